//! Loading: [`OnnxModel::load`] reads a file, refuses what the interpreter cannot run (an
//! operator outside [`SUPPORTED_OPERATORS`], a dynamic dimension other than the batch, an input
//! that is not `[N, C, H, W]`, an output that is not `[N, K]`), folds the shape arithmetic and
//! returns an [`OnnxGraph`]: the checked program, not tied to any backend.

use std::path::Path;
use std::rc::Rc;

use crate::compile::{Canon, Compiler, Meta, Step};
use crate::error::{ErrorKind, OnnxError};
use crate::host::HostTensor;
use crate::load::{self, DeclaredDim, Model};
use crate::ops::SUPPORTED_OPERATORS;
use crate::sym::{self, Sym};
use crate::tangent::TangentPlan;

/// The oldest opset of the default domain accepted (PyTorch's exporter writes 13 and later by
/// default; 11 and 12 differ from 13 only in ways the loader handles).
pub const MIN_OPSET: i64 = 11;

/// Entry point: ONNX files to [`OnnxGraph`]s.
pub struct OnnxModel;

impl OnnxModel {
    /// Reads and checks an ONNX classifier. Every error names the file.
    pub fn load(path: impl AsRef<Path>) -> Result<OnnxGraph, OnnxError> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| OnnxError::new(ErrorKind::Io(e)).in_file(path))?;
        Self::from_bytes(&bytes).map_err(|e| e.in_file(path))
    }

    /// As [`load`](Self::load), from the file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<OnnxGraph, OnnxError> {
        // Every malformed input is meant to be an error; should a case slip through as a panic
        // (a bug), it still reaches the caller as an error, not as the end of the program.
        std::panic::catch_unwind(|| build(load::decode(bytes)?)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown");
            Err(ErrorKind::Corrupt(format!(
                "internal error while loading (please report): {message}"
            ))
            .into())
        })
    }
}

/// A loaded ONNX classifier: its weights and the forward pass as a list of operations, with
/// every shape resolved up to the batch size. Make it run with [`crate::OnnxNetwork`].
#[derive(Clone, Debug)]
pub struct OnnxGraph {
    pub(crate) input_name: String,
    pub(crate) input_shape: [usize; 3],
    pub(crate) classes: usize,
    pub(crate) opset: i64,
    pub(crate) consts: Vec<HostTensor>,
    pub(crate) steps: Vec<Step>,
    pub(crate) slots: usize,
    pub(crate) input_slot: usize,
    pub(crate) output_slot: usize,
    pub(crate) output_shape: Canon,
    pub(crate) tangent: TangentPlan,
}

impl OnnxGraph {
    /// `[C, H, W]` of the input.
    pub fn input_shape(&self) -> [usize; 3] {
        self.input_shape
    }

    /// K, the number of logits.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The graph input's name.
    pub fn input_name(&self) -> &str {
        &self.input_name
    }

    /// The model's opset (default domain).
    pub fn opset(&self) -> i64 {
        self.opset
    }

    /// How many numbers the constants (weights, folded statistics) hold.
    pub fn constant_count(&self) -> usize {
        self.consts.iter().map(HostTensor::numel).sum()
    }

    /// How many operations one forward pass runs.
    pub fn operation_count(&self) -> usize {
        self.steps.len()
    }

    /// Whether the logits are piecewise linear in the input: every operation on values computed
    /// from the input is (ReLU, LeakyReLU, max- and average pooling, convolutions and linear
    /// layers with constant weights, BatchNormalization, layout operations, …), so that
    /// recording on which side of each kink the input lies fixes the Jacobian (the network
    /// linearises exactly: [`jem_attacks::Classifier::linearise`]). Smooth activations
    /// (SiLU, GELU, Tanh, …), LayerNormalization, Softmax and products of two computed values
    /// are not.
    pub fn is_piecewise_linear(&self) -> bool {
        self.tangent.piecewise_linear
    }

    /// The forward pass, one line per operation: the file's node name and what runs.
    pub fn describe(&self) -> String {
        self.steps
            .iter()
            .map(|s| format!("{}: {:?}\n", s.node, s.op))
            .collect()
    }
}

fn build(model: Model) -> Result<OnnxGraph, OnnxError> {
    if model.opset < MIN_OPSET {
        return Err(ErrorKind::Opset(format!(
            "opset {} is older than {MIN_OPSET}, the oldest supported (export with opset_version >= 13)",
            model.opset
        ))
        .into());
    }
    supported_operators(&model)?;
    let (input, chw) = image_input(&model)?;
    let input_name = input.name.clone();
    // A batch size fixed in the file usually means constants shaped for it further on.
    let hint = match input.dims.as_deref().and_then(|d| d.first()) {
        Some(DeclaredDim::Fixed(b)) => format!(
            " (the input's batch dimension is fixed at {b} in the file: export with dynamic_axes \
             {{'{0}': {{0: 'batch'}}}} so that no shape is baked in)",
            input_name
        ),
        _ => String::new(),
    };
    let mut c = Compiler::new(model.opset);
    for (name, t) in model.initializers {
        c.values.insert(name, Meta::Host(Rc::new(t)));
    }
    let input_slot = c.new_slot();
    let shape = vec![
        Sym::batch(),
        Sym::fixed(chw[0] as i64),
        Sym::fixed(chw[1] as i64),
        Sym::fixed(chw[2] as i64),
    ];
    c.values
        .insert(input_name.clone(), Meta::Act(input_slot, shape));
    for node in &model.nodes {
        c.node(node).map_err(|message| ErrorKind::Node {
            node: node.name.clone(),
            op_type: node.op_type.clone(),
            message: message + &hint,
        })?;
    }

    let (output_slot, shape, classes) = logits_output(&model.outputs, &c, &hint)?;
    crate::fuse::fuse_activations(&mut c.steps, output_slot);
    c.schedule_frees(Some(output_slot));
    let output_shape = crate::compile::canon(&shape).map_err(ErrorKind::Output)?;
    let tangent = TangentPlan::new(&c.steps, input_slot, c.slots);
    Ok(OnnxGraph {
        input_name,
        input_shape: chw,
        classes,
        opset: model.opset,
        consts: c.consts,
        steps: c.steps,
        slots: c.slots,
        input_slot,
        output_slot,
        output_shape,
        tangent,
    })
}

/// Every node's operator is one the interpreter runs, checked before any is compiled so that
/// the first refusal names what is missing.
fn supported_operators(model: &Model) -> Result<(), OnnxError> {
    for node in &model.nodes {
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        if !default_domain || !SUPPORTED_OPERATORS.contains(&node.op_type.as_str()) {
            return Err(ErrorKind::UnsupportedOperator {
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
                node: node.name.clone(),
                supported: SUPPORTED_OPERATORS.join(", "),
            }
            .into());
        }
    }

    Ok(())
}

/// The graph's one image input, `[N, C, H, W]` with C, H and W fixed, and its C, H, W.
fn image_input(model: &Model) -> Result<(&load::ValueInfo, [usize; 3]), OnnxError> {
    let initialised: Vec<&str> = model.initializers.iter().map(|(n, _)| n.as_str()).collect();
    let inputs: Vec<_> = model
        .inputs
        .iter()
        .filter(|i| !initialised.contains(&i.name.as_str()))
        .collect();
    let [input] = inputs.as_slice() else {
        let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
        return Err(ErrorKind::Input(format!("one image input expected, found {names:?}")).into());
    };
    if input.elem_type != 0 && !load::is_float_type(input.elem_type) {
        return Err(ErrorKind::Input(format!("'{}' is not a float tensor", input.name)).into());
    }
    let dims = input
        .dims
        .as_ref()
        .ok_or_else(|| ErrorKind::Input(format!("'{}' declares no shape", input.name)))?;
    if dims.len() != 4 {
        return Err(ErrorKind::Input(format!(
            "'{}' has rank {}: [N, C, H, W] expected",
            input.name,
            dims.len()
        ))
        .into());
    }
    let mut chw = [0usize; 3];
    for axis in 1..4 {
        chw[axis - 1] = match &dims[axis] {
            DeclaredDim::Fixed(d) if *d > 0 => *d as usize,
            DeclaredDim::Fixed(d) => {
                return Err(ErrorKind::Input(format!(
                    "'{}' has dimension {axis} of {d}",
                    input.name
                ))
                .into())
            }
            DeclaredDim::Named(name) => {
                return Err(ErrorKind::DynamicDimension {
                    input: input.name.clone(),
                    axis,
                    dim: name.clone(),
                }
                .into())
            }
            DeclaredDim::Unknown => {
                return Err(ErrorKind::DynamicDimension {
                    input: input.name.clone(),
                    axis,
                    dim: "?".into(),
                }
                .into())
            }
        };
    }

    Ok((input, chw))
}

/// The graph's one output, logits `[N, K]`: its slot, shape and K.
fn logits_output(
    outputs: &[load::ValueInfo],
    c: &Compiler,
    hint: &str,
) -> Result<(usize, Vec<Sym>, usize), OnnxError> {
    let [output] = outputs else {
        return Err(
            ErrorKind::Output(format!("one output expected, found {}", outputs.len())).into(),
        );
    };
    let (output_slot, shape) = match c.values.get(&output.name) {
        Some(Meta::Act(slot, shape)) => (*slot, shape.clone()),
        Some(Meta::Host(_)) => {
            return Err(ErrorKind::Output(format!(
                "'{}' does not depend on the input",
                output.name
            ))
            .into())
        }
        None => {
            return Err(
                ErrorKind::Output(format!("'{}' is not computed by any node", output.name)).into(),
            )
        }
    };
    let classes = match shape.as_slice() {
        [n, k] if *n == Sym::batch() && k.as_fixed().is_some_and(|k| k > 0) => k.k as usize,
        _ => {
            return Err(ErrorKind::Output(format!(
                "'{}' has shape {}: [N, K] expected, N the input's batch size{hint}",
                output.name,
                sym::show(&shape)
            ))
            .into())
        }
    };
    if let Some([_, DeclaredDim::Fixed(k)]) = output.dims.as_deref() {
        if *k as usize != classes {
            return Err(ErrorKind::Output(format!(
                "'{}' declares {k} classes but computes {classes}",
                output.name
            ))
            .into());
        }
    }
    Ok((output_slot, shape, classes))
}
