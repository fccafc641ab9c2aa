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
use crate::pgd::Rows;

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
        let target: Vec<i64> = targets.iter().map(|&v| v as i64).collect();
        let labels = |rows: &[usize]| {
            let t: Vec<i64> = rows.iter().map(|&i| target[i]).collect();
            Tensor::<Inner<B>, 1, Int>::from_data(TensorData::new(t, [rows.len()]), device)
        };
        let confidence = |logits: Tensor<Inner<B>, 2>, t: Tensor<Inner<B>, 1, Int>| -> Vec<f32> {
            let m = t.dims()[0];
            softmax(logits, 1)
                .gather(1, t.reshape([m, 1]))
                .reshape([m])
                .into_data()
                .to_vec()
                .expect("f32")
        };
        let mut reached = vec![false; n];
        let mut iterations = vec![0usize; n];
        // Only the searches still below the threshold are computed: a finished search leaves
        // the batch, so that a few slow searches do not cost a whole batch each iteration.
        let mut active: Vec<usize> = (0..n).collect();
        for _ in 0..self.max_iters {
            let rows = Rows::<Inner<B>>::new(&active, n, device);
            let t = labels(&active);
            let tracked = Tensor::<B, 1, Int>::from_inner(t.clone()).reshape([active.len(), 1]);
            let objective = |logits: Tensor<B, 2>| {
                let m = logits.dims()[0];
                log_softmax(logits, 1)
                    .gather(1, tracked.clone())
                    .reshape([m])
            };
            let (g, logits) = model.loss_gradient(rows.take(&x), &objective, &mut rng);
            let conf = confidence(logits, t);
            let mut still = vec![false; n];
            for (&i, &p) in active.iter().zip(&conf) {
                reached[i] = p >= self.threshold;
                still[i] = !reached[i];
            }
            active.retain(|&i| still[i]);
            if active.is_empty() {
                break;
            }
            // Rows that just reached the threshold keep their point: their gradient is masked.
            let m: Vec<f32> = still.iter().map(|&a| f32::from(u8::from(a))).collect();
            let m = Tensor::<Inner<B>, 4>::from_data(TensorData::new(m, [n, 1, 1, 1]), device);
            velocity = velocity * self.momentum + rows.put(g) * m.clone();
            x = (x + velocity.clone() * (m * self.lr)).clamp(0.0, 1.0);
            for &i in &active {
                iterations[i] += 1;
            }
        }
        let final_conf = confidence(
            model.recheck_logits(x.clone(), &mut rng),
            labels(&(0..n).collect::<Vec<_>>()),
        );
        NonsenseOutcome {
            targets: targets.to_vec(),
            confidence: final_conf,
            iterations,
            reached,
            images: x.into_data().to_vec().expect("f32"),
        }
    }
}
