//! jem-attacks: adversarial attacks on burn image classifiers, and the SGLD sampler that JEM
//! uses both to train and, at test time, as a defence (SPEC §3, §4).
//!
//! Pixels are in [0, 1] everywhere; a model maps an `N×C×H×W` batch to `N×K` logits through the
//! [`Classifier`] trait, so that an attack works on any network that implements it.
//!
//! - [`Model`]: what an attack sees — [`Undefended`], or [`SgldDefence`] (JEM-K: K SGLD steps
//!   in n chains before classifying, gradients `full` or `bpda`).
//! - Gradient attacks: [`PgdConfig`] (PGD and FGSM / FGM, L∞ and L2 through one [`Norm`] type,
//!   restarts, EOT, early stop); [`NonsenseConfig`] (targeted search from noise).
//! - Decision-based attacks: [`BoundaryConfig`], [`PointwiseConfig`].
//! - Every attack returns an [`AttackOutcome`]: per example, adversarial or not (re-checked),
//!   L0 / L2 / L∞ distances in pixel units, gradient and forward evaluations.

mod apgd;
mod boundary;
mod classifier;
mod decision;
mod defence;
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

pub use apgd::{checkpoints as apgd_checkpoints, should_halve as apgd_should_halve, ApgdConfig, ApgdLoss};
pub use boundary::BoundaryConfig;
pub use classifier::{input_gradient, log_sum_exp, Classifier};
pub use decision::Oracle;
pub use defence::{GradMode, HessianVector, SgldDefence, SgldDefenceConfig};
pub use linear::LinearClassifier;
pub use loss::{targeted_dlr, AttackLoss};
pub use model::{LossFn, Model, Undefended};
pub use nonsense::{NonsenseConfig, NonsenseOutcome};
pub use norm::Norm;
pub use outcome::{AttackOutcome, ExampleOutcome};
pub use pgd::PgdConfig;
pub use pointwise::PointwiseConfig;
pub use square::SquareConfig;
pub use sgld::{SgldConfig, SgldSampler, SgldTarget, UniformInit};
