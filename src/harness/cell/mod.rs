//! One cell of a sweep (a model, an attack, K and a gradient mode on the sweep's examples), in
//! layers: what every part of its run shares at the bottom (`attack`: one batch's attack and
//! the cutting into batches; `work`: the examples, the defended model, the kept parts), then
//! what uses it (`probe`, `convergence`, `adversarials`, `rows`), and `run`, which runs a cell
//! from its examples to its result, at the top.

mod adversarials;
mod attack;
mod convergence;
mod probe;
mod rows;
mod run;
mod work;

pub(super) use attack::{attack_batch, builder};
pub(super) use convergence::standing;
pub(super) use run::run_cell;
pub(super) use work::Examples;
