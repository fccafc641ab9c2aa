//! Learning rate: linear warm-up over the first iterations, then a step decay at given epochs
//! (JEM: warm-up over 1000 iterations, ×0.3 at epochs 160 and 180).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub base: f64,
    pub warmup_iters: usize,
    pub decay_epochs: Vec<usize>,
    pub decay_rate: f64,
}

impl LrSchedule {
    /// The rate at global iteration `iter` (0-based) during epoch `epoch` (0-based).
    pub fn at(&self, iter: usize, epoch: usize) -> f64 {
        let warm = if iter < self.warmup_iters {
            (iter + 1) as f64 / self.warmup_iters as f64
        } else {
            1.0
        };
        let decays = self.decay_epochs.iter().filter(|&&e| epoch >= e).count();
        self.base * warm * self.decay_rate.powi(decays as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_steps() {
        let s = LrSchedule {
            base: 1e-4,
            warmup_iters: 1000,
            decay_epochs: vec![160, 180],
            decay_rate: 0.3,
        };
        assert!((s.at(0, 0) - 1e-7).abs() < 1e-15);
        assert!((s.at(499, 0) - 5e-5).abs() < 1e-12);
        assert_eq!(s.at(5000, 159), 1e-4);
        assert!((s.at(5000, 160) - 3e-5).abs() < 1e-12);
        assert!((s.at(5000, 199) - 9e-6).abs() < 1e-12);
    }
}
