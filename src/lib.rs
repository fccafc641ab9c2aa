//! jem-bench: train Wide-ResNets as classifiers, as JEMs and adversarially, then measure their
//! robustness. This crate holds the models, the trainers, the evaluation metrics and the CLI;
//! the attacks live in `jem-attacks`, the data in `jem-datasets`.

// burn's `slice` takes one range per dimension: `[0..n]` is a one-dimension slice, not a
// mistaken `Vec` of a range.
#![allow(clippy::single_range_in_vec_init)]
pub mod backend;
pub mod batches;
pub mod bench;
pub mod calibration;
pub mod choice;
pub mod defended;
pub mod digest;
pub mod duration;
pub mod energy;
pub mod harness;
pub mod image_grid;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod nonsense;
pub mod ood;
pub mod output_folder;
pub mod plot;
pub mod sample;
pub mod seeds;
pub mod settings;
pub mod slurm;
pub mod tables;
pub mod test_set;
pub mod train;

pub use choice::Choice;
