//! The fast adaptive boundary attack, FAB (Croce & Hein, ICML 2020, "Minimally distorted
//! adversarial examples with a fast adaptive boundary attack"), under L∞ and L2: a
//! minimum-perturbation attack, so one run answers every ε (through
//! [`MinimumNorm`](crate::MinimumNorm)), and the white-box member of AutoAttack that does not
//! depend on a loss being well scaled.
//!
//! Each iteration linearises the classifier at the current point x_i: for a target class t,
//! f = z_t − z_y and its input gradient g give the hyperplane {f + g·δ = 0}. The smallest step
//! (in the attack's norm, inside the [0, 1] box) from x_i onto it is δ₁, the one from the
//! original x₀ onto it is δ₂; the next point is (1 − α)(x_i + η δ₁) + α(x₀ + η δ₂) with
//! α = min(‖δ₁‖ / (‖δ₁‖ + ‖δ₂‖), α_max), so the walk is biased toward x₀ the closer it gets to
//! the boundary, and the overshoot η > 1 lands it on the far side. A point that is
//! misclassified is kept if closer than the best so far, and the walk steps back toward x₀
//! (x₀ + β (x − x₀)) to look for a closer crossing.
//!
//! FAB-T (AutoAttack's default) targets each of the most likely other classes of the clean
//! input in turn and keeps the closest adversarial per example; the untargeted FAB instead
//! linearises toward the closest boundary over all classes at every step (one gradient per
//! class). The projections onto a hyperplane within the box are exact
//! ([`hyperplane_step_l2`](crate::hyperplane_step_l2),
//! [`hyperplane_step_linf`](crate::hyperplane_step_linf)) and run on the host in f64, so the
//! geometry does not depend on the backend. As the other gradient attacks here it works
//! through [`Model`]: gradients averaged over `eot` draws, a candidate against a stochastic
//! model judged on the mean logits of several passes, only correctly classified inputs
//! attacked, and the returned adversarial confirmed by re-classification.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::attack::MinimumPerturbation;
use crate::attack::{Access, Describe};
use crate::hyperplane::hyperplane_step;
use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::pgd::{predicted, to_labels};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of FAB (Croce & Hein 2020), a minimum-perturbation attack under L∞ or L2;
/// [`FabConfig::new`] gives AutoAttack's FAB-T.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabConfig {
    /// The norm whose perturbation is minimised (L∞ or L2).
    pub norm: Norm,
    /// FAB-T: one run toward each of the `target_classes` most likely other classes. Else the
    /// untargeted FAB, which linearises toward the closest boundary over all classes (one
    /// gradient per other class per step).
    pub targeted: bool,
    /// FAB-T: how many of the most likely other classes are targeted in turn (AutoAttack: 9).
    pub target_classes: usize,
    /// Iterations per run (AutoAttack: 100).
    pub iterations: usize,
    /// Runs per target: the first from the clean input, the others from a random point.
    pub restarts: usize,
    /// α_max: the largest weight of the step from the original point (0.1).
    pub alpha_max: f32,
    /// η: overshoot of the projection onto the linearised boundary (1.05).
    pub eta: f32,
    /// β: the backward step toward the original after a success, x₀ + β (x − x₀) (0.9).
    pub beta: f32,
    /// Runs after the first start on the sphere of radius ½·min(this, the closest
    /// adversarial found so far) around the input (in the attack's norm). AutoAttack passes
    /// its threat model's ε.
    pub restart_radius: f32,
    /// Gradient draws averaged per step (expectation over transformation); 1: none.
    pub eot: usize,
    /// Forward passes whose mean logits judge whether a point is adversarial when the model
    /// is stochastic (a deterministic model is asked once).
    pub passes: usize,
    /// Seed of the random restarts and of the model's noise; a run repeats exactly.
    pub seed: u64,
}

impl FabConfig {
    /// AutoAttack's FAB-T: targeted at the 9 most likely other classes, 100 iterations, one
    /// run per target, α_max = 0.1, η = 1.05, β = 0.9; restarts (none by default) within
    /// half the usual CIFAR-10 ε (8/255 for L∞, 0.5 for L2); no EOT; candidates against a
    /// stochastic model judged on the mean of 4 passes.
    pub fn new(norm: Norm) -> Self {
        Self {
            norm,
            targeted: true,
            target_classes: 9,
            iterations: 100,
            restarts: 1,
            alpha_max: 0.1,
            eta: 1.05,
            beta: 0.9,
            restart_radius: match norm {
                Norm::Linf => 8.0 / 255.0,
                Norm::L2 => 0.5,
            },
            eot: 1,
            passes: 4,
            seed: 0,
        }
    }

    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y`: per example the closest
    /// confirmed adversarial found, or the clean input (not adversarial, distance 0).
    /// Misclassified inputs are not attacked.
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        let dims = x.dims();
        let n = dims[0];
        let d: usize = dims[1..].iter().product();
        let device = x.device();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let labels = to_labels(y);
        let clean_logits = model.logits(x.clone(), &mut rng);
        let classes = clean_logits.dims()[1];
        let clean = predicted(clean_logits.clone());
        let mut examples: Vec<ExampleOutcome> = (0..n)
            .map(|i| ExampleOutcome::clean(clean[i] == labels[i]))
            .collect();
        let rows: Vec<usize> = (0..n).filter(|&i| examples[i].clean_correct).collect();
        let original: Vec<f32> = x
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");

        // FAB-T's targets: the 2nd, 3rd, … most likely classes of the clean input.
        let targets: Vec<Option<Vec<i64>>> = if self.targeted {
            let (_, order) = clean_logits.sort_descending_with_indices(1);
            let order = to_labels(order.reshape([n * classes]));
            (1..=self.target_classes.min(classes.saturating_sub(1)))
                .map(|t| Some(rows.iter().map(|&i| order[i * classes + t]).collect()))
                .collect()
        } else if classes >= 2 {
            vec![None]
        } else {
            Vec::new()
        };

        let mut best = Best {
            point: original.clone(),
            distance: vec![f32::INFINITY; n],
        };
        if !rows.is_empty() {
            for target in &targets {
                for restart in 0..self.restarts.max(1) {
                    self.descend(
                        model,
                        Problem {
                            original: &original,
                            dims,
                            device: &device,
                            rows: &rows,
                            labels: &labels,
                            target: target.as_deref(),
                            classes,
                        },
                        restart > 0,
                        &mut best,
                        &mut examples,
                        &mut rng,
                    );
                }
            }
        }

        // Confirm the closest adversarial of each example (many chains for a stochastic
        // model); one that does not hold returns the clean input.
        let found: Vec<usize> = rows
            .iter()
            .copied()
            .filter(|&i| best.distance[i].is_finite())
            .collect();
        if !found.is_empty() {
            let flat: Vec<f32> = found
                .iter()
                .flat_map(|&i| best.point[i * d..(i + 1) * d].iter().copied())
                .collect();
            let mut shape = dims;
            shape[0] = found.len();
            let batch = Tensor::<Inner<B>, 4>::from_data(TensorData::new(flat, shape), &device);
            let now = predicted(model.recheck_logits(batch, &mut rng));
            for (j, &i) in found.iter().enumerate() {
                examples[i].forward_evals += 1;
                if now[j] != labels[i] {
                    examples[i].adversarial = true;
                } else {
                    best.point[i * d..(i + 1) * d].copy_from_slice(&original[i * d..(i + 1) * d]);
                }
            }
        }
        let returned = Tensor::<Inner<B>, 4>::from_data(TensorData::new(best.point, dims), &device);
        AttackOutcome::measure(x, returned, examples)
    }

    /// One FAB run on `problem.rows` toward `problem.target` (per row; `None`: the closest
    /// boundary), from the clean input or from a random start. Every misclassified point met
    /// that is closer than `best` replaces it.
    fn descend<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        problem: Problem<'_, Inner<B>>,
        random_start: bool,
        best: &mut Best,
        examples: &mut [ExampleOutcome],
        rng: &mut StdRng,
    ) {
        let Problem {
            original,
            dims,
            device,
            rows,
            labels,
            target,
            classes,
        } = problem;
        let d: usize = dims[1..].iter().product();
        let x0 = |i: usize| &original[i * d..(i + 1) * d];
        let y: Vec<i64> = rows.iter().map(|&i| labels[i]).collect();
        let mut points: Vec<f32> = Vec::with_capacity(rows.len() * d);
        for &i in rows {
            if random_start {
                let radius = 0.5 * self.restart_radius.min(best.distance[i]);
                points.extend(self.random_start(x0(i), radius, rng));
            } else {
                points.extend_from_slice(x0(i));
            }
        }
        let mut shape = dims;
        shape[0] = rows.len();
        let batch = |v: &[f32]| {
            Tensor::<Inner<B>, 4>::from_data(TensorData::new(v.to_vec(), shape), device)
        };
        for _ in 0..self.iterations {
            let at = batch(&points);
            let (f, g, draws) = match target {
                Some(t) => {
                    let (f, g) = self.linearise(model, &at, &y, t, rng);
                    (f, g, self.eot.max(1))
                }
                None => self.closest_boundary(model, &at, &y, classes, rng),
            };
            let mut next: Vec<f32> = Vec::with_capacity(points.len());
            for (j, &i) in rows.iter().enumerate() {
                let span = j * d..(j + 1) * d;
                next.extend(self.step(&points[span.clone()], x0(i), &g[span], f[j]));
            }
            let adversarial = self.misclassified(model, batch(&next), &y, rng);
            for (j, &i) in rows.iter().enumerate() {
                examples[i].gradient_evals += draws;
                examples[i].forward_evals += self.passes_for(model);
                if !adversarial[j] {
                    continue;
                }
                let point = &mut next[j * d..(j + 1) * d];
                let distance = size(self.norm, point.iter().zip(x0(i)).map(|(&p, &o)| p - o));
                if (distance as f32) < best.distance[i] {
                    best.distance[i] = distance as f32;
                    best.point[i * d..(i + 1) * d].copy_from_slice(point);
                }
                // Back toward the original: a closer crossing may lie in between.
                for (p, &o) in point.iter_mut().zip(x0(i)) {
                    *p = o + self.beta * (*p - o);
                }
            }
            points = next;
        }
    }

    /// One FAB step of one example from `point`, with the linearisation `f + g·δ` there:
    /// the biased combination of the overshot projections of `point` and of `original`.
    fn step(&self, point: &[f32], original: &[f32], g: &[f32], f: f64) -> Vec<f32> {
        let bounds = |v: &[f32]| -> (Vec<f32>, Vec<f32>) {
            (
                v.iter().map(|a| -a).collect(),
                v.iter().map(|a| 1.0 - a).collect(),
            )
        };
        let (lb, ub) = bounds(point);
        let d1 = hyperplane_step(self.norm, g, -f as f32, &lb, &ub);
        // The same hyperplane seen from the original: f + g·(x₀ − x_i + δ) = 0.
        let shift: f64 = g
            .iter()
            .zip(original.iter().zip(point))
            .map(|(&w, (&o, &p))| w as f64 * (o as f64 - p as f64))
            .sum();
        let (lb, ub) = bounds(original);
        let d2 = hyperplane_step(self.norm, g, (-f - shift) as f32, &lb, &ub);
        let a1 = size(self.norm, d1.iter().copied()).max(1e-8);
        let a2 = size(self.norm, d2.iter().copied()).max(1e-8);
        let alpha = (a1 / (a1 + a2)).clamp(0.0, self.alpha_max as f64);
        let eta = self.eta as f64;
        (0..point.len())
            .map(|k| {
                let from_point = point[k] as f64 + eta * d1[k] as f64;
                let from_original = original[k] as f64 + eta * d2[k] as f64;
                ((1.0 - alpha) * from_point + alpha * from_original).clamp(0.0, 1.0) as f32
            })
            .collect()
    }

    /// f = z_t − z_y per row and its input gradient (flat, row after row) at `batch`,
    /// both averaged over `eot` draws of the model's noise.
    fn linearise<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        batch: &Tensor<Inner<B>, 4>,
        y: &[i64],
        t: &[i64],
        rng: &mut StdRng,
    ) -> (Vec<f64>, Vec<f32>) {
        let m = y.len();
        let device = batch.device();
        let column = |v: &[i64]| {
            Tensor::<B, 2, Int>::from_data(TensorData::new(v.to_vec(), [m, 1]), &device)
        };
        let (y_t, t_t) = (column(y), column(t));
        let loss = |z: Tensor<B, 2>| {
            (z.clone().gather(1, t_t.clone()) - z.gather(1, y_t.clone())).reshape([m])
        };
        let draws = self.eot.max(1);
        let mut grad: Option<Tensor<Inner<B>, 4>> = None;
        let mut logits: Option<Tensor<Inner<B>, 2>> = None;
        for _ in 0..draws {
            let (g, l) = model.loss_gradient(batch.clone(), &loss, rng);
            grad = Some(grad.map_or(g.clone(), |s| s + g));
            logits = Some(logits.map_or(l.clone(), |s| s + l));
        }
        let host = |t: Tensor<Inner<B>, 4>| -> Vec<f32> {
            t.into_data().convert::<f32>().to_vec().expect("f32")
        };
        let g = host(grad.expect("one draw") / draws as f32);
        let z: Vec<f32> = (logits.expect("one draw") / draws as f32)
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        let k = z.len() / m.max(1);
        let f = (0..m)
            .map(|j| z[j * k + t[j] as usize] as f64 - z[j * k + y[j] as usize] as f64)
            .collect();
        (f, g)
    }

    /// The untargeted linearisation: per row, the class j ≠ y whose linearised boundary is
    /// closest, |f_j| / ‖g_j‖ in the dual norm (L1 for L∞, L2 for L2). Returns its f and g,
    /// and the gradient draws spent per row.
    fn closest_boundary<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        batch: &Tensor<Inner<B>, 4>,
        y: &[i64],
        classes: usize,
        rng: &mut StdRng,
    ) -> (Vec<f64>, Vec<f32>, usize) {
        let m = y.len();
        let d: usize = batch.dims()[1..].iter().product();
        let mut best_f = vec![0.0f64; m];
        let mut best_g = vec![0.0f32; m * d];
        let mut best_ratio = vec![f64::INFINITY; m];
        for j in 0..classes - 1 {
            // The j-th class other than each row's label.
            let t: Vec<i64> = y
                .iter()
                .map(|&l| {
                    if (j as i64) < l {
                        j as i64
                    } else {
                        j as i64 + 1
                    }
                })
                .collect();
            let (f, g) = self.linearise(model, batch, y, &t, rng);
            for r in 0..m {
                let row = &g[r * d..(r + 1) * d];
                let dual = match self.norm {
                    Norm::Linf => row.iter().map(|&v| (v as f64).abs()).sum::<f64>(),
                    Norm::L2 => row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt(),
                };
                let ratio = f[r].abs() / (dual + 1e-12);
                if ratio < best_ratio[r] {
                    best_ratio[r] = ratio;
                    best_f[r] = f[r];
                    best_g[r * d..(r + 1) * d].copy_from_slice(row);
                }
            }
        }
        (best_f, best_g, (classes - 1) * self.eot.max(1))
    }

    /// Forward passes per judgement: `passes` for a stochastic model, else 1.
    fn passes_for<B: AutodiffBackend, M: Model<B>>(&self, model: &M) -> usize {
        if model.is_stochastic() {
            self.passes.max(1)
        } else {
            1
        }
    }

    /// Whether each row of `batch` is misclassified, on the mean logits of the passes.
    fn misclassified<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        batch: Tensor<Inner<B>, 4>,
        y: &[i64],
        rng: &mut StdRng,
    ) -> Vec<bool> {
        let passes = self.passes_for(model);
        let mut sum: Option<Tensor<Inner<B>, 2>> = None;
        for _ in 0..passes {
            let l = model.logits(batch.clone(), rng);
            sum = Some(sum.map_or(l.clone(), |s| s + l));
        }
        let pred = predicted(sum.expect("one pass") / passes as f32);
        pred.iter().zip(y).map(|(p, l)| p != l).collect()
    }

    /// A point on the sphere of `radius` (in the attack's norm) around `original`, clipped
    /// to the box: a uniform draw scaled to L∞ size `radius`, or a Gaussian direction.
    fn random_start(&self, original: &[f32], radius: f32, rng: &mut StdRng) -> Vec<f32> {
        let draw: Vec<f64> = match self.norm {
            Norm::Linf => (0..original.len())
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
            Norm::L2 => (0..original.len())
                .map(|_| StandardNormal.sample(rng))
                .collect(),
        };
        let scale = radius as f64 / size(self.norm, draw.iter().map(|&v| v as f32)).max(1e-12);
        original
            .iter()
            .zip(&draw)
            .map(|(&o, &v)| (o as f64 + scale * v).clamp(0.0, 1.0) as f32)
            .collect()
    }
}

impl Describe for FabConfig {
    fn name(&self) -> &'static str {
        if self.targeted {
            "fab-t"
        } else {
            "fab"
        }
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Gradients
    }

    /// The first run starts at the clean input; restarts start at random points.
    fn randomised(&self) -> bool {
        self.restarts > 1
    }
}

/// What one FAB run attacks: the clean inputs (flat), their shape and device, the rows
/// attacked, every row's label, the attacked rows' targets, and the model's classes.
struct Problem<'a, B: Backend> {
    original: &'a [f32],
    dims: [usize; 4],
    device: &'a B::Device,
    rows: &'a [usize],
    labels: &'a [i64],
    target: Option<&'a [i64]>,
    classes: usize,
}

/// The closest adversarial found so far per example (flat; the clean input where none) and
/// its distance (∞ where none).
struct Best {
    point: Vec<f32>,
    distance: Vec<f32>,
}

/// L∞ or L2 size of a vector, in f64.
fn size(norm: Norm, v: impl Iterator<Item = f32>) -> f64 {
    match norm {
        Norm::Linf => v.fold(0.0f64, |m, a| m.max((a as f64).abs())),
        Norm::L2 => v.map(|a| (a as f64).powi(2)).sum::<f64>().sqrt(),
    }
}

impl<B: AutodiffBackend, M: Model<B>> MinimumPerturbation<B, M> for FabConfig {
    fn run_once(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        self.run::<B, M>(model, x, y)
    }
}
