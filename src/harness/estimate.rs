//! How long a sweep will take, printed before it starts: one timed gradient of each defended
//! model the pending cells attack (model, K and gradient mode), times the gradient evaluations
//! their attacks are expected to take (from a pilot attack's survivors) and take at most (every
//! example attacked at every ε to the last iteration, and the convergence checks of stochastic
//! cells on their whole samples), the cells then handed out to the sweep's workers, which share
//! the machine's cores ([`schedule`]). The progress bar counts in the same units, so its
//! remaining time corrects itself as cells finish.

use std::time::Instant;

use burn::tensor::{Int, Tensor};
use jem_attacks::{AttackLoss, Model};
use rand::SeedableRng;

use super::builtin::Draws;
use super::cells::{AttackKind, Cell, CellAttack};
use super::spec::{SweepSpec, MORE_EOT, MORE_ITERATIONS};
use crate::backend::BenchBackend;

/// Input gradients per example of a cell: its attack's and its convergence check's (which
/// attacks up to 20 survivors at a time, a smaller batch that costs less per example).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gradients {
    /// The attack's, every stage at every ε.
    pub attack: f64,
    /// The share of a batch's examples the attack's gradients are computed on, on average over
    /// them: an attack computes the examples still standing only, so its batches shrink as it
    /// breaks them (1 where every example is attacked to the last iteration).
    pub attack_rows: f64,
    /// The convergence check's re-attacks of sampled survivors.
    pub check: f64,
}

impl Gradients {
    /// Both together.
    pub fn total(self) -> f64 {
        self.attack + self.check
    }
}

/// The input gradients one example of `cell` takes at most: its attack's over the `eps`
/// nonzero budgets ([`gradients_per_example`]), and its convergence check's on its whole
/// sample ([`check_factor`]).
pub fn most_gradients_per_example(
    spec: &SweepSpec,
    cell: &Cell,
    eps: usize,
    classes: usize,
    own_per_eps: impl Fn(&str, usize) -> f64,
) -> Gradients {
    let attack = gradients_per_example(spec, cell, eps, classes, own_per_eps);
    Gradients {
        attack,
        attack_rows: 1.0,
        check: attack * check_factor(spec, cell, eps),
    }
}

/// Input gradients of the cell's model one example takes at most, over the `eps` budgets > 0
/// of the grid, each counted with its EOT draws; an own attack (`own_per_eps`: its gradients at
/// one ε with `eot` draws) as it declares.
pub fn gradients_per_example(
    spec: &SweepSpec,
    cell: &Cell,
    eps: usize,
    classes: usize,
    own_per_eps: impl Fn(&str, usize) -> f64,
) -> f64 {
    let attack = match &cell.attack {
        CellAttack::Kind(kind) => *kind,
        CellAttack::Own(name) => return own_per_eps(name, spec.eot_at(cell.k)) * eps as f64,
    };
    stage_gradients(spec, attack, cell.k, classes)
        .into_iter()
        .map(|(per_eps, once)| if once { per_eps } else { per_eps * eps as f64 })
        .sum()
}

/// Per stage of `attack` (itself for a single attack) at K = `k`: the input gradients one
/// example takes at most at one ε, and whether the stage runs once for every ε (a
/// minimum-perturbation attack on its own) rather than at each.
fn stage_gradients(
    spec: &SweepSpec,
    attack: AttackKind,
    k: usize,
    classes: usize,
) -> Vec<(f64, bool)> {
    let draws = Draws {
        eot: spec.eot_at(k) as f64,
        classes,
    };
    attack
        .stages()
        .into_iter()
        .map(|kind| {
            let entry = kind.entry();
            ((entry.gradients)(spec, draws), entry.once_for_every_eps)
        })
        .collect()
}

/// Input gradients per example that a built-in `cell` of `spec` is expected to take, where a
/// weaker run of the same model and K left `standing` (a fraction, per ε > 0 of `grid`,
/// ascending) of the examples and classified `clean` of them correctly: at each ε the first
/// stage attacks what the smaller ε left standing (an example it breaks costs `broken_share` of
/// a whole run: what the weaker run's broken examples took), later stages and the convergence
/// check only what is left standing at ε, and a stage that answers every ε at once (FAB-T in
/// a cascade) only what stands at the smallest. Survivors of a weaker run are at least those
/// of the cell's, so this errs long. `None` for an own attack or a minimum-perturbation one on
/// its own (which attacks every example once for every ε).
pub fn expected_gradients_per_example(
    spec: &SweepSpec,
    cell: &Cell,
    classes: usize,
    clean: f64,
    standing: &[f64],
    broken_share: f64,
) -> Option<Gradients> {
    let attack = cell.attack.kind()?;
    let stages = stage_gradients(spec, attack, cell.k, classes);
    let (first, later) = stages.split_first().expect("an attack has a stage");
    if first.1 {
        return None;
    }
    let whole: f64 = stages.iter().map(|(g, _)| g).sum();
    let check = cell.k > 0 && spec.convergence_sample > 0;
    let n = spec.examples.count() as f64;
    let broken_share = broken_share.clamp(0.0, 1.0);
    let mut before = clean.clamp(0.0, 1.0);
    let (mut total, mut checked) = (0.0, 0.0);
    // The attack's gradients times the share of the batch each is computed on: the first
    // stage's batch holds, on average over its run, the survivors and the broken examples for
    // their share of it; the later stages', the survivors.
    let mut rows_weighted = 0.0;
    for (j, &left) in standing.iter().enumerate() {
        let left = left.clamp(0.0, before);
        let first_rows = left + broken_share * (before - left);
        total += first.0 * first_rows;
        rows_weighted += first.0 * first_rows * first_rows;
        let later_gradients = later
            .iter()
            .map(|&(g, once)| match (once, j) {
                (false, _) | (true, 0) => g * left,
                (true, _) => 0.0,
            })
            .sum::<f64>();
        total += later_gradients;
        rows_weighted += later_gradients * left;
        if check {
            let sampled = (spec.convergence_sample as f64).min(left * n) / n;
            checked += (MORE_EOT + MORE_ITERATIONS) as f64 * sampled * whole;
        }
        before = left;
    }
    Some(Gradients {
        attack: total,
        attack_rows: if total > 0.0 {
            rows_weighted / total
        } else {
            1.0
        },
        check: checked,
    })
}

/// Input gradients one example takes at most at one ε in the first stage of `cell`'s attack
/// (its first attack, for a preset): what a broken example's cost is a share of.
pub fn first_stage_gradients(spec: &SweepSpec, cell: &Cell, classes: usize) -> Option<f64> {
    let attack = cell.attack.kind()?;
    Some(stage_gradients(spec, attack, cell.k, classes)[0].0)
}

/// What an example broken by a first stage costs where nothing says otherwise: half a run.
pub const HALF_RUN: f64 = 0.5;

/// The convergence check's cost relative to the cell's attack over `eps` budgets > 0: a
/// stochastic cell (K > 0) attacks up to its sample of the `n` examples again at each ε, with
/// more EOT draws and with more iterations; 0 where no check runs. A minimum-perturbation
/// attack answers every ε in one run, but its check runs it again at each.
pub fn check_factor(spec: &SweepSpec, cell: &Cell, eps: usize) -> f64 {
    if cell.k == 0 || spec.convergence_sample == 0 {
        return 0.0;
    }
    let n = spec.examples.count() as f64;
    let strengths = (MORE_EOT + MORE_ITERATIONS) as f64;
    let once = cell
        .attack
        .kind()
        .and_then(AttackKind::built_in)
        .is_some_and(|entry| entry.once_for_every_eps);
    let runs = if once { eps as f64 } else { 1.0 };
    strengths * runs * (spec.convergence_sample as f64).min(n) / n
}

/// When the last of the tasks [`schedule`] hands out ends: what they take on `workers` workers.
pub fn makespan(seconds: &[f64], speedups: &[f64], workers: usize) -> f64 {
    schedule(seconds, speedups, workers)
        .into_iter()
        .map(|(_, end)| end)
        .fold(0.0, f64::max)
}

/// When each of the tasks of `seconds` (each alone on the machine, in the order they start)
/// starts and ends, as (start, end), handed out to `workers` workers that each take the next
/// task as soon as they are free, as a sweep hands out its cells. The workers share one
/// machine: with `m` tasks running, task `i` runs at `min(1, speedups[i] / m)` of its pace
/// alone, where `speedups[i]` (between 1 and `workers`) is how many times more work `workers`
/// such tasks get done side by side than one alone. A task left running alone at the end has
/// the machine to itself again.
pub fn schedule(seconds: &[f64], speedups: &[f64], workers: usize) -> Vec<(f64, f64)> {
    let workers = workers.max(1);
    let mut spans = vec![(0.0, 0.0); seconds.len()];
    // Running tasks: (index, seconds of work alone still to do).
    let mut running: Vec<(usize, f64)> = Vec::new();
    let (mut next, mut now) = (0, 0.0_f64);
    loop {
        while running.len() < workers && next < seconds.len() {
            spans[next].0 = now;
            running.push((next, seconds[next].max(0.0)));
            next += 1;
        }
        if running.is_empty() {
            return spans;
        }
        let m = running.len() as f64;
        let pace = |i: usize| {
            let speedup = speedups.get(i).copied().unwrap_or(1.0);
            (speedup.clamp(1.0, workers as f64) / m).min(1.0)
        };
        // Until the first running task ends, every running one keeps its pace.
        let step = running
            .iter()
            .map(|&(i, left)| left / pace(i))
            .fold(f64::INFINITY, f64::min);
        now += step;
        for (i, left) in &mut running {
            *left -= step * pace(*i);
        }
        running.retain(|&(i, left)| {
            // What rounding leaves of the task that ended is no more work.
            let ended = left <= 1e-9 * seconds[i].max(1.0);
            if ended {
                spans[i].1 = now;
            }
            !ended
        });
    }
}

/// Seconds one example's loss gradient takes through `model`: the fastest of [`TIMED_CALLS`]
/// timed gradients of the batch `x`, after one that warms caches and allocation pools up.
/// Whatever else the machine does only adds time, and on a shared VM it added a lot to single
/// calls: the same WRN-10-1 at K = 1 came out at 12.8 and 8.1 ms an example in one estimate,
/// from one call each.
pub fn seconds_per_gradient<B: BenchBackend, M: Model<B>>(
    model: &M,
    x: Tensor<B::InnerBackend, 4>,
    y: Tensor<B::InnerBackend, 1, Int>,
) -> f64 {
    let n = x.dims()[0].max(1);
    let y = Tensor::<B, 1, Int>::from_inner(y);
    let loss = |logits: Tensor<B, 2>| AttackLoss::CrossEntropy.of(logits, y.clone());
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let seconds: Vec<f64> = (0..=TIMED_CALLS)
        .map(|_| {
            let started = Instant::now();
            let (g, _) = model.loss_gradient(x.clone(), &loss, &mut rng);
            // Wait for the result (an asynchronous backend would return at once).
            let _ = g.into_data();
            started.elapsed().as_secs_f64()
        })
        .skip(1)
        .collect();
    seconds.into_iter().fold(f64::INFINITY, f64::min) / n as f64
}

/// Gradients timed per estimate of one, after the warm-up.
pub const TIMED_CALLS: usize = 3;

pub use crate::duration::duration;

#[cfg(test)]
mod tests {
    use super::*;
    use jem_attacks::GradMode;

    fn cell(attack: AttackKind, k: usize) -> Cell {
        Cell {
            model: "m".into(),
            attack: CellAttack::Kind(attack.at(k)),
            k,
            grad: (k > 0).then_some(GradMode::Full),
        }
    }

    fn no_own(_: &str, _: usize) -> f64 {
        unreachable!("no own attacks here")
    }

    /// Ends of the tasks `schedule` hands out.
    fn ends(seconds: &[f64], speedup: f64, workers: usize) -> Vec<f64> {
        let speedups = vec![speedup; seconds.len()];
        schedule(seconds, &speedups, workers)
            .into_iter()
            .map(|(_, end)| end)
            .collect()
    }

    #[test]
    fn tasks_that_keep_their_pace_side_by_side_take_the_longest_worker_not_their_sum() {
        assert!(ends(&[], 2.0, 2).is_empty());
        assert_eq!(ends(&[3.0, 1.0, 1.0, 1.0], 1.0, 1), [3.0, 4.0, 5.0, 6.0]);
        // Worker 1: 3; worker 2: 1, 1, 1 (each taken as it frees).
        assert_eq!(ends(&[3.0, 1.0, 1.0, 1.0], 2.0, 2), [3.0, 1.0, 2.0, 3.0]);
        // Worker 1: 2, then 5 (free at 2 before worker 2 at 4); worker 2: 4.
        assert_eq!(ends(&[2.0, 4.0, 5.0], 2.0, 2), [2.0, 4.0, 7.0]);
        assert_eq!(ends(&[2.0, 4.0, 5.0], 8.0, 8), [2.0, 4.0, 5.0]);
    }

    #[test]
    fn tasks_that_share_the_cores_take_their_sum_and_the_last_one_speeds_up_alone() {
        // Sharing two cores, 2 and 4 seconds of work: both at half pace until the first ends
        // at 4, then the second alone for its last 2.
        assert_eq!(ends(&[2.0, 4.0], 1.0, 2), [4.0, 6.0]);
        // Half way between: each at 3/4 of its pace side by side.
        let spans = schedule(&[3.0, 6.0], &[1.5, 1.5], 2);
        assert_eq!(spans, [(0.0, 4.0), (0.0, 7.0)]);
        // A third task starts when a worker frees.
        assert_eq!(
            schedule(&[2.0, 4.0, 1.0], &[1.0; 3], 2),
            [(0.0, 4.0), (0.0, 7.0), (4.0, 6.0)]
        );
    }

    #[test]
    fn gradients_are_counted_per_attack_eot_and_eps() {
        let spec = SweepSpec::default();
        assert_eq!(spec.budgets.pgd_steps.get(), 20);
        // PGD: 20 steps × 1 restart × 1 draw, at each of 3 ε.
        assert_eq!(
            gradients_per_example(&spec, &cell(AttackKind::Pgd, 0), 3, 10, no_own),
            60.0
        );
        // The default at K = 1: APGD-CE and APGD-DLR, 100 iterations each, 4 draws (5 chains).
        assert_eq!(spec.eot_at(1), 4);
        assert_eq!(
            gradients_per_example(&spec, &cell(AttackKind::Adaptive, 1), 3, 10, no_own),
            2.0 * 100.0 * 4.0 * 3.0
        );
        // At K = 0: APGD-CE, APGD-T (9 targets) and Square (5 000 queries at half a gradient
        // each) at each ε, FAB-T (9 targets, a gradient and a forward pass per iteration) once
        // for every ε; one draw.
        assert_eq!(
            gradients_per_example(&spec, &cell(AttackKind::Adaptive, 0), 1, 10, no_own),
            100.0 + 900.0 + 900.0 * 1.5 + 2_500.0
        );
        assert_eq!(
            gradients_per_example(&spec, &cell(AttackKind::Adaptive, 0), 3, 10, no_own),
            (100.0 + 900.0 + 2_500.0) * 3.0 + 900.0 * 1.5
        );
        // Two classes leave one target.
        assert_eq!(
            gradients_per_example(&spec, &cell(AttackKind::ApgdT, 0), 1, 2, no_own),
            100.0
        );
    }

    /// Where a weaker run left every example standing, the expected count is the bound; where
    /// it broke them all at the first ε, only the first stage's half-run on the correctly
    /// classified ones remains.
    #[test]
    fn the_expected_count_is_the_bound_when_nothing_breaks_and_shrinks_with_the_survivors() {
        let spec = SweepSpec::default();
        for k in [0, 1] {
            let cell = cell(AttackKind::Adaptive, k);
            let bound = most_gradients_per_example(&spec, &cell, 3, 10, no_own);
            let all =
                expected_gradients_per_example(&spec, &cell, 10, 1.0, &[1.0; 3], HALF_RUN).unwrap();
            for (all, bound) in [(all.attack, bound.attack), (all.check, bound.check)] {
                assert!(
                    (all - bound).abs() <= 1e-9 * bound,
                    "K = {k}: {all} vs {bound}"
                );
            }
            let all = all.total();
            let none = expected_gradients_per_example(&spec, &cell, 10, 0.9, &[0.0; 3], HALF_RUN)
                .unwrap()
                .total();
            // APGD-CE's 100 iterations, each with the K's EOT draws, half-run on 90 %.
            let first = 100.0 * spec.eot_at(k) as f64;
            assert!((none - first * 0.5 * 0.9).abs() < 1e-9, "K = {k}: {none}");
            let some =
                expected_gradients_per_example(&spec, &cell, 10, 1.0, &[0.8, 0.5, 0.2], HALF_RUN)
                    .unwrap()
                    .total();
            assert!(
                none < some && some < all,
                "K = {k}: {none} < {some} < {all}"
            );
        }
        // A minimum-perturbation attack attacks every example once for every ε.
        let fab = cell(AttackKind::FabT, 0);
        assert_eq!(
            expected_gradients_per_example(&spec, &fab, 10, 1.0, &[0.5], HALF_RUN),
            None
        );
    }

    /// Broken examples cost the share of a run the pilot's broken examples took; a stage that
    /// answers every ε at once (FAB-T in the cascade at K = 0) counts once, on what stands at
    /// the smallest ε.
    #[test]
    fn broken_examples_cost_their_share_and_fab_t_counts_once_in_the_cascade() {
        let spec = SweepSpec::default();
        let k1 = cell(AttackKind::Adaptive, 1);
        let first = 100.0 * spec.eot_at(1) as f64;
        let none = expected_gradients_per_example(&spec, &k1, 10, 1.0, &[0.0; 3], 0.1)
            .unwrap()
            .total();
        assert!((none - first * 0.1).abs() < 1e-9, "{none}");
        let k0 = cell(AttackKind::Adaptive, 0);
        let standing = [0.5, 0.5, 0.5];
        let got = expected_gradients_per_example(&spec, &k0, 10, 1.0, &standing, 0.0)
            .unwrap()
            .total();
        // APGD-CE a whole run on the half standing at each ε (the half it breaks at the first
        // costs nothing here); APGD-T and Square on that half at each ε; FAB-T once on it.
        let want = 100.0 * 0.5 * 3.0 + (900.0 + 2_500.0) * 0.5 * 3.0 + 1_350.0 * 0.5;
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }

    /// An attack computes the examples still standing only: its gradients are priced at the
    /// batch they run on. Nothing broken: the whole batch; half standing from the start: half
    /// of it; half broken at the first ε at a fifth of a run each: the first stage's batch at
    /// that ε holds 0.5 + 0.2 × 0.5 of it on average, every later one 0.5.
    #[test]
    fn the_attacks_gradients_are_computed_on_the_examples_still_standing() {
        let spec = SweepSpec::default();
        let k1 = cell(AttackKind::Adaptive, 1);
        let rows = |clean, standing: &[f64], broken| {
            expected_gradients_per_example(&spec, &k1, 10, clean, standing, broken)
                .unwrap()
                .attack_rows
        };
        assert!((rows(1.0, &[1.0; 3], 0.5) - 1.0).abs() < 1e-12);
        assert!((rows(0.5, &[0.5; 3], 0.5) - 0.5).abs() < 1e-12);
        // APGD-CE first, APGD-DLR after it.
        let stages = stage_gradients(&spec, AttackKind::Adaptive.at(1), 1, 10);
        assert_eq!(stages.len(), 2);
        let (g1, g2) = (stages[0].0, stages[1].0);
        let weighted = g1 * 0.6 * 0.6 + g2 * 0.5 * 0.5 + 2.0 * (g1 + g2) * 0.5 * 0.5;
        let want = weighted / (g1 * 0.6 + g2 * 0.5 + 2.0 * (g1 + g2) * 0.5);
        let got = rows(1.0, &[0.5; 3], 0.2);
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        let most = most_gradients_per_example(&spec, &k1, 3, 10, no_own);
        assert_eq!(most.attack_rows, 1.0);
    }

    #[test]
    fn a_convergence_check_costs_its_sample_at_six_times_the_attack() {
        // 20 of 100 examples again with 4× the draws, and again with 2× the iterations.
        let spec = SweepSpec::default();
        assert_eq!((spec.examples.count(), spec.convergence_sample), (100, 20));
        let f = check_factor(&spec, &cell(AttackKind::Adaptive, 1), 3);
        assert!((f - 1.2).abs() < 1e-12, "{f}");
        // No check at K = 0 (deterministic); a sample larger than the examples is all of them.
        assert_eq!(check_factor(&spec, &cell(AttackKind::Adaptive, 0), 3), 0.0);
        let few = SweepSpec {
            examples: super::super::Examples::first(super::super::budgets::count(10)),
            ..spec.clone()
        };
        assert_eq!(check_factor(&few, &cell(AttackKind::Pgd, 1), 3), 6.0);
        // FAB-T alone runs once for every ε, and its check once at each of the 3.
        assert_eq!(check_factor(&few, &cell(AttackKind::FabT, 1), 3), 18.0);
    }
}
