//! The training loop shared by every objective: seeded shuffling, augmentation and data noise,
//! Adam with warm-up and step decay, per-iteration and per-epoch CSV logs, validation with a
//! best-on-validation checkpoint, and a resumable state that a re-run of the same command picks up.

use jem_kernels::{FusedAdam, KernelsAutodiff};
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use indicatif::ProgressBar;
use jem_datasets::{DataSource, ImageSet};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::augment::Augmentation;
use super::log::{CsvLog, LogWindow};
use super::objective::{Objective, Step};
use super::opening::{iteration_bar, open_logs, say, warm_start};
use super::resume::{check_resumable, record_backend, record_changes, roll_back};
use super::schedule::LrSchedule;
use super::state::{Progress, StateDir};
use super::TrainSpec;
use crate::batches;
use crate::metrics::{self, CleanMetrics};
use crate::model::{Checkpoint, Sidecar, WideResNet, WideResNetConfig};

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
const WIDEN: u64 = 5;

/// The optimiser of every training run: Adam with PyTorch's β and ε (the official JEM's), each
/// parameter's update one pass (one launch on a GPU) with burn's `Adam`'s numbers and state.
pub fn adam() -> FusedAdam {
    FusedAdam::new(0.9, 0.999, 1e-8)
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

/// Trains with `objective` until `cfg.epochs` are done (or `cfg.max_iters`), resuming from
/// `cfg.out/state` when it exists.
pub fn train<B, O>(
    cfg: &TrainSpec,
    objective: &mut O,
    device: &B::Device,
) -> anyhow::Result<TrainOutcome>
where
    B: KernelsAutodiff,
    O: Objective<B>,
{
    let mut t = Trainer::open(cfg, objective, device)?;
    'epochs: while !t.done() {
        let order = t.epoch_order();
        while t.progress.batch_in_epoch < t.batches_per_epoch && !t.done() {
            if let Iteration::RolledBack = t.step(&order)? {
                continue 'epochs;
            }
        }
        if t.progress.batch_in_epoch < t.batches_per_epoch {
            break; // stopped by max_iters inside the epoch
        }
        t.end_epoch()?;
    }
    t.finish()
}

/// How one training iteration ended.
enum Iteration {
    /// The model took its step.
    Stepped,
    /// The divergence guard saw a symptom and returned to an earlier state: the epoch restarts
    /// from its shuffled order at the restored batch.
    RolledBack,
}

/// One training run in progress: its data, model, optimiser, saved state and logs.
struct Trainer<'a, B: KernelsAutodiff, O: Objective<B>> {
    cfg: &'a TrainSpec,
    objective: &'a mut O,
    device: &'a B::Device,
    source: DataSource,
    train: ImageSet,
    val: ImageSet,
    arch: WideResNetConfig,
    settings: serde_json::Value,
    state: StateDir,
    schedule: LrSchedule,
    augmentation: Augmentation,
    /// σ_data on the [0, 1] pixel scale the noise is added on.
    pixel_sigma: f32,
    model: WideResNet<B>,
    optim: OptimizerAdaptor<FusedAdam, WideResNet<B>, B>,
    progress: Progress,
    header: Vec<&'static str>,
    iter_log: CsvLog,
    epoch_log: CsvLog,
    /// Whether the best checkpoint is chosen on robust rather than clean validation accuracy.
    robust: bool,
    best: Checkpoint,
    batches_per_epoch: usize,
    stop_at: usize,
    bar: ProgressBar,
    started: Instant,
    /// Wall seconds of the run before this process resumed it.
    wall_before: f64,
    window: LogWindow,
    /// Held while the run lasts: one process per run folder.
    _lock: crate::output_folder::FolderLock,
}

impl<'a, B: KernelsAutodiff, O: Objective<B>> Trainer<'a, B, O> {
    /// Checks everything that can be refused, then claims `cfg.out` and starts or resumes the
    /// run saved there.
    fn open(
        cfg: &'a TrainSpec,
        objective: &'a mut O,
        device: &'a B::Device,
    ) -> anyhow::Result<Self> {
        cfg.validate()?;
        let (source, train, val) = cfg.load_data()?;
        // A random crop of a padded image must leave some of the image in every crop.
        let side = train.height.min(train.width);
        if cfg.pad >= side {
            return Err(crate::settings::InvalidSetting::new(
                "pad",
                cfg.pad.to_string(),
                &format!(
                    "expected a padding below the images' side ({side} pixels in {})",
                    cfg.data
                ),
            )
            .into());
        }
        let arch = cfg.architecture(&train);
        arch.blocks_per_stage()?;
        // Everything that can be refused is checked before the folder is written.
        let mut warm = cfg
            .init_from
            .as_ref()
            .map(|from| warm_start::<B>(from, &arch, stream_seed(cfg.seed, WIDEN, 0), device))
            .transpose()?;
        objective.prepare(&arch, &train, stream_seed(cfg.seed, OBJECTIVE_INIT, 0))?;
        // One process per run folder: a second would "resume" the same state and redo its work.
        let lock = crate::output_folder::claim(&cfg.out, "train")?;
        let settings = cfg.settings();
        // Said through the progress bar once it exists (the run's one reporter).
        let mut opening = None;
        let state = StateDir::new(&cfg.out);
        let mut model: WideResNet<B> = arch.init_seeded(cfg.seed, device)?;
        let mut optim = adam().init::<B, WideResNet<B>>();
        let progress = match state.load_progress()? {
            Some(mut p) => {
                // What a resumed run changed is recorded in `changes.csv`.
                check_resumable(cfg, &p, &settings)?;
                (model, optim) = state.restore(model, optim, &p, device)?;
                if let Some((bytes, what)) = state.objective_state(&p, objective.keeps_state())? {
                    objective.restore(&bytes, &what)?;
                }
                record_changes(&cfg.out, p.global_iter, &p.settings, &settings)?;
                p.settings = settings.clone();
                opening = Some(format!(
                    "resuming {} at iteration {} (epoch {}, batch {})",
                    cfg.out.display(),
                    p.global_iter,
                    p.epoch,
                    p.batch_in_epoch
                ));
                p
            }
            None => {
                if let Some((init, widened)) = warm.take() {
                    opening = widened;
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
        record_backend(&cfg.out, progress.global_iter)?;

        let robust = objective.selects_on_robustness();
        let (header, iter_log, epoch_log) = open_logs(cfg, &*objective, &progress)?;
        let best = Checkpoint::at(cfg.out.join("model"));

        let batches_per_epoch = train.len().div_ceil(cfg.batch_size);
        let total_iters = batches_per_epoch * cfg.epochs;
        let stop_at = cfg.max_iters.unwrap_or(usize::MAX).min(total_iters);
        let bar = iteration_bar(total_iters, progress.global_iter);
        if let Some(line) = opening {
            say(&bar, &line);
        }
        Ok(Trainer {
            cfg,
            objective,
            device,
            schedule: cfg.schedule(),
            augmentation: cfg.augmentation(source.name()),
            // σ_data is stated on the network's scale; the noise is added to [0, 1] pixels.
            pixel_sigma: cfg.sigma_data * arch.input_normalization.std[0],
            source,
            train,
            val,
            arch,
            settings,
            state,
            model,
            optim,
            wall_before: progress.wall_seconds,
            progress,
            header,
            iter_log,
            epoch_log,
            robust,
            best,
            batches_per_epoch,
            stop_at,
            bar,
            started: Instant::now(),
            window: LogWindow::new(),
            _lock: lock,
        })
    }

    /// Whether the run has done every epoch, or the iterations `--max-iters` allows.
    fn done(&self) -> bool {
        self.progress.epoch >= self.cfg.epochs || self.progress.global_iter >= self.stop_at
    }

    /// The current epoch's order of the training images (seeded by the run seed and the epoch).
    fn epoch_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(stream_seed(
            self.cfg.seed,
            SHUFFLE,
            self.progress.epoch as u64,
        )));
        order
    }

    /// The next batch of `order`, augmented and noised, with its labels; `rng` is the
    /// iteration's own stream.
    fn batch(
        &self,
        order: &[usize],
        rng: &mut rand::rngs::StdRng,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let (size, b, train) = (
            self.cfg.batch_size,
            self.progress.batch_in_epoch,
            &self.train,
        );
        let idx = &order[b * size..((b + 1) * size).min(order.len())];
        let mut pixels = Vec::with_capacity(idx.len() * train.image_len());
        idx.iter()
            .for_each(|&i| pixels.extend_from_slice(train.image(i)));
        self.augmentation
            .apply(&mut pixels, train.channels, train.height, train.width, rng);
        if self.pixel_sigma > 0.0 {
            let noise = Normal::new(0.0, self.pixel_sigma).expect("finite sigma");
            pixels.iter_mut().for_each(|p| *p += noise.sample(rng));
        }
        let x = Tensor::<B, 4>::from_data(
            TensorData::new(
                pixels,
                [idx.len(), train.channels, train.height, train.width],
            ),
            self.device,
        );
        (x, batches::labels::<B>(train, idx, self.device))
    }

    /// One iteration on the next batch of `order`: the objective's loss, the divergence guard,
    /// the optimiser's step, the log row and the periodic checkpoint.
    fn step(&mut self, order: &[usize]) -> anyhow::Result<Iteration> {
        let (it, epoch) = (self.progress.global_iter, self.progress.epoch);
        let mut rng =
            rand::rngs::StdRng::seed_from_u64(stream_seed(self.cfg.seed, BATCH, it as u64));
        let (x, y) = self.batch(order, &mut rng);
        let lr = self.schedule.at(it, epoch) * self.progress.lr_scale;
        let (loss, stats) = self.objective.loss(
            &self.model,
            x,
            y,
            Step {
                iteration: it,
                seed: stream_seed(self.cfg.seed, OBJECTIVE, it as u64),
            },
        );
        if let Some(symptom) = self
            .cfg
            .guard
            .symptom(&stats)
            .or_else(|| self.objective.symptom(&stats))
        {
            drop(loss);
            self.roll_back(&symptom)?;
            return Ok(Iteration::RolledBack);
        }
        // burn's optimisers take the model by value; a module's clone shares its parameters.
        self.model = descend(self.model.clone(), &mut self.optim, loss, lr);
        self.progress.global_iter += 1;
        self.progress.batch_in_epoch += 1;

        self.window.add(&stats);
        let global = self.progress.global_iter;
        if global.is_multiple_of(self.cfg.log_every) || global == self.stop_at {
            self.iter_log.row(&self.window.row(global, epoch, lr))?;
            self.bar.set_message(self.window.message());
            self.window = LogWindow::new();
        }
        self.bar.set_position(global as u64);
        self.progress.wall_seconds = self.wall_before + self.started.elapsed().as_secs_f64();
        if global.is_multiple_of(self.cfg.checkpoint_every)
            && self.progress.batch_in_epoch < self.batches_per_epoch
        {
            self.save()?;
            self.objective.snapshot(&self.cfg.out)?;
        }
        Ok(Iteration::Stepped)
    }

    /// Returns to the saved state the guard chooses after `symptom`, with its lower learning
    /// rate, and reopens the log at that iteration.
    fn roll_back(&mut self, symptom: &str) -> anyhow::Result<()> {
        let back = roll_back(self.cfg, &self.state, &self.progress, symptom)?;
        self.restore(&back)?;
        say(
            &self.bar,
            &format!(
                "iteration {}: {symptom}; rolled back to iteration {}, learning rate × {} (now × \
             {:.3e} of the schedule), rollback {} of at most {}",
                self.progress.global_iter + 1,
                back.global_iter,
                self.cfg.guard.guard_lr_factor,
                back.lr_scale,
                back.rollbacks,
                self.cfg.guard.guard_max_rollbacks
            ),
        );
        self.progress = back;
        self.iter_log = CsvLog::open(
            &self.cfg.out.join("log.csv"),
            &self.header,
            self.progress.global_iter as u64 + 1,
        )?;
        self.window = LogWindow::new();
        self.bar.set_position(self.progress.global_iter as u64);
        Ok(())
    }

    /// Loads the model, optimiser and objective state saved with `progress`.
    fn restore(&mut self, progress: &Progress) -> anyhow::Result<()> {
        let optim = std::mem::replace(&mut self.optim, adam().init());
        (self.model, self.optim) =
            self.state
                .restore(self.model.clone(), optim, progress, self.device)?;
        if let Some((bytes, what)) = self
            .state
            .objective_state(progress, self.objective.keeps_state())?
        {
            self.objective.restore(&bytes, &what)?;
        }
        Ok(())
    }

    /// Saves the model, optimiser and objective state as the next generation.
    fn save(&mut self) -> anyhow::Result<()> {
        self.progress.generation += 1;
        self.state.save(
            &self.model,
            &self.optim,
            self.objective.state(),
            &self.progress,
        )
    }

    /// The end of an epoch: validation, the best checkpoint, the epoch's log row and a save.
    fn end_epoch(&mut self) -> anyhow::Result<()> {
        let epoch = self.progress.epoch;
        let inference = self.model.valid();
        let m = metrics::evaluate(&inference, &self.val, 500, self.device);
        let r = self
            .robust
            .then(|| {
                self.objective
                    .robust_accuracy(&self.model, &self.val, self.device)
            })
            .transpose()?;
        let progress = &mut self.progress;
        let is_best = match r {
            Some(r) => progress.best_val_robust_accuracy.is_none_or(|b| r > b),
            None => progress.best_val_accuracy.is_none_or(|b| m.accuracy > b),
        };
        if is_best {
            progress.best_val_accuracy = Some(m.accuracy);
            progress.best_val_robust_accuracy = r;
            let record = self.cfg.record(
                self.objective.kind(),
                &self.source,
                progress.wall_seconds,
                &self.settings,
            );
            let mut sidecar = Sidecar::new(self.arch.clone(), record);
            sidecar.metrics.insert("val_accuracy".into(), m.accuracy);
            if let Some(r) = r {
                sidecar.metrics.insert("val_robust_accuracy".into(), r);
            }
            sidecar.metrics.insert("epoch".into(), epoch as f64);
            self.best.save(&inference, &sidecar)?;
        }
        progress.wall_seconds = self.wall_before + self.started.elapsed().as_secs_f64();
        let lr = self
            .schedule
            .at(progress.global_iter.saturating_sub(1), epoch)
            * progress.lr_scale;
        let mut row = vec![
            epoch.to_string(),
            progress.global_iter.to_string(),
            format!("{lr:.3e}"),
            format!("{:.5}", m.accuracy),
            format!("{:.5}", m.nll),
            format!("{:.5}", m.ece),
        ];
        row.extend(r.map(|r| format!("{r:.5}")));
        row.extend([is_best.to_string(), format!("{:.1}", progress.wall_seconds)]);
        self.epoch_log.row(&row)?;
        say(
            &self.bar,
            &format!(
                "epoch {epoch}: val accuracy {:.4}, nll {:.4}, ece {:.4}{}{}",
                m.accuracy,
                m.nll,
                m.ece,
                r.map_or(String::new(), |r| format!(", robust {r:.4}")),
                if is_best { " (best)" } else { "" }
            ),
        );
        progress.epoch += 1;
        progress.batch_in_epoch = 0;
        self.save()?;
        self.objective.snapshot(&self.cfg.out)
    }

    /// Saves a run stopped inside an epoch, and scores a finished run's best checkpoint on the
    /// test set (recorded in its sidecar).
    fn finish(mut self) -> anyhow::Result<TrainOutcome> {
        if self.progress.batch_in_epoch > 0 {
            self.save()?;
        }
        self.bar.finish_and_clear();
        let progress = &self.progress;
        let finished = progress.epoch >= self.cfg.epochs;
        let mut test = None;
        if finished && self.best.exists() {
            let (model, mut sidecar) = self.best.load::<B::InnerBackend>(self.device)?;
            let m = metrics::evaluate(&model, &self.cfg.load_test(&self.source)?, 500, self.device);
            sidecar.metrics.insert("test_accuracy".into(), m.accuracy);
            sidecar.metrics.insert("test_nll".into(), m.nll);
            sidecar.metrics.insert("test_ece".into(), m.ece);
            sidecar.training.wall_seconds = progress.wall_seconds;
            self.best.save(&model, &sidecar)?;
            test = Some(m);
        }
        Ok(TrainOutcome {
            best: self.best.clone(),
            iterations: progress.global_iter,
            finished,
            best_val_accuracy: progress.best_val_accuracy,
            best_val_robust_accuracy: progress.best_val_robust_accuracy,
            test,
            wall_seconds: progress.wall_seconds,
        })
    }
}
