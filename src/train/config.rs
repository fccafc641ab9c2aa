//! Every setting of a training run ([`TrainSpec`]), as the checkpoint sidecar records it.
//! Defaults are the official JEM ones (github.com/wgrathwohl/JEM, `train_wrn_ebm.py`) unless a comment says otherwise.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use jem_datasets::{DataSource, ImageSet, Split};

use super::{AdvConfig, Augmentation, GuardConfig, JemConfig, LrSchedule};
use crate::model::{TrainingRecord, WideResNetConfig};
use crate::settings::{self, InvalidSetting};
use crate::Choice;

/// Which objective trains the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainKind {
    Baseline,
    Jem,
    Adv,
}

impl Choice for TrainKind {
    const WHAT: &'static str = "kind of training";

    const ALL: &'static [Self] = &[TrainKind::Baseline, TrainKind::Jem, TrainKind::Adv];

    fn name(self) -> &'static str {
        match self {
            TrainKind::Baseline => "baseline",
            TrainKind::Jem => "jem",
            TrainKind::Adv => "adv",
        }
    }

    fn description(self) -> &'static str {
        match self {
            TrainKind::Baseline => "Plain classifier, cross-entropy only",
            TrainKind::Jem => "Joint Energy-based Model (p(y|x) + p(x) with SGLD)",
            TrainKind::Adv => "PGD adversarial training (Madry et al. 2018)",
        }
    }
}

/// Every setting of a training run. The sidecar of each checkpoint records all of them but
/// `max_iters` (how far this invocation goes), and a resumed run compares them with the
/// recorded ones; the output folder and the checkpoint and log intervals are recorded too, so
/// they stay here beside what the run computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSpec {
    /// What to train.
    pub kind: TrainKind,
    /// Data set: `mnist` (embedded), `fashion-mnist[:DIR]`, `cifar10:DIR`, `cifar100:DIR`.
    pub data: String,
    /// Training images held out (the last ones) for validation and best-checkpoint selection.
    pub val_size: usize,
    /// Use only the first N training images (quick experiments and tests).
    pub train_subset: Option<usize>,
    /// Score the finished run on only the first N test images (quick experiments and tests;
    /// absent from older sidecars, which scored on all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_subset: Option<usize>,
    /// Wide-ResNet depth (6n + 4).
    pub depth: usize,
    /// Wide-ResNet widening factor.
    pub width: usize,
    pub epochs: usize,
    pub batch_size: usize,
    /// Adam learning rate (β = 0.9, 0.999; ε = 1e-8 as PyTorch). A resumed run may change it
    /// from where it stands (recorded in the run folder's changes.csv).
    pub lr: f64,
    pub warmup_iters: usize,
    /// Epochs at which the learning rate is multiplied by `decay_rate`.
    pub decay_epochs: Vec<usize>,
    pub decay_rate: f64,
    /// Gaussian noise added to every training input, on the network's [−1, 1] scale. A resumed
    /// run may change it from where it stands (recorded in the run folder's changes.csv).
    pub sigma_data: f32,
    /// Reflect padding for random crops (0 turns crops off).
    pub pad: usize,
    /// Random horizontal flips; by default on for CIFAR and off for digits and clothes.
    pub flip: Option<bool>,
    pub seed: u64,
    /// Output folder: best checkpoint `model.*`, logs, resumable state.
    pub out: PathBuf,
    /// Save the resumable state every N iterations (and at every epoch end).
    pub checkpoint_every: usize,
    /// Write a row to the iteration log every N iterations.
    pub log_every: usize,
    /// Start from the weights of this checkpoint instead of a random initialisation: the same
    /// architecture, or a narrower one of the same depth, widened without changing its function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    pub jem: JemConfig,
    /// The training attack of `--kind adv` (absent from older sidecars).
    #[serde(default)]
    pub adv: AdvConfig,
    pub guard: GuardConfig,
    /// Stop after this many iterations in total (the run can be resumed later).
    #[serde(skip)]
    pub max_iters: Option<usize>,
}

impl TrainSpec {
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

    /// Checks every setting before a run touches its folder: counts at least 1, rates and
    /// probabilities finite and in range, JEM's settings for a JEM and the training attack's
    /// for adversarial training. An error is an [`InvalidSetting`] naming the field (the data
    /// set and `val_size` are checked when the data load, also before the folder is written).
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        for (field, value) in [
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            ("checkpoint_every", self.checkpoint_every),
            ("log_every", self.log_every),
            ("val_size", self.val_size),
        ] {
            settings::at_least_one(field, value)?;
        }
        for (field, value) in [
            ("train_subset", self.train_subset),
            ("test_subset", self.test_subset),
            ("max_iters", self.max_iters),
        ] {
            value.map_or(Ok(()), |n| settings::at_least_one(field, n))?;
        }
        settings::finite_positive("lr", self.lr)?;
        // A factor: below 1 decays; above 1 raises the rate (the divergence tests use it).
        settings::finite_positive("decay_rate", self.decay_rate)?;
        settings::finite_non_negative("sigma_data", self.sigma_data)?;
        self.guard.validate()?;
        match self.kind {
            TrainKind::Jem => self.jem.validate(),
            TrainKind::Adv => self.adv.validate(),
            TrainKind::Baseline => Ok(()),
        }
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
        if self.val_size >= full.len() {
            let problem = format!(
                "leaves no training images ({} in {})",
                full.len(),
                full.name
            );
            let value = self.val_size.to_string();
            return Err(InvalidSetting::new("val_size", value, &problem).into());
        }
        let (mut train, val) = full.split_last(self.val_size);
        if let Some(n) = self.train_subset {
            let what = format!("the training images left after val_size {}", self.val_size);
            train = settings::first_images(&train, "train_subset", n, &what)?;
        }
        // The test set is read only when the run finishes; a cut of it is checked now.
        if self.test_subset.is_some() {
            self.load_test(&source)?;
        }
        Ok((source, train, val))
    }

    /// The test images a finished run is scored on: `source`'s test split, cut to
    /// `test_subset` if set.
    pub fn load_test(&self, source: &DataSource) -> anyhow::Result<ImageSet> {
        let test = source.load(Split::Test)?;
        Ok(match self.test_subset {
            None => test,
            Some(n) => {
                let what = format!("the test images of {}", test.name);
                settings::first_images(&test, "test_subset", n, &what)?
            }
        })
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
            } + &self
                .test_subset
                .map_or(String::new(), |n| format!("; test: first {n} images")),
            seed: self.seed,
            settings: settings.clone(),
            wall_seconds: wall,
        }
    }
}

impl Default for TrainSpec {
    /// The command line's defaults: a WRN-10-1 classifier on the embedded digits, JEM's
    /// official schedule (200 epochs, Adam at 1e-4 with 1 000 warm-up iterations, decay by 0.3
    /// at epochs 160 and 180, data noise 0.03).
    fn default() -> Self {
        TrainSpec {
            kind: TrainKind::Baseline,
            data: "mnist".into(),
            val_size: 5000,
            train_subset: None,
            test_subset: None,
            depth: 10,
            width: 1,
            epochs: 200,
            batch_size: 64,
            lr: 1e-4,
            warmup_iters: 1000,
            decay_epochs: vec![160, 180],
            decay_rate: 0.3,
            sigma_data: 0.03,
            pad: 4,
            flip: None,
            seed: 1,
            out: PathBuf::from("runs/train"),
            checkpoint_every: 200,
            log_every: 20,
            init_from: None,
            jem: JemConfig::default(),
            adv: AdvConfig::default(),
            guard: GuardConfig::default(),
            max_iters: None,
        }
    }
}
