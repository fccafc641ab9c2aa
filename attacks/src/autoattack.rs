//! AutoAttack (Croce & Hein 2020): a fixed ensemble of parameter-free attacks run as a
//! [`Cascade`], each on what the ones before it left standing. Two versions, as the official
//! code has them: `standard` (APGD-CE, APGD-T, FAB-T, Square) for deterministic models, and
//! `rand` (APGD-CE, APGD-DLR with their gradients averaged over EOT draws) for randomised
//! defences, whose stochastic outputs the score- and decision-based stages would misread.

use burn::tensor::backend::AutodiffBackend;

use crate::{
    ApgdConfig, ApgdLoss, Attack, Cascade, FabConfig, MinimumNorm, Model, Norm, SquareConfig,
};

/// Which of AutoAttack's ensembles to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoAttackVersion {
    /// APGD-CE, APGD-T, FAB-T and Square: the version for deterministic models.
    Standard,
    /// APGD-CE and APGD-DLR, each gradient averaged over `eot` draws: the version for
    /// randomised defences.
    Rand,
}

/// AutoAttack's ensemble with its budgets; [`AutoAttack::cascade`] builds the attacks.
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use jem_attacks::{AutoAttack, Describe, Norm, Undefended, LinearClassifier};
///
/// type B = Autodiff<Flex>;
/// let standard = AutoAttack::standard(Norm::Linf);
/// let cascade = standard.cascade::<B, Undefended<LinearClassifier<B>>>();
/// let names: Vec<_> = cascade.attacks.iter().map(|a| a.name()).collect();
/// assert_eq!(names, ["apgd-ce", "apgd-t", "fab-t", "square"]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AutoAttack {
    /// The ensemble.
    pub version: AutoAttackVersion,
    /// The threat model every stage attacks under.
    pub norm: Norm,
    /// Iterations of each APGD stage (official: 100).
    pub apgd_iterations: usize,
    /// Restarts of each APGD stage (official: 1 in the standard version, as here).
    pub apgd_restarts: usize,
    /// Iterations of FAB-T per target class (official: 100).
    pub fab_iterations: usize,
    /// Queries of the Square attack (official: 5 000).
    pub square_queries: usize,
    /// Gradient draws averaged per step of the gradient stages (official: 1 in the standard
    /// version, 20 in `rand`).
    pub eot: usize,
    /// Seed of every stage's random starts and draws.
    pub seed: u64,
}

impl AutoAttack {
    /// The standard version with the official budgets.
    pub fn standard(norm: Norm) -> Self {
        AutoAttack {
            version: AutoAttackVersion::Standard,
            norm,
            apgd_iterations: 100,
            apgd_restarts: 1,
            fab_iterations: 100,
            square_queries: 5000,
            eot: 1,
            seed: 0,
        }
    }

    /// The version for randomised defences with the official budgets (20 EOT draws).
    pub fn rand(norm: Norm) -> Self {
        AutoAttack {
            version: AutoAttackVersion::Rand,
            eot: 20,
            ..AutoAttack::standard(norm)
        }
    }

    /// The version's name: `autoattack` or `autoattack-rand`.
    pub fn name(&self) -> &'static str {
        match self.version {
            AutoAttackVersion::Standard => "autoattack",
            AutoAttackVersion::Rand => "autoattack-rand",
        }
    }

    /// The names of the version's attacks, in the order they run.
    pub fn stage_names(version: AutoAttackVersion) -> &'static [&'static str] {
        match version {
            AutoAttackVersion::Standard => &["apgd-ce", "apgd-t", "fab-t", "square"],
            AutoAttackVersion::Rand => &["apgd-ce", "apgd-dlr"],
        }
    }

    /// The ensemble as a cascade on backend `B` and model `M`; FAB-T, a minimum-perturbation
    /// attack, answers each ε by the distance it found.
    pub fn cascade<'a, B: AutodiffBackend, M: Model<B> + 'a>(&self) -> Cascade<'a, B, M> {
        let apgd = |loss| ApgdConfig {
            iterations: self.apgd_iterations,
            restarts: self.apgd_restarts,
            eot: self.eot,
            seed: self.seed,
            ..ApgdConfig::new(self.norm, loss)
        };
        let attacks: Vec<Box<dyn Attack<B, M> + 'a>> = match self.version {
            AutoAttackVersion::Standard => vec![
                Box::new(apgd(ApgdLoss::CrossEntropy)),
                Box::new(apgd(ApgdLoss::TargetedDlr)),
                Box::new(MinimumNorm {
                    attack: FabConfig {
                        iterations: self.fab_iterations,
                        eot: self.eot,
                        seed: self.seed,
                        ..FabConfig::new(self.norm)
                    },
                    norm: self.norm,
                }),
                Box::new(SquareConfig {
                    queries: self.square_queries,
                    seed: self.seed,
                    ..SquareConfig::new(self.norm)
                }),
            ],
            AutoAttackVersion::Rand => vec![
                Box::new(apgd(ApgdLoss::CrossEntropy)),
                Box::new(apgd(ApgdLoss::Dlr)),
            ],
        };
        Cascade {
            name: self.name(),
            attacks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Describe, LinearClassifier, Undefended};
    use burn::backend::{Autodiff, Flex};

    type B = Autodiff<Flex>;
    type M = Undefended<LinearClassifier<B>>;

    #[test]
    fn each_version_builds_its_stages_in_order_with_its_budgets() {
        for aa in [AutoAttack::standard(Norm::L2), AutoAttack::rand(Norm::Linf)] {
            let cascade = aa.cascade::<B, M>();
            let names: Vec<&str> = cascade.attacks.iter().map(|a| a.name()).collect();
            assert_eq!(names, AutoAttack::stage_names(aa.version));
            assert_eq!(cascade.name, aa.name());
            let settings = cascade.attacks[0].settings();
            assert_eq!(settings["iterations"], 100);
            assert_eq!(settings["eot"], aa.eot);
        }
    }
}
