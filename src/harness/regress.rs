//! `jem-bench regress`: compares a sweep with a stored reference and fails when the robust
//! accuracy of any reference cell (model × attack × norm × ε × K × gradient mode) dropped by
//! more than the tolerance, or is missing. It reruns the reference's own sweep (same settings,
//! fresh folder), or reads a finished one given with `--run`, whose cells must have been
//! computed with the reference's settings (examples, attack, defence, EOT, seed, data): a run
//! of 10 examples and one PGD step holding against a reference of 50 and 10 steps proves
//! nothing, so it is refused unless `--allow-other-settings` says the comparison is meant.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::outputs::read_tidy;
use super::rows::{row_key, RowKey, TidyRow};
use super::spec::{Runner, SweepObserver};
use super::sweep::{check, run};
use crate::settings::InvalidSetting;

use crate::backend::BenchBackend;
use crate::model::write_atomic;

/// What [`regress`] compares: a reference sweep against a rerun of its own sweep, or against a
/// finished sweep folder.
#[derive(Debug, Clone, PartialEq)]
pub struct RegressSpec {
    /// The reference sweep folder (its settings.json and robust.csv).
    pub reference: PathBuf,
    /// Largest allowed drop of robust accuracy, absolute, in [0, 1] (0.02 = 2 points).
    pub tolerance: f64,
    /// A finished sweep folder to compare instead of rerunning the reference's sweep.
    pub run: Option<PathBuf>,
    /// Where the rerun goes (`None`: `runs/regress/<reference folder name>`); a previous rerun
    /// there (marked by a REGRESS-RERUN file) is cleared first; any other folder, and one that
    /// overlaps the reference, is refused.
    pub out: Option<PathBuf>,
    /// Compare a `run` whose cells were computed with other settings than the reference's
    /// (other examples, attack or defence settings, EOT, seed, data), printing the
    /// differences; otherwise such a run is refused.
    pub allow_other_settings: bool,
}

/// The reference cells that regressed, one line each; empty when all hold.
pub fn compare(reference: &[TidyRow], candidate: &[TidyRow], tolerance: f64) -> Vec<String> {
    let found: std::collections::HashMap<RowKey, &TidyRow> =
        candidate.iter().map(|r| (row_key(r), r)).collect();
    reference
        .iter()
        .filter_map(|r| {
            let cell = format!(
                "{} {} {} ε={} K={} grad={}",
                r.model, r.attack, r.norm, r.eps, r.k, r.grad
            );
            match found.get(&row_key(r)) {
                None => Some(format!("{cell}: missing from the new sweep")),
                Some(c) if c.robust_accuracy < r.robust_accuracy - tolerance - 1e-12 => {
                    Some(format!(
                        "{cell}: robust accuracy {:.4} < reference {:.4} − {tolerance}",
                        c.robust_accuracy, r.robust_accuracy
                    ))
                }
                Some(_) => None,
            }
        })
        .collect()
}

/// What decided a cell's numbers besides its key: the examples, the attack's and the defence's
/// settings, EOT, restarts, chains, seed and data.
fn cell_settings(r: &TidyRow) -> [(&'static str, String); 9] {
    [
        ("n", r.n.to_string()),
        ("attack_settings", r.attack_settings.clone()),
        ("defence", r.defence.clone()),
        ("eot", r.eot.to_string()),
        ("restarts", r.restarts.to_string()),
        ("chains", r.chains.to_string()),
        ("recheck_chains", r.recheck_chains.to_string()),
        ("seed", r.seed.to_string()),
        ("data", r.data.clone()),
    ]
}

/// For each reference cell the candidate computed otherwise, the settings that differ.
pub fn setting_differences(reference: &[TidyRow], candidate: &[TidyRow]) -> Vec<String> {
    let found: std::collections::HashMap<RowKey, &TidyRow> =
        candidate.iter().map(|r| (row_key(r), r)).collect();
    let mut out = Vec::new();
    for r in reference {
        let Some(c) = found.get(&row_key(r)) else {
            continue;
        };
        for ((name, want), (_, got)) in cell_settings(r).into_iter().zip(cell_settings(c)) {
            if want != got {
                out.push(format!(
                    "{} {} {} ε={} K={} grad={}: {name} {got} in the run, {want} in the reference",
                    r.model, r.attack, r.norm, r.eps, r.k, r.grad
                ));
            }
        }
    }
    out
}

/// File that marks a folder as a `regress` rerun, which a later rerun may clear.
const RERUN_MARKER: &str = "REGRESS-RERUN";

/// Whether `a` and `b` are the same folder or one lies inside the other (either may not exist
/// yet: its nearest existing ancestor is resolved).
fn overlapping(a: &Path, b: &Path) -> bool {
    fn resolve(p: &Path) -> PathBuf {
        let absolute = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut existing = absolute.as_path();
        let mut rest = Vec::new();
        while !existing.exists() {
            match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => break,
            }
        }
        let mut resolved = existing
            .canonicalize()
            .unwrap_or_else(|_| existing.to_path_buf());
        resolved.extend(rest.iter().rev());
        resolved
    }
    let (a, b) = (resolve(a), resolve(b));
    a.starts_with(&b) || b.starts_with(&a)
}

fn rerun<B: BenchBackend>(
    reference: &Path,
    out: &Path,
    device: &B::Device,
    observer: &dyn SweepObserver,
) -> anyhow::Result<()> {
    if overlapping(reference, out) {
        let problem = format!(
            "overlaps the reference {}: the rerun would overwrite what it is compared with; \
             name another folder",
            reference.display()
        );
        return Err(InvalidSetting::new("out", out.display().to_string(), &problem).into());
    }
    let p = reference.join("settings.json");
    let settings = super::record::read_settings(reference)?
        .with_context(|| format!("cannot read {}: not a sweep folder", p.display()))?;
    let (spec, checkpoints) = super::record::parts(&settings["args"])
        .with_context(|| format!("{}: `args` is not a robust sweep's arguments", p.display()))?;
    // Models, data and settings are checked before the folder is touched.
    check::<B>(&spec, &checkpoints, device)
        .with_context(|| format!("the sweep of {}", p.display()))?;
    // Start afresh, but only over a folder that an earlier rerun made (it carries the
    // marker): anything else, a finished sweep above all, is never deleted.
    let marker = out.join(RERUN_MARKER);
    if out.exists() {
        let empty = std::fs::read_dir(out)
            .with_context(|| format!("cannot read {}", out.display()))?
            .next()
            .is_none();
        anyhow::ensure!(
            empty || marker.exists(),
            "{} exists and was not made by `regress` (no {RERUN_MARKER} file in it); pass \
             another --out",
            out.display()
        );
        std::fs::remove_dir_all(out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_atomic(
        &marker,
        format!(
            "a rerun of {} by `jem-bench regress`; the next rerun clears this folder\n",
            reference.display()
        )
        .as_bytes(),
    )?;
    let runner = Runner {
        observer,
        ..Runner::new(out)
    };
    run::<B>(&spec, &checkpoints, &runner, device).map(|_| ())
}

/// A sweep folder's settings.json, its format checked; `Null` for a folder without one (a bare
/// robust.csv).
fn read_settings(dir: &Path) -> anyhow::Result<serde_json::Value> {
    Ok(super::record::read_settings(dir)?.unwrap_or(serde_json::Value::Null))
}

/// Refuses to compare sweeps of different weights under the same model paths: a retrained
/// model makes the reference stale, which is not a regression. References made before sweeps
/// recorded their weights are not checked.
fn check_same_weights(
    reference: &Path,
    saved: &serde_json::Value,
    now: &serde_json::Value,
) -> anyhow::Result<()> {
    if saved.is_null() || now.is_null() || saved == now {
        return Ok(());
    }
    anyhow::bail!(
        "{} was swept with other weights ({saved}) than the models have now ({now}); a model \
         changed, so regenerate the reference with the command in its settings.json \
         (results/README.md lists it)",
        reference.display()
    )
}

/// `jem-bench regress`: compares a sweep (rerun on `device` unless `a.run` names one) with a
/// reference; an error lists the cells that regressed.
pub fn regress<B: BenchBackend>(
    a: &RegressSpec,
    device: &B::Device,
    observer: &dyn SweepObserver,
) -> anyhow::Result<()> {
    if !(a.tolerance.is_finite() && (0.0..=1.0).contains(&a.tolerance)) {
        return Err(InvalidSetting::new(
            "tolerance",
            a.tolerance.to_string(),
            "expected an accuracy drop in [0, 1] (0.02 = 2 points)",
        )
        .into());
    }
    let reference = read_tidy(&a.reference.join("robust.csv"))?;
    anyhow::ensure!(
        !reference.is_empty(),
        "{}: the reference has no rows",
        a.reference.join("robust.csv").display()
    );
    let saved = read_settings(&a.reference)?;
    anyhow::ensure!(
        saved["args"]["quick"] != true,
        "{} is a quick look (`robust --quick`), whose rows are upper bounds from weak attacks: \
         no reference; make the reference with the budgets it should guard",
        a.reference.display()
    );
    let saved_weights = &saved["weights"];
    let candidate_dir = match &a.run {
        Some(dir) => {
            check_same_weights(&a.reference, saved_weights, &read_settings(dir)?["weights"])?;
            dir.clone()
        }
        None => {
            let paths: Vec<String> =
                serde_json::from_value(saved["models"].clone()).unwrap_or_default();
            let now = paths
                .iter()
                .map(|m| {
                    if let Some(onnx) = crate::model::OnnxCheckpoint::find(m) {
                        let (model, _) = onnx
                            .load::<B::InnerBackend>(device)
                            .with_context(|| format!("model {m} of the reference"))?;
                        return crate::model::weights_digest(&model);
                    }
                    let (model, _) = crate::model::Checkpoint::at(m)
                        .load::<B::InnerBackend>(device)
                        .with_context(|| format!("model {m} of the reference"))?;
                    crate::model::weights_digest(&model)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            check_same_weights(&a.reference, saved_weights, &serde_json::json!(now))?;
            let name = a
                .reference
                .file_name()
                .map_or("sweep".into(), |n| n.to_os_string());
            let out = a
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("runs/regress").join(name));
            rerun::<B>(&a.reference, &out, device, observer)?;
            out
        }
    };
    let candidate = read_tidy(&candidate_dir.join("robust.csv"))?;
    let differences = setting_differences(&reference, &candidate);
    if !differences.is_empty() {
        let shown = differences.len().min(5);
        let listed = differences[..shown].join("\n  ");
        let more = differences.len() - shown;
        let more = if more > 0 {
            format!("\n  (and {more} more)")
        } else {
            String::new()
        };
        anyhow::ensure!(
            a.allow_other_settings,
            "{} computed its cells with other settings than the reference {}:\n  {listed}{more}\n\
             its accuracies are not comparable; rerun the reference's sweep (leave out --run), \
             or pass --allow-other-settings to compare anyway",
            candidate_dir.display(),
            a.reference.display()
        );
        observer.warns(&format!(
            "warning: comparing cells computed with other settings:\n  {listed}{more}"
        ));
    }
    let failures = compare(&reference, &candidate, a.tolerance);
    if failures.is_empty() {
        observer.says(&format!(
            "regress: all {} reference cells hold within {} ({} vs {})",
            reference.len(),
            a.tolerance,
            candidate_dir.display(),
            a.reference.display()
        ));
        Ok(())
    } else {
        for f in &failures {
            observer.warns(&format!("REGRESSED {f}"));
        }
        anyhow::bail!(
            "{} of {} reference cells regressed ({} vs {})",
            failures.len(),
            reference.len(),
            candidate_dir.display(),
            a.reference.display()
        )
    }
}
