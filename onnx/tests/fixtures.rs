//! The fixture networks of tests/fixtures/onnx (made by make_fixtures.py) against PyTorch, and
//! the forward mode against the network's own values.
//!
//! Against PyTorch, each within a relative difference of the reference's max-abs: the logits,
//! the input gradients of the summed cross-entropy and of the summed LogSumExp (burn's
//! Autodiff<Flex>), the logits' J v by forward mode, a Hessian-vector product of the LogSumExp
//! both by nested autodiff (Autodiff<Autodiff<Flex>>) and by reverse mode over the forward
//! mode (single-level: what the SGLD defence uses), all to 1e-4; and jem-bench's SGLD defence
//! with K = 1 step in 5 chains, `--grad full`, for PyTorch's noise: its chain-averaged logits
//! and the input gradient of their cross-entropy through the step (PyTorch: double backprop),
//! to 1e-3.
//!
//! Forward mode against the network itself: J v against reverse mode and central differences
//! of the logits, the linearisation of a piecewise-linear graph against forward mode, and exact
//! Hessian-vector products against central differences of exact gradients.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{
    log_sum_exp, log_sum_exp_hessian_vector, AttackLoss, GradMode, HessianVector, SgldConfig,
    SgldDefence, SgldDefenceConfig, SgldSampler,
};
use jem_onnx::{Normalisation, OnnxModel, OnnxNetwork};
use safetensors::{Dtype, SafeTensors};

type Ad = Autodiff<Flex>;
type Ad2 = Autodiff<Ad>;

/// The bound on every comparison with PyTorch's values, relative to the reference's largest
/// magnitude.
const TOL: f32 = 1e-4;
/// The bound through the SGLD step (a step of up to 1.5 pixel units amplifies rounding).
const SGLD_TOL: f32 = 1e-3;
/// sgld_noise.safetensors stores standard-normal draws as int8 in units of 1/32.
const NOISE_UNIT: f32 = 1.0 / 32.0;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(name)
}

/// A tensor of a safetensors file as float32 values (uint8 pixels as k / 255, int8 noise in
/// its units), with its shape.
fn read(st: &SafeTensors, key: &str) -> Option<(Vec<f32>, Vec<usize>)> {
    let t = st.tensor(key).ok()?;
    let v = match t.dtype() {
        Dtype::F32 => t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::U8 => t.data().iter().map(|&b| b as f32 / 255.0).collect(),
        Dtype::I8 => t
            .data()
            .iter()
            .map(|&b| b as i8 as f32 * NOISE_UNIT)
            .collect(),
        other => panic!("{key}: unexpected dtype {other:?}"),
    };
    Some((v, t.shape().to_vec()))
}

/// The references of one fixture network.
struct Refs {
    x: (Vec<f32>, [usize; 4]),
    y: Vec<i64>,
    logits: Vec<f32>,
    grad_ce: Vec<f32>,
    grad_lse: Vec<f32>,
    hvp_lse: Vec<f32>,
    jvp_logits: Vec<f32>,
    sgld_logits: Vec<f32>,
    sgld_grad_ce: Vec<f32>,
    /// α, σ, initial noise.
    sgld: [f32; 3],
    sgld_scale: Vec<f32>,
    normalisation: Option<Normalisation>,
}

fn refs(name: &str) -> Refs {
    let bytes = std::fs::read(fixture(&format!("{name}.safetensors"))).expect("fixture references");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let get = |k: &str| read(&st, k).unwrap_or_else(|| panic!("{name}: no {k}"));
    let (x, xs) = get("x_u8");
    let normalisation = read(&st, "mean").map(|(mean, _)| Normalisation {
        mean,
        std: get("std").0,
    });
    let sgld = get("sgld").0;
    Refs {
        x: (x, [xs[0], xs[1], xs[2], xs[3]]),
        y: get("y").0.iter().map(|&v| v as i64).collect(),
        logits: get("logits").0,
        grad_ce: get("grad_ce").0,
        grad_lse: get("grad_lse").0,
        hvp_lse: get("hvp_lse").0,
        jvp_logits: get("jvp_logits").0,
        sgld_logits: get("sgld_logits").0,
        sgld_grad_ce: get("sgld_grad_ce").0,
        sgld: [sgld[0], sgld[1], sgld[2]],
        sgld_scale: get("sgld_scale").0,
        normalisation,
    }
}

/// The SGLD references' initial and step noise for inputs of `[C, H, W]`.
fn sgld_noise(chw: &[usize]) -> [(Vec<f32>, Vec<usize>); 2] {
    let bytes = std::fs::read(fixture("sgld_noise.safetensors")).expect("the SGLD noise");
    let st = SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let key = chw
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x");
    ["init", "step"].map(|kind| {
        read(&st, &format!("{kind}_{key}")).unwrap_or_else(|| panic!("no {kind}_{key} noise"))
    })
}

/// max |a − b| / max |b|.
fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    diff / scale.max(f32::MIN_POSITIVE)
}

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

fn tensor<B: Backend, const D: usize>(v: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), &Default::default())
}

/// Σ_i x_i y_i in f64.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

/// A fixed direction shaped like the inputs: v[i] = cos(0.61 i) over the flat index (the one
/// make_fixtures.py uses for hvp_lse).
fn direction(n: usize) -> Vec<f32> {
    (0..n).map(|i| (0.61 * i as f64).cos() as f32).collect()
}

/// Summed cross-entropy of logits against labels.
fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, y: &[i64]) -> Tensor<B, 1> {
    let n = y.len();
    let labels =
        Tensor::<B, 2, Int>::from_data(TensorData::new(y.to_vec(), [n, 1]), &logits.device());
    let picked = logits.clone().gather(1, labels).reshape([n]);
    (log_sum_exp(logits) - picked).sum()
}

fn network<B: jem_kernels::Kernels>(name: &str, r: &Refs) -> OnnxNetwork<B> {
    let graph = OnnxModel::load(fixture(&format!("{name}.onnx"))).unwrap_or_else(|e| panic!("{e}"));
    OnnxNetwork::<B>::new(graph, &Default::default())
        .with_normalisation(r.normalisation.clone())
        .unwrap()
}

/// Logits and both input gradients against PyTorch.
fn first_order(name: &str) {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let x = || tensor::<Ad, 4>(&r.x.0, r.x.1).require_grad();

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
    let n: usize = r.x.1.iter().product();
    let x_in = tensor::<Ad, 4>(&r.x.0, r.x.1).require_grad();
    let x_out = Tensor::<Ad2, 4>::from_inner(x_in.clone()).require_grad();
    let lse = log_sum_exp(net.logits(x_out.clone())).sum();
    let g = x_out.grad(&lse.backward()).unwrap();
    let v = tensor::<Ad, 4>(&direction(n), r.x.1);
    let hvp = values(x_in.grad(&(g * v).sum().backward()).unwrap());
    let d = rel(&hvp, &r.hvp_lse);
    println!("{name}: relative difference Hessian-vector product (nested autodiff) {d:.2e}");
    assert!(d < TOL, "{name}: Hessian-vector product differs by {d:e}");
}

/// The same Hessian-vector product by reverse mode over the forward mode (single-level
/// autodiff, [`log_sum_exp_hessian_vector`]), against PyTorch's double backward.
fn exact_hessian_vector(name: &str) {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let n: usize = r.x.1.iter().product();
    let hv = log_sum_exp_hessian_vector::<Ad, _>(
        &net,
        tensor(&r.x.0, r.x.1),
        tensor(&direction(n), r.x.1),
    )
    .expect("an ONNX network has a forward mode");
    let d = rel(&values(hv), &r.hvp_lse);
    println!("{name}: relative difference Hessian-vector product (reverse over forward) {d:.2e}");
    assert!(d < TOL, "{name}: Hessian-vector product differs by {d:e}");
}

/// J v from the forward mode against PyTorch's forward mode, against reverse mode (every
/// entry: (J v)_{n,k} = ∇f_k(x_n) · v_n) and against central differences of the logits; its
/// logits against the forward pass's; for a piecewise-linear graph, the linearisation's J v
/// against it (and no linearisation for any other graph).
fn forward_mode(name: &str) {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let shape = r.x.1;
    let n: usize = shape.iter().product();
    let k = r.logits.len() / shape[0];
    let v = direction(n);
    let piecewise_linear = !matches!(name, "wrn16_dm_swish" | "vit_tiny");
    assert_eq!(
        net.graph().is_piecewise_linear(),
        piecewise_linear,
        "{name}"
    );

    let x = tensor::<Ad, 4>(&r.x.0, shape);
    let (logits, jv) = net.jacobian_vector_product(x.clone(), tensor(&v, shape));
    let jv = values(jv);
    assert_eq!(values(logits), values(net.logits(x.clone())));
    let d_torch = rel(&jv, &r.jvp_logits);

    // Reverse mode, one class at a time: row n of the gradient of Σ_n f_k(x_n) is ∇f_k(x_n).
    let mut reverse = vec![0f32; jv.len()];
    for class in 0..k {
        let x = x.clone().require_grad();
        let g = values(
            x.grad(&net.logits(x.clone()).narrow(1, class, 1).sum().backward())
                .unwrap(),
        );
        let per = n / shape[0];
        for e in 0..shape[0] {
            let span = e * per..(e + 1) * per;
            reverse[e * k + class] = dot(&g[span.clone()], &v[span]) as f32;
        }
    }
    let d_reverse = rel(&jv, &reverse);

    // Central differences. A smooth network's agree closely at h = 1e-2. A piecewise-linear
    // network's cannot, in float32: along v its logits are nearly constant next to their size
    // (their rounding, divided by 2h, grows as h shrinks), and any h large enough to beat the
    // rounding crosses kinks here and there (each bending the line); at h = 1e-4 they agree to
    // a few percent in the root-mean-square, which still tells a wrong rule (errors of order 1)
    // from rounding. The checks above are the exact ones.
    let h = if piecewise_linear { 1e-4 } else { 1e-2 };
    let at = |s: f32| -> Vec<f32> {
        let shifted: Vec<f32> = r.x.0.iter().zip(&v).map(|(a, b)| a + s * b).collect();
        values(net.logits(tensor(&shifted, shape)))
    };
    let central: Vec<f32> = at(h)
        .iter()
        .zip(at(-h))
        .map(|(p, m)| (p - m) / (2.0 * h))
        .collect();
    let d_fd = if piecewise_linear {
        rms_rel(&jv, &central)
    } else {
        rel(&jv, &central)
    };

    println!(
        "{name}: J v against PyTorch {d_torch:.2e}, against reverse mode {d_reverse:.2e}, \
         against central differences {d_fd:.2e} (h = {h:.0e}{})",
        if piecewise_linear {
            ", root-mean-square"
        } else {
            ""
        }
    );
    assert!(
        d_torch < TOL,
        "{name}: J v differs from PyTorch's by {d_torch:e}"
    );
    assert!(
        d_reverse < 1e-5,
        "{name}: J v differs from reverse mode by {d_reverse:e}"
    );
    let fd_tol = if piecewise_linear { 5e-2 } else { 1e-3 };
    assert!(
        d_fd < fd_tol,
        "{name}: J v and central differences differ by {d_fd:e}"
    );

    // The linearisation, where the graph is piecewise linear.
    match net.linearise(x.clone()) {
        Some((lin_logits, jacobian)) => {
            assert!(piecewise_linear, "{name}: a smooth graph linearised");
            assert_eq!(values(lin_logits), values(net.logits(x.clone())));
            let d = rel(&values(jacobian(tensor(&v, shape))), &jv);
            println!("{name}: linearised J v against forward mode {d:.2e}");
            assert!(d < 1e-6, "{name}: the linearisation's J v differs by {d:e}");
        }
        None => assert!(!piecewise_linear, "{name}: no linearisation"),
    };
}

/// ‖a − b‖ / ‖b‖.
fn rms_rel(a: &[f32], b: &[f32]) -> f32 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let size: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (diff / size.max(f64::MIN_POSITIVE)).sqrt() as f32
}

/// The exact Hessian-vector product of Σ LSE(f(x)) (reverse over forward mode) against central
/// differences of exact input gradients, (∇(x + hv) − ∇(x − hv)) / 2h.
///
/// For a smooth network, of the network's own gradients. A piecewise-linear network's
/// gradient jumps at every kink, and float32 leaves no h both small enough to cross none and
/// large enough to beat rounding, so there the gradients are those of the network's linear
/// piece at x, f(x) + J(x)(y − x) (J from its linearisation, itself checked against forward
/// and reverse mode above): the function that equals f around x, whose Hessian of LSE the
/// exact product must be.
fn hessian_against_differences(name: &str) -> f32 {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let shape = r.x.1;
    let n: usize = shape.iter().product();
    let v = direction(n);
    let hv = values(
        log_sum_exp_hessian_vector::<Ad, _>(&net, tensor(&r.x.0, shape), tensor(&v, shape))
            .unwrap(),
    );
    let piece = net.linearise(tensor(&r.x.0, shape));
    let gradient = |s: f32| -> Vec<f32> {
        match &piece {
            // Through the linear piece, differentiated in the step δ = s v from x.
            Some((at_x, jacobian)) => {
                let step: Vec<f32> = v.iter().map(|b| s * b).collect();
                let delta = tensor::<Ad, 4>(&step, shape).require_grad();
                let logits = at_x.clone().detach() + jacobian(delta.clone());
                values(delta.grad(&log_sum_exp(logits).sum().backward()).unwrap())
            }
            None => {
                let shifted: Vec<f32> = r.x.0.iter().zip(&v).map(|(a, b)| a + s * b).collect();
                let y = tensor::<Ad, 4>(&shifted, shape).require_grad();
                values(
                    y.grad(&log_sum_exp(net.logits(y.clone())).sum().backward())
                        .unwrap(),
                )
            }
        }
    };
    // The linear piece's gradients change only through the softmax: a larger step keeps
    // their rounding small.
    let h = if piece.is_some() { 3e-2 } else { 3e-3 };
    let central: Vec<f32> = gradient(h)
        .iter()
        .zip(gradient(-h))
        .map(|(p, m)| (p - m) / (2.0 * h))
        .collect();
    let d = rel(&hv, &central);
    println!(
        "{name}: exact Hessian-vector product against differences of {} gradients {d:.2e}",
        if piece.is_some() {
            "the linear piece's"
        } else {
            "exact"
        }
    );
    d
}

#[test]
fn exact_hessian_vector_products_match_differences_of_gradients() {
    for name in [
        "wrn16_dm_swish",
        "vit_tiny",
        "preact_resnet18",
        "resnet18_cifar",
        "wrn16_robustbench",
        "small_cnn_mnist",
        "jem_wrn",
    ] {
        let d = hessian_against_differences(name);
        assert!(d < 1e-3, "{name}: differs by {d:e}");
    }
}

/// jem-bench's SGLD defence (K = 1, 5 chains, `full` gradient) for PyTorch's noise: the
/// chain-averaged logits and the gradient of their cross-entropy through the step.
fn sgld_step(name: &str) {
    let r = refs(name);
    let net = network::<Ad>(name, &r);
    let [alpha, sigma, init_noise] = r.sgld;
    let sampler = SgldSampler::new(SgldConfig {
        steps: 1,
        step_size: alpha,
        noise: sigma,
        pixel_scale: r.sgld_scale.clone(),
        clamp: false,
    });
    let config = SgldDefenceConfig {
        chains: 5,
        recheck_chains: 5,
        init_noise,
        grad: GradMode::Full,
        hvp: HessianVector::PiecewiseLinear,
        hvp_step: 1e-3,
    };
    let defence = SgldDefence::new(net, sampler, config);
    let noise = sgld_noise(&r.x.1[1..])
        .map(|(v, s)| tensor::<Flex, 4>(&v, [s[0], s[1], s[2], s[3]]))
        .to_vec();
    let y = Tensor::<Flex, 1, Int>::from_data(
        TensorData::new(r.y.clone(), [r.y.len()]),
        &Default::default(),
    );
    let loss = |l: Tensor<Ad, 2>| AttackLoss::CrossEntropy.of(l, Tensor::from_inner(y.clone()));
    let (grad, logits) =
        defence.loss_gradient_with_noise::<Ad>(tensor(&r.x.0, r.x.1), &loss, noise);
    let d_logits = rel(&values(logits), &r.sgld_logits);
    let d_grad = rel(&values(grad), &r.sgld_grad_ce);
    println!(
        "{name}: K = 1 SGLD defence, relative difference logits {d_logits:.2e}, gradient through \
         the step {d_grad:.2e}"
    );
    assert!(
        d_logits < SGLD_TOL,
        "{name}: defended logits differ by {d_logits:e}"
    );
    assert!(
        d_grad < SGLD_TOL,
        "{name}: gradient through the step differs by {d_grad:e}"
    );
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {
        mod first_order {
            $(#[test] fn $name() { super::first_order(stringify!($name)); })*
        }
        mod second_order {
            $(#[test] fn $name() { super::second_order(stringify!($name)); })*
        }
        mod exact_hessian_vector {
            $(#[test] fn $name() { super::exact_hessian_vector(stringify!($name)); })*
        }
        mod forward_mode {
            $(#[test] fn $name() { super::forward_mode(stringify!($name)); })*
        }
        mod sgld_step {
            $(#[test] fn $name() { super::sgld_step(stringify!($name)); })*
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
