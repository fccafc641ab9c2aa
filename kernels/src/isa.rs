//! Which instruction set this crate's direct convolution kernel runs on: the best the CPU has,
//! capped for the whole process by the environment variable [`ISA_VARIABLE`]
//! (`JEM_BENCH_ISA`) or by [`set_isa`] — e.g. to measure the AVX2 kernel, or the portable path
//! an Arm CPU takes, on a CPU with AVX-512.
//!
//! The variable is read once, the first time it is needed. It is read inside a library, which
//! has no good way to report a bad value: [`isa`] then falls back to what the CPU has (and
//! says so once on stderr), and [`isa_from_env`] returns the error, for a binary's `main` to
//! call early and report before any work starts.
//!
//! The cap covers this crate's own kernels only: see [`Isa`].

use crate::process_choice::ProcessChoice;
use std::ffi::OsStr;
use std::fmt;
use std::str::FromStr;
use std::sync::{Once, OnceLock};

/// The environment variable that caps the instruction set: `avx512`, `avx2` or `portable`
/// (unset or empty: no cap).
pub const ISA_VARIABLE: &str = "JEM_BENCH_ISA";

/// The instruction set of this crate's direct convolution kernels (stride-1 "same"
/// convolutions: forward and input gradient on maps of ≥ 128 pixels, any size on AVX-512; the
/// weight gradient of 3×3 ones), ordered from the least
/// capable: a cap of `Avx512` is no cap.
///
/// Its [`Display`](fmt::Display) and [`FromStr`] forms are the values of [`ISA_VARIABLE`]:
/// `avx512`, `avx2`, `portable`.
///
/// The cap ([`set_isa`], [`ISA_VARIABLE`]) covers this crate's own kernels only. The matrix
/// products (the `gemm` crate, behind this crate's kernel-rows and im2col paths and burn's own
/// operations) choose their instruction set themselves, from the CPU, on first use: `gemm`
/// 0.19 keeps that choice in a private static and has no public switch to cap it (its only
/// settings are size thresholds). So on an AVX-512 CPU, `JEM_BENCH_ISA=avx2` runs the AVX2
/// direct kernel beside AVX-512 matrix products (the weight gradients, the stride-2 and 7×7
/// convolutions): an AVX2-only CPU's code path in this crate, not its speed throughout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// No direct kernel: those convolutions go by kernel rows, copies of the input multiplied
    /// by `gemm` (the path of CPUs other than x86-64 with AVX2).
    Portable,
    /// The direct kernel on 8-lane AVX2 vectors with FMA (x86-64).
    Avx2,
    /// The direct kernel on 16-lane AVX-512F vectors (x86-64).
    Avx512,
}

impl Isa {
    /// Every instruction set, from the most capable.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Portable];

    /// The name used by [`ISA_VARIABLE`] and [`Display`](fmt::Display).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Whether this CPU can run this instruction set's kernel (always, for `Portable`).
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => false,
        }
    }

    /// The most capable instruction set this CPU runs.
    pub fn best_available() -> Isa {
        select(None, Isa::is_available)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = String;

    /// `avx512`, `avx2` or `portable`, in any case.
    fn from_str(s: &str) -> Result<Isa, String> {
        Isa::ALL
            .into_iter()
            .find(|isa| s.eq_ignore_ascii_case(isa.name()))
            .ok_or_else(|| format!("unknown instruction set {s:?}: expected {}", expected()))
    }
}

/// The accepted values, for error messages.
fn expected() -> String {
    let names: Vec<&str> = Isa::ALL.into_iter().map(Isa::name).collect();
    names.join(", ")
}

/// The cap a value of [`ISA_VARIABLE`] asks for: `None` where it is unset or empty, an error
/// naming the variable, the value and the accepted values where it is not one of them.
fn parse_cap(value: Option<&OsStr>) -> Result<Option<Isa>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let invalid = || {
        format!(
            "{ISA_VARIABLE}={value:?} is not an instruction set: expected one of {} \
             (or unset, for the best this CPU has)",
            expected()
        )
    };
    let text = value.to_str().ok_or_else(invalid)?.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| invalid())
}

/// The most capable instruction set at or below `cap` (no cap: any) for which `available`
/// holds, so a cap never selects a kernel the CPU lacks: forcing AVX-512 on a CPU with AVX2
/// only gives AVX2. (`available` is [`Isa::is_available`] but for tests.)
fn select(cap: Option<Isa>, available: impl Fn(Isa) -> bool) -> Isa {
    let cap = cap.unwrap_or(Isa::Avx512);
    Isa::ALL
        .into_iter()
        .find(|&isa| isa <= cap && available(isa))
        .unwrap_or(Isa::Portable)
}

/// [`ISA_VARIABLE`]'s cap, read once.
fn env_cap() -> &'static Result<Option<Isa>, String> {
    static CAP: OnceLock<Result<Option<Isa>, String>> = OnceLock::new();
    CAP.get_or_init(|| parse_cap(std::env::var_os(ISA_VARIABLE).as_deref()))
}

/// [`set_isa`]'s cap, if it was called.
static FORCED: ProcessChoice<Isa> = ProcessChoice::new(&Isa::ALL);

/// Caps, for the whole process, the instruction set of this crate's kernels, overriding
/// [`ISA_VARIABLE`]; `Isa::Avx512` lifts any cap. A cap the CPU lacks selects the best set
/// below it that the CPU has (see [`isa`]). Kernels prepared before the call (none are kept
/// across convolutions) are unaffected.
pub fn set_isa(cap: Isa) {
    FORCED.set(cap);
}

/// The instruction set this crate's kernels use now: the cap of [`set_isa`], else of
/// [`ISA_VARIABLE`], lowered to what the CPU has (forcing `avx512` on a CPU with AVX2 only
/// gives `Avx2`). An invalid value of the variable is ignored (reported once on stderr, and
/// by [`isa_from_env`]).
pub fn isa() -> Isa {
    let cap = FORCED.get().or_else(|| match env_cap() {
        Ok(cap) => *cap,
        Err(message) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| eprintln!("jem-kernels: {message}; ignored"));
            None
        }
    });
    select(cap, Isa::is_available)
}

/// The instruction set [`ISA_VARIABLE`] selects on this CPU (the best the CPU has where it is
/// unset), or a message naming the variable, its value and the accepted values where the value
/// is invalid: for a binary to call at startup and report. [`set_isa`] does not change it.
pub fn isa_from_env() -> Result<Isa, String> {
    let cap = env_cap().clone()?;
    Ok(select(cap, Isa::is_available))
}

/// The widest instruction set of the `gemm` crate's matrix products in this build on this CPU:
/// `avx512` (built with the `avx512-gemm` feature, the default, on a CPU with AVX-512F),
/// `avx2` (AVX2 + FMA), or `other` (gemm's NEON, SSE or scalar paths). [`ISA_VARIABLE`] does
/// not change it (see [`Isa`]); a build without `avx512-gemm` stops at `avx2`, as an AVX2-only
/// CPU does.
pub fn gemm_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if cfg!(feature = "avx512-gemm") && std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2";
        }
    }
    "other"
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `value` of the variable selects on a CPU that has the sets up to `cpu`.
    fn resolve(value: &str, cpu: Isa) -> Result<Isa, String> {
        Ok(select(parse_cap(Some(OsStr::new(value)))?, |isa| {
            isa <= cpu
        }))
    }

    #[test]
    fn valid_values_select_their_set_on_a_cpu_that_has_it() {
        for isa in Isa::ALL {
            assert_eq!(resolve(isa.name(), Isa::Avx512), Ok(isa));
            assert_eq!(isa.to_string(), isa.name());
            assert_eq!(isa.name().parse(), Ok(isa));
        }
        assert_eq!(resolve("AVX2", Isa::Avx512), Ok(Isa::Avx2));
        assert_eq!(resolve(" portable\n", Isa::Avx2), Ok(Isa::Portable));
    }

    #[test]
    fn unset_or_empty_selects_what_the_cpu_has() {
        for cpu in Isa::ALL {
            assert_eq!(parse_cap(None), Ok(None));
            assert_eq!(select(None, |isa| isa <= cpu), cpu);
            assert_eq!(resolve("", cpu), Ok(cpu));
            assert_eq!(resolve("  ", cpu), Ok(cpu));
        }
    }

    #[test]
    fn a_cap_above_the_cpu_is_lowered_to_it() {
        assert_eq!(resolve("avx512", Isa::Avx2), Ok(Isa::Avx2));
        assert_eq!(resolve("avx512", Isa::Portable), Ok(Isa::Portable));
        assert_eq!(resolve("avx2", Isa::Portable), Ok(Isa::Portable));
        assert_eq!(resolve("portable", Isa::Avx512), Ok(Isa::Portable));
        // A CPU with AVX-512F but not AVX2 + FMA (none is known): capped at AVX2, it must
        // fall to the portable path, not run the AVX2 kernel.
        let only_avx512 = |isa: Isa| isa != Isa::Avx2;
        assert_eq!(select(Some(Isa::Avx2), only_avx512), Isa::Portable);
        assert_eq!(select(None, only_avx512), Isa::Avx512);
    }

    #[test]
    fn an_invalid_value_names_the_variable_the_value_and_the_choices() {
        for bad in ["avx", "sse4", "avx-512", "neon", "1"] {
            let message = resolve(bad, Isa::Avx512).unwrap_err();
            for part in [ISA_VARIABLE, bad, "avx512, avx2, portable"] {
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let message = parse_cap(Some(OsStr::from_bytes(b"avx\xff"))).unwrap_err();
            assert!(message.contains(ISA_VARIABLE), "{message:?}");
        }
        let message = "avx".parse::<Isa>().unwrap_err();
        assert!(message.contains("avx512, avx2, portable"), "{message:?}");
    }

    #[test]
    fn the_sets_this_cpu_runs_are_available() {
        assert!(Isa::Portable.is_available());
        assert!(Isa::best_available().is_available());
        for cap in Isa::ALL {
            let isa = select(Some(cap), Isa::is_available);
            assert!(isa <= cap && isa.is_available(), "{cap} gave {isa}");
        }
    }
}
