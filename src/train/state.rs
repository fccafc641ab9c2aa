//! The resumable state of a training run: model and optimiser records (burn's own format, which
//! keeps parameter ids so Adam's moments reattach to the right tensors) and the progress counter.
//!
//! Crash-consistent: the records of generation g go to `model-g.bin` / `optim-g.bin` (and the
//! objective's own state, JEM's replay buffer, to `objective-g.bin`), then
//! `progress.json` (written atomically) switches to g, then generations older than the one before
//! g are deleted. An interruption at any point leaves a complete earlier generation in place.
//!
//! An objective state larger than [`PART_BYTES`] (MNIST's replay buffer of 10 000 chains is
//! 31 MB) is written as numbered parts, `objective-g.part0of2.bin`, `objective-g.part1of2.bin`,
//! so that every file of a training state fits a repository's limit on file size and a long run
//! can be committed and continued on another machine.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::model::{write_atomic, WideResNet};

/// Where a run stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub generation: u64,
    /// Completed optimiser steps.
    pub global_iter: usize,
    pub epoch: usize,
    /// Batches of `epoch` already done.
    pub batch_in_epoch: usize,
    /// Clean validation accuracy of the best checkpoint.
    pub best_val_accuracy: Option<f64>,
    /// Robust validation accuracy of the best checkpoint, for objectives that select on it
    /// (absent from runs started before it was measured).
    #[serde(default)]
    pub best_val_robust_accuracy: Option<f64>,
    pub wall_seconds: f64,
    /// The run's settings as JSON; a resume with other settings is refused.
    pub settings: serde_json::Value,
    /// Factor on the scheduled learning rate, lowered by the divergence guard at each rollback.
    #[serde(default = "one")]
    pub lr_scale: f64,
    /// Rollbacks the divergence guard has made so far.
    #[serde(default)]
    pub rollbacks: usize,
}

fn one() -> f64 {
    1.0
}

impl Default for Progress {
    fn default() -> Self {
        Self {
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

/// Largest file of an objective's state; larger states are split into parts of this size.
pub const PART_BYTES: usize = 16 << 20;

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
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
        Ok(Some(serde_json::from_str(&text).with_context(|| {
            format!("{}: not a jem-bench training progress file", p.display())
        })?))
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
            write_objective(&self.dir, g, &bytes, PART_BYTES)?;
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
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
        Ok(Some(serde_json::from_str(&text).with_context(|| {
            format!("{}: not a jem-bench training progress file", p.display())
        })?))
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

/// Writes an objective's state of generation `g`: one file, or parts of at most `part_bytes`.
fn write_objective(dir: &Path, g: u64, bytes: &[u8], part_bytes: usize) -> anyhow::Result<()> {
    if bytes.len() <= part_bytes {
        return write_atomic(&dir.join(format!("objective-{g}.bin")), bytes);
    }
    let parts = bytes.len().div_ceil(part_bytes);
    for (i, part) in bytes.chunks(part_bytes).enumerate() {
        write_atomic(
            &dir.join(format!("objective-{g}.part{i}of{parts}.bin")),
            part,
        )?;
    }
    Ok(())
}

/// Reads what [`write_objective`] wrote for generation `g`, with a name for error messages;
/// `None` if nothing was. Parts must all be there, each numbered for the same count.
fn read_objective(dir: &Path, g: u64) -> anyhow::Result<Option<(Vec<u8>, String)>> {
    let whole = dir.join(format!("objective-{g}.bin"));
    if whole.exists() {
        let bytes = std::fs::read(&whole)
            .with_context(|| format!("cannot read training state {}", whole.display()))?;
        return Ok(Some((bytes, whole.display().to_string())));
    }
    let prefix = format!("objective-{g}.part");
    let mut parts: Vec<(usize, usize)> = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let numbers = rest.strip_suffix(".bin").and_then(|r| r.split_once("of"));
        let parsed = numbers.and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
        let (i, n) = parsed.with_context(|| {
            format!(
                "{}: not a part of a training state (expected {prefix}IofN.bin)",
                dir.join(&name).display()
            )
        })?;
        parts.push((i, n));
    }
    let Some(&(_, count)) = parts.first() else {
        return Ok(None);
    };
    parts.sort_unstable();
    let label = dir
        .join(format!("{prefix}*of{count}.bin"))
        .display()
        .to_string();
    anyhow::ensure!(
        parts.iter().copied().eq((0..count).map(|i| (i, count))),
        "{label}: the training state's parts are incomplete or of different counts (found {:?} \
         as (part, of)); restore the missing parts",
        parts
    );
    let mut bytes = Vec::new();
    for i in 0..count {
        let path = dir.join(format!("{prefix}{i}of{count}.bin"));
        bytes.extend(
            std::fs::read(&path)
                .with_context(|| format!("cannot read training state {}", path.display()))?,
        );
    }
    Ok(Some((bytes, label)))
}

/// The generation number in a state file name (`model-3.bin`, `progress-3.json`,
/// `objective-3.part0of2.bin`, …).
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
    fn a_large_objective_state_goes_to_parts_and_comes_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..25u8).collect();
        write_objective(dir.path(), 7, &bytes, 10).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "objective-7.part0of3.bin",
                "objective-7.part1of3.bin",
                "objective-7.part2of3.bin"
            ]
        );
        assert!(names.iter().all(|n| generation_of(n) == Some(7)));
        assert_eq!(read_objective(dir.path(), 7).unwrap().unwrap().0, bytes);
        assert!(read_objective(dir.path(), 8).unwrap().is_none());

        // Small states stay one file.
        write_objective(dir.path(), 8, &bytes[..10], 10).unwrap();
        assert!(dir.path().join("objective-8.bin").exists());
        assert_eq!(
            read_objective(dir.path(), 8).unwrap().unwrap().0,
            &bytes[..10]
        );

        // A missing part is an error that names the parts, not a shorter state.
        std::fs::remove_file(dir.path().join("objective-7.part1of3.bin")).unwrap();
        let err = read_objective(dir.path(), 7).unwrap_err().to_string();
        assert!(
            err.contains("objective-7.part*of3.bin") && err.contains("incomplete"),
            "{err}"
        );
    }
}
