//! The vector operations the direct kernel needs, as one trait over the instruction sets it
//! runs on (AVX-512F, AVX2 + FMA), so that one generic micro-kernel serves both.
//!
//! The intrinsics only inline into a function compiled for their instruction set, so a
//! kernel is written as a [`Kernel`] whose `run` is `#[inline(always)]`, and
//! [`Simd::vectorize`] calls it from a `#[target_feature]` function of the set: there the
//! kernel's body, and every `#[inline(always)]` operation below, is compiled with the set's
//! instructions and registers.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m256, __m256i, __m512, __mmask16, _mm256_and_si256, _mm256_cmpeq_epi32, _mm256_fmadd_ps,
    _mm256_loadu_ps, _mm256_maskload_ps, _mm256_maskstore_ps, _mm256_set1_epi32, _mm256_set1_ps,
    _mm256_setr_epi32, _mm256_setzero_ps, _mm256_storeu_ps, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_mask_storeu_ps, _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
    _mm512_storeu_ps,
};

use crate::isa::Isa;

/// A computation generic over the instruction set, for [`Simd::vectorize`].
pub(super) trait Kernel {
    /// What the computation returns.
    type Output;

    /// Runs the computation with `S`'s operations. Implementations must be
    /// `#[inline(always)]`, so that they inline into `S`'s `#[target_feature]` function.
    ///
    /// # Safety
    /// The CPU must have `S`'s instruction set, and the computation's own contract must hold.
    unsafe fn run<S: Simd>(self) -> Self::Output;
}

/// One instruction set's `f32` vectors: `LANES` lanes, loads and stores masked per lane
/// (masked-off lanes are neither read nor written, and never fault), and the direct kernel's
/// tile, sized to the set's registers.
///
/// Every operation is `unsafe`: it needs the CPU to have the set ([`Isa::is_available`]),
/// and is meant to be called only inside [`Simd::vectorize`].
pub(super) trait Simd {
    /// The instruction set, as the rest of the crate names it.
    const ISA: Isa;
    /// `f32` lanes per vector (at most 16, the bits of a lane mask).
    const LANES: usize;
    /// Pixel vectors per tile of the direct kernel (at most 3).
    const TILE_VECTORS: usize;
    /// Output channels per tile of the direct kernel (at most 8).
    const TILE_CHANNELS: usize;
    /// The smallest maps (pixels per channel) the direct forward kernel takes; smaller ones go
    /// by im2col products, whose columns span several images.
    const DIRECT_MIN_PIXELS: usize;
    /// Vectors of output channels per tile of the direct weight gradient (at most 2).
    const WEIGHT_GRAD_VECTORS: usize;
    /// Accumulators of a tile of the direct weight gradient: 9 taps of an input channel per
    /// vector of output channels, as many channels as fit (at most 2).
    const WEIGHT_GRAD_ACCUMULATORS: usize;
    /// A vector of `LANES` floats.
    type Vector: Copy;
    /// Which lanes a load or store touches, in the form the set's instructions take.
    type Mask: Copy;

    /// Runs `kernel` inside a function compiled for this instruction set.
    ///
    /// # Safety
    /// As [`Kernel::run`]: the CPU must have this set.
    unsafe fn vectorize<K: Kernel>(kernel: K) -> K::Output;

    /// All lanes zero.
    unsafe fn zero() -> Self::Vector;
    /// `value` in every lane.
    unsafe fn splat(value: f32) -> Self::Vector;
    /// The mask of the lanes whose bit is set in `bits` (bit `i`: lane `i`).
    unsafe fn mask_from_bits(bits: u16) -> Self::Mask;
    /// `mask`, for a load inside the innermost loop: where the set's registers cannot keep
    /// a tile's masks beside its accumulators (AVX2), read again from memory at each use, so
    /// that register allocation never spills an accumulator (a store and a load per step)
    /// to keep a mask (a load).
    unsafe fn reload(mask: &Self::Mask) -> Self::Mask;
    /// `at[i]` in each lane `i` of `mask`, zero elsewhere.
    ///
    /// # Safety
    /// Also: `at[i]` must be readable for every lane `i` of `mask`.
    unsafe fn masked_load(mask: Self::Mask, at: *const f32) -> Self::Vector;
    /// `at[i]` in every lane `i`: a plain load, for vectors whose lanes are all inside.
    ///
    /// # Safety
    /// Also: `at[i]` must be readable for every lane.
    unsafe fn load(at: *const f32) -> Self::Vector;
    /// `a · b + c`, rounded once.
    unsafe fn fma(a: Self::Vector, b: Self::Vector, c: Self::Vector) -> Self::Vector;
    /// Writes every lane `i` of `value` to `at[i]`.
    ///
    /// # Safety
    /// Also: `at[i]` must be writable for every lane.
    unsafe fn store(at: *mut f32, value: Self::Vector);
    /// Writes lane `i` of `value` to `at[i]` for each lane `i` of `mask`.
    ///
    /// # Safety
    /// Also: `at[i]` must be writable for every lane `i` of `mask`.
    unsafe fn masked_store(at: *mut f32, mask: Self::Mask, value: Self::Vector);
}

/// AVX-512F: 16 lanes, 32 vector registers, lane masks in mask registers.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

/// AVX2 + FMA: 8 lanes, 16 vector registers, lane masks as vectors (`vmaskmovps`).
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn vectorize_avx512<K: Kernel>(kernel: K) -> K::Output {
    // SAFETY: the caller guarantees AVX-512F (`Simd::vectorize`'s contract).
    unsafe { kernel.run::<Avx512>() }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn vectorize_avx2<K: Kernel>(kernel: K) -> K::Output {
    // SAFETY: the caller guarantees AVX2 and FMA (`Simd::vectorize`'s contract).
    unsafe { kernel.run::<Avx2>() }
}

// In both implementations, each operation's SAFETY rests on the trait's contract: the CPU has
// the set (so the intrinsic's instructions exist), and for loads and stores, the caller's
// promise about the lanes of the mask.

#[cfg(target_arch = "x86_64")]
impl Simd for Avx512 {
    const ISA: Isa = Isa::Avx512;
    const LANES: usize = 16;
    /// 3 × 8 accumulators, 3 loaded vectors and 1 broadcast: 28 of the 32 registers (the masks
    /// live in mask registers), and 8 divides every Wide-ResNet width.
    const TILE_VECTORS: usize = 3;
    const TILE_CHANNELS: usize = 8;
    /// Every size: on 7×7 maps (49 pixels in 4 vectors, a quarter of the lanes idle) still
    /// 1.1–1.3× faster than im2col products (WRN-16-2's 64- and 128-channel layers, batch 64).
    const DIRECT_MIN_PIXELS: usize = 1;
    /// 2 vectors × 9 taps or 1 × 18 (two input channels): 18 accumulators, 2 loaded vectors,
    /// 1 broadcast.
    const WEIGHT_GRAD_VECTORS: usize = 2;
    const WEIGHT_GRAD_ACCUMULATORS: usize = 18;
    type Vector = __m512;
    type Mask = __mmask16;

    #[inline(always)]
    unsafe fn vectorize<K: Kernel>(kernel: K) -> K::Output {
        // SAFETY: the caller guarantees AVX-512F.
        unsafe { vectorize_avx512(kernel) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F, by the trait's contract.
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(value: f32) -> __m512 {
        // SAFETY: AVX-512F, by the trait's contract.
        unsafe { _mm512_set1_ps(value) }
    }

    #[inline(always)]
    unsafe fn mask_from_bits(bits: u16) -> __mmask16 {
        bits
    }

    #[inline(always)]
    unsafe fn reload(mask: &__mmask16) -> __mmask16 {
        // Mask registers: 8 of them, apart from the 32 vector registers.
        *mask
    }

    #[inline(always)]
    unsafe fn masked_load(mask: __mmask16, at: *const f32) -> __m512 {
        // SAFETY: AVX-512F; the caller guarantees the lanes of `mask` readable.
        unsafe { _mm512_maskz_loadu_ps(mask, at) }
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m512 {
        // SAFETY: AVX-512F; the caller guarantees every lane readable.
        unsafe { _mm512_loadu_ps(at) }
    }

    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F, by the trait's contract.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn store(at: *mut f32, value: __m512) {
        // SAFETY: AVX-512F; the caller guarantees every lane writable.
        unsafe { _mm512_storeu_ps(at, value) }
    }

    #[inline(always)]
    unsafe fn masked_store(at: *mut f32, mask: __mmask16, value: __m512) {
        // SAFETY: AVX-512F; the caller guarantees the lanes of `mask` writable.
        unsafe { _mm512_mask_storeu_ps(at, mask, value) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Simd for Avx2 {
    const ISA: Isa = Isa::Avx2;
    const LANES: usize = 8;
    /// 2 × 6: 12 accumulators (enough to cover the multiply-add's latency on two ports),
    /// 2 loaded vectors and 1 broadcast, 15 of the 16 registers, with the lane masks read
    /// again into the load registers at each step ([`Simd::reload`]). 3 × 4 (12 accumulators,
    /// 3 loads, 1 broadcast) would need all 16: as compiled, it spilled an accumulator to the
    /// stack at every step, where 2 × 6 keeps every accumulator in a register (checked in the
    /// disassembly). Channel blocks are split evenly (a width of 16 as 6 + 5 + 5, not
    /// 6 + 6 + 4), so on Wide-ResNet widths (16·k) no block is narrower than 5 channels.
    const TILE_VECTORS: usize = 2;
    const TILE_CHANNELS: usize = 6;
    /// 14×14 and up: on 7×7 maps (7 vectors, tiles of 2, 2, 2 and 1) no faster than im2col
    /// products at 128 channels (10.1 against 9.2 ms for WRN-16-2's 128-channel layer).
    const DIRECT_MIN_PIXELS: usize = 128;
    /// 1 vector × 9 taps: 9 accumulators (enough to cover the multiply-add's latency on two
    /// ports), 1 loaded vector, 1 broadcast; 18 accumulators would not fit 16 registers.
    const WEIGHT_GRAD_VECTORS: usize = 1;
    const WEIGHT_GRAD_ACCUMULATORS: usize = 9;
    type Vector = __m256;
    type Mask = __m256i;

    #[inline(always)]
    unsafe fn vectorize<K: Kernel>(kernel: K) -> K::Output {
        // SAFETY: the caller guarantees AVX2 and FMA.
        unsafe { vectorize_avx2(kernel) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: AVX, by the trait's contract.
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(value: f32) -> __m256 {
        // SAFETY: AVX, by the trait's contract.
        unsafe { _mm256_set1_ps(value) }
    }

    #[inline(always)]
    unsafe fn mask_from_bits(bits: u16) -> __m256i {
        // Lane i keeps bit i of `bits` and compares it with bit i: all ones (the sign bit
        // `vmaskmovps` reads) where it is set, zero elsewhere.
        // SAFETY: AVX2, by the trait's contract.
        unsafe {
            let bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
            let kept = _mm256_and_si256(_mm256_set1_epi32(i32::from(bits)), bit);
            _mm256_cmpeq_epi32(kept, bit)
        }
    }

    #[inline(always)]
    unsafe fn reload(mask: &__m256i) -> __m256i {
        // Volatile: otherwise LLVM hoists the load out of the loop and keeps the mask in a
        // register, spilling accumulators instead.
        // SAFETY: a read of a reference.
        unsafe { std::ptr::read_volatile(mask) }
    }

    #[inline(always)]
    unsafe fn masked_load(mask: __m256i, at: *const f32) -> __m256 {
        // SAFETY: AVX; the caller guarantees the lanes of `mask` readable, and `vmaskmovps`
        // neither reads nor faults on the others.
        unsafe { _mm256_maskload_ps(at, mask) }
    }

    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m256 {
        // SAFETY: AVX; the caller guarantees every lane readable.
        unsafe { _mm256_loadu_ps(at) }
    }

    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: FMA, by the trait's contract.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn store(at: *mut f32, value: __m256) {
        // SAFETY: AVX; the caller guarantees every lane writable.
        unsafe { _mm256_storeu_ps(at, value) }
    }

    #[inline(always)]
    unsafe fn masked_store(at: *mut f32, mask: __m256i, value: __m256) {
        // SAFETY: AVX; the caller guarantees the lanes of `mask` writable, and `vmaskmovps`
        // neither writes nor faults on the others.
        unsafe { _mm256_maskstore_ps(at, mask, value) }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Loads through every mask of `S`'s lanes, then stores back through it.
    struct RoundTrip(u16);

    impl Kernel for RoundTrip {
        type Output = ();

        #[inline(always)]
        unsafe fn run<S: Simd>(self) {
            let lanes = S::LANES;
            let src: Vec<f32> = (1..=lanes).map(|v| v as f32).collect();
            let mut dst = vec![-1.0f32; lanes];
            // SAFETY: `S` is available (the caller's check); both slices hold `LANES` floats.
            unsafe {
                let mask = S::mask_from_bits(self.0);
                let loaded = S::masked_load(mask, src.as_ptr());
                let two = S::splat(2.0);
                let v = S::fma(loaded, two, S::zero());
                S::masked_store(dst.as_mut_ptr(), S::mask_from_bits(u16::MAX), v);
                for (lane, &d) in dst.iter().enumerate() {
                    let want = if self.0 >> lane & 1 == 1 {
                        2.0 * src[lane]
                    } else {
                        0.0
                    };
                    assert_eq!(d, want, "{} mask {:#b} lane {lane}", S::ISA, self.0);
                }
                dst.fill(-1.0);
                S::masked_store(dst.as_mut_ptr(), mask, loaded);
                for (lane, &d) in dst.iter().enumerate() {
                    let want = if self.0 >> lane & 1 == 1 {
                        src[lane]
                    } else {
                        -1.0
                    };
                    assert_eq!(d, want, "{} mask {:#b} lane {lane}", S::ISA, self.0);
                }
            }
        }
    }

    /// Every mask of `S`'s lanes.
    fn round_trips<S: Simd>() {
        for bits in 0..(1u32 << S::LANES) {
            // SAFETY: the callers check that the CPU has `S`.
            unsafe { S::vectorize(RoundTrip(bits as u16)) }
        }
    }

    #[test]
    fn masks_select_exactly_their_lanes() {
        for isa in [Isa::Avx512, Isa::Avx2] {
            if !isa.is_available() {
                crate::conv::tests::not_run("masks_select_exactly_their_lanes", isa);
                continue;
            }
            match isa {
                Isa::Avx512 => round_trips::<Avx512>(),
                Isa::Avx2 => round_trips::<Avx2>(),
                Isa::Portable => unreachable!(),
            }
        }
    }
}
