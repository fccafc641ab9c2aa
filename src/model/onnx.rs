//! A classifier imported from ONNX (any PyTorch network: `torch.onnx.export`): `NAME.onnx`, the
//! graph as exported, beside `NAME.json`, jem-bench's sidecar — the data set it classifies, its
//! classes and input shape, the per-channel normalisation applied to [0, 1] pixels before the
//! graph, the file it was imported from and the digest of the graph's bytes (a graph edited
//! after import is refused). The graph runs on burn tensors through `jem-onnx`, so attacks
//! differentiate through it like through the native Wide-ResNet.

use std::path::{Path, PathBuf};

use anyhow::Context;
use jem_onnx::{Normalisation, OnnxModel, OnnxNetwork};
use serde::{Deserialize, Serialize};

use super::checkpoint::{write_atomic, SOFTWARE};

/// The `format` an ONNX checkpoint's sidecar names.
const FORMAT: &str = "onnx";

/// An ONNX checkpoint's sidecar (`NAME.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxSidecar {
    /// Always `onnx`: what tells this sidecar from a Wide-ResNet checkpoint's.
    pub format: String,
    /// The jem-bench that imported it.
    pub software: String,
    /// The data set it classifies, as the command line names it (`mnist`, `cifar10:DIR`, …).
    pub data: String,
    pub classes: usize,
    /// `[C, H, W]` of one input.
    pub input_shape: [usize; 3],
    /// Per-channel `(x − mean) / std` applied to [0, 1] pixels before the graph (absent: the
    /// graph takes [0, 1] pixels as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub std: Option<Vec<f32>>,
    /// The ONNX opset the graph was exported with.
    pub opset: i64,
    /// The file it was imported from.
    pub source: String,
    /// `sha256:<hex>` of `NAME.onnx`'s bytes.
    pub graph: String,
}

/// The two files of an ONNX checkpoint named `NAME` (or `NAME.onnx`, `NAME.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxCheckpoint {
    pub graph: PathBuf,
    pub sidecar: PathBuf,
}

impl OnnxCheckpoint {
    /// The ONNX checkpoint at `path`, if `NAME.onnx` is there.
    pub fn find(path: impl AsRef<Path>) -> Option<Self> {
        let path = path.as_ref();
        let stem = match path.extension().and_then(|e| e.to_str()) {
            Some("onnx") | Some("json") => path.with_extension(""),
            _ => path.to_path_buf(),
        };
        let with = |ext: &str| {
            let mut s = stem.clone().into_os_string();
            s.push(format!(".{ext}"));
            PathBuf::from(s)
        };
        let graph = with("onnx");
        graph.exists().then(|| OnnxCheckpoint {
            graph,
            sidecar: with("json"),
        })
    }

    /// The sidecar, checked: an ONNX sidecar of this graph's bytes.
    pub fn read_sidecar(&self) -> anyhow::Result<OnnxSidecar> {
        let text = std::fs::read_to_string(&self.sidecar).with_context(|| {
            format!(
                "no sidecar at {} for the ONNX graph {} (make both with `jem-bench import \
                 MODEL.onnx --data … --out NAME`)",
                self.sidecar.display(),
                self.graph.display()
            )
        })?;
        let sidecar: OnnxSidecar = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not the sidecar of an ONNX checkpoint",
                self.sidecar.display()
            )
        })?;
        anyhow::ensure!(
            sidecar.format == FORMAT,
            "{}: format `{}`, expected `{FORMAT}`",
            self.sidecar.display(),
            sidecar.format
        );
        let bytes = std::fs::read(&self.graph)
            .with_context(|| format!("cannot read {}", self.graph.display()))?;
        let digest = crate::digest::of(&bytes);
        anyhow::ensure!(
            digest == sidecar.graph,
            "{} is not the graph {} was written for (its digest is {digest}, the sidecar's \
             graph {}): import it again",
            self.graph.display(),
            self.sidecar.display(),
            sidecar.graph
        );
        Ok(sidecar)
    }

    /// The network on `device`, with its sidecar's normalisation.
    pub fn load<B: jem_kernels::Kernels>(
        &self,
        device: &B::Device,
    ) -> anyhow::Result<(OnnxNetwork<B>, OnnxSidecar)> {
        let sidecar = self.read_sidecar()?;
        let network = OnnxNetwork::<B>::load(&self.graph, device)?
            .with_normalisation(normalisation(&sidecar.mean, &sidecar.std)?)?;
        anyhow::ensure!(
            network.graph().input_shape() == sidecar.input_shape
                && network.graph().classes() == sidecar.classes,
            "{}: the graph takes {:?} and gives {} logits, its sidecar says {:?} and {}",
            self.graph.display(),
            network.graph().input_shape(),
            network.graph().classes(),
            sidecar.input_shape,
            sidecar.classes
        );
        Ok((network, sidecar))
    }
}

/// The normalisation of `--mean` and `--std`: both or neither.
fn normalisation(
    mean: &Option<Vec<f32>>,
    std: &Option<Vec<f32>>,
) -> anyhow::Result<Option<Normalisation>> {
    match (mean, std) {
        (None, None) => Ok(None),
        (Some(mean), Some(std)) => Ok(Some(Normalisation {
            mean: mean.clone(),
            std: std.clone(),
        })),
        _ => anyhow::bail!("--mean and --std go together: give both or neither"),
    }
}

/// `jem-bench import MODEL.onnx`: checks the graph (every operator supported, a fixed input
/// shape but for the batch), that it classifies the images of `data` into its classes, and the
/// normalisation; then writes `OUT.onnx` (the graph's bytes) and `OUT.json` (the sidecar).
/// Nothing is written when anything is refused.
pub fn import_onnx(
    source: &Path,
    data: &str,
    mean: Option<Vec<f32>>,
    std: Option<Vec<f32>>,
    out: &Path,
) -> anyhow::Result<OnnxSidecar> {
    let bytes =
        std::fs::read(source).with_context(|| format!("cannot read {}", source.display()))?;
    let graph = OnnxModel::load(source)?;
    let set = jem_datasets::DataSource::parse(data)
        .and_then(|s| s.load(jem_datasets::Split::Test))
        .map_err(|e| crate::settings::refusal("data", data, e.into()))?;
    let image = [set.channels, set.height, set.width];
    anyhow::ensure!(
        graph.input_shape() == image,
        "{} takes {:?} inputs; the images of {data} are {image:?}",
        source.display(),
        graph.input_shape()
    );
    anyhow::ensure!(
        graph.classes() == set.num_classes(),
        "{} gives {} logits; {data} has {} classes",
        source.display(),
        graph.classes(),
        set.num_classes()
    );
    let opset = graph.opset();
    let norm = normalisation(&mean, &std)?;
    // The normalisation's own checks (one value per channel, std > 0), before anything is written.
    OnnxNetwork::<burn::backend::Flex>::new(graph, &Default::default())
        .with_normalisation(norm)
        .with_context(|| format!("--mean / --std for {}", source.display()))?;
    let sidecar = OnnxSidecar {
        format: FORMAT.into(),
        software: SOFTWARE.into(),
        data: data.into(),
        classes: set.num_classes(),
        input_shape: image,
        mean,
        std,
        opset,
        source: source.display().to_string(),
        graph: crate::digest::of(&bytes),
    };
    let with = |ext: &str| {
        let mut s = out.as_os_str().to_owned();
        s.push(ext);
        PathBuf::from(s)
    };
    let target = OnnxCheckpoint {
        graph: with(".onnx"),
        sidecar: with(".json"),
    };
    write_atomic(&target.graph, &bytes)?;
    write_atomic(
        &target.sidecar,
        serde_json::to_string_pretty(&sidecar)?.as_bytes(),
    )?;
    Ok(sidecar)
}
