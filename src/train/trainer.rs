//! The training loop shared by every objective: seeded shuffling, augmentation and data noise,
//! Adam with warm-up and step decay, per-iteration and per-epoch CSV logs, validation with a
//! best-on-validation checkpoint, and a resumable state that a re-run of the same command picks up.

use jem_kernels::KernelsAutodiff;
use std::time::Instant;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};
use indicatif::{ProgressBar, ProgressStyle};
use jem_datasets::{DataSource, ImageSet, Split};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::log::CsvLog;
use super::objective::{Objective, Step};
use super::state::{Progress, StateDir};
use super::TrainConfig;
use crate::batches;
use crate::metrics::{self, CleanMetrics};
use crate::model::{Checkpoint, Sidecar, TrainingRecord, WideResNet, WideResNetConfig};

/// What a finished (or paused, with `max_iters`) run leaves behind.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    pub best: Checkpoint,
    pub iterations: usize,
    pub finished: bool,
    pub best_val_accuracy: Option<f64>,
    /// For objectives that select on it (adversarial training): the best checkpoint's accuracy
    /// under the training attack on the validation images.
    pub best_val_robust_accuracy: Option<f64>,
    pub test: Option<CleanMetrics>,
    pub wall_seconds: f64,
}

/// Seeds for independent random streams derived from the run seed.
pub(crate) fn stream_seed(seed: u64, stream: u64, index: u64) -> u64 {
    crate::seeds::splitmix64(
        seed ^ stream.wrapping_mul(crate::seeds::GOLDEN)
            ^ index.wrapping_mul(0xBF58_476D_1CE4_E5B9),
    )
}

const SHUFFLE: u64 = 1;
const BATCH: u64 = 2;
const OBJECTIVE: u64 = 3;
const OBJECTIVE_INIT: u64 = 4;

/// The optimiser of every training run: Adam with PyTorch's ε (the official JEM's).
pub fn adam() -> AdamConfig {
    AdamConfig::new().with_epsilon(1e-8)
}

/// The end of every training iteration: `loss` back to every parameter, then one step of
/// `optim`. `jem-bench bench` times its training rows through this same function.
pub fn descend<B, O>(
    model: WideResNet<B>,
    optim: &mut O,
    loss: Tensor<B, 1>,
    lr: f64,
) -> WideResNet<B>
where
    B: KernelsAutodiff,
    O: Optimizer<WideResNet<B>, B>,
{
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    optim.step(lr, model, grads)
}

/// Loads the training and validation sets named by the config.
pub fn load_data(cfg: &TrainConfig) -> anyhow::Result<(DataSource, ImageSet, ImageSet)> {
    let source = DataSource::parse(&cfg.data)?;
    let full = source.load(Split::Train)?;
    anyhow::ensure!(
        cfg.val_size < full.len(),
        "--val-size {} leaves no training images ({} in {})",
        cfg.val_size,
        full.len(),
        full.name
    );
    let (mut train, val) = full.split_last(cfg.val_size);
    if let Some(n) = cfg.train_subset {
        anyhow::ensure!(
            n >= 1 && n <= train.len(),
            "--train-subset {n}: expected 1 to {} (the training images left after --val-size {})",
            train.len(),
            cfg.val_size
        );
        train = train.select(&(0..n).collect::<Vec<_>>());
    }
    Ok((source, train, val))
}

pub fn architecture(cfg: &TrainConfig, data: &ImageSet) -> WideResNetConfig {
    WideResNetConfig::new(cfg.depth, cfg.width, data.channels, data.num_classes())
}

/// Settings a resumed run may change, named as `changes.csv` names them: more epochs, a new base
/// learning rate, a new σ_data (noise that can steady an energy model early and cost accuracy
/// late) and new weights of JEM's two terms (the balance between classifier and density) change
/// only its future; so do the guard's thresholds, and its folder may move. Learning-rate decays
/// may also be added at epochs it has not reached (checked apart, since they are a list).
const RESUMABLE: [&str; 7] = [
    "epochs",
    "out",
    "guard",
    "lr",
    "sigma_data",
    "jem.px_weight",
    "jem.pyx_weight",
];

/// Removes the setting at a dotted path (`jem.px_weight`) from a settings object, if present.
fn remove_setting(settings: &mut serde_json::Value, path: &str) {
    match path.split_once('.') {
        Some((group, rest)) => {
            if let Some(g) = settings.get_mut(group) {
                remove_setting(g, rest);
            }
        }
        None => {
            if let Some(o) = settings.as_object_mut() {
                o.remove(path);
            }
        }
    }
}

/// The settings that differ between two settings objects, as (name, before, after); a group
/// of settings (`jem`, `guard`) is compared setting by setting and named `group.setting`.
fn changed_settings(
    prefix: &str,
    before: &serde_json::Map<String, serde_json::Value>,
    after: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let null = serde_json::Value::Null;
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut changed = Vec::new();
    for k in keys {
        let (b, a) = (
            before.get(k).unwrap_or(&null),
            after.get(k).unwrap_or(&null),
        );
        match (b.as_object(), a.as_object()) {
            (Some(b), Some(a)) => changed.extend(changed_settings(&format!("{prefix}{k}."), b, a)),
            _ if b != a => changed.push((format!("{prefix}{k}"), b.clone(), a.clone())),
            _ => {}
        }
    }
    changed
}

/// Appends one row per setting that a resumed run changed (`iteration,setting,before,after`,
/// values as JSON) to `out/changes.csv`, so that a run's history stays readable from its folder
/// when its sidecar shows only the latest settings. The output folder itself is not a change.
fn record_changes(
    out: &std::path::Path,
    iteration: usize,
    before: &serde_json::Value,
    after: &serde_json::Value,
) -> anyhow::Result<()> {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
        return Ok(());
    };
    let changed: Vec<_> = changed_settings("", before, after)
        .into_iter()
        .filter(|(k, _, _)| k != "out")
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let path = out.join("changes.csv");
    let mut table = csv::Writer::from_writer(Vec::new());
    if !path.exists() {
        table.write_record(["iteration", "setting", "before", "after"])?;
    }
    for (k, b, a) in changed {
        table.write_record([&iteration.to_string(), &k, &b.to_string(), &a.to_string()])?;
    }
    let text = table.into_inner().context("cannot format changes.csv")?;
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&text))
        .with_context(|| format!("cannot append to {}", path.display()))
}

/// Trains with `objective` until `cfg.epochs` are done (or `cfg.max_iters`), resuming from
/// `cfg.out/state` when it exists.
pub fn train<B, O>(
    cfg: &TrainConfig,
    objective: &mut O,
    device: &B::Device,
) -> anyhow::Result<TrainOutcome>
where
    B: KernelsAutodiff,
    O: Objective<B>,
{
    cfg.validate()?;
    let (source, train, val) = load_data(cfg)?;
    let arch = architecture(cfg, &train);
    arch.blocks_per_stage()?;
    // Everything that can be refused is checked before the folder is written.
    let mut warm = cfg
        .init_from
        .as_ref()
        .map(|from| warm_start::<B>(from, &arch, device))
        .transpose()?;
    objective.prepare(&arch, &train, stream_seed(cfg.seed, OBJECTIVE_INIT, 0))?;
    crate::output_folder::claim(&cfg.out, "train")?;
    // One process per run folder: a second would "resume" the same state and redo its work.
    let _lock = crate::output_folder::FolderLock::acquire(&cfg.out, "train.lock")?;
    let settings = cfg.settings();
    let state = StateDir::new(&cfg.out);
    let schedule = cfg.schedule();
    let augmentation = cfg.augmentation(source.name());
    let norm = &arch.input_normalization;
    // σ_data is stated on the network's scale; the noise is added to [0, 1] pixels.
    let pixel_sigma = cfg.sigma_data * norm.std[0];

    let mut model: WideResNet<B> = arch.init_seeded(cfg.seed, device)?;
    let mut optim = adam().init::<B, WideResNet<B>>();
    let mut progress = match state.load_progress()? {
        Some(mut p) => {
            // Beyond the RESUMABLE settings and later decays, every setting must be the same,
            // or the resumed run would not be the run its log describes. What changed is
            // recorded in `changes.csv`.
            let started = p.epoch + usize::from(p.batch_in_epoch > 0);
            let comparable = |v: &serde_json::Value| {
                let mut v = v.clone();
                for path in RESUMABLE {
                    remove_setting(&mut v, path);
                }
                if let Some(d) = v.get_mut("decay_epochs").and_then(|d| d.as_array_mut()) {
                    d.retain(|e| e.as_u64().is_some_and(|e| (e as usize) < started));
                }
                v
            };
            anyhow::ensure!(
                comparable(&p.settings) == comparable(&settings) && cfg.epochs >= p.epoch,
                "{} holds a run with other settings; resume with the same command (--epochs may \
                 grow, --lr, --sigma-data, --px-weight and --pyx-weight may change, and \
                 --decay-epochs may gain epochs from {started} on) or use another --out\n  \
                 saved: {}\n  now:   {}",
                cfg.out.display(),
                p.settings,
                settings
            );
            (model, optim) = state.restore(model, optim, &p, device)?;
            if let Some((bytes, what)) = state.objective_state(&p, objective.keeps_state())? {
                objective.restore(&bytes, &what)?;
            }
            record_changes(&cfg.out, p.global_iter, &p.settings, &settings)?;
            p.settings = settings.clone();
            eprintln!(
                "resuming {} at iteration {} (epoch {}, batch {})",
                cfg.out.display(),
                p.global_iter,
                p.epoch,
                p.batch_in_epoch
            );
            p
        }
        None => {
            if let Some(init) = warm.take() {
                model = init;
            }
            // Generation 0: the divergence guard can always roll back to a saved state.
            let p = Progress {
                settings: settings.clone(),
                ..Default::default()
            };
            state.save(&model, &optim, objective.state(), &p)?;
            p
        }
    };

    let mut header = vec![
        "iteration",
        "epoch",
        "lr",
        "loss",
        "cross_entropy",
        "train_accuracy",
    ];
    header.extend(objective.extra_columns());
    header.push("seconds_per_iteration");
    // Rows are numbered by completed iterations (1-based) and epochs (0-based): keep those done.
    let mut iter_log = CsvLog::open(
        &cfg.out.join("log.csv"),
        &header,
        progress.global_iter as u64 + 1,
    )?;
    let robust = objective.selects_on_robustness();
    let mut epoch_header = vec![
        "epoch",
        "iteration",
        "lr",
        "val_accuracy",
        "val_nll",
        "val_ece",
    ];
    if robust {
        epoch_header.push("val_robust_accuracy");
    }
    epoch_header.extend(["best", "wall_seconds"]);
    let mut epoch_log = CsvLog::open(
        &cfg.out.join("epochs.csv"),
        &epoch_header,
        progress.epoch as u64,
    )?;

    let best = Checkpoint::at(cfg.out.join("model"));
    if robust && progress.best_val_robust_accuracy.is_none() && best.exists() {
        // A run from before robust selection: score its best checkpoint by the new criterion,
        // so that later epochs are compared with it rather than replacing it unseen.
        let (kept, _) = best.load::<B>(device)?;
        let r = objective.robust_accuracy(&kept, &val, device)?;
        eprintln!(
            "best checkpoint {}: robust validation accuracy {r:.4} (scored now; it was chosen on \
             clean accuracy)",
            best.weights.display()
        );
        progress.best_val_robust_accuracy = Some(r);
    }
    let batches_per_epoch = train.len().div_ceil(cfg.batch_size);
    let total_iters = batches_per_epoch * cfg.epochs;
    let stop_at = cfg.max_iters.unwrap_or(usize::MAX).min(total_iters);
    let bar = ProgressBar::new(total_iters as u64).with_position(progress.global_iter as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} it  ETA {eta}  {msg}",
        )
        .expect("valid template"),
    );
    let started = Instant::now();
    let wall_before = progress.wall_seconds;
    let mut window = (
        0.0f64,
        0.0f64,
        0.0f64,
        Vec::<f64>::new(),
        0usize,
        Instant::now(),
    );

    'epochs: while progress.epoch < cfg.epochs && progress.global_iter < stop_at {
        let epoch = progress.epoch;
        let mut order: Vec<usize> = (0..train.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(stream_seed(
            cfg.seed,
            SHUFFLE,
            epoch as u64,
        )));
        while progress.batch_in_epoch < batches_per_epoch && progress.global_iter < stop_at {
            let it = progress.global_iter;
            let b = progress.batch_in_epoch;
            let idx = &order[b * cfg.batch_size..((b + 1) * cfg.batch_size).min(order.len())];
            let mut rng =
                rand::rngs::StdRng::seed_from_u64(stream_seed(cfg.seed, BATCH, it as u64));
            let mut pixels = Vec::with_capacity(idx.len() * train.image_len());
            idx.iter()
                .for_each(|&i| pixels.extend_from_slice(train.image(i)));
            augmentation.apply(
                &mut pixels,
                train.channels,
                train.height,
                train.width,
                &mut rng,
            );
            if pixel_sigma > 0.0 {
                let noise = Normal::new(0.0, pixel_sigma).expect("finite sigma");
                pixels.iter_mut().for_each(|p| *p += noise.sample(&mut rng));
            }
            let x = Tensor::<B, 4>::from_data(
                TensorData::new(
                    pixels,
                    [idx.len(), train.channels, train.height, train.width],
                ),
                device,
            );
            let y = batches::labels::<B>(&train, idx, device);
            let lr = schedule.at(it, epoch) * progress.lr_scale;
            let (loss, stats) = objective.loss(
                &model,
                x,
                y,
                Step {
                    iteration: it,
                    seed: stream_seed(cfg.seed, OBJECTIVE, it as u64),
                },
            );
            if let Some(symptom) = cfg
                .guard
                .symptom(&stats)
                .or_else(|| objective.symptom(&stats))
            {
                drop(loss);
                let back = roll_back(cfg, &state, &progress, &symptom)?;
                (model, optim) = state.restore(model, optim, &back, device)?;
                if let Some((bytes, what)) =
                    state.objective_state(&back, objective.keeps_state())?
                {
                    objective.restore(&bytes, &what)?;
                }
                bar.println(format!(
                    "iteration {}: {symptom}; rolled back to iteration {}, learning rate × {} \
                     (now × {:.3e} of the schedule), rollback {} of at most {}",
                    it + 1,
                    back.global_iter,
                    cfg.guard.guard_lr_factor,
                    back.lr_scale,
                    back.rollbacks,
                    cfg.guard.guard_max_rollbacks
                ));
                progress = back;
                iter_log = CsvLog::open(
                    &cfg.out.join("log.csv"),
                    &header,
                    progress.global_iter as u64 + 1,
                )?;
                window = (0.0, 0.0, 0.0, Vec::new(), 0, Instant::now());
                bar.set_position(progress.global_iter as u64);
                continue 'epochs;
            }
            model = descend(model, &mut optim, loss, lr);
            progress.global_iter += 1;
            progress.batch_in_epoch += 1;

            let w = &mut window;
            w.0 += stats.loss;
            w.1 += stats.cross_entropy;
            w.2 += stats.accuracy;
            if w.3.len() < stats.extra.len() {
                w.3.resize(stats.extra.len(), 0.0);
            }
            w.3.iter_mut().zip(&stats.extra).for_each(|(a, b)| *a += b);
            w.4 += 1;
            if progress.global_iter % cfg.log_every == 0 || progress.global_iter == stop_at {
                let k = w.4 as f64;
                let mut row = vec![
                    progress.global_iter.to_string(),
                    epoch.to_string(),
                    format!("{lr:.3e}"),
                    format!("{:.5}", w.0 / k),
                    format!("{:.5}", w.1 / k),
                    format!("{:.4}", w.2 / k),
                ];
                row.extend(w.3.iter().map(|v| format!("{:.5}", v / k)));
                row.push(format!("{:.4}", w.5.elapsed().as_secs_f64() / k));
                iter_log.row(&row)?;
                bar.set_message(format!("loss {:.4} acc {:.3}", w.0 / k, w.2 / k));
                *w = (0.0, 0.0, 0.0, Vec::new(), 0, Instant::now());
            }
            bar.set_position(progress.global_iter as u64);
            progress.wall_seconds = wall_before + started.elapsed().as_secs_f64();
            if progress.global_iter % cfg.checkpoint_every == 0
                && progress.batch_in_epoch < batches_per_epoch
            {
                progress.generation += 1;
                state.save(&model, &optim, objective.state(), &progress)?;
                objective.snapshot(&cfg.out)?;
            }
        }
        if progress.batch_in_epoch < batches_per_epoch {
            break; // stopped by max_iters inside the epoch
        }
        // End of epoch: validate, keep the best, save the state.
        let inference = model.valid();
        let m = metrics::evaluate(&inference, &val, 500, device);
        let r = robust
            .then(|| objective.robust_accuracy(&model, &val, device))
            .transpose()?;
        let is_best = match r {
            Some(r) => progress.best_val_robust_accuracy.is_none_or(|b| r > b),
            None => progress.best_val_accuracy.is_none_or(|b| m.accuracy > b),
        };
        if is_best {
            progress.best_val_accuracy = Some(m.accuracy);
            progress.best_val_robust_accuracy = r;
            let mut sidecar = Sidecar::new(
                arch.clone(),
                record(
                    cfg,
                    objective.kind(),
                    &source,
                    progress.wall_seconds,
                    &settings,
                ),
            );
            sidecar.metrics.insert("val_accuracy".into(), m.accuracy);
            if let Some(r) = r {
                sidecar.metrics.insert("val_robust_accuracy".into(), r);
            }
            sidecar.metrics.insert("epoch".into(), epoch as f64);
            best.save(&inference, &sidecar)?;
        }
        progress.wall_seconds = wall_before + started.elapsed().as_secs_f64();
        let mut row = vec![
            epoch.to_string(),
            progress.global_iter.to_string(),
            format!(
                "{:.3e}",
                schedule.at(progress.global_iter.saturating_sub(1), epoch) * progress.lr_scale
            ),
            format!("{:.5}", m.accuracy),
            format!("{:.5}", m.nll),
            format!("{:.5}", m.ece),
        ];
        row.extend(r.map(|r| format!("{r:.5}")));
        row.extend([is_best.to_string(), format!("{:.1}", progress.wall_seconds)]);
        epoch_log.row(&row)?;
        bar.println(format!(
            "epoch {epoch}: val accuracy {:.4}, nll {:.4}, ece {:.4}{}{}",
            m.accuracy,
            m.nll,
            m.ece,
            r.map_or(String::new(), |r| format!(", robust {r:.4}")),
            if is_best { " (best)" } else { "" }
        ));
        progress.epoch += 1;
        progress.batch_in_epoch = 0;
        progress.generation += 1;
        state.save(&model, &optim, objective.state(), &progress)?;
        objective.snapshot(&cfg.out)?;
    }
    if progress.batch_in_epoch > 0 {
        progress.generation += 1;
        state.save(&model, &optim, objective.state(), &progress)?;
    }
    bar.finish_and_clear();

    let finished = progress.epoch >= cfg.epochs;
    let mut test = None;
    if finished && best.exists() {
        // Score the best checkpoint on the test set and record it in its sidecar.
        let (model, mut sidecar) = best.load::<B::InnerBackend>(device)?;
        let m = metrics::evaluate(&model, &source.load(Split::Test)?, 500, device);
        sidecar.metrics.insert("test_accuracy".into(), m.accuracy);
        sidecar.metrics.insert("test_nll".into(), m.nll);
        sidecar.metrics.insert("test_ece".into(), m.ece);
        sidecar.training.wall_seconds = progress.wall_seconds;
        best.save(&model, &sidecar)?;
        test = Some(m);
    }
    Ok(TrainOutcome {
        best,
        iterations: progress.global_iter,
        finished,
        best_val_accuracy: progress.best_val_accuracy,
        best_val_robust_accuracy: progress.best_val_robust_accuracy,
        test,
        wall_seconds: progress.wall_seconds,
    })
}

/// The saved state to return to after divergence was seen at `now`, with the learning rate
/// lowered; the rollback is appended to `rollbacks.csv`. Fails once the rollbacks are spent.
fn roll_back(
    cfg: &TrainConfig,
    state: &StateDir,
    now: &Progress,
    symptom: &str,
) -> anyhow::Result<Progress> {
    let guard = &cfg.guard;
    anyhow::ensure!(
        now.rollbacks < guard.guard_max_rollbacks,
        "training diverged at iteration {} ({symptom}) after {} rollbacks, each lowering the \
         learning rate × {}; giving up. The last good state is in {}: resume it with a lower --lr, \
         a smaller --sgld-lr or more --guard-max-rollbacks",
        now.global_iter + 1,
        now.rollbacks,
        guard.guard_lr_factor,
        cfg.out.join("state").display()
    );
    // The generation before the latest: the latest save may already hold the first diverging
    // steps, since a symptom shows only in the step after them. Stay within the epoch, so that
    // no finished epoch (its validation, its best checkpoint) is undone.
    let latest = state
        .load_progress()?
        .context("the divergence guard found no saved state to roll back to")?;
    let mut back = match state.previous(&latest)? {
        Some(p) if p.epoch == now.epoch => p,
        _ => latest,
    };
    back.lr_scale = now.lr_scale * guard.guard_lr_factor;
    back.rollbacks = now.rollbacks + 1;
    back.wall_seconds = now.wall_seconds;
    back.settings = now.settings.clone();
    let path = cfg.out.join("rollbacks.csv");
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    use std::io::Write;
    if fresh {
        writeln!(
            f,
            "detected_at_iteration,rolled_back_to_iteration,lr_scale,symptom"
        )?;
    }
    writeln!(
        f,
        "{},{},{:e},\"{}\"",
        now.global_iter + 1,
        back.global_iter,
        back.lr_scale,
        symptom.replace('"', "'")
    )?;
    Ok(back)
}

/// The model initialised from another checkpoint's weights (`--init-from`).
fn warm_start<B: AutodiffBackend>(
    from: &std::path::Path,
    arch: &WideResNetConfig,
    device: &B::Device,
) -> anyhow::Result<WideResNet<B>> {
    let (init, sidecar) = Checkpoint::at(from).load::<B>(device)?;
    anyhow::ensure!(
        &sidecar.architecture == arch,
        "--init-from {}: its architecture {:?} differs from this run's {:?}",
        from.display(),
        sidecar.architecture,
        arch
    );
    Ok(init)
}

fn record(
    cfg: &TrainConfig,
    kind: &str,
    source: &DataSource,
    wall: f64,
    settings: &serde_json::Value,
) -> TrainingRecord {
    TrainingRecord {
        kind: kind.into(),
        data: source.spec(),
        data_split: match cfg.train_subset {
            Some(n) => format!(
                "train: first {n} images; validation: last {} train images",
                cfg.val_size
            ),
            None => format!(
                "train minus its last {} images, which validate",
                cfg.val_size
            ),
        },
        seed: cfg.seed,
        settings: settings.clone(),
        wall_seconds: wall,
    }
}
