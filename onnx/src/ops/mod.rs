//! The supported operators: which exist ([`SUPPORTED_OPERATORS`]), how each node compiles
//! (folded at load time, or an [`Op`] of the forward pass), and how each [`Op`] runs on burn
//! tensors. One file per family.

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
pub(crate) fn run<B: Backend>(
    op: &Op,
    inputs: Vec<Tensor<B, 5>>,
    shapes: &[[usize; MAX_RANK]],
) -> Vec<Tensor<B, 5>> {
    let mut it = inputs.into_iter();
    let y = match op {
        Op::Unary(u) => elementwise::run_unary(take(&mut it), *u),
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
                Err(format!("index {i} is out of range for a dimension of {dim}").into())
            }
        })
        .collect()
}
