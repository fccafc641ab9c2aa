//! A sweep folder's record: its `settings.json`, read here for every command with its format
//! checked ([`SWEEP_FORMAT`]), the sweep's identity derived from it, and its arguments
//! (`args`), written and read by version, so that [`SweepSpec`] can change shape in memory
//! without changing what a folder holds or which folder a sweep resumes.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use anyhow::Context;

use jem_attacks::{GradMode, Norm};
use serde::{Deserialize, Serialize};

use super::budgets::BudgetCounts;
use super::cells::AttackKind;
use super::spec::{Checkpoints, Examples, Shard, SweepSpec, Threat};
use crate::defended::DefenceSpec;

/// The layout of a sweep folder (`settings.json`, `robust.csv`, `examples.csv`, `cells/`),
/// recorded as `settings.json`'s `format` and checked wherever a folder is read: a folder of
/// another layout is refused by it, never half understood. It says how the folder is laid
/// out, not what the sweep computes, so the sweep's [`identity`] leaves it out.
pub const SWEEP_FORMAT: u64 = 1;

/// The `settings.json` of the sweep folder `dir`, its format checked; `None` where the folder
/// has none (a bare `robust.csv`).
pub(crate) fn read_settings(dir: &Path) -> anyhow::Result<Option<serde_json::Value>> {
    let path = dir.join("settings.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let settings: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a sweep's settings", path.display()))?;
    match settings["format"].as_u64() {
        Some(SWEEP_FORMAT) => Ok(Some(settings)),
        found => anyhow::bail!(
            "{}: field `format`: expected {SWEEP_FORMAT}, found {} ({}); rerun the sweep's \
             command into a new --out",
            path.display(),
            settings["format"],
            match found {
                Some(f) if f > SWEEP_FORMAT => "a folder of a newer jem-bench",
                _ => "a folder of another layout, or not a sweep's",
            }
        ),
    }
}

/// `sha256:<hex>` of a sweep's settings, its folder's [`SWEEP_FORMAT`] aside: what every cell
/// file of the sweep carries, so that a cell is reused only by the sweep that computed it.
pub fn identity(settings: &serde_json::Value) -> String {
    let mut what = settings.clone();
    if let Some(map) = what.as_object_mut() {
        map.remove("format");
    }
    crate::digest::of(what.to_string().as_bytes())
}

/// Version 1, the layout of every sweep so far: each setting of `jem-bench robust` under its
/// flag's id, flat, with the output folder and the shard (which do not change what a sweep
/// computes) recorded as `null`; `batch_size`, `save_adversarials` and `quick` only where set.
/// A setting missing from a file takes its default.
#[derive(Serialize, Deserialize)]
#[serde(default)]
struct ArgsV1 {
    norm: Norm,
    models: Vec<PathBuf>,
    attacks: Vec<AttackKind>,
    eps: Vec<f32>,
    ks: Vec<usize>,
    grad: Vec<GradMode>,
    eot: Option<usize>,
    #[serde(flatten)]
    budgets: BudgetCounts,
    n_examples: usize,
    convergence_sample: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch_size: Option<usize>,
    data: Option<String>,
    seed: u64,
    defence: DefenceSpec,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    save_adversarials: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    quick: bool,
    out: Option<PathBuf>,
    shard: Option<Shard>,
}

impl Default for ArgsV1 {
    fn default() -> Self {
        ArgsV1::new(&SweepSpec::default(), &Checkpoints::default())
    }
}

impl ArgsV1 {
    fn new(spec: &SweepSpec, checkpoints: &Checkpoints) -> Self {
        ArgsV1 {
            norm: spec.threat.norm,
            models: checkpoints.models.clone(),
            attacks: spec.attacks.clone(),
            eps: spec.threat.eps.clone(),
            ks: spec.ks.clone(),
            grad: spec.grad.clone(),
            eot: spec.eot,
            budgets: BudgetCounts::from(&spec.budgets),
            n_examples: spec.examples.n.get(),
            convergence_sample: spec.convergence_sample,
            batch_size: spec.examples.batch_size.map(NonZeroUsize::get),
            data: checkpoints.data.clone(),
            seed: spec.seed,
            defence: spec.defence.clone(),
            save_adversarials: spec.save_adversarials,
            quick: spec.quick,
            out: None,
            shard: None,
        }
    }

    /// The spec and the checkpoints the arguments describe; a count of 0 is refused, naming
    /// it.
    fn parts(self) -> anyhow::Result<(SweepSpec, Checkpoints)> {
        let spec = SweepSpec {
            threat: Threat {
                norm: self.norm,
                eps: self.eps,
            },
            attacks: self.attacks,
            budgets: self.budgets.checked()?,
            ks: self.ks,
            grad: self.grad,
            eot: self.eot,
            defence: self.defence,
            examples: Examples::checked(self.n_examples, self.batch_size)?,
            convergence_sample: self.convergence_sample,
            seed: self.seed,
            save_adversarials: self.save_adversarials,
            quick: self.quick,
        };
        let checkpoints = Checkpoints {
            models: self.models,
            data: self.data,
        };
        Ok((spec, checkpoints))
    }
}

/// The arguments a sweep of `spec` on `checkpoints` records (the current version's layout; a
/// library sweep of its own subjects records no checkpoints).
pub(super) fn args(spec: &SweepSpec, checkpoints: &Checkpoints) -> serde_json::Value {
    serde_json::to_value(ArgsV1::new(spec, checkpoints)).expect("the arguments serialise")
}

/// The spec and checkpoints recorded as `args` (a sweep folder's `settings.json`).
pub(super) fn parts(args: &serde_json::Value) -> anyhow::Result<(SweepSpec, Checkpoints)> {
    let recorded: ArgsV1 = serde_json::from_value(args.clone())?;
    recorded.parts()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed sweep's recorded arguments read back into a spec and written again
    /// unchanged: the record, not the spec's own shape, decides a sweep's settings, so nothing
    /// in a committed folder's identity moves (the folders keep resuming, the references keep
    /// comparing).
    #[test]
    fn committed_sweeps_arguments_read_back_and_write_the_same() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        let mut checked = 0;
        for dir in ["sweeps", "reference"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path().join("settings.json");
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let settings: serde_json::Value = serde_json::from_str(&text).unwrap();
                let recorded = &settings["args"];
                let (spec, checkpoints) = parts(recorded).unwrap();
                let again = args(&spec, &checkpoints);
                assert_eq!(&again, recorded, "{}", path.display());
                checked += 1;
            }
        }
        assert!(checked >= 10, "only {checked} committed sweeps found");
    }

    #[test]
    fn a_recorded_count_of_zero_is_refused_by_name() {
        for field in ["fab_iterations", "n_examples", "batch_size"] {
            let mut recorded = args(&SweepSpec::default(), &Checkpoints::default());
            recorded[field] = serde_json::json!(0);
            let err = parts(&recorded).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }
}
