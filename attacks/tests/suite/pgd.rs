//! PGD and FGSM against cases with known answers, and the `full` gradient through SGLD steps
//! against finite differences of the whole defended model.
//!
//! A binary linear classifier f(x) = Wx + b has minimal adversarial perturbations in closed
//! form: |margin| / ‖w₀ − w₁‖₂ under L2 and |margin| / ‖w₀ − w₁‖₁ under L∞ (when the [0, 1]
//! box does not bind, which the inputs here ensure).

use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::Tensor;
use jem_attacks::{
    input_gradient, kl_divergence, log_sum_exp, log_sum_exp_hessian_vector, AttackLoss, Classifier,
    GradMode, HessianVector, LinearClassifier, Model, Norm, PgdConfig, SgldConfig, SgldDefence,
    SgldDefenceConfig, SgldSampler, Undefended,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common;
use common::{cases, image, label, Case, B, D, I};

fn undefended(c: &Case) -> Undefended<LinearClassifier<B>> {
    Undefended::new(LinearClassifier::<B>::new(
        c.w.clone(),
        c.b.clone(),
        2,
        &Default::default(),
    ))
}

fn attack_succeeds(cfg: &PgdConfig, c: &Case, eps: f32) -> bool {
    let model = undefended(c);
    let out = cfg.run::<B, _>(&model, image(&c.x), label(c.y), eps);
    let e = &out.examples[0];
    assert!(e.clean_correct);
    // Inside the ball and the box, whatever the outcome.
    assert!(
        e.distance(cfg.norm) <= eps * 1.0001 + 1e-6,
        "{e:?} at {eps}"
    );
    assert!(out.inputs.iter().all(|v| (0.0..=1.0).contains(v)));
    // The success flag agrees with re-classification of the returned input.
    let mut rng = StdRng::seed_from_u64(0);
    let logits: Vec<f32> = Model::<B>::logits(&model, image(&out.inputs), &mut rng)
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(e.adversarial, logits[1] > logits[0], "{e:?} {logits:?}");
    e.adversarial
}

#[test]
fn pgd_finds_the_minimal_perturbation_of_a_linear_model() {
    for norm in [Norm::Linf, Norm::L2] {
        let mut cfg = PgdConfig::pgd(norm);
        cfg.steps = 100;
        cfg.rel_stepsize = 0.05;
        cfg.loss = AttackLoss::Margin;
        for c in cases(6) {
            let min = match norm {
                Norm::Linf => c.min_linf,
                Norm::L2 => c.min_l2,
            };
            assert!(min < 0.1 * if norm == Norm::Linf { 1.0 } else { 4.0 });
            assert!(
                attack_succeeds(&cfg, &c, 1.02 * min),
                "{norm} just above {min}"
            );
            assert!(
                !attack_succeeds(&cfg, &c, 0.98 * min),
                "{norm} just below {min}"
            );
        }
    }
}

#[test]
fn fgsm_is_optimal_on_a_linear_model_and_stays_in_the_ball() {
    // One step of size ε along sign(∇) (L∞) or ∇/‖∇‖ (L2) is the optimal perturbation of a
    // binary linear model, so FGSM / FGM succeed exactly above the minimum.
    for norm in [Norm::Linf, Norm::L2] {
        let cfg = PgdConfig::fgsm(norm);
        for c in cases(4) {
            let min = match norm {
                Norm::Linf => c.min_linf,
                Norm::L2 => c.min_l2,
            };
            assert!(attack_succeeds(&cfg, &c, 1.02 * min), "{norm}");
            assert!(!attack_succeeds(&cfg, &c, 0.98 * min), "{norm}");
        }
    }
}

#[test]
fn same_seed_same_result_and_clean_errors_are_not_attacked() {
    let c = &cases(1)[0];
    let model = undefended(c);
    let cfg = PgdConfig::pgd(Norm::L2);
    let a = cfg.run::<B, _>(&model, image(&c.x), label(c.y), 0.5 * c.min_l2);
    let b = cfg.run::<B, _>(&model, image(&c.x), label(c.y), 0.5 * c.min_l2);
    assert_eq!(a.inputs, b.inputs);
    assert_eq!(a.examples, b.examples);
    // Labelled with the wrong class: a clean error, not robust at any ε, never attacked.
    let wrong = cfg.run::<B, _>(&model, image(&c.x), label(1), 0.1);
    assert!(!wrong.examples[0].clean_correct && wrong.examples[0].gradient_evals == 0);
    assert_eq!(wrong.robust_accuracy(Norm::L2, 0.0), 0.0);
}

/// A two-layer tanh network: smooth in its input, so the defended map is smooth too.
#[derive(Module, Debug, Clone)]
struct SmoothMlp<Bk: burn::tensor::backend::Backend> {
    hidden: LinearClassifier<Bk>,
    out: LinearClassifier<Bk>,
}

impl<Bk: burn::tensor::backend::Backend> Classifier<Bk> for SmoothMlp<Bk> {
    fn logits(&self, x: Tensor<Bk, 4>) -> Tensor<Bk, 2> {
        let h = self.hidden.logits(x).tanh();
        let [n, k] = h.dims();
        self.out.logits(h.reshape([n, 1, 1, k]))
    }
}

/// The same network with its forward mode written out: tanh(W₁x + b₁) has tangent
/// (1 − tanh²) ⊙ W₁v, and the head is linear. The SGLD defence then forms its Hessian-vector
/// products exactly, by reverse mode over this.
#[derive(Module, Debug, Clone)]
struct SmoothMlpWithTangents<Bk: burn::tensor::backend::Backend> {
    mlp: SmoothMlp<Bk>,
}

impl<Bk: burn::tensor::backend::Backend> Classifier<Bk> for SmoothMlpWithTangents<Bk> {
    fn logits(&self, x: Tensor<Bk, 4>) -> Tensor<Bk, 2> {
        self.mlp.logits(x)
    }

    fn jacobian_vector_product(
        &self,
        x: Tensor<Bk, 4>,
        v: Tensor<Bk, 4>,
    ) -> Option<(Tensor<Bk, 2>, Tensor<Bk, 2>)> {
        let (pre, hidden_jacobian) = self.mlp.hidden.linearise(x)?;
        let h = pre.tanh();
        let dh = (h.clone() * h.clone()).neg().add_scalar(1.0) * hidden_jacobian(v);
        let [n, k] = h.dims();
        let (logits, out_jacobian) = self.mlp.out.linearise(h.reshape([n, 1, 1, k]))?;
        let jv = out_jacobian(dh.reshape([n, 1, 1, k]));
        Some((logits, jv))
    }
}

fn random_linear(
    inputs: usize,
    outputs: usize,
    scale: f32,
    rng: &mut StdRng,
) -> LinearClassifier<B> {
    let w: Vec<f32> = (0..outputs * inputs)
        .map(|_| rng.random_range(-scale..scale))
        .collect();
    let b: Vec<f32> = (0..outputs).map(|_| rng.random_range(-0.5..0.5)).collect();
    LinearClassifier::<B>::new(w, b, outputs, &Default::default())
}

/// K SGLD steps (α = 1, σ = 0.01 on the [−1, 1] scale), 2 chains, data noise, before `f`.
fn defended<M: Classifier<B> + Module<B>>(
    f: M,
    k: usize,
    grad: GradMode,
    hvp: HessianVector,
) -> SgldDefence<M> {
    let sampler = SgldSampler::new(SgldConfig {
        steps: k,
        step_size: 1.0,
        noise: 0.01,
        pixel_scale: vec![0.5],
        clamp: false,
    });
    let cfg = SgldDefenceConfig {
        chains: 2,
        recheck_chains: 8,
        init_noise: 0.03,
        grad,
        hvp,
        hvp_step: 1e-3,
    };
    SgldDefence::new(f, sampler, cfg)
}

/// ⟨∇L, d⟩ from the model's gradient and from central differences of the whole defended map,
/// with the chains' noise held fixed (same seed for every evaluation).
fn directional(model: &impl Model<B>, x: &[f32], y: i64, d: &[f32], h: f32) -> (f64, f64) {
    let loss = |l: Tensor<B, 2>| AttackLoss::CrossEntropy.of(l, Tensor::from_inner(label(y)));
    let (g, _) = model.loss_gradient(image(x), &loss, &mut StdRng::seed_from_u64(5));
    let g: Vec<f32> = g.into_data().to_vec().unwrap();
    let analytic: f64 = g
        .iter()
        .zip(d)
        .map(|(a, b)| (*a as f64) * (*b as f64))
        .sum();
    let at = |s: f32| -> f64 {
        let shifted: Vec<f32> = x.iter().zip(d).map(|(a, b)| a + s * b).collect();
        let logits = model.logits(image(&shifted), &mut StdRng::seed_from_u64(5));
        let l = AttackLoss::CrossEntropy.of(logits, label(y));
        l.into_scalar() as f64
    };
    (analytic, (at(h) - at(-h)) / (2.0 * h as f64))
}

/// Checks `full` against finite differences for K = 1 and 10, and that BPDA is visibly off.
fn check_full_gradient<M: Classifier<B> + Module<B> + Clone>(
    f: M,
    hvp: HessianVector,
    classes: i64,
) {
    let mut rng = StdRng::seed_from_u64(3);
    let x: Vec<f32> = (0..D).map(|_| rng.random_range(0.2..0.8)).collect();
    for k in [1, 10] {
        let full = defended(f.clone(), k, GradMode::Full, hvp);
        let bpda = defended(f.clone(), k, GradMode::Bpda, hvp);
        let mut bpda_off = 0.0f64;
        for trial in 0..3 {
            let d: Vec<f32> = (0..D).map(|_| rng.random_range(-1.0..1.0)).collect();
            let y = trial % classes;
            let (g, fd) = directional(&full, &x, y, &d, 1e-2);
            assert!(
                (g - fd).abs() <= 2e-3 + 1e-2 * fd.abs(),
                "K={k}: full {g} vs fd {fd}"
            );
            let (gb, _) = directional(&bpda, &x, y, &d, 1e-2);
            bpda_off = bpda_off.max((gb - fd).abs() / fd.abs().max(1e-3));
        }
        // BPDA ignores the Jacobian of the steps: it must be visibly off, or this test would
        // not tell the two modes apart.
        assert!(
            bpda_off > 0.05,
            "K={k}: BPDA within {bpda_off} of the true gradient"
        );
    }
}

/// A classifier that only offers its logits (no [`Classifier::linearise`]), so that the
/// defence falls back to central differences of the logits for J v.
#[derive(Module, Debug, Clone)]
struct LogitsOnly<Bk: burn::tensor::backend::Backend> {
    inner: LinearClassifier<Bk>,
}

impl<Bk: burn::tensor::backend::Backend> Classifier<Bk> for LogitsOnly<Bk> {
    fn logits(&self, x: Tensor<Bk, 4>) -> Tensor<Bk, 2> {
        self.inner.logits(x)
    }
}

#[test]
fn full_gradient_through_sgld_on_a_linear_model_matches_finite_differences() {
    // LSE∘(Wx + b) has Hessian Wᵀ(diag p − p pᵀ)W everywhere: every product form is exact —
    // the linearised network's (the linear model linearises itself), central differences of
    // the logits (the fallback for networks that cannot), and differences of gradients.
    let mut rng = StdRng::seed_from_u64(7);
    for hvp in [
        HessianVector::PiecewiseLinear,
        HessianVector::GradientDifferences,
    ] {
        check_full_gradient(random_linear(D, 3, 0.6, &mut rng), hvp, 3);
    }
    let inner = random_linear(D, 3, 0.6, &mut rng);
    check_full_gradient(LogitsOnly { inner }, HessianVector::PiecewiseLinear, 3);
}

fn smooth_mlp(seed: u64) -> SmoothMlp<B> {
    let mut rng = StdRng::seed_from_u64(seed);
    SmoothMlp {
        hidden: random_linear(D, 12, 0.8, &mut rng),
        out: random_linear(12, 4, 0.8, &mut rng),
    }
}

#[test]
fn full_gradient_through_sgld_on_a_smooth_network_matches_finite_differences() {
    check_full_gradient(smooth_mlp(8), HessianVector::GradientDifferences, 4);
    // Exact, by reverse mode over the forward mode, under the default setting.
    let mlp = SmoothMlpWithTangents { mlp: smooth_mlp(8) };
    check_full_gradient(mlp, HessianVector::PiecewiseLinear, 4);
}

#[test]
fn forward_mode_gives_exact_hessian_vector_products_where_the_piecewise_linear_form_errs() {
    // H v of Σ LSE(f(x)) for the smooth network: exact (reverse over forward) against central
    // differences of exact gradients, and the piecewise-linear form Jᵀ(diag p − p pᵀ)J v — the
    // defence's fallback, exact for a linear model — visibly off, as it drops Σ_k p_k ∇²f_k.
    let mlp = SmoothMlpWithTangents { mlp: smooth_mlp(9) };
    let mut rng = StdRng::seed_from_u64(4);
    let x: Vec<f32> = (0..3 * D).map(|_| rng.random_range(0.2..0.8)).collect();
    let v: Vec<f32> = (0..3 * D).map(|_| rng.random_range(-1.0..1.0)).collect();
    let values = |t: Tensor<I, 4>| -> Vec<f32> { t.into_data().to_vec().unwrap() };
    let exact = values(
        log_sum_exp_hessian_vector::<B, _>(&mlp, image(&x), image(&v))
            .expect("the network has a forward mode"),
    );
    let h = 1e-2f32;
    let gradient = |s: f32| -> Vec<f32> {
        let shifted: Vec<f32> = x.iter().zip(&v).map(|(a, b)| a + s * b).collect();
        values(input_gradient::<B, _>(&mlp, image(&shifted), log_sum_exp).0)
    };
    let differences: Vec<f32> = gradient(h)
        .iter()
        .zip(gradient(-h))
        .map(|(p, m)| (p - m) / (2.0 * h))
        .collect();
    // The piecewise-linear form, with J v and Jᵀ(·) exact (forward and reverse mode).
    let piecewise = {
        let xs = Tensor::<B, 4>::from_inner(image(&x)).require_grad();
        let (logits, jv) = mlp
            .jacobian_vector_product(xs.clone(), Tensor::from_inner(image(&v)))
            .unwrap();
        let (p, jv) = (softmax(logits.clone().inner(), 1), jv.inner());
        let w = p.clone() * jv.clone() - p.clone() * (p * jv).sum_dim(1);
        let grads = (logits * Tensor::from_inner(w)).sum().backward();
        values(xs.grad(&grads).unwrap())
    };
    let rel = |a: &[f32], b: &[f32]| -> f32 {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    };
    let (d_exact, d_piecewise) = (rel(&exact, &differences), rel(&piecewise, &differences));
    assert!(d_exact < 1e-3, "exact H v off by {d_exact}");
    assert!(
        d_piecewise > 0.05,
        "the piecewise-linear form within {d_piecewise}"
    );
}

#[test]
fn eot_averages_draws_and_counts_each_gradient() {
    // A stochastic defence: every gradient call draws new chain noise. With EOT over 4 draws
    // and 5 steps without early stop, each attacked example costs 20 gradient evaluations,
    // and its break is re-checked once with the recheck chains.
    let mut rng = StdRng::seed_from_u64(11);
    let model = defended(
        random_linear(D, 3, 0.6, &mut rng),
        1,
        GradMode::Bpda,
        HessianVector::PiecewiseLinear,
    );
    assert!(Model::<B>::is_stochastic(&model));
    let x: Vec<f32> = (0..2 * D).map(|_| rng.random_range(0.3..0.7)).collect();
    let mut s = StdRng::seed_from_u64(0);
    let pred: Vec<i64> = Model::<B>::logits(&model, image(&x), &mut s)
        .argmax(1)
        .reshape([2])
        .into_data()
        .convert::<i64>()
        .to_vec()
        .unwrap();
    let y = Tensor::from_data(
        burn::tensor::TensorData::new(pred, [2]),
        &Default::default(),
    );
    let cfg = PgdConfig {
        eot: 4,
        steps: 5,
        early_stop: false,
        ..PgdConfig::pgd(Norm::Linf)
    };
    let a = cfg.run::<B, _>(&model, image(&x), y.clone(), 0.05);
    for e in &a.examples {
        if e.clean_correct {
            assert_eq!((e.gradient_evals, e.forward_evals), (20, 2), "{e:?}");
        }
    }
    assert!(a.examples.iter().any(|e| e.clean_correct));
    // Same seed, same draws, same result.
    let b = cfg.run::<B, _>(&model, image(&x), y, 0.05);
    assert_eq!(a.inputs, b.inputs);
}

#[test]
fn maximising_the_label_loss_is_perturbing() {
    // `maximise` is the same ascent as `perturb`, with the loss handed in instead of labels.
    let mut cfg = PgdConfig::pgd(Norm::Linf);
    cfg.early_stop = false;
    for c in cases(3) {
        let model = undefended(&c);
        let by_label = cfg.perturb::<B, _>(&model, image(&c.x), label(c.y), 0.05);
        let y = label(c.y);
        let ce = |logits: Tensor<B, 2>| {
            AttackLoss::CrossEntropy.of(logits, Tensor::from_inner(y.clone()))
        };
        let by_loss = cfg.maximise::<B, _>(&model, image(&c.x), &ce, 0.05);
        assert_eq!(
            by_label.into_data().to_vec::<f32>().unwrap(),
            by_loss.into_data().to_vec::<f32>().unwrap()
        );
    }
}

#[test]
fn the_trades_divergence_is_maximised_at_a_vertex_of_the_linf_ball() {
    // For a binary linear model the divergence from the clean prediction depends on δ only
    // through s = (w₁ − w₀)·δ and grows with |s| on either side of 0, so from any start the
    // ascent ends where every pixel sits at ±ε along sign(w₁ − w₀), all with the sign s
    // started with (the box does not bind: pixels lie in [0.4, 0.6], ε = 0.05).
    let mut cfg = PgdConfig::pgd(Norm::Linf);
    cfg.steps = 60;
    cfg.rel_stepsize = 0.1;
    let eps = 0.05;
    for (k, c) in cases(4).into_iter().enumerate() {
        cfg.seed = k as u64;
        let model = undefended(&c);
        let mut rng = StdRng::seed_from_u64(0);
        let clean = Model::<B>::logits(&model, image(&c.x), &mut rng);
        let reference = Tensor::from_inner(burn::tensor::activation::log_softmax(clean, 1));
        let kl = |logits: Tensor<B, 2>| kl_divergence(reference.clone(), logits);
        let adv: Vec<f32> = cfg
            .maximise::<B, _>(&model, image(&c.x), &kl, eps)
            .into_data()
            .to_vec()
            .unwrap();
        let v: Vec<f32> = (0..D).map(|d| c.w[D + d] - c.w[d]).collect();
        let delta: Vec<f32> = adv.iter().zip(&c.x).map(|(a, x)| a - x).collect();
        let s: f32 = v.iter().zip(&delta).map(|(v, d)| v * d).sum();
        for (d, v) in delta.iter().zip(&v) {
            assert!(
                (d - eps * v.signum() * s.signum()).abs() < 1e-5,
                "case {k}: δ {delta:?} is not the vertex ±ε·sign(w₁ − w₀) ({v:?})"
            );
        }
    }
}

#[test]
fn kl_divergence_matches_hand_computed_values() {
    let device = Default::default();
    let t =
        |v: Vec<f32>| Tensor::<B, 2>::from_data(burn::tensor::TensorData::new(v, [2, 2]), &device);
    // Row 0: p = (½, ½), q = (¼, ¾). Row 1: p = (1, e⁻²⁰⁰ ≈ 0 in f32), q = (½, ½): the
    // underflowing class adds 0, not NaN.
    let reference = t(vec![0.5f32.ln(), 0.5f32.ln(), 0.0, -200.0]);
    let logits = t(vec![0.0, 3.0f32.ln(), 1.0, 1.0]);
    let kl: Vec<f32> = kl_divergence(reference, logits)
        .into_data()
        .to_vec()
        .unwrap();
    let expected = [0.5 * 2.0f32.ln() + 0.5 * (2.0f32 / 3.0).ln(), 2.0f32.ln()];
    for (a, e) in kl.iter().zip(expected) {
        assert!((a - e).abs() < 1e-6, "{kl:?} vs {expected:?}");
    }
}
