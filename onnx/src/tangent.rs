//! Forward mode through the interpreter: tangents (directional derivatives J v) carried beside
//! the activations, step by step, by each operator's tangent rule ([`crate::ops::tangent`]).
//!
//! The rules are ordinary burn operations on the tangents and on the forward pass's values, so
//! the tangent J(x) v is differentiable in both x and v: reverse mode over it gives exact
//! second derivatives without nesting autodiff (the SGLD defence's Hessian-vector products,
//! H v = ∇ₓ[softmax(f(x)) · J(x) v]). With the forward pass's values held fixed instead, the
//! same pass is the network linearised at a point (v ↦ J v; exact for a piecewise-linear graph,
//! whose J is constant between kinks).

use burn::tensor::Tensor;
use jem_kernels::Kernels;

use crate::compile::{Operand, Step, MAX_RANK};
use crate::ops::{self, Primal, Reads};

/// What differentiating a graph needs to know of its steps, found once at load time.
#[derive(Clone, Debug)]
pub(crate) struct TangentPlan {
    /// Per step, what its tangent rule reads of the forward pass.
    pub reads: Vec<Reads>,
    /// Whether every step is piecewise linear in what varies with the input.
    pub piecewise_linear: bool,
}

impl TangentPlan {
    /// Follows which slots vary with the input (those computed from it; a step on constants
    /// alone has a zero tangent) through the steps.
    pub fn new(steps: &[Step], input_slot: usize, slots: usize) -> Self {
        let mut varies = vec![false; slots];
        varies[input_slot] = true;
        let mut reads = Vec::with_capacity(steps.len());
        let mut piecewise_linear = true;
        for step in steps {
            let varying: Vec<bool> = step
                .inputs
                .iter()
                .map(|o| matches!(o, Operand::Slot(i) if varies[*i]))
                .collect();
            let any = varying.iter().any(|&v| v);
            reads.push(if any {
                step.op.tangent_reads(&varying)
            } else {
                Reads {
                    inputs: vec![false; varying.len()],
                    output: false,
                }
            });
            piecewise_linear &= !any || step.op.is_piecewise_linear(&varying);
            for &slot in &step.outputs {
                varies[slot] = any;
            }
        }
        Self {
            reads,
            piecewise_linear,
        }
    }
}

/// The tangent of every live slot during one forward-mode pass (`None`: zero).
pub(crate) struct Tangents<B: Kernels> {
    slots: Vec<Option<Tensor<B, MAX_RANK>>>,
}

impl<B: Kernels> Tangents<B> {
    /// The input slot's tangent `v`, every other zero.
    pub fn new(slots: usize, input_slot: usize, v: Tensor<B, MAX_RANK>) -> Self {
        let mut s = vec![None; slots];
        s[input_slot] = Some(v);
        Self { slots: s }
    }

    /// Carries the tangents over one step at the point `primal` (what the step's rule reads of
    /// the forward pass), for a batch of `n`.
    pub fn step(&mut self, step: &Step, primal: &Primal<B>, n: usize) {
        let inputs: Vec<_> = step
            .inputs
            .iter()
            .map(|op| match op {
                Operand::Slot(i) => self.slots[*i].clone(),
                Operand::Const(_) => None,
            })
            .collect();
        let outputs = if inputs.iter().any(Option::is_some) {
            let shapes: Vec<[usize; MAX_RANK]> =
                step.shapes.iter().map(|s| s.map(|d| d.dim(n))).collect();
            ops::tangent(&step.op, primal, inputs, &shapes)
        } else {
            vec![None; step.outputs.len()]
        };
        for slot in &step.free {
            self.slots[*slot] = None;
        }
        for (slot, t) in step.outputs.iter().zip(outputs) {
            self.slots[*slot] = t;
        }
    }

    /// The tangent of `slot` (zero if nothing reached it), shaped like `like`.
    pub fn take(
        &mut self,
        slot: usize,
        like: [usize; MAX_RANK],
        device: &B::Device,
    ) -> Tensor<B, MAX_RANK> {
        self.slots[slot]
            .take()
            .unwrap_or_else(|| Tensor::zeros(like, device))
    }
}
