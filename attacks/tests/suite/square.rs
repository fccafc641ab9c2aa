//! The Square attack (score-based, no gradients) against a linear classifier, whose minimal L∞
//! and L2 perturbations are known in closed form; its window schedule against the published
//! one; and, on random inputs of many shapes, its promises: within ε, within [0, 1], repeatable.

use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{AttackOutcome, LinearClassifier, Norm, SquareConfig, Undefended};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common;
use common::{cases, image, label, Case, B, D, I};

fn linear(c: &Case) -> Undefended<LinearClassifier<B>> {
    Undefended::new(LinearClassifier::<B>::new(
        c.w.clone(),
        c.b.clone(),
        2,
        &Default::default(),
    ))
}

#[test]
fn window_fraction_follows_the_published_schedule() {
    let mut cfg = SquareConfig::new(Norm::Linf);
    cfg.queries = 10_000;
    let p = |q| cfg.window_fraction(q);
    assert_eq!(
        (p(1), p(10), p(11), p(50), p(51)),
        (0.8, 0.8, 0.4, 0.4, 0.2)
    );
    assert_eq!((p(8000), p(8001)), (0.8 / 256.0, 0.8 / 512.0));
    // Rescaled to a budget of 1 000: the first halving after query 1.
    cfg.queries = 1000;
    assert_eq!((cfg.window_fraction(1), cfg.window_fraction(2)), (0.8, 0.4));
}

#[test]
fn l2_windows_are_odd_from_3_up_and_fit_in_the_image() {
    let cfg = SquareConfig::new(Norm::L2);
    // MNIST: √(0.8·784) ≈ 25 at first, the floor of 3 at the end (0.8/512·784 ≈ 1.2 pixels).
    assert_eq!(
        (cfg.window_side(1, 28, 28), cfg.window_side(4999, 28, 28)),
        (25, 3)
    );
    // CIFAR: √(0.8·1024) ≈ 28.6 rounds to 29.
    assert_eq!(cfg.window_side(1, 32, 32), 29);
    // 4 × 4: √12.8 ≈ 3.6 rounds to 4, made odd (5), then cut to the image.
    assert_eq!(
        (cfg.window_side(1, 4, 4), cfg.window_side(100, 4, 4)),
        (4, 3)
    );
    for (h, w) in [(1, 1), (1, 5), (2, 3), (4, 4), (5, 7), (28, 28), (32, 32)] {
        for q in 1..5000 {
            let s = cfg.window_side(q, h, w);
            assert!(s >= 1 && s <= h.min(w), "{h}×{w} query {q}: {s}");
            assert!(
                s == h.min(w) || (s >= 3 && s % 2 == 1),
                "{h}×{w} query {q}: {s}"
            );
        }
    }
}

#[test]
fn square_finds_the_minimal_linf_perturbation_of_a_linear_model() {
    let cfg = SquareConfig::new(Norm::Linf);
    for c in cases(6) {
        let model = linear(&c);
        let run = |eps: f32| {
            let out = cfg
                .run::<B, _>(&model, image(&c.x), label(c.y), eps)
                .unwrap();
            let e = &out.examples[0];
            assert!(e.clean_correct && e.linf <= eps * 1.0001 + 1e-6, "{e:?}");
            assert!(e.gradient_evals == 0, "a black box takes no gradients");
            e.adversarial
        };
        assert!(run(1.02 * c.min_linf), "just above {}", c.min_linf);
        assert!(!run(0.98 * c.min_linf), "just below {}", c.min_linf);
    }
}

/// L2 Square with AutoAttack's 5 000 queries does not get within 2 % of the minimal L2
/// perturbation of these 16-pixel problems: each of its moves turns a whole window (at least
/// 3 × 3, so 9 of the 16 pixels) by some 45°, too coarse a step to approach a continuous
/// optimum, and the search stalls (ten times the queries: median 1.44× instead of 1.47× on
/// 12 problems × 3 seeds). What it reaches is measured here: the run at 0.98× the minimum must
/// fail and stay within ε, and the length of its perturbation along the optimal direction,
/// −(w₀ − w₁)/‖w₀ − w₁‖, says at which multiple of the minimum the same search would break the
/// model (the margin is linear and the search scale-free while the box is not reached).
/// Measured: 1.35–2.43× on these six problems (median 1.59×); over 40 problems × 5 seeds,
/// median 1.42×, 90 % within 1.75×, all within 2.43×. Asserted: at most 2.75× each, 1.8× in
/// the median, and a break at 2.75× the minimum.
#[test]
fn square_l2_fails_below_the_minimal_l2_perturbation_and_breaks_within_the_factor_it_reaches() {
    const REACHED: f32 = 2.75;
    let cfg = SquareConfig::new(Norm::L2);
    let mut factors = Vec::new();
    for c in cases(6) {
        let model = linear(&c);
        let run = |eps: f32| {
            let out = cfg
                .run::<B, _>(&model, image(&c.x), label(c.y), eps)
                .unwrap();
            let e = out.examples[0].clone();
            assert!(e.clean_correct && e.l2 <= eps * 1.0001, "{e:?}");
            assert!(e.gradient_evals == 0, "a black box takes no gradients");
            (e.adversarial, out.inputs)
        };
        let eps = 0.98 * c.min_l2;
        let (adversarial, inputs) = run(eps);
        assert!(!adversarial, "below the minimum {}", c.min_l2);
        let diff: Vec<f32> = (0..D).map(|d| c.w[d] - c.w[D + d]).collect();
        let norm = diff.iter().map(|v| v * v).sum::<f32>().sqrt();
        let along: f32 = (0..D).map(|d| -(inputs[d] - c.x[d]) * diff[d]).sum::<f32>() / norm;
        factors.push(eps / along);
        assert!(
            run(REACHED * c.min_l2).0,
            "{REACHED}× the minimum {}",
            c.min_l2
        );
    }
    let mut sorted = factors.clone();
    sorted.sort_by(f32::total_cmp);
    assert!(
        sorted[5] <= REACHED && sorted[2] <= 1.8,
        "reached factors {factors:?}"
    );
}

/// Random inputs of many shapes (1 × 1 to CIFAR's), random linear models, radii from 0 to far
/// beyond the box: every returned input lies in [0, 1] and within ε of the clean one, inputs
/// the model gets wrong come back untouched, and a second run with the same seed repeats the
/// first exactly.
#[test]
fn square_stays_in_the_ball_and_the_box_and_repeats_with_its_seed() {
    let mut rng = StdRng::seed_from_u64(11);
    let shapes = [
        [3, 1, 1, 1],
        [3, 2, 1, 4],
        [4, 1, 2, 3],
        [4, 1, 4, 4],
        [3, 3, 5, 7],
        [3, 2, 9, 6],
        [2, 1, 28, 28],
        [2, 3, 32, 32],
    ];
    for (trial, dims) in shapes.into_iter().enumerate() {
        let [n, ch, h, w] = dims;
        let len = ch * h * w;
        let k = rng.random_range(2..6);
        let weight: Vec<f32> = (0..k * len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let bias: Vec<f32> = (0..k).map(|_| rng.random_range(-0.5..0.5)).collect();
        // Some pixels at the edges of the box, where clipping bites.
        let x: Vec<f32> = (0..n * len)
            .map(|_| match rng.random_range(0..8) {
                0 => 0.0,
                1 => 1.0,
                _ => rng.random_range(0.0..1.0),
            })
            .collect();
        let y: Vec<i64> = (0..n).map(|_| rng.random_range(0..k as i64)).collect();
        let model = Undefended::new(LinearClassifier::<B>::new(
            weight,
            bias,
            k,
            &Default::default(),
        ));
        for norm in [Norm::L2, Norm::Linf] {
            for eps in [0.0, 0.03, 0.5, 4.0, 100.0] {
                let mut cfg = SquareConfig::new(norm);
                cfg.queries = 200;
                cfg.seed = trial as u64;
                let run = || -> AttackOutcome {
                    let xs = Tensor::<I, 4>::from_data(
                        TensorData::new(x.clone(), dims),
                        &Default::default(),
                    );
                    let ys = Tensor::<I, 1, Int>::from_data(
                        TensorData::new(y.clone(), [n]),
                        &Default::default(),
                    );
                    cfg.run::<B, _>(&model, xs, ys, eps).unwrap()
                };
                let out = run();
                let at = format!("{norm} {dims:?} ε = {eps}");
                for (i, e) in out.examples.iter().enumerate() {
                    let adv = &out.inputs[i * len..(i + 1) * len];
                    let clean = &x[i * len..(i + 1) * len];
                    assert!(adv.iter().all(|v| (0.0..=1.0).contains(v)), "{at}: box");
                    let d: Vec<f64> = adv.iter().zip(clean).map(|(a, b)| (a - b) as f64).collect();
                    let (l2, linf) = (
                        d.iter().map(|v| v * v).sum::<f64>().sqrt(),
                        d.iter().fold(0.0f64, |m, v| m.max(v.abs())),
                    );
                    let size = if norm == Norm::L2 { l2 } else { linf };
                    assert!(size <= eps as f64 * 1.0001 + 1e-7, "{at}: {size} {e:?}");
                    assert!(e.distance(norm) <= eps * 1.0001 + 1e-7, "{at}: {e:?}");
                    if !e.clean_correct {
                        assert!(adv == clean, "{at}: misclassified inputs are not attacked");
                    }
                }
                let again = run();
                assert!(
                    again.inputs == out.inputs && again.examples == out.examples,
                    "{at}: the same seed repeats"
                );
            }
        }
    }
}
