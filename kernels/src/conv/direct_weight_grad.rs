//! The weight gradient of a stride-1 "same" 3×3 convolution as a direct kernel on AVX-512F or
//! AVX2 + FMA: `dW[o, c, ki, kj] = Σ_images Σ_p grad[o, p] · x[c, p + tap(ki, kj)]`, summed
//! in registers, with no im2col matrix, no kernel-row copies and no matrix product.
//!
//! The forward kernel's shape turned around: the vectors run over *output channels* (of the
//! output gradient, transposed once per image to `[pixel][out]`), and the input's taps are
//! broadcast, one scalar per tap, from a copy of the image with a zero border (so a tap off the
//! image reads a zero: no lane masks). A tile is up to `WEIGHT_GRAD_VECTORS` vectors of output
//! channels by the 9 taps of one or two input channels; its accumulators stay in registers over
//! every pixel of the image, and the reduction over pixels is the loop itself, so no lane is
//! ever reduced across. Each pixel step is one load per vector of the output gradient, one
//! broadcast per tap and a multiply-add per (vector, tap).
//!
//! Only 3×3 kernels go this way (every stride-1 convolution of a Wide-ResNet): the taps are
//! then compile-time offsets from three row pointers. Other shapes keep the matrix products.
//! The results equal those of the products with im2col up to the order of the sums.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Kernel, Simd};
use super::{direct::tiles, ConvGeometry};
use crate::activation::copy_activated;
use crate::isa::Isa;

/// Kernel rows and columns of the convolutions this kernel computes.
const SIDE: usize = 3;
/// Taps per input channel.
const TAPS: usize = SIDE * SIDE;

/// The weight gradient of one 3×3 stride-1 "same" convolution, prepared for one instruction
/// set: how output channels and input channels are cut into tiles.
///
/// The partial sums it adds to ([`DirectWeightGrad::add_image`]) are `[patch][padded_out]`:
/// row `(c · 3 + ki) · 3 + kj`, one column per output channel, the channel count rounded up to
/// whole vectors (the extra columns stay zero); [`DirectWeightGrad::to_weight`] turns them into
/// the `[out, in, 3, 3]` gradient.
pub(super) struct DirectWeightGrad {
    /// The instruction set the tiles were made for.
    isa: Isa,
    /// Its lanes per vector.
    lanes: usize,
    /// Output channels rounded up to whole vectors: the row length of the partial sums and of
    /// the transposed output gradient.
    padded_out: usize,
    /// `(first vector, vectors, input channels per tile)` of each block of output channels.
    out_blocks: Vec<(usize, usize, usize)>,
}

impl DirectWeightGrad {
    /// Prepares `g` on the instruction set [`crate::isa()`] selects, or `None` where that is
    /// [`Isa::Portable`] or `g` is not a stride-1, 3×3 convolution whose output is as large
    /// as its input.
    pub(super) fn new(g: &ConvGeometry) -> Option<DirectWeightGrad> {
        DirectWeightGrad::for_isa(g, crate::isa::isa())
    }

    /// [`DirectWeightGrad::new`] on `isa`: `None` also where the CPU lacks it.
    pub(super) fn for_isa(g: &ConvGeometry, isa: Isa) -> Option<DirectWeightGrad> {
        if !g.by_kernel_rows() || g.kernel != [SIDE, SIDE] || !isa.is_available() {
            return None;
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(DirectWeightGrad::prepare::<Avx512>(g)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(DirectWeightGrad::prepare::<Avx2>(g)),
            _ => None,
        }
    }

    /// The instruction set this gradient was prepared for.
    #[cfg(test)]
    pub(super) fn isa(&self) -> Isa {
        self.isa
    }

    fn prepare<S: Simd>(g: &ConvGeometry) -> DirectWeightGrad {
        const { assert!(S::WEIGHT_GRAD_VECTORS <= MAX_VECTORS) };
        let vectors = g.out_channels.div_ceil(S::LANES);
        let out_blocks = tiles(vectors, S::WEIGHT_GRAD_VECTORS)
            .into_iter()
            .map(|(first, nv)| {
                // As many input channels as the set's accumulators hold at this width.
                let channels = (S::WEIGHT_GRAD_ACCUMULATORS / (TAPS * nv)).clamp(1, MAX_CHANNELS);
                (first, nv, channels)
            })
            .collect();
        DirectWeightGrad {
            isa: S::ISA,
            lanes: S::LANES,
            padded_out: vectors * S::LANES,
            out_blocks,
        }
    }

    /// Floats of one chunk's partial sums.
    pub(super) fn partial_len(&self, g: &ConvGeometry) -> usize {
        g.patch() * self.padded_out
    }

    /// Floats of the two scratch buffers [`DirectWeightGrad::add_image`] needs: the bordered
    /// copy of the image and the transposed output gradient.
    pub(super) fn scratch_lens(&self, g: &ConvGeometry) -> (usize, usize) {
        (
            g.in_channels * bordered_plane(g),
            g.in_pixels() * self.padded_out,
        )
    }

    /// Adds one image's weight gradient to `partial` ([`DirectWeightGrad::partial_len`]
    /// floats): `x` (`[in, h, w]`; LeakyReLU(`x`) with a `slope`) against `grad` (`[out, h, w]`).
    /// `bordered` and `transposed` are scratch of [`DirectWeightGrad::scratch_lens`] floats;
    /// their contents are overwritten.
    pub(super) fn add_image(
        &self,
        x: &[f32],
        grad: &[f32],
        g: &ConvGeometry,
        slope: Option<f32>,
        partial: &mut [f32],
        (bordered, transposed): (&mut [f32], &mut [f32]),
    ) {
        let (ci, co, pixels) = (g.in_channels, g.out_channels, g.in_pixels());
        assert_eq!(x.len(), ci * pixels, "input size");
        assert_eq!(grad.len(), co * pixels, "gradient size");
        assert_eq!(partial.len(), self.partial_len(g), "partial sum size");
        let (bordered_len, transposed_len) = self.scratch_lens(g);
        assert!(bordered.len() >= bordered_len, "scratch size");
        assert!(transposed.len() >= transposed_len, "scratch size");
        fill_bordered(x, g, &mut bordered[..bordered_len], slope);
        transpose(grad, co, pixels, self.padded_out, transposed);
        let kernel: fn(usize, usize) -> TileKernel = match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => kernel::<Avx512>,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => kernel::<Avx2>,
            // A function, not a panic here: on other CPUs every arm above is compiled out.
            _ => |_, _| unreachable!("DirectWeightGrad::for_isa prepares only AVX-512 or AVX2"),
        };
        let plane = bordered_plane(g);
        for &(first_vector, nv, most_channels) in &self.out_blocks {
            let first_out = first_vector * self.lanes;
            for (first_channel, nc) in tiles(ci, most_channels) {
                let tile = Tile {
                    src: bordered[first_channel * plane..].as_ptr(),
                    plane,
                    row: g.width + SIDE - 1,
                    height: g.height,
                    width: g.width,
                    grad: transposed[first_out..].as_ptr(),
                    grad_stride: self.padded_out,
                    partial: partial[first_channel * TAPS * self.padded_out + first_out..]
                        .as_mut_ptr(),
                    partial_stride: self.padded_out,
                };
                // SAFETY: `for_isa` checked that the CPU has `self.isa`, the set `kernel` runs
                // on; the tile reads `nc` bordered planes from `first_channel` on (each tap of
                // each pixel inside its plane, see `fill_bordered`), `nv` vectors of each
                // transposed gradient row from `first_out` on (inside `padded_out`), and
                // writes `nc · 9` rows of `nv` vectors of `partial` likewise.
                unsafe { kernel(nv, nc)(&tile) }
            }
        }
    }

    /// The `[out, in, 3, 3]` weight gradient from summed partial sums.
    pub(super) fn to_weight(&self, summed: &[f32], g: &ConvGeometry) -> Vec<f32> {
        let (co, k) = (g.out_channels, g.patch());
        let mut dw = vec![0.0f32; co * k];
        for (r, row) in summed.chunks_exact(self.padded_out).enumerate() {
            for (o, &value) in row[..co].iter().enumerate() {
                dw[o * k + r] = value;
            }
        }
        dw
    }
}

/// Floats per input channel of the bordered copy: `h + 2` rows of `w + 2`.
fn bordered_plane(g: &ConvGeometry) -> usize {
    (g.height + SIDE - 1) * (g.width + SIDE - 1)
}

/// Writes each channel of `x` (LeakyReLU(`x`) with a `slope`) into `bordered` with one row and
/// one column of zeros on every side, so that pixel `(y, x)`'s tap `(ki, kj)` is at
/// `(y + ki) · (w + 2) + x + kj` of its channel's plane (the last, `(h + 1) · (w + 2) + w + 1`,
/// inside it).
fn fill_bordered(x: &[f32], g: &ConvGeometry, bordered: &mut [f32], slope: Option<f32>) {
    let (w, pixels, row) = (g.width, g.in_pixels(), g.width + SIDE - 1);
    for (copy, plane) in bordered
        .chunks_exact_mut(bordered_plane(g))
        .zip(x.chunks_exact(pixels))
    {
        let (top, rest) = copy.split_at_mut(row);
        top.fill(0.0);
        let (rows, bottom) = rest.split_at_mut(g.height * row);
        bottom.fill(0.0);
        for (dst, src) in rows.chunks_exact_mut(row).zip(plane.chunks_exact(w)) {
            dst[0] = 0.0;
            dst[w + 1] = 0.0;
            copy_activated(&mut dst[1..=w], src, slope);
        }
    }
}

/// `grad` (`[out, pixels]`) as `[pixels][padded_out]` in `transposed`, zeros in the columns
/// past `out`. Blocks of 8 × 8 through AVX shuffles where the CPU has AVX (every CPU that runs
/// the direct kernels; a scalar transposition cost a quarter of the kernel's time on 16
/// channels), the edges one by one.
fn transpose(grad: &[f32], out: usize, pixels: usize, padded_out: usize, transposed: &mut [f32]) {
    assert!(
        grad.len() >= out * pixels && out <= padded_out,
        "transposition sizes"
    );
    let transposed = &mut transposed[..pixels * padded_out];
    for row in transposed.chunks_exact_mut(padded_out) {
        row[out..].fill(0.0);
    }
    let (whole_out, whole_pixels) = (out / 8 * 8, pixels / 8 * 8);
    // The whole 8 × 8 blocks by AVX where the CPU has it, else one by one like the edges.
    let avx = cfg!(target_arch = "x86_64") && avx_available();
    let whole = (0..whole_out, 0..whole_pixels);
    if avx {
        #[cfg(target_arch = "x86_64")]
        for o in (0..whole_out).step_by(8) {
            for p in (0..whole_pixels).step_by(8) {
                // SAFETY: AVX, checked above; rows o … o + 7 of `grad` hold pixels p … p + 7,
                // and rows p … p + 7 of `transposed` hold columns o … o + 7 (asserted above).
                unsafe {
                    transpose_8x8(
                        grad[o * pixels + p..].as_ptr(),
                        pixels,
                        transposed[p * padded_out + o..].as_mut_ptr(),
                        padded_out,
                    );
                }
            }
        }
    } else {
        transpose_scalar(grad, whole, pixels, padded_out, transposed);
    }
    transpose_scalar(
        grad,
        (0..out, whole_pixels..pixels),
        pixels,
        padded_out,
        transposed,
    );
    transpose_scalar(
        grad,
        (whole_out..out, 0..whole_pixels),
        pixels,
        padded_out,
        transposed,
    );
}

/// Whether the CPU has AVX (for [`transpose_8x8`]).
fn avx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`transpose`] of the rows and pixels in `ranges`, one element at a time.
fn transpose_scalar(
    grad: &[f32],
    (outs, pixel_range): (std::ops::Range<usize>, std::ops::Range<usize>),
    pixels: usize,
    padded_out: usize,
    transposed: &mut [f32],
) {
    for o in outs {
        for p in pixel_range.clone() {
            transposed[p * padded_out + o] = grad[o * pixels + p];
        }
    }
}

/// `dst[j · dst_stride + i] = src[i · src_stride + j]` for `i, j` in `0..8`.
///
/// # Safety
/// The CPU has AVX; the 8 rows of 8 floats at `src` and at `dst` are readable and writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
        _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    // SAFETY: the caller's contract.
    unsafe {
        let r: [_; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * src_stride)));
        // Pairs of rows interleaved, then pairs of pairs, then the 128-bit halves swapped.
        let t: [_; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for i in 0..4 {
            let low = _mm256_permute2f128_ps::<0x20>(u[i], u[i + 4]);
            let high = _mm256_permute2f128_ps::<0x31>(u[i], u[i + 4]);
            _mm256_storeu_ps(dst.add(i * dst_stride), low);
            _mm256_storeu_ps(dst.add((i + 4) * dst_stride), high);
        }
    }
}

/// The most vectors of output channels and input channels a tile has in any instruction set:
/// the size of the table of micro-kernels in [`kernel`].
const MAX_VECTORS: usize = 2;
const MAX_CHANNELS: usize = 2;

/// Everything one micro-kernel call reads and writes.
struct Tile {
    /// The bordered plane of the tile's first input channel.
    src: *const f32,
    /// Floats per bordered plane.
    plane: usize,
    /// Floats per bordered row, `w + 2`.
    row: usize,
    height: usize,
    width: usize,
    /// The transposed output gradient at pixel 0, the tile's first output channel.
    grad: *const f32,
    /// Floats per pixel of the transposed output gradient.
    grad_stride: usize,
    /// The partial sums at the tile's first tap row, first output channel.
    partial: *mut f32,
    /// Floats per tap row of the partial sums.
    partial_stride: usize,
}

/// A micro-kernel for one tile shape on one instruction set.
///
/// # Safety
/// The CPU must have the set; the tile's pointers must be where
/// [`DirectWeightGrad::add_image`] puts them.
type TileKernel = unsafe fn(&Tile);

/// `S`'s micro-kernel for `nv` vectors of output channels by `nc` input channels.
fn kernel<S: Simd>(nv: usize, nc: usize) -> TileKernel {
    match (nv, nc) {
        (1, 1) => tile::<S, 1, 1>,
        (1, 2) => tile::<S, 1, 2>,
        (2, 1) => tile::<S, 2, 1>,
        (2, 2) => tile::<S, 2, 2>,
        _ => unreachable!("{nv} × {nc} tile: at most {MAX_VECTORS} × {MAX_CHANNELS}"),
    }
}

/// Runs [`TileOp`] on `S`.
///
/// # Safety
/// As [`TileKernel`].
unsafe fn tile<S: Simd, const NV: usize, const NC: usize>(t: &Tile) {
    // SAFETY: the caller's contract, passed on.
    unsafe { S::vectorize(TileOp::<NV, NC>(t)) }
}

/// `partial[c][tap][o] += Σ_p src[c][p + tap] · grad[p][o]` for the tile's `NC` input
/// channels, 9 taps and `NV` vectors of output channels.
struct TileOp<'a, const NV: usize, const NC: usize>(&'a Tile);

impl<const NV: usize, const NC: usize> Kernel for TileOp<'_, NV, NC> {
    type Output = ();

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // `acc[c][tap][v]`: the register tile reads best by index
    unsafe fn run<S: Simd>(self) {
        let t = self.0;
        let lanes = S::LANES;
        // SAFETY: the CPU has `S` (the caller's contract); every pointer stays inside the
        // buffers `add_image` checked: pixel (y, x)'s taps are rows y … y + 2, columns
        // x … x + 2 of each bordered plane, its gradient row `p` of the transposed gradient.
        unsafe {
            let mut acc = [[[S::zero(); NV]; TAPS]; NC];
            for (c, taps) in acc.iter_mut().enumerate() {
                for (tap, row) in taps.iter_mut().enumerate() {
                    for (v, a) in row.iter_mut().enumerate() {
                        let at = (c * TAPS + tap) * t.partial_stride + v * lanes;
                        *a = S::load(t.partial.add(at));
                    }
                }
            }
            let mut grad = t.grad;
            for y in 0..t.height {
                let mut src = t.src.add(y * t.row);
                for _ in 0..t.width {
                    let mut g = [S::zero(); NV];
                    for v in 0..NV {
                        g[v] = S::load(grad.add(v * lanes));
                    }
                    for c in 0..NC {
                        let plane = src.add(c * t.plane);
                        for ki in 0..SIDE {
                            let row = plane.add(ki * t.row);
                            for kj in 0..SIDE {
                                let tap = S::splat(*row.add(kj));
                                for v in 0..NV {
                                    let a = &mut acc[c][ki * SIDE + kj][v];
                                    *a = S::fma(g[v], tap, *a);
                                }
                            }
                        }
                    }
                    src = src.add(1);
                    grad = grad.add(t.grad_stride);
                }
            }
            for (c, taps) in acc.iter().enumerate() {
                for (tap, row) in taps.iter().enumerate() {
                    for (v, &a) in row.iter().enumerate() {
                        let at = (c * TAPS + tap) * t.partial_stride + v * lanes;
                        S::store(t.partial.add(at), a);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transposition_moves_every_element_and_zeroes_the_padding() {
        for (out, pixels, padded_out) in [(16, 784, 16), (13, 21, 16), (5, 8, 8), (33, 49, 48)] {
            let grad: Vec<f32> = (0..out * pixels).map(|v| v as f32).collect();
            let mut transposed = vec![f32::NAN; pixels * padded_out];
            transpose(&grad, out, pixels, padded_out, &mut transposed);
            for p in 0..pixels {
                for o in 0..padded_out {
                    let want = if o < out { grad[o * pixels + p] } else { 0.0 };
                    assert_eq!(
                        transposed[p * padded_out + o],
                        want,
                        "{out}×{pixels} → {padded_out}: pixel {p}, channel {o}"
                    );
                }
            }
        }
    }
}
