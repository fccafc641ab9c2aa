//! [`OnnxNetwork`]: a loaded graph's constants as burn tensors on a device, and the forward
//! pass that interprets the graph's operations on them — a [`jem_attacks::Classifier`] — with
//! its forward-mode derivative (J v) and, for a piecewise-linear graph, its linearisation.

use std::path::Path;
use std::sync::Arc;

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use jem_attacks::{scale_channels, shift_channels, Classifier, Linearised, PixelStep};
use jem_kernels::Kernels;

use crate::compile::{Operand, MAX_RANK};
use crate::error::{ErrorKind, OnnxError};
use crate::graph::{OnnxGraph, OnnxModel};
use crate::host::{HostData, HostTensor};
use crate::ops::{self, Primal};
use crate::tangent::Tangents;

/// Sees each step of a forward pass: its index and what its tangent rule reads of it.
type StepObserver<'a, B> = &'a mut dyn FnMut(usize, Primal<B>);

/// A per-channel affine map applied to the pixels (in [0, 1]) before the graph:
/// `(x − mean) / std`, for networks exported without their input normalisation.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalisation {
    /// Per-channel mean.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation (positive).
    pub std: Vec<f32>,
}

impl Normalisation {
    /// 1 / std per channel: what the input is multiplied by after the mean is taken off.
    fn inv_std(&self) -> Vec<f32> {
        self.std.iter().map(|s| 1.0 / s).collect()
    }
}

/// An ONNX classifier on burn tensors of backend `B`: `[N, C, H, W]` pixels in [0, 1] to
/// `[N, K]` logits, differentiable (any order) through autodiff. A burn [`Module`]: the graph's
/// constants are its parameters (`consts.I`, in the graph's order), so it moves between
/// devices, freezes (`no_grad`) and is digested like any other network; the graph and the
/// normalisation are fixed settings.
#[derive(Module, Debug)]
pub struct OnnxNetwork<B: Backend> {
    #[module(skip)]
    graph: Arc<OnnxGraph>,
    consts: Vec<Param<Tensor<B, MAX_RANK>>>,
    #[module(skip)]
    normalisation: Option<Normalisation>,
}

impl<B: Kernels> OnnxNetwork<B> {
    /// The graph's constants uploaded to `device`.
    pub fn new(graph: impl Into<Arc<OnnxGraph>>, device: &B::Device) -> Self {
        let graph = graph.into();
        let consts = graph
            .consts
            .iter()
            .map(|t| Param::from_tensor(upload(t, device)))
            .collect();
        Self {
            graph,
            consts,
            normalisation: None,
        }
    }

    /// [`OnnxModel::load`] then [`new`](Self::new).
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self, OnnxError> {
        Ok(Self::new(OnnxModel::load(path)?, device))
    }

    /// Applies `(x − mean) / std` per channel before the graph (or, with `None`, nothing).
    pub fn with_normalisation(
        mut self,
        normalisation: Option<Normalisation>,
    ) -> Result<Self, OnnxError> {
        let Some(n) = normalisation else {
            self.normalisation = None;
            return Ok(self);
        };
        let c = self.graph.input_shape[0];
        if n.mean.len() != c || n.std.len() != c {
            return Err(ErrorKind::Input(format!(
                "normalisation for {} / {} channels, the network takes {c}",
                n.mean.len(),
                n.std.len()
            ))
            .into());
        }
        if n.std.iter().any(|&s| s.is_nan() || s <= 0.0) {
            return Err(ErrorKind::Input(format!(
                "normalisation std {:?} must be positive",
                n.std
            ))
            .into());
        }
        self.normalisation = Some(n);
        Ok(self)
    }

    /// The normalisation applied before the graph, if any.
    pub fn normalisation(&self) -> Option<&Normalisation> {
        self.normalisation.as_ref()
    }

    /// The loaded graph.
    pub fn graph(&self) -> &OnnxGraph {
        &self.graph
    }

    /// Logits `[N, K]` of pixels `x`, `[N, C, H, W]` in [0, 1].
    ///
    /// # Panics
    /// If `x` is not `[N, C, H, W]` with the graph's C, H, W.
    pub fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.walk(x, None)
    }

    /// The logits f(x) and the directional derivative J(x) v (`[N, K]` each) in one forward
    /// pass: forward mode, each operation's tangent rule beside it. Exact for every supported
    /// operator, and ordinary burn operations throughout, so both results are differentiable
    /// in `x` and in `v`: reverse mode over J(x) v gives second derivatives (Hessian-vector
    /// products) with single-level autodiff. Costs about two to three forward passes.
    ///
    /// # Panics
    /// If `x` is not `[N, C, H, W]` with the graph's C, H, W, or `v` is not shaped like `x`.
    pub fn jacobian_vector_product(
        &self,
        x: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        assert_eq!(
            v.dims(),
            x.dims(),
            "OnnxNetwork: a tangent shaped unlike the input"
        );
        let n = x.dims()[0];
        let steps = &self.graph.steps;
        let mut tangents =
            Tangents::new(self.graph.slots, self.graph.input_slot, self.tangent_in(v));
        let logits = self.walk(
            x,
            Some(&mut |i: usize, primal: Primal<B>| tangents.step(&steps[i], &primal, n)),
        );
        let jv = self.tangent_out(&mut tangents, n, &logits.device());
        (logits, jv)
    }

    /// For a piecewise-linear graph ([`OnnxGraph::is_piecewise_linear`]): the logits at `x`
    /// (gradients flow through them) and the network linearised there, v ↦ J(x) v: the same
    /// tangent pass as [`jacobian_vector_product`](Self::jacobian_vector_product), its rules
    /// reading the values this forward pass recorded (the activation pattern: what is below 0,
    /// which element each max-pool window picks), held fixed. Exact, because J is constant
    /// between kinks; reverse mode through the map gives Jᵀ u. `None` for any other graph,
    /// where J v depends on x within every region.
    pub fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, Linearised<'_, B>)> {
        if !self.graph.is_piecewise_linear() {
            return None;
        }
        let mut pattern = Vec::with_capacity(self.graph.steps.len());
        let logits = self.walk(
            x,
            Some(&mut |_: usize, primal: Primal<B>| pattern.push(primal.detach())),
        );
        let jacobian = move |v: Tensor<B, 4>| {
            let [n, c, h, w] = v.dims();
            assert_eq!(
                [c, h, w],
                self.graph.input_shape,
                "OnnxNetwork: a tangent of shape {:?}, the graph takes [N, {:?}]",
                v.dims(),
                self.graph.input_shape
            );
            let device = v.device();
            let mut tangents =
                Tangents::new(self.graph.slots, self.graph.input_slot, self.tangent_in(v));
            for (step, primal) in self.graph.steps.iter().zip(&pattern) {
                tangents.step(step, primal, n);
            }
            self.tangent_out(&mut tangents, n, &device)
        };
        Some((logits, Box::new(jacobian)))
    }

    /// The input normalisation's derivative: v / std per channel (canonical).
    fn tangent_in(&self, v: Tensor<B, 4>) -> Tensor<B, MAX_RANK> {
        let v = match &self.normalisation {
            Some(norm) => {
                let inv_std = per_channel(&norm.inv_std(), &v.device());
                scale_channels(v, inv_std)
            }
            None => v,
        };
        v.unsqueeze_dim(0)
    }

    /// The output slot's tangent as `[N, K]`.
    fn tangent_out(
        &self,
        tangents: &mut Tangents<B>,
        n: usize,
        device: &B::Device,
    ) -> Tensor<B, 2> {
        let shape = self.graph.output_shape.map(|d| d.dim(n));
        let k = shape[MAX_RANK - 1];
        tangents
            .take(self.graph.output_slot, shape, device)
            .reshape([n, k])
    }

    /// The forward pass: the steps in order on `x` (normalised first), each step's primal
    /// values its tangent rule reads handed to `observe`, where given.
    fn walk(&self, x: Tensor<B, 4>, mut observe: Option<StepObserver<'_, B>>) -> Tensor<B, 2> {
        let [n, c, h, w] = x.dims();
        assert_eq!(
            [c, h, w],
            self.graph.input_shape,
            "OnnxNetwork: input of shape {:?}, the graph takes [N, {:?}]",
            x.dims(),
            self.graph.input_shape
        );
        let x = match &self.normalisation {
            Some(norm) => {
                // As the native Wide-ResNet standardises: shift, then scale by 1 / std.
                let device = x.device();
                let minus_mean: Vec<f32> = norm.mean.iter().map(|m| -m).collect();
                let x = shift_channels(x, per_channel(&minus_mean, &device));
                scale_channels(x, per_channel(&norm.inv_std(), &device))
            }
            None => x,
        };
        let mut slots: Vec<Option<Tensor<B, MAX_RANK>>> = vec![None; self.graph.slots];
        slots[self.graph.input_slot] = Some(x.unsqueeze_dim(0));
        for (index, step) in self.graph.steps.iter().enumerate() {
            let inputs: Vec<Tensor<B, MAX_RANK>> = step
                .inputs
                .iter()
                .map(|op| match op {
                    Operand::Slot(i) => slots[*i]
                        .clone()
                        .expect("slots are written before they are read"),
                    Operand::Const(i) => self.consts[*i].val(),
                })
                .collect();
            // What the tangent rule reads, taken before the operation consumes its inputs.
            let reads = &self.graph.tangent.reads[index];
            let mut primal = observe.is_some().then(|| Primal {
                inputs: inputs
                    .iter()
                    .zip(&reads.inputs)
                    .map(|(t, &read)| read.then(|| t.clone()))
                    .collect(),
                output: None,
            });
            let shapes: Vec<[usize; MAX_RANK]> =
                step.shapes.iter().map(|s| s.map(|d| d.dim(n))).collect();
            let outputs = ops::run(&step.op, inputs, &shapes);
            if let (Some(observe), Some(mut primal)) = (observe.as_mut(), primal.take()) {
                primal.output = reads.output.then(|| outputs[0].clone());
                observe(index, primal);
            }
            for slot in &step.free {
                slots[*slot] = None;
            }
            for (slot, y) in step.outputs.iter().zip(outputs) {
                slots[*slot] = Some(y);
            }
        }
        let y = slots[self.graph.output_slot]
            .take()
            .expect("the output slot is written");
        let k = self.graph.output_shape[MAX_RANK - 1].dim(n);
        y.reshape([n, k])
    }
}

impl<B: Kernels> Classifier<B> for OnnxNetwork<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        OnnxNetwork::logits(self, x)
    }

    /// Exact where the graph is piecewise linear ([`OnnxNetwork::linearise`]), else `None`.
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, Linearised<'_, B>)> {
        OnnxNetwork::linearise(self, x)
    }

    /// Forward mode through every supported operator ([`OnnxNetwork::jacobian_vector_product`]).
    fn jacobian_vector_product(
        &self,
        x: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Option<(Tensor<B, 2>, Tensor<B, 2>)> {
        Some(OnnxNetwork::jacobian_vector_product(self, x, v))
    }

    /// jem-kernels' one-pass update ([`jem_kernels::FastSgld`]).
    fn sgld_update(
        &self,
        x: Tensor<B, 4>,
        g: Tensor<B, 4>,
        eps: Tensor<B, 4>,
        step: &PixelStep,
    ) -> Option<Tensor<B, 4>> {
        let (drift, noise) = (&step.drift, &step.noise);
        Some(jem_kernels::sgld_update(
            x, g, eps, drift, noise, step.clamp,
        ))
    }
}

/// One value per channel on `device`.
fn per_channel<B: Backend>(values: &[f32], device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// A constant as a canonical (rank-5) float tensor on `device`.
fn upload<B: Backend>(t: &HostTensor, device: &B::Device) -> Tensor<B, MAX_RANK> {
    let values = match &t.data {
        HostData::Float(v) => v.clone(),
        _ => t
            .to_f32()
            .expect("the compiler stores only float constants"),
    };
    let mut shape = [1usize; MAX_RANK];
    shape[MAX_RANK - t.shape.len()..].copy_from_slice(&t.shape);
    Tensor::from_data(TensorData::new(values, shape), device)
}
