//! Projected gradient descent (Madry et al. 2018) under L∞ or L2, and FGSM / FGM as its
//! single-step special case: random start in the ε-ball, steps of a fraction of ε along the
//! norm's steepest-ascent direction, projection onto the ball and onto [0, 1], restarts that
//! keep the best per example, per-example early stop, and EOT (gradients averaged over draws
//! of a stochastic model's noise). Only correctly classified inputs are attacked.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::attack::{Access, Describe};
use crate::loss::AttackLoss;
use crate::model::{LossFn, Model};
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A per-example loss of the logits of some rows of the batch (the rows, then their logits).
type RowsLoss<'a, B> = &'a dyn Fn(&[usize], Tensor<B, 2>) -> Tensor<B, 1>;

/// Settings of PGD (Madry et al. 2018) and of FGSM / FGM (Goodfellow et al. 2015), its one-step
/// case; [`PgdConfig::pgd`] and [`PgdConfig::fgsm`] give foolbox 3's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PgdConfig {
    /// Threat model: the ball projected onto and the step direction (sign of the gradient for L∞,
    /// the normalised gradient for L2).
    pub norm: Norm,
    /// Gradient steps per run (foolbox 3: 40 for L∞, 50 for L2; FGSM: 1).
    pub steps: usize,
    /// Step size as a fraction of ε.
    pub rel_stepsize: f32,
    /// Runs from independent random starts; the first that succeeds counts.
    pub restarts: usize,
    /// Start from a uniform draw in the ε-ball (else from the clean input).
    pub random_start: bool,
    /// The per-example loss maximised (default: cross-entropy).
    pub loss: AttackLoss,
    /// Gradient draws averaged per step (expectation over transformation); 1: none.
    pub eot: usize,
    /// Stop attacking an example once it is misclassified.
    pub early_stop: bool,
    /// Seed of the random starts and of the model's noise; a run repeats exactly.
    pub seed: u64,
}

impl PgdConfig {
    /// foolbox 3's defaults: L∞ 40 steps of ε/30 (Madry's 0.01 at ε = 0.3), L2 50 steps of
    /// ε/40; random start; cross-entropy.
    pub fn pgd(norm: Norm) -> Self {
        let (steps, rel_stepsize) = match norm {
            Norm::Linf => (40, 0.01 / 0.3),
            Norm::L2 => (50, 0.025),
        };
        Self {
            norm,
            steps,
            rel_stepsize,
            restarts: 1,
            random_start: true,
            loss: AttackLoss::CrossEntropy,
            eot: 1,
            early_stop: true,
            seed: 0,
        }
    }

    /// FGSM (L∞) / FGM (L2): one step of size ε from the clean input.
    pub fn fgsm(norm: Norm) -> Self {
        Self {
            steps: 1,
            rel_stepsize: 1.0,
            random_start: false,
            early_stop: false,
            ..Self::pgd(norm)
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
        let mut rng = StdRng::seed_from_u64(self.seed);
        let labels = to_labels(y.clone());
        let clean = predicted(model.logits(x.clone(), &mut rng));
        let mut examples: Vec<ExampleOutcome> = (0..n)
            .map(|i| ExampleOutcome::clean(clean[i] == labels[i]))
            .collect();
        let mut best = x.clone();
        let mut found = vec![false; n];
        for _ in 0..self.restarts.max(1) {
            let attacked: Vec<bool> = (0..n)
                .map(|i| examples[i].clean_correct && !found[i])
                .collect();
            if !attacked.contains(&true) {
                break;
            }
            let (adv, evals) = self.ascend(model, &x, &labels, &attacked, eps, &mut rng);
            for (e, k) in examples.iter_mut().zip(evals) {
                e.gradient_evals += k;
            }
            // Confirm each candidate by re-classification (many chains if stochastic).
            let now = predicted(model.recheck_logits(adv.clone(), &mut rng));
            for i in 0..n {
                if attacked[i] {
                    examples[i].forward_evals += 1;
                    found[i] |= now[i] != labels[i];
                }
            }
            // Keep a confirmed break; elsewhere the last attempt, so its distance is reported.
            best = blend(best, adv, &attacked);
        }

        for (e, &f) in examples.iter_mut().zip(&found) {
            e.adversarial = f;
        }
        AttackOutcome::measure(x, best, examples)
    }

    /// Adversarial inputs for a whole batch, as adversarial training needs them (Madry et al.'s
    /// inner maximisation): every input is attacked, misclassified ones too, in one run from
    /// the configured start, with no re-check and no bookkeeping. `restarts` is ignored.
    pub fn perturb<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Tensor<Inner<B>, 4> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let labels = to_labels(y);
        let all = vec![true; labels.len()];
        self.ascend(model, &x, &labels, &all, eps, &mut rng).0
    }

    /// Inputs that maximise `loss`, any per-example loss of the logits of the whole batch (in
    /// batch order), over the ε-ball: TRADES' inner maximisation of the divergence from the
    /// clean prediction (Zhang et al. 2019, see [`kl_divergence`](crate::kl_divergence)) needs
    /// no labels. Every input moves for all steps from the configured start; `restarts`, `loss`
    /// and `early_stop` (which needs labels) are ignored.
    pub fn maximise<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        eps: f32,
    ) -> Tensor<Inner<B>, 4> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let n = x.dims()[0];
        let all = vec![true; n];
        let whole_batch = |rows: &[usize], logits: Tensor<B, 2>| {
            debug_assert_eq!(rows.len(), n, "without early stop every row moves");
            loss(logits)
        };
        self.climb(model, &x, &whole_batch, None, &all, eps, &mut rng)
            .0
    }

    /// One run of [`climb`](Self::climb) on the configured loss of the labels, stopping a row
    /// once misclassified when early stop is on.
    fn ascend<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: &Tensor<Inner<B>, 4>,
        labels: &[i64],
        attack: &[bool],
        eps: f32,
        rng: &mut StdRng,
    ) -> (Tensor<Inner<B>, 4>, Vec<usize>) {
        let device = x.device();
        let loss_of_labels = |rows: &[usize], logits: Tensor<B, 2>| {
            let y_rows = Tensor::<B, 1, Int>::from_data(
                TensorData::new(rows.iter().map(|&i| labels[i]).collect(), [rows.len()]),
                &device,
            );
            self.loss.of(logits, y_rows)
        };
        let stop_labels = self.early_stop.then_some(labels);
        self.climb(model, x, &loss_of_labels, stop_labels, attack, eps, rng)
    }

    /// One run of projected steepest ascent on `loss(rows, logits of those rows)` from a random
    /// (or zero) start: only the rows in `attack` move, and with `stop_labels` a row stops once
    /// classified away from its label. Each step computes only the rows still moving, so a
    /// finished row costs nothing (and the gradient evaluations counted are the ones made).
    /// Returns the inputs reached and each row's gradient evaluations.
    #[allow(clippy::too_many_arguments)]
    fn climb<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: &Tensor<Inner<B>, 4>,
        loss: RowsLoss<'_, B>,
        stop_labels: Option<&[i64]>,
        attack: &[bool],
        eps: f32,
        rng: &mut StdRng,
    ) -> (Tensor<Inner<B>, 4>, Vec<usize>) {
        let dims = x.dims();
        let n = dims[0];
        let device = x.device();
        let eps_all = Tensor::<Inner<B>, 1>::from_data(TensorData::new(vec![eps; n], [n]), &device);
        let mut active = attack.to_vec();
        let mut evals = vec![0; n];
        let delta = if self.random_start {
            self.norm
                .random_in_ball(dims, eps_all.clone(), rng, &device)
        } else {
            Tensor::zeros(dims, &device)
        };
        let mut adv = (x.clone() + delta).clamp(0.0, 1.0);
        for _ in 0..self.steps {
            let rows: Vec<usize> = (0..n).filter(|&i| active[i]).collect();
            if rows.is_empty() {
                break;
            }
            let rows_of = Rows::<Inner<B>>::new(&rows, n, &device);
            let (adv_rows, x_rows) = (rows_of.take(&adv), rows_of.take(x));
            let loss = |logits: Tensor<B, 2>| loss(&rows, logits);
            let mut grad = Tensor::<Inner<B>, 4>::zeros(adv_rows.dims(), &device);
            let mut logits_sum = None;
            for _ in 0..self.eot.max(1) {
                let (g, l) = model.loss_gradient(adv_rows.clone(), &loss, rng);
                grad = grad + g;
                logits_sum = Some(match logits_sum {
                    None => l,
                    Some(s) => s + l,
                });
            }
            for &i in &rows {
                evals[i] += self.eot.max(1);
            }
            if let Some(labels) = stop_labels {
                let now = predicted(logits_sum.expect("at least one draw"));
                for (k, &i) in rows.iter().enumerate() {
                    active[i] &= now[k] == labels[i];
                }
            }
            let step = self.norm.steepest(grad) * (self.rel_stepsize * eps);
            let eps_rows = Tensor::<Inner<B>, 1>::from_data(
                TensorData::new(vec![eps; rows.len()], [rows.len()]),
                &device,
            );
            let delta = self
                .norm
                .project(adv_rows + step - x_rows.clone(), eps_rows);
            let moved = (x_rows + delta).clamp(0.0, 1.0);
            adv = blend(adv, rows_of.put(moved), &active);
        }
        // Rows that were never attacked keep the clean input.
        (blend(x.clone(), adv, attack), evals)
    }
}

impl Describe for PgdConfig {
    fn name(&self) -> &'static str {
        if self.steps == 1 && !self.random_start && self.rel_stepsize == 1.0 {
            "fgsm"
        } else {
            "pgd"
        }
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    /// A random start in the ε-ball, unless it starts at the clean input (FGSM).
    fn randomised(&self) -> bool {
        self.random_start
    }
}

/// A subset of a batch's rows: taken out to be computed alone, and put back.
pub(crate) struct Rows<B: Backend> {
    index: Tensor<B, 1, Int>,
    n: usize,
    all: bool,
}

impl<B: Backend> Rows<B> {
    /// `rows` (ascending) of a batch of `n`.
    pub(crate) fn new(rows: &[usize], n: usize, device: &B::Device) -> Self {
        let index = rows.iter().map(|&r| r as i64).collect::<Vec<_>>();
        Self {
            index: Tensor::from_data(TensorData::new(index, [rows.len()]), device),
            n,
            all: rows.len() == n,
        }
    }

    /// These rows of `t`.
    pub(crate) fn take(&self, t: &Tensor<B, 4>) -> Tensor<B, 4> {
        if self.all {
            t.clone()
        } else {
            t.clone().select(0, self.index.clone())
        }
    }

    /// A full batch holding `values` in these rows and zeros elsewhere (exactly: 0 + v = v).
    pub(crate) fn put(&self, values: Tensor<B, 4>) -> Tensor<B, 4> {
        if self.all {
            return values;
        }
        let [_, c, h, w] = values.dims();
        Tensor::zeros([self.n, c, h, w], &values.device()).select_assign(
            0,
            self.index.clone(),
            values,
            burn::tensor::IndexingUpdateOp::Add,
        )
    }
}

pub(crate) fn to_labels<B: Backend>(y: Tensor<B, 1, Int>) -> Vec<i64> {
    y.into_data().convert::<i64>().to_vec().expect("labels")
}

/// Arg-max class of each row.
pub(crate) fn predicted<B: Backend>(logits: Tensor<B, 2>) -> Vec<i64> {
    let n = logits.dims()[0];
    to_labels(logits.argmax(1).reshape([n]))
}

/// `b` in the rows where `take_b`, `a` elsewhere.
pub(crate) fn blend<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>, take_b: &[bool]) -> Tensor<B, 4> {
    let n = take_b.len();
    let v: Vec<f32> = take_b.iter().map(|&t| f32::from(u8::from(t))).collect();
    let m = Tensor::<B, 4>::from_data(TensorData::new(v, [n, 1, 1, 1]), &a.device());
    a * (m.clone().neg() + 1.0) + b * m
}
