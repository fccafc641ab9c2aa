//! Training a [`WideResNet`](crate::model::WideResNet): the shared loop (schedule, augmentation,
//! data noise, validation, best checkpoint, resumable state, CSV log, divergence guard) and the
//! objectives that plug into it: the plain classifier, JEM and PGD adversarial training.

mod adversarial;
mod augment;
mod chain_start;
mod config;
pub mod curves;
mod guard;
mod jem;
mod log;
mod objective;
mod opening;
mod replay_buffer;
mod resume;
mod schedule;
mod state;
mod trainer;

pub use adversarial::{AdvConfig, AdversarialObjective};
pub use augment::Augmentation;
pub use chain_start::{ChainStart, ChainStartKind, ClassGaussians};
pub use config::{TrainKind, TrainSpec};
pub use guard::GuardConfig;
pub use jem::{chain_init, JemConfig, JemObjective};
pub use log::CsvLog;
pub use objective::{accuracy, cross_entropy, ClassifierObjective, Objective, Step, StepStats};
pub use replay_buffer::{Draw, ReplayBuffer};
pub use schedule::LrSchedule;
pub(crate) use state::StateDir;
pub(crate) use trainer::stream_seed;
pub use trainer::{adam, descend, train, TrainOutcome};
