//! The divergence guard. JEM training is known to diverge (Grathwohl et al. 2020); instead of aborting as the
//! official code does, the trainer rolls back to the last saved state, lowers the learning rate
//! and continues, and gives up with a clear message after a bounded number of rollbacks.

use serde::{Deserialize, Serialize};

use super::objective::StepStats;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardConfig {
    /// Roll back when |loss| exceeds this (the official JEM code aborts at 1e8).
    pub guard_max_loss: f64,
    /// Roll back when the energy gap |E(data) − E(samples)| exceeds this (JEM).
    pub guard_max_energy_gap: f64,
    /// Multiply the learning rate by this at each rollback.
    pub guard_lr_factor: f64,
    /// Give up after this many rollbacks.
    pub guard_max_rollbacks: usize,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            guard_max_loss: 1e8,
            guard_max_energy_gap: 1e4,
            guard_lr_factor: 0.5,
            guard_max_rollbacks: 5,
        }
    }
}

impl GuardConfig {
    /// Checks the settings: thresholds finite and > 0, and a factor in (0, 1), so that each
    /// rollback lowers the learning rate. An error names the field.
    pub fn validate(&self) -> Result<(), crate::settings::InvalidSetting> {
        use crate::settings;
        settings::finite_positive("guard_max_loss", self.guard_max_loss)?;
        settings::finite_positive("guard_max_energy_gap", self.guard_max_energy_gap)?;
        let f = self.guard_lr_factor;
        if !(f > 0.0 && f < 1.0) {
            return Err(settings::InvalidSetting::bare(
                "guard_lr_factor",
                &format!(
                    "expected a factor in (0, 1) that lowers the learning rate at each \
                     rollback, found {f}"
                ),
            ));
        }
        Ok(())
    }

    /// Why a step's numbers mean divergence, if they do (the objective adds its own signs).
    pub fn symptom(&self, stats: &StepStats) -> Option<String> {
        if !stats.loss.is_finite() {
            Some(format!("loss is {}", stats.loss))
        } else if stats.loss.abs() > self.guard_max_loss {
            Some(format!(
                "|loss| = {:.3e} exceeds {:.1e}",
                stats.loss.abs(),
                self.guard_max_loss
            ))
        } else {
            None
        }
    }
}
