//! The resumable state of a training run: model and optimiser records (burn's own format, which
//! keeps parameter ids so Adam's moments reattach to the right tensors) and the progress counter.
//!
//! Crash-consistent: the records of generation g go to `model-g.bin` / `optim-g.bin`, then
//! `progress.json` (written atomically) switches to g, then older generations are deleted. An
//! interruption at any point leaves a complete earlier generation in place.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use crate::model::{write_atomic, WideResNet};

/// Where a run stands.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub generation: u64,
    /// Completed optimiser steps.
    pub global_iter: usize,
    pub epoch: usize,
    /// Batches of `epoch` already done.
    pub batch_in_epoch: usize,
    pub best_val_accuracy: Option<f64>,
    pub wall_seconds: f64,
    /// The run's settings as JSON; a resume with other settings is refused.
    pub settings: serde_json::Value,
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
        write_atomic(
            &self.progress_path(),
            serde_json::to_string_pretty(progress)?.as_bytes(),
        )?;
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            let gen = name
                .strip_prefix("model-")
                .or_else(|| name.strip_prefix("optim-"))
                .and_then(|s| s.strip_suffix(".bin"))
                .and_then(|s| s.parse::<u64>().ok());
            if gen.is_some_and(|old| old != g) {
                let _ = std::fs::remove_file(self.dir.join(&name));
            }
        }
        Ok(())
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
        let read = |name: String| {
            let p = self.dir.join(name);
            std::fs::read(&p).with_context(|| format!("cannot read training state {}", p.display()))
        };
        let model_rec = Rec::default()
            .load(read(format!("model-{g}.bin"))?, device)
            .context("training state: model record does not fit this architecture")?;
        let optim_rec = Rec::default()
            .load(read(format!("optim-{g}.bin"))?, device)
            .context("training state: optimiser record is unreadable")?;
        Ok((model.load_record(model_rec), optim.load_record(optim_rec)))
    }
}
