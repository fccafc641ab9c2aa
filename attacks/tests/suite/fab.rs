//! FAB against what is known by brute force or in closed form: its box-constrained projections
//! onto a hyperplane (L2 against an enumeration of every active set, L∞ against a bisection on
//! the reachable range), and the minimal L2 and L∞ perturbations of binary and ten-class linear
//! models (found within 1 %, never below; through `MinimumNorm` broken at 1.02× the minimum,
//! never at 0.98×). Misclassified inputs are not attacked, costs are counted, a seed repeats.

use crate::common;

use burn::tensor::Tensor;
use common::{batch, cases, image, label, labels, B, D, I};
use jem_attacks::{
    hyperplane_step_l2, hyperplane_step_linf, Attack, Describe, FabConfig, LinearClassifier,
    MinimumNorm, Model, Norm, Undefended,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type M = common::Linear;

fn dot(w: &[f32], v: &[f32]) -> f64 {
    w.iter().zip(v).map(|(&a, &b)| a as f64 * b as f64).sum()
}

fn within_box(delta: &[f32], lb: &[f32], ub: &[f32]) -> bool {
    (0..delta.len()).all(|d| delta[d] >= lb[d] - 1e-6 && delta[d] <= ub[d] + 1e-6)
}

/// A random projection problem: w with some zeros, a point x in [0, 1] with some pixels at
/// 0 or 1 (lb = −x, ub = 1 − x), and c a random fraction in (−1.3, 1.3) of what the box can
/// reach in its direction (|fraction| > 1: infeasible).
fn problem(rng: &mut StdRng, dim: usize) -> (Vec<f32>, f32, Vec<f32>, Vec<f32>) {
    let w: Vec<f32> = (0..dim)
        .map(|_| {
            if rng.random_bool(0.2) {
                0.0
            } else {
                rng.random_range(-1.0..1.0)
            }
        })
        .collect();
    let x: Vec<f32> = (0..dim)
        .map(|_| match rng.random_range(0..10) {
            0 => 0.0,
            1 => 1.0,
            _ => rng.random_range(0.0..1.0),
        })
        .collect();
    let lb: Vec<f32> = x.iter().map(|v| -v).collect();
    let ub: Vec<f32> = x.iter().map(|v| 1.0 - v).collect();
    let (lo, hi) = reach(&w, &lb, &ub);
    let r: f64 = rng.random_range(-1.3..1.3);
    let c = if r >= 0.0 { r * hi } else { -r * lo } as f32;
    (w, c, lb, ub)
}

/// The least and the largest w·δ over the box.
fn reach(w: &[f32], lb: &[f32], ub: &[f32]) -> (f64, f64) {
    let mut out = (0.0, 0.0);
    for d in 0..w.len() {
        let (a, b) = (w[d] as f64 * lb[d] as f64, w[d] as f64 * ub[d] as f64);
        out.0 += a.min(b);
        out.1 += a.max(b);
    }
    out
}

/// Where the box gets closest to an unreachable hyperplane: the corner in c's direction.
fn corner(w: &[f32], c: f32, lb: &[f32], ub: &[f32]) -> Vec<f32> {
    (0..w.len())
        .map(|d| match (w[d] * c.signum()).partial_cmp(&0.0) {
            Some(std::cmp::Ordering::Greater) => ub[d],
            Some(std::cmp::Ordering::Less) => lb[d],
            _ => 0.0,
        })
        .collect()
}

/// The least-L2 δ with w·δ = c in the box by brute force: every coordinate is free, at its
/// lower or at its upper bound; the free ones take λ w (the stationarity condition), λ set by
/// the equality; the best feasible assignment wins. `None` when nothing is feasible.
fn brute_l2(w: &[f32], c: f32, lb: &[f32], ub: &[f32]) -> Option<Vec<f64>> {
    let dim = w.len();
    let mut best: Option<(f64, Vec<f64>)> = None;
    for code in 0..3usize.pow(dim as u32) {
        let state: Vec<usize> = (0..dim).map(|d| code / 3usize.pow(d as u32) % 3).collect();
        let mut delta = vec![0.0f64; dim];
        let (mut fixed, mut free) = (0.0f64, 0.0f64);
        for d in 0..dim {
            match state[d] {
                1 => delta[d] = lb[d] as f64,
                2 => delta[d] = ub[d] as f64,
                _ => free += (w[d] as f64).powi(2),
            }
            if state[d] != 0 {
                fixed += w[d] as f64 * delta[d];
            }
        }
        if free == 0.0 {
            if (fixed - c as f64).abs() > 1e-9 {
                continue;
            }
        } else {
            let lambda = (c as f64 - fixed) / free;
            for d in (0..dim).filter(|&d| state[d] == 0) {
                delta[d] = lambda * w[d] as f64;
            }
        }
        if (0..dim).any(|d| delta[d] < lb[d] as f64 - 1e-9 || delta[d] > ub[d] as f64 + 1e-9) {
            continue;
        }
        let size: f64 = delta.iter().map(|v| v * v).sum();
        if best.as_ref().is_none_or(|(s, _)| size < *s) {
            best = Some((size, delta));
        }
    }
    best.map(|(_, delta)| delta)
}

#[test]
fn l2_projection_matches_brute_force_over_active_sets() {
    let mut rng = StdRng::seed_from_u64(1);
    let (mut infeasible, mut clipped) = (0, 0);
    for trial in 0..3000 {
        let (w, c, lb, ub) = problem(&mut rng, 1 + trial % 7);
        let delta = hyperplane_step_l2(&w, c, &lb, &ub);
        assert!(within_box(&delta, &lb, &ub), "{delta:?} outside the box");
        match brute_l2(&w, c, &lb, &ub) {
            Some(expected) => {
                assert!(
                    (dot(&w, &delta) - c as f64).abs() < 1e-5,
                    "w·δ = {} ≠ c = {c}",
                    dot(&w, &delta)
                );
                for d in 0..w.len() {
                    assert!(
                        (delta[d] as f64 - expected[d]).abs() < 1e-5,
                        "w {w:?} c {c} lb {lb:?} ub {ub:?}: {delta:?} vs brute force {expected:?}"
                    );
                }
                clipped += usize::from(
                    (0..w.len()).any(|d| w[d] != 0.0 && (delta[d] == lb[d] || delta[d] == ub[d])),
                );
            }
            None => {
                infeasible += 1;
                assert_eq!(delta, corner(&w, c, &lb, &ub), "as far as the box allows");
            }
        }
    }
    assert!(
        infeasible > 100 && clipped > 500,
        "both infeasible ({infeasible}) and box-bound ({clipped}) problems were drawn"
    );
}

#[test]
fn linf_projection_matches_a_bisection_on_the_reachable_range() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut infeasible = 0;
    for trial in 0..3000 {
        let (w, c, lb, ub) = problem(&mut rng, 1 + trial % 40);
        let delta = hyperplane_step_linf(&w, c, &lb, &ub);
        assert!(within_box(&delta, &lb, &ub), "{delta:?} outside the box");
        // The smallest t whose cube ∩ box reaches c: checked coordinate by coordinate,
        // in both directions, with no sorting.
        let reachable = |t: f64| {
            let (mut lo, mut hi) = (0.0f64, 0.0f64);
            for d in 0..w.len() {
                let a = w[d] as f64 * (lb[d] as f64).max(-t);
                let b = w[d] as f64 * (ub[d] as f64).min(t);
                lo += a.min(b);
                hi += a.max(b);
            }
            lo <= c as f64 && c as f64 <= hi
        };
        if !reachable(1.0) {
            infeasible += 1;
            assert_eq!(delta, corner(&w, c, &lb, &ub), "as far as the box allows");
            continue;
        }
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if reachable(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let size = delta.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
        assert!(
            (size - hi).abs() < 1e-5,
            "w {w:?} c {c}: ‖δ‖∞ = {size}, least {hi}"
        );
        assert!((dot(&w, &delta) - c as f64).abs() < 1e-5);
    }
    assert!(
        infeasible > 100,
        "infeasible problems were drawn: {infeasible}"
    );
}

#[test]
fn projections_have_closed_forms() {
    // Inactive box: c w / ‖w‖₂² and c sign(w) / ‖w‖₁.
    let w = [0.5f32, -1.0, 0.25, 0.0, 2.0];
    let (lb, ub) = ([-0.5f32; 5], [0.5f32; 5]);
    let c = -0.3f32;
    let l2: f32 = w.iter().map(|v| v * v).sum();
    let l1: f32 = w.iter().map(|v| v.abs()).sum();
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
    let expected: Vec<f32> = w.iter().map(|v| c * v / l2).collect();
    assert!(close(&hyperplane_step_l2(&w, c, &lb, &ub), &expected));
    let expected: Vec<f32> = w
        .iter()
        .map(|&v| if v == 0.0 { 0.0 } else { c * v.signum() / l1 })
        .collect();
    assert!(close(&hyperplane_step_linf(&w, c, &lb, &ub), &expected));

    // By hand: w = (1, −2, 0) at x = (0.5, 0.25, 0.3). To reach w·δ = 0.9 the second pixel
    // hits 0 (δ = −0.25) for both norms and the first makes up the rest: δ = (0.4, −0.25, 0).
    let w = [1.0f32, -2.0, 0.0];
    let (lb, ub) = ([-0.5f32, -0.25, -0.3], [0.5f32, 0.75, 0.7]);
    for step in [hyperplane_step_l2, hyperplane_step_linf] {
        assert!(close(&step(&w, 0.9, &lb, &ub), &[0.4, -0.25, 0.0]));
        // Out of reach (the box reaches w·δ ∈ [−2, 1]): as far as the box allows.
        assert_eq!(step(&w, 10.0, &lb, &ub), [0.5, -0.25, 0.0]);
        assert_eq!(step(&w, -10.0, &lb, &ub), [-0.5, 0.75, 0.0]);
        // Already on the hyperplane, or no direction at all: no step.
        assert_eq!(step(&w, 0.0, &lb, &ub), [0.0; 3]);
        assert_eq!(step(&[0.0; 3], 0.5, &lb, &ub), [0.0; 3]);
    }
}

fn linear(w: &[f32], b: &[f32]) -> M {
    Undefended::new(LinearClassifier::<B>::new(
        w.to_vec(),
        b.to_vec(),
        b.len(),
        &Default::default(),
    ))
}

/// A linear problem with its closed-form minimal perturbations (the box inactive there).
struct Problem {
    w: Vec<f32>,
    b: Vec<f32>,
    x: Vec<f32>,
    y: i64,
    min_l2: f32,
    min_linf: f32,
}

impl Problem {
    fn min(&self, norm: Norm) -> f32 {
        match norm {
            Norm::Linf => self.min_linf,
            Norm::L2 => self.min_l2,
        }
    }
}

/// Ten classes: label `y` leads every other class j by a margin m_j in [0.1, 0.5]; an input is
/// misclassified exactly when some z_j exceeds z_y, so the minimal perturbation is
/// min_j m_j / ‖w_y − w_j‖ (dual norm: L2 for L2, L1 for L∞).
fn ten_classes(seed: u64) -> Problem {
    let mut rng = StdRng::seed_from_u64(seed);
    let k = 10;
    let w: Vec<f32> = (0..k * D).map(|_| rng.random_range(-1.0..1.0)).collect();
    let x: Vec<f32> = (0..D).map(|_| rng.random_range(0.4..0.6)).collect();
    let y = rng.random_range(0..k);
    let z = |j: usize| (0..D).map(|d| w[j * D + d] * x[d]).sum::<f32>();
    let margins: Vec<f32> = (0..k).map(|_| rng.random_range(0.1..0.5)).collect();
    let b: Vec<f32> = (0..k)
        .map(|j| if j == y { -z(j) } else { -z(j) - margins[j] })
        .collect();
    let (mut min_l2, mut min_linf) = (f32::INFINITY, f32::INFINITY);
    for j in (0..k).filter(|&j| j != y) {
        let diff: Vec<f32> = (0..D).map(|d| w[y * D + d] - w[j * D + d]).collect();
        let l2 = diff.iter().map(|v| v * v).sum::<f32>().sqrt();
        let l1 = diff.iter().map(|v| v.abs()).sum::<f32>();
        min_l2 = min_l2.min(margins[j] / l2);
        min_linf = min_linf.min(margins[j] / l1);
    }
    // Every pixel moves by at most the minimal L2 size: the box is far.
    assert!(min_l2 < 0.4, "the box constrains this problem");
    Problem {
        w,
        b,
        x,
        y: y as i64,
        min_l2,
        min_linf,
    }
}

/// Where FAB lands on a linear model whose box is inactive, as a multiple of the minimal
/// distance: every step moves along the one optimal direction, so the walk is a scalar
/// recursion. Step 1 (x_i = x₀, δ₁ = δ₂, α = α_max) overshoots to η; the backward step leaves
/// βη; step 2 has ‖δ₁‖ = 1 − βη, ‖δ₂‖ = 1, α = (1 − βη) / (2 − βη) and lands at
/// (1 − α)(βη + η(1 − βη)) + αη ≈ 1.00522, the closest point of the walk (later steps settle
/// near 1.0087).
fn fab_on_a_linear_model() -> f64 {
    let (eta, beta) = (1.05f64, 0.9f64);
    let back = beta * eta;
    let alpha = (1.0 - back) / (2.0 - back);
    (1.0 - alpha) * (back + eta * (1.0 - back)) + alpha * eta
}

/// Runs `cfg` on one problem: adversarial, re-checked here, in the box, within
/// [0.999, 1.01] of the minimum, and where the published update puts it.
fn check_minimal(cfg: &FabConfig, p: &Problem) {
    let model = linear(&p.w, &p.b);
    let out = cfg.run::<B, _>(&model, image(&p.x), label(p.y));
    let e = &out.examples[0];
    assert!(e.clean_correct && e.adversarial, "{} {e:?}", cfg.name());
    assert!(out.inputs.iter().all(|v| (0.0..=1.0).contains(v)));
    let z: Vec<f32> = Model::<B>::logits(&model, image(&out.inputs), &mut StdRng::seed_from_u64(0))
        .into_data()
        .to_vec()
        .unwrap();
    let top = (0..z.len()).max_by(|&a, &b| z[a].total_cmp(&z[b])).unwrap();
    assert_ne!(top as i64, p.y, "returned input not misclassified: {z:?}");
    let ratio = e.distance(cfg.norm) / p.min(cfg.norm);
    eprintln!(
        "{} {}: {} / minimum {} = {ratio:.5}",
        cfg.name(),
        cfg.norm,
        e.distance(cfg.norm),
        p.min(cfg.norm)
    );
    assert!(
        (0.999..=1.01).contains(&ratio),
        "{} {}: distance {} vs minimum {} ({ratio})",
        cfg.name(),
        cfg.norm,
        e.distance(cfg.norm),
        p.min(cfg.norm)
    );
    assert!(
        (ratio as f64 - fab_on_a_linear_model()).abs() < 2e-4,
        "{} {}: {ratio} is not FAB's {}",
        cfg.name(),
        cfg.norm,
        fab_on_a_linear_model()
    );
}

#[test]
fn fab_finds_the_minimal_perturbation_of_binary_linear_models() {
    for norm in [Norm::Linf, Norm::L2] {
        for targeted in [true, false] {
            let cfg = FabConfig {
                targeted,
                ..FabConfig::new(norm)
            };
            for c in cases(4) {
                let p = Problem {
                    w: c.w,
                    b: c.b,
                    x: c.x,
                    y: c.y,
                    min_l2: c.min_l2,
                    min_linf: c.min_linf,
                };
                check_minimal(&cfg, &p);
            }
        }
    }
}

#[test]
fn fab_finds_the_minimal_perturbation_of_ten_class_linear_models() {
    for norm in [Norm::Linf, Norm::L2] {
        for targeted in [true, false] {
            let cfg = FabConfig {
                targeted,
                ..FabConfig::new(norm)
            };
            for seed in 0..3 {
                check_minimal(&cfg, &ten_classes(seed));
            }
        }
    }
}

#[test]
fn minimum_norm_fab_is_broken_at_1_02_and_never_at_0_98_of_the_minimum() {
    let b = batch();
    for norm in [Norm::Linf, Norm::L2] {
        let attack = MinimumNorm {
            attack: FabConfig::new(norm),
            norm,
        };
        assert_eq!(attack.name(), "fab-t");
        assert_eq!(attack.settings()["alpha_max"].as_f64(), Some(0.1f32 as f64));
        let min = match norm {
            Norm::Linf => &b.min_linf,
            Norm::L2 => &b.min_l2,
        };
        let eps: Vec<f32> = (0..8)
            .filter(|&i| b.margin[i] > 0.0)
            .flat_map(|i| [0.98 * min[i], 1.02 * min[i]])
            .collect();
        let out =
            Attack::<B, M>::attack(&attack, &b.model, image(&b.x), labels(8), &eps).expect("runs");
        for (j, &e) in eps.iter().enumerate() {
            for (i, (ex, &m)) in out[j].examples.iter().zip(min).enumerate() {
                assert_eq!(ex.clean_correct, b.margin[i] > 0.0, "{ex:?}");
                if !ex.clean_correct {
                    assert!(!ex.adversarial);
                    continue;
                }
                if e <= 0.98 * m {
                    assert!(!ex.adversarial, "{norm} ε {e} < minimum {m}");
                    assert_eq!(out[j].inputs[i * D..(i + 1) * D], b.x[i * D..(i + 1) * D]);
                }
                if e >= 1.02 * m {
                    assert!(ex.adversarial, "{norm} ε {e} ≥ 1.02 × minimum {m}");
                    assert!(ex.distance(norm) <= e * (1.0 + 1e-5) + 1e-7);
                }
            }
        }
    }
}

#[test]
fn misclassified_inputs_are_not_attacked_costs_are_counted_and_a_seed_repeats() {
    let b = batch();
    for targeted in [true, false] {
        let cfg = FabConfig {
            targeted,
            iterations: 20,
            restarts: 2,
            eot: 2,
            seed: 7,
            ..FabConfig::new(Norm::L2)
        };
        let once = cfg.run::<B, _>(&b.model, image(&b.x), labels(8));
        let again = cfg.run::<B, _>(&b.model, image(&b.x), labels(8));
        assert_eq!(once.examples, again.examples);
        assert_eq!(once.inputs, again.inputs);
        let settings = serde_json::to_value(&cfg).unwrap();
        assert_eq!(serde_json::from_value::<FabConfig>(settings).unwrap(), cfg);
        for (i, e) in once.examples.iter().enumerate() {
            if b.margin[i] < 0.0 {
                assert!(!e.clean_correct && !e.adversarial, "{e:?}");
                assert_eq!((e.gradient_evals, e.forward_evals), (0, 1));
                assert_eq!(once.inputs[i * D..(i + 1) * D], b.x[i * D..(i + 1) * D]);
                continue;
            }
            // Two classes: one target (or one other class); 2 runs of 20 steps of 2 draws;
            // a judgement per step, the clean pass and the final re-check.
            assert!(e.clean_correct && e.adversarial, "{e:?}");
            assert_eq!(e.gradient_evals, 2 * 20 * 2, "{e:?}");
            assert_eq!(e.forward_evals, 1 + 2 * 20 + 1, "{e:?}");
            assert!(e.l2 >= 0.999 * b.min_l2[i]);
        }
    }
    // Ten classes, untargeted: a gradient per other class per step.
    let p = ten_classes(0);
    let cfg = FabConfig {
        targeted: false,
        iterations: 10,
        ..FabConfig::new(Norm::Linf)
    };
    let out = cfg.run::<B, _>(&linear(&p.w, &p.b), image(&p.x), label(p.y));
    assert_eq!(out.examples[0].gradient_evals, 9 * 10);
    assert_eq!(cfg.name(), "fab");
}

/// A linear model behind a little logit noise: stochastic, so candidates are judged on the
/// mean of several passes. The noise is kept well below the margin FAB's overshoot leaves
/// (about 0.5 % of the clean margin): the closest adversarial sits that near the boundary, and
/// a louder noise would flip the single-pass re-check.
struct Noisy(M);

impl Model<B> for Noisy {
    fn logits(&self, x: Tensor<I, 4>, rng: &mut StdRng) -> Tensor<I, 2> {
        let z = Model::<B>::logits(&self.0, x, rng);
        let noise = jem_attacks::noise::gaussian::<I, 2>(z.dims(), rng, &Default::default());
        z + noise * 1e-5
    }
    fn loss_gradient(
        &self,
        x: Tensor<I, 4>,
        loss: jem_attacks::LossFn<'_, B>,
        rng: &mut StdRng,
    ) -> (Tensor<I, 4>, Tensor<I, 2>) {
        Model::<B>::loss_gradient(&self.0, x, loss, rng)
    }
    fn is_stochastic(&self) -> bool {
        true
    }
    fn describe(&self) -> String {
        "noisy linear".into()
    }
}

#[test]
fn a_stochastic_model_is_judged_on_several_passes_and_gradients_are_averaged() {
    let c = &cases(1)[0];
    let model = Noisy(linear(&c.w, &c.b));
    let cfg = FabConfig {
        iterations: 30,
        eot: 3,
        passes: 4,
        ..FabConfig::new(Norm::Linf)
    };
    let out = cfg.run::<B, _>(&model, image(&c.x), label(c.y));
    let e = &out.examples[0];
    assert!(e.clean_correct && e.adversarial, "{e:?}");
    // One target (two classes), 30 steps: 3 draws and 4 passes each, the clean pass and the
    // re-check.
    assert_eq!(e.gradient_evals, 30 * 3);
    assert_eq!(e.forward_evals, 1 + 30 * 4 + 1);
    let ratio = e.linf / c.min_linf;
    assert!((0.99..1.02).contains(&ratio), "{e:?} vs {}", c.min_linf);
}
