//! [`FastSgld`]: an SGLD step's update of the pixels, `x + g · drift[c] + ε · noise[c]` for every
//! element of channel c (then clamped to [0, 1] if asked), as one pass over memory (one launch on
//! a GPU, with the factors uploaded as one small tensor). Composed from burn's operations it is
//! six or seven launches per step (each channel's factor repeated per image, two products, two
//! sums, the clamp) and two uploads.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorData, TensorMetadata, TensorPrimitive};
use rayon::prelude::*;

use crate::backend::{implementation, Implementation};

/// A backend with SGLD's update of a batch of images in one pass. The default is burn's own
/// composition, so a backend without a kernel of its own implements it with an empty block.
pub trait FastSgld: Backend {
    /// `x + g · drift[c] + eps · noise[c]` for `[n, c, h, w]` tensors `x` (the chains), `g` (the
    /// score's input gradient there) and `eps` (standard-normal noise), with one `drift` and one
    /// `noise` factor per channel; clamped to [0, 1] if `clamp`. The sum is formed in that
    /// order, `(x + g · drift) + eps · noise`, on every backend.
    fn fast_sgld_update(
        x: FloatTensor<Self>,
        g: FloatTensor<Self>,
        eps: FloatTensor<Self>,
        drift: &[f32],
        noise: &[f32],
        clamp: bool,
    ) -> FloatTensor<Self> {
        composed_sgld_update::<Self>(x, g, eps, drift, noise, clamp)
    }
}

/// The update as burn's operations compose it.
pub(crate) fn composed_sgld_update<B: Backend>(
    x: FloatTensor<B>,
    g: FloatTensor<B>,
    eps: FloatTensor<B>,
    drift: &[f32],
    noise: &[f32],
    clamp: bool,
) -> FloatTensor<B> {
    let tensor = |t| Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(t));
    let (x, g, eps) = (tensor(x), tensor(g), tensor(eps));
    let per_channel = |v: &[f32]| {
        Tensor::<B, 4>::from_data(TensorData::new(v.to_vec(), [1, v.len(), 1, 1]), &x.device())
    };
    let next = x.clone() + g * per_channel(drift) + eps * per_channel(noise);
    let next = if clamp { next.clamp(0.0, 1.0) } else { next };
    next.into_primitive().tensor()
}

/// One element of the update: the operations of [`FastSgld::fast_sgld_update`] in its order.
#[inline]
fn update(x: f32, g: f32, eps: f32, drift: f32, noise: f32, clamp: bool) -> f32 {
    let next = (x + g * drift) + eps * noise;
    if clamp {
        next.clamp(0.0, 1.0)
    } else {
        next
    }
}

impl FastSgld for Flex {
    fn fast_sgld_update(
        x: FlexTensor,
        g: FlexTensor,
        eps: FlexTensor,
        drift: &[f32],
        noise: &[f32],
        clamp: bool,
    ) -> FlexTensor {
        let shape = x.shape();
        let handled = implementation() == Implementation::Own
            && shape.num_dims() == 4
            && shape[1] == drift.len()
            && shape[1] == noise.len()
            && [&x, &g, &eps]
                .iter()
                .all(|t| t.dtype() == DType::F32 && t.shape() == shape);
        if !handled {
            return composed_sgld_update::<Flex>(x, g, eps, drift, noise, clamp);
        }
        let (x, g, eps) = (x.to_contiguous(), g.to_contiguous(), eps.to_contiguous());
        let slice = |t| FlexTensor::as_slice::<f32>(t).expect("a contiguous f32 tensor");
        let (xs, gs, es) = (slice(&x), slice(&g), slice(&eps));
        let (channels, plane) = (shape[1], shape[2] * shape[3]);
        let mut next = vec![0f32; xs.len()];
        // One image plane per task: one channel, so one pair of factors.
        next.par_chunks_mut(plane.max(1))
            .enumerate()
            .for_each(|(p, out)| {
                let c = p % channels;
                let range = p * plane..(p + 1) * plane;
                for (((o, &x), &g), &e) in out
                    .iter_mut()
                    .zip(&xs[range.clone()])
                    .zip(&gs[range.clone()])
                    .zip(&es[range])
                {
                    *o = update(x, g, e, drift[c], noise[c], clamp);
                }
            });
        FlexTensor::from_data(TensorData::new(next, shape))
    }
}

/// The step of chains that are not differentiated through it (the sampler's own update; the
/// defence's exact gradient goes back through the steps by its own reverse pass): the inner
/// backend's kernel, untracked.
impl<B: FastSgld, C: CheckpointStrategy> FastSgld for Autodiff<B, C> {
    fn fast_sgld_update(
        x: FloatTensor<Self>,
        g: FloatTensor<Self>,
        eps: FloatTensor<Self>,
        drift: &[f32],
        noise: &[f32],
        clamp: bool,
    ) -> FloatTensor<Self> {
        let next =
            B::fast_sgld_update(x.primitive, g.primitive, eps.primitive, drift, noise, clamp);
        <Self as AutodiffBackend>::from_inner(next)
    }
}

/// SGLD's update of a batch, computed by the backend's [`FastSgld`] kernel; not tracked by
/// autodiff.
pub fn sgld_update<B: FastSgld>(
    x: Tensor<B, 4>,
    g: Tensor<B, 4>,
    eps: Tensor<B, 4>,
    drift: &[f32],
    noise: &[f32],
    clamp: bool,
) -> Tensor<B, 4> {
    let [x, g, eps] = [x, g, eps].map(|t| t.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(B::fast_sgld_update(
        x, g, eps, drift, noise, clamp,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tensors::{bits, formula};

    /// The one pass and burn's composition agree bit for bit, with one channel and three, with
    /// and without the clamp (which the pixels' range makes bite on some elements).
    #[test]
    fn the_one_pass_is_burns_composition_to_the_bit() {
        for (shape, drift, noise) in [
            ([5, 1, 7, 9], vec![2.5e-3], vec![5e-3]),
            ([4, 3, 8, 8], vec![1e-3, 2e-3, 3e-3], vec![1e-2, 2e-2, 5e-3]),
        ] {
            for clamp in [false, true] {
                let args = || {
                    let x = formula(&shape, 1, 0.5, 0.55);
                    (
                        x,
                        formula(&shape, 2, 0.0, 30.0),
                        formula(&shape, 3, 0.0, 2.0),
                    )
                };
                let (a, b, c) = args();
                let ours = Flex::fast_sgld_update(a, b, c, &drift, &noise, clamp);
                let (a, b, c) = args();
                let burns = composed_sgld_update::<Flex>(a, b, c, &drift, &noise, clamp);
                assert_eq!(bits(ours), bits(burns), "{shape:?}, clamp {clamp}");
            }
        }
    }
}
