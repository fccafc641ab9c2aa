//! [`FastActivation`]: LeakyReLU as one pass over memory forward and one backward, on every core.
//!
//! burn's autodiff backend has no LeakyReLU of its own: it records burn's default composition
//! (a comparison, a scaled copy and a masked select), so a forward pass makes three passes over
//! the activations and the backward pass five more (two masked fills, a scalar product, a sum),
//! each single-threaded into a fresh buffer. In a Wide-ResNet without normalisation layers that
//! was about an eighth of an input gradient. Here the forward is one pass and the backward node
//! is one pass, `grad · (x ≥ 0 ? 1 : slope)`, cut into chunks that run on rayon's pool.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{ActivationOps, FloatTensor};
use burn::tensor::{
    get_device_settings, DType, Tensor, TensorData, TensorMetadata, TensorPrimitive,
};

use crate::backend::{implementation, Implementation};
use crate::fresh::par_fresh;

/// Elements per parallel chunk: large enough that scheduling costs nothing next to the pass,
/// small enough that a WRN's smallest activation map (64 × 64 × 7 × 7) still splits in two.
const CHUNK: usize = 1 << 14;

/// A backend with LeakyReLU (`x` where `x ≥ 0`, else `slope · x`, as burn defines it) and its
/// gradient. Both default to burn's own operations, so a backend without kernels of its own
/// implements it with an empty block.
pub trait FastActivation: Backend {
    /// LeakyReLU of every element.
    fn fast_leaky_relu(x: FloatTensor<Self>, slope: f64) -> FloatTensor<Self> {
        Self::leaky_relu(x, slope.into())
    }

    /// The gradient of [`fast_leaky_relu`](Self::fast_leaky_relu) at `x`, given the output's
    /// gradient: `grad` where `x ≥ 0`, else `slope · grad`. For a positive slope the autodiff
    /// node passes the output as `x`: it has the input's sign.
    fn fast_leaky_relu_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        slope: f64,
    ) -> FloatTensor<Self> {
        composed_backward::<Self>(x, grad, slope)
    }

    /// LeakyReLU's derivative at every element of `x`: 1 where `x ≥ 0`, else `slope`. The
    /// factor by which the network linearised at `x` scales a tangent; computed once where a
    /// tangent needs it many times, and in one pass where burn's operations take four.
    fn fast_leaky_relu_derivative(x: FloatTensor<Self>, slope: f64) -> FloatTensor<Self> {
        composed_derivative::<Self>(x, slope)
    }
}

/// The gradient as burn's operations compose it: a comparison, a scaled copy, a masked select.
pub(crate) fn composed_backward<B: Backend>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
    slope: f64,
) -> FloatTensor<B> {
    let bool_dtype = get_device_settings::<B>(&B::float_device(&x)).bool_dtype;
    let negative = B::float_lower_elem(x, 0f32.into(), bool_dtype);
    let scaled = B::float_mul_scalar(grad.clone(), slope.into());
    B::float_mask_where(grad, negative, scaled)
}

/// The derivative as burn's operations compose it: the gradient above of a tensor of ones.
fn composed_derivative<B: Backend>(x: FloatTensor<B>, slope: f64) -> FloatTensor<B> {
    let ones = B::float_ones(x.shape(), &B::float_device(&x), x.dtype().into());
    composed_backward::<B>(x, ones, slope)
}

/// LeakyReLU of one value: `x` where `x ≥ 0`, else `slope · x` (burn's definition). Shared
/// with the convolutions that fuse it.
pub(crate) fn leaky(x: f32, slope: f32) -> f32 {
    if x >= 0.0 {
        x
    } else {
        slope * x
    }
}

/// `dst = src`, or LeakyReLU(`src`) given a slope: the copies that carry a fused activation
/// (kernel rows, padded images, a chunk's activated input) apply it on the way.
pub(crate) fn copy_activated(dst: &mut [f32], src: &[f32], slope: Option<f32>) {
    match slope {
        None => dst.copy_from_slice(src),
        Some(slope) => dst
            .iter_mut()
            .zip(src)
            .for_each(|(d, &v)| *d = leaky(v, slope)),
    }
}

/// LeakyReLU's derivative at `x`: `slope` where `x < 0`, else 1. A factor to multiply by
/// rather than a branch around a multiply: that vectorises (a branch on each element's sign was
/// scalar, and mispredicted on half of them).
pub(crate) fn leaky_derivative(x: f32, slope: f32) -> f32 {
    if x < 0.0 {
        slope
    } else {
        1.0
    }
}

/// LeakyReLU of a tensor, computed by the backend's [`FastActivation`] kernels.
pub fn leaky_relu<B: FastActivation, const D: usize>(x: Tensor<B, D>, slope: f64) -> Tensor<B, D> {
    let out = B::fast_leaky_relu(x.into_primitive().tensor(), slope);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// LeakyReLU's derivative at every element of `x` (1 where `x ≥ 0`, else `slope`), by the
/// backend's [`FastActivation`] kernels; not tracked by autodiff.
pub fn leaky_relu_derivative<B: FastActivation, const D: usize>(
    x: Tensor<B, D>,
    slope: f64,
) -> Tensor<B, D> {
    let out = B::fast_leaky_relu_derivative(x.into_primitive().tensor(), slope);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Maps `f` over the elements of `a` (and `b`, of the same shape), chunk by chunk on rayon's
/// pool, into a new contiguous tensor of `a`'s shape.
fn map_f32(
    a: &FlexTensor,
    b: Option<&FlexTensor>,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> FlexTensor {
    let (a, b) = (a.to_contiguous(), b.map(FlexTensor::to_contiguous));
    let xs = a.as_slice::<f32>().expect("a contiguous f32 tensor");
    let ys = b
        .as_ref()
        .map(|b| b.as_slice::<f32>().expect("a contiguous f32 tensor"));
    // Written chunk by chunk without zeroing first (rayon's `collect_into_vec` also skips the
    // zeroing, but its per-element writes did not vectorise: input gradient +4–9 %).
    let out = par_fresh(xs.len(), CHUNK, |i, blank| {
        let n = blank.len();
        let ys = ys.map(|ys| &ys[i * CHUNK..][..n]);
        blank.map(&xs[i * CHUNK..][..n], ys, &f)
    });
    FlexTensor::from_data(TensorData::new(out, a.shape()))
}

impl FastActivation for Flex {
    fn fast_leaky_relu(x: FlexTensor, slope: f64) -> FlexTensor {
        if x.dtype() != DType::F32 || implementation() != Implementation::Own {
            return Flex::leaky_relu(x, slope.into());
        }
        let s = slope as f32;
        map_f32(&x, None, move |x, _| leaky(x, s))
    }

    fn fast_leaky_relu_backward(x: FlexTensor, grad: FlexTensor, slope: f64) -> FlexTensor {
        let handled = implementation() == Implementation::Own
            && x.dtype() == DType::F32
            && grad.dtype() == DType::F32
            && x.shape() == grad.shape();
        if !handled {
            return composed_backward::<Flex>(x, grad, slope);
        }
        let s = slope as f32;
        map_f32(&x, Some(&grad), move |x, g| g * leaky_derivative(x, s))
    }

    fn fast_leaky_relu_derivative(x: FlexTensor, slope: f64) -> FlexTensor {
        if x.dtype() != DType::F32 || implementation() != Implementation::Own {
            return composed_derivative::<Flex>(x, slope);
        }
        let s = slope as f32;
        map_f32(&x, None, move |x, _| leaky_derivative(x, s))
    }
}

/// Backward of LeakyReLU: keeps the output (or, for slopes ≤ 0, the input) and the slope.
#[derive(Debug)]
struct LeakyReluBackward;

impl<B: FastActivation> Backward<B, 1> for LeakyReluBackward {
    type State = (FloatTensor<B>, f64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (x, slope) = ops.state;
        if let Some(node) = &ops.parents[0] {
            grads.register::<B>(node.id, B::fast_leaky_relu_backward(x, grad, slope));
        }
    }
}

impl<B: FastActivation, C: CheckpointStrategy> FastActivation for Autodiff<B, C> {
    fn fast_leaky_relu(x: FloatTensor<Self>, slope: f64) -> FloatTensor<Self> {
        let out = B::fast_leaky_relu(x.primitive.clone(), slope);
        match LeakyReluBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                // For a positive slope the output has the input's sign (out ≥ 0 exactly where
                // x ≥ 0), so the backward pass can test the output instead. The output is kept
                // anyway by whatever consumes it (in a Wide-ResNet, the next convolution), so
                // keeping it here instead of the input frees one activation map per LeakyReLU
                // for the whole backward pass (WRN-16-2, batch 64: a train step's peak RSS
                // 181 → 147 MiB).
                // The one difference: an x so close to 0 that slope · x underflows to −0 gets
                // the gradient at 0 (1 instead of slope), for |x| below 2⁻¹⁴⁹ / slope.
                let kept = if slope > 0.0 {
                    out.clone()
                } else {
                    x.primitive
                };
                prep.finish((kept, slope), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    /// Not tracked: the derivative is piecewise constant, so its own gradient is 0 wherever it
    /// exists.
    fn fast_leaky_relu_derivative(x: FloatTensor<Self>, slope: f64) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(B::fast_leaky_relu_derivative(x.primitive, slope))
    }
}
