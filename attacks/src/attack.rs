//! One interface for every attack, as foolbox has it: a model, inputs, labels and a list of ε in;
//! one [`AttackOutcome`] per ε out.
//!
//! Fixed-ε attacks (PGD, FGSM, APGD, Square) run ε in ascending order on the examples that no
//! smaller ε broke: an adversarial within ε is one within every larger ε, so a break is carried
//! up, per-example robustness never rises with ε, and the larger ε cost only their survivors.
//! Minimum-perturbation attacks (boundary, pointwise) run once and answer every ε by their
//! distance, in the norm of the threat model ([`MinimumNorm`]).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::{ApgdConfig, BoundaryConfig, PgdConfig, PointwiseConfig, SquareConfig};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// An attack on model `M` (a network, possibly behind a defence) over the backend `B`.
pub trait Attack<B: AutodiffBackend, M: Model<B>> {
    /// A short name for reports (`pgd`, `apgd-ce`, `square`, …).
    fn name(&self) -> &'static str;

    /// Every setting, as JSON, for reports.
    fn settings(&self) -> serde_json::Value;

    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y` at each radius of `eps`: one outcome
    /// per ε, in the order given, each covering all N examples. An error for settings the
    /// attack cannot run with (e.g. a norm it does not implement).
    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, String>;
}

/// Runs `at` (an attack at one ε on a sub-batch) at each ε in ascending order on the examples
/// not yet broken or misclassified, carrying each settled example's outcome and returned input
/// to every larger ε (with no further cost).
fn ascending<B: AutodiffBackend>(
    x: Tensor<Inner<B>, 4>,
    y: Tensor<Inner<B>, 1, Int>,
    eps: &[f32],
    mut at: impl FnMut(
        Tensor<Inner<B>, 4>,
        Tensor<Inner<B>, 1, Int>,
        f32,
    ) -> Result<AttackOutcome, String>,
) -> Result<Vec<AttackOutcome>, String> {
    let shape = x.dims();
    let n = shape[0];
    let len: usize = shape[1..].iter().product();
    let device = x.device();
    let mut order: Vec<usize> = (0..eps.len()).collect();
    order.sort_by(|&a, &b| eps[a].total_cmp(&eps[b]));
    let clean: Vec<f32> = x
        .clone()
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32");
    // Settled examples: their outcome and returned input.
    let mut settled: Vec<Option<(ExampleOutcome, Vec<f32>)>> = vec![None; n];
    let mut out: Vec<Option<AttackOutcome>> = vec![None; eps.len()];
    for j in order {
        let rows: Vec<usize> = (0..n).filter(|&i| settled[i].is_none()).collect();
        let mut examples: Vec<ExampleOutcome> = Vec::with_capacity(n);
        let mut inputs = clean.clone();
        for (i, s) in settled.iter().enumerate() {
            let (e, input) = match s {
                Some((e, input)) => (
                    ExampleOutcome {
                        gradient_evals: 0,
                        forward_evals: 0,
                        ..e.clone()
                    },
                    input.as_slice(),
                ),
                // Replaced below: every unsettled example is attacked.
                None => (ExampleOutcome::clean(false), &clean[i * len..(i + 1) * len]),
            };
            examples.push(e);
            inputs[i * len..(i + 1) * len].copy_from_slice(input);
        }
        if !rows.is_empty() {
            let index = Tensor::<Inner<B>, 1, Int>::from_data(
                TensorData::new(
                    rows.iter().map(|&r| r as i64).collect::<Vec<_>>(),
                    [rows.len()],
                ),
                &device,
            );
            let sub = at(
                x.clone().select(0, index.clone()),
                y.clone().select(0, index),
                eps[j],
            )?;
            for (k, &i) in rows.iter().enumerate() {
                let e = sub.examples[k].clone();
                let input = sub.inputs[k * len..(k + 1) * len].to_vec();
                inputs[i * len..(i + 1) * len].copy_from_slice(&input);
                if !e.clean_correct || e.adversarial {
                    settled[i] = Some((e.clone(), input));
                }
                examples[i] = e;
            }
        }
        out[j] = Some(AttackOutcome {
            examples,
            inputs,
            shape,
        });
    }
    Ok(out.into_iter().map(|o| o.expect("every ε ran")).collect())
}

impl<B: AutodiffBackend, M: Model<B>> Attack<B, M> for PgdConfig {
    fn name(&self) -> &'static str {
        PgdConfig::name(self)
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, String> {
        ascending::<B>(x, y, eps, |x, y, e| {
            let mut cfg = self.clone();
            if e == 0.0 {
                cfg.steps = 0; // nothing to search: the clean, re-checked answer
            }
            Ok(cfg.run::<B, M>(model, x, y, e))
        })
    }
}

impl<B: AutodiffBackend, M: Model<B>> Attack<B, M> for ApgdConfig {
    fn name(&self) -> &'static str {
        ApgdConfig::name(self)
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, String> {
        ascending::<B>(x, y, eps, |x, y, e| {
            let mut cfg = self.clone();
            if e == 0.0 {
                cfg.iterations = 0;
            }
            Ok(cfg.run::<B, M>(model, x, y, e))
        })
    }
}

impl<B: AutodiffBackend, M: Model<B>> Attack<B, M> for SquareConfig {
    fn name(&self) -> &'static str {
        SquareConfig::name(self)
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, String> {
        ascending::<B>(x, y, eps, |x, y, e| {
            let mut cfg = self.clone();
            if e == 0.0 {
                cfg.queries = 1;
            }
            cfg.run::<B, M>(model, x, y, e)
        })
    }
}

/// A minimum-perturbation attack judged in the norm of a threat model: adversarial at ε when
/// it found an adversarial at distance ≤ ε.
#[derive(Debug, Clone, PartialEq)]
pub struct MinimumNorm<A> {
    /// The minimum-perturbation attack.
    pub attack: A,
    /// The norm its distances are judged in.
    pub norm: Norm,
}

/// The attacks [`MinimumNorm`] can wrap: one run gives a minimum perturbation per example.
pub trait MinimumPerturbation<B: AutodiffBackend, M: Model<B>> {
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// Every setting, as JSON, for reports.
    fn settings(&self) -> serde_json::Value;
    /// One run on the whole batch: per example, the closest adversarial found.
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome;
}

impl<B: AutodiffBackend, M: Model<B>> MinimumPerturbation<B, M> for BoundaryConfig {
    fn name(&self) -> &'static str {
        "boundary"
    }
    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        self.run::<B, M>(model, x, y)
    }
}

impl<B: AutodiffBackend, M: Model<B>> MinimumPerturbation<B, M> for PointwiseConfig {
    fn name(&self) -> &'static str {
        "pointwise"
    }
    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        self.run::<B, M>(model, x, y)
    }
}

impl<B: AutodiffBackend, M: Model<B>, A: MinimumPerturbation<B, M>> Attack<B, M>
    for MinimumNorm<A>
{
    fn name(&self) -> &'static str {
        self.attack.name()
    }

    fn settings(&self) -> serde_json::Value {
        self.attack.settings()
    }

    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, String> {
        let clean: Vec<f32> = x
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        let once = self.attack.run_once(model, x, y);
        let len = once.inputs.len() / once.examples.len().max(1);
        Ok(eps
            .iter()
            .map(|&e| {
                let mut out = once.clone();
                for (i, ex) in out.examples.iter_mut().enumerate() {
                    if ex.adversarial && ex.distance(self.norm) > e * (1.0 + 1e-5) + 1e-7 {
                        // Too far for this ε: the clean input stands, at distance 0.
                        ex.adversarial = false;
                        (ex.l0, ex.l2, ex.linf) = (0.0, 0.0, 0.0);
                        out.inputs[i * len..(i + 1) * len]
                            .copy_from_slice(&clean[i * len..(i + 1) * len]);
                    }
                }
                out
            })
            .collect())
    }
}
