//! A forward convolution of this crate's own for burn's GPU backends: an implicit matrix product
//! tiled through shared memory, in true f32 on the CUDA cores (`JEM_BENCH_GPU_CONV=tiled`).
//!
//! Why: burn's direct convolution is a loop per output element (about 2 TFLOP/s on an H200 for
//! WRN-28-10), and the unfolded product ([`crate::conv2d_from_matmul`]) writes the unfolded
//! input to memory first (9× the input for a 3×3 kernel) and spends launches on it. Here the
//! unfolding happens while a tile is loaded: the output `[N·OH·OW, out]` is the product of the
//! (implicit) unfolded input `[N·OH·OW, in·kh·kw]` and the weight `[in·kh·kw, out]`, computed
//! in tiles of 16·`tm` output pixels × 16·`tn` output channels per cube of 16 × 16 units; each
//! step stages 16 terms of the reduction of both operands in shared memory, each unit keeping
//! `tm` × `tn` sums in registers. A unit owns pixels `x, x + 16, …` of its tile (and channels
//! `y, y + 16, …`), so neighbouring units read neighbouring shared-memory words and write
//! neighbouring output pixels. `tm` is 4 (64-pixel tiles), or 8 under
//! [`crate::GpuConv::TiledWide`]: each value staged in shared memory then feeds twice the
//! multiply-adds, on half as many cubes.
//!
//! What burn would launch around the product is done in it: a pre-activation block's LeakyReLU
//! on the input as a tile is loaded (`input_slope`; the activated maps are never written), and
//! the bias and a residual block's closing addition as the sums are written.

use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Output pixels per cube (the tile's rows) of the usual tile: 16 units × 4 pixels each (the
/// weight gradient's taps per cube, too).
pub(crate) const TILE_PIXELS: usize = 64;
/// Pixels per unit of the usual tile (taps per unit of the weight gradient's).
pub(crate) const PIXELS_PER_UNIT: usize = TILE_PIXELS / UNITS;
/// Pixels per unit of the wide tile ([`crate::GpuConv::TiledWide`]): 128-pixel tiles.
pub(crate) const WIDE_PIXELS_PER_UNIT: usize = 8;
/// Terms of the reduction staged in shared memory per step.
pub(crate) const TILE_DEPTH: usize = 16;
/// Units per cube along each axis (16 × 16 = 256 units).
pub(crate) const UNITS: usize = 16;

/// The geometry of one convolution, as the kernels read it.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct TiledConvArgs {
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub out_channels: usize,
    pub kernel_w: usize,
    /// kernel_h · kernel_w.
    pub kernel_area: usize,
    pub out_w: usize,
    /// out_h · out_w.
    pub out_pixels: usize,
    pub stride_h: usize,
    pub stride_w: usize,
    pub pad_h: usize,
    pub pad_w: usize,
    /// N · out_h · out_w: the product's rows.
    pub rows: usize,
    /// channels · kernel_area: the product's reduction.
    pub depth: usize,
    /// The slope of the LeakyReLU applied to the input as it is loaded (read only by kernels
    /// launched with `activate`).
    pub slope: InputScalar,
}

#[cube(launch_unchecked)]
fn tiled_conv_kernel<F: Float>(
    input: &Tensor<F>,
    weight: &Tensor<F>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    output: &mut Tensor<F>,
    args: &TiledConvArgs,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
    #[comptime] activate: bool,
    #[comptime] has_bias: bool,
    #[comptime] has_residual: bool,
    #[define(F)] _dtype: StorageType,
) {
    let tile_pixels = comptime![UNITS * tm];
    let tile_channels = comptime![UNITS * tn];
    let unit = UNIT_POS as usize;
    let (ux, uy) = (UNIT_POS_X as usize, UNIT_POS_Y as usize);
    let row0 = CUBE_POS_X as usize * tile_pixels;
    let channel0 = CUBE_POS_Y as usize * tile_channels;

    let mut pixels = SharedMemory::<F>::new(comptime![TILE_DEPTH * UNITS * tm]);
    let mut weights = SharedMemory::<F>::new(comptime![TILE_DEPTH * UNITS * tn]);
    let mut sums = Array::<F>::new(comptime![tm * tn]);
    #[unroll]
    for i in 0..comptime![tm * tn] {
        sums[i] = F::from_int(0);
    }

    // A unit loads the same pixel of every tile (`unit` mod 16·tm) at terms
    // `unit` / (16·tm) + (16 / tm)·e: its pixel's image and position are worked out once, not
    // per term.
    let pixel = unit % tile_pixels;
    let first_term = unit / tile_pixels;
    let row = row0 + pixel;
    let (image, at) = (row / args.out_pixels, row % args.out_pixels);
    let (y0, x0) = (
        (at / args.out_w) * args.stride_h,
        (at % args.out_w) * args.stride_w,
    );
    let image_start = image * args.channels * args.height;

    let mut k0 = 0usize;
    while k0 < args.depth {
        // The unfolded input's tile: 16 terms × 16·tm pixels, tm per unit; zero outside the
        // image (padding) and past the last row or term.
        #[unroll]
        for e in 0..tm {
            let term = first_term + e * comptime![UNITS / tm];
            let k = k0 + term;
            let mut value = F::from_int(0);
            if row < args.rows && k < args.depth {
                let (c, tap) = (k / args.kernel_area, k % args.kernel_area);
                // Coordinates in the zero-padded input.
                let (y, x) = (y0 + tap / args.kernel_w, x0 + tap % args.kernel_w);
                if y >= args.pad_h
                    && y < args.pad_h + args.height
                    && x >= args.pad_w
                    && x < args.pad_w + args.width
                {
                    let plane = image_start + c * args.height;
                    value = input[(plane + y - args.pad_h) * args.width + x - args.pad_w];
                    if activate {
                        value = leaky::<F>(value, args);
                    }
                }
            }
            pixels[term * tile_pixels + pixel] = value;
        }
        // The weight's tile: 16 terms × 16·tn channels, tn per unit; neighbouring units read
        // neighbouring terms of one channel's row.
        #[unroll]
        for e in 0..tn {
            let index = unit + e * comptime![UNITS * UNITS];
            let (term, channel) = (index % TILE_DEPTH, index / TILE_DEPTH);
            let (o, k) = (channel0 + channel, k0 + term);
            let mut value = F::from_int(0);
            if o < args.out_channels && k < args.depth {
                value = weight[o * args.depth + k];
            }
            weights[term * tile_channels + channel] = value;
        }
        sync_cube();
        accumulate_step::<F>(&pixels, &weights, &mut sums, ux, uy, tm, tn);
        sync_cube();
        k0 += TILE_DEPTH;
    }

    #[unroll]
    for i in 0..tm {
        let row = row0 + ux + i * UNITS;
        if row < args.rows {
            let (image, at) = (row / args.out_pixels, row % args.out_pixels);
            #[unroll]
            for j in 0..tn {
                let o = channel0 + uy + j * UNITS;
                if o < args.out_channels {
                    let mut value = sums[i * tn + j];
                    if has_bias {
                        value += bias[o];
                    }
                    let index = (image * args.out_channels + o) * args.out_pixels + at;
                    if has_residual {
                        value += residual[index];
                    }
                    output[index] = value;
                }
            }
        }
    }
}

/// LeakyReLU of `value` with the slope in `args` (the product with the slope for negative
/// values, as burn's `leaky_relu` computes it).
#[cube]
pub(crate) fn leaky<F: Float>(value: F, args: &TiledConvArgs) -> F {
    let mut out = value;
    if value < F::from_int(0) {
        out = value * args.slope.get::<F>();
    }
    out
}

/// Adds one staged step to a unit's register tile: for each of the 16 staged terms, its `tm`
/// rows (`ux + 16·i` of the 16·`tm`-wide `rows` tile) times its `tn` columns (`uy + 16·j` of
/// the 16·`tn`-wide `columns` tile), into `sums[i·tn + j]`. Both tiled kernels share it.
#[cube]
pub(crate) fn accumulate_step<F: Float>(
    rows: &SharedMemory<F>,
    columns: &SharedMemory<F>,
    sums: &mut Array<F>,
    ux: usize,
    uy: usize,
    #[comptime] tm: usize,
    #[comptime] tn: usize,
) {
    let height = comptime![UNITS * tm];
    let width = comptime![UNITS * tn];
    #[unroll]
    for term in 0..TILE_DEPTH {
        #[unroll]
        for i in 0..tm {
            let a = rows[term * height + ux + i * UNITS];
            #[unroll]
            for j in 0..tn {
                sums[i * tn + j] += a * columns[term * width + uy + j * UNITS];
            }
        }
    }
}

/// Channels per unit for a layer with `out_channels` outputs: the smallest tile (16, 32 or 64
/// channels) that covers them, so that a narrow layer does not compute padding.
pub(crate) fn channels_per_unit(out_channels: usize) -> usize {
    match out_channels {
        0..=16 => 1,
        17..=32 => 2,
        _ => 4,
    }
}

/// One convolution's sizes, from its input and weight shapes and options (one group, no
/// dilation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub batch: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    pub out_channels: usize,
    pub kernel: [usize; 2],
    pub out: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl Geometry {
    pub fn new(input: [usize; 4], weight: [usize; 4], options: &ConvOptions<2>) -> Geometry {
        assert!(
            options.groups == 1 && options.dilation == [1, 1],
            "the tiled convolution kernels take one group and no dilation"
        );
        let [batch, channels, height, width] = input;
        let [out_channels, _, kh, kw] = weight;
        let ([sh, sw], [ph, pw]) = (options.stride, options.padding);
        Geometry {
            batch,
            channels,
            height,
            width,
            out_channels,
            kernel: [kh, kw],
            out: [
                (height + 2 * ph - kh) / sh + 1,
                (width + 2 * pw - kw) / sw + 1,
            ],
            stride: options.stride,
            padding: options.padding,
        }
    }

    /// N · OH · OW: the output pixels (the forward product's rows, the weight gradient's
    /// reduction).
    pub fn rows(&self) -> usize {
        self.batch * self.out[0] * self.out[1]
    }

    /// in · kh · kw: the forward product's reduction, the weight gradient's columns.
    pub fn depth(&self) -> usize {
        self.channels * self.kernel[0] * self.kernel[1]
    }

    /// The kernels' arguments; `slope`: the LeakyReLU on the input, if any.
    pub fn args<R: CubeRuntime>(&self, slope: Option<f64>) -> TiledConvArgsLaunch<R> {
        TiledConvArgsLaunch::new(
            self.channels,
            self.height,
            self.width,
            self.out_channels,
            self.kernel[1],
            self.kernel[0] * self.kernel[1],
            self.out[1],
            self.out[0] * self.out[1],
            self.stride[0],
            self.stride[1],
            self.padding[0],
            self.padding[1],
            self.rows(),
            self.depth(),
            InputScalar::new(slope.unwrap_or(0.0) as f32, DType::F32),
        )
    }
}

/// `conv2d(act(x), weight) + bias + residual` (one group, no dilation) for `[n, in, h, w]` f32
/// input, `[out, in, kh, kw]` weight, `[out]` bias and `[n, out, oh, ow]` residual, `act` the
/// LeakyReLU of slope `input_slope` (the identity for `None`): the tiled implicit product
/// above, in one launch, on 128-pixel tiles if `wide`. Returns `[n, out, oh, ow]`,
/// contiguous.
pub(crate) fn tiled_conv2d<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    options: &ConvOptions<2>,
    input_slope: Option<f64>,
    wide: bool,
    residual: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    let (x, weight) = (into_contiguous(x), into_contiguous(weight));
    let geometry = Geometry::new(x.shape().dims(), weight.shape().dims(), options);
    let [out_h, out_w] = geometry.out;
    let output = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([geometry.batch, geometry.out_channels, out_h, out_w]),
        DType::F32,
    );
    let tn = channels_per_unit(geometry.out_channels);
    let tm = if wide {
        WIDE_PIXELS_PER_UNIT
    } else {
        PIXELS_PER_UNIT
    };
    let cube_count = CubeCount::Static(
        geometry.rows().div_ceil(UNITS * tm) as u32,
        geometry.out_channels.div_ceil(UNITS * tn) as u32,
        1,
    );
    let client = x.client.clone();
    let has_bias = bias.is_some();
    // Without a bias or a residual the kernel reads none (`has_bias`, `has_residual` false):
    // the weight stands in.
    let bias = into_contiguous(bias.unwrap_or_else(|| weight.clone()));
    let has_residual = residual.is_some();
    let residual = into_contiguous(residual.unwrap_or_else(|| weight.clone()));
    if has_residual {
        assert_eq!(
            residual.shape(),
            output.shape(),
            "the residual has the output's shape"
        );
    }
    // Safety: every read and write is guarded by the bounds above (rows, depth, channels, the
    // image), the bias is read only at channels below `out_channels`, the residual only at the
    // output's own index, and the tensors are contiguous with the shapes the arguments describe.
    unsafe {
        tiled_conv_kernel::launch_unchecked::<R>(
            &client,
            cube_count,
            CubeDim::new_2d(UNITS as u32, UNITS as u32),
            x.into_tensor_arg(),
            weight.into_tensor_arg(),
            bias.into_tensor_arg(),
            residual.into_tensor_arg(),
            output.clone().into_tensor_arg(),
            geometry.args(input_slope),
            tm,
            tn,
            input_slope.is_some(),
            has_bias,
            has_residual,
            DType::F32.into(),
        )
    };
    output
}
