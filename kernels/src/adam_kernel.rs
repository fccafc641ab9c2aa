//! Adam's update of a parameter tensor as one kernel for burn's GPU backends ([`crate::FastAdam`]):
//! one launch reads the parameter, its gradient and both moments, and writes the parameter and
//! the moments after the step, where burn's `Adam` launches thirteen element-wise kernels.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use crate::AdamStep;

/// Units per cube.
const UNITS: u32 = 256;

/// The step's scalars ([`AdamStep`]) and the tensors' length, as the kernel reads them.
#[derive(CubeLaunch, CubeType)]
struct AdamArgs {
    beta_1: InputScalar,
    /// 1 − β₁, worked out on the host as burn does.
    keep_1: InputScalar,
    beta_2: InputScalar,
    /// 1 − β₂.
    keep_2: InputScalar,
    correction: InputScalar,
    epsilon: InputScalar,
    lr: InputScalar,
    len: usize,
}

/// One element per unit, [`AdamStep::apply`]'s operations in its order; `later`: a step after
/// the first, whose moments are read (at the first, both are zero and not read).
#[cube(launch_unchecked)]
fn adam_kernel<F: Float>(
    param: &Tensor<F>,
    grad: &Tensor<F>,
    moment_1: &Tensor<F>,
    moment_2: &Tensor<F>,
    param_out: &mut Tensor<F>,
    moment_1_out: &mut Tensor<F>,
    moment_2_out: &mut Tensor<F>,
    args: &AdamArgs,
    #[comptime] later: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i < args.len {
        let g = grad[i];
        let mut m = g * args.keep_1.get::<F>();
        let mut v = (g * g) * args.keep_2.get::<F>();
        if later {
            m = moment_1[i] * args.beta_1.get::<F>() + m;
            v = moment_2[i] * args.beta_2.get::<F>() + v;
        }
        let direction = (m * args.correction.get::<F>()) / (F::sqrt(v) + args.epsilon.get::<F>());
        param_out[i] = param[i] - direction * args.lr.get::<F>();
        moment_1_out[i] = m;
        moment_2_out[i] = v;
    }
}

/// [`crate::FastAdam::fast_adam_step`] on f32 tensors of one shape, in one launch.
pub(crate) fn adam_step<R: CubeRuntime>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<[CubeTensor<R>; 2]>,
    step: AdamStep,
) -> [CubeTensor<R>; 3] {
    let (param, grad) = (into_contiguous(param), into_contiguous(grad));
    let later = moments.is_some();
    // At the first step the kernel reads no moments: the gradient stands in for both.
    let [moment_1, moment_2] = moments
        .map(|moments| moments.map(into_contiguous))
        .unwrap_or_else(|| [grad.clone(), grad.clone()]);
    let len = param.shape().num_elements();
    for (name, t) in [
        ("gradient", &grad),
        ("first moment", &moment_1),
        ("second moment", &moment_2),
    ] {
        assert_eq!(
            t.shape(),
            param.shape(),
            "Adam's {name} has the parameter's shape"
        );
    }
    let out = || {
        empty_device_contiguous_dtype(
            param.client.clone(),
            param.device.clone(),
            param.shape(),
            DType::F32,
        )
    };
    let outputs = [out(), out(), out()];
    let client = param.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, len, cube_dim);
    let scalar = |v: f32| InputScalar::new(v, DType::F32);
    let args = AdamArgsLaunch::new(
        scalar(step.beta_1),
        scalar(1.0 - step.beta_1),
        scalar(step.beta_2),
        scalar(1.0 - step.beta_2),
        scalar(step.correction),
        scalar(step.epsilon),
        scalar(step.lr),
        len,
    );
    // Safety: every tensor is contiguous with `len` elements, and the kernel touches element i
    // only for i < len.
    unsafe {
        adam_kernel::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
            param.into_tensor_arg(),
            grad.into_tensor_arg(),
            moment_1.into_tensor_arg(),
            moment_2.into_tensor_arg(),
            outputs[0].clone().into_tensor_arg(),
            outputs[1].clone().into_tensor_arg(),
            outputs[2].clone().into_tensor_arg(),
            args,
            later,
            DType::F32.into(),
        )
    };
    outputs
}
