//! Unit tests of the operators, one node at a time through the compiler and the forward pass,
//! against direct loops, closed forms, hand-computed values and burn's own (single-backward)
//! pooling for gradients.

use std::collections::HashMap;
use std::rc::Rc;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::compile::{Compiler, Meta, Operand, Res, MAX_RANK};
use crate::host::HostTensor;
use crate::load::{Attr, Node};
use crate::sym::Sym;

/// An input of a test node.
enum In {
    /// An activation: shape and values.
    Act(Vec<usize>, Vec<f32>),
    /// A load-time constant.
    Host(HostTensor),
    /// An omitted optional input.
    Absent,
}

fn act(shape: &[usize], values: Vec<f32>) -> In {
    assert_eq!(shape.iter().product::<usize>(), values.len());
    In::Act(shape.to_vec(), values)
}

/// 0, 1, 2, ... scaled, shifted and wrapped into a varied pattern.
fn pattern(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 23) as f32 / 7.0 - 1.5)
        .collect()
}

fn floats(shape: &[usize], values: Vec<f32>) -> In {
    In::Host(HostTensor::float(shape.to_vec(), values))
}

fn ints(values: &[i64]) -> In {
    In::Host(HostTensor::ints(values))
}

/// Compiles one node; returns the compiler (its steps, constants and values) and the slots of
/// the activation inputs, in input order.
fn compile_node(
    op: &str,
    attrs: Vec<(&str, Attr)>,
    inputs: &[In],
    outputs: usize,
) -> Res<(Compiler, Vec<usize>)> {
    let mut c = Compiler::new(17);
    let mut names = Vec::new();
    let mut act_slots = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let name = format!("in{i}");
        match input {
            In::Act(shape, _) => {
                let slot = c.new_slot();
                act_slots.push(slot);
                let shape = shape.iter().map(|&d| Sym::fixed(d as i64)).collect();
                c.values.insert(name.clone(), Meta::Act(slot, shape));
            }
            In::Host(t) => {
                c.values
                    .insert(name.clone(), Meta::Host(Rc::new(t.clone())));
            }
            In::Absent => {
                names.push(String::new());
                continue;
            }
        }
        names.push(name);
    }
    let node = Node {
        op_type: op.to_string(),
        domain: String::new(),
        name: "test".into(),
        inputs: names,
        outputs: (0..outputs).map(|i| format!("out{i}")).collect(),
        attrs: attrs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<HashMap<_, _>>(),
    };
    c.node(&node)?;
    Ok((c, act_slots))
}

/// Compiles one node and runs it on backend `B`, the activations given (canonical, in input
/// order); returns the outputs' logical shapes and canonical tensors.
fn eval_on<B: jem_kernels::Kernels>(
    op: &str,
    attrs: Vec<(&str, Attr)>,
    inputs: &[In],
    outputs: usize,
    acts: Vec<Tensor<B, MAX_RANK>>,
) -> Res<Vec<(Vec<usize>, Tensor<B, MAX_RANK>)>> {
    let (c, act_slots) = compile_node(op, attrs, inputs, outputs)?;
    let device = Default::default();
    let consts: Vec<Tensor<B, MAX_RANK>> = c.consts.iter().map(|t| upload(t, &device)).collect();
    let mut slots: Vec<Option<Tensor<B, MAX_RANK>>> = vec![None; c.slots];
    for (slot, t) in act_slots.into_iter().zip(acts) {
        slots[slot] = Some(t);
    }
    for step in &c.steps {
        let ins = step
            .inputs
            .iter()
            .map(|o| match o {
                Operand::Slot(i) => slots[*i].clone().unwrap(),
                Operand::Const(i) => consts[*i].clone(),
            })
            .collect();
        let shapes: Vec<[usize; MAX_RANK]> =
            step.shapes.iter().map(|s| s.map(|d| d.dim(1))).collect();
        for (slot, y) in step.outputs.iter().zip(super::run(&step.op, ins, &shapes)) {
            slots[*slot] = Some(y);
        }
    }
    (0..outputs)
        .map(|i| match &c.values[&format!("out{i}")] {
            Meta::Act(slot, shape) => {
                let shape: Vec<usize> = shape.iter().map(|d| d.dim(1)).collect();
                let t = slots[*slot].clone().unwrap();
                assert_eq!(
                    t.dims()[MAX_RANK - shape.len()..],
                    shape[..],
                    "runtime and inferred shapes"
                );
                Ok((shape, t))
            }
            Meta::Host(t) => Ok((
                t.shape.clone(),
                upload(&HostTensor::float(t.shape.clone(), t.to_f32()?), &device),
            )),
        })
        .collect()
}

fn upload<B: Backend>(t: &HostTensor, device: &B::Device) -> Tensor<B, MAX_RANK> {
    let mut shape = [1usize; MAX_RANK];
    shape[MAX_RANK - t.shape.len()..].copy_from_slice(&t.shape);
    Tensor::from_data(TensorData::new(t.to_f32().unwrap(), shape), device)
}

fn canonical<B: Backend>(shape: &[usize], values: &[f32]) -> Tensor<B, MAX_RANK> {
    let mut s = [1usize; MAX_RANK];
    s[MAX_RANK - shape.len()..].copy_from_slice(shape);
    Tensor::from_data(TensorData::new(values.to_vec(), s), &Default::default())
}

/// One node on Flex: each output's shape and values.
fn eval(
    op: &str,
    attrs: Vec<(&str, Attr)>,
    inputs: &[In],
    outputs: usize,
) -> Res<Vec<(Vec<usize>, Vec<f32>)>> {
    let acts = inputs
        .iter()
        .filter_map(|i| match i {
            In::Act(s, v) => Some(canonical::<Flex>(s, v)),
            _ => None,
        })
        .collect();
    Ok(eval_on::<Flex>(op, attrs, inputs, outputs, acts)?
        .into_iter()
        .map(|(s, t)| (s, t.into_data().to_vec().unwrap()))
        .collect())
}

fn eval1(op: &str, attrs: Vec<(&str, Attr)>, inputs: &[In]) -> (Vec<usize>, Vec<f32>) {
    eval(op, attrs, inputs, 1)
        .unwrap_or_else(|e| panic!("{op}: {e}"))
        .remove(0)
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "lengths: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} vs {w}\n{got:?}\n{want:?}"
        );
    }
}

fn ints_attr(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

// ------------------------------------------------------------------------------------ conv

#[test]
fn conv_with_groups_dilation_stride_and_asymmetric_pads_matches_a_direct_loop() {
    let (n, c, h, w) = (2, 4, 6, 7);
    let (m, groups, kh, kw) = (6, 2, 3, 2);
    let (stride, dil, pads) = ([1usize, 2], [2usize, 1], [1usize, 0, 2, 1]); // top, left, bottom, right
    let x = pattern(n * c * h * w);
    let wt: Vec<f32> = pattern(m * (c / groups) * kh * kw)
        .iter()
        .map(|v| v * 0.3)
        .collect();
    let b = vec![0.1, -0.2, 0.3, 0.0, 0.5, -0.6];
    let attrs = vec![
        ("group", Attr::Int(groups as i64)),
        ("dilations", ints_attr(&[2, 1])),
        ("strides", ints_attr(&[1, 2])),
        ("pads", ints_attr(&[1, 0, 2, 1])),
        ("kernel_shape", ints_attr(&[3, 2])),
    ];
    let (shape, got) = eval1(
        "Conv",
        attrs,
        &[
            act(&[n, c, h, w], x.clone()),
            floats(&[m, c / groups, kh, kw], wt.clone()),
            floats(&[m], b.clone()),
        ],
    );
    let oh = (h + pads[0] + pads[2] - ((kh - 1) * dil[0] + 1)) / stride[0] + 1;
    let ow = (w + pads[1] + pads[3] - ((kw - 1) * dil[1] + 1)) / stride[1] + 1;
    assert_eq!(shape, vec![n, m, oh, ow]);
    let cg = c / groups;
    let mut want = Vec::new();
    for ni in 0..n {
        for mi in 0..m {
            let g = mi / (m / groups);
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = b[mi];
                    for ci in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let y = (oy * stride[0] + ky * dil[0]) as i64 - pads[0] as i64;
                                let xx = (ox * stride[1] + kx * dil[1]) as i64 - pads[1] as i64;
                                if y < 0 || xx < 0 || y >= h as i64 || xx >= w as i64 {
                                    continue;
                                }
                                let cin = g * cg + ci;
                                acc += x[((ni * c + cin) * h + y as usize) * w + xx as usize]
                                    * wt[((mi * cg + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    want.push(acc);
                }
            }
        }
    }
    assert_close(&got, &want, 1e-5);
}

#[test]
fn conv_same_upper_pads_like_explicit_pads() {
    let x = pattern(5 * 5);
    let wt = pattern(2 * 2);
    let same = eval1(
        "Conv",
        vec![
            ("auto_pad", Attr::String("SAME_UPPER".into())),
            ("strides", ints_attr(&[2, 2])),
        ],
        &[
            act(&[1, 1, 5, 5], x.clone()),
            floats(&[1, 1, 2, 2], wt.clone()),
        ],
    );
    // 5 by stride 2: 3 outputs, total padding (3 − 1)·2 + 2 − 5 = 1, at the end.
    let explicit = eval1(
        "Conv",
        vec![
            ("pads", ints_attr(&[0, 0, 1, 1])),
            ("strides", ints_attr(&[2, 2])),
        ],
        &[act(&[1, 1, 5, 5], x), floats(&[1, 1, 2, 2], wt)],
    );
    assert_eq!(same.0, vec![1, 1, 3, 3]);
    assert_eq!(same, explicit);
}

// ------------------------------------------------------------------------------------- pad

#[test]
fn pad_constant_asymmetric_with_a_crop() {
    // [[1, 2, 3], [4, 5, 6]]: one row of 7 on top, the last column cropped, two columns of 7
    // on the right.
    let (shape, got) = eval1(
        "Pad",
        vec![],
        &[
            act(&[1, 1, 2, 3], vec![1., 2., 3., 4., 5., 6.]),
            ints(&[0, 0, 1, 0, 0, 0, 0, 1]),
            floats(&[], vec![7.0]),
        ],
    );
    assert_eq!(shape, vec![1, 1, 3, 4]);
    assert_eq!(got, vec![7., 7., 7., 7., 1., 2., 3., 7., 4., 5., 6., 7.]);
    let (shape, got) = eval1(
        "Pad",
        vec![],
        &[act(&[1, 3], vec![1., 2., 3.]), ints(&[0, -1, 0, 2])],
    );
    assert_eq!((shape, got), (vec![1, 4], vec![2., 3., 0., 0.]));
}

#[test]
fn pad_reflect_and_edge() {
    let x = || act(&[1, 4], vec![1., 2., 3., 4.]);
    let reflect = eval1(
        "Pad",
        vec![("mode", Attr::String("reflect".into()))],
        &[x(), ints(&[0, 2, 0, 1])],
    );
    assert_eq!(reflect.1, vec![3., 2., 1., 2., 3., 4., 3.]);
    let edge = eval1(
        "Pad",
        vec![("mode", Attr::String("edge".into()))],
        &[x(), ints(&[0, 2, 0, 1])],
    );
    assert_eq!(edge.1, vec![1., 1., 1., 2., 3., 4., 4.]);
}

// ---------------------------------------------------------------------------------- pools

#[test]
fn average_pool_count_include_pad_and_ceil_mode() {
    let ones = || act(&[1, 1, 3, 3], vec![1.0; 9]);
    let base = || {
        vec![
            ("kernel_shape", ints_attr(&[2, 2])),
            ("strides", ints_attr(&[2, 2])),
            ("pads", ints_attr(&[1, 1, 1, 1])),
        ]
    };
    // Windows over the padded 5×5: the corner ones see 1 input, the edge ones 2, the centre 4.
    let excl = eval1("AveragePool", base(), &[ones()]);
    assert_eq!(excl.0, vec![1, 1, 2, 2]);
    assert_close(&excl.1, &[1.0; 4], 1e-6);
    let mut attrs = base();
    attrs.push(("count_include_pad", Attr::Int(1)));
    let incl = eval1("AveragePool", attrs, &[ones()]);
    assert_close(&incl.1, &[0.25, 0.5, 0.5, 1.0], 1e-6);

    // ceil_mode on 0..=15 (4×4), kernel 3, stride 2, no padding: windows at 0 and 2 (the second
    // overhangs by one), averaged over the inputs they cover.
    let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
    let attrs = vec![
        ("kernel_shape", ints_attr(&[3, 3])),
        ("strides", ints_attr(&[2, 2])),
        ("ceil_mode", Attr::Int(1)),
    ];
    let (shape, got) = eval1("AveragePool", attrs, &[act(&[1, 1, 4, 4], x)]);
    assert_eq!(shape, vec![1, 1, 2, 2]);
    let mean = |rows: &[usize], cols: &[usize]| {
        let s: usize = rows
            .iter()
            .flat_map(|r| cols.iter().map(move |c| r * 4 + c))
            .sum();
        s as f32 / (rows.len() * cols.len()) as f32
    };
    let want = [
        mean(&[0, 1, 2], &[0, 1, 2]),
        mean(&[0, 1, 2], &[2, 3]),
        mean(&[2, 3], &[0, 1, 2]),
        mean(&[2, 3], &[2, 3]),
    ];
    assert_close(&got, &want, 1e-6);
}

/// MaxPool and AveragePool against burn's own pooling, values and input gradients, with
/// padding and ceil_mode.
#[test]
fn pools_match_burn_pooling_and_its_gradients() {
    type B = Autodiff<Flex>;
    let shape = [2, 3, 7, 6];
    let x: Vec<f32> = pattern(2 * 3 * 7 * 6)
        .iter()
        .enumerate()
        .map(|(i, v)| v + i as f32 * 1e-3)
        .collect();
    let weights: Vec<f32> = pattern(2 * 3 * 4 * 4).iter().map(|v| v + 2.0).collect();
    for (max, ceil, include) in [
        (true, false, false),
        (true, true, false),
        (false, false, true),
        (false, true, false),
    ] {
        let mut attrs = vec![
            ("kernel_shape", ints_attr(&[3, 3])),
            ("strides", ints_attr(&[2, 2])),
            ("pads", ints_attr(&[1, 1, 1, 1])),
            ("ceil_mode", Attr::Int(ceil as i64)),
        ];
        if !max {
            attrs.push(("count_include_pad", Attr::Int(include as i64)));
        }
        let op = if max { "MaxPool" } else { "AveragePool" };
        let t = canonical::<B>(&shape, &x).require_grad();
        let outs = eval_on::<B>(op, attrs, &[act(&shape, x.clone())], 1, vec![t.clone()]).unwrap();
        let ours = outs[0].1.clone();
        let [_, _, _, oh, ow] = ours.dims();
        assert_eq!([oh, ow], if ceil { [4, 4] } else { [4, 3] });
        let wt = Tensor::<B, 4>::from_data(
            TensorData::new(weights[..2 * 3 * oh * ow].to_vec(), [2, 3, oh, ow]),
            &Default::default(),
        );
        let g_ours = t
            .grad(
                &(ours.clone().reshape([2, 3, oh, ow]) * wt.clone())
                    .sum()
                    .backward(),
            )
            .unwrap();

        let t4 = Tensor::<B, 4>::from_data(TensorData::new(x.clone(), shape), &Default::default())
            .require_grad();
        let theirs = if max {
            burn::tensor::module::max_pool2d(t4.clone(), [3, 3], [2, 2], [1, 1], [1, 1], ceil)
        } else {
            burn::tensor::module::avg_pool2d(t4.clone(), [3, 3], [2, 2], [1, 1], include, ceil)
        };
        let g_theirs = t4.grad(&(theirs.clone() * wt).sum().backward()).unwrap();
        let v = |t: Tensor<B, 4>| t.into_data().to_vec::<f32>().unwrap();
        assert_close(&v(ours.reshape([2, 3, oh, ow])), &v(theirs), 1e-5);
        assert_close(
            &g_ours.into_data().to_vec::<f32>().unwrap(),
            &g_theirs.into_data().to_vec::<f32>().unwrap(),
            1e-5,
        );
    }
}

#[test]
fn global_average_pool() {
    let (shape, got) = eval1(
        "GlobalAveragePool",
        vec![],
        &[act(&[1, 2, 2, 2], vec![1., 2., 3., 4., 0., 0., 0., 8.])],
    );
    assert_eq!((shape, got), (vec![1, 2, 1, 1], vec![2.5, 2.0]));
}

// ---------------------------------------------------------------------------------- linear

#[test]
fn gemm_with_alpha_beta_and_transposes() {
    // A' = [[1, 2], [3, 4]] given transposed, B' = [[1, 0], [1, 1]] given transposed.
    let attrs = vec![
        ("alpha", Attr::Float(2.0)),
        ("beta", Attr::Float(0.5)),
        ("transA", Attr::Int(1)),
        ("transB", Attr::Int(1)),
    ];
    let (shape, got) = eval1(
        "Gemm",
        attrs,
        &[
            act(&[2, 2], vec![1., 3., 2., 4.]),
            floats(&[2, 2], vec![1., 1., 0., 1.]),
            floats(&[2], vec![10., 20.]),
        ],
    );
    // A'B' = [[3, 2], [7, 4]]; 2·A'B' + 0.5·[10, 20].
    assert_eq!((shape, got), (vec![2, 2], vec![11., 14., 19., 18.]));
}

#[test]
fn batched_matmul_broadcasts_like_numpy() {
    let (a, b) = (pattern(2 * 3 * 4), pattern(5 * 4 * 2));
    let (shape, got) = eval1(
        "MatMul",
        vec![],
        &[act(&[2, 1, 3, 4], a.clone()), act(&[5, 4, 2], b.clone())],
    );
    assert_eq!(shape, vec![2, 5, 3, 2]);
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..5 {
            for r in 0..3 {
                for c in 0..2 {
                    want.push(
                        (0..4)
                            .map(|k| a[(i * 3 + r) * 4 + k] * b[(j * 4 + k) * 2 + c])
                            .sum(),
                    );
                }
            }
        }
    }
    assert_close(&got, &want, 1e-5);
    // A weight matrix on the right of a sequence (a Linear layer): one 2-D product.
    let (shape, got) = eval1(
        "MatMul",
        vec![],
        &[
            act(&[2, 3, 4], a.clone()),
            floats(&[4, 1], vec![1., 0., 0., 1.]),
        ],
    );
    assert_eq!(shape, vec![2, 3, 1]);
    assert_eq!(
        got,
        (0..6).map(|r| a[r * 4] + a[r * 4 + 3]).collect::<Vec<_>>()
    );
}

// ----------------------------------------------------------------------------------- norms

#[test]
fn batch_normalization_uses_the_running_statistics() {
    let x = vec![1., 2., 3., 4.];
    let (shape, got) = eval1(
        "BatchNormalization",
        vec![("epsilon", Attr::Float(0.0))],
        &[
            act(&[1, 2, 2, 1], x),
            floats(&[2], vec![2., 1.]),
            floats(&[2], vec![0.5, -1.]),
            floats(&[2], vec![1., 3.]),
            floats(&[2], vec![4., 1.]),
        ],
    );
    // Channel 0: 2(x − 1)/2 + 0.5; channel 1: (x − 3) − 1.
    assert_eq!((shape, got), (vec![1, 2, 2, 1], vec![0.5, 1.5, -1., 0.]));
}

#[test]
fn layer_normalization_over_the_last_axes() {
    let x = vec![1., 2., 3., 4., 10., 10., 10., 14.];
    let (_, got) = eval1(
        "LayerNormalization",
        vec![("axis", Attr::Int(-2)), ("epsilon", Attr::Float(0.0))],
        &[
            act(&[2, 2, 2], x.clone()),
            floats(&[2, 2], vec![1., 2., 1., 1.]),
            floats(&[2], vec![0., 1.]),
        ],
    );
    let mut want = Vec::new();
    for row in x.chunks(4) {
        let mean = row.iter().sum::<f32>() / 4.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
        let scale = [1., 2., 1., 1.];
        let bias = [0., 1., 0., 1.];
        want.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| (v - mean) / var.sqrt() * scale[i] + bias[i]),
        );
    }
    assert_close(&got, &want, 1e-5);
}

// ------------------------------------------------------------------------------ activations

#[test]
fn activations_against_closed_forms() {
    let x = vec![-3.0f32, -1.0, -0.25, 0.0, 0.5, 1.0, 4.0];
    let run = |op: &str, attrs: Vec<(&str, Attr)>| eval1(op, attrs, &[act(&[7], x.clone())]).1;
    let map = |f: fn(f32) -> f32| x.iter().map(|&v| f(v)).collect::<Vec<_>>();
    assert_close(&run("Relu", vec![]), &map(|v| v.max(0.0)), 1e-6);
    assert_close(
        &run("LeakyRelu", vec![("alpha", Attr::Float(0.2))]),
        &map(|v| if v > 0.0 { v } else { 0.2 * v }),
        1e-6,
    );
    assert_close(
        &run("Sigmoid", vec![]),
        &map(|v| 1.0 / (1.0 + (-v).exp())),
        1e-6,
    );
    assert_close(
        &run("Softplus", vec![]),
        &map(|v| (1.0 + v.exp()).ln()),
        1e-6,
    );
    assert_close(
        &run("Elu", vec![]),
        &map(|v| if v > 0.0 { v } else { v.exp() - 1.0 }),
        1e-6,
    );
    assert_close(
        &run("HardSigmoid", vec![]),
        &map(|v| (0.2 * v + 0.5).clamp(0.0, 1.0)),
        1e-6,
    );
    assert_close(
        &run("HardSwish", vec![]),
        &map(|v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        1e-6,
    );
    let tanh_gelu = |v: f32| {
        0.5 * v * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
    };
    assert_close(
        &run("Gelu", vec![("approximate", Attr::String("tanh".into()))]),
        &map(tanh_gelu),
        1e-5,
    );
    // GELU(x) = x Φ(x), from tabulated Φ: Φ(−3), Φ(−1), Φ(−0.25), Φ(0), Φ(0.5), Φ(1), Φ(4).
    let phi = [
        0.001_349_898,
        0.15865525,
        0.40129367,
        0.5,
        0.69146246,
        0.841_344_8,
        0.99996833,
    ];
    let want: Vec<f32> = x.iter().zip(phi).map(|(v, p)| v * p).collect();
    assert_close(&run("Gelu", vec![]), &want, 1e-5);
    // erf(x) = 2Φ(x√2) − 1.
    let (_, erf) = eval1(
        "Erf",
        vec![],
        &[act(&[3], vec![-1.0 / 2f32.sqrt(), 0.0, 1.0 / 2f32.sqrt()])],
    );
    assert_close(
        &erf,
        &[2.0 * 0.15865525 - 1.0, 0.0, 2.0 * 0.841_344_8 - 1.0],
        1e-5,
    );
    let clip = eval1(
        "Clip",
        vec![],
        &[act(&[7], x.clone()), floats(&[], vec![-1.0]), In::Absent],
    )
    .1;
    assert_close(&clip, &map(|v| v.max(-1.0)), 0.0);
    let clip = eval1(
        "Clip",
        vec![("min", Attr::Float(0.0)), ("max", Attr::Float(1.0))],
        &[act(&[7], x.clone())],
    )
    .1;
    assert_close(&clip, &map(|v| v.clamp(0.0, 1.0)), 0.0);
    let pow = eval1(
        "Pow",
        vec![],
        &[act(&[7], x.clone()), floats(&[], vec![3.0])],
    )
    .1;
    assert_close(&pow, &map(|v| v * v * v), 1e-6);
    let prelu = eval1(
        "PRelu",
        vec![],
        &[
            act(&[1, 2, 2], vec![-1., 2., -3., 4.]),
            floats(&[2, 1], vec![0.5, 0.1]),
        ],
    )
    .1;
    assert_close(&prelu, &[-0.5, 2., -0.3, 4.], 1e-6);
}

/// Softplus and Elu stay finite, with finite gradients, far from 0.
#[test]
fn softplus_and_elu_are_stable_for_large_inputs() {
    type B = Autodiff<Flex>;
    for op in ["Softplus", "Elu"] {
        let x = vec![-200.0f32, -90.0, 90.0, 200.0];
        let t = canonical::<B>(&[4], &x).require_grad();
        let y = eval_on::<B>(op, vec![], &[act(&[4], x.clone())], 1, vec![t.clone()])
            .unwrap()
            .remove(0)
            .1;
        let g: Vec<f32> = t
            .grad(&y.clone().sum().backward())
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        let y: Vec<f32> = y.into_data().to_vec().unwrap();
        assert!(
            y.iter().chain(&g).all(|v| v.is_finite()),
            "{op}: {y:?} {g:?}"
        );
        assert_close(&y[2..], &[90.0, 200.0], 1e-6);
        assert_close(&g, &[0.0, 0.0, 1.0, 1.0], 1e-6);
    }
}

// ---------------------------------------------------------------------------------- layout

#[test]
fn slice_clamps_and_steps_backwards() {
    let x: Vec<f32> = (0..10).map(|v| v as f32).collect();
    // Python's x[-2::-3]: from 8 down to the start.
    let (shape, got) = eval1(
        "Slice",
        vec![],
        &[
            act(&[10], x.clone()),
            ints(&[-2]),
            ints(&[i64::MIN + 1]),
            ints(&[0]),
            ints(&[-3]),
        ],
    );
    assert_eq!((shape, got), (vec![3], vec![8., 5., 2.]));
    // An end past the dimension is clamped; axes given, other axes whole.
    let (shape, got) = eval1(
        "Slice",
        vec![],
        &[
            act(&[2, 5], x),
            ints(&[1]),
            ints(&[i64::MAX]),
            ints(&[1]),
            ints(&[2]),
        ],
    );
    assert_eq!((shape, got), (vec![2, 2], vec![1., 3., 6., 8.]));
}

#[test]
fn gather_split_transpose_concat_expand() {
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    // A scalar index drops the axis (x[:, 0] of a token sequence).
    let g = eval1(
        "Gather",
        vec![("axis", Attr::Int(1))],
        &[
            act(&[2, 3], x.clone()),
            In::Host(HostTensor::int(vec![], vec![Sym::fixed(-3)])),
        ],
    );
    assert_eq!(g, (vec![2], vec![0., 3.]));
    let g = eval1(
        "Gather",
        vec![("axis", Attr::Int(1))],
        &[act(&[2, 3], x.clone()), ints(&[2, 0])],
    );
    assert_eq!(g, (vec![2, 2], vec![2., 0., 5., 3.]));
    let s = eval(
        "Split",
        vec![("axis", Attr::Int(1))],
        &[act(&[2, 3], x.clone()), ints(&[1, 2])],
        2,
    )
    .unwrap();
    assert_eq!(
        s,
        vec![
            (vec![2, 1], vec![0., 3.]),
            (vec![2, 2], vec![1., 2., 4., 5.])
        ]
    );
    let t = eval1(
        "Transpose",
        vec![("perm", ints_attr(&[1, 0]))],
        &[act(&[2, 3], x.clone())],
    );
    assert_eq!(t, (vec![3, 2], vec![0., 3., 1., 4., 2., 5.]));
    let c = eval1(
        "Concat",
        vec![("axis", Attr::Int(-1))],
        &[act(&[2, 3], x.clone()), floats(&[2, 1], vec![9., 9.])],
    );
    assert_eq!(c, (vec![2, 4], vec![0., 1., 2., 9., 3., 4., 5., 9.]));
    let e = eval1(
        "Expand",
        vec![],
        &[act(&[3, 1], vec![1., 2., 3.]), ints(&[2, 1, 2])],
    );
    assert_eq!(
        e,
        (
            vec![2, 3, 2],
            vec![1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.]
        )
    );
    let r = eval1(
        "Unsqueeze",
        vec![],
        &[act(&[2, 3], x.clone()), ints(&[0, -1])],
    );
    assert_eq!(r.0, vec![1, 2, 3, 1]);
    let r = eval1(
        "Squeeze",
        vec![],
        &[act(&[1, 2, 1, 3], x.clone()), ints(&[2])],
    );
    assert_eq!(r.0, vec![1, 2, 3]);
    let r = eval1(
        "Flatten",
        vec![("axis", Attr::Int(2))],
        &[act(&[1, 2, 1, 3], x)],
    );
    assert_eq!(r.0, vec![2, 3]);
}

#[test]
fn reductions_and_softmax() {
    let x = vec![1., 2., 3., 4., 5., 6.];
    let r = eval1(
        "ReduceMean",
        vec![("keepdims", Attr::Int(0))],
        &[act(&[2, 3], x.clone()), ints(&[1])],
    );
    assert_eq!(r, (vec![2], vec![2., 5.]));
    let r = eval1("ReduceSum", vec![], &[act(&[2, 3], x.clone()), ints(&[0])]);
    assert_eq!(r, (vec![1, 3], vec![5., 7., 9.]));
    let r = eval1(
        "ReduceMean",
        vec![("axes", ints_attr(&[0, 1]))],
        &[act(&[2, 3], x.clone())],
    );
    assert_eq!(r, (vec![1, 1], vec![3.5]));
    let (_, s) = eval1(
        "Softmax",
        vec![("axis", Attr::Int(0))],
        &[act(&[2, 3], x.clone())],
    );
    let p = 1.0 / (1.0 + 3f32.exp());
    assert_close(&s, &[p, p, p, 1.0 - p, 1.0 - p, 1.0 - p], 1e-6);
    let (_, l) = eval1("LogSoftmax", vec![], &[act(&[1, 2], vec![0.0, 0.0])]);
    assert_close(&l, &[-std::f32::consts::LN_2; 2], 1e-6);
}

// ------------------------------------------------------------------------------- folding

/// `x.view(x.size(0), -1)` as PyTorch exports it: Shape, Gather, Unsqueeze, Concat, Reshape.
/// Everything but the Reshape folds at load time, the target to `[N, -1]`, resolved to
/// `[N, 16]`.
#[test]
fn shape_arithmetic_folds_with_the_batch_symbol() {
    let mut c = Compiler::new(17);
    let n = Sym::batch();
    c.values.insert(
        "x".into(),
        Meta::Act(0, vec![n, Sym::fixed(4), Sym::fixed(2), Sym::fixed(2)]),
    );
    c.slots = 1;
    let host = |t: HostTensor| Meta::Host(Rc::new(t));
    c.values.insert(
        "zero".into(),
        host(HostTensor::int(vec![], vec![Sym::fixed(0)])),
    );
    c.values.insert("axes".into(), host(HostTensor::ints(&[0])));
    c.values
        .insert("minus1".into(), host(HostTensor::ints(&[-1])));
    let node = |op: &str, inputs: &[&str], out: &str, attrs: Vec<(&str, Attr)>| Node {
        op_type: op.into(),
        domain: String::new(),
        name: format!("/{op}"),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: vec![out.into()],
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    for nd in [
        node("Shape", &["x"], "shape", vec![]),
        node(
            "Gather",
            &["shape", "zero"],
            "batch",
            vec![("axis", Attr::Int(0))],
        ),
        node("Unsqueeze", &["batch", "axes"], "batch1", vec![]),
        node(
            "Concat",
            &["batch1", "minus1"],
            "target",
            vec![("axis", Attr::Int(0))],
        ),
        node("Reshape", &["x", "target"], "y", vec![]),
    ] {
        c.node(&nd).unwrap();
    }
    assert_eq!(
        c.steps.len(),
        1,
        "only the Reshape runs in the forward pass"
    );
    match &c.values["target"] {
        Meta::Host(t) => assert_eq!(t.to_syms().unwrap(), vec![n, Sym::fixed(-1)]),
        m => panic!("the target did not fold: {m:?}"),
    }
    match &c.values["y"] {
        Meta::Act(_, shape) => assert_eq!(shape, &vec![n, Sym::fixed(16)]),
        m => panic!("{m:?}"),
    }
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    // Channels that do not match the weights, a non-constant Reshape target, a bad axis.
    assert!(eval(
        "Conv",
        vec![],
        &[
            act(&[1, 3, 4, 4], pattern(48)),
            floats(&[2, 2, 1, 1], pattern(4))
        ],
        1
    )
    .is_err());
    assert!(eval(
        "Reshape",
        vec![],
        &[act(&[2, 2], pattern(4)), act(&[2], vec![4., 1.])],
        1
    )
    .is_err());
    assert!(eval(
        "Softmax",
        vec![("axis", Attr::Int(5))],
        &[act(&[2, 2], pattern(4))],
        1
    )
    .is_err());
    assert!(eval(
        "MatMul",
        vec![],
        &[act(&[2, 3], pattern(6)), act(&[2, 3], pattern(6))],
        1
    )
    .is_err());
    assert!(eval(
        "Pad",
        vec![("mode", Attr::String("wrap".into()))],
        &[act(&[2, 2], pattern(4)), ints(&[1, 1, 1, 1])],
        1
    )
    .is_err());
    assert!(eval(
        "Equal",
        vec![],
        &[act(&[2], pattern(2)), act(&[2], pattern(2))],
        1
    )
    .is_err());
}

// ------------------------------------------------------------------------------- tangents

/// One node's tangent rule against reverse mode through its forward pass: with every
/// activation input varying along a fixed direction v and a fixed weighting u of the outputs,
/// Σ u · (J v) from forward mode must equal Σ (Jᵀ u) · v from burn's autodiff. The rule sees
/// only what `Op::tangent_reads` declares (it panics on reading anything else), so the
/// declarations are checked too. Returns Σ u · J v, for tests that check it against a value.
fn check_tangent(op: &str, attrs: Vec<(&str, Attr)>, inputs: &[In], outputs: usize) -> f64 {
    type B = Autodiff<Flex>;
    let (c, act_slots) =
        compile_node(op, attrs, inputs, outputs).unwrap_or_else(|e| panic!("{op}: {e}"));
    let device = Default::default();
    let consts: Vec<Tensor<B, MAX_RANK>> = c.consts.iter().map(|t| upload(t, &device)).collect();
    let mut slots: Vec<Option<Tensor<B, MAX_RANK>>> = vec![None; c.slots];
    let mut tangents: Vec<Option<Tensor<B, MAX_RANK>>> = vec![None; c.slots];
    let mut leaves = Vec::new();
    let mut seed = 0usize;
    let mut direction = |len: usize| -> Vec<f32> {
        seed += 1;
        (0..len)
            .map(|i| ((0.37 * (i + 11 * seed) as f64).sin() * 1.3) as f32)
            .collect()
    };
    for (slot, input) in act_slots.iter().zip(inputs.iter().filter_map(|i| match i {
        In::Act(s, v) => Some((s, v)),
        _ => None,
    })) {
        let x = canonical::<B>(input.0, input.1).require_grad();
        let v = canonical::<B>(input.0, &direction(input.1.len()));
        slots[*slot] = Some(x.clone());
        tangents[*slot] = Some(v.clone());
        leaves.push((x, v));
    }
    for step in &c.steps {
        let ins: Vec<Tensor<B, MAX_RANK>> = step
            .inputs
            .iter()
            .map(|o| match o {
                Operand::Slot(i) => slots[*i].clone().unwrap(),
                Operand::Const(i) => consts[*i].clone(),
            })
            .collect();
        let varying: Vec<bool> = step
            .inputs
            .iter()
            .map(|o| matches!(o, Operand::Slot(i) if tangents[*i].is_some()))
            .collect();
        let ts = step
            .inputs
            .iter()
            .map(|o| match o {
                Operand::Slot(i) => tangents[*i].clone(),
                Operand::Const(_) => None,
            })
            .collect();
        let reads = step.op.tangent_reads(&varying);
        let shapes: Vec<[usize; MAX_RANK]> =
            step.shapes.iter().map(|s| s.map(|d| d.dim(1))).collect();
        let mut primal = super::Primal {
            inputs: ins
                .iter()
                .zip(&reads.inputs)
                .map(|(t, &r)| r.then(|| t.clone().detach()))
                .collect(),
            output: None,
        };
        let ys = super::run(&step.op, ins, &shapes);
        primal.output = reads.output.then(|| ys[0].clone().detach());
        let tys = super::tangent(&step.op, &primal, ts, &shapes);
        assert_eq!(tys.len(), ys.len());
        for ((slot, y), t) in step.outputs.iter().zip(ys).zip(tys) {
            let t = t.expect("every output of a step on varying inputs has a tangent");
            assert_eq!(t.dims(), y.dims(), "{op}: tangent and output shapes");
            slots[*slot] = Some(y);
            tangents[*slot] = Some(t);
        }
    }
    let (mut forward, mut objective) = (0f64, None::<Tensor<B, 1>>);
    for i in 0..outputs {
        let Meta::Act(slot, _) = &c.values[&format!("out{i}")] else {
            panic!("{op}: output {i} folded")
        };
        let y = slots[*slot].clone().unwrap();
        let u = Tensor::<B, MAX_RANK>::from_data(
            TensorData::new(direction(y.dims().iter().product()), y.dims()),
            &device,
        );
        let t = tangents[*slot].clone().unwrap();
        forward += (t.inner() * u.clone().inner()).sum().into_scalar() as f64;
        let term = (y * u).sum();
        objective = Some(match objective {
            Some(o) => o + term,
            None => term,
        });
    }
    let grads = objective.unwrap().backward();
    let reverse: f64 = leaves
        .iter()
        .map(|(x, v)| {
            let g = x
                .grad(&grads)
                .expect("every activation input reaches an output");
            (g * v.clone().inner()).sum().into_scalar() as f64
        })
        .sum();
    assert!(
        (forward - reverse).abs() <= 1e-5 * (1.0 + reverse.abs()),
        "{op}: forward mode u·Jv = {forward}, reverse mode Jᵀu·v = {reverse}"
    );
    forward
}

/// Values spread over (−2.6, 2.6), none at a kink of the activations (0, ±3, ±1/2, …) and
/// no two equal (max-pooling picks one element per window).
fn spread(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 41) as f32 / 8.0 - 2.53 + i as f32 * 1e-3)
        .collect()
}

#[test]
fn unary_tangents_match_reverse_mode() {
    let x = spread(24);
    let positive: Vec<f32> = x.iter().map(|v| v.abs() + 0.3).collect();
    let shape = [2, 3, 4];
    for (op, attrs) in [
        ("Relu", vec![]),
        ("LeakyRelu", vec![("alpha", Attr::Float(0.2))]),
        ("Sigmoid", vec![]),
        ("Tanh", vec![]),
        ("Softplus", vec![]),
        ("Elu", vec![("alpha", Attr::Float(0.7))]),
        ("HardSigmoid", vec![]),
        ("HardSwish", vec![]),
        ("Gelu", vec![]),
        ("Gelu", vec![("approximate", Attr::String("tanh".into()))]),
        ("Erf", vec![]),
        ("Exp", vec![]),
        ("Neg", vec![]),
        ("Abs", vec![]),
        (
            "Clip",
            vec![("min", Attr::Float(-1.1)), ("max", Attr::Float(0.9))],
        ),
    ] {
        check_tangent(op, attrs, &[act(&shape, x.clone())], 1);
    }
    // HardSwish's middle and outer pieces: inputs beyond ±3.
    let wide: Vec<f32> = x.iter().map(|v| v * 1.9).collect();
    check_tangent("HardSwish", vec![], &[act(&shape, wide.clone())], 1);
    check_tangent("HardSigmoid", vec![], &[act(&shape, wide)], 1);
    for op in ["Sqrt", "Log", "Reciprocal"] {
        check_tangent(op, vec![], &[act(&shape, positive.clone())], 1);
    }
    check_tangent(
        "Clip",
        vec![],
        &[act(&shape, x.clone()), In::Absent, floats(&[], vec![0.4])],
        1,
    );
    for p in [1.0f32, 2.0, 3.0, -1.0, 0.5, 1.7] {
        let base = if p.fract() == 0.0 { &x } else { &positive };
        check_tangent(
            "Pow",
            vec![],
            &[act(&shape, base.clone()), floats(&[], vec![p])],
            1,
        );
    }
}

#[test]
fn binary_tangents_match_reverse_mode() {
    let a = spread(24);
    let b: Vec<f32> = spread(12).iter().map(|v| v * 0.7 + 3.1).collect();
    for op in ["Add", "Sub", "Mul", "Div"] {
        // Both varying, broadcast both ways; and a varying by a constant, and the other way.
        check_tangent(
            op,
            vec![],
            &[act(&[2, 3, 4], a.clone()), act(&[3, 4], b.clone())],
            1,
        );
        check_tangent(
            op,
            vec![],
            &[
                act(&[2, 1, 4], a[..8].to_vec()),
                act(&[3, 1], b[..3].to_vec()),
            ],
            1,
        );
        check_tangent(
            op,
            vec![],
            &[act(&[2, 3, 4], a.clone()), floats(&[3, 4], b.clone())],
            1,
        );
        check_tangent(
            op,
            vec![],
            &[floats(&[3, 4], b.clone()), act(&[2, 3, 4], a.clone())],
            1,
        );
    }
    let slope = floats(&[3, 1], vec![0.1, -0.3, 0.5]);
    check_tangent("PRelu", vec![], &[act(&[2, 3, 4], a.clone()), slope], 1);
    check_tangent(
        "PRelu",
        vec![],
        &[
            act(&[2, 3, 4], a.clone()),
            act(&[3, 1], vec![0.1, -0.3, 0.5]),
        ],
        1,
    );
}

#[test]
fn linear_and_normalisation_tangents_match_reverse_mode() {
    // Conv: input and weights both varying, with groups, stride, dilation and asymmetric pads;
    // then the usual constant weights with a varying bias.
    let attrs = || {
        vec![
            ("group", Attr::Int(2)),
            ("strides", ints_attr(&[2, 1])),
            ("dilations", ints_attr(&[1, 2])),
            ("pads", ints_attr(&[1, 0, 0, 2])),
        ]
    };
    let x = act(&[2, 4, 6, 5], spread(240));
    check_tangent(
        "Conv",
        attrs(),
        &[x, act(&[6, 2, 3, 2], spread(72)), act(&[6], spread(6))],
        1,
    );
    let x = act(&[2, 4, 6, 5], spread(240));
    check_tangent(
        "Conv",
        attrs(),
        &[x, floats(&[6, 2, 3, 2], spread(72)), act(&[6], spread(6))],
        1,
    );
    // Gemm with transposes, alpha, beta and a varying C; MatMul batched and by a constant.
    let gemm = vec![
        ("transA", Attr::Int(1)),
        ("transB", Attr::Int(1)),
        ("alpha", Attr::Float(0.7)),
        ("beta", Attr::Float(-1.3)),
    ];
    check_tangent(
        "Gemm",
        gemm,
        &[
            act(&[4, 3], spread(12)),
            act(&[5, 4], spread(20)),
            act(&[5], spread(5)),
        ],
        1,
    );
    check_tangent(
        "Gemm",
        vec![],
        &[act(&[3, 4], spread(12)), floats(&[4, 5], spread(20))],
        1,
    );
    check_tangent(
        "MatMul",
        vec![],
        &[act(&[2, 1, 3, 4], spread(24)), act(&[3, 4, 2], spread(24))],
        1,
    );
    check_tangent(
        "MatMul",
        vec![],
        &[act(&[2, 3, 4], spread(24)), floats(&[4, 2], spread(8))],
        1,
    );
    // BatchNormalization (constant statistics) and LayerNormalization (varying scale too).
    let c = |v: Vec<f32>| floats(&[3], v);
    check_tangent(
        "BatchNormalization",
        vec![],
        &[
            act(&[2, 3, 2, 2], spread(24)),
            c(vec![0.5, 1.5, -1.0]),
            c(vec![0.1, 0.2, 0.3]),
            c(vec![0.3, -0.2, 0.0]),
            c(vec![0.5, 2.0, 1.0]),
        ],
        1,
    );
    check_tangent(
        "LayerNormalization",
        vec![("axis", Attr::Int(-2))],
        &[
            act(&[2, 3, 4], spread(24)),
            floats(&[3, 4], spread(12)),
            floats(&[4], spread(4)),
        ],
        1,
    );
    check_tangent(
        "LayerNormalization",
        vec![],
        &[
            act(&[2, 3, 4], spread(24)),
            act(&[4], spread(4)),
            act(&[4], spread(4)),
        ],
        1,
    );
}

#[test]
fn pooling_reduction_and_softmax_tangents_match_reverse_mode() {
    let x = || act(&[2, 3, 7, 6], spread(252));
    let pool = |ceil: i64| {
        vec![
            ("kernel_shape", ints_attr(&[3, 2])),
            ("strides", ints_attr(&[2, 2])),
            ("dilations", ints_attr(&[1, 2])),
            ("pads", ints_attr(&[1, 1, 1, 0])),
            ("ceil_mode", Attr::Int(ceil)),
        ]
    };
    for ceil in [0, 1] {
        check_tangent("MaxPool", pool(ceil), &[x()], 1);
        let mut avg = pool(ceil);
        avg.push(("count_include_pad", Attr::Int(1 - ceil)));
        check_tangent("AveragePool", avg, &[x()], 1);
    }
    check_tangent("GlobalAveragePool", vec![], &[x()], 1);
    check_tangent(
        "ReduceMean",
        vec![],
        &[act(&[2, 3, 4], spread(24)), ints(&[1, -1])],
        1,
    );
    check_tangent(
        "ReduceSum",
        vec![("keepdims", Attr::Int(0))],
        &[act(&[2, 3, 4], spread(24)), ints(&[0])],
        1,
    );
    for op in ["Softmax", "LogSoftmax"] {
        for axis in [1, -1] {
            check_tangent(
                op,
                vec![("axis", Attr::Int(axis))],
                &[act(&[2, 3, 4], spread(24))],
                1,
            );
        }
    }
}

#[test]
fn layout_tangents_match_reverse_mode() {
    let x = || act(&[2, 3, 4], spread(24));
    check_tangent("Reshape", vec![], &[x(), ints(&[4, -1])], 1);
    check_tangent("Flatten", vec![("axis", Attr::Int(2))], &[x()], 1);
    check_tangent(
        "Transpose",
        vec![("perm", ints_attr(&[2, 0, 1]))],
        &[x()],
        1,
    );
    check_tangent(
        "Squeeze",
        vec![],
        &[act(&[2, 1, 4], spread(8)), ints(&[1])],
        1,
    );
    check_tangent("Unsqueeze", vec![], &[x(), ints(&[0, 3])], 1);
    // A constant among the parts (a class token) has no tangent: zeros in its place.
    check_tangent(
        "Concat",
        vec![("axis", Attr::Int(1))],
        &[
            floats(&[2, 1, 4], spread(8)),
            x(),
            act(&[2, 2, 4], spread(16)),
        ],
        1,
    );
    for (mode, value) in [("constant", Some(1.5)), ("reflect", None), ("edge", None)] {
        let mut inputs = vec![x(), ints(&[0, 1, -1, 0, 2, 1])];
        if let Some(v) = value {
            inputs.push(floats(&[], vec![v]));
        }
        check_tangent("Pad", vec![("mode", Attr::String(mode.into()))], &inputs, 1);
    }
    check_tangent(
        "Slice",
        vec![],
        &[
            x(),
            ints(&[3, 2]),
            ints(&[0, 0]),
            ints(&[2, 1]),
            ints(&[-2, -1]),
        ],
        1,
    );
    check_tangent(
        "Gather",
        vec![("axis", Attr::Int(2))],
        &[x(), ints(&[3, 0, 3])],
        1,
    );
    check_tangent(
        "Gather",
        vec![("axis", Attr::Int(1))],
        &[x(), ints(&[1, 2])],
        1,
    );
    check_tangent(
        "Split",
        vec![("axis", Attr::Int(2))],
        &[x(), ints(&[1, 3])],
        2,
    );
    check_tangent(
        "Expand",
        vec![],
        &[act(&[3, 1], spread(3)), ints(&[2, 3, 4])],
        1,
    );
}

/// The tangent rules see through a kink as the forward pass's gradient does: ReLU's slope at
/// 0 is 0, a max-pool tie goes to the earlier element; and a piecewise-linear rule gives the
/// exact directional derivative away from kinks (a closed-form value).
#[test]
fn tangents_at_kinks_follow_the_gradient() {
    // u and v are fixed sin patterns: u·Jv = Σ u_i v_i over the ReLU inputs > 0.
    let got = check_tangent("Relu", vec![], &[act(&[4], vec![-1.0, 0.0, 2.0, 3.0])], 1);
    let (v, u): (Vec<f64>, Vec<f64>) = (
        (0..4)
            .map(|i| (0.37 * (i + 11) as f64).sin() * 1.3)
            .collect(),
        (0..4)
            .map(|i| (0.37 * (i + 22) as f64).sin() * 1.3)
            .collect(),
    );
    let want: f64 = (2..4).map(|i| u[i] * v[i]).sum();
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    check_tangent(
        "MaxPool",
        vec![("kernel_shape", ints_attr(&[2, 2]))],
        &[act(&[1, 1, 2, 2], vec![1.0, 1.0, 0.5, 1.0])],
        1,
    );
}
