//! The flags of `jem-bench calibrate`, converted into the library's
//! [`CalibrateSpec`](jem_bench::calibration::CalibrateSpec).

use std::path::PathBuf;

use super::defence::DefenceFlags;
use clap::Args;
use jem_bench::backend::BenchBackend;
use jem_bench::calibration::{self, CalibrateSpec};

#[derive(Debug, Clone, Args)]
pub struct CalibrateArgs {
    /// Checkpoints, comma-separated: Wide-ResNets or graphs imported from ONNX (default: the
    /// embedded baseline, JEM and adversarially trained models).
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<PathBuf>,
    /// Test data (default: each model's own data set): mnist, fashion-mnist, cifar10:DIR, …
    #[arg(long)]
    pub data: Option<String>,
    /// SGLD sampling steps K before classifying, comma-separated; 0 is the plain classifier.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub steps: Vec<usize>,
    /// Evaluate the first N test images.
    #[arg(long, default_value_t = CalibrateSpec::default().n)]
    pub n: usize,
    /// Images per forward pass (K > 0 runs --chains times as many).
    #[arg(long, default_value_t = CalibrateSpec::default().batch_size)]
    pub batch_size: usize,
    #[command(flatten)]
    pub defence: DefenceFlags,
    /// Seed of the SGLD noise (K > 0); K = 0 draws nothing.
    #[arg(long, default_value_t = CalibrateSpec::default().seed)]
    pub seed: u64,
    /// Output folder: calibration.csv, calibration-bins.csv, reliability.{png,svg},
    /// settings.json.
    #[arg(long, default_value = "runs/calibrate")]
    pub out: PathBuf,
    /// Run K beyond 100 SGLD steps (far beyond what evaluations use; refused without it).
    #[arg(long)]
    pub allow_long: bool,
}

impl CalibrateArgs {
    /// Runs `calibrate` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = CalibrateSpec {
            models: self.models,
            data: self.data,
            steps: self.steps,
            n: self.n,
            batch_size: self.batch_size,
            defence: self.defence.spec(),
            seed: self.seed,
            allow_long: self.allow_long,
            out: self.out,
        };
        // Progress on stderr: stdout carries the results, printed once they are written.
        let summary = calibration::run::<B>(spec, device, &|line| eprintln!("{line}"))?;
        println!("{summary}");
        Ok(())
    }
}
