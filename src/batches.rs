//! Moving images and labels from an [`ImageSet`] onto a device, in batches, and running a
//! model over a whole set batch by batch.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Device, Int, Tensor, TensorData};
use jem_attacks::Model;
use jem_datasets::ImageSet;
use rand::rngs::StdRng;

/// The images at `indices` as an N×C×H×W tensor.
pub fn images<B: Backend>(set: &ImageSet, indices: &[usize], device: &B::Device) -> Tensor<B, 4> {
    let mut data = Vec::with_capacity(indices.len() * set.image_len());
    for &i in indices {
        data.extend_from_slice(set.image(i));
    }
    Tensor::from_data(
        TensorData::new(data, [indices.len(), set.channels, set.height, set.width]),
        device,
    )
}

/// The labels at `indices` as an integer tensor.
pub fn labels<B: Backend>(
    set: &ImageSet,
    indices: &[usize],
    device: &B::Device,
) -> Tensor<B, 1, Int> {
    let data: Vec<i64> = indices.iter().map(|&i| set.labels[i] as i64).collect();
    Tensor::from_data(TensorData::new(data, [indices.len()]), device)
}

/// A host-side copy of a float tensor.
pub fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("float tensor data converts to f32")
}

/// The logits `model` gives for every image of `set`, `[len × classes]`, computed
/// `batch_size` images at a time; a stochastic model (JEM-K) draws its noise from `rng`, batch
/// after batch, so that the same seed and batch size give the same numbers.
pub fn model_logits<B: AutodiffBackend, M: Model<B>>(
    model: &M,
    set: &ImageSet,
    batch_size: usize,
    rng: &mut StdRng,
    device: &Device<B::InnerBackend>,
) -> Tensor<B::InnerBackend, 2> {
    let all: Vec<usize> = (0..set.len()).collect();
    let parts = all
        .chunks(batch_size.max(1))
        .map(|chunk| model.logits(images::<B::InnerBackend>(set, chunk, device), rng))
        .collect();
    Tensor::cat(parts, 0)
}
