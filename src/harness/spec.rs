//! What a sweep computes ([`SweepSpec`], from its typed parts: [`Threat`], the attacks with
//! their [`Budgets`], K and gradient modes, the defence, [`Examples`], seed), with the defaults
//! it resolves to (ε grid, EOT per K) and its validation; the command line's models
//! ([`Checkpoints`]); and where and how a sweep runs ([`Runner`]: output folder, [`Shard`],
//! worker threads, a [`SweepObserver`] told of its progress). The command line's flags convert
//! into these in the binary; errors here name fields ([`InvalidSetting`]), which the command
//! line names as flags.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use jem_attacks::{GradMode, Norm};
use serde::{Deserialize, Serialize};

use super::budgets::count;
use super::budgets::Budgets;
use super::cells::{AttackKind, Cell};
use super::estimate;
use super::rows::CellResult;
use crate::defended::DefenceSpec;
use crate::settings::{self, InvalidSetting};

/// What a sweep computes: the threat model, the attacks with their budgets, the defence's K
/// and gradient modes, the examples and the seed, each part documented where it is defined;
/// the flags of `jem-bench robust` that set them say what they are for and why their defaults
/// are what they are. The models are not part of it: a library caller passes its networks as
/// [`Subject`](super::Subject)s, the command line names checkpoints ([`Checkpoints`]). Every
/// sweep's `settings.json` records the spec in a versioned layout of its own
/// (`harness/record.rs`), so the type can change without changing a folder's identity; where
/// the sweep is written and how it is run are the [`Runner`](super::Runner)'s.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// The norm and the budgets ε the attacks are held to.
    pub threat: Threat,
    /// Attacks and presets, each a cell per model, K and gradient mode.
    pub attacks: Vec<AttackKind>,
    /// How long the attacks search: restarts, steps, iterations, queries.
    pub budgets: Budgets,
    /// SGLD steps K of the defence, 0 the plain classifier.
    pub ks: Vec<usize>,
    /// Gradient modes through the SGLD steps at K > 0.
    pub grad: Vec<GradMode>,
    /// EOT draws per gradient; `None`: [`SweepSpec::eot_at`]'s default per K.
    pub eot: Option<usize>,
    /// The SGLD defence's settings where they override the model's (chains, step size, …).
    pub defence: DefenceSpec,
    /// Which test images are attacked, and how many at once.
    pub examples: Examples,
    /// Survivors re-attacked per ε by a stochastic cell's convergence check, 0 for none.
    pub convergence_sample: usize,
    /// Seed of every attack's random starts and draws.
    pub seed: u64,
    /// Keep each cell's returned inputs under `OUT/adversarials/`.
    pub save_adversarials: bool,
    /// A quick look ([`SweepSpec::quick_look`]): budgets far below the default evaluation's,
    /// so every row it writes is marked as an upper bound on robust accuracy. Never a
    /// reference: `regress` refuses one.
    pub quick: bool,
}

/// The threat model: the norm that measures a perturbation and the budgets ε of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Threat {
    pub norm: Norm,
    /// The ε grid in [0, 1] pixel units (L2: the Euclidean norm of the whole image); empty:
    /// the norm's default grid ([`Threat::eps_grid`]).
    pub eps: Vec<f32>,
}

impl Threat {
    /// The norm with its default ε grid.
    pub fn new(norm: Norm) -> Self {
        Threat {
            norm,
            eps: Vec::new(),
        }
    }

    /// The ε of the sweep: those given, else the norm's default grid (L∞ 0, 0.1, 0.2, 0.3;
    /// L2 0, 1, 2, 3: MNIST's usual budgets).
    pub fn eps_grid(&self) -> Vec<f32> {
        if !self.eps.is_empty() {
            return self.eps.clone();
        }
        match self.norm {
            Norm::Linf => vec![0.0, 0.1, 0.2, 0.3],
            Norm::L2 => vec![0.0, 1.0, 2.0, 3.0],
        }
    }
}

/// The examples a sweep attacks: the first `n` images of each model's test set, `batch_size`
/// at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Examples {
    pub n: NonZeroUsize,
    /// Examples attacked at once, each batch kept as it finishes (a killed sweep resumes after
    /// it); `None`: all of a cell's at once.
    pub batch_size: Option<NonZeroUsize>,
}

impl Examples {
    /// The first `n` test images, all at once.
    pub const fn first(n: NonZeroUsize) -> Self {
        Examples {
            n,
            batch_size: None,
        }
    }

    /// The first `n` test images, `batch_size` at a time, as flags and records give them: a
    /// count of 0 is an [`InvalidSetting`] naming `n_examples` or `batch_size`.
    pub fn checked(n: usize, batch_size: Option<usize>) -> Result<Self, InvalidSetting> {
        Ok(Examples {
            n: settings::count("n_examples", n)?,
            batch_size: batch_size
                .map(|b| settings::count("batch_size", b))
                .transpose()?,
        })
    }

    /// How many there are.
    pub const fn count(&self) -> usize {
        self.n.get()
    }

    /// Examples in the largest batch of a cell: `batch_size`, at most all of them.
    pub fn largest_batch(&self) -> usize {
        self.batch_len(self.count()).min(self.count())
    }

    /// Examples per batch of a cell of `n` examples (`batch_size`, else all of them).
    pub fn batch_len(&self, n: usize) -> usize {
        self.batch_size.map_or(n, NonZeroUsize::get).max(1)
    }
}

/// The models of a sweep run from the command line: checkpoint files, loaded and checked as
/// the sweep is planned, and the data set they are tested on. Not part of [`SweepSpec`]: a
/// library caller builds its [`Subject`](super::Subject)s itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checkpoints {
    /// Checkpoints to sweep (a Wide-ResNet's `NAME.safetensors` + `NAME.json`, or an ONNX
    /// graph's `NAME.onnx` + `NAME.json`); empty: the embedded models.
    pub models: Vec<PathBuf>,
    /// The data set (`mnist`, `cifar10:DIR`, …); `None`: each model's own.
    pub data: Option<String>,
}

impl Checkpoints {
    /// The paths to load: `models`, else the embedded ones.
    pub(super) fn paths(&self) -> Vec<PathBuf> {
        if !self.models.is_empty() {
            return self.models.clone();
        }
        crate::model::embedded_models()
    }
}

/// Where and how a sweep runs: none of it changes what the sweep computes, so none of it is
/// part of the sweep's identity.
pub struct Runner<'a> {
    /// The sweep's folder; running the same spec there again resumes it.
    pub out: PathBuf,
    /// Run only every n-th cell (join the shards' folders with `merge`).
    pub shard: Option<Shard>,
    /// Cells run at once, each on its own thread.
    pub jobs: NonZeroUsize,
    /// Told of the sweep's progress; [`Silent`] by default.
    pub observer: &'a dyn SweepObserver,
    /// Run a sweep whose counts are beyond the usual ([`SweepSpec::beyond_usual`]); without
    /// it such a sweep is refused with its estimate, before its folder is touched.
    pub allow_long: bool,
}

impl Runner<'static> {
    /// A runner writing to `out`, one worker per core, the whole sweep, silently.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        Runner {
            out: out.into(),
            shard: None,
            jobs: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            observer: &Silent,
            allow_long: false,
        }
    }
}

/// What a running sweep reports. Every method does nothing by default.
pub trait SweepObserver {
    /// Before the estimate, which times gradients and runs pilot attacks (up to minutes for an
    /// adaptive sweep through SGLD steps): `cells` cells are to run, `pairs` of them distinct
    /// models and K to time.
    fn estimating(&self, _cells: usize, _pairs: usize) {}
    /// Before the first cell: what the cells to run are expected to take (see
    /// [`SweepEstimate`]) and how many cells were finished by an earlier run.
    fn starting(&self, _estimate: &SweepEstimate, _finished_before: usize) {}
    /// A part of a running cell finished and was kept, or was read back from what an earlier,
    /// interrupted run kept (`part.resumed`: its share of the estimate is not to run now); see
    /// [`CellPart`]. `estimated_seconds` is what the whole cell had been estimated at.
    fn part_finished(&self, _part: &CellPart, _estimated_seconds: f64) {}
    /// A cell finished and was saved; `estimated_seconds` is what it had been estimated at.
    fn cell_finished(&self, _result: &CellResult, _estimated_seconds: f64) {}
    /// The outputs are written: the table of the sweep in `out`, and how many cells ran now
    /// (the others were finished before).
    fn finished(&self, _out: &Path, _table: &str, _ran: usize, _cells: usize) {}
    /// This shard has no cells of a sweep of `cells` cells.
    fn nothing_to_do(&self, _shard: Shard, _cells: usize) {}
    /// Results for the reader, as `report`, `regress` and `merge` give them: a table, a
    /// verdict, a file written (text of one or more lines).
    fn says(&self, _text: &str) {}
    /// A warning for the reader: the results stand, but something about them needs attention
    /// (cells compared across other settings, a reference cell that regressed).
    fn warns(&self, _text: &str) {}
}

/// How many times the attack's EOT draws the first re-attack of a convergence check takes.
pub(super) const MORE_EOT: usize = 4;
/// How many times the attack's iterations (steps, queries) the second re-attack takes.
pub(super) const MORE_ITERATIONS: usize = 2;

/// What the cells a sweep is about to run are expected to take here, printed before the first
/// one. Each cell's gradient is timed as the cell computes it (on a batch of its size), alone
/// and beside as many copies as cells run at once, and a pilot (the cell's first attack at its
/// budget with one draw, on 16 examples, in sweeps of 64 or more) tells how many examples stand
/// at each ε and what a broken one cost, so that the examples an attack breaks early, and the
/// later stages of a cascade that never see them, are not counted at full cost.
/// Cells run `jobs` at a time on one machine and share its cores: the sweep takes what its
/// cells take when handed out in order to that many workers, each computing at the pace its
/// timed gradients had side by side ([`estimate::schedule`]). On a GPU, whose cells take turns
/// on one device, `jobs` is 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepEstimate {
    /// Expected seconds of each cell to run, in the order they start, with the machine to
    /// itself.
    pub cells: Vec<f64>,
    /// Seconds each takes at most alone, every example attacked at every ε to the last
    /// iteration.
    pub bounds: Vec<f64>,
    /// Per cell, how many times more work `jobs` such cells get done side by side than one
    /// alone: 1 where they share the cores (each runs at 1 / `jobs` of its pace alone), `jobs`
    /// where each runs as fast as alone.
    pub speedups: Vec<f64>,
    /// Cells run side by side.
    pub jobs: usize,
    /// Per cell, what its expected seconds are made of (empty where not known).
    pub counts: Vec<CellCount>,
    /// Per cell, the share of its cost that an earlier, interrupted run kept (its finished
    /// parts), which this run reads back instead of running: left out of the expected seconds
    /// and the bound. Empty where nothing was kept.
    pub kept: Vec<f64>,
}

/// What one cell's estimate is made of: input gradients per example expected and at most, and
/// the seconds one takes alone on the cell's batch and on its convergence check's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellCount {
    /// Gradients per example expected, from the pilot's survivors.
    pub expected: estimate::Gradients,
    /// Gradients per example at most.
    pub most: estimate::Gradients,
    /// Seconds one example's gradient of the attack takes alone, in the batch its gradients
    /// are expected to run on (the examples still standing).
    pub seconds_per_gradient: f64,
    /// The same on the convergence check's batch.
    pub seconds_per_check_gradient: f64,
}

impl SweepEstimate {
    /// The share of cell `i` an earlier run kept (0 where [`kept`](Self::kept) is empty).
    pub fn kept_share(&self, i: usize) -> f64 {
        self.kept.get(i).copied().unwrap_or(0.0)
    }

    /// The share of cell `i` still to run: 1 less what an earlier run kept.
    fn to_run(&self, i: usize) -> f64 {
        (1.0 - self.kept_share(i)).clamp(0.0, 1.0)
    }

    /// Whether an earlier run kept parts of any of the cells.
    pub fn resumes(&self) -> bool {
        (0..self.cells.len()).any(|i| self.to_run(i) < 1.0)
    }

    /// Expected seconds of each cell's part still to run, alone.
    fn left(&self, whole: &[f64]) -> Vec<f64> {
        whole
            .iter()
            .enumerate()
            .map(|(i, s)| s * self.to_run(i))
            .collect()
    }

    /// Expected seconds of the whole sweep: what is left of its cells on
    /// [`jobs`](Self::jobs) workers.
    pub fn expected(&self) -> f64 {
        estimate::makespan(&self.left(&self.cells), &self.speedups, self.jobs)
    }

    /// Seconds the whole sweep takes at most: what is left of the cells' bounds on the same
    /// workers, sharing the cores.
    pub fn bound(&self) -> f64 {
        let shared = vec![1.0; self.bounds.len()];
        estimate::makespan(&self.left(&self.bounds), &shared, self.jobs)
    }

    /// Expected seconds from each cell's start to its end, beside the cells it runs with:
    /// what is left of it ([`expected`](Self::expected)'s schedule).
    pub fn durations_left(&self) -> Vec<f64> {
        estimate::schedule(&self.left(&self.cells), &self.speedups, self.jobs)
            .into_iter()
            .map(|(start, end)| end - start)
            .collect()
    }

    /// Expected seconds of each whole cell at the pace it runs beside the others (its part
    /// still to run, scaled up by what was kept): what its parts' shares and its closing line
    /// are weighed by, the parts read back included.
    pub fn durations(&self) -> Vec<f64> {
        self.durations_left()
            .into_iter()
            .enumerate()
            .map(|(i, left)| match self.to_run(i) {
                share if share > 1e-9 => left / share,
                _ => 0.0,
            })
            .collect()
    }
}

/// A part of a cell that is kept as it finishes, so that a killed sweep resumes after it: a
/// batch of the cell's attack, or a part of one re-attack of its convergence check (some of
/// one ε's sampled survivors, with more EOT draws or more iterations). A cell of hours
/// reports its progress part by part.
#[derive(Debug, Clone)]
pub struct CellPart {
    /// The cell it is part of.
    pub cell: Cell,
    /// A batch of the attack, or a part of the convergence check.
    pub kind: PartKind,
    /// Which part of its kind it is, from 0.
    pub index: usize,
    /// How many parts of its kind the cell has.
    pub count: usize,
    /// Seconds it took (0 for a part read back).
    pub seconds: f64,
    /// Its share of the cell's estimated cost (the shares of a cell's parts add up to at most 1).
    pub share: f64,
    /// Kept by an earlier, interrupted run of the sweep and read back, not run now.
    pub resumed: bool,
}

/// What a [`CellPart`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartKind {
    /// A batch of examples through the cell's attack (the whole attack if unbatched).
    AttackBatch,
    /// Some of one ε's sampled survivors, re-attacked with more EOT draws or more iterations
    /// (the convergence check).
    ConvergenceCheck,
}

impl std::fmt::Display for PartKind {
    /// `attack batch` or `convergence check part`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PartKind::AttackBatch => "attack batch",
            PartKind::ConvergenceCheck => "convergence check part",
        })
    }
}

impl std::fmt::Display for CellPart {
    /// `attack batch 3/10` (`attack` where there is one batch) or `convergence check 2/6`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            PartKind::AttackBatch if self.count == 1 => return f.write_str("attack"),
            PartKind::AttackBatch => "attack batch",
            PartKind::ConvergenceCheck => "convergence check",
        };
        write!(f, "{what} {}/{}", self.index + 1, self.count)
    }
}

/// Reports nothing.
pub struct Silent;

impl SweepObserver for Silent {}

/// SGLD noise samples per gradient that the default EOT aims at: AutoAttack's 20 draws for
/// randomised defences (Croce & Hein 2020).
pub(super) const EOT_NOISE_SAMPLES: usize = 20;

impl Default for SweepSpec {
    /// The command line's defaults: the adaptive attacks at K = 0 and 1 with full gradients on
    /// the first 100 test images of the embedded models.
    fn default() -> Self {
        SweepSpec {
            threat: Threat::new(Norm::Linf),
            attacks: vec![AttackKind::Adaptive],
            budgets: Budgets::default(),
            ks: vec![0, 1],
            grad: vec![GradMode::Full],
            eot: None,
            defence: DefenceSpec::default(),
            examples: Examples::first(count(100)),
            convergence_sample: 20,
            seed: 0,
            save_adversarials: false,
            quick: false,
        }
    }
}

impl SweepSpec {
    /// A first table in minutes rather than hours: the default sweep's models, norm, ε and K
    /// on 20 test images, APGD-CE alone with 20 iterations, 2 EOT draws (through the exact
    /// gradient of the SGLD steps at K > 0) and no convergence check. Weaker than the adaptive
    /// default in every respect, so every row is an upper bound ([`SweepSpec::quick`]).
    pub fn quick_look(norm: Norm) -> Self {
        SweepSpec {
            threat: Threat::new(norm),
            attacks: vec![AttackKind::ApgdCe],
            budgets: Budgets {
                apgd_iterations: count(20),
                ..Budgets::default()
            },
            eot: Some(2),
            examples: Examples::first(count(20)),
            convergence_sample: 0,
            quick: true,
            ..SweepSpec::default()
        }
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
    pub(super) fn single_attacks(&self) -> Vec<AttackKind> {
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

    /// The first count beyond what published evaluations use, by a wide margin (SGLD steps,
    /// iterations, queries, draws, restarts, chains): a sweep that sets one runs only when its
    /// runner allows it ([`Runner::allow_long`]), after its estimate is printed. A mistyped
    /// `--steps 1000000` would otherwise compute in silence for days.
    pub fn beyond_usual(&self) -> Option<InvalidSetting> {
        let k = self.ks.iter().copied().max().unwrap_or(0);
        let b = &self.budgets;
        let counts: [(&'static str, usize, usize, &str); 10] = [
            ("ks", k, 100, "SGLD steps"),
            ("pgd_steps", b.pgd_steps.get(), 10_000, "PGD steps"),
            (
                "apgd_iterations",
                b.apgd_iterations.get(),
                10_000,
                "APGD iterations",
            ),
            (
                "fab_iterations",
                b.fab_iterations.get(),
                10_000,
                "FAB iterations",
            ),
            (
                "square_queries",
                b.square_queries.get(),
                1_000_000,
                "queries",
            ),
            (
                "boundary_steps",
                b.boundary_steps.get(),
                1_000_000,
                "boundary steps",
            ),
            ("eot", self.eot.unwrap_or(0), 1_000, "EOT draws"),
            ("restarts", b.restarts.get(), 100, "restarts"),
            ("chains", self.defence.chains, 1_000, "chains"),
            (
                "recheck_chains",
                self.defence.recheck_chains,
                10_000,
                "chains",
            ),
        ];
        let (field, value, most, what) = counts.into_iter().find(|c| c.1 > c.2)?;
        Some(InvalidSetting::new(
            field,
            value.to_string(),
            &format!("more than {most} {what}, far beyond what evaluations use"),
        ))
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

    /// Checks the settings on their own (against each model's data when a sweep is planned); an [`InvalidSetting`] names the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (field, empty, what) in [
            (
                "attacks",
                self.attacks.is_empty(),
                "name at least one attack",
            ),
            (
                "ks",
                self.ks.is_empty(),
                "name at least one K (0 = no SGLD)",
            ),
            (
                "grad",
                self.grad.is_empty(),
                "name at least one of full, bpda",
            ),
        ] {
            if empty {
                return Err(InvalidSetting::bare(field, what).into());
            }
        }
        settings::at_least_one("eot", self.eot.unwrap_or(1))?;
        // Checked at K = 0 too: a flag given is a flag meant, and a NaN is never a setting.
        self.defence.validate()?;
        if let Some(r) = self.budgets.pgd_rel_stepsize {
            settings::finite_positive("pgd_rel_stepsize", r)?;
        }
        for &e in &self.threat.eps_grid() {
            if !(e.is_finite() && e >= 0.0) {
                return Err(InvalidSetting::bare(
                    "eps",
                    &format!("expected numbers >= 0, found {e}"),
                )
                .into());
            }
            if self.threat.norm == Norm::Linf && e > 1.0 {
                return Err(InvalidSetting::bare(
                    "eps",
                    &format!(
                        "{e} exceeds 1, the largest L∞ distance between [0, 1] pixels (ε is in \
                         [0, 1] pixel units: 8/255 = 0.0314)"
                    ),
                )
                .into());
            }
        }
        Ok(())
    }
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
        let bad = || format!("`{s}`: expected i/n with 0 ≤ i < n, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (i.parse().map_err(|_| bad())?, n.parse().map_err(|_| bad())?);
        if index < count {
            Ok(Shard { index, count })
        } else {
            Err(bad())
        }
    }
}
