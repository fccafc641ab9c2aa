//! What a sweep's cells are expected to take here, before they start: each model's gradient
//! timed as its cells compute it (on a batch of their size, alone and beside as many copies as
//! cells run at once), a pilot attack's survivors and the cost of what it broke, counted by
//! [`estimate`] and handed out to the sweep's workers; the bound for counts far beyond the
//! usual; and, under a quick look's table, what the full evaluation would take.

use std::num::NonZeroUsize;

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{Classifier, GradMode};

use super::budgets::Budgets;
use super::cells::{AttackKind, Cell};
use super::estimate;
use super::plan::Plan;
use super::robustness::WORST_CASE;
use super::rows::TidyRow;
use super::spec::{CellCount, SweepEstimate, SweepSpec};
use super::subject::Subject;
use crate::backend::BenchBackend;
use crate::batches;
use crate::defended::Defended;

/// How many of `jobs` cells the estimate counts as running side by side: on the CPU every
/// worker's cell computes beside the others' (sharing the cores); on a GPU, cells take turns on
/// the one device, so their times add up. The device's lanes are those it shards SGLD chains
/// over when left to itself.
pub(super) fn side_by_side<B: BenchBackend>(jobs: usize) -> usize {
    jobs.clamp(1, B::default_sgld_shards().max(1))
}

/// Examples a gradient is timed on, at most: the default sweep's batch, so that a larger one
/// (which costs about as much per example) does not hold up the start of a sweep.
const TIMED_BATCH: usize = 100;

/// Examples of the pilot attack that tells the estimate how many examples stand; only sweeps of
/// at least [`PILOT_EXAMPLES`] × [`PILOTED_SWEEPS`] examples run it (for a smaller one the pilot
/// would cost a good part of the cell, and the estimate is the bound).
const PILOT_EXAMPLES: usize = 16;
const PILOTED_SWEEPS: usize = 4;

/// One example's input gradient through a cell's defended model, timed.
#[derive(Debug, Clone, Copy)]
struct Timed {
    /// Seconds with the machine to itself, on the cell's batch.
    alone: f64,
    /// Examples in that batch.
    batch: f64,
    /// The same on the convergence check's batch (its sample of survivors): a batch of 20
    /// costs less per example than one of 100 (the maps of 100 images × 5 chains outgrow the
    /// caches); `alone` where the cell has no check.
    check_alone: f64,
    /// Examples in the check's batch (`batch` where the cell has no check).
    check_batch: f64,
    /// How many times more gradients the lanes computed side by side than one alone in the
    /// same time (see [`SweepEstimate::speedups`]).
    speedup: f64,
}

impl Timed {
    /// Seconds one example's gradient takes alone in a batch of `rows` (a share) of the cell's
    /// batch: between the two batches timed, along the line through them; at the nearer one
    /// outside them. An attack's batches shrink as it breaks examples, and a smaller batch
    /// costs less per example (a WRN-10-1's gradient through one SGLD step: about 9 ms an
    /// example in a batch of 100, 8 in one of 20), so pricing all of them at the full batch
    /// counts long.
    fn per_gradient(self, rows: f64) -> f64 {
        let (small, large) = (self.check_batch, self.batch);
        if large - small < 1.0 {
            return self.alone;
        }
        let at = ((large * rows).clamp(small, large) - small) / (large - small);
        self.check_alone + at * (self.alone - self.check_alone)
    }

    /// Seconds `n` examples take through `gradients` each.
    fn seconds(self, gradients: estimate::Gradients, n: f64) -> f64 {
        n * (gradients.attack * self.per_gradient(gradients.attack_rows)
            + gradients.check * self.check_alone)
    }
}

/// One example's input gradient through `cell`'s defended model (its model, K and gradient
/// mode) as the cell computes it: on a batch of the cell's size (its first examples, at most
/// [`TIMED_BATCH`]), alone, then `lanes` at once, each on its own thread. Cells side by side
/// share the cores: the gradients of large batches, which keep every core busy, get no more
/// done two at a time than one after the other, while small and serial work fills the cores
/// another leaves idle. (Timed side by side only, each cell counted at its pace beside a copy of
/// itself, the default sweep's K = 1 cell of the embedded baseline was counted 2.2× long: it
/// ran beside a cheaper K = 0 cell at nearly its pace alone.)
fn time_gradient<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    cell: &Cell,
    lanes: usize,
) -> anyhow::Result<Timed> {
    let len = spec.examples.largest_batch().min(TIMED_BATCH);
    let on = |len: usize| -> anyhow::Result<f64> {
        let (x, y) = first_examples(plan.subject(cell), len);
        Ok(estimate::seconds_per_gradient(
            &defended(plan, spec, cell)?,
            x,
            y,
        ))
    };
    let alone = on(len)?;
    let checked = cell.k > 0 && spec.convergence_sample > 0;
    let (check_alone, check_batch) = match spec.convergence_sample.min(len) {
        sample if checked && sample < len => (on(sample)?, sample),
        _ => (alone, len),
    };
    let single = Timed {
        alone,
        batch: len as f64,
        check_alone,
        check_batch: check_batch as f64,
        speedup: 1.0,
    };
    if lanes <= 1 {
        return Ok(single);
    }
    let timed: Vec<f64> = std::thread::scope(|scope| {
        let lanes: Vec<_> = (0..lanes).map(|_| scope.spawn(|| on(len))).collect();
        lanes
            .into_iter()
            .map(|lane| lane.join().expect("a timing thread does not panic"))
            .collect::<anyhow::Result<_>>()
    })?;
    let side_by_side = timed.iter().sum::<f64>() / timed.len() as f64;
    Ok(Timed {
        speedup: (lanes as f64 * alone / side_by_side).clamp(1.0, lanes as f64),
        ..single
    })
}

/// `cell`'s model behind its K SGLD steps, with its gradient mode.
fn defended<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    cell: &Cell,
) -> anyhow::Result<Defended<N>> {
    let subject = plan.subject(cell);
    let grad = cell.grad.unwrap_or(GradMode::Bpda);
    Defended::new(
        subject.network(),
        subject.sgld(),
        cell.k,
        grad,
        &spec.defence,
    )
}

/// The first `len` test images of `subject` and their labels.
fn first_examples<B: BenchBackend, N: Module<B>>(
    subject: &Subject<B, N>,
    len: usize,
) -> super::cell::Examples<B> {
    let data = subject.test_set();
    let idx: Vec<usize> = (0..len.max(1)).collect();
    let labels: Vec<i64> = idx.iter().map(|&j| data.labels[j] as i64).collect();
    let device = subject.device();
    let x = batches::images::<B::InnerBackend>(data, &idx, device);
    let y =
        Tensor::<B::InnerBackend, 1, Int>::from_data(TensorData::new(labels, [idx.len()]), device);
    (x, y)
}

/// What `mine` would take at most on `jobs` workers sharing the cores
/// ([`SweepEstimate::bound`]), within seconds even for counts
/// far beyond the usual: each gradient is timed on a few examples at no more than
/// [`TIMED_STEPS`] SGLD steps and [`TIMED_CHAINS`] chains and scaled to the sweep's (an SGLD
/// step and a chain each cost about one pass of the network).
pub(super) fn long_run_bound<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    mine: &[&Cell],
    jobs: usize,
) -> anyhow::Result<f64> {
    let eps = plan.eps_grid.iter().filter(|&&e| e > 0.0).count();
    let chains = spec.defence.chains.max(1);
    let timed_spec = SweepSpec {
        defence: crate::defended::DefenceSpec {
            chains: chains.min(TIMED_CHAINS),
            ..spec.defence.clone()
        },
        ..spec.clone()
    };
    // In the order the sweep would start them, longest K first.
    let mut cells = mine.to_vec();
    cells.sort_by_key(|cell| std::cmp::Reverse(cell.k));
    let mut bounds = Vec::new();
    for cell in cells {
        let timed_cell = Cell {
            k: cell.k.min(TIMED_STEPS),
            ..(*cell).clone()
        };
        let len = spec.examples.count().clamp(1, 4);
        let (x, y) = first_examples(plan.subject(cell), len);
        let defended = defended(plan, &timed_spec, &timed_cell)?;
        let mut seconds = estimate::seconds_per_gradient(&defended, x, y);
        seconds *= (cell.k + 1) as f64 / (timed_cell.k + 1) as f64;
        if cell.k > 0 {
            seconds *= chains as f64 / chains.min(TIMED_CHAINS) as f64;
        }
        let classes = plan.subject(cell).test_set().num_classes();
        let own = |name: &str, eot| {
            let attack = plan.own.iter().find(|o| o.name() == name);
            attack.map_or(0.0, |o| o.gradients_per_eps(eot))
        };
        let most = estimate::most_gradients_per_example(spec, cell, eps, classes, own);
        bounds.push(seconds * spec.examples.count() as f64 * most.total());
    }
    let shared = vec![1.0; bounds.len()];
    Ok(estimate::makespan(&bounds, &shared, jobs))
}

/// SGLD steps and chains a gradient is timed at, at most, for [`long_run_bound`].
const TIMED_STEPS: usize = 10;
const TIMED_CHAINS: usize = 5;

/// What the first attack of `cell` (a preset's first stage), at its own budget but with one
/// gradient draw and one restart, leaves of `cell`'s model, K and gradient mode on
/// [`PILOT_EXAMPLES`] examples: at least as many as the whole cell leaves (its later stages,
/// more draws and restarts break more), so an estimate from it errs long, but not by much: the
/// first stage breaks most of what a cascade breaks. (A pilot of 10 APGD iterations left
/// standing far more at large ε than 100 do, and the estimate of the default sweep came out
/// 2–4× long.)
struct Pilot {
    /// The fraction classified correctly.
    clean: f64,
    /// Of those, the fraction standing at each ε > 0 of the grid (ascending).
    standing: Vec<f64>,
    /// What an example the attack broke cost, as a share of a whole run at one ε (broken
    /// examples stop early: often after a few of APGD's 100 iterations).
    broken_share: f64,
}

fn pilot<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    cell: &Cell,
    first: AttackKind,
    grid: &[f32],
) -> anyhow::Result<Pilot> {
    let defended = defended(plan, spec, cell)?;
    let pilot_cell = Cell {
        attack: super::CellAttack::Kind(first),
        ..cell.clone()
    };
    let pilot_spec = SweepSpec {
        eot: Some(1),
        budgets: Budgets {
            restarts: NonZeroUsize::MIN,
            ..spec.budgets.clone()
        },
        ..spec.clone()
    };
    let (x, y) = first_examples(plan.subject(cell), PILOT_EXAMPLES);
    let build = super::cell::builder(&pilot_cell, &plan.own);
    let stages =
        super::cell::attack_batch(&pilot_spec, 1, &pilot_cell, &build, &defended, x, y, grid)?;
    let last = stages.last().expect("an attack has a stage");
    let share = |flags: &[bool]| {
        let n = flags.len().max(1) as f64;
        flags.iter().filter(|&&f| f).count() as f64 / n
    };
    let clean_flags: Vec<bool> = last.outcomes.first().map_or(Vec::new(), |(_, o)| {
        o.examples.iter().map(|e| e.clean_correct).collect()
    });
    let clean = if clean_flags.is_empty() {
        1.0
    } else {
        share(&clean_flags)
    };
    // Per ε, which examples stand, and what each broken one took where it broke.
    let mut before = clean_flags;
    let (mut standing, mut broken_evals) = (Vec::new(), Vec::new());
    for &eps in grid {
        let (at, outcome) = last
            .outcomes
            .iter()
            .find(|(at, _)| at.is_none_or(|a| a == eps))
            .expect("a stage answers every ε of the grid");
        let now = super::cell::standing(outcome, *at, spec.threat.norm, eps);
        for (i, example) in outcome.examples.iter().enumerate() {
            if before.get(i).copied().unwrap_or(false) && !now[i] {
                broken_evals.push(example.gradient_evals as f64);
            }
        }
        standing.push(share(&now));
        before = now;
    }
    let classes = plan.subject(cell).test_set().num_classes();
    let whole = estimate::first_stage_gradients(&pilot_spec, &pilot_cell, classes);
    let broken_share = match (broken_evals.is_empty(), whole) {
        (false, Some(whole)) if whole > 0.0 => {
            broken_evals.iter().sum::<f64>() / broken_evals.len() as f64 / whole
        }
        _ => estimate::HALF_RUN,
    };
    Ok(Pilot {
        clean,
        standing,
        broken_share,
    })
}

/// What each pending cell (in `pending`'s order) is expected to take, and what they take at
/// most: per model, K and gradient mode one timed gradient and, for the built-in attacks that
/// run at each ε, a pilot attack's survivors (see [`SweepEstimate`]).
pub(super) fn estimate_cells<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    spec: &SweepSpec,
    mine: &[&Cell],
    pending: &[usize],
    identity: &str,
    jobs: usize,
) -> anyhow::Result<SweepEstimate> {
    let mut grid: Vec<f32> = plan.eps_grid.iter().copied().filter(|&e| e > 0.0).collect();
    grid.sort_by(f32::total_cmp);
    let eps = grid.len();
    type Key<'a> = (&'a str, usize, Option<GradMode>);
    let mut timed: Vec<(Key, Timed)> = Vec::new();
    let mut piloted: Vec<((Key, AttackKind), Pilot)> = Vec::new();
    let (mut cells, mut bounds, mut speedups) = (Vec::new(), Vec::new(), Vec::new());
    let (mut counts, mut kept) = (Vec::new(), Vec::new());
    for &i in pending {
        let cell = mine[i];
        kept.push(super::kept_parts::kept_share(&plan.out, identity, cell));
        let subject = plan.subject(cell);
        let key = (cell.model.as_str(), cell.k, cell.grad);
        let gradient = match timed.iter().find(|(k, _)| *k == key) {
            Some((_, t)) => *t,
            None => {
                let t = time_gradient(plan, spec, cell, jobs)?;
                timed.push((key, t));
                t
            }
        };
        speedups.push(gradient.speedup);
        let classes = subject.test_set().num_classes();
        let own = |name: &str, eot| {
            let attack = plan.own.iter().find(|o| o.name() == name);
            attack.map_or(0.0, |o| o.gradients_per_eps(eot))
        };
        let n = spec.examples.count() as f64;
        let most = estimate::most_gradients_per_example(spec, cell, eps, classes, own);
        bounds.push(gradient.seconds(most, n));
        // Only where the count can use survivors, and the pilot costs a small part of the
        // cell's attack: at the default's K = 1, 16 examples at one draw of APGD-CE's 4 and
        // without APGD-DLR, against 100 examples (3 % of the attack, before its check).
        let uses_survivors = eps > 0
            && spec.examples.count() >= PILOT_EXAMPLES * PILOTED_SWEEPS
            && estimate::expected_gradients_per_example(
                spec,
                cell,
                classes,
                1.0,
                &vec![1.0; eps],
                estimate::HALF_RUN,
            )
            .is_some();
        let first = cell.attack.kind().map(|kind| kind.stages()[0]);
        let likely = match (uses_survivors, first) {
            (true, Some(first)) => {
                let key = (key, first);
                if !piloted.iter().any(|(k, _)| *k == key) {
                    piloted.push((key, pilot(plan, spec, cell, first, &grid)?));
                }
                let (_, pilot) = piloted.iter().find(|(k, _)| *k == key).expect("piloted");
                estimate::expected_gradients_per_example(
                    spec,
                    cell,
                    classes,
                    pilot.clean,
                    &pilot.standing,
                    pilot.broken_share,
                )
                .unwrap_or(most)
            }
            _ => most,
        };
        cells.push(gradient.seconds(likely, n));
        counts.push(CellCount {
            expected: likely,
            most,
            seconds_per_gradient: gradient.per_gradient(likely.attack_rows),
            seconds_per_check_gradient: gradient.check_alone,
        });
    }
    Ok(SweepEstimate {
        cells,
        bounds,
        speedups,
        jobs,
        counts,
        kept,
    })
}

/// What the default evaluation of a quick look's models, norm, ε and K would take here: the
/// line printed under a quick look's table. Its cells' gradients are timed now; the expected
/// time counts, per model and K, the examples the quick look left standing at each ε (at least
/// as many as the default's stronger attacks leave: it errs long); the bound, every example
/// attacked at every ε to the last iteration.
pub(super) fn full_evaluation<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    quick: &SweepSpec,
    rows: &[TidyRow],
) -> anyhow::Result<String> {
    let full = SweepSpec {
        threat: quick.threat.clone(),
        ks: quick.ks.clone(),
        seed: quick.seed,
        defence: quick.defence.clone(),
        ..SweepSpec::default()
    };
    let mut grid: Vec<f32> = plan.eps_grid.iter().copied().filter(|&e| e > 0.0).collect();
    grid.sort_by(f32::total_cmp);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = side_by_side::<B>(cores);
    // Per cell, in the order `robust` starts them (longest K first): its K and timed
    // gradient, and its expected and most seconds.
    let mut cells: Vec<(usize, Timed, f64, f64)> = Vec::new();
    for subject in &plan.subjects {
        for &k in &full.ks {
            let cell = Cell {
                model: subject.name().to_string(),
                attack: super::CellAttack::Kind(AttackKind::Adaptive.at(k)),
                k,
                grad: (k > 0).then_some(GradMode::Full),
            };
            let gradient = time_gradient(plan, &full, &cell, jobs)?;
            let classes = subject.test_set().num_classes();
            let n = full.examples.count() as f64;
            let most =
                estimate::most_gradients_per_example(&full, &cell, grid.len(), classes, |_, _| 0.0);
            // The quick look's worst case at this model and K.
            let worst: Vec<&TidyRow> = rows
                .iter()
                .filter(|r| r.model == cell.model && r.k == k && r.attack == WORST_CASE)
                .collect();
            let clean = worst.first().map_or(1.0, |r| r.clean_accuracy);
            let standing: Vec<f64> = grid
                .iter()
                .map(|&e| {
                    worst
                        .iter()
                        .find(|r| r.eps == e)
                        .map_or(1.0, |r| r.robust_accuracy)
                })
                .collect();
            let likely = estimate::expected_gradients_per_example(
                &full,
                &cell,
                classes,
                clean,
                &standing,
                estimate::HALF_RUN,
            )
            .unwrap_or(most);
            let (likely, most) = (gradient.seconds(likely, n), gradient.seconds(most, n));
            cells.push((k, gradient, likely, most));
        }
    }
    cells.sort_by_key(|&(k, ..)| std::cmp::Reverse(k));
    let estimate = SweepEstimate {
        cells: cells.iter().map(|&(_, _, likely, _)| likely).collect(),
        bounds: cells.iter().map(|&(.., most)| most).collect(),
        speedups: cells.iter().map(|(_, t, ..)| t.speedup).collect(),
        jobs,
        counts: Vec::new(),
        kept: Vec::new(),
    };
    let (expected, bound) = (estimate.expected(), estimate.bound());
    let norm = quick.threat.norm;
    Ok(format!(
        "the full evaluation, `jem-bench robust --norm {norm}` (100 images, the adaptive \
         attacks, convergence checks): about {} here from what this quick look left standing, \
         at most {}",
        estimate::duration(expected),
        estimate::duration(bound)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timed at 34 ms an example in a batch of 100 and 21 in one of 20: a gradient in between
    /// is priced on the line through them, one outside at the nearer end; a cell without a
    /// check (one batch timed) at its batch's.
    #[test]
    fn a_gradient_is_priced_at_the_batch_it_runs_on() {
        let timed = Timed {
            alone: 0.034,
            batch: 100.0,
            check_alone: 0.021,
            check_batch: 20.0,
            speedup: 1.0,
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(timed.per_gradient(1.0), 0.034));
        assert!(close(timed.per_gradient(0.2), 0.021));
        assert!(close(timed.per_gradient(0.6), 0.021 + 0.5 * 0.013));
        assert!(close(timed.per_gradient(0.05), 0.021));
        assert!(close(timed.per_gradient(3.0), 0.034));
        let unchecked = Timed {
            check_alone: 0.034,
            check_batch: 100.0,
            ..timed
        };
        assert!(close(unchecked.per_gradient(0.2), 0.034));
        // 10 examples through 50 attack gradients on 60 % of the batch and 20 check ones.
        let gradients = estimate::Gradients {
            attack: 50.0,
            attack_rows: 0.6,
            check: 20.0,
        };
        assert!(close(
            timed.seconds(gradients, 10.0),
            10.0 * (50.0 * 0.0275 + 20.0 * 0.021)
        ));
    }
}
