//! Checkpoints: the weights as safetensors (PyTorch's parameter names) plus a JSON sidecar that
//! says what the weights are (architecture, data, training settings, seed, metrics, software).
//!
//! A checkpoint named `results/models/baseline` is the pair `baseline.safetensors` +
//! `baseline.json`. Both files are written to a temporary name and renamed, so an interrupted
//! write never leaves a half-written checkpoint behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use burn::tensor::backend::Backend;
use burn_store::{ModuleSnapshot, SafetensorsStore};
use serde::{Deserialize, Serialize};

use super::{WideResNet, WideResNetConfig};

/// `jem-bench <version>`, recorded in every output.
pub const SOFTWARE: &str = concat!("jem-bench ", env!("CARGO_PKG_VERSION"));

/// How a model came to be: which trainer, with which settings, on which data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingRecord {
    /// `baseline`, `jem`, `adv` or `imported`.
    pub kind: String,
    /// The data set spec (`mnist`, `cifar10:DIR`, …), as `--data` takes it.
    pub data: String,
    /// Which images of it were trained on and which validated.
    #[serde(default)]
    pub data_split: String,
    pub seed: u64,
    /// Every setting of the trainer, as it serialises its own config.
    pub settings: serde_json::Value,
    pub wall_seconds: f64,
}

/// The JSON sidecar of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sidecar {
    pub format_version: u32,
    pub software: String,
    pub architecture: WideResNetConfig,
    pub training: TrainingRecord,
    /// Named results such as `val_accuracy`, `test_accuracy`, `test_nll`, `test_ece`.
    pub metrics: BTreeMap<String, f64>,
    pub parameters: usize,
}

impl Sidecar {
    pub fn new(architecture: WideResNetConfig, training: TrainingRecord) -> Self {
        Self {
            format_version: 1,
            software: SOFTWARE.into(),
            architecture,
            training,
            metrics: BTreeMap::new(),
            parameters: 0,
        }
    }
}

/// The two file paths of a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub weights: PathBuf,
    pub sidecar: PathBuf,
}

impl Checkpoint {
    /// Accepts `NAME`, `NAME.safetensors` or `NAME.json`.
    pub fn at(path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        let stem = match path.extension().and_then(|e| e.to_str()) {
            Some("safetensors") | Some("json") => path.with_extension(""),
            _ => path.to_path_buf(),
        };
        let with = |ext: &str| {
            let mut s = stem.clone().into_os_string();
            s.push(format!(".{ext}"));
            PathBuf::from(s)
        };
        Self {
            weights: with("safetensors"),
            sidecar: with("json"),
        }
    }

    pub fn exists(&self) -> bool {
        self.weights.exists() && self.sidecar.exists()
    }

    /// Writes weights and sidecar atomically (temporary file, then rename).
    pub fn save<B: Backend>(&self, model: &WideResNet<B>, sidecar: &Sidecar) -> anyhow::Result<()> {
        if let Some(dir) = self.weights.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create checkpoint folder {}", dir.display()))?;
        }
        let mut sidecar = sidecar.clone();
        sidecar.parameters = burn::module::Module::num_params(model);
        let mut store = SafetensorsStore::from_bytes(None)
            .metadata("software", SOFTWARE)
            .metadata("architecture", sidecar.architecture.name());
        model
            .save_into(&mut store)
            .map_err(|e| anyhow::anyhow!("cannot serialise weights: {e}"))?;
        let bytes = store
            .get_bytes()
            .map_err(|e| anyhow::anyhow!("cannot serialise weights: {e}"))?;
        write_atomic(&self.weights, &bytes)?;
        write_atomic(
            &self.sidecar,
            serde_json::to_string_pretty(&sidecar)?.as_bytes(),
        )
    }

    /// `sha256:<hex>` of the weights file: what sweeps record, so that a folder swept with other
    /// weights under the same path is never resumed, merged or compared as if it were this one.
    pub fn weights_digest(&self) -> anyhow::Result<String> {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(&self.weights)
            .with_context(|| format!("cannot read weights {}", self.weights.display()))?;
        let hex: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(format!("sha256:{hex}"))
    }

    pub fn read_sidecar(&self) -> anyhow::Result<Sidecar> {
        let text = std::fs::read_to_string(&self.sidecar).with_context(|| {
            format!(
                "cannot read checkpoint sidecar {} (a checkpoint is NAME.safetensors + NAME.json)",
                self.sidecar.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a jem-bench checkpoint sidecar (expected the JSON written by `jem-bench train`)",
                self.sidecar.display()
            )
        })
    }

    /// Builds the architecture named in the sidecar and loads the weights into it.
    pub fn load<B: Backend>(&self, device: &B::Device) -> anyhow::Result<(WideResNet<B>, Sidecar)> {
        let sidecar = self.read_sidecar()?;
        let mut model = sidecar.architecture.init::<B>(device)?;
        load_weights(&mut model, &self.weights)?;
        Ok((model, sidecar))
    }
}

/// Loads safetensors weights into `model`, demanding that every parameter is present with the
/// right shape and that the file holds nothing else.
pub(crate) fn load_weights<B: Backend>(
    model: &mut WideResNet<B>,
    path: &Path,
) -> anyhow::Result<()> {
    if !path.exists() {
        bail!("checkpoint weights {} do not exist", path.display());
    }
    let mut store = SafetensorsStore::from_file(path);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if !result.errors.is_empty() || !result.unused.is_empty() {
        bail!(
            "{}: weights do not fit the architecture {}: errors {:?}, unexpected tensors {:?}",
            path.display(),
            model.config().name(),
            result
                .errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>(),
            result.unused
        );
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

/// The embedded default models that exist under `results/models/` (baseline, JEM, adversarially
/// trained, in that order): what `robust` and `nonsense` use when no `--models` is given.
pub fn embedded_models() -> Vec<PathBuf> {
    ["baseline", "jem", "adv"]
        .iter()
        .map(|m| PathBuf::from("results/models").join(m))
        .filter(|p| Checkpoint::at(p).exists())
        .collect()
}
