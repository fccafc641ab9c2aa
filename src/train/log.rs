//! An append-only CSV log that survives interruption: each row is flushed as it is written, and
//! a resumed run first drops any row past the point it resumes from, so no row is duplicated;
//! and the window of iterations whose means make one row of a training log.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use super::objective::StepStats;

pub struct CsvLog {
    path: PathBuf,
    file: std::fs::File,
}

impl CsvLog {
    /// Opens `path` for appending with `header`; keeps existing rows whose first column (the
    /// step counter) is below `keep_below`. A log with another header (another objective's, or
    /// another version's) is refused, and left as it was.
    pub fn open(path: &Path, header: &[&str], keep_below: u64) -> anyhow::Result<Self> {
        let header_line = header.join(",");
        let mut kept = vec![header_line.clone()];
        if path.exists() {
            let f = std::fs::File::open(path)
                .with_context(|| format!("cannot read log {}", path.display()))?;
            let mut lines = BufReader::new(f).lines();
            let first = lines.next().transpose()?.unwrap_or_default();
            anyhow::ensure!(
                first == header_line,
                "{}: the log's header `{first}` differs from this run's `{header_line}`; use \
                 another --out folder",
                path.display()
            );
            for line in lines {
                let line = line?;
                let fields: Vec<&str> = line.split(',').collect();
                let step: u64 = fields
                    .first()
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("{}: bad row `{line}`", path.display()))?;
                anyhow::ensure!(
                    fields.len() == header.len(),
                    "{}: row `{line}` has {} fields, its header {}",
                    path.display(),
                    fields.len(),
                    header.len()
                );
                if step < keep_below {
                    kept.push(line);
                }
            }
        }
        let mut text = kept.join("\n");
        text.push('\n');
        crate::model::write_atomic(path, text.as_bytes())?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("cannot append to {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn row(&mut self, values: &[String]) -> anyhow::Result<()> {
        writeln!(self.file, "{}", values.join(","))
            .and_then(|_| self.file.flush())
            .with_context(|| format!("cannot write to {}", self.path.display()))
    }
}

/// Sums of the per-iteration statistics since the last row of `log.csv`: each row is their mean
/// over the `--log-every` iterations it covers.
pub(super) struct LogWindow {
    loss: f64,
    cross_entropy: f64,
    accuracy: f64,
    extra: Vec<f64>,
    iterations: usize,
    since: Instant,
}

impl LogWindow {
    pub(super) fn new() -> Self {
        LogWindow {
            loss: 0.0,
            cross_entropy: 0.0,
            accuracy: 0.0,
            extra: Vec::new(),
            iterations: 0,
            since: Instant::now(),
        }
    }

    pub(super) fn add(&mut self, stats: &StepStats) {
        self.loss += stats.loss;
        self.cross_entropy += stats.cross_entropy;
        self.accuracy += stats.accuracy;
        if self.extra.len() < stats.extra.len() {
            self.extra.resize(stats.extra.len(), 0.0);
        }
        self.extra
            .iter_mut()
            .zip(&stats.extra)
            .for_each(|(a, b)| *a += b);
        self.iterations += 1;
    }

    /// The log row of the window's means, after `iteration` iterations in `epoch` at `lr`.
    pub(super) fn row(&self, iteration: usize, epoch: usize, lr: f64) -> Vec<String> {
        let k = self.iterations as f64;
        let mut row = vec![
            iteration.to_string(),
            epoch.to_string(),
            format!("{lr:.3e}"),
            format!("{:.5}", self.loss / k),
            format!("{:.5}", self.cross_entropy / k),
            format!("{:.4}", self.accuracy / k),
        ];
        row.extend(self.extra.iter().map(|v| format!("{:.5}", v / k)));
        row.push(format!("{:.4}", self.since.elapsed().as_secs_f64() / k));
        row
    }

    pub(super) fn message(&self) -> String {
        let k = self.iterations as f64;
        format!("loss {:.4} acc {:.3}", self.loss / k, self.accuracy / k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_log_drops_its_tail_and_another_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("epochs.csv");
        std::fs::write(
            &path,
            "epoch,acc,robust,best\n0,0.5,0.1,true\n1,0.6,0.2,false\n2,0.7,0.3,true\n",
        )
        .unwrap();
        let mut log = CsvLog::open(&path, &["epoch", "acc", "robust", "best"], 2).unwrap();
        log.row(&["2".into(), "0.8".into(), "0.4".into(), "true".into()])
            .unwrap();
        drop(log);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "epoch,acc,robust,best\n0,0.5,0.1,true\n1,0.6,0.2,false\n2,0.8,0.4,true\n"
        );
        // Reopened with the same header: nothing changes but the dropped tail.
        CsvLog::open(&path, &["epoch", "acc", "robust", "best"], 3).unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .ends_with("2,0.8,0.4,true\n"));
        // Columns reordered, renamed, dropped or added: refused, and the file is left as it was.
        for header in [
            &["epoch", "best", "acc"][..],
            &["epoch", "acc", "robust", "best", "seconds"],
            &["epoch", "accuracy", "best"],
            &["epoch", "best"],
            &["iteration", "epoch", "acc", "best"],
        ] {
            let err = CsvLog::open(&path, header, 3).err().expect("refused");
            assert!(err.to_string().contains("use another --out"), "{err}");
        }
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("epoch,acc,robust,best\n"));
    }
}
