//! CPU and GPU compute the same numbers, in one process: burn's `flex` CPU backend against its
//! CUDA backend, both through jem-kernels (on CUDA: burn's forward convolution, the gradients
//! composed from it and a matrix product, see `tests/suite/portable_gradients.rs`).
//!
//! - every convolution of WRN-10-1 (MNIST, and 3×32×32), WRN-16-2 and WRN-28-10 (3×32×32):
//!   the output and the input and weight gradients, plain and with the fused LeakyReLU and bias
//!   (and the bias gradient);
//! - the embedded baseline, as jem-bench's Wide-ResNet and as its ONNX export run by the
//!   interpreter: logits, the LSE input gradient, one SGLD step with the same noise,
//!   the K = 0 loss gradient, the K = 1 defence's logits and its loss gradients (BPDA, full
//!   gradient with either Hessian-vector product, and K = 3), one PGD step; a failing gradient
//!   names the digits it differs on (burn 0.21's CUDA adjoint of the chain average was wrong for
//!   every other digit: docs/gpu.md);
//! - Adam's update of a parameter (jem-kernels' one launch) at the first step and a later one,
//!   and SGLD's update of a batch (one launch) with and without the clamp;
//!   two Adam steps of a classifier and one JEM training iteration (20 SGLD steps, then Adam).
//!
//! The GPU tests need a CUDA GPU and are ignored by default, so a machine without one reports
//! them as ignored (not run), never as passed. On a machine with one (scripts/gpu-check.sh does this):
//!
//! ```sh
//! cargo test --release --features cuda --test gpu -- --ignored --nocapture
//! ```
//!
//! Run with `--ignored` where no GPU can be opened, they fail. Built without `--features cuda`,
//! one ignored test stands for them and fails if asked to run.
//!
//! The whole-network cases themselves also run on every build, on the CPU: jem-kernels' CPU
//! kernels against the portable construction the CUDA backend uses, so CI checks both the
//! construction on every case and this file's code before a GPU ever runs it.
//!
//! Tolerances. jem-bench's CUDA backend computes convolutions and matrix products in true f32
//! (burn's direct convolution, cubek's unit-tiled product; jem-kernels' `Cuda`), so the GPU
//! differs from the CPU only by summation order: `F32` = 1e-4 of the largest magnitude, for
//! single operations and the whole network alike (twice that through the defence's
//! Hessian-vector products). burn's own kernels would not meet it: its autotuner runs f32 on
//! tensor cores in TF32 (inputs rounded to 2⁻¹¹ ≈ 4.9e-4 relative) with no switch to turn that
//! off, and some of its candidates are wrong outright (docs/gpu.md). A wrong gradient is off by
//! the order of the gradient itself (burn's two wrong backward kernels: 0.93 and 1.00).
//! Where the result is a sign (PGD step, Adam's first step), elements may differ only where the
//! gradient is within rounding of zero: ≤ 1 ‰.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use jem_attacks::{
    noise, Classifier, GradMode, HessianVector, LossFn, Model, Norm, PgdConfig, SgldConfig,
    SgldDefence, SgldDefenceConfig, SgldSampler, SgldTarget, Undefended,
};
use jem_bench::model::{Checkpoint, LoadedNetwork, WideResNet};
use jem_bench::train::{adam, cross_entropy, descend, JemConfig, JemObjective, Objective, Step};
use jem_datasets::{embedded, ImageSet, Split};
use jem_kernels::{set_implementation, Implementation, KernelsAutodiff};
use jem_onnx::{Normalisation, OnnxNetwork};
use rand::rngs::StdRng;
use rand::SeedableRng;

type Cpu = Autodiff<Flex>;

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().unwrap()
}

/// Whether `x` and `y` differ by more than `atol`; a NaN on either side always does (`f32::max`
/// and `>` would pass it silently).
fn differs_beyond(x: f32, y: f32, atol: f32) -> bool {
    let d = (x - y).abs();
    d.is_nan() || d > atol
}

/// max |a − b| / max |a|; NaN where any element of either is NaN.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        scale > 0.0,
        "the CPU's result is all zeros: nothing to compare"
    );
    let worst = a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    });
    worst / scale
}

/// Elements whose |a − b| exceeds `atol`, per thousand.
fn differing_per_mille(a: &[f32], b: &[f32], atol: f32) -> f64 {
    assert_eq!(a.len(), b.len());
    let n = a
        .iter()
        .zip(b)
        .filter(|(x, y)| differs_beyond(**x, **y, atol))
        .count();
    1000.0 * n as f64 / a.len() as f64
}

/// Collects every comparison, prints each, and fails at the end naming every one over its
/// tolerance: one GPU run names every culprit.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    /// The network the comparisons are of, named before each (empty: none named).
    subject: String,
}

impl Report {
    fn relative(&mut self, what: &str, cpu: &[f32], gpu: &[f32], tolerance: f32) {
        let d = relative_difference(cpu, gpu);
        let scale = cpu.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let beyond = cpu
            .iter()
            .zip(gpu)
            .filter(|(a, b)| differs_beyond(**a, **b, tolerance * scale))
            .count();
        // Per image, where the result is one row per digit: a wrong batch index shows as
        // whole images, rounding as scattered elements.
        let images = if cpu.len().is_multiple_of(DIGITS) && cpu.len() > DIGITS {
            let row = cpu.len() / DIGITS;
            let differing: Vec<usize> = (0..DIGITS)
                .filter(|i| {
                    let r = i * row..(i + 1) * row;
                    cpu[r.clone()]
                        .iter()
                        .zip(&gpu[r])
                        .any(|(a, b)| differs_beyond(*a, *b, tolerance * scale))
                })
                .collect();
            format!(", in digits {differing:?}")
        } else {
            String::new()
        };
        let line = format!(
            "{}{what}: relative difference {d:.2e} (tolerance {tolerance:.0e}; {beyond} of {} \
             elements beyond it{images})",
            self.prefix(),
            cpu.len()
        );
        eprintln!("{line}");
        if d.is_nan() || d > tolerance {
            self.failures.push(line);
        }
    }

    fn signs(&mut self, what: &str, cpu: &[f32], gpu: &[f32], atol: f32) {
        let per_mille = differing_per_mille(cpu, gpu, atol);
        let line = format!(
            "{}{what}: {per_mille:.3} ‰ of elements differ by more than {atol:e}",
            self.prefix()
        );
        eprintln!("{line}");
        if per_mille > 1.0 {
            self.failures.push(line);
        }
    }

    /// `Onnx: ` before a comparison of the ONNX subject's.
    fn prefix(&self) -> String {
        match self.subject.as_str() {
            "" => String::new(),
            subject => format!("{subject}: "),
        }
    }

    fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "the GPU differs from the CPU on:\n{}",
            self.failures.join("\n")
        );
    }
}

/// Everything compared on the whole network, as host vectors.
struct Computed {
    logits: Vec<f32>,
    lse_gradient: Vec<f32>,
    sgld_step: Vec<f32>,
    linearised_jv: Vec<f32>,
    defended_logits: Vec<f32>,
    undefended_gradient: Vec<f32>,
    defended_gradient: Vec<f32>,
    defended_gradient_differences: Vec<f32>,
    defended_gradient_bpda: Vec<f32>,
    defended_gradient_k3: Vec<f32>,
    pgd_step: Vec<f32>,
}

fn baseline<B: KernelsAutodiff>() -> (WideResNet<B>, jem_bench::model::Sidecar) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/baseline");
    Checkpoint::at(path).load::<B>(&Default::default()).unwrap()
}

/// The network the whole-network cases run: the embedded baseline, or the same weights
/// exported by PyTorch to ONNX and run by jem-bench's interpreter.
#[derive(Clone, Copy, Debug)]
enum Subject {
    Native,
    Onnx,
}

impl Subject {
    const ALL: [Subject; 2] = [Subject::Native, Subject::Onnx];

    /// The network, and the SGLD settings of the embedded baseline (the same for both: the
    /// graph holds the same network on the same normalised scale).
    fn load<B: KernelsAutodiff>(self) -> (LoadedNetwork<B>, SgldConfig) {
        let (wrn, sidecar) = baseline::<B>();
        let sgld = jem_bench::defended::sgld_of(&sidecar).unwrap();
        let network = match self {
            Subject::Native => LoadedNetwork::Wrn(wrn),
            Subject::Onnx => {
                let path = concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/onnx/embedded_baseline.onnx"
                );
                let half = Normalisation {
                    mean: vec![0.5],
                    std: vec![0.5],
                };
                let graph = OnnxNetwork::<B>::load(path, &Default::default()).unwrap();
                LoadedNetwork::Onnx(graph.with_normalisation(Some(half)).unwrap())
            }
        };
        (network, sgld)
    }
}

/// How many test digits the whole-network cases take.
const DIGITS: usize = 16;

fn digits() -> (ImageSet, Vec<usize>) {
    (embedded::mnist(Split::Test).unwrap(), (0..DIGITS).collect())
}

fn compute<B: KernelsAutodiff>(subject: Subject) -> Computed {
    let device = Default::default();
    let (model, mut sgld) = subject.load::<B>();
    let model = model.no_grad();
    let (test, idx) = digits();
    let x = jem_bench::batches::images::<B::InnerBackend>(&test, &idx, &device);
    let y = jem_bench::batches::labels::<B::InnerBackend>(&test, &idx, &device);

    let logits = host(Classifier::logits(&model.valid(), x.clone()));
    let lse_gradient = host(jem_bench::energy::lse_input_gradient::<B>(
        &model,
        x.clone(),
    ));

    sgld.steps = 1;
    let sampler = SgldSampler::new(sgld.clone());
    let eps = noise::gaussian(x.dims(), &mut StdRng::seed_from_u64(1), &device);
    let sgld_step = host(sampler.step::<B, _>(&model, x.clone(), &SgldTarget::Marginal, eps));

    // J v of the network linearised at x (its activation pattern recorded), for a random v:
    // what the piecewise-linear Hessian-vector product runs forward.
    let v = noise::gaussian(x.dims(), &mut StdRng::seed_from_u64(4), &device);
    let linearised_jv = {
        let (_, jacobian) =
            Classifier::<B>::linearise(&model, Tensor::from_inner(x.clone())).unwrap();
        host(jacobian(Tensor::from_inner(v)).inner())
    };

    let defence_with = |hvp| {
        SgldDefence::new(
            model.clone(),
            SgldSampler::new(sgld.clone()),
            SgldDefenceConfig {
                chains: 2,
                recheck_chains: 2,
                init_noise: 0.0,
                grad: GradMode::Full,
                hvp,
                hvp_step: 1e-3,
            },
        )
    };
    let defence = defence_with(HessianVector::PiecewiseLinear);
    let defended_logits = host(Model::<B>::logits(
        &defence,
        x.clone(),
        &mut StdRng::seed_from_u64(2),
    ));
    // The cross-entropy of the next class, not the true one: at a confidently classified digit
    // (p_y = 1 − 1e-6) the true label's gradient, p − onehot(y), is mostly f32 rounding of
    // 1 − p_y, and two correct implementations differ there by the order of the gradient itself
    // (seen on lavapipe: 4e-4 of the scale, 38 of 12 544 elements, where the network's own
    // gradient agrees to 5e-7). Against another class p − onehot(y') has no such cancellation.
    let labels = y.clone().add_scalar(1).remainder_scalar(10);
    let loss: LossFn<'_, B> =
        &|logits: Tensor<B, 2>| cross_entropy(logits, Tensor::from_inner(labels.clone()));
    let (gradient, _) = Undefended::new(model.clone()).loss_gradient(
        x.clone(),
        loss,
        &mut StdRng::seed_from_u64(2),
    );
    let undefended_gradient = host(gradient);
    let (gradient, _) = defence.loss_gradient(x.clone(), loss, &mut StdRng::seed_from_u64(2));
    let defended_gradient = host(gradient);
    let (gradient, _) = defence_with(HessianVector::GradientDifferences).loss_gradient(
        x.clone(),
        loss,
        &mut StdRng::seed_from_u64(2),
    );
    let defended_gradient_differences = host(gradient);
    let mut bpda = defence_with(HessianVector::PiecewiseLinear);
    bpda.config.grad = GradMode::Bpda;
    let (gradient, _) = bpda.loss_gradient(x.clone(), loss, &mut StdRng::seed_from_u64(2));
    let defended_gradient_bpda = host(gradient);
    // Three steps: the backward pass through a chain of steps, each with its own Hessian.
    let mut three = defence_with(HessianVector::PiecewiseLinear);
    three.sampler.config.steps = 3;
    let (gradient, _) = three.loss_gradient(x.clone(), loss, &mut StdRng::seed_from_u64(2));
    let defended_gradient_k3 = host(gradient);

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
        linearised_jv,
        defended_logits,
        undefended_gradient,
        defended_gradient,
        defended_gradient_differences,
        defended_gradient_bpda,
        defended_gradient_k3,
        pgd_step,
    }
}

/// Every parameter's values, in visiting order.
struct Flatten(Vec<f32>);

impl<B: Backend> ModuleVisitor<B> for Flatten {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.extend(host(param.val()));
    }
}

/// The weights before, after one and two Adam steps of the classifier (on one batch) and after
/// one JEM iteration, flattened.
fn training_steps<B: KernelsAutodiff>() -> [Vec<f32>; 4] {
    let device: burn::tensor::Device<B> = Default::default();
    let (test, idx) = digits();
    let x = Tensor::<B, 4>::from_inner(jem_bench::batches::images::<B::InnerBackend>(
        &test, &idx, &device,
    ));
    let y: Tensor<B, 1, Int> = Tensor::from_inner(jem_bench::batches::labels::<B::InnerBackend>(
        &test, &idx, &device,
    ));
    let flat = |m: &WideResNet<B>| {
        let mut all = Flatten(Vec::new());
        m.visit(&mut all);
        all.0
    };

    let (model, _) = baseline::<B>();
    let before = flat(&model);
    let mut optim = adam().init::<B, WideResNet<B>>();
    let loss = cross_entropy(model.forward(x.clone()), y.clone());
    let model = descend(model, &mut optim, loss, 1e-3);
    let adam_step = flat(&model);
    // The second step reads the moments the first one left.
    let loss = cross_entropy(model.forward(x.clone()), y.clone());
    let adam_steps = flat(&descend(model, &mut optim, loss, 1e-3));

    let (model, sidecar) = baseline::<B>();
    let config = JemConfig {
        buffer_size: 64,
        sgld_threads: 1,
        ..JemConfig::default()
    };
    let mut objective = JemObjective::new(config, f64::INFINITY);
    let arch = sidecar.architecture.clone();
    Objective::<B>::prepare(&mut objective, &arch, &test, 5).unwrap();
    let (loss, _) = objective.loss(
        &model,
        x,
        y,
        Step {
            iteration: 0,
            seed: 6,
        },
    );
    let mut optim = adam().init::<B, WideResNet<B>>();
    let jem_step = flat(&descend(model, &mut optim, loss, 1e-4));
    [before, adam_step, adam_steps, jem_step]
}

/// The whole-network comparisons of `b` against `a`, each within `tolerance` of the largest
/// magnitude (twice that through the defence's Hessian-vector products).
fn compare_network(report: &mut Report, a: &Computed, b: &Computed, tolerance: f32) {
    report.relative("logits", &a.logits, &b.logits, tolerance);
    report.relative(
        "LSE input gradient",
        &a.lse_gradient,
        &b.lse_gradient,
        tolerance,
    );
    report.relative("one SGLD step", &a.sgld_step, &b.sgld_step, tolerance);
    report.relative(
        "J v of the network linearised at x",
        &a.linearised_jv,
        &b.linearised_jv,
        tolerance,
    );
    report.relative(
        "K = 1 logits",
        &a.defended_logits,
        &b.defended_logits,
        tolerance,
    );
    report.relative(
        "K = 0 loss gradient",
        &a.undefended_gradient,
        &b.undefended_gradient,
        tolerance,
    );
    report.relative(
        "K = 1 BPDA loss gradient",
        &a.defended_gradient_bpda,
        &b.defended_gradient_bpda,
        tolerance,
    );
    report.relative(
        "K = 1 full-gradient loss gradient",
        &a.defended_gradient,
        &b.defended_gradient,
        2.0 * tolerance,
    );
    report.relative(
        "K = 1 full-gradient loss gradient, Hessian-vector products from gradient differences",
        &a.defended_gradient_differences,
        &b.defended_gradient_differences,
        2.0 * tolerance,
    );
    report.relative(
        "K = 3 full-gradient loss gradient",
        &a.defended_gradient_k3,
        &b.defended_gradient_k3,
        2.0 * tolerance,
    );
    report.signs("one PGD step", &a.pgd_step, &b.pgd_step, 1e-4);
}

/// Adam's first step moves each weight by about ±lr, its second by about ±2 lr where the
/// gradient keeps its sign: the moves are compared, weight by weight.
fn compare_training(report: &mut Report, a: &[Vec<f32>; 4], b: &[Vec<f32>; 4]) {
    let moves = |after: &[f32], before: &[f32]| -> Vec<f32> {
        after.iter().zip(before).map(|(x, y)| x - y).collect()
    };
    report.signs(
        "one Adam step (moves)",
        &moves(&a[1], &a[0]),
        &moves(&b[1], &b[0]),
        1e-5,
    );
    report.signs(
        "two Adam steps (moves)",
        &moves(&a[2], &a[0]),
        &moves(&b[2], &b[0]),
        1e-5,
    );
    report.signs(
        "one JEM iteration (moves)",
        &moves(&a[3], &a[0]),
        &moves(&b[3], &b[0]),
        1e-6,
    );
}

/// On the CPU: jem-kernels' own kernels against the portable gradients (what CUDA runs) on
/// every whole-network case. Both in f32, so to 1e-4 of the scale. One test in this binary
/// switches the process-wide implementation.
#[test]
fn the_portable_gradients_agree_with_the_cpu_kernels_on_every_whole_network_case() {
    let computed = |implementation| {
        set_implementation(implementation);
        let networks = Subject::ALL.map(compute::<Cpu>);
        (networks, training_steps::<Cpu>())
    };
    let (own, own_training) = computed(Implementation::Own);
    let (portable, portable_training) = computed(Implementation::Portable);
    set_implementation(Implementation::Own);
    let mut report = Report::default();
    for ((subject, own), portable) in Subject::ALL.iter().zip(&own).zip(&portable) {
        report.subject = format!("{subject:?}");
        compare_network(&mut report, own, portable, 1e-4);
    }
    report.subject = String::new();
    compare_training(&mut report, &own_training, &portable_training);
    report.finish();
}

/// The comparison itself, on the CPU: a NaN on the GPU's side fails it (as a difference does),
/// equal results pass; `f32::max` alone would have passed the NaN as 0.
#[test]
fn the_comparison_fails_on_a_nan_or_a_difference_and_passes_equal_results() {
    let cpu = [1.0f32, -2.0, 0.5];
    let mut report = Report::default();
    report.relative("equal", &cpu, &cpu, 1e-4);
    report.signs("equal", &cpu, &cpu, 1e-5);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    report.relative("a NaN", &cpu, &[1.0, f32::NAN, 0.5], 1e-4);
    report.relative("a difference", &cpu, &[1.0, -2.1, 0.5], 1e-4);
    report.signs("a NaN", &cpu, &[f32::NAN, -2.0, 0.5], 1e-5);
    assert_eq!(report.failures.len(), 3, "{:?}", report.failures);
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
#[test]
#[ignore = "needs --features cuda and a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
fn gpu_agreement() {
    panic!("not run: this test binary was built without --features cuda, so nothing was compared");
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod on_gpu {
    use super::*;
    use burn::tensor::ops::ConvOptions;
    use burn::tensor::{TensorData, TensorPrimitive};
    use jem_bench::model::{ConvShape, WideResNetConfig};
    #[cfg(feature = "cuda")]
    use jem_kernels::Cuda as Device;
    #[cfg(all(feature = "wgpu", not(feature = "cuda")))]
    use jem_kernels::Wgpu as Device;

    type Gpu = Autodiff<Device>;

    /// Fails (never skips) where no CUDA device can be opened: these tests run only when asked.
    /// Applies `JEM_BENCH_GPU_CONV` (the forward convolution: tiled, tiled-wide, auto, direct or
    /// im2col).
    fn require_gpu() {
        if let Some(conv) = jem_kernels::GpuConv::from_env().unwrap() {
            jem_kernels::set_gpu_conv(conv);
        }
        eprintln!(
            "GPU forward convolution: {}",
            jem_kernels::gpu_conv().name()
        );
        let opened = std::panic::catch_unwind(|| {
            Tensor::<Device, 1>::zeros([1], &Default::default()).into_data();
        });
        assert!(
            opened.is_ok(),
            "no CUDA device could be opened on this machine: nothing was compared"
        );
    }

    /// Relative tolerance of one GPU result against the CPU's (see the file's comment).
    const F32: f32 = 1e-4;

    /// conv(act(x), w) + b and d Σ(r · (conv(act(x), w) + b)) / dx, / dw (and / db, empty
    /// without a bias) through [`FastConv`] (the path a Wide-ResNet's forward pass takes) on
    /// backend B.
    fn conv_gradients<B: KernelsAutodiff>(
        shape: &ConvShape,
        data: [&TensorData; 3],
        slope: Option<f64>,
        bias: Option<&TensorData>,
    ) -> [Vec<f32>; 4] {
        let device = Default::default();
        let [x, w, r] = data.map(|d| Tensor::<B, 4>::from_data(d.clone(), &device));
        let (x, w) = (x.require_grad(), w.require_grad());
        let b = bias.map(|b| Tensor::<B, 1>::from_data(b.clone(), &device).require_grad());
        let options = ConvOptions::new([shape.stride; 2], [shape.padding; 2], [1, 1], 1);
        let y = B::fast_conv2d(
            x.clone().into_primitive().tensor(),
            w.clone().into_primitive().tensor(),
            b.clone().map(|b| b.into_primitive().tensor()),
            options,
            slope,
        );
        let y = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(y));
        let grads = (y.clone() * r).sum().backward();
        let dx = host(x.grad(&grads).unwrap());
        let db = b.map_or_else(Vec::new, |b| host(b.grad(&grads).unwrap()));
        [host(y), dx, host(w.grad(&grads).unwrap()), db]
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn cpu_and_gpu_agree_on_every_convolution_gradient_of_the_wide_resnets() {
        require_gpu();
        let tolerance = F32;
        let networks = [
            ("WRN-10-1", WideResNetConfig::new(10, 1, 1, 10), 28),
            ("WRN-10-1", WideResNetConfig::new(10, 1, 3, 10), 32),
            ("WRN-16-2", WideResNetConfig::new(16, 2, 3, 10), 32),
            ("WRN-28-10", WideResNetConfig::new(28, 10, 3, 10), 32),
        ];
        let mut rng = StdRng::seed_from_u64(3);
        let mut report = Report::default();
        let mut seen = Vec::new();
        for (name, config, side) in networks {
            for shape in config.convolutions(side, side).unwrap() {
                if seen.contains(&shape) {
                    continue;
                }
                seen.push(shape);
                let random = |dims: [usize; 4], rng: &mut StdRng| {
                    noise::gaussian::<Flex, 4>(dims, rng, &Default::default()).into_data()
                };
                let (k, [h, w], [oh, ow]) = (shape.kernel, shape.input, shape.output());
                let batch = 2;
                let x = random([batch, shape.in_channels, h, w], &mut rng);
                let weight = random([shape.out_channels, shape.in_channels, k, k], &mut rng);
                let r = random([batch, shape.out_channels, oh, ow], &mut rng);
                let b =
                    noise::gaussian::<Flex, 1>([shape.out_channels], &mut rng, &Default::default())
                        .into_data();
                // Plain, and with what the GPU's tiled kernel does in its own launch: the
                // LeakyReLU on the input and the bias.
                for (slope, bias) in [(None, None), (Some(0.2), Some(&b))] {
                    let data = [&x, &weight, &r];
                    let cpu = conv_gradients::<Cpu>(&shape, data, slope, bias);
                    let gpu = conv_gradients::<Gpu>(&shape, data, slope, bias);
                    let case = format!(
                        "{name} conv {}→{} {k}×{k} stride {} on {h}×{w}, LeakyReLU {slope:?}, \
                         bias {}",
                        shape.in_channels,
                        shape.out_channels,
                        shape.stride,
                        bias.is_some()
                    );
                    let what = [
                        "output",
                        "input gradient",
                        "weight gradient",
                        "bias gradient",
                    ];
                    for ((what, cpu), gpu) in what.iter().zip(&cpu).zip(&gpu) {
                        // No bias, no bias gradient.
                        if !cpu.is_empty() {
                            report.relative(&format!("{case}, {what}"), cpu, gpu, tolerance);
                        }
                    }
                }
            }
        }
        report.finish();
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn cpu_and_gpu_agree_on_a_wide_resnet_its_sgld_defence_and_pgd() {
        require_gpu();
        let tolerance = F32;
        let mut report = Report::default();
        // The network as jem-bench's own Wide-ResNet and as its ONNX export.
        for subject in Subject::ALL {
            report.subject = format!("{subject:?}");
            let (cpu, gpu) = (compute::<Cpu>(subject), compute::<Gpu>(subject));
            compare_network(&mut report, &cpu, &gpu, tolerance);
        }
        report.finish();
    }

    /// A tensor of `shape` with values in [centre − scale, centre + scale), the same for one
    /// seed on every backend.
    fn formula(shape: &[usize], seed: usize, centre: f32, scale: f32) -> TensorData {
        let n = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|i| {
                let unit = ((i * 7_919 + seed * 104_729) % 1_000) as f32 / 500.0 - 1.0;
                centre + scale * unit
            })
            .collect();
        TensorData::new(values, shape.to_vec())
    }

    /// Adam's update of one parameter tensor, jem-kernels' one launch against the CPU's pass, at
    /// the first step (no moments read) and the seventh; 5 000 elements (several cubes, the
    /// last one partly outside).
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn cpu_and_gpu_agree_on_adams_update() {
        require_gpu();
        let mut report = Report::default();
        let n = [5_000];
        // The second moment never negative.
        let inputs = [
            formula(&n, 1, 0.0, 1.0),
            formula(&n, 2, 0.0, 1e-2),
            formula(&n, 3, 0.0, 1e-3),
            formula(&n, 4, 1e-4, 1e-4),
        ];
        for t in [1, 7] {
            let step = jem_kernels::AdamStep::new(0.9, 0.999, 1e-8, t, 1e-3);
            let cpu = adam_update::<Flex>(&inputs, t > 1, step);
            let gpu = adam_update::<Device>(&inputs, t > 1, step);
            for (i, what) in ["parameter", "first moment", "second moment"]
                .iter()
                .enumerate()
            {
                report.relative(
                    &format!("Adam's update at step {t}: {what}"),
                    &cpu[i],
                    &gpu[i],
                    1e-6,
                );
            }
        }
        report.finish();
    }

    /// SGLD's update of a batch, jem-kernels' one launch against the CPU's pass: one channel and
    /// three, with and without the clamp (which the values make bite).
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn cpu_and_gpu_agree_on_sglds_update() {
        require_gpu();
        let mut report = Report::default();
        for (shape, drift, noise) in [
            ([5, 1, 7, 9], vec![2.5e-3], vec![5e-3]),
            ([4, 3, 8, 8], vec![1e-3, 2e-3, 3e-3], vec![1e-2, 2e-2, 5e-3]),
        ] {
            let inputs = [
                formula(&shape, 1, 0.5, 0.55),
                formula(&shape, 2, 0.0, 30.0),
                formula(&shape, 3, 0.0, 2.0),
            ];
            for clamp in [false, true] {
                let cpu = sgld_update::<Flex>(&inputs, &drift, &noise, clamp);
                let gpu = sgld_update::<Device>(&inputs, &drift, &noise, clamp);
                let what = format!("SGLD's update of {shape:?}, clamp {clamp}");
                report.relative(&what, &cpu, &gpu, 1e-6);
            }
        }
        report.finish();
    }

    /// [`jem_kernels::sgld_update`] on backend B.
    fn sgld_update<B: jem_kernels::FastSgld>(
        inputs: &[TensorData; 3],
        drift: &[f32],
        noise: &[f32],
        clamp: bool,
    ) -> Vec<f32> {
        let device = Default::default();
        let [x, g, eps] = inputs
            .clone()
            .map(|d| Tensor::<B, 4>::from_data(d, &device));
        host(jem_kernels::sgld_update(x, g, eps, drift, noise, clamp))
    }

    /// [`jem_kernels::FastAdam::fast_adam_step`] on backend B: parameter, gradient and, if
    /// `later`, the moments from `inputs`.
    fn adam_update<B: jem_kernels::FastAdam>(
        inputs: &[TensorData; 4],
        later: bool,
        step: jem_kernels::AdamStep,
    ) -> [Vec<f32>; 3] {
        let device = Default::default();
        let [p, g, m, v] = inputs.clone().map(|d| {
            Tensor::<B, 1>::from_data(d, &device)
                .into_primitive()
                .tensor()
        });
        let moments = later.then_some([m, v]);
        B::fast_adam_step(p, g, moments, step)
            .map(|t| host(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t))))
    }

    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn cpu_and_gpu_agree_on_an_adam_step_and_a_jem_training_iteration() {
        require_gpu();
        let mut report = Report::default();
        compare_training(
            &mut report,
            &training_steps::<Cpu>(),
            &training_steps::<Gpu>(),
        );
        report.finish();
    }

    /// What `--device cuda` prints in every output: the GPU, by index.
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU: cargo test --release --features cuda --test gpu -- --ignored"]
    fn outputs_name_the_gpu() {
        require_gpu();
        jem_bench::backend::select("cuda:0").unwrap();
        assert_eq!(jem_bench::backend::name(), "burn-cuda:0");
    }
}
