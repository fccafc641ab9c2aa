//! jem-bench's integration tests, as one test binary: the command line as a user runs it, the
//! library calls, and real networks on real digits. Each module checks one part; `cargo test
//! --release --test suite harness::` runs one of them.
//!
//! One binary rather than a file per target: every target links burn and instantiates the
//! backend-generic models, attacks and harness again, so fifteen targets compiled the same code
//! fifteen times. The GPU agreement tests (`tests/gpu.rs`) stay a target of their own: they run
//! on another machine, with `--ignored`.

mod common;

mod attacks;
mod bad_input;
mod bench_cli;
mod calibration_ood;
mod corrupt_readers;
mod harness;
mod jem;
mod kernels;
mod library_sweep;
mod linearisation;
mod model;
mod portable_gradients;
mod sample_quality;
mod training;
