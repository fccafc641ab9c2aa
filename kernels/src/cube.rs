//! burn's GPU backends as jem-bench runs them: burn 0.21's `CubeBackend` without kernel fusion
//! ([`Cuda`]; [`Wgpu`] with the `wgpu` feature, which also runs on a software Vulkan device, so
//! that a machine without a GPU can run the same GPU kernels), with this crate's extensions,
//! computing convolutions and matrix products in true f32: burn's direct convolution kernel or
//! the unfolded input times the weight (per layer: [`crate::GpuConv`]) and cubek's unit-tiled
//! matrix product, on the CUDA cores (not the tensor cores).
//! burn's own choice for both, its autotuner, picks tensor-core kernels that compute f32 in
//! TF32 (inputs rounded to 10 mantissa bits) with no switch to turn that off, and some of its
//! candidates return wrong results for Wide-ResNet shapes (docs/gpu.md). Both gradients of a
//! convolution are composed from the forward convolution and the matrix product
//! ([`crate::portable`]), never burn's CUDA backward kernels, two of which are wrong for
//! Wide-ResNet shapes.

use burn::tensor::ops::{ConvOptions, FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape, TensorData, TensorMetadata};
use burn_cubecl::kernel::conv::{conv_forward, ConvStrategy};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::std::InputBinding;

use crate::adam::composed_adam_step;
use crate::adam_kernel::adam_step;
use crate::backend::{activated, portable_weight_backward, portable_x_backward};
use crate::gpu_conv::{gpu_conv, GpuConv};
use crate::portable::conv2d_from_matmul;
use crate::sgld::composed_sgld_update;
use crate::sgld_kernel::sgld_update;
use crate::tiled_conv::tiled_conv2d;
use crate::tiled_weight_grad::tiled_weight_grad_partials;
use crate::{AdamStep, FastActivation, FastAdam, FastConv, FastLinear, FastSgld};

/// burn's CUDA backend without fusion (f32 floats, i32 integers, u8 booleans): the backend
/// `jem-bench --device cuda` computes on.
#[cfg(feature = "cuda")]
pub type Cuda = CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// burn's WebGPU backend (Vulkan, Metal, DX12) without fusion, as burn's `Wgpu` types its
/// booleans (u32): the same kernels as [`Cuda`], compiled for another runtime. The GPU tests
/// run on it where no CUDA GPU is present, on a software Vulkan device if need be.
#[cfg(feature = "wgpu")]
pub type Wgpu = CubeBackend<burn_cubecl::cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// `lhs · rhs` in true f32: cubek's unit-tiled product (each thread a tile of the output, on
/// the CUDA cores), or its naive one where the tiled one does not take the shapes.
fn f32_matmul<R: CubeRuntime>(lhs: CubeTensor<R>, rhs: CubeTensor<R>) -> CubeTensor<R> {
    let (lhs, rhs) = (into_contiguous(lhs), into_contiguous(rhs));
    let out = init_matmul_output(&lhs, &rhs, DType::F32);
    let f32_type = DType::F32.into();
    let globals = MatmulGlobalElems {
        lhs: f32_type,
        rhs: f32_type,
        out: f32_type,
    };
    let mut refused = Vec::new();
    for strategy in [Strategy::SimpleUnit(Default::default()), Strategy::Naive] {
        let mut dtypes = MatmulElems::from_globals(&globals);
        let launched = launch_ref(
            &strategy,
            &out.client,
            InputBinding::new(lhs.clone().binding(), f32_type),
            InputBinding::new(rhs.clone().binding(), f32_type),
            out.clone().binding(),
            &mut dtypes,
        );
        match launched {
            Ok(()) => return out,
            Err(e) => refused.push(format!("{strategy}: {e:?}")),
        }
    }
    panic!(
        "no f32 matrix product for {:?} · {:?} on the GPU: {}",
        lhs.shape(),
        rhs.shape(),
        refused.join("; ")
    );
}

impl<R: CubeRuntime, BT: BoolElement> FastLinear for CubeBackend<R, f32, i32, BT> {
    fn fast_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        f32_matmul(lhs, rhs)
    }

    fn fast_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let out = f32_matmul(x, weight);
        match bias {
            Some(bias) => {
                let n = bias.shape()[0];
                Self::float_add(out, Self::float_reshape(bias, Shape::new([1, n])))
            }
            None => out,
        }
    }

    fn fast_linear_x_backward(
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::fast_matmul(output_grad, Self::float_swap_dims(weight, 0, 1))
    }

    fn fast_linear_weight_backward(
        x: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::fast_matmul(Self::float_swap_dims(x, 0, 1), output_grad)
    }
}

impl<R: CubeRuntime, BT: BoolElement> FastConv for CubeBackend<R, f32, i32, BT> {
    fn fast_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        forward_conv2d::<R, BT>(x, weight, bias, options, input_slope, None)
    }

    fn fast_conv2d_add(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
        residual: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        forward_conv2d::<R, BT>(x, weight, bias, options, input_slope, Some(residual))
    }

    fn fast_conv2d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        portable_x_backward::<Self>(x, weight, output_grad, options, input_slope)
    }

    fn fast_conv2d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        if !gpu_conv().is_tiled() || !crate::portable_gradients_apply(&options) {
            return portable_weight_backward::<Self>(x, weight, output_grad, options, input_slope);
        }
        let weight_shape: [usize; 4] = weight.shape().dims();
        // The activation applied as the input is loaded: its maps are never written.
        let partial =
            tiled_weight_grad_partials(x, output_grad, weight_shape, &options, input_slope);
        // One chunk (a wide layer) is the gradient already: no reduction launched.
        let summed = match partial.shape()[0] {
            1 => partial,
            _ => Self::float_sum_dim(partial, 0),
        };
        Self::float_reshape(summed, Shape::new(weight_shape))
    }
}

/// The forward convolution (plus `residual`, if any) by the kernel [`gpu_conv`] chooses for the
/// layer: the tiled kernels do the activation, the bias and the residual in the product's own
/// launch; burn's kernels take the activated input, and the residual is added after.
fn forward_conv2d<R: CubeRuntime, BT: BoolElement>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    options: ConvOptions<2>,
    input_slope: Option<f64>,
    residual: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;
    let weight_shape: [usize; 4] = weight.shape().dims();
    let y = match gpu_conv().for_weight(weight_shape) {
        conv if conv.is_tiled() && crate::portable_gradients_apply(&options) => {
            let wide = conv == GpuConv::TiledWide;
            return tiled_conv2d(x, weight, bias, &options, input_slope, wide, residual);
        }
        GpuConv::Im2col => {
            let x = activated::<Cube<R, BT>>(x, input_slope);
            conv2d_from_matmul::<Cube<R, BT>>(x, weight, bias, &options)
        }
        _ => conv_forward(
            activated::<Cube<R, BT>>(x, input_slope),
            weight,
            bias,
            options,
            ConvStrategy::Direct,
        )
        .unwrap_or_else(|e| panic!("burn's GPU convolution refused its arguments: {e:?}")),
    };
    // Both leave the result as a permuted view of NHWC memory; some of burn's kernels read
    // their input in memory order whatever its strides (burn 0.21's bool-to-float cast
    // does: an activation pattern recorded from such a view comes out scrambled), so the
    // maps leave here in plain NCHW order.
    let y = into_contiguous(y);
    match residual {
        Some(r) => Cube::<R, BT>::float_add(y, r),
        None => y,
    }
}

impl<R: CubeRuntime, BT: BoolElement> FastActivation for CubeBackend<R, f32, i32, BT> {}

impl<R: CubeRuntime, BT: BoolElement> FastAdam for CubeBackend<R, f32, i32, BT> {
    fn fast_adam_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<[FloatTensor<Self>; 2]>,
        step: AdamStep,
    ) -> [FloatTensor<Self>; 3] {
        let mut inputs = vec![&param, &grad];
        inputs.extend(moments.iter().flatten());
        if inputs.iter().all(|t| t.dtype == DType::F32) {
            adam_step(param, grad, moments, step)
        } else {
            composed_adam_step::<Self>(param, grad, moments, step)
        }
    }
}

impl<R: CubeRuntime, BT: BoolElement> FastSgld for CubeBackend<R, f32, i32, BT> {
    fn fast_sgld_update(
        x: FloatTensor<Self>,
        g: FloatTensor<Self>,
        eps: FloatTensor<Self>,
        drift: &[f32],
        noise: &[f32],
        clamp: bool,
    ) -> FloatTensor<Self> {
        let shape = x.shape();
        let handled = shape.num_dims() == 4
            && shape[1] == drift.len()
            && shape[1] == noise.len()
            && [&x, &g, &eps]
                .iter()
                .all(|t| t.dtype == DType::F32 && t.shape() == shape);
        if !handled {
            return composed_sgld_update::<Self>(x, g, eps, drift, noise, clamp);
        }
        let factors: Vec<f32> = drift.iter().chain(noise).copied().collect();
        let factors = Self::float_from_data(TensorData::new(factors, [2 * drift.len()]), &x.device);
        sgld_update(x, g, eps, factors, clamp)
    }
}
