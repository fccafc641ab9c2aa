//! `jem-bench sample`: draws class-conditional samples from a JEM — or from any classifier's
//! energy, a Wide-ResNet's or a graph imported from ONNX — by SGLD on `f(x)[y]`, starting
//! from JEM's uniform noise, from each class's Gaussian fitted to the training images (JEM++) or
//! from a training run's replay buffer, and writes a PNG grid (one row per class) with a JSON
//! record of the settings, of how the model classifies them and of how they look to an
//! independent judge ([`quality`]).

mod frechet;
pub mod quality;

use std::path::PathBuf;

use anyhow::Context;
use burn::module::{AutodiffModule, Module};
use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{Classifier, SgldConfig, SgldSampler, SgldTarget};
use jem_datasets::{DataSource, Split};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::backend::BenchBackend;
use crate::harness::InvalidSetting;
use crate::image_grid::{write_grid, ImageBatch};
use crate::model::{InputNormalization, ModelInfo, SOFTWARE};
use crate::settings;
use crate::tables::Summary;
use crate::train::{chain_init, ChainStart, ClassGaussians, ReplayBuffer};

/// What `sample` draws and where it writes: recorded in the JSON beside the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleSpec {
    /// The model to sample from: a Wide-ResNet checkpoint (NAME, NAME.safetensors or
    /// NAME.json) or a graph imported from ONNX (NAME or NAME.onnx).
    pub model: PathBuf,
    /// Classes to sample (empty: every class, one grid row each).
    pub class: Vec<usize>,
    /// Samples per class (grid columns).
    pub per_class: usize,
    /// SGLD steps.
    pub steps: usize,
    /// SGLD step size α on the network scale (`None`: the model's training setting).
    pub sgld_lr: Option<f32>,
    /// SGLD noise σ on the network scale (`None`: the model's training setting).
    pub sgld_std: Option<f32>,
    /// Start from the replay buffer of this training run folder (its `state/`) instead of
    /// uniform noise.
    pub from_buffer: Option<PathBuf>,
    /// Start each row from its class's Gaussian fitted to the model's training images (the
    /// whole training split; JEM++'s informative initialisation) instead of uniform noise;
    /// not with `from_buffer`.
    pub from_class_gaussian: bool,
    pub seed: u64,
    /// The PNG to write; a JSON record goes next to it.
    pub out: PathBuf,
    /// The classifier that judges the samples (its probability of each sample's class, and its
    /// penultimate features for the Fréchet distance to the test images); `none` skips both.
    pub judge: String,
    /// The judge's probability of the intended class that counts a sample as that class.
    pub judge_threshold: f64,
    /// Test images (the first N) that the samples' Fréchet distance is measured against.
    pub reference_images: usize,
}

#[derive(Serialize)]
struct ClassReport {
    class: usize,
    name: String,
    /// Mean p(y = class | sample).
    mean_confidence: f64,
    /// Fraction of samples classified as the class.
    classified_as_class: f64,
    /// Fraction the judge gives the class with p ≥ the threshold (absent with `--judge none`).
    #[serde(skip_serializing_if = "Option::is_none")]
    judge_confident: Option<f64>,
}

#[derive(Serialize)]
struct SampleRecord<'a> {
    software: &'a str,
    backend: String,
    settings: &'a SampleSpec,
    sgld: SgldConfig,
    start: String,
    classes: Vec<ClassReport>,
    /// The judge's verdict (absent with `--judge none`).
    #[serde(skip_serializing_if = "Option::is_none")]
    quality: Option<quality::Quality>,
}

/// Draws the samples `args` asks for, judges them and writes the grid and its JSON record;
/// returns the record's table.
pub fn run<B: BenchBackend>(args: SampleSpec, device: &B::Device) -> anyhow::Result<Summary> {
    validate(&args)?;
    let (model, info) = ModelInfo::load_setting::<B>(&args.model, "model", device)?;
    let model = model.no_grad();
    let trained = info
        .jem()
        .with_context(|| format!("the JEM settings of {}", info.file.display()))?;
    let num_classes = info.classes();
    let classes: Vec<usize> = if args.class.is_empty() {
        (0..num_classes).collect()
    } else {
        args.class.clone()
    };
    if let Some(&bad) = classes.iter().find(|&&c| c >= num_classes) {
        anyhow::bail!(
            "--class {bad}: the model has classes 0..{}",
            num_classes - 1
        );
    }
    let [c, h, w] = info
        .image_shape()
        .with_context(|| format!("--model {}", args.model.display()))?;
    let source = jem_datasets::DataSource::parse(info.data())
        .with_context(|| format!("the data set of {}", info.file.display()))?;
    let names = source.class_names();
    let judge = load_judge::<B>(&args, &info, &classes, [c, h, w], &source, device)?;
    let norm = &info.input_normalization();
    let sampler = SgldSampler::new(SgldConfig {
        steps: args.steps,
        step_size: args.sgld_lr.unwrap_or(trained.sgld_lr),
        noise: args.sgld_std.unwrap_or(trained.sgld_std),
        pixel_scale: norm.std.clone(),
        clamp: trained.sgld_clamp,
    });

    let n = classes.len() * args.per_class;
    settings::fits_in_memory(
        "per_class",
        args.per_class,
        n as u128 * (c * h * w) as u128 * 4,
        &format!("{n} chains of {c}×{h}×{w} images, for the images alone,"),
        "lower --per-class or name fewer --class",
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let (start, pixels) = chain_starts(&args, &classes, norm, [c, h, w], &source, &mut rng)?;
    let x0 = Tensor::from_data(TensorData::new(pixels, [n, c, h, w]), device);
    let labels: Vec<i64> = classes
        .iter()
        .flat_map(|&k| std::iter::repeat_n(k as i64, args.per_class))
        .collect();
    let y = Tensor::<B::InnerBackend, 1, Int>::from_data(TensorData::new(labels, [n]), device);
    let samples = sampler.run::<B, _>(&model, x0, &SgldTarget::Class(y), &mut rng);

    let probs: Vec<f32> = softmax(model.valid().logits(samples.clone()), 1)
        .into_data()
        .to_vec()
        .expect("f32");
    let k = num_classes;
    let mut reports = class_reports(&probs, k, &classes, args.per_class, &names);

    let pixels: Vec<f32> = samples.into_data().to_vec().expect("f32");
    let quality = match &judge {
        None => None,
        Some(judge) => {
            let intended: Vec<usize> = classes
                .iter()
                .flat_map(|&k| std::iter::repeat_n(k, args.per_class))
                .collect();
            let q = judge.assess(
                &pixels,
                &intended,
                &classes,
                &source,
                args.reference_images,
                args.judge_threshold,
            )?;
            for (r, &f) in reports.iter_mut().zip(&q.confident_fraction_per_class) {
                r.judge_confident = Some(f);
            }
            Some(q)
        }
    };
    let batch = ImageBatch {
        pixels: &pixels,
        channels: c,
        height: h,
        width: w,
    };
    write_grid(&args.out, &batch, classes.len(), args.per_class)?;
    let record = SampleRecord {
        software: SOFTWARE,
        backend: B::recorded_name(device),
        settings: &args,
        sgld: sampler.config.clone(),
        start,
        classes: reports,
        quality,
    };
    let json = args.out.with_extension("json");
    crate::model::write_atomic(&json, serde_json::to_string_pretty(&record)?.as_bytes())?;
    Ok(Summary {
        table: record_table(&record),
        wrote: vec![args.out.clone(), json],
    })
}

/// Refuses settings no sampling can use, before anything is loaded.
fn validate(args: &SampleSpec) -> anyhow::Result<()> {
    let refuse = |field, problem: String| Err(InvalidSetting::bare(field, &problem).into());
    settings::at_least_one("per_class", args.per_class)?;
    for (field, v) in [("sgld_lr", args.sgld_lr), ("sgld_std", args.sgld_std)] {
        v.map_or(Ok(()), |v| settings::finite_non_negative(field, v))?;
    }
    if args.from_class_gaussian && args.from_buffer.is_some() {
        let problem = "a sample starts either from a replay buffer or from the class Gaussians";
        return refuse("from_class_gaussian", problem.into());
    }
    Ok(())
}

/// The judge of the samples' quality (`None` with `--judge none`), its settings checked
/// against the model's data.
fn load_judge<B: BenchBackend>(
    args: &SampleSpec,
    info: &ModelInfo,
    classes: &[usize],
    [c, h, w]: [usize; 3],
    source: &DataSource,
    device: &B::Device,
) -> anyhow::Result<Option<quality::Judge<B::InnerBackend>>> {
    Ok(if args.judge == "none" {
        None
    } else {
        settings::probability("judge_threshold", args.judge_threshold)?;
        // The reference images are the test split's first ones: a count beyond the split
        // would silently shrink to it.
        let test_images = source.load(Split::Test)?.len();
        anyhow::ensure!(
            (2..=test_images).contains(&args.reference_images),
            "--reference-images: expected 2 to {test_images} (the test images of {}), found {}",
            info.data(),
            args.reference_images
        );
        anyhow::ensure!(
            classes.len() * args.per_class >= 2,
            "--judge: a Fréchet distance needs at least 2 samples; raise --per-class or pass \
             --judge none"
        );
        Some(quality::Judge::load(
            &args.judge,
            info.data(),
            [c, h, w],
            info.classes(),
            device,
        )?)
    })
}

/// The chains' first images, one per sample (rows of `per_class` for each class), and how they
/// were drawn.
fn chain_starts(
    args: &SampleSpec,
    classes: &[usize],
    norm: &InputNormalization,
    [c, h, w]: [usize; 3],
    source: &DataSource,
    rng: &mut StdRng,
) -> anyhow::Result<(String, Vec<f32>)> {
    let n = classes.len() * args.per_class;
    Ok(match &args.from_buffer {
        None => {
            // Only the class Gaussians need the training images.
            let train = args
                .from_class_gaussian
                .then(|| source.load(Split::Train))
                .transpose()?;
            let init = match &train {
                None => ChainStart::Uniform(chain_init(norm)),
                Some(train) => {
                    ChainStart::ClassGaussian(ClassGaussians::fit(train, chain_init(norm))?)
                }
            };
            let v = classes
                .iter()
                .flat_map(|&k| std::iter::repeat_n(k, args.per_class))
                .flat_map(|k| init.image_of_class(k, [c, h, w], rng))
                .collect();
            let of = train.map_or(String::new(), |t| format!(" ({})", t.name));
            (format!("{}{of}", init.describe()), v)
        }
        Some(run) => {
            let buffer = latest_buffer(run)?;
            anyhow::ensure!(
                buffer.image_len() == c * h * w,
                "{}: its chains have {} pixels, the model takes {}",
                run.display(),
                buffer.image_len(),
                c * h * w
            );
            let v = (0..n)
                .flat_map(|_| {
                    buffer
                        .image(rng.random_range(0..buffer.capacity()))
                        .to_vec()
                })
                .collect();
            (format!("replay buffer of {}", run.display()), v)
        }
    })
}

/// How the model classifies each class's samples, from their class probabilities (`probs`,
/// `k` per sample).
fn class_reports(
    probs: &[f32],
    k: usize,
    classes: &[usize],
    per_class: usize,
    names: &[String],
) -> Vec<ClassReport> {
    classes
        .iter()
        .enumerate()
        .map(|(row, &class)| {
            let rows = (row * per_class..(row + 1) * per_class).map(|i| &probs[i * k..(i + 1) * k]);
            let (mut conf, mut hits) = (0.0, 0.0);
            for p in rows {
                conf += p[class] as f64;
                let arg = (0..k)
                    .max_by(|&a, &b| p[a].total_cmp(&p[b]))
                    .expect("classes");
                hits += f64::from(u8::from(arg == class));
            }
            ClassReport {
                class,
                name: names
                    .get(class)
                    .cloned()
                    .unwrap_or_else(|| class.to_string()),
                mean_confidence: conf / per_class as f64,
                classified_as_class: hits / per_class as f64,
                judge_confident: None,
            }
        })
        .collect()
}

/// The record as a table: a line per class, and the judge's verdict.
fn record_table(record: &SampleRecord) -> String {
    let mut table =
        "class  name        p(y|x) mean  classified as class  judge p >= threshold\n".to_string();
    for r in &record.classes {
        let judged = r.judge_confident.map_or("-".into(), |f| format!("{f:.2}"));
        table += &format!(
            "{:>5}  {:<10}  {:>11.3}  {:>19.2}  {judged:>20}\n",
            r.class, r.name, r.mean_confidence, r.classified_as_class
        );
    }
    if let Some(q) = &record.quality {
        table += &format!(
            "judge {}: {:.1} % of {} samples at p >= {}; Fréchet distance to {} in its \
             {}-dim features {:.3} (as many training images: {:.3})\n",
            q.judge,
            100.0 * q.confident_fraction,
            q.samples,
            q.threshold,
            q.reference,
            q.feature_dim,
            q.frechet_distance,
            q.frechet_distance_train_images
        );
    }
    table
}

/// The replay buffer of the latest saved state of a training run folder.
fn latest_buffer(run: &std::path::Path) -> anyhow::Result<ReplayBuffer> {
    let state = crate::train::StateDir::new(run);
    let progress = state.load_progress()?.with_context(|| {
        format!(
            "{}: no training state (expected a JEM run folder)",
            run.join("state/progress.json").display()
        )
    })?;
    let (bytes, what) = state
        .objective_state(&progress, true)
        .with_context(|| format!("{} is not a JEM run with a replay buffer", run.display()))?
        .expect("a required state is present");
    ReplayBuffer::from_bytes(&bytes, &what)
}
