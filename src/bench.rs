//! `jem-bench bench`: times one hot operation of the suite on a Wide-ResNet — a seeded one of
//! the shape asked for, or a model from a file: a checkpoint, a graph imported from ONNX, or a
//! bare `.onnx` file — and prints one JSON line: a forward pass, a training step (forward, backward, Adam), the input gradient
//! d(Σ LSE)/dx that drives SGLD and the attacks, one SGLD step, one whole JEM training iteration
//! (20 SGLD steps on the persistent chains, then the JEM loss, backward and Adam), or one PGD
//! gradient of the cross-entropy through the test-time SGLD defence (K steps in n chains,
//! gradient by BPDA or through every step). The last two call the code that training and the
//! attacks run (`JemObjective`, `Defended`), so that the benchmark times what the suite runs.
//! `benches/pytorch/compare.py` runs it beside the same operation in PyTorch
//! (`benches/pytorch/ops.py`), one process per measurement (so that each side's peak memory is
//! its own), and writes the comparison table.
//!
//! With `model`, the network is the file's; the two operations that train (training step, JEM
//! iteration) need a Wide-ResNet's trainable weights and refuse an ONNX graph. The same rows on
//! a checkpoint and on its export to ONNX time the interpreter against the native network
//! (`benches/onnx_native.py`).
//!
//! Threads: the CPU backend computes on rayon's global pool, sized by `RAYON_NUM_THREADS`; the
//! JEM iteration's SGLD shards (`--sgld-threads` of training) are given the same count.

use crate::settings;
use crate::Choice;
use std::path::PathBuf;
use std::time::Instant;

use burn::module::{AutodiffModule, Module};
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use jem_attacks::Classifier;
use jem_attacks::{noise, AttackLoss, GradMode, Model, SgldConfig, SgldSampler, SgldTarget};
use jem_datasets::ImageSet;
use jem_kernels::Implementation;
use rand::SeedableRng;
use serde::Serialize;

use crate::backend::BenchBackend;
use crate::defended::{DefenceSpec, Defended};
use crate::energy::lse_input_gradient;
use crate::model::{LoadedNetwork, WideResNet, WideResNetConfig, WrnVariant};
use crate::train::{adam, cross_entropy, descend, JemConfig, JemObjective};
use crate::train::{Objective, Step};

mod network;
use network::{timed_network, Timed};

/// The operations timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// One JEM training iteration (Algorithm 1 of Grathwohl et al. 2020) as `train --kind jem`
    /// runs it with the official settings: `--batch` chains drawn from the replay buffer
    /// (10 000 chains, 5 % restarted from noise), 20 SGLD steps on them (α = 1, σ = 0.01),
    /// then CE(f(x), y) − (mean LSE f(x) − mean LSE f(x̂)) on data and samples in one forward
    /// pass, backward to every parameter, one Adam step.
    JemIteration,
    /// One PGD gradient: d Σ CE / dx through the test-time SGLD defence, as the attacks take
    /// it (`--k` steps in `--chains` chains, logits averaged, `--grad bpda|full`; K = 0: the
    /// plain classifier).
    PgdStep,
}

impl Choice for BenchOp {
    const WHAT: &'static str = "operation";

    const ALL: &'static [Self] = &[
        BenchOp::Forward,
        BenchOp::TrainStep,
        BenchOp::InputGradient,
        BenchOp::SgldStep,
        BenchOp::JemIteration,
        BenchOp::PgdStep,
    ];

    /// The operation's name (`train-step`, …), as the command line and the timings call it.
    fn name(self) -> &'static str {
        match self {
            BenchOp::Forward => "forward",
            BenchOp::TrainStep => "train-step",
            BenchOp::InputGradient => "input-gradient",
            BenchOp::SgldStep => "sgld-step",
            BenchOp::JemIteration => "jem-iteration",
            BenchOp::PgdStep => "pgd-step",
        }
    }

    /// What the operation computes, in a sentence (the command line's help).
    fn description(self) -> &'static str {
        match self {
            BenchOp::Forward => "Logits of a batch (no autodiff)",
            BenchOp::TrainStep => {
                "Cross-entropy forward, backward to every parameter, one Adam step"
            }
            BenchOp::InputGradient => {
                "d(Σ_i LogSumExp f(x_i))/dx, parameters frozen: the SGLD and attack gradient"
            }
            BenchOp::SgldStep => {
                "One SGLD step on the LogSumExp (the input gradient, then the noisy update)"
            }
            BenchOp::JemIteration => {
                "One JEM training iteration (Algorithm 1 of Grathwohl et al. 2020) as `train \
                 --kind jem` runs it with the official settings: `--batch` chains drawn from the \
                 replay buffer (10 000 chains, 5 % restarted from noise), 20 SGLD steps on them \
                 (α = 1, σ = 0.01), then CE(f(x), y) − (mean LSE f(x) − mean LSE f(x̂)) on data \
                 and samples in one forward pass, backward to every parameter, one Adam step"
            }
            BenchOp::PgdStep => {
                "One PGD gradient: d Σ CE / dx through the test-time SGLD defence, as the \
                 attacks take it (`--k` steps in `--chains` chains, logits averaged, `--grad \
                 bpda|full`; K = 0: the plain classifier)"
            }
        }
    }
}

/// Floating-point operations of one call, from F, the forward FLOPs of one batch of `--batch`
/// images. A backward pass to the input costs about F more, one to the weights too: an input
/// gradient is 2F, a training step 3F (the usual convention). What each row adds:
/// - JEM iteration: η input gradients on the `batch` chains (η·2F), then a training step on
///   data and samples in one batch of twice the size (3·2F): (2η + 6)F, 46F at η = 20. The
///   replay buffer, the noise and Adam are not counted.
/// - PGD step, K = 0: one input gradient of the cross-entropy, 2F. With K > 0 every chain
///   copy of the batch costs F per forward pass, so n chains cost n·F:
///   - `bpda`: K SGLD steps (2F each) and the gradient at x_K (2F): n·(2K + 2)F;
///   - `full`: as `bpda`, plus, per step on the way back, the Hessian-vector product that
///     `jem_attacks::SgldDefence` forms without double backward (burn has none): the WRN's
///     linearisation at the step's state (recorded during the step's forward pass) run forward
///     on the vector (F) and back to its input (F), so n·(4K + 2)F — the count of PyTorch's
///     exact double backward too (a backward of the step's forward and backward passes, about
///     2F per step back), which ops.py reports for its side.
fn flops(args: &BenchSpec, forward: u64) -> u64 {
    let n = args.chains as u64;
    let k = args.k as u64;
    match args.op {
        BenchOp::Forward => forward,
        BenchOp::InputGradient | BenchOp::SgldStep => 2 * forward,
        BenchOp::TrainStep => 3 * forward,
        BenchOp::JemIteration => (2 * JemConfig::default().sgld_steps as u64 + 6) * forward,
        BenchOp::PgdStep if k == 0 => 2 * forward,
        BenchOp::PgdStep => match args.grad {
            GradMode::Bpda => n * (2 * k + 2) * forward,
            GradMode::Full => n * (4 * k + 2) * forward,
        },
    }
}

/// The row's name in the comparison table: the operation, and for a PGD step its K and
/// gradient mode (`pgd-step k10 full`; `pgd-step k0` has no mode).
fn row(args: &BenchSpec) -> String {
    match args.op {
        BenchOp::PgdStep if args.k == 0 => "pgd-step k0".into(),
        BenchOp::PgdStep => format!("pgd-step k{} {}", args.k, args.grad),
        op => op.name().into(),
    }
}

/// What `bench` times: one operation on a seeded Wide-ResNet (or the network of `model`), its
/// shape and batch, how many calls, on whose kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSpec {
    /// What to time.
    pub op: BenchOp,
    /// Time the network of this file instead of a seeded Wide-ResNet: a checkpoint (`NAME`,
    /// `NAME.safetensors`, an embedded `results/models/NAME`), a graph imported from ONNX
    /// (`NAME`, `NAME.onnx` beside its sidecar), or a bare `.onnx` file (no sidecar: [0, 1]
    /// pixels straight into the graph). Its image shape replaces `channels` and `size`; its
    /// architecture `depth`, `width` and `layout`.
    pub model: Option<PathBuf>,
    /// Images per call.
    pub batch: usize,
    pub depth: usize,
    pub width: usize,
    /// The network's layout (JEM's or RobustBench's, with BatchNorm).
    pub layout: WrnVariant,
    pub channels: usize,
    /// Image height and width.
    pub size: usize,
    /// Timed calls (after the warm-up); the median is reported.
    pub reps: usize,
    /// Untimed calls first (allocation pools, caches).
    pub warmup: usize,
    /// Whose convolutions and LeakyReLU the CPU backend runs: jem-kernels' (`Own`, what every
    /// other command uses), burn's (`Burn`), or burn's forward operations with the convolution
    /// gradients composed from a forward convolution and a matrix product as on a GPU
    /// (`Portable`), to measure one against another.
    pub kernels: KernelsArg,
    /// Cut the warm-up (after at least 1 call) and the timed calls (after at least 3, or
    /// `reps` if fewer) short once this many seconds have passed in each.
    pub max_seconds: Option<f64>,
    /// pgd-step: SGLD steps K of the defence in front of the classifier (0: none).
    pub k: usize,
    /// pgd-step: how the gradient passes the K steps (ignored at K = 0).
    pub grad: GradMode,
    /// pgd-step: chains per image whose logits the defence averages (ignored at K = 0).
    pub chains: usize,
}

/// Whose convolutions and LeakyReLU the CPU backend runs (see [`BenchSpec::kernels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelsArg {
    Own,
    Burn,
    /// burn's forward operations, gradients composed as on the GPU.
    Portable,
}

impl Choice for KernelsArg {
    const WHAT: &'static str = "kernel set";

    const ALL: &'static [Self] = &[KernelsArg::Own, KernelsArg::Burn, KernelsArg::Portable];

    fn name(self) -> &'static str {
        match self {
            KernelsArg::Own => "own",
            KernelsArg::Burn => "burn",
            KernelsArg::Portable => "portable",
        }
    }

    fn description(self) -> &'static str {
        match self {
            KernelsArg::Own => {
                "jem-kernels' convolutions and LeakyReLU (what every other command uses)"
            }
            KernelsArg::Burn => "burn's own convolutions and LeakyReLU",
            KernelsArg::Portable => {
                "burn's forward operations, the convolution gradients composed from a forward \
                 convolution and a matrix product as on a GPU"
            }
        }
    }
}

/// One timed operation, with every setting it ran at: what `bench` prints as one JSON line
/// (serialise it).
#[derive(Debug, Serialize)]
pub struct Timing {
    op: BenchOp,
    /// The table's row: `op`, with K and the gradient mode for a PGD step.
    row: String,
    /// The architecture (`WRN-10-1`), or `ONNX FILE` for a graph.
    model: String,
    /// The file timed, with `--model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    model_file: Option<String>,
    /// `C×H×W` of the images.
    input: String,
    batch: usize,
    threads: usize,
    kernels: KernelsArg,
    /// Timed calls made (fewer than `--reps` when `--max-seconds` ran out).
    reps: usize,
    median_ms: f64,
    min_ms: f64,
    /// `null` for an ONNX graph, whose FLOPs jem-bench does not count.
    gflop_per_call: Option<f64>,
    backend: String,
    /// Which kernels computed ([`BenchBackend::kernel_path`]): `avx2+gemm-avx2` is what an
    /// AVX2-only CPU runs; on CUDA, `f32` or `tf32`.
    isa: String,
    /// jem-iteration: SGLD steps η per iteration.
    #[serde(skip_serializing_if = "Option::is_none")]
    sgld_steps: Option<usize>,
    /// pgd-step: the defence's K.
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<usize>,
    /// pgd-step with K > 0: gradient mode and chains per image.
    #[serde(skip_serializing_if = "Option::is_none")]
    grad: Option<GradMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chains: Option<usize>,
}

/// At least this many timed calls, whatever `--max-seconds` says, so that a median exists.
const MIN_REPS: usize = 3;

/// How often an operation is called: `warmup` times, then up to `reps` times; `max_seconds`
/// cuts either part short once that long has passed in it (keeping at least 1 warm-up call
/// and 3 timed ones).
#[derive(Clone, Copy)]
struct Repeats {
    warmup: usize,
    reps: usize,
    max_seconds: Option<f64>,
}

impl Repeats {
    /// The wall times of the timed calls of `call`, in ms.
    fn time(self, mut call: impl FnMut()) -> Vec<f64> {
        let within = |since: Instant| {
            self.max_seconds
                .is_none_or(|s| since.elapsed().as_secs_f64() < s)
        };
        let started = Instant::now();
        for i in 0..self.warmup {
            // One call fills the allocation pools and caches; a slow row needs no more.
            if i >= 1 && !within(started) {
                break;
            }
            call();
        }
        let started = Instant::now();
        let mut times = Vec::with_capacity(self.reps);
        while times.len() < self.reps && (times.len() < MIN_REPS || within(started)) {
            let t = Instant::now();
            call();
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times
    }
}

/// Refuses settings no benchmark can run, naming the field.
fn validate(args: &BenchSpec) -> anyhow::Result<()> {
    for (field, value) in [
        ("batch", args.batch),
        ("reps", args.reps),
        ("width", args.width),
        ("channels", args.channels),
        ("size", args.size),
    ] {
        settings::at_least_one(field, value)?;
    }
    if let Some(s) = args.max_seconds {
        settings::finite_non_negative("max_seconds", s)?;
    }
    if args.op == BenchOp::PgdStep && args.k > 0 {
        settings::at_least_one("chains", args.chains)?;
    }
    if args.k > 100 {
        let problem = "expected at most 100 SGLD steps (a row times one PGD step, whose cost \
                       grows with K: beyond 100 it measures nothing the others do not)";
        return Err(settings::InvalidSetting::new("k", args.k.to_string(), problem).into());
    }
    // The timed batch's images (chains of them at K > 0), before any activation: a size or
    // batch that cannot hold even those is refused, not an aborted allocation.
    let chains = if args.k > 0 { args.chains } else { 1 } as u128;
    let image = args.channels as u128 * (args.size as u128).pow(2) * 4;
    settings::fits_in_memory(
        "batch",
        args.batch,
        chains * args.batch as u128 * image,
        &format!(
            "{} × {chains} images of {}×{}×{}, for the images alone,",
            args.batch, args.channels, args.size, args.size
        ),
        "lower --batch, --size or --chains",
    )?;
    Ok(())
}

/// Times the operation `args` names on `device` (the command line prints it as one JSON line).
pub fn run<B: BenchBackend>(args: BenchSpec, device: &B::Device) -> anyhow::Result<Timing> {
    validate(&args)?;
    jem_kernels::set_implementation(match args.kernels {
        KernelsArg::Own => Implementation::Own,
        KernelsArg::Burn => Implementation::Burn,
        KernelsArg::Portable => Implementation::Portable,
    });
    let timed = timed_network::<B>(&args, device)?;
    let (name, shape, flops_per_image) = (timed.name.clone(), timed.shape, timed.flops_per_image);
    let times = time_op::<B>(&args, timed, device)?;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    // The median as Python's `statistics.median` takes it (ops.py's): the mean of the two
    // middle times for an even count.
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 0 {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    };
    let pgd = args.op == BenchOp::PgdStep;
    let defended = pgd && args.k > 0;
    let [c, h, w] = shape;
    let timing = Timing {
        op: args.op,
        row: row(&args),
        model: name,
        model_file: args.model.as_ref().map(|p| p.display().to_string()),
        input: format!("{c}×{h}×{w}"),
        batch: args.batch,
        threads: rayon_threads(),
        kernels: args.kernels,
        reps: times.len(),
        median_ms: median,
        min_ms: sorted[0],
        gflop_per_call: flops_per_image.map(|f| flops(&args, f * args.batch as u64) as f64 / 1e9),
        backend: B::recorded_name(device),
        isa: B::kernel_path(),
        sgld_steps: (args.op == BenchOp::JemIteration).then(|| JemConfig::default().sgld_steps),
        k: pgd.then_some(args.k),
        grad: defended.then_some(args.grad),
        chains: defended.then_some(args.chains),
    };
    Ok(timing)
}

/// The wall times (ms) of the timed calls of `args.op` on `timed`'s network and a batch of
/// uniform images.
fn time_op<B: BenchBackend>(
    args: &BenchSpec,
    timed: Timed<B>,
    device: &B::Device,
) -> anyhow::Result<Vec<f64>> {
    let [c, h, w] = timed.shape;
    let shape = [args.batch, c, h, w];
    let model = timed.network;
    // The same images and labels in every run: the time of a step through the defence
    // depends on its values (the embedded baseline's `pgd-step k1 full` took 120 to 640 ms
    // with unseeded images from one run to the next).
    B::seed(device, 0);
    let x = Tensor::<B, 4>::random(shape, Distribution::Uniform(0.0, 1.0), device);
    let xi: Tensor<B::InnerBackend, 4> = x.clone().inner();
    let repeats = Repeats {
        warmup: args.warmup,
        reps: args.reps,
        max_seconds: args.max_seconds,
    };
    let classes = timed.classes as f64;
    let random_labels =
        || Tensor::<B, 1, Int>::random([args.batch], Distribution::Uniform(0.0, classes), device);
    // The two operations that train need a Wide-ResNet's trainable weights.
    let trainable = |model: LoadedNetwork<B>| match model {
        LoadedNetwork::Wrn(network) => Ok(network),
        LoadedNetwork::Onnx(_) => Err(settings::refusal(
            "model",
            args.model
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            anyhow::anyhow!(
                "{} trains the network's weights, which jem-bench does for its own Wide-ResNets \
                 only (an ONNX graph's weights are constants of the imported graph); time \
                 forward, input-gradient, sgld-step or pgd-step",
                args.op.name()
            ),
        )),
    };
    Ok(match args.op {
        BenchOp::Forward => {
            let m = model.valid();
            repeats.time(|| {
                m.logits(xi.clone()).into_data();
            })
        }
        BenchOp::TrainStep => {
            let model = trainable(model)?;
            let y = random_labels();
            let mut optim = adam().init::<B, WideResNet<B>>();
            let mut model = Some(model);
            repeats.time(|| {
                let m = model.take().expect("model");
                let loss = cross_entropy(m.forward(x.clone()), y.clone());
                let m = descend(m, &mut optim, loss, 1e-4);
                // Wait for the update (lazy backends would otherwise time nothing).
                m.linear.weight.val().into_data();
                model = Some(m);
            })
        }
        BenchOp::InputGradient => {
            let m = model.no_grad();
            repeats.time(|| {
                lse_input_gradient(&m, xi.clone()).into_data();
            })
        }
        BenchOp::SgldStep => {
            let m = model.no_grad();
            let sampler = SgldSampler::new(SgldConfig {
                steps: 1,
                step_size: 1.0,
                noise: 0.01,
                pixel_scale: timed.normalization.std.clone(),
                clamp: false,
            });
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            repeats.time(|| {
                let eps = noise::gaussian(shape, &mut rng, device);
                sampler
                    .step::<B, _>(&m, xi.clone(), &SgldTarget::Marginal, eps)
                    .into_data();
            })
        }
        BenchOp::JemIteration => {
            let model = trainable(model)?;
            let cfg = model.config().clone();
            time_jem_iteration(args, &cfg, model, x, repeats, device)?
        }
        BenchOp::PgdStep => {
            // The defence as `robust` builds it for a model trained with the official JEM
            // settings (α = 1, σ = 0.01 on the network's scale), n chains, no initial noise.
            let sgld = JemConfig::default().sampler(&timed.normalization).config;
            let defence = DefenceSpec {
                chains: args.chains.max(1),
                ..DefenceSpec::default()
            };
            let defended = Defended::new(model, Some(&sgld), args.k, args.grad, &defence)?;
            let y = random_labels();
            // The per-example loss PGD maximises (`--loss ce`), of the chain-averaged logits.
            let loss = |logits: Tensor<B, 2>| AttackLoss::CrossEntropy.of(logits, y.clone());
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            repeats.time(|| {
                defended
                    .loss_gradient(xi.clone(), &loss, &mut rng)
                    .0
                    .into_data();
            })
        }
    })
}

/// One JEM training iteration after another, as `train --kind jem` runs them, with the
/// official settings and, on the CPU, the SGLD shards on as many threads as the rest of the
/// row (training's default, one per core, would ignore `RAYON_NUM_THREADS`); on a GPU one shard,
/// as training runs it there.
fn time_jem_iteration<B: BenchBackend>(
    args: &BenchSpec,
    cfg: &WideResNetConfig,
    model: WideResNet<B>,
    x: Tensor<B, 4>,
    repeats: Repeats,
    device: &B::Device,
) -> anyhow::Result<Vec<f64>> {
    let config = JemConfig {
        sgld_threads: if B::default_sgld_shards() == 1 {
            1
        } else {
            rayon_threads()
        },
        ..JemConfig::default()
    };
    let mut objective = JemObjective::new(config, f64::INFINITY);
    // The batch as a training set: `prepare` sizes the replay buffer from its shape.
    let labels: Vec<u8> = (0..args.batch).map(|i| (i % 10) as u8).collect();
    let [_, channels, height, width] = x.dims();
    let data = ImageSet {
        name: "bench".into(),
        images: x.clone().inner().to_data().to_vec().expect("f32 pixels"),
        labels: labels.clone(),
        channels,
        height,
        width,
        class_names: (0..10).map(|c| c.to_string()).collect(),
    };
    Objective::<B>::prepare(&mut objective, cfg, &data, 0)?;
    let y = Tensor::<B, 1, Int>::from_data(
        TensorData::new(labels.iter().map(|&l| l as i64).collect(), [args.batch]),
        device,
    );
    let mut optim = adam().init::<B, WideResNet<B>>();
    let (mut model, mut iteration) = (Some(model), 0);
    Ok(repeats.time(|| {
        let m = model.take().expect("model");
        // Each call a fresh draw of chains and noise, as successive iterations.
        let step = Step {
            iteration,
            seed: iteration as u64,
        };
        let (loss, _) = objective.loss(&m, x.clone(), y.clone(), step);
        let m = descend(m, &mut optim, loss, 1e-4);
        m.linear.weight.val().into_data();
        model = Some(m);
        iteration += 1;
    }))
}

/// The size of rayon's global pool: `RAYON_NUM_THREADS`, else the number of cores.
fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
