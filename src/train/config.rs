//! Every setting of a training run, on the command line and in the checkpoint sidecar.
//! Defaults are the official JEM ones (github.com/wgrathwohl/JEM, `train_wrn_ebm.py`) unless a comment says otherwise.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

use jem_datasets::{DataSource, ImageSet, Split};

use super::{AdvConfig, Augmentation, GuardConfig, JemConfig, LrSchedule};
use crate::model::{TrainingRecord, WideResNetConfig};

/// Which objective trains the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TrainKind {
    /// Plain classifier, cross-entropy only.
    Baseline,
    /// Joint Energy-based Model (p(y|x) + p(x) with SGLD).
    Jem,
    /// PGD adversarial training (Madry et al. 2018).
    Adv,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
pub struct TrainConfig {
    /// What to train.
    #[arg(long, value_enum, default_value = "baseline")]
    pub kind: TrainKind,
    /// Data set: `mnist` (embedded), `fashion-mnist[:DIR]`, `cifar10:DIR`, `cifar100:DIR`.
    #[arg(long, default_value = "mnist")]
    pub data: String,
    /// Training images held out (the last ones) for validation and best-checkpoint selection.
    #[arg(long, default_value_t = 5000)]
    pub val_size: usize,
    /// Use only the first N training images (quick experiments and tests).
    #[arg(long)]
    pub train_subset: Option<usize>,
    /// Wide-ResNet depth (6n + 4).
    #[arg(long, default_value_t = 10)]
    pub depth: usize,
    /// Wide-ResNet widening factor.
    #[arg(long, default_value_t = 1)]
    pub width: usize,
    #[arg(long, default_value_t = 200)]
    pub epochs: usize,
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Adam learning rate (β = 0.9, 0.999; ε = 1e-8 as PyTorch). A resumed run may change it
    /// from where it stands (recorded in the run folder's changes.csv).
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f64,
    #[arg(long, default_value_t = 1000)]
    pub warmup_iters: usize,
    /// Epochs at which the learning rate is multiplied by --decay-rate.
    #[arg(long, value_delimiter = ',', default_values_t = vec![160, 180])]
    pub decay_epochs: Vec<usize>,
    #[arg(long, default_value_t = 0.3)]
    pub decay_rate: f64,
    /// Gaussian noise added to every training input, on the network's [−1, 1] scale. A resumed
    /// run may change it from where it stands (recorded in the run folder's changes.csv).
    #[arg(long, default_value_t = 0.03)]
    pub sigma_data: f32,
    /// Reflect padding for random crops (0 turns crops off).
    #[arg(long, default_value_t = 4)]
    pub pad: usize,
    /// Random horizontal flips; by default on for CIFAR and off for digits and clothes.
    #[arg(long)]
    pub flip: Option<bool>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output folder: best checkpoint `model.*`, logs, resumable state.
    #[arg(long, default_value = "runs/train")]
    pub out: PathBuf,
    /// Save the resumable state every N iterations (and at every epoch end).
    #[arg(long, default_value_t = 200)]
    pub checkpoint_every: usize,
    /// Write a row to the iteration log every N iterations.
    #[arg(long, default_value_t = 20)]
    pub log_every: usize,
    /// Start from the weights of this checkpoint (same architecture) instead of a random
    /// initialisation, e.g. a JEM fine-tuned from the baseline.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    #[command(flatten)]
    pub jem: JemConfig,
    /// The training attack of `--kind adv` (absent from older sidecars).
    #[command(flatten)]
    #[serde(default)]
    pub adv: AdvConfig,
    #[command(flatten)]
    pub guard: GuardConfig,
    /// Stop after this many iterations in total (the run can be resumed later).
    #[arg(long)]
    #[serde(skip)]
    pub max_iters: Option<usize>,
}

impl TrainConfig {
    /// The settings recorded in the sidecar and compared on resume: JEM's only for JEM runs,
    /// the training attack's only for adversarial ones.
    pub fn settings(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("settings serialise");
        let o = v.as_object_mut().expect("an object");
        if self.kind != TrainKind::Jem {
            o.remove("jem");
        }
        if self.kind != TrainKind::Adv {
            o.remove("adv");
        }
        v
    }

    /// Checks every flag before a run touches its folder: counts at least 1, rates and
    /// probabilities finite and in range. (The data set and `--val-size` are checked when the
    /// data load, also before the folder is written.)
    pub fn validate(&self) -> anyhow::Result<()> {
        let mut counts = vec![
            ("--epochs", self.epochs),
            ("--batch-size", self.batch_size),
            ("--checkpoint-every", self.checkpoint_every),
            ("--log-every", self.log_every),
            ("--val-size", self.val_size),
        ];
        if let Some(n) = self.train_subset {
            counts.push(("--train-subset", n));
        }
        if let Some(n) = self.max_iters {
            counts.push(("--max-iters", n));
        }
        for (flag, value) in counts {
            anyhow::ensure!(value >= 1, "{flag}: expected at least 1, found {value}");
        }
        let positive = |flag: &str, v: f64| {
            anyhow::ensure!(
                v.is_finite() && v > 0.0,
                "{flag}: expected a finite number > 0, found {v}"
            );
            Ok(())
        };
        let non_negative = |flag: &str, v: f64| {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{flag}: expected a finite number >= 0, found {v}"
            );
            Ok(())
        };
        positive("--lr", self.lr)?;
        // A factor: below 1 decays; above 1 raises the rate (the divergence tests use it).
        positive("--decay-rate", self.decay_rate)?;
        non_negative("--sigma-data", self.sigma_data as f64)?;
        if self.kind == TrainKind::Jem {
            self.jem
                .validate(|field| format!("--{}", field.replace('_', "-")))?;
        }
        if self.kind == TrainKind::Adv {
            self.adv.validate()?;
        }
        Ok(())
    }

    pub fn schedule(&self) -> LrSchedule {
        LrSchedule {
            base: self.lr,
            warmup_iters: self.warmup_iters,
            decay_epochs: self.decay_epochs.clone(),
            decay_rate: self.decay_rate,
        }
    }

    pub fn augmentation(&self, data_name: &str) -> Augmentation {
        Augmentation {
            pad: self.pad,
            flip: self.flip.unwrap_or(data_name.starts_with("cifar")),
        }
    }

    /// Loads the training and validation sets the config names: the training split less its
    /// last `val_size` images (which validate), cut to `train_subset` if set.
    pub fn load_data(&self) -> anyhow::Result<(DataSource, ImageSet, ImageSet)> {
        let source = DataSource::parse(&self.data)?;
        let full = source.load(Split::Train)?;
        anyhow::ensure!(
            self.val_size < full.len(),
            "--val-size {} leaves no training images ({} in {})",
            self.val_size,
            full.len(),
            full.name
        );
        let (mut train, val) = full.split_last(self.val_size);
        if let Some(n) = self.train_subset {
            anyhow::ensure!(
                n >= 1 && n <= train.len(),
                "--train-subset {n}: expected 1 to {} (the training images left after --val-size {})",
                train.len(),
                self.val_size
            );
            train = train.select(&(0..n).collect::<Vec<_>>());
        }
        Ok((source, train, val))
    }

    /// The network the config trains on images like `data`'s.
    pub fn architecture(&self, data: &ImageSet) -> WideResNetConfig {
        WideResNetConfig::new(self.depth, self.width, data.channels, data.num_classes())
    }

    /// How a checkpoint of this run was made, for its sidecar.
    pub(super) fn record(
        &self,
        kind: &str,
        source: &DataSource,
        wall: f64,
        settings: &serde_json::Value,
    ) -> TrainingRecord {
        TrainingRecord {
            kind: kind.into(),
            data: source.spec(),
            data_split: match self.train_subset {
                Some(n) => format!(
                    "train: first {n} images; validation: last {} train images",
                    self.val_size
                ),
                None => format!(
                    "train minus its last {} images, which validate",
                    self.val_size
                ),
            },
            seed: self.seed,
            settings: settings.clone(),
            wall_seconds: wall,
        }
    }
}

/// Defaults of a flattened argument group, taken from its clap attributes (one source of truth
/// for the command line and for code that builds settings, such as tests).
pub(crate) fn clap_defaults<T: clap::Args>() -> T {
    #[derive(clap::Parser)]
    struct Only<T: clap::Args> {
        #[command(flatten)]
        inner: T,
    }
    <Only<T> as clap::Parser>::parse_from(["jem-bench"]).inner
}

impl Default for JemConfig {
    fn default() -> Self {
        clap_defaults()
    }
}

impl Default for AdvConfig {
    fn default() -> Self {
        clap_defaults()
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        clap_defaults()
    }
}
