//! A convolution's two gradients composed from the operations every backend already computes
//! right: a forward convolution (stride 1, no dilation) for the input gradient, a matrix product
//! for the weight gradient, and zero-padding, slicing and reshapes around them.
//!
//! Why: a backend's own backward kernels are separate code paths, autotuned between several
//! candidates per shape, and may be wrong where its forward pass is right (burn 0.21's CUDA
//! backend: see docs/gpu.md). Built from the forward convolution and the matrix product, the
//! gradients are right wherever those two are, and the construction itself is checked on the CPU
//! backend against burn's gradients (`tests/suite/portable_gradients.rs`), so a GPU run has only
//! its forward convolution and matrix product left to agree.
//!
//! With `y[n,o,p,q] = Σ_{i,a,b} w[o,i,a,b] · x̄[n,i, s·p + a, s·q + b]` (x̄: x zero-padded by P),
//!
//! - input gradient: x̄'s gradient is the full correlation of the output gradient, dilated by the
//!   stride (s − 1 zeros between its rows and columns), with the weight flipped in both spatial
//!   axes and its two channel axes swapped; the rows x̄ adds for padding are cut away. Rows of x̄
//!   that no output reads ((H + 2P − k) mod s of them, at the bottom) get zero.
//! - weight gradient: for each tap (a, b), `Σ_{n,p,q} g[n,o,p,q] · x̄[n,i, s·p + a, s·q + b]`, the
//!   product of the output gradient `[out, N·L]` with the unfolded input `[N·L, in·kh·kw]`, its
//!   long reduction split into chunks where the layer is narrow; the strided reads of x̄ are
//!   reshapes (`[…, oh, s, ow, s]`, keep index 0), not strided slices.
//!
//! The convolution and the product are the backend's [`FastConv::fast_conv2d`] and
//! [`FastLinear::fast_matmul`], so that a backend's choice of kernels (CUDA: true f32, not
//! burn's TF32 tensor-core kernels) holds for the gradients too.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor};
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

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

/// Products a chunk of the weight gradient's reduction sums at least, when
/// [`weight_grad_chunks`] splits it.
pub const WEIGHT_GRAD_MIN_CHUNK: usize = 256;

/// Partial sums (\[chunks\] × out × in·kh·kw) [`weight_grad_chunks`] aims at: enough independent
/// sums to occupy a GPU's cores, few enough that the partial sums stay small (4 MiB).
pub const WEIGHT_GRAD_PARTIAL_SUMS: usize = 1 << 20;

/// Into how many chunks [`conv2d_weight_grad_from_matmul`] splits the reduction of a weight
/// gradient with `outputs` elements (out · in · kh · kw) over `products` terms each
/// (batch · output pixels): the largest divisor of `products` that keeps chunks at least
/// [`WEIGHT_GRAD_MIN_CHUNK`] long and the partial sums within [`WEIGHT_GRAD_PARTIAL_SUMS`];
/// 1 (one product, no split) for a wide layer.
///
/// Why: a narrow layer's weight gradient has few elements (WRN-10-1's first convolution: 144)
/// and long sums (50 176 at batch 64 on 28×28). As one matrix product it gives a GPU a few
/// threads with long loops: on an H200 the weight gradients took about 90 % of a WRN-10-1 train
/// step (docs/gpu.md). Chunked, they are a batch of short products and a sum over chunks.
pub fn weight_grad_chunks(products: usize, outputs: usize) -> usize {
    let most = (products / WEIGHT_GRAD_MIN_CHUNK).min(WEIGHT_GRAD_PARTIAL_SUMS / outputs.max(1));
    (1..=most.max(1))
        .rev()
        .find(|&c| products.is_multiple_of(c))
        .unwrap_or(1)
}

/// The gradient of `conv2d(x, weight)` with respect to its `[out, in, kh, kw]` weight: the
/// output gradient `[out, N·L]` times the unfolded input `[N·L, in·kh·kw]`, its reduction split
/// into [`weight_grad_chunks`] chunks.
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
    let [n, cin, _, _] = x.shape().dims();
    let [_, out, oh, ow] = output_grad.shape().dims();
    let chunks = weight_grad_chunks(n * oh * ow, out * cin * kernel[0] * kernel[1]);
    conv2d_weight_grad_in_chunks::<B>(x, output_grad, kernel, options, chunks)
}

/// [`conv2d_weight_grad_from_matmul`] with the reduction over the batch and the output pixels
/// (N·L terms) split into `chunks` equal chunks: one batched product `[chunks, out, N·L/chunks]
/// · [chunks, N·L/chunks, in·kh·kw]` and a sum over chunks (1: one plain product).
///
/// # Panics
/// If `chunks` does not divide N·L, if the options have groups or dilation (see
/// [`portable_gradients_apply`]), or if the shapes do not belong to one convolution.
pub fn conv2d_weight_grad_in_chunks<B: FastConv + FastLinear>(
    x: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    kernel: [usize; 2],
    options: &ConvOptions<2>,
    chunks: usize,
) -> FloatTensor<B> {
    let (x, grad) = (wrap::<B>(x), wrap::<B>(output_grad));
    let [n, cin, h, w] = x.dims();
    let [_, out, oh, ow] = grad.dims();
    let [kh, kw] = kernel;
    check_shapes(options, [h, w], [kh, kw], [oh, ow]);
    let products = n * oh * ow;
    assert!(
        chunks > 0 && products % chunks == 0,
        "{chunks} chunks do not divide the weight gradient's {products} products"
    );
    let columns = unfold(x, kernel, [oh, ow], options);
    let rows = grad.swap_dims(0, 1).reshape([out, products]);
    let weight_grad = if chunks == 1 {
        let [rows, columns] = [rows, columns].map(|m| m.into_primitive().tensor());
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::fast_matmul(rows, columns)))
    } else {
        let chunk = products / chunks;
        let rows = rows.reshape([out, chunks, chunk]).swap_dims(0, 1);
        let columns = columns.reshape([chunks, chunk, cin * kh * kw]);
        let [rows, columns] = [rows, columns].map(|m| m.into_primitive().tensor());
        let partial =
            Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(B::fast_matmul(rows, columns)));
        partial.sum_dim(0).reshape([out, cin * kh * kw])
    };
    unwrap(weight_grad.reshape([out, cin, kh, kw]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_layers_split_their_weight_gradient_and_wide_or_short_ones_do_not() {
        // WRN-10-1's first convolution at batch 64 on 28×28: 144 sums of 50 176 = 2¹⁰ · 49
        // products, split into the most chunks of at least 256 products: 196 of 256.
        assert_eq!(weight_grad_chunks(64 * 28 * 28, 16 * 9), 196);
        // WRN-28-10's widest convolution: 3.7 million sums are already enough.
        assert_eq!(weight_grad_chunks(64 * 8 * 8, 640 * 640 * 9), 1);
        // Too short to split, or a prime length with no divisor to split it by.
        assert_eq!(weight_grad_chunks(300, 9), 1);
        assert_eq!(weight_grad_chunks(7919, 9), 1);
        // Any length: a divisor, chunks of at least the minimum, partial sums within the bound.
        for products in 1..3000 {
            for outputs in [1, 9, 144, 4608, 1 << 19, 1 << 21] {
                let chunks = weight_grad_chunks(products, outputs);
                assert_eq!(products % chunks, 0, "{products} {outputs}");
                if chunks > 1 {
                    assert!(products / chunks >= WEIGHT_GRAD_MIN_CHUNK);
                    assert!(chunks * outputs <= WEIGHT_GRAD_PARTIAL_SUMS);
                }
            }
        }
    }
}
