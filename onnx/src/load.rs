//! Reading an ONNX file: the protobuf decoded with onnx-ir's bindings, then copied into plain
//! structs (nodes with their file names and attributes, initializers as [`HostTensor`]s).
//!
//! Nothing here panics on bad input: every malformed field becomes an [`ErrorKind`].

use std::collections::HashMap;

use onnx_ir::{ModelProto, TensorProto, ValueInfoProto};
use protobuf::Message;

use crate::error::{ErrorKind, OnnxError};
use crate::host::{HostData, HostTensor};
use crate::sym::Sym;

/// A decoded model: the default domain's opset and the main graph.
pub(crate) struct Model {
    pub opset: i64,
    pub nodes: Vec<Node>,
    pub initializers: Vec<(String, HostTensor)>,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
}

/// A graph input or output as declared.
pub(crate) struct ValueInfo {
    pub name: String,
    /// Element type (ONNX `TensorProto.DataType`), 0 where undeclared.
    pub elem_type: i32,
    /// Dimensions, where the shape is declared.
    pub dims: Option<Vec<DeclaredDim>>,
}

/// A declared dimension.
pub(crate) enum DeclaredDim {
    Fixed(i64),
    Named(String),
    Unknown,
}

/// A node of the graph, as in the file.
pub(crate) struct Node {
    pub op_type: String,
    pub domain: String,
    /// The file's name, or `#index` where it has none.
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: HashMap<String, Attr>,
}

/// An attribute value.
pub(crate) enum Attr {
    Float(f32),
    Int(i64),
    String(String),
    Tensor(HostTensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    /// Graphs, sparse tensors, lists of strings or tensors: none of the supported operators
    /// takes one.
    Other,
}

// AttributeProto.AttributeType
const A_FLOAT: i32 = 1;
const A_INT: i32 = 2;
const A_STRING: i32 = 3;
const A_TENSOR: i32 = 4;
const A_FLOATS: i32 = 6;
const A_INTS: i32 = 7;

/// Decodes an `AttributeProto` (a macro: onnx-ir does not export the type's name).
macro_rules! attribute {
    ($a:expr) => {{
        let a = $a;
        let ty = a.type_.value();
        // Old exporters may leave the type out: infer it from the field that is set.
        let ty = if ty != 0 {
            ty
        } else if a.t.is_some() {
            A_TENSOR
        } else if !a.ints.is_empty() {
            A_INTS
        } else if !a.floats.is_empty() {
            A_FLOATS
        } else if !a.s.is_empty() {
            A_STRING
        } else if a.f != 0.0 {
            A_FLOAT
        } else {
            A_INT
        };
        let value: Result<Attr, String> = Ok(match ty {
            A_FLOAT => Attr::Float(a.f),
            A_INT => Attr::Int(a.i),
            A_STRING => Attr::String(String::from_utf8_lossy(&a.s).into_owned()),
            A_TENSOR => match a.t.as_ref() {
                Some(t) => tensor(t).map(Attr::Tensor).map_err(|e| e.kind.to_string()),
                None => Err("a tensor attribute without its tensor".to_string()),
            }?,
            A_FLOATS => Attr::Floats(a.floats.clone()),
            A_INTS => Attr::Ints(a.ints.clone()),
            _ => Attr::Other,
        });
        value
    }};
}

/// Decodes the bytes of an ONNX file.
pub(crate) fn decode(bytes: &[u8]) -> Result<Model, OnnxError> {
    let model =
        ModelProto::parse_from_bytes(bytes).map_err(|e| ErrorKind::Corrupt(e.to_string()))?;
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max()
        .ok_or_else(|| {
            ErrorKind::Opset("the model imports no opset of the default ONNX domain".into())
        })?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ErrorKind::Corrupt("the model has no graph".into()))?;
    if graph.node.is_empty() {
        return Err(ErrorKind::Corrupt("the graph has no nodes".into()).into());
    }
    if !graph.sparse_initializer.is_empty() {
        return Err(ErrorKind::Corrupt("sparse initializers are not supported".into()).into());
    }
    let initializers = graph
        .initializer
        .iter()
        .map(|t| Ok((t.name.clone(), tensor(t)?)))
        .collect::<Result<Vec<_>, OnnxError>>()?;
    let nodes = graph
        .node
        .iter()
        .enumerate()
        .map(|(index, n)| {
            let name = if n.name.is_empty() {
                format!("#{index}")
            } else {
                n.name.clone()
            };
            let mut attrs = HashMap::new();
            for a in &n.attribute {
                let value = (|| attribute!(a))().map_err(|message| ErrorKind::Node {
                    node: name.clone(),
                    op_type: n.op_type.clone(),
                    message: format!("attribute '{}': {message}", a.name),
                })?;
                attrs.insert(a.name.clone(), value);
            }
            Ok(Node {
                op_type: n.op_type.clone(),
                domain: n.domain.clone(),
                name,
                inputs: n.input.clone(),
                outputs: n.output.clone(),
                attrs,
            })
        })
        .collect::<Result<Vec<_>, OnnxError>>()?;
    Ok(Model {
        opset,
        nodes,
        initializers,
        inputs: graph.input.iter().map(value_info).collect(),
        outputs: graph.output.iter().map(value_info).collect(),
    })
}

fn value_info(v: &ValueInfoProto) -> ValueInfo {
    let (elem_type, dims) = match v.type_.as_ref() {
        Some(t) if t.has_tensor_type() => {
            let tt = t.tensor_type();
            let dims = tt.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| {
                        if d.has_dim_value() {
                            DeclaredDim::Fixed(d.dim_value())
                        } else if !d.dim_param().is_empty() {
                            DeclaredDim::Named(d.dim_param().to_string())
                        } else {
                            DeclaredDim::Unknown
                        }
                    })
                    .collect()
            });
            (tt.elem_type, dims)
        }
        _ => (0, None),
    };
    ValueInfo {
        name: v.name.clone(),
        elem_type,
        dims,
    }
}

// TensorProto.DataType
const T_FLOAT: i32 = 1;
const T_UINT8: i32 = 2;
const T_INT8: i32 = 3;
const T_UINT16: i32 = 4;
const T_INT16: i32 = 5;
const T_INT32: i32 = 6;
const T_INT64: i32 = 7;
const T_BOOL: i32 = 9;
const T_FLOAT16: i32 = 10;
const T_DOUBLE: i32 = 11;
const T_UINT32: i32 = 12;
const T_UINT64: i32 = 13;
const T_BFLOAT16: i32 = 16;

/// Whether an ONNX element type is a floating-point one.
pub(crate) fn is_float_type(t: i32) -> bool {
    matches!(t, T_FLOAT | T_FLOAT16 | T_DOUBLE | T_BFLOAT16)
}

/// Whether an ONNX element type is an integer or bool one.
pub(crate) fn is_int_type(t: i32) -> bool {
    matches!(
        t,
        T_UINT8 | T_INT8 | T_UINT16 | T_INT16 | T_INT32 | T_INT64 | T_UINT32 | T_UINT64 | T_BOOL
    )
}

/// Decodes a stored tensor: floats to f32, integers to i64, bools.
pub(crate) fn tensor(t: &TensorProto) -> Result<HostTensor, OnnxError> {
    let fail = |message: String| {
        OnnxError::from(ErrorKind::Tensor {
            name: t.name.clone(),
            message,
        })
    };
    if t.data_location.value() == 1 || !t.external_data.is_empty() {
        return Err(fail(
            "external data (a separate weights file) is not supported".into(),
        ));
    }
    if t.segment.is_some() {
        return Err(fail("segmented tensors are not supported".into()));
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(usize::try_from(d).map_err(|_| fail(format!("negative dimension {d}")))?);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 1 << 31)
        .ok_or_else(|| {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            fail(format!("implausible shape {}", dims.join("×")))
        })?;
    let data = values(t, n).map_err(|message| {
        fail(format!(
            "{message} (shape {})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("×")
        ))
    })?;
    Ok(HostTensor { shape, data })
}

/// The `n` values of `t`, from its raw little-endian bytes or its typed field: floats as f32,
/// integers as i64, bools.
fn values(t: &TensorProto, n: usize) -> Result<HostData, String> {
    let raw: &[u8] = &t.raw_data;
    let from_raw = |width: usize| -> Result<Option<Vec<&[u8]>>, String> {
        if raw.is_empty() {
            return Ok(None);
        }
        if raw.len() != n * width {
            return Err(format!(
                "{} bytes of data for {n} elements of {width} bytes",
                raw.len()
            ));
        }
        Ok(Some(raw.chunks_exact(width).collect()))
    };
    let check = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!("{len} values for {n} elements"))
        }
    };
    let data = match t.data_type {
        T_FLOAT => {
            let v: Vec<f32> = match from_raw(4)? {
                Some(c) => c
                    .iter()
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                None => t.float_data.clone(),
            };
            check(v.len())?;
            HostData::Float(v)
        }
        T_DOUBLE => {
            let v: Vec<f32> = match from_raw(8)? {
                Some(c) => c
                    .iter()
                    .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f32)
                    .collect(),
                None => t.double_data.iter().map(|&d| d as f32).collect(),
            };
            check(v.len())?;
            HostData::Float(v)
        }
        T_FLOAT16 | T_BFLOAT16 => {
            let bits: Vec<u16> = match from_raw(2)? {
                Some(c) => c.iter().map(|b| u16::from_le_bytes([b[0], b[1]])).collect(),
                None => t.int32_data.iter().map(|&i| i as u16).collect(),
            };
            check(bits.len())?;
            let conv = if t.data_type == T_FLOAT16 {
                f16_to_f32
            } else {
                bf16_to_f32
            };
            HostData::Float(bits.into_iter().map(conv).collect())
        }
        T_INT64 => {
            let v: Vec<i64> = match from_raw(8)? {
                Some(c) => c
                    .iter()
                    .map(|b| i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])))
                    .collect(),
                None => t.int64_data.clone(),
            };
            check(v.len())?;
            HostData::Int(v.into_iter().map(Sym::fixed).collect())
        }
        T_UINT64 => {
            let v: Vec<i64> = match from_raw(8)? {
                Some(c) => c
                    .iter()
                    .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as i64)
                    .collect(),
                None => t.uint64_data.iter().map(|&u| u as i64).collect(),
            };
            check(v.len())?;
            HostData::Int(v.into_iter().map(Sym::fixed).collect())
        }
        T_INT32 | T_UINT32 | T_INT16 | T_UINT16 | T_INT8 | T_UINT8 | T_BOOL => {
            let width = match t.data_type {
                T_INT32 | T_UINT32 => 4,
                T_INT16 | T_UINT16 => 2,
                _ => 1,
            };
            let v: Vec<i64> = match from_raw(width)? {
                Some(c) => c
                    .iter()
                    .map(|b| match t.data_type {
                        T_INT32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                        T_UINT32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
                        T_INT16 => i16::from_le_bytes([b[0], b[1]]) as i64,
                        T_UINT16 => u16::from_le_bytes([b[0], b[1]]) as i64,
                        T_INT8 => b[0] as i8 as i64,
                        _ => b[0] as i64,
                    })
                    .collect(),
                None => t.int32_data.iter().map(|&i| i as i64).collect(),
            };
            check(v.len())?;
            if t.data_type == T_BOOL {
                HostData::Bool(v.into_iter().map(|b| b != 0).collect())
            } else {
                HostData::Int(v.into_iter().map(Sym::fixed).collect())
            }
        }
        other => return Err(format!("element type {other} is not supported")),
    };
    Ok(data)
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut f = frac;
            while f & 0x400 == 0 {
                f <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((f & 0x3ff) << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (frac << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (frac << 13),
    };
    f32::from_bits(bits)
}

fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode(b"definitely not a protobuf").is_err());
        assert!(decode(&[]).is_err());
    }
}
