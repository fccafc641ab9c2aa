//! The fixture networks of tests/fixtures/onnx (made by make_fixtures.py) against PyTorch:
//! logits, the input gradients of the summed cross-entropy and of the summed LogSumExp (burn's
//! Autodiff<Flex>), and a Hessian-vector product of the LogSumExp (double backprop, through
//! Autodiff<Autodiff<Flex>>), each within a relative difference of the reference's max-abs.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::log_sum_exp;
use jem_onnx::{Normalisation, OnnxModel, OnnxNetwork};
use safetensors::SafeTensors;

type Ad = Autodiff<Flex>;
type Ad2 = Autodiff<Ad>;

/// The bound on every comparison, relative to the reference's largest magnitude.
const TOL: f32 = 1e-4;

fn fixture(name: &str, ext: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(format!("{name}.{ext}"))
}

/// The references of one fixture network.
struct Refs {
    x: (Vec<f32>, [usize; 4]),
    y: Vec<i64>,
    logits: Vec<f32>,
    grad_ce: Vec<f32>,
    grad_lse: Vec<f32>,
    hvp_lse: Vec<f32>,
    normalisation: Option<Normalisation>,
}

fn refs(name: &str) -> Refs {
    let bytes = std::fs::read(fixture(name, "safetensors")).expect("fixture references");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let get = |k: &str| -> Option<(Vec<f32>, Vec<usize>)> {
        let t = st.tensor(k).ok()?;
        let v = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Some((v, t.shape().to_vec()))
    };
    let (x, xs) = get("x").unwrap();
    let normalisation = get("mean").map(|(mean, _)| Normalisation {
        mean,
        std: get("std").unwrap().0,
    });
    Refs {
        x: (x, [xs[0], xs[1], xs[2], xs[3]]),
        y: get("y").unwrap().0.iter().map(|&v| v as i64).collect(),
        logits: get("logits").unwrap().0,
        grad_ce: get("grad_ce").unwrap().0,
        grad_lse: get("grad_lse").unwrap().0,
        hvp_lse: get("hvp_lse").unwrap().0,
        normalisation,
    }
}

/// max |a − b| / max |b|.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(f32::MIN_POSITIVE)
}

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Summed cross-entropy of logits against labels.
fn cross_entropy<B: burn::tensor::backend::Backend>(
    logits: Tensor<B, 2>,
    y: &[i64],
) -> Tensor<B, 1> {
    let n = y.len();
    let labels =
        Tensor::<B, 2, Int>::from_data(TensorData::new(y.to_vec(), [n, 1]), &logits.device());
    let picked = logits.clone().gather(1, labels).reshape([n]);
    (log_sum_exp(logits) - picked).sum()
}

fn network<B: burn::tensor::backend::Backend>(name: &str, r: &Refs) -> OnnxNetwork<B> {
    let graph = OnnxModel::load(fixture(name, "onnx")).unwrap_or_else(|e| panic!("{e}"));
    OnnxNetwork::<B>::new(graph, &Default::default())
        .with_normalisation(r.normalisation.clone())
        .unwrap()
}

/// Logits and both input gradients against PyTorch.
fn first_order(name: &str) {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let device = Default::default();
    let x = || {
        Tensor::<Ad, 4>::from_data(TensorData::new(r.x.0.clone(), r.x.1), &device).require_grad()
    };

    let x1 = x();
    let logits = net.logits(x1.clone());
    let d_logits = rel(&values(logits.clone()), &r.logits);
    let g_ce = values(x1.grad(&cross_entropy(logits, &r.y).backward()).unwrap());
    let d_ce = rel(&g_ce, &r.grad_ce);

    let x2 = x();
    let g_lse = values(
        x2.grad(&log_sum_exp(net.logits(x2.clone())).sum().backward())
            .unwrap(),
    );
    let d_lse = rel(&g_lse, &r.grad_lse);

    println!("{name}: relative difference logits {d_logits:.2e}, grad CE {d_ce:.2e}, grad LSE {d_lse:.2e}");
    assert!(d_logits < TOL, "{name}: logits differ by {d_logits:e}");
    assert!(
        d_ce < TOL,
        "{name}: cross-entropy gradient differs by {d_ce:e}"
    );
    assert!(
        d_lse < TOL,
        "{name}: LogSumExp gradient differs by {d_lse:e}"
    );
}

/// d/dx ⟨∇ₓ Σ LSE(f(x)), v⟩ through nested autodiff, against PyTorch's double backward.
fn second_order(name: &str) {
    let r = refs(name);
    let net = network::<Ad2>(name, &r);
    let device = Default::default();
    let n: usize = r.x.1.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (0.61 * i as f64).cos() as f32).collect();
    let x_in =
        Tensor::<Ad, 4>::from_data(TensorData::new(r.x.0.clone(), r.x.1), &device).require_grad();
    let x_out = Tensor::<Ad2, 4>::from_inner(x_in.clone()).require_grad();
    let lse = log_sum_exp(net.logits(x_out.clone())).sum();
    let g = x_out.grad(&lse.backward()).unwrap();
    let v = Tensor::<Ad, 4>::from_data(TensorData::new(v, r.x.1), &device);
    let hvp = values(x_in.grad(&(g * v).sum().backward()).unwrap());
    let d = rel(&hvp, &r.hvp_lse);
    println!("{name}: relative difference Hessian-vector product {d:.2e}");
    assert!(d < TOL, "{name}: Hessian-vector product differs by {d:e}");
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {
        mod first_order {
            $(#[test] fn $name() { super::first_order(stringify!($name)); })*
        }
        mod second_order {
            $(#[test] fn $name() { super::second_order(stringify!($name)); })*
        }
    };
}

fixture_tests!(
    preact_resnet18,
    resnet18_cifar,
    wrn16_robustbench,
    wrn16_dm_swish,
    small_cnn_mnist,
    vit_tiny,
    jem_wrn,
);
