//! `jem-bench ood`: out-of-distribution detection from the model's own outputs, the second of
//! JEM's three claims (Grathwohl et al. 2020, "Out-of-distribution detection": a JEM's density
//! log p(x) = `LogSumExp_y f(x)[y] − log Z` tells test images from other data better than a
//! classifier's confidence does). Per model, number of SGLD steps K and score (`lse`,
//! `max-softmax`, `grad-norm`), the AUROC, AUPR and FPR at 95 % TPR of telling the first n
//! in-distribution test images from n images of each OOD set (another data set's test split,
//! or seeded noise), with score histograms of every set.

mod detection;
mod histograms;
mod scores;
mod sets;

use crate::settings;
use crate::Choice;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use jem_attacks::GradMode;
use jem_datasets::{DataSource, ImageSet, Split};
use rand::SeedableRng;
use serde::Serialize;

pub use detection::{detection, Detection};
pub use scores::{scores, Score};
pub use sets::{OodSet, GAUSSIAN_MEAN, GAUSSIAN_STD, NOISE_SETS};

use crate::backend::BenchBackend;
use crate::defended::{DefenceSpec, Defended};
use crate::harness::InvalidSetting;
use crate::model::{LoadedNetwork, ModelInfo, SOFTWARE};
use crate::output_folder::FileSet;
use crate::tables::{csv_bytes, first_repeat, Summary};
use crate::test_set::{self, TestImages};

/// What `ood` computes: per model and K, how well each score separates the in-distribution
/// test images from each OOD set. Recorded in its `settings.json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OodSpec {
    /// Checkpoints: Wide-ResNets or graphs imported from ONNX (empty: the embedded baseline,
    /// JEM and adversarially trained models).
    pub models: Vec<PathBuf>,
    /// In-distribution test data (`None`: each model's own data set).
    pub in_data: Option<String>,
    /// OOD sets: a data set's test split (fashion-mnist, mnist, cifar10:DIR, …) or seeded
    /// noise: uniform, gaussian, interp, constant ([`OodSet`]).
    pub ood: Vec<String>,
    /// SGLD sampling steps K before scoring; 0 is the plain classifier.
    pub steps: Vec<usize>,
    /// Scores to compute.
    pub scores: Vec<Score>,
    /// Images per set: the first `n` in-distribution test images, and `n` of each OOD set.
    pub n: usize,
    /// Images per forward pass (K > 0 runs `defence.chains` times as many).
    pub batch_size: usize,
    pub defence: DefenceSpec,
    /// Seed of the noise sets and of the SGLD noise (K > 0).
    pub seed: u64,
    /// Output folder: ood.csv, histograms.{png,svg}, settings.json.
    pub out: PathBuf,
}

impl Default for OodSpec {
    fn default() -> Self {
        OodSpec {
            models: Vec::new(),
            in_data: None,
            ood: ["fashion-mnist", "uniform", "gaussian", "interp", "constant"]
                .map(String::from)
                .to_vec(),
            steps: vec![0],
            scores: Score::ALL.to_vec(),
            n: 1000,
            batch_size: 100,
            defence: DefenceSpec::default(),
            seed: 1,
            out: PathBuf::from("runs/ood"),
        }
    }
}

/// One model — its network, whichever kind, and its description — with its in-distribution
/// images and every OOD set, built and checked before anything is computed or written.
struct Prepared<B: BenchBackend> {
    path: PathBuf,
    network: LoadedNetwork<B>,
    info: ModelInfo,
    data: TestImages,
    ood: Vec<ImageSet>,
}

/// Every score of one model at one K, per set: `sets[0]` is the in-distribution set, then the
/// OOD sets in the order named; `values[s]` follows the order of `--scores`.
pub(crate) struct ScoredCell {
    pub model: String,
    pub k: usize,
    pub sets: Vec<ScoredSet>,
}

pub(crate) struct ScoredSet {
    pub name: String,
    pub values: Vec<Vec<f64>>,
}

/// One row of `ood.csv`.
#[derive(Debug, Clone, Serialize)]
struct Row {
    model: String,
    k: usize,
    score: &'static str,
    ood_set: String,
    n_in: usize,
    n_out: usize,
    auroc: f64,
    aupr: f64,
    fpr95: f64,
    seed: u64,
    /// The in-distribution data set.
    data: String,
    /// Every setting of the SGLD defence in force, as JSON; `{}` for K = 0.
    defence: String,
}

/// Random stream of the SGLD noise, per set (by name) and K.
const SGLD_STREAM: u64 = 0x00D_5C0E;

/// FNV-1a of a set's name: its SGLD noise does not depend on which other sets a run names.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl OodSpec {
    fn grad_mode(&self) -> Option<GradMode> {
        self.scores
            .contains(&Score::GradNorm)
            .then_some(GradMode::Full)
    }

    /// The defence's settings at K as recorded: with the gradient mode only when a gradient is
    /// taken through it.
    fn defence_settings(&self, info: &ModelInfo, k: usize) -> anyhow::Result<String> {
        Ok(match self.grad_mode() {
            Some(grad) => crate::defended::settings(
                Some(&info.sgld()?).filter(|_| k > 0),
                k,
                grad,
                &self.defence,
            )?,
            None => crate::defended::forward_settings(info, k, &self.defence)?,
        }
        .to_string())
    }

    /// Checks every flag, model and set before anything is written, and builds the sets.
    fn prepare<B: BenchBackend>(&self, device: &B::Device) -> anyhow::Result<Vec<Prepared<B>>> {
        let refuse = |field, problem: String| Err(InvalidSetting::bare(field, &problem).into());
        if self.steps.is_empty() {
            return refuse(
                "steps",
                "name at least one K (0 = the plain classifier)".into(),
            );
        }
        if self.scores.is_empty() {
            return refuse("scores", "name at least one score".into());
        }
        if self.ood.is_empty() {
            return refuse("ood", "name at least one OOD set".into());
        }
        settings::at_least_one("n", self.n)?;
        settings::at_least_one("batch_size", self.batch_size)?;
        if let Some(k) = first_repeat(&self.steps) {
            return refuse("steps", format!("K = {k} named twice"));
        }
        if let Some(s) = first_repeat(&self.scores) {
            return refuse("scores", format!("{} named twice", s.name()));
        }
        if let Some(s) = first_repeat(&self.ood) {
            return refuse("ood", format!("{s} named twice"));
        }
        let sets = self
            .ood
            .iter()
            .map(|name| OodSet::parse(name))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // Checked at K = 0 too: a flag given is a flag meant, and a NaN is never a setting.
        self.defence.validate()?;
        let models =
            crate::defended::checked_models::<B>(&self.models, &self.steps, device, |info, k| {
                self.defence_settings(info, k).map(drop)
            })?;
        let mut prepared = Vec::new();
        for (path, (network, info)) in self.models.iter().zip(models) {
            let m = path.display().to_string();
            let data = test_set::load(&m, &info, "in_data", self.in_data.as_deref(), self.n)?;
            if let Some(same) = sets.iter().find(|s| **s == OodSet::Data(data.spec.clone())) {
                let problem = format!("that is the in-distribution data of {m}; name another set");
                return Err(InvalidSetting::new("ood", same.name().into(), &problem).into());
            }
            let split = DataSource::parse(&data.spec)
                .and_then(|s| s.load(Split::Test))
                .map_err(|e| settings::refusal("in_data", &data.spec, e.into()))?;
            let ood = sets
                .iter()
                .map(|s| s.build(&data.set, &split, self.n, self.seed))
                .collect::<anyhow::Result<Vec<_>>>()?;
            prepared.push(Prepared {
                path: path.clone(),
                network,
                info,
                data,
                ood,
            });
        }
        Ok(prepared)
    }
}

/// Every score of one model at K on its in-distribution set and each OOD set.
fn score_cell<B: BenchBackend>(
    args: &OodSpec,
    p: &Prepared<B>,
    k: usize,
    device: &B::Device,
) -> anyhow::Result<ScoredCell> {
    let grad = args.grad_mode().unwrap_or(GradMode::Bpda);
    let base = if k > 0 { Some(p.info.sgld()?) } else { None };
    let defended = Defended::new(p.network.clone(), base.as_ref(), k, grad, &args.defence)?;
    let model_name = p.path.display().to_string();
    let mut sets = Vec::new();
    for set in std::iter::once(&p.data.set).chain(&p.ood) {
        let name = if sets.is_empty() {
            p.data.spec.clone()
        } else {
            set.name.clone()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(crate::train::stream_seed(
            args.seed ^ name_hash(&name),
            SGLD_STREAM,
            k as u64,
        ));
        let values = scores::<B, _>(
            &defended,
            set,
            &args.scores,
            args.batch_size,
            &mut rng,
            device,
        );
        for (score, v) in args.scores.iter().zip(&values) {
            let nan = v.iter().filter(|x| x.is_nan()).count();
            anyhow::ensure!(
                nan == 0,
                "{model_name} at K = {k}: the {} score is NaN on {nan} of the {} images of {name}; \
                 the model's outputs are not finite there (broken weights, input normalisation or \
                 SGLD settings)",
                score.name(),
                v.len()
            );
        }
        sets.push(ScoredSet { name, values });
    }
    Ok(ScoredCell {
        model: model_name,
        k,
        sets,
    })
}

/// Computes `args` on `device`, telling `progress` of each model and K as it finishes; returns
/// the table of the results written.
pub fn run<B: BenchBackend>(
    mut args: OodSpec,
    device: &B::Device,
    progress: &dyn Fn(&str),
) -> anyhow::Result<Summary> {
    if args.models.is_empty() {
        args.models = crate::model::embedded_models();
    }
    let started = Instant::now();
    let prepared = args.prepare::<B>(device)?;
    let _lock = crate::output_folder::claim(&args.out, "ood")?;
    let mut rows = Vec::new();
    let mut cells = Vec::new();
    for p in &prepared {
        for &k in &args.steps {
            let clock = Instant::now();
            let cell = score_cell::<B>(&args, p, k, device)?;
            let defence = args.defence_settings(&p.info, k)?;
            let inside = &cell.sets[0];
            for (s, &score) in args.scores.iter().enumerate() {
                for out in &cell.sets[1..] {
                    let d = detection(&inside.values[s], &out.values[s]).with_context(|| {
                        format!(
                            "{} at K = {k}, {} against {}",
                            cell.model,
                            score.name(),
                            out.name
                        )
                    })?;
                    rows.push(Row {
                        model: cell.model.clone(),
                        k,
                        score: score.name(),
                        ood_set: out.name.clone(),
                        n_in: inside.values[s].len(),
                        n_out: out.values[s].len(),
                        auroc: d.auroc,
                        aupr: d.aupr,
                        fpr95: d.fpr95,
                        seed: args.seed,
                        data: p.data.spec.clone(),
                        defence: defence.clone(),
                    });
                }
            }
            progress(&format!(
                "{} K = {k}: {} sets scored in {}",
                cell.model,
                cell.sets.len(),
                crate::duration::duration(clock.elapsed().as_secs_f64())
            ));
            cells.push(cell);
        }
    }
    // Short: the raster title must fit over a single column of panels.
    let title = format!("OOD scores, n = {} per set, seed {}", args.n, args.seed);
    let sets: serde_json::Map<String, serde_json::Value> = args
        .ood
        .iter()
        .map(|name| {
            let describe = OodSet::parse(name).map_or_else(|e| e.to_string(), |s| s.describe());
            (name.clone(), describe.into())
        })
        .collect();
    let score_defs: serde_json::Map<String, serde_json::Value> = args
        .scores
        .iter()
        .map(|s| (s.name().to_string(), s.description().into()))
        .collect();
    let record = serde_json::json!({
        "software": SOFTWARE,
        "backend": B::recorded_name(device),
        "settings": &args,
        "sets": sets,
        "scores": score_defs,
        "metrics": {
            "positive": "in-distribution; a higher score means more in-distribution",
            "auroc": "P(s_in > s_out) + ½ P(s_in = s_out) over all pairs (Mann–Whitney)",
            "aupr": "average precision Σ_t (R(t) − R(t′)) P(t) over the distinct scores t as thresholds, descending (tied scores enter together)",
            "fpr95": "fraction of OOD images with score ≥ t at the largest threshold t accepting ≥ 95 % of the in-distribution images",
        },
        "k": "SGLD steps before scoring; K > 0: scores of the logits averaged over --chains chains, grad-norm differentiated through the steps (full mode)",
        "seconds": started.elapsed().as_secs_f64(),
    });
    // All of them or none: a folder never holds this run's table beside an earlier figure.
    let mut files = FileSet::new();
    files.add(args.out.join("ood.csv"), csv_bytes(&rows)?);
    let figure = histograms::figure(&cells, &args.scores, &title);
    for (path, bytes) in figure.files(&args.out.join("histograms"))? {
        files.add(path, bytes);
    }
    files.add(
        args.out.join("settings.json"),
        serde_json::to_string_pretty(&record)?.into_bytes(),
    );
    files.write()?;
    Ok(Summary {
        table: table(&rows, &args.ood),
        wrote: vec![args.out.clone()],
    })
}

/// AUROC per model × K × score (rows) and OOD set (columns).
fn table(rows: &[Row], sets: &[String]) -> String {
    let mut t = format!(
        "AUROC (in-distribution positive)\n{:<28} {:>3} {:<12}",
        "model", "K", "score"
    );
    for s in sets {
        t += &format!(" {:>13}", s);
    }
    t += "\n";
    let mut seen: Vec<(&str, usize, &str)> = Vec::new();
    for r in rows {
        let key = (r.model.as_str(), r.k, r.score);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        t += &format!("{:<28} {:>3} {:<12}", r.model, r.k, r.score);
        for s in sets {
            let v = rows
                .iter()
                .find(|o| (o.model.as_str(), o.k, o.score) == key && &o.ood_set == s)
                .map_or("-".to_string(), |o| format!("{:.4}", o.auroc));
            t += &format!(" {v:>13}");
        }
        t += "\n";
    }
    t
}
