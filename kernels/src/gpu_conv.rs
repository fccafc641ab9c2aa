//! How the GPU backends compute a forward convolution: burn's direct kernel or the unfolded
//! input times the weight, chosen per layer by default. Kept apart from the GPU backends
//! themselves so that every build (and its tests) has the choice, with or without a GPU
//! backend compiled in.

use crate::process_choice::ProcessChoice;

/// How the GPU backends compute a forward convolution (both kernels in true f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuConv {
    /// Per convolution, by the length of its sums (the default): burn's direct kernel where
    /// each output sums fewer than [`IM2COL_MIN_TERMS`] products, the unfolded product where
    /// it sums more.
    Auto,
    /// burn's direct convolution kernel: a loop per output element.
    Direct,
    /// The input unfolded (im2col) and one unit-tiled matrix product with the weight
    /// ([`crate::conv2d_from_matmul`]): more memory, and a kernel built for throughput.
    Im2col,
    /// This crate's own kernels: the unfolded product computed in shared-memory tiles without
    /// writing the unfolded input (src/tiled_conv.rs), and the weight gradient the same way
    /// (src/tiled_weight_grad.rs). Agrees with the CPU on a software Vulkan device; on an
    /// NVIDIA GPU not yet (see [`GpuConv::check_for_cuda`]), hence not chosen by `Auto`.
    Tiled,
}

/// Under [`GpuConv::Auto`], the length of an output's sum (input channels × kernel area) from
/// which the unfolded product computes the convolution. Measured on an H200 (results/perf/
/// gpu.csv): where every layer sums 9 to 576 terms (WRN-10-1) the direct kernel made the
/// whole network 1.05–3.1× faster, row by row; where the 3×3 layers but the first two sum
/// 1 440 to 5 760 (WRN-28-10) the unfolded product did, 2.8–5.1×. The threshold lies between
/// the two; single layers have not been timed apart, and no network mixing both was timed.
pub const IM2COL_MIN_TERMS: usize = 1024;

/// The environment variable that chooses [`GpuConv`]: `auto` (default), `direct`, `im2col` or
/// `tiled`.
pub const GPU_CONV_VARIABLE: &str = "JEM_BENCH_GPU_CONV";

/// The environment variable that lets a CUDA build run a choice that failed its agreement
/// tests on an NVIDIA GPU (`1`), to debug it; see [`GpuConv::check_for_cuda`].
pub const UNVERIFIED_VARIABLE: &str = "JEM_BENCH_GPU_CONV_UNVERIFIED";

static GPU_CONV: ProcessChoice<GpuConv> = ProcessChoice::new(&GpuConv::ALL);

/// Chooses how the GPU backends compute forward convolutions, for the whole process.
pub fn set_gpu_conv(conv: GpuConv) {
    GPU_CONV.set(conv);
}

/// How the GPU backends compute forward convolutions (see [`set_gpu_conv`]; `Auto` until set).
pub fn gpu_conv() -> GpuConv {
    GPU_CONV.get().unwrap_or(GpuConv::Auto)
}

impl GpuConv {
    /// Every choice, the default first.
    pub const ALL: [GpuConv; 4] = [
        GpuConv::Auto,
        GpuConv::Direct,
        GpuConv::Im2col,
        GpuConv::Tiled,
    ];

    /// The name [`GPU_CONV_VARIABLE`] takes and outputs record.
    pub fn name(self) -> &'static str {
        match self {
            GpuConv::Auto => "auto",
            GpuConv::Direct => "direct",
            GpuConv::Im2col => "im2col",
            GpuConv::Tiled => "tiled",
        }
    }

    /// The kernel that computes a convolution with `weight_shape` `[out, in, kh, kw]`: `Auto`
    /// resolved to [`GpuConv::Direct`] or [`GpuConv::Im2col`], any other choice itself.
    pub fn for_weight(self, weight_shape: [usize; 4]) -> GpuConv {
        match self {
            GpuConv::Auto => {
                let [_, channels, kh, kw] = weight_shape;
                if channels * kh * kw >= IM2COL_MIN_TERMS {
                    GpuConv::Im2col
                } else {
                    GpuConv::Direct
                }
            }
            chosen => chosen,
        }
    }

    /// Whether this choice agreed with the CPU on an NVIDIA GPU (tests/gpu.rs on an H200).
    /// `Tiled` did not: its kernels wrote their outputs densely into memory that CUDA had
    /// allocated with padded rows, so every layer whose rows were padded (output width 28, 14;
    /// weight-gradient rows of 9, 144, 576 … terms) came out wrong, while a software Vulkan
    /// device, which does not pad, agreed. The outputs are now allocated dense; until a GPU
    /// run confirms it, a CUDA build refuses `Tiled`.
    pub fn agrees_on_cuda(self) -> bool {
        !matches!(self, GpuConv::Tiled)
    }

    /// `Ok` where this choice may compute on CUDA: it agreed there, or `unverified_allowed`
    /// ([`UNVERIFIED_VARIABLE`] set to `1`, for debugging the kernels). Otherwise an error that
    /// says why and what to use instead.
    pub fn check_for_cuda(self, unverified_allowed: bool) -> Result<(), String> {
        if self.agrees_on_cuda() || unverified_allowed {
            return Ok(());
        }
        Err(format!(
            "{GPU_CONV_VARIABLE}={}: these kernels have not yet agreed with the CPU on an NVIDIA \
             GPU (on an H200 they computed wrong convolutions; the cause is fixed but not yet \
             checked there, docs/gpu.md); use auto (the default), direct or im2col, or set \
             {UNVERIFIED_VARIABLE}=1 to run them anyway to check them",
            self.name()
        ))
    }

    /// Reads [`GPU_CONV_VARIABLE`]: `None` when unset, an error naming the variable and the
    /// values it takes when it holds anything else.
    pub fn from_env() -> Result<Option<GpuConv>, String> {
        match std::env::var(GPU_CONV_VARIABLE) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Ok(v) => GpuConv::parse(&v).map(Some),
            Err(e) => Err(format!("{GPU_CONV_VARIABLE}: {e}")),
        }
    }

    /// The choice named `value` ([`GpuConv::name`]); an error naming [`GPU_CONV_VARIABLE`] and
    /// the names it takes otherwise.
    pub fn parse(value: &str) -> Result<GpuConv, String> {
        GpuConv::ALL
            .into_iter()
            .find(|c| c.name() == value)
            .ok_or_else(|| {
                format!(
                    "{GPU_CONV_VARIABLE}={value:?}: expected auto (the default: by layer width), \
                     direct (burn's direct convolution), im2col (unfolded input times the weight) \
                     or tiled (jem-kernels' own tiled implicit product)"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_chooses_by_the_length_of_an_outputs_sum_and_forced_choices_pass_through() {
        // [out, in, kh, kw]: 64 channels 3×3 sum 576 terms, 128 sum 1 152, 1×1 of 640 sum 640.
        assert_eq!(GpuConv::Auto.for_weight([64, 64, 3, 3]), GpuConv::Direct);
        assert_eq!(GpuConv::Auto.for_weight([128, 128, 3, 3]), GpuConv::Im2col);
        assert_eq!(GpuConv::Auto.for_weight([640, 640, 1, 1]), GpuConv::Direct);
        let [terms_below, terms_at] = [IM2COL_MIN_TERMS - 1, IM2COL_MIN_TERMS];
        assert_eq!(
            GpuConv::Auto.for_weight([8, terms_below, 1, 1]),
            GpuConv::Direct
        );
        assert_eq!(
            GpuConv::Auto.for_weight([8, terms_at, 1, 1]),
            GpuConv::Im2col
        );
        for forced in [GpuConv::Direct, GpuConv::Im2col, GpuConv::Tiled] {
            assert_eq!(forced.for_weight([640, 640, 3, 3]), forced);
            assert_eq!(forced.for_weight([16, 1, 3, 3]), forced);
        }
    }

    #[test]
    fn cuda_refuses_the_choice_that_disagreed_there_unless_asked_to_debug_it() {
        for conv in [GpuConv::Auto, GpuConv::Direct, GpuConv::Im2col] {
            assert_eq!(conv.check_for_cuda(false), Ok(()));
        }
        let refused = GpuConv::Tiled.check_for_cuda(false).unwrap_err();
        for part in [
            "JEM_BENCH_GPU_CONV=tiled",
            UNVERIFIED_VARIABLE,
            "auto",
            "docs/gpu.md",
        ] {
            assert!(refused.contains(part), "{refused:?} lacks {part:?}");
        }
        assert_eq!(GpuConv::Tiled.check_for_cuda(true), Ok(()));
    }

    #[test]
    fn every_choice_parses_by_its_name_and_anything_else_is_refused_naming_the_variable() {
        for conv in GpuConv::ALL {
            assert_eq!(GpuConv::parse(conv.name()), Ok(conv));
        }
        let refused = GpuConv::parse("cudnn").unwrap_err();
        for part in [
            GPU_CONV_VARIABLE,
            "\"cudnn\"",
            "auto",
            "direct",
            "im2col",
            "tiled",
        ] {
            assert!(refused.contains(part), "{refused:?} lacks {part:?}");
        }
    }
}
