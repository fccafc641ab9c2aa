//! The command line: one flag struct per command (clap), each converting into the library's
//! settings type (`SweepSpec`, `CalibrateSpec`, …) and calling the library, which never sees
//! clap; refused settings come back naming their field, and [`robust::with_flags`] shows them
//! with their flag.

pub mod bench;
pub mod calibrate;
pub mod choices;
pub mod defence;
pub mod harness;
pub mod lists;
pub mod nonsense;
pub mod ood;
pub mod robust;
pub mod sample;
pub mod train;
