//! The flags of `jem-bench ood`, converted into the library's [`OodSpec`](jem_bench::ood::OodSpec).

use super::choices::choices;
use std::path::PathBuf;

use super::defence::DefenceFlags;
use clap::Args;
use jem_bench::backend::BenchBackend;
use jem_bench::ood::{self, OodSpec, Score};

#[derive(Debug, Clone, Args)]
pub struct OodArgs {
    /// Checkpoints, comma-separated: Wide-ResNets or graphs imported from ONNX (default: the
    /// embedded baseline, JEM and adversarially trained models).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// In-distribution test data (default: each model's own data set).
    #[arg(long = "in", value_name = "DATA")]
    pub in_data: Option<String>,
    /// OOD sets, comma-separated: a data set's test split (fashion-mnist, mnist, cifar10:DIR,
    /// …) or seeded noise: uniform (pixels U(0, 1)), gaussian (N(0.5, 0.25²) clipped to
    /// [0, 1]), interp (mean of two in-distribution test images of different classes), constant
    /// (one random grey level per image). Named --ood because --out is the output folder in
    /// every command.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fashion-mnist,uniform,gaussian,interp,constant"
    )]
    pub ood: Vec<String>,
    /// SGLD sampling steps K before scoring, comma-separated; 0 is the plain classifier. For
    /// K > 0 every score comes from the chain-averaged logits, and grad-norm differentiates
    /// through the K steps (full mode: slow).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub steps: Vec<usize>,
    /// Scores, comma-separated: lse (the LogSumExp of the logits, log p(x) up to a constant),
    /// max-softmax (max_y p(y|x)), grad-norm (−‖∂ log p(x)/∂x‖₂).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lse,max-softmax,grad-norm",
        value_parser = choices::<Score>()
    )]
    pub scores: Vec<Score>,
    /// Images per set: the first N in-distribution test images, and N of each OOD set.
    #[arg(long, default_value_t = 1000)]
    pub n: usize,
    /// Images per forward pass (K > 0 runs --chains times as many).
    #[arg(long, default_value_t = 100)]
    pub batch_size: usize,
    #[command(flatten)]
    pub defence: DefenceFlags,
    /// Seed of the noise sets and of the SGLD noise (K > 0).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output folder: ood.csv, histograms.{png,svg}, settings.json.
    #[arg(long, default_value = "runs/ood")]
    pub out: PathBuf,
}

impl OodArgs {
    /// Runs `ood` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = OodSpec {
            models: self.models,
            in_data: self.in_data,
            ood: self.ood,
            steps: self.steps,
            scores: self.scores,
            n: self.n,
            batch_size: self.batch_size,
            defence: self.defence.spec(),
            seed: self.seed,
            out: self.out,
        };
        // Progress on stderr: stdout carries the results, printed once they are written.
        let summary = ood::run::<B>(spec, device, &|line| eprintln!("{line}"))?;
        println!("{summary}");
        Ok(())
    }
}
