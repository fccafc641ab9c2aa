//! The boundary attack (Brendel et al. 2018), decision-based, with foolbox 3's defaults and
//! step-size adaptation. It starts from an adversarial found by blending the input
//! with uniform noise and walks along the decision boundary toward the input: an orthogonal
//! Gaussian step of `spherical_step`·‖x − x₀‖ projected back onto the sphere around x₀, then a
//! step of `source_step`·‖x − x₀‖ toward x₀; a candidate is kept when still adversarial and
//! closer. Minimises the L2 distance; all examples advance in lock step, one batched query per
//! step. The geometry runs on the host in f64, so results do not depend on the backend.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

use crate::attack::{Access, Describe};
use crate::decision::Start;
use crate::model::Model;
use crate::outcome::AttackOutcome;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of the boundary attack (Brendel et al. 2018): decision-based, it sees only the
/// predicted class and minimises the L2 distance. [`Default`] gives foolbox 3's step settings
/// (25 000 steps, both step sizes 0.01, adaptation factor 1.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoundaryConfig {
    /// Steps along the boundary at most (fewer once every example has converged).
    pub steps: usize,
    /// Initial length of the orthogonal step, as a fraction of the current distance ‖x − x₀‖₂;
    /// adapted per example.
    pub spherical_step: f64,
    /// Initial length of the step toward x₀, as a fraction of ‖x − x₀‖₂; adapted per example.
    pub source_step: f64,
    /// Factor by which step sizes grow or shrink.
    pub step_adaptation: f64,
    /// Success statistics are gathered (and the spherical candidate queried) every k steps.
    pub update_stats_every: usize,
    /// Uniform-noise images tried per example to find a starting adversarial.
    pub init_draws: usize,
    /// Bisection steps of the blend between the input and that noise.
    pub init_blend_steps: usize,
    /// Stop an example once its source step falls below this.
    pub convergence: f64,
    /// Forward passes per query of a stochastic model (all must misclassify).
    pub repeats: usize,
    /// Seed of the noise start, the steps and the model's noise; a run repeats exactly.
    pub seed: u64,
}

impl Default for BoundaryConfig {
    fn default() -> Self {
        Self {
            steps: 25_000,
            spherical_step: 1e-2,
            source_step: 1e-2,
            step_adaptation: 1.5,
            update_stats_every: 10,
            init_draws: 1000,
            init_blend_steps: 25,
            convergence: 1e-7,
            repeats: 5,
            seed: 0,
        }
    }
}

/// A fixed-length window of success flags.
struct Window {
    flags: VecDeque<bool>,
    len: usize,
}

impl Window {
    fn new(len: usize) -> Self {
        Self {
            flags: VecDeque::with_capacity(len),
            len,
        }
    }
    fn push(&mut self, v: bool) {
        if self.flags.len() == self.len {
            self.flags.pop_front();
        }
        self.flags.push_back(v);
    }
    /// The success rate once the window is full.
    fn rate(&self) -> Option<f64> {
        (self.flags.len() == self.len)
            .then(|| self.flags.iter().filter(|&&f| f).count() as f64 / self.len as f64)
    }
    fn clear(&mut self) {
        self.flags.clear();
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|a| a * a).sum::<f64>().sqrt()
}

impl BoundaryConfig {
    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y`: per example the closest adversarial
    /// found (L2), or the clean input where no start was found. Misclassified inputs are not
    /// attacked.
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
    ) -> AttackOutcome {
        let n = x.dims()[0];
        let mut st = Start::<M, B>::new(model, x, y, self.repeats, self.seed);
        let (d, device) = (st.d, st.device.clone());
        // Borrow the start's parts (the images stay where they are) until `finish`.
        let Start {
            oracle,
            original,
            clean_wrong,
            rng,
            ..
        } = &mut st;
        let x0 = |i: usize| &original[i * d..(i + 1) * d];

        // Start: blended uniform noise.
        let mut best: Vec<Vec<f64>> = (0..n)
            .map(|i| x0(i).iter().map(|&v| v as f64).collect())
            .collect();
        let mut found = vec![false; n];
        let mut noise: Vec<Vec<f32>> = vec![Vec::new(); n];
        for _ in 0..self.init_draws {
            let rows: Vec<usize> = (0..n).filter(|&i| !clean_wrong[i] && !found[i]).collect();
            if rows.is_empty() {
                break;
            }
            let draws: Vec<Vec<f32>> = rows
                .iter()
                .map(|_| (0..d).map(|_| rng.random::<f32>()).collect())
                .collect();
            let flat: Vec<f32> = draws.concat();
            let adv = oracle.adversarial::<B>(&flat, &rows, &device, rng);
            for (j, &i) in rows.iter().enumerate() {
                if adv[j] {
                    found[i] = true;
                    noise[i] = draws[j].clone();
                }
            }
        }
        let started: Vec<usize> = (0..n).filter(|&i| found[i]).collect();
        let (mut lo, mut hi) = (vec![0.0f64; n], vec![1.0f64; n]);
        let blend = |i: usize, t: f64| -> Vec<f64> {
            x0(i)
                .iter()
                .zip(&noise[i])
                .map(|(&a, &b)| (1.0 - t) * a as f64 + t * b as f64)
                .collect()
        };
        for _ in 0..self.init_blend_steps {
            let mids: Vec<Vec<f64>> = started
                .iter()
                .map(|&i| blend(i, 0.5 * (lo[i] + hi[i])))
                .collect();
            let flat: Vec<f32> = mids.iter().flatten().map(|&v| v as f32).collect();
            let adv = oracle.adversarial::<B>(&flat, &started, &device, rng);
            for (j, &i) in started.iter().enumerate() {
                let mid = 0.5 * (lo[i] + hi[i]);
                if adv[j] {
                    hi[i] = mid;
                } else {
                    lo[i] = mid;
                }
            }
        }
        for &i in &started {
            best[i] = blend(i, hi[i]);
        }

        // The walk along the boundary.
        let mut spherical = vec![self.spherical_step; n];
        let mut source = vec![self.source_step; n];
        let mut sph_stats: Vec<Window> = (0..n).map(|_| Window::new(100)).collect();
        let mut step_stats: Vec<Window> = (0..n).map(|_| Window::new(30)).collect();
        for step in 1..=self.steps {
            let rows: Vec<usize> = started
                .iter()
                .copied()
                .filter(|&i| source[i] >= self.convergence)
                .collect();
            if rows.is_empty() {
                break;
            }
            let check = step % self.update_stats_every == 0;
            let mut candidates = Vec::with_capacity(rows.len() * d);
            let mut on_sphere = Vec::with_capacity(rows.len() * d);
            let mut dist_before = Vec::with_capacity(rows.len());
            for &i in &rows {
                let o: Vec<f64> = x0(i).iter().map(|&v| v as f64).collect();
                let to_source: Vec<f64> = o.iter().zip(&best[i]).map(|(a, b)| a - b).collect();
                let r = norm(&to_source);
                dist_before.push(r);
                let unit: Vec<f64> = to_source.iter().map(|v| v / r).collect();
                // Gaussian step orthogonal to the source direction, of length spherical·r.
                let mut eta: Vec<f64> = (0..d).map(|_| StandardNormal.sample(rng)).collect();
                let along: f64 = eta.iter().zip(&unit).map(|(a, b)| a * b).sum();
                eta.iter_mut().zip(&unit).for_each(|(e, u)| *e -= along * u);
                let scale = spherical[i] * r / norm(&eta).max(1e-30);
                // Project back onto the sphere of radius r around the original.
                let dir: Vec<f64> = eta
                    .iter()
                    .zip(&to_source)
                    .map(|(e, s)| e * scale - s)
                    .collect();
                let dn = norm(&dir).max(1e-30);
                let sph: Vec<f64> = o.iter().zip(&dir).map(|(a, v)| a + v / dn * r).collect();
                // Then toward the original by source·r.
                let back: Vec<f64> = o.iter().zip(&sph).map(|(a, b)| a - b).collect();
                let bn = norm(&back).max(1e-30);
                let len = ((source[i] * r + bn - r).max(0.0)) / bn;
                candidates.extend(
                    sph.iter()
                        .zip(&back)
                        .map(|(s, b)| (s + len * b).clamp(0.0, 1.0) as f32),
                );
                on_sphere.extend(sph.iter().map(|s| s.clamp(0.0, 1.0) as f32));
            }
            let adv = oracle.adversarial::<B>(&candidates, &rows, &device, rng);
            let sph_adv = if check {
                oracle.adversarial::<B>(&on_sphere, &rows, &device, rng)
            } else {
                Vec::new()
            };
            for (j, &i) in rows.iter().enumerate() {
                let cand: Vec<f64> = candidates[j * d..(j + 1) * d]
                    .iter()
                    .map(|&v| v as f64)
                    .collect();
                let dist = norm(
                    &x0(i)
                        .iter()
                        .zip(&cand)
                        .map(|(&a, b)| a as f64 - b)
                        .collect::<Vec<_>>(),
                );
                if adv[j] && dist < dist_before[j] {
                    best[i] = cand;
                }
                if check {
                    sph_stats[i].push(sph_adv[j]);
                    step_stats[i].push(adv[j]);
                    let a = self.step_adaptation;
                    if let Some(p) = sph_stats[i].rate() {
                        if p > 0.5 {
                            spherical[i] *= a;
                            source[i] *= a;
                            sph_stats[i].clear();
                        } else if p < 0.2 {
                            spherical[i] /= a;
                            source[i] /= a;
                            sph_stats[i].clear();
                        }
                    }
                    if let Some(p) = step_stats[i].rate() {
                        if p > 0.25 {
                            source[i] *= a;
                            step_stats[i].clear();
                        } else if p < 0.1 {
                            source[i] /= a;
                            step_stats[i].clear();
                        }
                    }
                }
            }
        }

        let flat: Vec<f32> = best.iter().flatten().map(|&v| v as f32).collect();
        st.finish(flat, &found)
    }
}

impl Describe for BoundaryConfig {
    fn name(&self) -> &'static str {
        "boundary"
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Decisions
    }

    /// A random adversarial start and random proposals.
    fn randomised(&self) -> bool {
        true
    }
}
