//! Layout operators on activations: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Concat,
//! Pad, Slice, Gather, Split, Expand (and Identity, Dropout, Cast as aliases). Every parameter
//! is resolved at load time; the forward pass only reshapes, permutes, slices and concatenates
//! burn tensors, all of which autodiff differentiates (twice, too).

use burn::tensor::backend::Backend;
use burn::tensor::ops::PadMode;
use burn::tensor::{Int, Slice, Tensor, TensorData};

use super::Op;
use crate::compile::{canon_axis, Arg, Compiled, Cx, Res, MAX_RANK};
use crate::load::is_float_type;
use crate::sym::{self, Sym, SymShape};

/// How Pad fills.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum PadKind {
    Constant(f32),
    Reflect,
    Edge,
}

/// Pad: first crops (negative pads), then pads, per canonical axis.
#[derive(Clone, Debug)]
pub(crate) struct Pad {
    pub crop: [(usize, usize); MAX_RANK],
    pub pad: [(usize, usize); MAX_RANK],
    pub kind: PadKind,
}

/// A slice along one canonical axis; `None` keeps it whole.
pub(crate) type AxisSlice = Option<(usize, isize, usize)>; // start, step, length

/// Gather with constant indices along a canonical axis.
#[derive(Clone, Debug)]
pub(crate) struct Gather {
    pub axis: usize,
    pub indices: Vec<usize>,
}

/// Split along a canonical axis into pieces of these sizes.
#[derive(Clone, Debug)]
pub(crate) struct Split {
    pub axis: usize,
    pub sizes: Vec<usize>,
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    let op = cx.node.op_type.as_str();
    match op {
        "Identity" => Ok(Compiled::Alias(0)),
        "Dropout" => dropout(cx),
        "Cast" => cast(cx),
        "Reshape" => {
            let target = cx.host(1)?.to_syms()?;
            let out = sym::reshape_target(&cx.shape(0)?, &target, cx.attr_i("allowzero", 0)? != 0)?;
            reshape_to(out)
        }
        "Flatten" => flatten(cx),
        "Squeeze" => reshape_to(squeezed(cx, &cx.shape(0)?)?),
        "Unsqueeze" => reshape_to(unsqueezed(cx, &cx.shape(0)?)?),
        "Transpose" => transpose(cx),
        "Concat" => concat(cx),
        "Pad" => pad(cx),
        "Slice" => slice(cx),
        "Gather" => gather(cx),
        "Split" => split(cx),
        "Expand" => expand(cx),
        _ => Err(format!("{op} is not a layout operator")),
    }
}

/// Dropout: the identity at inference; a training-mode flag that is set is refused.
fn dropout(cx: &Cx) -> Res<Compiled> {
    if let Some(t) = cx.opt_host(2)? {
        if t.to_f32()?.iter().any(|&v| v != 0.0) {
            return Err("training mode is not supported (inference only)".into());
        }
    }
    Ok(Compiled::Alias(0))
}

/// Cast: the identity between float types; any other element type is refused.
fn cast(cx: &Cx) -> Res<Compiled> {
    let to = cx.attr_i("to", 1)? as i32;
    if is_float_type(to) {
        Ok(Compiled::Alias(0))
    } else {
        Err(format!(
            "casting an activation to element type {to} is not supported"
        ))
    }
}

/// Flatten: a reshape to two dimensions split at `axis`.
fn flatten(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let axis = cx.axis(cx.attr_i("axis", 1)?, shape.len() + 1)?;
    let rows = sym::numel(&shape[..axis]).ok_or("size not linear in the batch size")?;
    let cols = sym::numel(&shape[axis..]).ok_or("size not linear in the batch size")?;
    reshape_to(vec![rows, cols])
}

/// Transpose: the permutation, on canonical axes.
fn transpose(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let perm = permutation(cx, shape.len())?;
    let off = MAX_RANK - shape.len();
    let mut canon: [usize; MAX_RANK] = std::array::from_fn(|i| i);
    for (i, &p) in perm.iter().enumerate() {
        canon[off + i] = off + p;
    }
    let out = perm.iter().map(|&p| shape[p]).collect();
    Ok(Compiled::Run {
        op: Op::Transpose(canon),
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

/// Concat: inputs joined along `axis`, every other dimension equal.
fn concat(cx: &Cx) -> Res<Compiled> {
    let shapes: Vec<SymShape> = (0..cx.n_inputs())
        .map(|i| cx.shape(i))
        .collect::<Res<_>>()?;
    let rank = shapes.first().ok_or("no inputs")?.len();
    let axis = cx.axis(cx.attr_i("axis", 0)?, rank)?;
    let mut out = shapes[0].clone();
    for s in &shapes[1..] {
        if s.len() != rank || (0..rank).any(|d| d != axis && s[d] != out[d]) {
            return Err(format!(
                "inputs of incompatible shapes {} and {}",
                sym::show(&out),
                sym::show(s)
            ));
        }
        out[axis] = out[axis]
            .add(s[axis])
            .ok_or("concatenated size not linear in the batch size")?;
    }
    let args = (0..cx.n_inputs()).map(Arg::Input).collect();
    Ok(Compiled::Run {
        op: Op::Concat(canon_axis(axis, rank)),
        args,
        shapes: vec![out],
    })
}

/// Slice: constant starts, ends, axes and steps (a slice along the batch is refused).
fn slice(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let ranges = slice_ranges(cx, &shape)?;
    let off = MAX_RANK - shape.len();
    let mut axes = [None; MAX_RANK];
    for (d, r) in ranges.iter().enumerate() {
        if r.whole {
            continue;
        }
        let len = r
            .len
            .as_fixed()
            .ok_or("slicing along the batch dimension")? as usize;
        if len == 0 {
            return Err("an empty slice".into());
        }
        axes[off + d] = Some((r.start as usize, r.step as isize, len));
    }
    let out = ranges.iter().map(|r| r.len).collect();
    Ok(Compiled::Run {
        op: Op::Slice(axes),
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

/// Gather: constant indices along a fixed-size axis.
fn gather(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let axis = cx.axis(cx.attr_i("axis", 0)?, shape.len())?;
    let dim = shape[axis]
        .as_fixed()
        .ok_or("gathering along the batch dimension")?;
    let idx = cx.host(1)?;
    let indices = super::gather_indices(idx, dim)?;
    let mut out = shape[..axis].to_vec();
    out.extend(idx.shape.iter().map(|&d| Sym::fixed(d as i64)));
    out.extend_from_slice(&shape[axis + 1..]);
    let op = Op::Gather(Gather {
        axis: canon_axis(axis, shape.len()),
        indices,
    });
    Ok(Compiled::Run {
        op,
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

/// Split: sizes from the attribute or input 1, else `num_outputs` equal parts.
fn split(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let axis = cx.axis(cx.attr_i("axis", 0)?, shape.len())?;
    let dim = shape[axis]
        .as_fixed()
        .ok_or("splitting along the batch dimension")? as usize;
    let n_out = cx.node.outputs.len();
    let sizes: Vec<usize> = match cx.ints_attr_or_input("split", 1)? {
        Some(s) => s
            .into_iter()
            .map(|v| usize::try_from(v).map_err(|_| "negative split"))
            .collect::<Result<_, _>>()?,
        None => {
            let parts = cx.attr_i("num_outputs", n_out as i64)?.max(1) as usize;
            let each = dim.div_ceil(parts);
            (0..parts)
                .map(|i| each.min(dim.saturating_sub(i * each)))
                .collect()
        }
    };
    if sizes.iter().sum::<usize>() != dim || sizes.len() != n_out || sizes.contains(&0) {
        return Err(format!(
            "split sizes {sizes:?} do not divide a dimension of {dim} into {n_out} outputs"
        ));
    }
    let shapes = sizes
        .iter()
        .map(|&s| {
            let mut o = shape.clone();
            o[axis] = Sym::fixed(s as i64);
            o
        })
        .collect();
    let op = Op::Split(Split {
        axis: canon_axis(axis, shape.len()),
        sizes,
    });
    Ok(Compiled::Run {
        op,
        args: vec![Arg::Input(0)],
        shapes,
    })
}

/// Expand: a broadcast to a constant shape.
fn expand(cx: &Cx) -> Res<Compiled> {
    let target = cx.host(1)?.to_syms()?;
    let out = sym::broadcast(&cx.shape(0)?, &target).ok_or("shapes do not broadcast")?;
    Ok(Compiled::Run {
        op: Op::Expand,
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

fn reshape_to(out: SymShape) -> Res<Compiled> {
    Ok(Compiled::Run {
        op: Op::Reshape,
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

/// Squeeze's output shape (axes from the attribute, opset < 13, or input 1).
pub(crate) fn squeezed(cx: &Cx, shape: &[Sym]) -> Res<SymShape> {
    let one = Sym::fixed(1);
    match cx.ints_attr_or_input("axes", 1)? {
        None => Ok(shape.iter().copied().filter(|&d| d != one).collect()),
        Some(axes) => {
            let axes: Vec<usize> = axes
                .iter()
                .map(|&a| cx.axis(a, shape.len()))
                .collect::<Res<_>>()?;
            if let Some(&a) = axes.iter().find(|&&a| shape[a] != one) {
                return Err(format!("cannot squeeze axis {a} of size {}", shape[a]));
            }
            Ok((0..shape.len())
                .filter(|d| !axes.contains(d))
                .map(|d| shape[d])
                .collect())
        }
    }
}

/// Unsqueeze's output shape (axes from the attribute, opset < 13, or input 1).
pub(crate) fn unsqueezed(cx: &Cx, shape: &[Sym]) -> Res<SymShape> {
    let axes = cx.ints_attr_or_input("axes", 1)?.ok_or("no axes")?;
    let rank = shape.len() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|&a| cx.axis(a, rank)).collect::<Res<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    if axes.len() + shape.len() != rank {
        return Err("repeated axes".into());
    }
    let mut rest = shape.iter();
    Ok((0..rank)
        .map(|d| {
            if axes.contains(&d) {
                Sym::fixed(1)
            } else {
                *rest.next().unwrap_or(&Sym::fixed(1))
            }
        })
        .collect())
}

/// Transpose's permutation (default: reversed axes), checked.
pub(crate) fn permutation(cx: &Cx, rank: usize) -> Res<Vec<usize>> {
    let perm: Vec<usize> = match cx.attr_ints("perm")? {
        Some(p) => p.iter().map(|&a| cx.axis(a, rank)).collect::<Res<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..rank).collect::<Vec<_>>() {
        return Err(format!("{perm:?} is not a permutation of {rank} axes"));
    }
    Ok(perm)
}

/// One axis of a Slice: `len` elements from `start` by `step`, or the whole axis.
pub(crate) struct SliceRange {
    pub start: i64,
    pub step: i64,
    pub len: Sym,
    pub whole: bool,
}

/// Slice's ranges along every axis, clamped as ONNX specifies.
pub(crate) fn slice_ranges(cx: &Cx, shape: &[Sym]) -> Res<Vec<SliceRange>> {
    let starts = cx.ints_attr_or_input("starts", 1)?.ok_or("no starts")?;
    let ends = cx.ints_attr_or_input("ends", 2)?.ok_or("no ends")?;
    let axes = cx
        .ints_attr_or_input("axes", 3)?
        .unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = cx
        .ints_attr_or_input("steps", 4)?
        .unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps of different lengths".into());
    }
    let mut ranges: Vec<SliceRange> = shape
        .iter()
        .map(|&d| SliceRange {
            start: 0,
            step: 1,
            len: d,
            whole: true,
        })
        .collect();
    for i in 0..starts.len() {
        let a = cx.axis(axes[i], shape.len())?;
        let (s, e, step) = (starts[i], ends[i], steps[i]);
        if step == 0 {
            return Err("a step of 0".into());
        }
        let Some(d) = shape[a].as_fixed() else {
            // Only the whole batch: from 0 (or -N and less) to N (or a huge end), by 1.
            if step == 1 && s <= 0 && e >= i32::MAX as i64 && (s == 0 || s <= -(1 << 30)) {
                continue;
            }
            return Err("slicing along the batch dimension".into());
        };
        if d <= 0 {
            return Err("slicing an empty dimension".into());
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (start, len) = if step > 0 {
            let s = norm(s).clamp(0, d);
            let e = norm(e).clamp(0, d);
            (s, if e > s { (e - s + step - 1) / step } else { 0 })
        } else {
            let s = norm(s).clamp(0, d - 1);
            let e = norm(e).clamp(-1, d - 1);
            (s, if s > e { (s - e - step - 1) / -step } else { 0 })
        };
        let whole = step == 1 && start == 0 && len == d;
        ranges[a] = SliceRange {
            start,
            step,
            len: Sym::fixed(len),
            whole,
        };
    }
    Ok(ranges)
}

fn pad(cx: &Cx) -> Res<Compiled> {
    let shape = cx.shape(0)?;
    let rank = shape.len();
    let kind = match cx.attr_s("mode", "constant")?.as_str() {
        "constant" => {
            let value = match (cx.opt_host(2)?, cx.attr("value")) {
                (Some(t), _) => t.scalar_f32()?,
                (None, Some(_)) => cx.attr_f("value", 0.0)?,
                _ => 0.0,
            };
            PadKind::Constant(value)
        }
        "reflect" => PadKind::Reflect,
        "edge" => PadKind::Edge,
        m => {
            return Err(format!(
                "pad mode '{m}' is not supported (constant, reflect, edge are)"
            ))
        }
    };
    let pads = cx.ints_attr_or_input("pads", 1)?.ok_or("no pads")?;
    let axes: Vec<usize> = match cx.opt_host(3)? {
        Some(t) => t
            .to_i64()?
            .iter()
            .map(|&a| cx.axis(a, rank))
            .collect::<Res<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", pads.len(), axes.len()));
    }
    let off = MAX_RANK - rank;
    let mut p = Pad {
        crop: [(0, 0); MAX_RANK],
        pad: [(0, 0); MAX_RANK],
        kind,
    };
    let mut out = shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        let (b, e) = (pads[i], pads[i + axes.len()]);
        if b == 0 && e == 0 {
            continue;
        }
        let d = shape[a].as_fixed().ok_or("padding the batch dimension")?;
        let new = d + b + e;
        if new < 1 || (b < 0 && -b > d) || (e < 0 && -e > d) {
            return Err(format!("pads ({b}, {e}) crop more than a dimension of {d}"));
        }
        if kind == PadKind::Reflect && (b >= d || e >= d) {
            return Err(format!(
                "reflect pads ({b}, {e}) must be smaller than the dimension {d}"
            ));
        }
        p.crop[off + a] = ((-b).max(0) as usize, (-e).max(0) as usize);
        p.pad[off + a] = (b.max(0) as usize, e.max(0) as usize);
        out[a] = Sym::fixed(new);
    }
    Ok(Compiled::Run {
        op: Op::Pad(p),
        args: vec![Arg::Input(0)],
        shapes: vec![out],
    })
}

// ---------------------------------------------------------------------------------- forward

/// Pads (after cropping) a canonical tensor.
pub(crate) fn run_pad<B: Backend>(mut x: Tensor<B, 5>, p: &Pad) -> Tensor<B, 5> {
    for (axis, &(b, e)) in p.crop.iter().enumerate() {
        if b + e > 0 {
            let len = x.dims()[axis] - b - e;
            x = x.narrow(axis, b, len);
        }
    }
    if p.pad.iter().all(|&(b, e)| b + e == 0) {
        return x;
    }
    let mode = match p.kind {
        PadKind::Constant(v) => PadMode::Constant(v),
        PadKind::Reflect => PadMode::Reflect,
        PadKind::Edge => PadMode::Edge,
    };
    x.pad(p.pad, mode)
}

/// Pad's tangent: the same crop and padding of the tangent, constant padding by 0 (a
/// constant has none).
pub(crate) fn tangent_pad<B: Backend>(t: Tensor<B, 5>, p: &Pad) -> Tensor<B, 5> {
    let kind = match p.kind {
        PadKind::Constant(_) => PadKind::Constant(0.0),
        other => other,
    };
    run_pad(t, &Pad { kind, ..p.clone() })
}

pub(crate) fn run_slice<B: Backend>(x: Tensor<B, 5>, axes: &[AxisSlice; MAX_RANK]) -> Tensor<B, 5> {
    let dims = x.dims();
    let slices: [Slice; MAX_RANK] = std::array::from_fn(|a| match axes[a] {
        None => Slice::new(0, Some(dims[a] as isize), 1),
        Some((start, step, len)) if step > 0 => {
            let start = start as isize;
            Slice::new(
                start,
                Some(start + (len as isize - 1).max(0) * step + 1),
                step,
            )
        }
        // Negative steps: burn takes the range [end, start] and walks it backwards.
        Some((start, step, len)) => {
            let first = start as isize + (len as isize - 1) * step;
            Slice::new(first.max(0), Some(start as isize + 1), step)
        }
    });
    x.slice(slices)
}

pub(crate) fn run_gather<B: Backend>(x: Tensor<B, 5>, g: &Gather) -> Tensor<B, 5> {
    let contiguous = g.indices.windows(2).all(|w| w[1] == w[0] + 1);
    if contiguous && !g.indices.is_empty() {
        return x.narrow(g.axis, g.indices[0], g.indices.len());
    }
    let device = x.device();
    let idx: Vec<i64> = g.indices.iter().map(|&i| i as i64).collect();
    let n = idx.len();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [n]), &device);
    x.select(g.axis, idx)
}

pub(crate) fn run_split<B: Backend>(x: Tensor<B, 5>, s: &Split) -> Vec<Tensor<B, 5>> {
    let mut start = 0;
    s.sizes
        .iter()
        .map(|&len| {
            let piece = x.clone().narrow(s.axis, start, len);
            start += len;
            piece
        })
        .collect()
}
