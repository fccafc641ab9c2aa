//! Training a [`WideResNet`](crate::model::WideResNet): the shared loop (schedule, augmentation,
//! data noise, validation, best checkpoint, resumable state, CSV log) and the objectives that
//! plug into it. `baseline` is the plain classifier; later kinds (JEM, adversarial) are further
//! [`Objective`]s on the same loop.

mod augment;
mod config;
mod log;
mod objective;
mod schedule;
mod state;
mod trainer;

pub use augment::Augmentation;
pub use config::{TrainConfig, TrainKind};
pub use log::CsvLog;
pub use objective::{cross_entropy, ClassifierObjective, Objective, StepStats};
pub use schedule::LrSchedule;
pub use trainer::{train, TrainOutcome};
