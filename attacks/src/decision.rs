//! The oracle of decision-based attacks: is this input misclassified? A stochastic model is
//! asked several times and an input counts as adversarial only when every answer is wrong
//! (foolbox judges from a single pass, which a random defence can pass by luck). Queries are
//! counted per example.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::model::Model;
use crate::outcome::{AttackOutcome, ExampleOutcome};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// The question decision-based attacks ask a model: is this input misclassified? A stochastic
/// model is asked `repeats` times and must be wrong every time. Counts forward passes per example.
pub struct Oracle<'a, M> {
    model: &'a M,
    labels: Vec<i64>,
    /// Forward passes per question (1 for a deterministic model).
    pub repeats: usize,
    /// Forward passes spent on each example.
    pub queries: Vec<usize>,
    shape: [usize; 3],
}

impl<'a, M> Oracle<'a, M> {
    /// An oracle for examples with true `labels`, images of `shape` (C, H, W); `repeats` applies
    /// only to a stochastic model (a deterministic one is asked once).
    pub fn new<B: AutodiffBackend>(
        model: &'a M,
        labels: Vec<i64>,
        shape: [usize; 3],
        repeats: usize,
    ) -> Self
    where
        M: Model<B>,
    {
        let repeats = if model.is_stochastic() {
            repeats.max(1)
        } else {
            1
        };
        let n = labels.len();
        Self {
            model,
            labels,
            repeats,
            queries: vec![0; n],
            shape,
        }
    }

    /// For image rows `images` (row j belongs to example `rows[j]`): misclassified in every pass?
    pub fn adversarial<B: AutodiffBackend>(
        &mut self,
        images: &[f32],
        rows: &[usize],
        device: &burn::tensor::Device<Inner<B>>,
        rng: &mut StdRng,
    ) -> Vec<bool>
    where
        M: Model<B>,
    {
        let [c, h, w] = self.shape;
        let m = rows.len();
        if m == 0 {
            return Vec::new();
        }
        let x = Tensor::<Inner<B>, 4>::from_data(
            TensorData::new(images.to_vec(), [m, c, h, w]),
            device,
        );
        let mut wrong = vec![true; m];
        for _ in 0..self.repeats {
            let pred: Vec<i64> = self
                .model
                .logits(x.clone(), rng)
                .argmax(1)
                .reshape([m])
                .into_data()
                .convert::<i64>()
                .to_vec()
                .expect("argmax");
            for (j, &r) in rows.iter().enumerate() {
                wrong[j] &= pred[j] != self.labels[r];
                self.queries[r] += 1;
            }
        }
        wrong
    }
}

/// What every decision-based attack starts from: the oracle, the inputs on the host, which of
/// them the model already gets wrong (those are not attacked), and the seeded generator.
pub(crate) struct Start<'a, M, B: AutodiffBackend> {
    pub oracle: Oracle<'a, M>,
    pub x: Tensor<Inner<B>, 4>,
    pub original: Vec<f32>,
    pub clean_wrong: Vec<bool>,
    pub rng: StdRng,
    pub device: burn::tensor::Device<Inner<B>>,
    /// Pixels per image.
    pub d: usize,
}

impl<'a, M: Model<B>, B: AutodiffBackend> Start<'a, M, B> {
    pub fn new(
        model: &'a M,
        x: Tensor<Inner<B>, 4>,
        y: Tensor<Inner<B>, 1, Int>,
        repeats: usize,
        seed: u64,
    ) -> Self {
        let [n, c, h, w] = x.dims();
        let device = x.device();
        let mut rng = StdRng::seed_from_u64(seed);
        let labels: Vec<i64> = y.into_data().convert::<i64>().to_vec().expect("labels");
        let original: Vec<f32> = x.clone().into_data().to_vec().expect("f32");
        let mut oracle = Oracle::new::<B>(model, labels, [c, h, w], repeats);
        let all: Vec<usize> = (0..n).collect();
        let clean_wrong = oracle.adversarial::<B>(&original, &all, &device, &mut rng);
        Self {
            oracle,
            x,
            original,
            clean_wrong,
            rng,
            device,
            d: c * h * w,
        }
    }

    /// Confirms the returned images (`found`: the attack believes them adversarial), counts the
    /// queries and measures the distances.
    pub fn finish(mut self, returned: Vec<f32>, found: &[bool]) -> AttackOutcome {
        let dims = self.x.dims();
        let all: Vec<usize> = (0..dims[0]).collect();
        let confirmed = self
            .oracle
            .adversarial::<B>(&returned, &all, &self.device, &mut self.rng);
        let examples = (0..dims[0])
            .map(|i| ExampleOutcome {
                clean_correct: !self.clean_wrong[i],
                adversarial: !self.clean_wrong[i] && found[i] && confirmed[i],
                l0: 0.0,
                l2: 0.0,
                linf: 0.0,
                gradient_evals: 0,
                forward_evals: self.oracle.queries[i],
            })
            .collect();
        let returned =
            Tensor::<Inner<B>, 4>::from_data(TensorData::new(returned, dims), &self.device);
        AttackOutcome::measure(self.x, returned, examples)
    }
}
