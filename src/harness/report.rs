//! What a sweep reports, computed from its tidy rows alone: the worst-case robustness curves and
//! sanity checks (`summary.json`), the robustness-curve plots (`curves.svg`, `curves.png`),
//! robust accuracy against K where the rows hold at least three K (`k-curve.csv`, `.svg`,
//! `.png`) and the terminal table. `jem-bench robust` and `merge` end here; `jem-bench report DIR…`
//! regenerates the same from a run's CSV, and can draw several runs (L∞ and L2) in one figure.

use std::path::{Path, PathBuf};

use anyhow::Context;
use jem_attacks::Norm;
use jem_datasets::DataSource;
use serde::Serialize;

use super::checks;
use super::outputs::read_tidy;
use super::robustness::{ALL_GRADS, WORST_CASE};
use super::rows::{GradColumn, TidyRow};
use super::spec::SweepObserver;
use crate::model::{write_atomic, SOFTWARE};
use crate::plot::{model_labels, Dash, Figure, Panel, Series, PALETTE};

/// Clean and worst-case robust accuracy of one model at one K, over the ε grid, with 95 %
/// Wilson intervals.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub model: String,
    pub k: usize,
    /// Gradient mode of the worst case: `none` (K = 0), `bpda`, `full`, or `all` when the
    /// sweep ran several.
    pub grad: GradColumn,
    /// Every point comes from BPDA gradients through K > 0 SGLD steps: an upper bound.
    pub upper_bound: bool,
    pub n: usize,
    pub clean_accuracy: f64,
    pub clean_interval: (f64, f64),
    /// Per ε: the per-example worst case over every attack.
    pub worst_case: Vec<CurvePoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CurvePoint {
    pub eps: f32,
    pub robust_accuracy: f64,
    pub interval: (f64, f64),
}

/// Distinct values in order of first appearance.
fn distinct<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

fn eps_grid(rows: &[&TidyRow]) -> Vec<f32> {
    let mut e = distinct(rows.iter().map(|r| r.eps));
    e.sort_by(f32::total_cmp);
    e
}

/// Lowest robust accuracy (with its interval) among `rows` that pass `keep`, per ε of the
/// grid (ε with no row are left out).
fn lowest(
    rows: &[&TidyRow],
    grid: &[f32],
    keep: impl Fn(&TidyRow) -> bool,
) -> Vec<(f32, f64, (f64, f64))> {
    grid.iter()
        .filter_map(|&e| {
            rows.iter()
                .filter(|r| r.eps == e && keep(r))
                .min_by(|a, b| a.robust_accuracy.total_cmp(&b.robust_accuracy))
                .map(|r| (e, r.robust_accuracy, (r.robust_lo, r.robust_hi)))
        })
        .collect()
}

/// The worst-case rows a model and K are summarised by: over every gradient mode (`all`) when
/// the sweep ran several, else its only one.
fn is_summary(r: &TidyRow, rows: &[TidyRow]) -> bool {
    r.attack == WORST_CASE
        && (r.grad == ALL_GRADS
            || !rows.iter().any(|o| {
                o.attack == WORST_CASE && o.model == r.model && o.k == r.k && o.grad == ALL_GRADS
            }))
}

/// One curve per model and K, from the worst-case rows; an error for rows without any (a CSV
/// written before jem-bench computed the per-example worst case: rerun its sweep).
pub fn curves(rows: &[TidyRow]) -> anyhow::Result<Vec<Curve>> {
    let summary: Vec<&TidyRow> = rows.iter().filter(|r| is_summary(r, rows)).collect();
    anyhow::ensure!(
        !summary.is_empty(),
        "the rows hold no `{WORST_CASE}` rows (robust.csv lost them, or was not written by \
         `jem-bench robust`); rerun the sweep's command to recompute them from its cells"
    );
    let grid = eps_grid(&summary);
    let mut curves = Vec::new();
    for m in distinct(summary.iter().map(|r| &r.model)) {
        for k in distinct(summary.iter().filter(|r| &r.model == m).map(|r| r.k)) {
            let mine: Vec<&TidyRow> = summary
                .iter()
                .copied()
                .filter(|r| &r.model == m && r.k == k)
                .collect();
            let first = mine[0];
            curves.push(Curve {
                model: m.clone(),
                k,
                grad: first.grad,
                upper_bound: mine.iter().all(|r| r.upper_bound),
                n: first.n,
                clean_accuracy: first.clean_accuracy,
                clean_interval: (first.clean_lo, first.clean_hi),
                worst_case: lowest(&mine, &grid, |_| true)
                    .into_iter()
                    .map(|(eps, robust_accuracy, interval)| CurvePoint {
                        eps,
                        robust_accuracy,
                        interval,
                    })
                    .collect(),
            });
        }
    }
    Ok(curves)
}

fn norm_title(norm: Norm) -> &'static str {
    match norm {
        Norm::Linf => "L∞",
        Norm::L2 => "L2",
    }
}

/// Robust accuracy (%) against ε: one row of panels per norm, the worst case over attacks
/// first and then each attack; one line per model (colour) × K (stroke).
pub fn figure(rows: &[TidyRow], title: &str) -> Figure {
    let models = distinct(rows.iter().map(|r| &r.model));
    let labels = model_labels(&models);
    let ks = distinct(rows.iter().map(|r| r.k));
    let attacks = distinct(
        rows.iter()
            .map(|r| r.attack.clone())
            .filter(|a| *a != WORST_CASE),
    );
    let norms = distinct(rows.iter().map(|r| r.norm));
    let mut panels = Vec::new();
    for norm in &norms {
        let of_norm: Vec<&TidyRow> = rows.iter().filter(|r| r.norm == *norm).collect();
        let grid = eps_grid(&of_norm);
        let x_hi = grid.last().copied().unwrap_or(1.0).max(f32::EPSILON) as f64;
        for attack in std::iter::once(None).chain(attacks.iter().map(Some)) {
            let mut series = Vec::new();
            for (mi, m) in models.iter().enumerate() {
                for (ki, &k) in ks.iter().enumerate() {
                    let points = lowest(&of_norm, &grid, |r| {
                        &&r.model == m
                            && r.k == k
                            && match attack {
                                None => is_summary(r, rows),
                                Some(a) => r.attack == *a,
                            }
                    });
                    if points.is_empty() {
                        continue;
                    }
                    series.push(Series {
                        label: format!("{}, K = {k}", labels[mi]),
                        color: PALETTE[mi % PALETTE.len()],
                        dash: Dash::ALL[ki % Dash::ALL.len()],
                        points: points
                            .iter()
                            .map(|&(e, a, _)| (e as f64, 100.0 * a))
                            .collect(),
                        intervals: points
                            .iter()
                            .map(|&(_, _, (lo, hi))| (100.0 * lo, 100.0 * hi))
                            .collect(),
                    });
                }
            }
            if series.is_empty() {
                continue;
            }
            let what = attack.map_or("worst case".to_string(), |a| a.to_string());
            panels.push(Panel {
                title: format!("{} {what}", norm_title(*norm)),
                x_label: format!("ε ({} norm, [0, 1] pixel units)", norm_title(*norm)),
                y_label: "robust accuracy (%)".into(),
                x_range: Some((0.0, x_hi)),
                y_range: Some((0.0, 100.0)),
                series,
                bars: Vec::new(),
            });
        }
    }
    Figure {
        title: title.to_string(),
        columns: attacks.len() + 1,
        panels,
    }
}

/// Robust accuracy against the number of SGLD steps K — how much test-time sampling buys — for
/// rows that hold at least [`K_CURVE_MIN`] distinct K: one panel per norm and ε > 0, one line
/// per model, each point the worst case over every attack and gradient mode of that model, K
/// and ε, with its 95 % interval. Also as CSV. `None` for fewer K.
pub fn against_k(rows: &[TidyRow], title: &str) -> anyhow::Result<Option<(Figure, String)>> {
    if distinct(rows.iter().map(|r| r.k)).len() < K_CURVE_MIN {
        return Ok(None);
    }
    let models = distinct(rows.iter().map(|r| &r.model));
    let labels = model_labels(&models);
    let mut csv =
        String::from("model,norm,eps,k,grad,n,robust_accuracy,robust_lo,robust_hi,upper_bound\n");
    let mut panels = Vec::new();
    for norm in distinct(rows.iter().map(|r| r.norm)) {
        let of_norm: Vec<TidyRow> = rows.iter().filter(|r| r.norm == norm).cloned().collect();
        let curves = curves(&of_norm)?;
        let grid = eps_grid(&of_norm.iter().collect::<Vec<_>>());
        for &eps in grid.iter().filter(|&&e| e > 0.0) {
            let mut series = Vec::new();
            for (mi, m) in models.iter().enumerate() {
                let mut points: Vec<(usize, &Curve, &CurvePoint)> = curves
                    .iter()
                    .filter(|c| &c.model == *m)
                    .filter_map(|c| {
                        c.worst_case
                            .iter()
                            .find(|p| p.eps == eps)
                            .map(|p| (c.k, c, p))
                    })
                    .collect();
                points.sort_by_key(|(k, ..)| *k);
                for (k, c, p) in &points {
                    csv += &format!(
                        "{},{norm},{eps},{k},{},{},{},{},{},{}\n",
                        c.model,
                        c.grad,
                        c.n,
                        p.robust_accuracy,
                        p.interval.0,
                        p.interval.1,
                        c.upper_bound
                    );
                }
                if points.is_empty() {
                    continue;
                }
                series.push(Series {
                    label: labels[mi].clone(),
                    color: PALETTE[mi % PALETTE.len()],
                    dash: Dash::Solid,
                    points: points
                        .iter()
                        .map(|(k, _, p)| (*k as f64, 100.0 * p.robust_accuracy))
                        .collect(),
                    intervals: points
                        .iter()
                        .map(|(_, _, p)| (100.0 * p.interval.0, 100.0 * p.interval.1))
                        .collect(),
                });
            }
            let largest = rows.iter().map(|r| r.k).max().unwrap_or(1).max(1);
            panels.push(Panel {
                title: format!("{} ε = {eps}, worst case", norm_title(norm)),
                x_label: "SGLD steps K".into(),
                y_label: "robust accuracy (%)".into(),
                x_range: Some((0.0, largest as f64)),
                y_range: Some((0.0, 100.0)),
                series,
                bars: Vec::new(),
            });
        }
    }
    let columns = panels.len().clamp(1, 3);
    Ok(Some((
        Figure {
            title: title.to_string(),
            columns,
            panels,
        },
        csv,
    )))
}

/// Distinct K from which a sweep's outputs include robust accuracy against K.
pub const K_CURVE_MIN: usize = 3;

/// Writes `k-curve.csv` and `k-curve.{svg,png}` into `dir` when the rows hold enough K.
fn write_against_k(dir: &Path, rows: &[TidyRow], title: &str) -> anyhow::Result<bool> {
    let Some((figure, csv)) = against_k(rows, title)? else {
        return Ok(false);
    };
    write_atomic(&dir.join("k-curve.csv"), csv.as_bytes())?;
    figure.write(&dir.join("k-curve"))?;
    Ok(true)
}

/// Number of classes of the data the rows were measured on (for the chance level).
fn classes(rows: &[TidyRow]) -> anyhow::Result<usize> {
    let mut classes = 0;
    for data in distinct(rows.iter().map(|r| r.data.as_str())) {
        let source = DataSource::parse(data)
            .with_context(|| format!("robust.csv: column `data` holds `{data}`, not a data set"))?;
        classes = classes.max(source.class_names().len());
    }
    Ok(classes)
}

/// Both estimates of every cell whose convergence check ran: the attack's, and the one with
/// the check's re-attacks of a sample of the survivors counted.
fn convergence_checks(rows: &[TidyRow]) -> Vec<serde_json::Value> {
    rows.iter()
        .filter(|r| r.check_sampled.is_some())
        .map(|r| {
            serde_json::json!({
                "model": r.model,
                "attack": r.attack,
                "k": r.k,
                "grad": r.grad,
                "eps": r.eps,
                "robust_accuracy": r.robust_accuracy,
                "interval": (r.robust_lo, r.robust_hi),
                "sampled_survivors": r.check_sampled,
                "broken_with_4x_eot": r.check_broken_eot,
                "broken_with_2x_iterations": r.check_broken_iterations,
                "broken": r.check_broken,
                "checked_robust_accuracy": r.checked_robust_accuracy(),
                "moved_below_interval": r.check_moved(),
            })
        })
        .collect()
}

/// Writes `summary.json` and `curves.{svg,png}` of one sweep into `dir` and returns the table.
/// `seconds`: the cells' run time, when known.
pub fn write(dir: &Path, rows: &[TidyRow], seconds: Option<f64>) -> anyhow::Result<String> {
    anyhow::ensure!(!rows.is_empty(), "{}: the sweep has no rows", dir.display());
    let curves = curves(rows)?;
    // The sweep's own attacks, as its settings record them (a merged report has none).
    let settings = super::record::read_settings(dir)?;
    let quick = settings
        .as_ref()
        .is_some_and(|s| s["args"]["quick"] == true);
    let own = settings.map_or_else(Vec::new, |s| super::own_attack::recorded(&s));
    let checks = checks::run(rows, classes(rows)?, &own);
    let first = &rows[0];
    let summary = serde_json::json!({
        "software": SOFTWARE,
        "norm": first.norm,
        "units": "ε and distances in [0, 1] pixel units; L2 is the Euclidean norm (not foolbox 1.x's RMS)",
        "robust_accuracy": "per example: robust at ε only if no attack broke it within ε (breaks carry to larger ε); intervals are 95 % Wilson score intervals",
        "n_examples": first.n,
        "seed": first.seed,
        "data": first.data,
        "curves": &curves,
        "convergence_checks": convergence_checks(rows),
        "sanity_checks": &checks,
        "seconds": seconds,
    });
    write_atomic(
        &dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    let title = format!(
        "{} robustness, {} ({} test images, seed {}; bars: 95 % CI)",
        norm_title(first.norm),
        first.data,
        first.n,
        first.seed
    );
    figure(rows, &title).write(&dir.join("curves"))?;
    write_against_k(dir, rows, &format!("robust accuracy against K, {}", title))?;

    let grid = eps_grid(&rows.iter().collect::<Vec<_>>());
    let mut t = format!(
        "robust accuracy, per-example worst case over attacks ({}; ε in [0, 1] pixel units; \
         n = {}; [95 % Wilson interval])\n",
        first.norm, first.n
    );
    let cell = |a: f64, (lo, hi): (f64, f64)| {
        format!("{:.1} [{:.0}–{:.0}]", 100.0 * a, 100.0 * lo, 100.0 * hi)
    };
    t += &format!("{:<28} {:>3} {:>5} {:>16}", "model", "K", "grad", "clean");
    for e in &grid {
        t += &format!(" {:>16}", format!("ε={e}"));
    }
    t += "\n";
    // BPDA rows at K > 0 are upper bounds: marked in the table as in robust.csv.
    for c in &curves {
        let grad = if c.upper_bound {
            format!("{}*", c.grad)
        } else {
            c.grad.to_string()
        };
        t += &format!(
            "{:<28} {:>3} {:>5} {:>16}",
            c.model,
            c.k,
            grad,
            cell(c.clean_accuracy, c.clean_interval)
        );
        for &e in &grid {
            match c.worst_case.iter().find(|p| p.eps == e) {
                Some(p) => {
                    let moved = rows
                        .iter()
                        .any(|r| r.model == c.model && r.k == c.k && r.eps == e && r.check_moved());
                    let mark = if moved { "†" } else { "" };
                    t += &format!(" {:>16}", cell(p.robust_accuracy, p.interval) + mark)
                }
                None => t += &format!(" {:>16}", "-"),
            }
        }
        t += "\n";
    }
    if rows.iter().any(TidyRow::check_moved) {
        t += "† the convergence check (survivors attacked again with 4× EOT, 2× iterations) fell \
              below this estimate's interval: the attack had not converged (summary.json: \
              convergence_checks)\n";
    }
    if quick {
        t += "* a quick look (--quick): 20 images, APGD-CE alone with 20 iterations, no \
              convergence check; every robust accuracy is an upper bound, which the full \
              evaluation may lower (robust.csv: upper_bound)\n";
    } else if curves.iter().any(|c| c.upper_bound) {
        t +=
            "* BPDA through the SGLD steps: an upper bound on robust accuracy; an adaptive attack \
              (--grad full with --eot) may find more (robust.csv: upper_bound)\n";
    }
    for c in &checks {
        t += &format!("[{}] {}: {}\n", c.status, c.name, c.detail);
    }
    Ok(t)
}

/// Seconds the finished cells of a sweep folder took, when its cell files are there.
fn cell_seconds(dir: &Path) -> Option<f64> {
    let cells = std::fs::read_dir(dir.join("cells")).ok()?;
    let mut total = 0.0;
    // Only the cell files: an unfinished cell's kept batches are a folder beside them.
    let files = cells.flatten().filter(|e| {
        e.file_name()
            .to_string_lossy()
            .ends_with(super::outputs::CELL_FILE_SUFFIX)
    });
    for entry in files {
        total += super::outputs::read_cell_file(&entry.path()).ok()?.seconds;
    }
    Some(total)
}

/// The cells a sweep folder's `settings.json` plans that have no finished cell file (for a
/// shard's folder, the other shards' cells too); `None` where the folder records no sweep
/// settings (a `robust.csv` alone).
fn unfinished_cells(dir: &Path) -> anyhow::Result<Option<(Vec<super::Cell>, usize)>> {
    let path = dir.join("settings.json");
    let Some(settings) = super::record::read_settings(dir)? else {
        return Ok(None);
    };
    let (spec, _) = super::record::parts(&settings["args"])
        .with_context(|| format!("{}: `args` is not a sweep's settings", path.display()))?;
    let models: Vec<String> = serde_json::from_value(settings["models"].clone())
        .with_context(|| format!("{}: `models` is not a list of models", path.display()))?;
    let own = super::own_attack::recorded(&settings);
    let planned = super::cells::list(&models, &spec.attack_list(), &own, &spec.ks, &spec.grad);
    let total = planned.len();
    let missing = planned
        .into_iter()
        .filter(|cell| !super::outputs::cell_path(dir, cell).exists())
        .collect();
    Ok(Some((missing, total)))
}

/// `jem-bench report`: regenerates the summary, table and plots of the finished sweeps `runs`
/// from their `robust.csv`; with `out`, also draws all of them into one figure there
/// (curves.svg, .png) and, where they hold at least 3 values of K, robust accuracy against K
/// (k-curve.csv, .svg, .png). A sweep whose settings plan cells it has not finished (killed,
/// still running, or one shard of several) is refused, naming them, unless `partial` asks to
/// draw what is there; then the table says what is missing.
pub fn report(
    runs: &[PathBuf],
    out: Option<&Path>,
    partial: bool,
    observer: &dyn SweepObserver,
) -> anyhow::Result<()> {
    anyhow::ensure!(!runs.is_empty(), "no sweep folders to report");
    // Every folder is checked before anything is drawn.
    let mut unfinished = Vec::new();
    for dir in runs {
        let missing = unfinished_cells(dir)?;
        if let Some((missing, total)) = &missing {
            let names: Vec<String> = missing
                .iter()
                .map(|c| {
                    let grad = c.grad.map_or(String::new(), |g| format!(" grad={g}"));
                    format!("{} {} K={}{grad}", c.model, c.attack.name(), c.k)
                })
                .collect();
            anyhow::ensure!(
                partial || names.is_empty(),
                "{}: {} of its {total} cells are not finished ({}); run the sweep's command again \
                 to finish it (or merge its shards), or pass --partial to draw the finished ones",
                dir.display(),
                names.len(),
                names.join(", ")
            );
            unfinished.push((names, *total));
        } else {
            unfinished.push((Vec::new(), 0));
        }
    }
    let mut all = Vec::new();
    for (dir, (missing, total)) in runs.iter().zip(&unfinished) {
        let rows = read_tidy(&dir.join("robust.csv"))?;
        observer.says(&write(dir, &rows, cell_seconds(dir))?);
        if !missing.is_empty() {
            observer.says(&format!(
                "partial: {} of {total} cells not finished, not drawn: {}",
                missing.len(),
                missing.join(", ")
            ));
        }
        observer.says(&format!("wrote {}", dir.display()));
        all.extend(rows);
    }
    if let Some(out) = out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let first = &all[0];
        let title = format!(
            "robustness, {} ({} test images, seed {}; bars: 95 % CI)",
            first.data, first.n, first.seed
        );
        figure(&all, &title).write(&out.join("curves"))?;
        observer.says(&format!("wrote {}", out.join("curves.{svg,png}").display()));
        if write_against_k(out, &all, &format!("robust accuracy against K, {title}"))? {
            observer.says(&format!(
                "wrote {}",
                out.join("k-curve.{csv,svg,png}").display()
            ));
        }
    }
    Ok(())
}
