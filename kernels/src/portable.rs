//! A convolution's two gradients composed from the operations every backend already computes
//! right: a forward convolution (stride 1, no dilation) for the input gradient, a matrix product
//! for the weight gradient, and zero-padding, slicing and reshapes around them.
//!
//! Why: a backend's own backward kernels are separate code paths, autotuned between several
//! candidates per shape, and may be wrong where its forward pass is right (burn 0.21's CUDA
//! backend: see docs/gpu.md). Built from the forward convolution and the matrix product, the
//! gradients are right wherever those two are, and the construction itself is checked on the CPU
//! backend against burn's gradients (`tests/portable_gradients.rs`), so a GPU run has only its
//! forward convolution and matrix product left to agree.
//!
//! With `y[n,o,p,q] = Σ_{i,a,b} w[o,i,a,b] · x̄[n,i, s·p + a, s·q + b]` (x̄: x zero-padded by P),
//!
//! - input gradient: x̄'s gradient is the full correlation of the output gradient, dilated by the
//!   stride (s − 1 zeros between its rows and columns), with the weight flipped in both spatial
//!   axes and its two channel axes swapped; the rows x̄ adds for padding are cut away. Rows of x̄
//!   that no output reads ((H + 2P − k) mod s of them, at the bottom) get zero.
//! - weight gradient: for each tap (a, b), `Σ_{n,p,q} g[n,o,p,q] · x̄[n,i, s·p + a, s·q + b]`, one
//!   product of the output gradient `[out, N·L]` with the unfolded input `[N·L, in·kh·kw]`; the
//!   strided reads of x̄ are reshapes (`[…, oh, s, ow, s]`, keep index 0), not strided slices.
//!
//! The convolution and the product are the backend's [`FastConv::fast_conv2d`] and
//! [`FastLinear::fast_matmul`], so that a backend's choice of kernels (CUDA: true f32, not
//! burn's TF32 tensor-core kernels) holds for the gradients too.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{Tensor, TensorPrimitive};

use crate::{FastConv, FastLinear};

fn wrap<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn unwrap<B: Backend>(t: Tensor<B, 4>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

/// Whether [`conv2d_input_grad_from_forward`] and [`conv2d_weight_grad_from_matmul`] handle
/// these options: one group, no dilation (every Wide-ResNet convolution).
pub fn portable_gradients_apply(options: &ConvOptions<2>) -> bool {
    options.groups == 1 && options.dilation == [1, 1]
}

/// Panics unless the construction applies to `options` and an `input`-sized map convolved with
/// a `kernel`-sized weight gives an `output`-sized one.
fn check_shapes(
    options: &ConvOptions<2>,
    input: [usize; 2],
    kernel: [usize; 2],
    output: [usize; 2],
) {
    assert!(
        portable_gradients_apply(options),
        "one group and no dilation"
    );
    for d in 0..2 {
        let expected = (input[d] + 2 * options.padding[d] - kernel[d]) / options.stride[d] + 1;
        assert_eq!(output[d], expected, "output size of the convolution");
    }
}

/// Inserts `stride − 1` zeros between consecutive rows and between consecutive columns:
/// `[n, c, h, w]` → `[n, c, (h − 1)·sh + 1, (w − 1)·sw + 1]`.
fn dilate<B: Backend>(t: Tensor<B, 4>, stride: [usize; 2]) -> Tensor<B, 4> {
    if stride == [1, 1] {
        return t;
    }
    let [n, c, h, w] = t.dims();
    let [sh, sw] = stride;
    t.reshape([n, c, h, 1, w, 1])
        .pad([(0, 0), (0, sh - 1), (0, 0), (0, sw - 1)], 0.0)
        .reshape([n, c, h * sh, w * sw])
        .slice([0..n, 0..c, 0..(h - 1) * sh + 1, 0..(w - 1) * sw + 1])
}

/// The gradient of `conv2d(x, weight)` with respect to `x` (`[n, in, height, width]`, of which
/// only the spatial size is needed), from one forward convolution at stride 1.
///
/// # Panics
/// If the options have groups or dilation (see [`portable_gradients_apply`]), or if the shapes do
/// not belong to one convolution.
pub fn conv2d_input_grad_from_forward<B: FastConv + FastLinear>(
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    input_size: [usize; 2],
    options: &ConvOptions<2>,
) -> FloatTensor<B> {
    let (weight, grad) = (wrap::<B>(weight), wrap::<B>(output_grad));
    let [_, _, kh, kw] = weight.dims();
    let [n, out, oh, ow] = grad.dims();
    let [h, w] = input_size;
    let [ph, pw] = options.padding;
    let [sh, sw] = options.stride;
    check_shapes(options, [h, w], [kh, kw], [oh, ow]);
    // Rows and columns of the padded input that no output reads.
    let (rh, rw) = ((h + 2 * ph - kh) % sh, (w + 2 * pw - kw) % sw);
    // Full correlation: k − 1 zeros on each side (plus the unread rows at the end); then only
    // the window whose correlation lands on x itself, not on its padding, is kept.
    let padded = dilate(grad, [sh, sw])
        .pad([(kh - 1, kh - 1 + rh), (kw - 1, kw - 1 + rw)], 0.0)
        .slice([0..n, 0..out, ph..ph + h + kh - 1, pw..pw + w + kw - 1]);
    let flipped = weight.swap_dims(0, 1).flip([2, 3]);
    B::fast_conv2d(
        unwrap(padded),
        unwrap(flipped),
        None,
        ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
        None,
    )
}

/// `x` (`[n, in, h, w]`) unfolded for a convolution with an `[kh, kw]` kernel and `[oh, ow]`
/// output: `[n·oh·ow, in·kh·kw]`, row (n, p, q) holding the padded input's taps
/// x̄[n, i, s·p + a, s·q + b] in the order of a weight's last three axes. Slices and reshapes
/// only: the strided reads are reshapes (`[…, oh, s, ow, s]`, keep index 0).
fn unfold<B: Backend>(
    x: Tensor<B, 4>,
    kernel: [usize; 2],
    output: [usize; 2],
    options: &ConvOptions<2>,
) -> Tensor<B, 2> {
    let [n, cin, h, w] = x.dims();
    let ([kh, kw], [oh, ow]) = (kernel, output);
    let [ph, pw] = options.padding;
    let [sh, sw] = options.stride;
    // Enough zeros below and to the right that every tap's window of s·oh rows fits.
    let (hp, wp) = (kh - 1 + sh * oh, kw - 1 + sw * ow);
    let padded = x.pad([(ph, hp - h - ph), (pw, wp - w - pw)], 0.0);
    let mut taps = Vec::with_capacity(kh * kw);
    for a in 0..kh {
        for b in 0..kw {
            // x̄[n, i, s·p + a, s·q + b] for every output position (p, q).
            let window = padded
                .clone()
                .slice([0..n, 0..cin, a..a + sh * oh, b..b + sw * ow])
                .reshape([n, cin, oh, sh, ow, sw])
                .slice([0..n, 0..cin, 0..oh, 0..1, 0..ow, 0..1])
                .reshape([n, cin, oh * ow]);
            taps.push(window);
        }
    }
    // [n, in, taps, L] → [n·L, in·taps], in the order of the weight's last three axes.
    Tensor::stack::<4>(taps, 2)
        .permute([0, 3, 1, 2])
        .reshape([n * oh * ow, cin * kh * kw])
}

/// `conv2d(x, weight) + bias` as one matrix product of the unfolded input `[N·L, in·kh·kw]`
/// with the weight `[in·kh·kw, out]` ([`FastLinear::fast_matmul`]): an im2col convolution,
/// for a backend whose matrix product is faster than its convolution.
///
/// # Panics
/// If the options have groups or dilation (see [`portable_gradients_apply`]).
pub fn conv2d_from_matmul<B: FastConv + FastLinear>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    options: &ConvOptions<2>,
) -> FloatTensor<B> {
    let (x, weight) = (wrap::<B>(x), wrap::<B>(weight));
    let [n, _, h, w] = x.dims();
    let [out, cin, kh, kw] = weight.dims();
    let [ph, pw] = options.padding;
    let [sh, sw] = options.stride;
    let (oh, ow) = ((h + 2 * ph - kh) / sh + 1, (w + 2 * pw - kw) / sw + 1);
    check_shapes(options, [h, w], [kh, kw], [oh, ow]);
    let columns = unfold(x, [kh, kw], [oh, ow], options)
        .into_primitive()
        .tensor();
    let weights = weight.reshape([out, cin * kh * kw]).swap_dims(0, 1);
    let product = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::fast_matmul(
        columns,
        weights.into_primitive().tensor(),
    )));
    let y = product.reshape([n, oh, ow, out]).permute([0, 3, 1, 2]);
    let y = match bias {
        Some(bias) => {
            let bias = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(bias));
            y + bias.reshape([1, out, 1, 1])
        }
        None => y,
    };
    unwrap(y)
}

/// The gradient of `conv2d(x, weight)` with respect to its `[out, in, kh, kw]` weight, as one
/// matrix product of the output gradient with the unfolded input.
///
/// # Panics
/// If the options have groups or dilation (see [`portable_gradients_apply`]), or if the shapes do
/// not belong to one convolution.
pub fn conv2d_weight_grad_from_matmul<B: FastConv + FastLinear>(
    x: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    kernel: [usize; 2],
    options: &ConvOptions<2>,
) -> FloatTensor<B> {
    let (x, grad) = (wrap::<B>(x), wrap::<B>(output_grad));
    let [n, cin, h, w] = x.dims();
    let [_, out, oh, ow] = grad.dims();
    let [kh, kw] = kernel;
    check_shapes(options, [h, w], [kh, kw], [oh, ow]);
    let columns = unfold(x, kernel, [oh, ow], options);
    let rows = grad.swap_dims(0, 1).reshape([out, n * oh * ow]);
    let [rows, columns] = [rows, columns].map(|m| m.into_primitive().tensor());
    let product =
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::fast_matmul(rows, columns)));
    unwrap(product.reshape([out, cin, kh, kw]))
}
