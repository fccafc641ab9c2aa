//! The load-time walk over the graph: every node either folds to a constant (shape arithmetic,
//! constants, anything whose inputs are all known) or becomes one [`Step`] of the forward pass,
//! with its parameters checked and its output shape inferred (symbolically in the batch size).
//!
//! Activations of any rank up to 5 are kept as rank-5 burn tensors with leading dimensions of
//! size 1 ("canonical" form): ONNX broadcasting aligns shapes on the right, so leading ones
//! change nothing, and one tensor type serves every rank.

use std::collections::HashMap;
use std::rc::Rc;

use crate::host::{HostData, HostTensor};
use crate::load::{Attr, Node};
use crate::ops::{self, Op};
use crate::sym::{Sym, SymShape};

/// The largest tensor rank the interpreter handles.
pub(crate) const MAX_RANK: usize = 5;

/// A canonical (rank-5, left-padded with ones) symbolic shape.
pub(crate) type Canon = [Sym; MAX_RANK];

/// What a value of the graph is at load time.
#[derive(Clone, Debug)]
pub(crate) enum Meta {
    /// Known now: a weight, a constant, a folded shape value.
    Host(Rc<HostTensor>),
    /// Computed by the forward pass, in a slot; its logical shape.
    Act(usize, SymShape),
}

impl Meta {
    pub fn shape(&self) -> SymShape {
        match self {
            Meta::Host(t) => t.shape.iter().map(|&d| Sym::fixed(d as i64)).collect(),
            Meta::Act(_, s) => s.clone(),
        }
    }
}

/// Where a step reads a tensor from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// An activation slot.
    Slot(usize),
    /// A constant of [`crate::OnnxGraph`] (uploaded once to the device).
    Const(usize),
}

/// One operation of the forward pass.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub op: Op,
    pub inputs: Vec<Operand>,
    pub outputs: Vec<usize>,
    /// Canonical output shapes.
    pub shapes: Vec<Canon>,
    /// Slots read for the last time here (dropped after the step).
    pub free: Vec<usize>,
    /// The node's name in the file, for messages.
    pub node: String,
}

/// An input of a runtime step, as an op's compile function names it.
pub(crate) enum Arg {
    /// The node's input `i`.
    Input(usize),
    /// A constant the compile function made (a folded BatchNorm scale, a pooling divisor).
    Host(HostTensor),
}

/// What a node compiles to.
pub(crate) enum Compiled {
    /// Its outputs, known now.
    Host(Vec<HostTensor>),
    /// Its (only) output is its input `i` unchanged.
    Alias(usize),
    /// A step of the forward pass, with the outputs' logical shapes.
    Run {
        op: Op,
        args: Vec<Arg>,
        shapes: Vec<SymShape>,
    },
}

/// One node being compiled: its attributes and what its inputs are.
pub(crate) struct Cx<'a> {
    pub node: &'a Node,
    pub opset: i64,
    pub inputs: Vec<Option<Meta>>,
}

pub(crate) type Res<T> = Result<T, String>;

impl Cx<'_> {
    pub fn n_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Input `i`, where present (absent and empty-named optional inputs are `None`).
    pub fn input(&self, i: usize) -> Option<&Meta> {
        self.inputs.get(i).and_then(|m| m.as_ref())
    }

    pub fn required(&self, i: usize) -> Res<&Meta> {
        self.input(i).ok_or_else(|| format!("input {i} is missing"))
    }

    /// Input `i`, which must be known at load time.
    pub fn host(&self, i: usize) -> Res<&HostTensor> {
        match self.required(i)? {
            Meta::Host(t) => Ok(t),
            Meta::Act(..) => Err(format!(
                "input {i} ('{}') must be a constant (known at load time), but it is computed from \
                 the network's input",
                self.node.inputs[i]
            )),
        }
    }

    /// Optional input `i`, which must be known at load time where present.
    pub fn opt_host(&self, i: usize) -> Res<Option<&HostTensor>> {
        match self.input(i) {
            None => Ok(None),
            Some(_) => self.host(i).map(Some),
        }
    }

    /// Whether every present input is known at load time.
    pub fn all_host(&self) -> bool {
        self.inputs
            .iter()
            .flatten()
            .all(|m| matches!(m, Meta::Host(_)))
    }

    pub fn shape(&self, i: usize) -> Res<SymShape> {
        Ok(self.required(i)?.shape())
    }

    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.node.attrs.get(name)
    }

    pub fn attr_i(&self, name: &str, default: i64) -> Res<i64> {
        match self.attr(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(*v),
            Some(_) => Err(format!("attribute '{name}' should be an integer")),
        }
    }

    pub fn attr_f(&self, name: &str, default: f32) -> Res<f32> {
        match self.attr(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(*v),
            Some(Attr::Int(v)) => Ok(*v as f32),
            Some(_) => Err(format!("attribute '{name}' should be a float")),
        }
    }

    pub fn attr_s(&self, name: &str, default: &str) -> Res<String> {
        match self.attr(name) {
            None => Ok(default.to_string()),
            Some(Attr::String(v)) => Ok(v.clone()),
            Some(_) => Err(format!("attribute '{name}' should be a string")),
        }
    }

    pub fn attr_ints(&self, name: &str) -> Res<Option<Vec<i64>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(_) => Err(format!("attribute '{name}' should be a list of integers")),
        }
    }

    /// Integer list given as attribute `name` (older opsets) or as constant input `i`.
    pub fn ints_attr_or_input(&self, name: &str, i: usize) -> Res<Option<Vec<i64>>> {
        if let Some(v) = self.attr_ints(name)? {
            return Ok(Some(v));
        }
        match self.opt_host(i)? {
            Some(t) => Ok(Some(t.to_i64().map_err(|e| format!("input {i}: {e}"))?)),
            None => Ok(None),
        }
    }

    /// A possibly negative axis of a rank-`rank` tensor, normalised.
    pub fn axis(&self, axis: i64, rank: usize) -> Res<usize> {
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        if (0..rank as i64).contains(&a) {
            Ok(a as usize)
        } else {
            Err(format!("axis {axis} is out of range for rank {rank}"))
        }
    }
}

/// The canonical (rank-5) form of a logical shape.
pub(crate) fn canon(shape: &[Sym]) -> Res<Canon> {
    if shape.len() > MAX_RANK {
        return Err(format!(
            "rank {} tensors are not supported (at most {MAX_RANK})",
            shape.len()
        ));
    }
    let mut c = [Sym::fixed(1); MAX_RANK];
    c[MAX_RANK - shape.len()..].copy_from_slice(shape);
    Ok(c)
}

/// The canonical position of logical axis `axis` of a rank-`rank` tensor.
pub(crate) fn canon_axis(axis: usize, rank: usize) -> usize {
    axis + MAX_RANK - rank
}

/// Walks the nodes in file order, folding or scheduling each.
pub(crate) struct Compiler {
    pub opset: i64,
    pub values: HashMap<String, Meta>,
    pub consts: Vec<HostTensor>,
    const_ids: HashMap<String, usize>,
    pub steps: Vec<Step>,
    pub slots: usize,
}

impl Compiler {
    pub fn new(opset: i64) -> Self {
        Self {
            opset,
            values: HashMap::new(),
            consts: Vec::new(),
            const_ids: HashMap::new(),
            steps: Vec::new(),
            slots: 0,
        }
    }

    pub fn new_slot(&mut self) -> usize {
        self.slots += 1;
        self.slots - 1
    }

    /// Compiles one node; errors are messages for [`crate::ErrorKind::Node`].
    pub fn node(&mut self, node: &Node) -> Res<()> {
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for name in &node.inputs {
            if name.is_empty() {
                inputs.push(None);
            } else {
                let m = self.values.get(name).ok_or_else(|| {
                    format!("input '{name}' is neither an initializer nor the output of an earlier node")
                })?;
                inputs.push(Some(m.clone()));
            }
        }
        let cx = Cx {
            node,
            opset: self.opset,
            inputs,
        };
        let compiled = ops::compile(&cx)?;
        match compiled {
            Compiled::Host(outs) => {
                if outs.len() < node.outputs.iter().filter(|o| !o.is_empty()).count() {
                    return Err("an output that is not computed at load time is used".into());
                }
                for (name, t) in node.outputs.iter().zip(outs) {
                    if !name.is_empty() {
                        self.values.insert(name.clone(), Meta::Host(Rc::new(t)));
                    }
                }
            }
            Compiled::Alias(i) => {
                let m = cx.required(i)?.clone();
                self.only_first_output(node)?;
                self.values.insert(node.outputs[0].clone(), m);
            }
            Compiled::Run { op, args, shapes } => {
                let mut operands = Vec::with_capacity(args.len());
                for arg in args {
                    operands.push(match arg {
                        Arg::Input(i) => match cx.required(i)? {
                            Meta::Act(slot, _) => Operand::Slot(*slot),
                            Meta::Host(t) => self.intern(&node.inputs[i], t)?,
                        },
                        Arg::Host(t) => {
                            self.consts.push(float_const(&t)?);
                            Operand::Const(self.consts.len() - 1)
                        }
                    });
                }
                if node.outputs.len() > shapes.len()
                    && node.outputs[shapes.len()..].iter().any(|o| !o.is_empty())
                {
                    return Err("an optional output that is not supported is used".into());
                }
                let mut outputs = Vec::with_capacity(shapes.len());
                let mut canon_shapes = Vec::with_capacity(shapes.len());
                for (name, shape) in node.outputs.iter().zip(&shapes) {
                    let slot = self.new_slot();
                    canon_shapes.push(canon(shape)?);
                    outputs.push(slot);
                    if !name.is_empty() {
                        self.values
                            .insert(name.clone(), Meta::Act(slot, shape.clone()));
                    }
                }
                self.steps.push(Step {
                    op,
                    inputs: operands,
                    outputs,
                    shapes: canon_shapes,
                    free: Vec::new(),
                    node: node.name.clone(),
                });
            }
        }
        Ok(())
    }

    fn only_first_output(&self, node: &Node) -> Res<()> {
        if node.outputs.is_empty() || node.outputs[1..].iter().any(|o| !o.is_empty()) {
            return Err("only the first output is supported".into());
        }
        Ok(())
    }

    /// A named constant read by a step (uploaded once, however many steps read it).
    fn intern(&mut self, name: &str, t: &HostTensor) -> Res<Operand> {
        if let Some(&id) = self.const_ids.get(name) {
            return Ok(Operand::Const(id));
        }
        self.consts.push(float_const(t)?);
        let id = self.consts.len() - 1;
        self.const_ids.insert(name.to_string(), id);
        Ok(Operand::Const(id))
    }

    /// Marks, for every slot, the step that reads it last, so that the forward pass drops it
    /// there (`keep` is never dropped: the graph output).
    pub fn schedule_frees(&mut self, keep: Option<usize>) {
        let mut last = vec![None; self.slots];
        for (s, step) in self.steps.iter().enumerate() {
            for op in &step.inputs {
                if let Operand::Slot(i) = op {
                    last[*i] = Some(s);
                }
            }
        }
        for (slot, l) in last.into_iter().enumerate() {
            if let Some(s) = l {
                if Some(slot) != keep && !self.steps[s].free.contains(&slot) {
                    self.steps[s].free.push(slot);
                }
            }
        }
    }
}

/// A constant as the float tensor a step reads.
fn float_const(t: &HostTensor) -> Res<HostTensor> {
    if t.shape.len() > MAX_RANK {
        return Err(format!(
            "a constant of rank {} (at most {MAX_RANK})",
            t.shape.len()
        ));
    }
    match &t.data {
        HostData::Float(_) => Ok(t.clone()),
        _ => Ok(HostTensor::float(t.shape.clone(), t.to_f32()?)),
    }
}
