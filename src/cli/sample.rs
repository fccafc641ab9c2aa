//! The flags of `jem-bench sample`, converted into the library's
//! [`SampleSpec`](jem_bench::sample::SampleSpec).

use std::path::PathBuf;

use clap::Args;
use jem_bench::backend::BenchBackend;
use jem_bench::sample::{self, SampleSpec};

#[derive(Debug, Clone, Args)]
pub struct SampleArgs {
    /// The model to sample from: a checkpoint (NAME, NAME.safetensors or NAME.json) or a graph
    /// imported from ONNX (NAME or NAME.onnx; its SGLD runs with the JEM paper's settings on
    /// its input normalisation's scale).
    #[arg(long)]
    pub model: PathBuf,
    /// Classes to sample, comma-separated (default: every class, one grid row each).
    #[arg(long, value_delimiter = ',')]
    pub class: Vec<usize>,
    /// Samples per class (grid columns).
    #[arg(long, default_value_t = 10)]
    pub per_class: usize,
    /// SGLD steps.
    #[arg(long, default_value_t = 200)]
    pub steps: usize,
    /// SGLD step size α on the network scale (default: the model's training setting).
    #[arg(long)]
    pub sgld_lr: Option<f32>,
    /// SGLD noise σ on the network scale (default: the model's training setting).
    #[arg(long)]
    pub sgld_std: Option<f32>,
    /// Start from the replay buffer of this training run folder (its `state/`) instead of
    /// uniform noise.
    #[arg(long)]
    pub from_buffer: Option<PathBuf>,
    /// Start each row from its class's Gaussian fitted to the model's training images (the
    /// whole training split; JEM++'s informative initialisation) instead of uniform noise.
    #[arg(long, conflicts_with = "from_buffer")]
    pub from_class_gaussian: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The PNG to write; a JSON record goes next to it.
    #[arg(long, default_value = "samples.png")]
    pub out: PathBuf,
    /// The classifier that judges the samples (its probability of each sample's class, and its
    /// penultimate features for the Fréchet distance to the test images); `none` skips both.
    /// The default is the embedded baseline, trained without any generative term. A Wide-ResNet
    /// checkpoint: an ONNX graph exposes no penultimate features.
    #[arg(long, default_value = "results/models/baseline")]
    pub judge: String,
    /// The judge's probability of the intended class that counts a sample as that class.
    #[arg(long, default_value_t = 0.9)]
    pub judge_threshold: f64,
    /// Test images (the first N) that the samples' Fréchet distance is measured against.
    #[arg(long, default_value_t = 10_000)]
    pub reference_images: usize,
}

impl SampleArgs {
    /// Runs `sample` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = SampleSpec {
            model: self.model,
            class: self.class,
            per_class: self.per_class,
            steps: self.steps,
            sgld_lr: self.sgld_lr,
            sgld_std: self.sgld_std,
            from_buffer: self.from_buffer,
            from_class_gaussian: self.from_class_gaussian,
            seed: self.seed,
            out: self.out,
            judge: self.judge,
            judge_threshold: self.judge_threshold,
            reference_images: self.reference_images,
        };
        println!("{}", sample::run::<B>(spec, device)?);
        Ok(())
    }
}
