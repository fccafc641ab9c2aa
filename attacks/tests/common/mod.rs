//! Shared by the attack tests: binary linear problems whose minimal adversarial perturbations
//! are known in closed form.
#![allow(dead_code)]

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub type I = Flex;
pub type B = Autodiff<Flex>;
/// Images are 1 × 4 × 4.
pub const D: usize = 16;

pub fn image(v: &[f32]) -> Tensor<I, 4> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [v.len() / D, 1, 4, 4]),
        &Default::default(),
    )
}

pub fn label(y: i64) -> Tensor<I, 1, Int> {
    Tensor::from_data(TensorData::new(vec![y], [1]), &Default::default())
}

pub struct Case {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub x: Vec<f32>,
    pub y: i64,
    pub min_l2: f32,
    pub min_linf: f32,
}

/// Random binary problems with x near the middle of the box and a small margin.
pub fn cases(n: usize) -> Vec<Case> {
    let mut rng = StdRng::seed_from_u64(42);
    (0..n)
        .map(|_| {
            let w: Vec<f32> = (0..2 * D).map(|_| rng.random_range(-1.0..1.0)).collect();
            let x: Vec<f32> = (0..D).map(|_| rng.random_range(0.4..0.6)).collect();
            let z = |k: usize| (0..D).map(|d| w[k * D + d] * x[d]).sum::<f32>();
            // Bias so that class 0 wins by a margin between 0.2 and 0.6.
            let margin = rng.random_range(0.2..0.6);
            let b = vec![0.0, z(0) - z(1) - margin];
            let diff: Vec<f32> = (0..D).map(|d| w[d] - w[D + d]).collect();
            let l2 = diff.iter().map(|v| v * v).sum::<f32>().sqrt();
            let l1 = diff.iter().map(|v| v.abs()).sum::<f32>();
            Case {
                w,
                b,
                x,
                y: 0,
                min_l2: margin / l2,
                min_linf: margin / l1,
            }
        })
        .collect()
}
