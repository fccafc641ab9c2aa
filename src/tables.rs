//! Result tables: rows serialised as CSV with a header from their field names, written
//! atomically (a killed run never leaves half a table behind).

use std::path::Path;

use serde::Serialize;

use crate::model::write_atomic;

/// Writes `rows` to `path` as CSV; `None` fields are left empty.
pub fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> anyhow::Result<()> {
    write_atomic(path, &csv_bytes(rows)?)
}

/// `rows` as the bytes of a CSV file; `None` fields are left empty.
pub fn csv_bytes<T: Serialize>(rows: &[T]) -> anyhow::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)?;
    }
    Ok(w.into_inner()?)
}

/// The first value a list flag names twice (two K = 1 in `--steps 0,1,1`): its rows would
/// appear twice under one name.
pub fn first_repeat<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].contains(v))
        .map(|(_, v)| v)
}

/// What a command that writes results tells its reader once they are written: the table of
/// its results and what it wrote. Library code returns it; the command line prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The results as a table (lines ending in newlines), or empty.
    pub table: String,
    /// The files and folders written.
    pub wrote: Vec<std::path::PathBuf>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.table)?;
        if !self.table.is_empty() && !self.table.ends_with('\n') {
            writeln!(f)?;
        }
        let wrote: Vec<String> = self.wrote.iter().map(|p| p.display().to_string()).collect();
        write!(f, "wrote {}", wrote.join(" and "))
    }
}
