//! Reductions along axes: ReduceMean and ReduceSum (axes as attribute or input, keepdims),
//! Softmax and LogSoftmax.

use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::Op;
use crate::compile::{canon_axis, Arg, Compiled, Cx, Res};
use crate::sym::{Sym, SymShape};

/// A reduction over canonical axes (kept as size 1; the step reshapes to drop them).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Reduce {
    pub axes: Vec<usize>,
    pub mean: bool,
}

/// Softmax or LogSoftmax along a canonical axis.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Softmax {
    pub axis: usize,
    pub log: bool,
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let op = cx.node.op_type.as_str();
    let shape = cx.shape(0)?;
    let r = shape.len();
    match op {
        "Softmax" | "LogSoftmax" => {
            let default = if cx.opset < 13 { 1 } else { -1 };
            let axis = cx.axis(cx.attr_i("axis", default)?, r)?;
            if cx.opset < 13 && axis != r - 1 {
                return Err(
                    "opset < 13 Softmax over several trailing axes is not supported".into(),
                );
            }
            let op = Op::Softmax(Softmax {
                axis: canon_axis(axis, r),
                log: op == "LogSoftmax",
            });
            Ok(Compiled::Run {
                op,
                args: vec![Arg::Input(0)],
                shapes: vec![shape],
            })
        }
        _ => {
            let axes = cx.ints_attr_or_input("axes", 1)?.unwrap_or_default();
            let axes: Vec<usize> = if axes.is_empty() {
                if cx.attr_i("noop_with_empty_axes", 0)? != 0 {
                    return Ok(Compiled::Alias(0));
                }
                (0..r).collect()
            } else {
                axes.iter().map(|&a| cx.axis(a, r)).collect::<Res<_>>()?
            };
            let keep = cx.attr_i("keepdims", 1)? != 0;
            let out: SymShape = (0..r)
                .filter_map(|d| match (axes.contains(&d), keep) {
                    (false, _) => Some(shape[d]),
                    (true, true) => Some(Sym::fixed(1)),
                    (true, false) => None,
                })
                .collect();
            let axes = axes.iter().map(|&a| canon_axis(a, r)).collect();
            let op = Op::Reduce(Reduce {
                axes,
                mean: op == "ReduceMean",
            });
            Ok(Compiled::Run {
                op,
                args: vec![Arg::Input(0)],
                shapes: vec![out],
            })
        }
    }
}

// ---------------------------------------------------------------------------------- forward

pub(crate) fn run_reduce<B: Backend>(x: Tensor<B, 5>, p: &Reduce, out: [usize; 5]) -> Tensor<B, 5> {
    let y = p
        .axes
        .iter()
        .fold(x, |t, &a| if p.mean { t.mean_dim(a) } else { t.sum_dim(a) });
    y.reshape(out)
}

pub(crate) fn run_softmax<B: Backend>(x: Tensor<B, 5>, p: &Softmax) -> Tensor<B, 5> {
    if p.log {
        activation::log_softmax(x, p.axis)
    } else {
        activation::softmax(x, p.axis)
    }
}

/// Softmax's tangent from its output y: y ⊙ (t − Σ y t); LogSoftmax's: t − Σ eʸ t (the sums
/// along the axis).
pub(crate) fn tangent_softmax<B: Backend>(
    y: Tensor<B, 5>,
    t: Tensor<B, 5>,
    p: &Softmax,
) -> Tensor<B, 5> {
    if p.log {
        let weighted = (y.exp() * t.clone()).sum_dim(p.axis);
        t - weighted
    } else {
        let weighted = (y.clone() * t.clone()).sum_dim(p.axis);
        y * (t - weighted)
    }
}
