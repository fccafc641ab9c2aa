//! The classifier f_θ: a Wide-ResNet as in the official JEM code, its checkpoints, the
//! import of PyTorch weights, and its function-preserving widening.

mod checkpoint;
mod import;
mod loaded;
mod network;
mod onnx;
mod precision;
mod widen;
mod wrn;
mod wrn_flops;

pub(crate) use checkpoint::temporary_path;
pub use checkpoint::{
    embedded_models, weights_digest, write_atomic, Checkpoint, Sidecar, TrainingRecord,
    FORMAT_VERSION, SOFTWARE,
};
pub use import::{import_pytorch, stored_normalization, PytorchNaming};
pub use loaded::{ModelInfo, ModelSidecar};
pub use network::LoadedNetwork;
pub use onnx::{import_onnx, OnnxCheckpoint, OnnxSidecar};
pub use precision::{to_f32, Precision};
pub use widen::{widen, widening_factor};
pub use wrn::{InputNormalization, WideBasic, WideResNet, WideResNetConfig, WrnVariant};
pub use wrn_flops::ConvShape;
