//! The robustness harness: `jem-bench robust` sweeps models × attacks × ε × sampling steps K ×
//! gradient mode, one resumable cell at a time, and writes tidy CSV, per-example CSV, a JSON
//! summary with the sanity checks of SPEC §5, and a terminal table.
//!
//! Built so far: the sweep, its outputs, resume, the sanity checks, `--shard` and `merge`.
//! Not yet: plots, `regress`, `report` (issue #5).

mod cells;
mod checks;
mod outputs;
mod sweep;

pub use cells::{AttackKind, Cell};
pub use outputs::{read_tidy, ExampleRow, TidyRow};
pub use sweep::{merge, run, MergeArgs, RobustArgs, Shard};
