//! The attack a cell runs, built from the sweep's settings ([`AttackKind::build`]): a fixed-ε
//! attack, a minimum-perturbation attack, or a preset: jem-attacks' [`AutoAttack`] cascade. What each attack needs
//! of the model (gradients, scores, decisions) is what the attack itself declares
//! ([`Describe::access`]), read from the same configuration.

use jem_attacks::{Access, Attack, AutoAttack, Cascade, MinimumPerturbation, Model};

use super::builtin::Single;
use super::cells::AttackKind;
use super::spec::SweepSpec;
use crate::backend::BenchBackend;

/// The attack a cell runs, configured from the sweep's settings.
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

impl AttackKind {
    /// What the attack needs of the model, as it declares it (a preset: the most any of its
    /// attacks needs). A gradient attack has a gradient mode through the SGLD steps and EOT.
    pub fn access(self) -> Access {
        let spec = SweepSpec::default();
        let each = self.stages().into_iter();
        each.map(|kind| single(&spec, kind, 1).description().access())
            .max()
            .expect("every attack has at least one stage")
    }

    /// The attack configured from the sweep's settings, with `eot` gradient draws per step.
    pub(super) fn build<'a, B: BenchBackend, M: Model<B> + 'a>(
        self,
        spec: &SweepSpec,
        eot: usize,
    ) -> Configured<'a, B, M> {
        let Some(version) = self.autoattack_version() else {
            return bind(single(spec, self, eot));
        };
        let autoattack = AutoAttack {
            version,
            norm: spec.threat.norm,
            apgd_iterations: spec.budgets.apgd_iterations.get(),
            apgd_restarts: spec.budgets.restarts.get(),
            fab_iterations: spec.budgets.fab_iterations.get(),
            square_queries: spec.budgets.square_queries.get(),
            eot,
            seed: spec.seed,
        };
        Configured::Cascade(self.stages(), autoattack.cascade())
    }
}

/// The attack on backend `B` and model `M`: fixed-ε or minimum-perturbation.
fn bind<'a, B: BenchBackend, M: Model<B> + 'a>(single: Single) -> Configured<'a, B, M> {
    match single {
        Single::Pgd(a) => Configured::PerEps(Box::new(a)),
        Single::Apgd(a) => Configured::PerEps(Box::new(a)),
        Single::Square(a) => Configured::PerEps(Box::new(a)),
        Single::Fab(a) => Configured::Minimum(Box::new(a)),
        Single::Boundary(a) => Configured::Minimum(Box::new(a)),
        Single::Pointwise(a) => Configured::Minimum(Box::new(a)),
    }
}

/// The single attack `kind` configured from the sweep's settings (its [`BuiltIn`] entry).
///
/// [`BuiltIn`]: super::builtin::BuiltIn
fn single(spec: &SweepSpec, kind: AttackKind, eot: usize) -> Single {
    (kind.entry().configure)(spec, eot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::budgets::Budgets;
    use crate::Choice;
    use std::num::NonZeroUsize;

    #[test]
    fn each_attack_declares_what_it_needs_of_the_model() {
        for &kind in AttackKind::ALL {
            let want = match kind {
                AttackKind::Square => Access::Scores,
                AttackKind::Boundary | AttackKind::Pointwise => Access::Decisions,
                // Every other attack, and every preset (each holds a gradient attack).
                _ => Access::Gradients,
            };
            assert_eq!(kind.access(), want, "{}", kind.name());
        }
    }

    /// A preset's stages, built by jem-attacks' AutoAttack, take exactly the settings each of
    /// those attacks takes on its own in a sweep of the same budgets.
    #[test]
    fn a_presets_stages_are_configured_as_the_single_attacks() {
        type B = crate::backend::Train;
        type M = jem_attacks::Undefended<jem_attacks::LinearClassifier<B>>;
        let spec = SweepSpec {
            budgets: Budgets {
                apgd_iterations: NonZeroUsize::new(7).unwrap(),
                restarts: NonZeroUsize::new(2).unwrap(),
                fab_iterations: NonZeroUsize::new(5).unwrap(),
                square_queries: NonZeroUsize::new(40).unwrap(),
                ..Budgets::default()
            },
            seed: 9,
            ..SweepSpec::default()
        };
        for preset in [AttackKind::AutoAttack, AttackKind::AutoAttackRand] {
            let Configured::Cascade(kinds, cascade) = preset.build::<B, M>(&spec, 3) else {
                panic!("{} is a cascade", preset.name());
            };
            assert_eq!(kinds, preset.stages());
            assert_eq!(kinds.len(), cascade.attacks.len());
            for (kind, attack) in kinds.iter().zip(&cascade.attacks) {
                let alone = single(&spec, *kind, 3);
                assert_eq!(attack.name(), alone.description().name());
                assert_eq!(attack.settings(), alone.description().settings());
            }
        }
    }
}
