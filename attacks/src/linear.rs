//! A linear classifier f(x) = W·vec(x) + b. Its minimal adversarial perturbations and its
//! LogSumExp gradient are known in closed form, which makes it the yardstick of the tests.

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::Classifier;

/// A linear classifier f(x) = W·vec(x) + b of `[N, C, H, W]` inputs: its minimal adversarial
/// perturbations are known in closed form, which makes it the yardstick of the tests.
#[derive(Module, Debug)]
pub struct LinearClassifier<B: Backend> {
    /// `[K, D]`, D = C·H·W in the batch's memory order.
    pub weight: Param<Tensor<B, 2>>,
    /// `[K]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> LinearClassifier<B> {
    /// From row-major `weight` (`classes × dim`) and `bias` (`classes`).
    pub fn new(weight: Vec<f32>, bias: Vec<f32>, classes: usize, device: &B::Device) -> Self {
        assert_eq!(bias.len(), classes, "one bias per class");
        assert_eq!(weight.len() % classes, 0, "weight is classes × dim");
        let dim = weight.len() / classes;
        Self {
            weight: Param::from_tensor(Tensor::from_data(
                TensorData::new(weight, [classes, dim]),
                device,
            )),
            bias: Param::from_tensor(Tensor::from_data(TensorData::new(bias, [classes]), device)),
        }
    }
}

impl<B: Backend> LinearClassifier<B> {
    /// W·vec(x), without the bias.
    fn apply_weight(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let [n, c, h, w] = x.dims();
        x.reshape([n, c * h * w])
            .matmul(self.weight.val().transpose())
    }
}

impl<B: Backend> Classifier<B> for LinearClassifier<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.apply_weight(x) + self.bias.val().unsqueeze_dim(0)
    }

    /// Linear everywhere: J = W at every point.
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, crate::Linearised<'_, B>)> {
        Some((self.logits(x), Box::new(|v| self.apply_weight(v))))
    }
}
