//! The SGLD sampler against a linear model, whose LogSumExp gradient is analytic:
//! ∇ₓ LSE(Wx + b) = Wᵀ softmax(Wx + b), and ∇ₓ f(x)[y] = W_y.

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{LinearClassifier, SgldConfig, SgldSampler, SgldTarget, UniformInit};
use rand::{Rng, SeedableRng};

type I = Flex;
type B = Autodiff<Flex>;

const K: usize = 3;
const D: usize = 4; // images are 1 × 2 × 2

fn linear(w: &[f32], b: &[f32]) -> LinearClassifier<B> {
    LinearClassifier::new(w.to_vec(), b.to_vec(), K, &Default::default())
}

fn sampler(steps: usize, step_size: f32, noise: f32, scale: f32) -> SgldSampler {
    SgldSampler::new(SgldConfig {
        steps,
        step_size,
        noise,
        pixel_scale: vec![scale],
        clamp: false,
    })
}

fn images(v: Vec<f32>) -> Tensor<I, 4> {
    let n = v.len() / D;
    Tensor::from_data(TensorData::new(v, [n, 1, 2, 2]), &Default::default())
}

fn values(t: Tensor<I, 4>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

fn random(n: usize, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

#[test]
fn drift_matches_the_analytic_gradient() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (w, b) = (random(K * D, &mut rng), random(K, &mut rng));
    let model = linear(&w, &b).no_grad();
    let n = 5;
    let x0 = random(n * D, &mut rng);
    let (alpha, s) = (0.7, 0.5);
    let sgld = sampler(1, alpha, 0.0, s);

    let got = values(sgld.run::<B, _>(&model, images(x0.clone()), &SgldTarget::Marginal, &mut rng));
    let labels = [2i64, 0, 1, 1, 2];
    let y =
        Tensor::<I, 1, Int>::from_data(TensorData::new(labels.to_vec(), [n]), &Default::default());
    let got_class =
        values(sgld.run::<B, _>(&model, images(x0.clone()), &SgldTarget::Class(y), &mut rng));

    for i in 0..n {
        let x = &x0[i * D..(i + 1) * D];
        let logits: Vec<f32> = (0..K)
            .map(|k| b[k] + (0..D).map(|d| w[k * D + d] * x[d]).sum::<f32>())
            .collect();
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        let p: Vec<f32> = logits.iter().map(|l| (l - max).exp() / z).collect();
        for d in 0..D {
            let grad: f32 = (0..K).map(|k| w[k * D + d] * p[k]).sum();
            let want = x[d] + alpha * s * s * grad;
            assert!((got[i * D + d] - want).abs() < 1e-5, "marginal {i},{d}");
            let want = x[d] + alpha * s * s * w[labels[i] as usize * D + d];
            assert!((got_class[i * D + d] - want).abs() < 1e-5, "class {i},{d}");
        }
    }
}

#[test]
fn noise_has_the_requested_variance_and_is_seeded() {
    // With a constant energy the chain is a pure random walk: after K steps each pixel moved
    // by N(0, K (σ s)²).
    let model = linear(&[0.0; K * D], &[0.0; K]).no_grad();
    let (steps, sigma, s) = (4, 0.1, 0.5);
    let sgld = sampler(steps, 1.0, sigma, s);
    let n = 5000;
    let x0 = vec![0.5f32; n * D];
    let run = |seed| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        values(sgld.run::<B, _>(&model, images(x0.clone()), &SgldTarget::Marginal, &mut rng))
    };
    let x = run(9);
    let moved: Vec<f64> = x.iter().map(|&v| (v - 0.5) as f64).collect();
    let m = moved.iter().sum::<f64>() / moved.len() as f64;
    let var = moved.iter().map(|v| (v - m).powi(2)).sum::<f64>() / moved.len() as f64;
    let want = steps as f64 * (sigma as f64 * s as f64).powi(2);
    assert!(m.abs() < 0.003, "mean displacement {m}");
    assert!(
        (var / want - 1.0).abs() < 0.03,
        "variance {var}, want {want}"
    );
    assert_eq!(x, run(9), "same seed, same chain");
    assert_ne!(x, run(10), "another seed, another chain");
}

#[test]
fn clamping_and_uniform_initialisation_stay_in_range() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let (w, b) = (random(K * D, &mut rng), random(K, &mut rng));
    let model = linear(&w, &b).no_grad();
    let mut sgld = sampler(10, 5.0, 0.5, 0.5);
    sgld.config.clamp = true;
    let init = UniformInit {
        mean: vec![0.5],
        scale: vec![0.5],
    };
    let x0 = init.batch::<I>([400, 1, 2, 2], &mut rng, &Default::default());
    let init = values(x0.clone());
    assert!(init.iter().all(|&v| (0.0..=1.0).contains(&v)));
    // U(−1, 1) on the network scale is U(0, 1) in pixels here: mean 1/2, variance 1/12.
    let mean = init.iter().sum::<f32>() / init.len() as f32;
    let var = init.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / init.len() as f32;
    assert!(
        (mean - 0.5).abs() < 0.02 && (var - 1.0 / 12.0).abs() < 0.005,
        "{mean} {var}"
    );
    let x = values(sgld.run::<B, _>(&model, x0, &SgldTarget::Marginal, &mut rng));
    assert!(x.iter().all(|&v| (0.0..=1.0).contains(&v)));
}
