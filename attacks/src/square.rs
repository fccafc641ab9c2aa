//! The Square attack (Andriushchenko et al., ECCV 2020), under L∞ and L2: a score-based black
//! box that sees only logits — no gradients — and so doubles as the check for gradient masking
//! (it must not beat the white-box attacks).
//!
//! It minimises the margin z_y − max_{j≠y} z_j by random search: each query changes the
//! perturbation in one random square window, and the change is kept when the margin drops. The
//! window covers a fraction p of the image, p = 0.8 halved after 10, 50, 200, 500, 1000, 2000,
//! 4000, 6000 and 8000 of 10 000 queries (the schedule rescaled to the budget). Against a
//! stochastic model every candidate is judged on the mean logits of several passes. Only
//! correctly classified inputs are attacked, and a break is confirmed by re-classification. One
//! loop serves both norms; only the start and the candidate depend on the norm:
//!
//! - L∞: the perturbation starts as vertical stripes of ±ε (one sign per column and channel),
//!   and a candidate redraws the window to ±ε per channel: the optimum of a locally linear
//!   margin is a vertex of the ε-cube, which such moves reach.
//! - L2: a window of ±ε alone would already leave the L2 ball, so the perturbation instead keeps
//!   ‖δ‖₂ = ε and moves mass around. It starts as a grid of pseudo-Gaussian bumps (a positive and a
//!   negative half per window, AutoAttack's `meta_pseudo_gaussian_pert`) with random signs per
//!   channel; a candidate draws two windows, empties the second and puts its mass (with any unused
//!   budget) into the first, reshaped as its old content plus a fresh ±bump; the whole is rescaled
//!   to ‖δ‖₂ = ε and clipped to [0, 1], which can only shorten it. Windows have an odd side of at
//!   least 3 (AutoAttack's rule) but never exceed the image, so small images work (down to 1 × 1);
//!   the two windows are drawn independently, and when they coincide the candidate only reshapes
//!   that window. Unlike AutoAttack, whose window corner is drawn from 0..H − side (the last
//!   position is never used, and a side-3 window on a 4 × 4 image never moves), every position is
//!   drawn; and AutoAttack's start tiles windows of side ⌊H/5⌋, which is 0 below 5 × 5 and fails,
//!   where this one falls back to single pixels.
//!
//! An L2 move turns its window's content by about 45° (the old direction plus a fresh unit
//! bump), so the step is as coarse as the window is large against the image: on tiny images
//! (the 4 × 4 test problems, where a window covers at least 9 of 16 pixels, and a move turns the
//! whole perturbation by some 47°) the search stalls short of the minimal L2 perturbation of a
//! linear model — it breaks it at 1.2–2.4× that (median 1.4×), hardly closer with ten times the
//! queries — where the L∞ variant finds its vertex to within 2 %.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::attack::{Access, Describe};
use crate::model::Model;
use crate::norm::Norm;
use crate::outcome::{AttackOutcome, ExampleOutcome};
use crate::pgd::{predicted, to_labels};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of the Square attack (Andriushchenko et al. 2020), a score-based black-box L∞ or L2
/// attack by random search over square windows; [`SquareConfig::new`] gives AutoAttack's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SquareConfig {
    /// Threat model: L∞ or L2.
    pub norm: Norm,
    /// Query budget per example (AutoAttack: 5 000).
    pub queries: usize,
    /// Initial fraction of the image a window covers (0.8).
    pub p_init: f32,
    /// Forward passes whose mean logits judge a candidate when the model is stochastic.
    pub passes: usize,
    /// Seed of the starting perturbation, the windows and the model's noise; a run repeats
    /// exactly.
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

    /// Attacks `x` (`[N, C, H, W]`, [0, 1]) with labels `y` at radius `eps` in `self.norm`;
    /// the returned inputs stay in [0, 1] and within `eps` of `x` (up to f32 rounding). Both
    /// norms are implemented, so this always returns `Ok` (the `Result` is the [`Attack`]
    /// trait's).
    ///
    /// [`Attack`]: crate::Attack
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        eps: f32,
    ) -> Result<AttackOutcome, crate::AttackError> {
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

        // The starting perturbation: stripes (L∞) or tiled pseudo-Gaussian windows (L2).
        let attacked: Vec<usize> = (0..n).filter(|&i| examples[i].clean_correct).collect();
        let mut delta: Vec<Vec<f32>> = vec![vec![0.0; len]; n];
        for &i in &attacked {
            let x0 = &clean[i * len..(i + 1) * len];
            delta[i] = match self.norm {
                Norm::Linf => linf_start(dims, eps, &mut rng),
                Norm::L2 => l2_start(x0, dims, eps, &mut rng),
            };
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
                    match self.norm {
                        Norm::Linf => linf_candidate(&delta[i], x0, dims, side, eps, &mut rng),
                        Norm::L2 => l2_candidate(&delta[i], x0, dims, side, eps, &mut rng),
                    }
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
    /// [`SquareConfig::window_fraction`] p: round(√(p·h·w)), at least 1 and, under L∞, at most
    /// min(h, w) − 1 (at most 1 for an image one pixel wide); under L2 at least 3 and odd, as
    /// AutoAttack has it, then at most min(h, w) (so 2 or 1 in images that small).
    pub fn window_side(&self, query: usize, h: usize, w: usize) -> usize {
        let p = self.window_fraction(query);
        let side = (p * (h * w) as f32).sqrt().round() as usize;
        match self.norm {
            Norm::Linf => side.clamp(1, (h.min(w) - 1).max(1)),
            Norm::L2 => (side.max(3) | 1).min(h.min(w)),
        }
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

impl Describe for SquareConfig {
    fn name(&self) -> &'static str {
        "square"
    }

    fn settings(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("settings serialise")
    }

    fn access(&self) -> Access {
        Access::Scores
    }

    /// Random squares (L∞) or windows (L2), and a random start.
    fn randomised(&self) -> bool {
        true
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

/// Sum of squares, in f64.
fn squared(v: impl IntoIterator<Item = f64>) -> f64 {
    v.into_iter().map(|a| a * a).sum()
}

/// `v` scaled to unit L2 norm (left as it is when it is zero).
fn unit(mut v: Vec<f64>) -> Vec<f64> {
    let norm = squared(v.iter().copied()).sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|a| *a /= norm);
    }
    v
}

/// A `rows × cols` bump of concentric rectangles about the centre pixel (rows/2, cols/2), unit
/// L2 norm: ring k (Chebyshev distance k from the centre) weighs Σ_{j≥k} 1/(j+1)², so the
/// weight falls off roughly as 1/k, like a Gaussian's tail seen coarsely.
fn rings(rows: usize, cols: usize) -> Vec<f64> {
    let last = rows.max(cols) / 2 + 1;
    let mut tail = vec![0.0; last + 1];
    for j in (0..last).rev() {
        tail[j] = tail[j + 1] + 1.0 / ((j + 1) * (j + 1)) as f64;
    }
    let (cr, cc) = (rows / 2, cols / 2);
    unit(
        (0..rows)
            .flat_map(|r| (0..cols).map(move |c| (r, c)))
            .map(|(r, c)| tail[r.abs_diff(cr).max(c.abs_diff(cc))])
            .collect(),
    )
}

/// AutoAttack's pseudo-Gaussian window of side `s` (`s × s`, row-major, unit L2 norm): a
/// positive [`rings`] bump over the upper ⌊s/2⌋ rows and a negative one of the same norm over
/// the rest, transposed (the halves side by side) with probability ½. Each half peaks at its
/// centre, so a window's change is largest in its middle and fades towards its edges.
fn pseudo_gaussian(s: usize, rng: &mut StdRng) -> Vec<f64> {
    let upper = s / 2;
    let mut v = rings(upper, s);
    v.extend(rings(s - upper, s).into_iter().map(|a| -a));
    let v = unit(v);
    if rng.random_bool(0.5) {
        (0..s * s).map(|k| v[(k % s) * s + k / s]).collect()
    } else {
        v
    }
}

/// `v` (a perturbation of `x0`) rescaled to L2 norm ε, then clipped so that x0 + δ stays in
/// [0, 1]; returns that clipped δ, whose norm is at most ε (zero when `v` is).
fn l2_onto_sphere(v: &[f64], x0: &[f32], eps: f32) -> Vec<f32> {
    let norm = squared(v.iter().copied()).sqrt();
    let scale = if norm > 0.0 { eps as f64 / norm } else { 0.0 };
    v.iter()
        .zip(x0)
        .map(|(&a, &x)| {
            let x = x as f64;
            ((x + a * scale).clamp(0.0, 1.0) - x) as f32
        })
        .collect()
}

/// The L2 start: the image tiled by windows of side max(⌊min(h, w)/5⌋, 1) (a 5 × 5 grid of
/// them, centred, in an MNIST or CIFAR image; single pixels below 10 × 10), each a
/// [`pseudo_gaussian`] with one random sign per channel; the whole scaled to ‖δ‖₂ = ε, then
/// clipped to the box.
fn l2_start(x0: &[f32], d: Dims, eps: f32, rng: &mut StdRng) -> Vec<f32> {
    let s = (d.h.min(d.w) / 5).max(1);
    let (down, across) = (d.h / s, d.w / s);
    let (top, left) = ((d.h - down * s) / 2, (d.w - across * s) / 2);
    let mut v = vec![0.0; d.c * d.h * d.w];
    for ti in 0..down {
        for tj in 0..across {
            let bump = pseudo_gaussian(s, rng);
            for ch in 0..d.c {
                let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                for r in 0..s {
                    for c in 0..s {
                        v[d.at(ch, top + ti * s + r, left + tj * s + c)] = sign * bump[r * s + c];
                    }
                }
            }
        }
    }
    l2_onto_sphere(&v, x0, eps)
}

/// The L2 candidate: two random `side × side` windows W1 and W2 (independent; they may
/// overlap or coincide). Per channel, the mass of `delta` in W1 ∪ W2 plus an even share of the
/// unused budget ε² − ‖δ‖₂² is put into W1, in the direction of W1's old content (unit) plus a
/// fresh ±[`pseudo_gaussian`]; the rest of W2 is emptied. So mass moves from W2 to W1 and W1
/// changes shape, and the norm outside the windows is untouched. The whole is then rescaled to
/// ‖δ‖₂ = ε and clipped to the box.
fn l2_candidate(
    delta: &[f32],
    x0: &[f32],
    d: Dims,
    side: usize,
    eps: f32,
    rng: &mut StdRng,
) -> Vec<f32> {
    let (t1, l1) = (
        rng.random_range(0..=d.h - side),
        rng.random_range(0..=d.w - side),
    );
    let (t2, l2) = (
        rng.random_range(0..=d.h - side),
        rng.random_range(0..=d.w - side),
    );
    let bump = pseudo_gaussian(side, rng);
    let window = |top: usize, left: usize, ch: usize| {
        (top..top + side).flat_map(move |r| (left..left + side).map(move |c| d.at(ch, r, c)))
    };
    let in1 = |k: usize| {
        let (r, c) = ((k / d.w) % d.h, k % d.w);
        (t1..t1 + side).contains(&r) && (l1..l1 + side).contains(&c)
    };
    let mut next: Vec<f64> = delta.iter().map(|&a| a as f64).collect();
    let spare = (eps as f64 * eps as f64 - squared(next.iter().copied())).max(0.0) / d.c as f64;
    for ch in 0..d.c {
        let sign = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
        // W1 in row-major order (as the bump), and the part of W2 outside it.
        let first: Vec<usize> = window(t1, l1, ch).collect();
        let rest: Vec<usize> = window(t2, l2, ch).filter(|&k| !in1(k)).collect();
        let old = unit(first.iter().map(|&k| next[k]).collect());
        let mass = squared(first.iter().chain(&rest).map(|&k| next[k])) + spare;
        let shape = unit(old.iter().zip(&bump).map(|(o, b)| o + sign * b).collect());
        for &k in &rest {
            next[k] = 0.0;
        }
        for (&k, a) in first.iter().zip(shape) {
            next[k] = a * mass.sqrt();
        }
    }
    l2_onto_sphere(&next, x0, eps)
}
