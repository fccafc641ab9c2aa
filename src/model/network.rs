//! What a model path on the command line loads: jem-bench's own Wide-ResNet checkpoint
//! (`NAME.safetensors` + `NAME.json`, or an embedded model) or a classifier imported from ONNX
//! (`NAME.onnx` + `NAME.json`). One type, so that a sweep mixes them.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use jem_attacks::{Classifier, Linearised, PixelStep};
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

    /// Exact wherever the network is piecewise linear: the Wide-ResNet's linearisation, or an
    /// ONNX graph's where every operation in it is piecewise linear (ReLU, max-pooling,
    /// BatchNorm, …); `None` for a graph with smooth operations.
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, Linearised<'_, B>)> {
        match self {
            LoadedNetwork::Wrn(n) => n.linearise(x),
            LoadedNetwork::Onnx(n) => Classifier::linearise(n, x),
        }
    }

    /// An ONNX graph's forward mode, through every supported operator (so the SGLD defence's
    /// Hessian-vector products are exact for smooth graphs too); the Wide-ResNet has none (it
    /// linearises itself).
    fn jacobian_vector_product(
        &self,
        x: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Option<(Tensor<B, 2>, Tensor<B, 2>)> {
        match self {
            LoadedNetwork::Wrn(_) => None,
            LoadedNetwork::Onnx(n) => Classifier::jacobian_vector_product(n, x, v),
        }
    }

    /// jem-kernels' one-pass update ([`jem_kernels::FastSgld`]).
    fn sgld_update(
        &self,
        x: Tensor<B, 4>,
        g: Tensor<B, 4>,
        eps: Tensor<B, 4>,
        step: &PixelStep,
    ) -> Option<Tensor<B, 4>> {
        let (drift, noise) = (&step.drift, &step.noise);
        Some(jem_kernels::sgld_update(
            x, g, eps, drift, noise, step.clamp,
        ))
    }
}
