//! Nonsense-input search ("distal adversarials", Schott et al. 2019; JEM Fig. 6): from uniform
//! noise, climb log p(y = c | x) for a target class c by gradient ascent with momentum (the ABS
//! code: SGD lr 1, momentum 0.95, clamped to [0, 1], up to 10 000 iterations), stopping each
//! search once its confidence reaches the threshold. A robust model should not be driven to
//! high confidence on unstructured inputs.

use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::noise;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Settings of the nonsense-input search (Schott et al. 2019); [`Default`] gives the ABS code's
/// (10 000 iterations, lr 1, momentum 0.95) and a confidence threshold of 0.9.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NonsenseConfig {
    /// Gradient steps per search at most.
    pub max_iters: usize,
    /// Learning rate: x ← clamp(x + lr · v, 0, 1).
    pub lr: f32,
    /// Momentum μ: v ← μ v + ∇ₓ log p(y = c | x).
    pub momentum: f32,
    /// Stop a search once p(y = c | x) reaches this.
    pub threshold: f32,
    /// Seed of the uniform-noise starts and of the model's noise.
    pub seed: u64,
}

impl Default for NonsenseConfig {
    fn default() -> Self {
        Self {
            max_iters: 10_000,
            lr: 1.0,
            momentum: 0.95,
            threshold: 0.9,
            seed: 0,
        }
    }
}

/// One search per target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NonsenseOutcome {
    /// The target class c of each search, as given.
    pub targets: Vec<usize>,
    /// p(y = target | x) of the final input (re-checked; many chains for a stochastic model).
    pub confidence: Vec<f32>,
    /// Gradient steps taken.
    pub iterations: Vec<usize>,
    /// The threshold was reached during the search.
    pub reached: Vec<bool>,
    /// Final inputs `[N, C, H, W]`, row-major, in [0, 1].
    pub images: Vec<f32>,
}

impl NonsenseConfig {
    /// Runs one search per entry of `targets`, as one batch of images of `shape` (C, H, W) started
    /// from uniform noise in [0, 1] on `device`.
    pub fn run<B: AutodiffBackend, M: Model<B>>(
        &self,
        model: &M,
        shape: [usize; 3],
        targets: &[usize],
        device: &burn::tensor::Device<Inner<B>>,
    ) -> NonsenseOutcome {
        let n = targets.len();
        let [c, h, w] = shape;
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut x: Tensor<Inner<B>, 4> = noise::uniform([n, c, h, w], 0.0, 1.0, &mut rng, device);
        let mut velocity = Tensor::<Inner<B>, 4>::zeros([n, c, h, w], device);
        let t: Vec<i64> = targets.iter().map(|&v| v as i64).collect();
        let target = Tensor::<Inner<B>, 1, Int>::from_data(TensorData::new(t, [n]), device);
        let tracked = Tensor::<B, 1, Int>::from_inner(target.clone()).reshape([n, 1]);
        let objective = |logits: Tensor<B, 2>| {
            log_softmax(logits, 1)
                .gather(1, tracked.clone())
                .reshape([n])
        };
        let confidence = |logits: Tensor<Inner<B>, 2>| -> Vec<f32> {
            softmax(logits, 1)
                .gather(1, target.clone().reshape([n, 1]))
                .reshape([n])
                .into_data()
                .to_vec()
                .expect("f32")
        };
        let mut active = vec![true; n];
        let mut reached = vec![false; n];
        let mut iterations = vec![0usize; n];
        for _ in 0..self.max_iters {
            let (g, logits) = model.loss_gradient(x.clone(), &objective, &mut rng);
            let conf = confidence(logits);
            for i in 0..n {
                if active[i] && conf[i] >= self.threshold {
                    active[i] = false;
                    reached[i] = true;
                }
            }
            if !active.contains(&true) {
                break;
            }
            let m: Vec<f32> = active.iter().map(|&a| f32::from(u8::from(a))).collect();
            let m = Tensor::<Inner<B>, 4>::from_data(TensorData::new(m, [n, 1, 1, 1]), device);
            velocity = velocity * self.momentum + g * m.clone();
            x = (x + velocity.clone() * (m * self.lr)).clamp(0.0, 1.0);
            for i in 0..n {
                iterations[i] += usize::from(active[i]);
            }
        }
        let final_conf = confidence(model.recheck_logits(x.clone(), &mut rng));
        NonsenseOutcome {
            targets: targets.to_vec(),
            confidence: final_conf,
            iterations,
            reached,
            images: x.into_data().to_vec().expect("f32"),
        }
    }
}
