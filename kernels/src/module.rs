//! [`conv2d`], [`leaky_relu_conv2d`], [`leaky_relu_conv2d_add`] and [`conv2d_without_bias`]: a
//! burn `Conv2d` module applied through [`FastConv`]; [`conv2d_tensors`]: the same on bare
//! tensors (a graph interpreter's convolution).

use burn::nn::conv::Conv2d;
use burn::nn::PaddingConfig2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::FastConv;

/// `conv.forward(x)`, computed by the backend's [`FastConv`] kernels. Asymmetric padding (which
/// `PaddingConfig2d::Same` gives for even kernels) goes through burn's own module.
pub fn conv2d<B: FastConv>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    fused_conv2d(conv, x, None, true, None)
}

/// The convolution's linear part, `conv.forward(x)` without its bias: what a linearised
/// network (a Jacobian-vector product) applies.
pub fn conv2d_without_bias<B: FastConv>(conv: &Conv2d<B>, x: Tensor<B, 4>) -> Tensor<B, 4> {
    fused_conv2d(conv, x, None, false, None)
}

/// `conv.forward(leaky_relu(x, slope))` with the activation fused into the convolution: the
/// activated maps are computed chunk by chunk in cache and never stored, neither for the
/// forward pass nor for the backward one (which recomputes them from `x`). A pre-activation
/// residual block's `conv(act(x))` in one operation.
pub fn leaky_relu_conv2d<B: FastConv>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    slope: f64,
) -> Tensor<B, 4> {
    fused_conv2d(conv, x, Some(slope), true, None)
}

/// [`leaky_relu_conv2d`] plus `residual` (shaped like the output): a pre-activation residual
/// block's last convolution and its closing addition in one operation
/// ([`FastConv::fast_conv2d_add`]).
pub fn leaky_relu_conv2d_add<B: FastConv>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    slope: f64,
    residual: Tensor<B, 4>,
) -> Tensor<B, 4> {
    fused_conv2d(conv, x, Some(slope), true, Some(residual))
}

fn fused_conv2d<B: FastConv>(
    conv: &Conv2d<B>,
    x: Tensor<B, 4>,
    slope: Option<f64>,
    with_bias: bool,
    residual: Option<Tensor<B, 4>>,
) -> Tensor<B, 4> {
    let [_, _, height, width] = x.dims();
    let bias = conv.bias.as_ref().filter(|_| with_bias);
    let Some(padding) = symmetric_padding(conv, height, width) else {
        let x = match slope {
            Some(slope) => burn::tensor::activation::leaky_relu(x, slope),
            None => x,
        };
        let out = conv.forward(x);
        // burn's module always adds its bias, uniformly per channel: take it off again.
        let out = match conv.bias.as_ref().filter(|_| !with_bias) {
            Some(b) => {
                let c = b.dims()[0];
                out - b.val().reshape([1, c, 1, 1])
            }
            None => out,
        };
        return match residual {
            Some(r) => out + r,
            None => out,
        };
    };
    let options = ConvOptions::new(conv.stride, padding, conv.dilation, conv.groups);
    let bias = bias.map(|b| b.val());
    tensors_conv2d(x, conv.weight.val(), bias, options, slope, residual)
}

/// burn's `conv2d(x, weight, bias, options)` (padding the same on both sides of each
/// dimension, as [`ConvOptions`] has it), or given `input_slope` the convolution of
/// LeakyReLU(x) with that slope, computed by the backend's [`FastConv`] kernels.
pub fn conv2d_tensors<B: FastConv>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: ConvOptions<2>,
    input_slope: Option<f64>,
) -> Tensor<B, 4> {
    tensors_conv2d(x, weight, bias, options, input_slope, None)
}

/// [`conv2d_tensors`], plus `residual` where given ([`FastConv::fast_conv2d_add`]).
fn tensors_conv2d<B: FastConv>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: ConvOptions<2>,
    input_slope: Option<f64>,
    residual: Option<Tensor<B, 4>>,
) -> Tensor<B, 4> {
    let (x, weight) = (
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
    );
    let bias = bias.map(|b| b.into_primitive().tensor());
    let out = match residual {
        Some(r) => {
            let r = r.into_primitive().tensor();
            B::fast_conv2d_add(x, weight, bias, options, input_slope, r)
        }
        None => B::fast_conv2d(x, weight, bias, options, input_slope),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The padding per side, if it is the same on both sides of each dimension.
fn symmetric_padding<B: FastConv>(
    conv: &Conv2d<B>,
    height: usize,
    width: usize,
) -> Option<[usize; 2]> {
    match conv.padding {
        PaddingConfig2d::Valid => Some([0, 0]),
        PaddingConfig2d::Explicit(top, left, bottom, right) => {
            (top == bottom && left == right).then_some([top, left])
        }
        PaddingConfig2d::Same => {
            // burn's rule: total = (ceil(n / s) − 1)·s + k − n, the smaller half first.
            let same = |n: usize, k: usize, s: usize| {
                let total = ((n.div_ceil(s) - 1) * s + k).saturating_sub(n);
                total.is_multiple_of(2).then_some(total / 2)
            };
            let [kh, kw] = conv.kernel_size;
            Some([
                same(height, kh, conv.stride[0])?,
                same(width, kw, conv.stride[1])?,
            ])
        }
    }
}
