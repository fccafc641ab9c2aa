//! JEM's test-time defence (Grathwohl et al. 2020; the official attack code): before classifying, each input is refined by K SGLD steps
//! started at the input (plus optional data noise), in n independent chains whose logits are
//! averaged. Gradients through it come in two modes:
//!
//! - `Full`: reverse mode through all K steps. The step x ← x + D ⊙ ∇ₓLSE f(x) + noise
//!   (D = α s² per channel) has Jacobian I + diag(D) H(x), H the Hessian of LSE∘f. burn has
//!   no double backward, so the Hessian-vector products are formed as [`HessianVector`] says:
//!   exactly wherever the classifier offers it — a piecewise-linear network that linearises
//!   itself ([`Classifier::linearise`]) from the activation pattern recorded on the way
//!   forward, at the cost of one forward and one backward pass of the linearised network per
//!   step; any other network with a forward mode ([`Classifier::jacobian_vector_product`]) by
//!   reverse mode over it ([`log_sum_exp_hessian_vector`]), one forward pass with tangents and
//!   one backward pass per step — and by finite differences otherwise (tests check the whole
//!   map against finite differences for K = 1 and 10, and tests/fixtures/onnx against
//!   PyTorch's double backward through one step).
//! - `Bpda`: the K steps are the identity on the backward pass; the gradient is taken at x_K
//!   (what the official JEM attack effectively did).

use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::channels::scale_channels;
use crate::classifier::{
    input_gradient, log_sum_exp, log_sum_exp_hessian_vector, Classifier, Linearised,
};
use crate::model::{LossFn, Model};
use crate::norm::Norm;
use crate::sgld::{SgldSampler, SgldTarget};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Where the chains' standard-normal noise comes from: called with the state each draw is for
/// (a generator's draws, or given ones: [`SgldDefence::loss_gradient_with_noise`]).
type NoiseSource<'a, B> = &'a mut dyn FnMut(&Tensor<Inner<B>, 4>) -> Tensor<Inner<B>, 4>;

/// How the gradient passes the SGLD steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradMode {
    /// Reverse mode through all K steps, Hessian-vector products formed as [`HessianVector`] says.
    Full,
    /// BPDA (Athalye et al. 2018): the K steps are the identity on the backward pass; the
    /// gradient is taken at x_K.
    Bpda,
}

impl std::str::FromStr for GradMode {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        match s {
            "full" => Ok(GradMode::Full),
            "bpda" => Ok(GradMode::Bpda),
            _ => Err(crate::UnknownName {
                what: "gradient mode",
                found: s.to_string(),
                expected: "full or bpda",
            }),
        }
    }
}

impl std::fmt::Display for GradMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GradMode::Full => "full",
            GradMode::Bpda => "bpda",
        })
    }
}

/// Settings of the defence, all recorded with every result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SgldDefenceConfig {
    /// Chains per input whose logits are averaged (official attack code: 5).
    pub chains: usize,
    /// Chains used to confirm a break (Hill et al. 2021: 150).
    pub recheck_chains: usize,
    /// Gaussian noise added to the input before the chain starts, on the network scale
    /// (JEM's σ_data; 0 for none).
    pub init_noise: f32,
    /// How gradients pass the K SGLD steps (`full` or `bpda`).
    pub grad: GradMode,
    /// How `Full` mode forms Hessian-vector products (exactly where the classifier offers it,
    /// under the default `PiecewiseLinear`).
    pub hvp: HessianVector,
    /// Finite-difference step h of the Hessian-vector products, in pixel units.
    pub hvp_step: f32,
}

/// Hessian-vector products of LSE∘f without double backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HessianVector {
    /// The default: exact wherever the classifier offers it, in this order.
    ///
    /// 1. For networks that are piecewise linear in their input (ReLU / LeakyReLU, pooling,
    ///    convolutions, linear layers and affine normalisation: every WRN here), the Hessian
    ///    of LSE∘f is Jᵀ(diag p − p pᵀ)J almost everywhere (f's own second derivative vanishes
    ///    between kinks). Where the classifier linearises itself ([`Classifier::linearise`]),
    ///    J v is one forward pass of the network linearised at x (its activation pattern
    ///    recorded during the SGLD step) and Jᵀ(·) one reverse pass of it: about two forward
    ///    passes per step.
    /// 2. Otherwise, where the classifier has a forward mode
    ///    ([`Classifier::jacobian_vector_product`]), for any network, smooth ones included:
    ///    H v = ∇ₓ[softmax(f(x)) · J(x) v] by reverse mode over it
    ///    ([`log_sum_exp_hessian_vector`]), which keeps the term Σ_k p_k ∇²f_k that the
    ///    piecewise-linear form drops.
    /// 3. Otherwise the piecewise-linear form, approximately: J v from central differences of
    ///    the logits (step `hvp_step`) and Jᵀ(·) from reverse mode through the network; wrong
    ///    by that dropped term for a smooth network. Differencing gradients instead would blow
    ///    up at every kink crossed.
    ///
    /// (The name, recorded in every sweep's settings, is the fallback's.)
    PiecewiseLinear,
    /// Central differences of exact input gradients, (∇(x + h û) − ∇(x − h û)) / 2h · ‖v‖,
    /// whatever the classifier offers: for networks that are smooth in their input (softplus,
    /// tanh, …), and as an independent check of the exact products.
    GradientDifferences,
}

/// JEM-K (Grathwohl et al. 2020): a [`Classifier`] behind K SGLD steps on its unconditional
/// energy, started at the input, in `chains` chains whose logits are averaged. A stochastic
/// [`Model`] whenever the steps or the initial noise add noise.
pub struct SgldDefence<M> {
    classifier: M,
    /// K = `sampler.config.steps`, with α, σ and the pixel scale.
    pub sampler: SgldSampler,
    /// Chains, re-check chains, initial noise and gradient mode.
    pub config: SgldDefenceConfig,
}

/// One batch of chains: what the backward pass needs of each step (Full mode keeps them all)
/// and the final state.
struct Chains<'a, B: AutodiffBackend> {
    steps: Vec<StepRecord<'a, B>>,
    last: Tensor<Inner<B>, 4>,
}

/// One SGLD step as the backward pass through it needs it.
struct StepRecord<'a, B: AutodiffBackend> {
    /// x_t, the state the step started from.
    state: Tensor<Inner<B>, 4>,
    /// The network linearised at x_t and its softmax there, where the classifier offers it.
    linearised: Option<(Linearised<'a, B>, Tensor<Inner<B>, 2>)>,
}

impl<M> SgldDefence<M> {
    /// Puts `classifier` behind the defence (its parameter gradients switched off with
    /// `Module::no_grad`); K, α, σ and the pixel scale come from `sampler`.
    pub fn new<B: AutodiffBackend>(
        classifier: M,
        sampler: SgldSampler,
        config: SgldDefenceConfig,
    ) -> Self
    where
        M: Module<B>,
    {
        Self {
            classifier: classifier.no_grad(),
            sampler,
            config,
        }
    }

    /// The chains from `x`, their standard-normal noise from `noise` (called with the state it
    /// is for: the initial noise first, where `init_noise` > 0, then once per step).
    fn run_chains<B: AutodiffBackend>(
        &self,
        x: &Tensor<Inner<B>, 4>,
        chains: usize,
        keep: bool,
        noise: NoiseSource<'_, B>,
    ) -> Chains<'_, B>
    where
        M: Classifier<B>,
    {
        // Chain-major copies: row c·N + i is chain c of example i.
        let mut state = x.clone().repeat_dim(0, chains);
        if self.config.init_noise > 0.0 {
            let init_noise = self.config.init_noise;
            let scale = self
                .sampler
                .pixel_factor(|s| init_noise * s, &state.device());
            state = state.clone() + scale_channels(noise(&state), scale);
        }
        let linearise = keep && self.config.hvp == HessianVector::PiecewiseLinear;
        let mut steps = Vec::new();
        for _ in 0..self.sampler.config.steps {
            let eps = noise(&state);
            let linearised = if linearise {
                self.linearised_step::<B>(state.clone())
            } else {
                None
            };
            let next = match &linearised {
                Some((g, ..)) => {
                    self.sampler
                        .update::<B, M>(&self.classifier, state.clone(), g.clone(), eps)
                }
                None => self.sampler.step::<B, M>(
                    &self.classifier,
                    state.clone(),
                    &SgldTarget::Marginal,
                    eps,
                ),
            };
            if keep {
                steps.push(StepRecord {
                    state,
                    linearised: linearised.map(|(_, jacobian, p)| (jacobian, p)),
                });
            }
            state = next;
        }
        Chains { steps, last: state }
    }

    /// ∇ₓ LSE f at `x` (the SGLD step's gradient) from the same forward pass that linearises
    /// the network there, with the softmax at `x`; `None` if the classifier cannot linearise.
    #[allow(clippy::type_complexity)]
    fn linearised_step<B: AutodiffBackend>(
        &self,
        x: Tensor<Inner<B>, 4>,
    ) -> Option<(Tensor<Inner<B>, 4>, Linearised<'_, B>, Tensor<Inner<B>, 2>)>
    where
        M: Classifier<B>,
    {
        let x = Tensor::<B, 4>::from_inner(x).require_grad();
        let (logits, jacobian) = self.classifier.linearise(x.clone())?;
        let grads = log_sum_exp(logits.clone()).sum().backward();
        let g = x
            .grad(&grads)
            .expect("the input was marked as requiring a gradient");
        Some((g, jacobian, softmax(logits.inner(), 1)))
    }

    /// (diag p − p pᵀ) u, row by row: the softmax's Jacobian, the middle factor of the
    /// Hessian of LSE∘f.
    fn softmax_jacobian<I: burn::tensor::backend::Backend>(
        p: Tensor<I, 2>,
        u: Tensor<I, 2>,
    ) -> Tensor<I, 2> {
        p.clone() * u.clone() - p.clone() * (p * u).sum_dim(1)
    }

    /// H(x_t) v for the Hessian H of Σ LSE f at a step's state x_t, per example (see
    /// [`HessianVector`]).
    fn hessian_vector<B: AutodiffBackend>(
        &self,
        step: &StepRecord<'_, B>,
        v: Tensor<Inner<B>, 4>,
    ) -> Tensor<Inner<B>, 4>
    where
        M: Classifier<B>,
    {
        if let Some((jacobian, p)) = &step.linearised {
            // J v forward through the linearised network, then Jᵀ(diag p − p pᵀ)(J v) by
            // reverse mode through the same pass (the middle factor held constant).
            let v = Tensor::<B, 4>::from_inner(v).require_grad();
            let jv = jacobian(v.clone());
            let w = Self::softmax_jacobian(p.clone(), jv.clone().inner());
            let grads = (jv * Tensor::from_inner(w)).sum().backward();
            return v
                .grad(&grads)
                .expect("the input was marked as requiring a gradient");
        }
        let x = step.state.clone();
        if self.config.hvp == HessianVector::PiecewiseLinear {
            if let Some(hv) =
                log_sum_exp_hessian_vector::<B, M>(&self.classifier, x.clone(), v.clone())
            {
                return hv;
            }
        }
        let [n, ..] = x.dims();
        let len = Norm::L2.size(v.clone()).reshape([n, 1, 1, 1]);
        let unit = v / len.clone().clamp_min(1e-30);
        let h = self.config.hvp_step;
        let both = Tensor::cat(vec![x.clone() + unit.clone() * h, x.clone() - unit * h], 0);
        match self.config.hvp {
            HessianVector::PiecewiseLinear => {
                // J v from central differences of the logits (f is Lipschitz, so the error stays
                // bounded even where a kink lies within ±h), then Jᵀ(diag p − p pᵀ)(J v) by
                // reverse mode, exactly.
                // One forward pass gives f(x + hû), f(x − hû) and f(x).
                let three = Tensor::cat(vec![both, x.clone()], 0);
                let logits = self.classifier.logits(Tensor::from_inner(three)).inner();
                let jv = (logits.clone().slice([0..n]) - logits.clone().slice([n..2 * n]))
                    / (2.0 * h)
                    * len.reshape([n, 1]);
                let p = softmax(logits.slice([2 * n..3 * n]), 1);
                let w = Self::softmax_jacobian(p, jv);
                let (jtw, _) = input_gradient::<B, M>(&self.classifier, x, |l| {
                    (l * Tensor::from_inner(w.clone())).sum_dim(1).reshape([n])
                });
                jtw
            }
            HessianVector::GradientDifferences => {
                let (g, _) = input_gradient::<B, M>(&self.classifier, both, log_sum_exp);
                let (plus, minus) = (g.clone().slice([0..n]), g.slice([n..2 * n]));
                (plus - minus) / (2.0 * h) * len
            }
        }
    }

    /// Averages `[chains·N, K]` chain-major logits to `[N, K]`.
    fn average<Bk: burn::tensor::backend::Backend>(
        logits: Tensor<Bk, 2>,
        chains: usize,
    ) -> Tensor<Bk, 2> {
        let [cn, k] = logits.dims();
        logits
            .reshape([chains, cn / chains, k])
            .mean_dim(0)
            .reshape([cn / chains, k])
    }

    /// Σ over chains of per-chain rows (chain-major), as additions of whole slices: no
    /// reduction kernel along the chain axis (see [`Self::averaged_loss_gradient`]).
    fn sum_chains<Bk: burn::tensor::backend::Backend>(
        g: Tensor<Bk, 4>,
        chains: usize,
    ) -> Tensor<Bk, 4> {
        let n = g.dims()[0] / chains;
        (1..chains).fold(g.clone().narrow(0, 0, n), |sum, c| {
            sum + g.clone().narrow(0, c * n, n)
        })
    }

    /// The loss of the chain-averaged logits, differentiated at every chain's input `last`;
    /// returns that gradient and the averaged logits. The loss is differentiated at the
    /// averaged logits as a leaf, and the network at each chain's logits against that
    /// gradient over the chains (the average's adjoint, written out): burn 0.21's CUDA
    /// backend computed the same adjoint wrong for every other digit when autodiff took it
    /// through the averaging's reduction (docs/gpu.md); these are elementwise operations.
    fn averaged_loss_gradient<B: AutodiffBackend>(
        &self,
        last: Tensor<Inner<B>, 4>,
        chains: usize,
        loss: LossFn<'_, B>,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>)
    where
        M: Classifier<B>,
    {
        let x = Tensor::<B, 4>::from_inner(last).require_grad();
        let logits = self.classifier.logits(x.clone());
        let averaged = Self::average(logits.clone().inner(), chains);
        let leaf = Tensor::<B, 2>::from_inner(averaged.clone()).require_grad();
        let grads = loss(leaf.clone()).sum().backward();
        let per_average = leaf
            .grad(&grads)
            .expect("the averaged logits were marked as requiring a gradient");
        let per_chain = per_average
            .repeat_dim(0, chains)
            .mul_scalar(1.0 / chains as f64);
        let grads = (logits * Tensor::from_inner(per_chain)).sum().backward();
        let g = x
            .grad(&grads)
            .expect("the input was marked as requiring a gradient");
        (g, averaged)
    }

    /// [`Model::loss_gradient`] with the chains' standard-normal noise given instead of drawn:
    /// the initial noise first (where `init_noise` > 0), then one draw per SGLD step, each
    /// `[chains·N, C, H, W]` and chain-major (row c·N + i is chain c of example i) — the draws
    /// `loss_gradient` makes, in its order. A chain is then a fixed function of the input, so
    /// that the gradient through its steps can be checked against another implementation fed
    /// the same draws (tests/fixtures/onnx: PyTorch's double backward).
    ///
    /// # Panics
    /// If `noise` holds another number of draws, or a draw of another shape.
    pub fn loss_gradient_with_noise<B: AutodiffBackend>(
        &self,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        noise: Vec<Tensor<Inner<B>, 4>>,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>)
    where
        M: Classifier<B>,
    {
        let expected = self.sampler.config.steps + usize::from(self.config.init_noise > 0.0);
        assert_eq!(noise.len(), expected, "SgldDefence: draws of noise given");
        let mut draws = noise.into_iter();
        self.gradient::<B>(x, loss, &mut |state| {
            let draw = draws.next().expect("counted above");
            assert_eq!(
                draw.dims(),
                state.dims(),
                "SgldDefence: a draw of noise of another shape"
            );
            draw
        })
    }

    /// The loss gradient for the noise `noise` gives (see [`Self::run_chains`]).
    fn gradient<B: AutodiffBackend>(
        &self,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        noise: NoiseSource<'_, B>,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>)
    where
        M: Classifier<B>,
    {
        let chains = self.config.chains;
        let full = self.config.grad == GradMode::Full;
        let run = self.run_chains::<B>(&x, chains, full, noise);
        let (mut v, logits) = self.averaged_loss_gradient::<B>(run.last.clone(), chains, loss);
        if full {
            let step_size = self.sampler.config.step_size;
            let drift = self
                .sampler
                .pixel_factor(|s| s * s * step_size, &x.device());
            let mut next = run.last;
            for step in run.steps.iter().rev() {
                if self.sampler.config.clamp {
                    // Clamping passes the gradient only where it did not bind.
                    let inside = next
                        .clone()
                        .greater_elem(0.0)
                        .bool_and(next.clone().lower_elem(1.0));
                    v = v * inside.float();
                }
                // x_{t+1} = x_t + D ⊙ ∇(x_t) + noise has Jacobian I + diag(D) H, whose
                // transpose (H symmetric) maps v to v + H (D ⊙ v).
                let drifted = scale_channels(v.clone(), drift.clone());
                v = v + self.hessian_vector::<B>(step, drifted);
                next = step.state.clone();
            }
        }
        (Self::sum_chains(v, chains), logits)
    }

    fn forward<B: AutodiffBackend>(
        &self,
        x: Tensor<Inner<B>, 4>,
        chains: usize,
        rng: &mut StdRng,
    ) -> Tensor<Inner<B>, 2>
    where
        M: Classifier<B>,
    {
        let run = self.run_chains::<B>(&x, chains, false, &mut |s| self.sampler.draw_noise(s, rng));
        let logits = self.classifier.logits(Tensor::from_inner(run.last)).inner();
        Self::average(logits, chains)
    }
}

impl<B: AutodiffBackend, M: Classifier<B>> Model<B> for SgldDefence<M> {
    fn logits(&self, x: Tensor<Inner<B>, 4>, rng: &mut StdRng) -> Tensor<Inner<B>, 2> {
        self.forward::<B>(x, self.config.chains, rng)
    }

    fn recheck_logits(&self, x: Tensor<Inner<B>, 4>, rng: &mut StdRng) -> Tensor<Inner<B>, 2> {
        self.forward::<B>(x, self.config.recheck_chains, rng)
    }

    fn loss_gradient(
        &self,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        rng: &mut StdRng,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>) {
        self.gradient::<B>(x, loss, &mut |s| self.sampler.draw_noise(s, rng))
    }

    fn is_stochastic(&self) -> bool {
        self.sampler.config.steps > 0 && self.sampler.config.noise > 0.0
            || self.config.init_noise > 0.0
    }

    fn describe(&self) -> String {
        format!(
            "sgld K={} n={} {}",
            self.sampler.config.steps, self.config.chains, self.config.grad
        )
    }
}
