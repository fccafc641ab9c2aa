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

use indicatif::{ProgressBar, ProgressStyle};

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
}

impl TerminalProgress {
    fn prefix(&self) -> String {
        format!("{}/{} cells", self.done.get(), self.cells.get())
    }

    /// The plain line of a finished part or cell: elapsed time, cells, time left (elapsed time
    /// scaled by the estimated cost still to run, as the bar's own remaining time), then `what`.
    /// The bar keeps the clock and the estimated milliseconds run, drawn or not.
    fn line(&self, bar: &ProgressBar, what: &str) -> String {
        let elapsed = bar.elapsed().as_secs_f64();
        let (total, done) = (bar.length().unwrap_or(0), bar.position());
        let left = if done > 0 {
            let fraction_left = total.saturating_sub(done) as f64 / done as f64;
            format!(
                ", about {} left",
                estimate::duration(elapsed * fraction_left)
            )
        } else {
            String::new()
        };
        format!(
            "{} elapsed, {}{left}; {what}",
            estimate::duration(elapsed),
            self.prefix()
        )
    }
}

impl SweepObserver for TerminalProgress {
    fn starting(&self, estimate: &SweepEstimate, finished_before: usize) {
        let estimates = estimate.durations();
        if !estimates.is_empty() {
            let at_once = match estimate.jobs.min(estimates.len()) {
                1 => String::new(),
                jobs => format!(", {jobs} at a time"),
            };
            eprintln!(
                "{} cells to run{at_once}, about {} here (timed gradients, and the examples a \
                 pilot attack left standing at each ε), at most {} (every example attacked at \
                 every ε to the last iteration)",
                estimates.len(),
                estimate::duration(estimate.expected()),
                estimate::duration(estimate.bound())
            );
        }
        // Counted in the cells' estimated milliseconds, so that the remaining time weighs cells
        // by cost; run side by side, they advance it side by side.
        let total: f64 = estimates.iter().sum();
        let bar = ProgressBar::new((1000.0 * total).ceil().max(1.0) as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {prefix}  about {eta} left  {msg}",
            )
            .expect("template"),
        );
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
            // An earlier run's part leaves the work to do, not the work done: the time left
            // is this run's pace over what this run has still to compute.
            bar.set_length(bar.length().unwrap_or(0).saturating_sub(step).max(1));
            format!("{cell}: {part} read back (kept by an earlier run)")
        } else {
            bar.inc(step);
            format!(
                "{cell}: {part} done in {}",
                estimate::duration(part.seconds)
            )
        };
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
