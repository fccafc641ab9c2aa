//! An attack defined outside jem-attacks, run the way the crate's own are: per ε over a list of
//! budgets, and as a stage of a cascade after APGD-CE, on the embedded baseline.
//!
//! The attack is a deliberately simple black box, "random corners": at budget ε it tries
//! `tries` random vertices of the L∞ ball (x + ε·s, s a random sign pattern, clipped to [0, 1])
//! and keeps the first the model misclassifies. It only has to say what it is ([`Describe`]:
//! name, settings, what it needs of the model) and what it does at one ε ([`FixedEpsilon`]);
//! [`PerEpsilon`] runs it at each ε in ascending order on the examples no
//! smaller ε broke, and a [`Cascade`] runs it on what the attacks before it left standing.
//!
//! ```sh
//! cargo run --release --example own_attack
//! ```
//!
//! It checks what any attack's outcome must satisfy (returned inputs within ε and in [0, 1],
//! robust accuracy not rising with ε, the cascade at most as robust as either attack alone) and
//! exits non-zero if one fails.

use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{
    Access, ApgdConfig, ApgdLoss, Attack, AttackError, AttackOutcome, Cascade, Describe,
    ExampleOutcome, FixedEpsilon, Model, Norm, PerEpsilon, Undefended,
};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches;
use jem_bench::harness::{
    sweep_with_attacks, AttackKind, Budgets, Examples, OwnAttack, RunContext, Runner, Subject,
    SweepSpec, Threat,
};
use jem_bench::model::Checkpoint;
use jem_datasets::{embedded, Split};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::num::NonZeroUsize;

type Inner = Inference;

/// Random vertices of the L∞ ball, `tries` per example, the first misclassified one kept.
#[derive(Debug, Clone, Serialize)]
struct RandomCorners {
    tries: usize,
    seed: u64,
}

/// What the attack is, on any model: its name and settings for reports, and the properties an
/// evaluation reasons with (a decision-based black box, random).
impl Describe for RandomCorners {
    fn name(&self) -> &'static str {
        "random-corners"
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Decisions
    }

    fn randomised(&self) -> bool {
        true
    }
}

/// What it does at one ε.
impl<M: Model<Train>> FixedEpsilon<Train, M> for RandomCorners {
    fn run_at(
        &self,
        model: &M,
        x: Tensor<Inner, 4>,
        y: Tensor<Inner, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, AttackError> {
        let mut rng = StdRng::seed_from_u64(self.seed ^ eps.to_bits() as u64);
        let dims = x.dims();
        let n = dims[0];
        let labels = ints(y.clone());
        let predicted = |t: Tensor<Inner, 4>, rng: &mut StdRng| -> Vec<i64> {
            ints(model.logits(t, rng).argmax(1).reshape([n]))
        };
        let clean = predicted(x.clone(), &mut rng);
        let mut examples: Vec<ExampleOutcome> = (0..n)
            .map(|i| ExampleOutcome::clean(clean[i] == labels[i]))
            .collect();
        let mut returned = x.clone();
        let tries = if eps > 0.0 { self.tries } else { 0 };
        for _ in 0..tries {
            let signs: Vec<f32> = (0..dims.iter().product::<usize>())
                .map(|_| if rng.random_bool(0.5) { eps } else { -eps })
                .collect();
            let step = Tensor::<Inner, 4>::from_data(TensorData::new(signs, dims), &x.device());
            let candidate = (x.clone() + step).clamp(0.0, 1.0);
            let now = predicted(candidate.clone(), &mut rng);
            // Keep the candidate where it is the first break of a correctly classified example.
            let take: Vec<bool> = (0..n)
                .map(|i| {
                    examples[i].clean_correct && !examples[i].adversarial && now[i] != labels[i]
                })
                .collect();
            for (i, e) in examples.iter_mut().enumerate() {
                e.forward_evals += usize::from(e.clean_correct && !e.adversarial);
                e.adversarial |= take[i];
            }
            returned = returned.mask_where(rows(take, dims, &x.device()), candidate);
        }
        // Breaks are confirmed by the model's re-check (many chains for a stochastic model);
        // where it disagrees, the clean input stands.
        let confirmed = ints(
            model
                .recheck_logits(returned.clone(), &mut rng)
                .argmax(1)
                .reshape([n]),
        );
        let revert: Vec<bool> = (0..n)
            .map(|i| examples[i].adversarial && confirmed[i] == labels[i])
            .collect();
        for (i, e) in examples.iter_mut().enumerate() {
            e.adversarial &= !revert[i];
        }
        let returned = returned.mask_where(rows(revert, dims, &x.device()), x.clone());
        Ok(AttackOutcome::measure(x, returned, examples))
    }
}

/// Integer tensor values on the host.
fn ints<const D: usize>(t: Tensor<Inner, D, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().to_vec().expect("i64")
}

/// A per-example flag broadcast over a batch shaped `dims`.
fn rows(
    flags: Vec<bool>,
    dims: [usize; 4],
    device: &burn::tensor::Device<Inner>,
) -> Tensor<Inner, 4, burn::tensor::Bool> {
    let n = flags.len();
    Tensor::<Inner, 1, burn::tensor::Bool>::from_data(TensorData::new(flags, [n]), device)
        .reshape([n, 1, 1, 1])
        .expand(dims)
}

fn main() -> anyhow::Result<()> {
    let device = backend::device();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/baseline");
    let (network, _) = Checkpoint::at(path).load::<Train>(&device)?;
    let model = Undefended::new(network);
    let data = embedded::mnist(Split::Test)?;
    let idx: Vec<usize> = (0..40).collect();
    let x = batches::images::<Inference>(&data, &idx, &device);
    let y = batches::labels::<Inference>(&data, &idx, &device);
    let eps = [0.0, 0.1, 0.2, 0.3];

    let corners = RandomCorners { tries: 20, seed: 0 };
    let alone = PerEpsilon(corners.clone())
        .attack(&model, x.clone(), y.clone(), &eps)
        .map_err(anyhow::Error::msg)?;
    let mut apgd = ApgdConfig::new(Norm::Linf, ApgdLoss::CrossEntropy);
    apgd.iterations = 20;
    let cascade = Cascade {
        name: "apgd-ce+random-corners",
        attacks: vec![Box::new(apgd.clone()), Box::new(PerEpsilon(corners))],
    };
    let stages = cascade
        .stages(&model, x.clone(), y.clone(), &eps)
        .map_err(anyhow::Error::msg)?;
    let apgd_alone = apgd
        .attack(&model, x, y, &eps)
        .map_err(anyhow::Error::msg)?;
    // The wrappers pass the attack's description through; a cascade needs what its most
    // demanding stage needs.
    let wrapped = PerEpsilon(RandomCorners { tries: 20, seed: 0 });
    anyhow::ensure!(
        (wrapped.name(), wrapped.access(), cascade.access())
            == ("random-corners", Access::Decisions, Access::Gradients),
        "the descriptions of the wrapped attack and the cascade are not what their attacks declare"
    );

    println!("robust accuracy of the embedded baseline on 40 test digits (L∞):");
    println!(
        "{:>6} {:>16} {:>10} {:>22}",
        "ε", "random corners", "APGD-CE", "APGD-CE → corners"
    );
    let mut previous = f64::INFINITY;
    for (j, &e) in eps.iter().enumerate() {
        let (c, a, joint) = (
            alone[j].robust_accuracy(Norm::Linf, e),
            apgd_alone[j].robust_accuracy(Norm::Linf, e),
            stages[1][j].robust_accuracy(Norm::Linf, e),
        );
        println!(
            "{e:>6} {:>15.1}% {:>9.1}% {:>21.1}%",
            100.0 * c,
            100.0 * a,
            100.0 * joint
        );
        anyhow::ensure!(c <= previous, "random corners: robust accuracy rose with ε");
        previous = c;
        anyhow::ensure!(
            joint <= c && joint <= stages[0][j].robust_accuracy(Norm::Linf, e),
            "the cascade is more robust than one of its stages at ε = {e}"
        );
        for outcome in [&alone[j], &stages[1][j]] {
            for (i, ex) in outcome.examples.iter().enumerate() {
                anyhow::ensure!(
                    !ex.adversarial || Norm::within(ex.linf, e),
                    "example {i} returned at L∞ {} beyond ε = {e}",
                    ex.linf
                );
            }
            anyhow::ensure!(
                outcome.inputs.iter().all(|v| (0.0..=1.0).contains(v)),
                "a returned input left [0, 1]"
            );
        }
    }
    through_the_sweep(path, &eps, &alone)
}

/// The same attack through the sweep, beside APGD-CE ([`sweep_with_attacks`]): cells, rows and
/// examples of its own, counted in the worst case, and in the sanity checks as what it declares
/// itself (a decision-based black box). On the same 40 digits with the same seed it must break
/// exactly what it broke alone.
fn through_the_sweep(path: &str, eps: &[f32], alone: &[AttackOutcome]) -> anyhow::Result<()> {
    let device = backend::device();
    let out = std::env::temp_dir().join(format!("jem-bench-own-attack-{}", std::process::id()));
    let spec = SweepSpec {
        attacks: vec![AttackKind::ApgdCe],
        budgets: Budgets {
            apgd_iterations: NonZeroUsize::new(20).expect("20 is not 0"),
            ..Budgets::default()
        },
        ks: vec![0],
        threat: Threat {
            norm: Norm::Linf,
            eps: eps.to_vec(),
        },
        examples: Examples::first(NonZeroUsize::new(40).expect("40 is not 0")),
        ..SweepSpec::default()
    };
    // At most 20 forward passes an example at one ε: 10 gradients' worth, for the estimate.
    let corners = OwnAttack::new(
        |run: &RunContext| {
            PerEpsilon(RandomCorners {
                tries: 20 * run.strength,
                seed: run.seed,
            })
        },
        10.0,
    );
    let subject = Subject::from_checkpoint(path, None, &device)?;
    let rows = sweep_with_attacks(vec![subject], vec![corners], &spec, &Runner::new(&out))?;
    let robust = |attack: &str, e: f32| {
        let row = rows.iter().find(|r| r.attack == attack && r.eps == e);
        row.map(|r| r.robust_accuracy)
            .ok_or_else(|| anyhow::anyhow!("the sweep has no {attack} row at ε = {e}"))
    };
    println!("through the sweep (robust.csv rows): ε, random corners, APGD-CE, worst case");
    for (j, &e) in eps.iter().enumerate() {
        let (own, apgd, worst) = (
            robust("random-corners", e)?,
            robust("apgd-ce", e)?,
            robust("worst-case", e)?,
        );
        println!(
            "{e:>6} {:>15.1}% {:>9.1}% {:>9.1}%",
            100.0 * own,
            100.0 * apgd,
            100.0 * worst
        );
        anyhow::ensure!(
            own == alone[j].robust_accuracy(Norm::Linf, e),
            "the sweep's random corners broke other digits than the attack alone at ε = {e}"
        );
        anyhow::ensure!(worst <= own.min(apgd), "the worst case is above an attack");
    }
    // The sanity check that needs to know which attacks are black boxes ran on this one.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json"))?)?;
    let black_box = summary["sanity_checks"]
        .as_array()
        .and_then(|c| {
            c.iter().find(|c| {
                c["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("black-box"))
            })
        })
        .ok_or_else(|| anyhow::anyhow!("summary.json has no black-box check"))?;
    anyhow::ensure!(
        black_box["status"] != "not run",
        "the black-box check did not compare the own attack: {black_box}"
    );
    std::fs::remove_dir_all(&out)?;
    Ok(())
}
