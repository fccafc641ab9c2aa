//! 2-D convolution on contiguous NCHW `f32` slices: forward, input gradient, weight gradient and
//! bias gradient, each as im2col (or its adjoint, col2im) around one well-shaped matrix product.
//!
//! The batch is cut into chunks of whole images, sized by pixel count alone (never by the
//! number of threads), and the chunks run in parallel; sums across chunks (weight and bias
//! gradients) are added in chunk order. So results are bit-identical whatever the thread count.
//! Scratch matrices live in per-thread buffers that are reused across calls instead of being
//! allocated and zeroed each time. On CPUs with AVX-512F or AVX2 + FMA (as capped by
//! [`crate::isa()`]) the stride-1 "same" convolutions skip im2col and matrix products: the
//! forward pass, and so the input gradient, through the direct kernel of [`direct`] (maps of
//! ≥ 128 pixels on AVX2, any on AVX-512), the weight gradient of 3×3 ones through
//! [`direct_weight_grad`].
//!
//! A LeakyReLU in front of the convolution (a Wide-ResNet's pre-activation) can be fused:
//! `input_slope` applies it while the kernel rows are copied, or to each chunk's input in a
//! cache-sized buffer before im2col, and the input gradient is multiplied by its derivative
//! chunk by chunk while still in cache. The activated maps are never written to memory, nor
//! kept for the backward pass.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::activation::{copy_activated, leaky_derivative};
use crate::fresh::par_fresh;
use crate::matmul::{matmul, MatMut, MatRef};

mod direct;
mod direct_weight_grad;
mod simd;

use direct::Direct;
use direct_weight_grad::DirectWeightGrad;

/// Shape of one convolution: an NCHW input, an `[out, in, kh, kw]` weight, symmetric zero
/// padding, stride, no dilation, one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Images in the batch.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Input height.
    pub height: usize,
    /// Input width.
    pub width: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Vertical and horizontal stride (≥ 1).
    pub stride: [usize; 2],
    /// Zero padding on each side, vertically and horizontally.
    pub padding: [usize; 2],
}

/// Pixels (over all images of a chunk) per matrix product of the forward pass and the input
/// gradient: few enough for the im2col matrix to stay in the core's L2 cache while the product
/// reads it (and for 28×28 and 14×14 maps to go one image per chunk, so the product is written
/// in NCHW directly), enough columns for gemm's micro-kernels to run at full width. Measured on
/// WRN-16-2's input gradient at one thread: 256 pixels 8–10 % faster than 2048.
const CHUNK_PIXELS: usize = 256;

/// Pixels per chunk of the weight gradient, whose chunks each add a `[out, patch]` partial sum:
/// fewer, larger chunks there.
const WEIGHT_GRAD_CHUNK_PIXELS: usize = 2048;

impl ConvGeometry {
    /// Output height.
    pub fn out_height(&self) -> usize {
        (self.height + 2 * self.padding[0] - self.kernel[0]) / self.stride[0] + 1
    }

    /// Output width.
    pub fn out_width(&self) -> usize {
        (self.width + 2 * self.padding[1] - self.kernel[1]) / self.stride[1] + 1
    }

    /// Whether the kernel fits the padded input and every size is non-zero.
    pub fn is_valid(&self) -> bool {
        let sizes = [
            self.batch,
            self.in_channels,
            self.height,
            self.width,
            self.out_channels,
            self.kernel[0],
            self.kernel[1],
            self.stride[0],
            self.stride[1],
        ];
        sizes.iter().all(|&s| s > 0)
            && self.kernel[0] <= self.height + 2 * self.padding[0]
            && self.kernel[1] <= self.width + 2 * self.padding[1]
    }

    fn in_pixels(&self) -> usize {
        self.height * self.width
    }

    fn out_pixels(&self) -> usize {
        self.out_height() * self.out_width()
    }

    /// Rows of the im2col matrix: one per (input channel, kernel row, kernel column), in the
    /// order of the weight's last three dimensions.
    fn patch(&self) -> usize {
        self.in_channels * self.kernel[0] * self.kernel[1]
    }

    fn images_per_chunk(&self, pixels: usize) -> usize {
        (pixels / self.out_pixels()).clamp(1, self.batch)
    }

    /// Whether [`conv_by_kernel_rows`] computes this convolution: stride 1, output as large as
    /// the input, a kernel taller than one row.
    fn by_kernel_rows(&self) -> bool {
        self.stride == [1, 1]
            && self.kernel[0] > 1
            && self.out_height() == self.height
            && self.out_width() == self.width
    }

    /// Whether the forward pass and the weight gradient go by kernel rows, image by image: where
    /// [`ConvGeometry::by_kernel_rows`] holds and an image has enough pixels for one image's
    /// products to keep gemm's micro-kernels at full width (28×28 and 14×14, not 7×7).
    fn uses_kernel_rows(&self) -> bool {
        self.by_kernel_rows() && self.out_pixels() >= 128
    }

    /// The convolution whose forward pass is this one's input gradient at stride 1: channels
    /// swapped, padding k − 1 − p, on the output's plane (weights flipped and transposed by
    /// [`flip_transpose`]). `None` where that padding would be negative or the stride is not 1.
    fn transposed(&self) -> Option<ConvGeometry> {
        let pad = |d: usize| (self.kernel[d] - 1).checked_sub(self.padding[d]);
        (self.stride == [1, 1]).then_some(())?;
        Some(ConvGeometry {
            batch: self.batch,
            in_channels: self.out_channels,
            height: self.out_height(),
            width: self.out_width(),
            out_channels: self.in_channels,
            kernel: self.kernel,
            stride: [1, 1],
            padding: [pad(0)?, pad(1)?],
        })
    }
}

thread_local! {
    /// Two scratch matrices per thread, grown on demand and never shrunk.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` on this thread's two scratch buffers, sized `a` and `b`. Their contents are
/// whatever the last call left: every user overwrites what it reads.
fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| {
        let mut buffers = cell.borrow_mut();
        let (first, second) = &mut *buffers;
        for (buffer, len) in [(&mut *first, a), (&mut *second, b)] {
            if buffer.len() < len {
                buffer.resize(len, 0.0);
            }
        }
        f(&mut first[..a], &mut second[..b])
    })
}

thread_local! {
    /// One chunk's activated input per thread (fused LeakyReLU), grown on demand.
    static ACTIVATED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `x`, or, given a slope, on LeakyReLU(`x`) computed into this thread's buffer:
/// a chunk's input is activated once, in cache, right before its products read it.
fn with_activated<R>(x: &[f32], slope: Option<f32>, f: impl FnOnce(&[f32]) -> R) -> R {
    let Some(slope) = slope else {
        return f(x);
    };
    ACTIVATED.with(|cell| {
        let mut buffer = cell.borrow_mut();
        if buffer.len() < x.len() {
            buffer.resize(x.len(), 0.0);
        }
        let activated = &mut buffer[..x.len()];
        copy_activated(activated, x, Some(slope));
        f(activated)
    })
}

/// Multiplies `grad` by LeakyReLU's derivative at `x`.
fn times_leaky_derivative(grad: &mut [f32], x: &[f32], slope: f32) {
    grad.iter_mut()
        .zip(x)
        .for_each(|(g, &v)| *g *= leaky_derivative(v, slope));
}

/// `dst[i] = src[i * stride + offset]`, zero where that index falls outside `src`.
fn gather_row(dst: &mut [f32], src: &[f32], offset: isize, stride: usize) {
    let (lo, hi) = valid_range(dst.len(), src.len(), offset, stride);
    dst[..lo].fill(0.0);
    dst[hi..].fill(0.0);
    if lo == hi {
        // Nothing inside `src` (and `lo · stride + offset` may be negative).
        return;
    }
    let start = (lo as isize * stride as isize + offset) as usize;
    match stride {
        1 => dst[lo..hi].copy_from_slice(&src[start..start + (hi - lo)]),
        // Pairs instead of indices: no bounds check per element, so the loop vectorises
        // (WRN-10-1's input gradient 8 % faster, its train step 4 %).
        2 => {
            let dst = &mut dst[lo..hi];
            let pairs = src[start..].chunks_exact(2);
            let paired = pairs.len().min(dst.len());
            for (d, pair) in dst[..paired].iter_mut().zip(pairs) {
                *d = pair[0];
            }
            if let Some(last) = dst.get_mut(paired) {
                *last = src[start + 2 * paired];
            }
        }
        _ => {
            for (i, d) in dst[lo..hi].iter_mut().enumerate() {
                *d = src[start + i * stride];
            }
        }
    }
}

/// `dst[i * stride + offset] += src[i]` wherever that index falls inside `dst`.
fn scatter_add_row(dst: &mut [f32], src: &[f32], offset: isize, stride: usize) {
    let (lo, hi) = valid_range(src.len(), dst.len(), offset, stride);
    if lo == hi {
        return;
    }
    let start = (lo as isize * stride as isize + offset) as usize;
    match stride {
        1 => {
            for (d, s) in dst[start..start + (hi - lo)].iter_mut().zip(&src[lo..hi]) {
                *d += s;
            }
        }
        // Pairs, as in `gather_row`.
        2 => {
            let src = &src[lo..hi];
            let pairs = dst[start..].chunks_exact_mut(2);
            let paired = pairs.len().min(src.len());
            for (pair, s) in pairs.zip(&src[..paired]) {
                pair[0] += s;
            }
            if let Some(s) = src.get(paired) {
                dst[start + 2 * paired] += s;
            }
        }
        _ => {
            for (i, s) in src[lo..hi].iter().enumerate() {
                dst[start + i * stride] += s;
            }
        }
    }
}

/// The positions i in 0..n with 0 ≤ i·stride + offset < len, as a range lo..hi.
fn valid_range(n: usize, len: usize, offset: isize, stride: usize) -> (usize, usize) {
    let lo = if offset < 0 {
        (-offset as usize).div_ceil(stride)
    } else {
        0
    }
    .min(n);
    let last = len as isize - 1 - offset;
    let hi = if last < 0 {
        0
    } else {
        last as usize / stride + 1
    };
    (lo, hi.clamp(lo, n))
}

/// Unfolds `images` NCHW images into the `patch × (images · out_pixels)` matrix whose product
/// with the `[out, patch]` weight is the convolution.
fn im2col(x: &[f32], images: usize, g: &ConvGeometry, col: &mut [f32]) {
    if g.stride == [1, 1] && g.out_width() == g.width {
        im2col_by_shifts(x, images, g, col);
    } else if g.stride == [2, 2] && g.kernel != [1, 1] && phases_cover(g) {
        im2col_by_phases(x, images, g, col);
    } else {
        im2col_by_rows(x, images, g, col);
    }
}

/// [`im2col`] for any geometry: one gather per output row.
fn im2col_by_rows(x: &[f32], images: usize, g: &ConvGeometry, col: &mut [f32]) {
    let (ho, wo) = (g.out_height(), g.out_width());
    let columns = images * ho * wo;
    for (row_index, row) in col.chunks_exact_mut(columns).enumerate() {
        let (c, ki, kj) = patch_position(row_index, g);
        for image in 0..images {
            let plane = &x[(image * g.in_channels + c) * g.in_pixels()..][..g.in_pixels()];
            let dst = &mut row[image * ho * wo..][..ho * wo];
            for oy in 0..ho {
                let dst = &mut dst[oy * wo..][..wo];
                match input_row(oy, ki, g) {
                    Some(iy) => gather_row(
                        dst,
                        &plane[iy * g.width..][..g.width],
                        kj as isize - g.padding[1] as isize,
                        g.stride[1],
                    ),
                    None => dst.fill(0.0),
                }
            }
        }
    }
}

/// [`im2col`] at stride 1 with output rows as wide as the input's: each tap of each plane is
/// one shifted copy ([`shifted_copy`]) instead of one copy per output row.
fn im2col_by_shifts(x: &[f32], images: usize, g: &ConvGeometry, col: &mut [f32]) {
    let pixels = g.out_pixels();
    for (row_index, row) in col.chunks_exact_mut(images * pixels).enumerate() {
        let (c, ki, kj) = patch_position(row_index, g);
        let dy = ki as isize - g.padding[0] as isize;
        let dx = kj as isize - g.padding[1] as isize;
        for (image, dst) in row.chunks_exact_mut(pixels).enumerate() {
            let plane = &x[(image * g.in_channels + c) * g.in_pixels()..][..g.in_pixels()];
            shifted_copy(dst, plane, g.width, dy, dx, None);
        }
    }
}

/// A tap's offset into the input, `k − p`, as (phase, shift) at stride 2: input index
/// `2·o + k − p = 2·(o + shift) + phase`.
fn phase_and_shift(k: usize, p: usize) -> (usize, isize) {
    let offset = k as isize - p as isize;
    (offset.rem_euclid(2) as usize, offset.div_euclid(2))
}

/// Whether, at stride 2, every tap reads phase-plane columns below the output width, so that
/// phase planes exactly as wide as the output rows hold everything [`im2col_by_phases`] reads.
/// (A 1×1 kernel skips the phase planes: with one tap per phase, building one is a second pass
/// for nothing, measured 5–10 % slower.)
fn phases_cover(g: &ConvGeometry) -> bool {
    phase_and_shift(g.kernel[1] - 1, g.padding[1]).1 <= 0
}

/// Each tap of the kernel at stride 2 as (its row within a channel's block of the im2col
/// matrix, the phase plane it reads, the shift (dy, dx) within that plane): what
/// [`im2col_by_phases`] and its adjoint [`col2im_by_phases`] walk, computed once per call.
fn phase_taps(g: &ConvGeometry) -> Vec<(usize, usize, isize, isize)> {
    let mut taps = Vec::with_capacity(g.kernel[0] * g.kernel[1]);
    for ki in 0..g.kernel[0] {
        let (ry, dy) = phase_and_shift(ki, g.padding[0]);
        for kj in 0..g.kernel[1] {
            let (rx, dx) = phase_and_shift(kj, g.padding[1]);
            taps.push((ki * g.kernel[1] + kj, 2 * ry + rx, dy, dx));
        }
    }
    taps
}

/// [`im2col`] at stride 2 without a gather per output row (rows of 7 or 14 pixels leave most
/// of a vectorised gather in its scalar tail). Each input plane is split once into its four
/// phase planes — even or odd rows × even or odd columns, `ceil(h / 2)` rows of `wo` columns,
/// zero past the image — and each tap is then one shifted copy of one phase plane, as at
/// stride 1.
fn im2col_by_phases(x: &[f32], images: usize, g: &ConvGeometry, col: &mut [f32]) {
    let (ho, wo) = (g.out_height(), g.out_width());
    let (h, w) = (g.height, g.width);
    let columns = images * ho * wo;
    let rows = h.div_ceil(2);
    let mut phases = vec![0.0f32; 4 * rows * wo];
    let taps = phase_taps(g);
    for c in 0..g.in_channels {
        for image in 0..images {
            let plane = &x[(image * g.in_channels + c) * g.in_pixels()..][..g.in_pixels()];
            for (index, phase) in phases.chunks_exact_mut(rows * wo).enumerate() {
                let (ry, rx) = (index / 2, index % 2);
                for (i, dst) in phase.chunks_exact_mut(wo).enumerate() {
                    let iy = 2 * i + ry;
                    if iy < h {
                        gather_row(dst, &plane[iy * w..][..w], rx as isize, 2);
                    } else {
                        dst.fill(0.0);
                    }
                }
            }
            for &(tap, phase, dy, dx) in &taps {
                let row_index = c * taps.len() + tap;
                let dst = &mut col[row_index * columns + image * ho * wo..][..ho * wo];
                let phase = &phases[phase * rows * wo..][..rows * wo];
                shifted_copy(dst, phase, wo, dy, dx, None);
            }
        }
    }
}

/// Where a plane of rows `w` wide, shifted by (dy, dx), overlaps an output of `out_len`
/// elements with the same row width: the shared geometry of [`shifted_copy`] and
/// [`shifted_add`].
struct Shift {
    /// Output rows `first..last` read rows inside the plane.
    first: usize,
    last: usize,
    /// Output indices `lo..hi` map to `plane[i + shift]` inside the plane: rows `first..last`
    /// trimmed at the ends, where the trimmed entries lie in border columns.
    lo: usize,
    hi: usize,
    shift: isize,
    /// Columns at the left and right of each row whose source column lies outside the plane.
    left: usize,
    right: usize,
}

impl Shift {
    fn new(plane_len: usize, out_len: usize, w: usize, dy: isize, dx: isize) -> Self {
        let (h, ho) = (plane_len / w, out_len / w);
        let first = ((-dy).max(0) as usize).min(ho);
        let last = ((h as isize - dy).max(0) as usize).clamp(first, ho);
        let shift = dy * w as isize + dx;
        let lo = ((first * w) as isize).max(-shift).min((last * w) as isize) as usize;
        let hi = ((last * w) as isize)
            .min(plane_len as isize - shift)
            .max(lo as isize) as usize;
        let (left, right) = if dx < 0 {
            ((-dx as usize).min(w), 0)
        } else {
            (0, (dx as usize).min(w))
        };
        Shift {
            first,
            last,
            lo,
            hi,
            shift,
            left,
            right,
        }
    }

    /// The plane's indices that output indices `lo..hi` map to (empty when they are).
    fn source(&self) -> std::ops::Range<usize> {
        if self.hi == self.lo {
            // `lo + shift` may be negative then.
            return 0..0;
        }
        let start = (self.lo as isize + self.shift) as usize;
        start..start + (self.hi - self.lo)
    }

    /// Zeroes, in every row of `first..last` of `out`, the columns whose source lies outside.
    fn zero_border_columns(&self, out: &mut [f32], w: usize) {
        // One column (3×3 kernels) is the common case: a store, not a call to memset per row.
        let zero = |cells: &mut [f32]| match cells {
            [] => {}
            [one] => *one = 0.0,
            many => many.fill(0.0),
        };
        for row in out[self.first * w..self.last * w].chunks_exact_mut(w) {
            zero(&mut row[..self.left]);
            zero(&mut row[w - self.right..]);
        }
    }
}

/// `dst[y][x] = plane[y + dy][x + dx]`, zero where that falls outside the plane; `dst` and
/// `plane` are row-major with rows `w` wide. One copy of the whole overlap instead of one per
/// row, then zeros written where the shift crossed the left or right border. With a `slope`,
/// the copy is of LeakyReLU(plane), activated on the way (no pass of its own).
fn shifted_copy(
    dst: &mut [f32],
    plane: &[f32],
    w: usize,
    dy: isize,
    dx: isize,
    slope: Option<f32>,
) {
    let s = Shift::new(plane.len(), dst.len(), w, dy, dx);
    dst[..s.first * w].fill(0.0);
    dst[s.last * w..].fill(0.0);
    dst[s.first * w..s.lo].fill(0.0);
    dst[s.hi..s.last * w].fill(0.0);
    copy_activated(&mut dst[s.lo..s.hi], &plane[s.source()], slope);
    s.zero_border_columns(dst, w);
}

/// The adjoint of [`shifted_copy`]: `plane[y + dy][x + dx] += src[y][x]` wherever that falls
/// inside the plane. Like the copy, one pass over the whole overlap: `src`'s entries whose
/// column falls outside are zeroed first (`src` is scratch), so what the flat pass adds across
/// a row's end is zero.
fn shifted_add(plane: &mut [f32], src: &mut [f32], w: usize, dy: isize, dx: isize) {
    let s = Shift::new(plane.len(), src.len(), w, dy, dx);
    s.zero_border_columns(src, w);
    let targets = &mut plane[s.source()];
    targets
        .iter_mut()
        .zip(&src[s.lo..s.hi])
        .for_each(|(t, v)| *t += v);
}

/// The adjoint of [`im2col`]: adds each column entry back onto the input pixel it was read
/// from. `x` must hold zeros (or what is to be added to). `col` is scratch: the phase path
/// zeroes entries that fall outside the image.
fn col2im(col: &mut [f32], images: usize, g: &ConvGeometry, x: &mut [f32]) {
    if g.stride == [2, 2] && g.kernel != [1, 1] && phases_cover(g) {
        col2im_by_phases(col, images, g, x);
    } else {
        col2im_by_rows(col, images, g, x);
    }
}

/// [`col2im`] for any geometry: one scatter per output row.
fn col2im_by_rows(col: &[f32], images: usize, g: &ConvGeometry, x: &mut [f32]) {
    let (ho, wo) = (g.out_height(), g.out_width());
    let columns = images * ho * wo;
    for (row_index, row) in col.chunks_exact(columns).enumerate() {
        let (c, ki, kj) = patch_position(row_index, g);
        for image in 0..images {
            let plane = &mut x[(image * g.in_channels + c) * g.in_pixels()..][..g.in_pixels()];
            for oy in 0..ho {
                if let Some(iy) = input_row(oy, ki, g) {
                    scatter_add_row(
                        &mut plane[iy * g.width..][..g.width],
                        &row[(image * ho + oy) * wo..][..wo],
                        kj as isize - g.padding[1] as isize,
                        g.stride[1],
                    );
                }
            }
        }
    }
}

/// [`col2im`] at stride 2, the adjoint of [`im2col_by_phases`]: each tap is added onto its
/// phase plane by one shifted add, then the four phase planes are scattered back onto the
/// input plane once.
fn col2im_by_phases(col: &mut [f32], images: usize, g: &ConvGeometry, x: &mut [f32]) {
    let (ho, wo) = (g.out_height(), g.out_width());
    let (h, w) = (g.height, g.width);
    let columns = images * ho * wo;
    let rows = h.div_ceil(2);
    let mut phases = vec![0.0f32; 4 * rows * wo];
    let taps = phase_taps(g);
    for c in 0..g.in_channels {
        for image in 0..images {
            phases.fill(0.0);
            for &(tap, phase, dy, dx) in &taps {
                let row_index = c * taps.len() + tap;
                let src = &mut col[row_index * columns + image * ho * wo..][..ho * wo];
                let phase = &mut phases[phase * rows * wo..][..rows * wo];
                shifted_add(phase, src, wo, dy, dx);
            }
            let plane = &mut x[(image * g.in_channels + c) * g.in_pixels()..][..g.in_pixels()];
            for (index, phase) in phases.chunks_exact(rows * wo).enumerate() {
                let (ry, rx) = (index / 2, index % 2);
                for (i, src) in phase.chunks_exact(wo).enumerate() {
                    let iy = 2 * i + ry;
                    if iy < h {
                        scatter_add_row(&mut plane[iy * w..][..w], src, rx as isize, 2);
                    }
                }
            }
        }
    }
}

fn patch_position(row: usize, g: &ConvGeometry) -> (usize, usize, usize) {
    let [kh, kw] = g.kernel;
    (row / (kh * kw), row / kw % kh, row % kw)
}

/// The input row that output row `oy` reads through kernel row `ki`, if inside the image.
fn input_row(oy: usize, ki: usize, g: &ConvGeometry) -> Option<usize> {
    (oy * g.stride[0] + ki)
        .checked_sub(g.padding[0])
        .filter(|&iy| iy < g.height)
}

/// Copies a chunk's NCHW maps (`images × channels × pixels`) into a `channels × (images ·
/// pixels)` matrix, the layout the matrix products want.
fn channels_first(maps: &[f32], images: usize, channels: usize, pixels: usize, out: &mut [f32]) {
    for image in 0..images {
        for c in 0..channels {
            out[(c * images + image) * pixels..][..pixels]
                .copy_from_slice(&maps[(image * channels + c) * pixels..][..pixels]);
        }
    }
}

/// A chunk's NCHW maps as a `channels × (images · pixels)` matrix: the maps themselves for one
/// image, else [`channels_first`]'s copy in `scratch`.
fn as_matrix<'a>(
    maps: &'a [f32],
    images: usize,
    channels: usize,
    pixels: usize,
    scratch: &'a mut [f32],
) -> &'a [f32] {
    if images == 1 {
        maps
    } else {
        channels_first(maps, images, channels, pixels, scratch);
        scratch
    }
}

/// Adds a `channels × (images · pixels)` matrix onto NCHW maps: the inverse layout of
/// [`channels_first`].
fn images_first_add(
    matrix: &[f32],
    images: usize,
    channels: usize,
    pixels: usize,
    maps: &mut [f32],
) {
    for image in 0..images {
        for c in 0..channels {
            let src = &matrix[(c * images + image) * pixels..][..pixels];
            let dst = &mut maps[(image * channels + c) * pixels..][..pixels];
            dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
        }
    }
}

/// `weight` (`[out, in, kh, kw]`) as `kh` row-major `[out, in · kw]` matrices, one per kernel
/// row, for [`conv_by_kernel_rows`].
fn weight_by_kernel_rows(weight: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (ci, co, [kh, kw]) = (g.in_channels, g.out_channels, g.kernel);
    let mut rows = vec![0.0f32; weight.len()];
    for ki in 0..kh {
        for o in 0..co {
            for i in 0..ci {
                let src = &weight[((o * ci + i) * kh + ki) * kw..][..kw];
                rows[((ki * co + o) * ci + i) * kw..][..kw].copy_from_slice(src);
            }
        }
    }
    rows
}

/// Length of one row of [`fill_kernel_rows`]'s buffer: the plane and `kh − 1` rows of margin.
fn kernel_row_len(g: &ConvGeometry) -> usize {
    g.in_pixels() + (g.kernel[0] - 1) * g.width
}

/// Fills `rows` (`in · kw` rows of [`kernel_row_len`]) for one image `x`: row (c, kj) holds
/// plane c shifted by kernel column kj, between `padding` zero rows above and the rest of the
/// margin below. Kernel row ki of the convolution is then the view [`kernel_row_taps`]. With a
/// `slope`, the rows hold LeakyReLU(x) (the fused activation, applied while copying).
fn fill_kernel_rows(x: &[f32], g: &ConvGeometry, rows: &mut [f32], slope: Option<f32>) {
    let (kw, w, pixels) = (g.kernel[1], g.width, g.in_pixels());
    let top = g.padding[0] * w;
    for (r, row) in rows.chunks_exact_mut(kernel_row_len(g)).enumerate() {
        let (c, kj) = (r / kw, r % kw);
        row[..top].fill(0.0);
        row[top + pixels..].fill(0.0);
        let dx = kj as isize - g.padding[1] as isize;
        shifted_copy(
            &mut row[top..top + pixels],
            &x[c * pixels..][..pixels],
            w,
            0,
            dx,
            slope,
        );
    }
}

/// The `[in · kw, pixels]` im2col rows of kernel row `ki`, as a view into the buffer of
/// [`fill_kernel_rows`]: output pixel p reads input row y + ki − padding, at p + ki·w there.
fn kernel_row_taps<'a>(rows: &'a [f32], ki: usize, g: &ConvGeometry) -> MatRef<'a> {
    MatRef {
        data: &rows[ki * g.width..],
        rows: g.in_channels * g.kernel[1],
        cols: g.in_pixels(),
        row_stride: kernel_row_len(g),
        col_stride: 1,
    }
}

/// One image's stride-1 "same" convolution without a full im2col matrix: `kh` products of
/// `[out, in · kw]` (`kernel_rows`, from [`weight_by_kernel_rows`]) by [`kernel_row_taps`]
/// added onto `out` (which holds the bias). A third of im2col's copying for 3×3 kernels, and
/// the output is written in NCHW.
fn conv_by_kernel_rows(
    x: &[f32],
    kernel_rows: &[f32],
    g: &ConvGeometry,
    out: &mut [f32],
    slope: Option<f32>,
) {
    let (co, patch_row) = (g.out_channels, g.in_channels * g.kernel[1]);
    with_scratch(patch_row * kernel_row_len(g), 0, |rows, _| {
        fill_kernel_rows(x, g, rows, slope);
        for ki in 0..g.kernel[0] {
            let weight = MatRef::row_major(
                &kernel_rows[ki * co * patch_row..][..co * patch_row],
                co,
                patch_row,
            );
            let out = MatMut::row_major(out, co, g.in_pixels());
            matmul(out, weight, kernel_row_taps(rows, ki, g), true);
        }
    });
}

/// One image's contribution to the weight gradient by kernel rows (the adjoint of
/// [`conv_by_kernel_rows`]): adds `grad · taps(ki)ᵀ` to `partial`, `kh` column-major
/// `[out, in · kw]` blocks (so gemm reads the taps in place and packs only `grad`).
fn weight_grad_by_kernel_rows(
    x: &[f32],
    grad: &[f32],
    g: &ConvGeometry,
    partial: &mut [f32],
    slope: Option<f32>,
) {
    let (co, patch_row) = (g.out_channels, g.in_channels * g.kernel[1]);
    with_scratch(patch_row * kernel_row_len(g), 0, |rows, _| {
        fill_kernel_rows(x, g, rows, slope);
        let grad = MatRef::row_major(grad, co, g.in_pixels());
        for (ki, block) in partial.chunks_exact_mut(co * patch_row).enumerate() {
            let dst = MatMut::column_major(block, co, patch_row);
            matmul(dst, grad, kernel_row_taps(rows, ki, g).t(), true);
        }
    });
}

/// How the forward pass computes a convolution image by image: the direct kernel where
/// [`Direct::new`] takes it, else kernel rows where [`ConvGeometry::uses_kernel_rows`].
/// Either way the per-image copy of the input (padded image or kernel rows) applies a fused
/// activation.
enum ByImage {
    Direct(Direct),
    /// The weight as [`weight_by_kernel_rows`] arranges it.
    KernelRows(Vec<f32>),
}

impl ByImage {
    fn new(weight: &[f32], g: &ConvGeometry) -> Option<ByImage> {
        match Direct::new(weight, g) {
            Some(direct) => Some(ByImage::Direct(direct)),
            None => g
                .uses_kernel_rows()
                .then(|| ByImage::KernelRows(weight_by_kernel_rows(weight, g))),
        }
    }

    /// Adds one image's convolution of `x` (LeakyReLU(`x`) with a `slope`) onto `out`.
    fn conv_image(&self, x: &[f32], g: &ConvGeometry, out: &mut [f32], slope: Option<f32>) {
        match self {
            ByImage::Direct(direct) => with_scratch(direct.scratch_len(g), 0, |padded, _| {
                direct.conv_image(x, g, out, slope, padded)
            }),
            ByImage::KernelRows(rows) => conv_by_kernel_rows(x, rows, g, out, slope),
        }
    }
}

/// The convolution of `x` (`[batch, in, h, w]`) with `weight` (`[out, in, kh, kw]`) plus
/// `bias` (`[out]`): `[batch, out, ho, wo]`. With `input_slope`, the convolution of
/// LeakyReLU(`x`) with that slope, the activation fused into the kernel.
pub fn conv2d(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    g: &ConvGeometry,
    input_slope: Option<f32>,
) -> Vec<f32> {
    conv2d_masked(x, weight, bias, g, input_slope, None)
}

/// [`conv2d`], its output then multiplied by LeakyReLU's derivative at `output_mask.0` (slope
/// `output_mask.1`) chunk by chunk while in cache: the input gradient at stride 1 of a fused
/// convolution.
fn conv2d_masked(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    g: &ConvGeometry,
    input_slope: Option<f32>,
    output_mask: Option<(&[f32], f32)>,
) -> Vec<f32> {
    assert!(g.is_valid(), "invalid convolution geometry {g:?}");
    assert_eq!(
        x.len(),
        g.batch * g.in_channels * g.in_pixels(),
        "input size"
    );
    assert_eq!(weight.len(), g.out_channels * g.patch(), "weight size");
    let (co, k, pixels) = (g.out_channels, g.patch(), g.out_pixels());
    let chunk = g.images_per_chunk(CHUNK_PIXELS);
    let by_image = ByImage::new(weight, g);
    let weight = MatRef::row_major(weight, co, k);
    let image_len = g.in_channels * g.in_pixels();
    par_fresh(g.batch * co * pixels, chunk * co * pixels, |i, blank| {
        let images = blank.len() / (co * pixels);
        let columns = images * pixels;
        let x = &x[i * chunk * image_len..][..images * image_len];
        // The bias first, the products added onto it: no zeroing, no second pass for the bias.
        let mut out = match bias {
            Some(bias) => blank.fill_runs(pixels, bias.iter().copied().cycle()),
            None => blank.fill_runs(pixels, std::iter::repeat(0.0)),
        };
        if let Some(by_image) = &by_image {
            for (out, x) in out
                .chunks_exact_mut(co * pixels)
                .zip(x.chunks_exact(image_len))
            {
                by_image.conv_image(x, g, out, input_slope);
            }
        } else {
            with_activated(x, input_slope, |x| {
                with_scratch(k * columns, co * columns, |col, product| {
                    im2col(x, images, g, col);
                    let col = MatRef::row_major(col, k, columns);
                    if images == 1 {
                        // One image: its [out, pixels] block of the output is the product.
                        matmul(MatMut::row_major(&mut out, co, columns), weight, col, true);
                    } else {
                        matmul(MatMut::row_major(product, co, columns), weight, col, false);
                        images_first_add(product, images, co, pixels, &mut out);
                    }
                });
            });
        }
        if let Some((at, slope)) = output_mask {
            let start = i * chunk * co * pixels;
            times_leaky_derivative(&mut out, &at[start..][..images * co * pixels], slope);
        }
        out
    })
}

/// The gradient with respect to the input of [`conv2d`], given the output's gradient
/// `grad` (`[batch, out, ho, wo]`): `[batch, in, h, w]`. For a convolution with a fused
/// LeakyReLU, `fused` is its input `x` and slope: the gradient is then multiplied by the
/// activation's derivative at `x`.
pub fn conv2d_input_grad(
    grad: &[f32],
    weight: &[f32],
    g: &ConvGeometry,
    fused: Option<(&[f32], f32)>,
) -> Vec<f32> {
    assert!(g.is_valid(), "invalid convolution geometry {g:?}");
    assert_eq!(
        grad.len(),
        g.batch * g.out_channels * g.out_pixels(),
        "gradient size"
    );
    assert_eq!(weight.len(), g.out_channels * g.patch(), "weight size");
    let image_len = g.in_channels * g.in_pixels();
    if let Some((x, _)) = fused {
        assert_eq!(x.len(), g.batch * image_len, "input size");
    }
    if let Some(transposed) = g.transposed() {
        // At stride 1 the input gradient is itself a convolution: of the output gradient with
        // the flipped, transposed kernel. No scatter, and the forward kernel's speed.
        let flipped = flip_transpose(weight, g);
        return conv2d_masked(grad, &flipped, None, &transposed, None, fused);
    }
    let (co, k, pixels) = (g.out_channels, g.patch(), g.out_pixels());
    let chunk = g.images_per_chunk(CHUNK_PIXELS);
    let mut dx = vec![0.0f32; g.batch * image_len];
    let weight_t = MatRef::row_major(weight, co, k).t();
    dx.par_chunks_mut(chunk * image_len)
        .zip(grad.par_chunks(chunk * co * pixels))
        .enumerate()
        .for_each(|(i, (dx, grad))| {
            let images = grad.len() / (co * pixels);
            let columns = images * pixels;
            with_scratch(k * columns, co * columns, |col, grad_matrix| {
                let grad = MatRef::row_major(
                    as_matrix(grad, images, co, pixels, grad_matrix),
                    co,
                    columns,
                );
                matmul(MatMut::row_major(col, k, columns), weight_t, grad, false);
                col2im(col, images, g, dx);
            });
            if let Some((x, slope)) = fused {
                times_leaky_derivative(dx, &x[i * chunk * image_len..][..dx.len()], slope);
            }
        });
    dx
}

/// `w'[i, o, a, b] = w[o, i, kh − 1 − a, kw − 1 − b]`.
fn flip_transpose(weight: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (ci, co, [kh, kw]) = (g.in_channels, g.out_channels, g.kernel);
    let mut flipped = vec![0.0f32; weight.len()];
    for o in 0..co {
        for i in 0..ci {
            for a in 0..kh {
                for b in 0..kw {
                    flipped[((i * co + o) * kh + a) * kw + b] =
                        weight[((o * ci + i) * kh + (kh - 1 - a)) * kw + (kw - 1 - b)];
                }
            }
        }
    }
    flipped
}

/// The gradient with respect to the weight of [`conv2d`]: `[out, in, kh, kw]`. With
/// `input_slope`, of the convolution with that LeakyReLU fused (the activation recomputed
/// from `x` chunk by chunk).
pub fn conv2d_weight_grad(
    x: &[f32],
    grad: &[f32],
    g: &ConvGeometry,
    input_slope: Option<f32>,
) -> Vec<f32> {
    assert!(g.is_valid(), "invalid convolution geometry {g:?}");
    assert_eq!(
        x.len(),
        g.batch * g.in_channels * g.in_pixels(),
        "input size"
    );
    assert_eq!(
        grad.len(),
        g.batch * g.out_channels * g.out_pixels(),
        "gradient size"
    );
    let (co, k, pixels) = (g.out_channels, g.patch(), g.out_pixels());
    let chunk = g.images_per_chunk(WEIGHT_GRAD_CHUNK_PIXELS);
    let direct = DirectWeightGrad::new(g);
    // One partial sum per chunk, added in chunk order below: the same bits for any thread count.
    let partials: Vec<Vec<f32>> = x
        .par_chunks(chunk * g.in_channels * g.in_pixels())
        .zip(grad.par_chunks(chunk * co * pixels))
        .map(|(x, grad)| match &direct {
            Some(direct) => direct_weight_grad_partial(direct, x, grad, g, input_slope),
            None => weight_grad_partial(x, grad, g, input_slope),
        })
        .collect();
    let summed = sum_in_order(partials);
    if let Some(direct) = direct {
        return direct.to_weight(&summed, g);
    }
    let mut dw = vec![0.0f32; co * k];
    if g.uses_kernel_rows() {
        // [kh][in · kw][out] → [out][in][kh][kw]
        let (ci, [kh, kw]) = (g.in_channels, g.kernel);
        for ki in 0..kh {
            for r in 0..ci * kw {
                let (i, kj) = (r / kw, r % kw);
                for o in 0..co {
                    dw[((o * ci + i) * kh + ki) * kw + kj] = summed[(ki * ci * kw + r) * co + o];
                }
            }
        }
    } else {
        // [patch][out] → [out][patch]
        for o in 0..co {
            for i in 0..k {
                dw[o * k + i] = summed[i * co + o];
            }
        }
    }
    dw
}

/// One chunk's partial weight gradient by the direct kernel, image by image (the layout of
/// [`DirectWeightGrad`]).
fn direct_weight_grad_partial(
    direct: &DirectWeightGrad,
    x: &[f32],
    grad: &[f32],
    g: &ConvGeometry,
    slope: Option<f32>,
) -> Vec<f32> {
    let mut partial = vec![0.0f32; direct.partial_len(g)];
    let (bordered, transposed) = direct.scratch_lens(g);
    let x_images = x.chunks_exact(g.in_channels * g.in_pixels());
    for (x, grad) in x_images.zip(grad.chunks_exact(g.out_channels * g.out_pixels())) {
        with_scratch(bordered, transposed, |bordered, transposed| {
            direct.add_image(x, grad, g, slope, &mut partial, (bordered, transposed));
        });
    }
    partial
}

/// One chunk's `[out, patch]` partial weight gradient (kernel-row blocks `[kh][in · kw][out]`
/// where [`ConvGeometry::uses_kernel_rows`], else column-major `[patch][out]`); with a `slope`,
/// of the convolution of LeakyReLU(x).
fn weight_grad_partial(x: &[f32], grad: &[f32], g: &ConvGeometry, slope: Option<f32>) -> Vec<f32> {
    let (co, k, pixels) = (g.out_channels, g.patch(), g.out_pixels());
    let images = grad.len() / (co * pixels);
    let columns = images * pixels;
    let mut partial = vec![0.0f32; co * k];
    if g.uses_kernel_rows() {
        let x_images = x.chunks_exact(g.in_channels * g.in_pixels());
        for (x, grad) in x_images.zip(grad.chunks_exact(co * pixels)) {
            weight_grad_by_kernel_rows(x, grad, g, &mut partial, slope);
        }
        return partial;
    }
    with_activated(x, slope, |x| {
        with_scratch(k * columns, co * columns, |col, grad_matrix| {
            im2col(x, images, g, col);
            let grad = as_matrix(grad, images, co, pixels, grad_matrix);
            // Column-major: gemm then reads the large im2col matrix in place and packs
            // only the output gradient (row-major, it transposed the product and packed
            // im2col for every chunk: 10 % of a train step). Transposed back below.
            matmul(
                MatMut::column_major(&mut partial, co, k),
                MatRef::row_major(grad, co, columns),
                MatRef::row_major(col, k, columns).t(),
                false,
            );
        });
    });
    partial
}

/// The gradient with respect to the bias of [`conv2d`]: `[out]`, each entry summed over
/// images and pixels in a fixed order (in `f64`, so that large batches lose no precision).
pub fn conv2d_bias_grad(grad: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (co, pixels) = (g.out_channels, g.out_pixels());
    assert_eq!(grad.len(), g.batch * co * pixels, "gradient size");
    (0..co)
        .into_par_iter()
        .map(|c| {
            let sum: f64 = (0..g.batch)
                .map(|image| sum_f64(&grad[(image * co + c) * pixels..][..pixels]))
                .sum();
            sum as f32
        })
        .collect()
}

/// The sum of `values` in `f64`, in eight interleaved running sums: one running sum is a chain
/// of dependent additions, bound by the adder's latency (it was 4 % of a train step); eight
/// independent ones vectorise. The order is fixed, so the bits are too.
fn sum_f64(values: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = values.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| v as f64).sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

fn sum_in_order(mut partials: Vec<Vec<f32>>) -> Vec<f32> {
    let mut total = partials.remove(0);
    for partial in partials {
        total.iter_mut().zip(partial).for_each(|(t, p)| *t += p);
    }
    total
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::activation::leaky;
    use crate::isa::Isa;

    #[test]
    fn valid_range_matches_a_brute_force_count() {
        for n in 0..9 {
            for len in 1..9 {
                for offset in -4isize..4 {
                    for stride in 1..4 {
                        let inside: Vec<usize> = (0..n)
                            .filter(|&i| {
                                let j = (i * stride) as isize + offset;
                                j >= 0 && j < len as isize
                            })
                            .collect();
                        let (lo, hi) = valid_range(n, len, offset, stride);
                        assert_eq!(
                            (lo..hi).collect::<Vec<_>>(),
                            inside,
                            "{n} {len} {offset} {stride}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_shifted_copy_equals_its_rows_gathered_one_by_one() {
        for (h, w, k, p) in [
            (5, 6, 3, 1),
            (1, 4, 3, 1),
            (4, 1, 3, 1),
            (7, 5, 5, 2),
            (3, 3, 1, 0),
            (2, 2, 5, 2),
        ] {
            let g = ConvGeometry {
                batch: 1,
                in_channels: 1,
                height: h,
                width: w,
                out_channels: 1,
                kernel: [k, k],
                stride: [1, 1],
                padding: [p, p],
            };
            let plane: Vec<f32> = (0..h * w).map(|v| v as f32 + 1.0).collect();
            for ki in 0..k {
                for kj in 0..k {
                    let mut fast = vec![f32::NAN; h * w];
                    let (dy, dx) = (ki as isize - p as isize, kj as isize - p as isize);
                    shifted_copy(&mut fast, &plane, w, dy, dx, None);
                    let mut slow = vec![f32::NAN; h * w];
                    for oy in 0..h {
                        let dst = &mut slow[oy * w..][..w];
                        match input_row(oy, ki, &g) {
                            Some(iy) => {
                                gather_row(dst, &plane[iy * w..][..w], kj as isize - p as isize, 1)
                            }
                            None => dst.fill(0.0),
                        }
                    }
                    assert_eq!(fast, slow, "{h}×{w} kernel {k} pad {p} tap ({ki}, {kj})");
                }
            }
        }
    }

    #[test]
    fn every_im2col_path_equals_the_row_by_row_gather() {
        // Stride 1 takes the shifted copies, stride 2 the phase planes where they cover the
        // taps; odd and even sizes, 1×1 and 3×3 (and 2×2, 5×5) kernels, several paddings.
        let mut covered = 0;
        for (h, w) in [
            (28, 28),
            (14, 14),
            (7, 7),
            (5, 6),
            (6, 5),
            (1, 1),
            (2, 3),
            (9, 4),
        ] {
            for (k, p) in [(3, 1), (1, 0), (3, 0), (2, 0), (5, 2), (2, 1), (4, 2)] {
                for stride in [1, 2] {
                    let g = ConvGeometry {
                        batch: 2,
                        in_channels: 3,
                        height: h,
                        width: w,
                        out_channels: 1,
                        kernel: [k, k],
                        stride: [stride, stride],
                        padding: [p, p],
                    };
                    if !g.is_valid() {
                        continue;
                    }
                    covered += usize::from(stride == 2 && k > 1 && phases_cover(&g));
                    let x: Vec<f32> = (0..2 * 3 * h * w).map(|v| v as f32 + 1.0).collect();
                    let len = g.patch() * 2 * g.out_pixels();
                    let (mut fast, mut slow) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                    im2col(&x, 2, &g, &mut fast);
                    im2col_by_rows(&x, 2, &g, &mut slow);
                    assert_eq!(fast, slow, "{h}×{w} kernel {k} pad {p} stride {stride}");
                }
            }
        }
        assert!(
            covered > 20,
            "only {covered} geometries took the phase planes"
        );
    }

    #[test]
    fn the_kernel_rows_paths_equal_the_products_with_im2col() {
        // Integer data: every partial sum is exact, so any summation order gives the same bits.
        let mut taken = 0;
        for (h, w) in [(28, 28), (14, 14), (7, 7), (5, 6), (9, 4), (1, 1), (2, 3)] {
            for (kernel, padding) in [([3, 3], [1, 1]), ([5, 5], [2, 2]), ([3, 1], [1, 0])] {
                let g = ConvGeometry {
                    batch: 1,
                    in_channels: 3,
                    height: h,
                    width: w,
                    out_channels: 5,
                    kernel,
                    stride: [1, 1],
                    padding,
                };
                assert!(g.by_kernel_rows(), "{g:?}");
                taken += 1;
                let x: Vec<f32> = (0..3 * h * w).map(|v| (v % 7) as f32 - 3.0).collect();
                let weight: Vec<f32> = (0..5 * g.patch()).map(|v| (v % 5) as f32 - 2.0).collect();
                let mut col = vec![f32::NAN; g.patch() * g.out_pixels()];
                im2col_by_rows(&x, 1, &g, &mut col);
                let want: Vec<f32> = (0..5 * g.out_pixels())
                    .map(|i| {
                        let (o, p) = (i / g.out_pixels(), i % g.out_pixels());
                        (0..g.patch())
                            .map(|r| weight[o * g.patch() + r] * col[r * g.out_pixels() + p])
                            .sum()
                    })
                    .collect();
                let mut got = vec![0.0; want.len()];
                conv_by_kernel_rows(&x, &weight_by_kernel_rows(&weight, &g), &g, &mut got, None);
                assert_eq!(got, want, "{h}×{w} kernel {kernel:?} padding {padding:?}");

                // The weight gradient: Σ_p grad[o, p] · col[r, p], blocks [kh][in · kw][out].
                let grad: Vec<f32> = (0..5 * g.out_pixels())
                    .map(|v| (v % 3) as f32 - 1.0)
                    .collect();
                let mut blocks = vec![0.0f32; 5 * g.patch()];
                weight_grad_by_kernel_rows(&x, &grad, &g, &mut blocks, None);
                let [kh, kw] = kernel;
                for o in 0..5 {
                    for r in 0..g.patch() {
                        let want: f32 = (0..g.out_pixels())
                            .map(|p| grad[o * g.out_pixels() + p] * col[r * g.out_pixels() + p])
                            .sum();
                        let (c, ki, kj) = patch_position(r, &g);
                        let got = blocks[(ki * 3 * kw + c * kw + kj) * 5 + o];
                        assert_eq!(
                            got, want,
                            "{h}×{w} kernel {kernel:?} dw[{o}, {r}] ({kh} rows)"
                        );
                    }
                }
            }
        }
        assert_eq!(taken, 21);
        // Strided, shrinking and one-row kernels keep im2col.
        let g = |kernel, stride, padding| ConvGeometry {
            batch: 1,
            in_channels: 1,
            height: 8,
            width: 8,
            out_channels: 1,
            kernel,
            stride,
            padding,
        };
        assert!(!g([3, 3], [2, 2], [1, 1]).by_kernel_rows());
        assert!(!g([3, 3], [1, 1], [0, 0]).by_kernel_rows());
        assert!(!g([1, 1], [1, 1], [0, 0]).by_kernel_rows());
    }

    /// Says, past the test harness's capture of `eprintln!` (so that it shows for a passing
    /// test too), that `test` did not run for `isa` because this CPU lacks it.
    pub(super) fn not_run(test: &str, isa: Isa) {
        use std::io::Write;
        let line = format!("{test}: NOT RUN for {isa}: this CPU lacks it\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
    }

    /// The direct kernel on `isa` against im2col products, on every shape below; the number of
    /// shapes run, or `None` (and a line on stderr) where the CPU lacks `isa`.
    fn direct_equals_im2col(isa: Isa, test: &str) -> Option<usize> {
        if !isa.is_available() {
            not_run(test, isa);
            return None;
        }
        // Integer data and a slope of 1/2: every partial sum is exact, so the order of the
        // sums cannot change the bits. Pixel counts that are and are not multiples of 8 and 16
        // (784 = 49 · 16, 196, 8, 16, 24, 51, ...), so tiles of every vector count and
        // partial vectors; output channel counts whose blocks take every width up to 6
        // (AVX2) and 8 (AVX-512), e.g. 13 as 5 + 4 + 4 or 7 + 6, 33 as 6 + 6 + 6 + 5 + 5 + 5.
        let mut taken = 0;
        for (h, w) in [
            (28, 28),
            (14, 14),
            (7, 7),
            (5, 6),
            (9, 4),
            (1, 1),
            (2, 3),
            (3, 17),
            (2, 4),
            (4, 4),
            (3, 8),
        ] {
            for (kernel, padding) in [
                ([3, 3], [1, 1]),
                ([5, 5], [2, 2]),
                ([3, 1], [1, 0]),
                ([5, 3], [2, 1]),
            ] {
                for (ci, co) in [
                    (3, 5),
                    (2, 13),
                    (4, 16),
                    (1, 8),
                    (5, 6),
                    (2, 7),
                    (3, 1),
                    (2, 2),
                    (1, 3),
                    (2, 4),
                    (1, 33),
                ] {
                    let g = ConvGeometry {
                        batch: 1,
                        in_channels: ci,
                        height: h,
                        width: w,
                        out_channels: co,
                        kernel,
                        stride: [1, 1],
                        padding,
                    };
                    let x: Vec<f32> = (0..ci * h * w).map(|v| (v % 7) as f32 - 3.0).collect();
                    let weight: Vec<f32> =
                        (0..co * g.patch()).map(|v| (v % 5) as f32 - 2.0).collect();
                    let bias: Vec<f32> = (0..co).map(|o| o as f32).collect();
                    for slope in [None, Some(0.5)] {
                        let activated: Vec<f32> = match slope {
                            Some(s) => x.iter().map(|&v| leaky(v, s)).collect(),
                            None => x.clone(),
                        };
                        let mut col = vec![f32::NAN; g.patch() * g.out_pixels()];
                        im2col_by_rows(&activated, 1, &g, &mut col);
                        let want: Vec<f32> = (0..co * g.out_pixels())
                            .map(|i| {
                                let (o, p) = (i / g.out_pixels(), i % g.out_pixels());
                                bias[o]
                                    + (0..g.patch())
                                        .map(|r| {
                                            weight[o * g.patch() + r] * col[r * g.out_pixels() + p]
                                        })
                                        .sum::<f32>()
                            })
                            .collect();
                        let direct = Direct::for_isa(&weight, &g, isa).expect("stride 1, same");
                        assert_eq!(direct.isa(), isa);
                        let mut got: Vec<f32> =
                            (0..want.len()).map(|i| bias[i / g.out_pixels()]).collect();
                        // Scratch full of NaN: a lane that read outside the padded copy shows.
                        let mut padded = vec![f32::NAN; direct.scratch_len(&g)];
                        direct.conv_image(&x, &g, &mut got, slope, &mut padded);
                        assert_eq!(
                            got, want,
                            "{isa}: {h}×{w} {ci}→{co} kernel {kernel:?} padding {padding:?} \
                             {slope:?}"
                        );
                        taken += 1;
                    }
                }
            }
        }
        Some(taken)
    }

    #[test]
    fn the_avx512_direct_kernel_equals_the_products_with_im2col() {
        let test = "the_avx512_direct_kernel_equals_the_products_with_im2col";
        if let Some(taken) = direct_equals_im2col(Isa::Avx512, test) {
            assert_eq!(taken, 11 * 4 * 11 * 2);
        }
    }

    #[test]
    fn the_avx2_direct_kernel_equals_the_products_with_im2col() {
        let test = "the_avx2_direct_kernel_equals_the_products_with_im2col";
        if let Some(taken) = direct_equals_im2col(Isa::Avx2, test) {
            assert_eq!(taken, 11 * 4 * 11 * 2);
        }
    }

    /// The direct weight gradient on `isa` against the sums of im2col products, on every shape
    /// below; the number of shapes run, or `None` (and a line on stderr) where the CPU lacks
    /// `isa`.
    fn direct_weight_grad_equals_im2col(isa: Isa, test: &str) -> Option<usize> {
        if !isa.is_available() {
            not_run(test, isa);
            return None;
        }
        // Integer data and a slope of 1/2: every partial sum is exact. Output channel counts
        // that fill no whole vector (5, 13, 33), one, two and three vectors of 8 and 16 lanes
        // (blocks of every width), odd and even input channel counts (tiles of one and two
        // channels), maps of one pixel up to 28×28, and two images (the sums across images).
        let mut taken = 0;
        for (h, w) in [(28, 28), (14, 14), (7, 7), (5, 6), (1, 1), (2, 3), (3, 17)] {
            for (ci, co) in [
                (1, 16),
                (3, 5),
                (2, 13),
                (4, 32),
                (5, 48),
                (2, 33),
                (3, 1),
                (1, 8),
            ] {
                let g = ConvGeometry {
                    batch: 2,
                    in_channels: ci,
                    height: h,
                    width: w,
                    out_channels: co,
                    kernel: [3, 3],
                    stride: [1, 1],
                    padding: [1, 1],
                };
                let (pixels, patch) = (g.in_pixels(), g.patch());
                let x: Vec<f32> = (0..2 * ci * pixels).map(|v| (v % 7) as f32 - 3.0).collect();
                let grad: Vec<f32> = (0..2 * co * pixels)
                    .map(|v| ((v * 31) % 5) as f32 - 2.0)
                    .collect();
                for slope in [None, Some(0.5)] {
                    let activated: Vec<f32> = match slope {
                        Some(s) => x.iter().map(|&v| leaky(v, s)).collect(),
                        None => x.clone(),
                    };
                    let mut want = vec![0.0f32; co * patch];
                    for image in 0..2 {
                        let mut col = vec![f32::NAN; patch * pixels];
                        im2col_by_rows(&activated[image * ci * pixels..], 1, &g, &mut col);
                        let grad = &grad[image * co * pixels..];
                        for o in 0..co {
                            for r in 0..patch {
                                want[o * patch + r] += (0..pixels)
                                    .map(|p| grad[o * pixels + p] * col[r * pixels + p])
                                    .sum::<f32>();
                            }
                        }
                    }
                    let direct = DirectWeightGrad::for_isa(&g, isa).expect("3×3, stride 1, same");
                    assert_eq!(direct.isa(), isa);
                    let mut partial = vec![0.0f32; direct.partial_len(&g)];
                    // Scratch full of NaN: a tap read outside what was written shows.
                    let (a, b) = direct.scratch_lens(&g);
                    let (mut bordered, mut transposed) = (vec![f32::NAN; a], vec![f32::NAN; b]);
                    for image in 0..2 {
                        direct.add_image(
                            &x[image * ci * pixels..][..ci * pixels],
                            &grad[image * co * pixels..][..co * pixels],
                            &g,
                            slope,
                            &mut partial,
                            (&mut bordered, &mut transposed),
                        );
                    }
                    assert_eq!(
                        direct.to_weight(&partial, &g),
                        want,
                        "{isa}: {h}×{w} {ci}→{co} {slope:?}"
                    );
                    taken += 1;
                }
            }
        }
        Some(taken)
    }

    #[test]
    fn the_avx512_direct_weight_gradient_equals_the_products_with_im2col() {
        let test = "the_avx512_direct_weight_gradient_equals_the_products_with_im2col";
        if let Some(taken) = direct_weight_grad_equals_im2col(Isa::Avx512, test) {
            assert_eq!(taken, 7 * 8 * 2);
        }
    }

    #[test]
    fn the_avx2_direct_weight_gradient_equals_the_products_with_im2col() {
        let test = "the_avx2_direct_weight_gradient_equals_the_products_with_im2col";
        if let Some(taken) = direct_weight_grad_equals_im2col(Isa::Avx2, test) {
            assert_eq!(taken, 7 * 8 * 2);
        }
    }

    #[test]
    fn no_direct_weight_gradient_on_the_portable_path_or_for_other_shapes() {
        let g = |kernel, stride, padding| ConvGeometry {
            batch: 1,
            in_channels: 2,
            height: 8,
            width: 8,
            out_channels: 3,
            kernel,
            stride,
            padding,
        };
        assert!(DirectWeightGrad::for_isa(&g([3, 3], [1, 1], [1, 1]), Isa::Portable).is_none());
        for isa in Isa::ALL {
            for (kernel, stride, padding) in [
                ([3, 3], [2, 2], [1, 1]),
                ([3, 3], [1, 1], [0, 0]),
                ([5, 5], [1, 1], [2, 2]),
                ([1, 1], [1, 1], [0, 0]),
            ] {
                let prepared = DirectWeightGrad::for_isa(&g(kernel, stride, padding), isa);
                assert!(
                    prepared.is_none(),
                    "{isa} {kernel:?} {stride:?} {padding:?}"
                );
            }
            let prepared = DirectWeightGrad::for_isa(&g([3, 3], [1, 1], [1, 1]), isa);
            let want = (isa != Isa::Portable && isa.is_available()).then_some(isa);
            assert_eq!(prepared.map(|p| p.isa()), want);
        }
    }

    #[test]
    fn no_direct_kernel_on_the_portable_path_or_for_other_shapes() {
        let g = |kernel, stride, padding| ConvGeometry {
            batch: 1,
            in_channels: 2,
            height: 8,
            width: 8,
            out_channels: 3,
            kernel,
            stride,
            padding,
        };
        let weight = vec![1.0; 3 * 2 * 9];
        assert!(Direct::for_isa(&weight, &g([3, 3], [1, 1], [1, 1]), Isa::Portable).is_none());
        for isa in Isa::ALL {
            assert!(Direct::for_isa(&weight, &g([3, 3], [2, 2], [1, 1]), isa).is_none());
            assert!(Direct::for_isa(&weight, &g([3, 3], [1, 1], [0, 0]), isa).is_none());
            let prepared = Direct::for_isa(&weight, &g([3, 3], [1, 1], [1, 1]), isa);
            let want = (isa != Isa::Portable && isa.is_available()).then_some(isa);
            assert_eq!(prepared.map(|d| d.isa()), want, "{isa}");
        }
    }

    #[test]
    fn strided_rows_gather_and_scatter_the_right_pixels() {
        let src: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let mut dst = vec![f32::NAN; 5];
        gather_row(&mut dst, &src, -1, 2);
        assert_eq!(dst, [0.0, 1.0, 3.0, 5.0, 7.0]);
        let mut back = vec![0.0; 9];
        scatter_add_row(&mut back, &[1.0, 2.0, 3.0, 4.0, 5.0], -1, 2);
        assert_eq!(back, [0.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0, 5.0, 0.0]);
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col_and_its_paths_agree() {
        // <im2col(x), c> = <x, col2im(c)> for every x, c: the defining property of the adjoint.
        // Small integers keep every sum exact, so the two col2im paths must agree bit for bit.
        for (h, w, k, p, stride) in [
            (5, 6, 3, 1, [2, 1]),
            (28, 28, 3, 1, [2, 2]),
            (7, 7, 3, 1, [2, 2]),
            (6, 5, 2, 0, [2, 2]),
            (9, 4, 5, 2, [2, 2]),
            (1, 1, 3, 1, [2, 2]),
            (8, 8, 1, 0, [2, 2]),
            (6, 6, 3, 1, [1, 1]),
        ] {
            let g = ConvGeometry {
                batch: 2,
                in_channels: 3,
                height: h,
                width: w,
                out_channels: 1,
                kernel: [k, k],
                stride,
                padding: [p, p],
            };
            let x: Vec<f32> = (0..2 * 3 * h * w)
                .map(|v| ((v * 7919) % 13) as f32 - 6.0)
                .collect();
            let columns = 2 * g.out_pixels();
            let c: Vec<f32> = (0..g.patch() * columns)
                .map(|v| ((v * 104729) % 11) as f32 - 5.0)
                .collect();
            let mut col = vec![f32::NAN; c.len()];
            im2col(&x, 2, &g, &mut col);
            let mut back = vec![0.0; x.len()];
            col2im(&mut c.clone(), 2, &g, &mut back);
            let lhs: f32 = col.iter().zip(&c).map(|(a, b)| a * b).sum();
            let rhs: f32 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
            assert_eq!(lhs, rhs, "{h}×{w} kernel {k} pad {p} stride {stride:?}");
            let mut by_rows = vec![0.0; x.len()];
            col2im_by_rows(&c, 2, &g, &mut by_rows);
            assert_eq!(
                back, by_rows,
                "{h}×{w} kernel {k} pad {p} stride {stride:?}"
            );
        }
    }
}
