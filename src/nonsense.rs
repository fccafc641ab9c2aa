//! `jem-bench nonsense`: the nonsense-input test (Schott et al. 2019; JEM's Figure 6) for each model and number of SGLD
//! sampling steps K: from uniform noise, search for inputs the model assigns to each class with
//! confidence ≥ the threshold. Writes a table (fraction of searches that reach the threshold,
//! median confidence and iterations), a per-search CSV, a JSON record of every setting, and per
//! K a PNG grid with a row per model and a column per class.

use std::path::PathBuf;

use jem_attacks::{GradMode, NonsenseConfig};
use serde::Serialize;

use crate::backend::BenchBackend;
use crate::defended::{DefenceSpec, Defended};
use crate::harness::InvalidSetting;
use crate::image_grid::{grid_png, ImageBatch};
use crate::model::{LoadedNetwork, ModelInfo, SOFTWARE};
use crate::output_folder::FileSet;
use crate::settings;
use crate::tables::{csv_bytes, Summary};

/// What `nonsense` computes: per model, K and class, searches from noise for an input the
/// model classifies as that class with at least `threshold` confidence (after Schott et al.
/// 2019's distal adversarials). Recorded in its `nonsense.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NonsenseSpec {
    /// Checkpoints: Wide-ResNets or graphs imported from ONNX (empty: the embedded baseline,
    /// JEM and adversarially trained models).
    pub models: Vec<PathBuf>,
    /// SGLD sampling steps K before classifying.
    pub steps: Vec<usize>,
    /// Searches per class.
    pub per_class: usize,
    /// Iterations per search at most (the ABS code used 10 000; lowered so that a run on a CPU
    /// ends in minutes — searches that reach the threshold stop early anyway).
    pub max_iters: usize,
    /// The confidence a search stops at, in (0, 1].
    pub threshold: f32,
    /// SGD learning rate of the search (ABS: 1).
    pub lr: f32,
    /// SGD momentum of the search, in [0, 1) (ABS: 0.95).
    pub momentum: f32,
    /// Gradient through the SGLD steps (K > 0): full (exact, through every step) or bpda (the
    /// steps taken as the identity on the backward pass: cheaper, and weaker as a search).
    pub grad: GradMode,
    pub defence: DefenceSpec,
    pub seed: u64,
    pub out: PathBuf,
}

impl Default for NonsenseSpec {
    fn default() -> Self {
        NonsenseSpec {
            models: Vec::new(),
            steps: vec![0],
            per_class: 3,
            max_iters: 1000,
            threshold: 0.9,
            lr: 1.0,
            momentum: 0.95,
            grad: GradMode::Full,
            defence: DefenceSpec::default(),
            seed: 1,
            out: PathBuf::from("runs/nonsense"),
        }
    }
}

#[derive(Serialize)]
struct Row {
    model: String,
    k: usize,
    grad: String,
    searches: usize,
    reached_fraction: f64,
    median_confidence: f32,
    median_iterations: usize,
    seconds: f64,
}

/// Median; an error when a value is NaN (a search that diverged), which has no median.
fn median<T: Copy + PartialOrd>(v: &[T]) -> anyhow::Result<T> {
    anyhow::ensure!(!v.is_empty(), "no searches to summarise");
    anyhow::ensure!(
        v.iter().all(|x| x.partial_cmp(x).is_some()),
        "a search produced NaN confidences: the model's logits are not finite"
    );
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).expect("checked: no NaN"));
    Ok(s[s.len() / 2])
}

impl NonsenseSpec {
    /// Checks the flags, and every model with the image shape it takes, before anything is
    /// written; the models, loaded (Wide-ResNets or graphs imported from ONNX), in order.
    fn validate<B: BenchBackend>(
        &self,
        device: &B::Device,
    ) -> anyhow::Result<Vec<(LoadedNetwork<B>, ModelInfo)>> {
        let refuse = |field, problem: String| Err(InvalidSetting::bare(field, &problem).into());
        if self.steps.is_empty() {
            return refuse("steps", "name at least one K".into());
        }
        settings::at_least_one("per_class", self.per_class)?;
        settings::at_least_one("max_iters", self.max_iters)?;
        let t = self.threshold;
        if !(t.is_finite() && t > 0.0 && t <= 1.0) {
            return refuse(
                "threshold",
                format!("expected a confidence in (0, 1], found {t}"),
            );
        }
        settings::finite_positive("lr", self.lr)?;
        if !(0.0..1.0).contains(&self.momentum) {
            let m = self.momentum;
            return refuse(
                "momentum",
                format!("expected a number in [0, 1), found {m}"),
            );
        }
        // Checked at K = 0 too: a flag given is a flag meant, and a NaN is never a setting.
        self.defence.validate()?;
        let models =
            crate::defended::checked_models::<B>(&self.models, &self.steps, device, |info, k| {
                match k {
                    0 => Ok(()),
                    _ => info.sgld().map(drop),
                }
            })?;
        let mut shapes = Vec::new();
        for (path, (_, info)) in self.models.iter().zip(&models) {
            let shape = info
                .image_shape()
                .map_err(|e| crate::settings::refusal("models", path.display(), e))?;
            shapes.push((path.display().to_string(), shape, info.classes()));
        }
        if let Some((first, rest)) = shapes.split_first() {
            for other in rest {
                anyhow::ensure!(
                    (other.1, other.2) == (first.1, first.2),
                    InvalidSetting::bare(
                        "models",
                        &format!(
                            "{} takes {} images of {} classes, {} {} of {}: the grid needs \
                             one image shape and class count; run them separately",
                            first.0,
                            shape_text(first.1),
                            first.2,
                            other.0,
                            shape_text(other.1),
                            other.2
                        )
                    )
                );
            }
        }
        Ok(models)
    }
}

/// What the searches found so far: a summary row per model and K, a line per search.
struct Found {
    rows: Vec<Row>,
    searches: csv::Writer<Vec<u8>>,
}

/// Every model's searches at K = `k`, added to `found`; returns the PNG grid of the first
/// search of each class (a row per model, a column per class).
fn search_at<B: BenchBackend>(
    args: &NonsenseSpec,
    cfg: &NonsenseConfig,
    models: &[(LoadedNetwork<B>, ModelInfo)],
    k: usize,
    found: &mut Found,
    device: &B::Device,
) -> anyhow::Result<Vec<u8>> {
    let mut grid: Vec<f32> = Vec::new();
    let (mut classes, mut shape) = (0, [0; 3]);
    for (network, info) in models {
        shape = info.image_shape()?;
        classes = info.classes();
        let targets: Vec<usize> = (0..classes)
            .flat_map(|c| std::iter::repeat_n(c, args.per_class))
            .collect();
        let base = if k > 0 { Some(info.sgld()?) } else { None };
        let defended = Defended::new(network.clone(), base.as_ref(), k, args.grad, &args.defence)?;
        let started = std::time::Instant::now();
        let out = cfg.run::<B, _>(&defended, shape, &targets, device);
        let name = info.file.display().to_string();
        for (i, target) in targets.iter().enumerate() {
            found.searches.write_record([
                name.clone(),
                k.to_string(),
                target.to_string(),
                format!("{:.5}", out.confidence[i]),
                out.iterations[i].to_string(),
                out.reached[i].to_string(),
            ])?;
        }
        let reached = out.reached.iter().filter(|&&r| r).count();
        found.rows.push(Row {
            model: name,
            k,
            grad: if k > 0 {
                args.grad.to_string()
            } else {
                "none".into()
            },
            searches: targets.len(),
            reached_fraction: reached as f64 / targets.len() as f64,
            median_confidence: median(&out.confidence)?,
            median_iterations: median(&out.iterations)?,
            seconds: started.elapsed().as_secs_f64(),
        });
        // The first search of each class goes into the grid.
        let len: usize = shape.iter().product();
        for c in 0..classes {
            let i = c * args.per_class;
            grid.extend_from_slice(&out.images[i * len..(i + 1) * len]);
        }
    }
    let [c, h, w] = shape;
    let batch = ImageBatch {
        pixels: &grid,
        channels: c,
        height: h,
        width: w,
    };
    grid_png(&batch, models.len(), classes)
}

/// Runs every search of `args` on `device`; returns the table of the results written.
pub fn run<B: BenchBackend>(mut args: NonsenseSpec, device: &B::Device) -> anyhow::Result<Summary> {
    if args.models.is_empty() {
        args.models = crate::model::embedded_models();
    }
    let models = args.validate::<B>(device)?;
    let _lock = crate::output_folder::claim(&args.out, "nonsense")?;
    let cfg = NonsenseConfig {
        max_iters: args.max_iters,
        lr: args.lr,
        momentum: args.momentum,
        threshold: args.threshold,
        seed: args.seed,
    };
    let mut found = Found {
        rows: Vec::new(),
        searches: csv::Writer::from_writer(Vec::new()),
    };
    found.searches.write_record([
        "model",
        "k",
        "target",
        "confidence",
        "iterations",
        "reached",
    ])?;
    // All of the files or none: nothing is written before every search has finished.
    let mut files = FileSet::new();
    for &k in &args.steps {
        let grid = search_at::<B>(&args, &cfg, &models, k, &mut found, device)?;
        files.add(args.out.join(format!("grid-k{k}.png")), grid);
    }
    let Found { rows, searches } = found;
    files.add(args.out.join("searches.csv"), searches.into_inner()?);
    files.add(args.out.join("nonsense.csv"), csv_bytes(&rows)?);
    let record = serde_json::json!({
        "software": SOFTWARE,
        "backend": B::recorded_name(device),
        "settings": &args,
        "search": &cfg,
        "gradient": match args.grad {
            GradMode::Full => "full (through the SGLD steps)",
            GradMode::Bpda => "bpda (SGLD steps as the identity on the backward pass)",
        },
        "units": "pixels in [0, 1]; confidence = p(y = target | x) re-checked with recheck_chains chains",
        "rows": &rows,
    });
    files.add(
        args.out.join("nonsense.json"),
        serde_json::to_string_pretty(&record)?.into_bytes(),
    );
    files.write()?;
    let mut table = format!(
        "{:<40} {:>3} {:>5} {:>8} {:>10} {:>11} {:>10} {:>8}\n",
        "model", "K", "grad", "searches", "≥ threshold", "median conf", "median its", "seconds"
    );
    for r in &rows {
        table += &format!(
            "{:<40} {:>3} {:>5} {:>8} {:>10.2} {:>11.3} {:>10} {:>8.0}\n",
            r.model,
            r.k,
            r.grad,
            r.searches,
            r.reached_fraction,
            r.median_confidence,
            r.median_iterations,
            r.seconds
        );
    }
    Ok(Summary {
        table,
        wrote: vec![args.out.clone()],
    })
}

/// An image shape as messages write it: `1×28×28`.
fn shape_text([c, h, w]: [usize; 3]) -> String {
    format!("{c}×{h}×{w}")
}
