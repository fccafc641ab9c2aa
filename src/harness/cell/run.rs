//! One cell of a sweep, from its examples to its result: its attack run batch by batch (each
//! batch kept as it finishes, so a killed cell resumes), the model probed, the convergence
//! check where the model is stochastic, the adversarials saved if asked, and its rows.

use std::time::Instant;

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{Classifier, GradMode, Model};

use super::adversarials::save_adversarials;
use super::attack::{batch_seed, builder, BatchResult, Stage};
use super::convergence::convergence_checks;
use super::probe::probe;
use super::rows::{rows_and_examples, CellFacts};
use super::work::{CellWork, Loaded};
use crate::backend::BenchBackend;
use crate::batches;
use crate::defended::Defended;
use crate::harness::cells::Cell;
use crate::harness::own_attack::gradient_use;
use crate::harness::plan::Plan;
use crate::harness::rows::CellResult;
use crate::harness::spec::{CellPart, PartKind, SweepSpec};
use crate::harness::{estimate, kept_parts, robustness};

/// Runs `cell` of `plan`'s sweep (`identity`, `spec`) in the folder `out`, resuming from the
/// parts an earlier run kept there; `report` is told of each part.
pub(in crate::harness) fn run_cell<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
    plan: &Plan<B, N>,
    out: &std::path::Path,
    identity: &str,
    spec: &SweepSpec,
    cell: &Cell,
    report: &dyn Fn(CellPart) -> anyhow::Result<()>,
) -> anyhow::Result<CellResult> {
    let started = Instant::now();
    let (subject, own, eps_grid) = (plan.subject(cell), &plan.own, &plan.eps_grid);
    let device = subject.device();
    let loaded = Loaded::of(spec, subject);
    let n = loaded.indices.len();
    let grad_mode = cell.grad.unwrap_or(GradMode::Bpda);
    let sgld = subject.sgld();
    let defence_settings = crate::defended::settings(sgld, cell.k, grad_mode, &spec.defence)?;
    let defended = Defended::new(subject.network(), sgld, cell.k, grad_mode, &spec.defence)?;
    let build = builder(cell, own);
    let batch = |rows: &[usize]| {
        let idx: Vec<usize> = rows.iter().map(|&r| loaded.indices[r]).collect();
        let labels: Vec<i64> = idx.iter().map(|&i| loaded.data.labels[i] as i64).collect();
        (
            batches::images::<B::InnerBackend>(loaded.data, &idx, device),
            Tensor::<B::InnerBackend, 1, Int>::from_data(
                TensorData::new(labels, [idx.len()]),
                device,
            ),
        )
    };

    let mut grid = eps_grid.to_vec();
    grid.sort_by(f32::total_cmp);
    let work = CellWork {
        identity,
        spec,
        cell,
        build: &build,
        defended: &defended,
        grid: &grid,
        batch: &batch,
        keep: kept_parts::batches_dir(out, cell),
        report,
    };
    let (stages, attack_read_back) = attack_in_batches(&work, n)?;
    let all: Vec<usize> = (0..n).collect();
    if spec.save_adversarials {
        // A cascade's adversarials are its last stage's: the joint outcome of all its attacks.
        let last = stages.last().expect("every cell runs an attack");
        for (eps, outcome) in &last.outcomes {
            save_adversarials(out, identity, cell, *eps, &loaded, &all, outcome)?;
        }
    }

    let probe = probe(&defended, &loaded, spec.seed, device)
        .with_context(|| format!("{} K={}", cell.model, cell.k))?;
    let last = stages.last().expect("every cell runs an attack");
    let (convergence, check_read_back) = if probe.stochastic && spec.convergence_sample > 0 {
        let checks = convergence_checks(&work, last)?;
        (checks.per_eps, checks.read_back_seconds)
    } else {
        (Vec::new(), 0.0)
    };
    let facts = CellFacts {
        probe,
        defence: defence_settings,
        backend: B::recorded_name(device),
        own: gradient_use(own),
    };
    let (mut rows, examples) = rows_and_examples(spec, cell, &stages, &loaded, eps_grid, &facts);
    // The convergence check is of the cell's last stage (a cascade's joint outcome).
    for r in rows.iter_mut().filter(|r| r.attack == last.name) {
        if let Some(c) = convergence.iter().find(|c| c.eps == r.eps) {
            r.check_sampled = Some(c.sampled);
            r.check_broken_eot = Some(c.broken_eot);
            r.check_broken_iterations = Some(c.broken_iterations);
            r.check_broken = Some(c.broken);
        }
    }
    robustness::with_own_rates(CellResult {
        cell: cell.clone(),
        identity: identity.to_string(),
        // Parts an earlier, interrupted run kept count with the time they took then.
        seconds: started.elapsed().as_secs_f64() + attack_read_back + check_read_back,
        rows,
        examples,
    })
}

/// Per attack (several for a preset's cascade), per ε of the grid (ascending; or once, for a
/// minimum-perturbation attack): every one of the cell's `n` examples' outcome, batch after
/// batch. Returns the stages joined over the batches and the seconds that batches read back
/// had taken in the earlier, interrupted runs that kept them.
fn attack_in_batches<B: BenchBackend, M: Model<B>>(
    work: &CellWork<'_, '_, B, M>,
    n: usize,
) -> anyhow::Result<(Vec<Stage>, f64)> {
    let (spec, cell, grid) = (work.spec, work.cell, work.grid);
    // Per attack (several for a preset's cascade), per ε (or once, for a minimum-perturbation
    // attack): every example's outcome, batch after batch.
    let all: Vec<usize> = (0..n).collect();
    let chunks: Vec<&[usize]> = all.chunks(spec.examples.batch_len(n)).collect();
    // Each batch is kept as it finishes, a single one too: a killed sweep resumes mid-cell (an
    // AutoAttack cascade on 1 000 images runs for hours on two cores, and so does one adaptive
    // cell through K > 0 SGLD steps on 100, its attack and then its convergence check).
    let eps = grid.iter().filter(|&&e| e > 0.0).count();
    let share = 1.0 / (1.0 + estimate::check_factor(spec, cell, eps)) / chunks.len() as f64;
    let compute = |j| {
        let batch_started = Instant::now();
        let batch_args = SweepSpec {
            seed: batch_seed(spec.seed, j),
            ..spec.clone()
        };
        let mut stages = work.attack(&batch_args, 1, chunks[j], grid)?;
        if !spec.save_adversarials {
            // Only saved adversarials need the inputs; batch files stay small without them.
            for (_, outcome) in stages.iter_mut().flat_map(|s| &mut s.outcomes) {
                outcome.inputs = Vec::new();
            }
        }
        let seconds = batch_started.elapsed().as_secs_f64();
        Ok(BatchResult { seconds, stages })
    };
    let fits = |j: usize, batch: &BatchResult| {
        let held = batch
            .stages
            .first()
            .and_then(|s| s.outcomes.first())
            .map_or(0, |(_, o)| o.examples.len());
        let rows = chunks[j].len();
        (held == rows)
            .then_some(())
            .ok_or(format!("{held} examples, where this batch has {rows}"))
    };
    let (parts, read_back_seconds) = work.parts(
        PartKind::AttackBatch,
        &work.keep,
        chunks.len(),
        |_| share,
        fits,
        compute,
    )?;
    let mut stages: Vec<Stage> = Vec::new();
    for part in parts {
        stages = if stages.is_empty() {
            part.stages
        } else {
            stages
                .into_iter()
                .zip(part.stages)
                .map(|(s, p)| s.append(p))
                .collect()
        };
    }
    Ok((stages, read_back_seconds))
}
