//! The Square attack (Andriushchenko et al., ECCV 2020), L∞: a score-based black box that sees
//! only logits — no gradients — and so doubles as the check for gradient masking (it must not
//! beat the white-box attacks).
//!
//! It minimises the margin z_y − max_{j≠y} z_j by random search: the perturbation starts as
//! vertical stripes of ±ε (one sign per column and channel), and each query redraws one random
//! square window to ±ε per channel, kept when the margin drops. The window covers a fraction p of
//! the image, p = 0.8 halved after 10, 50, 200, 500, 1000, 2000, 4000, 6000 and 8000 of 10 000
//! queries (the schedule rescaled to the budget). Against a stochastic model every candidate is
//! judged on the mean logits of several passes. Only correctly classified inputs are attacked,
//! and a break is confirmed by re-classification.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::pgd::{predicted, to_labels};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of the Square attack (Andriushchenko et al. 2020), a score-based black-box L∞ attack
/// by random search over square windows; [`SquareConfig::new`] gives AutoAttack's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SquareConfig {
    /// Threat model; only L∞ is implemented (`run` refuses L2).
    pub norm: Norm,
    /// Query budget per example (AutoAttack: 5 000).
    pub queries: usize,
    /// Initial fraction of the image a window covers (0.8).
    pub p_init: f32,
    /// Forward passes whose mean logits judge a candidate when the model is stochastic.
    pub passes: usize,
    /// Seed of the stripes, the windows and the model's noise; a run repeats exactly.
    pub seed: u64,
}

impl SquareConfig {
    /// AutoAttack's settings: 5 000 queries, p_init = 0.8; candidates against a stochastic model
    /// judged on the mean of 4 passes.
    pub fn new(norm: Norm) -> Self {
        Self {
            norm,
            queries: 5000,
            p_init: 0.8,
            passes: 4,
            seed: 0,
        }
    }

    /// `square`, for reports.
    pub fn name(&self) -> &'static str {
        "square"
    }

    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y` at radius `eps`. Only L∞ is
    /// implemented; L2 is refused.
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, String> {
        if self.norm != Norm::Linf {
            return Err(
                "the Square attack is implemented for L∞ only; its L2 variant is not available yet"
                    .into(),
            );
        }
        let [n, c, h, w] = x.dims();
        let len = c * h * w;
        let dims = Dims { c, h, w };
        let device = x.device();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let labels = to_labels(y);
        let passes = if model.is_stochastic() {
            self.passes.max(1)
        } else {
            1
        };
        let clean: Vec<f32> = x
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        let pred = predicted(model.logits(x.clone(), &mut rng));
        let mut examples: Vec<ExampleOutcome> = (0..n)
            .map(|i| ExampleOutcome::clean(pred[i] == labels[i]))
            .collect();
        // The margin z_y − max_{j≠y} z_j of some rows' candidates (mean logits of `passes`).
        let margins =
            |rows: &[usize], images: &[f32], rng: &mut StdRng, examples: &mut [ExampleOutcome]| {
                let m = rows.len();
                let batch = Tensor::<Inner<B>, 4>::from_data(
                    TensorData::new(images.to_vec(), [m, c, h, w]),
                    &device,
                );
                let mut sum: Option<Tensor<Inner<B>, 2>> = None;
                for _ in 0..passes {
                    let l = model.logits(batch.clone(), rng);
                    sum = Some(sum.map_or(l.clone(), |s| s + l));
                }
                let logits: Vec<f32> = (sum.expect("one pass") / passes as f32)
                    .into_data()
                    .convert::<f32>()
                    .to_vec()
                    .expect("f32");
                let k = logits.len() / m;
                rows.iter()
                    .enumerate()
                    .map(|(r, &i)| {
                        examples[i].forward_evals += passes;
                        let z = &logits[r * k..(r + 1) * k];
                        let y = labels[i] as usize;
                        let other = (0..k)
                            .filter(|&j| j != y)
                            .map(|j| z[j])
                            .fold(f32::NEG_INFINITY, f32::max);
                        z[y] - other
                    })
                    .collect::<Vec<f32>>()
            };
        let clip = |i: usize, delta: &[f32]| -> Vec<f32> {
            (0..len)
                .map(|d| (clean[i * len + d] + delta[d]).clamp(0.0, 1.0))
                .collect()
        };

        // Vertical stripes of ±ε: one sign per channel and column.
        let attacked: Vec<usize> = (0..n).filter(|&i| examples[i].clean_correct).collect();
        let mut delta: Vec<Vec<f32>> = vec![vec![0.0; len]; n];
        for &i in &attacked {
            delta[i] = linf_start(dims, eps, &mut rng);
        }
        let images: Vec<f32> = attacked.iter().flat_map(|&i| clip(i, &delta[i])).collect();
        let mut margin = vec![f32::INFINITY; n];
        if !attacked.is_empty() {
            for (&i, m) in attacked
                .iter()
                .zip(margins(&attacked, &images, &mut rng, &mut examples))
            {
                margin[i] = m;
            }
        }
        for query in 1..self.queries {
            let active: Vec<usize> = attacked
                .iter()
                .copied()
                .filter(|&i| margin[i] >= 0.0)
                .collect();
            if active.is_empty() {
                break;
            }
            let side = self.window_side(query, h, w);
            let candidates: Vec<Vec<f32>> = active
                .iter()
                .map(|&i| {
                    let x0 = &clean[i * len..(i + 1) * len];
                    linf_candidate(&delta[i], x0, dims, side, eps, &mut rng)
                })
                .collect();
            let images: Vec<f32> = active
                .iter()
                .zip(&candidates)
                .flat_map(|(&i, d)| clip(i, d))
                .collect();
            let new = margins(&active, &images, &mut rng, &mut examples);
            for ((&i, m), d) in active.iter().zip(new).zip(candidates) {
                if m < margin[i] {
                    margin[i] = m;
                    delta[i] = d;
                }
            }
        }
        let returned: Vec<f32> = (0..n)
            .flat_map(|i| {
                if examples[i].clean_correct {
                    clip(i, &delta[i])
                } else {
                    clean[i * len..(i + 1) * len].to_vec()
                }
            })
            .collect();
        let returned =
            Tensor::<Inner<B>, 4>::from_data(TensorData::new(returned, [n, c, h, w]), &device);
        // Confirm each candidate that crossed (many chains for a stochastic model).
        let now = predicted(model.recheck_logits(returned.clone(), &mut rng));
        for i in 0..n {
            if examples[i].clean_correct {
                examples[i].forward_evals += 1;
                examples[i].adversarial = margin[i] < 0.0 && now[i] != labels[i];
            }
        }
        Ok(AttackOutcome::measure(x, returned, examples))
    }

    /// The side of the square windows at `query` in an `h × w` image, from
    /// [`SquareConfig::window_fraction`] p: round(√(p·h·w)), at least 1 and at most
    /// min(h, w) − 1 (at most 1 for an image one pixel wide).
    pub fn window_side(&self, query: usize, h: usize, w: usize) -> usize {
        let p = self.window_fraction(query);
        let side = (p * (h * w) as f32).sqrt().round() as usize;
        side.clamp(1, (h.min(w) - 1).max(1))
    }

    /// The fraction of the image a window covers at `query`: p_init, halved at 10, 50, 200,
    /// 500, 1000, 2000, 4000, 6000 and 8000 of 10 000 queries, rescaled to the budget.
    pub fn window_fraction(&self, query: usize) -> f32 {
        let at = query * 10_000 / self.queries.max(1);
        let halvings = [10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000]
            .iter()
            .filter(|&&t| at > t)
            .count();
        self.p_init / (1u32 << halvings) as f32
    }
}

/// Channels, rows and columns of one image (`[C, H, W]`, row-major).
#[derive(Debug, Clone, Copy)]
struct Dims {
    c: usize,
    h: usize,
    w: usize,
}

impl Dims {
    /// Index of channel `ch`, row `row`, column `col`.
    fn at(self, ch: usize, row: usize, col: usize) -> usize {
        (ch * self.h + row) * self.w + col
    }
}

/// The L∞ start: vertical stripes of ±ε, one sign per channel and column.
fn linf_start(d: Dims, eps: f32, rng: &mut StdRng) -> Vec<f32> {
    let mut delta = vec![0.0; d.c * d.h * d.w];
    for ch in 0..d.c {
        for col in 0..d.w {
            let v = if rng.random_bool(0.5) { eps } else { -eps };
            for row in 0..d.h {
                delta[d.at(ch, row, col)] = v;
            }
        }
    }
    delta
}

/// The L∞ candidate: one random `side × side` window of `delta` set to ±ε, one sign per
/// channel, redrawn (up to 100 times) until it changes the clipped image of `x0`, else the query
/// would be wasted.
fn linf_candidate(
    delta: &[f32],
    x0: &[f32],
    d: Dims,
    side: usize,
    eps: f32,
    rng: &mut StdRng,
) -> Vec<f32> {
    let (top, left) = (
        rng.random_range(0..=d.h - side),
        rng.random_range(0..=d.w - side),
    );
    let window = move |ch: usize| {
        (top..top + side)
            .flat_map(move |row| (left..left + side).map(move |col| d.at(ch, row, col)))
    };
    let mut next = delta.to_vec();
    for _ in 0..100 {
        for ch in 0..d.c {
            let v = if rng.random_bool(0.5) { eps } else { -eps };
            for k in window(ch) {
                next[k] = v;
            }
        }
        let changed = (0..d.c).any(|ch| {
            window(ch).any(|k| {
                ((x0[k] + next[k]).clamp(0.0, 1.0) - (x0[k] + delta[k]).clamp(0.0, 1.0)).abs()
                    > 1e-7
            })
        });
        if changed {
            break;
        }
    }
    next
}
