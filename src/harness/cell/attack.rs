//! A cell's attack on one batch of its examples: built from the sweep's settings (a built-in
//! attack, a preset's cascade or an own attack), run at every ε of the grid, its outcomes per
//! stage; and how a cell is cut into batches, each seeded from the sweep's seed.

use burn::tensor::{Int, Tensor};
use jem_attacks::{AttackOutcome, Classifier, MinimumPerturbation, Model};
use serde::{Deserialize, Serialize};

use crate::backend::BenchBackend;
use crate::defended::Defended;
use crate::harness::attack_config::Configured;
use crate::harness::cells::{Cell, CellAttack};
use crate::harness::own_attack::{OwnAttack, RunContext};
use crate::harness::rows::RowAttack;
use crate::harness::spec::SweepSpec;
use crate::settings::InvalidSetting;

/// Builds a cell's attack from the sweep's settings, the gradient draws per step and the
/// strength factor on its budgets (2 for the convergence check's re-attack with more
/// iterations, whose settings hold the built-in attacks' budgets doubled already): a built-in
/// attack or preset ([`AttackKind::build`]), or an own attack's builder ([`RunContext`]).
pub(in crate::harness) type Build<'a, B, M> =
    dyn Fn(&SweepSpec, usize, usize) -> Configured<'a, B, M> + 'a;

/// The builder of `cell`'s attack on the defended network.
pub(in crate::harness) fn builder<'a, B: BenchBackend, N: Classifier<B> + 'static>(
    cell: &'a Cell,
    own: &'a [OwnAttack<B, N>],
) -> impl Fn(&SweepSpec, usize, usize) -> Configured<'a, B, Defended<N>> + 'a {
    move |spec, eot, strength| match &cell.attack {
        CellAttack::Kind(kind) => kind.build(spec, eot),
        CellAttack::Own(name) => {
            let attack = own.iter().find(|o| o.name() == name);
            let run = RunContext {
                norm: spec.threat.norm,
                seed: spec.seed,
                eot,
                strength,
            };
            Configured::PerEps(
                attack
                    .expect("the plan lists every own attack")
                    .attack(&run),
            )
        }
    }
}

/// Runs a cell's attack (each stage of a preset's cascade) on one batch of examples, at
/// `strength` times its budgets (see [`Build`]).
pub(in crate::harness) fn attack_batch<B: BenchBackend, M: Model<B>>(
    spec: &SweepSpec,
    strength: usize,
    cell: &Cell,
    build: &Build<'_, B, M>,
    defended: &M,
    x: Tensor<B::InnerBackend, 4>,
    y: Tensor<B::InnerBackend, 1, Int>,
    grid: &[f32],
) -> anyhow::Result<Vec<Stage>> {
    let failed = |e: jem_attacks::AttackError| {
        InvalidSetting::new("attacks", cell.attack.name().into(), &e.to_string())
    };
    let name = match &cell.attack {
        CellAttack::Kind(kind) => RowAttack::Attack(*kind),
        CellAttack::Own(name) => RowAttack::Own(name.clone()),
    };
    Ok(match build(spec, spec.eot_at(cell.k), strength) {
        Configured::PerEps(attack) => {
            let per_eps = attack.attack(defended, x, y, grid).map_err(failed)?;
            vec![Stage {
                name,
                settings: attack.settings(),
                outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
            }]
        }
        Configured::Minimum(attack) => vec![Stage {
            name,
            settings: attack.settings(),
            outcomes: vec![(None, attack.run_once(defended, x, y))],
        }],
        Configured::Cascade(kinds, cascade) => {
            let preset = cell.attack.kind().expect("a cascade is a preset's");
            let joint = cascade.stages(defended, x, y, grid).map_err(failed)?;
            kinds
                .iter()
                .zip(&cascade.attacks)
                .zip(joint)
                .map(|((&kind, attack), per_eps)| Stage {
                    name: RowAttack::Stage {
                        preset,
                        stage: kind,
                    },
                    settings: attack.settings(),
                    outcomes: grid.iter().copied().map(Some).zip(per_eps).collect(),
                })
                .collect()
        }
    })
}

/// The attacks' seed for batch `j`: the sweep's own for the first batch (so one batch gives
/// the numbers of an unbatched run), a SplitMix64 mix of (seed, j) for the others.
pub(in crate::harness) fn batch_seed(seed: u64, j: usize) -> u64 {
    if j == 0 {
        return seed;
    }
    crate::seeds::splitmix64(seed ^ (j as u64).wrapping_mul(crate::seeds::GOLDEN))
}

impl Stage {
    /// This stage's outcomes followed by the next batch's.
    pub(in crate::harness) fn append(self, next: Stage) -> Stage {
        let outcomes = self
            .outcomes
            .into_iter()
            .zip(next.outcomes)
            .map(|((eps, mut a), (_, b))| {
                a.examples.extend(b.examples);
                a.inputs.extend(b.inputs);
                a.shape[0] += b.shape[0];
                (eps, a)
            })
            .collect();
        Stage { outcomes, ..self }
    }
}

/// One batch of a cell: its stages and the seconds it took.
#[derive(Serialize, Deserialize)]
pub(in crate::harness) struct BatchResult {
    pub(in crate::harness) seconds: f64,
    pub(in crate::harness) stages: Vec<Stage>,
}

/// One attack's outcomes in a cell: the cell's attack, or one stage of a preset's cascade
/// (`autoattack/apgd-t`: the joint outcome of APGD-T and the attacks before it).
#[derive(Serialize, Deserialize)]
pub(in crate::harness) struct Stage {
    /// The row's attack: the cell's, or `preset/stage`; whether it follows gradients and its
    /// restarts are read from it.
    pub(in crate::harness) name: RowAttack,
    pub(in crate::harness) settings: serde_json::Value,
    /// Per ε of the grid, ascending; one entry with no ε for a minimum-perturbation attack.
    pub(in crate::harness) outcomes: Vec<(Option<f32>, AttackOutcome)>,
}
