//! The losses a gradient attack maximises, per example.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttackLoss {
    /// −log p(y|x).
    CrossEntropy,
    /// Carlini–Wagner margin max_{j≠y} z_j − z_y: positive exactly when misclassified.
    Margin,
}

impl AttackLoss {
    pub fn name(self) -> &'static str {
        match self {
            AttackLoss::CrossEntropy => "ce",
            AttackLoss::Margin => "margin",
        }
    }

    /// Per-example loss `[N]` of logits `[N, K]` against labels `[N]`.
    pub fn of<B: Backend>(self, logits: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let [n, k] = logits.dims();
        let y = y.reshape([n, 1]);
        match self {
            AttackLoss::CrossEntropy => log_softmax(logits, 1).gather(1, y).reshape([n]).neg(),
            AttackLoss::Margin => {
                let true_logit = logits.clone().gather(1, y.clone());
                let is_true: Tensor<B, 2, Bool> =
                    Tensor::<B, 1, Int>::arange(0..k as i64, &logits.device())
                        .reshape([1, k])
                        .expand([n, k])
                        .equal(y.expand([n, k]));
                let others = logits.mask_fill(is_true, f32::NEG_INFINITY).max_dim(1);
                (others - true_logit).reshape([n])
            }
        }
    }
}

impl std::str::FromStr for AttackLoss {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ce" | "cross-entropy" => Ok(AttackLoss::CrossEntropy),
            "margin" | "cw" => Ok(AttackLoss::Margin),
            _ => Err(format!("unknown attack loss `{s}`: expected ce or margin")),
        }
    }
}
