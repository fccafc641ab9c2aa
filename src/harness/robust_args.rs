//! The settings of a sweep, as `jem-bench robust` takes them on the command line and stores
//! them in `settings.json`: [`RobustArgs`], the defaults they resolve to (ε grid, EOT per K,
//! PGD schedule, restarts) and their validation; [`Shard`].

use std::path::PathBuf;

use clap::Args;
use jem_attacks::{GradMode, Norm};
use serde::{Deserialize, Serialize};

use super::cells::AttackKind;
use crate::defended::DefenceArgs;

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
pub(super) const EOT_NOISE_SAMPLES: usize = 20;

pub(super) fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for RobustArgs {
    fn default() -> Self {
        crate::train::clap_defaults()
    }
}

impl RobustArgs {
    pub(super) fn eps_grid(&self) -> Vec<f32> {
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
    pub(super) fn validate(&self) -> anyhow::Result<()> {
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

    pub(super) fn model_paths(&self) -> Vec<PathBuf> {
        if !self.models.is_empty() {
            return self.models.clone();
        }
        crate::model::embedded_models()
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
