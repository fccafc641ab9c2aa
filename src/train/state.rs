//! The resumable state of a training run: model and optimiser records (burn's own format, which
//! keeps parameter ids so Adam's moments reattach to the right tensors) and the progress counter.
//!
//! Crash-consistent: the records of generation g go to `model-g.bin` / `optim-g.bin` (and the
//! objective's own state, JEM's replay buffer, to `objective-g.bin`), then
//! `progress.json` (written atomically) switches to g, then generations older than the one before
//! g are deleted. An interruption at any point leaves a complete earlier generation in place.
//!
//! A state records its format ([`STATE_FORMAT`]); a state of another format is refused with
//! what to do instead (start afresh from the run's best checkpoint), never half read.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::model::{write_atomic, WideResNet};

/// The format of the training states this jem-bench writes and reads. Format 2: one file per
/// record (format 1 split large objective states into parts and lacked some fields below).
pub const STATE_FORMAT: u32 = 2;

/// Where a run stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// [`STATE_FORMAT`] of the state.
    pub format: u32,
    pub generation: u64,
    /// Completed optimiser steps.
    pub global_iter: usize,
    pub epoch: usize,
    /// Batches of `epoch` already done.
    pub batch_in_epoch: usize,
    /// Clean validation accuracy of the best checkpoint.
    pub best_val_accuracy: Option<f64>,
    /// Robust validation accuracy of the best checkpoint, for objectives that select on it.
    pub best_val_robust_accuracy: Option<f64>,
    pub wall_seconds: f64,
    /// The run's settings as JSON; a resume with other settings is refused.
    pub settings: serde_json::Value,
    /// Factor on the scheduled learning rate, lowered by the divergence guard at each rollback.
    pub lr_scale: f64,
    /// Rollbacks the divergence guard has made so far.
    pub rollbacks: usize,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            format: STATE_FORMAT,
            generation: 0,
            global_iter: 0,
            epoch: 0,
            batch_in_epoch: 0,
            best_val_accuracy: None,
            best_val_robust_accuracy: None,
            wall_seconds: 0.0,
            settings: serde_json::Value::Null,
            lr_scale: 1.0,
            rollbacks: 0,
        }
    }
}

pub struct StateDir {
    dir: PathBuf,
}

type Rec = BinBytesRecorder<FullPrecisionSettings>;

impl StateDir {
    pub fn new(out: &Path) -> Self {
        Self {
            dir: out.join("state"),
        }
    }

    fn progress_path(&self) -> PathBuf {
        self.dir.join("progress.json")
    }

    pub fn load_progress(&self) -> anyhow::Result<Option<Progress>> {
        let p = self.progress_path();
        if !p.exists() {
            return Ok(None);
        }
        read_progress(&p).map(Some)
    }

    pub fn save<B, O>(
        &self,
        model: &WideResNet<B>,
        optim: &O,
        objective: Option<Vec<u8>>,
        progress: &Progress,
    ) -> anyhow::Result<()>
    where
        B: AutodiffBackend,
        O: Optimizer<WideResNet<B>, B>,
    {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let g = progress.generation;
        let model_bytes = Rec::default()
            .record(model.clone().into_record(), ())
            .context("cannot serialise the model state")?;
        let optim_bytes = Rec::default()
            .record(optim.to_record(), ())
            .context("cannot serialise the optimiser state")?;
        write_atomic(&self.dir.join(format!("model-{g}.bin")), &model_bytes)?;
        write_atomic(&self.dir.join(format!("optim-{g}.bin")), &optim_bytes)?;
        if let Some(bytes) = objective {
            write_atomic(&self.dir.join(format!("objective-{g}.bin")), &bytes)?;
        }
        let progress_json = serde_json::to_string_pretty(progress)?;
        write_atomic(
            &self.dir.join(format!("progress-{g}.json")),
            progress_json.as_bytes(),
        )?;
        write_atomic(&self.progress_path(), progress_json.as_bytes())?;
        // Keep this generation and the one before it (the divergence guard's fallback, since
        // the latest save may already hold the first diverging steps); delete the rest.
        let generations = self.generations()?;
        let previous = generations.iter().copied().filter(|&o| o < g).max();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if generation_of(&name).is_some_and(|old| old != g && Some(old) != previous) {
                let _ = std::fs::remove_file(self.dir.join(&name));
            }
        }
        Ok(())
    }

    /// Generations whose progress file is present.
    fn generations(&self) -> anyhow::Result<Vec<u64>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)
            .with_context(|| format!("cannot list {}", self.dir.display()))?
        {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with("progress-") {
                found.extend(generation_of(&name));
            }
        }
        Ok(found)
    }

    /// The saved generation before `progress`'s, if one is kept.
    pub fn previous(&self, progress: &Progress) -> anyhow::Result<Option<Progress>> {
        let Some(g) = self
            .generations()?
            .into_iter()
            .filter(|&o| o < progress.generation)
            .max()
        else {
            return Ok(None);
        };
        let p = self.dir.join(format!("progress-{g}.json"));
        read_progress(&p).map(Some)
    }

    /// The objective's saved state of the generation named in `progress`, with the file's
    /// path for error messages; `None` when the objective keeps none. A missing file is an
    /// error when the objective keeps state (`required`): continuing a JEM with fresh chains
    /// would silently be another run.
    pub fn objective_state(
        &self,
        progress: &Progress,
        required: bool,
    ) -> anyhow::Result<Option<(Vec<u8>, String)>> {
        let g = progress.generation;
        let found = read_objective(&self.dir, g)?;
        anyhow::ensure!(
            found.is_some() || !required,
            "{} is missing: the training state of generation {g} (iteration {}) has no saved \
             objective state (a JEM's replay buffer), so the run cannot continue as the same \
             run; restore the file, or start a new run with another --out",
            self.dir.join(format!("objective-{g}.bin")).display(),
            progress.global_iter
        );
        Ok(found)
    }

    /// Restores model and optimiser of the generation named in `progress`.
    pub fn restore<B, O>(
        &self,
        model: WideResNet<B>,
        optim: O,
        progress: &Progress,
        device: &B::Device,
    ) -> anyhow::Result<(WideResNet<B>, O)>
    where
        B: AutodiffBackend,
        O: Optimizer<WideResNet<B>, B>,
    {
        let g = progress.generation;
        let model_rec = load_record::<B, _>(&self.dir.join(format!("model-{g}.bin")), device)?;
        let optim_rec = load_record::<B, _>(&self.dir.join(format!("optim-{g}.bin")), device)?;
        Ok((model.load_record(model_rec), optim.load_record(optim_rec)))
    }
}

/// One record of a training state. burn's binary recorder panics, rather than erring, on a
/// record of another layout (one written before the model gained a field, say): that becomes
/// an error that says what to do.
fn load_record<B: burn::tensor::backend::Backend, R: burn::record::Record<B>>(
    path: &Path,
    device: &B::Device,
) -> anyhow::Result<R> {
    let bytes = std::fs::read(path)
        .with_context(|| format!("cannot read training state {}", path.display()))?;
    // Silence the default hook's panic message and backtrace while loading: the error below
    // replaces them.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Rec::default().load(bytes, device)
    }));
    std::panic::set_hook(hook);
    loaded
        .map_err(|_| {
            anyhow::anyhow!(
                "training state {} cannot be read as this jem-bench's model or optimiser: it is \
             truncated or corrupt, or was written by a jem-bench whose layout differs; start a \
             fresh run, with --init-from the run's best checkpoint to keep its weights",
                path.display()
            )
        })?
        .with_context(|| format!("training state {} is unreadable", path.display()))
}

/// A progress file read and checked: its format must be [`STATE_FORMAT`].
fn read_progress(p: &Path) -> anyhow::Result<Progress> {
    let text =
        std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a jem-bench training progress file", p.display()))?;
    let format = value.get("format").and_then(serde_json::Value::as_u64);
    let found = format.map_or(
        "format 1 (written before states recorded one)".into(),
        |f| format!("format {f}"),
    );
    // state/progress.json: the run's folder is two up.
    let run = p.parent().and_then(Path::parent).unwrap_or(Path::new("."));
    anyhow::ensure!(
        format == Some(STATE_FORMAT.into()),
        "{}: format: a training state of {found}; this jem-bench reads format {STATE_FORMAT} \
         only: train afresh into another --out (--init-from {} keeps the run's best weights)",
        p.display(),
        run.join("model").display()
    );
    serde_json::from_value(value)
        .with_context(|| format!("{}: not a jem-bench training progress file", p.display()))
}

/// The objective's state of generation `g`, with its path for error messages; `None` if the
/// objective keeps none.
fn read_objective(dir: &Path, g: u64) -> anyhow::Result<Option<(Vec<u8>, String)>> {
    let path = dir.join(format!("objective-{g}.bin"));
    if !path.exists() {
        return Ok(None);
    }
    let bytes = std::fs::read(&path)
        .with_context(|| format!("cannot read training state {}", path.display()))?;
    Ok(Some((bytes, path.display().to_string())))
}

/// The generation number in a state file name (`model-3.bin`, `progress-3.json`,
/// `objective-3.bin`, …).
fn generation_of(name: &str) -> Option<u64> {
    let (stem, _) = name.split_once('.')?;
    let (kind, g) = stem.rsplit_once('-')?;
    matches!(kind, "model" | "optim" | "objective" | "progress")
        .then(|| g.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_of_another_format_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        let progress = Progress::default();
        let mut json = serde_json::to_value(&progress).unwrap();
        std::fs::write(state.progress_path(), json.to_string()).unwrap();
        assert_eq!(state.load_progress().unwrap(), Some(progress));
        for format in [None, Some(1), Some(3)] {
            match format {
                None => json.as_object_mut().unwrap().remove("format"),
                Some(f) => json
                    .as_object_mut()
                    .unwrap()
                    .insert("format".into(), f.into()),
            };
            std::fs::write(state.progress_path(), json.to_string()).unwrap();
            let err = state.load_progress().unwrap_err().to_string();
            assert!(
                err.contains("progress.json: format")
                    && err.contains(&format!("format {}", format.unwrap_or(1)))
                    && err.contains("--init-from"),
                "{err}"
            );
        }
    }
}
