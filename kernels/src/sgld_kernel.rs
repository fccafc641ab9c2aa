//! SGLD's update of a batch of images as one kernel for burn's GPU backends
//! ([`crate::FastSgld`]): `(x + g · drift[c]) + ε · noise[c]`, clamped if asked, in one launch
//! with the per-channel factors uploaded as one small tensor.

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

/// Units per cube.
const UNITS: u32 = 256;

/// The batch's layout, as the kernel reads it.
#[derive(CubeLaunch, CubeType)]
struct SgldArgs {
    /// Elements in the batch.
    len: usize,
    /// h · w: the elements of one channel of one image.
    plane: usize,
    channels: usize,
}

/// One element per unit; `factors` holds the drift factors of every channel, then the noise
/// factors.
#[cube(launch_unchecked)]
fn sgld_update_kernel<F: Float>(
    x: &Tensor<F>,
    g: &Tensor<F>,
    eps: &Tensor<F>,
    factors: &Tensor<F>,
    next: &mut Tensor<F>,
    args: &SgldArgs,
    #[comptime] clamp: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i < args.len {
        let c = (i / args.plane) % args.channels;
        let drifted = x[i] + g[i] * factors[c];
        let mut value = drifted + eps[i] * factors[args.channels + c];
        if clamp {
            if value < F::from_int(0) {
                value = F::from_int(0);
            }
            if value > F::from_int(1) {
                value = F::from_int(1);
            }
        }
        next[i] = value;
    }
}

/// [`crate::FastSgld::fast_sgld_update`] on `[n, c, h, w]` f32 tensors of one shape, with
/// `factors` the `c` drift factors and then the `c` noise factors, in one launch.
pub(crate) fn sgld_update<R: CubeRuntime>(
    x: CubeTensor<R>,
    g: CubeTensor<R>,
    eps: CubeTensor<R>,
    factors: CubeTensor<R>,
    clamp: bool,
) -> CubeTensor<R> {
    let [x, g, eps, factors] = [x, g, eps, factors].map(into_contiguous);
    let shape = x.shape();
    let channels = shape[1];
    assert!(
        shape.num_dims() == 4
            && [&g, &eps].iter().all(|t| t.shape() == shape)
            && factors.shape().num_elements() == 2 * channels,
        "SGLD's update takes [n, c, h, w] batches of one shape and 2·c factors"
    );
    let len = shape.num_elements();
    let next = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        shape.clone(),
        DType::F32,
    );
    let client = x.client.clone();
    let cube_dim = CubeDim::new_1d(UNITS);
    let cube_count = calculate_cube_count_elemwise(&client, len, cube_dim);
    let args = SgldArgsLaunch::new(len, shape[2] * shape[3], channels);
    // Safety: the three batches are contiguous with `len` elements, `factors` has 2·channels,
    // and the kernel touches element i only for i < len (its channel is < channels).
    unsafe {
        sgld_update_kernel::launch_unchecked::<R>(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            g.into_tensor_arg(),
            eps.into_tensor_arg(),
            factors.into_tensor_arg(),
            next.clone().into_tensor_arg(),
            args,
            clamp,
            DType::F32.into(),
        )
    };
    next
}
