//! CPU and GPU compute the same numbers: the embedded baseline's logits and input gradients,
//! one SGLD step with the same noise, the JEM-1 defence's logits, and one PGD step, on burn's
//! `flex` CPU backend and on its CUDA backend, in one process.
//!
//! Built only with `--features cuda`: `cargo test --release --features cuda --test gpu`. Where
//! no CUDA device can be opened, every test says so on stderr and passes without comparing.
//!
//! Tolerances: f32 on both sides, but GPU matmul and convolution sum in other orders, so logits
//! and gradients agree to 1e-3 relative to their largest magnitude, not bit for bit; a PGD step's sign of the gradient may flip only where
//! the gradient is near zero (≤ 0.1 % of pixels).
#![cfg(feature = "cuda")]

use burn::backend::{Autodiff, Cuda, Flex};
use burn::module::Module;
use burn::tensor::Tensor;
use jem_attacks::{
    noise, Classifier, GradMode, HessianVector, Norm, PgdConfig, SgldDefence, SgldDefenceConfig,
    SgldSampler, SgldTarget, Undefended,
};
use jem_bench::model::Checkpoint;
use jem_datasets::{DataSource, Split};
use jem_kernels::KernelsAutodiff;
use rand::rngs::StdRng;
use rand::SeedableRng;

type Cpu = Autodiff<Flex>;
type Gpu = Autodiff<Cuda>;

/// Whether a CUDA device can be opened (burn's CUDA backend panics when there is none).
fn gpu_present() -> bool {
    std::panic::catch_unwind(|| {
        Tensor::<Cuda, 1>::zeros([1], &Default::default()).into_data();
    })
    .is_ok()
}

macro_rules! require_gpu {
    () => {
        if !gpu_present() {
            eprintln!("skipped: no CUDA device could be opened on this machine");
            return;
        }
    };
}

/// Everything compared, as host vectors.
struct Computed {
    logits: Vec<f32>,
    lse_gradient: Vec<f32>,
    sgld_step: Vec<f32>,
    defended_logits: Vec<f32>,
    pgd_step: Vec<f32>,
}

fn host<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

fn compute<B: KernelsAutodiff>() -> Computed {
    let device = Default::default();
    let (model, sidecar) = Checkpoint::at("results/models/baseline")
        .load::<B>(&device)
        .unwrap();
    let model = model.no_grad();
    let test = DataSource::parse("mnist")
        .unwrap()
        .load(Split::Test)
        .unwrap();
    let idx: Vec<usize> = (0..16).collect();
    let x = jem_bench::batches::images::<B::InnerBackend>(&test, &idx, &device);
    let y = jem_bench::batches::labels::<B::InnerBackend>(&test, &idx, &device);

    let logits = host(model.logits(Tensor::from_inner(x.clone())).inner());
    let lse_gradient = host(jem_bench::energy::lse_input_gradient::<B>(
        &model,
        x.clone(),
    ));

    let mut sgld = jem_bench::defended::sgld_of(&sidecar).unwrap();
    sgld.steps = 1;
    let sampler = SgldSampler::new(sgld.clone());
    let eps = noise::gaussian(x.dims(), &mut StdRng::seed_from_u64(1), &device);
    let sgld_step = host(sampler.step::<B, _>(&model, x.clone(), &SgldTarget::Marginal, eps));

    let defence = SgldDefence::new(
        model.clone(),
        SgldSampler::new(sgld),
        SgldDefenceConfig {
            chains: 2,
            recheck_chains: 2,
            init_noise: 0.0,
            grad: GradMode::Full,
            hvp: HessianVector::PiecewiseLinear,
            hvp_step: 1e-3,
        },
    );
    let defended_logits = host(jem_attacks::Model::<B>::logits(
        &defence,
        x.clone(),
        &mut StdRng::seed_from_u64(2),
    ));

    let pgd = PgdConfig {
        steps: 1,
        random_start: false,
        early_stop: false,
        ..PgdConfig::pgd(Norm::Linf)
    };
    let pgd_step = pgd.run::<B, _>(&Undefended::new(model), x, y, 0.1).inputs;
    Computed {
        logits,
        lse_gradient,
        sgld_step,
        defended_logits,
        pgd_step,
    }
}

/// max |a − b| / max |a|.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

#[test]
fn cpu_and_gpu_agree_on_a_wide_resnet_its_sgld_defence_and_pgd() {
    require_gpu!();
    let (cpu, gpu) = (compute::<Cpu>(), compute::<Gpu>());
    for (what, a, b, tolerance) in [
        ("logits", &cpu.logits, &gpu.logits, 1e-3),
        (
            "LSE input gradient",
            &cpu.lse_gradient,
            &gpu.lse_gradient,
            1e-3,
        ),
        ("one SGLD step", &cpu.sgld_step, &gpu.sgld_step, 1e-3),
        (
            "JEM-1 logits",
            &cpu.defended_logits,
            &gpu.defended_logits,
            1e-3,
        ),
    ] {
        let d = relative_difference(a, b);
        eprintln!("{what}: relative difference {d:.2e}");
        assert!(
            d <= tolerance,
            "{what}: CPU and GPU differ by {d:.2e} (> {tolerance})"
        );
    }
    let differ = cpu
        .pgd_step
        .iter()
        .zip(&gpu.pgd_step)
        .filter(|(a, b)| (*a - *b).abs() > 1e-4)
        .count();
    eprintln!("PGD step: {differ} of {} pixels differ", cpu.pgd_step.len());
    assert!(
        differ * 1000 <= cpu.pgd_step.len(),
        "PGD step: {differ} pixels moved differently on the GPU"
    );
}

/// What `--device cuda` prints in every output: the GPU, by index.
#[test]
fn outputs_name_the_gpu() {
    require_gpu!();
    jem_bench::backend::select("cuda:0").unwrap();
    assert_eq!(jem_bench::backend::name(), "burn-cuda:0");
}

/// Which operation of the network's backward pass the GPU computes differently, if any: the
/// input and weight gradients of every convolution shape of the embedded WRN-10-1 (28×28 inputs;
/// stride 1 and 2, 3×3 and the 1×1 shortcuts), and LeakyReLU's gradient, each on the same data
/// on both backends. All cases are printed before any is asserted, so that one run on a GPU
/// names every culprit.
#[test]
fn cpu_and_gpu_agree_on_each_convolution_and_activation_gradient() {
    use burn::tensor::module::conv2d;
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::TensorData;
    require_gpu!();

    /// Standard normal values, drawn on the host once and given to both backends.
    fn random(shape: [usize; 4], rng: &mut StdRng) -> TensorData {
        noise::gaussian::<Flex, 4>(shape, rng, &Default::default()).into_data()
    }
    /// d Σ(r · conv(x, w)) / dx and / dw on backend B.
    fn conv_gradients<B: burn::tensor::backend::AutodiffBackend>(
        x: &TensorData,
        w: &TensorData,
        r: &TensorData,
        stride: usize,
        padding: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let device = Default::default();
        let x = Tensor::<B, 4>::from_data(x.clone(), &device).require_grad();
        let w = Tensor::<B, 4>::from_data(w.clone(), &device).require_grad();
        let r = Tensor::<B, 4>::from_data(r.clone(), &device);
        let options = ConvOptions::new([stride; 2], [padding; 2], [1, 1], 1);
        let grads = (conv2d(x.clone(), w.clone(), None, options) * r)
            .sum()
            .backward();
        (host(x.grad(&grads).unwrap()), host(w.grad(&grads).unwrap()))
    }
    /// d Σ(r · LeakyReLU(x)) / dx on backend B, through the activation the WRN uses.
    fn activation_gradient<B: KernelsAutodiff>(x: &TensorData, r: &TensorData) -> Vec<f32> {
        let device = Default::default();
        let x = Tensor::<B, 4>::from_data(x.clone(), &device).require_grad();
        let r = Tensor::<B, 4>::from_data(r.clone(), &device);
        let grads = (jem_kernels::leaky_relu(x.clone(), 0.2) * r)
            .sum()
            .backward();
        host(x.grad(&grads).unwrap())
    }

    // (in, out, kernel, stride, padding, side): every convolution of WRN-10-1 on MNIST.
    let shapes = [
        (1, 16, 3, 1, 1, 28),
        (16, 16, 3, 1, 1, 28),
        (16, 32, 3, 2, 1, 28),
        (16, 32, 1, 2, 0, 28),
        (32, 32, 3, 1, 1, 14),
        (32, 64, 3, 2, 1, 14),
        (32, 64, 1, 2, 0, 14),
        (64, 64, 3, 1, 1, 7),
    ];
    let mut rng = StdRng::seed_from_u64(3);
    let mut failures = Vec::new();
    for (cin, cout, k, stride, padding, side) in shapes {
        let x = random([4, cin, side, side], &mut rng);
        let w = random([cout, cin, k, k], &mut rng);
        let out = (side + 2 * padding - k) / stride + 1;
        let r = random([4, cout, out, out], &mut rng);
        let (cpu_dx, cpu_dw) = conv_gradients::<Cpu>(&x, &w, &r, stride, padding);
        let (gpu_dx, gpu_dw) = conv_gradients::<Gpu>(&x, &w, &r, stride, padding);
        for (what, a, b) in [("input", &cpu_dx, &gpu_dx), ("weight", &cpu_dw, &gpu_dw)] {
            let d = relative_difference(a, b);
            let case = format!(
                "conv {cin}→{cout} {k}×{k} stride {stride} padding {padding} on {side}×{side}, \
                 {what} gradient: relative difference {d:.2e}"
            );
            eprintln!("{case}");
            if d > 1e-3 {
                failures.push(case);
            }
        }
    }
    let x = random([4, 16, 28, 28], &mut rng);
    let r = random([4, 16, 28, 28], &mut rng);
    let d = relative_difference(
        &activation_gradient::<Cpu>(&x, &r),
        &activation_gradient::<Gpu>(&x, &r),
    );
    eprintln!("LeakyReLU gradient: relative difference {d:.2e}");
    if d > 1e-3 {
        failures.push(format!("LeakyReLU gradient: relative difference {d:.2e}"));
    }
    assert!(
        failures.is_empty(),
        "the GPU differs on:\n{}",
        failures.join("\n")
    );
}
