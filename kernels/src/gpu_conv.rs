//! How the GPU backends compute a forward convolution: this crate's tiled kernels by default,
//! or burn's direct kernel or the unfolded input times the weight. Kept apart from the GPU backends
//! themselves so that every build (and its tests) has the choice, with or without a GPU
//! backend compiled in.

use crate::process_choice::ProcessChoice;

/// How the GPU backends compute a forward convolution (every kernel in true f32). All of them
/// agree with the CPU on a software Vulkan device and all but `TiledWide` on an NVIDIA H200
/// (tests/gpu.rs, docs/gpu.md); they differ in speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuConv {
    /// This crate's own kernels (the default): the unfolded product computed in shared-memory
    /// tiles without writing the unfolded input (src/tiled_conv.rs), and the weight gradient
    /// the same way (src/tiled_weight_grad.rs). The fastest of the four on every row timed on
    /// an H200 (results/perf/gpu.csv).
    Tiled,
    /// The tiled kernels with 128-pixel tiles of the forward product (8 pixels × up to 4
    /// channels per unit, against 4 × 4): twice the multiply-adds per value staged in shared
    /// memory, on half as many cubes — for the wide layers of a WRN-28-10 at large batches.
    /// Not yet timed on a GPU: `scripts/gpu-check.sh` times it beside `Tiled`.
    TiledWide,
    /// Per convolution, by the length of its sums: burn's direct kernel where each output sums
    /// fewer than [`IM2COL_MIN_TERMS`] products, the unfolded product where it sums more.
    Auto,
    /// burn's direct convolution kernel: a loop per output element.
    Direct,
    /// The input unfolded (im2col) and one unit-tiled matrix product with the weight
    /// ([`crate::conv2d_from_matmul`]): more memory, and a kernel built for throughput.
    Im2col,
}

/// Under [`GpuConv::Auto`], the length of an output's sum (input channels × kernel area) from
/// which the unfolded product computes the convolution. Measured on an H200 (results/perf/
/// gpu.csv): where every layer sums 9 to 576 terms (WRN-10-1) the direct kernel made the
/// whole network 1.05–3.1× faster, row by row; where the 3×3 layers but the first two sum
/// 1 440 to 5 760 (WRN-28-10) the unfolded product did, 2.8–5.1×. The threshold lies between
/// the two; single layers have not been timed apart, and no network mixing both was timed.
pub const IM2COL_MIN_TERMS: usize = 1024;

/// The environment variable that chooses [`GpuConv`]: `tiled` (default), `tiled-wide`, `auto`,
/// `direct` or `im2col`.
pub const GPU_CONV_VARIABLE: &str = "JEM_BENCH_GPU_CONV";

static GPU_CONV: ProcessChoice<GpuConv> = ProcessChoice::new(&GpuConv::ALL);

/// Chooses how the GPU backends compute forward convolutions, for the whole process.
pub fn set_gpu_conv(conv: GpuConv) {
    GPU_CONV.set(conv);
}

/// How the GPU backends compute forward convolutions (see [`set_gpu_conv`]; `Tiled` until set).
pub fn gpu_conv() -> GpuConv {
    GPU_CONV.get().unwrap_or(GpuConv::Tiled)
}

impl GpuConv {
    /// Every choice, the default first.
    pub const ALL: [GpuConv; 5] = [
        GpuConv::Tiled,
        GpuConv::TiledWide,
        GpuConv::Auto,
        GpuConv::Direct,
        GpuConv::Im2col,
    ];

    /// The name [`GPU_CONV_VARIABLE`] takes and outputs record.
    pub fn name(self) -> &'static str {
        match self {
            GpuConv::Auto => "auto",
            GpuConv::Direct => "direct",
            GpuConv::Im2col => "im2col",
            GpuConv::Tiled => "tiled",
            GpuConv::TiledWide => "tiled-wide",
        }
    }

    /// Whether this crate's tiled kernels compute the convolution and its weight gradient.
    pub fn is_tiled(self) -> bool {
        matches!(self, GpuConv::Tiled | GpuConv::TiledWide)
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
                    "{GPU_CONV_VARIABLE}={value:?}: expected tiled (the default: jem-kernels' \
                     own tiled implicit product), tiled-wide (the same on 128-pixel tiles), \
                     auto (burn's kernels chosen by layer width), direct (burn's direct \
                     convolution) or im2col (unfolded input times the weight)"
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
        for forced in [
            GpuConv::Direct,
            GpuConv::Im2col,
            GpuConv::Tiled,
            GpuConv::TiledWide,
        ] {
            assert_eq!(forced.for_weight([640, 640, 3, 3]), forced);
            assert_eq!(forced.for_weight([16, 1, 3, 3]), forced);
        }
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
            "tiled-wide",
        ] {
            assert!(refused.contains(part), "{refused:?} lacks {part:?}");
        }
    }
}
