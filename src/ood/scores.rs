//! The three OOD scores of JEM's out-of-distribution section (Grathwohl et al. 2020), each
//! higher for inputs the model takes as more in-distribution:
//!
//! - `lse`: LogSumExp_y f(x)[y] = log p(x) + log Z, the model's unnormalised log density;
//! - `max-softmax`: max_y p(y|x), the baseline of Hendrycks & Gimpel (2017);
//! - `grad-norm`: −‖∂ log p(x) / ∂x‖₂, JEM's "approximate mass" score: inputs where the density
//!   is flat are typical, steep ones are not.
//!
//! The gradient is taken with respect to the [0, 1] pixels (the network's own input scaling
//! multiplies every norm by the same constant, which no ranking metric sees), per example: the
//! gradient of Σ_i LSE(x_i) with respect to the batch holds each example's own gradient, since
//! examples do not interact. For the JEM-K defence (K > 0) every score is taken on the
//! chain-averaged logits, and the gradient through the K SGLD steps (`Model::loss_gradient` in
//! `full` mode).

use crate::Choice;
use burn::tensor::activation::softmax;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Device;
use jem_attacks::{log_sum_exp, Model};
use jem_datasets::ImageSet;
use rand::rngs::StdRng;
use serde::Serialize;

use crate::batches;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Score {
    Lse,
    MaxSoftmax,
    GradNorm,
}

impl Choice for Score {
    const WHAT: &'static str = "score";

    const ALL: &'static [Self] = &[Score::Lse, Score::MaxSoftmax, Score::GradNorm];

    /// The score's name: `lse`, `max-softmax`, `grad-norm`.
    fn name(self) -> &'static str {
        match self {
            Score::Lse => "lse",
            Score::MaxSoftmax => "max-softmax",
            Score::GradNorm => "grad-norm",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Score::Lse => "LogSumExp_y f(x)[y] = log p(x) up to a constant",
            Score::MaxSoftmax => "max_y p(y|x)",
            Score::GradNorm => {
                "−‖∂ LogSumExp_y f(x)[y] / ∂x‖₂ = −‖∂ log p(x)/∂x‖₂, x in [0, 1] pixels"
            }
        }
    }
}

/// Every score in `wanted` for each image of `set`, in the order of `wanted`, computed
/// `batch_size` images at a time; a stochastic model draws its noise from `rng`.
pub fn scores<B: AutodiffBackend, M: Model<B>>(
    model: &M,
    set: &ImageSet,
    wanted: &[Score],
    batch_size: usize,
    rng: &mut StdRng,
    device: &Device<B::InnerBackend>,
) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::with_capacity(set.len()); wanted.len()];
    let all: Vec<usize> = (0..set.len()).collect();
    for chunk in all.chunks(batch_size.max(1)) {
        let x = batches::images::<B::InnerBackend>(set, chunk, device);
        let (logits, gradient_norms) = if wanted.contains(&Score::GradNorm) {
            let (g, logits) = model.loss_gradient(x, &log_sum_exp::<B>, rng);
            let norms = g.powf_scalar(2.0).flatten::<2>(1, 3).sum_dim(1).sqrt();
            (logits, Some(batches::to_vec(norms)))
        } else {
            (model.logits(x, rng), None)
        };
        for (s, values) in wanted.iter().zip(out.iter_mut()) {
            let v: Vec<f32> = match s {
                Score::Lse => batches::to_vec(log_sum_exp(logits.clone())),
                Score::MaxSoftmax => batches::to_vec(softmax(logits.clone(), 1).max_dim(1)),
                Score::GradNorm => gradient_norms
                    .iter()
                    .flatten()
                    .map(|g| -g)
                    .collect::<Vec<f32>>(),
            };
            values.extend(v.into_iter().map(f64::from));
        }
    }
    out
}

/// The value a histogram shows for a score: the score itself, except the gradient norm,
/// whose values span orders of magnitude: log10 ‖∂ log p(x)/∂x‖₂ (floored at 10⁻³⁰).
pub fn histogram_value(score: Score, value: f64) -> f64 {
    match score {
        Score::GradNorm => (-value).max(1e-30).log10(),
        _ => value,
    }
}

/// The axis label of [`histogram_value`], with the side the in-distribution images should
/// fall on (short: it must fit under one panel).
pub fn histogram_label(score: Score) -> &'static str {
    match score {
        Score::Lse => "LogSumExp f(x): high = in",
        Score::MaxSoftmax => "max p(y|x): high = in",
        Score::GradNorm => "log10 |d log p/dx|: low = in",
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use jem_attacks::{LinearClassifier, Undefended};
    use rand::SeedableRng;

    use super::*;

    type B = Autodiff<Flex>;

    #[test]
    fn scores_of_a_linear_model_match_their_closed_forms() {
        // f(x) = W x + b: ∇ₓ LogSumExp f(x) = Wᵀ softmax(W x + b), per example.
        let (classes, dim) = (3, 4);
        let w: Vec<f32> = (0..classes * dim)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let b = vec![0.3f32, -0.2, 0.1];
        let device = Default::default();
        let model = Undefended::new(LinearClassifier::<B>::new(
            w.clone(),
            b.clone(),
            classes,
            &device,
        ));
        let images: Vec<f32> = (0..3 * dim).map(|i| ((i * 5 % 9) as f32) / 8.0).collect();
        let set = ImageSet {
            name: "t".into(),
            images: images.clone(),
            labels: vec![0; 3],
            channels: 1,
            height: 2,
            width: 2,
            class_names: vec!["a".into(), "b".into(), "c".into()],
        };
        let wanted = [Score::Lse, Score::MaxSoftmax, Score::GradNorm];
        let mut rng = StdRng::seed_from_u64(0);
        // Batches of 2 then 1: the per-example values do not depend on the batch.
        let got = scores::<B, _>(&model, &set, &wanted, 2, &mut rng, &device);
        for (i, x) in images.chunks(dim).enumerate() {
            let f: Vec<f64> = (0..classes)
                .map(|k| {
                    let row = &w[k * dim..(k + 1) * dim];
                    b[k] as f64 + row.iter().zip(x).map(|(a, c)| (a * c) as f64).sum::<f64>()
                })
                .collect();
            let max = f.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + f.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            let p: Vec<f64> = f.iter().map(|v| (v - lse).exp()).collect();
            let grad: Vec<f64> = (0..dim)
                .map(|d| (0..classes).map(|k| w[k * dim + d] as f64 * p[k]).sum())
                .collect();
            let norm = grad.iter().map(|g| g * g).sum::<f64>().sqrt();
            let max_p = p.iter().copied().fold(0.0, f64::max);
            for (s, expected) in [(0, lse), (1, max_p), (2, -norm)] {
                assert!(
                    (got[s][i] - expected).abs() < 1e-5,
                    "example {i}, {:?}: {} vs {expected}",
                    wanted[s],
                    got[s][i]
                );
            }
        }
        // Without the gradient score, the same logits give the same other scores.
        let two = scores::<B, _>(&model, &set, &wanted[..2], 3, &mut rng, &device);
        assert_eq!(two.len(), 2);
        for s in 0..2 {
            for i in 0..3 {
                assert!((two[s][i] - got[s][i]).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn the_gradient_norm_matches_finite_differences_of_lse() {
        // A nonlinear check on a real network: central differences of LSE along each pixel of
        // a tiny WRN give the same gradient norm.
        use crate::model::WideResNetConfig;
        let device = Default::default();
        let net = WideResNetConfig::new(10, 1, 1, 10)
            .init_seeded::<B>(3, &device)
            .unwrap();
        let model = Undefended::new(net);
        let (h, w) = (8, 8);
        let image: Vec<f32> = (0..h * w).map(|i| ((i * 13 % 17) as f32) / 16.0).collect();
        let set = ImageSet {
            name: "t".into(),
            images: image.clone(),
            labels: vec![0],
            channels: 1,
            height: h,
            width: w,
            class_names: (0..10).map(|c| c.to_string()).collect(),
        };
        let mut rng = StdRng::seed_from_u64(0);
        let got = scores::<B, _>(&model, &set, &[Score::GradNorm], 1, &mut rng, &device);
        let lse = |x: &[f32]| -> f64 {
            let one = ImageSet {
                images: x.to_vec(),
                ..set.clone()
            };
            scores::<B, _>(
                &model,
                &one,
                &[Score::Lse],
                1,
                &mut StdRng::seed_from_u64(0),
                &device,
            )[0][0]
        };
        let step = 1e-2f32;
        let mut sq = 0.0f64;
        for d in 0..h * w {
            let (mut plus, mut minus) = (image.clone(), image.clone());
            plus[d] += step;
            minus[d] -= step;
            let g = (lse(&plus) - lse(&minus)) / (2.0 * step as f64);
            sq += g * g;
        }
        let fd = sq.sqrt();
        assert!(fd > 1e-3, "a gradient too small to test: {fd}");
        let rel = (-got[0][0] - fd).abs() / fd;
        assert!(
            rel < 0.02,
            "autodiff {} vs finite differences {fd}",
            -got[0][0]
        );
    }
}
