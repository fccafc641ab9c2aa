//! Importing weights trained in PyTorch: a `state_dict` saved as safetensors or as a `.pt` file
//! (`torch.save`), in the naming of the official JEM code.
//!
//! burn-store's `PyTorchToBurnAdapter` transposes linear weights; the key remapping below turns
//! the naming of a checkpoint into the field names of [`WideResNet`].

use std::path::Path;

use anyhow::bail;
use burn::tensor::backend::Backend;
use burn_store::{
    ApplyResult, KeyRemapper, ModuleSnapshot, PyTorchToBurnAdapter, PytorchStore, SafetensorsStore,
};

use super::{WideResNet, WideResNetConfig};

/// How the tensors of a PyTorch checkpoint are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PytorchNaming {
    /// `Wide_ResNet.state_dict()` of the official JEM `wideresnet.py`: `conv1.weight`,
    /// `layer1.0.conv1.weight`, `layer2.0.shortcut.0.weight`, `linear.weight`, …
    WideResnet,
    /// The JEM wrapper `F` of `train_wrn_ebm.py`: the network under `f.`, the classifier head
    /// `class_output` (the unused `f.linear` and `energy_output` heads are ignored).
    Jem,
}

impl PytorchNaming {
    fn remapper(self) -> KeyRemapper {
        let patterns: Vec<(&str, &str)> = match self {
            PytorchNaming::WideResnet => vec![],
            PytorchNaming::Jem => vec![
                // Applied in order: park the heads JEM does not classify with, then unwrap `f.`.
                (r"^f\.linear\.", "ignored.f_linear."),
                (r"^energy_output\.", "ignored.energy_output."),
                (r"^f\.", ""),
                (r"^class_output\.", "linear."),
            ],
        };
        KeyRemapper::from_patterns(patterns).expect("static patterns are valid regexes")
    }
}

/// Loads a PyTorch checkpoint (`.safetensors`, or `.pt` / `.pth` written by `torch.save`) into a
/// fresh model of architecture `config`. `.pt` files may hold the state_dict under a top-level
/// key (`model_state_dict` in JEM's checkpoints): pass it as `top_level_key`.
pub fn import_pytorch<B: Backend>(
    path: &Path,
    config: &WideResNetConfig,
    naming: PytorchNaming,
    top_level_key: Option<&str>,
    device: &B::Device,
) -> anyhow::Result<WideResNet<B>> {
    if !path.exists() {
        bail!("PyTorch checkpoint {} does not exist", path.display());
    }
    let mut model = config.init::<B>(device)?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let result: ApplyResult = match ext {
        "safetensors" => {
            let mut store = SafetensorsStore::from_file(path)
                .with_from_adapter(PyTorchToBurnAdapter)
                .remap(naming.remapper());
            model
                .load_from(&mut store)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        "pt" | "pth" | "bin" => {
            let mut store = PytorchStore::from_file(path).remap(naming.remapper());
            if let Some(key) = top_level_key {
                store = store.with_top_level_key(key);
            }
            model
                .load_from(&mut store)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        other => bail!(
            "{}: unknown checkpoint extension `.{other}`; expected .safetensors, .pt or .pth",
            path.display()
        ),
    };
    let unexpected: Vec<_> = result
        .unused
        .iter()
        .filter(|k| !k.starts_with("ignored."))
        .collect();
    if !result.errors.is_empty() || !unexpected.is_empty() {
        bail!(
            "{}: does not fit {} with {:?} naming: errors {:?}, unexpected tensors {:?} \
             (check --depth/--width/--naming)",
            path.display(),
            config.name(),
            naming,
            result
                .errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>(),
            unexpected
        );
    }
    Ok(model)
}
