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
