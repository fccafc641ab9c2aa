//! Shared by the attack tests: binary linear problems whose minimal adversarial perturbations
//! are known in closed form.
#![allow(dead_code)]

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{LinearClassifier, Undefended};
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

/// A linear classifier as an attack sees it.
pub type Linear = Undefended<LinearClassifier<B>>;

/// Eight inputs for one binary linear model, and per input its margin (negative:
/// misclassified) and minimal L∞ and L2 perturbations.
pub struct Batch {
    pub model: Linear,
    pub x: Vec<f32>,
    pub margin: Vec<f32>,
    pub min_linf: Vec<f32>,
    pub min_l2: Vec<f32>,
}

pub fn batch() -> Batch {
    let c = &cases(1)[0];
    let diff: Vec<f32> = (0..D).map(|d| c.w[d] - c.w[D + d]).collect();
    let l1: f32 = diff.iter().map(|v| v.abs()).sum();
    let l2: f32 = diff.iter().map(|v| v * v).sum::<f32>().sqrt();
    // Moving the case's input by −t·sign(w₀ − w₁) lowers its margin by t‖w₀ − w₁‖₁.
    let margin = vec![-0.1, 0.03, 0.07, 0.15, 0.25, 0.4, 0.6, 0.9];
    let mut x = Vec::new();
    for &m in &margin {
        let t = (c.min_linf * l1 - m) / l1;
        x.extend((0..D).map(|d| c.x[d] - t * diff[d].signum()));
    }
    Batch {
        model: Undefended::new(LinearClassifier::<B>::new(
            c.w.clone(),
            c.b.clone(),
            2,
            &Default::default(),
        )),
        min_linf: margin.iter().map(|m| m / l1).collect(),
        min_l2: margin.iter().map(|m| m / l2).collect(),
        x,
        margin,
    }
}

/// Label 0 for each of `n` inputs.
pub fn labels(n: usize) -> Tensor<I, 1, Int> {
    Tensor::from_data(TensorData::new(vec![0i64; n], [n]), &Default::default())
}
