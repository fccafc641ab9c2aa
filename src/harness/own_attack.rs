//! Attacks of the caller's own in a sweep ([`sweep_with_attacks`](super::sweep_with_attacks)):
//! any [`Attack`] on the defended model, built from a small [`RunContext`] (norm, seed, EOT
//! draws, strength), runs in cells of its own beside the spec's attacks — rows, examples, worst
//! case, sanity checks and convergence checks included — and is recorded in the sweep's
//! settings by its name, settings and what it needs of the model.

use jem_attacks::{Access, Attack, Classifier, Describe, Norm};

use super::cells::AttackKind;
use super::spec::SweepSpec;
use crate::backend::BenchBackend;
use crate::defended::Defended;
use crate::settings::InvalidSetting;
use crate::Choice;

/// What an own attack is built for: all a sweep tells it, rather than the whole [`SweepSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunContext {
    /// The sweep's threat model.
    pub norm: Norm,
    /// The seed of this run (the sweep's; a batch's or a re-attack's mixed from it).
    pub seed: u64,
    /// Gradient draws per step (EOT): the sweep's count at the cell's K for an attack that
    /// follows gradients, 4× that in the convergence check's first re-attack.
    pub eot: usize,
    /// The factor on the attack's own budgets (iterations, queries, tries): 1, or 2 in the
    /// convergence check's second re-attack.
    pub strength: usize,
}

impl RunContext {
    /// The context of a sweep's first run with `spec`'s norm and seed, one draw, strength 1.
    pub fn of(spec: &SweepSpec) -> Self {
        RunContext {
            norm: spec.threat.norm,
            seed: spec.seed,
            eot: 1,
            strength: 1,
        }
    }
}

/// Builds an own attack for a run.
type Builder<B, N> = dyn Fn(&RunContext) -> Box<dyn Attack<B, Defended<N>>> + Send + Sync;

/// An attack defined outside jem-bench, for [`sweep_with_attacks`](super::sweep_with_attacks).
pub struct OwnAttack<B: BenchBackend, N: Classifier<B> + 'static> {
    name: &'static str,
    access: Access,
    build: Box<Builder<B, N>>,
    gradients_per_eps: f64,
}

impl<B: BenchBackend, N: Classifier<B> + 'static> OwnAttack<B, N> {
    /// The attack `build` makes for a run (see [`RunContext`]: the convergence check of a
    /// stochastic cell builds it again with 4× the EOT draws, and with strength 2 for its
    /// budgets doubled). `gradients_per_eps`: input gradients one example takes at one ε at
    /// most, with one draw (a forward pass counts half), for the sweep's time estimate.
    pub fn new<A>(
        build: impl Fn(&RunContext) -> A + Send + Sync + 'static,
        gradients_per_eps: f64,
    ) -> Self
    where
        A: Attack<B, Defended<N>> + 'static,
    {
        let example = build(&RunContext::of(&SweepSpec::default()));
        OwnAttack {
            name: example.name(),
            access: example.access(),
            build: Box::new(move |run| Box::new(build(run))),
            gradients_per_eps,
        }
    }

    /// The attack's name, as its cells and rows call it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether it follows the defended model's gradients (and so has a gradient mode through
    /// the SGLD steps and EOT draws).
    pub fn uses_gradients(&self) -> bool {
        self.access == Access::Gradients
    }

    /// Input gradients one example takes at one ε at most, with `eot` draws.
    pub(super) fn gradients_per_eps(&self, eot: usize) -> f64 {
        let draws = if self.uses_gradients() { eot } else { 1 };
        self.gradients_per_eps * draws as f64
    }

    /// The attack built for `run`.
    pub(super) fn attack(&self, run: &RunContext) -> Box<dyn Attack<B, Defended<N>>> {
        (self.build)(run)
    }

    /// What the sweep's settings record of it: a sweep resumes only with the same own attacks.
    pub(super) fn record(&self, spec: &SweepSpec) -> serde_json::Value {
        let attack = self.attack(&RunContext::of(spec));
        serde_json::json!({
            "name": self.name,
            "access": format!("{:?}", self.access).to_lowercase(),
            "settings": attack.settings(),
        })
    }
}

/// Each own attack's name with whether it follows gradients: what the cell list, the rows and
/// the sanity checks need of it (and what a sweep's settings record, [`recorded`]).
pub(super) fn gradient_use<B: BenchBackend, N: Classifier<B>>(
    own: &[OwnAttack<B, N>],
) -> Vec<(String, bool)> {
    own.iter()
        .map(|o| (o.name.to_string(), o.uses_gradients()))
        .collect()
}

/// Refuses own attacks whose names could be read as another attack's: a built-in attack's or
/// preset's name (in any case), a cascade stage's (`a/b`), the worst case's, or another own
/// attack's.
pub(super) fn check_names<B: BenchBackend, N: Classifier<B>>(
    own: &[OwnAttack<B, N>],
) -> Result<(), InvalidSetting> {
    for (i, attack) in own.iter().enumerate() {
        let name = attack.name;
        let problem = if AttackKind::parse(name).is_ok() || name == "worst-case" {
            "an attack of the sweep already has this name"
        } else if name.is_empty() || name.contains(['/', ',', '.']) {
            "an own attack's name is a word without '/', ',' or '.'"
        } else if own[..i].iter().any(|o| o.name == name) {
            "two own attacks have this name"
        } else {
            continue;
        };
        return Err(InvalidSetting::new("attacks", name.into(), problem));
    }
    Ok(())
}

/// The own attacks a sweep folder's settings record, each with whether it follows gradients
/// (what the sanity checks need of an own attack's rows).
pub fn recorded(settings: &serde_json::Value) -> Vec<(String, bool)> {
    let Some(own) = settings["own_attacks"].as_array() else {
        return Vec::new();
    };
    own.iter()
        .filter_map(|o| Some((o["name"].as_str()?.to_string(), o["access"] == "gradients")))
        .collect()
}
