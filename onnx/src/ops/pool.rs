//! MaxPool, AveragePool (count_include_pad, ceil_mode, padding, dilation) and
//! GlobalAveragePool.
//!
//! Written with ops whose derivatives autodiff differentiates again — burn's own pooling
//! backward passes cannot be (a double backward through them panics) — so that an attack can
//! differentiate through a gradient: max pooling as a running maximum over the kernel's strided
//! slices, average pooling as a depthwise convolution with ones divided by each window's count.

use burn::tensor::backend::Backend;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::ops::PadMode;
use burn::tensor::{Slice, Tensor};

use super::conv::{out_size, spatial, to4, window};
use super::Op;
use crate::compile::{Arg, Compiled, Cx, Res};
use crate::host::HostTensor;
use crate::sym::Sym;

/// A pooling window after padding is resolved: the input is padded by `pads` (top, left,
/// bottom, right; bottom and right include what ceil_mode needs) and every window fits.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pool {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub pads: [usize; 4],
    pub out: [usize; 2],
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let op = cx.node.op_type.as_str();
    let (shape, hw) = spatial(cx)?;
    if op == "GlobalAveragePool" {
        let out = vec![shape[0], shape[1], Sym::fixed(1), Sym::fixed(1)];
        return Ok(Compiled::Run {
            op: Op::GlobalAvgPool,
            args: vec![Arg::Input(0)],
            shapes: vec![out],
        });
    }
    let w = window(cx, hw, None)?;
    let ceil = cx.attr_i("ceil_mode", 0)? != 0;
    let mut pads = w.pads;
    let mut out = [0; 2];
    for a in 0..2 {
        let (k, s, d) = (w.kernel[a], w.stride[a], w.dilation[a]);
        if w.pads[a] > (k - 1) * d || w.pads[a + 2] > (k - 1) * d {
            return Err(format!("padding {:?} as large as the window", w.pads));
        }
        let floor = out_size(hw[a], w.pads[a] + w.pads[a + 2], k, s, d)?;
        let span = (k - 1) * d + 1;
        let padded = hw[a] + w.pads[a] + w.pads[a + 2];
        let mut o = floor;
        if ceil && (padded - span) % s != 0 {
            o += 1;
            // The last window must start inside the input or its left padding (PyTorch, ONNX).
            if (o - 1) * s >= hw[a] + w.pads[a] {
                o -= 1;
            }
        }
        out[a] = o;
        // Room for every window: extra bottom/right padding (never counted by AveragePool).
        pads[a + 2] += ((o - 1) * s + span).saturating_sub(padded);
    }
    let pool = Pool {
        kernel: w.kernel,
        stride: w.stride,
        dilation: w.dilation,
        pads,
        out,
    };
    let out_shape = vec![
        shape[0],
        shape[1],
        Sym::fixed(out[0] as i64),
        Sym::fixed(out[1] as i64),
    ];
    if op == "MaxPool" {
        // A used second output (the indices) is refused by the compiler.
        return Ok(Compiled::Run {
            op: Op::MaxPool(pool),
            args: vec![Arg::Input(0)],
            shapes: vec![out_shape],
        });
    }
    // AveragePool: ones for the depthwise sum, and each output's count.
    let include_pad = cx.attr_i("count_include_pad", 0)? != 0;
    let c = shape[1]
        .as_fixed()
        .ok_or("channels depend on the batch size")? as usize;
    let counts: Vec<Vec<f32>> = (0..2)
        .map(|a| {
            let (lo, hi) = if include_pad {
                (-(w.pads[a] as i64), (hw[a] + w.pads[a + 2]) as i64)
            } else {
                (0, hw[a] as i64)
            };
            (0..out[a])
                .map(|o| {
                    let start = (o * w.stride[a]) as i64 - w.pads[a] as i64;
                    (0..w.kernel[a])
                        .map(|j| start + (j * w.dilation[a]) as i64)
                        .filter(|p| (lo..hi).contains(p))
                        .count() as f32
                })
                .collect()
        })
        .collect();
    let divisor: Vec<f32> = counts[0]
        .iter()
        .flat_map(|&ch| counts[1].iter().map(move |&cw| 1.0 / (ch * cw).max(1.0)))
        .collect();
    let ones = HostTensor::float(
        vec![c, 1, w.kernel[0], w.kernel[1]],
        vec![1.0; c * w.kernel[0] * w.kernel[1]],
    );
    let divisor = HostTensor::float(vec![out[0], out[1]], divisor);
    let args = vec![Arg::Input(0), Arg::Host(ones), Arg::Host(divisor)];
    Ok(Compiled::Run {
        op: Op::AvgPool(pool),
        args,
        shapes: vec![out_shape],
    })
}

// ---------------------------------------------------------------------------------- forward

fn padded<B: Backend>(x: Tensor<B, 4>, p: &Pool, value: f32) -> Tensor<B, 4> {
    let [t, l, b, r] = p.pads;
    if t + l + b + r == 0 {
        return x;
    }
    x.pad([(t, b), (l, r)], PadMode::Constant(value))
}

/// The kernel's strided slices of a padded input, row-major over the window: element (i, j)
/// of every window at once.
fn window_elements<B: Backend>(
    x: Tensor<B, 4>,
    p: &Pool,
) -> impl Iterator<Item = Tensor<B, 4>> + '_ {
    let [n, c, _, _] = x.dims();
    (0..p.kernel[0]).flat_map(move |i| {
        let x = x.clone();
        (0..p.kernel[1]).map(move |j| {
            let h0 = (i * p.dilation[0]) as isize;
            let w0 = (j * p.dilation[1]) as isize;
            let h1 = h0 + ((p.out[0] - 1) * p.stride[0]) as isize + 1;
            let w1 = w0 + ((p.out[1] - 1) * p.stride[1]) as isize + 1;
            x.clone().slice([
                Slice::new(0, Some(n as isize), 1),
                Slice::new(0, Some(c as isize), 1),
                Slice::new(h0, Some(h1), p.stride[0] as isize),
                Slice::new(w0, Some(w1), p.stride[1] as isize),
            ])
        })
    })
}

pub(crate) fn run_max<B: Backend>(x: Tensor<B, 5>, p: &Pool) -> Tensor<B, 5> {
    let x = padded(to4(x), p, f32::NEG_INFINITY);
    // Row-major over the window; ties keep the earlier element, as PyTorch's argmax does.
    window_elements(x, p)
        .reduce(|best, part| best.max_pair(part))
        .expect("a kernel has at least one element")
        .unsqueeze_dim(0)
}

/// MaxPool's tangent: each window's tangent at the element the forward pass picks (the first
/// of equal maxima, as `max_pair` keeps the earlier).
pub(crate) fn tangent_max<B: Backend>(x: Tensor<B, 5>, t: Tensor<B, 5>, p: &Pool) -> Tensor<B, 5> {
    let x = padded(to4(x), p, f32::NEG_INFINITY);
    let t = padded(to4(t), p, 0.0);
    window_elements(x, p)
        .zip(window_elements(t, p))
        .reduce(|(best, best_t), (part, part_t)| {
            let later = best.clone().lower(part.clone());
            (best.max_pair(part), best_t.mask_where(later, part_t))
        })
        .expect("a kernel has at least one element")
        .1
        .unsqueeze_dim(0)
}

pub(crate) fn run_avg<B: Backend>(
    x: Tensor<B, 5>,
    ones: Tensor<B, 5>,
    divisor: Tensor<B, 5>,
    p: &Pool,
) -> Tensor<B, 5> {
    let x = padded(to4(x), p, 0.0);
    let c = x.dims()[1];
    let sum = conv2d(
        x,
        to4(ones),
        None,
        ConvOptions::new(p.stride, [0, 0], p.dilation, c),
    );
    sum.unsqueeze_dim(0) * divisor
}

pub(crate) fn run_global_avg<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 5> {
    x.mean_dim(3).mean_dim(4)
}
