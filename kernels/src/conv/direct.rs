//! Direct ("implicit GEMM") stride-1 "same" convolution on AVX-512: the micro-kernel reads the
//! shifted input rows straight from one padded copy of the image, with no im2col matrix, no
//! shifted copies per kernel column and no packing pass.
//!
//! An output tile is `NV` vectors of 16 consecutive pixels (in NCHW order, so a vector may span
//! image rows) by `NC ≤ 8` output channels, `NV · NC` accumulators held in registers for the
//! whole reduction over input channels and kernel taps. Each tap is one masked load per vector
//! at a fixed offset from the pixel: the padded copy has zero rows above and below the plane, so
//! taps that fall above or below the image read zeros, and taps that cross the left or right
//! border (where a flat offset wraps into the neighbouring row) are masked off per lane — the
//! masks depend only on the kernel column and are computed once per call. The weights are packed
//! once per call so that a tap's `NC` weights are consecutive: one broadcast each.
//!
//! Only on x86-64 CPUs with AVX-512F (chosen at run time), where [`crate::isa()`] is
//! [`Isa::Avx512`]; elsewhere, or capped below it, the caller keeps the kernel-rows path. The
//! results equal the kernel-rows path's up to the order of the sums.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m512, _mm512_fmadd_ps, _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_set1_ps,
    _mm512_setzero_ps,
};

use super::ConvGeometry;
use crate::activation::copy_activated;
use crate::isa::Isa;

/// Pixels per vector (AVX-512, `f32`).
const LANES: usize = 16;
/// Output channels per tile: 3 × 8 accumulators + 3 loaded vectors + 1 broadcast fit AVX-512's
/// 32 registers, and 8 divides every Wide-ResNet width.
const BLOCK: usize = 8;

/// A stride-1 "same" convolution prepared for [`Direct::conv_image`]: where each tap reads in
/// a padded copy of the image, which lanes of each pixel vector it may read, and the weight
/// packed so that each tap's weights for a block of output channels are consecutive.
pub(super) struct Direct {
    /// `masks[kj · vectors + v]`: the lanes of pixel vector `v` whose tap in kernel column `kj`
    /// lies inside the image (and whose pixel does).
    masks: Vec<u16>,
    /// The lanes of each pixel vector that are pixels of the image (the last may be partial).
    store_masks: Vec<u16>,
    /// `(first vector, vectors)` of each pixel tile: tiles of 3 vectors, and of 2 where the
    /// count is not a multiple of 3.
    tiles: Vec<(usize, usize)>,
    /// Offset of each tap, in the order the packed weight walks them: `ki · w + kj − pw`.
    offsets: Vec<isize>,
    /// Floats per input channel in the padded copy.
    channel_len: usize,
    /// For each block of [`BLOCK`] output channels (the last may be smaller, `nc` wide):
    /// `[kw][kh][in][nc]`.
    packed: Vec<f32>,
}

impl Direct {
    /// Prepares `weight` (`[out, in, kh, kw]`) for `g`, or `None` where [`crate::isa()`] is
    /// not AVX-512F (the CPU lacks it, or a cap excludes it) or `g` is not a stride-1
    /// convolution whose output is as large as its input.
    pub(super) fn new(weight: &[f32], g: &ConvGeometry) -> Option<Direct> {
        if !g.by_kernel_rows() || crate::isa::isa() != Isa::Avx512 {
            return None;
        }
        let (ci, co, [kh, kw], pw) = (g.in_channels, g.out_channels, g.kernel, g.padding[1]);
        let (w, pixels) = (g.width, g.in_pixels());
        let vectors = pixels.div_ceil(LANES);
        // Bit `lane` set where pixel `v · 16 + lane` is in the image and `inside` holds for it.
        let lanes = |v: usize, inside: &dyn Fn(usize) -> bool| {
            (0..LANES).fold(0u16, |mask, lane| {
                let p = v * LANES + lane;
                mask | (u16::from(p < pixels && inside(p)) << lane)
            })
        };
        let mut masks = Vec::with_capacity(kw * vectors);
        for kj in 0..kw {
            // Column x reads column x + kj − pw, which must not wrap into the next row.
            let inside = |p: usize| (pw..w + pw).contains(&(p % w + kj));
            masks.extend((0..vectors).map(|v| lanes(v, &inside)));
        }
        let store_masks = (0..vectors).map(|v| lanes(v, &|_| true)).collect();
        let offsets = (0..kw)
            .flat_map(|kj| (0..kh).map(move |ki| (ki * w + kj) as isize - pw as isize))
            .collect();
        let mut packed = Vec::with_capacity(weight.len());
        for block in (0..co).step_by(BLOCK) {
            for kj in 0..kw {
                for ki in 0..kh {
                    for c in 0..ci {
                        for o in block..co.min(block + BLOCK) {
                            packed.push(weight[((o * ci + c) * kh + ki) * kw + kj]);
                        }
                    }
                }
            }
        }
        Some(Direct {
            masks,
            store_masks,
            tiles: tiles(vectors),
            offsets,
            // `pw` floats, then zero rows above and below the plane, then `kw − 1 − pw`
            // floats: every unmasked lane of every tap reads inside the channel's copy.
            channel_len: pw + pixels + (kh - 1) * w + (kw - 1 - pw),
            packed,
        })
    }

    /// Adds one image's convolution of `x` (`[in, h, w]`; LeakyReLU(`x`) with a `slope`) onto
    /// `out` (`[out, h, w]`, holding the bias). `padded` is scratch of at least
    /// [`Direct::scratch_len`] floats; its contents are overwritten.
    pub(super) fn conv_image(
        &self,
        x: &[f32],
        g: &ConvGeometry,
        out: &mut [f32],
        slope: Option<f32>,
        padded: &mut [f32],
    ) {
        let (ci, co, pixels) = (g.in_channels, g.out_channels, g.in_pixels());
        assert_eq!(x.len(), ci * pixels, "input size");
        assert_eq!(out.len(), co * pixels, "output size");
        assert!(padded.len() >= self.scratch_len(g), "scratch size");
        let top = g.padding[1] + g.padding[0] * g.width;
        for (copy, plane) in padded
            .chunks_exact_mut(self.channel_len)
            .zip(x.chunks_exact(pixels))
        {
            copy[..top].fill(0.0);
            copy[top + pixels..].fill(0.0);
            copy_activated(&mut copy[top..top + pixels], plane, slope);
        }
        let vectors = self.store_masks.len();
        let taps = g.kernel[0] * g.kernel[1];
        for block in (0..co).step_by(BLOCK) {
            let nc = BLOCK.min(co - block);
            let weights = &self.packed[block * taps * ci..][..nc * taps * ci];
            for &(first, nv) in &self.tiles {
                let tile = Tile {
                    // The copy's index of output pixel p's input pixel, less the padding rows.
                    src: padded[g.padding[1] + first * LANES..].as_ptr(),
                    channel_len: self.channel_len,
                    in_channels: ci,
                    offsets: &self.offsets,
                    kw: g.kernel[1],
                    kh: g.kernel[0],
                    masks: &self.masks[first..],
                    mask_stride: vectors,
                    store_masks: &self.store_masks[first..first + nv],
                    weights,
                    out: out[block * pixels + first * LANES..].as_mut_ptr(),
                    out_stride: pixels,
                };
                // SAFETY: `new` checked AVX-512F (`isa()` selects only sets the CPU has);
                // every unmasked lane lies inside `padded` (see `channel_len`) or inside
                // `out`'s rows of this block.
                unsafe { kernel(nv, nc)(&tile) }
            }
        }
    }

    /// Floats of scratch [`Direct::conv_image`] needs: the padded copy and one tile of slack,
    /// so that pointers to masked-off lanes stay inside the allocation.
    pub(super) fn scratch_len(&self, g: &ConvGeometry) -> usize {
        g.in_channels * self.channel_len + 3 * LANES
    }
}

/// Splits `vectors` pixel vectors into tiles of 3, with tiles of 2 where the count is not a
/// multiple of 3 (a tile of 1 only for a single vector): the 2-vector tiles still amortise each
/// weight broadcast over two loads.
fn tiles(vectors: usize) -> Vec<(usize, usize)> {
    let (threes, twos) = match (vectors, vectors % 3) {
        (1, _) => return vec![(0, 1)],
        (_, 0) => (vectors / 3, 0),
        (_, 1) => (vectors / 3 - 1, 2),
        _ => (vectors / 3, 1),
    };
    let sizes = std::iter::repeat_n(3, threes).chain(std::iter::repeat_n(2, twos));
    sizes
        .scan(0, |first, nv| {
            let tile = (*first, nv);
            *first += nv;
            Some(tile)
        })
        .collect()
}

/// Everything one micro-kernel call reads and writes.
struct Tile<'a> {
    src: *const f32,
    channel_len: usize,
    in_channels: usize,
    offsets: &'a [isize],
    kw: usize,
    kh: usize,
    masks: &'a [u16],
    mask_stride: usize,
    store_masks: &'a [u16],
    weights: &'a [f32],
    out: *mut f32,
    out_stride: usize,
}

type TileKernel = unsafe fn(&Tile);

/// The micro-kernel for `nv` pixel vectors by `nc` output channels.
fn kernel(nv: usize, nc: usize) -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    {
        fn by_channels<const NV: usize>(nc: usize) -> TileKernel {
            match nc {
                1 => tile::<NV, 1>,
                2 => tile::<NV, 2>,
                3 => tile::<NV, 3>,
                4 => tile::<NV, 4>,
                5 => tile::<NV, 5>,
                6 => tile::<NV, 6>,
                7 => tile::<NV, 7>,
                8 => tile::<NV, 8>,
                _ => unreachable!("at most {BLOCK} channels per tile"),
            }
        }
        match nv {
            1 => by_channels::<1>(nc),
            2 => by_channels::<2>(nc),
            3 => by_channels::<3>(nc),
            _ => unreachable!("at most 3 vectors per tile"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (nv, nc);
        unreachable!("Direct::new returns None without AVX-512")
    }
}

/// `out[n][p] += Σ_tap Σ_c weight[tap][c][n] · src[c][p + offset(tap)]` for the tile's `NV · 16`
/// pixels and `NC` channels, each lane's load masked by its kernel column's mask.
///
/// # Safety
/// AVX-512F must be available; `t.src`/`t.out` must point where [`Direct::conv_image`] puts them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // `acc[v][n]`: the register tile reads best by index
unsafe fn tile<const NV: usize, const NC: usize>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); NC]; NV];
    for (v, row) in acc.iter_mut().enumerate() {
        for (n, a) in row.iter_mut().enumerate() {
            let at = t.out.wrapping_add(n * t.out_stride + v * LANES);
            *a = _mm512_maskz_loadu_ps(t.store_masks[v], at);
        }
    }
    let mut weights = t.weights.as_ptr();
    let mut offsets = t.offsets.iter();
    for kj in 0..t.kw {
        let masks: [u16; NV] = std::array::from_fn(|v| t.masks[kj * t.mask_stride + v]);
        for _ in 0..t.kh {
            let offset = *offsets.next().expect("one offset per tap");
            let mut src = t.src.wrapping_offset(offset);
            for _ in 0..t.in_channels {
                let data: [__m512; NV] = std::array::from_fn(|v| {
                    _mm512_maskz_loadu_ps(masks[v], src.wrapping_add(v * LANES))
                });
                for n in 0..NC {
                    let w = _mm512_set1_ps(*weights.add(n));
                    for v in 0..NV {
                        acc[v][n] = _mm512_fmadd_ps(data[v], w, acc[v][n]);
                    }
                }
                weights = weights.add(NC);
                src = src.wrapping_add(t.channel_len);
            }
        }
    }
    for (v, row) in acc.iter().enumerate() {
        for (n, &a) in row.iter().enumerate() {
            let at = t.out.wrapping_add(n * t.out_stride + v * LANES);
            _mm512_mask_storeu_ps(at, t.store_masks[v], a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_vector_once_in_threes_and_twos() {
        for vectors in 1..60 {
            let tiles = tiles(vectors);
            let mut next = 0;
            for &(first, nv) in &tiles {
                assert_eq!(first, next, "{vectors} vectors: {tiles:?}");
                assert!(nv == 3 || nv == 2 || vectors == 1, "{vectors}: {tiles:?}");
                next += nv;
            }
            assert_eq!(next, vectors, "{vectors} vectors: {tiles:?}");
        }
    }
}
