//! Per-channel factors and offsets of an `N×C×H×W` batch (the SGLD step's pixel scale, an input
//! normalisation's mean and 1 / std, BatchNorm's running statistics), applied with the batch
//! viewed as `[N·C, H·W]` and one value per row.
//!
//! Why not a `[1, C, 1, 1]` tensor and burn's broadcasting: burn's CPU backend broadcasts a
//! tensor whose leading dimension is 1 through its generic strided iterator, 60–150× slower
//! than a contiguous pass (an `80×1×28×28` product: 0.8–1.5 ms against 10 µs, one thread;
//! docs/performance.md), while a per-row column (`[rows, 1]`) takes its fast path. Each SGLD
//! step and each forward pass made such products. The results are the same bits: each element
//! meets the same value in the same operation.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// `x · factor[c]` for every element of channel `c`; `factor` has one value per channel.
/// Differentiable in both.
pub fn scale_channels<B: Backend>(x: Tensor<B, 4>, factor: Tensor<B, 1>) -> Tensor<B, 4> {
    per_row(x, factor, |rows, column| rows * column)
}

/// `x + offset[c]` for every element of channel `c`; `offset` has one value per channel.
/// Differentiable in both.
pub fn shift_channels<B: Backend>(x: Tensor<B, 4>, offset: Tensor<B, 1>) -> Tensor<B, 4> {
    per_row(x, offset, |rows, column| rows + column)
}

/// `op` on `x` as `[N·C, H·W]` rows and `values` repeated into a `[N·C, 1]` column.
fn per_row<B: Backend>(
    x: Tensor<B, 4>,
    values: Tensor<B, 1>,
    op: impl FnOnce(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>,
) -> Tensor<B, 4> {
    let [n, c, h, w] = x.dims();
    let [k] = values.dims();
    assert_eq!(
        k, c,
        "one value per channel: {k} values for {c} channels of an {n}×{c}×{h}×{w} batch"
    );
    let column = values.reshape([1, c]).repeat_dim(0, n).reshape([n * c, 1]);
    op(x.reshape([n * c, h * w]), column).reshape([n, c, h, w])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Distribution, TensorData};

    type B = Autodiff<Flex>;

    fn values<const D: usize>(t: Tensor<Flex, D>) -> Vec<f32> {
        t.into_data().to_vec().unwrap()
    }

    /// Against burn's own broadcast of a `[1, C, 1, 1]` tensor, bit for bit, values and both
    /// gradients, for one and three channels.
    #[test]
    fn equal_burns_broadcast_bit_for_bit() {
        let device = Default::default();
        for c in [1, 3] {
            let x =
                Tensor::<B, 4>::random([4, c, 5, 6], Distribution::Default, &device).require_grad();
            let v =
                Tensor::<B, 1>::random([c], Distribution::Normal(0.0, 2.0), &device).require_grad();
            let w = Tensor::<B, 4>::random([4, c, 5, 6], Distribution::Default, &device);
            let broadcast = || v.clone().reshape([1, c, 1, 1]);
            for (ours, burns) in [
                (
                    scale_channels(x.clone(), v.clone()),
                    x.clone() * broadcast(),
                ),
                (
                    shift_channels(x.clone(), v.clone()),
                    x.clone() + broadcast(),
                ),
            ] {
                assert_eq!(values(ours.clone().inner()), values(burns.clone().inner()));
                let g_ours = (ours * w.clone()).sum().backward();
                let g_burns = (burns * w.clone()).sum().backward();
                assert_eq!(
                    values(x.grad(&g_ours).unwrap()),
                    values(x.grad(&g_burns).unwrap())
                );
                let (a, b) = (v.grad(&g_ours).unwrap(), v.grad(&g_burns).unwrap());
                let tolerance = 1e-5 * values(b.clone().abs().max()).first().unwrap().max(1.0);
                for (a, b) in values(a).iter().zip(values(b)) {
                    // Sums over the batch: the order of additions may differ.
                    assert!((a - b).abs() <= tolerance, "{a} against {b}");
                }
            }
        }
        let x =
            Tensor::<Flex, 4>::from_data(TensorData::new(vec![1.0f32; 8], [2, 2, 1, 2]), &device);
        let v = Tensor::<Flex, 1>::from_data(TensorData::new(vec![2.0f32, -1.0], [2]), &device);
        assert_eq!(
            values(scale_channels(x, v)),
            [2.0, 2.0, -1.0, -1.0, 2.0, 2.0, -1.0, -1.0]
        );
    }
}
