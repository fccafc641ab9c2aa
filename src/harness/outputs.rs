//! What a sweep writes. Each finished cell is one gzip-compressed JSON file under `cells/`,
//! written atomically: a killed sweep loses at most the cell in progress — at most its batch in
//! progress when it runs in several `--batch-size` batches, each kept under `cells/<id>.batches/`
//! (`kept_parts`) until the cell is done — and no row can be written twice. The tidy and
//! per-example CSVs are rebuilt from the cell files after every cell.

use std::path::Path;

use anyhow::Context;

use super::cells::Cell;
use super::rows::{row_key, CellResult, TidyRow};
use super::spec::SweepEstimate;
use crate::model::write_atomic;

/// How a finished cell's file name ends: its JSON, gzip-compressed (the example records that
/// make up most of it compress about 20×, and the tree keeps every committed sweep's cells).
pub const CELL_FILE_SUFFIX: &str = ".json.gz";

/// The file of `cell`'s result in the sweep folder `out`.
pub fn cell_path(out: &Path, cell: &Cell) -> std::path::PathBuf {
    out.join("cells")
        .join(format!("{}{CELL_FILE_SUFFIX}", cell.id()))
}

/// Writes a finished cell's file (atomically: a killed run leaves the old file or the new one).
pub fn save_cell(out: &Path, result: &CellResult) -> anyhow::Result<()> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(serde_json::to_string(result)?.as_bytes())?;
    write_atomic(&cell_path(out, &result.cell), &gz.finish()?)
}

/// Writes what this run of a sweep is estimated to take, `estimate.json`: the whole sweep's
/// expected seconds and bound on its workers, and per cell to run (`cells`, in the order they
/// start) the whole cell's seconds and most seconds with the machine to itself, what they are
/// made of (gradients per example, expected and at most, of the attack and of the convergence
/// check, and the seconds one takes alone), how much more its kind gets done side by side, the
/// share of it an earlier, interrupted run kept, and the expected seconds of the rest beside
/// the cells it runs with — to set against the time it takes. Each run that starts cells
/// writes it anew: a resumed sweep's estimate counts only what is left, cells and parts.
pub fn write_estimate(out: &Path, estimate: &SweepEstimate, cells: &[&Cell]) -> anyhow::Result<()> {
    let durations = estimate.durations_left();
    let per_cell: Vec<serde_json::Value> = cells
        .iter()
        .enumerate()
        .map(|(i, cell)| {
            let mut record = serde_json::json!({
                "cell": cell.id(),
                "model": cell.model,
                "attack": cell.attack.name(),
                "k": cell.k,
                "seconds_alone": estimate.cells[i],
                "bound_alone": estimate.bounds[i],
                "speedup_side_by_side": estimate.speedups[i],
                "kept_by_an_earlier_run": estimate.kept_share(i),
                "expected_seconds": durations[i],
            });
            if let Some(count) = estimate.counts.get(i) {
                let gradients = |g: super::estimate::Gradients| {
                    serde_json::json!({
                        "attack": g.attack,
                        "attack_batch_share": g.attack_rows,
                        "convergence_check": g.check,
                    })
                };
                record["gradients_per_example"] = gradients(count.expected);
                record["most_gradients_per_example"] = gradients(count.most);
                record["seconds_per_gradient"] = serde_json::json!({
                    "attack": count.seconds_per_gradient,
                    "convergence_check": count.seconds_per_check_gradient,
                });
            }
            record
        })
        .collect();
    let record = serde_json::json!({
        "jobs": estimate.jobs,
        "expected_seconds": estimate.expected(),
        "bound_seconds": estimate.bound(),
        "cells": per_cell,
    });
    write_atomic(
        &out.join("estimate.json"),
        serde_json::to_string_pretty(&record)?.as_bytes(),
    )
}

/// A finished cell's file, decompressed and parsed (not yet checked against its sweep: see
/// [`load_cell`]); errors name the file.
pub fn read_cell_file(p: &Path) -> anyhow::Result<CellResult> {
    use std::io::Read;
    let bytes = std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_string(&mut text)
        .with_context(|| {
            format!(
                "{}: not a gzip-compressed cell file (delete it to run the cell again)",
                p.display()
            )
        })?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a finished sweep cell (delete it to run the cell again)",
            p.display()
        )
    })
}

/// The finished result of `cell`, if a previous run of the sweep `identity` wrote it; an error
/// if another sweep (other models, weights, data or settings) wrote it.
pub fn load_cell(out: &Path, cell: &Cell, identity: &str) -> anyhow::Result<Option<CellResult>> {
    let p = cell_path(out, cell);
    if !p.exists() {
        return Ok(None);
    }
    let r = read_cell_file(&p)?;
    anyhow::ensure!(
        &r.cell == cell,
        "{}: holds another cell ({}, where this sweep's file of that name is {})",
        p.display(),
        r.cell.id(),
        cell.id()
    );
    anyhow::ensure!(
        r.identity == identity,
        "{} was computed by another sweep (other models, weights, model configuration, data, \
         attack or defence settings, or seed: identity `{}`, this sweep's `{identity}`); delete \
         the folder or use another --out",
        p.display(),
        r.identity
    );
    super::robustness::check_cell(&r).map_err(|why| {
        anyhow::anyhow!(
            "{}: {why} (delete the file to run the cell again)",
            p.display()
        )
    })?;
    Ok(Some(r))
}

/// Writes `robust.csv` (per-attack rows with breaks carried across ε, then the per-example
/// worst-case rows; see [`super::robustness`]) and `examples.csv` from the finished cells, in
/// sweep order. Returns the tidy rows.
pub fn write_csvs<'a>(
    out: &Path,
    results: impl IntoIterator<Item = &'a CellResult>,
) -> anyhow::Result<Vec<TidyRow>> {
    let results: Vec<&CellResult> = results.into_iter().collect();
    let rows = super::robustness::tidy_rows(&results)?;
    let mut tidy = csv::Writer::from_writer(Vec::new());
    let mut per_example = csv::Writer::from_writer(Vec::new());
    for row in &rows {
        tidy.serialize(row)?;
    }
    for r in &results {
        for row in &r.examples {
            per_example.serialize(row)?;
        }
    }
    write_atomic(&out.join("robust.csv"), &tidy.into_inner()?)?;
    write_atomic(&out.join("examples.csv"), &per_example.into_inner()?)?;
    Ok(rows)
}

/// Reads a tidy CSV back (for `regress`, `report` and the tests), each row checked
/// ([`TidyRow::check`]) and its key found once: an error names the file and row refused.
pub fn read_tidy(path: &Path) -> anyhow::Result<Vec<TidyRow>> {
    let mut r =
        csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut seen = std::collections::HashMap::new();
    r.deserialize()
        .enumerate()
        .map(|(i, row)| {
            let line = i + 2;
            let mut row: TidyRow = row.with_context(|| {
                format!("{}: row {line} does not fit the schema", path.display())
            })?;
            row.check()
                .map_err(|why| anyhow::anyhow!("{}: row {line}: {why}", path.display()))?;
            if let Some(first) = seen.insert(row_key(&row), line) {
                anyhow::bail!(
                    "{}: rows {first} and {line} are both of {} {} {} ε={} K={} grad={}",
                    path.display(),
                    row.model,
                    row.attack,
                    row.norm,
                    row.eps,
                    row.k,
                    row.grad
                );
            }
            // A BPDA row at K > 0 is an upper bound whatever the file says.
            row.upper_bound |= row.is_bpda_bound();
            Ok(row)
        })
        .collect()
}
