//! A disk that fills up while a command writes its results. A file-size limit (`ulimit -f`, with
//! SIGXFSZ ignored) fails a write the way a full disk does, with an error from `write`, so the
//! command meets it at its first large file. Every command must then exit with an error that
//! names the file, leave no temporary file behind, and leave its folder as it was: never this
//! run's table beside an earlier run's figure.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

/// `jem-bench ARGS` with files limited to `kib` KiB.
fn limited(kib: u32, args: &[&str], out: &Path) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_jem-bench"))
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// Every file under `dir` with its bytes, but the lock file (which each run rewrites).
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if !path.ends_with("jem-bench.lock") {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// Ran into the limit: exit 1 (an error, not a panic or a signal) naming a file of `out`, and
/// no temporary file left anywhere under it.
#[track_caller]
fn assert_failed_cleanly(o: &Output, out: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a clean error: {err}");
    assert!(err.contains("cannot write"), "no file named in: {err}");
    assert!(err.contains(&out.display().to_string()), "{err}");
    let left: Vec<String> = contents(out)
        .into_keys()
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A command that writes its results at the end: on a full disk the folder keeps an earlier
/// run's files byte for byte; a fresh folder gets none of the results.
fn keeps_the_folder_whole(
    command: &[&'static str],
    first: &[&'static str],
    second: &[&'static str],
    table: &str,
) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let args = |extra: &[&'static str]| [command, extra].concat();
    let o = limited(1_000_000, &args(first), &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let before = contents(&out);
    assert!(before.contains_key(table), "{before:?}");
    let o = limited(4, &args(second), &out);
    assert_failed_cleanly(&o, &out);
    assert!(contents(&out) == before, "the earlier results changed");

    let fresh = dir.path().join("fresh");
    let o = limited(4, &args(second), &fresh);
    assert_failed_cleanly(&o, &fresh);
    let written: Vec<String> = contents(&fresh).into_keys().collect();
    assert!(written.is_empty(), "half the results written: {written:?}");
}

#[test]
fn calibrate_on_a_full_disk_writes_all_of_its_files_or_none() {
    keeps_the_folder_whole(
        &[
            "calibrate",
            "--models",
            "results/models/baseline",
            "--steps",
            "0",
        ],
        &["--n", "20"],
        &["--n", "30"],
        "calibration.csv",
    );
}

#[test]
fn ood_on_a_full_disk_writes_all_of_its_files_or_none() {
    keeps_the_folder_whole(
        &[
            "ood",
            "--models",
            "results/models/baseline",
            "--ood",
            "uniform",
        ],
        &["--n", "20"],
        &["--n", "30"],
        "ood.csv",
    );
}

#[test]
fn nonsense_on_a_full_disk_writes_all_of_its_files_or_none() {
    keeps_the_folder_whole(
        &[
            "nonsense",
            "--models",
            "results/models/baseline",
            "--per-class",
            "1",
        ],
        &["--max-iters", "2"],
        &["--max-iters", "3"],
        "nonsense.csv",
    );
}

#[test]
fn a_sweep_on_a_full_disk_stops_with_an_error_and_leaves_no_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let sweep = [
        &crate::common::TINY_FGSM_SWEEP[..],
        &["--models", "results/models/baseline", "--n-examples", "5"],
    ]
    .concat();
    let o = limited(1, &sweep, &out);
    assert_failed_cleanly(&o, &out);
    // What the full disk stopped, the same command finishes once there is room.
    let o = limited(1_000_000, &sweep, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("robust.csv").exists());
}
