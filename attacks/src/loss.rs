//! The losses a gradient attack maximises, per example: cross-entropy, the Carlini–Wagner
//! margin, and Croce & Hein's (ICML 2020) difference of logits ratio, plain and targeted.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};

/// A per-example loss of the logits that a gradient attack maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttackLoss {
    /// −log p(y|x).
    CrossEntropy,
    /// Carlini–Wagner margin max_{j≠y} z_j − z_y: positive exactly when misclassified.
    Margin,
    /// Croce & Hein's difference of logits ratio, −(z_y − max_{i≠y} z_i) / (z_π1 − z_π3 + 1e-12)
    /// with z sorted descending: the margin made invariant to shifting and scaling the logits
    /// (needs at least 3 classes).
    Dlr,
}

/// Keeps the DLR denominator away from zero (as in Croce & Hein 2020).
const DLR_EPS: f32 = 1e-12;

impl AttackLoss {
    /// `ce`, `margin` or `dlr`, as parsed from a string.
    pub fn name(self) -> &'static str {
        match self {
            AttackLoss::CrossEntropy => "ce",
            AttackLoss::Margin => "margin",
            AttackLoss::Dlr => "dlr",
        }
    }

    /// Per-example loss `[N]` of logits `[N, K]` against labels `[N]`.
    pub fn of<B: Backend>(self, logits: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let [n, k] = logits.dims();
        let y = y.reshape([n, 1]);
        match self {
            AttackLoss::CrossEntropy => log_softmax(logits, 1).gather(1, y).reshape([n]).neg(),
            AttackLoss::Margin => margin(logits, y),
            AttackLoss::Dlr => {
                assert!(
                    k >= 3,
                    "the DLR loss needs at least 3 classes, the model has {k}"
                );
                let sorted = logits.clone().sort_descending(1);
                let spread = sorted.clone().slice([0..n, 0..1]) - sorted.slice([0..n, 2..3]);
                (margin(logits, y) / (spread.reshape([n]) + DLR_EPS)).reshape([n])
            }
        }
    }
}

/// max_{j≠y} z_j − z_y, `[N]`.
fn margin<B: Backend>(logits: Tensor<B, 2>, y: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [n, k] = logits.dims();
    let true_logit = logits.clone().gather(1, y.clone());
    let is_true: Tensor<B, 2, Bool> = Tensor::<B, 1, Int>::arange(0..k as i64, &logits.device())
        .reshape([1, k])
        .expand([n, k])
        .equal(y.expand([n, k]));
    let others = logits.mask_fill(is_true, f32::NEG_INFINITY).max_dim(1);
    (others - true_logit).reshape([n])
}

/// Croce & Hein's targeted DLR loss toward class `target` (`[N]`), maximised by an attack:
/// −(z_y − z_t) / (z_π1 − (z_π3 + z_π4) / 2 + 1e-12), z sorted descending (needs at least 4
/// classes).
pub fn targeted_dlr<B: Backend>(
    logits: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
    target: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let [n, k] = logits.dims();
    assert!(
        k >= 4,
        "the targeted DLR loss needs at least 4 classes, the model has {k}"
    );
    let at = |t: Tensor<B, 1, Int>| logits.clone().gather(1, t.reshape([n, 1])).reshape([n]);
    let difference = at(target) - at(y);
    let sorted = logits.clone().sort_descending(1);
    let column = |j: usize| sorted.clone().slice([0..n, j..j + 1]).reshape([n]);
    let spread = column(0) - (column(2) + column(3)) * 0.5;
    difference / (spread + DLR_EPS)
}

impl std::str::FromStr for AttackLoss {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        match s {
            "ce" | "cross-entropy" => Ok(AttackLoss::CrossEntropy),
            "margin" | "cw" => Ok(AttackLoss::Margin),
            "dlr" => Ok(AttackLoss::Dlr),
            _ => Err(crate::UnknownName {
                what: "attack loss",
                found: s.to_string(),
                expected: "ce, margin or dlr",
            }),
        }
    }
}

/// KL(p ‖ softmax(logits)) per example (`[N]`), the reference distribution p given by its
/// log-probabilities `reference_log_probs` (`[N, K]`, e.g. `log_softmax` of the clean logits):
/// TRADES' divergence between the clean and the perturbed prediction (Zhang et al. 2019), which
/// its inner maximisation raises and its training loss lowers. Log-probabilities keep it finite
/// where p underflows (0 · finite = 0).
pub fn kl_divergence<B: Backend>(
    reference_log_probs: Tensor<B, 2>,
    logits: Tensor<B, 2>,
) -> Tensor<B, 1> {
    let n = logits.dims()[0];
    let p = reference_log_probs.clone().exp();
    (p * (reference_log_probs - log_softmax(logits, 1)))
        .sum_dim(1)
        .reshape([n])
}
