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
use burn_store::{BurnToPyTorchAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
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
            format_version: FORMAT_VERSION,
            software: SOFTWARE.into(),
            architecture,
            training,
            metrics: BTreeMap::new(),
            parameters: 0,
        }
    }
}

impl Sidecar {
    /// Checks everything the rest of the program relies on, before any of it is used: a known
    /// format, a buildable architecture, a usable input normalisation (finite means, finite
    /// positive stds: a zero std would turn every input into NaN), a data set named.
    pub fn validate(&self, path: &Path) -> anyhow::Result<()> {
        let at = |field: &str| format!("{}: field `{field}`", path.display());
        check_format(Some(self.format_version.into()), path)?;
        let a = &self.architecture;
        a.blocks_per_stage().with_context(|| at("architecture"))?;
        anyhow::ensure!(
            a.in_channels >= 1,
            "{}: expected at least 1, found 0",
            at("architecture.in_channels")
        );
        anyhow::ensure!(
            a.num_classes >= 2,
            "{}: expected at least 2 classes, found {}",
            at("architecture.num_classes"),
            a.num_classes
        );
        anyhow::ensure!(
            a.leak.is_finite() && (0.0..1.0).contains(&a.leak),
            "{}: expected a slope in [0, 1), found {}",
            at("architecture.leak"),
            a.leak
        );
        let norm = &a.input_normalization;
        anyhow::ensure!(
            norm.mean.iter().all(|m| m.is_finite()),
            "{}: expected finite numbers, found {:?}",
            at("architecture.input_normalization.mean"),
            norm.mean
        );
        anyhow::ensure!(
            norm.std.iter().all(|s| s.is_finite() && *s > 0.0),
            "{}: expected finite numbers > 0, found {:?}",
            at("architecture.input_normalization.std"),
            norm.std
        );
        anyhow::ensure!(
            !self.training.data.trim().is_empty(),
            "{}: expected the data set the model was trained on (mnist, cifar10:DIR, …), found \"\"",
            at("training.data")
        );
        // A JEM's SGLD settings are what its defence and sampler run with: a JEM without them
        // would silently take another model's defaults.
        let jem = self.training.settings.get("jem");
        anyhow::ensure!(
            self.training.kind != "jem" || jem.is_some(),
            "{}: expected the JEM's settings (written by `jem-bench train --kind jem`), found none",
            at("training.settings.jem")
        );
        if jem.is_some() {
            crate::train::JemConfig::of(self)
                .with_context(|| at("training.settings.jem"))?
                .validate()
                .map_err(|e| {
                    let field = at(&format!("training.settings.jem.{}", e.field));
                    anyhow::anyhow!(e.message_naming(&field))
                })?;
        }
        Ok(())
    }

    /// The image shape (C, H, W) the model takes: that of the data set it was trained on,
    /// checked against its architecture (channels, classes).
    pub fn image_shape(&self) -> anyhow::Result<[usize; 3]> {
        let source = jem_datasets::DataSource::parse_name(&self.training.data)
            .context("the model's data set (its sidecar's training.data)")?;
        let set_classes = source.class_names().len();
        let a = &self.architecture;
        let shape = source.image_shape();
        anyhow::ensure!(
            shape[0] == a.in_channels && set_classes == a.num_classes,
            "the model takes {} channel(s) and has {} classes, but its data set {} has {} and {}",
            a.in_channels,
            a.num_classes,
            self.training.data,
            shape[0],
            set_classes
        );
        Ok(shape)
    }

    /// The one model–data compatibility check of every command: the data's channels, image
    /// size and number of classes must be those the model was built and trained for. A
    /// mismatch that broadcasts (a 3-channel model on 1-channel data) would otherwise run and
    /// report a meaningless accuracy.
    pub fn check_data(&self, model: &str, data: &jem_datasets::ImageSet) -> anyhow::Result<()> {
        let a = &self.architecture;
        let trained_shape = jem_datasets::DataSource::image_shape_of(&self.training.data);
        let size_ok = trained_shape.is_none_or(|[_, h, w]| h == data.height && w == data.width);
        anyhow::ensure!(
            data.channels == a.in_channels && data.num_classes() == a.num_classes && size_ok,
            "model {model} takes {} channel(s){} and has {} classes; data set {} has {} \
             channel(s) of {}×{} pixels and {} classes: name the data set the model was trained \
             on ({})",
            a.in_channels,
            trained_shape.map_or(String::new(), |[_, h, w]| format!(" of {h}×{w} pixels")),
            a.num_classes,
            data.name,
            data.channels,
            data.height,
            data.width,
            data.num_classes(),
            self.training.data
        );
        Ok(())
    }
}

/// The two file paths of a checkpoint; for the embedded default models, also the bytes compiled
/// into the binary, used when the files are not on disk (so that `jem-bench robust` works from
/// any folder).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub weights: PathBuf,
    pub sidecar: PathBuf,
    embedded: Option<&'static EmbeddedModel>,
}

/// A default model compiled into the binary.
#[derive(Debug, PartialEq)]
struct EmbeddedModel {
    /// The path it is known by (`results/models/NAME`), as sweeps record it.
    path: &'static str,
    weights: &'static [u8],
    sidecar: &'static str,
}

macro_rules! embedded {
    ($name:literal) => {
        EmbeddedModel {
            path: concat!("results/models/", $name),
            weights: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/results/models/",
                $name,
                ".safetensors"
            )),
            sidecar: include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/results/models/",
                $name,
                ".json"
            )),
        }
    };
}

/// The embedded models: first the defaults (baseline, JEM, adversarially trained, in that
/// order), then the others that any command can name from anywhere: the JEM whose log p(y|x)
/// is weighted 1 000 : 1 against log p(x), the reweighted model compared with the paper's balance
/// (docs/training-log.md).
static EMBEDDED: [EmbeddedModel; 4] = [
    embedded!("baseline"),
    embedded!("jem"),
    embedded!("adv"),
    embedded!("jem-ce1000"),
];

/// How many of [`EMBEDDED`] are the defaults.
const DEFAULTS: usize = 3;

/// Sidecar format: 3 stores every tensor as PyTorch's `state_dict` does (`linear.weight` is
/// `[out, in]`) and records every field of [`Sidecar`]. Earlier formats are refused by this
/// field: 2 (the same weights, `variant` and `data_split` optional) and 1 (burn's `[in, out]`
/// head).
pub const FORMAT_VERSION: u32 = 3;

/// Refuses a sidecar of another format than [`FORMAT_VERSION`] (`found` as read, `None` where
/// the field is not a number), saying which way it differs.
fn check_format(found: Option<u64>, path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        found == Some(FORMAT_VERSION as u64),
        "{}: field `format_version`: expected {FORMAT_VERSION}, found {} ({}); read it with the \
         jem-bench that wrote it",
        path.display(),
        found.map_or("none".to_string(), |f| f.to_string()),
        match found {
            Some(f) if f > FORMAT_VERSION as u64 => "written by a newer jem-bench",
            _ => "an earlier jem-bench's layout, no longer read",
        }
    );
    Ok(())
}

impl Checkpoint {
    /// Accepts `NAME`, `NAME.safetensors` or `NAME.json`. `results/models/{baseline,jem,adv}`
    /// name the embedded default models and `results/models/jem-ce1000` one more: files at that
    /// path (relative to the working folder) take precedence, else the copy compiled into the
    /// binary is used.
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
        let (weights, sidecar) = (with("safetensors"), with("json"));
        let on_disk = weights.exists() || sidecar.exists();
        let normalized = stem.strip_prefix(".").unwrap_or(&stem);
        let embedded = EMBEDDED
            .iter()
            .find(|m| !on_disk && normalized == Path::new(m.path));
        Self {
            weights,
            sidecar,
            embedded,
        }
    }

    /// Whether both files exist (or the checkpoint is embedded).
    pub fn exists(&self) -> bool {
        self.embedded.is_some() || (self.weights.exists() && self.sidecar.exists())
    }

    /// Checks that both files are there, naming the one that is missing.
    pub fn ensure_exists(&self) -> anyhow::Result<()> {
        if self.embedded.is_some() {
            return Ok(());
        }
        let onnx = self.weights.with_extension("onnx");
        anyhow::ensure!(
            self.weights.exists() || !onnx.exists(),
            "{} is a model imported from ONNX; a Wide-ResNet checkpoint (NAME.safetensors + \
             NAME.json) is needed here",
            onnx.display()
        );
        for (what, p) in [("weights", &self.weights), ("sidecar", &self.sidecar)] {
            anyhow::ensure!(
                p.exists(),
                "no checkpoint {what} at {} (a checkpoint NAME is NAME.safetensors + NAME.json)",
                p.display()
            );
        }
        Ok(())
    }

    /// Writes weights and sidecar atomically (temporary file, then rename). The weights are in
    /// PyTorch's layout (a `Wide_ResNet` state_dict: `load_state_dict` takes them), and the bytes
    /// depend on nothing but the tensors: saving the same weights twice gives the same file.
    pub fn save<B: Backend>(&self, model: &WideResNet<B>, sidecar: &Sidecar) -> anyhow::Result<()> {
        if let Some(dir) = self.weights.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create checkpoint folder {}", dir.display()))?;
        }
        let mut sidecar = sidecar.clone();
        sidecar.format_version = FORMAT_VERSION;
        sidecar.software = SOFTWARE.into();
        sidecar.parameters = burn::module::Module::num_params(model);
        // One metadata entry only: safetensors writes its metadata map in hash order, so two
        // entries would make the bytes differ from save to save.
        let mut store = SafetensorsStore::from_bytes(None)
            .clear_metadata()
            .metadata(
                "jem-bench",
                format!("{SOFTWARE}; {}", sidecar.architecture.name()),
            )
            .with_to_adapter(BurnToPyTorchAdapter);
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

    /// The sidecar, read and checked ([`Sidecar::validate`]).
    pub fn read_sidecar(&self) -> anyhow::Result<Sidecar> {
        let text = match self.embedded {
            Some(m) => m.sidecar.to_string(),
            None => std::fs::read_to_string(&self.sidecar).with_context(|| {
                format!(
                    "cannot read checkpoint sidecar {} (a checkpoint NAME is NAME.safetensors + NAME.json)",
                    self.sidecar.display()
                )
            })?,
        };
        // The format first: a sidecar of another one may lack fields this one requires.
        let not_a_sidecar = || {
            format!(
                "{}: not a jem-bench checkpoint sidecar (expected the JSON written by `jem-bench train` or `import`)",
                self.sidecar.display()
            )
        };
        let value: serde_json::Value = serde_json::from_str(&text).with_context(not_a_sidecar)?;
        let format = value.get("format_version").with_context(not_a_sidecar)?;
        check_format(format.as_u64(), &self.sidecar)?;
        let sidecar: Sidecar = serde_json::from_value(value).with_context(not_a_sidecar)?;
        sidecar.validate(&self.sidecar)?;
        Ok(sidecar)
    }

    fn weight_bytes(&self) -> anyhow::Result<Vec<u8>> {
        match self.embedded {
            Some(m) => Ok(m.weights.to_vec()),
            None => std::fs::read(&self.weights).with_context(|| {
                format!("cannot read checkpoint weights {}", self.weights.display())
            }),
        }
    }

    /// The checkpoint `path`, the value of the settings field `field` (`models`, `judge`, …),
    /// loaded: it exists, its sidecar and weights pass every check; a failure is a refusal of
    /// the field. Commands call this before writing anything, so that a broken model stops
    /// them there.
    pub fn load_setting<B: Backend>(
        path: &Path,
        field: &'static str,
        device: &B::Device,
    ) -> Result<(WideResNet<B>, Sidecar), crate::settings::InvalidSetting> {
        let refused = |e| crate::settings::refusal(field, path.display(), e);
        let ckpt = Checkpoint::at(path);
        ckpt.ensure_exists().map_err(refused)?;
        ckpt.load::<B>(device).map_err(refused)
    }

    /// Builds the architecture named in the sidecar and loads the weights into it, after
    /// checking that the file holds exactly the tensors of that architecture.
    pub fn load<B: Backend>(&self, device: &B::Device) -> anyhow::Result<(WideResNet<B>, Sidecar)> {
        let sidecar = self.read_sidecar()?;
        let model = sidecar
            .architecture
            .init::<B>(device)
            .with_context(|| format!("{}: field `architecture`", self.sidecar.display()))?;
        let bytes = self.weight_bytes()?;
        let model = load_weights(model, bytes, &self.weights, &self.sidecar)?;
        Ok((model, sidecar))
    }
}

/// `sha256:<hex>` of a model's tensors — names in sorted order, each with its dtype, shape and
/// little-endian bytes — in the layout the model holds them. What sweeps record: the same
/// weights give the same digest however the file was written (format, metadata, import or
/// re-save), and other weights under the same path are never resumed or compared as these.
pub fn weights_digest<B: Backend, M: ModuleSnapshot<B>>(model: &M) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    let mut tensors = model.collect(None, None, false);
    tensors.sort_by_key(|t| t.full_path());
    let mut hash = Sha256::new();
    for t in &tensors {
        let data = t
            .to_data()
            .map_err(|e| anyhow::anyhow!("cannot read tensor {}: {e}", t.full_path()))?;
        hash.update(t.full_path().as_bytes());
        hash.update([0]);
        hash.update(format!("{:?}{:?}", data.dtype, data.shape).as_bytes());
        hash.update([0]);
        hash.update(&data.bytes[..]);
    }
    Ok(crate::digest::named(hash))
}

/// Loads safetensors `bytes` into `model`, after checking — in the project's words, naming the
/// files — that they are a safetensors file holding every tensor of the architecture with its
/// shape and nothing else.
pub(crate) fn load_weights<B: Backend>(
    mut model: WideResNet<B>,
    bytes: Vec<u8>,
    weights: &Path,
    sidecar: &Path,
) -> anyhow::Result<WideResNet<B>> {
    let found: BTreeMap<String, Vec<usize>> = {
        let parsed = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            anyhow::anyhow!(
                "{}: not a readable safetensors file ({e}); the file may be truncated or of \
                 another format",
                weights.display()
            )
        })?;
        parsed
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect()
    };
    let expected: BTreeMap<String, Vec<usize>> = model
        .collect(None, Some(Box::new(BurnToPyTorchAdapter)), false)
        .iter()
        .map(|t| (t.full_path(), t.shape.to_vec()))
        .collect();
    let mut problems = Vec::new();
    for (name, shape) in &expected {
        match found.get(name) {
            None => problems.push(format!("tensor `{name}` {shape:?} is missing")),
            Some(s) if s != shape => problems.push(format!(
                "tensor `{name}` has shape {s:?}, the architecture needs {shape:?}"
            )),
            Some(_) => {}
        }
    }
    for (name, shape) in &found {
        if !expected.contains_key(name) {
            problems.push(format!(
                "tensor `{name}` {shape:?} is not part of the architecture"
            ));
        }
    }
    if !problems.is_empty() {
        let shown = problems.len().min(4);
        let more = problems.len() - shown;
        bail!(
            "{} does not hold the {} that {} describes: {}{}; the sidecar's depth, width, \
             in_channels, num_classes and variant must be those of the weights",
            weights.display(),
            model.config().name(),
            sidecar.display(),
            problems[..shown].join("; "),
            if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            }
        );
    }
    let mut store =
        SafetensorsStore::from_bytes(Some(bytes)).with_from_adapter(PyTorchToBurnAdapter);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("{}: cannot load the weights: {e}", weights.display()))?;
    // Names and shapes were checked above; burn-store lists BatchNorm tensors it matched
    // through their PyTorch names (weight/bias for gamma/beta) as unused too, so only its
    // errors and missing tensors count here.
    anyhow::ensure!(
        result.errors.is_empty() && result.missing.is_empty(),
        "{}: the weights do not fit {}: {}",
        weights.display(),
        model.config().name(),
        result
            .errors
            .iter()
            .map(|e| e.to_string())
            .chain(result.missing.iter().map(|m| format!("{m:?} missing")))
            .take(4)
            .collect::<Vec<_>>()
            .join("; ")
    );
    // A file written in another float type (f16, bf16, f64) computes in f32 like any other.
    let (model, found) = super::to_f32(model);
    found.ensure_finite(weights)?;
    Ok(model)
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
/// The temporary name is unique to the process and the call, so that concurrent writers of the
/// same file never write into each other's temporary file; the last rename wins whole.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = temporary_path(path)?;
    let written = std::fs::write(&tmp, bytes)
        .with_context(|| format!("cannot write {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
        });
    if written.is_err() {
        // A full disk or a refused rename leaves no debris: the target is as it was.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A temporary name beside `path`, unique to this process and call, with `path`'s folder
/// created: where [`write_atomic`] and [`FileSet`](crate::output_folder::FileSet) write before
/// renaming.
pub(crate) fn temporary_path(path: &Path) -> anyhow::Result<PathBuf> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}-{call}.tmp", std::process::id()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    Ok(PathBuf::from(tmp))
}

/// The embedded default models (baseline, JEM, adversarially trained, in that order), by the
/// paths sweeps record them under: what `robust` and `nonsense` use when no `--models` is given.
/// They are always available (compiled in); files at those paths take precedence.
pub fn embedded_models() -> Vec<PathBuf> {
    EMBEDDED[..DEFAULTS]
        .iter()
        .map(|m| PathBuf::from(m.path))
        .collect()
}
