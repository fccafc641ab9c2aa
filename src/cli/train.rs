//! `jem-bench train`'s flags, parsed once here and turned into the library's
//! [`TrainSpec`] (with its [`JemConfig`], [`AdvConfig`] and [`GuardConfig`]); every default is
//! the library's `Default`, and the library's errors name the spec's fields, shown by
//! [`with_flags`](super::with_flags) as these flags.

use std::path::PathBuf;

use clap::Args;
use jem_attacks::Norm;
use jem_bench::train::{AdvConfig, ChainStartKind, GuardConfig, JemConfig, TrainKind, TrainSpec};
use jem_bench::Choice;

use super::choices::choices;
use super::unused::Unused;

/// What `jem-bench train` trains and how (every flag of the command).
#[derive(Debug, Clone, PartialEq, Args)]
pub struct TrainFlags {
    /// What to train.
    #[arg(long, value_parser = choices::<TrainKind>(), default_value = TrainSpec::default().kind.name())]
    pub kind: TrainKind,
    /// Data set: `mnist` (embedded), `fashion-mnist[:DIR]`, `cifar10:DIR`, `cifar100:DIR`.
    #[arg(long, default_value_t = TrainSpec::default().data)]
    pub data: String,
    /// Training images held out (the last ones) for validation and best-checkpoint selection.
    #[arg(long, default_value_t = TrainSpec::default().val_size)]
    pub val_size: usize,
    /// Use only the first N training images (quick experiments and tests).
    #[arg(long)]
    pub train_subset: Option<usize>,
    /// Score the finished run on only the first N test images (quick experiments and tests;
    /// default: all of them).
    #[arg(long)]
    pub test_subset: Option<usize>,
    /// Wide-ResNet depth (6n + 4).
    #[arg(long, default_value_t = TrainSpec::default().depth)]
    pub depth: usize,
    /// Wide-ResNet widening factor.
    #[arg(long, default_value_t = TrainSpec::default().width)]
    pub width: usize,
    #[arg(long, default_value_t = TrainSpec::default().epochs)]
    pub epochs: usize,
    #[arg(long, default_value_t = TrainSpec::default().batch_size)]
    pub batch_size: usize,
    /// Adam learning rate (β = 0.9, 0.999; ε = 1e-8 as PyTorch). A resumed run may change it
    /// from where it stands (recorded in the run folder's changes.csv).
    #[arg(long, default_value_t = TrainSpec::default().lr)]
    pub lr: f64,
    #[arg(long, default_value_t = TrainSpec::default().warmup_iters)]
    pub warmup_iters: usize,
    /// Epochs at which the learning rate is multiplied by --decay-rate, comma-separated
    /// (e.g. `--decay-epochs 160,180`).
    #[arg(long, value_delimiter = ',', default_values_t = TrainSpec::default().decay_epochs)]
    pub decay_epochs: Vec<usize>,
    #[arg(long, default_value_t = TrainSpec::default().decay_rate)]
    pub decay_rate: f64,
    /// Gaussian noise added to every training input, on the network's [−1, 1] scale. A resumed
    /// run may change it from where it stands (recorded in the run folder's changes.csv).
    #[arg(long, default_value_t = TrainSpec::default().sigma_data)]
    pub sigma_data: f32,
    /// Reflect padding for random crops (0 turns crops off).
    #[arg(long, default_value_t = TrainSpec::default().pad)]
    pub pad: usize,
    /// Random horizontal flips; by default on for CIFAR and off for digits and clothes.
    #[arg(long)]
    pub flip: Option<bool>,
    #[arg(long, default_value_t = TrainSpec::default().seed)]
    pub seed: u64,
    /// Output folder: best checkpoint `model.*`, logs, resumable state.
    #[arg(long, default_value_os_t = TrainSpec::default().out)]
    pub out: PathBuf,
    /// Save the resumable state every N iterations (and at every epoch end).
    #[arg(long, default_value_t = TrainSpec::default().checkpoint_every)]
    pub checkpoint_every: usize,
    /// Write a row to the iteration log every N iterations.
    #[arg(long, default_value_t = TrainSpec::default().log_every)]
    pub log_every: usize,
    /// Start from the weights of this checkpoint instead of a random initialisation, e.g. a JEM
    /// fine-tuned from the baseline. Same architecture, or a narrower one of the same depth
    /// whose width divides this run's: it is widened first without changing its logits
    /// (Net2WiderNet, Chen et al. 2016), so a wider network continues where it stopped.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    pub jem: JemFlags,
    /// The training attack of `--kind adv` (absent from older sidecars).
    #[command(flatten)]
    pub adv: AdvFlags,
    #[command(flatten)]
    pub guard: GuardFlags,
    /// Stop after this many iterations in total (the run can be resumed later).
    #[arg(long)]
    pub max_iters: Option<usize>,
}

impl TrainFlags {
    /// The settings the flags give.
    pub fn spec(self) -> TrainSpec {
        TrainSpec {
            kind: self.kind,
            data: self.data,
            val_size: self.val_size,
            train_subset: self.train_subset,
            test_subset: self.test_subset,
            depth: self.depth,
            width: self.width,
            epochs: self.epochs,
            batch_size: self.batch_size,
            lr: self.lr,
            warmup_iters: self.warmup_iters,
            decay_epochs: self.decay_epochs,
            decay_rate: self.decay_rate,
            sigma_data: self.sigma_data,
            pad: self.pad,
            flip: self.flip,
            seed: self.seed,
            out: self.out,
            checkpoint_every: self.checkpoint_every,
            log_every: self.log_every,
            init_from: self.init_from,
            jem: self.jem.spec(),
            adv: self.adv.spec(),
            guard: self.guard.spec(),
            max_iters: self.max_iters,
        }
    }

    /// The flags `--kind` leaves unused: JEM's (and the energy-gap guard) outside `--kind jem`,
    /// the training attack's outside `--kind adv`.
    pub fn unused(&self) -> Vec<Unused> {
        let of = |kind: TrainKind| format!("a setting of --kind {} only", kind.name());
        let mut unused = Vec::new();
        if self.kind != TrainKind::Jem {
            unused.push(Unused {
                ids: &[
                    "px_weight",
                    "pyx_weight",
                    "sgld_steps",
                    "sgld_lr",
                    "sgld_std",
                    "sgld_clamp",
                    "buffer_size",
                    "reinit_freq",
                    "energy_reg",
                    "sgld_threads",
                    "chain_start",
                    "guard_max_energy_gap",
                ],
                used_by: of(TrainKind::Jem),
            });
        }
        if self.kind != TrainKind::Adv {
            unused.push(Unused {
                ids: &[
                    "norm",
                    "eps",
                    "adv_steps",
                    "adv_rel_stepsize",
                    "adv_zero_start",
                    "adv_clean_weight",
                    "adv_eps_ramp_iters",
                    "adv_val_size",
                    "trades_beta",
                ],
                used_by: of(TrainKind::Adv),
            });
        }
        unused
    }
}

/// JEM's settings (`--kind jem`); defaults are the official ones (`train_wrn_ebm.py`).
#[derive(Debug, Clone, PartialEq, Args)]
pub struct JemFlags {
    /// Weight of the p(x) (generative) term. A resumed run may change it (recorded in the run
    /// folder's changes.csv), as it may --pyx-weight.
    #[arg(long, default_value_t = JemConfig::default().px_weight)]
    pub px_weight: f64,
    /// Weight of the p(y|x) (cross-entropy) term; a resumed run may change it.
    #[arg(long, default_value_t = JemConfig::default().pyx_weight)]
    pub pyx_weight: f64,
    /// SGLD steps η per iteration.
    #[arg(long, default_value_t = JemConfig::default().sgld_steps)]
    pub sgld_steps: usize,
    /// SGLD step size α, on the network's [−1, 1] scale.
    #[arg(long, default_value_t = JemConfig::default().sgld_lr)]
    pub sgld_lr: f32,
    /// SGLD noise σ, on the network's [−1, 1] scale.
    #[arg(long, default_value_t = JemConfig::default().sgld_std)]
    pub sgld_std: f32,
    /// Clamp SGLD samples to [0, 1] pixels after each step (the official code does not).
    #[arg(long)]
    pub sgld_clamp: bool,
    /// Persistent chains in the replay buffer.
    #[arg(long, default_value_t = JemConfig::default().buffer_size)]
    pub buffer_size: usize,
    /// Probability ρ that a chain restarts from U(−1, 1).
    #[arg(long, default_value_t = JemConfig::default().reinit_freq)]
    pub reinit_freq: f64,
    /// Weight λ of an energy penalty λ·(E(x)² + E(x̂)²) (Du & Mordatch 2019), which keeps the
    /// energies of data and samples near zero; 0 (the official JEM) turns it off. Meant for a
    /// JEM started from a trained classifier, whose first samples have LogSumExp near 165
    /// against 17 for data: the official loss then wipes out its accuracy.
    #[arg(long, default_value_t = JemConfig::default().energy_reg)]
    pub energy_reg: f64,
    /// Threads that share the SGLD chains of a step (0: one per core on the CPU, one on a GPU,
    /// where shards only multiply kernel launches). Every chain gets the
    /// same noise whatever the count, but a shard's batch size moves the last bit of some
    /// results, so runs with different counts drift apart: the count is a setting of the run.
    #[arg(long, default_value_t = JemConfig::default().sgld_threads)]
    pub sgld_threads: usize,
    /// Where chains start and restart: `uniform`, U(−1, 1) (the paper), or `class-gaussian`, a
    /// Gaussian per class fitted to the training images (JEM++'s informative initialisation),
    /// which puts short chains near the data from the first step.
    #[arg(long, value_parser = choices::<ChainStartKind>(), default_value = JemConfig::default().chain_start.name())]
    pub chain_start: ChainStartKind,
}

impl JemFlags {
    /// The settings the flags give.
    pub fn spec(self) -> JemConfig {
        JemConfig {
            px_weight: self.px_weight,
            pyx_weight: self.pyx_weight,
            sgld_steps: self.sgld_steps,
            sgld_lr: self.sgld_lr,
            sgld_std: self.sgld_std,
            sgld_clamp: self.sgld_clamp,
            buffer_size: self.buffer_size,
            reinit_freq: self.reinit_freq,
            energy_reg: self.energy_reg,
            sgld_threads: self.sgld_threads,
            chain_start: self.chain_start,
        }
    }
}

/// The training attack of `--kind adv`; defaults are Madry et al.'s MNIST L∞ ones.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct AdvFlags {
    /// Threat model of the training attack: linf or l2.
    #[arg(long, default_value_t = AdvConfig::default().norm)]
    pub norm: Norm,
    /// Radius ε of the training attack in [0, 1] pixel units.
    #[arg(long, default_value_t = AdvConfig::default().eps)]
    pub eps: f32,
    /// PGD steps per batch.
    #[arg(long, default_value_t = AdvConfig::default().adv_steps)]
    pub adv_steps: usize,
    /// PGD step size as a fraction of ε (0.01 / 0.3: Madry's 0.01 at ε = 0.3).
    #[arg(long, default_value_t = AdvConfig::default().adv_rel_stepsize)]
    pub adv_rel_stepsize: f32,
    /// Start PGD at the clean input instead of a uniform random point of the ε-ball.
    #[arg(long)]
    pub adv_zero_start: bool,
    /// Weight of the clean cross-entropy; the adversarial one gets 1 − weight (0: PGD only).
    #[arg(long, default_value_t = AdvConfig::default().adv_clean_weight)]
    pub adv_clean_weight: f64,
    /// Grow ε linearly from 0 over the first N iterations (small networks trained at the full ε
    /// from the start can collapse to a constant prediction).
    #[arg(long, default_value_t = AdvConfig::default().adv_eps_ramp_iters)]
    pub adv_eps_ramp_iters: usize,
    /// Validation images (the first N of the held-out set) attacked at the end of each epoch
    /// with the training attack at the full ε; the most robust epoch is kept as the best
    /// checkpoint.
    #[arg(long, default_value_t = AdvConfig::default().adv_val_size)]
    pub adv_val_size: usize,
    /// Train with TRADES (Zhang et al. 2019) instead of Madry's loss: CE(clean) + β ·
    /// KL(clean ‖ perturbed), the perturbation maximising the KL term (the TRADES paper reports
    /// MNIST and CIFAR-10 at β = 6; smaller β favours clean accuracy). Needs the random start
    /// (the divergence has no gradient at the clean input) and no `--adv-clean-weight`.
    #[arg(long, value_name = "BETA")]
    pub trades_beta: Option<f64>,
}

impl AdvFlags {
    /// The settings the flags give.
    pub fn spec(self) -> AdvConfig {
        AdvConfig {
            norm: self.norm,
            eps: self.eps,
            adv_steps: self.adv_steps,
            adv_rel_stepsize: self.adv_rel_stepsize,
            adv_zero_start: self.adv_zero_start,
            adv_clean_weight: self.adv_clean_weight,
            adv_eps_ramp_iters: self.adv_eps_ramp_iters,
            adv_val_size: self.adv_val_size,
            trades_beta: self.trades_beta,
        }
    }
}

/// The divergence guard: when a step counts as divergence, and what the trainer does then.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct GuardFlags {
    /// Roll back when |loss| exceeds this (the official JEM code aborts at 1e8).
    #[arg(long, default_value_t = GuardConfig::default().guard_max_loss)]
    pub guard_max_loss: f64,
    /// Roll back when the energy gap |E(data) − E(samples)| exceeds this (JEM).
    #[arg(long, default_value_t = GuardConfig::default().guard_max_energy_gap)]
    pub guard_max_energy_gap: f64,
    /// Multiply the learning rate by this at each rollback.
    #[arg(long, default_value_t = GuardConfig::default().guard_lr_factor)]
    pub guard_lr_factor: f64,
    /// Give up after this many rollbacks.
    #[arg(long, default_value_t = GuardConfig::default().guard_max_rollbacks)]
    pub guard_max_rollbacks: usize,
}

impl GuardFlags {
    /// The settings the flags give.
    pub fn spec(self) -> GuardConfig {
        GuardConfig {
            guard_max_loss: self.guard_max_loss,
            guard_max_energy_gap: self.guard_max_energy_gap,
            guard_lr_factor: self.guard_lr_factor,
            guard_max_rollbacks: self.guard_max_rollbacks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Train {
        #[command(flatten)]
        flags: TrainFlags,
    }

    fn parse(flags: &[&str]) -> TrainSpec {
        let line = std::iter::once("train").chain(flags.iter().copied());
        Train::try_parse_from(line)
            .expect("valid flags")
            .flags
            .spec()
    }

    #[test]
    fn no_flags_give_the_default_spec() {
        assert_eq!(parse(&[]), TrainSpec::default());
    }

    #[test]
    fn each_flag_sets_its_field() {
        let flags = concat!(
            "--kind jem --data fashion-mnist --val-size 100 --train-subset 640 --depth 16 ",
            "--width 4 --epochs 3 --batch-size 32 --lr 0.001 --warmup-iters 10 ",
            "--decay-epochs 1,2 --decay-rate 0.5 --sigma-data 0.1 --pad 0 --flip true ",
            "--seed 7 --out runs/x --checkpoint-every 9 --log-every 3 --init-from ",
            "results/models/baseline --max-iters 11 --px-weight 0.5 --pyx-weight 2 ",
            "--sgld-steps 5 --sgld-lr 0.5 --sgld-std 0.02 --sgld-clamp --buffer-size 64 ",
            "--reinit-freq 0.1 --energy-reg 0.01 --sgld-threads 2 --chain-start ",
            "class-gaussian --norm l2 --eps 1.5 --adv-steps 7 --adv-rel-stepsize 0.2 ",
            "--adv-zero-start --adv-clean-weight 0.25 --adv-eps-ramp-iters 50 ",
            "--adv-val-size 20 --trades-beta 6 --guard-max-loss 1e6 --guard-max-energy-gap ",
            "100 --guard-lr-factor 0.25 --guard-max-rollbacks 2"
        );
        let spec = parse(&flags.split_whitespace().collect::<Vec<_>>());
        let want = TrainSpec {
            kind: TrainKind::Jem,
            data: "fashion-mnist".into(),
            val_size: 100,
            train_subset: Some(640),
            test_subset: None,
            depth: 16,
            width: 4,
            epochs: 3,
            batch_size: 32,
            lr: 0.001,
            warmup_iters: 10,
            decay_epochs: vec![1, 2],
            decay_rate: 0.5,
            sigma_data: 0.1,
            pad: 0,
            flip: Some(true),
            seed: 7,
            out: PathBuf::from("runs/x"),
            checkpoint_every: 9,
            log_every: 3,
            init_from: Some(PathBuf::from("results/models/baseline")),
            jem: JemConfig {
                px_weight: 0.5,
                pyx_weight: 2.0,
                sgld_steps: 5,
                sgld_lr: 0.5,
                sgld_std: 0.02,
                sgld_clamp: true,
                buffer_size: 64,
                reinit_freq: 0.1,
                energy_reg: 0.01,
                sgld_threads: 2,
                chain_start: ChainStartKind::ClassGaussian,
            },
            adv: AdvConfig {
                norm: Norm::L2,
                eps: 1.5,
                adv_steps: 7,
                adv_rel_stepsize: 0.2,
                adv_zero_start: true,
                adv_clean_weight: 0.25,
                adv_eps_ramp_iters: 50,
                adv_val_size: 20,
                trades_beta: Some(6.0),
            },
            guard: GuardConfig {
                guard_max_loss: 1e6,
                guard_max_energy_gap: 100.0,
                guard_lr_factor: 0.25,
                guard_max_rollbacks: 2,
            },
            max_iters: Some(11),
        };
        assert_eq!(spec, want);
    }

    #[test]
    fn a_refused_field_is_shown_as_its_flag() {
        for (flags, shown) in [
            (
                &["--epochs", "0"][..],
                "--epochs: expected at least 1, found 0",
            ),
            (
                &["--kind", "jem", "--reinit-freq", "1.5"][..],
                "--reinit-freq: expected a probability in [0, 1], found 1.5",
            ),
            (
                &["--kind", "adv", "--adv-steps", "0"][..],
                "--adv-steps: expected at least 1, found 0",
            ),
        ] {
            let e = anyhow::Error::new(parse(flags).validate().unwrap_err());
            let command = Train::command();
            assert_eq!(format!("{}", super::super::with_flags(e, &command)), shown);
        }
        // JEM's settings are checked for a JEM only.
        assert!(parse(&["--reinit-freq", "1.5"]).validate().is_ok());
    }
}
