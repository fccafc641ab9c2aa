//! One interface for every attack, as foolbox has it: a model, inputs, labels and a list of ε in;
//! one [`AttackOutcome`] per ε out.
//!
//! Fixed-ε attacks (PGD, FGSM, APGD, Square) run ε in ascending order on the examples that no
//! smaller ε broke: an adversarial within ε is one within every larger ε, so a break is carried
//! up, per-example robustness never rises with ε, and the larger ε cost only their survivors.
//! Minimum-perturbation attacks (boundary, pointwise) run once and answer every ε by their
//! distance, in the norm of the threat model ([`MinimumNorm`]).
//!
//! Attacks chain into a [`Cascade`], as AutoAttack runs its ensemble: each attack sees, at each
//! ε, only the examples that every attack before it left standing there
//! ([`Attack::attack_after`]), so the strongest first attack pays for most of the work and the
//! later ones only search where it failed.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::error::AttackError;
use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::{ApgdConfig, BoundaryConfig, PgdConfig, PointwiseConfig, SquareConfig};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// What an attack needs of the model it attacks, ordered from least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Only the predicted class: a decision-based black box (boundary, pointwise).
    Decisions,
    /// The model's scores (logits) on inputs it chooses: a score-based black box (Square).
    Scores,
    /// Gradients of a loss with respect to the input: a white-box attack (PGD, APGD, FAB).
    Gradients,
}

/// What an attack is, whatever model and backend it runs on: its name and settings for
/// reports, and the properties an evaluation reasons with. Each attack declares it once;
/// [`Attack`], [`FixedEpsilon`] and [`MinimumPerturbation`] build on it, and wrappers
/// ([`PerEpsilon`], [`MinimumNorm`], `Box`) pass it through.
pub trait Describe {
    /// A short name for reports (`pgd`, `apgd-ce`, `square`, …).
    fn name(&self) -> &'static str;

    /// Every setting, as JSON, for reports.
    fn settings(&self) -> serde_json::Value;

    /// What the attack needs of the model. A black-box attack that beats the white-box ones
    /// says that their gradients are masked (Athalye et al. 2018).
    fn access(&self) -> Access;

    /// Whether the attack draws random numbers (a random start, random proposals), so that its
    /// outcome depends on its seed and restarts can find more. FGSM does not; PGD does.
    fn randomised(&self) -> bool;
}

impl<A: Describe + ?Sized> Describe for Box<A> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn settings(&self) -> serde_json::Value {
        (**self).settings()
    }
    fn access(&self) -> Access {
        (**self).access()
    }
    fn randomised(&self) -> bool {
        (**self).randomised()
    }
}

/// An attack on model `M` (a network, possibly behind a defence) over the backend `B`.
pub trait Attack<B: AutodiffBackend, M: Model<B>>: Describe {
    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y` at each radius of `eps`: one outcome
    /// per ε, in the order given, each covering all N examples. An error for settings the
    /// attack cannot run with (e.g. a norm it does not implement).
    fn attack(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<AttackOutcome>, AttackError> {
        self.attack_after(model, x, y, eps, None)
    }

    /// As [`Attack::attack`], after `earlier` attacks: `earlier[j]` is their (joint) outcome at
    /// `eps[j]`. An example they left not robust there — broken, or misclassified clean — is
    /// not attacked again at that ε: it keeps their outcome and returned input, at no further
    /// cost. The result is the joint outcome of the earlier attacks and this one.
    fn attack_after(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
        earlier: Option<&[AttackOutcome]>,
    ) -> Result<Vec<AttackOutcome>, AttackError>;
}

/// An earlier attack's outcome carried into a later one's: the same result at no further cost.
fn carried(e: &ExampleOutcome) -> ExampleOutcome {
    ExampleOutcome {
        gradient_evals: 0,
        forward_evals: 0,
        ..e.clone()
    }
}

/// Checks that `earlier` holds one outcome per ε, each of `n` examples.
fn check_earlier(
    earlier: Option<&[AttackOutcome]>,
    eps: &[f32],
    n: usize,
) -> Result<(), AttackError> {
    match earlier {
        Some(e) if e.len() != eps.len() || e.iter().any(|o| o.examples.len() != n) => {
            Err(AttackError::EarlierOutcomes {
                earlier_eps: e.len(),
                earlier_examples: e.iter().map(|o| o.examples.len()).collect(),
                eps: eps.len(),
                examples: n,
            })
        }
        _ => Ok(()),
    }
}

/// The rows `rows` (ascending) of a batch and its labels: the batch itself when it is all of them.
fn select_rows<B: AutodiffBackend>(
    x: Tensor<Inner<B>, 4>,
    y: Tensor<Inner<B>, 1, Int>,
    rows: &[usize],
) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 1, Int>) {
    if rows.len() == x.dims()[0] {
        return (x, y);
    }
    let index = Tensor::<Inner<B>, 1, Int>::from_data(
        TensorData::new(rows.iter().map(|&r| r as i64).collect(), [rows.len()]),
        &x.device(),
    );
    (x.select(0, index.clone()), y.select(0, index))
}

/// Runs `at` (an attack at one ε on a sub-batch) at each ε in ascending order on the examples
/// not yet broken or misclassified, carrying each settled example's outcome and returned input
/// to every larger ε (with no further cost). Examples that `earlier` attacks left not robust at
/// an ε keep their outcome there.
fn ascending<B: AutodiffBackend>(
    x: Tensor<Inner<B>, 4>,
    y: Tensor<Inner<B>, 1, Int>,
    eps: &[f32],
    earlier: Option<&[AttackOutcome]>,
    mut at: impl FnMut(
        Tensor<Inner<B>, 4>,
        Tensor<Inner<B>, 1, Int>,
        f32,
    ) -> Result<AttackOutcome, AttackError>,
) -> Result<Vec<AttackOutcome>, AttackError> {
    let shape = x.dims();
    let n = shape[0];
    check_earlier(earlier, eps, n)?;
    let len: usize = shape[1..].iter().product();
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
        let before = earlier.map(|e| &e[j]);
        let taken = |i: usize| before.is_some_and(|b| !b.examples[i].stands());
        let rows: Vec<usize> = (0..n)
            .filter(|&i| settled[i].is_none() && !taken(i))
            .collect();
        let mut examples: Vec<ExampleOutcome> = Vec::with_capacity(n);
        let mut inputs = clean.clone();
        for (i, s) in settled.iter().enumerate() {
            let (e, input) = match (s, before) {
                (Some((e, input)), _) => (carried(e), input.as_slice()),
                (None, Some(b)) if taken(i) => {
                    (carried(&b.examples[i]), &b.inputs[i * len..(i + 1) * len])
                }
                // Replaced below: every other example is attacked.
                (None, _) => (ExampleOutcome::clean(false), &clean[i * len..(i + 1) * len]),
            };
            examples.push(e);
            inputs[i * len..(i + 1) * len].copy_from_slice(input);
        }
        if !rows.is_empty() {
            let (x_rows, y_rows) = select_rows::<B>(x.clone(), y.clone(), &rows);
            let sub = at(x_rows, y_rows, eps[j])?;
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

/// A fixed-ε attack: one run at one radius. Each is an [`Attack`] over a list of ε, run in
/// ascending order on the examples no smaller ε broke.
pub trait FixedEpsilon<B: AutodiffBackend, M: Model<B>>: Describe {
    /// One run at radius `eps` on the whole batch (ε = 0: the clean answer, re-checked).
    fn run_at(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, AttackError>;
}

/// A [`FixedEpsilon`] attack as an [`Attack`] over a list of ε: run at each ε in ascending
/// order on the examples no smaller ε broke, each settled example's outcome carried to every
/// larger ε, and after `earlier` attacks in a [`Cascade`] only on what they left standing. The
/// way an attack defined outside this crate joins cascades and per-ε curves (the crate's own
/// fixed-ε attacks are [`Attack`]s through it already).
#[derive(Debug, Clone, PartialEq)]
pub struct PerEpsilon<A>(pub A);

impl<A: Describe> Describe for PerEpsilon<A> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn settings(&self) -> serde_json::Value {
        self.0.settings()
    }
    fn access(&self) -> Access {
        self.0.access()
    }
    fn randomised(&self) -> bool {
        self.0.randomised()
    }
}

impl<B: AutodiffBackend, M: Model<B>, A: FixedEpsilon<B, M>> Attack<B, M> for PerEpsilon<A> {
    fn attack_after(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
        earlier: Option<&[AttackOutcome]>,
    ) -> Result<Vec<AttackOutcome>, AttackError> {
        ascending::<B>(x, y, eps, earlier, |x, y, e| self.0.run_at(model, x, y, e))
    }
}

/// The crate's fixed-ε attacks are [`Attack`]s directly, through [`PerEpsilon`]. (One macro
/// rather than a blanket impl: the compiler cannot tell that [`MinimumNorm`] and [`Cascade`]
/// are not fixed-ε attacks, so a blanket impl would conflict with theirs.)
macro_rules! attack_over_eps {
    ($($attack:ty),*) => {$(
        impl<B: AutodiffBackend, M: Model<B>> Attack<B, M> for $attack {
            fn attack_after(
                &self,
                model: &M,
                x: Tensor<Inner<B>, 4>,
                y: Tensor<Inner<B>, 1, Int>,
                eps: &[f32],
                earlier: Option<&[AttackOutcome]>,
            ) -> Result<Vec<AttackOutcome>, AttackError> {
                // A copy of the settings, not of any data.
                PerEpsilon(self.clone()).attack_after(model, x, y, eps, earlier)
            }
        }
    )*};
}

attack_over_eps!(PgdConfig, ApgdConfig, SquareConfig);

impl<B: AutodiffBackend, M: Model<B>> FixedEpsilon<B, M> for PgdConfig {
    fn run_at(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, AttackError> {
        let mut cfg = self.clone();
        if eps == 0.0 {
            cfg.steps = 0; // nothing to search: the clean, re-checked answer
        }
        Ok(cfg.run::<B, M>(model, x, y, eps))
    }
}

impl<B: AutodiffBackend, M: Model<B>> FixedEpsilon<B, M> for ApgdConfig {
    fn run_at(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, AttackError> {
        let mut cfg = self.clone();
        if eps == 0.0 {
            cfg.iterations = 0;
        }
        Ok(cfg.run::<B, M>(model, x, y, eps))
    }
}

impl<B: AutodiffBackend, M: Model<B>> FixedEpsilon<B, M> for SquareConfig {
    fn run_at(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, AttackError> {
        let mut cfg = self.clone();
        if eps == 0.0 {
            cfg.queries = 1;
        }
        cfg.run::<B, M>(model, x, y, eps)
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
pub trait MinimumPerturbation<B: AutodiffBackend, M: Model<B>>: Describe {
    /// One run on the whole batch: per example, the closest adversarial found.
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome;
}

impl<B: AutodiffBackend, M: Model<B>, A: MinimumPerturbation<B, M> + ?Sized>
    MinimumPerturbation<B, M> for Box<A>
{
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        (**self).run_once(model, x, y)
    }
}

impl<B: AutodiffBackend, M: Model<B>> MinimumPerturbation<B, M> for BoundaryConfig {
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
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        self.run::<B, M>(model, x, y)
    }
}

impl<A: Describe> Describe for MinimumNorm<A> {
    fn name(&self) -> &'static str {
        self.attack.name()
    }
    fn settings(&self) -> serde_json::Value {
        self.attack.settings()
    }
    fn access(&self) -> Access {
        self.attack.access()
    }
    fn randomised(&self) -> bool {
        self.attack.randomised()
    }
}

impl<B: AutodiffBackend, M: Model<B>, A: MinimumPerturbation<B, M>> Attack<B, M>
    for MinimumNorm<A>
{
    fn attack_after(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
        earlier: Option<&[AttackOutcome]>,
    ) -> Result<Vec<AttackOutcome>, AttackError> {
        let [n, c, h, w] = x.dims();
        check_earlier(earlier, eps, n)?;
        let len = c * h * w;
        let clean: Vec<f32> = x
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        // One run on the examples still standing at some ε > 0 after the earlier attacks (at
        // ε = 0 nothing can be broken). Its cost is counted once per example, at the first ε
        // that needed it.
        let taken = |j: usize, i: usize| earlier.is_some_and(|e| !e[j].examples[i].stands());
        let needed: Vec<Option<usize>> = (0..n)
            .map(|i| match earlier {
                Some(_) => (0..eps.len()).find(|&j| eps[j] > 0.0 && !taken(j, i)),
                None => (!eps.is_empty()).then_some(0),
            })
            .collect();
        let rows: Vec<usize> = (0..n).filter(|&i| needed[i].is_some()).collect();
        let mut once = AttackOutcome {
            examples: vec![ExampleOutcome::clean(false); n],
            inputs: clean.clone(),
            shape: [n, c, h, w],
        };
        if !rows.is_empty() {
            let (x_rows, y_rows) = select_rows::<B>(x, y, &rows);
            let sub = self.attack.run_once(model, x_rows, y_rows);
            for (k, &i) in rows.iter().enumerate() {
                once.examples[i] = sub.examples[k].clone();
                once.inputs[i * len..(i + 1) * len]
                    .copy_from_slice(&sub.inputs[k * len..(k + 1) * len]);
            }
        }
        Ok(eps
            .iter()
            .enumerate()
            .map(|(j, &e)| {
                let mut out = once.clone();
                for (i, ex) in out.examples.iter_mut().enumerate() {
                    // Not run (broken at every ε > 0 before), or broken here before: the
                    // earlier attacks' outcome stands.
                    let earlier_stands = taken(j, i) || needed[i].is_none();
                    if let (true, Some(before)) = (earlier_stands, earlier) {
                        *ex = carried(&before[j].examples[i]);
                        out.inputs[i * len..(i + 1) * len]
                            .copy_from_slice(&before[j].inputs[i * len..(i + 1) * len]);
                    } else if needed[i] != Some(j) {
                        (ex.gradient_evals, ex.forward_evals) = (0, 0);
                    }
                    if ex.adversarial && !Norm::within(ex.distance(self.norm), e) {
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

/// Attacks run one after another, as AutoAttack runs its ensemble: at each ε, each attack only
/// on the examples every attack before it left robust. One call returns the joint outcome of
/// every stage ([`Cascade::stages`]), the last being the cascade's result.
pub struct Cascade<'a, B: AutodiffBackend, M: Model<B>> {
    /// A short name for reports (`autoattack`, …).
    pub name: &'static str,
    /// The attacks, in the order they run.
    pub attacks: Vec<Box<dyn Attack<B, M> + 'a>>,
}

impl<B: AutodiffBackend, M: Model<B>> Cascade<'_, B, M> {
    /// Per attack, in order: the joint outcome of it and every attack before it, per ε (in the
    /// order given). The cost fields count only what each attack itself spent.
    pub fn stages(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
    ) -> Result<Vec<Vec<AttackOutcome>>, AttackError> {
        self.stages_after(model, x, y, eps, None)
    }

    /// [`Cascade::stages`] after `earlier` attacks (see [`Attack::attack_after`]).
    fn stages_after(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
        earlier: Option<&[AttackOutcome]>,
    ) -> Result<Vec<Vec<AttackOutcome>>, AttackError> {
        let mut out: Vec<Vec<AttackOutcome>> = Vec::with_capacity(self.attacks.len());
        for attack in &self.attacks {
            let before = out.last().map(Vec::as_slice).or(earlier);
            let joint = attack
                .attack_after(model, x.clone(), y.clone(), eps, before)
                .map_err(|e| format!("{}: {e}", attack.name()))?;
            out.push(joint);
        }
        Ok(out)
    }
}

impl<B: AutodiffBackend, M: Model<B>> Describe for Cascade<'_, B, M> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.attacks
                .iter()
                .map(|a| serde_json::json!({ "attack": a.name(), "settings": a.settings() }))
                .collect(),
        )
    }

    /// The most the cascade's attacks need: gradients if any of them follows them.
    fn access(&self) -> Access {
        let accesses = self.attacks.iter().map(|a| a.access());
        accesses.max().unwrap_or(Access::Decisions)
    }

    fn randomised(&self) -> bool {
        self.attacks.iter().any(|a| a.randomised())
    }
}

impl<B: AutodiffBackend, M: Model<B>> Attack<B, M> for Cascade<'_, B, M> {
    fn attack_after(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: &[f32],
        earlier: Option<&[AttackOutcome]>,
    ) -> Result<Vec<AttackOutcome>, AttackError> {
        self.stages_after(model, x, y, eps, earlier)?
            .pop()
            .ok_or_else(|| AttackError::EmptyCascade {
                name: self.name.to_string(),
            })
    }
}
