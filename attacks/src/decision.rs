//! The oracle of decision-based attacks: is this input misclassified? A stochastic model is
//! asked several times and an input counts as adversarial only when every answer is wrong
//! (foolbox judges from a single pass, which a random defence can pass by luck). Queries are
//! counted per example.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;

use crate::model::Model;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

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
