//! A model path as the commands that evaluate a model take it (`eval`, `calibrate`, `ood`,
//! `nonsense`, `sample`, `bench`): a jem-bench Wide-ResNet checkpoint (`NAME.safetensors` +
//! `NAME.json`, or an embedded model) or a classifier imported from ONNX (`NAME.onnx` +
//! `NAME.json`), loaded as one [`LoadedNetwork`] beside a [`ModelInfo`] that answers, for
//! either kind, what those commands ask of a model's sidecar: its data set, image shape and
//! classes, its input normalisation, and the SGLD settings its defence and its sampler run with.
//! The commands themselves are generic over the classifier; only this file tells the two kinds
//! apart.

use std::path::{Path, PathBuf};

use jem_attacks::SgldConfig;
use jem_datasets::ImageSet;

use super::{Checkpoint, InputNormalization, LoadedNetwork, OnnxCheckpoint, OnnxSidecar, Sidecar};
use crate::settings::InvalidSetting;
use crate::train::JemConfig;

/// What a model's sidecar says, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSidecar {
    /// A jem-bench Wide-ResNet: its architecture, training record and metrics.
    Wrn(Sidecar),
    /// A graph imported from ONNX: its data set, input shape, classes and normalisation.
    Onnx(OnnxSidecar),
}

/// A loaded model's description: where its files are and what its sidecar says.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The file that holds the network (`NAME.safetensors` or `NAME.onnx`), as outputs name it.
    pub file: PathBuf,
    pub sidecar: ModelSidecar,
}

impl ModelInfo {
    /// The model at `path` (`NAME`, or a file of it: `NAME.safetensors`, `NAME.onnx`,
    /// `NAME.json`; or an embedded model's `results/models/NAME`), checked and loaded onto
    /// `device`: an ONNX checkpoint where `NAME.onnx` exists, a Wide-ResNet checkpoint otherwise.
    pub fn load<B: jem_kernels::Kernels>(
        path: &Path,
        device: &B::Device,
    ) -> anyhow::Result<(LoadedNetwork<B>, Self)> {
        if let Some(onnx) = OnnxCheckpoint::find(path) {
            let (network, sidecar) = onnx.load::<B>(device)?;
            let info = ModelInfo {
                file: onnx.graph,
                sidecar: ModelSidecar::Onnx(sidecar),
            };
            return Ok((LoadedNetwork::Onnx(network), info));
        }
        let ckpt = Checkpoint::at(path);
        ckpt.ensure_exists()?;
        let (network, sidecar) = ckpt.load::<B>(device)?;
        let info = ModelInfo {
            file: ckpt.weights,
            sidecar: ModelSidecar::Wrn(sidecar),
        };
        Ok((LoadedNetwork::Wrn(network), info))
    }

    /// [`ModelInfo::load`] of the value of the settings field `field` (`models`, `model`, …): a
    /// failure is a refusal of that field, so that the command line names its flag.
    pub fn load_setting<B: jem_kernels::Kernels>(
        path: &Path,
        field: &'static str,
        device: &B::Device,
    ) -> Result<(LoadedNetwork<B>, Self), InvalidSetting> {
        Self::load::<B>(path, device)
            .map_err(|e| crate::settings::refusal(field, path.display(), e))
    }

    /// Whether the model is a graph imported from ONNX.
    pub fn is_onnx(&self) -> bool {
        matches!(self.sidecar, ModelSidecar::Onnx(_))
    }

    /// The data set the model classifies, as `--data` names it (`mnist`, `cifar10:DIR`, …): the
    /// default data of every command on it.
    pub fn data(&self) -> &str {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => &s.training.data,
            ModelSidecar::Onnx(s) => &s.data,
        }
    }

    /// Where the sidecar records [`data`](Self::data), for messages.
    pub fn data_field(&self) -> &'static str {
        match &self.sidecar {
            ModelSidecar::Wrn(_) => "training.data",
            ModelSidecar::Onnx(_) => "data",
        }
    }

    /// `[C, H, W]` of the images the model takes.
    pub fn image_shape(&self) -> anyhow::Result<[usize; 3]> {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => s.image_shape(),
            ModelSidecar::Onnx(s) => Ok(s.input_shape),
        }
    }

    /// The number of classes (logits per image).
    pub fn classes(&self) -> usize {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => s.architecture.num_classes,
            ModelSidecar::Onnx(s) => s.classes,
        }
    }

    /// Refuses a data set whose images or classes the model cannot take (a 3-channel model on
    /// 1-channel data would broadcast and report a meaningless accuracy); `model` names it.
    pub fn check_data(&self, model: &str, data: &ImageSet) -> anyhow::Result<()> {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => s.check_data(model, data),
            ModelSidecar::Onnx(s) => {
                let [c, h, w] = s.input_shape;
                anyhow::ensure!(
                    [data.channels, data.height, data.width] == s.input_shape
                        && data.num_classes() == s.classes,
                    "model {model} takes {c} channel(s) of {h}×{w} pixels and has {} classes; \
                     data set {} has {} channel(s) of {}×{} pixels and {} classes: name the data \
                     set the model was imported for ({})",
                    s.classes,
                    data.name,
                    data.channels,
                    data.height,
                    data.width,
                    data.num_classes(),
                    s.data
                );
                Ok(())
            }
        }
    }

    /// The per-channel `(x − mean) / std` the network applies to [0, 1] pixels: a Wide-ResNet's
    /// own, an ONNX graph's `--mean`/`--std` of import (none: mean 0, std 1). SGLD steps are
    /// stated on this scale.
    pub fn input_normalization(&self) -> InputNormalization {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => s.architecture.input_normalization.clone(),
            ModelSidecar::Onnx(s) => match (&s.mean, &s.std) {
                (Some(mean), Some(std)) => InputNormalization {
                    mean: mean.clone(),
                    std: std.clone(),
                },
                _ => InputNormalization {
                    mean: vec![0.0; s.input_shape[0]],
                    std: vec![1.0; s.input_shape[0]],
                },
            },
        }
    }

    /// The JEM settings the model's sampler runs with: a Wide-ResNet's own training settings (a
    /// JEM's; the paper's defaults for models trained otherwise), the paper's defaults for an
    /// ONNX graph, which carries no training record.
    pub fn jem(&self) -> anyhow::Result<JemConfig> {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => JemConfig::of(s),
            ModelSidecar::Onnx(_) => Ok(JemConfig::default()),
        }
    }

    /// The SGLD settings of the model's test-time defence (K > 0; `steps` is set per K): its
    /// [`jem`](Self::jem) settings on its [input normalisation](Self::input_normalization)'s
    /// scale — what `robust` runs an ONNX model's defence with too.
    pub fn sgld(&self) -> anyhow::Result<SgldConfig> {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => crate::defended::sgld_of(s),
            ModelSidecar::Onnx(_) => Ok(self.jem()?.sampler(&self.input_normalization()).config),
        }
    }

    /// The model in a few words for a report: `WRN-10-1, 77 850 parameters, baseline`, or
    /// `ONNX graph (opset 17), 77 850 parameters, imported from FILE`; `parameters` is the
    /// loaded network's count.
    pub fn describe(&self, parameters: usize) -> String {
        match &self.sidecar {
            ModelSidecar::Wrn(s) => format!(
                "{}, {parameters} parameters, {}",
                s.architecture.name(),
                s.training.kind
            ),
            ModelSidecar::Onnx(s) => format!(
                "ONNX graph (opset {}), {parameters} parameters, imported from {}",
                s.opset, s.source
            ),
        }
    }
}
