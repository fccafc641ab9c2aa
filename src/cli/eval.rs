//! `jem-bench eval`: clean accuracy, NLL, Brier score and ECE (15 bins) of one model on a test
//! set — a Wide-ResNet checkpoint or a graph imported from ONNX, through the same code.

use std::path::PathBuf;

use burn::module::Module;
use clap::Args;
use jem_bench::backend::BenchBackend;
use jem_bench::metrics;
use jem_bench::model::ModelInfo;
use jem_bench::settings;

#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// The model: a checkpoint (NAME, NAME.safetensors or NAME.json) or a graph imported from
    /// ONNX (NAME or NAME.onnx, written by `jem-bench import MODEL.onnx`).
    #[arg(long)]
    pub model: PathBuf,
    /// Data set (default: the one the model was trained or imported for).
    #[arg(long)]
    pub data: Option<String>,
    /// Evaluate only the first N test images.
    #[arg(long)]
    pub n: Option<usize>,
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Print the metrics as JSON.
    #[arg(long)]
    pub json: bool,
}

impl EvalArgs {
    /// Runs `eval` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        settings::at_least_one("batch_size", self.batch_size)?;
        let (model, info) =
            ModelInfo::load_setting::<B::InnerBackend>(&self.model, "model", device)?;
        let name = self.model.display().to_string();
        let (spec, mut set) =
            jem_bench::test_set::test_split(&name, &info, "data", self.data.as_deref())?;
        if let Some(n) = self.n {
            set = settings::first_images(&set, "n", n, &format!("the test images of {spec}"))?;
        }
        let m = metrics::evaluate(&model, &set, self.batch_size, device);
        anyhow::ensure!(
            m.nll.is_finite() && m.ece.is_finite(),
            "{}: the model's outputs are not finite on {} (NLL {}, ECE {}); its weights or input \
             normalisation are broken",
            info.file.display(),
            set.name,
            m.nll,
            m.ece
        );
        if self.json {
            println!("{}", serde_json::to_string_pretty(&m)?);
        } else {
            println!(
                "model:    {} ({})",
                info.file.display(),
                info.describe(model.num_params())
            );
            println!("data:     {} (n = {})", set.name, m.n);
            println!("accuracy: {:.2} %", 100.0 * m.accuracy);
            println!("nll:      {:.4} nats", m.nll);
            println!("brier:    {:.4}", m.brier);
            println!(
                "ece:      {:.2} % ({} bins)",
                100.0 * m.ece,
                metrics::ECE_BINS
            );
        }
        Ok(())
    }
}
