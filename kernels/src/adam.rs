//! [`FastAdam`]: Adam's update of one parameter tensor as one pass over memory (one kernel launch
//! on a GPU), and [`FusedAdam`], the optimiser that uses it.
//!
//! burn's `Adam` composes each parameter's update from thirteen element-wise operations (the two
//! moments, the bias-corrected ratio, the step), each a pass over memory into a fresh buffer and,
//! on a GPU, a launch of its own: a Wide-ResNet's optimiser step launched more kernels than its
//! forward pass. [`FusedAdam`] computes the same numbers — burn's formula, operation for operation
//! in burn's order, so on the CPU the same bits — and keeps the same state record, so a training
//! state saved under burn's `Adam` resumes under it.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

use crate::backend::{implementation, Implementation};

/// Elements per parallel chunk of the CPU pass.
const CHUNK: usize = 1 << 14;

/// The scalars of Adam's step number `t` (from 1), worked out once per tensor on the host in
/// f32, as burn's `Adam` works them out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// β₁, the first moment's decay.
    pub beta_1: f32,
    /// β₂, the second moment's decay.
    pub beta_2: f32,
    /// √(1 − β₂ᵗ) / (1 − β₁ᵗ): both bias corrections as one factor on the first moment.
    pub correction: f32,
    /// ε · √(1 − β₂ᵗ): ε carried inside the uncorrected denominator.
    pub epsilon: f32,
    /// The learning rate.
    pub lr: f32,
}

impl AdamStep {
    /// Step `t` (≥ 1) with decays `beta_1`, `beta_2`, ε `epsilon` and learning rate `lr`.
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32, t: usize, lr: f64) -> Self {
        let t = i32::try_from(t).unwrap_or(i32::MAX);
        let corrected_2 = (1.0 - beta_2.powi(t)).sqrt();
        Self {
            beta_1,
            beta_2,
            correction: corrected_2 / (1.0 - beta_1.powi(t)),
            epsilon: epsilon * corrected_2,
            lr: lr as f32,
        }
    }

    /// The step on one element: parameter `p` with gradient `g` and moments `m`, `v` before
    /// the step (`None` at the first, where both are zero) → parameter and moments after it.
    /// burn's operations in burn's order (no fused multiply-add), so the same bits.
    #[inline]
    pub fn apply(&self, p: f32, g: f32, moments: Option<(f32, f32)>) -> [f32; 3] {
        let (fresh_1, fresh_2) = (g * (1.0 - self.beta_1), (g * g) * (1.0 - self.beta_2));
        let (m, v) = match moments {
            Some((m, v)) => (m * self.beta_1 + fresh_1, v * self.beta_2 + fresh_2),
            None => (fresh_1, fresh_2),
        };
        let direction = (m * self.correction) / (v.sqrt() + self.epsilon);
        [p - direction * self.lr, m, v]
    }
}

/// A backend with Adam's update of a parameter tensor in one pass. The default is burn's own
/// composition (what burn's `Adam` launches), so a backend without a kernel of its own
/// implements it with an empty block.
pub trait FastAdam: Backend {
    /// One step of a parameter `param` with gradient `grad` and moments `[m, v]` before it
    /// (`None` at the first step): the parameter, `m` and `v` after it, in that order.
    fn fast_adam_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<[FloatTensor<Self>; 2]>,
        step: AdamStep,
    ) -> [FloatTensor<Self>; 3] {
        composed_adam_step::<Self>(param, grad, moments, step)
    }
}

/// The step as burn's `Adam` composes it, one operation per pass.
pub(crate) fn composed_adam_step<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<[FloatTensor<B>; 2]>,
    s: AdamStep,
) -> [FloatTensor<B>; 3] {
    let fresh_1 = B::float_mul_scalar(grad.clone(), (1.0 - s.beta_1).into());
    let squared = B::float_mul(grad.clone(), grad);
    let fresh_2 = B::float_mul_scalar(squared, (1.0 - s.beta_2).into());
    let (m, v) = match moments {
        Some([m, v]) => (
            B::float_add(B::float_mul_scalar(m, s.beta_1.into()), fresh_1),
            B::float_add(B::float_mul_scalar(v, s.beta_2.into()), fresh_2),
        ),
        None => (fresh_1, fresh_2),
    };
    let denominator = B::float_add_scalar(B::float_sqrt(v.clone()), s.epsilon.into());
    let direction = B::float_div(
        B::float_mul_scalar(m.clone(), s.correction.into()),
        denominator,
    );
    let param = B::float_sub(param, B::float_mul_scalar(direction, s.lr.into()));
    [param, m, v]
}

impl FastAdam for Flex {
    fn fast_adam_step(
        param: FlexTensor,
        grad: FlexTensor,
        moments: Option<[FlexTensor; 2]>,
        step: AdamStep,
    ) -> [FlexTensor; 3] {
        let mut inputs = vec![&param, &grad];
        inputs.extend(moments.iter().flatten());
        let handled = implementation() == Implementation::Own
            && inputs
                .iter()
                .all(|t| t.dtype() == DType::F32 && t.shape() == param.shape());
        if !handled {
            return composed_adam_step::<Flex>(param, grad, moments, step);
        }
        let shape = param.shape();
        let contiguous: Vec<FlexTensor> = inputs.iter().map(|t| t.to_contiguous()).collect();
        let slices: Vec<&[f32]> = contiguous
            .iter()
            .map(|t| t.as_slice::<f32>().expect("a contiguous f32 tensor"))
            .collect();
        let (p, g) = (slices[0], slices[1]);
        let moments = (slices.len() == 4).then(|| &slices[2..]);
        // Zeroed by the allocator (fresh pages), then written once.
        let n = p.len();
        let (mut p_out, mut m_out, mut v_out) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        p_out
            .par_chunks_mut(CHUNK)
            .zip(m_out.par_chunks_mut(CHUNK))
            .zip(v_out.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(chunk, ((p_out, m_out), v_out))| {
                let start = chunk * CHUNK;
                for (j, ((p_out, m_out), v_out)) in
                    p_out.iter_mut().zip(m_out).zip(v_out).enumerate()
                {
                    let i = start + j;
                    let before = moments.map(|mv| (mv[0][i], mv[1][i]));
                    [*p_out, *m_out, *v_out] = step.apply(p[i], g[i], before);
                }
            });
        [p_out, m_out, v_out].map(|v| FlexTensor::from_data(TensorData::new(v, shape.clone())))
    }
}

/// An optimiser's update is not differentiated: the step runs on the inner backend's kernel and
/// its results are untracked.
impl<B: FastAdam, C: CheckpointStrategy> FastAdam for Autodiff<B, C> {
    fn fast_adam_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<[FloatTensor<Self>; 2]>,
        step: AdamStep,
    ) -> [FloatTensor<Self>; 3] {
        let moments = moments.map(|[m, v]| [m.primitive, v.primitive]);
        B::fast_adam_step(param.primitive, grad.primitive, moments, step)
            .map(<Self as AutodiffBackend>::from_inner)
    }
}

/// Adam (Kingma & Ba 2015) as burn's `Adam` computes it — without weight decay, AMSGrad or
/// gradient clipping — with each parameter's update done by the backend's [`FastAdam`].
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::nn::LinearConfig;
/// use burn::optim::{GradientsParams, Optimizer};
/// use burn::tensor::{Distribution, Tensor};
/// use jem_kernels::FusedAdam;
///
/// type B = Autodiff<Flex>;
/// let device = Default::default();
/// let layer = LinearConfig::new(4, 2).init::<B>(&device);
/// let mut optim = FusedAdam::new(0.9, 0.999, 1e-8).init::<B, _>();
/// let x = Tensor::<B, 2>::random([8, 4], Distribution::Default, &device);
/// let loss = layer.forward(x).powi_scalar(2).sum();
/// let grads = GradientsParams::from_grads(loss.backward(), &layer);
/// let before = layer.weight.val().into_data();
/// let layer = optim.step(1e-2, layer, grads);
/// // Adam's first step moves every weight by about the learning rate.
/// let moved = layer.weight.val().inner() - Tensor::from_data(before, &device);
/// assert!((moved.abs().max().into_scalar() - 1e-2).abs() < 1e-4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAdam {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
}

impl FusedAdam {
    /// Adam with decays `beta_1`, `beta_2` and ε `epsilon` (PyTorch's defaults: 0.9, 0.999,
    /// 1e-8).
    pub fn new(beta_1: f32, beta_2: f32, epsilon: f32) -> Self {
        Self {
            beta_1,
            beta_2,
            epsilon,
        }
    }

    /// The optimiser for module `M` on autodiff backend `B`, as burn's `AdamConfig::init`
    /// makes one.
    pub fn init<B, M>(self) -> OptimizerAdaptor<Self, M, B>
    where
        B: AutodiffBackend<InnerBackend: FastAdam>,
        M: AutodiffModule<B>,
    {
        OptimizerAdaptor::from(self)
    }
}

impl<B: FastAdam> SimpleOptimizer<B> for FusedAdam {
    /// burn's own `Adam` state, so that either optimiser resumes the other's record.
    type State<const D: usize> = AdamState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let primitive = |t: Tensor<B, D>| t.into_primitive().tensor();
        let (t, moments) = match state {
            Some(AdamState { momentum }) => (
                momentum.time + 1,
                Some([primitive(momentum.moment_1), primitive(momentum.moment_2)]),
            ),
            None => (1, None),
        };
        let step = AdamStep::new(self.beta_1, self.beta_2, self.epsilon, t, lr);
        let [param, m, v] = B::fast_adam_step(primitive(tensor), primitive(grad), moments, step);
        let tensor = |p| Tensor::from_primitive(TensorPrimitive::Float(p));
        let momentum = AdaptiveMomentumState::new(t, tensor(m), tensor(v));
        (tensor(param), Some(AdamState::new(momentum)))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tensors::{bits, formula};

    /// The one pass and burn's composition agree bit for bit, at the first step and later ones,
    /// on a tensor longer than one chunk (so several chunks run in parallel).
    #[test]
    fn the_one_pass_is_burns_composition_to_the_bit() {
        let shape = [3, CHUNK + 77];
        let (p, g) = (formula(&shape, 1, 0.0, 1.0), formula(&shape, 2, 0.0, 1e-3));
        // Moments as a run leaves them: the second never negative.
        let (m, v) = (
            formula(&shape, 3, 0.0, 1e-3),
            formula(&shape, 4, 1e-6, 1e-6),
        );
        for (t, moments) in [(1, false), (2, true), (1000, true)] {
            let step = AdamStep::new(0.9, 0.999, 1e-8, t, 1e-3);
            let before = || moments.then(|| [m.clone(), v.clone()]);
            let ours = Flex::fast_adam_step(p.clone(), g.clone(), before(), step);
            let burns = composed_adam_step::<Flex>(p.clone(), g.clone(), before(), step);
            for (which, (a, b)) in ["param", "m", "v"].iter().zip(ours.into_iter().zip(burns)) {
                assert_eq!(bits(a), bits(b), "{which} at step {t}");
            }
        }
    }
}
