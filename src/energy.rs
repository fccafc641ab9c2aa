//! JEM's reading of the logits: `E(x) = −LogSumExp_y f(x)[y]`, and the input gradient that drives
//! SGLD and the attacks.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
pub use jem_attacks::log_sum_exp;
use jem_attacks::Classifier;

/// d(Σ_i LogSumExp f(x_i)) / dx for a batch, on the inference backend, of any classifier (a
/// Wide-ResNet, a graph imported from ONNX, …). Pass a model whose parameters do not require
/// gradients (`no_grad`), so that only the input is tracked.
pub fn lse_input_gradient<B: AutodiffBackend>(
    model: &impl Classifier<B>,
    x: Tensor<B::InnerBackend, 4>,
) -> Tensor<B::InnerBackend, 4> {
    jem_attacks::input_gradient::<B, _>(model, x, log_sum_exp).0
}
