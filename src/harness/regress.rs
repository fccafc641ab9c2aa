//! `jem-bench regress`: compares a sweep with a stored reference and fails when the robust
//! accuracy of any reference cell (model × attack × norm × ε × K × gradient mode) dropped by
//! more than the tolerance, or is missing. It reruns the reference's own sweep (same settings,
//! fresh folder), or reads a finished one given with `--run`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use super::outputs::{read_tidy, TidyRow};
use super::sweep::{run, RobustArgs};
use crate::model::write_atomic;

#[derive(Debug, Clone, Args)]
pub struct RegressArgs {
    /// The reference sweep folder (its settings.json and robust.csv).
    #[arg(long)]
    pub reference: PathBuf,
    /// Largest allowed drop of robust accuracy (absolute, e.g. 0.02 = 2 points).
    #[arg(long, default_value_t = 0.02)]
    pub tolerance: f64,
    /// Compare this finished sweep folder instead of rerunning the reference's sweep.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Where the rerun goes (default: runs/regress/<reference folder name>); a previous rerun
    /// there is cleared first (any other folder is refused).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

type Key = (String, String, String, u32, usize, String);

fn key(r: &TidyRow) -> Key {
    (
        r.model.clone(),
        r.attack.clone(),
        r.norm.clone(),
        r.eps.to_bits(),
        r.k,
        r.grad.clone(),
    )
}

/// The reference cells that regressed, one line each; empty when all hold.
pub fn compare(reference: &[TidyRow], candidate: &[TidyRow], tolerance: f64) -> Vec<String> {
    let found: std::collections::HashMap<Key, &TidyRow> =
        candidate.iter().map(|r| (key(r), r)).collect();
    reference
        .iter()
        .filter_map(|r| {
            let cell = format!(
                "{} {} {} ε={} K={} grad={}",
                r.model, r.attack, r.norm, r.eps, r.k, r.grad
            );
            match found.get(&key(r)) {
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

/// File that marks a folder as a `regress` rerun, which a later rerun may clear.
const RERUN_MARKER: &str = "REGRESS-RERUN";

fn rerun(reference: &Path, out: &Path) -> anyhow::Result<()> {
    let p = reference.join("settings.json");
    let settings: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?,
    )
    .with_context(|| format!("{}: unreadable", p.display()))?;
    let mut args: RobustArgs = serde_json::from_value(settings["args"].clone())
        .with_context(|| format!("{}: `args` is not a robust sweep's arguments", p.display()))?;
    // Start afresh, but only over a folder that a rerun made (it carries a marker; the
    // reference it reran may have changed since) or that holds this same sweep.
    let own = out.join("settings.json");
    let marker = out.join(RERUN_MARKER);
    if own.exists() {
        let theirs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&own)?)?;
        anyhow::ensure!(
            theirs == settings || marker.exists(),
            "{} holds another sweep, not made by `regress`; pass another --out",
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
    args.out = Some(out.to_path_buf());
    run(args)
}

/// A sweep folder's settings.json; `Null` for a folder without one (a bare robust.csv).
fn read_settings(dir: &Path) -> anyhow::Result<serde_json::Value> {
    let p = dir.join("settings.json");
    if !p.exists() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?,
    )
    .with_context(|| format!("{}: unreadable", p.display()))
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

pub fn regress(a: RegressArgs) -> anyhow::Result<()> {
    let reference = read_tidy(&a.reference.join("robust.csv"))?;
    let saved = read_settings(&a.reference)?;
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
                .map(|m| crate::model::Checkpoint::at(m).weights_digest())
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
            rerun(&a.reference, &out)?;
            out
        }
    };
    let candidate = read_tidy(&candidate_dir.join("robust.csv"))?;
    let failures = compare(&reference, &candidate, a.tolerance);
    if failures.is_empty() {
        println!(
            "regress: all {} reference cells hold within {} ({} vs {})",
            reference.len(),
            a.tolerance,
            candidate_dir.display(),
            a.reference.display()
        );
        Ok(())
    } else {
        for f in &failures {
            eprintln!("REGRESSED {f}");
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
