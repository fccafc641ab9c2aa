//! The built-in attacks, one entry each ([`BuiltIn`]): the attack configured from the sweep's
//! budgets, its restarts, what one example costs it in input gradients, whether one run
//! answers every ε, the classes its loss needs and the settings that set its budget. The
//! cells' attacks ([`super::attack_config`]), the estimate, the convergence check's cost, the
//! plan's checks, the rows and the command line's notes on unused flags all read the entry, so
//! a new built-in attack is its [`AttackKind`] variant, its entry here, and the flag of a new
//! budget if it has one.

use jem_attacks::{
    ApgdConfig, ApgdLoss, BoundaryConfig, Describe, FabConfig, PgdConfig, PointwiseConfig,
    SquareConfig,
};

use super::cells::AttackKind;
use super::spec::SweepSpec;

/// A forward pass costs about half an input gradient (a backward pass costs about as much as
/// the forward one); score- and decision-based attacks are counted so.
pub(super) const FORWARD: f64 = 0.5;

/// Targets of the targeted attacks (APGD-T, FAB-T): the 9 most likely other classes.
const TARGETS: usize = 9;

/// Decision-based pointwise attack: about this many model queries per example.
const POINTWISE_QUERIES: f64 = 2_000.0;

/// What the harness knows of one built-in attack.
pub(super) struct BuiltIn {
    /// The attack configured from the sweep's settings, with `eot` gradient draws per step.
    pub configure: fn(&SweepSpec, usize) -> Single,
    /// Its restarts under the sweep's settings (1 for an attack that does not restart).
    pub restarts: fn(&SweepSpec) -> usize,
    /// Input gradients one example takes at most in one run (a forward pass counted as
    /// [`FORWARD`]), at `eot` draws per gradient against `classes` classes.
    pub gradients: fn(&SweepSpec, Draws) -> f64,
    /// One run answers every ε (a minimum-perturbation attack), rather than one run per ε.
    pub once_for_every_eps: bool,
    /// Classes its loss needs at least.
    pub min_classes: usize,
    /// The settings (their flags' ids) that set its budget.
    pub budget: &'static [&'static str],
}

/// One attack (not a preset) with its settings, before it is bound to a backend and model.
pub(super) enum Single {
    Pgd(PgdConfig),
    Apgd(ApgdConfig),
    Square(SquareConfig),
    Fab(FabConfig),
    Boundary(BoundaryConfig),
    Pointwise(PointwiseConfig),
}

impl Single {
    /// What the attack declares of itself.
    pub(super) fn description(&self) -> &dyn Describe {
        match self {
            Single::Pgd(a) => a,
            Single::Apgd(a) => a,
            Single::Square(a) => a,
            Single::Fab(a) => a,
            Single::Boundary(a) => a,
            Single::Pointwise(a) => a,
        }
    }
}

/// What a run's gradient count depends on besides the budgets.
#[derive(Clone, Copy)]
pub(super) struct Draws {
    /// EOT draws per gradient.
    pub eot: f64,
    /// Classes of the data set.
    pub classes: usize,
}

impl Draws {
    /// Target classes of a targeted attack: the 9 most likely others, or all the others.
    fn targets(self) -> f64 {
        TARGETS.min(self.classes.saturating_sub(1)) as f64
    }
}

impl AttackKind {
    /// The entry of a single attack; `None` for a preset (its stages have theirs).
    pub(super) fn built_in(self) -> Option<&'static BuiltIn> {
        Some(match self {
            AttackKind::Pgd => &PGD,
            AttackKind::PgdLong => &PGD_LONG,
            AttackKind::Fgsm => &FGSM,
            AttackKind::ApgdCe => &APGD_CE,
            AttackKind::ApgdDlr => &APGD_DLR,
            AttackKind::ApgdT => &APGD_T,
            AttackKind::Square => &SQUARE,
            AttackKind::FabT => &FAB_T,
            AttackKind::Boundary => &BOUNDARY,
            AttackKind::Pointwise => &POINTWISE,
            AttackKind::AutoAttack | AttackKind::AutoAttackRand | AttackKind::Adaptive => {
                return None
            }
        })
    }

    /// The settings that set the attack's budget, as the flags' ids name them (`apgd_iterations`
    /// for the APGD attacks); none for a preset, FGSM and the pointwise attack.
    pub fn budget_settings(self) -> &'static [&'static str] {
        self.built_in().map_or(&[], |entry| entry.budget)
    }

    /// The entry of a single attack (a preset's stage).
    ///
    /// # Panics
    /// For a preset.
    pub(super) fn entry(self) -> &'static BuiltIn {
        self.built_in()
            .expect("a preset's stages are single attacks")
    }
}

const PGD_BUDGET: &[&str] = &["pgd_steps", "pgd_rel_stepsize"];
const APGD_BUDGET: &[&str] = &["apgd_iterations"];

static PGD: BuiltIn = BuiltIn {
    configure: |spec, eot| pgd(spec, 1, spec.budgets.restarts.get(), eot),
    restarts: |spec| spec.budgets.restarts.get(),
    gradients: |spec, d| pgd_steps(spec, 1).0 as f64 * spec.budgets.restarts.get() as f64 * d.eot,
    once_for_every_eps: false,
    min_classes: 2,
    budget: PGD_BUDGET,
};

/// PGD with 4× the steps, each 4× shorter, and twice the restarts: it can cross the ball as
/// often, more finely, from more starts.
static PGD_LONG: BuiltIn = BuiltIn {
    configure: |spec, eot| pgd(spec, 4, 2 * spec.budgets.restarts.get(), eot),
    restarts: |spec| 2 * spec.budgets.restarts.get(),
    gradients: |spec, d| {
        pgd_steps(spec, 4).0 as f64 * 2.0 * spec.budgets.restarts.get() as f64 * d.eot
    },
    once_for_every_eps: false,
    min_classes: 2,
    budget: PGD_BUDGET,
};

static FGSM: BuiltIn = BuiltIn {
    configure: |spec, eot| {
        Single::Pgd(PgdConfig {
            eot,
            seed: spec.seed,
            ..PgdConfig::fgsm(spec.threat.norm)
        })
    },
    restarts: |_| 1,
    gradients: |_, d| d.eot,
    once_for_every_eps: false,
    min_classes: 2,
    budget: &[],
};

static APGD_CE: BuiltIn = BuiltIn {
    configure: |spec, eot| apgd(spec, ApgdLoss::CrossEntropy, eot),
    restarts: |spec| spec.budgets.restarts.get(),
    gradients: |spec, d| apgd_gradients(spec, d),
    once_for_every_eps: false,
    min_classes: 2,
    budget: APGD_BUDGET,
};

/// The difference-of-logits-ratio loss reads the three largest logits.
static APGD_DLR: BuiltIn = BuiltIn {
    configure: |spec, eot| apgd(spec, ApgdLoss::Dlr, eot),
    restarts: |spec| spec.budgets.restarts.get(),
    gradients: |spec, d| apgd_gradients(spec, d),
    once_for_every_eps: false,
    min_classes: 3,
    budget: APGD_BUDGET,
};

/// One run per target class; the targeted DLR loss reads four logits.
static APGD_T: BuiltIn = BuiltIn {
    configure: |spec, eot| apgd(spec, ApgdLoss::TargetedDlr, eot),
    restarts: |spec| spec.budgets.restarts.get(),
    gradients: |spec, d| apgd_gradients(spec, d) * d.targets(),
    once_for_every_eps: false,
    min_classes: 4,
    budget: APGD_BUDGET,
};

static SQUARE: BuiltIn = BuiltIn {
    configure: |spec, _| {
        let mut cfg = SquareConfig::new(spec.threat.norm);
        cfg.queries = spec.budgets.square_queries.get();
        cfg.seed = spec.seed;
        Single::Square(cfg)
    },
    restarts: |_| 1,
    gradients: |spec, _| spec.budgets.square_queries.get() as f64 * FORWARD,
    once_for_every_eps: false,
    min_classes: 2,
    budget: &["square_queries"],
};

/// Once for every ε, on its own and inside a cascade (there on the examples standing at any
/// ε); a forward pass beside each iteration's gradient, per target class.
static FAB_T: BuiltIn = BuiltIn {
    configure: |spec, eot| {
        let mut cfg = FabConfig::new(spec.threat.norm);
        cfg.iterations = spec.budgets.fab_iterations.get();
        cfg.eot = eot;
        cfg.seed = spec.seed;
        Single::Fab(cfg)
    },
    restarts: |_| 1,
    gradients: |spec, d| spec.budgets.fab_iterations.get() as f64 * d.targets() * (d.eot + FORWARD),
    once_for_every_eps: true,
    min_classes: 2,
    budget: &["fab_iterations"],
};

static BOUNDARY: BuiltIn = BuiltIn {
    configure: |spec, _| {
        Single::Boundary(BoundaryConfig {
            steps: spec.budgets.boundary_steps.get(),
            seed: spec.seed,
            ..Default::default()
        })
    },
    restarts: |_| 1,
    gradients: |spec, _| spec.budgets.boundary_steps.get() as f64 * FORWARD,
    once_for_every_eps: true,
    min_classes: 2,
    budget: &["boundary_steps"],
};

static POINTWISE: BuiltIn = BuiltIn {
    configure: |spec, _| {
        Single::Pointwise(PointwiseConfig {
            seed: spec.seed,
            ..Default::default()
        })
    },
    restarts: |_| 1,
    gradients: |_, _| POINTWISE_QUERIES * FORWARD,
    once_for_every_eps: true,
    min_classes: 2,
    budget: &[],
};

/// PGD steps and step size (a fraction of ε) at `factor` times `--pgd-steps`, each step
/// `factor` times shorter than the schedule's (2.5 / steps, or `--pgd-rel-stepsize`).
fn pgd_steps(spec: &SweepSpec, factor: usize) -> (usize, f32) {
    let steps = spec.budgets.pgd_steps.get() * factor;
    let rel = spec
        .budgets
        .pgd_rel_stepsize
        .map_or(2.5 / steps.max(1) as f32, |r| r / factor as f32);
    (steps, rel)
}

fn pgd(spec: &SweepSpec, factor: usize, restarts: usize, eot: usize) -> Single {
    let (steps, rel_stepsize) = pgd_steps(spec, factor);
    Single::Pgd(PgdConfig {
        steps,
        restarts,
        rel_stepsize,
        eot,
        seed: spec.seed,
        ..PgdConfig::pgd(spec.threat.norm)
    })
}

fn apgd(spec: &SweepSpec, loss: ApgdLoss, eot: usize) -> Single {
    let mut cfg = ApgdConfig::new(spec.threat.norm, loss);
    cfg.iterations = spec.budgets.apgd_iterations.get();
    cfg.restarts = spec.budgets.restarts.get();
    cfg.eot = eot;
    cfg.seed = spec.seed;
    Single::Apgd(cfg)
}

fn apgd_gradients(spec: &SweepSpec, d: Draws) -> f64 {
    spec.budgets.apgd_iterations.get() as f64 * spec.budgets.restarts.get() as f64 * d.eot
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::budgets::Budgets;
    use crate::Choice;
    use std::num::NonZeroUsize;

    /// Every single attack has an entry, and its restarts are what its configuration runs.
    #[test]
    fn every_single_attack_has_an_entry_whose_restarts_it_runs() {
        let spec = SweepSpec {
            budgets: Budgets {
                restarts: NonZeroUsize::new(3).unwrap(),
                ..Budgets::default()
            },
            ..SweepSpec::default()
        };
        for &kind in AttackKind::ALL {
            let Some(entry) = kind.built_in() else {
                assert!(kind.is_preset(), "{} has no entry", kind.name());
                continue;
            };
            let settings = (entry.configure)(&spec, 1).description().settings();
            let restarts = settings.get("restarts").and_then(|r| r.as_u64());
            assert_eq!(
                restarts.unwrap_or(1) as usize,
                (entry.restarts)(&spec),
                "{}",
                kind.name()
            );
        }
    }
}
