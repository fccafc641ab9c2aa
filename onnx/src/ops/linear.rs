//! Gemm (alpha, beta, transA, transB, broadcast C) and MatMul (2-D and batched, with numpy
//! broadcasting of the batch dimensions).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::Op;
use crate::compile::{Arg, Compiled, Cx, Res, MAX_RANK};
use crate::sym;

/// Gemm's settings: `alpha · A' B' + beta · C`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

pub(crate) fn compile(cx: &Cx) -> Res<Compiled> {
    match cx.node.op_type.as_str() {
        "Gemm" => gemm(cx),
        _ => matmul(cx),
    }
}

fn gemm(cx: &Cx) -> Res<Compiled> {
    let (a, b) = (cx.shape(0)?, cx.shape(1)?);
    if a.len() != 2 || b.len() != 2 {
        return Err(format!(
            "Gemm of shapes {} and {}: 2-D expected",
            sym::show(&a),
            sym::show(&b)
        ));
    }
    let g = Gemm {
        alpha: cx.attr_f("alpha", 1.0)?,
        beta: cx.attr_f("beta", 1.0)?,
        trans_a: cx.attr_i("transA", 0)? != 0,
        trans_b: cx.attr_i("transB", 0)? != 0,
    };
    let (m, ka) = if g.trans_a {
        (a[1], a[0])
    } else {
        (a[0], a[1])
    };
    let (kb, n) = if g.trans_b {
        (b[1], b[0])
    } else {
        (b[0], b[1])
    };
    if ka != kb {
        return Err(format!("inner dimensions {ka} and {kb} differ"));
    }
    let out = vec![m, n];
    let mut args = vec![Arg::Input(0), Arg::Input(1)];
    if let Some(c) = cx.input(2) {
        if sym::broadcast(&out, &c.shape()).as_ref() != Some(&out) {
            return Err(format!(
                "C of shape {} does not broadcast to {}",
                sym::show(&c.shape()),
                sym::show(&out)
            ));
        }
        args.push(Arg::Input(2));
    }
    Ok(Compiled::Run {
        op: Op::Gemm(g),
        args,
        shapes: vec![out],
    })
}

fn matmul(cx: &Cx) -> Res<Compiled> {
    let (a, b) = (cx.shape(0)?, cx.shape(1)?);
    if a.len() < 2 || b.len() < 2 {
        return Err(format!(
            "MatMul of shapes {} and {}: 1-D operands are not supported",
            sym::show(&a),
            sym::show(&b)
        ));
    }
    let (ra, rb) = (a.len(), b.len());
    if a[ra - 1] != b[rb - 2] {
        return Err(format!(
            "inner dimensions of {} and {} differ",
            sym::show(&a),
            sym::show(&b)
        ));
    }
    let batch = sym::broadcast(&a[..ra - 2], &b[..rb - 2]).ok_or_else(|| {
        format!(
            "batch dimensions of {} and {} do not broadcast",
            sym::show(&a),
            sym::show(&b)
        )
    })?;
    let mut out = batch;
    out.extend([a[ra - 2], b[rb - 1]]);
    Ok(Compiled::Run {
        op: Op::MatMul,
        args: vec![Arg::Input(0), Arg::Input(1)],
        shapes: vec![out],
    })
}

// ---------------------------------------------------------------------------------- forward

fn to2<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 2> {
    let [_, _, _, r, c] = x.dims();
    x.reshape([r, c])
}

pub(crate) fn run_gemm<B: Backend>(
    a: Tensor<B, 5>,
    b: Tensor<B, 5>,
    c: Option<Tensor<B, 5>>,
    g: &Gemm,
) -> Tensor<B, 5> {
    let (mut a, mut b) = (to2(a), to2(b));
    if g.trans_a {
        a = a.transpose();
    }
    if g.trans_b {
        b = b.transpose();
    }
    let mut y = a.matmul(b);
    if g.alpha != 1.0 {
        y = y.mul_scalar(g.alpha);
    }
    let [m, n] = y.dims();
    let mut y: Tensor<B, 5> = y.reshape([1, 1, 1, m, n]);
    if let Some(c) = c {
        y = if g.beta == 1.0 {
            y + c
        } else {
            y + c.mul_scalar(g.beta)
        };
    }
    y
}

pub(crate) fn run_matmul<B: Backend>(
    a: Tensor<B, 5>,
    b: Tensor<B, 5>,
    out: [usize; MAX_RANK],
) -> Tensor<B, 5> {
    let (da, db) = (a.dims(), b.dims());
    let (m, k, n) = (da[3], da[4], db[4]);
    if db[..3].iter().all(|&d| d == 1) {
        // A matrix on the right (a Linear layer on a sequence): one 2-D product.
        let rows = da[..4].iter().product();
        let b2: Tensor<B, 2> = b.reshape([k, n]);
        return a.reshape([rows, k]).matmul(b2).reshape(out);
    }
    let batch: [usize; 3] = std::array::from_fn(|i| da[i].max(db[i]));
    let a = if da[..3] == batch {
        a
    } else {
        a.expand([batch[0], batch[1], batch[2], m, k])
    };
    let b = if db[..3] == batch {
        b
    } else {
        b.expand([batch[0], batch[1], batch[2], k, n])
    };
    a.matmul(b)
}
