//! What a training step minimises. The loop in `trainer.rs` is shared; an objective turns a
//! batch into a loss and the numbers worth logging.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor};
use jem_kernels::KernelsAutodiff;

use jem_datasets::ImageSet;

use crate::model::{WideResNet, WideResNetConfig};

/// Which training step a loss is for.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// Iterations done before this one (0 for the first step).
    pub iteration: usize,
    /// Seeds any randomness the objective needs, so that a resumed run repeats it exactly.
    pub seed: u64,
}

/// Numbers a step reports for the log.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    pub loss: f64,
    pub cross_entropy: f64,
    pub accuracy: f64,
    /// Objective-specific columns, in the order of [`Objective::extra_columns`].
    pub extra: Vec<f64>,
}

/// A training objective on the shared loop.
pub trait Objective<B: AutodiffBackend> {
    /// `baseline`, `jem`, `adv`: recorded in the sidecar.
    fn kind(&self) -> &'static str;
    /// Names of the extra per-iteration log columns.
    fn extra_columns(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The loss of one batch (`x` already augmented and noised).
    fn loss(
        &mut self,
        model: &WideResNet<B>,
        x: Tensor<B, 4>,
        y: Tensor<B, 1, Int>,
        step: Step,
    ) -> (Tensor<B, 1>, StepStats);

    /// Called once before training starts (and before any saved state is restored) with the
    /// architecture, the training images and a seed for the objective's own randomness.
    fn prepare(
        &mut self,
        _arch: &WideResNetConfig,
        _train: &ImageSet,
        _seed: u64,
    ) -> anyhow::Result<()> {
        Ok(())
    }

    /// A sign, beyond a non-finite or huge loss, that training is diverging (checked by the
    /// trainer's divergence guard after every step).
    fn symptom(&self, _stats: &StepStats) -> Option<String> {
        None
    }

    /// State the objective carries between steps (JEM's replay buffer), saved with the
    /// training state so that a resumed or rolled-back run continues exactly.
    fn state(&self) -> Option<Vec<u8>> {
        None
    }

    /// Whether [`Objective::state`] returns something, without serialising it: a resumed run
    /// whose saved state lacks the file is refused rather than continued from fresh state.
    fn keeps_state(&self) -> bool {
        false
    }

    /// Writes a picture of that state into the run folder whenever the trainer saves (JEM:
    /// `buffer.png`), so that a long run can be watched without stopping it.
    fn snapshot(&self, _run: &std::path::Path) -> anyhow::Result<()> {
        Ok(())
    }

    /// Restores [`Objective::state`]; `what` names the file in errors.
    fn restore(&mut self, _bytes: &[u8], _what: &str) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether the best checkpoint is chosen by [`Objective::robust_accuracy`] instead of clean
    /// validation accuracy.
    fn selects_on_robustness(&self) -> bool {
        false
    }

    /// Accuracy on `val` under the objective's own attack, asked only of objectives that
    /// [select on it](Objective::selects_on_robustness). Adversarial training overfits robustly
    /// long before it overfits clean (Rice et al. 2020, "Overfitting in adversarially robust
    /// deep learning"): its best epoch is the most robust.
    fn robust_accuracy(
        &self,
        _model: &WideResNet<B>,
        _val: &ImageSet,
        _device: &B::Device,
    ) -> anyhow::Result<f64> {
        anyhow::bail!("`{}` training has no attack to validate under", self.kind())
    }
}

/// Mean cross-entropy `−log softmax(logits)[y]`.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    log_softmax(logits, 1)
        .gather(1, y.reshape([n, 1]))
        .mean()
        .neg()
}

/// Fraction of rows whose arg-max is the label.
pub fn accuracy<B: Backend>(logits: Tensor<B, 2>, y: Tensor<B, 1, Int>) -> f64 {
    let [n, _] = logits.dims();
    let hits = logits.argmax(1).reshape([n]).equal(y).int().sum();
    hits.into_scalar().elem::<f64>() / n as f64
}

/// The plain classifier: cross-entropy on p(y|x).
pub struct ClassifierObjective;

impl<B: KernelsAutodiff> Objective<B> for ClassifierObjective {
    fn kind(&self) -> &'static str {
        "baseline"
    }

    fn loss(
        &mut self,
        model: &WideResNet<B>,
        x: Tensor<B, 4>,
        y: Tensor<B, 1, Int>,
        _step: Step,
    ) -> (Tensor<B, 1>, StepStats) {
        let logits = model.forward(x);
        let acc = accuracy(logits.clone().detach(), y.clone());
        let loss = cross_entropy(logits, y);
        let ce = loss.clone().into_scalar().elem::<f64>();
        (
            loss,
            StepStats {
                loss: ce,
                cross_entropy: ce,
                accuracy: acc,
                extra: vec![],
            },
        )
    }
}
