//! [`FastLinear`], the backend extension for matrix products: a Wide-ResNet's classifier head
//! (`x · W + b`) with its own backward through burn's autodiff, and the plain product the
//! portable convolution weight gradient is made of. Every method defaults to burn's own
//! operation, so the CPU computes exactly what burn computes; the CUDA backend overrides them to
//! keep its products in true f32, out of burn's TF32 tensor-core kernels.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

/// A backend with a matrix product and a linear layer of its own choosing. The defaults are
/// burn's `float_matmul` and `linear` with its backward functions.
pub trait FastLinear: Backend {
    /// `lhs · rhs` for `[m, k]` and `[k, n]` matrices, or batched over leading axes
    /// (`[g, m, k] · [g, k, n]`).
    fn fast_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(lhs, rhs)
    }

    /// `x · weight + bias` for `x` `[batch, d_in]`, `weight` `[d_in, d_out]`, `bias` `[d_out]`.
    fn fast_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::linear(x, weight, bias)
    }

    /// The gradient of [`fast_linear`](Self::fast_linear) with respect to `x`:
    /// `output_grad · weightᵀ`.
    fn fast_linear_x_backward(
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::linear_x_backward(weight, output_grad)
    }

    /// The gradient of [`fast_linear`](Self::fast_linear) with respect to `weight`:
    /// `xᵀ · output_grad`.
    fn fast_linear_weight_backward(
        x: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::linear_weight_backward(x, output_grad)
    }
}

impl FastLinear for Flex {}

/// `x · weight + bias` through [`FastLinear`]: what a Wide-ResNet's head computes.
pub fn linear<B: FastLinear>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::fast_linear(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        bias.map(|b| b.into_primitive().tensor()),
    )))
}

/// Backward of a linear layer: the input and the weight are kept (a head's are small).
#[derive(Debug)]
struct LinearBackward;

type LinearState<B> = (FloatTensor<B>, FloatTensor<B>);

fn linear_backward<B: FastLinear, const N: usize>(
    ops: Ops<LinearState<B>, N>,
    grads: &mut Gradients,
) {
    let grad = grads.consume::<B>(&ops.node);
    let (x, weight) = ops.state;
    if let Some(node) = &ops.parents[0] {
        grads.register::<B>(node.id, B::fast_linear_x_backward(weight, grad.clone()));
    }
    if let Some(node) = &ops.parents[1] {
        grads.register::<B>(node.id, B::fast_linear_weight_backward(x, grad.clone()));
    }
    if let Some(Some(node)) = ops.parents.get(2) {
        grads.register::<B>(node.id, B::linear_bias_backward(grad));
    }
}

impl<B: FastLinear> Backward<B, 3> for LinearBackward {
    type State = LinearState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        linear_backward::<B, 3>(ops, grads);
    }
}

impl<B: FastLinear> Backward<B, 2> for LinearBackward {
    type State = LinearState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        linear_backward::<B, 2>(ops, grads);
    }
}

/// Backward of a plain matrix product.
#[derive(Debug)]
struct MatmulBackward;

impl<B: FastLinear> Backward<B, 2> for MatmulBackward {
    type State = LinearState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let (lhs, rhs) = ops.state;
        // The last two axes are the matrices' (leading ones batch them).
        let transposed = |t: FloatTensor<B>| {
            let d = t.shape().num_dims();
            B::float_swap_dims(t, d - 2, d - 1)
        };
        if let Some(node) = &ops.parents[0] {
            grads.register::<B>(node.id, B::fast_matmul(grad.clone(), transposed(rhs)));
        }
        if let Some(node) = &ops.parents[1] {
            grads.register::<B>(node.id, B::fast_matmul(transposed(lhs), grad));
        }
    }
}

impl<B: FastLinear, C: CheckpointStrategy> FastLinear for Autodiff<B, C> {
    fn fast_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = B::fast_matmul(lhs.primitive.clone(), rhs.primitive.clone());
        match MatmulBackward
            .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((lhs.primitive, rhs.primitive), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn fast_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let out = B::fast_linear(
            x.primitive.clone(),
            weight.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
        );
        let state = (x.primitive.clone(), weight.primitive.clone());
        match bias {
            Some(b) => {
                let nodes = [x.node.clone(), weight.node.clone(), b.node.clone()];
                match LinearBackward
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                }
            }
            None => {
                let nodes = [x.node.clone(), weight.node.clone()];
                match LinearBackward
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                }
            }
        }
    }
}
