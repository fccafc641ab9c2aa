//! `jem-bench merge`: finished sweep folders joined into one, as if it had run whole — the
//! shards of one sweep, or sweeps that differ only in their models (a model swept later beside
//! a published table). A model whose checkpoint moved to another path keeps its cells under
//! the new name (`--rename`) when the weights there are the ones the folder recorded, and
//! `--models` keeps some models and sets their order. No cell is computed again: a cell's
//! numbers depend on its model, the settings and the seed, never on the other models of its
//! sweep or on the path its checkpoint was read from.
//!
//! Folders swept on other backends merge too (cells computed on a GPU beside a CPU table):
//! the backend is not a setting of the attack, and every row keeps the one that computed it.
//! A merge whose rows all come from the backend it runs on records its settings exactly as a
//! sweep would (the folder resumes as that sweep's own); otherwise `settings.json` names the
//! backend of the rows, or `mixed` and each model's backends (`backends`), and no sweep
//! resumes it.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use super::outputs;
use super::plan::{claim_folder, settings_differences, Plan};
use super::rows::CellResult;
use super::spec::{Checkpoints, SweepObserver, SweepSpec};
use super::sweep::finish;
use crate::backend::BenchBackend;

/// What [`merge`] keeps, and under which names.
#[derive(Debug, Clone, Default)]
pub struct MergeSpec {
    /// The models of the merged sweep, in order (default: every model of the folders, in the
    /// order they first appear); names after `renames`.
    pub models: Option<Vec<String>>,
    /// `(old, new)`: the cells of model `old` are the cells of the checkpoint now at `new`,
    /// which must hold the weights the folders recorded for `old`.
    pub renames: Vec<(String, String)>,
}

/// One input folder: its recorded settings, the identity its cells carry, and its models
/// under their new names.
struct Folder {
    dir: PathBuf,
    identity: String,
    /// `(old name, new name)` of each model, in the folder's order.
    models: Vec<(String, String)>,
    /// The settings with everything that names or describes the models removed.
    shared: Value,
    /// The sweep ran without --models (the default models).
    defaults: bool,
    spec: SweepSpec,
    /// The checkpoints it swept, under their new names, and its data.
    checkpoints: Checkpoints,
}

/// Joins the finished sweep folders `folders` into `out`, as `spec` says; every model is
/// loaded onto `device` to check its weights against what the folders recorded.
pub fn merge<B: BenchBackend>(
    folders: &[PathBuf],
    spec: &MergeSpec,
    out: &Path,
    device: &B::Device,
    observer: &dyn SweepObserver,
) -> anyhow::Result<()> {
    anyhow::ensure!(!folders.is_empty(), "no sweep folders to merge");
    let folders = folders
        .iter()
        .map(|dir| Folder::read::<B>(dir, &spec.renames, device))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for (old, _) in &spec.renames {
        anyhow::ensure!(
            folders
                .iter()
                .any(|f| f.models.iter().any(|(m, _)| m == old)),
            "--rename names {old}, which no folder swept"
        );
    }
    for f in &folders[1..] {
        let differences = settings_differences(&folders[0].shared, &f.shared);
        anyhow::ensure!(
            differences.is_empty(),
            "{} ran other settings than {} ({}); only sweeps that differ in their models merge",
            f.dir.display(),
            folders[0].dir.display(),
            differences.join("; ")
        );
    }
    let mut available: Vec<&str> = Vec::new();
    for (_, new) in folders.iter().flat_map(|f| &f.models) {
        if !available.contains(&new.as_str()) {
            available.push(new);
        }
    }
    let models: Vec<String> = match &spec.models {
        Some(chosen) => {
            for m in chosen {
                anyhow::ensure!(
                    available.contains(&m.as_str()),
                    "--models names {m}, which no folder swept (they hold {})",
                    available.join(", ")
                );
            }
            chosen.clone()
        }
        None => available.iter().map(|s| s.to_string()).collect(),
    };
    let joined = &folders[0].spec;
    let mut checkpoints = Checkpoints {
        models: models.iter().map(PathBuf::from).collect(),
        ..folders[0].checkpoints.clone()
    };
    // A sweep of the default models recorded them as no --models at all: so does its merge.
    if folders[0].defaults && checkpoints.models == crate::model::embedded_models() {
        checkpoints.models.clear();
    }
    let plan = Plan::<B, _>::from_args(joined, &checkpoints, out, device)?;
    // Every cell is found before anything is written: a missing one leaves no folder.
    let mut found_cells = Vec::with_capacity(plan.cells.len());
    for cell in &plan.cells {
        let mut found = None;
        for f in &folders {
            let Some((old, _)) = f.models.iter().find(|(_, new)| *new == cell.model) else {
                continue;
            };
            let as_recorded = super::Cell {
                model: old.clone(),
                ..cell.clone()
            };
            if let Some(result) = outputs::load_cell(&f.dir, &as_recorded, &f.identity)? {
                found = Some(result);
                break;
            }
        }
        let found = found.with_context(|| {
            format!(
                "no folder holds the finished cell {}: finish that sweep (or shard) first",
                cell.id()
            )
        })?;
        found_cells.push((found, cell));
    }
    let mut settings = plan.settings(joined);
    record_backends(&mut settings, &found_cells);
    let identity = super::record::identity(&settings);
    let results: Vec<CellResult> = found_cells
        .into_iter()
        .map(|(found, cell)| renamed(found, cell, &identity))
        .collect();
    let lock = crate::output_folder::claim(out, "robust")?;
    let every: Vec<&super::Cell> = plan.cells.iter().collect();
    claim_folder(out, &settings, &identity, &every, &lock)?;
    for result in &results {
        outputs::save_cell(out, result)?;
    }
    outputs::write_csvs(out, &results)?;
    finish(&plan, joined, &results, observer, 0).map(|_| ())
}

impl Folder {
    /// Reads `dir`'s settings and checks them against what this jem-bench computes for the
    /// same sweep with its models renamed: the same settings, and the same weights at the new
    /// paths.
    fn read<B: BenchBackend>(
        dir: &Path,
        renames: &[(String, String)],
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        let path = dir.join("settings.json");
        let saved = super::record::read_settings(dir)?
            .with_context(|| format!("{}: not a sweep folder (no settings.json)", dir.display()))?;
        let (spec, mut checkpoints) = super::record::parts(&saved["args"]).with_context(|| {
            format!(
                "{}: `args` is not a robust sweep's arguments",
                path.display()
            )
        })?;
        let recorded: Vec<String> = serde_json::from_value(saved["models"].clone())
            .with_context(|| format!("{}: `models` is not a list of names", path.display()))?;
        let rename = |m: &String| {
            renames
                .iter()
                .find(|(old, _)| old == m)
                .map_or_else(|| m.clone(), |(_, new)| new.clone())
        };
        let models: Vec<(String, String)> =
            recorded.iter().map(|m| (m.clone(), rename(m))).collect();
        let defaults = checkpoints.models.is_empty();
        checkpoints.models = models.iter().map(|(_, new)| PathBuf::from(new)).collect();
        let plan = Plan::<B, _>::from_args(&spec, &checkpoints, dir, device)
            .with_context(|| format!("{}: its models cannot be loaded", dir.display()))?;
        let now = plan.settings(&spec);
        let mut expected = saved.clone();
        expected["models"] = serde_json::to_value(&checkpoints.models)?;
        expected["args"]["models"] = serde_json::to_value(&checkpoints.models)?;
        // Whatever backend computed the folder: its rows say which.
        expected["backend"] = now["backend"].clone();
        if let Some(settings) = expected.as_object_mut() {
            settings.remove("backends");
        }
        let differences = settings_differences(&expected, &now);
        anyhow::ensure!(
            differences.is_empty(),
            "{} cannot be merged as recorded ({}): a checkpoint that changed since is swept \
             again, and a sweep of another jem-bench is rerun",
            dir.display(),
            differences.join("; ")
        );
        let mut shared = saved.clone();
        for key in ["models", "weights", "subjects", "backend", "backends"] {
            shared[key] = Value::Null;
        }
        shared["args"]["models"] = Value::Null;
        Ok(Self {
            dir: dir.to_path_buf(),
            identity: super::record::identity(&saved),
            models,
            shared,
            defaults,
            spec,
            checkpoints,
        })
    }
}

/// Where the merged rows were not all computed on the backend of `settings` (the one the merge
/// runs on), its `backend` becomes theirs, or `mixed` with `backends`: each model's, in the
/// order of its `models` (` + `-joined where its cells come from several).
fn record_backends(settings: &mut Value, cells: &[(CellResult, &super::Cell)]) {
    let mut per_model: Vec<(String, Vec<&str>)> = settings["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m.as_str()?.to_string(), Vec::new())))
        .collect();
    let mut all: Vec<&str> = Vec::new();
    for (result, cell) in cells {
        let slot = match per_model.iter().position(|(m, _)| *m == cell.model) {
            Some(slot) => slot,
            None => {
                per_model.push((cell.model.clone(), Vec::new()));
                per_model.len() - 1
            }
        };
        for row in &result.rows {
            for list in [&mut per_model[slot].1, &mut all] {
                if !list.contains(&row.backend.as_str()) {
                    list.push(&row.backend);
                }
            }
        }
    }
    match all.as_slice() {
        [] => {}
        [one] if settings["backend"] == *one => {}
        [one] => settings["backend"] = Value::from(*one),
        _ => {
            settings["backend"] = Value::from("mixed");
            let backends: Vec<Value> = per_model
                .iter()
                .map(|(_, b)| Value::from(b.join(" + ")))
                .collect();
            settings["backends"] = Value::from(backends);
        }
    }
}

/// `result` as the cell `cell` of the sweep `identity`: its model under its new name.
fn renamed(mut result: CellResult, cell: &super::Cell, identity: &str) -> CellResult {
    result.cell = cell.clone();
    result.identity = identity.to_string();
    for row in &mut result.rows {
        row.model = cell.model.clone();
    }
    for example in &mut result.examples {
        example.model = cell.model.clone();
    }
    result
}
