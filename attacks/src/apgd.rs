//! Auto-PGD (Croce & Hein, ICML 2020, "Reliable evaluation of adversarial robustness with an
//! ensemble of diverse parameter-free attacks"): PGD without a step-size parameter, under L∞ or
//! L2 through one [`Norm`] type.
//!
//! The step starts at 2ε and is halved at checkpoints w_j = ⌈p_j N⌉ (p₀ = 0, p₁ = 0.22,
//! p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06)) when fewer than ρ = 0.75 of the steps since
//! the last checkpoint raised the loss, or when the step was not halved at the last checkpoint
//! and the best loss has not improved since; after a halving the iterate restarts from the best
//! point. Steps use momentum 0.75 (the first without). Losses: cross-entropy, DLR, and
//! targeted DLR against each of the most likely other classes in turn (APGD-T). Like
//! [`PgdConfig`](crate::PgdConfig) it works through [`Model`], so it runs through the SGLD
//! defence (gradients `full` or `bpda`, EOT), attacks only correctly classified inputs, and
//! confirms every break by re-classification.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::attack::{Access, Describe};
use crate::loss::{targeted_dlr, AttackLoss};
use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::pgd::{blend, predicted, to_labels, Rows};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The loss APGD maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApgdLoss {
    /// Cross-entropy (APGD-CE).
    CrossEntropy,
    /// Difference of logits ratio (APGD-DLR).
    Dlr,
    /// Targeted DLR, one run per target among the most likely other classes (APGD-T).
    TargetedDlr,
}

/// Settings of Auto-PGD (Croce & Hein 2020), PGD whose step size adapts itself;
/// [`ApgdConfig::new`] gives AutoAttack's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApgdConfig {
    /// Threat model: the ball (L∞ or L2) that ε bounds, in pixel units.
    pub norm: Norm,
    /// The loss maximised: APGD-CE, APGD-DLR or APGD-T.
    pub loss: ApgdLoss,
    /// Iterations N per run (AutoAttack: 100).
    pub iterations: usize,
    /// Runs from independent random starts (per target for APGD-T).
    pub restarts: usize,
    /// APGD-T: how many of the most likely other classes are targeted in turn (AutoAttack: 9).
    pub target_classes: usize,
    /// ρ: the fraction of loss-raising steps below which the step is halved.
    pub rho: f32,
    /// α: the momentum weight of the new step.
    pub momentum: f32,
    /// Gradient draws averaged per step (expectation over transformation); 1: none.
    pub eot: usize,
    /// Seed of the random starts and of the model's noise; a run repeats exactly.
    pub seed: u64,
}

impl ApgdConfig {
    /// AutoAttack's settings: 100 iterations, one run, 9 target classes, ρ = 0.75, α = 0.75.
    pub fn new(norm: Norm, loss: ApgdLoss) -> Self {
        Self {
            norm,
            loss,
            iterations: 100,
            restarts: 1,
            target_classes: 9,
            rho: 0.75,
            momentum: 0.75,
            eot: 1,
            seed: 0,
        }
    }

    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y` at radius `eps`.
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> AttackOutcome {
        let n = x.dims()[0];
        let device = x.device();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let labels = to_labels(y.clone());
        let clean_logits = model.logits(x.clone(), &mut rng);
        let clean = predicted(clean_logits.clone());
        let mut examples: Vec<ExampleOutcome> = (0..n)
            .map(|i| ExampleOutcome::clean(clean[i] == labels[i]))
            .collect();
        // APGD-T's targets: the 2nd, 3rd, … most likely classes of the clean input.
        let targets: Vec<Option<Vec<i64>>> = match self.loss {
            ApgdLoss::TargetedDlr => {
                let (_, order) = clean_logits.sort_descending_with_indices(1);
                let k = order.dims()[1];
                let order = to_labels(order.reshape([n * k]));
                (1..=self.target_classes.min(k - 1))
                    .map(|t| Some((0..n).map(|i| order[i * k + t]).collect()))
                    .collect()
            }
            _ => vec![None],
        };
        let mut best = x.clone();
        let mut found = vec![false; n];
        for target in &targets {
            for _ in 0..self.restarts.max(1) {
                let attacked: Vec<bool> = (0..n)
                    .map(|i| examples[i].clean_correct && !found[i])
                    .collect();
                if !attacked.contains(&true) {
                    break;
                }
                let target = target.as_ref().map(|t| {
                    Tensor::<Inner<B>, 1, Int>::from_data(TensorData::new(t.clone(), [n]), &device)
                });
                let run = self.ascend(model, &x, &y, target, &attacked, eps, &mut rng);
                for (e, k) in examples.iter_mut().zip(&run.evals) {
                    e.gradient_evals += k;
                }
                // Confirm the candidates (many chains for a stochastic model).
                let now = predicted(model.recheck_logits(run.returned.clone(), &mut rng));
                for i in 0..n {
                    if attacked[i] {
                        examples[i].forward_evals += 1;
                        found[i] |= now[i] != labels[i];
                    }
                }
                best = blend(best, run.returned, &attacked);
            }
        }
        for (e, &f) in examples.iter_mut().zip(&found) {
            e.adversarial = f;
        }
        AttackOutcome::measure(x, best, examples)
    }

    /// One APGD run from a random start. Rows outside `attack` stay at the clean input; a row
    /// stops moving once misclassified (it returns that point), the others return their point
    /// of highest loss.
    #[allow(clippy::too_many_arguments)]
    fn ascend<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: &Tensor<Inner<B>, 4>,
        y: &Tensor<Inner<B>, 1, Int>,
        target: Option<Tensor<Inner<B>, 1, Int>>,
        attack: &[bool],
        eps: f32,
        rng: &mut StdRng,
    ) -> Run<Inner<B>> {
        let dims = x.dims();
        let n = dims[0];
        let device = x.device();
        let labels = to_labels(y.clone());
        let per_row =
            |v: &[f32]| Tensor::<Inner<B>, 1>::from_data(TensorData::new(v.to_vec(), [n]), &device);
        let eps_all = per_row(&vec![eps; n]);
        let project = |v: Tensor<Inner<B>, 4>| {
            let delta = self.norm.project(v - x.clone(), eps_all.clone());
            (x.clone() + delta).clamp(0.0, 1.0)
        };
        let mut evals = vec![0; n];
        let mut active = attack.to_vec();
        // Gradient, loss and prediction at a point, averaged over `eot` draws of the model's
        // noise, computed for the active rows only (a settled row costs nothing; the others
        // get a zero gradient, loss 0 and their label, which nothing reads).
        let mut evaluate = |point: &Tensor<Inner<B>, 4>, active: &[bool], rng: &mut StdRng| {
            let rows: Vec<usize> = (0..n).filter(|&i| active[i]).collect();
            let mut loss = vec![0.0f32; n];
            let mut pred = labels.clone();
            if rows.is_empty() {
                return (Tensor::<Inner<B>, 4>::zeros(dims, &device), loss, pred);
            }
            let rows_of = Rows::<Inner<B>>::new(&rows, n, &device);
            let index = Tensor::<Inner<B>, 1, Int>::from_data(
                TensorData::new(rows.iter().map(|&i| i as i64).collect(), [rows.len()]),
                &device,
            );
            let y_rows = y.clone().select(0, index.clone());
            let t_rows = target.clone().map(|t| t.select(0, index));
            let y_tracked = Tensor::<B, 1, Int>::from_inner(y_rows.clone());
            let t_tracked = t_rows.clone().map(Tensor::<B, 1, Int>::from_inner);
            let loss_tracked = |logits: Tensor<B, 2>| match &t_tracked {
                Some(t) => targeted_dlr(logits, y_tracked.clone(), t.clone()),
                None => self.plain_loss().of(logits, y_tracked.clone()),
            };
            let draws = self.eot.max(1);
            let at = rows_of.take(point);
            let mut grad = Tensor::<Inner<B>, 4>::zeros(at.dims(), &device);
            let mut logits_sum: Option<Tensor<Inner<B>, 2>> = None;
            for _ in 0..draws {
                let (g, l) = model.loss_gradient(at.clone(), &loss_tracked, rng);
                grad = grad + g;
                logits_sum = Some(logits_sum.map_or(l.clone(), |s| s + l));
            }
            let logits = logits_sum.expect("one draw") / draws as f32;
            let values = match &t_rows {
                Some(t) => targeted_dlr(logits.clone(), y_rows, t.clone()),
                None => self.plain_loss().of(logits.clone(), y_rows),
            };
            let values: Vec<f32> = values.into_data().convert::<f32>().to_vec().expect("f32");
            for (k, (&i, p)) in rows.iter().zip(predicted(logits)).enumerate() {
                evals[i] += draws;
                loss[i] = values[k];
                pred[i] = p;
            }
            (rows_of.put(grad), loss, pred)
        };

        let start = self
            .norm
            .random_in_ball(dims, eps_all.clone(), rng, &device);
        let mut current = blend(x.clone(), (x.clone() + start).clamp(0.0, 1.0), attack);
        let (mut grad, mut loss, mut pred) = evaluate(&current, &active, rng);
        let mut best_loss = loss.clone();
        let mut best_point = current.clone();
        let mut best_grad = grad.clone();
        let mut returned = current.clone();
        let stop = |active: &mut Vec<bool>,
                    pred: &[i64],
                    point: &Tensor<Inner<B>, 4>,
                    returned: &mut Tensor<Inner<B>, 4>| {
            let broken: Vec<bool> = (0..n).map(|i| active[i] && pred[i] != labels[i]).collect();
            if broken.contains(&true) {
                *returned = blend(returned.clone(), point.clone(), &broken);
                for i in 0..n {
                    active[i] &= !broken[i];
                }
            }
        };
        stop(&mut active, &pred, &current, &mut returned);

        let mut step = vec![2.0 * eps; n];
        let mut previous = current.clone();
        let checkpoints = checkpoints(self.iterations);
        let mut next_checkpoint = 1;
        let mut increases = vec![0usize; n];
        let mut halved_last = vec![true; n];
        let mut best_at_last = best_loss.clone();
        for k in 0..self.iterations {
            if !active.contains(&true) {
                break;
            }
            let step_t = per_row(&step).reshape([n, 1, 1, 1]);
            let z = project(current.clone() + self.norm.steepest(grad.clone()) * step_t);
            let moved = if k == 0 {
                z
            } else {
                let a = self.momentum;
                project(
                    current.clone()
                        + (z - current.clone()) * a
                        + (current.clone() - previous.clone()) * (1.0 - a),
                )
            };
            previous = current.clone();
            current = blend(current, moved, &active);
            let new_loss;
            (grad, new_loss, pred) = evaluate(&current, &active, rng);
            let mut improved = vec![false; n];
            for i in 0..n {
                if !active[i] {
                    continue;
                }
                increases[i] += usize::from(new_loss[i] > loss[i]);
                if new_loss[i] > best_loss[i] {
                    best_loss[i] = new_loss[i];
                    improved[i] = true;
                }
            }
            loss = new_loss;
            best_point = blend(best_point, current.clone(), &improved);
            best_grad = blend(best_grad, grad.clone(), &improved);
            stop(&mut active, &pred, &current, &mut returned);

            if checkpoints.get(next_checkpoint) == Some(&(k + 1)) {
                let interval = checkpoints[next_checkpoint] - checkpoints[next_checkpoint - 1];
                let mut halve = vec![false; n];
                for i in 0..n {
                    halve[i] = active[i]
                        && should_halve(
                            increases[i],
                            interval,
                            self.rho,
                            halved_last[i],
                            best_at_last[i],
                            best_loss[i],
                        );
                    if halve[i] {
                        step[i] /= 2.0;
                    }
                    halved_last[i] = halve[i];
                    best_at_last[i] = best_loss[i];
                    increases[i] = 0;
                }
                // A halving restarts from the best point so far, with its gradient.
                current = blend(current, best_point.clone(), &halve);
                grad = blend(grad, best_grad.clone(), &halve);
                for i in 0..n {
                    if halve[i] {
                        loss[i] = best_loss[i];
                    }
                }
                next_checkpoint += 1;
            }
        }
        // Rows still unbroken return their point of highest loss.
        let returned = blend(returned, best_point, &active);
        Run {
            returned: blend(x.clone(), returned, attack),
            evals,
        }
    }

    fn plain_loss(&self) -> AttackLoss {
        match self.loss {
            ApgdLoss::CrossEntropy => AttackLoss::CrossEntropy,
            _ => AttackLoss::Dlr,
        }
    }
}

impl Describe for ApgdConfig {
    fn name(&self) -> &'static str {
        match self.loss {
            ApgdLoss::CrossEntropy => "apgd-ce",
            ApgdLoss::Dlr => "apgd-dlr",
            ApgdLoss::TargetedDlr => "apgd-t",
        }
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    /// Every run starts at a random point of the ε-ball.
    fn randomised(&self) -> bool {
        true
    }
}

struct Run<B: Backend> {
    returned: Tensor<B, 4>,
    evals: Vec<usize>,
}

/// APGD's checkpoints for `iterations` = N: w_j = ⌈p_j N⌉ with p₀ = 0, p₁ = 0.22 and
/// p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06), up to N. For N = 100: 0, 22, 41, 57, 70,
/// 80, 87, 93, 99.
pub fn checkpoints(iterations: usize) -> Vec<usize> {
    // In hundredths, so that the schedule is exact (no 0.22 + 0.19 = 0.41000000000000003).
    let (mut before, mut now) = (0i64, 22i64);
    let mut out = vec![0];
    while now <= 100 {
        let w = (now as usize * iterations).div_ceil(100);
        if w > *out.last().expect("non-empty") && w <= iterations {
            out.push(w);
        }
        let next = now + (now - before - 3).max(6);
        (before, now) = (now, next);
    }
    out
}

/// Whether APGD halves an example's step at a checkpoint: fewer than `rho` of the `interval`
/// steps since the last checkpoint raised the loss (`increases`), or the step was not halved
/// at the last checkpoint and the best loss has not improved since.
pub fn should_halve(
    increases: usize,
    interval: usize,
    rho: f32,
    halved_last: bool,
    best_at_last: f32,
    best_now: f32,
) -> bool {
    let oscillating = (increases as f32) < rho * interval as f32;
    let stalled = !halved_last && best_now <= best_at_last;
    oscillating || stalled
}
