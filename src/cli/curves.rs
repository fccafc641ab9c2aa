//! `jem-bench curves`: training runs' validation curves (their `epochs.csv`) in one figure,
//! through `jem_bench::train::curves`.

use std::path::PathBuf;

use clap::Args;
use jem_bench::train::curves::CurveRun;

/// `jem-bench curves`: validation accuracy, NLL and ECE against training iterations.
#[derive(Debug, Clone, Args)]
pub struct CurvesArgs {
    /// Training runs: `DIR[=LABEL][@START]`, a folder of `jem-bench train --out` (or its
    /// epochs.csv), the legend's label (default: the folder's name), and the iteration its
    /// curve starts at (default 0; a run that continued another from that one's iteration
    /// START, e.g. `--init-from` its checkpoint, drawn where it took over).
    #[arg(required = true, value_parser = parse_run)]
    pub runs: Vec<CurveRun>,
    /// Writes OUT.svg and OUT.png.
    #[arg(long)]
    pub out: PathBuf,
    /// The second panel shows validation accuracy from this percentage up (where runs that all
    /// end near the top differ).
    #[arg(long, default_value_t = 90.0)]
    pub zoom_from: f64,
}

impl CurvesArgs {
    pub fn run(self) -> anyhow::Result<()> {
        jem_bench::train::curves::write(&self.runs, &self.out, self.zoom_from)?;
        eprintln!("wrote {}.svg and .png", self.out.display());
        Ok(())
    }
}

/// `DIR[=LABEL][@START]` → the run.
fn parse_run(arg: &str) -> Result<CurveRun, String> {
    let expected =
        || format!("expected DIR[=LABEL][@START] (START an iteration count), got '{arg}'");
    let (s, start) = match arg.rsplit_once('@') {
        Some((s, start)) => (s, start.parse::<u64>().map_err(|_| expected())? as f64),
        None => (arg, 0.0),
    };
    let (dir, label) = match s.split_once('=') {
        Some((dir, label)) if !dir.is_empty() && !label.is_empty() => (dir, label.to_string()),
        Some(_) => return Err(expected()),
        None => {
            let path = std::path::Path::new(s);
            let name = path
                .file_name()
                .filter(|n| *n != "epochs.csv")
                .or_else(|| path.parent().and_then(|p| p.file_name()))
                .map_or_else(|| s.to_string(), |n| n.to_string_lossy().into_owned());
            (s, name)
        }
    };
    Ok(CurveRun {
        label,
        dir: PathBuf::from(dir),
        start,
    })
}
