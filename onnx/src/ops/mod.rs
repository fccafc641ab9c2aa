//! The supported operators: which exist ([`SUPPORTED_OPERATORS`]), how each node compiles
//! (folded at load time, or an [`Op`] of the forward pass), how each [`Op`] runs on burn
//! tensors, and its tangent rule: how a directional derivative passes it (forward mode,
//! [`tangent`]), with what of the forward pass that rule reads ([`Op::tangent_reads`]) and
//! whether the operation is piecewise linear ([`Op::is_piecewise_linear`]). One file per
//! family, each nonlinear operator's rule beside its forward pass; the linear and bilinear
//! ones are their own forward pass applied to the tangents, in [`tangent`] itself.

pub(crate) mod conv;
pub(crate) mod elementwise;
pub(crate) mod fold;
pub(crate) mod layout;
pub(crate) mod linear;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod reduce;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use jem_kernels::Kernels;

use crate::compile::{Compiled, Cx, Res, MAX_RANK};

/// Every ONNX operator (default domain) the loader accepts. Some only in the shape arithmetic
/// an exporter writes, folded at load time: `Shape`, `ConstantOfShape`, `Equal`, `Less`,
/// `Greater`, `Where`, `Range`, `Floor`, `Ceil`.
pub const SUPPORTED_OPERATORS: &[&str] = &[
    "Abs",
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Ceil",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "Div",
    "Dropout",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "Greater",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "Log",
    "LogSoftmax",
    "MatMul",
    "MaxPool",
    "Mul",
    "Neg",
    "Pad",
    "Pow",
    "PRelu",
    "Range",
    "Reciprocal",
    "ReduceMean",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Slice",
    "Softmax",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Tanh",
    "Transpose",
    "Unsqueeze",
    "Where",
];

/// One operation of the forward pass, its parameters resolved at load time. Inputs and
/// outputs are canonical (rank-5) tensors.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    Unary(elementwise::Unary),
    /// LeakyReLU with this slope (0: ReLU) on jem-kernels, in place of a `Unary` one whose
    /// input comes from a linear step ([`crate::fuse`]).
    Activation(f32),
    Binary(elementwise::Binary),
    Conv(conv::Conv),
    Gemm(linear::Gemm),
    MatMul,
    /// `x · scale + shift` (a folded BatchNormalization).
    Affine,
    LayerNorm(norm::LayerNorm),
    MaxPool(pool::Pool),
    /// Inputs: x, the depthwise ones, the per-output divisor.
    AvgPool(pool::Pool),
    GlobalAvgPool,
    Reduce(reduce::Reduce),
    Softmax(reduce::Softmax),
    /// To the step's output shape.
    Reshape,
    Transpose([usize; MAX_RANK]),
    Concat(usize),
    Pad(layout::Pad),
    Slice([layout::AxisSlice; MAX_RANK]),
    Gather(layout::Gather),
    Split(layout::Split),
    /// To the step's output shape.
    Expand,
}

/// Compiles one node (its operator is in [`SUPPORTED_OPERATORS`]).
pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let op = cx.node.op_type.as_str();
    // Anything whose inputs are all known folds, where a host evaluation exists; Shape folds
    // always (shapes are known, up to the batch size).
    if cx.all_host() || op == "Shape" {
        if let Some(c) = fold::fold(cx)? {
            return Ok(c);
        }
    }
    match op {
        "Constant" | "ConstantOfShape" | "Equal" | "Less" | "Greater" | "Where" | "Range" | "Floor" | "Ceil" => {
            Err("only supported on load-time constants (shape arithmetic), not on tensors computed from the \
                 network's input"
                .into())
        }
        "Identity" | "Dropout" | "Cast" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Transpose"
        | "Concat" | "Pad" | "Slice" | "Gather" | "Split" | "Expand" => layout::compile(cx),
        "Conv" => conv::compile(cx),
        "MaxPool" | "AveragePool" | "GlobalAveragePool" => pool::compile(cx),
        "Gemm" | "MatMul" => linear::compile(cx),
        "BatchNormalization" | "LayerNormalization" => norm::compile(cx),
        "ReduceMean" | "ReduceSum" | "Softmax" | "LogSoftmax" => reduce::compile(cx),
        _ => elementwise::compile(cx),
    }
}

/// Runs one step on its (canonical) inputs; `shapes` are its outputs' dimensions.
pub(crate) fn run<B: Kernels>(
    op: &Op,
    inputs: Vec<Tensor<B, 5>>,
    shapes: &[[usize; MAX_RANK]],
) -> Vec<Tensor<B, 5>> {
    let mut it = inputs.into_iter();
    let y = match op {
        Op::Unary(u) => elementwise::run_unary(take(&mut it), *u),
        Op::Activation(slope) => {
            let x = take(&mut it);
            jem_kernels::leaky_relu(x, f64::from(*slope))
        }
        Op::Binary(b) => {
            let a = take(&mut it);
            elementwise::run_binary(a, take(&mut it), *b)
        }
        Op::Conv(p) => {
            let (x, w) = (take(&mut it), take(&mut it));
            let b = it.next();
            return vec![conv::run(x, w, b, p)];
        }
        Op::Gemm(g) => {
            let (a, b) = (take(&mut it), take(&mut it));
            let c = it.next();
            return vec![linear::run_gemm(a, b, c, g)];
        }
        Op::MatMul => {
            let a = take(&mut it);
            linear::run_matmul(a, take(&mut it), shapes[0])
        }
        Op::Affine => {
            let (x, s) = (take(&mut it), take(&mut it));
            norm::run_affine(x, s, take(&mut it))
        }
        Op::LayerNorm(p) => {
            let (x, s) = (take(&mut it), take(&mut it));
            let b = it.next();
            return vec![norm::run_layer_norm(x, s, b, p)];
        }
        Op::MaxPool(p) => pool::run_max(take(&mut it), p),
        Op::AvgPool(p) => {
            let (x, ones) = (take(&mut it), take(&mut it));
            pool::run_avg(x, ones, take(&mut it), p)
        }
        Op::GlobalAvgPool => pool::run_global_avg(take(&mut it)),
        Op::Reduce(p) => reduce::run_reduce(take(&mut it), p, shapes[0]),
        Op::Softmax(p) => reduce::run_softmax(take(&mut it), p),
        Op::Reshape => take(&mut it).reshape(shapes[0]),
        Op::Transpose(perm) => take(&mut it).permute(*perm),
        Op::Concat(axis) => {
            let all: Vec<Tensor<B, 5>> = it.collect();
            return vec![Tensor::cat(all, *axis)];
        }
        Op::Pad(p) => layout::run_pad(take(&mut it), p),
        Op::Slice(axes) => layout::run_slice(take(&mut it), axes),
        Op::Gather(g) => layout::run_gather(take(&mut it), g).reshape(shapes[0]),
        Op::Split(s) => return layout::run_split(take(&mut it), s),
        Op::Expand => take(&mut it).expand(shapes[0]),
    };
    vec![y]
}

/// The primal values of one step at the point of differentiation that its tangent rule reads
/// (as [`Op::tangent_reads`] says); the others are `None`, so that a linearisation keeps only
/// what its tangent pass needs.
#[derive(Clone, Debug)]
pub(crate) struct Primal<B: Backend> {
    /// The step's inputs (canonical).
    pub inputs: Vec<Option<Tensor<B, MAX_RANK>>>,
    /// Its first output.
    pub output: Option<Tensor<B, MAX_RANK>>,
}

impl<B: Backend> Primal<B> {
    fn input(&self, i: usize) -> Tensor<B, MAX_RANK> {
        self.inputs[i].clone().unwrap_or_else(|| {
            panic!("a tangent rule reads input {i}, which Op::tangent_reads omits")
        })
    }

    fn output(&self) -> Tensor<B, MAX_RANK> {
        self.output
            .clone()
            .expect("a tangent rule reads the output, which Op::tangent_reads omits")
    }

    /// The same values cut from the autodiff graph: the point of a linearisation is fixed.
    pub fn detach(self) -> Self {
        Self {
            inputs: self
                .inputs
                .into_iter()
                .map(|t| t.map(Tensor::detach))
                .collect(),
            output: self.output.map(Tensor::detach),
        }
    }
}

/// Which primal values of a step its tangent rule reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Reads {
    /// Per input.
    pub inputs: Vec<bool>,
    /// The first output.
    pub output: bool,
}

impl Op {
    /// Whether the step is piecewise linear in its inputs that vary with the network's input
    /// (`varying[i]`; the others are constants): then its second derivative vanishes between
    /// kinks, and a network made only of such steps is linearised exactly by its activation
    /// pattern. Products of two varying inputs and smooth nonlinearities are not.
    pub(crate) fn is_piecewise_linear(&self, varying: &[bool]) -> bool {
        let both = varying.len() >= 2 && varying[0] && varying[1];
        match self {
            Op::Unary(u) => elementwise::unary_is_piecewise_linear(*u),
            Op::Activation(_) => true,
            Op::Binary(b) => elementwise::binary_is_piecewise_linear(*b, varying),
            Op::Conv(_) | Op::Gemm(_) | Op::MatMul | Op::Affine => !both,
            Op::LayerNorm(_) | Op::Softmax(_) => false,
            Op::MaxPool(_)
            | Op::AvgPool(_)
            | Op::GlobalAvgPool
            | Op::Reduce(_)
            | Op::Reshape
            | Op::Transpose(_)
            | Op::Concat(_)
            | Op::Pad(_)
            | Op::Slice(_)
            | Op::Gather(_)
            | Op::Split(_)
            | Op::Expand => true,
        }
    }

    /// What of the forward pass this step's tangent rule ([`tangent`]) reads, given which inputs
    /// carry a tangent (`varying[i]`): a product reads the other factor of each varying one, a
    /// nonlinearity its input or output, a layout operation nothing.
    pub(crate) fn tangent_reads(&self, varying: &[bool]) -> Reads {
        let n = varying.len();
        let v = |i: usize| varying.get(i).copied().unwrap_or(false);
        let mut inputs = vec![false; n];
        let mut output = false;
        match self {
            Op::Unary(u) => (inputs[0], output) = elementwise::unary_reads(*u),
            Op::Activation(_) => inputs[0] = true,
            Op::Binary(b) => inputs = elementwise::binary_reads(*b, varying),
            // Bilinear: each factor's tangent meets the other factor; a fused activation's
            // slope is read off the input.
            Op::Conv(_) | Op::Gemm(_) | Op::MatMul | Op::Affine => {
                let fused = matches!(self, Op::Conv(c) if c.input_slope.is_some());
                inputs[0] = v(1) || (fused && v(0));
                inputs[1] = v(0);
            }
            Op::LayerNorm(_) => {
                inputs[0] = true;
                inputs[1] = v(0);
            }
            Op::MaxPool(_) => inputs[0] = true,
            // The depthwise ones and the divisor.
            Op::AvgPool(_) => (inputs[1], inputs[2]) = (true, true),
            Op::Softmax(_) => output = true,
            // Inputs without a tangent are concatenated as zeros of their shape.
            Op::Concat(_) => inputs = varying.iter().map(|v| !v).collect(),
            Op::GlobalAvgPool
            | Op::Reduce(_)
            | Op::Reshape
            | Op::Transpose(_)
            | Op::Pad(_)
            | Op::Slice(_)
            | Op::Gather(_)
            | Op::Split(_)
            | Op::Expand => {}
        }
        Reads { inputs, output }
    }
}

/// The tangent rule: the step's outputs' tangents (directional derivatives) from its inputs'
/// `tangents` (`None`: zero, a constant's; at least one is given) at the point `primal`;
/// `shapes` are its outputs' dimensions. Ordinary burn operations only, linear in the tangents
/// and differentiable in both them and the point: reverse mode over it gives second
/// derivatives. Where the forward pass has a kink (ReLU at 0, a max-pool tie) the rule takes
/// the side the forward pass's own gradient takes.
pub(crate) fn tangent<B: Kernels>(
    op: &Op,
    primal: &Primal<B>,
    tangents: Vec<Option<Tensor<B, MAX_RANK>>>,
    shapes: &[[usize; MAX_RANK]],
) -> Vec<Option<Tensor<B, MAX_RANK>>> {
    let out = shapes[0];
    let mut ts = tangents.into_iter();
    let mut next = || ts.next().flatten();
    let t = match op {
        Op::Unary(u) => {
            let x = primal.inputs[0].clone();
            let t = next().expect("a tangent is given");
            elementwise::tangent_unary(*u, x, primal.output.clone(), t)
        }
        // The kernels' derivative (1 at exactly 0), as their own gradient takes it; piecewise
        // constant in x: not tracked.
        Op::Activation(slope) => {
            let t = next().expect("a tangent is given");
            let x = primal.input(0).detach();
            t * jem_kernels::leaky_relu_derivative(x, f64::from(*slope))
        }
        Op::Binary(b) => {
            let (ta, tb) = (next(), next());
            elementwise::tangent_binary(*b, primal, ta, tb, out)
        }
        Op::Conv(p) => conv::tangent(primal, [next(), next(), next()], p, out),
        Op::Gemm(g) => {
            let (ta, tb, tc) = (next(), next(), next());
            sum_terms(
                [
                    ta.map(|t| linear::run_gemm(t, primal.input(1), None, g)),
                    tb.map(|t| linear::run_gemm(primal.input(0), t, None, g)),
                    tc.map(|t| t.mul_scalar(g.beta)),
                ],
                out,
            )
        }
        Op::MatMul => {
            let (ta, tb) = (next(), next());
            sum_terms(
                [
                    ta.map(|t| linear::run_matmul(t, primal.input(1), out)),
                    tb.map(|t| linear::run_matmul(primal.input(0), t, out)),
                ],
                out,
            )
        }
        Op::Affine => {
            let (tx, ts, tb) = (next(), next(), next());
            sum_terms(
                [
                    tx.map(|t| norm::scale(t, primal.input(1))),
                    ts.map(|t| primal.input(0) * t),
                    tb,
                ],
                out,
            )
        }
        Op::LayerNorm(p) => {
            let (tx, ts, tb) = (next(), next(), next());
            norm::tangent_layer_norm(primal, tx, ts, tb, p, out)
        }
        Op::MaxPool(p) => {
            pool::tangent_max(primal.input(0), next().expect("a tangent is given"), p)
        }
        Op::AvgPool(p) => pool::run_avg(
            next().expect("a tangent is given"),
            primal.input(1),
            primal.input(2),
            p,
        ),
        Op::Softmax(p) => {
            reduce::tangent_softmax(primal.output(), next().expect("a tangent is given"), p)
        }
        Op::Concat(axis) => {
            let parts = primal
                .inputs
                .iter()
                .map(|x| match next() {
                    Some(t) => t,
                    None => x
                        .clone()
                        .expect("Concat reads the inputs without a tangent")
                        .zeros_like(),
                })
                .collect();
            Tensor::cat(parts, *axis)
        }
        Op::Split(s) => {
            return layout::run_split(next().expect("a tangent is given"), s)
                .into_iter()
                .map(Some)
                .collect()
        }
        Op::Pad(p) => layout::tangent_pad(next().expect("a tangent is given"), p),
        // Linear in their one varying input: the operation itself, on the tangent.
        Op::GlobalAvgPool
        | Op::Reduce(_)
        | Op::Reshape
        | Op::Transpose(_)
        | Op::Slice(_)
        | Op::Gather(_)
        | Op::Expand => {
            let t = next().expect("a tangent is given");
            return run(op, vec![t], shapes).into_iter().map(Some).collect();
        }
    };
    vec![Some(t)]
}

/// The sum of the terms present (at least one), broadcast to `out`.
pub(crate) fn sum_terms<B: Backend, const N: usize>(
    terms: [Option<Tensor<B, MAX_RANK>>; N],
    out: [usize; MAX_RANK],
) -> Tensor<B, MAX_RANK> {
    let sum = terms
        .into_iter()
        .flatten()
        .reduce(|a, b| a + b)
        .expect("a tangent rule has at least one term");
    if sum.dims() == out {
        sum
    } else {
        sum.expand(out)
    }
}

fn take<T>(it: &mut impl Iterator<Item = T>) -> T {
    it.next().expect("the compiler gives every step its inputs")
}

#[cfg(test)]
mod tests;

/// Gather's constant indices into a dimension of `dim` (negative ones count from its end),
/// each checked to fall inside it.
fn gather_indices(idx: &crate::host::HostTensor, dim: i64) -> Res<Vec<usize>> {
    idx.to_i64()?
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim } else { i };
            if (0..dim).contains(&j) {
                Ok(j as usize)
            } else {
                Err(format!(
                    "index {i} is out of range for a dimension of {dim}"
                ))
            }
        })
        .collect()
}
