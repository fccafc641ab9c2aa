//! Direct ("implicit GEMM") stride-1 "same" convolution on AVX-512F or AVX2 + FMA: the
//! micro-kernel reads the shifted input rows straight from one padded copy of the image, with
//! no im2col matrix, no shifted copies per kernel column and no packing pass.
//!
//! An output tile is a few vectors of consecutive pixels (in NCHW order, so a vector may span
//! image rows) by a few output channels — AVX-512: up to 3 vectors of 16 lanes by 8 channels,
//! AVX2: up to 2 vectors of 8 lanes by 6 channels (see the `Simd` implementations for why) —
//! the accumulators held in registers for the whole reduction over input channels and kernel
//! taps. Each tap is one masked load per vector at a fixed offset from the pixel: the padded
//! copy has zero rows above and below the plane, so taps that fall above or below the image
//! read zeros, and taps that cross the left or right border (where a flat offset wraps into the
//! neighbouring row) are masked off per lane. The masks depend only on the kernel column: their
//! bits are computed once per call, and turned into the set's mask form once per kernel column
//! of each tile, not per channel. The weights are packed once per call so that a tap's weights
//! for a tile's channels are consecutive: one broadcast each.
//!
//! One generic micro-kernel serves both instruction sets, through [`Simd`]; its tile sizes and
//! lane count come from the set. Which set runs is [`crate::isa()`] (the CPU's best, or a cap);
//! with neither set (other CPUs, or capped at `portable`) the caller keeps the kernel-rows
//! path. The results equal the kernel-rows path's up to the order of the sums.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Kernel, Simd};
use super::ConvGeometry;
use crate::activation::copy_activated;
use crate::isa::Isa;

/// The most pixel vectors and output channels a tile has in any instruction set: the size of
/// the table of micro-kernels in [`kernel`].
const MAX_TILE_VECTORS: usize = 3;
const MAX_TILE_CHANNELS: usize = 8;

/// A stride-1 "same" convolution prepared for [`Direct::conv_image`] on one instruction set:
/// where each tap reads in a padded copy of the image, which lanes of each pixel vector it may
/// read, and the weight packed so that each tap's weights for a block of output channels are
/// consecutive.
pub(super) struct Direct {
    /// The instruction set the masks, tiles and packing below were made for.
    isa: Isa,
    /// Its lanes per vector.
    lanes: usize,
    /// `(first channel, channels)` of each block of output channels (see [`tiles`]).
    blocks: Vec<(usize, usize)>,
    /// `masks[kj · vectors + v]`: the lanes of pixel vector `v` whose tap in kernel column `kj`
    /// lies inside the image (and whose pixel does), bit `i` for lane `i`.
    masks: Vec<u16>,
    /// The lanes of each pixel vector that are pixels of the image (the last may be partial).
    store_masks: Vec<u16>,
    /// `(first vector, vectors)` of each pixel tile (see [`tiles`]).
    tiles: Vec<(usize, usize)>,
    /// Offset of each tap, in the order the packed weight walks them: `ki · w + kj − pw`.
    offsets: Vec<isize>,
    /// Floats per input channel in the padded copy.
    channel_len: usize,
    /// For each block of `nc` output channels: `[kw][kh][in][nc]`.
    packed: Vec<f32>,
}

impl Direct {
    /// Prepares `weight` (`[out, in, kh, kw]`) for `g` on the instruction set [`crate::isa()`]
    /// selects, or `None` where that is [`Isa::Portable`], `g` is not a stride-1 convolution
    /// whose output is as large as its input, or its maps are smaller than that set's kernel
    /// runs well on ([`Simd::DIRECT_MIN_PIXELS`]).
    pub(super) fn new(weight: &[f32], g: &ConvGeometry) -> Option<Direct> {
        let isa = crate::isa::isa();
        let min_pixels = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512::DIRECT_MIN_PIXELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::DIRECT_MIN_PIXELS,
            _ => return None,
        };
        (g.in_pixels() >= min_pixels)
            .then(|| Direct::for_isa(weight, g, isa))
            .flatten()
    }

    /// [`Direct::new`] on `isa`: `None` also where the CPU lacks it.
    pub(super) fn for_isa(weight: &[f32], g: &ConvGeometry, isa: Isa) -> Option<Direct> {
        if !g.by_kernel_rows() || !isa.is_available() {
            return None;
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(Direct::prepare::<Avx512>(weight, g)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(Direct::prepare::<Avx2>(weight, g)),
            _ => None,
        }
    }

    /// The instruction set this convolution was prepared for.
    #[cfg(test)]
    pub(super) fn isa(&self) -> Isa {
        self.isa
    }

    /// [`Direct::for_isa`] on `S`, whose lane count and tile sizes shape everything here.
    fn prepare<S: Simd>(weight: &[f32], g: &ConvGeometry) -> Direct {
        const { assert!(S::LANES <= 16, "lane masks are 16 bits") };
        const { assert!(S::TILE_VECTORS <= MAX_TILE_VECTORS) };
        const { assert!(S::TILE_CHANNELS <= MAX_TILE_CHANNELS) };
        let lanes = S::LANES;
        let (ci, co, [kh, kw], pw) = (g.in_channels, g.out_channels, g.kernel, g.padding[1]);
        let (w, pixels) = (g.width, g.in_pixels());
        let vectors = pixels.div_ceil(lanes);
        // Bit `lane` set where pixel `v · lanes + lane` is in the image and `inside` holds.
        let lane_bits = |v: usize, inside: &dyn Fn(usize) -> bool| {
            (0..lanes).fold(0u16, |mask, lane| {
                let p = v * lanes + lane;
                mask | (u16::from(p < pixels && inside(p)) << lane)
            })
        };
        let mut masks = Vec::with_capacity(kw * vectors);
        for kj in 0..kw {
            // Column x reads column x + kj − pw, which must not wrap into the next row.
            let inside = |p: usize| (pw..w + pw).contains(&(p % w + kj));
            masks.extend((0..vectors).map(|v| lane_bits(v, &inside)));
        }
        let store_masks = (0..vectors).map(|v| lane_bits(v, &|_| true)).collect();
        let offsets = (0..kw)
            .flat_map(|kj| (0..kh).map(move |ki| (ki * w + kj) as isize - pw as isize))
            .collect();
        let blocks = tiles(co, S::TILE_CHANNELS);
        let mut packed = Vec::with_capacity(weight.len());
        for &(first, nc) in &blocks {
            for kj in 0..kw {
                for ki in 0..kh {
                    for c in 0..ci {
                        for o in first..first + nc {
                            packed.push(weight[((o * ci + c) * kh + ki) * kw + kj]);
                        }
                    }
                }
            }
        }
        Direct {
            isa: S::ISA,
            lanes,
            blocks,
            masks,
            store_masks,
            tiles: tiles(vectors, S::TILE_VECTORS),
            offsets,
            // `pw` floats, then zero rows above and below the plane, then `kw − 1 − pw`
            // floats: every unmasked lane of every tap reads inside the channel's copy.
            channel_len: pw + pixels + (kh - 1) * w + (kw - 1 - pw),
            packed,
        }
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
        let kernel: fn(usize, usize) -> TileKernel = match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => kernel::<Avx512>,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => kernel::<Avx2>,
            // A function, not a panic here: on other CPUs every arm above is compiled out,
            // and a diverging `let` would make the rest unreachable code.
            _ => |_, _| unreachable!("Direct::for_isa prepares only AVX-512 or AVX2"),
        };
        let (lanes, vectors) = (self.lanes, self.store_masks.len());
        let taps = g.kernel[0] * g.kernel[1];
        for &(first_channel, nc) in &self.blocks {
            let weights = &self.packed[first_channel * taps * ci..][..nc * taps * ci];
            for &(first, nv) in &self.tiles {
                let tile = Tile {
                    // The copy's index of output pixel p's input pixel, less the padding rows.
                    src: padded[g.padding[1] + first * lanes..].as_ptr(),
                    channel_len: self.channel_len,
                    in_channels: ci,
                    offsets: &self.offsets,
                    kw: g.kernel[1],
                    kh: g.kernel[0],
                    masks: &self.masks[first..],
                    mask_stride: vectors,
                    store_masks: &self.store_masks[first..first + nv],
                    weights,
                    out: out[first_channel * pixels + first * lanes..].as_mut_ptr(),
                    out_stride: pixels,
                };
                // SAFETY: `for_isa` checked that the CPU has `self.isa`, the set `kernel` runs
                // on; every unmasked lane lies inside `padded` (see `channel_len`) or inside
                // `out`'s rows of this block of channels.
                unsafe { kernel(nv, nc)(&tile) }
            }
        }
    }

    /// Floats of scratch [`Direct::conv_image`] needs: the padded copy and one tile of slack,
    /// so that pointers to masked-off lanes stay inside the allocation.
    pub(super) fn scratch_len(&self, g: &ConvGeometry) -> usize {
        g.in_channels * self.channel_len + MAX_TILE_VECTORS * self.lanes
    }
}

/// Splits `n` pixel vectors (or output channels) into `ceil(n / most)` tiles (blocks) of as
/// equal sizes as can be, the larger first, as `(first, size)`: with at most 3, tiles of 3 and
/// 2 where the count is not a multiple of 3 (a tile of 1 only for a single vector), since a
/// 2-vector tile still amortises each weight broadcast over two loads; 16 channels in blocks of
/// at most 6 as 6 + 5 + 5, each block still wide enough to hide the multiply-add's latency.
pub(super) fn tiles(n: usize, most: usize) -> Vec<(usize, usize)> {
    let count = n.div_ceil(most);
    let (size, larger) = (n / count.max(1), n % count.max(1));
    (0..count)
        .scan(0, |first, i| {
            let tile = (*first, size + usize::from(i < larger));
            *first += tile.1;
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

/// A micro-kernel for one tile shape on one instruction set.
///
/// # Safety
/// The CPU must have the set; the tile's pointers must be where [`Direct::conv_image`] puts
/// them.
type TileKernel = unsafe fn(&Tile);

/// `S`'s micro-kernel for `nv` pixel vectors by `nc` output channels.
fn kernel<S: Simd>(nv: usize, nc: usize) -> TileKernel {
    fn by_channels<S: Simd, const NV: usize>(nc: usize) -> TileKernel {
        match nc {
            1 => tile::<S, NV, 1>,
            2 => tile::<S, NV, 2>,
            3 => tile::<S, NV, 3>,
            4 => tile::<S, NV, 4>,
            // Instantiated for every set (the match is on a run-time count) but only reached
            // where the set's tiles are that wide.
            5 => tile::<S, NV, 5>,
            6 => tile::<S, NV, 6>,
            7 => tile::<S, NV, 7>,
            8 => tile::<S, NV, 8>,
            _ => unreachable!("at most {MAX_TILE_CHANNELS} channels per tile"),
        }
    }
    assert!(
        nv <= S::TILE_VECTORS && nc <= S::TILE_CHANNELS,
        "{nv} × {nc} tile"
    );
    match nv {
        1 => by_channels::<S, 1>(nc),
        2 => by_channels::<S, 2>(nc),
        3 => by_channels::<S, 3>(nc),
        _ => unreachable!("at most {MAX_TILE_VECTORS} vectors per tile"),
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

/// `out[n][p] += Σ_tap Σ_c weight[tap][c][n] · src[c][p + offset(tap)]` for the tile's `NV`
/// vectors of pixels and `NC` channels, each lane's load masked by its kernel column's mask.
struct TileOp<'a, const NV: usize, const NC: usize>(&'a Tile<'a>);

impl<const NV: usize, const NC: usize> Kernel for TileOp<'_, NV, NC> {
    type Output = ();

    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // `acc[v][n]`: the register tile reads best by index
    unsafe fn run<S: Simd>(self) {
        let t = self.0;
        let lanes = S::LANES;
        // SAFETY: the CPU has `S` (the caller's contract). Every load and store is masked to
        // lanes inside `padded` or `out` (see `Direct::conv_image`); pointers to the other
        // lanes are formed with wrapping arithmetic and never dereferenced. `weights` holds
        // `NC` weights for each (tap, channel) step taken.
        unsafe {
            let mut acc = [[S::zero(); NC]; NV];
            for (v, row) in acc.iter_mut().enumerate() {
                let mask = S::mask_from_bits(t.store_masks[v]);
                for (n, a) in row.iter_mut().enumerate() {
                    *a = S::masked_load(mask, t.out.wrapping_add(n * t.out_stride + v * lanes));
                }
            }
            let mut weights = t.weights.as_ptr();
            let mut offsets = t.offsets.iter();
            for kj in 0..t.kw {
                // Once per kernel column: the same lanes are masked for every row and channel.
                // (Loops, not `array::from_fn`: its closures are not inlined here, and one
                // compiled without the set's features cannot keep a mask in a register.)
                let mut masks = [S::mask_from_bits(0); NV];
                let mut inside = true;
                for (v, mask) in masks.iter_mut().enumerate() {
                    let bits = t.masks[kj * t.mask_stride + v];
                    *mask = S::mask_from_bits(bits);
                    inside &= u32::from(bits) == (1u32 << lanes) - 1;
                }
                for _ in 0..t.kh {
                    let offset = *offsets.next().expect("one offset per tap");
                    let mut src = t.src.wrapping_offset(offset);
                    // Where every lane of the tile is inside the image, plain loads: a masked
                    // load costs more than a plain one on AVX2 (`vmaskmovps`). The sums are the
                    // same either way.
                    if inside {
                        for _ in 0..t.in_channels {
                            let mut data = [S::zero(); NV];
                            for v in 0..NV {
                                data[v] = S::load(src.wrapping_add(v * lanes));
                            }
                            accumulate::<S, NV, NC>(&mut acc, &data, weights);
                            weights = weights.add(NC);
                            src = src.wrapping_add(t.channel_len);
                        }
                    } else {
                        for _ in 0..t.in_channels {
                            let mut data = [S::zero(); NV];
                            for v in 0..NV {
                                let mask = S::reload(&masks[v]);
                                data[v] = S::masked_load(mask, src.wrapping_add(v * lanes));
                            }
                            accumulate::<S, NV, NC>(&mut acc, &data, weights);
                            weights = weights.add(NC);
                            src = src.wrapping_add(t.channel_len);
                        }
                    }
                }
            }
            for (v, row) in acc.iter().enumerate() {
                let mask = S::mask_from_bits(t.store_masks[v]);
                for (n, &a) in row.iter().enumerate() {
                    S::masked_store(t.out.wrapping_add(n * t.out_stride + v * lanes), mask, a);
                }
            }
        }
    }
}

/// `acc[v][n] += data[v] · weights[n]` for the tile's `NV` vectors and `NC` channels.
///
/// # Safety
/// The CPU has `S`; `weights` points at `NC` readable floats.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `acc[v][n]`: the register tile reads best by index
unsafe fn accumulate<S: Simd, const NV: usize, const NC: usize>(
    acc: &mut [[S::Vector; NC]; NV],
    data: &[S::Vector; NV],
    weights: *const f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        for n in 0..NC {
            let w = S::splat(*weights.add(n));
            for v in 0..NV {
                acc[v][n] = S::fma(data[v], w, acc[v][n]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_every_vector_once_in_threes_and_twos() {
        for vectors in 1..60 {
            let tiles = tiles(vectors, 3);
            let mut next = 0;
            for &(first, nv) in &tiles {
                assert_eq!(first, next, "{vectors} vectors: {tiles:?}");
                assert!(nv == 3 || nv == 2 || vectors == 1, "{vectors}: {tiles:?}");
                next += nv;
            }
            assert_eq!(next, vectors, "{vectors} vectors: {tiles:?}");
            assert_eq!(
                tiles.len(),
                vectors.div_ceil(3),
                "{vectors} vectors: {tiles:?}"
            );
        }
    }

    #[test]
    fn tiles_of_any_most_are_as_equal_as_can_be() {
        for most in 1..5 {
            for vectors in 1..40 {
                let tiles = tiles(vectors, most);
                let sizes: Vec<usize> = tiles.iter().map(|t| t.1).collect();
                assert_eq!(sizes.iter().sum::<usize>(), vectors, "{most}: {tiles:?}");
                assert!(sizes.windows(2).all(|s| s[0] >= s[1]), "{most}: {tiles:?}");
                assert!(sizes[0] <= most && sizes[0] - sizes[sizes.len() - 1] <= 1);
                assert_eq!(tiles.len(), vectors.div_ceil(most), "{most}: {tiles:?}");
            }
        }
    }
}
