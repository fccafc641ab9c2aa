//! Kernels for Wide-ResNets and their training (convolutions, LeakyReLU, the Adam and SGLD
//! updates) as a burn backend extension.
//!
//! burn's CPU backend (`flex`) computes a convolution's weight gradient through transposed
//! copies and a convolution whose output is the kernel, and its input gradient through a
//! single-threaded transposed convolution. This crate gives each of the four pieces one matrix
//! product of the `gemm` crate (the same micro-kernels burn uses, chosen at run time for the
//! CPU's instruction set):
//!
//! - forward: `weight [out, in·kh·kw] × im2col(x)`, a chunk of images per product — except the
//!   stride-1 "same" convolutions of larger maps on x86-64 CPUs with AVX-512F or AVX2 + FMA,
//!   which run a direct kernel of this crate that reads the shifted input rows in place (no
//!   im2col, no packing; elsewhere they go by kernel rows, a third of im2col's copying);
//! - input gradient: at stride 1, the forward kernel on the output gradient with the flipped,
//!   transposed weight; otherwise `weightᵀ × grad` scattered back by col2im;
//! - weight gradient: `grad × im2col(x)ᵀ`, the transpose read through strides, never copied;
//! - bias gradient: row sums.
//!
//! Which instruction set the direct kernel uses is [`isa()`]: the best the CPU has, capped for
//! the process by the environment variable `JEM_BENCH_ISA` (`avx512`, `avx2`, `portable`: no
//! direct kernel) or by [`set_isa`]. A binary should call [`isa_from_env`] early to report an
//! invalid value, which the kernels otherwise ignore. The cap does not reach the `gemm`
//! crate's matrix products, which pick their own instruction set (see [`Isa`]).
//!
//! Chunks of images run in parallel on rayon's pool; scratch buffers are reused per thread;
//! the results are the same bits for any number of threads.
//!
//! A LeakyReLU in front of a convolution, a pre-activation block's `conv(act(x))`, is fused into
//! it ([`leaky_relu_conv2d`]): applied while the input is unfolded, its derivative applied as
//! the input gradient is written, the activated maps never stored. A block's last convolution
//! takes its shortcut too ([`leaky_relu_conv2d_add`]), which a GPU adds as the sums are
//! written. A LeakyReLU on its own ([`leaky_relu`], trait [`FastActivation`]) is one pass over
//! memory forward and one backward, on every core; burn's autodiff records it as a composition
//! of eight passes.
//!
//! [`FastConv`] is the extension trait: implemented with these kernels for `Flex`, with a
//! backward node for `Autodiff<B>` over any `B: FastConv`, and, with the `cuda` or `wgpu`
//! feature, for burn's GPU backends without fusion (`Cuda`, `Wgpu`): burn's direct convolution in
//! true f32, whose two gradients are composed from that forward convolution and a matrix product
//! ([`conv2d_input_grad_from_forward`], [`conv2d_weight_grad_from_matmul`]) — burn 0.21's own
//! CUDA backward kernels are wrong for some shapes, and its autotuned kernels compute in TF32.
//! [`FastLinear`] does the same for matrix products and a network's linear head ([`linear`]):
//! burn's own on the CPU, cubek's unit-tiled f32 product on a GPU. [`FastAdam`] is Adam's update of
//! a parameter tensor in one pass over memory (one launch on a GPU, thirteen with burn's `Adam`),
//! burn's numbers to the bit on the CPU; [`FusedAdam`] is the optimiser built on it. [`FastSgld`]
//! does the same for an SGLD step's update of the pixels ([`sgld_update`]). A model calls
//! [`conv2d`] where it would call `Conv2d::forward`:
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::nn::conv::Conv2dConfig;
//! use burn::nn::PaddingConfig2d;
//! use burn::tensor::{Distribution, Tensor};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let conv = Conv2dConfig::new([3, 8], [3, 3])
//!     .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
//!     .init::<B>(&device);
//! let x = Tensor::<B, 4>::random([2, 3, 9, 9], Distribution::Default, &device).require_grad();
//!
//! let ours = jem_kernels::conv2d(&conv, x.clone());
//! let burns = conv.forward(x.clone());
//! assert!(ours.clone().sub(burns.clone()).abs().max().into_scalar() < 1e-5);
//!
//! // The gradients agree as well.
//! let grad_ours = ours.sum().backward();
//! let grad_burns = burns.sum().backward();
//! let (a, b) = (x.grad(&grad_ours).unwrap(), x.grad(&grad_burns).unwrap());
//! assert!(a.sub(b).abs().max().into_scalar() < 1e-4);
//! ```

#![warn(missing_docs)]

mod activation;
mod adam;
#[cfg(feature = "cubecl")]
mod adam_kernel;
mod backend;
mod conv;
#[cfg(feature = "cubecl")]
mod cube;
mod fresh;
mod gpu_conv;
mod isa;
mod linear;
mod matmul;
mod module;
mod portable;
mod process_choice;
mod sgld;
#[cfg(feature = "cubecl")]
mod sgld_kernel;
#[cfg(test)]
mod test_tensors;
#[cfg(feature = "cubecl")]
mod tiled_conv;
#[cfg(feature = "cubecl")]
mod tiled_weight_grad;

pub use activation::{leaky_relu, leaky_relu_derivative, FastActivation};
pub use adam::{AdamStep, FastAdam, FusedAdam};
pub use backend::{implementation, set_implementation, FastConv, Implementation};
pub use conv::{conv2d_bias_grad, conv2d_input_grad, conv2d_weight_grad, ConvGeometry};
#[cfg(feature = "cuda")]
pub use cube::Cuda;
#[cfg(feature = "wgpu")]
pub use cube::Wgpu;
pub use gpu_conv::{gpu_conv, set_gpu_conv, GpuConv, GPU_CONV_VARIABLE, IM2COL_MIN_TERMS};
pub use isa::{gemm_isa, isa, isa_from_env, set_isa, Isa, ISA_VARIABLE};
pub use linear::{linear, FastLinear};
pub use module::{
    conv2d, conv2d_tensors, conv2d_without_bias, leaky_relu_conv2d, leaky_relu_conv2d_add,
};
pub use portable::{
    conv2d_from_matmul, conv2d_input_grad_from_forward, conv2d_weight_grad_from_matmul,
    conv2d_weight_grad_in_chunks, portable_gradients_apply, weight_grad_chunks,
    WEIGHT_GRAD_MIN_CHUNK, WEIGHT_GRAD_PARTIAL_SUMS,
};
pub use sgld::{sgld_update, FastSgld};

/// The raw forward kernel on NCHW slices (see [`ConvGeometry`]).
pub use conv::conv2d as conv2d_slices;

use burn::tensor::backend::AutodiffBackend;

/// A backend with every kernel of this crate: what a Wide-ResNet's forward pass, its training
/// step and SGLD's chains ask for.
pub trait Kernels: FastConv + FastActivation + FastLinear + FastAdam + FastSgld {}

impl<B: FastConv + FastActivation + FastLinear + FastAdam + FastSgld> Kernels for B {}

/// An autodiff backend whose inner backend has the kernels too: what code that differentiates
/// a model on one backend and evaluates it on the inner one (training, attacks) asks for.
pub trait KernelsAutodiff: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

impl<B> KernelsAutodiff for B
where
    B: AutodiffBackend + Kernels,
    B::InnerBackend: Kernels,
{
}
