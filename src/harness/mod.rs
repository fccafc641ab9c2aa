//! The robustness harness: `jem-bench robust` sweeps models × attacks × ε × sampling steps K ×
//! gradient mode, one resumable cell at a time, and writes tidy CSV, per-example CSV, a JSON
//! summary with the sanity checks of SPEC §5, and a terminal table.
//!
//! Built so far: the sweep, its outputs, resume, the sanity checks, `--shard` and `merge`.
//! `regress`. Not yet: plots, `report` (issue #5).

mod cells;
mod checks;
mod outputs;
mod regress;
mod sweep;

pub use cells::{AttackKind, Cell};
pub use outputs::{read_tidy, ExampleRow, TidyRow};
pub use regress::{compare, regress, RegressArgs};
pub use sweep::{merge, run, MergeArgs, RobustArgs, Shard};
