//! jem-attacks: adversarial attacks on burn image classifiers, and the SGLD sampler that JEM
//! (Grathwohl et al., ICLR 2020) uses both to train and, at test time, as a defence.
//!
//! Pixels are in [0, 1] everywhere; a model maps an `N×C×H×W` batch to `N×K` logits through the
//! [`Classifier`] trait, so that an attack works on any network that implements it. One call —
//! model, inputs, labels, a list of ε — returns one [`AttackOutcome`] per ε: per example,
//! whether it was broken and how far the adversarial input is ([`Attack`]):
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::{Int, Tensor, TensorData};
//! use jem_attacks::{ApgdConfig, ApgdLoss, Attack, LinearClassifier, Norm, Undefended};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! // Any burn module implementing `Classifier`; here a 3-class linear model of 2×2 images.
//! let weight = vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
//! let model = Undefended::new(LinearClassifier::<B>::new(weight, vec![0.3, 0.0, 0.0], 3, &device));
//! let x = Tensor::<Flex, 4>::from_data(TensorData::new(vec![0.5; 4], [1, 1, 2, 2]), &device);
//! let y = Tensor::<Flex, 1, Int>::from_data(TensorData::new(vec![0i64], [1]), &device);
//!
//! // Class 0 leads by 0.3; under L∞ the closest boundary is 0.15 away.
//! let apgd = ApgdConfig::new(Norm::Linf, ApgdLoss::CrossEntropy);
//! let per_eps = apgd.attack(&model, x, y, &[0.14, 0.16]).unwrap();
//! let (held, broken) = (&per_eps[0].examples[0], &per_eps[1].examples[0]);
//! assert!(held.stands()); // classified correctly, not broken
//! assert!(broken.adversarial && broken.linf <= 0.16 + 1e-6);
//! ```
//!
//! Fixed-ε attacks run the list in ascending order on the examples no smaller ε broke (a break
//! carries to every larger ε); minimum-perturbation attacks run once, wrapped in
//! [`MinimumNorm`]. Each attack also has `run`, at a single ε. Every attack declares what it
//! is in [`Describe`] (name, settings, the [`Access`] it needs of the model: gradients, scores
//! or decisions; whether it is randomised). An attack of your own joins them by implementing
//! it and [`FixedEpsilon`] (one run at one ε), wrapped in [`PerEpsilon`], or
//! [`MinimumPerturbation`] and [`MinimumNorm`]; a [`Cascade`] runs attacks
//! one after another, each on what the ones before left standing.
//!
//! - [`Model`]: what an attack sees — [`Undefended`], or [`SgldDefence`] (JEM-K: K SGLD steps
//!   in n chains before classifying, gradients `full` or `bpda`, Athalye et al. 2018).
//! - Gradient attacks: [`ApgdConfig`] (APGD-CE, APGD-DLR, APGD-T; Croce & Hein 2020),
//!   [`PgdConfig`] (PGD and FGSM / FGM; restarts, EOT, early stop), all under L∞ and L2 through
//!   one [`Norm`] type; [`NonsenseConfig`] (targeted search from noise).
//! - Minimum-perturbation, gradient-based: [`FabConfig`] (FAB and FAB-T, Croce & Hein 2020,
//!   L∞ and L2), answering every ε at once through [`MinimumNorm`].
//! - Score-based: [`SquareConfig`] (Andriushchenko et al. 2020, L∞ and L2). Decision-based:
//!   [`BoundaryConfig`], [`PointwiseConfig`].
//! - Ensembles: [`AutoAttack`] (Croce & Hein 2020), its standard version and the one for
//!   randomised defences, as a [`Cascade`].
//! - Every attack returns an [`AttackOutcome`]: per example, adversarial or not (re-checked;
//!   with many chains for a stochastic model), L0 / L2 / L∞ distances in pixel units, gradient
//!   and forward evaluations.

// burn's `slice` takes one range per dimension: `[0..n]` is a one-dimension slice, not a
// mistaken `Vec` of a range.
#![allow(clippy::single_range_in_vec_init)]
#![warn(missing_docs)]

mod apgd;
mod attack;
mod autoattack;
mod boundary;
mod channels;
mod classifier;
mod decision;
mod defence;
mod error;
mod fab;
mod hyperplane;
mod linear;
mod loss;
mod model;
pub mod noise;
mod nonsense;
mod norm;
mod outcome;
mod pgd;
mod pointwise;
mod sgld;
mod square;

pub use apgd::{
    checkpoints as apgd_checkpoints, should_halve as apgd_should_halve, ApgdConfig, ApgdLoss,
};
pub use attack::{
    Access, Attack, Cascade, Describe, FixedEpsilon, MinimumNorm, MinimumPerturbation, PerEpsilon,
};
pub use autoattack::{AutoAttack, AutoAttackVersion};
pub use boundary::BoundaryConfig;
pub use channels::{scale_channels, shift_channels};
pub use classifier::{
    input_gradient, log_sum_exp, log_sum_exp_hessian_vector, Classifier, Linearised,
};
pub use decision::Oracle;
pub use defence::{GradMode, HessianVector, SgldDefence, SgldDefenceConfig};
pub use error::{AttackError, UnknownName};
pub use fab::FabConfig;
pub use hyperplane::{hyperplane_step_l2, hyperplane_step_linf};
pub use linear::LinearClassifier;
pub use loss::{kl_divergence, targeted_dlr, AttackLoss};
pub use model::{LossFn, Model, Undefended};
pub use nonsense::{NonsenseConfig, NonsenseOutcome};
pub use norm::Norm;
pub use outcome::{AttackOutcome, ExampleOutcome};
pub use pgd::PgdConfig;
pub use pointwise::PointwiseConfig;
pub use sgld::{PixelStep, SgldConfig, SgldSampler, SgldTarget, UniformInit};
pub use square::SquareConfig;
