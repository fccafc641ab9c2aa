//! Element-wise operators: activations (Relu, LeakyRelu, PRelu, Sigmoid, Tanh, Softplus, Elu,
//! HardSigmoid, HardSwish, Gelu in both forms), math (Erf, Sqrt, Exp, Log, Neg, Abs,
//! Reciprocal, Pow by a constant, Clip) and the broadcasting arithmetic (Add, Sub, Mul, Div).
//!
//! Each is a composition of burn tensor operations, so autodiff differentiates it to any order;
//! where a textbook form overflows (softplus, elu) a stable equivalent is used. So is each
//! tangent rule (the derivative times the tangent, in closed form), below the forward pass.

use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::{sum_terms, Op, Primal};
use crate::compile::{Arg, Compiled, Cx, Res, MAX_RANK};
use crate::sym;

/// A one-input element-wise function.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Unary {
    Relu,
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    Softplus,
    Elu(f32),
    HardSigmoid(f32, f32),
    HardSwish,
    Gelu { tanh: bool },
    Erf,
    Sqrt,
    Exp,
    Log,
    Neg,
    Abs,
    Reciprocal,
    Clip(Option<f32>, Option<f32>),
    Pow(f32),
}

/// A two-input element-wise function, ONNX-broadcast.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    /// `x` where positive, `slope · x` elsewhere (the slope broadcast to x).
    PRelu,
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let op = cx.node.op_type.as_str();
    let unary = match op {
        "Relu" => Unary::Relu,
        "LeakyRelu" => Unary::LeakyRelu(cx.attr_f("alpha", 0.01)?),
        "Sigmoid" => Unary::Sigmoid,
        "Tanh" => Unary::Tanh,
        "Softplus" => Unary::Softplus,
        "Elu" => Unary::Elu(cx.attr_f("alpha", 1.0)?),
        "HardSigmoid" => Unary::HardSigmoid(cx.attr_f("alpha", 0.2)?, cx.attr_f("beta", 0.5)?),
        "HardSwish" => Unary::HardSwish,
        "Gelu" => match cx.attr_s("approximate", "none")?.as_str() {
            "none" => Unary::Gelu { tanh: false },
            "tanh" => Unary::Gelu { tanh: true },
            a => return Err(format!("approximate='{a}' is not supported")),
        },
        "Erf" => Unary::Erf,
        "Sqrt" => Unary::Sqrt,
        "Exp" => Unary::Exp,
        "Log" => Unary::Log,
        "Neg" => Unary::Neg,
        "Abs" => Unary::Abs,
        "Reciprocal" => Unary::Reciprocal,
        "Clip" => {
            let bound = |name: &str, i: usize| -> Res<Option<f32>> {
                if cx.attr(name).is_some() {
                    return Ok(Some(cx.attr_f(name, 0.0)?));
                }
                cx.opt_host(i)?.map(|t| t.scalar_f32()).transpose()
            };
            Unary::Clip(bound("min", 1)?, bound("max", 2)?)
        }
        "Pow" => {
            let e = cx
                .host(1)
                .map_err(|e| format!("{e} (only constant exponents are supported)"))?;
            let v = e.to_f32()?;
            let p = *v.first().ok_or("an empty exponent")?;
            if v.iter().any(|&x| x != p) {
                return Err("only a single constant exponent is supported".into());
            }
            let out =
                sym::broadcast(&cx.shape(0)?, &cx.shape(1)?).ok_or("shapes do not broadcast")?;
            if out != cx.shape(0)? {
                return Err("the exponent broadcasts the base to a larger shape".into());
            }
            Unary::Pow(p)
        }
        "Add" | "Sub" | "Mul" | "Div" | "PRelu" => return binary(cx),
        _ => return Err(format!("{op} is not an element-wise operator")),
    };
    Ok(Compiled::Run {
        op: Op::Unary(unary),
        args: vec![Arg::Input(0)],
        shapes: vec![cx.shape(0)?],
    })
}

fn binary(cx: &Cx) -> Res<Compiled> {
    let (a, b) = (cx.shape(0)?, cx.shape(1)?);
    let (kind, out) = match cx.node.op_type.as_str() {
        "Add" => (Binary::Add, sym::broadcast(&a, &b)),
        "Sub" => (Binary::Sub, sym::broadcast(&a, &b)),
        "Mul" => (Binary::Mul, sym::broadcast(&a, &b)),
        "Div" => (Binary::Div, sym::broadcast(&a, &b)),
        _ => (Binary::PRelu, sym::broadcast(&a, &b).filter(|o| *o == a)),
    };
    let out = out.ok_or_else(|| {
        format!(
            "shapes {} and {} do not broadcast",
            sym::show(&a),
            sym::show(&b)
        )
    })?;
    Ok(Compiled::Run {
        op: Op::Binary(kind),
        args: vec![Arg::Input(0), Arg::Input(1)],
        shapes: vec![out],
    })
}

// ---------------------------------------------------------------------------------- forward

pub(crate) fn run_unary<B: Backend>(x: Tensor<B, 5>, u: Unary) -> Tensor<B, 5> {
    match u {
        Unary::Relu => activation::relu(x),
        // x where x > 0, else αx: PyTorch's slope (α) at exactly 0, too.
        Unary::LeakyRelu(a) => {
            let positive = x.clone().greater_elem(0.0);
            x.clone().mul_scalar(a).mask_where(positive, x)
        }
        Unary::Sigmoid => activation::sigmoid(x),
        Unary::Tanh => x.tanh(),
        Unary::Softplus => {
            // log(1 + eˣ) = m + log(e⁻ᵐ + eˣ⁻ᵐ) for any m; m = max(x, 0), held constant, keeps
            // both exponentials ≤ 1 and leaves every derivative exact.
            let m = activation::relu(x.clone()).detach();
            let inner = m.clone().neg().exp() + (x - m.clone()).exp();
            m + inner.log()
        }
        // α(e^{min(x, 0)} − 1) where x ≤ 0: no e^x of a large x, even in the unused branch
        // (whose zero gradient would otherwise meet an infinite derivative).
        Unary::Elu(a) => {
            let positive = x.clone().greater_elem(0.0);
            let negative = x.clone().clamp_max(0.0).exp().sub_scalar(1.0).mul_scalar(a);
            negative.mask_where(positive, x)
        }
        Unary::HardSigmoid(a, b) => x.mul_scalar(a).add_scalar(b).clamp(0.0, 1.0),
        Unary::HardSwish => x.clone() * x.div_scalar(6.0).add_scalar(0.5).clamp(0.0, 1.0),
        Unary::Gelu { tanh: false } => {
            x.clone()
                * x.div_scalar(std::f64::consts::SQRT_2)
                    .erf()
                    .add_scalar(1.0)
                    .mul_scalar(0.5)
        }
        Unary::Gelu { tanh: true } => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let cube = x.clone() * x.clone() * x.clone();
            let inner = (x.clone() + cube.mul_scalar(0.044715)).mul_scalar(c);
            x * inner.tanh().add_scalar(1.0).mul_scalar(0.5)
        }
        Unary::Erf => x.erf(),
        Unary::Sqrt => x.sqrt(),
        Unary::Exp => x.exp(),
        Unary::Log => x.log(),
        Unary::Neg => x.neg(),
        Unary::Abs => x.abs(),
        Unary::Reciprocal => x.recip(),
        Unary::Clip(lo, hi) => match (lo, hi) {
            (Some(lo), Some(hi)) => x.clamp(lo, hi),
            (Some(lo), None) => x.clamp_min(lo),
            (None, Some(hi)) => x.clamp_max(hi),
            (None, None) => x,
        },
        Unary::Pow(p) => match p {
            1.0 => x,
            2.0 => x.clone() * x,
            3.0 => x.clone() * x.clone() * x,
            0.5 => x.sqrt(),
            -1.0 => x.recip(),
            _ => x.powf_scalar(p),
        },
    }
}

pub(crate) fn run_binary<B: Backend>(
    a: Tensor<B, 5>,
    b: Tensor<B, 5>,
    kind: Binary,
) -> Tensor<B, 5> {
    match kind {
        Binary::Add => a + b,
        Binary::Sub => a - b,
        Binary::Mul => a * b,
        Binary::Div => a / b,
        Binary::PRelu => {
            let positive = a.clone().greater_elem(0.0);
            (a.clone() * b).mask_where(positive, a)
        }
    }
}

// ---------------------------------------------------------------------------------- tangents

/// Whether a unary function is piecewise linear (its second derivative vanishes between kinks).
pub(crate) fn unary_is_piecewise_linear(u: Unary) -> bool {
    match u {
        Unary::Relu
        | Unary::LeakyRelu(_)
        | Unary::HardSigmoid(..)
        | Unary::Neg
        | Unary::Abs
        | Unary::Clip(..) => true,
        Unary::Pow(p) => p == 1.0,
        Unary::Sigmoid
        | Unary::Tanh
        | Unary::Softplus
        | Unary::Elu(_)
        | Unary::HardSwish
        | Unary::Gelu { .. }
        | Unary::Erf
        | Unary::Sqrt
        | Unary::Exp
        | Unary::Log
        | Unary::Reciprocal => false,
    }
}

/// Whether its tangent rule reads the input, and the output: the derivative is written with
/// whichever the forward pass has already computed more cheaply.
pub(crate) fn unary_reads(u: Unary) -> (bool, bool) {
    match u {
        Unary::Neg => (false, false),
        Unary::Pow(1.0) => (false, false),
        Unary::Sigmoid | Unary::Tanh | Unary::Sqrt | Unary::Exp | Unary::Reciprocal => {
            (false, true)
        }
        // The side of 0 from the input, e^x as the output plus α.
        Unary::Elu(_) => (true, true),
        _ => (true, false),
    }
}

/// `t` times the derivative of `u` at input `x` (output `y`), each given where
/// [`unary_reads`] says the rule reads it.
pub(crate) fn tangent_unary<B: Backend>(
    u: Unary,
    x: Option<Tensor<B, MAX_RANK>>,
    y: Option<Tensor<B, MAX_RANK>>,
    t: Tensor<B, MAX_RANK>,
) -> Tensor<B, MAX_RANK> {
    let x = || x.clone().expect("the rule reads the input");
    let y = || y.clone().expect("the rule reads the output");
    match u {
        // Slope 0 at 0, as the forward pass's gradient (and PyTorch's).
        Unary::Relu => t.mask_fill(x().lower_equal_elem(0.0), 0.0),
        Unary::LeakyRelu(a) => t.clone().mul_scalar(a).mask_where(x().greater_elem(0.0), t),
        // σ' = σ(1 − σ).
        Unary::Sigmoid => {
            let y = y();
            t * y.clone() * y.neg().add_scalar(1.0)
        }
        Unary::Tanh => {
            let y = y();
            t * (y.clone() * y).neg().add_scalar(1.0)
        }
        // softplus' = σ.
        Unary::Softplus => t * activation::sigmoid(x()),
        // α eˣ = y + α below 0, 1 above.
        Unary::Elu(a) => (t.clone() * y().add_scalar(a)).mask_where(x().greater_elem(0.0), t),
        Unary::HardSigmoid(a, b) => {
            let z = x().mul_scalar(a).add_scalar(b);
            let inside = z.clone().greater_elem(0.0).bool_and(z.lower_elem(1.0));
            t.mul_scalar(a).mask_fill(inside.bool_not(), 0.0)
        }
        // x h(x), h = clamp(x / 6 + 1/2, 0, 1): h + x h', h' = 1/6 on (−3, 3).
        Unary::HardSwish => {
            let x = x();
            let h = x.clone().div_scalar(6.0).add_scalar(0.5).clamp(0.0, 1.0);
            let inside = x
                .clone()
                .greater_elem(-3.0)
                .bool_and(x.clone().lower_elem(3.0));
            let slope = (t.clone() * x)
                .div_scalar(6.0)
                .mask_fill(inside.bool_not(), 0.0);
            t * h + slope
        }
        Unary::Gelu { tanh } => t * gelu_slope(x(), tanh),
        Unary::Erf => {
            let x = x();
            t * (x.clone() * x)
                .neg()
                .exp()
                .mul_scalar(2.0 / std::f64::consts::PI.sqrt())
        }
        Unary::Sqrt => t / y().mul_scalar(2.0),
        Unary::Exp => t * y(),
        Unary::Log => t / x(),
        Unary::Neg => t.neg(),
        Unary::Abs => t * x().sign(),
        Unary::Reciprocal => {
            let y = y();
            (t * y.clone() * y).neg()
        }
        // The bounds included, as PyTorch's clamp passes its gradient.
        Unary::Clip(lo, hi) => {
            let x = x();
            let mut outside = None;
            if let Some(lo) = lo {
                outside = Some(x.clone().lower_elem(lo));
            }
            if let Some(hi) = hi {
                let above = x.greater_elem(hi);
                outside = Some(match outside {
                    Some(below) => below.bool_or(above),
                    None => above,
                });
            }
            match outside {
                Some(mask) => t.mask_fill(mask, 0.0),
                None => t,
            }
        }
        Unary::Pow(p) => match p {
            1.0 => t,
            2.0 => t * x().mul_scalar(2.0),
            3.0 => {
                let x = x();
                t * (x.clone() * x).mul_scalar(3.0)
            }
            0.5 => t / x().sqrt().mul_scalar(2.0),
            -1.0 => {
                let x = x();
                (t / (x.clone() * x)).neg()
            }
            _ => t * x().powf_scalar(p - 1.0).mul_scalar(p),
        },
    }
}

/// GELU's derivative at `x`, in its erf form (`tanh` false) or its tanh approximation.
fn gelu_slope<B: Backend>(x: Tensor<B, MAX_RANK>, tanh: bool) -> Tensor<B, MAX_RANK> {
    if !tanh {
        // x Φ(x): Φ(x) + x φ(x).
        let cdf = x
            .clone()
            .div_scalar(std::f64::consts::SQRT_2)
            .erf()
            .add_scalar(1.0)
            .mul_scalar(0.5);
        let pdf = (x.clone() * x.clone())
            .mul_scalar(-0.5)
            .exp()
            .mul_scalar(1.0 / (2.0 * std::f64::consts::PI).sqrt());
        return cdf + x * pdf;
    }
    // x (1 + tanh u) / 2, u = c (x + k x³): (1 + tanh u) / 2 + x (1 − tanh² u) u' / 2.
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let square = x.clone() * x.clone();
    let u = (x.clone() + square.clone() * x.clone().mul_scalar(0.044715)).mul_scalar(c);
    let th = u.tanh();
    let du = square
        .mul_scalar(3.0 * 0.044715)
        .add_scalar(1.0)
        .mul_scalar(c);
    let sech2 = (th.clone() * th.clone()).neg().add_scalar(1.0);
    th.add_scalar(1.0).mul_scalar(0.5) + x * sech2 * du.mul_scalar(0.5)
}

/// Whether a binary operation is piecewise linear in its varying inputs.
pub(crate) fn binary_is_piecewise_linear(b: Binary, varying: &[bool]) -> bool {
    match b {
        Binary::Add | Binary::Sub => true,
        Binary::Mul => !(varying[0] && varying[1]),
        // Linear in the numerator; PRelu piecewise linear in x for a constant slope.
        Binary::Div | Binary::PRelu => !varying[1],
    }
}

/// Which of (a, b) the rule reads, given which vary.
pub(crate) fn binary_reads(b: Binary, varying: &[bool]) -> Vec<bool> {
    let (va, vb) = (varying[0], varying[1]);
    match b {
        Binary::Add | Binary::Sub => vec![false, false],
        Binary::Mul => vec![vb, va],
        Binary::Div => vec![vb, true],
        // The side of 0 from a, the slope for a's tangent.
        Binary::PRelu => vec![true, va],
    }
}

/// The tangent of `a ∘ b` from the inputs' tangents (at least one given).
pub(crate) fn tangent_binary<B: Backend>(
    kind: Binary,
    primal: &Primal<B>,
    ta: Option<Tensor<B, MAX_RANK>>,
    tb: Option<Tensor<B, MAX_RANK>>,
    out: [usize; MAX_RANK],
) -> Tensor<B, MAX_RANK> {
    let a = || primal.input(0);
    let b = || primal.input(1);
    match kind {
        Binary::Add => sum_terms([ta, tb], out),
        Binary::Sub => sum_terms([ta, tb.map(Tensor::neg)], out),
        Binary::Mul => sum_terms([ta.map(|t| t * b()), tb.map(|t| a() * t)], out),
        // a/b: ta / b − a tb / b².
        Binary::Div => {
            let b = b();
            sum_terms(
                [
                    ta.map(|t| t / b.clone()),
                    tb.map(|t| (a() * t / (b.clone() * b.clone())).neg()),
                ],
                out,
            )
        }
        // a where a > 0, else a · b: ta there, ta · b + a · tb here.
        Binary::PRelu => {
            let positive = a().greater_elem(0.0);
            let negative = sum_terms([ta.clone().map(|t| t * b()), tb.map(|t| a() * t)], out);
            match ta {
                Some(ta) => negative.mask_where(positive, sum_terms([Some(ta)], out)),
                None => negative.mask_fill(positive, 0.0),
            }
        }
    }
}
