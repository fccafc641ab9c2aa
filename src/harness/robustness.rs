//! Robust accuracy as AutoAttack and RobustBench define it, computed from a sweep's per-example
//! outcomes rather than from per-attack totals:
//!
//! - **Breaks carry across ε.** An adversarial found within ε is one within every larger ε of
//!   the same norm, so an example broken by an attack at ε counts as broken at every larger ε of
//!   that attack's row too: each curve is non-increasing by construction.
//! - **Worst case per example.** An example is robust at ε only if no attack broke it there (and
//!   every attack's clean pass classified it correctly). The minimum of per-attack accuracies
//!   is not the worst case: two attacks can break different examples.
//! - **Intervals.** Every accuracy comes with its 95 % Wilson score interval (n = 20 gives about
//!   ±20 points at 50 %).
//!
//! `robust.csv` is derived here from the finished cells; the cells themselves keep what each
//! attack found on its own.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use jem_attacks::Norm;

use super::rows::{CellResult, ExampleRow, GradColumn, RowAttack, TidyRow};

/// The `attack` of the rows that hold the per-example worst case over attacks.
pub const WORST_CASE: RowAttack = RowAttack::WorstCase;

/// The `grad` of a worst-case row over every gradient mode of a model and K.
pub const ALL_GRADS: GradColumn = GradColumn::All;

/// 95 % Wilson score interval of a proportion `successes / n` (Wilson 1927): unlike the
/// normal approximation it stays inside [0, 1] and is not degenerate at 0 or n.
pub fn wilson(successes: usize, n: usize) -> (f64, f64) {
    assert!(n > 0 && successes <= n, "wilson({successes}, {n})");
    const Z: f64 = 1.959_963_984_540_054;
    let (n, p) = (n as f64, successes as f64 / n as f64);
    let z2 = Z * Z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // At 0 and n the bound is exactly 0 (or 1); rounding would put it a hair inside.
    let lo = if successes == 0 {
        0.0
    } else {
        (centre - half).max(0.0)
    };
    let hi = if successes as f64 == n {
        1.0
    } else {
        (centre + half).min(1.0)
    };
    (lo, hi)
}

/// One attack's cells for one model, K and gradient mode: its per-example outcomes at each of
/// its ε (one cell per ε), or at every ε at once (a minimum-perturbation attack).
struct AttackRun<'a> {
    /// (the ε a run was made at, or `None` for a minimum-perturbation attack; its examples).
    cells: Vec<(Option<f32>, Vec<&'a ExampleRow>)>,
}

impl AttackRun<'_> {
    /// Per example (by test-set index): robust at `eps` for this attack, with breaks at smaller
    /// ε carried; `None` when no cell of this attack says anything at `eps` (all its fixed ε are
    /// larger).
    fn robust_at(&self, norm: Norm, eps: f32) -> Option<BTreeMap<usize, bool>> {
        let mut robust: Option<BTreeMap<usize, bool>> = None;
        for (cell_eps, examples) in &self.cells {
            let applies = cell_eps.is_none_or(|e| e <= eps);
            if !applies {
                continue;
            }
            let map = robust.get_or_insert_with(BTreeMap::new);
            for ex in examples.iter() {
                let ok = ex.outcome().robust_under(*cell_eps, norm, eps);
                *map.entry(ex.example).or_insert(true) &= ok;
            }
        }
        robust
    }
}

/// Accuracy, its interval, and the count behind it.
fn rate(flags: impl Iterator<Item = bool>) -> (f64, (f64, f64), usize) {
    let (mut k, mut n) = (0, 0);
    for f in flags {
        n += 1;
        k += usize::from(f);
    }
    (k as f64 / n as f64, wilson(k, n), n)
}

/// Sets the counts, accuracies and intervals of a cell's own rows from its per-example
/// outcomes, by the computation that makes `robust.csv` (breaks carried across ε): what a
/// cell file says and what the sweep's table says come from one place.
pub fn with_own_rates(mut result: CellResult) -> anyhow::Result<CellResult> {
    let rows = {
        let cell = [&result];
        per_attack_rows(&cell, &Runs::collect(&cell)?)?
    };
    result.rows = rows;
    Ok(result)
}

/// What a cell file read back must be before it is used: its examples and rows all of its
/// cell, its examples' distances sizes, every row valid ([`TidyRow::check`]), one row per key,
/// and each row's counts, accuracies and intervals those its examples give (recomputed). The
/// reason, where it is not.
pub fn check_cell(result: &CellResult) -> Result<(), String> {
    let cell = &result.cell;
    let grad = GradColumn::of(cell.grad);
    let mine =
        |model: &str, k: usize, g: GradColumn| model == cell.model && k == cell.k && g == grad;
    for (i, e) in result.examples.iter().enumerate() {
        if !mine(&e.model, e.k, e.grad) {
            return Err(format!(
                "example record {i} is of {} K={} grad={}, not of the cell",
                e.model, e.k, e.grad
            ));
        }
        let sizes = [e.l0, e.l2, e.linf];
        if sizes.iter().any(|d| d.is_nan() || *d < 0.0) || e.eps.is_some_and(|x| !(x >= 0.0)) {
            let eps = e.eps.map_or("none".to_string(), |x| x.to_string());
            return Err(format!(
                "example record {i} has a negative or NaN size (ε {eps}, L0 {}, L2 {}, L∞ {})",
                e.l0, e.l2, e.linf
            ));
        }
    }
    let mut keys = BTreeSet::new();
    for row in &result.rows {
        let what = format!("row {} ε={}", row.attack, row.eps);
        if !mine(&row.model, row.k, row.grad) {
            return Err(format!(
                "{what} is of {} K={}, not of the cell",
                row.model, row.k
            ));
        }
        row.check().map_err(|why| format!("{what}: {why}"))?;
        if !keys.insert((row.attack.clone(), row.eps.to_bits())) {
            return Err(format!("{what} is there twice"));
        }
        let has_examples = result
            .examples
            .iter()
            .any(|e| e.attack == row.attack && e.eps.is_none_or(|x| x == row.eps));
        if !has_examples {
            return Err(format!("{what} has no example records"));
        }
    }
    let recomputed = with_own_rates(result.clone()).map_err(|e| e.to_string())?;
    for (kept, own) in result.rows.iter().zip(&recomputed.rows) {
        let same = kept.n == own.n
            && [
                (kept.clean_accuracy, own.clean_accuracy),
                (kept.robust_accuracy, own.robust_accuracy),
                (kept.clean_lo, own.clean_lo),
                (kept.clean_hi, own.clean_hi),
                (kept.robust_lo, own.robust_lo),
                (kept.robust_hi, own.robust_hi),
            ]
            .iter()
            .all(|(a, b)| (a - b).abs() <= 1e-12);
        if !same {
            return Err(format!(
                "row {} ε={} says {} of n = {}, where its example records give {} of n = {}",
                kept.attack, kept.eps, kept.robust_accuracy, kept.n, own.robust_accuracy, own.n
            ));
        }
    }
    Ok(())
}

/// `robust.csv` of the finished cells: each cell's rows with breaks carried from its attack's
/// smaller ε and Wilson intervals, then per model × K × gradient mode the worst-case rows.
pub fn tidy_rows(results: &[&CellResult]) -> anyhow::Result<Vec<TidyRow>> {
    let runs = Runs::collect(results)?;
    let mut out = per_attack_rows(results, &runs)?;
    out.extend(worst_case_rows(results, &runs)?);
    for row in &mut out {
        row.upper_bound |= row.is_bpda_bound();
    }
    Ok(out)
}

/// Model, K, gradient mode and attack: the cells of one attack run.
type Group = (String, usize, GradColumn, RowAttack);

/// The finished cells' examples grouped into attack runs, in sweep order.
struct Runs<'a> {
    order: Vec<Group>,
    runs: BTreeMap<Group, AttackRun<'a>>,
    /// Each run's first row, whose settings its worst-case rows copy.
    templates: BTreeMap<Group, &'a TidyRow>,
}

impl<'a> Runs<'a> {
    fn collect(results: &[&'a CellResult]) -> anyhow::Result<Self> {
        let mut order: Vec<Group> = Vec::new();
        let mut runs: BTreeMap<Group, AttackRun> = BTreeMap::new();
        let mut templates: BTreeMap<Group, &TidyRow> = BTreeMap::new();
        for r in results {
            // A cell's examples come attack by attack (several for a preset's cascade), and
            // within an attack ε by ε (once for a minimum-perturbation attack).
            for e in &r.examples {
                let g = (e.model.clone(), e.k, e.grad, e.attack.clone());
                if !runs.contains_key(&g) {
                    let template = r
                        .rows
                        .iter()
                        .find(|row| row.attack == e.attack)
                        .with_context(|| {
                            format!("cell of {} K={}: no row for {}", e.model, e.k, e.attack)
                        })?;
                    order.push(g.clone());
                    templates.insert(g.clone(), template);
                }
                let run = runs.entry(g).or_insert(AttackRun { cells: Vec::new() });
                match run.cells.last_mut() {
                    Some((eps, rows)) if eps.map(f32::to_bits) == e.eps.map(f32::to_bits) => {
                        rows.push(e)
                    }
                    _ => run.cells.push((e.eps, vec![e])),
                }
            }
        }
        Ok(Runs {
            order,
            runs,
            templates,
        })
    }
}

/// Every cell's own rows, with breaks carried from its attack's smaller ε.
fn per_attack_rows(results: &[&CellResult], runs: &Runs) -> anyhow::Result<Vec<TidyRow>> {
    let mut out = Vec::new();
    for r in results {
        for row in &r.rows {
            let g = (row.model.clone(), row.k, row.grad, row.attack.clone());
            let norm = row.norm;
            let robust = runs.runs[&g]
                .robust_at(norm, row.eps)
                .expect("a cell's own ε applies to it");
            let clean = r
                .examples
                .iter()
                .filter(|e| e.attack == row.attack && e.eps.is_none_or(|x| x == row.eps))
                .map(|e| e.clean_correct);
            out.push(with_rates(row.clone(), clean, robust.into_values()));
        }
    }
    Ok(out)
}

/// Worst-case rows per model × K × gradient mode (gradient-free attacks join every mode, and
/// a model with several modes gets a row over all of them), at every ε of the model's rows.
fn worst_case_rows(results: &[&CellResult], runs: &Runs) -> anyhow::Result<Vec<TidyRow>> {
    let mut out = Vec::new();
    let mut models_ks: Vec<(String, usize)> = Vec::new();
    for (m, k, _, _) in &runs.order {
        if !models_ks.contains(&(m.clone(), *k)) {
            models_ks.push((m.clone(), *k));
        }
    }
    for (m, k) in models_ks {
        let mine: Vec<&Group> = runs.order.iter().filter(|g| g.0 == m && g.1 == k).collect();
        let modes: BTreeSet<GradColumn> = mine
            .iter()
            .map(|g| g.2)
            .filter(|g| *g != GradColumn::None)
            .collect();
        let mut grads: Vec<GradColumn> = if modes.is_empty() {
            vec![GradColumn::None]
        } else {
            modes.iter().copied().collect()
        };
        if modes.len() > 1 {
            grads.push(ALL_GRADS);
        }
        let eps_grid: BTreeSet<u32> = results
            .iter()
            .flat_map(|r| r.rows.iter())
            .filter(|r| r.model == m && r.k == k)
            .map(|r| r.eps.to_bits())
            .collect();
        let mut eps_grid: Vec<f32> = eps_grid.into_iter().map(f32::from_bits).collect();
        eps_grid.sort_by(f32::total_cmp);
        for grad in grads {
            let members: Vec<&Group> = mine
                .iter()
                .copied()
                .filter(|g| grad == ALL_GRADS || g.2 == grad || g.2 == GradColumn::None)
                .collect();
            out.extend(worst_case_over(runs, &members, grad, &eps_grid)?);
        }
    }
    Ok(out)
}

/// The worst case over the attack runs `members` (of one model and K) at each ε of
/// `eps_grid`, as rows of gradient mode `grad`.
fn worst_case_over(
    runs: &Runs,
    members: &[&Group],
    grad: GradColumn,
    eps_grid: &[f32],
) -> anyhow::Result<Vec<TidyRow>> {
    let template = runs.templates[members[0]];
    let norm = template.norm;
    let names: Vec<String> = members
        .iter()
        .map(|g| {
            if g.2 == GradColumn::None {
                g.3.to_string()
            } else {
                format!("{} ({})", g.3, g.2)
            }
        })
        .collect();
    // Clean: correct in every attack's clean pass.
    let mut clean: BTreeMap<usize, bool> = BTreeMap::new();
    for g in members {
        for (_, examples) in &runs.runs[*g].cells {
            for e in examples.iter() {
                *clean.entry(e.example).or_insert(true) &= e.clean_correct;
            }
        }
    }
    let mut out = Vec::new();
    for &eps in eps_grid {
        let mut robust: BTreeMap<usize, bool> = clean.clone();
        for g in members {
            if let Some(flags) = runs.runs[*g].robust_at(norm, eps) {
                for (i, ok) in flags {
                    *robust.entry(i).or_insert(true) &= ok;
                }
            }
        }
        let row = TidyRow {
            attack: WORST_CASE,
            eps,
            grad,
            eot: 0,
            restarts: 0,
            attack_settings: serde_json::json!({ "worst_case_over": names }).to_string(),
            // The cells' convergence checks stay on their own rows.
            check_sampled: None,
            check_broken_eot: None,
            check_broken_iterations: None,
            check_broken: None,
            ..template.clone()
        };
        out.push(with_rates(
            row,
            clean.values().copied(),
            robust.into_values(),
        ));
    }
    Ok(out)
}

fn with_rates(
    mut row: TidyRow,
    clean: impl Iterator<Item = bool>,
    robust: impl Iterator<Item = bool>,
) -> TidyRow {
    let (c, (c_lo, c_hi), n) = rate(clean);
    let (r, (r_lo, r_hi), _) = rate(robust);
    row.n = n;
    (row.clean_accuracy, row.clean_lo, row.clean_hi) = (c, c_lo, c_hi);
    (row.robust_accuracy, row.robust_lo, row.robust_hi) = (r, r_lo, r_hi);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimum-perturbation attack answers every ε by its distances (no committed cell has
    /// one): at ε an example stands when it was classified correctly and its closest
    /// adversarial, if any, lies beyond ε.
    #[test]
    fn a_minimum_perturbation_cell_counts_by_distance() {
        use crate::harness::cells::{AttackKind, Cell};
        // (clean correct, adversarial, L∞ distance)
        let outcomes = [
            (true, true, 0.05),
            (true, true, 0.15),
            (true, true, 0.25),
            (true, false, 0.0),
            (false, false, 0.0),
        ];
        let examples: Vec<ExampleRow> = outcomes
            .iter()
            .enumerate()
            .map(|(i, &(clean_correct, adversarial, linf))| ExampleRow {
                model: "m".into(),
                attack: RowAttack::Attack(AttackKind::Boundary),
                norm: Norm::Linf,
                eps: None,
                k: 0,
                grad: GradColumn::None,
                example: i,
                label: 0,
                clean_correct,
                adversarial,
                l0: 1.0,
                l2: linf,
                linf,
                gradient_evals: 0,
                forward_evals: 1,
            })
            .collect();
        let template = committed_cell();
        let rows = [0.1f32, 0.2, 0.3, 0.25]
            .map(|eps| TidyRow {
                model: "m".into(),
                attack: RowAttack::Attack(AttackKind::Boundary),
                eps,
                k: 0,
                grad: GradColumn::None,
                ..template.rows[0].clone()
            })
            .to_vec();
        let cell = CellResult {
            cell: Cell {
                model: "m".into(),
                attack: crate::harness::CellAttack::Kind(AttackKind::Boundary),
                k: 0,
                grad: None,
            },
            identity: String::new(),
            seconds: 0.0,
            rows,
            examples,
        };
        let rated = with_own_rates(cell).expect("rates");
        let robust: Vec<(usize, f64)> = rated
            .rows
            .iter()
            .map(|r| (r.n, r.robust_accuracy))
            .collect();
        // ε 0.1: the 0.15, 0.25 and unbroken examples; 0.2: 0.25 and unbroken; 0.3 and 0.25
        // (a distance equal to ε breaks): the unbroken one.
        assert_eq!(robust, [(5, 0.6), (5, 0.4), (5, 0.2), (5, 0.2)]);
        assert!(rated.rows.iter().all(|r| r.clean_accuracy == 0.8));
    }

    /// Every committed cell file (reference and sweeps: fixed-ε attacks, cascades, minimum-
    /// perturbation attacks, EOT, K up to 10) was written with counts computed on their own;
    /// recomputed from its examples by `with_own_rates`, the one computation now, they must be
    /// the same.
    #[test]
    fn committed_cells_counts_are_what_their_examples_give() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        let mut files = Vec::new();
        for group in ["reference", "sweeps"] {
            for sweep in std::fs::read_dir(root.join(group)).expect("results folder") {
                let cells = sweep.expect("entry").path().join("cells");
                if let Ok(entries) = std::fs::read_dir(&cells) {
                    files.extend(entries.map(|e| e.expect("entry").path()).filter(|p| {
                        let name = p.file_name().unwrap().to_string_lossy();
                        name.ends_with(crate::harness::outputs::CELL_FILE_SUFFIX)
                    }));
                }
            }
        }
        assert!(files.len() >= 20, "only {} cell files found", files.len());
        let mut rows = 0;
        for file in files {
            let stored = crate::harness::outputs::read_cell_file(&file).expect("a cell file");
            // Each file is named for its cell and passes the check a sweep reads it with.
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(name, format!("{}.json.gz", stored.cell.id()));
            check_cell(&stored).unwrap_or_else(|why| panic!("{}: {why}", file.display()));
            let recomputed = with_own_rates(stored.clone()).expect("rates");
            assert_eq!(
                recomputed.rows.len(),
                stored.rows.len(),
                "{}",
                file.display()
            );
            for (got, want) in recomputed.rows.iter().zip(&stored.rows) {
                let numbers = |r: &TidyRow| {
                    let rates = [r.clean_accuracy, r.clean_lo, r.clean_hi];
                    let robust = [r.robust_accuracy, r.robust_lo, r.robust_hi];
                    (r.n, rates, robust, r.attack.clone(), r.eps)
                };
                assert_eq!(numbers(got), numbers(want), "{}", file.display());
                rows += 1;
            }
        }
        assert!(rows >= 100, "only {rows} rows compared");
    }

    /// A cell of the committed reference sweep, as jem-bench wrote it.
    fn committed_cell() -> CellResult {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "results/reference/linf-small/cells/\
             results_models_baseline.pgd.k0.none.f714f53c8564d075.json.gz",
        );
        crate::harness::outputs::read_cell_file(&path).expect("a cell file")
    }

    /// A cell file edited after the fact is refused: a flag flipped in its examples, or a
    /// row's number out of range or at odds with its examples.
    #[test]
    fn an_edited_cell_is_refused() {
        let cell = committed_cell();
        check_cell(&cell).unwrap();
        let refused = |edit: &dyn Fn(&mut CellResult), why: &str| {
            let mut edited = cell.clone();
            edit(&mut edited);
            let err = check_cell(&edited).unwrap_err();
            assert!(err.contains(why), "{err}");
        };
        // The first example PGD broke at the smallest ε > 0, as if it had held (at a larger ε
        // an earlier break would carry).
        let first_eps = cell
            .examples
            .iter()
            .filter_map(|e| e.eps)
            .filter(|&e| e > 0.0)
            .fold(f32::INFINITY, f32::min);
        let broken = cell
            .examples
            .iter()
            .position(|e| e.eps == Some(first_eps) && e.clean_correct && e.adversarial)
            .expect("a break at the smallest ε");
        refused(
            &|c| c.examples[broken].adversarial = false,
            "where its example records give",
        );
        refused(&|c| c.rows[0].robust_accuracy = f64::NAN, "not in [0, 1]");
        refused(&|c| c.rows[0].robust_accuracy = 1.7, "not in [0, 1]");
        refused(&|c| c.rows[0].n = 0, "n is 0");
        refused(&|c| c.rows[1] = c.rows[0].clone(), "twice");
        refused(
            &|c| c.examples[0].model = "another".into(),
            "not of the cell",
        );
        refused(&|c| c.examples[0].l2 = -1.0, "negative or NaN");
    }

    /// Values from the closed form, checked against statsmodels' `proportion_confint(…,
    /// method="wilson")`.
    #[test]
    fn wilson_matches_known_intervals() {
        let close = |(a, b): (f64, f64), (c, d): (f64, f64)| {
            assert!(
                (a - c).abs() < 5e-4 && (b - d).abs() < 5e-4,
                "({a}, {b}) vs ({c}, {d})"
            );
        };
        close(wilson(10, 20), (0.2993, 0.7007));
        close(wilson(0, 20), (0.0, 0.1611));
        close(wilson(20, 20), (0.8389, 1.0));
        close(wilson(250, 500), (0.4563, 0.5437));
        close(wilson(1, 1), (0.2065, 1.0));
    }
}
