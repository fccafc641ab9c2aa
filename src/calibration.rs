//! `jem-bench calibrate`: how well each model's confidence matches its accuracy, the first of
//! JEM's three claims (Grathwohl et al. 2020, "Calibration": a JEM is better calibrated than the
//! classifier it is built on). Per model and number of SGLD sampling steps K (0: the plain
//! classifier; K > 0: the JEM-K defence, whose chain-averaged logits are then the prediction):
//! accuracy, NLL, Brier score and ECE over 15 equal-width confidence bins, with the bins
//! themselves and a reliability diagram (Guo et al. 2017) of every model × K in one figure.

mod diagram;

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::activation::log_softmax;
use jem_attacks::{GradMode, Model};
use rand::SeedableRng;
use serde::Serialize;

use crate::backend::BenchBackend;
use crate::defended::{DefenceSpec, Defended};
use crate::harness::InvalidSetting;
use crate::metrics::{self, Calibration};
use crate::model::{LoadedNetwork, ModelInfo, SOFTWARE};
use crate::output_folder::FileSet;
use crate::settings;
use crate::tables::{csv_bytes, first_repeat, Summary};
use crate::test_set::{self, TestImages};

/// What `calibrate` computes: models × K, on how many test images, with which defence and
/// seed, written where. Recorded in its `settings.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrateSpec {
    /// Checkpoints: Wide-ResNets or graphs imported from ONNX (empty: the embedded baseline,
    /// JEM and adversarially trained models).
    pub models: Vec<PathBuf>,
    /// Test data (`None`: each model's own data set): mnist, fashion-mnist, cifar10:DIR, …
    pub data: Option<String>,
    /// SGLD sampling steps K before classifying; 0 is the plain classifier.
    pub steps: Vec<usize>,
    /// Evaluate the first `n` test images.
    pub n: usize,
    /// Images per forward pass (K > 0 runs `defence.chains` times as many).
    pub batch_size: usize,
    pub defence: DefenceSpec,
    /// Seed of the SGLD noise (K > 0); K = 0 draws nothing.
    pub seed: u64,
    /// Run K beyond 100 SGLD steps (far beyond what evaluations use).
    #[serde(default)]
    pub allow_long: bool,
    /// Output folder: calibration.csv, calibration-bins.csv, reliability.{png,svg},
    /// settings.json.
    pub out: PathBuf,
}

impl Default for CalibrateSpec {
    fn default() -> Self {
        CalibrateSpec {
            models: Vec::new(),
            data: None,
            steps: vec![0],
            n: 1000,
            batch_size: 100,
            defence: DefenceSpec::default(),
            seed: 1,
            allow_long: false,
            out: PathBuf::from("runs/calibrate"),
        }
    }
}

/// One model — its network, whichever kind, and its description — with its test images,
/// checked before anything is computed or written.
struct Prepared<B: BenchBackend> {
    path: PathBuf,
    network: LoadedNetwork<B>,
    info: ModelInfo,
    data: TestImages,
}

/// One row of `calibration.csv`: a model at one K.
#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    k: usize,
    n: usize,
    accuracy: f64,
    nll: f64,
    brier: f64,
    ece: f64,
    seed: u64,
    data: String,
    /// Every setting of the SGLD defence in force, as JSON; `{}` for K = 0.
    defence: String,
}

/// One row of `calibration-bins.csv`; accuracy and confidence are empty for an empty bin.
#[derive(Debug, Clone, Serialize)]
struct BinRow {
    model: String,
    k: usize,
    bin: usize,
    lo: f64,
    hi: f64,
    count: usize,
    accuracy: Option<f64>,
    confidence: Option<f64>,
}

/// Random stream of the SGLD noise at K (one per K, the same for every model, so that a
/// model's numbers do not depend on which other models ran with it).
const SGLD_STREAM: u64 = 0xCA11_B8A7;

impl CalibrateSpec {
    /// Checks every flag, model and data set before anything is written: at least one K,
    /// counts ≥ 1, the defence's settings when some K > 0, models that exist and can run the
    /// defence, data they can take, n within the test split.
    fn prepare<B: BenchBackend>(&self, device: &B::Device) -> anyhow::Result<Vec<Prepared<B>>> {
        if self.steps.is_empty() {
            let problem = "name at least one K (0 = the plain classifier)";
            return Err(InvalidSetting::bare("steps", problem).into());
        }
        settings::at_least_one("n", self.n)?;
        settings::at_least_one("batch_size", self.batch_size)?;
        if let Some(k) = first_repeat(&self.steps) {
            let problem = format!("K = {k} named twice");
            return Err(InvalidSetting::bare("steps", &problem).into());
        }
        // Checked at K = 0 too: a flag given is a flag meant, and a NaN is never a setting.
        self.defence.validate()?;
        let models =
            crate::defended::checked_models::<B>(&self.models, &self.steps, device, |info, k| {
                crate::defended::forward_settings(info, k, &self.defence).map(drop)
            })?;
        let mut prepared = Vec::new();
        for (path, (network, info)) in self.models.iter().zip(models) {
            let m = path.display().to_string();
            let data = test_set::load(&m, &info, "data", self.data.as_deref(), self.n)?;
            if self.steps.iter().any(|&k| k > 0) {
                let batch = self.batch_size.min(self.n);
                let chains = self.defence.chains;
                settings::fits_in_memory(
                    "chains",
                    chains,
                    (chains * batch) as u128 * data.set.image_len() as u128 * 4,
                    &format!("{chains} chains × {batch} images, for the images alone,"),
                    "lower --chains or --batch-size",
                )?;
            }
            prepared.push(Prepared {
                path: path.clone(),
                network,
                info,
                data,
            });
        }
        let longest = self.steps.iter().copied().max().unwrap_or(0);
        if let (Err(mut refused), false) = (
            settings::usual_count("steps", longest, MOST_STEPS, "SGLD steps", false),
            self.allow_long,
        ) {
            refused.problem = format!(
                "more than {MOST_STEPS} SGLD steps, far beyond what evaluations use: this \
                 calibration would take about {} here (SGLD steps timed at K ≤ {TIMED_STEPS} on \
                 {TIMED_IMAGES} images, scaled); allow it (--allow-long) to run it",
                crate::duration::duration(self.seconds_scaled(&prepared, device)?)
            );
            return Err(refused.into());
        }
        Ok(prepared)
    }

    /// What computing every model at every K would take here, within seconds even for counts
    /// far beyond the usual: each model's defence timed on [`TIMED_IMAGES`] images at no more
    /// than [`TIMED_STEPS`] SGLD steps, scaled to K (a step costs about one pass of the
    /// network) and to the images evaluated.
    fn seconds_scaled<B: BenchBackend>(
        &self,
        prepared: &[Prepared<B>],
        device: &B::Device,
    ) -> anyhow::Result<f64> {
        let mut seconds = 0.0;
        for p in prepared {
            let len = TIMED_IMAGES.min(p.data.set.len()).max(1);
            let idx: Vec<usize> = (0..len).collect();
            let x = crate::batches::images::<B::InnerBackend>(&p.data.set, &idx, device);
            for &k in &self.steps {
                let timed = k.min(TIMED_STEPS);
                let base = if timed > 0 {
                    Some(p.info.sgld()?)
                } else {
                    None
                };
                let defended = Defended::new(
                    p.network.clone(),
                    base.as_ref(),
                    timed,
                    GradMode::Bpda,
                    &self.defence,
                )?;
                let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
                // The second of two calls: the first warms caches and allocation pools up.
                let mut once = 0.0;
                for _ in 0..2 {
                    let started = Instant::now();
                    let _ = defended.logits(x.clone(), &mut rng).into_data();
                    once = started.elapsed().as_secs_f64();
                }
                let scale = (k + 1) as f64 / (timed + 1) as f64 * self.n as f64 / len as f64;
                seconds += once * scale;
            }
        }
        Ok(seconds)
    }
}

/// SGLD steps beyond which a calibration needs `--allow-long`.
const MOST_STEPS: usize = 100;
/// SGLD steps and images [`CalibrateSpec::seconds_scaled`] times at most.
const TIMED_STEPS: usize = 10;
const TIMED_IMAGES: usize = 4;

/// Predictions of one model at K on its test images, summarised; an error when they are not
/// finite (a number made of NaN is no result).
fn calibrate_one<B: BenchBackend>(
    args: &CalibrateSpec,
    p: &Prepared<B>,
    k: usize,
    device: &B::Device,
) -> anyhow::Result<Calibration> {
    let base = if k > 0 { Some(p.info.sgld()?) } else { None };
    let defended = Defended::new(
        p.network.clone(),
        base.as_ref(),
        k,
        GradMode::Bpda,
        &args.defence,
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(crate::train::stream_seed(
        args.seed,
        SGLD_STREAM,
        k as u64,
    ));
    let logits = crate::batches::model_logits::<B, _>(
        &defended,
        &p.data.set,
        args.batch_size,
        &mut rng,
        device,
    );
    let log_probs = crate::batches::to_vec(log_softmax(logits, 1));
    let c = metrics::calibration(&log_probs, &p.data.set.labels, p.data.set.num_classes());
    let m = &c.metrics;
    anyhow::ensure!(
        [m.accuracy, m.nll, m.brier, m.ece]
            .iter()
            .all(|v| v.is_finite()),
        "{} at K = {k}: the predictions on {} are not finite (NLL {}, Brier {}, ECE {}); its \
         weights, input normalisation or SGLD settings are broken",
        p.path.display(),
        p.data.set.name,
        m.nll,
        m.brier,
        m.ece
    );
    Ok(c)
}

/// Computes `args` on `device`, telling `progress` of each model and K as it finishes; returns
/// the table of the results written.
pub fn run<B: BenchBackend>(
    mut args: CalibrateSpec,
    device: &B::Device,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Summary> {
    if args.models.is_empty() {
        args.models = crate::model::embedded_models();
    }
    let started = Instant::now();
    let prepared = args.prepare::<B>(device)?;
    let _lock = crate::output_folder::claim(&args.out, "calibrate")?;
    let mut rows = Vec::new();
    let mut bins = Vec::new();
    let mut results = Vec::new();
    for p in &prepared {
        let model = p.path.display().to_string();
        for &k in &args.steps {
            let cell = Instant::now();
            let c = calibrate_one::<B>(&args, p, k, device)?;
            let m = c.metrics;
            progress(&format!(
                "{model} K = {k}: accuracy {:.4}, NLL {:.4}, Brier {:.4}, ECE {:.4} ({})",
                m.accuracy,
                m.nll,
                m.brier,
                m.ece,
                crate::duration::duration(cell.elapsed().as_secs_f64())
            ));
            rows.push(Row {
                model: model.clone(),
                k,
                n: m.n,
                accuracy: m.accuracy,
                nll: m.nll,
                brier: m.brier,
                ece: m.ece,
                seed: args.seed,
                data: p.data.spec.clone(),
                defence: crate::defended::forward_settings(&p.info, k, &args.defence)?.to_string(),
            });
            for (b, bin) in c.bins.iter().enumerate() {
                bins.push(BinRow {
                    model: model.clone(),
                    k,
                    bin: b,
                    lo: bin.lo,
                    hi: bin.hi,
                    count: bin.count,
                    accuracy: bin.accuracy,
                    confidence: bin.confidence,
                });
            }
            results.push((model.clone(), k, c));
        }
    }
    let data = distinct_specs(&prepared);
    // Short: the raster title must fit over a single column of panels.
    let title = format!("Reliability, {data}, n = {}, seed {}", args.n, args.seed);
    let record = serde_json::json!({
        "software": SOFTWARE,
        "backend": B::recorded_name(device),
        "settings": &args,
        "metrics": {
            "accuracy": "fraction of examples whose most probable class is the label",
            "nll": "mean −log p(y|x), nats",
            "brier": "mean over examples of Σ_k (p_k − [k = y])²",
            "ece": "Σ_b (n_b / n) |accuracy_b − confidence_b| over 15 bins (k/15, (k+1)/15] of max_k p_k",
            "k": "SGLD steps before classifying; K > 0: p(y|x) = softmax of the logits averaged over --chains chains",
        },
        "seconds": started.elapsed().as_secs_f64(),
        "rows": &rows,
    });
    // All of them or none: a folder never holds this run's table beside an earlier figure.
    let mut files = FileSet::new();
    files.add(args.out.join("calibration.csv"), csv_bytes(&rows)?);
    files.add(args.out.join("calibration-bins.csv"), csv_bytes(&bins)?);
    for (path, bytes) in diagram::figure(&results, &title).files(&args.out.join("reliability"))? {
        files.add(path, bytes);
    }
    files.add(
        args.out.join("settings.json"),
        serde_json::to_string_pretty(&record)?.into_bytes(),
    );
    files.write()?;
    let mut table = format!(
        "{:<32} {:>3} {:>6} {:>9} {:>8} {:>8} {:>7}\n",
        "model", "K", "n", "accuracy", "NLL", "Brier", "ECE"
    );
    for r in &rows {
        table += &format!(
            "{:<32} {:>3} {:>6} {:>8.2}% {:>8.4} {:>8.4} {:>6.2}%\n",
            r.model,
            r.k,
            r.n,
            100.0 * r.accuracy,
            r.nll,
            r.brier,
            100.0 * r.ece
        );
    }
    Ok(Summary {
        table,
        wrote: vec![args.out.clone()],
    })
}

/// The data sets of a run, comma-separated, each once.
fn distinct_specs<B: BenchBackend>(prepared: &[Prepared<B>]) -> String {
    let mut specs: Vec<&str> = Vec::new();
    for p in prepared {
        if !specs.contains(&p.data.spec.as_str()) {
            specs.push(&p.data.spec);
        }
    }
    specs.join(", ")
}
