//! How long the built-in attacks search ([`Budgets`]): restarts, PGD steps and step size, APGD
//! and FAB iterations, Square queries, boundary steps, each count at least 1 by its type, and
//! the same budgets scaled for a convergence check's longer runs.

use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use crate::settings::{self, InvalidSetting};

/// How long the built-in attacks search. Every count is at least 1 by its type;
/// [`Budgets::scaled`] gives the longer runs of a convergence check. A sweep's settings record
/// each under its flag's id, beside the other settings (`harness/record.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Budgets {
    /// Restarts of the attacks that restart (PGD, APGD; `--restarts`).
    pub restarts: NonZeroUsize,
    /// PGD steps (`--pgd-steps`).
    pub pgd_steps: NonZeroUsize,
    /// PGD step size as a fraction of ε; `None`: the schedule's (`--pgd-rel-stepsize`).
    pub pgd_rel_stepsize: Option<f32>,
    /// Iterations of each APGD run (`--apgd-iterations`).
    pub apgd_iterations: NonZeroUsize,
    /// Square-attack queries per example (`--square-queries`).
    pub square_queries: NonZeroUsize,
    /// FAB-T iterations per target class (`--fab-iterations`).
    pub fab_iterations: NonZeroUsize,
    /// Boundary-attack steps (`--boundary-steps`).
    pub boundary_steps: NonZeroUsize,
}

/// `n` as a count that is at least 1 (for constants).
pub(super) const fn count(n: usize) -> NonZeroUsize {
    match NonZeroUsize::new(n) {
        Some(n) => n,
        None => panic!("a count of 0"),
    }
}

impl Default for Budgets {
    /// One run; 20 PGD steps, 100 APGD and FAB iterations, 5 000 Square queries, 1 000
    /// boundary steps.
    fn default() -> Self {
        Budgets {
            restarts: count(1),
            pgd_steps: count(20),
            pgd_rel_stepsize: None,
            apgd_iterations: count(100),
            square_queries: count(5000),
            fab_iterations: count(100),
            boundary_steps: count(1000),
        }
    }
}

/// The budgets as plain numbers, as flags give them and a sweep's settings record them (each
/// under its flag's id); [`BudgetCounts::checked`] makes them [`Budgets`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetCounts {
    pub restarts: usize,
    pub pgd_steps: usize,
    pub pgd_rel_stepsize: Option<f32>,
    pub apgd_iterations: usize,
    pub square_queries: usize,
    pub fab_iterations: usize,
    pub boundary_steps: usize,
}

impl Default for BudgetCounts {
    fn default() -> Self {
        BudgetCounts::from(&Budgets::default())
    }
}

impl From<&Budgets> for BudgetCounts {
    fn from(b: &Budgets) -> Self {
        BudgetCounts {
            restarts: b.restarts.get(),
            pgd_steps: b.pgd_steps.get(),
            pgd_rel_stepsize: b.pgd_rel_stepsize,
            apgd_iterations: b.apgd_iterations.get(),
            square_queries: b.square_queries.get(),
            fab_iterations: b.fab_iterations.get(),
            boundary_steps: b.boundary_steps.get(),
        }
    }
}

impl BudgetCounts {
    /// The budgets, every count at least 1: a 0 is an [`InvalidSetting`] naming its field.
    pub fn checked(&self) -> Result<Budgets, InvalidSetting> {
        Ok(Budgets {
            restarts: settings::count("restarts", self.restarts)?,
            pgd_steps: settings::count("pgd_steps", self.pgd_steps)?,
            pgd_rel_stepsize: self.pgd_rel_stepsize,
            apgd_iterations: settings::count("apgd_iterations", self.apgd_iterations)?,
            square_queries: settings::count("square_queries", self.square_queries)?,
            fab_iterations: settings::count("fab_iterations", self.fab_iterations)?,
            boundary_steps: settings::count("boundary_steps", self.boundary_steps)?,
        })
    }
}

impl Budgets {
    /// `factor` times every attack's steps, iterations and queries; the restarts and a PGD step
    /// size given as a fraction of ε as they are (the schedule's own shortens with more steps).
    pub fn scaled(&self, factor: NonZeroUsize) -> Budgets {
        let times = |n: NonZeroUsize| n.saturating_mul(factor);
        Budgets {
            restarts: self.restarts,
            pgd_steps: times(self.pgd_steps),
            pgd_rel_stepsize: self.pgd_rel_stepsize,
            apgd_iterations: times(self.apgd_iterations),
            square_queries: times(self.square_queries),
            fab_iterations: times(self.fab_iterations),
            boundary_steps: times(self.boundary_steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_budgets_multiply_every_count_but_the_restarts() {
        let budgets = Budgets {
            restarts: count(3),
            pgd_rel_stepsize: Some(0.1),
            ..Budgets::default()
        };
        let twice = budgets.scaled(count(2));
        assert_eq!(twice.restarts.get(), 3);
        assert_eq!(twice.pgd_rel_stepsize, Some(0.1));
        assert_eq!(
            [
                twice.pgd_steps,
                twice.apgd_iterations,
                twice.square_queries,
                twice.fab_iterations,
                twice.boundary_steps
            ]
            .map(NonZeroUsize::get),
            [40, 200, 10_000, 200, 2_000]
        );
    }
}
