//! The convergence check of a stochastic cell: a seeded sample of the examples its attack left
//! standing, attacked again with 4× the EOT draws and with 2× the iterations. An attack that
//! had converged breaks (almost) none of them. Each re-attack (one ε, one of the two
//! strengths) is kept in parts of about one attack batch's cost as they finish, where the cell
//! keeps its batches, so an interrupted sweep resumes the check instead of starting it again
//! (at K = 10 a check runs for hours on two cores, and one whole re-attack of 20 survivors
//! for longer than many runs are left alive).

use std::time::Instant;

use jem_attacks::{AttackOutcome, Model, Norm};
use serde::{Deserialize, Serialize};

use super::attack::{batch_seed, Stage};
use super::work::{CellWork, KeptPart};
use crate::backend::BenchBackend;
use crate::harness::budgets::count;
use crate::harness::estimate;
use crate::harness::spec::{PartKind, SweepSpec, MORE_EOT, MORE_ITERATIONS};

/// A kept part of a convergence check: some of one ε's sampled survivors under one re-attack.
struct CheckPart {
    /// Which ε's sample (an index into the check's samples).
    sample: usize,
    /// 0: more EOT draws; 1: more iterations.
    strength: usize,
    /// The part's number within its re-attack (its seed's mix).
    chunk: usize,
    /// The survivors it re-attacks (rows of the cell's examples, ascending).
    rows: Vec<usize>,
}

/// A kept part's outcome: per re-attacked survivor, whether it broke, and the seconds the part
/// took, which the cell's time counts when a rerun reads the part back.
#[derive(Serialize, Deserialize)]
struct KeptCheck {
    broken: Vec<bool>,
    seconds: f64,
}

impl KeptPart for KeptCheck {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// A cell's convergence check: one entry per ε with survivors, and the seconds that parts
/// read back had taken in the earlier runs that kept them (the cell's time adds them).
pub(in crate::harness) struct Checks {
    pub(in crate::harness) per_eps: Vec<ConvergenceCheck>,
    pub(in crate::harness) read_back_seconds: f64,
}

/// The number of examples in a stage's outcomes (every ε's outcome holds all of them).
fn last_len(stage: &Stage) -> usize {
    stage.outcomes.first().map_or(0, |(_, o)| o.examples.len())
}

/// One ε of a cell's convergence check (see [`SweepSpec::convergence_sample`]).
pub(in crate::harness) struct ConvergenceCheck {
    pub(in crate::harness) eps: f32,
    pub(in crate::harness) sampled: usize,
    pub(in crate::harness) broken_eot: usize,
    pub(in crate::harness) broken_iterations: usize,
    pub(in crate::harness) broken: usize,
}

/// The examples of one outcome standing at ε: correctly classified and not broken within ε
/// (a minimum-perturbation outcome answers every ε by its distance).
pub(in crate::harness) fn standing(
    outcome: &AttackOutcome,
    at: Option<f32>,
    norm: Norm,
    eps: f32,
) -> Vec<bool> {
    outcome
        .examples
        .iter()
        .map(|x| x.robust_under(at, norm, eps))
        .collect()
}

/// Per ε > 0 of `grid` where `last` left examples standing: a seeded sample of at most
/// `convergence_sample` of them (rows of the cell's examples, ascending).
fn sampled_survivors(spec: &SweepSpec, grid: &[f32], last: &Stage) -> Vec<(f32, Vec<usize>)> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut samples = Vec::new();
    for (i, &eps) in grid.iter().enumerate().filter(|(_, &e)| e > 0.0) {
        let (at, outcome) = last
            .outcomes
            .iter()
            .find(|(at, _)| at.is_none_or(|a| a == eps))
            .expect("a stage answers every ε of the grid");
        let mut survivors: Vec<usize> = standing(outcome, *at, spec.threat.norm, eps)
            .into_iter()
            .enumerate()
            .filter_map(|(row, ok)| ok.then_some(row))
            .collect();
        if survivors.is_empty() {
            continue;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(batch_seed(spec.seed, 1 + i));
        survivors.shuffle(&mut rng);
        survivors.truncate(spec.convergence_sample);
        survivors.sort_unstable();
        samples.push((eps, survivors));
    }
    samples
}

/// The convergence check of a stochastic cell: at each ε > 0, a seeded sample of the examples
/// the cell's attack (its last stage: a cascade's joint outcome) left standing is attacked
/// again with 4× the EOT draws, and again with 2× the iterations, each from a fresh seed. An
/// attack that had converged breaks (almost) none of them. Each re-attack is kept in the cell's
/// batch folder (`work.keep`) part by part as they finish and read back by a rerun.
pub(in crate::harness) fn convergence_checks<B: BenchBackend, M: Model<B>>(
    work: &CellWork<'_, '_, B, M>,
    last: &Stage,
) -> anyhow::Result<Checks> {
    let (spec, cell, grid) = (work.spec, work.cell, work.grid);
    let more_eot = SweepSpec {
        eot: Some(MORE_EOT * spec.eot_at(cell.k)),
        seed: crate::seeds::splitmix64(spec.seed ^ 0xC0_4EE7),
        ..spec.clone()
    };
    let more_iterations = SweepSpec {
        budgets: spec.budgets.scaled(count(MORE_ITERATIONS)),
        seed: crate::seeds::splitmix64(spec.seed ^ 0x17E7),
        ..spec.clone()
    };
    // Each ε's sample of survivors, then the re-attacks in order: ε by ε, more EOT then more
    // iterations (the order and seeds of a check run in one go, so kept parts change nothing).
    let samples = sampled_survivors(spec, grid, last);
    // Each re-attack is cut into parts that cost about one of the attack's batches (a quarter
    // of a batch's examples at 4× the draws, half at 2× the iterations), each kept as it
    // finishes: at K = 10 one whole re-attack of 20 survivors runs for hours on two cores. A
    // part's seed is its re-attack's mixed with the part's number, as the attack's batches'
    // are (part 0 keeps the re-attack's own).
    let strengths = [(&more_eot, MORE_EOT), (&more_iterations, MORE_ITERATIONS)];
    let batch_len = spec.examples.batch_len(last_len(last));
    let mut parts: Vec<CheckPart> = Vec::new();
    for (sample, (_, survivors)) in samples.iter().enumerate() {
        for (strength, &(_, times)) in strengths.iter().enumerate() {
            for (chunk, rows) in survivors.chunks(batch_len.div_ceil(times)).enumerate() {
                parts.push(CheckPart {
                    sample,
                    strength,
                    chunk,
                    rows: rows.to_vec(),
                });
            }
        }
    }
    let dir = work.keep.join("convergence");
    // Each part's share of the cell's estimated cost, which counts a whole sample at every
    // ε > 0, each re-attack in proportion to the gradients it takes.
    let eps = grid.iter().filter(|&&e| e > 0.0).count();
    let factor = estimate::check_factor(spec, cell, eps);
    let share = |part: &CheckPart| {
        let times = strengths[part.strength].1 as f64;
        let of_sample = part.rows.len() as f64 / samples[part.sample].1.len() as f64;
        factor / (1.0 + factor) / eps.max(1) as f64 * times / (MORE_EOT + MORE_ITERATIONS) as f64
            * of_sample
    };
    let compute = |j: usize| {
        let started = Instant::now();
        let part = &parts[j];
        let eps = samples[part.sample].0;
        let strength = SweepSpec {
            seed: batch_seed(strengths[part.strength].0.seed, part.chunk),
            ..strengths[part.strength].0.clone()
        };
        // The re-attack with more iterations: an own attack is told to double its budgets.
        let factor = if part.strength == 1 {
            MORE_ITERATIONS
        } else {
            1
        };
        let stages = work.attack(&strength, factor, &part.rows, &[eps])?;
        let last = stages.last().expect("every cell runs an attack");
        let (at, outcome) = &last.outcomes[0];
        let broken = standing(outcome, *at, spec.threat.norm, eps)
            .into_iter()
            .map(|ok| !ok)
            .collect();
        let seconds = started.elapsed().as_secs_f64();
        Ok(KeptCheck { broken, seconds })
    };
    let fits = |j: usize, kept: &KeptCheck| {
        let (rows, held) = (parts[j].rows.len(), kept.broken.len());
        (held == rows).then_some(()).ok_or(format!(
            "{held} outcomes, where this part re-attacks {rows}"
        ))
    };
    let (kept, read_back_seconds): (Vec<KeptCheck>, f64) = work.parts(
        PartKind::ConvergenceCheck,
        &dir,
        parts.len(),
        |j| share(&parts[j]),
        fits,
        compute,
    )?;
    // Each sample's outcomes under each re-attack, its parts joined in order.
    let mut joined = vec![[Vec::new(), Vec::new()]; samples.len()];
    for (part, kept) in parts.iter().zip(&kept) {
        joined[part.sample][part.strength].extend_from_slice(&kept.broken);
    }
    let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
    let per_eps = samples
        .iter()
        .zip(joined)
        .map(|((eps, survivors), [eot, iterations])| ConvergenceCheck {
            eps: *eps,
            sampled: survivors.len(),
            broken_eot: count(&eot),
            broken_iterations: count(&iterations),
            broken: eot
                .iter()
                .zip(&iterations)
                .filter(|(a, b)| **a || **b)
                .count(),
        })
        .collect();
    Ok(Checks {
        per_eps,
        read_back_seconds,
    })
}
