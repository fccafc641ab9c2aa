//! One cell of a sweep: its attack run batch by batch on the cell's examples (each batch kept as
//! it finishes, so a killed cell resumes), the model probed for stochasticity and zero
//! gradients, the convergence check where the model is stochastic, and the rows and
//! per-example records it adds to the outputs.

use std::time::Instant;

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{AttackOutcome, Classifier, GradMode, MinimumPerturbation, Model};
use jem_datasets::ImageSet;
use serde::{Deserialize, Serialize};

use super::adversarials::save_adversarials;
use super::attack_config::Configured;
use super::cells::{Cell, CellAttack};
use super::convergence::convergence_checks;
use super::estimate;
use super::kept_parts;
use super::outputs::{CellResult, ExampleRow, GradColumn, RowAttack, TidyRow};
use super::own_attack::{gradient_use, OwnAttack};
use super::plan::Plan;
use super::robustness;
use super::spec::{CellPart, PartKind, SweepSpec};
use super::subject::Subject;
use burn::tensor::backend::AutodiffBackend;

use crate::backend::BenchBackend;
use crate::batches;
use crate::defended::Defended;
use crate::model::SOFTWARE;
use crate::settings::InvalidSetting;

/// A batch of test images and their labels.
pub(super) type Examples<B> = (
    Tensor<<B as AutodiffBackend>::InnerBackend, 4>,
    Tensor<<B as AutodiffBackend>::InnerBackend, 1, Int>,
);

/// The test images a cell attacks: the first `--n-examples` of its subject's test set.
pub(super) struct Loaded<'a> {
    pub(super) data: &'a ImageSet,
    pub(super) spec: &'a str,
    pub(super) indices: Vec<usize>,
}

impl<'a> Loaded<'a> {
    pub(super) fn of<B: BenchBackend, N: Module<B>>(
        spec: &SweepSpec,
        subject: &'a Subject<B, N>,
    ) -> Self {
        Loaded {
            data: subject.test_set(),
            spec: subject.data_name(),
            indices: (0..spec.n_examples).collect(),
        }
    }
}

/// What every kept part of one cell's run (an attack batch, a part of its convergence check)
/// needs: the sweep's identity and settings, the cell, its attack on the defended model, the
/// ε grid, how to load a batch of its examples, where its parts are kept and whom to tell.
pub(super) struct CellWork<'a, 'b, B: BenchBackend, M: Model<B>> {
    /// The sweep's identity, which every kept part records.
    identity: &'a str,
    pub(super) spec: &'a SweepSpec,
    pub(super) cell: &'a Cell,
    build: &'a Build<'b, B, M>,
    defended: &'a M,
    /// The ε grid, ascending.
    pub(super) grid: &'a [f32],
    /// The images and labels of the given rows of the cell's examples.
    batch: &'a dyn Fn(&[usize]) -> Examples<B>,
    /// The cell's batch folder, where its parts are kept until it finishes.
    pub(super) keep: std::path::PathBuf,
    /// Told of each part as it is kept or read back.
    report: &'a dyn Fn(CellPart) -> anyhow::Result<()>,
}

impl<B: BenchBackend, M: Model<B>> CellWork<'_, '_, B, M> {
    /// The cell's attack, with `settings` (the sweep's, or a batch's or a re-attack's variant
    /// of them), on the given rows of its examples at every ε of `grid`.
    pub(super) fn attack(
        &self,
        settings: &SweepSpec,
        rows: &[usize],
        grid: &[f32],
    ) -> anyhow::Result<Vec<Stage>> {
        let (x, y) = (self.batch)(rows);
        attack_batch(settings, self.cell, self.build, self.defended, x, y, grid)
    }

    /// The cell's `count` parts of one `kind`, each kept in `dir` as `compute` finishes it and
    /// read back by a rerun (refused unless it `fits`: see [`kept_parts::resumable_batches`]), the
    /// observer told of each with its `share` of the cell's estimated cost. Returns the parts in
    /// order and the seconds that those read back had taken in the earlier, interrupted runs
    /// that kept them (the cell's time counts them).
    pub(super) fn parts<T: KeptPart>(
        &self,
        kind: PartKind,
        dir: &std::path::Path,
        count: usize,
        share: impl Fn(usize) -> f64,
        fits: impl Fn(usize, &T) -> Result<(), String>,
        compute: impl FnMut(usize) -> anyhow::Result<T>,
    ) -> anyhow::Result<(Vec<T>, f64)> {
        let mut read_back = Vec::new();
        let kept = |index: usize, seconds: Option<f64>| {
            if seconds.is_none() {
                read_back.push(index);
            }
            (self.report)(CellPart {
                cell: self.cell.clone(),
                kind,
                index,
                count,
                seconds: seconds.unwrap_or(0.0),
                share: share(index),
                resumed: seconds.is_none(),
            })
        };
        let owner = kept_parts::PartOwner {
            sweep: self.identity,
            cell: self.cell,
            kind,
        };
        // A part's time counts in the cell's: it must be one.
        let fits = |j: usize, part: &T| {
            let seconds = part.seconds();
            if !(seconds.is_finite() && seconds >= 0.0) {
                return Err(format!("it took {seconds} s, not a time"));
            }
            fits(j, part)
        };
        let parts = kept_parts::resumable_batches(dir, owner, count, fits, compute, kept)?;
        let read_back_seconds = read_back.iter().map(|&j| parts[j].seconds()).sum();
        Ok((parts, read_back_seconds))
    }
}

/// A kept part of a cell's run, as a rerun reads it back: it records the seconds it took.
pub(super) trait KeptPart: Serialize + serde::de::DeserializeOwned {
    /// The seconds computing the part took.
    fn seconds(&self) -> f64;
}

impl KeptPart for BatchResult {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}

/// Runs `cell` of `plan`'s sweep (`identity`, `spec`) in the folder `out`, resuming from the
/// parts an earlier run kept there; `report` is told of each part.
pub(super) fn run_cell<B: BenchBackend, N: Classifier<B> + Module<B> + 'static>(
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

/// Examples per batch of a cell of `n` examples.
pub(super) fn batch_len(spec: &SweepSpec, n: usize) -> usize {
    spec.batch_size.unwrap_or(n).max(1)
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
    let chunks: Vec<&[usize]> = all.chunks(batch_len(spec, n)).collect();
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
        let mut stages = work.attack(&batch_args, chunks[j], grid)?;
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

/// What every row of a cell records besides its counts and attack.
struct CellFacts {
    probe: Probe,
    /// The defence's settings.
    defence: serde_json::Value,
    /// The backend and device, as outputs name them.
    backend: String,
    /// The sweep's own attacks, each with whether it follows gradients (and so has EOT draws).
    own: Vec<(String, bool)>,
}

/// The rows (per stage and ε) and per-example records of a cell's finished `stages`; the rows'
/// counts, accuracies and intervals are left for [`robustness::with_own_rates`] to compute from
/// the examples (NaN until then).
fn rows_and_examples(
    spec: &SweepSpec,
    cell: &Cell,
    stages: &[Stage],
    loaded: &Loaded,
    eps_grid: &[f32],
    facts: &CellFacts,
) -> (Vec<TidyRow>, Vec<ExampleRow>) {
    let (probe, defence_settings) = (&facts.probe, &facts.defence);
    let (n, norm) = (loaded.indices.len(), spec.norm);
    let grad = GradColumn::of(cell.grad);
    let row = |stage: &Stage, eps: f32| {
        let gradients = stage.name.follows_gradients(&facts.own) == Some(true);
        TidyRow {
            model: cell.model.clone(),
            attack: stage.name.clone(),
            norm,
            eps,
            k: cell.k,
            grad,
            n,
            clean_accuracy: f64::NAN,
            clean_lo: f64::NAN,
            clean_hi: f64::NAN,
            robust_accuracy: f64::NAN,
            robust_lo: f64::NAN,
            robust_hi: f64::NAN,
            eot: if gradients { spec.eot_at(cell.k) } else { 0 },
            restarts: stage
                .name
                .single()
                .map_or(spec.restarts, |kind| spec.restarts_of(kind)),
            chains: if cell.k > 0 { spec.defence.chains } else { 0 },
            recheck_chains: if cell.k > 0 {
                spec.defence.recheck_chains
            } else {
                0
            },
            seed: spec.seed,
            attack_settings: stage.settings.to_string(),
            defence: defence_settings.to_string(),
            stochastic: probe.stochastic,
            zero_gradients: probe.zero_gradients,
            // A quick look's rows are upper bounds; BPDA rows at K > 0 are marked where the
            // rows are assembled (robustness::tidy_rows).
            upper_bound: spec.quick,
            check_sampled: None,
            check_broken_eot: None,
            check_broken_iterations: None,
            check_broken: None,
            data: loaded.spec.to_string(),
            software: SOFTWARE.into(),
            backend: facts.backend.clone(),
        }
    };
    let mut rows = Vec::new();
    let mut examples = Vec::new();
    for stage in stages {
        for (eps, outcome) in &stage.outcomes {
            let ex = &outcome.examples;
            match eps {
                Some(e) => rows.push(row(stage, *e)),
                None => rows.extend(eps_grid.iter().map(|&e| row(stage, e))),
            }
            examples.extend(ex.iter().zip(&loaded.indices).map(|(e, &i)| ExampleRow {
                model: cell.model.clone(),
                attack: stage.name.clone(),
                norm,
                eps: *eps,
                k: cell.k,
                grad,
                example: i,
                label: loaded.data.labels[i],
                clean_correct: e.clean_correct,
                adversarial: e.adversarial,
                l0: e.l0,
                l2: e.l2,
                linf: e.linf,
                gradient_evals: e.gradient_evals,
                forward_evals: e.forward_evals,
            }));
        }
    }
    (rows, examples)
}

/// Builds a cell's attack from the sweep's settings and the gradient draws per step: a
/// built-in attack or preset ([`AttackKind::build`]), or an own attack's builder.
pub(super) type Build<'a, B, M> = dyn Fn(&SweepSpec, usize) -> Configured<'a, B, M> + 'a;

/// The builder of `cell`'s attack on the defended network.
pub(super) fn builder<'a, B: BenchBackend, N: Classifier<B> + 'static>(
    cell: &'a Cell,
    own: &'a [OwnAttack<B, N>],
) -> impl Fn(&SweepSpec, usize) -> Configured<'a, B, Defended<N>> + 'a {
    move |spec, eot| match &cell.attack {
        CellAttack::Kind(kind) => kind.build(spec, eot),
        CellAttack::Own(name) => {
            let attack = own.iter().find(|o| o.name() == name);
            Configured::PerEps(
                attack
                    .expect("the plan lists every own attack")
                    .attack(spec, eot),
            )
        }
    }
}

/// Runs a cell's attack (each stage of a preset's cascade) on one batch of examples.
pub(super) fn attack_batch<B: BenchBackend, M: Model<B>>(
    spec: &SweepSpec,
    cell: &Cell,
    build: &Build<'_, B, M>,
    defended: &M,
    x: Tensor<B::InnerBackend, 4>,
    y: Tensor<B::InnerBackend, 1, Int>,
    grid: &[f32],
) -> anyhow::Result<Vec<Stage>> {
    let failed = |e: String| InvalidSetting::new("attacks", cell.attack.name().into(), &e);
    let name = match &cell.attack {
        CellAttack::Kind(kind) => RowAttack::Attack(*kind),
        CellAttack::Own(name) => RowAttack::Own(name.clone()),
    };
    Ok(match build(spec, spec.eot_at(cell.k)) {
        Configured::PerEps(attack) => {
            let per_eps = attack.attack(defended, x, y, grid).map_err(failed)?;
            vec![Stage {
                name,
                settings: attack.settings(),
                outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
            }]
        }
        Configured::Minimum(attack) => vec![Stage {
            name,
            settings: attack.settings(),
            outcomes: vec![(None, attack.run_once(defended, x, y))],
        }],
        Configured::Cascade(kinds, cascade) => {
            let preset = cell.attack.kind().expect("a cascade is a preset's");
            let joint = cascade.stages(defended, x, y, grid).map_err(failed)?;
            kinds
                .iter()
                .zip(&cascade.attacks)
                .zip(joint)
                .map(|((&kind, attack), per_eps)| Stage {
                    name: RowAttack::Stage {
                        preset,
                        stage: kind,
                    },
                    settings: attack.settings(),
                    outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
                })
                .collect()
        }
    })
}

/// The attacks' seed for batch `j`: the sweep's own for the first batch (so one batch gives
/// the numbers of an unbatched run), a SplitMix64 mix of (seed, j) for the others.
pub(super) fn batch_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    crate::seeds::splitmix64(seed ^ (j as u64).wrapping_mul(crate::seeds::GOLDEN))
}

impl Stage {
    /// This stage's outcomes followed by the next batch's.
    pub(super) fn append(self, next: Stage) -> Stage {
        let outcomes = self
            .outcomes
            .into_iter()
            .zip(next.outcomes)
            .map(|((eps, mut a), (_, b))| {
                a.examples.extend(b.examples);
                a.inputs.extend(b.inputs);
                a.shape[0] += b.shape[0];
                (eps, a)
            })
            .collect();
        Stage { outcomes, ..self }
    }
}

/// One batch of a cell: its stages and the seconds it took.
#[derive(Serialize, Deserialize)]
pub(super) struct BatchResult {
    pub(super) seconds: f64,
    pub(super) stages: Vec<Stage>,
}

/// One attack's outcomes in a cell: the cell's attack, or one stage of a preset's cascade
/// (`autoattack/apgd-t`: the joint outcome of APGD-T and the attacks before it).
#[derive(Serialize, Deserialize)]
pub(super) struct Stage {
    /// The row's attack: the cell's, or `preset/stage`; whether it follows gradients and its
    /// restarts are read from it.
    pub(super) name: RowAttack,
    pub(super) settings: serde_json::Value,
    /// Per ε of the grid, ascending; one entry with no ε for a minimum-perturbation attack.
    pub(super) outcomes: Vec<(Option<f32>, AttackOutcome)>,
}

/// What two clean passes and one gradient say about the defended model (AutoAttack's checks
/// for randomness and for masked gradients), on the first [`PROBED`] attacked images; an error
/// where the logits or the gradient are not finite, from which no accuracy means anything.
pub(super) struct Probe {
    /// Two passes on the same inputs gave different logits: attack with EOT.
    pub(super) stochastic: bool,
    /// Correctly classified probed images whose loss gradient is exactly zero.
    pub(super) zero_gradients: usize,
}

pub(super) const PROBED: usize = 16;

pub(super) fn probe<B: BenchBackend, M: Model<B>>(
    model: &M,
    loaded: &Loaded,
    seed: u64,
    device: &B::Device,
) -> anyhow::Result<Probe> {
    use jem_attacks::AttackLoss;
    use rand::SeedableRng;
    let idx = &loaded.indices[..loaded.indices.len().min(PROBED)];
    let x = batches::images::<B::InnerBackend>(loaded.data, idx, device);
    let labels: Vec<i64> = idx.iter().map(|&i| loaded.data.labels[i] as i64).collect();
    let n = labels.len();
    let y =
        Tensor::<B::InnerBackend, 1, Int>::from_data(TensorData::new(labels.clone(), [n]), device);
    // A stream of its own, so that probing does not change any attack's draws.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5052_4f42_4521);
    let first = model.logits(x.clone(), &mut rng);
    let second = model.logits(x.clone(), &mut rng);
    let differ = batches::to_vec((first.clone() - second).abs().max());
    let y_tracked = Tensor::<B, 1, Int>::from_inner(y);
    let loss = |logits: Tensor<B, 2>| AttackLoss::CrossEntropy.of(logits, y_tracked.clone());
    let (g, _) = model.loss_gradient(x, &loss, &mut rng);
    for (what, values) in [
        ("logits", batches::to_vec(first.clone())),
        ("input gradient", batches::to_vec(g.clone())),
    ] {
        anyhow::ensure!(
            values.iter().all(|v| v.is_finite()),
            "the model's {what} on the first {n} test images are not finite: no accuracy \
             computed from it would mean anything"
        );
    }
    let largest = batches::to_vec(g.abs().flatten::<2>(1, 3).max_dim(1));
    let predicted = batches::to_vec(first.argmax(1).float());
    let zero_gradients = (0..n)
        .filter(|&i| predicted[i] as i64 == labels[i] && largest[i] == 0.0)
        .count();
    Ok(Probe {
        stochastic: differ[0] > 1e-6,
        zero_gradients,
    })
}
