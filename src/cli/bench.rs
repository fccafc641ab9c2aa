//! The flags of `jem-bench bench`, converted into the library's
//! [`BenchSpec`](jem_bench::bench::BenchSpec).

use super::choices::choices;
use clap::Args;
use jem_attacks::GradMode;
use jem_bench::backend::BenchBackend;
use jem_bench::bench::{self, BenchOp, BenchSpec, KernelsArg};
use jem_bench::model::WrnVariant;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to time.
    #[arg(long, value_parser = choices::<BenchOp>())]
    pub op: BenchOp,
    /// Time this model instead of a seeded Wide-ResNet: a checkpoint (NAME, NAME.safetensors,
    /// results/models/NAME), a graph imported from ONNX (NAME or NAME.onnx beside NAME.json),
    /// or a bare MODEL.onnx (taking [0, 1] pixels). Its image shape and architecture replace
    /// --channels, --size, --depth, --width and --layout; train-step and jem-iteration need a
    /// Wide-ResNet.
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Images per call (MNIST-shaped unless --channels/--size say otherwise).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[arg(long, default_value_t = 10)]
    pub depth: usize,
    #[arg(long, default_value_t = 1)]
    pub width: usize,
    /// The network's layout.
    #[arg(long, default_value = "jem", value_parser = choices::<WrnVariant>())]
    pub layout: WrnVariant,
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
    /// Whose convolutions and LeakyReLU the CPU backend runs, to measure one against another.
    #[arg(long, default_value = "own", value_parser = choices::<KernelsArg>())]
    pub kernels: KernelsArg,
    /// Cut the warm-up (after at least 1 call) and the timed calls (after at least 3, or
    /// `--reps` if fewer) short once this many seconds have passed in each: the slow rows then
    /// take a bounded time. No limit by default.
    #[arg(long)]
    pub max_seconds: Option<f64>,
    /// pgd-step: SGLD steps K of the defence in front of the classifier (0: none).
    #[arg(long, default_value_t = 0)]
    pub k: usize,
    /// pgd-step: how the gradient passes the K steps, `bpda` or `full` (ignored at K = 0).
    #[arg(long, default_value = "bpda")]
    pub grad: GradMode,
    /// pgd-step: chains per image whose logits the defence averages (ignored at K = 0).
    #[arg(long, default_value_t = 5)]
    pub chains: usize,
}

impl BenchArgs {
    /// Runs `bench` on `device`.
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = BenchSpec {
            op: self.op,
            model: self.model,
            batch: self.batch,
            depth: self.depth,
            width: self.width,
            layout: self.layout,
            channels: self.channels,
            size: self.size,
            reps: self.reps,
            warmup: self.warmup,
            kernels: self.kernels,
            max_seconds: self.max_seconds,
            k: self.k,
            grad: self.grad,
            chains: self.chains,
        };
        let timing = bench::run::<B>(spec, device)?;
        println!("{}", serde_json::to_string(&timing)?);
        Ok(())
    }
}
