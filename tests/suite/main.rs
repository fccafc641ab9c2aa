//! jem-bench's integration tests, as one test binary: the command line as a user runs it, the
//! library calls, and real networks on real digits. Each module checks one part; `cargo test
//! --release --test suite harness::` runs one of them.
//!
//! One binary rather than a file per target: every target links burn and instantiates the
//! backend-generic models, attacks and harness again, so fifteen targets compiled the same code
//! fifteen times. Two files stay targets of their own: the GPU agreement tests (`tests/gpu.rs`)
//! run on another machine, with `--ignored`; and `tests/kernels.rs` switches the process-wide
//! choice of kernels, which would change, within rounding, what the tests running beside it in
//! this binary compute (and break those that check a resumed run reproduces every bit).

mod common;

mod attacks;
mod bad_input;
mod bench_cli;
mod calibration_ood;
mod corrupt_readers;
mod full_disk;
mod harness;
mod jem;
mod library_sweep;
mod linearisation;
mod model;
mod onnx;
mod onnx_commands;
mod portable_gradients;
mod sample_quality;
mod training;
