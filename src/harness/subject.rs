//! What a sweep evaluates: any network that implements [`Classifier`] — a jem-bench checkpoint
//! or a burn model of the caller's — with its name, its test images and the SGLD settings its
//! test-time defence runs with at K > 0.
//!
//! A sweep runs cells on several threads; each cell classifies with its own copy of the
//! network, cloned from the one the subject holds.

use std::sync::Mutex;

use anyhow::Context;
use burn::module::Module;
use burn::tensor::{Tensor, TensorData};
use jem_attacks::{Classifier, SgldConfig};
use jem_datasets::ImageSet;

use crate::backend::BenchBackend;
use crate::model::{weights_digest, Checkpoint, LoadedNetwork, OnnxCheckpoint};
use crate::train::JemConfig;

/// A model under evaluation.
///
/// ```no_run
/// # fn wrap(network: jem_bench::model::WideResNet<jem_bench::backend::Train>) -> anyhow::Result<()> {
/// use std::num::NonZeroUsize;
/// use jem_bench::harness::{sweep, Examples, Runner, Subject, SweepSpec};
///
/// let subject = Subject::new("my-net", network, "mnist")?;
/// let n = NonZeroUsize::new(50).expect("50 is not 0");
/// let spec = SweepSpec { examples: Examples::first(n), ..SweepSpec::default() };
/// // robust.csv, curves and summary in runs/my-net
/// let rows = sweep(vec![subject], &spec, &Runner::new("runs/my-net"))?;
/// # Ok(()) }
/// ```
pub struct Subject<B: BenchBackend, N> {
    name: String,
    /// Where the network's parameters live, and so where its cells compute.
    device: B::Device,
    /// Cloned per cell: burn modules are `Send` but not `Sync`.
    network: Mutex<N>,
    digest: String,
    test: ImageSet,
    data_name: String,
    sgld: Option<SgldConfig>,
    /// A checkpoint's architecture, with its input normalisation (which its weights do not
    /// hold): a Wide-ResNet's configuration, or an ONNX checkpoint's sidecar (with its graph's
    /// digest); `None` for a network given as is.
    architecture: Option<serde_json::Value>,
}

impl<B: BenchBackend, N: Classifier<B> + Module<B>> Subject<B, N> {
    /// `network` classifies the images of `data` (a data set as the command line names it:
    /// `mnist`, `fashion-mnist`, `cifar10:DIR`, …; N×C×H×W pixels in [0, 1] to one logit per
    /// class), which is checked here on one test image. Its SGLD defence (K > 0) runs with the
    /// JEM paper's settings (α = 1, σ = 0.01 on a [−1, 1] input scale, no clamp) unless
    /// [`Subject::with_sgld`] says otherwise. Its cells compute on the device its parameters
    /// are on (the backend's default device for a network without parameters).
    pub fn new(name: impl Into<String>, network: N, data: &str) -> anyhow::Result<Self> {
        let name = name.into();
        let device = network.devices().into_iter().next().unwrap_or_default();
        let test = jem_datasets::DataSource::parse(data)
            .and_then(|s| s.load(jem_datasets::Split::Test))
            .with_context(|| format!("{name}: data set `{data}`"))?;
        anyhow::ensure!(
            !test.is_empty(),
            "{name}: the test set {} holds no images",
            test.name
        );
        let classes = test.num_classes();
        let outputs = outputs_on_one_image(&network, &test, &device)
            .with_context(|| format!("{name} cannot classify an image of {}", test.name))?;
        anyhow::ensure!(
            outputs == classes,
            "{name} gives {outputs} logits per image; {} has {classes} classes",
            test.name
        );
        let digest = weights_digest::<B, N>(&network)?;
        let sgld = JemConfig::default()
            .sampler(&crate::model::InputNormalization::symmetric(test.channels))
            .config;
        Ok(Self {
            name,
            device,
            network: Mutex::new(network),
            digest,
            architecture: None,
            data_name: data.to_string(),
            test,
            sgld: Some(sgld),
        })
    }

    /// The SGLD settings of the defence (`steps` is set per cell to its K).
    pub fn with_sgld(mut self, sgld: SgldConfig) -> Self {
        self.sgld = Some(sgld);
        self
    }
}

impl<B: BenchBackend, N: Module<B>> Subject<B, N> {
    /// The name in every output row.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `sha256:…` of the weights: a sweep resumes or compares only the same weights.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The device the subject's cells compute on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The test images attacked (the first `--n-examples` of them).
    pub fn test_set(&self) -> &ImageSet {
        &self.test
    }

    /// How the data set is named in output rows.
    pub fn data_name(&self) -> &str {
        &self.data_name
    }

    /// The SGLD settings of the defence, `None` when the model has none (K > 0 is refused).
    pub fn sgld(&self) -> Option<&SgldConfig> {
        self.sgld.as_ref()
    }

    /// What besides its weights decides the subject's outputs — a checkpoint's architecture with
    /// its input normalisation, the defence's SGLD settings, the data — as a sweep records it.
    pub fn configuration(&self) -> serde_json::Value {
        serde_json::json!({
            "architecture": &self.architecture,
            "sgld": &self.sgld,
            "data": &self.data_name,
        })
    }

    /// A copy of the network for one cell.
    pub fn network(&self) -> N {
        self.network
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl<B: BenchBackend> Subject<B, LoadedNetwork<B>> {
    /// A checkpoint (or an embedded model's name under `results/models/`) on its own data set
    /// or on `data` (`mnist`, `cifar10:DIR`, …), checked against each other: a jem-bench
    /// Wide-ResNet, whose defence uses its own JEM training settings (the paper's for other
    /// models), or a classifier imported from ONNX (`NAME.onnx`), whose defence uses the
    /// paper's settings on its input normalisation's scale. The network is loaded onto
    /// `device`.
    pub fn from_checkpoint(
        path: &str,
        data: Option<&str>,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        if let Some(onnx) = OnnxCheckpoint::find(path) {
            return Self::from_onnx(path, &onnx, data, device);
        }
        let ckpt = Checkpoint::at(path);
        ckpt.ensure_exists()?;
        let (network, sidecar) = ckpt.load::<B>(device)?;
        let (spec, test) = crate::test_set::test_split(path, &sidecar, "data", data)?;
        let sgld = crate::defended::sgld_of(&sidecar)?;
        Ok(Self {
            name: path.to_string(),
            // Of the network itself, as sweeps before ONNX models recorded it.
            digest: weights_digest::<B, _>(&network)?,
            device: device.clone(),
            architecture: Some(serde_json::to_value(&sidecar.architecture)?),
            network: Mutex::new(LoadedNetwork::Wrn(network)),
            data_name: spec,
            test,
            sgld: Some(sgld),
        })
    }

    fn from_onnx(
        path: &str,
        onnx: &OnnxCheckpoint,
        data: Option<&str>,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        let (network, sidecar) = onnx.load::<B>(device)?;
        let digest = weights_digest::<B, _>(&network)?;
        let data = data.unwrap_or(&sidecar.data).to_string();
        let channels = sidecar.input_shape[0];
        let scale = match (&sidecar.mean, &sidecar.std) {
            (Some(mean), Some(std)) => crate::model::InputNormalization {
                mean: mean.clone(),
                std: std.clone(),
            },
            // A graph on [0, 1] pixels: the paper's settings, taken on that scale.
            _ => crate::model::InputNormalization {
                mean: vec![0.0; channels],
                std: vec![1.0; channels],
            },
        };
        let sgld = JemConfig::default().sampler(&scale).config;
        let subject = Subject::new(path, LoadedNetwork::Onnx(network), &data)
            .map_err(|e| crate::settings::refusal("data", &data, e))?;
        Ok(Self {
            digest,
            device: device.clone(),
            architecture: Some(serde_json::to_value(&sidecar)?),
            ..subject
        }
        .with_sgld(sgld))
    }
}

/// The number of logits `network` gives for the first image of `test`; an error (not a panic)
/// when the network cannot take the image's shape.
fn outputs_on_one_image<B: BenchBackend, N: Classifier<B>>(
    network: &N,
    test: &ImageSet,
    device: &B::Device,
) -> anyhow::Result<usize> {
    let x = Tensor::<B, 4>::from_data(
        TensorData::new(
            test.image(0).to_vec(),
            [1, test.channels, test.height, test.width],
        ),
        device,
    );
    let dims = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        network.logits(x.clone()).dims()
    }))
    .map_err(|panic| {
        let what = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        anyhow::anyhow!(
            "a forward pass on a {}×{}×{} image failed: {what}",
            test.channels,
            test.height,
            test.width
        )
    })?;
    anyhow::ensure!(dims[0] == 1, "one image gave {} rows of logits", dims[0]);
    Ok(dims[1])
}
