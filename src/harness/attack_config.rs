//! The attack a cell runs, built from the sweep's settings: a fixed-ε attack, a
//! minimum-perturbation attack, or a preset's cascade of them.

use jem_attacks::{
    ApgdConfig, ApgdLoss, Attack, BoundaryConfig, Cascade, FabConfig, MinimumNorm,
    MinimumPerturbation, Model, PgdConfig, PointwiseConfig, SquareConfig,
};

use super::cells::AttackKind;
use super::spec::SweepSpec;
use crate::backend::BenchBackend;
use crate::Choice;

/// The attack a cell runs, configured from the sweep's flags.
pub(super) enum Configured<'a, B: BenchBackend, M: Model<B>> {
    /// A fixed-ε attack: run at every ε of the grid, ascending, on the examples no smaller ε
    /// broke.
    PerEps(Box<dyn Attack<B, M> + 'a>),
    /// A minimum-perturbation attack: one run answers every ε.
    Minimum(Box<dyn MinimumPerturbation<B, M> + 'a>),
    /// A preset: its attacks one after another, each at each ε on what the ones before left
    /// standing.
    Cascade(Vec<AttackKind>, Cascade<'a, B, M>),
}

pub(super) fn configure<'a, B: BenchBackend, M: Model<B> + 'a>(
    spec: &SweepSpec,
    attack: AttackKind,
    eot: usize,
) -> anyhow::Result<Configured<'a, B, M>> {
    let norm = spec.norm;
    if attack.is_preset() {
        let kinds = attack.stages();
        let attacks = kinds
            .iter()
            .map(|&kind| {
                Ok(match configure::<B, M>(spec, kind, eot)? {
                    Configured::PerEps(a) => a,
                    // Inside a cascade a minimum-norm attack answers each ε by its distance.
                    Configured::Minimum(a) => Box::new(MinimumNorm { attack: a, norm }) as _,
                    Configured::Cascade(..) => anyhow::bail!("presets do not nest"),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        return Ok(Configured::Cascade(
            kinds,
            Cascade {
                name: attack.name(),
                attacks,
            },
        ));
    }
    Ok(match attack {
        AttackKind::Pgd | AttackKind::PgdLong | AttackKind::Fgsm => {
            let mut cfg = match attack {
                AttackKind::Fgsm => PgdConfig::fgsm(norm),
                pgd => {
                    let (steps, rel_stepsize) = spec.pgd_schedule(pgd);
                    PgdConfig {
                        steps,
                        restarts: spec.restarts_of(pgd),
                        rel_stepsize,
                        ..PgdConfig::pgd(norm)
                    }
                }
            };
            cfg.eot = eot;
            cfg.seed = spec.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::ApgdCe | AttackKind::ApgdDlr | AttackKind::ApgdT => {
            let loss = match attack {
                AttackKind::ApgdCe => ApgdLoss::CrossEntropy,
                AttackKind::ApgdDlr => ApgdLoss::Dlr,
                _ => ApgdLoss::TargetedDlr,
            };
            let mut cfg = ApgdConfig::new(norm, loss);
            cfg.iterations = spec.apgd_iterations;
            cfg.restarts = spec.restarts_of(attack);
            cfg.eot = eot;
            cfg.seed = spec.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::Square => {
            let mut cfg = SquareConfig::new(norm);
            cfg.queries = spec.square_queries;
            cfg.seed = spec.seed;
            Configured::PerEps(Box::new(cfg))
        }
        AttackKind::FabT => {
            let mut cfg = FabConfig::new(norm);
            cfg.iterations = spec.fab_iterations;
            cfg.eot = eot;
            cfg.seed = spec.seed;
            Configured::Minimum(Box::new(cfg))
        }
        AttackKind::Boundary => Configured::Minimum(Box::new(BoundaryConfig {
            steps: spec.boundary_steps,
            seed: spec.seed,
            ..Default::default()
        })),
        AttackKind::Pointwise => Configured::Minimum(Box::new(PointwiseConfig {
            seed: spec.seed,
            ..Default::default()
        })),
        AttackKind::AutoAttack | AttackKind::AutoAttackRand | AttackKind::Adaptive => {
            unreachable!("presets are configured as cascades above")
        }
    })
}
