//! Adversarial training with the attack library's [`PgdConfig`] against the current parameters,
//! in one of two forms:
//! - Madry et al. (2018): each batch is replaced by PGD examples that maximise the
//!   cross-entropy, and the network minimises their cross-entropy (optionally mixed with the
//!   clean loss);
//! - TRADES (Zhang et al. 2019, `--trades-beta β`): PGD maximises the KL divergence of the
//!   prediction from the clean one, and the network minimises CE(clean) + β · KL(clean ‖
//!   perturbed), trading a little clean accuracy for a smoother, more robust classifier.

use jem_kernels::KernelsAutodiff;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::{ElementConversion, Int, Tensor};
use jem_attacks::{kl_divergence, AttackLoss, Norm, PgdConfig, Undefended};
use serde::{Deserialize, Serialize};

use super::objective::{accuracy, cross_entropy, Objective, Step, StepStats};
use crate::batches;
use crate::model::WideResNet;
use crate::settings::{self, InvalidSetting};
use jem_datasets::ImageSet;

/// The training attack. Defaults are Madry et al.'s MNIST L∞ ones (ε = 0.3, 40 steps of 0.01,
/// random start); fewer steps trade strength for time (1 step of 1.25 ε from a random start
/// is Wong et al. 2020's "fast" FGSM training).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdvConfig {
    /// Threat model of the training attack: linf or l2.
    pub norm: Norm,
    /// Radius ε of the training attack in [0, 1] pixel units.
    pub eps: f32,
    /// PGD steps per batch.
    pub adv_steps: usize,
    /// PGD step size as a fraction of ε (0.01 / 0.3: Madry's 0.01 at ε = 0.3).
    pub adv_rel_stepsize: f32,
    /// Start PGD at the clean input instead of a uniform random point of the ε-ball.
    pub adv_zero_start: bool,
    /// Weight of the clean cross-entropy; the adversarial one gets 1 − weight (0: PGD only).
    pub adv_clean_weight: f64,
    /// Grow ε linearly from 0 over the first N iterations (small networks trained at the full ε
    /// from the start can collapse to a constant prediction).
    pub adv_eps_ramp_iters: usize,
    /// Validation images (the first N of the held-out set) attacked at the end of each epoch
    /// with the training attack at the full ε; the most robust epoch is kept as the best
    /// checkpoint.
    // Left out of the settings while it keeps the default, so that runs started before it
    // existed still resume with the same command.
    #[serde(
        default = "default_adv_val_size",
        skip_serializing_if = "is_default_adv_val_size"
    )]
    pub adv_val_size: usize,
    /// Train with TRADES (Zhang et al. 2019) instead of Madry's loss: CE(clean) + β ·
    /// KL(clean ‖ perturbed), the perturbation maximising the KL term (the TRADES paper reports
    /// MNIST and CIFAR-10 at β = 6; smaller β favours clean accuracy). Needs the random start
    /// (the divergence has no gradient at the clean input) and no `--adv-clean-weight`.
    // Absent from the settings of Madry runs, so that runs started before it resume unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trades_beta: Option<f64>,
}

const DEFAULT_ADV_VAL_SIZE: usize = 1000;

impl Default for AdvConfig {
    /// Madry et al.'s MNIST L∞ training attack.
    fn default() -> Self {
        AdvConfig {
            norm: Norm::Linf,
            eps: 0.3,
            adv_steps: 40,
            adv_rel_stepsize: 0.01 / 0.3,
            adv_zero_start: false,
            adv_clean_weight: 0.0,
            adv_eps_ramp_iters: 0,
            adv_val_size: DEFAULT_ADV_VAL_SIZE,
            trades_beta: None,
        }
    }
}

fn default_adv_val_size() -> usize {
    DEFAULT_ADV_VAL_SIZE
}

fn is_default_adv_val_size(n: &usize) -> bool {
    *n == DEFAULT_ADV_VAL_SIZE
}

/// Seed of the validation attack: one fixed random start for every epoch, so epochs are compared
/// on the same attack.
const VALIDATION_SEED: u64 = 0x7661_6c69_6461_7465;

impl AdvConfig {
    /// The attack of one training step.
    pub fn attack(&self, seed: u64) -> PgdConfig {
        PgdConfig {
            norm: self.norm,
            steps: self.adv_steps,
            rel_stepsize: self.adv_rel_stepsize,
            restarts: 1,
            random_start: !self.adv_zero_start,
            loss: AttackLoss::CrossEntropy,
            eot: 1,
            // Training wants the loss maximised for every example, not the first break.
            early_stop: false,
            seed,
        }
    }

    /// ε after `iteration` iterations, with the ramp.
    pub fn eps_at(&self, iteration: usize) -> f32 {
        if iteration >= self.adv_eps_ramp_iters {
            self.eps
        } else {
            self.eps * (iteration + 1) as f32 / self.adv_eps_ramp_iters as f32
        }
    }

    /// Checks the settings: ε a positive radius (at most 1 under L∞), a positive step size,
    /// steps and validation images at least 1, the
    /// clean weight in [0, 1], TRADES' β positive and without a clean weight or zero start. An
    /// error names the field.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        settings::finite_positive("eps", self.eps)?;
        if self.norm == Norm::Linf && self.eps > 1.0 {
            return Err(InvalidSetting::bare(
                "eps",
                &format!(
                    "expected an L∞ radius of at most 1 (pixels lie in [0, 1]), found {}",
                    self.eps
                ),
            ));
        }
        settings::finite_positive("adv_rel_stepsize", self.adv_rel_stepsize)?;
        settings::at_least_one("adv_steps", self.adv_steps)?;
        // The best epoch is chosen by robust validation accuracy.
        settings::at_least_one("adv_val_size", self.adv_val_size)?;
        settings::probability("adv_clean_weight", self.adv_clean_weight)?;
        if let Some(beta) = self.trades_beta {
            let refuse = |field, problem: &str| Err(InvalidSetting::bare(field, problem));
            if !(beta > 0.0 && beta.is_finite()) {
                let problem = format!(
                    "expected a positive weight of the KL term (TRADES uses 6), found {beta}"
                );
                return refuse("trades_beta", &problem);
            }
            if self.adv_clean_weight != 0.0 {
                return refuse(
                    "adv_clean_weight",
                    "TRADES' loss already holds CE(clean); leave it at 0 with trades_beta",
                );
            }
            if self.adv_zero_start {
                return refuse(
                    "adv_zero_start",
                    "TRADES needs the random start: the KL divergence from the clean prediction \
                     has zero gradient at the clean input, so PGD from there never moves",
                );
            }
        }
        Ok(())
    }
}

pub struct AdversarialObjective {
    config: AdvConfig,
}

impl AdversarialObjective {
    pub fn new(config: AdvConfig) -> Self {
        Self { config }
    }
}

impl<B: KernelsAutodiff> Objective<B> for AdversarialObjective {
    fn kind(&self) -> &'static str {
        "adv"
    }

    fn extra_columns(&self) -> Vec<&'static str> {
        vec!["adv_cross_entropy", "adv_accuracy", "eps", "attack_seconds"]
    }

    fn loss(
        &mut self,
        model: &WideResNet<B>,
        x: Tensor<B, 4>,
        y: Tensor<B, 1, Int>,
        step: Step,
    ) -> (Tensor<B, 1>, StepStats) {
        let n = x.dims()[0];
        let eps = self.config.eps_at(step.iteration);

        // The inner maximisation sees the current parameters frozen: input gradients only.
        let attack_start = Instant::now();
        let attacked = Undefended::new(model.clone());
        let attack = self.config.attack(step.seed);
        let x_adv = match self.config.trades_beta {
            None => attack.perturb::<B, _>(&attacked, x.clone().inner(), y.clone().inner(), eps),
            Some(_) => {
                let clean = model.valid().forward(x.clone().inner());
                let reference = Tensor::<B, 2>::from_inner(log_softmax(clean, 1));
                let divergence = |logits: Tensor<B, 2>| kl_divergence(reference.clone(), logits);
                attack.maximise::<B, _>(&attacked, x.clone().inner(), &divergence, eps)
            }
        };
        let attack_seconds = attack_start.elapsed().as_secs_f64();

        let scalar = |t: Tensor<B, 1>| t.into_scalar().elem::<f64>();
        let w = self.config.adv_clean_weight;
        let (loss, clean_ce, clean_acc, adv_ce, adv_acc) =
            if self.config.trades_beta.is_some() || w > 0.0 {
                // Both terms train: clean and perturbed inputs in one forward pass.
                let logits = model.forward(Tensor::cat(vec![x, Tensor::from_inner(x_adv)], 0));
                let (clean, adv) = (logits.clone().slice([0..n]), logits.slice([n..2 * n]));
                let (clean_acc, adv_acc) = (
                    accuracy(clean.clone().detach(), y.clone()),
                    accuracy(adv.clone().detach(), y.clone()),
                );
                let clean_ce = cross_entropy(clean.clone(), y.clone());
                let (loss, adv_ce) = match self.config.trades_beta {
                    Some(beta) => {
                        // The KL term differentiates through both logits, as in TRADES; the
                        // perturbed cross-entropy is only logged, to compare with Madry runs.
                        let divergence = kl_divergence(log_softmax(clean, 1), adv.clone()).mean();
                        let adv_ce = scalar(cross_entropy(adv.detach(), y));
                        (clean_ce.clone() + divergence * beta, adv_ce)
                    }
                    None => {
                        let adv_ce = cross_entropy(adv, y);
                        let loss = clean_ce.clone() * w + adv_ce.clone() * (1.0 - w);
                        (loss, scalar(adv_ce))
                    }
                };
                (loss, scalar(clean_ce), clean_acc, adv_ce, adv_acc)
            } else {
                // The clean loss is only logged: a forward pass without a graph.
                let clean = model.valid().forward(x.inner());
                let y_inner = y.clone().inner();
                let clean_acc = accuracy(clean.clone(), y_inner.clone());
                let clean_ce = cross_entropy(clean, y_inner).into_scalar().elem::<f64>();
                let adv = model.forward(Tensor::from_inner(x_adv));
                let adv_acc = accuracy(adv.clone().detach(), y.clone());
                let adv_ce = cross_entropy(adv, y);
                let adv_value = scalar(adv_ce.clone());
                (adv_ce, clean_ce, clean_acc, adv_value, adv_acc)
            };
        let stats = StepStats {
            loss: scalar(loss.clone()),
            cross_entropy: clean_ce,
            accuracy: clean_acc,
            extra: vec![adv_ce, adv_acc, eps as f64, attack_seconds],
        };
        (loss, stats)
    }

    fn selects_on_robustness(&self) -> bool {
        true
    }

    fn robust_accuracy(
        &self,
        model: &WideResNet<B>,
        val: &ImageSet,
        device: &B::Device,
    ) -> anyhow::Result<f64> {
        let n = self.config.adv_val_size.min(val.len());
        anyhow::ensure!(n > 0, "no validation images to attack (--val-size 0)");
        let attack = self.config.attack(VALIDATION_SEED);
        let attacked = Undefended::new(model.clone());
        let inference = model.valid();
        let indices: Vec<usize> = (0..n).collect();
        let mut correct = 0.0;
        // Batches of 250 bound memory; the seed is per batch, the same in every epoch.
        for (b, chunk) in indices.chunks(250).enumerate() {
            let x = batches::images::<B::InnerBackend>(val, chunk, device);
            let y = batches::labels::<B::InnerBackend>(val, chunk, device);
            let x_adv = PgdConfig {
                seed: attack.seed.wrapping_add(b as u64),
                ..attack.clone()
            }
            .perturb::<B, _>(&attacked, x, y.clone(), self.config.eps);
            correct += (accuracy(inference.forward(x_adv), y) * chunk.len() as f64).round();
        }
        Ok(correct / n as f64)
    }
}
