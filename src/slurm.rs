//! A sweep on a Slurm cluster: a job array of N shards (`robust --shard i/N`, each into its own
//! folder) and a merge job that waits for all of them (`--dependency=afterok`) and joins them
//! into the sweep's output folder. Both are shell scripts written into `OUT/slurm/` before
//! anything is submitted, so a user can read, edit and resubmit them (`sbatch OUT/slurm/…`);
//! a resubmitted array resumes its shards, as any rerun of a sweep does.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::model::write_atomic;
use crate::settings::InvalidSetting;

/// What the cluster is asked for. The values go to `#SBATCH` lines as given; Slurm checks them
/// at submission.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SlurmSpec {
    /// Array tasks, one shard each (at least 1).
    pub shards: usize,
    /// `--partition`.
    pub partition: Option<String>,
    /// `--time` of each task (e.g. `4:00:00`, `1-00:00:00`).
    pub time: Option<String>,
    /// `--cpus-per-task`.
    pub cpus: Option<usize>,
    /// GPUs per task (`--gres=gpu:N`).
    pub gpus: Option<usize>,
    /// A file of extra lines for both scripts: each `#SBATCH …`, a comment or blank.
    pub extra: Option<PathBuf>,
}

/// The scripts of one submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Scripts {
    /// The shards' job array: `OUT/slurm/shards.sh`.
    pub array: PathBuf,
    /// The merge that waits for the array: `OUT/slurm/merge.sh`.
    pub merge: PathBuf,
}

/// The command a shard runs: `program` with `sweep` (the sweep's own arguments, without
/// `--out`, `--shard` or any Slurm flag), then its shard and folder.
pub struct SweepCommand<'a> {
    pub program: &'a Path,
    /// Where the commands run (model paths in `sweep` are relative to it).
    pub workdir: &'a Path,
    pub sweep: &'a [String],
    /// The sweep's output folder: the merged sweep; shards go to `OUT/shards/I`.
    pub out: &'a Path,
}

impl SlurmSpec {
    /// Checks the settings: at least one shard, no line breaks in what goes to `#SBATCH`
    /// lines, and an extra-lines file that holds only `#SBATCH` lines, comments and blanks.
    /// Returns the extra lines.
    pub fn validate(&self) -> anyhow::Result<Vec<String>> {
        crate::settings::at_least_one("slurm", self.shards)?;
        for (field, value) in [
            ("slurm_partition", &self.partition),
            ("slurm_time", &self.time),
        ] {
            if let Some(v) = value {
                if v.is_empty() || v.contains(['\n', '\r']) || v.contains(char::is_whitespace) {
                    let problem = "expected one word for an #SBATCH line";
                    return Err(InvalidSetting::new(field, format!("{v:?}"), problem).into());
                }
            }
        }
        for (field, value) in [("slurm_cpus", self.cpus), ("slurm_gpus", self.gpus)] {
            value.map_or(Ok(()), |n| crate::settings::at_least_one(field, n))?;
        }
        let Some(path) = &self.extra else {
            return Ok(Vec::new());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--slurm-extra: cannot read {}", path.display()))?;
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.starts_with("#SBATCH ") {
                lines.push(line.to_string());
            } else if !(line.is_empty() || line.starts_with('#')) {
                anyhow::bail!(
                    "{}: line {}: expected an `#SBATCH …` line, a comment or a blank line, \
                     found `{line}`",
                    path.display(),
                    i + 1
                );
            }
        }
        Ok(lines)
    }

    /// The `#SBATCH` lines of a script: the partition and the extra lines for both; the time
    /// limit, cores and GPUs for the shards only (the merge reads files for seconds).
    fn resources(&self, extra: &[String], shards: bool) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(p) = &self.partition {
            lines.push(format!("#SBATCH --partition={p}"));
        }
        if shards {
            if let Some(t) = &self.time {
                lines.push(format!("#SBATCH --time={t}"));
            }
            if let Some(c) = self.cpus {
                lines.push(format!("#SBATCH --cpus-per-task={c}"));
            }
            if let Some(g) = self.gpus {
                lines.push(format!("#SBATCH --gres=gpu:{g}"));
            }
        }
        lines.extend(extra.iter().cloned());
        lines
    }

    /// Writes `OUT/slurm/shards.sh` and `OUT/slurm/merge.sh` for `command` (replacing earlier
    /// ones: a resubmission runs what the command says now).
    pub fn write(&self, command: &SweepCommand) -> anyhow::Result<Scripts> {
        let extra = self.validate()?;
        let dir = command.out.join("slurm");
        let (n, out) = (self.shards, command.out);
        let program = quoted(&command.program.display().to_string());
        let workdir = quoted(&command.workdir.display().to_string());
        let sweep: Vec<String> = command.sweep.iter().map(|a| quoted(a)).collect();
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let header = |name: &str, log: &str, shards: bool| {
            let mut lines = vec![
                "#!/bin/bash".to_string(),
                format!("#SBATCH --job-name={name}"),
                format!("#SBATCH --output={}", logs.join(log).display()),
            ];
            lines.extend(self.resources(&extra, shards));
            lines
        };
        let mut array = header("jem-bench-shards", "shard-%a.log", true);
        array.push(format!("#SBATCH --array=0-{}", n - 1));
        // Cells side by side on the cores the task holds, not on every core the node has.
        let jobs = match self.cpus {
            Some(c)
                if !command
                    .sweep
                    .iter()
                    .any(|a| a == "--jobs" || a.starts_with("--jobs=")) =>
            {
                format!(" --jobs {c}")
            }
            _ => String::new(),
        };
        array.extend([
            "# One shard of the sweep per array task, each in its own folder; rerunning a task"
                .into(),
            "# resumes its shard, and a task with no cells exits 0.".into(),
            "set -euo pipefail".into(),
            format!("cd {workdir}"),
            format!(
                "exec {program} {}{jobs} --shard \"$SLURM_ARRAY_TASK_ID/{n}\" --out {}/\"$SLURM_ARRAY_TASK_ID\"",
                sweep.join(" "),
                quoted(&out.join("shards").display().to_string())
            ),
        ]);
        let mut merge = header("jem-bench-merge", "merge.log", false);
        merge.extend([
            "# Joins the shards' folders (a shard with no cells writes none) into the sweep's."
                .into(),
            "set -euo pipefail".into(),
            format!("cd {workdir}"),
            format!(
                "exec {program} merge {}/*/ --out {}",
                quoted(&out.join("shards").display().to_string()),
                quoted(&out.display().to_string())
            ),
        ]);
        let scripts = Scripts {
            array: dir.join("shards.sh"),
            merge: dir.join("merge.sh"),
        };
        for (path, lines) in [(&scripts.array, array), (&scripts.merge, merge)] {
            write_atomic(path, (lines.join("\n") + "\n").as_bytes())?;
        }
        Ok(scripts)
    }
}

/// The job ids of a submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub array: String,
    pub merge: String,
}

/// Submits the array, then the merge depending on it (`afterok`: it runs once every shard
/// succeeded), with `sbatch` from the PATH. Without `sbatch` the error says so; the scripts
/// stay written.
pub fn submit(scripts: &Scripts) -> anyhow::Result<Submitted> {
    let array = sbatch(&[], &scripts.array)?;
    let merge = sbatch(&[format!("--dependency=afterok:{array}")], &scripts.merge)?;
    Ok(Submitted { array, merge })
}

/// `sbatch --parsable ARGS SCRIPT`: the job id it prints.
fn sbatch(args: &[String], script: &Path) -> anyhow::Result<String> {
    let output = Command::new("sbatch")
        .arg("--parsable")
        .args(args)
        .arg(script)
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "sbatch is not on the PATH (no Slurm here?): {} is written; submit it on the \
             cluster with `sbatch {}`, then its merge with `sbatch --dependency=afterok:JOBID {}`",
            script.display(),
            script.display(),
            script.with_file_name("merge.sh").display()
        ),
        Err(e) => return Err(e).context("cannot run sbatch"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "sbatch refused {}: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    // `--parsable` prints `ID` or `ID;CLUSTER`.
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    anyhow::ensure!(
        !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
        "sbatch printed no job id for {} (it printed `{}`)",
        script.display(),
        stdout.trim()
    );
    Ok(id)
}

/// `text` as one shell word (single-quoted where it needs quoting).
fn quoted(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@+%".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell_only_where_needed() {
        assert_eq!(quoted("results/models/jem"), "results/models/jem");
        assert_eq!(quoted("0,0.1"), "0,0.1");
        assert_eq!(quoted("a b"), "'a b'");
        assert_eq!(quoted("it's"), r"'it'\''s'");
        assert_eq!(quoted(""), "''");
        assert_eq!(quoted("$HOME"), "'$HOME'");
    }

    #[test]
    fn the_scripts_run_each_shard_and_merge_them_with_the_resources_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("extra");
        std::fs::write(&extra, "# site\n#SBATCH --account=lab\n\n").unwrap();
        let spec = SlurmSpec {
            shards: 3,
            partition: Some("gpu".into()),
            time: Some("4:00:00".into()),
            cpus: Some(8),
            gpus: Some(1),
            extra: Some(extra.clone()),
        };
        let out = dir.path().join("out");
        let sweep = ["robust".to_string(), "--models".into(), "a b/m".into()];
        let scripts = spec
            .write(&SweepCommand {
                program: Path::new("/opt/jem-bench"),
                workdir: Path::new("/work"),
                sweep: &sweep,
                out: &out,
            })
            .unwrap();
        let array = std::fs::read_to_string(&scripts.array).unwrap();
        for line in [
            "#SBATCH --array=0-2",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=4:00:00",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --gres=gpu:1",
            "#SBATCH --account=lab",
            "cd /work",
        ] {
            assert!(array.lines().any(|l| l == line), "{line} in {array}");
        }
        assert!(
            array.contains(
                "exec /opt/jem-bench robust --models 'a b/m' --jobs 8 --shard \"$SLURM_ARRAY_TASK_ID/3\""
            ),
            "{array}"
        );
        let merge = std::fs::read_to_string(&scripts.merge).unwrap();
        assert!(
            merge.contains(" merge ") && !merge.contains("--array"),
            "{merge}"
        );
        assert!(
            !merge.contains("--gres") && !merge.contains("--cpus") && !merge.contains("--time"),
            "the merge asks for nothing but its partition and the extra lines: {merge}"
        );
        assert!(merge.contains("#SBATCH --partition=gpu") && merge.contains("--account=lab"));

        // Lines that are not #SBATCH lines, and words with spaces, are refused.
        std::fs::write(&extra, "srun rm -rf /\n").unwrap();
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("#SBATCH"), "{err}");
        let spaced = SlurmSpec {
            partition: Some("a b".into()),
            extra: None,
            ..spec.clone()
        };
        assert!(spaced
            .validate()
            .unwrap_err()
            .to_string()
            .contains("slurm_partition"));
        let none = SlurmSpec {
            shards: 0,
            ..SlurmSpec::default()
        };
        assert!(none.validate().is_err());
    }
}
