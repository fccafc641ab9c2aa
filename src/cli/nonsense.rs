//! The flags of `jem-bench nonsense`, converted into the library's
//! [`NonsenseSpec`](jem_bench::nonsense::NonsenseSpec).

use std::path::PathBuf;

use super::defence::DefenceFlags;
use clap::Args;
use jem_attacks::GradMode;
use jem_bench::backend::BenchBackend;
use jem_bench::nonsense::{self, NonsenseSpec};

#[derive(Debug, Clone, Args)]
pub struct NonsenseArgs {
    /// Checkpoints, comma-separated: Wide-ResNets or graphs imported from ONNX (default: the
    /// embedded baseline, JEM and adversarially trained models).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// SGLD sampling steps K before classifying, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub steps: Vec<usize>,
    /// Searches per class.
    #[arg(long, default_value_t = NonsenseSpec::default().per_class)]
    pub per_class: usize,
    /// Iterations per search at most (the ABS code used 10 000; lowered so that a run on a CPU
    /// ends in minutes — searches that reach the threshold stop early anyway).
    #[arg(long, default_value_t = NonsenseSpec::default().max_iters)]
    pub max_iters: usize,
    /// The confidence at which a search stops, in (0, 1].
    #[arg(long, default_value_t = NonsenseSpec::default().threshold)]
    pub threshold: f32,
    /// SGD learning rate and momentum of the search (ABS: 1 and 0.95).
    #[arg(long, default_value_t = NonsenseSpec::default().lr)]
    pub lr: f32,
    #[arg(long, default_value_t = NonsenseSpec::default().momentum)]
    pub momentum: f32,
    /// Gradient through the SGLD steps (K > 0): full (exact, through every step) or bpda (the
    /// steps taken as the identity on the backward pass: cheaper, and weaker as a search).
    #[arg(long, default_value = "full")]
    pub grad: GradMode,
    #[command(flatten)]
    pub defence: DefenceFlags,
    #[arg(long, default_value_t = NonsenseSpec::default().seed)]
    pub seed: u64,
    #[arg(long, default_value = "runs/nonsense")]
    pub out: PathBuf,
}

impl NonsenseArgs {
    /// Runs `nonsense` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = NonsenseSpec {
            models: self.models,
            steps: self.steps,
            per_class: self.per_class,
            max_iters: self.max_iters,
            threshold: self.threshold,
            lr: self.lr,
            momentum: self.momentum,
            grad: self.grad,
            defence: self.defence.spec(),
            seed: self.seed,
            out: self.out,
        };
        println!("{}", nonsense::run::<B>(spec, device)?);
        Ok(())
    }
}
