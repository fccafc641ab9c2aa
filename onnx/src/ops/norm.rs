//! BatchNormalization (inference statistics, folded at load time into a per-channel scale and
//! shift) and LayerNormalization (any trailing axes, optional bias).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use jem_attacks::{scale_channels, shift_channels};

use super::conv::to4;

use super::{sum_terms, Op, Primal};
use crate::compile::{canon_axis, Arg, Compiled, Cx, Res, MAX_RANK};
use crate::host::HostTensor;
use crate::sym;

/// LayerNormalization over these canonical axes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LayerNorm {
    pub axes: Vec<usize>,
    pub eps: f32,
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    match cx.node.op_type.as_str() {
        "BatchNormalization" => batch_norm(cx),
        _ => layer_norm(cx),
    }
}

fn batch_norm(cx: &Cx) -> Res<Compiled> {
    if cx.attr_i("training_mode", 0)? != 0 {
        return Err("training mode (batch statistics) is not supported; export in eval()".into());
    }
    let shape = cx.shape(0)?;
    if shape.len() < 2 {
        return Err("input of rank < 2".into());
    }
    let c = shape[1]
        .as_fixed()
        .ok_or("channels depend on the batch size")? as usize;
    let eps = cx.attr_f("epsilon", 1e-5)?;
    let mut params = Vec::with_capacity(4);
    for i in 1..5 {
        let t = cx.host(i)?;
        if t.numel() != c {
            return Err(format!(
                "input {i} has {} values for {c} channels",
                t.numel()
            ));
        }
        params.push(t.to_f32()?);
    }
    let (gamma, beta, mean, var) = (&params[0], &params[1], &params[2], &params[3]);
    let scale: Vec<f32> = (0..c).map(|i| gamma[i] / (var[i] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..c).map(|i| beta[i] - mean[i] * scale[i]).collect();
    // [C, 1, ..., 1]: broadcast over the dimensions after the channels.
    let mut pshape = vec![c];
    pshape.resize(shape.len() - 1, 1);
    let args = vec![
        Arg::Input(0),
        Arg::Host(HostTensor::float(pshape.clone(), scale)),
        Arg::Host(HostTensor::float(pshape, shift)),
    ];
    Ok(Compiled::Run {
        op: Op::Affine,
        args,
        shapes: vec![shape],
    })
}

fn layer_norm(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let r = shape.len();
    let axis = cx.axis(cx.attr_i("axis", -1)?, r)?;
    let normalised = &shape[axis..];
    for i in 1..3 {
        if let Some(p) = cx.input(i) {
            if sym::broadcast(normalised, &p.shape()).as_deref() != Some(normalised) {
                return Err(format!(
                    "input {i} of shape {} does not broadcast to {}",
                    sym::show(&p.shape()),
                    sym::show(normalised)
                ));
            }
        }
    }
    let mut args = vec![Arg::Input(0), Arg::Input(1)];
    if cx.input(2).is_some() {
        args.push(Arg::Input(2));
    }
    let axes = (axis..r).map(|a| canon_axis(a, r)).collect();
    let op = Op::LayerNorm(LayerNorm {
        axes,
        eps: cx.attr_f("epsilon", 1e-5)?,
    });
    Ok(Compiled::Run {
        op,
        args,
        shapes: vec![shape],
    })
}

// ---------------------------------------------------------------------------------- forward

pub(crate) fn run_affine<B: Backend>(
    x: Tensor<B, 5>,
    scale: Tensor<B, 5>,
    shift: Tensor<B, 5>,
) -> Tensor<B, 5> {
    match per_channel(&x, &scale) {
        Some(c) => {
            let x = to4(x);
            let (scale, shift) = (scale.reshape([c]), shift.reshape([c]));
            shift_channels(scale_channels(x, scale), shift).unsqueeze_dim(0)
        }
        None => x * scale + shift,
    }
}

/// `t · scale` (the folded BatchNorm's tangent), per channel where it can be.
pub(crate) fn scale<B: Backend>(t: Tensor<B, 5>, scale: Tensor<B, 5>) -> Tensor<B, 5> {
    match per_channel(&t, &scale) {
        Some(c) => scale_channels(to4(t), scale.reshape([c])).unsqueeze_dim(0),
        None => t * scale,
    }
}

/// The channel count where `x` is an image batch (`[1, N, C, H, W]`) and `values` one value per
/// channel (`[1, 1, C, 1, 1]`): then jem-attacks' per-channel operations apply, which run as
/// rows against a column instead of burn's general broadcast (element by element through
/// strides, on one thread).
fn per_channel<B: Backend>(x: &Tensor<B, 5>, values: &Tensor<B, 5>) -> Option<usize> {
    let [a, _, c, _, _] = x.dims();
    (a == 1 && values.dims() == [1, 1, c, 1, 1]).then_some(c)
}

fn mean_over<B: Backend>(x: Tensor<B, 5>, axes: &[usize]) -> Tensor<B, 5> {
    axes.iter().fold(x, |t, &a| t.mean_dim(a))
}

/// `(x − mean) / s` over the axes, and that s = `sqrt(var + ε)`.
fn standardise<B: Backend>(x: Tensor<B, 5>, p: &LayerNorm) -> (Tensor<B, 5>, Tensor<B, 5>) {
    let centred = x.clone() - mean_over(x, &p.axes);
    let var = mean_over(centred.clone() * centred.clone(), &p.axes);
    let std = var.add_scalar(p.eps).sqrt();
    (centred / std.clone(), std)
}

pub(crate) fn run_layer_norm<B: Backend>(
    x: Tensor<B, 5>,
    scale: Tensor<B, 5>,
    bias: Option<Tensor<B, 5>>,
    p: &LayerNorm,
) -> Tensor<B, 5> {
    let y = standardise(x, p).0 * scale;
    match bias {
        Some(b) => y + b,
        None => y,
    }
}

/// LayerNormalization's tangent. With x̂ = (x − μ)/s, s = sqrt(var + ε), and the centred
/// tangent c = t − mean(t): dx̂ = (c − x̂ · mean(x̂ c)) / s; then dy = dx̂ · scale + x̂ · t_scale
/// + t_bias.
pub(crate) fn tangent_layer_norm<B: Backend>(
    primal: &Primal<B>,
    tx: Option<Tensor<B, 5>>,
    t_scale: Option<Tensor<B, 5>>,
    t_bias: Option<Tensor<B, 5>>,
    p: &LayerNorm,
    out: [usize; MAX_RANK],
) -> Tensor<B, 5> {
    let (xhat, std) = standardise(primal.input(0), p);
    let d_xhat = tx.map(|t| {
        let c = t.clone() - mean_over(t, &p.axes);
        let along = mean_over(xhat.clone() * c.clone(), &p.axes);
        (c - xhat.clone() * along) / std
    });
    sum_terms(
        [
            d_xhat.map(|d| d * primal.input(1)),
            t_scale.map(|t| xhat * t),
            t_bias,
        ],
        out,
    )
}
