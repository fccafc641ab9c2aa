//! The one error type of the crate: it always names the file and what was wrong with it.

use std::path::PathBuf;

/// Why a data file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be opened or read (missing, permissions, bad gzip stream). The
    /// cause is the error's `source`, so that a chain printer (`{:#}`) shows it once.
    #[error("cannot read {path}")]
    Io {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file was read but its contents are not what the format requires.
    #[error("{path}: field `{field}`: expected {expected}, found {found}")]
    Format {
        /// The offending file.
        path: PathBuf,
        /// The part at fault: `magic`, `header`, `payload`, `count`, `label` or `length`.
        field: &'static str,
        /// What the format requires there.
        expected: String,
        /// What the file holds instead.
        found: String,
    },
    /// A data specification on the command line could not be understood.
    #[error("data source `{spec}`: {reason}")]
    Spec {
        /// The specification as given.
        spec: String,
        /// What is wrong with it, and what would be accepted.
        reason: String,
    },
}

impl DatasetError {
    pub(crate) fn format(
        path: impl Into<PathBuf>,
        field: &'static str,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        DatasetError::Format {
            path: path.into(),
            field,
            expected: expected.into(),
            found: found.into(),
        }
    }
}
