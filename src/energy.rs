//! JEM's reading of the logits: E(x) = −LogSumExp_y f(x)[y], and the input gradients that drive
//! SGLD and the attacks.

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use crate::model::WideResNet;

/// Row-wise LogSumExp of `[N, K]` logits, computed stably (max subtracted first).
pub fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let max = logits.clone().max_dim(1).detach();
    let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
    lse.reshape([n])
}

/// d(Σ_i LogSumExp f(x_i)) / dx for a batch, on the inference backend. Only the input is
/// tracked, so no parameter gradient is built.
pub fn lse_input_gradient<B: AutodiffBackend>(
    model: &WideResNet<B>,
    x: Tensor<B::InnerBackend, 4>,
) -> Tensor<B::InnerBackend, 4>
where
    WideResNet<B>: AutodiffModule<B>,
{
    let x = Tensor::<B, 4>::from_inner(x).require_grad();
    let total = log_sum_exp(model.forward(x.clone())).sum();
    let grads = total.backward();
    x.grad(&grads)
        .expect("the input was marked as requiring a gradient")
}
