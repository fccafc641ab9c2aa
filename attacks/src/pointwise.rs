//! The pointwise attack (Schott et al. 2019), decision-based, minimising L0 then L2: start from
//! salt-and-pepper noise that is adversarial; L0 phase: visit the differing pixels in random
//! order and reset each to its original value when the input stays adversarial, until a pass
//! changes nothing; L2 phase: for each pixel still differing, bisect (10 steps) between its
//! adversarial and original value; repeat both while the L2 distance improves. All examples
//! advance in lock step, one batched query per pixel visit. "Pixel" means tensor element.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::attack::{Access, Describe};
use crate::decision::Start;
use crate::model::Model;
use crate::outcome::AttackOutcome;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of the pointwise attack (Schott et al. 2019): decision-based, it sees only the
/// predicted class and minimises L0, then L2.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointwiseConfig {
    /// Noise levels tried for the salt-and-pepper start (probabilities p/steps, p = 1..steps).
    pub init_steps: usize,
    /// Draws per noise level.
    pub init_repeats: usize,
    /// Bisection steps per pixel in the L2 phase.
    pub bisection_steps: usize,
    /// Rounds of (L0 phase, L2 phase) at most.
    pub max_rounds: usize,
    /// Forward passes per query of a stochastic model (all must misclassify).
    pub repeats: usize,
    /// Seed of the noise start, the pixel order and the model's noise.
    pub seed: u64,
}

impl Default for PointwiseConfig {
    fn default() -> Self {
        Self {
            init_steps: 100,
            init_repeats: 10,
            bisection_steps: 10,
            max_rounds: 10,
            repeats: 5,
            seed: 0,
        }
    }
}

impl PointwiseConfig {
    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y`: per example the sparsest, then closest
    /// adversarial found, or the clean input where no start was found. Misclassified inputs are not
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
        let mut adv: Vec<Vec<f32>> = (0..n)
            .map(|i| original[i * d..(i + 1) * d].to_vec())
            .collect();
        let x0 = |i: usize| &original[i * d..(i + 1) * d];

        // Salt-and-pepper start at increasing noise levels.
        let mut found = vec![false; n];
        'levels: for level in 1..=self.init_steps {
            let p = level as f64 / self.init_steps as f64;
            for _ in 0..self.init_repeats {
                let rows: Vec<usize> = (0..n).filter(|&i| !clean_wrong[i] && !found[i]).collect();
                if rows.is_empty() {
                    break 'levels;
                }
                let draws: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|&i| {
                        x0(i)
                            .iter()
                            .map(|&v| {
                                let u: f64 = rng.random();
                                if u < p / 2.0 {
                                    0.0
                                } else if u < p {
                                    1.0
                                } else {
                                    v
                                }
                            })
                            .collect()
                    })
                    .collect();
                let ok = oracle.adversarial::<B>(&draws.concat(), &rows, &device, rng);
                for (j, &i) in rows.iter().enumerate() {
                    if ok[j] {
                        found[i] = true;
                        adv[i] = draws[j].clone();
                    }
                }
            }
        }
        let started: Vec<usize> = (0..n).filter(|&i| found[i]).collect();
        let l2 = |a: &[f32], b: &[f32]| -> f64 {
            a.iter()
                .zip(b)
                .map(|(p, q)| ((p - q) as f64).powi(2))
                .sum::<f64>()
                .sqrt()
        };

        for _round in 0..self.max_rounds {
            let before: Vec<f64> = started.iter().map(|&i| l2(&adv[i], x0(i))).collect();
            // L0 phase: reset pixels while the input stays adversarial.
            loop {
                let mut orders: Vec<Vec<usize>> = started
                    .iter()
                    .map(|&i| (0..d).filter(|&k| adv[i][k] != x0(i)[k]).collect())
                    .collect();
                orders.iter_mut().for_each(|o| o.shuffle(rng));
                let longest = orders.iter().map(Vec::len).max().unwrap_or(0);
                let mut changed = false;
                for pos in 0..longest {
                    let (rows, pixels): (Vec<usize>, Vec<usize>) = started
                        .iter()
                        .zip(&orders)
                        .filter_map(|(&i, o)| o.get(pos).map(|&k| (i, k)))
                        .unzip();
                    let trial: Vec<f32> = rows
                        .iter()
                        .zip(&pixels)
                        .flat_map(|(&i, &k)| {
                            let mut t = adv[i].clone();
                            t[k] = x0(i)[k];
                            t
                        })
                        .collect();
                    let ok = oracle.adversarial::<B>(&trial, &rows, &device, rng);
                    for ((&i, &k), keep) in rows.iter().zip(&pixels).zip(ok) {
                        if keep {
                            adv[i][k] = x0(i)[k];
                            changed = true;
                        }
                    }
                }
                if !changed {
                    break;
                }
            }
            // L2 phase: bisect each remaining pixel toward its original value.
            let differing: Vec<Vec<usize>> = started
                .iter()
                .map(|&i| (0..d).filter(|&k| adv[i][k] != x0(i)[k]).collect())
                .collect();
            let longest = differing.iter().map(Vec::len).max().unwrap_or(0);
            for pos in 0..longest {
                let (rows, pixels): (Vec<usize>, Vec<usize>) = started
                    .iter()
                    .zip(&differing)
                    .filter_map(|(&i, o)| o.get(pos).map(|&k| (i, k)))
                    .unzip();
                // Per row: [toward original (not adversarial), current (adversarial)].
                let mut lo: Vec<f32> = rows.iter().zip(&pixels).map(|(&i, &k)| x0(i)[k]).collect();
                let mut hi: Vec<f32> = rows.iter().zip(&pixels).map(|(&i, &k)| adv[i][k]).collect();
                for _ in 0..self.bisection_steps {
                    let trial: Vec<f32> = rows
                        .iter()
                        .zip(&pixels)
                        .enumerate()
                        .flat_map(|(j, (&i, &k))| {
                            let mut t = adv[i].clone();
                            t[k] = 0.5 * (lo[j] + hi[j]);
                            t
                        })
                        .collect();
                    let ok = oracle.adversarial::<B>(&trial, &rows, &device, rng);
                    for (j, keep) in ok.into_iter().enumerate() {
                        let mid = 0.5 * (lo[j] + hi[j]);
                        if keep {
                            hi[j] = mid;
                        } else {
                            lo[j] = mid;
                        }
                    }
                }
                for (j, (&i, &k)) in rows.iter().zip(&pixels).enumerate() {
                    adv[i][k] = hi[j];
                }
            }
            let after: Vec<f64> = started.iter().map(|&i| l2(&adv[i], x0(i))).collect();
            if before
                .iter()
                .zip(&after)
                .all(|(b, a)| a >= &(b * (1.0 - 1e-6)))
            {
                break;
            }
        }

        st.finish(adv.concat(), &found)
    }
}

impl Describe for PointwiseConfig {
    fn name(&self) -> &'static str {
        "pointwise"
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Decisions
    }

    /// A random salt-and-pepper start and a random order of pixels.
    fn randomised(&self) -> bool {
        true
    }
}
