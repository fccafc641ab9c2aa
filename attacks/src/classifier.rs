//! The one interface every attack and the SGLD sampler work through: a batch of images in,
//! logits out, on any burn backend; gradients with respect to the input come from autodiff.
//! Two optional derivatives serve the SGLD defence's exact gradients through its steps: a
//! piecewise-linear network's linearisation ([`Classifier::linearise`]) and any network's
//! forward-mode Jacobian-vector product ([`Classifier::jacobian_vector_product`]). A network
//! whose backend has a fused kernel for an SGLD step's update offers it
//! ([`Classifier::sgld_update`]); the sampler composes the update itself otherwise.

use burn::tensor::activation::softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

/// An image classifier: `N×C×H×W` pixels in [0, 1] to `N×K` logits.
pub trait Classifier<B: Backend> {
    /// Logits `[N, K]` of the pixels `x`, `[N, C, H, W]` in [0, 1].
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2>;

    /// For a network that is piecewise linear in its input (ReLU / LeakyReLU, convolutions,
    /// pooling, affine normalisation): the logits at `x`, computed as [`logits`](Self::logits)
    /// does (gradients flow through them), together with the network linearised at `x`: the map
    /// v ↦ J(x) v, one forward pass with the biases dropped and every activation replaced by its
    /// slope at `x`. Exact, with no finite-difference step, so the SGLD defence's Hessian-vector
    /// products can use it ([`crate::HessianVector::PiecewiseLinear`]).
    ///
    /// `None`, the default, where the network does not provide it; the defence then forms J v by
    /// central differences of the logits.
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, Linearised<'_, B>)> {
        let _ = x;
        None
    }

    /// The logits f(x) and the Jacobian-vector product J(x) v (`[N, K]` each, v shaped like
    /// `x`), by forward mode: for any network, smooth or not. Both must be differentiable in
    /// `x` and `v` through the backend's autodiff — ordinary tensor operations on the tangent
    /// and the forward pass's values, nothing detached — because reverse mode over J(x) v is
    /// what gives second derivatives without nesting autodiff: the SGLD defence's exact
    /// Hessian-vector products ([`log_sum_exp_hessian_vector`]) for networks that do not
    /// [`linearise`](Self::linearise), where the piecewise-linear form Jᵀ(diag p − p pᵀ)J
    /// would drop the term Σ_k p_k ∇²f_k of a smooth activation (SiLU, GELU, Softplus, Tanh).
    ///
    /// `None`, the default, where the network does not provide it; the defence then falls back
    /// to finite differences ([`crate::HessianVector`]).
    fn jacobian_vector_product(
        &self,
        x: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Option<(Tensor<B, 2>, Tensor<B, 2>)> {
        let _ = (x, v);
        None
    }

    /// One SGLD step's update of the pixels, `x + g · drift[c] + eps · noise[c]` for every
    /// element of channel c, formed in that order and then clamped to [0, 1] if `step` says so,
    /// by a fused kernel of the network's backend (one pass, one launch on a GPU). The sampler
    /// asks the network because the network is what knows its backend's kernels. Not
    /// differentiated through: the result need not be tracked.
    ///
    /// `None`, the default: the sampler composes the update from burn's operations, with the
    /// same numbers.
    fn sgld_update(
        &self,
        x: Tensor<B, 4>,
        g: Tensor<B, 4>,
        eps: Tensor<B, 4>,
        step: &crate::PixelStep,
    ) -> Option<Tensor<B, 4>> {
        let _ = (x, g, eps, step);
        None
    }
}

/// A network's Jacobian at a point as a function, v ↦ J v (see [`Classifier::linearise`]).
/// Linear in v; gradients flow through it, so reverse mode on it gives Jᵀ u.
pub type Linearised<'a, B> = Box<dyn Fn(Tensor<B, 4>) -> Tensor<B, 2> + 'a>;

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

/// H(x) v, per example, for the Hessian H of LSE(f(x)) — JEM's negative energy — exactly,
/// by reverse mode over the classifier's forward-mode derivative
/// ([`Classifier::jacobian_vector_product`]): ∇ₓ LSE(f(x)) = J(x)ᵀ p(x), p = softmax(f(x)), so
/// H v = ∇ₓ[p(x) · J(x) v] with v held constant — one forward pass with tangents and one
/// backward pass through both, single-level autodiff. `None` where the classifier offers no
/// forward mode.
///
/// As with [`input_gradient`], pass a model whose parameters do not require gradients.
pub fn log_sum_exp_hessian_vector<B, M>(
    model: &M,
    x: Tensor<B::InnerBackend, 4>,
    v: Tensor<B::InnerBackend, 4>,
) -> Option<Tensor<B::InnerBackend, 4>>
where
    B: AutodiffBackend,
    M: Classifier<B>,
{
    let x = Tensor::<B, 4>::from_inner(x).require_grad();
    let (logits, jv) = model.jacobian_vector_product(x.clone(), Tensor::from_inner(v))?;
    let grads = (softmax(logits, 1) * jv).sum().backward();
    Some(
        x.grad(&grads)
            .expect("the input was marked as requiring a gradient"),
    )
}

/// Row-wise LogSumExp of `[N, K]` logits, computed stably (max subtracted first): JEM's
/// negative energy −E(x).
pub fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    let max = logits.clone().max_dim(1).detach();
    let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
    lse.reshape([n])
}
