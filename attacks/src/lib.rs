//! jem-attacks: adversarial attacks on burn image classifiers, and the SGLD sampler that JEM
//! uses both to train and, at test time, as a defence (SPEC §3, §4).
//!
//! Pixels are in [0, 1] everywhere; a model maps an `N×C×H×W` batch to `N×K` logits through the
//! [`Classifier`] trait, so that an attack works on any network that implements it.
//!
//! Built so far: the [`Classifier`] interface with input gradients, a [`LinearClassifier`]
//! whose answers are known in closed form, and the [`SgldSampler`]. The attacks themselves
//! (PGD, FGSM, boundary, pointwise, nonsense inputs) are issue #4 and not here yet.

mod boundary;
mod classifier;
mod decision;
mod defence;
mod linear;
mod loss;
mod model;
pub mod noise;
mod norm;
mod outcome;
mod pgd;
mod pointwise;
mod sgld;

pub use boundary::BoundaryConfig;
pub use classifier::{input_gradient, log_sum_exp, Classifier};
pub use decision::Oracle;
pub use defence::{GradMode, HessianVector, SgldDefence, SgldDefenceConfig};
pub use linear::LinearClassifier;
pub use loss::AttackLoss;
pub use model::{LossFn, Model, Undefended};
pub use norm::Norm;
pub use outcome::{AttackOutcome, ExampleOutcome};
pub use pgd::PgdConfig;
pub use pointwise::PointwiseConfig;
pub use sgld::{SgldConfig, SgldSampler, SgldTarget, UniformInit};
