//! `jem-bench merge`: the folders of a sharded sweep joined into one, as if it had run whole.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::outputs;
use super::plan::{claim_folder, Plan};
use super::progress::TerminalProgress;
use super::spec::SweepSpec;
use super::sweep::finish;
use crate::backend::BenchBackend;
use crate::output_folder::FolderLock;

/// Joins the folders `shards` of a sharded sweep into `out`, as if it had run whole; their
/// models are loaded onto `device` to check their weights.
pub fn merge<B: BenchBackend>(
    shards: &[PathBuf],
    out: &Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    anyhow::ensure!(!shards.is_empty(), "no shard folders to merge");
    let read = |dir: &PathBuf| -> anyhow::Result<serde_json::Value> {
        let p = dir.join("settings.json");
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("{}: not a sweep folder (no settings.json)", dir.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: unreadable", p.display()))
    };
    let settings = read(&shards[0])?;
    for dir in &shards[1..] {
        anyhow::ensure!(
            read(dir)? == settings,
            "{} ran another sweep than {} (settings.json differ); only shards of one sweep merge",
            dir.display(),
            shards[0].display()
        );
    }
    let spec: SweepSpec = serde_json::from_value(settings["args"].clone())
        .context("settings.json: `args` is not a robust sweep's arguments")?;
    let plan = Plan::<B, _>::from_args(&spec, out, device)?;
    anyhow::ensure!(
        plan.settings(&spec) == settings,
        "the shards were made by another jem-bench or from other models; rerun them"
    );
    crate::output_folder::claim(out, "robust")?;
    let lock = FolderLock::acquire(out, "sweep.lock")?;
    claim_folder(out, &settings, &plan.identity(&spec), &[], &lock)?;
    let identity = plan.identity(&spec);
    let mut results = Vec::with_capacity(plan.cells.len());
    for cell in &plan.cells {
        let found = shards
            .iter()
            .map(|dir| outputs::load_cell(dir, cell, &identity))
            .collect::<anyhow::Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .next()
            .with_context(|| {
                format!(
                    "no shard holds the finished cell {}: finish that shard first",
                    cell.id()
                )
            })?;
        outputs::save_cell(out, &found)?;
        results.push(found);
    }
    outputs::write_csvs(out, &results)?;
    finish(&plan, &results, &TerminalProgress::default(), 0).map(|_| ())
}
