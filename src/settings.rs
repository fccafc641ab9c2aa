//! Checks of settings (the library's `…Spec` and `…Config` types), one function per kind of
//! range, each refusing a value with an [`InvalidSetting`] that names the field: the library
//! speaks of fields, and the command line shows them as its flags.

use jem_datasets::ImageSet;

/// A setting refused, named as its settings type names it (`n_examples`, `ks`, `px_weight`, …);
/// the command line shows the flag instead (`--n-examples`, `--steps`, `--px-weight`).
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidSetting {
    /// The field of the spec.
    pub field: &'static str,
    /// The refused value where the problem quotes it (`10001` of "n_examples 10001: …"),
    /// else empty.
    pub value: String,
    /// What is wrong, and what was expected.
    pub problem: String,
}

impl InvalidSetting {
    /// `field value: problem`.
    pub fn new(field: &'static str, value: String, problem: &str) -> Self {
        InvalidSetting {
            field,
            value,
            problem: problem.to_string(),
        }
    }

    /// `field: problem`.
    pub fn bare(field: &'static str, problem: &str) -> Self {
        Self::new(field, String::new(), problem)
    }

    /// The message with the field called `name` (a flag on the command line).
    pub fn message_naming(&self, name: &str) -> String {
        match self.value.as_str() {
            "" => format!("{name}: {}", self.problem),
            value => format!("{name} {value}: {}", self.problem),
        }
    }
}

impl std::fmt::Display for InvalidSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message_naming(self.field))
    }
}

impl std::error::Error for InvalidSetting {}

/// The first `n` images of `set`, or the refusal of `n` (the value of `field`) outside 1 to the
/// set's size; `what` names the images in the message ("the test images of mnist").
pub fn first_images(
    set: &ImageSet,
    field: &'static str,
    n: usize,
    what: &str,
) -> Result<ImageSet, InvalidSetting> {
    if !(1..=set.len()).contains(&n) {
        let problem = format!("expected 1 to {} ({what})", set.len());
        return Err(InvalidSetting::new(field, n.to_string(), &problem));
    }
    Ok(set.select(&(0..n).collect::<Vec<_>>()))
}

/// `value` as a count that is at least 1 (steps, iterations, queries, …).
pub fn count(field: &'static str, value: usize) -> Result<std::num::NonZeroUsize, InvalidSetting> {
    at_least_one(field, value)?;
    Ok(std::num::NonZeroUsize::new(value).expect("checked above"))
}

/// `value` ≥ 1 (a count: examples, steps, chains, …).
pub fn at_least_one(field: &'static str, value: usize) -> Result<(), InvalidSetting> {
    refuse_unless(
        value >= 1,
        field,
        format!("expected at least 1, found {value}"),
    )
}

/// `value` finite and > 0 (a learning rate, a step size).
pub fn finite_positive(field: &'static str, value: impl Number) -> Result<(), InvalidSetting> {
    let fine = value.into().is_finite() && value.into() > 0.0;
    refuse_unless(
        fine,
        field,
        format!("expected a finite number > 0, found {value}"),
    )
}

/// `value` finite and ≥ 0 (a weight, a noise level, a time limit).
pub fn finite_non_negative(field: &'static str, value: impl Number) -> Result<(), InvalidSetting> {
    let fine = value.into().is_finite() && value.into() >= 0.0;
    refuse_unless(
        fine,
        field,
        format!("expected a finite number >= 0, found {value}"),
    )
}

/// `value` a probability, in [0, 1].
pub fn probability(field: &'static str, value: impl Number) -> Result<(), InvalidSetting> {
    let fine = (0.0..=1.0).contains(&value.into());
    refuse_unless(
        fine,
        field,
        format!("expected a probability in [0, 1], found {value}"),
    )
}

/// `error` as a refusal of the field `field` set to `value`: its causes become the problem.
pub fn refusal(
    field: &'static str,
    value: impl std::fmt::Display,
    error: anyhow::Error,
) -> InvalidSetting {
    InvalidSetting::new(field, value.to_string(), &format!("{error:#}"))
}

/// Bytes of memory the machine has available now (Linux's `MemAvailable`); `None` where it
/// cannot be read, and nothing is refused for size.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses a setting (`field`, set to `value`) whose tensors take `bytes` (`what` says which:
/// "5 chains × 100 images of mnist") beyond the memory the machine has available now: checked
/// before allocating, so that a mistyped count is an error naming its flag and what to lower,
/// not an aborted allocation. Nothing is refused where the available memory cannot be read.
pub fn fits_in_memory(
    field: &'static str,
    value: impl std::fmt::Display,
    bytes: u128,
    what: &str,
    lower: &str,
) -> Result<(), InvalidSetting> {
    let Some(available) = available_memory() else {
        return Ok(());
    };
    let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
    refuse_unless(
        bytes <= available as u128,
        field,
        format!(
            "{what} need {:.1} GiB; this machine has {:.1} GiB available ({lower})",
            gib(bytes),
            gib(available as u128)
        ),
    )
    .map_err(|mut e| {
        e.value = value.to_string();
        e
    })
}

/// `value` at most `most` (a count of steps or iterations far beyond what evaluations use,
/// which would compute in silence for days), unless the caller allows long runs.
pub fn usual_count(
    field: &'static str,
    value: usize,
    most: usize,
    what: &str,
    allow_long: bool,
) -> Result<(), InvalidSetting> {
    refuse_unless(
        allow_long || value <= most,
        field,
        format!("more than {most} {what}, far beyond what evaluations use; allow it (--allow-long) to run it"),
    )
    .map_err(|mut e| {
        e.value = value.to_string();
        e
    })
}

/// `RAYON_NUM_THREADS`, the worker threads of the CPU backend, checked: a number from 0
/// (rayon's default, one per core) to the cores this process may use. More threads than cores
/// only slow every operation down, and rayon spends minutes silently creating 100 000 of them.
pub fn rayon_threads_from_env() -> anyhow::Result<()> {
    let Some(value) = std::env::var_os("RAYON_NUM_THREADS") else {
        return Ok(());
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let value = value.to_string_lossy();
    match value.trim().parse::<usize>() {
        Ok(n) if n <= cores => Ok(()),
        _ => anyhow::bail!(
            "RAYON_NUM_THREADS={value}: expected 1 to {cores} (the cores this process may use), \
             or 0 for one thread per core; unset it or set it in that range"
        ),
    }
}

/// A real setting, f32 or f64, shown as written (an f32 0.1 as `0.1`).
pub trait Number: Into<f64> + Copy + std::fmt::Display {}

impl Number for f32 {}
impl Number for f64 {}

fn refuse_unless(fine: bool, field: &'static str, problem: String) -> Result<(), InvalidSetting> {
    match fine {
        true => Ok(()),
        false => Err(InvalidSetting::bare(field, &problem)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_refuses_what_is_out_of_its_range_naming_the_field() {
        assert!(at_least_one("n", 1).is_ok());
        assert_eq!(
            at_least_one("n", 0).unwrap_err().to_string(),
            "n: expected at least 1, found 0"
        );
        assert!(finite_positive("lr", 1e-4).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(finite_positive("lr", bad).is_err(), "{bad}");
        }
        assert!(finite_non_negative("sigma", 0.0).is_ok());
        for bad in [-1e-9, f64::NAN, f64::INFINITY] {
            assert!(finite_non_negative("sigma", bad).is_err(), "{bad}");
        }
        assert!(probability("rho", 0.0).is_ok() && probability("rho", 1.0).is_ok());
        for bad in [-0.1, 1.1, f64::NAN] {
            assert!(probability("rho", bad).is_err(), "{bad}");
        }
        assert_eq!(
            finite_positive("eps", -0.1f32).unwrap_err().to_string(),
            "eps: expected a finite number > 0, found -0.1"
        );
        let e = probability("reinit_freq", 2.0).unwrap_err();
        assert_eq!(e.field, "reinit_freq");
        assert_eq!(
            e.message_naming("--reinit-freq"),
            "--reinit-freq: expected a probability in [0, 1], found 2"
        );
    }
}
