//! The divergence guard. JEM training is known to diverge (Grathwohl et al. 2020); instead of aborting as the
//! official code does, the trainer rolls back to the last saved state, lowers the learning rate
//! and continues, and gives up with a clear message after a bounded number of rollbacks.

use clap::Args;
use serde::{Deserialize, Serialize};

use super::objective::StepStats;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
pub struct GuardConfig {
    /// Roll back when |loss| exceeds this (the official JEM code aborts at 1e8).
    #[arg(long, default_value_t = 1e8)]
    pub guard_max_loss: f64,
    /// Roll back when the energy gap |E(data) − E(samples)| exceeds this (JEM).
    #[arg(long, default_value_t = 1e4)]
    pub guard_max_energy_gap: f64,
    /// Multiply the learning rate by this at each rollback.
    #[arg(long, default_value_t = 0.5)]
    pub guard_lr_factor: f64,
    /// Give up after this many rollbacks.
    #[arg(long, default_value_t = 5)]
    pub guard_max_rollbacks: usize,
}

impl GuardConfig {
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
