//! `jem-bench robust`: lists the cells of a sweep, runs those not finished yet (each saved
//! atomically), and rebuilds the outputs: `robust.csv`, `examples.csv`, `summary.json` (clean
//! and worst-case robust accuracy per model, K and ε, with the sanity checks) and a table.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use jem_attacks::{
    ApgdConfig, ApgdLoss, Attack, AttackOutcome, BoundaryConfig, Cascade, Classifier, FabConfig,
    GradMode, MinimumNorm, MinimumPerturbation, Model, Norm, PgdConfig, PointwiseConfig,
    SquareConfig,
};
use jem_datasets::ImageSet;
use serde::{Deserialize, Serialize};

use super::cells::{self, AttackKind, Cell};
use super::estimate;
use super::outputs::{self, CellResult, ExampleRow, TidyRow};
use super::report;
use super::robustness::wilson;
use super::subject::Subject;
use crate::backend::{self, Inference, Train};
use crate::batches;
use crate::defended::{DefenceArgs, Defended};
use crate::model::{write_atomic, WideResNet, SOFTWARE};
use crate::output_folder::FolderLock;

/// Stored in every sweep's settings.json; fields missing there (settings of an older version)
/// take their command-line defaults, so stored references keep loading.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct RobustArgs {
    /// Threat model: linf or l2.
    #[arg(long, default_value = "linf")]
    pub norm: Norm,
    /// Checkpoints, comma-separated (default: the embedded baseline, JEM and adversarially
    /// trained models that exist under results/models/).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// Attacks, comma-separated; presets `autoattack` (APGD-CE → APGD-T → FAB-T → Square) and
    /// `autoattack-rand` (APGD-CE → APGD-DLR, with EOT) run their attacks as a cascade, each on
    /// what the ones before left standing. The default, `adaptive`, is `autoattack` at K = 0
    /// and `autoattack-rand` at K > 0 with gradients through the SGLD steps (--grad full)
    /// averaged over EOT draws: the evaluation a stochastic test-time defence has to survive.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "adaptive")]
    pub attacks: Vec<AttackKind>,
    /// ε grid in [0, 1] pixel units (default: 0,0.1,0.2,0.3 for linf; 0,1,2,3 for l2).
    #[arg(long, value_delimiter = ',')]
    pub eps: Vec<f32>,
    /// SGLD sampling steps K of the defence.
    /// (K = 10 through 5 chains costs about 10× K = 1 per attack step: add it when there is
    /// time.)
    #[arg(long = "steps", value_delimiter = ',', default_value = "0,1")]
    pub ks: Vec<usize>,
    /// Gradient modes through the SGLD steps (K > 0): full (exact reverse mode through every
    /// step), bpda (the steps taken as the identity on the way back: a weaker attack, whose
    /// robust accuracies are upper bounds).
    #[arg(long, value_delimiter = ',', default_value = "full")]
    pub grad: Vec<GradMode>,
    /// Gradient draws averaged per step of the gradient attacks (EOT). Default: 1 at K = 0
    /// (a deterministic model); at K > 0 enough draws for 20 SGLD noise samples per gradient,
    /// AutoAttack's count for randomised defences, each draw averaging --chains chains
    /// (4 with the default 5 chains).
    #[arg(long)]
    pub eot: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub restarts: usize,
    /// PGD steps (foolbox's default is 40; lowered so that the default sweep fits a CPU).
    #[arg(long, default_value_t = 20)]
    pub pgd_steps: usize,
    /// PGD step size as a fraction of ε (default 2.5 / steps, so that the steps can cross the
    /// ball 1.25 times from a random start, as foolbox's 40 steps of ε/30 do).
    #[arg(long)]
    pub pgd_rel_stepsize: Option<f32>,
    /// APGD iterations per run (AutoAttack: 100).
    #[arg(long, default_value_t = 100)]
    pub apgd_iterations: usize,
    /// Square-attack queries per example (AutoAttack: 5 000).
    #[arg(long, default_value_t = 5000)]
    pub square_queries: usize,
    /// FAB-T iterations per target class (AutoAttack: 100).
    #[arg(long, default_value_t = 100)]
    pub fab_iterations: usize,
    /// Boundary-attack steps (foolbox's default is 25 000).
    #[arg(long, default_value_t = 1000)]
    pub boundary_steps: usize,
    /// The first N images of the test split (100: intervals of about ±10 points at 50 %).
    #[arg(long, default_value_t = 100)]
    pub n_examples: usize,
    /// Convergence check of every stochastic cell (K > 0): at each ε, up to this many of the
    /// examples the attack left standing (a seeded sample) are attacked again, once with 4×
    /// the EOT draws and once with 2× the iterations (steps, queries); a robust accuracy that
    /// then falls below the first estimate's 95 % interval is flagged in the table and in
    /// summary.json. 0: no check.
    #[arg(long, default_value_t = 20)]
    pub convergence_sample: usize,
    /// Examples attacked at once (default: all of a cell's). Bounds memory for a large
    /// --n-examples: a batch holds its images × chains activations. Batch j > 0 seeds its
    /// attacks from (--seed, j), so the numbers depend on the batch size as on the seed.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    /// Data set (default: the one each model was trained on).
    #[arg(long)]
    pub data: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub defence: DefenceArgs,
    /// Keep each cell's returned inputs: `OUT/adversarials/CELL.safetensors` (`inputs`
    /// [N, C, H, W] in [0, 1], `clean`, `labels`, `examples` (test-set indices), `adversarial`
    /// flags) and `CELL.png` (up to 8 broken examples: clean above, adversarial below).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub save_adversarials: bool,
    /// Output folder (default: runs/robust-NORM). Re-running the same command resumes.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run only every n-th cell starting at i (`i/n`), e.g. one Slurm array task per shard;
    /// join the folders with `jem-bench merge`.
    #[arg(long)]
    pub shard: Option<Shard>,
    /// Cells run at once, each on its own thread (default: the number of cores). Results do
    /// not depend on it, so it is not part of the sweep's settings.
    #[arg(long, default_value_t = default_jobs())]
    #[serde(skip)]
    pub jobs: usize,
}

/// SGLD noise samples per gradient that the default EOT aims at: AutoAttack's 20 draws for
/// randomised defences (Croce & Hein 2020).
const EOT_NOISE_SAMPLES: usize = 20;

fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for RobustArgs {
    fn default() -> Self {
        crate::train::clap_defaults()
    }
}

impl RobustArgs {
    fn eps_grid(&self) -> Vec<f32> {
        if !self.eps.is_empty() {
            return self.eps.clone();
        }
        match self.norm {
            Norm::Linf => vec![0.0, 0.1, 0.2, 0.3],
            Norm::L2 => vec![0.0, 1.0, 2.0, 3.0],
        }
    }

    /// PGD steps and step size (fraction of ε) of a PGD cell; `pgd-long` takes 4× the steps,
    /// each 4× shorter, so that it can cross the ball as often but more finely.
    pub(super) fn pgd_schedule(&self, attack: AttackKind) -> (usize, f32) {
        let factor = if attack == AttackKind::PgdLong { 4 } else { 1 };
        let steps = self.pgd_steps * factor;
        let rel = self
            .pgd_rel_stepsize
            .map_or(2.5 / steps.max(1) as f32, |r| r / factor as f32);
        (steps, rel)
    }

    /// The attacks of the sweep (a preset is one, run as a cascade), each once, in the order
    /// given.
    pub fn attack_list(&self) -> Vec<AttackKind> {
        let mut out = Vec::new();
        for &a in &self.attacks {
            if !out.contains(&a) {
                out.push(a);
            }
        }
        out
    }

    /// Every single attack the sweep runs, presets opened up.
    fn single_attacks(&self) -> Vec<AttackKind> {
        let mut out = Vec::new();
        for attack in self.attack_list() {
            for &k in &self.ks {
                for single in attack.at(k).stages() {
                    if !out.contains(&single) {
                        out.push(single);
                    }
                }
            }
        }
        out
    }

    /// EOT draws of the gradient attacks at K: `--eot`, else 1 at K = 0 and, at K > 0, enough
    /// draws of `--chains` chains each for 20 noise samples per gradient (AutoAttack's count
    /// for randomised defences).
    pub fn eot_at(&self, k: usize) -> usize {
        self.eot.unwrap_or(if k == 0 {
            1
        } else {
            EOT_NOISE_SAMPLES.div_ceil(self.defence.chains.max(1))
        })
    }

    /// Restarts of an attack: `pgd-long` doubles PGD's; single runs elsewhere.
    pub(super) fn restarts_of(&self, attack: AttackKind) -> usize {
        match attack {
            AttackKind::Pgd | AttackKind::ApgdCe | AttackKind::ApgdDlr | AttackKind::ApgdT => {
                self.restarts
            }
            AttackKind::PgdLong => 2 * self.restarts,
            _ => 1,
        }
    }

    /// Checks the flags on their own (models and data are checked by [`Plan::new`]).
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.attacks.is_empty(),
            "--attacks: name at least one attack"
        );
        anyhow::ensure!(
            !self.ks.is_empty(),
            "--steps: name at least one K (0 = no SGLD)"
        );
        anyhow::ensure!(
            !self.grad.is_empty(),
            "--grad: name at least one of full, bpda"
        );
        for (flag, value) in [
            ("--n-examples", self.n_examples),
            ("--batch-size", self.batch_size.unwrap_or(1)),
            ("--eot", self.eot.unwrap_or(1)),
            ("--apgd-iterations", self.apgd_iterations),
            ("--square-queries", self.square_queries),
            ("--fab-iterations", self.fab_iterations),
            ("--restarts", self.restarts),
            ("--pgd-steps", self.pgd_steps),
            ("--boundary-steps", self.boundary_steps),
            ("--jobs", self.jobs),
        ] {
            anyhow::ensure!(value >= 1, "{flag}: expected at least 1, found {value}");
        }
        if self.ks.iter().any(|&k| k > 0) {
            self.defence.validate()?;
        }
        if let Some(r) = self.pgd_rel_stepsize {
            anyhow::ensure!(
                r.is_finite() && r > 0.0,
                "--pgd-rel-stepsize: expected a finite number > 0, found {r}"
            );
        }
        let grid = self.eps_grid();
        for &e in &grid {
            anyhow::ensure!(
                e.is_finite() && e >= 0.0,
                "--eps: expected numbers >= 0, found {e}"
            );
            anyhow::ensure!(
                self.norm != Norm::Linf || e <= 1.0,
                "--eps: {e} exceeds 1, the largest L∞ distance between [0, 1] pixels \
                 (ε is in [0, 1] pixel units: 8/255 = 0.0314)"
            );
        }
        Ok(())
    }

    fn model_paths(&self) -> Vec<PathBuf> {
        if !self.models.is_empty() {
            return self.models.clone();
        }
        crate::model::embedded_models()
    }
}

/// The test images a cell attacks: the first `--n-examples` of its subject's test set.
struct Loaded<'a> {
    data: &'a ImageSet,
    spec: &'a str,
    indices: Vec<usize>,
}

impl<'a> Loaded<'a> {
    fn of<N: Module<Train>>(args: &RobustArgs, subject: &'a Subject<N>) -> Self {
        Loaded {
            data: subject.test_set(),
            spec: subject.data_name(),
            indices: (0..args.n_examples).collect(),
        }
    }
}

/// What the sweep's flags need of one model, checked before anything is written: enough test
/// images, ε within reach under L2, enough classes for the DLR losses, SGLD settings for K > 0.
fn check_subject<N: Module<Train>>(args: &RobustArgs, subject: &Subject<N>) -> anyhow::Result<()> {
    let (data, spec, name) = (subject.test_set(), subject.data_name(), subject.name());
    anyhow::ensure!(
        args.n_examples <= data.len(),
        "--n-examples {}: the test split of {spec} has only {} images",
        args.n_examples,
        data.len()
    );
    if args.norm == Norm::L2 {
        let largest = (data.image_len() as f32).sqrt();
        for &e in &args.eps_grid() {
            anyhow::ensure!(
                e <= largest,
                "--eps: {e} exceeds {largest:.2}, the largest L2 distance between [0, 1] images \
                 of {spec}"
            );
        }
    }
    let classes = data.num_classes();
    for (attack, needs) in [(AttackKind::ApgdDlr, 3), (AttackKind::ApgdT, 4)] {
        anyhow::ensure!(
            !args.single_attacks().contains(&attack) || classes >= needs,
            "--attacks {}: its loss needs at least {needs} classes; {name} has {classes}",
            attack.name()
        );
    }
    anyhow::ensure!(
        args.ks.iter().all(|&k| k == 0) || subject.sgld().is_some(),
        "--steps: {name} has no SGLD settings for the defence at K > 0"
    );
    Ok(())
}

fn run_cell<N: Classifier<Train> + Module<Train>>(
    out: &std::path::Path,
    identity: &str,
    args: &RobustArgs,
    subject: &Subject<N>,
    cell: &Cell,
    eps_grid: &[f32],
) -> anyhow::Result<CellResult> {
    let started = Instant::now();
    let device = backend::device();
    let loaded = Loaded::of(args, subject);
    let n = loaded.indices.len();
    let grad_mode = cell.grad.unwrap_or(GradMode::Bpda);
    let sgld = subject.sgld();
    let defence_settings = crate::defended::settings(sgld, cell.k, grad_mode, &args.defence)?;
    let defended = Defended::new(subject.network(), sgld, cell.k, grad_mode, &args.defence)?;
    let norm = args.norm;
    let batch = |rows: &[usize]| {
        let idx: Vec<usize> = rows.iter().map(|&r| loaded.indices[r]).collect();
        let labels: Vec<i64> = idx.iter().map(|&i| loaded.data.labels[i] as i64).collect();
        (
            batches::images::<Inference>(loaded.data, &idx, &device),
            Tensor::<Inference, 1, Int>::from_data(TensorData::new(labels, [idx.len()]), &device),
        )
    };

    // Per attack (several for a preset's cascade), per ε (or once, for a minimum-perturbation
    // attack): every example's outcome, batch after batch.
    let all: Vec<usize> = (0..n).collect();
    let mut grid = eps_grid.to_vec();
    grid.sort_by(f32::total_cmp);
    let chunks: Vec<&[usize]> = all.chunks(args.batch_size.unwrap_or(n).max(1)).collect();
    // Several batches: each is kept as it finishes, so a killed sweep resumes mid-cell (an
    // AutoAttack cascade on 1 000 images runs for hours on two cores).
    let keep = (chunks.len() > 1).then(|| outputs::batches_dir(out, cell));
    let mut seconds_now = 0.0;
    let parts = outputs::resumable_batches(keep.as_deref(), identity, chunks.len(), |j| {
        let batch_started = Instant::now();
        let (x, y) = batch(chunks[j]);
        let batch_args = RobustArgs {
            seed: batch_seed(args.seed, j),
            ..args.clone()
        };
        let mut stages = attack_batch(&batch_args, cell, &defended, x, y, &grid)?;
        if !args.save_adversarials {
            // Only saved adversarials need the inputs; batch files stay small without them.
            for (_, outcome) in stages.iter_mut().flat_map(|s| &mut s.outcomes) {
                outcome.inputs = Vec::new();
            }
        }
        let seconds = batch_started.elapsed().as_secs_f64();
        seconds_now += seconds;
        Ok(BatchResult { seconds, stages })
    })?;
    let batch_seconds: f64 = parts.iter().map(|p| p.seconds).sum();
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
    if args.save_adversarials {
        // A cascade's adversarials are its last stage's: the joint outcome of all its attacks.
        let last = stages.last().expect("every cell runs an attack");
        for (eps, out) in &last.outcomes {
            save_adversarials(args, cell, *eps, &loaded, &all, out)?;
        }
    }

    let probe = probe(&defended, &loaded, args.seed, &device)
        .with_context(|| format!("{} K={}", cell.model, cell.k))?;
    let last = stages.last().expect("every cell runs an attack");
    let convergence = if probe.stochastic && args.convergence_sample > 0 {
        convergence_checks(args, cell, &defended, last, &grid, &batch)?
    } else {
        Vec::new()
    };
    let grad = cell.grad.map_or("none".to_string(), |g| g.to_string());
    let row = |stage: &Stage, eps: f32, clean: usize, robust: usize| {
        let (clean_lo, clean_hi) = wilson(clean, n);
        let (robust_lo, robust_hi) = wilson(robust, n);
        TidyRow {
            model: cell.model.clone(),
            attack: stage.name.clone(),
            norm: norm.name().into(),
            eps,
            k: cell.k,
            grad: grad.clone(),
            n,
            clean_accuracy: clean as f64 / n as f64,
            clean_lo,
            clean_hi,
            robust_accuracy: robust as f64 / n as f64,
            robust_lo,
            robust_hi,
            eot: if stage.kind.uses_gradients() {
                args.eot_at(cell.k)
            } else {
                0
            },
            restarts: args.restarts_of(stage.kind),
            chains: if cell.k > 0 { args.defence.chains } else { 0 },
            recheck_chains: if cell.k > 0 {
                args.defence.recheck_chains
            } else {
                0
            },
            seed: args.seed,
            attack_settings: stage.settings.to_string(),
            defence: defence_settings.to_string(),
            stochastic: probe.stochastic,
            zero_gradients: probe.zero_gradients,
            // Set for every row alike where the rows are assembled (robustness::tidy_rows).
            upper_bound: false,
            check_sampled: None,
            check_broken_eot: None,
            check_broken_iterations: None,
            check_broken: None,
            data: loaded.spec.to_string(),
            software: SOFTWARE.into(),
            backend: backend::name(),
        }
    };
    let mut rows = Vec::new();
    let mut examples = Vec::new();
    for stage in &stages {
        for (eps, outcome) in &stage.outcomes {
            let ex = &outcome.examples;
            let clean = ex.iter().filter(|e| e.clean_correct).count();
            match eps {
                Some(e) => {
                    let robust = ex
                        .iter()
                        .filter(|x| x.clean_correct && !x.adversarial)
                        .count();
                    rows.push(row(stage, *e, clean, robust));
                }
                None => {
                    for &e in eps_grid {
                        let robust = ex.iter().filter(|x| x.robust_at(norm, e)).count();
                        rows.push(row(stage, e, clean, robust));
                    }
                }
            }
            examples.extend(ex.iter().zip(&loaded.indices).map(|(e, &i)| ExampleRow {
                model: cell.model.clone(),
                attack: stage.name.clone(),
                norm: norm.name().into(),
                eps: *eps,
                k: cell.k,
                grad: grad.clone(),
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
    // The convergence check is of the cell's last stage (a cascade's joint outcome).
    for r in rows.iter_mut().filter(|r| r.attack == last.name) {
        if let Some(c) = convergence.iter().find(|c| c.eps == r.eps) {
            r.check_sampled = Some(c.sampled);
            r.check_broken_eot = Some(c.broken_eot);
            r.check_broken_iterations = Some(c.broken_iterations);
            r.check_broken = Some(c.broken);
        }
    }
    Ok(CellResult {
        cell: cell.clone(),
        identity: identity.to_string(),
        // Batches an earlier, interrupted run finished count with the time they took then.
        seconds: started.elapsed().as_secs_f64() - seconds_now + batch_seconds,
        rows,
        examples,
    })
}

/// One ε of a cell's convergence check (see [`RobustArgs::convergence_sample`]).
struct ConvergenceCheck {
    eps: f32,
    sampled: usize,
    broken_eot: usize,
    broken_iterations: usize,
    broken: usize,
}

/// The examples of one outcome standing at ε: correctly classified and not broken within ε
/// (a minimum-perturbation outcome answers every ε by its distance).
fn standing(outcome: &AttackOutcome, at: Option<f32>, norm: Norm, eps: f32) -> Vec<bool> {
    outcome
        .examples
        .iter()
        .map(|x| match at {
            Some(_) => x.clean_correct && !x.adversarial,
            None => x.robust_at(norm, eps),
        })
        .collect()
}

/// The convergence check of a stochastic cell: at each ε > 0, a seeded sample of the examples
/// the cell's attack (its last stage: a cascade's joint outcome) left standing is attacked
/// again with 4× the EOT draws, and again with 2× the iterations, each from a fresh seed. An
/// attack that had converged breaks (almost) none of them.
fn convergence_checks<M: Model<Train>>(
    args: &RobustArgs,
    cell: &Cell,
    defended: &M,
    last: &Stage,
    grid: &[f32],
    batch: &dyn Fn(&[usize]) -> (Tensor<Inference, 4>, Tensor<Inference, 1, Int>),
) -> anyhow::Result<Vec<ConvergenceCheck>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let more_eot = RobustArgs {
        eot: Some(4 * args.eot_at(cell.k)),
        seed: crate::seeds::splitmix64(args.seed ^ 0xC0_4EE7),
        ..args.clone()
    };
    let more_iterations = RobustArgs {
        apgd_iterations: 2 * args.apgd_iterations,
        pgd_steps: 2 * args.pgd_steps,
        fab_iterations: 2 * args.fab_iterations,
        square_queries: 2 * args.square_queries,
        boundary_steps: 2 * args.boundary_steps,
        seed: crate::seeds::splitmix64(args.seed ^ 0x17E7),
        ..args.clone()
    };
    let mut checks = Vec::new();
    for (i, &eps) in grid.iter().enumerate().filter(|(_, &e)| e > 0.0) {
        let (at, outcome) = last
            .outcomes
            .iter()
            .find(|(at, _)| at.is_none_or(|a| a == eps))
            .expect("a stage answers every ε of the grid");
        let mut survivors: Vec<usize> = standing(outcome, *at, args.norm, eps)
            .into_iter()
            .enumerate()
            .filter_map(|(row, ok)| ok.then_some(row))
            .collect();
        if survivors.is_empty() {
            continue;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(batch_seed(args.seed, 1 + i));
        survivors.shuffle(&mut rng);
        survivors.truncate(args.convergence_sample);
        survivors.sort_unstable();
        let broken_by = |strong: &RobustArgs| -> anyhow::Result<Vec<bool>> {
            let (x, y) = batch(&survivors);
            let stages = attack_batch(strong, cell, defended, x, y, &[eps])?;
            let last = stages.last().expect("every cell runs an attack");
            let (at, outcome) = &last.outcomes[0];
            Ok(standing(outcome, *at, args.norm, eps)
                .into_iter()
                .map(|ok| !ok)
                .collect())
        };
        let (eot, iterations) = (broken_by(&more_eot)?, broken_by(&more_iterations)?);
        let count = |v: &[bool]| v.iter().filter(|&&b| b).count();
        checks.push(ConvergenceCheck {
            eps,
            sampled: survivors.len(),
            broken_eot: count(&eot),
            broken_iterations: count(&iterations),
            broken: eot
                .iter()
                .zip(&iterations)
                .filter(|(a, b)| **a || **b)
                .count(),
        });
    }
    Ok(checks)
}

/// Runs a cell's attack (each stage of a preset's cascade) on one batch of examples.
fn attack_batch<M: Model<Train>>(
    args: &RobustArgs,
    cell: &Cell,
    defended: &M,
    x: Tensor<Inference, 4>,
    y: Tensor<Inference, 1, Int>,
    grid: &[f32],
) -> anyhow::Result<Vec<Stage>> {
    let failed = |e: String| anyhow::anyhow!("--attacks {}: {e}", cell.attack.name());
    Ok(match configure(args, cell.attack, args.eot_at(cell.k))? {
        Configured::PerEps(attack) => {
            let per_eps = attack.attack(defended, x, y, grid).map_err(failed)?;
            vec![Stage {
                kind: cell.attack,
                name: cell.attack.name().into(),
                settings: attack.settings(),
                outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
            }]
        }
        Configured::Minimum(attack) => vec![Stage {
            kind: cell.attack,
            name: cell.attack.name().into(),
            settings: attack.settings(),
            outcomes: vec![(None, attack.run_once(defended, x, y))],
        }],
        Configured::Cascade(kinds, cascade) => {
            let joint = cascade.stages(defended, x, y, grid).map_err(failed)?;
            kinds
                .iter()
                .zip(&cascade.attacks)
                .zip(joint)
                .map(|((&kind, attack), per_eps)| Stage {
                    kind,
                    name: format!("{}/{}", cell.attack.name(), kind.name()),
                    settings: attack.settings(),
                    outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
                })
                .collect()
        }
    })
}

/// The attacks' seed for batch `j`: the sweep's own for the first batch (so one batch gives
/// the numbers of an unbatched run), a SplitMix64 mix of (seed, j) for the others.
fn batch_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    crate::seeds::splitmix64(seed ^ (j as u64).wrapping_mul(crate::seeds::GOLDEN))
}

impl Stage {
    /// This stage's outcomes followed by the next batch's.
    fn append(self, next: Stage) -> Stage {
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
struct BatchResult {
    seconds: f64,
    stages: Vec<Stage>,
}

/// One attack's outcomes in a cell: the cell's attack, or one stage of a preset's cascade
/// (`autoattack/apgd-t`: the joint outcome of APGD-T and the attacks before it).
#[derive(Serialize, Deserialize)]
struct Stage {
    kind: AttackKind,
    name: String,
    settings: serde_json::Value,
    /// Per ε of the grid, ascending; one entry with no ε for a minimum-perturbation attack.
    outcomes: Vec<(Option<f32>, AttackOutcome)>,
}

/// The attack a cell runs, configured from the sweep's flags.
enum Configured<'a, M: Model<Train>> {
    /// A fixed-ε attack: run at every ε of the grid, ascending, on the examples no smaller ε
    /// broke.
    PerEps(Box<dyn Attack<Train, M> + 'a>),
    /// A minimum-perturbation attack: one run answers every ε.
    Minimum(Box<dyn MinimumPerturbation<Train, M> + 'a>),
    /// A preset: its attacks one after another, each at each ε on what the ones before left
    /// standing.
    Cascade(Vec<AttackKind>, Cascade<'a, Train, M>),
}

fn configure<'a, M: Model<Train> + 'a>(
    args: &RobustArgs,
    attack: AttackKind,
    eot: usize,
) -> anyhow::Result<Configured<'a, M>> {
    let norm = args.norm;
    if attack.is_preset() {
        let kinds = attack.stages();
        let attacks = kinds
            .iter()
            .map(|&kind| {
                Ok(match configure::<M>(args, kind, eot)? {
                    Configured::PerEps(a) => a,
                    // Inside a cascade a minimum-norm attack answers each ε by its distance.
                    Configured::Minimum(a) => Box::new(MinimumNorm { attack: a, norm }) as _,
                    Configured::Cascade(..) => anyhow::bail!("presets do not nest"),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        return Ok(Configured::Cascade(
            kinds,
            Cascade {
                name: attack.name(),
                attacks,
            },
        ));
    }
    Ok(match attack {
        AttackKind::Pgd | AttackKind::PgdLong | AttackKind::Fgsm => {
            let mut cfg = match attack {
                AttackKind::Fgsm => PgdConfig::fgsm(norm),
                pgd => {
                    let (steps, rel_stepsize) = args.pgd_schedule(pgd);
                    PgdConfig {
                        steps,
                        restarts: args.restarts_of(pgd),
                        rel_stepsize,
                        ..PgdConfig::pgd(norm)
                    }
                }
            };
            cfg.eot = eot;
            cfg.seed = args.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::ApgdCe | AttackKind::ApgdDlr | AttackKind::ApgdT => {
            let loss = match attack {
                AttackKind::ApgdCe => ApgdLoss::CrossEntropy,
                AttackKind::ApgdDlr => ApgdLoss::Dlr,
                _ => ApgdLoss::TargetedDlr,
            };
            let mut cfg = ApgdConfig::new(norm, loss);
            cfg.iterations = args.apgd_iterations;
            cfg.restarts = args.restarts_of(attack);
            cfg.eot = eot;
            cfg.seed = args.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::Square => {
            let mut cfg = SquareConfig::new(norm);
            cfg.queries = args.square_queries;
            cfg.seed = args.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::FabT => {
            let mut cfg = FabConfig::new(norm);
            cfg.iterations = args.fab_iterations;
            cfg.eot = eot;
            cfg.seed = args.seed;
            Configured::Minimum(Box::new(cfg))
        }
        AttackKind::Boundary => Configured::Minimum(Box::new(BoundaryConfig {
            steps: args.boundary_steps,
            seed: args.seed,
            ..Default::default()
        })),
        AttackKind::Pointwise => Configured::Minimum(Box::new(PointwiseConfig {
            seed: args.seed,
            ..Default::default()
        })),
        AttackKind::AutoAttack | AttackKind::AutoAttackRand | AttackKind::Adaptive => {
            unreachable!("presets are configured as cascades above")
        }
    })
}

/// What two clean passes and one gradient say about the defended model (AutoAttack's checks
/// for randomness and for masked gradients), on the first [`PROBED`] attacked images; an error
/// where the logits or the gradient are not finite, from which no accuracy means anything.
struct Probe {
    /// Two passes on the same inputs gave different logits: attack with EOT.
    stochastic: bool,
    /// Correctly classified probed images whose loss gradient is exactly zero.
    zero_gradients: usize,
}

const PROBED: usize = 16;

fn probe<M: Model<Train>>(
    model: &M,
    loaded: &Loaded,
    seed: u64,
    device: &backend::Device,
) -> anyhow::Result<Probe> {
    use jem_attacks::AttackLoss;
    use rand::SeedableRng;
    let idx = &loaded.indices[..loaded.indices.len().min(PROBED)];
    let x = batches::images::<Inference>(loaded.data, idx, device);
    let labels: Vec<i64> = idx.iter().map(|&i| loaded.data.labels[i] as i64).collect();
    let n = labels.len();
    let y = Tensor::<Inference, 1, Int>::from_data(TensorData::new(labels.clone(), [n]), device);
    // A stream of its own, so that probing does not change any attack's draws.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5052_4f42_4521);
    let first = model.logits(x.clone(), &mut rng);
    let second = model.logits(x.clone(), &mut rng);
    let differ = batches::to_vec((first.clone() - second).abs().max());
    let y_tracked = Tensor::<Train, 1, Int>::from_inner(y);
    let loss = |logits: Tensor<Train, 2>| AttackLoss::CrossEntropy.of(logits, y_tracked.clone());
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

/// `--save-adversarials`: the inputs an attack returned for the examples at `rows` (of the
/// sweep's examples) at one ε, and a picture of a few breaks.
fn save_adversarials(
    args: &RobustArgs,
    cell: &Cell,
    eps: Option<f32>,
    loaded: &Loaded,
    rows: &[usize],
    outcome: &AttackOutcome,
) -> anyhow::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("runs/robust-{}", args.norm)))
        .join("adversarials");
    let [n, c, h, w] = outcome.shape;
    let indices: Vec<usize> = rows.iter().map(|&r| loaded.indices[r]).collect();
    let clean: Vec<f32> = indices
        .iter()
        .flat_map(|&i| loaded.data.image(i).iter().copied())
        .collect();
    let labels: Vec<u8> = indices.iter().map(|&i| loaded.data.labels[i]).collect();
    let examples: Vec<u32> = indices.iter().map(|&i| i as u32).collect();
    let broken: Vec<u8> = outcome
        .examples
        .iter()
        .map(|e| u8::from(e.adversarial))
        .collect();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let u32_bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (inputs_b, clean_b, examples_b) = (
        f32_bytes(&outcome.inputs),
        f32_bytes(&clean),
        u32_bytes(&examples),
    );
    fn view(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> anyhow::Result<TensorView<'_>> {
        TensorView::new(dtype, shape, data).map_err(|e| anyhow::anyhow!("{e}"))
    }
    let tensors = vec![
        ("inputs", view(Dtype::F32, vec![n, c, h, w], &inputs_b)?),
        ("clean", view(Dtype::F32, vec![n, c, h, w], &clean_b)?),
        ("labels", view(Dtype::U8, vec![n], &labels)?),
        ("examples", view(Dtype::U32, vec![n], &examples_b)?),
        ("adversarial", view(Dtype::U8, vec![n], &broken)?),
    ];
    let bytes = safetensors::serialize(tensors, None)?;
    // Cell ids contain dots (`eps0.2`): append the extension rather than replace one.
    let stem = match eps {
        Some(e) => format!("{}.eps{e}", cell.id()),
        None => cell.id(),
    };
    let file = |ext: &str| out.join(format!("{stem}.{ext}"));
    write_atomic(&file("safetensors"), &bytes)?;
    let len = c * h * w;
    let shown: Vec<usize> = (0..n).filter(|&i| broken[i] == 1).take(8).collect();
    if !shown.is_empty() {
        let mut pixels = Vec::with_capacity(2 * shown.len() * len);
        for source in [&clean, &outcome.inputs] {
            for &i in &shown {
                pixels.extend_from_slice(&source[i * len..(i + 1) * len]);
            }
        }
        let batch = crate::image_grid::ImageBatch {
            pixels: &pixels,
            channels: c,
            height: h,
            width: w,
        };
        crate::image_grid::write_grid(&file("png"), &batch, 2, shown.len())?;
    }
    Ok(())
}

/// `i/n`: this process runs every n-th cell of the sweep, starting at cell i.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--shard `{s}`: expected i/n with 0 ≤ i < n, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
        if index < count {
            Ok(Shard { index, count })
        } else {
            Err(bad())
        }
    }
}

/// What a sweep will do, derived from its arguments.
struct Plan<N> {
    out: PathBuf,
    subjects: Vec<Subject<N>>,
    eps_grid: Vec<f32>,
    /// Every cell of the whole sweep, in order.
    cells: Vec<Cell>,
}

impl Plan<WideResNet<Train>> {
    /// The command line's sweep: `--models` (or the embedded ones) on `--data` (or each
    /// model's own data set), checked before anything touches the disk.
    fn from_args(args: &RobustArgs) -> anyhow::Result<Self> {
        args.validate()?;
        let paths = args.model_paths();
        anyhow::ensure!(!paths.is_empty(), "--models: name at least one checkpoint");
        let subjects = paths
            .iter()
            .map(|p| {
                let m = p.display().to_string();
                Subject::from_checkpoint(&m, args.data.as_deref())
                    .with_context(|| format!("--models {m}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Plan::new(args, subjects)
    }
}

impl<N: Classifier<Train> + Module<Train>> Plan<N> {
    /// Everything a sweep needs, checked before anything touches the disk: the flags, and
    /// per model its data and the settings its cells need.
    fn new(args: &RobustArgs, subjects: Vec<Subject<N>>) -> anyhow::Result<Self> {
        args.validate()?;
        anyhow::ensure!(!subjects.is_empty(), "a sweep needs at least one model");
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("runs/robust-{}", args.norm)));
        let mut names = std::collections::BTreeSet::new();
        for subject in &subjects {
            anyhow::ensure!(
                names.insert(subject.name()),
                "two models are named {}: every model of a sweep needs its own name",
                subject.name()
            );
            check_subject(args, subject)?;
        }
        let models: Vec<String> = subjects.iter().map(|s| s.name().to_string()).collect();
        let eps_grid = args.eps_grid();
        let cells = cells::list(&models, &args.attack_list(), &args.ks, &args.grad);
        Ok(Self {
            out,
            subjects,
            eps_grid,
            cells,
        })
    }

    /// The model a cell attacks.
    fn subject(&self, cell: &Cell) -> &Subject<N> {
        self.subjects
            .iter()
            .find(|s| s.name() == cell.model)
            .expect("cells are listed from the subjects")
    }

    /// The settings that identify the sweep (the shard and output folder aside), recorded in
    /// `settings.json`: a resume or a merge must find the same, the models' weights included
    /// (a checkpoint retrained under the same path must not resume an old sweep).
    fn settings(&self, args: &RobustArgs) -> serde_json::Value {
        let mut a = args.clone();
        a.shard = None;
        a.out = None;
        serde_json::json!({
            "software": SOFTWARE,
            "backend": backend::name(),
            "args": &a,
            // The EOT each K gets, `--eot` or its default, spelled out: a folder of a version
            // whose default differed must not resume.
            "eot_at_k": args.ks.iter().map(|&k| (k, args.eot_at(k))).collect::<Vec<_>>(),
            "eps": &self.eps_grid,
            "models": self.subjects.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "weights": self.subjects.iter().map(|s| s.digest()).collect::<Vec<_>>(),
            "subjects": self.subjects.iter().map(|s| s.configuration()).collect::<Vec<_>>(),
        })
    }

    /// `sha256:<hex>` of [`Plan::settings`]: what every cell file of the sweep carries, so that
    /// a cell is reused only by the sweep that computed it (even with settings.json deleted).
    fn identity(&self, args: &RobustArgs) -> String {
        crate::digest::of(self.settings(args).to_string().as_bytes())
    }
}

/// Refuses a folder that holds a sweep with other settings, naming each setting that differs,
/// or cells of another sweep; records the settings in a new one, and returns the finished
/// `cells` (`None` for those still to run). Call with the folder's [`FolderLock`] held.
fn claim_folder(
    out: &std::path::Path,
    settings: &serde_json::Value,
    identity: &str,
    cells: &[&Cell],
    _lock: &FolderLock,
) -> anyhow::Result<Vec<Option<CellResult>>> {
    std::fs::create_dir_all(out.join("cells"))
        .with_context(|| format!("cannot create {}", out.display()))?;
    let settings_path = out.join("settings.json");
    if settings_path.exists() {
        let text = std::fs::read_to_string(&settings_path)
            .with_context(|| format!("cannot read {}", settings_path.display()))?;
        let saved: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a sweep's settings", settings_path.display()))?;
        if saved["models"] == settings["models"] && saved["weights"] != settings["weights"] {
            anyhow::bail!(
                "{} holds a sweep of other weights under the same model paths (its settings.json \
                 records {}, the models now hold {}); delete the folder or use another --out",
                out.display(),
                saved["weights"],
                settings["weights"]
            );
        }
        let differences = settings_differences(&saved, settings);
        anyhow::ensure!(
            differences.is_empty(),
            "{} holds a sweep with other settings ({}); run that sweep's command to resume it, \
             or use another --out",
            out.display(),
            differences.join("; ")
        );
    }
    // The cells finished before: each must have been computed by this very sweep (its file
    // says so even where settings.json was deleted). Read before the settings are recorded,
    // so that a refused command records nothing.
    let done = cells
        .iter()
        .map(|cell| outputs::load_cell(out, cell, identity))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !settings_path.exists() {
        write_atomic(
            &settings_path,
            serde_json::to_string_pretty(settings)?.as_bytes(),
        )?;
    }
    Ok(done)
}

/// `field: the folder has A, this command B` for each leaf setting that differs.
pub(crate) fn settings_differences(
    saved: &serde_json::Value,
    now: &serde_json::Value,
) -> Vec<String> {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        use serde_json::Value::Object;
        match (a, b) {
            (Object(x), Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let null = serde_json::Value::Null;
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(
                        &p,
                        x.get(k).unwrap_or(&null),
                        y.get(k).unwrap_or(&null),
                        out,
                    );
                }
            }
            _ if a != b => out.push(format!("{path}: the folder has {a}, this command {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", saved, now, &mut out);
    out
}

/// `jem-bench robust`: the sweep of `--models` (default: the embedded models).
pub fn run(args: RobustArgs) -> anyhow::Result<()> {
    let plan = Plan::from_args(&args)?;
    execute(&plan, &args).map(|_| ())
}

/// Sweeps `subjects` — networks of any architecture that implement
/// [`Classifier`](jem_attacks::Classifier) — under `args` (everything but `models` and `data`,
/// which name checkpoints and data sets for the command line): runs the cells not finished
/// yet in `args.out` (default `runs/robust-NORM`), writes `robust.csv`, `examples.csv`,
/// `summary.json` with the sanity checks, the curves and the table, as `jem-bench robust` does,
/// and returns the rows of `robust.csv`.
pub fn sweep<N: Classifier<Train> + Module<Train>>(
    subjects: Vec<Subject<N>>,
    args: &RobustArgs,
) -> anyhow::Result<Vec<TidyRow>> {
    anyhow::ensure!(
        args.models.is_empty() && args.data.is_none(),
        "sweep: RobustArgs::models and ::data name checkpoints and data sets for the command \
         line; here the subjects are the models, each with its test set"
    );
    let plan = Plan::new(args, subjects)?;
    execute(&plan, args)
}

/// Runs a plan's unfinished cells and writes every output.
fn execute<N: Classifier<Train> + Module<Train>>(
    plan: &Plan<N>,
    args: &RobustArgs,
) -> anyhow::Result<Vec<TidyRow>> {
    let out = plan.out.clone();
    let mine: Vec<&Cell> = plan
        .cells
        .iter()
        .enumerate()
        .filter(|(j, _)| args.shard.is_none_or(|s| j % s.count == s.index))
        .map(|(_, c)| c)
        .collect();
    if let (Some(shard), true) = (args.shard, mine.is_empty()) {
        // A job array larger than the sweep: this task has nothing to do, which is no error.
        eprintln!(
            "shard {}/{}: the sweep has {} cells, none of them this shard's; nothing to do",
            shard.index,
            shard.count,
            plan.cells.len()
        );
        return Ok(Vec::new());
    }
    crate::output_folder::claim(&out, "robust")?;
    let lock = FolderLock::acquire(&out, "sweep.lock")?;
    // Finished cells (from an earlier, interrupted run) are read back; the rest run on
    // `--jobs` worker threads. The CSVs always hold the finished cells in plan order.
    let identity = plan.identity(args);
    let mut done = claim_folder(&out, &plan.settings(args), &identity, &mine, &lock)?;
    // Longest first, so that the last cell running alone is a short one: cells with more SGLD
    // steps cost more (a K = 1 cell about 5× its K = 0 twin). Outputs keep the plan's order.
    let mut pending: Vec<usize> = (0..mine.len()).filter(|&i| done[i].is_none()).collect();
    pending.sort_by_key(|&i| std::cmp::Reverse(mine[i].k));
    let estimates = estimate_cells(plan, args, &mine, &pending)?;
    let total: f64 = estimates.iter().sum();
    if !pending.is_empty() {
        eprintln!(
            "{} cells to run, estimated at most {} here (one timed gradient per model, K and \
             gradient mode, every example attacked at every ε to the last iteration; broken \
             examples drop out, so it usually takes less)",
            pending.len(),
            estimate::duration(total)
        );
    }
    // Counted in estimated milliseconds, so that the remaining time weighs cells by cost.
    let bar = ProgressBar::new((1000.0 * total).ceil().max(1.0) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {prefix}  about {eta} left  {msg}",
        )
        .expect("template"),
    );
    let mut cells_done = mine.len() - pending.len();
    bar.set_prefix(format!("{cells_done}/{} cells", mine.len()));
    outputs::write_csvs(&out, done.iter().flatten())?;

    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, anyhow::Result<CellResult>)>();
    let jobs = args.jobs.clamp(1, pending.len().max(1));
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, failed, pending, mine, args, plan, out, identity) = (
                &next, &failed, &pending, &mine, &args, &plan, &out, &identity,
            );
            scope.spawn(move || {
                while !failed.load(Ordering::Relaxed) {
                    let Some(&i) = pending.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        break;
                    };
                    let cell = mine[i];
                    let result = run_cell(
                        out,
                        identity,
                        args,
                        plan.subject(cell),
                        cell,
                        &plan.eps_grid,
                    );
                    if tx.send((i, result)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (i, result) in rx {
            let r = match result {
                Ok(r) => r,
                Err(e) => {
                    // Stop handing out cells; what finished is already saved.
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            };
            outputs::save_cell(&out, &r)?;
            outputs::remove_batches(&out, &r.cell)?;
            if let Some(row) = r.rows.last() {
                bar.set_message(format!(
                    "last: {} {} K={} ε={} robust {:.1} %",
                    row.attack,
                    row.model,
                    row.k,
                    row.eps,
                    100.0 * row.robust_accuracy
                ));
            }
            done[i] = Some(r);
            outputs::write_csvs(&out, done.iter().flatten())?;
            cells_done += 1;
            bar.set_prefix(format!("{cells_done}/{} cells", mine.len()));
            let at = pending
                .iter()
                .position(|&p| p == i)
                .expect("a pending cell");
            bar.inc((1000.0 * estimates[at]).ceil() as u64);
        }
        Ok(())
    })?;
    let results: Vec<CellResult> = done.into_iter().flatten().collect();
    bar.finish_and_clear();
    println!(
        "ran {} cells ({} were finished already)",
        pending.len(),
        mine.len() - pending.len()
    );
    finish(plan, &results)
}

/// Estimated seconds of each pending cell (in `pending`'s order): one timed gradient per
/// model, K and gradient mode, times the gradients its attack takes at most.
fn estimate_cells<N: Classifier<Train> + Module<Train>>(
    plan: &Plan<N>,
    args: &RobustArgs,
    mine: &[&Cell],
    pending: &[usize],
) -> anyhow::Result<Vec<f64>> {
    let device = backend::device();
    let eps = plan.eps_grid.iter().filter(|&&e| e > 0.0).count();
    let mut timed: Vec<((&str, usize, Option<GradMode>), f64)> = Vec::new();
    let mut out = Vec::new();
    for &i in pending {
        let cell = mine[i];
        let subject = plan.subject(cell);
        let key = (cell.model.as_str(), cell.k, cell.grad);
        let seconds = match timed.iter().find(|(k, _)| *k == key) {
            Some((_, s)) => *s,
            None => {
                let grad = cell.grad.unwrap_or(GradMode::Bpda);
                let defended = Defended::new(
                    subject.network(),
                    subject.sgld(),
                    cell.k,
                    grad,
                    &args.defence,
                )?;
                let data = subject.test_set();
                let idx: Vec<usize> = (0..args.n_examples.min(16)).collect();
                let labels: Vec<i64> = idx.iter().map(|&j| data.labels[j] as i64).collect();
                let x = batches::images::<Inference>(data, &idx, &device);
                let y = Tensor::<Inference, 1, Int>::from_data(
                    TensorData::new(labels, [idx.len()]),
                    &device,
                );
                let s = estimate::seconds_per_gradient(&defended, x, y);
                timed.push((key, s));
                s
            }
        };
        let classes = subject.test_set().num_classes();
        let gradients = estimate::gradients_per_example(args, cell, eps, classes);
        // The convergence check of a stochastic cell attacks up to its sample again, with 4×
        // the EOT draws and with 2× the iterations.
        let n = args.n_examples as f64;
        let check = if cell.k > 0 && args.convergence_sample > 0 {
            (4.0 + 2.0) * (args.convergence_sample as f64).min(n) / n
        } else {
            0.0
        };
        out.push(seconds * gradients * n * (1.0 + check));
    }
    Ok(out)
}

/// Checks a sweep's flags, models and data without touching the disk (what `robust` does
/// first), so that a caller can refuse bad settings before it prepares a folder.
pub fn check(args: &RobustArgs) -> anyhow::Result<()> {
    Plan::from_args(args).map(|_| ())
}

/// `jem-bench merge`: joins the folders of a sharded sweep into one, as if it had run whole.
#[derive(Debug, Clone, Args)]
pub struct MergeArgs {
    /// The shards' output folders.
    #[arg(required = true)]
    pub shards: Vec<PathBuf>,
    /// The merged folder.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn merge(m: MergeArgs) -> anyhow::Result<()> {
    let read = |dir: &PathBuf| -> anyhow::Result<serde_json::Value> {
        let p = dir.join("settings.json");
        let text = std::fs::read_to_string(&p)
            .with_context(|| format!("{}: not a sweep folder (no settings.json)", dir.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: unreadable", p.display()))
    };
    let settings = read(&m.shards[0])?;
    for dir in &m.shards[1..] {
        anyhow::ensure!(
            read(dir)? == settings,
            "{} ran another sweep than {} (settings.json differ); only shards of one sweep merge",
            dir.display(),
            m.shards[0].display()
        );
    }
    let mut args: RobustArgs = serde_json::from_value(settings["args"].clone())
        .context("settings.json: `args` is not a robust sweep's arguments")?;
    args.out = Some(m.out.clone());
    let plan = Plan::from_args(&args)?;
    anyhow::ensure!(
        plan.settings(&args) == settings,
        "the shards were made by another jem-bench or from other models; rerun them"
    );
    crate::output_folder::claim(&m.out, "robust")?;
    let lock = FolderLock::acquire(&m.out, "sweep.lock")?;
    claim_folder(&m.out, &settings, &plan.identity(&args), &[], &lock)?;
    let identity = plan.identity(&args);
    let mut results = Vec::with_capacity(plan.cells.len());
    for cell in &plan.cells {
        let found = m
            .shards
            .iter()
            .map(|dir| outputs::load_cell(dir, cell, &identity))
            .collect::<anyhow::Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .next()
            .with_context(|| {
                format!(
                    "no shard holds the finished cell {}: finish that shard first",
                    cell.id()
                )
            })?;
        outputs::save_cell(&m.out, &found)?;
        results.push(found);
    }
    outputs::write_csvs(&m.out, &results)?;
    finish(&plan, &results).map(|_| ())
}

/// Summary, sanity checks, plots and table of the finished cells.
fn finish<N>(plan: &Plan<N>, results: &[CellResult]) -> anyhow::Result<Vec<TidyRow>> {
    let rows = super::robustness::tidy_rows(&results.iter().collect::<Vec<_>>())?;
    let seconds = results.iter().map(|r| r.seconds).sum::<f64>();
    print!("{}", report::write(&plan.out, &rows, Some(seconds))?);
    println!("wrote {}", plan.out.display());
    Ok(rows)
}
