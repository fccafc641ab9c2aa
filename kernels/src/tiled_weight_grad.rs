//! A convolution's weight gradient of this crate's own for burn's GPU backends, the companion of
//! [`crate::tiled_conv`] (`JEM_BENCH_GPU_CONV=tiled`): `dW[o, k] = Σ_m g[m, o] · x̄[m, k]` over
//! the output pixels m = (n, p, q), with the unfolded input x̄ gathered (and a pre-activation
//! block's LeakyReLU applied to it) while a tile is loaded, never written out.
//!
//! A cube computes a tile of 64 taps k × 16·`tn` output channels o (4 × `tn` sums per unit)
//! over one chunk of the pixels, 16 pixels staged in shared memory per step; the chunks
//! ([`crate::weight_grad_chunks`]: a narrow layer's reduction is long and its output small) are
//! the grid's third axis, and their partial sums are added afterwards.

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use crate::portable::weight_grad_chunks;
use crate::tiled_conv::{
    accumulate_step, channels_per_unit, leaky, Geometry, TiledConvArgs, TiledConvArgsLaunch,
    PIXELS_PER_UNIT, TILE_DEPTH, TILE_PIXELS, UNITS,
};

#[cube(launch_unchecked)]
fn tiled_weight_grad_kernel<F: Float>(
    input: &Tensor<F>,
    output_grad: &Tensor<F>,
    partial: &mut Tensor<F>,
    args: &TiledConvArgs,
    chunk: usize,
    #[comptime] tn: usize,
    #[comptime] activate: bool,
    #[define(F)] _dtype: StorageType,
) {
    let tile_channels = comptime![UNITS * tn];
    let unit = UNIT_POS as usize;
    let (ux, uy) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let k0 = CUBE_POS_X as usize * TILE_PIXELS;
    let channel0 = CUBE_POS_Y as usize * tile_channels;
    let chunk_index = CUBE_POS_Z as usize;
    let (first, last) = (chunk_index * chunk, chunk_index * chunk + chunk);

    let mut taps = SharedMemory::<F>::new(comptime![TILE_DEPTH * TILE_PIXELS]);
    let mut grads = SharedMemory::<F>::new(comptime![TILE_DEPTH * UNITS * tn]);
    let mut sums = Array::<F>::new(comptime![4 * tn]);
    #[unroll]
    for i in 0..comptime![4 * tn] {
        sums[i] = F::from_int(0);
    }

    // A unit loads pixel `unit` mod 16 of every step, for taps `unit` / 16 + 16·e of the
    // cube's 64 and for channels `unit` / 16 + 16·e of its 16·tn: neighbouring units read
    // neighbouring pixels. Its taps' channel and offsets are worked out once.
    let step_pixel = unit % TILE_DEPTH;
    let lane = unit / TILE_DEPTH;
    let mut tap_plane = Array::<usize>::new(4usize);
    let mut tap_y = Array::<usize>::new(4usize);
    let mut tap_x = Array::<usize>::new(4usize);
    #[unroll]
    for e in 0..4usize {
        let k = k0 + lane + e * UNITS;
        let (c, tap) = (k / args.kernel_area, k % args.kernel_area);
        tap_plane[e] = c * args.height;
        tap_y[e] = tap / args.kernel_w;
        tap_x[e] = tap % args.kernel_w;
    }

    let mut m0 = first;
    while m0 < last {
        let m = m0 + step_pixel;
        let live = m < last && m < args.rows;
        let (image, at) = (m / args.out_pixels, m % args.out_pixels);
        let (y0, x0) = (
            (at / args.out_w) * args.stride_h,
            (at % args.out_w) * args.stride_w,
        );
        // The unfolded input's tile: 16 pixels × 64 taps, 4 per unit.
        #[unroll]
        for e in 0..4usize {
            let tap = lane + e * UNITS;
            let k = k0 + tap;
            let mut value = F::from_int(0);
            if live && k < args.depth {
                let (y, x) = (y0 + tap_y[e], x0 + tap_x[e]);
                if y >= args.pad_h
                    && y < args.pad_h + args.height
                    && x >= args.pad_w
                    && x < args.pad_w + args.width
                {
                    let plane = image * args.channels * args.height + tap_plane[e];
                    value = input[(plane + y - args.pad_h) * args.width + x - args.pad_w];
                    if activate {
                        value = leaky::<F>(value, args);
                    }
                }
            }
            taps[step_pixel * TILE_PIXELS + tap] = value;
        }
        // The output gradient's tile: 16 pixels × 16·tn channels, tn per unit.
        #[unroll]
        for e in 0..tn {
            let channel = lane + e * UNITS;
            let o = channel0 + channel;
            let mut value = F::from_int(0);
            if live && o < args.out_channels {
                value = output_grad[(image * args.out_channels + o) * args.out_pixels + at];
            }
            grads[step_pixel * tile_channels + channel] = value;
        }
        sync_cube();
        accumulate_step::<F>(&taps, &grads, &mut sums, ux, uy, PIXELS_PER_UNIT, tn);
        sync_cube();
        m0 += TILE_DEPTH;
    }

    let chunk_start = chunk_index * args.out_channels * args.depth;
    #[unroll]
    for i in 0..4usize {
        let k = k0 + ux + i * UNITS;
        if k < args.depth {
            #[unroll]
            for j in 0..tn {
                let o = channel0 + uy + j * UNITS;
                if o < args.out_channels {
                    partial[chunk_start + o * args.depth + k] = sums[i * tn + j];
                }
            }
        }
    }
}

/// The gradient of `conv2d(act(x), weight)` (one group, no dilation; `act` the LeakyReLU of
/// slope `input_slope`, the identity for `None`) with respect to its `[out, in, kh, kw]`
/// weight, for `[n, in, h, w]` f32 input `x` and `[n, out, oh, ow]` output gradient:
/// the tiled kernel above over [`weight_grad_chunks`] chunks of the pixels. Returns the chunks'
/// partial sums, `[chunks, out, in·kh·kw]`: their sum over the first axis, reshaped to the
/// weight's shape, is the gradient.
pub(crate) fn tiled_weight_grad_partials<R: CubeRuntime>(
    x: CubeTensor<R>,
    output_grad: CubeTensor<R>,
    weight_shape: [usize; 4],
    options: &ConvOptions<2>,
    input_slope: Option<f64>,
) -> CubeTensor<R> {
    let (x, output_grad) = (into_contiguous(x), into_contiguous(output_grad));
    let geometry = Geometry::new(x.shape().dims(), weight_shape, options);
    assert_eq!(
        output_grad.shape().dims::<4>(),
        [
            geometry.batch,
            geometry.out_channels,
            geometry.out[0],
            geometry.out[1]
        ],
        "the output gradient's shape"
    );
    let (rows, depth, out_channels) = (geometry.rows(), geometry.depth(), geometry.out_channels);
    let chunks = weight_grad_chunks(rows, out_channels * depth);
    let partial = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([chunks, out_channels, depth]),
        DType::F32,
    );
    let tn = channels_per_unit(out_channels);
    let cube_count = CubeCount::Static(
        depth.div_ceil(TILE_PIXELS) as u32,
        out_channels.div_ceil(UNITS * tn) as u32,
        chunks as u32,
    );
    let client = x.client.clone();
    let args: TiledConvArgsLaunch<R> = geometry.args(input_slope);
    // Safety: every read and write is guarded (pixels, taps, channels, the image), the chunks
    // divide the pixels, and the three tensors are contiguous with the shapes the arguments
    // describe.
    unsafe {
        tiled_weight_grad_kernel::launch_unchecked::<R>(
            &client,
            cube_count,
            CubeDim::new_2d(UNITS as u32, UNITS as u32),
            x.into_tensor_arg(),
            output_grad.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            args,
            rows / chunks,
            tn,
            input_slope.is_some(),
            DType::F32.into(),
        )
    };
    partial
}
