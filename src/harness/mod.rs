//! The robustness harness: `jem-bench robust` sweeps models × attacks × ε × sampling steps K ×
//! gradient mode, one resumable cell at a time, and writes tidy CSV, per-example CSV, a JSON
//! summary with the sanity checks (after Carlini et al. 2019), and a terminal table.
//!
//! Robustness-curve plots and `report` (regenerating summary, table and plots from CSV),
//! `--shard` with `merge` (which also joins sweeps of other models), and `regress` against a stored reference.

mod attack_config;
mod budgets;
mod builtin;
mod cell;
mod cells;
mod checks;
mod estimate;
mod forecast;
mod kept_parts;
mod merge;
mod outputs;
mod own_attack;
mod plan;
mod progress;
mod record;
mod regress;
mod report;
mod robustness;
mod rows;
mod spec;
mod subject;
mod sweep;

pub use crate::settings::InvalidSetting;
pub use budgets::{BudgetCounts, Budgets};
pub use cells::{AttackKind, Cell, CellAttack};
pub use estimate::Gradients;
pub use merge::{merge, MergeSpec};
pub use outputs::read_tidy;
pub use own_attack::{OwnAttack, RunContext};
pub use progress::TerminalProgress;
pub use record::{identity as sweep_identity, SWEEP_FORMAT};
pub use regress::{compare, regress, RegressSpec};
pub use report::report;
pub use robustness::{tidy_rows, wilson, ALL_GRADS, WORST_CASE};
pub use rows::{ExampleRow, GradColumn, RowAttack, TidyRow};
pub use spec::{
    CellCount, CellPart, Checkpoints, Examples, PartKind, Runner, Shard, Silent, SweepEstimate,
    SweepObserver, SweepSpec, Threat,
};
pub use subject::Subject;
pub use sweep::{check, run, sweep, sweep_with_attacks};
