//! A sweep's progress on a terminal ([`TerminalProgress`]): the estimate before the first cell,
//! a bar on stderr weighted by each cell's estimated cost, and the table at the end — what
//! `jem-bench robust`, `merge` and `regress` show. The bar moves as each kept part of a cell
//! finishes (a batch, a re-attack of the convergence check), not only when the cell does: an
//! adaptive cell through SGLD steps runs for hours. Where stderr is not a terminal (a sweep left
//! running under `nohup`, a CI log) the bar would draw nothing, so each finished part and cell
//! prints one line there instead. Library callers get silence unless they pass it (or their own
//! [`SweepObserver`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressState, ProgressStyle};

use super::estimate;
use super::rows::CellResult;
use super::spec::{CellPart, Shard, SweepEstimate, SweepObserver};

/// Draws the bar on stderr and prints the table on stdout.
#[derive(Default)]
pub struct TerminalProgress {
    bar: RefCell<Option<ProgressBar>>,
    cells: Cell<usize>,
    done: Cell<usize>,
    /// Per running cell (by id), the estimated milliseconds its finished parts advanced the bar.
    advanced: RefCell<HashMap<String, u64>>,
    /// What the bar's time left is counted from.
    left: Arc<Mutex<TimeLeft>>,
}

/// The time left, from the estimate: the sweep's expected seconds less those elapsed, counting
/// down with the clock, but never less than the estimated seconds of the parts still to run.
/// Where the sweep runs behind its estimate, the clock runs out first and the parts still to
/// run hold the time left up; it falls as they finish. (Scaling the rest by the pace of the
/// parts finished so far swung by hours: cells side by side do not share the cores evenly, so
/// the first part to finish, the only evidence for a long while, ran at its own cell's pace, not
/// the sweep's. In the default sweep the baseline's K = 1 attack, beside the JEM's K = 1 cell,
/// ran far behind its share of the estimate, and the time left read "15 h 46 min" for a sweep
/// estimated at 4 h 34 min.)
#[derive(Debug, Clone, Copy, Default)]
struct TimeLeft {
    /// The estimated seconds of the whole sweep.
    expected: f64,
    /// The estimated seconds of what is still to run, as the last finished part left it.
    undone: f64,
    /// Wall-clock seconds per second of the cells' estimated durations added up (the bar's
    /// unit): cells side by side advance the bar together.
    wall_per_summed: f64,
}

impl TimeLeft {
    fn at(self, elapsed: f64) -> f64 {
        (self.expected - elapsed).max(self.undone).max(0.0)
    }
}

impl TerminalProgress {
    fn prefix(&self) -> String {
        format!("{}/{} cells", self.done.get(), self.cells.get())
    }

    /// Seconds left ([`TimeLeft`]).
    fn time_left(&self, bar: &ProgressBar) -> f64 {
        let left = *self.left.lock().expect("the time left");
        left.at(bar.elapsed().as_secs_f64())
    }

    /// Counts what is still to run again, as a part or a cell finishes: the estimated durations
    /// not yet run, as wall-clock time.
    fn recount(&self, bar: &ProgressBar) {
        let undone = bar.length().unwrap_or(0).saturating_sub(bar.position()) as f64 / 1000.0;
        let mut left = self.left.lock().expect("the time left");
        left.undone = undone * left.wall_per_summed;
    }

    /// The plain line of a finished part or cell: elapsed time, cells, time left (as the bar
    /// shows it), then `what`. The bar keeps the clock and the estimated milliseconds run,
    /// drawn or not.
    fn line(&self, bar: &ProgressBar, what: &str) -> String {
        format!(
            "{} elapsed, {}, about {} left; {what}",
            estimate::duration(bar.elapsed().as_secs_f64()),
            self.prefix(),
            estimate::duration(self.time_left(bar))
        )
    }
}

/// "1 cell", "6 cells".
fn cells_to_run(cells: usize) -> String {
    match cells {
        1 => "1 cell".to_string(),
        n => format!("{n} cells"),
    }
}

impl SweepObserver for TerminalProgress {
    fn estimating(&self, cells: usize, pairs: usize) {
        // Said at once: a silent start of minutes looks like a hang.
        eprintln!(
            "{} to run; estimating their time first (a timed gradient and a pilot \
             attack per model and K: {pairs} of them) …",
            cells_to_run(cells)
        );
    }

    fn starting(&self, estimate: &SweepEstimate, finished_before: usize) {
        let estimates = estimate.durations();
        if !estimates.is_empty() {
            let at_once = match estimate.jobs.min(estimates.len()) {
                1 => String::new(),
                jobs => format!(", {jobs} at a time"),
            };
            // A resumed sweep's estimate is of what is left: say so, or it reads as the whole.
            let resumed = if estimate.resumes() {
                "; the parts an earlier run kept left out"
            } else {
                ""
            };
            eprintln!(
                "{} to run{at_once}, about {} here (timed gradients, and the examples a \
                 pilot attack left standing at each ε{resumed}), at most {} (every example \
                 attacked at every ε to the last iteration)",
                cells_to_run(estimates.len()),
                estimate::duration(estimate.expected()),
                estimate::duration(estimate.bound())
            );
        }
        // Counted in the cells' estimated milliseconds, so that the remaining time weighs cells
        // by cost; run side by side, they advance it side by side. The bar holds the whole
        // cells: the parts an earlier run kept come off it as they are read back, which leaves
        // what is left of the cells, the expected seconds' share.
        let total: f64 = estimates.iter().sum();
        let summed_left: f64 = estimate.durations_left().iter().sum();
        let wall = estimate.expected();
        let bar = ProgressBar::new((1000.0 * total).ceil().max(1.0) as u64);
        let left = self.left.clone();
        let count_down = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let left = *left.lock().expect("the time left");
            let seconds = left.at(state.elapsed().as_secs_f64());
            let _ = write!(w, "{}", estimate::duration(seconds));
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {prefix}  about {left} left  {msg}",
            )
            .expect("template")
            .with_key("left", count_down),
        );
        *self.left.lock().expect("the time left") = TimeLeft {
            expected: wall,
            undone: wall,
            wall_per_summed: if summed_left > 0.0 {
                wall / summed_left
            } else {
                1.0
            },
        };
        self.cells.set(estimates.len() + finished_before);
        self.done.set(finished_before);
        bar.set_prefix(self.prefix());
        *self.bar.borrow_mut() = Some(bar);
    }

    fn part_finished(&self, part: &CellPart, estimated_seconds: f64) {
        let Some(bar) = self.bar.borrow().clone() else {
            return;
        };
        let total = (1000.0 * estimated_seconds).ceil() as u64;
        let mut advanced = self.advanced.borrow_mut();
        let so_far = advanced.entry(part.cell.id()).or_default();
        // Never past the cell's estimate: what is left of it is counted when the cell finishes.
        let step = ((1000.0 * estimated_seconds * part.share).ceil() as u64)
            .min(total.saturating_sub(*so_far));
        *so_far += step;
        let cell = format!(
            "{} {} K={}",
            part.cell.attack.name(),
            part.cell.model,
            part.cell.k
        );
        let what = if part.resumed {
            // An earlier run's part leaves the work to do, not the work done: it comes off
            // what is still to run, not onto what this run has run.
            bar.set_length(bar.length().unwrap_or(0).saturating_sub(step).max(1));
            format!("{cell}: {part} read back (kept by an earlier run)")
        } else {
            bar.inc(step);
            format!(
                "{cell}: {part} done in {}",
                estimate::duration(part.seconds)
            )
        };
        self.recount(&bar);
        if bar.is_hidden() {
            eprintln!("{}", self.line(&bar, &what));
        }
        bar.set_message(what);
    }

    fn cell_finished(&self, result: &CellResult, estimated_seconds: f64) {
        self.done.set(self.done.get() + 1);
        let last = result.rows.last().map_or(String::new(), |row| {
            format!(
                "last: {} {} K={} ε={} robust {:.1} % (the cell took {}, estimated {})",
                row.attack,
                row.model,
                row.k,
                row.eps,
                100.0 * row.robust_accuracy,
                estimate::duration(result.seconds),
                estimate::duration(estimated_seconds)
            )
        });
        let advanced = self
            .advanced
            .borrow_mut()
            .remove(&result.cell.id())
            .unwrap_or(0);
        if let Some(bar) = self.bar.borrow().as_ref() {
            let total = (1000.0 * estimated_seconds).ceil() as u64;
            bar.inc(total.saturating_sub(advanced));
            bar.set_prefix(self.prefix());
            self.recount(bar);
            // A hidden bar (stderr not a terminal) draws nothing for hours: print a line.
            if bar.is_hidden() {
                eprintln!("{}", self.line(bar, &last));
            }
            bar.set_message(last);
        }
    }

    fn finished(&self, out: &Path, table: &str, ran: usize, cells: usize) {
        // A sweep that ran says how much it ran; a merge or report only shows its table.
        if let Some(bar) = self.bar.borrow_mut().take() {
            bar.finish_and_clear();
            println!("ran {ran} cells ({} were finished already)", cells - ran);
        }
        print!("{table}");
        println!("wrote {}", out.display());
    }

    fn says(&self, text: &str) {
        println!("{}", text.trim_end_matches('\n'));
    }

    fn warns(&self, text: &str) {
        eprintln!("{}", text.trim_end_matches('\n'));
    }

    fn nothing_to_do(&self, shard: Shard, cells: usize) {
        eprintln!(
            "shard {}/{}: the sweep has {cells} cells, none of them this shard's; nothing to do",
            shard.index, shard.count,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{AttackKind, Cell, CellAttack, PartKind};
    use jem_attacks::GradMode;

    fn cell(k: usize) -> Cell {
        Cell {
            model: "m".into(),
            attack: CellAttack::Kind(AttackKind::Pgd),
            k,
            grad: Some(GradMode::Full),
        }
    }

    fn part(k: usize, index: usize, share: f64) -> CellPart {
        CellPart {
            cell: cell(k),
            kind: PartKind::AttackBatch,
            index,
            count: 3,
            seconds: 1.0,
            share,
            resumed: false,
        }
    }

    fn estimate(cells: &[f64]) -> SweepEstimate {
        SweepEstimate {
            cells: cells.to_vec(),
            bounds: cells.iter().map(|c| 2.0 * c).collect(),
            speedups: vec![1.0; cells.len()],
            jobs: 1,
            counts: Vec::new(),
            kept: Vec::new(),
        }
    }

    #[test]
    fn parts_move_the_bar_within_their_cell_and_the_cell_ends_on_its_estimate() {
        let progress = TerminalProgress::default();
        progress.starting(&estimate(&[10.0, 4.0]), 0);
        let position = || progress.bar.borrow().as_ref().unwrap().position();
        // Two cells in flight: parts count for their own cell only.
        progress.part_finished(&part(1, 0, 0.25), 10.0);
        progress.part_finished(&part(2, 0, 0.5), 4.0);
        assert_eq!(position(), 2_500 + 2_000);
        // Parts that took more than estimated stop at their cell's estimate...
        progress.part_finished(&part(1, 1, 0.5), 10.0);
        progress.part_finished(&part(1, 2, 0.5), 10.0);
        assert_eq!(position(), 10_000 + 2_000);
        // ...and a finished cell adds what its parts left of it, no more.
        let finished = |k| CellResult {
            cell: cell(k),
            identity: String::new(),
            seconds: 1.0,
            rows: Vec::new(),
            examples: Vec::new(),
        };
        progress.cell_finished(&finished(1), 10.0);
        assert_eq!(position(), 10_000 + 2_000);
        progress.cell_finished(&finished(2), 4.0);
        assert_eq!(position(), 14_000);
        assert_eq!(progress.done.get(), 2);
        assert!(progress.advanced.borrow().is_empty());
    }

    #[test]
    fn the_time_left_counts_down_from_the_estimate_but_not_below_what_is_still_to_run() {
        // Behind the estimate (its 14 s elapsed, none run): what is still to run, all 14 s.
        let left = TimeLeft {
            expected: 14.0,
            undone: 14.0,
            wall_per_summed: 1.0,
        };
        assert_eq!(left.at(0.0), 14.0);
        assert_eq!(left.at(20.0), 14.0);
        // A part ran, ahead of the clock: the clock counts down, then the 11.5 s still to run.
        let left = TimeLeft {
            undone: 11.5,
            ..left
        };
        assert_eq!(left.at(1.0), 13.0);
        assert_eq!(left.at(5.0), 11.5);
        let progress = TerminalProgress::default();
        progress.starting(&estimate(&[10.0, 4.0]), 0);
        progress.part_finished(&part(1, 0, 0.25), 10.0);
        assert_eq!(progress.left.lock().unwrap().undone, 11.5);
        // Two workers sharing the cores: 10 s and 4 s of work side by side end at 14 s (the
        // second at 8, then the first alone), not at 10; the bar adds up 14 + 8, and what is
        // still to run counts as the 14 s of wall-clock time.
        let shared = TerminalProgress::default();
        shared.starting(
            &SweepEstimate {
                jobs: 2,
                ..estimate(&[10.0, 4.0])
            },
            0,
        );
        let bar = shared.bar.borrow().as_ref().unwrap().clone();
        assert_eq!(bar.length(), Some(22_000));
        shared.recount(&bar);
        assert!((shared.left.lock().unwrap().undone - 14.0).abs() < 1e-9);
    }

    /// A resumed sweep: half of the first cell kept. The estimate is of what is left (5 + 4 s
    /// on one worker), the bar holds the whole cells until the kept half is read back, and then
    /// what is still to run is the 9 s, not a share of it.
    #[test]
    fn a_resumed_sweeps_time_left_is_what_is_left() {
        let resumed = SweepEstimate {
            kept: vec![0.5, 0.0],
            ..estimate(&[10.0, 4.0])
        };
        assert!(resumed.resumes() && !estimate(&[10.0, 4.0]).resumes());
        assert_eq!(resumed.expected(), 9.0);
        assert_eq!(resumed.bound(), 18.0);
        assert_eq!(resumed.durations_left(), [5.0, 4.0]);
        assert_eq!(resumed.durations(), [10.0, 4.0]);
        let progress = TerminalProgress::default();
        progress.starting(&resumed, 0);
        let read_back = CellPart {
            resumed: true,
            seconds: 0.0,
            ..part(1, 0, 0.5)
        };
        progress.part_finished(&read_back, 10.0);
        let left = *progress.left.lock().unwrap();
        assert_eq!(
            progress.bar.borrow().as_ref().unwrap().length(),
            Some(9_000)
        );
        assert!((left.undone - 9.0).abs() < 1e-9, "{left:?}");
        assert!((left.at(5.0) - 9.0).abs() < 1e-9, "{left:?}");
    }

    #[test]
    fn parts_read_back_shrink_what_is_left_instead_of_counting_as_done() {
        let progress = TerminalProgress::default();
        progress.starting(&estimate(&[10.0]), 0);
        let state = || {
            let bar = progress.bar.borrow().as_ref().unwrap().clone();
            (bar.position(), bar.length())
        };
        // A resumed cell: its first part an earlier run kept, its second run now.
        let read_back = CellPart {
            resumed: true,
            seconds: 0.0,
            ..part(1, 0, 0.25)
        };
        progress.part_finished(&read_back, 10.0);
        assert_eq!(state(), (0, Some(7_500)));
        progress.part_finished(&part(1, 1, 0.25), 10.0);
        assert_eq!(state(), (2_500, Some(7_500)));
        let finished = CellResult {
            cell: cell(1),
            identity: String::new(),
            seconds: 1.0,
            rows: Vec::new(),
            examples: Vec::new(),
        };
        progress.cell_finished(&finished, 10.0);
        assert_eq!(state(), (7_500, Some(7_500)));
    }
}
