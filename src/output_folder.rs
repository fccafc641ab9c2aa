//! An output folder belongs to the command that made it.
//!
//! Unclaimed, `calibrate --out` over a sweep folder would overwrite the sweep's `settings.json`
//! (after which the sweep could not resume), and two `train` runs on one folder would both
//! "resume" it. So each command that writes a folder first [`claim`]s it: a folder holding another
//! command's results (recognised by the file only that command writes) is refused, naming that
//! command and file; the command's own folder is reused (to resume, or to refresh its results).
//! [`FolderLock`] keeps a second process off a folder while one works in it.

use std::path::Path;

use anyhow::Context;

/// The file (or folder) each command writes into its output folder, and nobody else does.
const SIGNATURES: [(&str, &str); 7] = [
    ("robust", "robust.csv"),
    ("robust", "cells"),
    ("calibrate", "calibration.csv"),
    ("ood", "ood.csv"),
    ("nonsense", "nonsense.csv"),
    ("train", "epochs.csv"),
    ("train", "state"),
];

/// The command whose results `dir` holds, and the entry that says so.
pub fn maker(dir: &Path) -> Option<(&'static str, &'static str)> {
    SIGNATURES
        .iter()
        .find(|(_, entry)| dir.join(entry).exists())
        .copied()
}

/// The lock file every command takes in its output folder.
pub const LOCK_FILE: &str = "jem-bench.lock";

/// Claims `dir` for `command` while the returned lock is held: locks it (creating it), so that
/// no other jem-bench, of this command or another, works in it at the same time; then refuses
/// it if another command than `command` made it. Hold the lock until the command is done.
pub fn claim(dir: &Path, command: &str) -> anyhow::Result<FolderLock> {
    let lock = FolderLock::acquire(dir, command)?;
    if let Some((other, entry)) = maker(dir) {
        anyhow::ensure!(
            other == command,
            "{} holds the results of `jem-bench {other}` (its {entry}); `{command}` would \
             overwrite them: choose another --out",
            dir.display()
        );
    }
    Ok(lock)
}

/// An exclusive lock on an output folder (an OS file lock on `dir/name`): a second process on
/// the same folder is refused instead of computing the same work. The operating system releases
/// the lock when its holder exits, however it exits, so a killed run leaves no stale lock.
pub struct FolderLock {
    _file: std::fs::File,
}

impl FolderLock {
    /// Creates `dir` if needed and locks it through its file [`LOCK_FILE`] for `command`
    /// (which a refused second process is told of).
    pub fn acquire(dir: &Path, command: &str) -> anyhow::Result<Self> {
        use std::io::{Read, Seek, Write};
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                anyhow::bail!(
                    "{} is in use by another jem-bench ({}); wait for it to finish (then the \
                     same command resumes or reports), or use another --out",
                    dir.display(),
                    holder.trim()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        file.set_len(0)?;
        file.rewind()?;
        write!(file, "`jem-bench {command}`, pid {}", std::process::id())?;
        Ok(Self { _file: file })
    }
}

/// Files a command writes together as its results (tables, figures, the record of its
/// settings): each is written to a temporary file first, and only when every one is written
/// are they renamed into place. A failure to write (a full disk, a refused write) removes the
/// temporaries and leaves the folder as it was: no file of the set is replaced unless all are. (A rename, which needs no space, failing between two
/// others is the one failure that leaves part of the set in place.)
#[derive(Default)]
pub struct FileSet {
    files: Vec<(std::path::PathBuf, Vec<u8>)>,
}

impl FileSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `path` with its contents.
    pub fn add(&mut self, path: std::path::PathBuf, bytes: Vec<u8>) {
        self.files.push((path, bytes));
    }

    /// Writes every file of the set, or none (see [`FileSet`]).
    pub fn write(self) -> anyhow::Result<()> {
        let mut staged = Vec::with_capacity(self.files.len());
        let written = self.stage(&mut staged).and_then(|()| {
            for ((path, _), tmp) in self.files.iter().zip(&staged) {
                std::fs::rename(tmp, path).with_context(|| {
                    format!("cannot rename {} to {}", tmp.display(), path.display())
                })?;
            }
            Ok(())
        });
        if written.is_err() {
            for tmp in &staged {
                let _ = std::fs::remove_file(tmp);
            }
        }
        written
    }

    /// Writes each file to its temporary name, pushing the names onto `staged` as it goes.
    fn stage(&self, staged: &mut Vec<std::path::PathBuf>) -> anyhow::Result<()> {
        for (path, bytes) in &self.files {
            let tmp = crate::model::temporary_path(path)?;
            staged.push(tmp.clone());
            std::fs::write(&tmp, bytes).with_context(|| {
                format!("cannot write {} (for {})", tmp.display(), path.display())
            })?;
        }
        Ok(())
    }
}
