//! Load-time folding: the operators an exporter uses for shape arithmetic (`Shape`, `Gather`,
//! `Slice`, `Concat`, `Unsqueeze`, `Reshape`, `Cast`, `Equal`, `Where`, ...) and any other
//! whose inputs are all known, evaluated once on [`HostTensor`]s. Integers may involve the
//! batch size N ([`Sym`]), so `x.view(x.size(0), -1)` folds to the target `[N, -1]`.

use crate::compile::{Compiled, Cx, Res};
use crate::host::{broadcast_shapes, HostData, HostTensor};
use crate::load::{is_float_type, is_int_type, Attr};
use crate::sym::{self, Sym};

/// The folded outputs of a node whose inputs are all known, or `None` where the operator does
/// not fold (it then runs in the forward pass on constant operands).
pub(crate) fn fold(cx: &Cx) -> Res<Option<Compiled>> {
    let out = match cx.node.op_type.as_str() {
        "Constant" => constant(cx)?,
        "Identity" | "Dropout" => cx.host(0)?.clone(),
        "Cast" => cast(cx)?,
        "Shape" => shape(cx)?,
        "ConstantOfShape" => constant_of_shape(cx)?,
        "Reshape" => reshape(cx)?,
        "Flatten" => {
            let t = cx.host(0)?;
            let axis = cx.axis(cx.attr_i("axis", 1)?, t.shape.len() + 1)?;
            let rows = t.shape[..axis].iter().product();
            t.clone().reshaped(vec![rows, t.numel() / rows.max(1)])
        }
        "Squeeze" => {
            let t = cx.host(0)?;
            let shape: Vec<Sym> = t.shape.iter().map(|&d| Sym::fixed(d as i64)).collect();
            let out = super::layout::squeezed(cx, &shape)?;
            t.clone()
                .reshaped(out.iter().map(|s| s.k as usize).collect())
        }
        "Unsqueeze" => {
            let t = cx.host(0)?;
            let shape: Vec<Sym> = t.shape.iter().map(|&d| Sym::fixed(d as i64)).collect();
            let out = super::layout::unsqueezed(cx, &shape)?;
            t.clone()
                .reshaped(out.iter().map(|s| s.k as usize).collect())
        }
        "Concat" => concat(cx)?,
        "Gather" => {
            let t = cx.host(0)?;
            let rank = t.shape.len();
            let axis = cx.axis(cx.attr_i("axis", 0)?, rank)?;
            let idx = cx.host(1)?;
            let dim = t.shape[axis] as i64;
            let indices = super::gather_indices(idx, dim)?;
            t.gather(axis, &indices, &idx.shape)
        }
        "Slice" => {
            let t = cx.host(0)?;
            let dims: Vec<Sym> = t.shape.iter().map(|&d| Sym::fixed(d as i64)).collect();
            let ranges = super::layout::slice_ranges(cx, &dims)?;
            let starts: Vec<i64> = ranges.iter().map(|r| r.start).collect();
            let steps: Vec<i64> = ranges.iter().map(|r| r.step).collect();
            let lens: Vec<usize> = ranges.iter().map(|r| r.len.k as usize).collect();
            t.slice(&starts, &steps, &lens)
        }
        "Transpose" => {
            let t = cx.host(0)?;
            let perm = super::layout::permutation(cx, t.shape.len())?;
            t.transpose(&perm)
        }
        "Expand" => {
            let t = cx.host(0)?;
            // Expanded to the batch size (a class token): a step of the forward pass.
            let Ok(target) = fixed_dims(cx.host(1)?) else {
                return Ok(None);
            };
            let shape = broadcast_shapes(&t.shape, &target).ok_or("shapes do not broadcast")?;
            limit(&shape)?;
            t.broadcast_to(&shape)
        }
        "Range" => range(cx)?,
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" => binary(cx)?,
        "Where" => select(cx)?,
        "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Relu" | "Floor" | "Ceil" => {
            unary(cx)?
        }
        _ => return Ok(None),
    };
    Ok(Some(Compiled::Host(vec![out])))
}

/// Concat of constants along `axis` (mixed integer and float parts as floats).
fn concat(cx: &Cx) -> Res<HostTensor> {
    let parts: Vec<&HostTensor> = (0..cx.n_inputs()).map(|i| cx.host(i)).collect::<Res<_>>()?;
    let rank = parts.first().map(|p| p.shape.len()).ok_or("no inputs")?;
    let axis = cx.axis(cx.attr_i("axis", 0)?, rank)?;
    for p in &parts {
        let mut a = p.shape.clone();
        let mut b = parts[0].shape.clone();
        if a.len() != rank {
            return Err("inputs of different ranks".into());
        }
        a[axis] = 0;
        b[axis] = 0;
        if a != b {
            return Err("inputs of incompatible shapes".into());
        }
    }
    let same = parts.iter().all(|p| p.kind() == parts[0].kind());
    if same {
        HostTensor::concat(&parts, axis)
    } else {
        let floats: Vec<HostTensor> = parts
            .iter()
            .map(|p| Ok(HostTensor::float(p.shape.clone(), p.to_f32()?)))
            .collect::<Res<_>>()?;
        HostTensor::concat(&floats.iter().collect::<Vec<_>>(), axis)
    }
}

/// Where on constants: `x` where the condition holds, else `y`, broadcast.
fn select(cx: &Cx) -> Res<HostTensor> {
    let (c, x, y) = (cx.host(0)?, cx.host(1)?, cx.host(2)?);
    let shape = broadcast_shapes(&c.shape, &x.shape)
        .and_then(|s| broadcast_shapes(&s, &y.shape))
        .ok_or("shapes do not broadcast")?;
    limit(&shape)?;
    let HostData::Bool(c) = c.broadcast_to(&shape).data else {
        return Err("the condition is not a bool tensor".into());
    };
    let (x, y) = unify(&x.broadcast_to(&shape), &y.broadcast_to(&shape))?;
    let data = match (x.data, y.data) {
        (HostData::Float(a), HostData::Float(b)) => HostData::Float(
            c.iter()
                .zip(a.iter().zip(&b))
                .map(|(&c, (&a, &b))| if c { a } else { b })
                .collect(),
        ),
        (HostData::Int(a), HostData::Int(b)) => HostData::Int(
            c.iter()
                .zip(a.iter().zip(&b))
                .map(|(&c, (&a, &b))| if c { a } else { b })
                .collect(),
        ),
        _ => return Err("unsupported element types".into()),
    };
    Ok(HostTensor { shape, data })
}

/// The most elements a folded constant may have (a guard against absurd shapes in a corrupt
/// file, which would otherwise exhaust memory).
const MAX_FOLDED: usize = 1 << 26;

/// Refuses a folded result of more than [`MAX_FOLDED`] elements.
fn limit(shape: &[usize]) -> Res<()> {
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(n) if n <= MAX_FOLDED => Ok(()),
        _ => Err(format!(
            "a constant of shape {shape:?} is implausibly large"
        )),
    }
}

/// The values of a 1-D integer tensor of dimensions (no negative, no batch factor), for a
/// tensor of at most [`MAX_FOLDED`] elements.
fn fixed_dims(t: &HostTensor) -> Res<Vec<usize>> {
    let dims = t
        .to_i64()
        .map_err(|e| format!("a shape that {e} cannot make a load-time constant"))?
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<Res<Vec<usize>>>()?;
    limit(&dims)?;
    Ok(dims)
}

fn constant(cx: &Cx) -> Res<HostTensor> {
    if let Some((name, attr)) = cx.node.attrs.iter().next() {
        return Ok(match (name.as_str(), attr) {
            ("value", Attr::Tensor(t)) => t.clone(),
            ("value_float", Attr::Float(f)) => HostTensor::float(vec![], vec![*f]),
            ("value_floats", Attr::Floats(f)) => HostTensor::float(vec![f.len()], f.clone()),
            ("value_int", Attr::Int(i)) => HostTensor::int(vec![], vec![Sym::fixed(*i)]),
            ("value_ints", Attr::Ints(i)) => HostTensor::ints(i),
            _ => return Err(format!("a constant given as '{name}' is not supported")),
        });
    }
    Err("a constant without a value".into())
}

fn cast(cx: &Cx) -> Res<HostTensor> {
    let t = cx.host(0)?;
    let to = cx.attr_i("to", 1)? as i32;
    let data = if to == 9 {
        HostData::Bool(t.to_f32()?.into_iter().map(|v| v != 0.0).collect())
    } else if is_float_type(to) {
        HostData::Float(t.to_f32()?)
    } else if is_int_type(to) {
        match &t.data {
            HostData::Float(v) => {
                HostData::Int(v.iter().map(|f| Sym::fixed(f.trunc() as i64)).collect())
            }
            _ => HostData::Int(t.to_syms()?),
        }
    } else {
        return Err(format!("cast to element type {to} is not supported"));
    };
    Ok(HostTensor {
        shape: t.shape.clone(),
        data,
    })
}

/// `Shape`: the (symbolic) dimensions of any value, activations included.
pub(crate) fn shape(cx: &Cx) -> Res<HostTensor> {
    let dims = cx.shape(0)?;
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attr_i("start", 0)?);
    let end = clamp(cx.attr_i("end", r)?);
    let dims = dims[start..end.max(start)].to_vec();
    Ok(HostTensor::int(vec![dims.len()], dims))
}

fn constant_of_shape(cx: &Cx) -> Res<HostTensor> {
    let shape = fixed_dims(cx.host(0)?)?;
    let n = shape.iter().product();
    let value = match cx.attr("value") {
        None => HostTensor::float(vec![1], vec![0.0]),
        Some(Attr::Tensor(t)) if t.len() == 1 => t.clone(),
        Some(_) => return Err("attribute 'value' should be a one-element tensor".into()),
    };
    let data = match value.data {
        HostData::Float(v) => HostData::Float(vec![v[0]; n]),
        HostData::Int(v) => HostData::Int(vec![v[0]; n]),
        HostData::Bool(v) => HostData::Bool(vec![v[0]; n]),
    };
    Ok(HostTensor { shape, data })
}

fn reshape(cx: &Cx) -> Res<HostTensor> {
    let t = cx.host(0)?;
    let input: Vec<Sym> = t.shape.iter().map(|&d| Sym::fixed(d as i64)).collect();
    let target = cx.host(1)?.to_syms()?;
    let out = sym::reshape_target(&input, &target, cx.attr_i("allowzero", 0)? != 0)?;
    let shape = out
        .iter()
        .map(|s| {
            s.as_fixed()
                .map(|k| k as usize)
                .ok_or("a load-time constant reshaped by the batch size")
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(t.clone().reshaped(shape))
}

fn range(cx: &Cx) -> Res<HostTensor> {
    let (s, l, d) = (cx.host(0)?, cx.host(1)?, cx.host(2)?);
    if let (HostData::Int(_), HostData::Int(_), HostData::Int(_)) = (&s.data, &l.data, &d.data) {
        let (s, l, d) = (s.to_i64()?[0], l.to_i64()?[0], d.to_i64()?[0]);
        if d == 0 {
            return Err("a delta of 0".into());
        }
        let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0);
        if n > MAX_FOLDED as f64 {
            return Err("an implausibly long range".into());
        }
        let n = n as i64;
        return Ok(HostTensor::ints(
            &(0..n).map(|i| s + i * d).collect::<Vec<_>>(),
        ));
    }
    let (s, l, d) = (s.scalar_f32()?, l.scalar_f32()?, d.scalar_f32()?);
    if d == 0.0 {
        return Err("a delta of 0".into());
    }
    let n = ((l - s) / d).ceil().max(0.0);
    if n.is_nan() || n > MAX_FOLDED as f32 {
        return Err("an implausibly long range".into());
    }
    let n = n as usize;
    Ok(HostTensor::float(
        vec![n],
        (0..n).map(|i| s + i as f32 * d).collect(),
    ))
}

/// Both as integers where both are, else both as floats.
fn unify(a: &HostTensor, b: &HostTensor) -> Res<(HostTensor, HostTensor)> {
    match (&a.data, &b.data) {
        (HostData::Int(_), HostData::Int(_)) | (HostData::Float(_), HostData::Float(_)) => {
            Ok((a.clone(), b.clone()))
        }
        _ => Ok((
            HostTensor::float(a.shape.clone(), a.to_f32()?),
            HostTensor::float(b.shape.clone(), b.to_f32()?),
        )),
    }
}

fn binary(cx: &Cx) -> Res<HostTensor> {
    let op = cx.node.op_type.as_str();
    let (a, b) = (cx.host(0)?, cx.host(1)?);
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or("shapes do not broadcast")?;
    limit(&shape)?;
    let (a, b) = unify(&a.broadcast_to(&shape), &b.broadcast_to(&shape))?;
    let undecided = || format!("cannot evaluate {op} on values that depend on the batch size");
    let data = match (a.data, b.data) {
        (HostData::Float(a), HostData::Float(b)) => {
            let it = a.iter().zip(&b);
            match op {
                "Add" => HostData::Float(it.map(|(x, y)| x + y).collect()),
                "Sub" => HostData::Float(it.map(|(x, y)| x - y).collect()),
                "Mul" => HostData::Float(it.map(|(x, y)| x * y).collect()),
                "Div" => HostData::Float(it.map(|(x, y)| x / y).collect()),
                "Pow" => HostData::Float(it.map(|(x, y)| x.powf(*y)).collect()),
                "Equal" => HostData::Bool(it.map(|(x, y)| x == y).collect()),
                "Less" => HostData::Bool(it.map(|(x, y)| x < y).collect()),
                _ => HostData::Bool(it.map(|(x, y)| x > y).collect()),
            }
        }
        (HostData::Int(a), HostData::Int(b)) => {
            let it = a.iter().zip(&b);
            match op {
                "Add" => HostData::Int(
                    it.map(|(x, y)| x.add(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                "Sub" => HostData::Int(
                    it.map(|(x, y)| x.sub(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                "Mul" => HostData::Int(
                    it.map(|(x, y)| x.mul(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                "Div" => HostData::Int(
                    it.map(|(x, y)| x.div(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                "Pow" => HostData::Int(
                    it.map(|(x, y)| {
                        Some(Sym::fixed(
                            x.as_fixed()?
                                .checked_pow(u32::try_from(y.as_fixed()?).ok()?)?,
                        ))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(undecided)?,
                ),
                "Equal" => HostData::Bool(
                    it.map(|(x, y)| x.equal(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                "Less" => HostData::Bool(
                    it.map(|(x, y)| x.less(*y))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
                _ => HostData::Bool(
                    it.map(|(x, y)| y.less(*x))
                        .collect::<Option<_>>()
                        .ok_or_else(undecided)?,
                ),
            }
        }
        _ => return Err("unsupported element types".into()),
    };
    Ok(HostTensor { shape, data })
}

fn unary(cx: &Cx) -> Res<HostTensor> {
    let op = cx.node.op_type.as_str();
    let t = cx.host(0)?;
    let data = match &t.data {
        HostData::Int(v) if matches!(op, "Neg" | "Abs" | "Relu" | "Floor" | "Ceil") => {
            HostData::Int(
                v.iter()
                    .map(|s| match op {
                        "Neg" => Some(s.neg()),
                        "Abs" => s.as_fixed().map(|k| Sym::fixed(k.abs())),
                        "Relu" => s.as_fixed().map(|k| Sym::fixed(k.max(0))),
                        _ => Some(*s),
                    })
                    .collect::<Option<_>>()
                    .ok_or("cannot evaluate on values that depend on the batch size")?,
            )
        }
        _ => {
            let f: fn(f32) -> f32 = match op {
                "Neg" => |x| -x,
                "Abs" => f32::abs,
                "Sqrt" => f32::sqrt,
                "Reciprocal" => f32::recip,
                "Exp" => f32::exp,
                "Log" => f32::ln,
                "Relu" => |x| x.max(0.0),
                "Floor" => f32::floor,
                _ => f32::ceil,
            };
            HostData::Float(t.to_f32()?.into_iter().map(f).collect())
        }
    };
    Ok(HostTensor {
        shape: t.shape.clone(),
        data,
    })
}
