//! Moving images and labels from an [`ImageSet`] onto a device, in batches.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use jem_datasets::ImageSet;

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
