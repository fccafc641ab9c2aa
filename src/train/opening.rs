//! What a training run opens before its first iteration, beside its saved state: the weights
//! it starts from (`--init-from`, widened where it is narrower), its logs appended to where it
//! stopped, an old best checkpoint re-scored when selection changed, and its progress bar.

use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use jem_kernels::KernelsAutodiff;

use super::log::CsvLog;
use super::objective::Objective;
use super::state::Progress;
use super::TrainSpec;
use crate::model::{Checkpoint, WideResNet, WideResNetConfig};
use crate::settings::InvalidSetting;

/// The run's iteration log (`log.csv`) and epoch log (`epochs.csv`), opened to append after
/// the rows `progress` has done, and the iteration log's header (the objective adds columns).
pub(super) fn open_logs<B: KernelsAutodiff, O: Objective<B>>(
    cfg: &TrainSpec,
    objective: &O,
    progress: &Progress,
) -> anyhow::Result<(Vec<&'static str>, CsvLog, CsvLog)> {
    let robust = objective.selects_on_robustness();
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
    let iter_log = CsvLog::open(
        &cfg.out.join("log.csv"),
        &header,
        progress.global_iter as u64 + 1,
    )?;
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
    let epoch_log = CsvLog::open(
        &cfg.out.join("epochs.csv"),
        &epoch_header,
        progress.epoch as u64,
    )?;
    Ok((header, iter_log, epoch_log))
}

/// The progress bar of a run of `total` iterations, `done` of them done.
pub(super) fn iteration_bar(total: usize, done: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64).with_position(done as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} it  ETA {eta}  {msg}",
        )
        .expect("valid template"),
    );
    bar
}

/// Says `line` above the run's progress bar, or on standard error where the bar is hidden (a
/// log file, a Slurm job's output), where indicatif's own `println` would drop it: the one way
/// a training run reports besides the bar.
pub(super) fn say(bar: &ProgressBar, line: &str) {
    bar.suspend(|| eprintln!("{line}"));
}

/// The model initialised from another checkpoint's weights (`init_from`): the same
/// architecture, or a narrower one of the same depth, widened to this run's width without
/// changing what it computes (Net2WiderNet, `crate::model::widen`; `seed` splits its weights),
/// with a line saying so for the log if it was widened.
pub(super) fn warm_start<B: AutodiffBackend>(
    from: &std::path::Path,
    arch: &WideResNetConfig,
    seed: u64,
    device: &B::Device,
) -> anyhow::Result<(WideResNet<B>, Option<String>)> {
    let value = from.display();
    let (init, sidecar) = Checkpoint::at(from)
        .load::<B>(device)
        .map_err(|e| crate::settings::refusal("init_from", &value, e))?;
    if &sidecar.architecture == arch {
        return Ok((init, None));
    }
    match crate::model::widening_factor(&sidecar.architecture, arch) {
        Ok(factor) => {
            let note = format!(
                "init_from: {} widened ×{factor} to {} (Net2WiderNet: the same logits, its \
                 weights split at random among each channel's copies)",
                sidecar.architecture.name(),
                arch.name()
            );
            Ok((crate::model::widen(&init, arch, seed, device)?, Some(note)))
        }
        Err(why) => {
            let problem = format!(
                "its architecture ({}) is neither this run's ({arch}) nor one that widens to \
                 it ({why})",
                sidecar.architecture
            );
            Err(InvalidSetting::new("init_from", value.to_string(), &problem).into())
        }
    }
}
