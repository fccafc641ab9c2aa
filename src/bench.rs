//! `jem-bench bench`: times one hot operation of the suite on a Wide-ResNet — a forward pass,
//! a training step (forward, backward, Adam), the input gradient d(Σ LSE)/dx that drives SGLD
//! and the attacks, or one SGLD step — and prints one JSON line. `benches/pytorch/compare.py`
//! runs it beside the same operation in PyTorch, one process per measurement (so that each
//! side's peak memory is its own), and writes the comparison table.
//!
//! Threads: the CPU backend computes on rayon's global pool, sized by `RAYON_NUM_THREADS`.

use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Distribution, Int, Tensor};
use clap::Args;
use jem_attacks::{noise, SgldConfig, SgldSampler, SgldTarget};
use jem_kernels::Convolution;
use rand::SeedableRng;
use serde::Serialize;

use crate::backend::{self, Inference, Train};
use crate::energy::lse_input_gradient;
use crate::model::{InputNormalization, WideResNetConfig};
use crate::train::cross_entropy;

/// The operations timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchOp {
    /// Logits of a batch (no autodiff).
    Forward,
    /// Cross-entropy forward, backward to every parameter, one Adam step.
    TrainStep,
    /// d(Σ_i LogSumExp f(x_i))/dx, parameters frozen: the SGLD and attack gradient.
    InputGradient,
    /// One SGLD step on the LogSumExp (the input gradient, then the noisy update).
    SgldStep,
}

impl BenchOp {
    /// Floating-point operations of one call, from the forward pass's F: a backward to the
    /// input costs about F more, one to the weights too (so 2F and 3F, the usual convention).
    fn flops(self, forward: u64) -> u64 {
        match self {
            BenchOp::Forward => forward,
            BenchOp::InputGradient | BenchOp::SgldStep => 2 * forward,
            BenchOp::TrainStep => 3 * forward,
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to time.
    #[arg(long, value_enum)]
    pub op: BenchOp,
    /// Images per call (MNIST-shaped unless --channels/--size say otherwise).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[arg(long, default_value_t = 10)]
    pub depth: usize,
    #[arg(long, default_value_t = 1)]
    pub width: usize,
    #[arg(long, default_value_t = 1)]
    pub channels: usize,
    /// Image height and width.
    #[arg(long, default_value_t = 28)]
    pub size: usize,
    /// Timed calls (after the warm-up); the median is reported.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Untimed calls first (allocation pools, caches).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Whose convolution the CPU backend runs: jem-kernels' (`own`, what every other command
    /// uses) or burn's (`burn`), to measure one against the other.
    #[arg(long, value_enum, default_value_t = ConvolutionArg::Own)]
    pub convolution: ConvolutionArg,
}

/// `--convolution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConvolutionArg {
    Own,
    Burn,
}

#[derive(Debug, Serialize)]
struct Timing {
    op: BenchOp,
    model: String,
    batch: usize,
    threads: usize,
    convolution: ConvolutionArg,
    reps: usize,
    median_ms: f64,
    min_ms: f64,
    gflop_per_call: f64,
    backend: String,
}

/// Runs `call` `warmup + reps` times; the wall times of the last `reps`, in ms.
fn time(warmup: usize, reps: usize, mut call: impl FnMut()) -> Vec<f64> {
    for _ in 0..warmup {
        call();
    }
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            call();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.batch >= 1, "--batch: expected at least 1, found 0");
    anyhow::ensure!(args.reps >= 1, "--reps: expected at least 1, found 0");
    jem_kernels::set_convolution(match args.convolution {
        ConvolutionArg::Own => Convolution::Own,
        ConvolutionArg::Burn => Convolution::Burn,
    });
    let device = backend::device();
    let cfg = WideResNetConfig::new(args.depth, args.width, args.channels, 10);
    cfg.blocks_per_stage()
        .map_err(|e| anyhow::anyhow!("--depth {}: {e}", args.depth))?;
    let shape = [args.batch, args.channels, args.size, args.size];
    let mut model = Some(cfg.init_seeded::<Train>(0, &device)?);
    let x = Tensor::<Train, 4>::random(shape, Distribution::Uniform(0.0, 1.0), &device);
    let xi: Tensor<Inference, 4> = x.clone().inner();
    let times = match args.op {
        BenchOp::Forward => {
            let m = model.take().expect("model").valid();
            time(args.warmup, args.reps, || {
                m.forward(xi.clone()).into_data();
            })
        }
        BenchOp::TrainStep => {
            let y = Tensor::<Train, 1, Int>::random(
                [args.batch],
                Distribution::Uniform(0.0, 10.0),
                &device,
            );
            let mut optim = AdamConfig::new().init::<Train, _>();
            time(args.warmup, args.reps, || {
                let m = model.take().expect("model");
                let loss = cross_entropy(m.forward(x.clone()), y.clone());
                let grads = GradientsParams::from_grads(loss.backward(), &m);
                let m = optim.step(1e-4, m, grads);
                // Wait for the update (lazy backends would otherwise time nothing).
                m.linear.weight.val().into_data();
                model = Some(m);
            })
        }
        BenchOp::InputGradient => {
            let m = model.take().expect("model").no_grad();
            time(args.warmup, args.reps, || {
                lse_input_gradient(&m, xi.clone()).into_data();
            })
        }
        BenchOp::SgldStep => {
            let m = model.take().expect("model").no_grad();
            let sampler = SgldSampler::new(SgldConfig {
                steps: 1,
                step_size: 1.0,
                noise: 0.01,
                pixel_scale: InputNormalization::symmetric(args.channels).std,
                clamp: false,
            });
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            time(args.warmup, args.reps, || {
                let eps = noise::gaussian(shape, &mut rng, &device);
                sampler
                    .step::<Train, _>(&m, xi.clone(), &SgldTarget::Marginal, eps)
                    .into_data();
            })
        }
    };
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let forward = cfg.forward_flops(args.size, args.size)? * args.batch as u64;
    let timing = Timing {
        op: args.op,
        model: cfg.name(),
        batch: args.batch,
        threads: rayon_threads(),
        convolution: args.convolution,
        reps: args.reps,
        median_ms: sorted[sorted.len() / 2],
        min_ms: sorted[0],
        gflop_per_call: args.op.flops(forward) as f64 / 1e9,
        backend: backend::name(),
    };
    println!("{}", serde_json::to_string(&timing)?);
    Ok(())
}

/// The size of rayon's global pool: `RAYON_NUM_THREADS`, else the number of cores.
fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
