//! What a model path on the command line loads: jem-bench's own Wide-ResNet checkpoint
//! (`NAME.safetensors` + `NAME.json`, or an embedded model) or a classifier imported from ONNX
//! (`NAME.onnx` + `NAME.json`). One type, so that a sweep mixes them.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use jem_attacks::{Classifier, Linearised};
use jem_kernels::Kernels;
use jem_onnx::OnnxNetwork;

use super::WideResNet;

/// A loaded network: a Wide-ResNet or an ONNX graph.
#[derive(Module, Debug)]
pub enum LoadedNetwork<B: Backend> {
    Wrn(WideResNet<B>),
    Onnx(OnnxNetwork<B>),
}

impl<B: Kernels> Classifier<B> for LoadedNetwork<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        match self {
            LoadedNetwork::Wrn(n) => n.logits(x),
            LoadedNetwork::Onnx(n) => n.logits(x),
        }
    }

    /// The Wide-ResNet's exact linearisation; an ONNX graph gives none (the SGLD defence's
    /// Hessian-vector products then take central differences of its logits).
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, Linearised<'_, B>)> {
        match self {
            LoadedNetwork::Wrn(n) => n.linearise(x),
            LoadedNetwork::Onnx(_) => None,
        }
    }
}
