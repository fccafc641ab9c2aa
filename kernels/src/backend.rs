//! [`FastConv`], the backend extension: burn's CPU backend runs this crate's kernels, burn's
//! autodiff backend gets a backward node that calls them (the CUDA backend's implementation is
//! in `cuda.rs`: a forward convolution with the portable gradients, [`crate::portable`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{ConvOptions, FloatTensor, ModuleOps};
use burn::tensor::{DType, TensorData, TensorMetadata};

use crate::activation::composed_backward;
use crate::conv::{self, ConvGeometry};
use crate::portable;
use crate::process_choice::ProcessChoice;
use crate::FastLinear;

/// A backend with a 2-D convolution for Wide-ResNets, optionally with a LeakyReLU fused in
/// front of it (`input_slope`: the convolution of LeakyReLU(`x`), a pre-activation block's
/// order). Every method defaults to burn's own operations, so a backend without kernels of its
/// own implements it with an empty block.
pub trait FastConv: Backend {
    /// The convolution of `x` (`[batch, in, h, w]`), or of LeakyReLU(`x`) with slope
    /// `input_slope`, with `weight` (`[out, in, kh, kw]`), plus `bias` (`[out]`).
    fn fast_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        composed_conv2d::<Self>(x, weight, bias, options, input_slope)
    }

    /// [`fast_conv2d`](Self::fast_conv2d) plus `residual`, shaped like its output: a residual
    /// block's closing addition, done as the sums are written where the backend can (on a GPU,
    /// one launch fewer per block). Its gradient with respect to `residual` is the output's.
    /// Defaults to the convolution followed by burn's addition.
    fn fast_conv2d_add(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
        residual: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = Self::fast_conv2d(x, weight, bias, options, input_slope);
        Self::float_add(out, residual)
    }

    /// The gradient of [`fast_conv2d`](Self::fast_conv2d) with respect to `x` (through the
    /// fused activation, if any).
    fn fast_conv2d_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        composed_x_backward::<Self>(x, weight, output_grad, options, input_slope)
    }

    /// The gradient of [`fast_conv2d`](Self::fast_conv2d) with respect to `weight`.
    fn fast_conv2d_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        composed_weight_backward::<Self>(x, weight, output_grad, options, input_slope)
    }

    /// The gradient of [`fast_conv2d`](Self::fast_conv2d) with respect to `bias`.
    fn fast_conv2d_bias_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        output_grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::conv2d_bias_backward(x, bias, output_grad)
    }
}

/// `x`, or burn's LeakyReLU of it.
pub(crate) fn activated<B: Backend>(x: FloatTensor<B>, slope: Option<f64>) -> FloatTensor<B> {
    match slope {
        Some(slope) => B::leaky_relu(x, slope.into()),
        None => x,
    }
}

/// The convolution from burn's operations: its LeakyReLU, then its convolution.
fn composed_conv2d<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    options: ConvOptions<2>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    B::conv2d(activated::<B>(x, slope), weight, bias, options)
}

/// The weight gradient from burn's operations, on the activated input.
fn composed_weight_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    options: ConvOptions<2>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    B::conv2d_weight_backward(activated::<B>(x, slope), weight, output_grad, options)
}

/// The input gradient from burn's operations: the convolution's, then the activation's.
fn composed_x_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    options: ConvOptions<2>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    let input = activated::<B>(x.clone(), slope);
    let grad = B::conv2d_x_backward(input, weight, output_grad, options);
    through_activation::<B>(x, grad, slope)
}

/// `grad` (the gradient at the activated input) carried back through the fused activation.
fn through_activation<B: Backend>(
    x: FloatTensor<B>,
    grad: FloatTensor<B>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    match slope {
        Some(slope) => composed_backward::<B>(x, grad, slope),
        None => grad,
    }
}

/// The input gradient from a forward convolution ([`crate::conv2d_input_grad_from_forward`]),
/// then the activation's; burn's own where the construction does not apply (groups, dilation).
pub(crate) fn portable_x_backward<B: FastConv + FastLinear>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    options: ConvOptions<2>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    if !portable::portable_gradients_apply(&options) {
        return composed_x_backward::<B>(x, weight, output_grad, options, slope);
    }
    let shape = x.shape();
    let size = [shape[2], shape[3]];
    let grad = portable::conv2d_input_grad_from_forward::<B>(weight, output_grad, size, &options);
    through_activation::<B>(x, grad, slope)
}

/// The weight gradient from matrix products ([`crate::conv2d_weight_grad_from_matmul`]) on
/// the activated input; burn's own where the construction does not apply.
pub(crate) fn portable_weight_backward<B: FastConv + FastLinear>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    output_grad: FloatTensor<B>,
    options: ConvOptions<2>,
    slope: Option<f64>,
) -> FloatTensor<B> {
    if !portable::portable_gradients_apply(&options) {
        return composed_weight_backward::<B>(x, weight, output_grad, options, slope);
    }
    let shape = weight.shape();
    let kernel = [shape[2], shape[3]];
    let input = activated::<B>(x, slope);
    portable::conv2d_weight_grad_from_matmul::<B>(input, output_grad, kernel, &options)
}

/// Whose operations burn's CPU backend runs for [`FastConv`] and
/// [`FastActivation`](crate::FastActivation): this crate's kernels (the default), burn's own,
/// or burn's forward operations with the portable gradients the CUDA backend runs — e.g. to
/// measure one against another in the same process, or to test on the CPU the construction a
/// GPU relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implementation {
    /// This crate's kernels.
    Own,
    /// burn's `conv2d`, `leaky_relu` and their backward functions.
    Burn,
    /// burn's `conv2d` and `leaky_relu`, with the convolution gradients composed from a forward
    /// convolution and a matrix product ([`crate::conv2d_input_grad_from_forward`],
    /// [`crate::conv2d_weight_grad_from_matmul`]): what the CUDA backend computes.
    Portable,
}

static CHOICE: ProcessChoice<Implementation> = ProcessChoice::new(&[
    Implementation::Own,
    Implementation::Burn,
    Implementation::Portable,
]);

/// Chooses, for the whole process, whose operations the CPU backend runs.
pub fn set_implementation(choice: Implementation) {
    CHOICE.set(choice);
}

/// Whose operations the CPU backend runs now (`Own` until set).
pub fn implementation() -> Implementation {
    CHOICE.get().unwrap_or(Implementation::Own)
}

/// The geometry of a convolution the kernels handle: `f32`, one group, no dilation, and the
/// own kernels chosen. `None` sends the call to burn's convolution.
fn geometry(x: &FlexTensor, weight: &FlexTensor, options: &ConvOptions<2>) -> Option<ConvGeometry> {
    let handled = implementation() == Implementation::Own
        && x.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && options.groups == 1
        && options.dilation == [1, 1];
    let (xs, ws) = (x.shape(), weight.shape());
    if !handled || xs.num_dims() != 4 || ws.num_dims() != 4 || xs[1] != ws[1] {
        return None;
    }
    let g = ConvGeometry {
        batch: xs[0],
        in_channels: xs[1],
        height: xs[2],
        width: xs[3],
        out_channels: ws[0],
        kernel: [ws[2], ws[3]],
        stride: options.stride,
        padding: options.padding,
    };
    g.is_valid().then_some(g)
}

/// The tensor's elements in row-major order (copied only if its layout is not already so).
fn values(tensor: &FlexTensor) -> FlexTensor {
    tensor.to_contiguous()
}

fn slice(tensor: &FlexTensor) -> &[f32] {
    tensor
        .as_slice::<f32>()
        .expect("a contiguous f32 tensor, as checked by geometry()")
}

fn tensor(values: Vec<f32>, shape: [usize; 4]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

impl FastConv for Flex {
    fn fast_conv2d(
        x: FlexTensor,
        weight: FlexTensor,
        bias: Option<FlexTensor>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FlexTensor {
        let bias_ok = bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
        let Some(g) = geometry(&x, &weight, &options).filter(|_| bias_ok) else {
            return composed_conv2d::<Flex>(x, weight, bias, options, input_slope);
        };
        let (x, weight, bias) = (values(&x), values(&weight), bias.as_ref().map(values));
        let slope = input_slope.map(|s| s as f32);
        let bias = bias.as_ref().map(slice);
        let out = conv::conv2d(slice(&x), slice(&weight), bias, &g, slope);
        tensor(
            out,
            [g.batch, g.out_channels, g.out_height(), g.out_width()],
        )
    }

    fn fast_conv2d_x_backward(
        x: FlexTensor,
        weight: FlexTensor,
        output_grad: FlexTensor,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FlexTensor {
        if implementation() == Implementation::Portable {
            return portable_x_backward::<Flex>(x, weight, output_grad, options, input_slope);
        }
        let Some(g) = geometry(&x, &weight, &options).filter(|_| output_grad.dtype() == DType::F32)
        else {
            return composed_x_backward::<Flex>(x, weight, output_grad, options, input_slope);
        };
        let (x, weight, grad) = (values(&x), values(&weight), values(&output_grad));
        let fused = input_slope.map(|s| (slice(&x), s as f32));
        let dx = conv::conv2d_input_grad(slice(&grad), slice(&weight), &g, fused);
        tensor(dx, [g.batch, g.in_channels, g.height, g.width])
    }

    fn fast_conv2d_weight_backward(
        x: FlexTensor,
        weight: FlexTensor,
        output_grad: FlexTensor,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FlexTensor {
        if implementation() == Implementation::Portable {
            return portable_weight_backward::<Flex>(x, weight, output_grad, options, input_slope);
        }
        let Some(g) = geometry(&x, &weight, &options).filter(|_| output_grad.dtype() == DType::F32)
        else {
            return composed_weight_backward::<Flex>(x, weight, output_grad, options, input_slope);
        };
        let (x, grad) = (values(&x), values(&output_grad));
        let slope = input_slope.map(|s| s as f32);
        let dw = conv::conv2d_weight_grad(slice(&x), slice(&grad), &g, slope);
        tensor(
            dw,
            [g.out_channels, g.in_channels, g.kernel[0], g.kernel[1]],
        )
    }

    fn fast_conv2d_bias_backward(
        x: FlexTensor,
        bias: FlexTensor,
        output_grad: FlexTensor,
    ) -> FlexTensor {
        let shape = output_grad.shape();
        let handled = implementation() == Implementation::Own
            && output_grad.dtype() == DType::F32
            && shape.num_dims() == 4;
        if !handled {
            return Flex::conv2d_bias_backward(x, bias, output_grad);
        }
        let g = ConvGeometry {
            batch: shape[0],
            in_channels: 1,
            height: shape[2],
            width: shape[3],
            out_channels: shape[1],
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
        };
        let grad = values(&output_grad);
        let db = conv::conv2d_bias_grad(slice(&grad), &g);
        FlexTensor::from_data(TensorData::new(db, [g.out_channels]))
    }
}

/// Backward of a convolution with a bias: gradients for x, the weight and the bias.
#[derive(Debug)]
struct ConvWithBias;

/// Backward of a convolution without a bias.
#[derive(Debug)]
struct ConvNoBias;

/// Backward of a convolution with a bias and a residual added ([`FastConv::fast_conv2d_add`]):
/// the convolution's gradients, and the output's for the residual (the last parent).
#[derive(Debug)]
struct ConvWithBiasAdd;

/// Backward of a convolution without a bias, with a residual added.
#[derive(Debug)]
struct ConvNoBiasAdd;

/// What the backward pass needs: the input (before the fused activation: the activated maps
/// are never kept), the weight, the bias (for its shape), the options and the fused slope.
type ConvState<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    Option<FloatTensor<B>>,
    ConvOptions<2>,
    Option<f64>,
);

/// Registers the gradients of x and the weight (and the bias, when it has a node), `parents`
/// being their nodes in that order; with `residual`, the last parent is a residual added to
/// the output, whose gradient is the output's.
fn conv_backward<B: FastConv, const N: usize>(
    ops: Ops<ConvState<B>, N>,
    grads: &mut Gradients,
    residual: bool,
) {
    let grad = grads.consume::<B>(&ops.node);
    let (x, weight, bias, options, slope) = ops.state;
    let mut parents: Vec<_> = ops
        .parents
        .iter()
        .map(|p| p.as_ref().map(|n| n.id))
        .collect();
    if residual {
        if let Some(Some(id)) = parents.pop() {
            grads.register::<B>(id, grad.clone());
        }
    }
    if let Some(id) = parents[0] {
        let (w, g) = (weight.clone(), grad.clone());
        let dx = B::fast_conv2d_x_backward(x.clone(), w, g, options.clone(), slope);
        grads.register::<B>(id, dx);
    }
    if let Some(id) = parents[1] {
        let dw = B::fast_conv2d_weight_backward(x.clone(), weight, grad.clone(), options, slope);
        grads.register::<B>(id, dw);
    }
    if let (Some(Some(id)), Some(bias)) = (parents.get(2), bias) {
        grads.register::<B>(*id, B::fast_conv2d_bias_backward(x, bias, grad));
    }
}

impl<B: FastConv> Backward<B, 3> for ConvWithBias {
    type State = ConvState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        conv_backward::<B, 3>(ops, grads, false);
    }
}

impl<B: FastConv> Backward<B, 2> for ConvNoBias {
    type State = ConvState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        conv_backward::<B, 2>(ops, grads, false);
    }
}

impl<B: FastConv> Backward<B, 4> for ConvWithBiasAdd {
    type State = ConvState<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        conv_backward::<B, 4>(ops, grads, true);
    }
}

impl<B: FastConv> Backward<B, 3> for ConvNoBiasAdd {
    type State = ConvState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        conv_backward::<B, 3>(ops, grads, true);
    }
}

impl<B: FastConv, C: CheckpointStrategy> FastConv for Autodiff<B, C> {
    fn fast_conv2d(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
    ) -> FloatTensor<Self> {
        tracked_conv2d::<B, C>(x, weight, bias, options, input_slope, None)
    }

    fn fast_conv2d_add(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        options: ConvOptions<2>,
        input_slope: Option<f64>,
        residual: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        tracked_conv2d::<B, C>(x, weight, bias, options, input_slope, Some(residual))
    }
}

/// The convolution (plus `residual`, if any) on the inner backend, recorded with the backward
/// node for the parents it has.
fn tracked_conv2d<B: FastConv, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    options: ConvOptions<2>,
    input_slope: Option<f64>,
    residual: Option<FloatTensor<Autodiff<B, C>>>,
) -> FloatTensor<Autodiff<B, C>> {
    let state = (
        x.primitive.clone(),
        weight.primitive.clone(),
        bias.as_ref().map(|b| b.primitive.clone()),
        options.clone(),
        input_slope,
    );
    let out = {
        let (x, w) = (x.primitive.clone(), weight.primitive.clone());
        let b = bias.as_ref().map(|b| b.primitive.clone());
        match &residual {
            Some(r) => B::fast_conv2d_add(x, w, b, options, input_slope, r.primitive.clone()),
            None => B::fast_conv2d(x, w, b, options, input_slope),
        }
    };
    let (xn, wn) = (x.node.clone(), weight.node.clone());
    // One node type per set of parents (burn's nodes have a fixed number of them).
    macro_rules! record {
        ($node:expr, $parents:expr) => {
            match $node.prepare::<C>($parents).compute_bound().stateful() {
                OpsKind::Tracked(prep) => prep.finish(state, out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        };
    }
    match (&bias, &residual) {
        (Some(b), None) => record!(ConvWithBias, [xn, wn, b.node.clone()]),
        (None, None) => record!(ConvNoBias, [xn, wn]),
        (Some(b), Some(r)) => record!(ConvWithBiasAdd, [xn, wn, b.node.clone(), r.node.clone()]),
        (None, Some(r)) => record!(ConvNoBiasAdd, [xn, wn, r.node.clone()]),
    }
}
