//! jem-attacks' tests, as one test binary: each attack against a case whose answer is known by
//! hand or in closed form (mostly binary linear models, `common`). One binary rather than a file
//! per target, so that the attacks, generic over the backend, are compiled once.

mod common;

mod apgd;
mod attack_trait;
mod decision;
mod fab;
mod nonsense;
mod pgd;
mod sgld;
mod square;
