//! `jem-bench robust`'s flags, parsed once here and turned into the library's [`SweepSpec`]
//! (what the sweep computes) and [`Runner`](jem_bench::harness::Runner) (where and how); the library's errors name the
//! spec's fields, shown here as the flags that set them.

use super::choices::choices;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use super::defence::DefenceFlags;
use super::unused::Unused;
use clap::Args;
use jem_attacks::{GradMode, Norm};
use jem_bench::harness::{
    AttackKind, BudgetCounts, Budgets, Checkpoints, Examples, Shard, SweepSpec, Threat,
};
use jem_bench::Choice;

/// `jem-bench robust`'s flags: what the sweep computes ([`SweepSpec`]) and where and how it
/// runs ([`Runner`](jem_bench::harness::Runner)).
#[derive(Debug, Clone, Args)]
pub struct RobustArgs {
    /// A quick look, a first table in minutes: 20 test images, APGD-CE alone with 20
    /// iterations and 2 EOT draws, no convergence check (the budget flags it sets cannot be
    /// given with it). Every row is marked as an upper bound on robust accuracy, and the line
    /// under the table estimates the full evaluation. Output: runs/quick-NORM.
    #[arg(
        long,
        conflicts_with_all = ["attacks", "n_examples", "apgd_iterations", "eot", "convergence_sample"]
    )]
    pub quick: bool,
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
    #[arg(long, value_delimiter = ',', default_value = "adaptive", value_parser = choices::<AttackKind>())]
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
    /// Restarts of PGD and each APGD run (PGD-long takes twice as many).
    #[arg(long, default_value_t = SweepSpec::default().budgets.restarts.get())]
    pub restarts: usize,
    /// PGD steps (foolbox's default is 40; lowered so that the default sweep fits a CPU).
    #[arg(long, default_value_t = SweepSpec::default().budgets.pgd_steps.get())]
    pub pgd_steps: usize,
    /// PGD step size as a fraction of ε (default 2.5 / steps, so that the steps can cross the
    /// ball 1.25 times from a random start, as foolbox's 40 steps of ε/30 do).
    #[arg(long)]
    pub pgd_rel_stepsize: Option<f32>,
    /// APGD iterations per run (AutoAttack: 100).
    #[arg(long, default_value_t = SweepSpec::default().budgets.apgd_iterations.get())]
    pub apgd_iterations: usize,
    /// Square-attack queries per example (AutoAttack: 5 000).
    #[arg(long, default_value_t = SweepSpec::default().budgets.square_queries.get())]
    pub square_queries: usize,
    /// FAB-T iterations per target class (AutoAttack: 100).
    #[arg(long, default_value_t = SweepSpec::default().budgets.fab_iterations.get())]
    pub fab_iterations: usize,
    /// Boundary-attack steps (foolbox's default is 25 000).
    #[arg(long, default_value_t = SweepSpec::default().budgets.boundary_steps.get())]
    pub boundary_steps: usize,
    /// The first N images of the test split (100: intervals of about ±10 points at 50 %).
    #[arg(long, default_value_t = SweepSpec::default().examples.count())]
    pub n_examples: usize,
    /// Convergence check of every stochastic cell (K > 0): at each ε, up to this many of the
    /// examples the attack left standing (a seeded sample) are attacked again, once with 4×
    /// the EOT draws and once with 2× the iterations (steps, queries); a robust accuracy that
    /// then falls below the first estimate's 95 % interval is flagged in the table and in
    /// summary.json. 0: no check.
    #[arg(long, default_value_t = SweepSpec::default().convergence_sample)]
    pub convergence_sample: usize,
    /// Examples attacked at once (default: all of a cell's). Bounds memory for a large
    /// --n-examples: a batch holds its images × chains activations. Batch j > 0 seeds its
    /// attacks from (--seed, j), so the numbers depend on the batch size as on the seed.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Data set (default: the one each model was trained on).
    #[arg(long)]
    pub data: Option<String>,
    /// Seed of every attack's random starts and draws (batch j > 0: mixed with j).
    #[arg(long, default_value_t = SweepSpec::default().seed)]
    pub seed: u64,
    #[command(flatten)]
    pub defence: DefenceFlags,
    /// Keep each cell's returned inputs: `OUT/adversarials/CELL.safetensors` (`inputs`
    /// [N, C, H, W] in [0, 1], `clean`, `labels`, `examples` (test-set indices), `adversarial`
    /// flags) and `CELL.png` (up to 8 broken examples: clean above, adversarial below).
    #[arg(long)]
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
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run even where a count is far beyond what evaluations use (more than 100 SGLD steps,
    /// 10 000 iterations, 1 000 000 queries, …): without it such a sweep prints what it would
    /// take here and stops before touching --out.
    #[arg(long)]
    pub allow_long: bool,
    #[command(flatten)]
    pub slurm: SlurmFlags,
}

/// Running the sweep on a Slurm cluster instead of here (docs/scaling.md).
#[derive(Debug, Clone, Args)]
pub struct SlurmFlags {
    /// Submit the sweep to Slurm as a job array of N shards and a merge job that waits for
    /// them, instead of running it here: the scripts are written to OUT/slurm/ (kept, to read,
    /// edit or resubmit), each shard runs in OUT/shards/I, the merged sweep lands in OUT.
    /// Rerunning the command resubmits; finished shards' cells are reused.
    #[arg(long, value_name = "N", conflicts_with = "shard")]
    pub slurm: Option<usize>,
    /// Slurm partition of both jobs.
    #[arg(long, requires = "slurm")]
    pub slurm_partition: Option<String>,
    /// Time limit of each shard, as Slurm writes it (`4:00:00`, `1-00:00:00`).
    #[arg(long, requires = "slurm")]
    pub slurm_time: Option<String>,
    /// CPU cores per shard (`--cpus-per-task`).
    #[arg(long, requires = "slurm")]
    pub slurm_cpus: Option<usize>,
    /// GPUs per shard (`--gres=gpu:N`; run the sweep with `--device cuda`).
    #[arg(long, requires = "slurm")]
    pub slurm_gpus: Option<usize>,
    /// A file of extra `#SBATCH` lines for both jobs (an account, a QOS, modules are not
    /// lines of it: only `#SBATCH …`, comments and blank lines).
    #[arg(long, requires = "slurm")]
    pub slurm_extra: Option<PathBuf>,
}

impl SlurmFlags {
    /// The flags' settings, if `--slurm` was given.
    pub fn spec(&self) -> Option<jem_bench::slurm::SlurmSpec> {
        self.slurm.map(|shards| jem_bench::slurm::SlurmSpec {
            shards,
            partition: self.slurm_partition.clone(),
            time: self.slurm_time.clone(),
            cpus: self.slurm_cpus,
            gpus: self.slurm_gpus,
            extra: self.slurm_extra.clone(),
        })
    }
}

/// The command line of this process as a shard runs it: every argument but the program,
/// `--out`, `--shard` and the Slurm flags (each with its value, written `--flag value` or
/// `--flag=value`).
pub fn sweep_arguments(args: &[String]) -> Vec<String> {
    const DROPPED: [&str; 8] = [
        "--out",
        "--shard",
        "--slurm",
        "--slurm-partition",
        "--slurm-time",
        "--slurm-cpus",
        "--slurm-gpus",
        "--slurm-extra",
    ];
    let mut kept = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
        if DROPPED.contains(&flag) {
            if !arg.contains('=') {
                args.next();
            }
        } else {
            kept.push(arg.clone());
        }
    }
    kept
}

impl RobustArgs {
    /// The flags no cell of the sweep uses: the SGLD defence's, the gradient mode and the
    /// convergence check without a K > 0; each attack budget where no attack of the sweep (a
    /// preset's stages at each K) takes it.
    pub fn unused(&self) -> Vec<Unused> {
        let mut unused = Vec::new();
        if self.ks.iter().all(|&k| k == 0) {
            unused.push(Unused {
                ids: &[
                    "chains",
                    "recheck_chains",
                    "init_noise",
                    "sgld_step_size",
                    "sgld_noise",
                    "sgld_clamp",
                    "grad",
                    "convergence_sample",
                ],
                used_by: "a setting of the SGLD defence, which runs at --steps K > 0 only".into(),
            });
        }
        let attacks = if self.quick {
            SweepSpec::quick_look(self.norm).attacks
        } else {
            self.attacks.clone()
        };
        let stages: Vec<AttackKind> = attacks
            .iter()
            .flat_map(|a| self.ks.iter().flat_map(move |&k| a.at(k).stages()))
            .collect();
        // Each budget with the attacks it sets (`apgd_iterations`: APGD-CE, -DLR and -T).
        let mut budgets: Vec<(&'static [&'static str], Vec<AttackKind>)> = Vec::new();
        for &kind in AttackKind::ALL {
            let ids = kind.budget_settings();
            match budgets.iter_mut().find(|(b, _)| *b == ids) {
                _ if ids.is_empty() => {}
                Some((_, users)) => users.push(kind),
                None => budgets.push((ids, vec![kind])),
            }
        }
        for (ids, users) in budgets {
            if !stages.iter().any(|s| users.contains(s)) {
                let names: Vec<&str> = users.iter().map(|a| a.name()).collect();
                unused.push(Unused {
                    ids,
                    used_by: format!(
                        "a budget of {} only, which this sweep does not run (at any --steps)",
                        names.join(" and ")
                    ),
                });
            }
        }
        unused
    }

    /// The spec, the checkpoints and the runner's settings the flags describe; a count of 0 is
    /// refused here, every other setting by [`SweepSpec::validate`] (its errors name fields;
    /// [`with_flags`](super::with_flags) shows them as flags).
    pub fn into_parts(self) -> anyhow::Result<RobustSettings> {
        let jobs = match self.jobs {
            None => std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            Some(n) => NonZeroUsize::new(n)
                .ok_or_else(|| anyhow::anyhow!("--jobs: expected at least 1, found 0"))?,
        };
        let folder = if self.quick { "quick" } else { "robust" };
        let out = self
            .out
            .unwrap_or_else(|| PathBuf::from(format!("runs/{folder}-{}", self.norm)));
        let quick = SweepSpec::quick_look(self.norm);
        let spec = SweepSpec {
            threat: Threat {
                norm: self.norm,
                eps: self.eps,
            },
            attacks: self.attacks,
            ks: self.ks,
            grad: self.grad,
            eot: self.eot,
            budgets: BudgetCounts {
                restarts: self.restarts,
                pgd_steps: self.pgd_steps,
                pgd_rel_stepsize: self.pgd_rel_stepsize,
                apgd_iterations: self.apgd_iterations,
                square_queries: self.square_queries,
                fab_iterations: self.fab_iterations,
                boundary_steps: self.boundary_steps,
            }
            .checked()?,
            examples: Examples::checked(self.n_examples, self.batch_size)?,
            convergence_sample: self.convergence_sample,
            seed: self.seed,
            defence: self.defence.spec(),
            save_adversarials: self.save_adversarials,
            quick: false,
        };
        // The quick look's budgets replace the defaults the flags it conflicts with hold.
        let spec = if self.quick {
            SweepSpec {
                attacks: quick.attacks,
                budgets: Budgets {
                    apgd_iterations: quick.budgets.apgd_iterations,
                    ..spec.budgets
                },
                eot: quick.eot,
                examples: quick.examples,
                convergence_sample: quick.convergence_sample,
                quick: true,
                ..spec
            }
        } else {
            spec
        };
        let checkpoints = Checkpoints {
            models: self.models,
            data: self.data,
        };
        Ok(RobustSettings {
            spec,
            checkpoints,
            out,
            shard: self.shard,
            jobs,
        })
    }
}

/// `jem-bench robust`'s flags resolved: what the sweep computes, on which checkpoints, and
/// where and how it runs.
#[derive(Debug)]
pub struct RobustSettings {
    pub spec: SweepSpec,
    pub checkpoints: Checkpoints,
    /// The sweep's folder (`--out`, else `runs/robust-NORM` or `runs/quick-NORM`).
    pub out: PathBuf,
    pub shard: Option<Shard>,
    /// Cells run at once.
    pub jobs: NonZeroUsize,
}

#[cfg(test)]
mod tests {
    use super::super::{flag_of, with_flags};
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    #[command(allow_negative_numbers = true)]
    struct Robust {
        #[command(flatten)]
        args: RobustArgs,
    }

    fn parse(flags: &[&str]) -> RobustArgs {
        let line = std::iter::once("robust").chain(flags.iter().copied());
        Robust::try_parse_from(line).expect("valid flags").args
    }

    #[test]
    fn the_flags_default_to_the_default_spec() {
        let settings = parse(&[]).into_parts().unwrap();
        assert_eq!(settings.spec, SweepSpec::default());
        assert_eq!(settings.checkpoints, Checkpoints::default());
        assert_eq!(settings.out, PathBuf::from("runs/robust-linf"));
        assert_eq!(settings.shard, None);
        let RobustSettings { spec, out, .. } =
            parse(&["--norm", "l2", "--steps", "0,10", "--n-examples", "7"])
                .into_parts()
                .unwrap();
        assert_eq!(
            (spec.threat.norm, spec.ks, spec.examples.count()),
            (Norm::L2, vec![0, 10], 7)
        );
        assert_eq!(out, PathBuf::from("runs/robust-l2"));
    }

    #[test]
    fn a_shard_runs_the_sweeps_own_arguments_without_where_and_how() {
        let args: Vec<String> = [
            "--device",
            "cpu",
            "robust",
            "--models",
            "a,b",
            "--out",
            "x",
            "--slurm",
            "3",
            "--slurm-time=1:00:00",
            "--eps",
            "0,0.1",
            "--slurm-partition",
            "p",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            sweep_arguments(&args),
            ["--device", "cpu", "robust", "--models", "a,b", "--eps", "0,0.1"]
        );
        assert!(Robust::try_parse_from(["robust", "--slurm-time", "1:00"]).is_err());
        assert!(Robust::try_parse_from(["robust", "--slurm", "2", "--shard", "0/2"]).is_err());
    }

    #[test]
    fn quick_is_the_quick_look_and_refuses_the_budgets_it_sets() {
        let RobustSettings { spec, out, .. } = parse(&["--quick"]).into_parts().unwrap();
        assert_eq!(spec, SweepSpec::quick_look(Norm::Linf));
        assert_eq!(out, PathBuf::from("runs/quick-linf"));
        let spec = parse(&["--quick", "--norm", "l2", "--steps", "0", "--seed", "3"])
            .into_parts()
            .unwrap()
            .spec;
        assert_eq!(
            (spec.threat.norm, spec.ks, spec.seed, spec.quick),
            (Norm::L2, vec![0], 3, true)
        );
        for flag in ["--attacks", "--n-examples", "--apgd-iterations", "--eot"] {
            let value = if flag == "--attacks" { "pgd" } else { "5" };
            let line = ["robust", "--quick", flag, value];
            assert!(Robust::try_parse_from(line).is_err(), "{flag}");
        }
    }

    #[test]
    fn a_refused_field_is_shown_as_its_flag() {
        for (flags, shown) in [
            (
                &["--n-examples", "0"][..],
                "--n-examples: expected at least 1, found 0",
            ),
            (
                &["--eps", "-0.1"][..],
                "--eps: expected numbers >= 0, found -0.1",
            ),
        ] {
            let e = match parse(flags).into_parts() {
                Ok(settings) => settings.spec.validate().unwrap_err(),
                Err(e) => e,
            };
            assert!(
                format!("{e}")
                    .starts_with(flags[0].trim_start_matches('-').replace('-', "_").as_str()),
                "{e}"
            );
            assert_eq!(format!("{}", with_flags(e, &Robust::command())), shown);
        }
        let command = Robust::command();
        assert_eq!(flag_of(&command, "ks").as_deref(), Some("--steps"));
        assert_eq!(
            flag_of(&command, "n_examples").as_deref(),
            Some("--n-examples")
        );
        assert_eq!(flag_of(&command, "chains").as_deref(), Some("--chains"));
        assert_eq!(flag_of(&command, "no_such_field"), None);
        let e = parse(&["--jobs", "0"]).into_parts().unwrap_err();
        assert_eq!(format!("{e}"), "--jobs: expected at least 1, found 0");
    }
}
