//! Element-wise operators: activations (Relu, LeakyRelu, PRelu, Sigmoid, Tanh, Softplus, Elu,
//! HardSigmoid, HardSwish, Gelu in both forms), math (Erf, Sqrt, Exp, Log, Neg, Abs,
//! Reciprocal, Pow by a constant, Clip) and the broadcasting arithmetic (Add, Sub, Mul, Div).
//!
//! Each is a composition of burn tensor operations, so autodiff differentiates it to any order;
//! where a textbook form overflows (softplus, elu) a stable equivalent is used.

use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::Op;
use crate::compile::{Arg, Compiled, Cx, Res};
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
