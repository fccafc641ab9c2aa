//! An append-only CSV log that survives interruption: each row is flushed as it is written, and
//! a resumed run first drops any row past the point it resumes from, so no row is duplicated.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

pub struct CsvLog {
    path: PathBuf,
    file: std::fs::File,
}

impl CsvLog {
    /// Opens `path` for appending with `header`; keeps existing rows whose first column (the
    /// step counter) is below `keep_below`, and refuses a file with another header.
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
                "{}: the log's header `{first}` differs from this run's `{header_line}`; \
                 use another --out folder",
                path.display()
            );
            for line in lines {
                let line = line?;
                let step: u64 = line
                    .split(',')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("{}: bad row `{line}`", path.display()))?;
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
