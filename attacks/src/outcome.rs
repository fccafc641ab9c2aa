//! The one result type of every attack: per example, the adversarial input, whether it is
//! adversarial (confirmed by re-classification), its distance to the original in L0 / L2 / L∞
//! pixel units, and what it cost. Fixed-ε and minimum-perturbation attacks both fill it, so that
//! accuracy-vs-ε curves come from either the same way.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use crate::norm::Norm;

/// What an attack did to one example: at one ε for a fixed-ε attack, the closest adversarial
/// found for a minimum-perturbation attack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExampleOutcome {
    /// The model classified the clean input correctly (else it counts as an error at every ε
    /// and is not attacked).
    pub clean_correct: bool,
    /// The returned input is misclassified (re-checked; with many chains for a stochastic model).
    pub adversarial: bool,
    /// Pixels (tensor elements) changed by more than 1e-6.
    pub l0: f32,
    /// L2 distance of the returned input to the clean one, in pixel units.
    pub l2: f32,
    /// L∞ distance of the returned input to the clean one, in pixel units.
    pub linf: f32,
    /// Gradient evaluations of the (defended) model, EOT draws counted one by one.
    pub gradient_evals: usize,
    /// Forward evaluations (decision-based attacks, re-checks).
    pub forward_evals: usize,
}

impl ExampleOutcome {
    /// An example before any attack: classified correctly or not by the clean pass (one
    /// forward evaluation), not adversarial, at distance 0.
    pub fn clean(clean_correct: bool) -> Self {
        Self {
            clean_correct,
            adversarial: false,
            l0: 0.0,
            l2: 0.0,
            linf: 0.0,
            gradient_evals: 0,
            forward_evals: 1,
        }
    }

    /// The L∞ or L2 distance, as the norm asks.
    pub fn distance(&self, norm: Norm) -> f32 {
        match norm {
            Norm::Linf => self.linf,
            Norm::L2 => self.l2,
        }
    }

    /// Correctly classified and not broken: robust at the ε the attack was run at.
    pub fn stands(&self) -> bool {
        self.clean_correct && !self.adversarial
    }

    /// Robust at `eps` by an outcome of an attack run at `run_at` (`None`: a
    /// minimum-perturbation attack, which answers for any ε by its distance). A fixed-ε
    /// outcome answers for its own ε and, its breaks carried, for every larger one.
    pub fn robust_under(&self, run_at: Option<f32>, norm: Norm, eps: f32) -> bool {
        match run_at {
            Some(_) => self.stands(),
            None => self.robust_at(norm, eps),
        }
    }

    /// Still correctly classified under every perturbation of size ≤ `eps` this attack tried.
    /// A fixed-ε attack answers only for its own ε; a minimum-perturbation attack for any.
    pub fn robust_at(&self, norm: Norm, eps: f32) -> bool {
        self.clean_correct && !(self.adversarial && Norm::within(self.distance(norm), eps))
    }
}

/// An attack's result on a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttackOutcome {
    /// One outcome per example, in batch order.
    pub examples: Vec<ExampleOutcome>,
    /// The returned inputs, `[N, C, H, W]` row-major in [0, 1] (the clean input where the
    /// attack found nothing).
    pub inputs: Vec<f32>,
    /// `[N, C, H, W]` of `inputs`.
    pub shape: [usize; 4],
}

impl AttackOutcome {
    /// Fraction of examples that are robust at `eps` (clean errors count as not robust).
    pub fn robust_accuracy(&self, norm: Norm, eps: f32) -> f64 {
        let n = self.examples.len().max(1);
        self.examples
            .iter()
            .filter(|e| e.robust_at(norm, eps))
            .count() as f64
            / n as f64
    }

    /// Fraction of examples the model classified correctly before the attack.
    pub fn clean_accuracy(&self) -> f64 {
        let n = self.examples.len().max(1);
        self.examples.iter().filter(|e| e.clean_correct).count() as f64 / n as f64
    }
}

impl AttackOutcome {
    /// Fills in every example's L0 / L2 / L∞ distance between `original` and `returned`, and
    /// keeps the returned inputs.
    pub fn measure<B: Backend>(
        original: Tensor<B, 4>,
        returned: Tensor<B, 4>,
        mut examples: Vec<ExampleOutcome>,
    ) -> Self {
        let shape = returned.dims();
        let n = shape[0];
        let delta = returned.clone() - original;
        let values =
            |t: Tensor<B, 1>| -> Vec<f32> { t.into_data().convert::<f32>().to_vec().expect("f32") };
        let l2 = values(Norm::L2.size(delta.clone()));
        let linf = values(Norm::Linf.size(delta.clone()));
        let l0 = values(
            delta
                .abs()
                .greater_elem(1e-6)
                .float()
                .flatten::<2>(1, 3)
                .sum_dim(1)
                .reshape([n]),
        );
        for (i, e) in examples.iter_mut().enumerate() {
            (e.l0, e.l2, e.linf) = (l0[i], l2[i], linf[i]);
        }
        Self {
            examples,
            inputs: returned.into_data().convert::<f32>().to_vec().expect("f32"),
            shape,
        }
    }
}
