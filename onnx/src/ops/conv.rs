//! Conv (2-D): bias, explicit or automatic padding (asymmetric included), stride, dilation,
//! groups — jem-kernels' convolution (the native Wide-ResNet's), after an explicit zero pad
//! where the padding is asymmetric.

use burn::tensor::backend::Backend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::ops::PadMode;
use burn::tensor::Tensor;
use jem_kernels::{conv2d_tensors, leaky_relu_derivative, Kernels};

use super::Op;
use crate::compile::{Arg, Compiled, Cx, Res};
use crate::sym::{self, Sym};

/// A 2-D convolution's settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Conv {
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// Top, left, bottom, right.
    pub pads: [usize; 4],
    /// The convolution of LeakyReLU(x) with this slope (0: ReLU) instead of x's: an activation
    /// step fused into it at load ([`crate::fuse`]).
    pub input_slope: Option<f32>,
}

/// Spatial settings shared by Conv and the pools: kernel, stride, dilation, and the padding
/// (top, left, bottom, right) after `auto_pad` is resolved.
pub(crate) struct Window {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub pads: [usize; 4],
}

/// Reads kernel_shape (or `kernel`, from the weights), strides, dilations, pads and auto_pad.
pub(crate) fn window(cx: &Cx, hw: [usize; 2], kernel: Option<[usize; 2]>) -> Res<Window> {
    let pair = |name: &str, default: usize| -> Res<[usize; 2]> {
        match cx.attr_ints(name)? {
            None => Ok([default; 2]),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(format!(
                "{name} {v:?}: two positive values expected (2-D only)"
            )),
        }
    };
    let kernel = match (cx.attr_ints("kernel_shape")?, kernel) {
        (Some(_), _) => pair("kernel_shape", 1)?,
        (None, Some(k)) => k,
        (None, None) => return Err("no kernel_shape".into()),
    };
    let stride = pair("strides", 1)?;
    let dilation = pair("dilations", 1)?;
    let pads = match cx.attr_s("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" => match cx.attr_ints("pads")? {
            None => [0; 4],
            Some(p) if p.len() == 4 && p.iter().all(|&x| x >= 0) => {
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            Some(p) => return Err(format!("pads {p:?}: four non-negative values expected")),
        },
        "VALID" => [0; 4],
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut pads = [0; 4];
            for a in 0..2 {
                let out = hw[a].div_ceil(stride[a]);
                let span = (kernel[a] - 1) * dilation[a] + 1;
                let total = ((out - 1) * stride[a] + span).saturating_sub(hw[a]);
                let (small, big) = (total / 2, total - total / 2);
                (pads[a], pads[a + 2]) = if mode == "SAME_UPPER" {
                    (small, big)
                } else {
                    (big, small)
                };
            }
            pads
        }
        m => return Err(format!("auto_pad '{m}' is not supported")),
    };
    Ok(Window {
        kernel,
        stride,
        dilation,
        pads,
    })
}

/// Output size along one axis (floor mode).
pub(crate) fn out_size(
    input: usize,
    pad: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Res<usize> {
    let span = (kernel - 1) * dilation + 1;
    let padded = input + pad;
    if padded < span {
        return Err(format!(
            "a window of {span} does not fit an input of {input} padded by {pad}"
        ));
    }
    Ok((padded - span) / stride + 1)
}

/// The fixed spatial dimensions of an `[N, C, H, W]` input.
pub(crate) fn spatial(cx: &Cx) -> Res<(Vec<Sym>, [usize; 2])> {
    let shape = cx.shape(0)?;
    if shape.len() != 4 {
        return Err(format!(
            "input of shape {}: only 2-D ([N, C, H, W]) is supported",
            sym::show(&shape)
        ));
    }
    let h = shape[2]
        .as_fixed()
        .ok_or("a spatial dimension depends on the batch size")? as usize;
    let w = shape[3]
        .as_fixed()
        .ok_or("a spatial dimension depends on the batch size")? as usize;
    Ok((shape, [h, w]))
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let (shape, hw) = spatial(cx)?;
    let wshape = cx.shape(1)?;
    let wdims: Vec<usize> = wshape
        .iter()
        .map(|d| {
            d.as_fixed()
                .map(|k| k as usize)
                .ok_or("weights that depend on the batch size")
        })
        .collect::<Result<_, _>>()?;
    if wdims.len() != 4 || wdims.contains(&0) {
        return Err(format!(
            "weights of shape {wdims:?}: only 2-D convolutions are supported"
        ));
    }
    let groups = cx.attr_i("group", 1)?;
    let groups = usize::try_from(groups)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or("group < 1")?;
    let c = shape[1]
        .as_fixed()
        .ok_or("channels depend on the batch size")? as usize;
    let (m, cg) = (wdims[0], wdims[1]);
    if cg * groups != c || m % groups != 0 {
        return Err(format!(
            "weights {wdims:?} with {groups} groups do not fit {c} input channels"
        ));
    }
    if let Some(b) = cx.input(2) {
        if b.shape() != vec![Sym::fixed(m as i64)] {
            return Err(format!(
                "bias of shape {} for {m} output channels",
                sym::show(&b.shape())
            ));
        }
    }
    let w = window(cx, hw, Some([wdims[2], wdims[3]]))?;
    if w.kernel != [wdims[2], wdims[3]] {
        return Err(format!(
            "kernel_shape {:?} differs from the weights' {wdims:?}",
            w.kernel
        ));
    }
    let oh = out_size(
        hw[0],
        w.pads[0] + w.pads[2],
        w.kernel[0],
        w.stride[0],
        w.dilation[0],
    )?;
    let ow = out_size(
        hw[1],
        w.pads[1] + w.pads[3],
        w.kernel[1],
        w.stride[1],
        w.dilation[1],
    )?;
    let out = vec![
        shape[0],
        Sym::fixed(m as i64),
        Sym::fixed(oh as i64),
        Sym::fixed(ow as i64),
    ];
    let mut args = vec![Arg::Input(0), Arg::Input(1)];
    if cx.input(2).is_some() {
        args.push(Arg::Input(2));
    }
    let op = Op::Conv(Conv {
        stride: w.stride,
        dilation: w.dilation,
        groups,
        pads: w.pads,
        input_slope: None,
    });
    Ok(Compiled::Run {
        op,
        args,
        shapes: vec![out],
    })
}

// ---------------------------------------------------------------------------------- forward

/// The 4-D tensor of a canonical one whose first dimension is 1.
pub(crate) fn to4<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 4> {
    let [_, n, c, h, w] = x.dims();
    x.reshape([n, c, h, w])
}

pub(crate) fn run<B: Kernels>(
    x: Tensor<B, 5>,
    w: Tensor<B, 5>,
    b: Option<Tensor<B, 5>>,
    p: &Conv,
) -> Tensor<B, 5> {
    let (x, w) = (to4(x), to4(w));
    let b = b.map(|b| {
        let m = b.dims()[4];
        b.reshape([m])
    });
    let [t, l, bo, r] = p.pads;
    // jem-kernels' convolution takes the same padding on both sides: an asymmetric one is
    // made explicit first (zeros, which a fused activation keeps).
    let (x, padding) = if t == bo && l == r {
        (x, [t, l])
    } else {
        (x.pad([(t, bo), (l, r)], PadMode::Constant(0.0)), [0, 0])
    };
    let options = ConvOptions::new(p.stride, padding, p.dilation, p.groups);
    let slope = p.input_slope.map(f64::from);
    conv2d_tensors(x, w, b, options, slope).unsqueeze_dim(0)
}

/// The tangent of a convolution's output for the tangents of its input, weights and bias
/// (`None`: constant), at the point `primal`.
pub(crate) fn tangent<B: Kernels>(
    primal: &super::Primal<B>,
    [tx, tw, tb]: [Option<Tensor<B, 5>>; 3],
    p: &Conv,
    out: [usize; 5],
) -> Tensor<B, 5> {
    super::sum_terms(
        [
            tx.map(|t| run_tangent(primal, t, p)),
            tw.map(|t| run(primal.input(0), t, None, p)),
            tb.map(|t| {
                let m = t.dims()[4];
                t.reshape([1, 1, m, 1, 1])
            }),
        ],
        out,
    )
}

/// The tangent of a convolution's output for a tangent `t` of its input `x`: the convolution
/// of `t`, through a fused activation's slope at `x` as the fused convolution's own gradient
/// takes it (jem-kernels': 1 where x ≥ 0, the slope elsewhere; see [`crate::fuse`] on x = 0).
/// The slope is piecewise constant in `x`: not tracked.
fn run_tangent<B: Kernels>(primal: &super::Primal<B>, t: Tensor<B, 5>, p: &Conv) -> Tensor<B, 5> {
    let t = match p.input_slope {
        Some(slope) => t * leaky_relu_derivative(primal.input(0).detach(), f64::from(slope)),
        None => t,
    };
    let linear = Conv {
        input_slope: None,
        ..p.clone()
    };
    run(t, primal.input(1), None, &linear)
}
