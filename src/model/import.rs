//! Importing weights trained in PyTorch: a `state_dict` saved as safetensors or as a `.pt` file
//! (`torch.save`), in the naming of the official JEM code or of RobustBench's WRN (which also
//! selects that architecture, [`WrnVariant::RobustBench`]), with the input normalisation the
//! network expects (from `--mean/--std`, or from `mu`/`sigma` buffers stored in the file, as
//! RobustBench's wrappers keep them).
//!
//! burn-store's `PyTorchToBurnAdapter` transposes linear weights; the key remapping below turns
//! the naming of a checkpoint into the field names of [`WideResNet`].

use crate::Choice;
use std::path::Path;

use anyhow::bail;
use burn::tensor::backend::Backend;
use burn_store::{
    ApplyResult, KeyRemapper, ModuleSnapshot, PyTorchToBurnAdapter, PytorchStore, SafetensorsStore,
};

use super::{InputNormalization, WideResNet, WideResNetConfig, WrnVariant};

/// Names of input-normalisation buffers in a state_dict: (mean, std).
const NORMALIZATION_BUFFERS: [(&str, &str); 2] = [("mu", "sigma"), ("mean", "std")];

/// How the tensors of a PyTorch checkpoint are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PytorchNaming {
    /// `Wide_ResNet.state_dict()` of the official JEM `wideresnet.py`: `conv1.weight`,
    /// `layer1.0.conv1.weight`, `layer2.0.shortcut.0.weight`, `linear.weight`, …
    WideResnet,
    /// The JEM wrapper `F` of `train_wrn_ebm.py`: the network under `f.`, the classifier head
    /// `class_output` (the unused `f.linear` and `energy_output` heads are ignored).
    Jem,
    /// RobustBench's `WideResNet` (`robustbench/model_zoo/architectures/wide_resnet.py`, also
    /// TRADES' and MART's): `block1.layer.0.bn1`, `convShortcut`, final `bn1`, head `fc`; a
    /// `module.` prefix (DataParallel) is dropped. Implies [`WrnVariant::RobustBench`].
    Robustbench,
}

impl Choice for PytorchNaming {
    const WHAT: &'static str = "naming";

    const ALL: &'static [Self] = &[
        PytorchNaming::WideResnet,
        PytorchNaming::Jem,
        PytorchNaming::Robustbench,
    ];

    /// The naming's name on the command line: `wide-resnet`, `jem`, `robustbench`.
    fn name(self) -> &'static str {
        match self {
            PytorchNaming::WideResnet => "wide-resnet",
            PytorchNaming::Jem => "jem",
            PytorchNaming::Robustbench => "robustbench",
        }
    }

    /// Whose checkpoints are named this way (the command line's help).
    fn description(self) -> &'static str {
        match self {
            PytorchNaming::WideResnet => {
                "Wide_ResNet.state_dict() of the official JEM wideresnet.py: conv1.weight, \
                 layer1.0.conv1.weight, layer2.0.shortcut.0.weight, linear.weight, …"
            }
            PytorchNaming::Jem => {
                "The JEM wrapper F of train_wrn_ebm.py: the network under f., the classifier \
                 head class_output (the unused f.linear and energy_output heads are ignored)"
            }
            PytorchNaming::Robustbench => {
                "RobustBench's WideResNet (also TRADES' and MART's): block1.layer.0.bn1, \
                 convShortcut, final bn1, head fc; a module. prefix (DataParallel) is dropped"
            }
        }
    }
}

impl PytorchNaming {
    /// The architecture a checkpoint in this naming has.
    pub fn variant(self) -> WrnVariant {
        match self {
            PytorchNaming::WideResnet | PytorchNaming::Jem => WrnVariant::Jem,
            PytorchNaming::Robustbench => WrnVariant::RobustBench,
        }
    }

    fn remapper(self) -> KeyRemapper {
        // Normalisation buffers are read by `stored_normalization`, not loaded as weights.
        let mut patterns: Vec<(&str, &str)> = vec![(r"^(mu|sigma|mean|std)$", "ignored.$1")];
        patterns.extend(match self {
            PytorchNaming::WideResnet => vec![],
            PytorchNaming::Jem => vec![
                // Applied in order: park the heads JEM does not classify with, then unwrap `f.`.
                (r"^f\.linear\.", "ignored.f_linear."),
                (r"^energy_output\.", "ignored.energy_output."),
                (r"^f\.", ""),
                (r"^class_output\.", "linear."),
            ],
            PytorchNaming::Robustbench => vec![
                (r"^module\.", ""),
                // Carmon et al.'s and TRADES' checkpoints keep an unused `sub_block1`.
                (r"^sub_block1\.", "ignored.sub_block1."),
                (
                    r"^(.*)num_batches_tracked$",
                    "ignored.${1}num_batches_tracked",
                ),
                (r"^block(\d)\.layer\.", "layer$1."),
                (r"\.convShortcut\.", ".shortcut.0."),
                (r"^fc\.", "linear."),
                // burn's BatchNorm calls PyTorch's weight and bias gamma and beta.
                (r"^(.*\bbn\d)\.weight$", "$1.gamma"),
                (r"^(.*\bbn\d)\.bias$", "$1.beta"),
            ],
        });
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
                .remap(naming.remapper())
                .validate(false);
            model
                .load_from(&mut store)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        "pt" | "pth" | "bin" => {
            let mut store = PytorchStore::from_file(path)
                .remap(naming.remapper())
                .validate(false);
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
    // A tensor the file lacks would keep its random initialisation: refuse that too.
    let missing: Vec<_> = result.missing.iter().map(|(path, _)| path).collect();
    if !result.errors.is_empty() || !unexpected.is_empty() || !missing.is_empty() {
        bail!(
            "{}: does not fit {} with {} naming: errors [{}], unexpected tensors [{}], \
             missing tensors [{}] (check --depth/--width/--naming)",
            path.display(),
            config.name(),
            naming.name(),
            result
                .errors
                .iter()
                .map(describe)
                .collect::<Vec<_>>()
                .join("; "),
            unexpected
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", "),
            missing
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(model)
}

/// The input normalisation a safetensors checkpoint stores as top-level buffers (`mu`/`sigma`
/// or `mean`/`std`, one value per channel, any broadcastable shape such as `[1, C, 1, 1]`), or
/// `None` when it stores none (and for `.pt` files, which need `--mean/--std`).
pub fn stored_normalization(path: &Path) -> anyhow::Result<Option<InputNormalization>> {
    if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
        return Ok(None);
    }
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a safetensors file: {e}", path.display()))?;
    let values = |name: &str| -> anyhow::Result<Option<Vec<f32>>> {
        let Ok(view) = file.tensor(name) else {
            return Ok(None);
        };
        let data = view.data();
        let out = match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            safetensors::Dtype::F64 => data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
                .collect(),
            other => bail!(
                "{}: tensor `{name}` is {other:?}; expected a float32 or float64 normalisation buffer",
                path.display()
            ),
        };
        Ok(Some(out))
    };
    for (mean_name, std_name) in NORMALIZATION_BUFFERS {
        match (values(mean_name)?, values(std_name)?) {
            (Some(mean), Some(std)) => {
                anyhow::ensure!(
                    mean.len() == std.len() && std.iter().all(|s| *s > 0.0),
                    "{}: normalisation buffers `{mean_name}` ({} values) and `{std_name}` ({} values) \
                     must have one value per channel, and the std must be positive",
                    path.display(),
                    mean.len(),
                    std.len()
                );
                return Ok(Some(InputNormalization { mean, std }));
            }
            (None, None) => {}
            _ => bail!(
                "{}: holds only one of the normalisation buffers `{mean_name}` and `{std_name}`",
                path.display()
            ),
        }
    }
    Ok(None)
}

/// One tensor that did not fit, in the file's terms. burn keeps a linear layer's weight as
/// `[in, out]`, PyTorch (and so the file) as `[out, in]`: a 2-D shape is reported as the file
/// has it and as the file should have it, not in burn's transposed layout.
fn describe(error: &burn_store::ApplyError) -> String {
    match error {
        burn_store::ApplyError::ShapeMismatch {
            path,
            expected,
            found,
        } if expected.num_dims() == 2 && found.num_dims() == 2 => {
            let pytorch = |dims: &[usize]| dims.iter().rev().copied().collect::<Vec<_>>();
            format!(
                "tensor `{path}` is {:?} in the file; the architecture needs {:?} (PyTorch's \
                 [out, in] layout)",
                pytorch(found.as_slice()),
                pytorch(expected.as_slice())
            )
        }
        other => other.to_string(),
    }
}
