//! LeakyReLU and its backward node against burn's own operation and its autodiff gradient, and
//! against the closed form: forward `x` where `x ≥ 0`, else `slope · x`; gradient of
//! `Σ w · leaky_relu(x)` is `w` where `x ≥ 0`, else `slope · w`. Sizes below, at and above a
//! parallel chunk, exact zeros (where the two branches meet), transposed (non-contiguous) inputs.
//! The derivative on its own (`leaky_relu_derivative`, the factor a linearised network scales
//! tangents by) is the gradient of `Σ leaky_relu(x)`, and is not tracked.

use burn::backend::{Autodiff, Flex};
use burn::tensor::activation;
use burn::tensor::{Distribution, Tensor, TensorData};
use jem_kernels::{leaky_relu, leaky_relu_derivative};
use rand::{Rng, SeedableRng};

type B = Autodiff<Flex>;

fn values<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// A `[a, b]` tensor of normal values with every seventh element exactly 0.
fn input(a: usize, b: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..a * b)
        .map(|i| {
            if i % 7 == 0 {
                0.0
            } else {
                rng.random_range(-2.0f32..2.0)
            }
        })
        .collect()
}

fn check(a: usize, b: usize, slope: f64, transposed: bool, seed: u64) {
    let device = Default::default();
    let label = format!("{a}×{b} slope {slope} transposed {transposed}");
    let x = Tensor::<B, 2>::from_data(TensorData::new(input(a, b, seed), [a, b]), &device);
    let x = if transposed { x.transpose() } else { x }.require_grad();
    let w = Tensor::<B, 2>::random(x.dims(), Distribution::Normal(0.0, 1.0), &device);

    let ours = leaky_relu(x.clone(), slope);
    let burns = activation::leaky_relu(x.clone(), slope);
    let xs = values(x.clone().inner());
    let expected: Vec<f32> = xs
        .iter()
        .map(|&v| if v >= 0.0 { v } else { slope as f32 * v })
        .collect();
    assert_eq!(values(ours.clone().inner()), expected, "{label}: forward");
    assert_eq!(
        values(burns.clone().inner()),
        expected,
        "{label}: burn's forward"
    );

    let grad_ours = (ours * w.clone()).sum().backward();
    let grad_burns = (burns * w.clone()).sum().backward();
    let ours = values(x.grad(&grad_ours).unwrap());
    let burns = values(x.grad(&grad_burns).unwrap());
    let ws = values(w.inner());
    let expected: Vec<f32> = xs
        .iter()
        .zip(&ws)
        .map(|(&v, &w)| if v >= 0.0 { w } else { slope as f32 * w })
        .collect();
    assert_eq!(ours, expected, "{label}: gradient");
    assert_eq!(ours, burns, "{label}: gradient against burn's");

    let derivative = leaky_relu_derivative(x.clone(), slope);
    assert!(
        !derivative.is_require_grad(),
        "{label}: the derivative is tracked"
    );
    let burns = burns_gradient_of_sum(x.clone(), slope);
    let expected: Vec<f32> = xs
        .iter()
        .map(|&v| if v >= 0.0 { 1.0 } else { slope as f32 })
        .collect();
    assert_eq!(values(derivative.inner()), expected, "{label}: derivative");
    assert_eq!(
        burns, expected,
        "{label}: derivative against burn's gradient"
    );
    let plain = leaky_relu_derivative(x.inner(), slope);
    assert_eq!(
        values(plain),
        expected,
        "{label}: derivative without autodiff"
    );
}

/// The gradient of `Σ leaky_relu(x)` by burn's own operation and autodiff.
fn burns_gradient_of_sum(x: Tensor<B, 2>, slope: f64) -> Vec<f32> {
    let grads = activation::leaky_relu(x.clone(), slope).sum().backward();
    values(x.grad(&grads).unwrap())
}

#[test]
fn matches_burn_and_the_closed_form() {
    // 1 element; an odd size; one chunk (16 384) exactly; a chunk and a bit; several chunks.
    let shapes = [[1, 1], [7, 13], [128, 128], [129, 129], [64, 1000]];
    for (i, &[a, b]) in shapes.iter().enumerate() {
        for &slope in &[0.2, 0.0, 1.0] {
            for transposed in [false, true] {
                check(a, b, slope, transposed, i as u64);
            }
        }
    }
}

#[test]
fn untracked_inputs_and_a_second_use_of_the_output() {
    // The output feeds two branches; the gradient adds both, as for any burn operation.
    let device = Default::default();
    let x = Tensor::<B, 2>::from_data(TensorData::new(input(9, 11, 5), [9, 11]), &device)
        .require_grad();
    let y = leaky_relu(x.clone(), 0.2);
    let grads = (y.clone() * 3.0 + y.powf_scalar(2.0)).sum().backward();
    let ours = values(x.grad(&grads).unwrap());
    let y = activation::leaky_relu(x.clone(), 0.2);
    let grads = (y.clone() * 3.0 + y.powf_scalar(2.0)).sum().backward();
    let burns = values(x.grad(&grads).unwrap());
    for (o, b) in ours.iter().zip(&burns) {
        assert!((o - b).abs() <= 1e-6 * b.abs().max(1.0), "{o} against {b}");
    }
    // Without autodiff the kernel is the inner backend's.
    let plain = Tensor::<Flex, 2>::from_data(TensorData::new(input(9, 11, 5), [9, 11]), &device);
    assert_eq!(
        values(leaky_relu(plain.clone(), 0.2)),
        values(activation::leaky_relu(plain, 0.2))
    );
}
