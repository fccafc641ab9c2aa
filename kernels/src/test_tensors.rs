//! Tensors for the unit tests: values from a formula rather than the backend's random generator
//! (which tests running side by side share), and a tensor's bits for exact comparisons.

use burn::backend::flex::FlexTensor;
use burn::tensor::TensorData;

/// A tensor of `shape` with values in [centre − scale, centre + scale), the same for one seed.
pub(crate) fn formula(shape: &[usize], seed: usize, centre: f32, scale: f32) -> FlexTensor {
    let n = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|i| {
            let unit = ((i * 7_919 + seed * 104_729) % 1_000) as f32 / 500.0 - 1.0;
            centre + scale * unit
        })
        .collect();
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// The bits of every element of an f32 tensor, in memory order once made contiguous.
pub(crate) fn bits(t: FlexTensor) -> Vec<u32> {
    let t = t.to_contiguous();
    let values = t.as_slice::<f32>().expect("an f32 tensor");
    values.iter().map(|v| v.to_bits()).collect()
}
