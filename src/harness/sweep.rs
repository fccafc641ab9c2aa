//! `jem-bench robust`: lists the cells of a sweep, runs those not finished yet (each saved
//! atomically), and rebuilds the outputs: `robust.csv`, `examples.csv`, `summary.json` (clean
//! and worst-case robust accuracy per model, K and ε, with the sanity checks) and a table.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use burn::module::Module;
use jem_attacks::Classifier;

use super::cell::run_cell;
use super::cells::Cell;
use super::estimate;
use super::forecast::{estimate_cells, full_evaluation, long_run_bound, side_by_side};
use super::kept_parts;
use super::outputs;
use super::own_attack::OwnAttack;
use super::plan::{claim_folder, Plan};
use super::report;
use super::rows::{CellResult, TidyRow};
use super::spec::{CellPart, Checkpoints, Runner, SweepObserver, SweepSpec};
use super::subject::Subject;
use crate::backend::BenchBackend;

/// `jem-bench robust`: the sweep of `checkpoints` (default: the embedded models), loaded onto
/// `device`, run by `runner`.
pub fn run<B: BenchBackend>(
    spec: &SweepSpec,
    checkpoints: &Checkpoints,
    runner: &Runner,
    device: &B::Device,
) -> anyhow::Result<Vec<TidyRow>> {
    let plan = Plan::<B, _>::from_args(spec, checkpoints, &runner.out, device)?;
    execute(&plan, spec, runner)
}

/// Sweeps `subjects` — networks of any architecture that implement
/// [`Classifier`](jem_attacks::Classifier), each on its own device, with its test set — under
/// `spec`: runs the cells not finished yet in `runner.out`, writes `robust.csv`, `examples.csv`,
/// `summary.json` with the sanity checks, the curves and the table, as `jem-bench robust` does,
/// and returns the rows of `robust.csv`.
pub fn sweep<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    subjects: Vec<Subject<B, N>>,
    spec: &SweepSpec,
    runner: &Runner,
) -> anyhow::Result<Vec<TidyRow>> {
    sweep_with_attacks(subjects, Vec::new(), spec, runner)
}

/// [`sweep`], with attacks of the caller's own beside `spec.attacks`: each runs in cells of its
/// own (after the spec's attacks, per model and K), gets rows and examples, counts in the
/// worst case and the sanity checks by what it declares of itself, and is recorded in the
/// sweep's settings, so that a resume needs the same own attacks.
pub fn sweep_with_attacks<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    subjects: Vec<Subject<B, N>>,
    own: Vec<OwnAttack<B, N>>,
    spec: &SweepSpec,
    runner: &Runner,
) -> anyhow::Result<Vec<TidyRow>> {
    let plan = Plan::new(spec, subjects, own, &runner.out)?;
    execute(&plan, spec, runner)
}

/// Runs a plan's unfinished cells and writes every output.
pub(super) fn execute<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    runner: &Runner,
) -> anyhow::Result<Vec<TidyRow>> {
    let out = plan.out.clone();
    // This shard's cells, by their index in the plan.
    let mine_at: Vec<usize> = (0..plan.cells.len())
        .filter(|j| runner.shard.is_none_or(|s| j % s.count == s.index))
        .collect();
    let mine: Vec<&Cell> = mine_at.iter().map(|&j| &plan.cells[j]).collect();
    if let (Some(shard), true) = (runner.shard, mine.is_empty()) {
        // A job array larger than the sweep: this task has nothing to do, which is no error.
        runner.observer.nothing_to_do(shard, plan.cells.len());
        return Ok(Vec::new());
    }
    if let (Some(mut beyond), false) = (spec.beyond_usual(), runner.allow_long) {
        beyond.problem = format!(
            "{}: this sweep would take up to {} here (a gradient timed at smaller counts, \
             scaled); allow it (--allow-long) to run it",
            beyond.problem,
            estimate::duration(long_run_bound(
                plan,
                spec,
                &mine,
                side_by_side::<B>(runner.jobs.get())
            )?)
        );
        return Err(beyond.into());
    }
    let lock = crate::output_folder::claim(&out, "robust")?;
    // Finished cells (from an earlier, interrupted run) are read back; the rest run on
    // `--jobs` worker threads. The CSVs always hold the finished cells in plan order: every
    // cell the folder holds finished, also other shards' where shards run one after another
    // in one folder, so that a shard's run never leaves tables of fewer cells than are done.
    let identity = plan.identity(spec);
    let every: Vec<&Cell> = plan.cells.iter().collect();
    let mut done = claim_folder(&out, &plan.settings(spec), &identity, &every, &lock)?;
    // Longest first, so that the last cell running alone is a short one: cells with more SGLD
    // steps cost more (a K = 1 cell about 5× its K = 0 twin). Outputs keep the plan's order.
    let mut pending: Vec<usize> = (0..mine.len())
        .filter(|&i| done[mine_at[i]].is_none())
        .collect();
    pending.sort_by_key(|&i| std::cmp::Reverse(mine[i].k));
    let jobs = runner.jobs.get().clamp(1, pending.len().max(1));
    let starting: Vec<&Cell> = pending.iter().map(|&i| mine[i]).collect();
    if !starting.is_empty() {
        let mut pairs: Vec<(&str, usize)> =
            starting.iter().map(|c| (c.model.as_str(), c.k)).collect();
        pairs.sort();
        pairs.dedup();
        runner.observer.estimating(starting.len(), pairs.len());
    }
    let estimate = estimate_cells(
        plan,
        spec,
        &mine,
        &pending,
        &identity,
        side_by_side::<B>(jobs),
    )?;
    if !starting.is_empty() {
        outputs::write_estimate(&out, &estimate, &starting)?;
    }
    runner
        .observer
        .starting(&estimate, mine.len() - pending.len());
    let estimates = estimate.durations();
    outputs::write_csvs(&out, done.iter().flatten())?;

    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    // Workers send each kept part of a cell and each finished cell; this thread reports and
    // saves them (an observer need not be shareable between threads).
    let (tx, rx) = mpsc::channel::<(usize, Message)>();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, failed, pending, mine, spec, plan, out, identity) = (
                &next, &failed, &pending, &mine, &spec, &plan, &out, &identity,
            );
            scope.spawn(move || {
                while !failed.load(Ordering::Relaxed) {
                    let Some(&i) = pending.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    let cell = mine[i];
                    let report = |part: CellPart| {
                        // A closed channel: another cell failed and the sweep stopped. This
                        // cell stops at the part just kept instead of running on for hours.
                        tx.send((i, Message::Part(part)))
                            .map_err(|_| anyhow::anyhow!("the sweep stopped"))
                    };
                    let result = run_cell(plan, out, identity, spec, cell, &report);
                    if tx.send((i, Message::Finished(result))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (i, message) in rx {
            let at = pending
                .iter()
                .position(|&p| p == i)
                .expect("a pending cell");
            let result = match message {
                Message::Part(part) => {
                    runner.observer.part_finished(&part, estimates[at]);
                    continue;
                }
                Message::Finished(result) => result,
            };
            let r = match result {
                Ok(r) => r,
                Err(e) => {
                    // Stop handing out cells; what finished is already saved.
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            outputs::save_cell(&out, &r)?;
            kept_parts::remove_batches(&out, &r.cell)?;
            runner.observer.cell_finished(&r, estimates[at]);
            done[mine_at[i]] = Some(r);
            outputs::write_csvs(&out, done.iter().flatten())?;
        }
        Ok(())
    })?;
    let results: Vec<CellResult> = done.into_iter().flatten().collect();
    finish(plan, spec, &results, runner.observer, pending.len())
}

/// What a worker sends about the cell it runs.
enum Message {
    /// A part of the cell was kept.
    Part(CellPart),
    /// The cell finished (or failed).
    Finished(anyhow::Result<CellResult>),
}

/// Checks a sweep's settings, models and data without touching the disk (what `robust` does
/// first), so that a caller can refuse bad settings before it prepares a folder.
pub fn check<B: BenchBackend>(
    spec: &SweepSpec,
    checkpoints: &Checkpoints,
    device: &B::Device,
) -> anyhow::Result<()> {
    Plan::<B, _>::from_args(spec, checkpoints, std::path::Path::new(""), device).map(|_| ())
}

/// Summary, sanity checks, plots and table of the finished cells, `ran` of them run now; under
/// a quick look's table, what the full evaluation would take.
pub(super) fn finish<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    results: &[CellResult],
    observer: &dyn SweepObserver,
    ran: usize,
) -> anyhow::Result<Vec<TidyRow>> {
    let rows = super::robustness::tidy_rows(&results.iter().collect::<Vec<_>>())?;
    let seconds = results.iter().map(|r| r.seconds).sum::<f64>();
    let mut table = report::write(&plan.out, &rows, Some(seconds))?;
    if spec.quick && !rows.is_empty() {
        table += &full_evaluation(plan, spec, &rows)?;
        table += "\n";
    }
    observer.finished(&plan.out, &table, ran, results.len());
    Ok(rows)
}
