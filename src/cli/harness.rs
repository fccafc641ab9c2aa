//! The flags of `jem-bench regress`, `report` and `merge`, converted into the library's calls
//! (`jem_bench::harness::{regress, report, merge}`), which know nothing of the command line.

use std::path::PathBuf;

use clap::Args;
use jem_bench::backend::BenchBackend;
use jem_bench::harness::{self, MergeSpec, RegressSpec};

/// `jem-bench regress`: compares a sweep with a stored reference.
#[derive(Debug, Clone, Args)]
pub struct RegressArgs {
    /// The reference sweep folder (its settings.json and robust.csv).
    #[arg(long)]
    pub reference: PathBuf,
    /// Largest allowed drop of robust accuracy (absolute, e.g. 0.02 = 2 points).
    #[arg(long, default_value_t = 0.02)]
    pub tolerance: f64,
    /// Compare this finished sweep folder instead of rerunning the reference's sweep.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// Where the rerun goes (default: `runs/regress/<reference folder name>`); a previous rerun
    /// there (marked by a REGRESS-RERUN file) is cleared first; any other folder, and one that
    /// overlaps the reference, is refused.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Compare a `--run` whose cells were computed with other settings than the reference's
    /// (other examples, attack or defence settings, EOT, seed, data); the differences are
    /// printed. Without it such a run is refused.
    #[arg(long)]
    pub allow_other_settings: bool,
}

impl RegressArgs {
    /// Runs `regress` on `device` (a refused setting is reported with its flag by `main`).
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = RegressSpec {
            reference: self.reference,
            tolerance: self.tolerance,
            run: self.run,
            out: self.out,
            allow_other_settings: self.allow_other_settings,
        };
        harness::regress::<B>(&spec, device, &harness::TerminalProgress::default())
    }
}

/// `jem-bench report`: regenerates the summary, table and plots of finished sweeps from their
/// `robust.csv`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Sweep folders (each holds a robust.csv).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Also draw all the runs into one figure here (e.g. the L∞ and L2 sweeps side by side):
    /// writes OUT/curves.svg and OUT/curves.png, and, when the runs together hold at least 3
    /// values of K (e.g. the default sweep's K = 0, 1 and a sweep at K = 2, 5, 10), robust
    /// accuracy against K as OUT/k-curve.csv, .svg and .png.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw a sweep that has not finished every cell its settings plan (killed, still running,
    /// or one shard of several): the finished cells are drawn and the missing ones listed.
    /// Without it such a sweep is refused, naming the missing cells.
    #[arg(long)]
    pub partial: bool,
}

impl ReportArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let terminal = harness::TerminalProgress::default();
        harness::report(&self.runs, self.out.as_deref(), self.partial, &terminal)
    }
}

/// `jem-bench merge`: joins finished sweep folders into one, as if it had run whole: the shards
/// of one sweep, or sweeps that differ only in their models (or in the backend that computed
/// them: each row keeps its own, and `settings.json` names them).
#[derive(Debug, Clone, Args)]
pub struct MergeArgs {
    /// The sweep folders (shards of one sweep, or sweeps of other models with the same
    /// settings).
    #[arg(required = true)]
    pub folders: Vec<PathBuf>,
    /// The merged folder.
    #[arg(long)]
    pub out: PathBuf,
    /// The models to keep, comma-separated, in the order of the merged tables (names after
    /// --rename; default: all, in the order the folders list them).
    #[arg(long, value_delimiter = ',')]
    pub models: Option<Vec<String>>,
    /// `OLD=NEW`: the cells of model OLD belong to the checkpoint now at NEW (it must hold the
    /// weights the folders recorded for OLD). Repeatable.
    #[arg(long, value_parser = parse_rename)]
    pub rename: Vec<(String, String)>,
}

impl MergeArgs {
    /// Merges on `device`, where the models are loaded to check their weights.
    pub fn run<B: BenchBackend>(self, device: &B::Device) -> anyhow::Result<()> {
        let spec = MergeSpec {
            models: self.models,
            renames: self.rename,
        };
        harness::merge::<B>(
            &self.folders,
            &spec,
            &self.out,
            device,
            &harness::TerminalProgress::default(),
        )
    }
}

fn parse_rename(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((old, new)) if !old.is_empty() && !new.is_empty() && old != new => {
            Ok((old.to_string(), new.to_string()))
        }
        _ => Err(format!(
            "expected OLD=NEW, two different model paths (e.g. \
             results/models/jem=results/models/jem-ce1000), got '{s}'"
        )),
    }
}
