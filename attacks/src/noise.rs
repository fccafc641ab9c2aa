//! Seeded noise drawn on the host, so that the same seed gives the same numbers on every
//! backend (CPU or GPU) and a resumed run repeats exactly what an uninterrupted one did.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

/// Standard normal noise of the given shape.
pub fn gaussian<B: Backend, const D: usize>(
    dims: [usize; D],
    rng: &mut impl Rng,
    device: &B::Device,
) -> Tensor<B, D> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| StandardNormal.sample(rng)).collect();
    Tensor::from_data(TensorData::new(v, dims), device)
}

/// Uniform noise in [lo, hi) of the given shape.
pub fn uniform<B: Backend, const D: usize>(
    dims: [usize; D],
    lo: f32,
    hi: f32,
    rng: &mut impl Rng,
    device: &B::Device,
) -> Tensor<B, D> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::from_data(TensorData::new(v, dims), device)
}
