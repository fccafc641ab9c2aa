//! The one interface every attack and the SGLD sampler work through: a batch of images in,
//! logits out, on any burn backend; gradients with respect to the input come from autodiff.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

/// An image classifier: `N×C×H×W` pixels in [0, 1] to `N×K` logits.
pub trait Classifier<B: Backend> {
    /// Logits `[N, K]` of the pixels `x`, `[N, C, H, W]` in [0, 1].
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2>;
}

/// The gradient of `Σ_i score(logits)_i` with respect to the input, and the logits.
///
/// Only the input is tracked: pass a model whose parameters do not require gradients
/// (`Module::no_grad`), so that no parameter gradient is built (the SGLD hot loop).
pub fn input_gradient<B, M>(
    model: &M,
    x: Tensor<B::InnerBackend, 4>,
    score: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 1>,
) -> (Tensor<B::InnerBackend, 4>, Tensor<B::InnerBackend, 2>)
where
    B: AutodiffBackend,
    M: Classifier<B>,
{
    let x = Tensor::<B, 4>::from_inner(x).require_grad();
    let logits = model.logits(x.clone());
    let total = score(logits.clone()).sum();
    let grads = total.backward();
    let g = x
        .grad(&grads)
        .expect("the input was marked as requiring a gradient");
    (g, logits.inner())
}

/// Row-wise LogSumExp of `[N, K]` logits, computed stably (max subtracted first): JEM's
/// negative energy −E(x).
pub fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let max = logits.clone().max_dim(1).detach();
    let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
    lse.reshape([n])
}
