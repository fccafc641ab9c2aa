//! Bad input, as a new user would give it: every case fails before anything is written, with an
//! error that names the flag or file and what was expected — or, where the input was in fact
//! fine, gives the correct result. No panic, no lost data, no number made up from nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use jem_bench::backend::{self, Inference};
use jem_bench::model::{weights_digest, Checkpoint};

use crate::common;
use common::TINY_FGSM_SWEEP;

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Failed with exit code 1 (an error, not a panic's 101), saying every one of `what`.
#[track_caller]
fn assert_fails_with(o: &Output, what: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "expected a clean error, got: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    for w in what {
        assert!(err.contains(w), "expected `{w}` in: {err}");
    }
}

#[track_caller]
fn assert_ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A small sweep: FGSM on the baseline, K = 0, ε ∈ {0, 0.1}, 5 images (unless `extra` sets
/// the number); list flags in `extra` add to these.
fn small_sweep(out: &Path, extra: &[&str]) -> Output {
    let mut c = cli();
    c.args(TINY_FGSM_SWEEP)
        .args(["--models", "results/models/baseline", "--out"])
        .arg(out)
        .args(extra);
    if !extra.contains(&"--n-examples") {
        c.args(["--n-examples", "5"]);
    }
    c.output().unwrap()
}

/// A copy of the embedded baseline under `dir/NAME` whose sidecar `edit` changes.
fn doctored_model(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    doctored(dir, name, "baseline", edit)
}

/// A copy of the embedded model `source` under `dir/NAME` whose sidecar `edit` changes.
fn doctored(
    dir: &Path,
    name: &str,
    source: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> PathBuf {
    let stem = dir.join(name);
    let models = root().join("results/models");
    std::fs::copy(
        models.join(format!("{source}.safetensors")),
        stem.with_extension("safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(models.join(format!("{source}.json"))).unwrap();
    let mut sidecar: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut sidecar);
    std::fs::write(stem.with_extension("json"), sidecar.to_string()).unwrap();
    stem
}

/// The folder does not exist, or exists empty: nothing was written.
#[track_caller]
fn assert_untouched(out: &Path) {
    let entries: Vec<_> = std::fs::read_dir(out)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(entries.is_empty(), "{} holds {entries:?}", out.display());
}

// 1. `regress --out` over the reference, or over any sweep it did not make, deletes nothing.
#[test]
fn regress_never_deletes_a_folder_it_did_not_make() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference");
    assert_ok(&small_sweep(&reference, &[]));
    let before = std::fs::read(reference.join("robust.csv")).unwrap();

    let o = cli()
        .args(["regress", "--reference"])
        .arg(&reference)
        .arg("--out")
        .arg(&reference)
        .output()
        .unwrap();
    assert_fails_with(&o, &["overlaps the reference"]);
    // Another finished sweep with the same settings is not a rerun either.
    let other = dir.path().join("other");
    assert_ok(&small_sweep(&other, &[]));
    let o = cli()
        .args(["regress", "--reference"])
        .arg(&reference)
        .arg("--out")
        .arg(&other)
        .output()
        .unwrap();
    assert_fails_with(&o, &["was not made by `regress`"]);
    assert_eq!(std::fs::read(reference.join("robust.csv")).unwrap(), before);
    assert!(other.join("robust.csv").exists() && other.join("curves.png").exists());

    // A rerun folder (with its marker) is cleared and rerun, and passes.
    let rerun = dir.path().join("rerun");
    for _ in 0..2 {
        let o = cli()
            .args(["regress", "--reference"])
            .arg(&reference)
            .arg("--out")
            .arg(&rerun)
            .output()
            .unwrap();
        assert!(assert_ok(&o).contains("reference cells hold"));
    }
}

// 2. The tolerance of a CI gate must be a number that can fail.
#[test]
fn regress_refuses_a_tolerance_that_cannot_fail_or_always_fails() {
    for bad in ["NaN", "-1", "inf", "1.5"] {
        let o = cli()
            .args(["regress", "--reference", "results/reference/linf-small"])
            .arg(format!("--tolerance={bad}"))
            .output()
            .unwrap();
        assert_fails_with(&o, &["--tolerance", "[0, 1]"]);
    }
}

// 3. One compatibility check: a 3-channel model on 1-channel data is refused everywhere.
#[test]
fn a_model_on_data_of_another_shape_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let cifar = dir.path().join("cifar");
    let o = cli()
        .arg("import")
        .arg(root().join("tests/fixtures/pytorch/wrn10_1_cifar_normalized.safetensors"))
        .args(["--depth", "10", "--width", "1", "--in-channels", "3"])
        .args(["--data", "cifar10", "--out"])
        .arg(&cifar)
        .output()
        .unwrap();
    assert_ok(&o);
    let out = dir.path().join("sweep");
    let o = cli()
        .args([
            "robust",
            "--data",
            "mnist",
            "--attacks",
            "fgsm",
            "--steps",
            "0",
        ])
        .args(["--eps", "0,0.1", "--n-examples", "5", "--models"])
        .arg(&cifar)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(&o, &["3 channel(s)", "mnist"]);
    assert_untouched(&out);
    let o = cli()
        .args(["eval", "--data", "mnist", "--model"])
        .arg(&cifar)
        .output()
        .unwrap();
    assert_fails_with(&o, &["3 channel(s)"]);
    // A model whose sidecar names data of another shape than its architecture takes.
    let lying = doctored_model(dir.path(), "lying", |s| {
        s["training"]["data"] = "cifar10".into();
    });
    for args in [
        vec![
            "nonsense",
            "--per-class",
            "1",
            "--max-iters",
            "2",
            "--models",
        ],
        vec!["sample", "--per-class", "1", "--steps", "1", "--model"],
    ] {
        let o = cli()
            .args(&args)
            .arg(&lying)
            .arg("--out")
            .arg(dir.path().join("never"))
            .output()
            .unwrap();
        assert_fails_with(&o, &["1 channel(s)", "cifar10"]);
    }
    assert!(!dir.path().join("never").exists());
}

// 4a. A sidecar of another format (an earlier layout of the weights, or a newer jem-bench's) is
// refused by its field, never read as this one.
#[test]
fn a_sidecar_of_another_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let formats = [
        (1, "no longer read"),
        (2, "no longer read"),
        (4, "newer jem-bench"),
    ];
    for (version, why) in formats {
        let name = format!("v{version}");
        // An earlier sidecar may lack `variant`: refused by its format, not a missing field.
        let other = doctored_model(dir.path(), &name, |s| {
            s["format_version"] = version.into();
            s["architecture"].as_object_mut().unwrap().remove("variant");
        });
        let o = cli()
            .args(["eval", "--model"])
            .arg(&other)
            .output()
            .unwrap();
        assert_fails_with(
            &o,
            &[&format!("{name}.json"), "format_version", "expected 3", why],
        );
    }
}

// 4. A zero std would divide every pixel by zero: refused on reading and on import.
#[test]
fn a_zero_std_is_refused_where_it_is_read_and_where_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let zero = doctored_model(dir.path(), "zero", |s| {
        s["architecture"]["input_normalization"]["std"] = serde_json::json!([0.0]);
    });
    let o = cli().args(["eval", "--model"]).arg(&zero).output().unwrap();
    assert_fails_with(&o, &["zero.json", "input_normalization.std", "> 0"]);
    let o = cli()
        .arg("import")
        .arg(root().join("tests/fixtures/pytorch/wrn10_1.safetensors"))
        .args([
            "--depth",
            "10",
            "--width",
            "1",
            "--in-channels",
            "1",
            "--data",
            "mnist",
        ])
        .args(["--mean", "0.5", "--std", "0", "--out"])
        .arg(dir.path().join("imported"))
        .output()
        .unwrap();
    assert_fails_with(&o, &["input_normalization.std"]);
    assert!(!dir.path().join("imported.json").exists());
}

// 5. 0/0 is not 0 %, and more images than the split has is not silently fewer.
#[test]
fn example_counts_must_be_within_the_split() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let o = small_sweep(&out, &["--n-examples", "0"]);
    assert_fails_with(&o, &["--n-examples", "at least 1"]);
    let o = small_sweep(&out, &["--n-examples", "10001"]);
    assert_fails_with(&o, &["--n-examples 10001", "10000"]);
    assert_untouched(&out);
    let o = cli()
        .args(["eval", "--model", "results/models/baseline", "--n", "0"])
        .output()
        .unwrap();
    assert_fails_with(&o, &["--n 0"]);
    // A finished run is scored on the test set; a cut of it past its end is refused before
    // the run begins, not when it ends.
    let run = dir.path().join("run");
    let o = cli()
        .args(["train", "--epochs", "1", "--test-subset", "10001", "--out"])
        .arg(&run)
        .output()
        .unwrap();
    assert_fails_with(&o, &["--test-subset", "10001", "expected 1 to 10000"]);
    assert!(!run.exists(), "the refused run created {}", run.display());
}

// 6. Weight identity is the tensors, not the file: re-saving identical weights gives the same
//    bytes and digest, so a sweep on them resumes.
#[test]
fn identical_weights_saved_twice_are_the_same_weights() {
    let dir = tempfile::tempdir().unwrap();
    let device = backend::device();
    let (model, sidecar) = Checkpoint::at("results/models/baseline")
        .load::<Inference>(&device)
        .unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    Checkpoint::at(&a).save(&model, &sidecar).unwrap();
    Checkpoint::at(&b).save(&model, &sidecar).unwrap();
    let bytes = |p: &Path| std::fs::read(p.with_extension("safetensors")).unwrap();
    assert_eq!(bytes(&a), bytes(&b), "the writer is deterministic");
    let (reloaded, _) = Checkpoint::at(&a).load::<Inference>(&device).unwrap();
    assert_eq!(
        weights_digest(&reloaded).unwrap(),
        weights_digest(&model).unwrap()
    );

    // A sweep resumes on the same weights written again under its model path.
    let out = dir.path().join("sweep");
    let sweep = |out: &Path| {
        cli()
            .args(TINY_FGSM_SWEEP)
            .args(["--n-examples", "3", "--models"])
            .arg(&a)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    assert_ok(&sweep(&out));
    Checkpoint::at(&a).save(&reloaded, &sidecar).unwrap();
    let stdout = assert_ok(&sweep(&out));
    assert!(
        stdout.contains("ran 0 cells (1 were finished already)"),
        "{stdout}"
    );
}

// 7. Bad input leaves no folder behind, and a folder's refusal names what differs.
#[test]
fn bad_input_claims_no_folder_and_refusals_name_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    assert_fails_with(
        &small_sweep(&out, &["--data", "mnsit"]),
        &["--data", "mnsit"],
    );
    let o = small_sweep(&out, &["--steps", "1", "--chains", "0"]);
    assert_fails_with(&o, &["--chains", "at least 1"]);
    let truncated = doctored_model(dir.path(), "truncated", |_| {});
    let w = truncated.with_extension("safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let o = cli()
        .args(["robust", "--attacks", "fgsm", "--steps", "0", "--models"])
        .arg(&truncated)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(&o, &["truncated.safetensors", "safetensors"]);
    assert_untouched(&out);
    // The corrected command runs; another one on the folder is told what differs.
    assert_ok(&small_sweep(&out, &[]));
    let o = small_sweep(&out, &["--seed", "7"]);
    assert_fails_with(&o, &["args.seed: the folder has 0, this command 7"]);
}

// 8. Two sweeps on one folder: one computes, the other is refused or finds the work done.
#[test]
fn concurrent_sweeps_on_one_folder_compute_each_cell_once() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let spawn = || {
        cli()
            .args([
                "robust",
                "--models",
                "results/models/baseline",
                "--attacks",
                "pgd",
            ])
            .args(["--steps", "0", "--eps", "0,0.1,0.2", "--n-examples", "8"])
            .args(["--pgd-steps", "5", "--out"])
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let outputs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let mut computed = 0;
    for o in &outputs {
        if o.status.success() {
            let stdout = String::from_utf8_lossy(&o.stdout);
            let ran: usize = stdout
                .lines()
                .find_map(|l| l.strip_prefix("ran ")?.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no `ran N cells` line in {stdout}"));
            computed += ran;
        } else {
            assert_fails_with(o, &["in use by another jem-bench"]);
        }
    }
    assert!(outputs.iter().any(|o| o.status.success()));
    assert_eq!(computed, 1, "the one cell (three ε) computed exactly once");
    let rows = jem_bench::harness::read_tidy(&out.join("robust.csv")).unwrap();
    assert_eq!(rows.iter().filter(|r| r.attack == "pgd").count(), 3);
    let tmp: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "left-over temporary files {tmp:?}");
}

// 9. Counts of zero are refused before anything runs or is written, never a panic.
#[test]
fn zero_counts_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    assert_fails_with(
        &small_sweep(&out, &["--steps", "1", "--chains", "0"]),
        &["--chains"],
    );
    for flag in [
        "--batch-size",
        "--log-every",
        "--checkpoint-every",
        "--train-subset",
        "--test-subset",
    ] {
        let run = dir.path().join(flag.trim_start_matches('-'));
        let o = cli()
            .args(["train", "--kind", "baseline", "--epochs", "1", "--out"])
            .arg(&run)
            .args([flag, "0"])
            .output()
            .unwrap();
        assert_fails_with(&o, &[flag, "at least 1"]);
        assert!(!run.exists(), "{flag} 0 created {}", run.display());
    }
    let o = cli()
        .args(["nonsense", "--per-class", "0", "--out"])
        .arg(dir.path().join("nonsense"))
        .output()
        .unwrap();
    assert_fails_with(&o, &["--per-class", "at least 1"]);
    assert!(!dir.path().join("nonsense").exists());
}

// 10. Messages: causes once, the project's words for weights that do not fit, --data required
//     on import, negative numbers read as numbers, L∞ budgets above 1 refused.
#[test]
fn messages_name_the_cause_once_in_the_projects_words() {
    let dir = tempfile::tempdir().unwrap();
    let o = cli()
        .args([
            "eval",
            "--model",
            "results/models/baseline",
            "--data",
            "mnist:/nonexistent",
        ])
        .output()
        .unwrap();
    assert_fails_with(&o, &["/nonexistent"]);
    assert_eq!(
        stderr(&o).matches("No such file or directory").count(),
        1,
        "{}",
        stderr(&o)
    );

    let deeper = doctored_model(dir.path(), "deeper", |s| {
        s["architecture"]["depth"] = 16.into();
    });
    let o = cli()
        .args(["eval", "--model"])
        .arg(&deeper)
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &[
            "deeper.safetensors",
            "WRN-16-1",
            "deeper.json",
            "is missing",
        ],
    );
    assert!(stderr(&o).lines().count() <= 3, "{}", stderr(&o));

    let o = cli()
        .arg("import")
        .arg(root().join("tests/fixtures/pytorch/wrn10_1.safetensors"))
        .args([
            "--depth",
            "10",
            "--width",
            "1",
            "--in-channels",
            "1",
            "--out",
        ])
        .arg(dir.path().join("no-data"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "clap's usage error: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--data"), "{}", stderr(&o));

    let out = dir.path().join("sweep");
    assert_fails_with(&small_sweep(&out, &["--eps", "-0.1"]), &["--eps", ">= 0"]);
    assert_fails_with(&small_sweep(&out, &["--eps", "8"]), &["exceeds 1", "8/255"]);
    assert_untouched(&out);
}

// 11. The default models are compiled in: `robust` works from any folder; so does the
//     reweighted JEM, which is embedded but not a default.
#[test]
fn the_embedded_models_work_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = |models: &[&str], out: &str| -> Vec<String> {
        let o = Command::new(env!("CARGO_BIN_EXE_jem-bench"))
            .current_dir(dir.path())
            .args(TINY_FGSM_SWEEP)
            .args(models)
            .args(["--n-examples", "2", "--out", out])
            .output()
            .unwrap();
        assert_ok(&o);
        let rows = jem_bench::harness::read_tidy(&dir.path().join(out).join("robust.csv")).unwrap();
        let models: std::collections::BTreeSet<_> = rows.into_iter().map(|r| r.model).collect();
        models.into_iter().collect()
    };
    assert_eq!(
        sweep(&[], "defaults"),
        [
            "results/models/adv",
            "results/models/baseline",
            "results/models/jem"
        ]
    );
    assert_eq!(
        sweep(&["--models", "results/models/jem-ce1000"], "ce1000"),
        ["results/models/jem-ce1000"]
    );
}

// 13. Checkpoints are PyTorch state_dicts: the same names and shapes as a file PyTorch wrote,
//     the head in PyTorch's [out, in] layout.
#[test]
fn checkpoints_have_the_names_and_shapes_of_a_pytorch_state_dict() {
    fn header(path: &Path) -> std::collections::BTreeMap<String, Vec<usize>> {
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec()))
            .collect()
    }
    let ours = header(&root().join("results/models/baseline.safetensors"));
    let pytorch = header(&root().join("tests/fixtures/pytorch/wrn10_1.safetensors"));
    assert_eq!(ours, pytorch);
    assert_eq!(ours["linear.weight"], vec![10, 64]);
}

/// PyTorch loads a checkpoint into its own Wide_ResNet (strict: every name and shape).
#[test]
#[ignore = "needs a Python with torch: JEM_BENCH_PYTHON=PYTHON cargo test --release --test suite -- --ignored pytorch"]
fn pytorch_loads_a_checkpoint_strictly() {
    let script = root().join("tests/fixtures/pytorch/load_checkpoint.py");
    let o = Command::new(common::python_with_torch())
        .arg(&script)
        .arg(root().join("results/models/baseline.safetensors"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_device_this_build_cannot_reach_is_refused() {
    let bogus = cli()
        .args([
            "--device",
            "tpu",
            "eval",
            "--model",
            "results/models/baseline",
        ])
        .output()
        .unwrap();
    assert_fails_with(&bogus, &["--device tpu", "expected"]);
    if cfg!(feature = "cuda") {
        let cpu = cli()
            .args([
                "eval",
                "--device",
                "cpu",
                "--model",
                "results/models/baseline",
            ])
            .output()
            .unwrap();
        assert_fails_with(&cpu, &["--device cpu", "built for CUDA"]);
    } else {
        let gpu = cli()
            .args([
                "eval",
                "--device",
                "cuda:1",
                "--model",
                "results/models/baseline",
            ])
            .output()
            .unwrap();
        assert_fails_with(&gpu, &["--device cuda:1", "--features cuda"]);
        let cpu = cli()
            .args([
                "--device",
                "cpu",
                "eval",
                "--model",
                "results/models/baseline",
                "--n",
                "20",
            ])
            .output()
            .unwrap();
        assert!(assert_ok(&cpu).contains("accuracy"));
    }
}

/// Every list flag of every command refuses a repeated value (which would compute a cell twice
/// and count its examples twice), naming the flag, before anything is written; numbers compare
/// as numbers. Per-channel lists (`import --mean 0.5,0.5,0.5`) are not sets and may repeat.
#[test]
fn every_list_flag_refuses_a_repeated_value() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let model = "results/models/baseline";
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "--models",
            vec![
                "robust",
                "--models",
                "results/models/baseline,results/models/baseline",
            ],
        ),
        (
            "--attacks",
            vec!["robust", "--models", model, "--attacks", "fgsm,pgd,fgsm"],
        ),
        (
            "--eps",
            vec!["robust", "--models", model, "--eps", "0,0.1,0.10"],
        ),
        // Equal as the f32 a sweep computes with: the same ε, so the same rows twice.
        (
            "--eps",
            vec![
                "robust",
                "--models",
                model,
                "--eps",
                "0,0.1,0.1000000000001",
            ],
        ),
        (
            "--eps",
            vec!["robust", "--models", model, "--eps", "0,1e-50"],
        ),
        (
            "--steps",
            vec!["robust", "--models", model, "--steps", "0,0"],
        ),
        (
            "--grad",
            vec!["robust", "--models", model, "--grad", "bpda,bpda"],
        ),
        (
            "--models",
            vec![
                "nonsense",
                "--models",
                "results/models/jem,results/models/jem",
            ],
        ),
        (
            "--steps",
            vec!["nonsense", "--models", model, "--steps", "0,1,1"],
        ),
        (
            "--models",
            vec![
                "calibrate",
                "--models",
                "results/models/adv,results/models/adv",
            ],
        ),
        (
            "--steps",
            vec!["calibrate", "--models", model, "--steps", "0,0"],
        ),
        (
            "--models",
            vec!["ood", "--models", "results/models/jem,results/models/jem"],
        ),
        ("--steps", vec!["ood", "--models", model, "--steps", "1,1"]),
        (
            "--ood",
            vec!["ood", "--models", model, "--ood", "uniform,uniform"],
        ),
        (
            "--scores",
            vec!["ood", "--models", model, "--scores", "lse,max-softmax,lse"],
        ),
        (
            "--class",
            vec!["sample", "--model", "results/models/jem", "--class", "3,3"],
        ),
        (
            "--decay-epochs",
            vec!["train", "--epochs", "1", "--decay-epochs", "1,1"],
        ),
    ];
    for (flag, args) in cases {
        let output = cli().args(&args).args(["--out", o]).output().unwrap();
        let said = stderr(&output);
        assert_fails_with(&output, &[flag, "twice"]);
        assert!(!out.exists(), "{args:?} wrote {o}: {said}");
    }
}

/// Per-channel values repeat legitimately: the refusal, if any, is not about repeats.
#[test]
fn per_channel_values_may_repeat() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let output = cli()
        .args([
            "import",
            "--depth",
            "10",
            "--width",
            "1",
            "--in-channels",
            "3",
        ])
        .args([
            "--mean",
            "0.5,0.5,0.5",
            "--std",
            "0.5,0.5,0.5",
            "--data",
            "mnist",
        ])
        .args(["--out", o, "missing.pt"])
        .output()
        .unwrap();
    assert!(!stderr(&output).contains("twice"), "{}", stderr(&output));
}

/// Sizes of zero are refused by the flag that gave them (the network's width, the images'
/// channels and size), and a reference set larger than the test split is refused, not shrunk.
#[test]
fn zero_sizes_and_oversized_reference_sets_name_their_flag() {
    for (flag, value) in [("--channels", "0"), ("--size", "0"), ("--width", "0")] {
        let output = cli()
            .args([
                "bench", "--op", "forward", "--batch", "1", "--reps", "1", flag, value,
            ])
            .output()
            .unwrap();
        assert_fails_with(&output, &[flag, "at least 1"]);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("samples");
    let output = cli()
        .args([
            "sample",
            "--model",
            "results/models/jem",
            "--reference-images",
            "20000",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(&output, &["--reference-images", "2 to 10000", "20000"]);
    assert!(!out.exists());
}

/// A JEM's sidecar is validated as a whole: SGLD settings out of range, or a `kind: jem` without
/// its settings, are refused by every command that reads a checkpoint, naming the field, before
/// anything is written.
#[test]
fn every_command_refuses_a_jem_sidecar_with_bad_or_missing_sgld_settings() {
    let dir = tempfile::tempdir().unwrap();
    let bad: Vec<(&str, PathBuf)> = vec![
        (
            "training.settings.jem.sgld_std",
            doctored(dir.path(), "std", "jem", |s| {
                s["training"]["settings"]["jem"]["sgld_std"] = (-1.0).into();
            }),
        ),
        (
            "training.settings.jem.sgld_lr",
            doctored(dir.path(), "lr", "jem", |s| {
                s["training"]["settings"]["jem"]["sgld_lr"] = 1e39.into();
            }),
        ),
        (
            "training.settings.jem.buffer_size",
            doctored(dir.path(), "buffer", "jem", |s| {
                s["training"]["settings"]["jem"]["buffer_size"] = 0.into();
            }),
        ),
        (
            "training.settings.jem",
            doctored(dir.path(), "missing", "jem", |s| {
                let settings = s["training"]["settings"].as_object_mut().unwrap();
                settings.remove("jem");
            }),
        ),
    ];
    let out = dir.path().join("never");
    for (field, model) in &bad {
        for command in [
            vec!["eval", "--model"],
            vec!["robust", "--steps", "1", "--models"],
            vec!["calibrate", "--models"],
            vec!["ood", "--models"],
            vec!["nonsense", "--models"],
            vec!["sample", "--model"],
        ] {
            let mut c = cli();
            c.args(&command).arg(model);
            if command[0] != "eval" {
                c.arg("--out").arg(&out);
            }
            let o = c.output().unwrap();
            assert_fails_with(&o, &[field]);
            assert!(!out.exists(), "{command:?} wrote {}", out.display());
        }
    }
}

/// The baseline's weights rewritten as `dtype` (f64 exactly, bf16 by truncating each f32).
fn baseline_as(dtype: safetensors::Dtype, path: &Path) {
    baseline_rewritten(dtype, path, |_, _| {});
}

/// The baseline's weights, each tensor's values changed by `edit` (given its name), written as
/// `dtype`.
fn baseline_rewritten(dtype: safetensors::Dtype, path: &Path, edit: impl Fn(&str, &mut [f32])) {
    let bytes = std::fs::read(root().join("results/models/baseline.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let converted: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32);
            let mut values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            edit(&name, &mut values);
            let values = values.into_iter();
            let data: Vec<u8> = match dtype {
                safetensors::Dtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
                safetensors::Dtype::F64 => values.flat_map(|v| (v as f64).to_le_bytes()).collect(),
                safetensors::Dtype::BF16 => values
                    .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                    .collect(),
                other => panic!("no conversion to {other:?}"),
            };
            (name, view.shape().to_vec(), data)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = converted
        .iter()
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// `eval --json` of a checkpoint on the first 500 test digits: its accuracy.
fn accuracy_of(model: &Path) -> f64 {
    let o = cli()
        .args(["eval", "--n", "500", "--json", "--model"])
        .arg(model)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&assert_ok(&o)).unwrap();
    json["accuracy"].as_f64().unwrap()
}

/// Weights stored in another float type than f32 (PyTorch's f16, bf16 or f64 state_dicts) are
/// converted to f32 where they enter — on load and on import — and compute the same numbers:
/// f64 exactly, bf16 within its rounding. The import records the source type and writes f32.
#[test]
fn checkpoints_of_any_float_type_compute_in_f32() {
    let dir = tempfile::tempdir().unwrap();
    let reference = accuracy_of(&root().join("results/models/baseline"));
    for (dtype, name) in [
        (safetensors::Dtype::F64, "f64"),
        (safetensors::Dtype::BF16, "bf16"),
    ] {
        // As a checkpoint: the baseline's sidecar beside weights of another type.
        let stem = dir.path().join(name);
        baseline_as(dtype, &stem.with_extension("safetensors"));
        std::fs::copy(
            root().join("results/models/baseline.json"),
            stem.with_extension("json"),
        )
        .unwrap();
        let loaded = accuracy_of(&stem);
        // Every other command that reads a checkpoint runs on it too, without a panic.
        for command in [
            vec![
                "robust",
                "--attacks",
                "fgsm",
                "--steps",
                "0",
                "--n-examples",
                "5",
                "--models",
            ],
            vec!["calibrate", "--n", "20", "--models"],
            vec!["ood", "--n", "20", "--ood", "uniform", "--models"],
            vec![
                "nonsense",
                "--per-class",
                "1",
                "--max-iters",
                "2",
                "--models",
            ],
            vec![
                "sample",
                "--per-class",
                "1",
                "--steps",
                "1",
                "--judge",
                "none",
                "--model",
            ],
        ] {
            let out = dir.path().join(format!("{name}-{}", command[0]));
            let mut c = cli();
            c.args(&command).arg(&stem).arg("--out");
            if command[0] == "sample" {
                c.arg(out.with_extension("png"));
            } else {
                c.arg(&out);
            }
            assert_ok(&c.output().unwrap());
        }
        // Imported as a PyTorch state_dict (the checkpoint's names are PyTorch's).
        let imported = dir.path().join(format!("imported-{name}"));
        let o = cli()
            .arg("import")
            .arg(stem.with_extension("safetensors"))
            .args(["--depth", "10", "--width", "1", "--in-channels", "1"])
            .args(["--data", "mnist", "--out"])
            .arg(&imported)
            .output()
            .unwrap();
        assert_ok(&o);
        let sidecar: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(imported.with_extension("json")).unwrap(),
        )
        .unwrap();
        assert_eq!(sidecar["training"]["settings"]["source_dtype"], name);
        let written = std::fs::read(imported.with_extension("safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&written).unwrap();
        assert!(st
            .tensors()
            .iter()
            .all(|(_, v)| v.dtype() == safetensors::Dtype::F32));
        let through_import = accuracy_of(&imported);
        let tolerance = if name == "f64" { 0.0 } else { 0.01 };
        for (how, accuracy) in [("loaded", loaded), ("imported", through_import)] {
            assert!(
                (accuracy - reference).abs() <= tolerance,
                "{name} {how}: accuracy {accuracy}, the f32 baseline's {reference}"
            );
        }
    }
}

/// A checkpoint with one NaN (or infinite) weight cannot compute: every command that reads a
/// checkpoint refuses it, naming the file and the tensor, before anything is written; so does
/// `import`.
#[test]
fn a_model_with_a_non_finite_weight_is_refused_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    for (bad, value) in [("nan", f32::NAN), ("inf", f32::INFINITY)] {
        let stem = dir.path().join(bad);
        baseline_rewritten(
            safetensors::Dtype::F32,
            &stem.with_extension("safetensors"),
            |name, values| {
                if name == "layer2.0.conv1.weight" {
                    values[7] = value;
                }
            },
        );
        std::fs::copy(
            root().join("results/models/baseline.json"),
            stem.with_extension("json"),
        )
        .unwrap();
        for command in [
            vec!["eval", "--model"],
            vec!["robust", "--steps", "0", "--models"],
            vec!["calibrate", "--models"],
            vec!["ood", "--models"],
            vec!["nonsense", "--models"],
            vec!["sample", "--model"],
        ] {
            let mut c = cli();
            c.args(&command).arg(&stem);
            if command[0] != "eval" {
                c.arg("--out").arg(&out);
            }
            let o = c.output().unwrap();
            assert_fails_with(&o, &["layer2.0.conv1.weight", "NaN or infinite", bad]);
            assert!(!out.exists(), "{command:?} wrote {}", out.display());
        }
        let o = cli()
            .arg("import")
            .arg(stem.with_extension("safetensors"))
            .args(["--depth", "10", "--width", "1", "--in-channels", "1"])
            .args(["--data", "mnist", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert_fails_with(&o, &["layer2.0.conv1.weight", "NaN or infinite"]);
        assert!(!out.with_extension("safetensors").exists());
    }
}

/// Finite weights whose logits overflow (the head scaled to near f32's limit): the sweep's
/// sanity probe refuses to report an accuracy computed from non-finite logits.
#[test]
fn a_sweep_refuses_a_model_whose_logits_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let stem = dir.path().join("huge");
    baseline_rewritten(
        safetensors::Dtype::F32,
        &stem.with_extension("safetensors"),
        |name, values| {
            if name == "linear.weight" {
                for v in values.iter_mut() {
                    *v = (*v * 1e38).clamp(-3.4e38, 3.4e38);
                }
            }
        },
    );
    std::fs::copy(
        root().join("results/models/baseline.json"),
        stem.with_extension("json"),
    )
    .unwrap();
    let out = dir.path().join("sweep");
    let o = cli()
        .args(TINY_FGSM_SWEEP)
        .args(["--n-examples", "5", "--models"])
        .arg(&stem)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(&o, &["huge K=0", "logits", "not finite"]);
    // No row reports an accuracy.
    let rows = std::fs::read_to_string(out.join("robust.csv")).unwrap_or_default();
    assert!(rows.is_empty(), "{rows}");
}

/// Standard output closed early (`… | head`) or full (`> /dev/full`): every command writes its
/// results before it prints, a closed pipe ends it quietly (exit 0), a full one is a one-line
/// error (exit 1), never a panic; the result files are there either way.
#[test]
fn closed_or_full_stdout_loses_no_result_and_does_not_panic() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let commands = |out: &Path| -> Vec<(Vec<String>, Option<&'static str>)> {
        let o = out.display().to_string();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            (
                s(&[
                    "calibrate",
                    "--models",
                    "results/models/baseline",
                    "--n",
                    "50",
                    "--out",
                    &o,
                ]),
                Some("calibration.csv"),
            ),
            (
                s(&[
                    &TINY_FGSM_SWEEP[..],
                    &[
                        "--models",
                        "results/models/baseline",
                        "--n-examples",
                        "5",
                        "--out",
                        &o,
                    ],
                ]
                .concat()),
                Some("robust.csv"),
            ),
            (
                s(&["eval", "--model", "results/models/baseline", "--n", "50"]),
                None,
            ),
        ]
    };
    for how in ["closed", "full"] {
        let out = dir.path().join(how);
        for (args, file) in commands(&out) {
            let _ = std::fs::remove_dir_all(&out);
            let mut c = cli();
            c.args(&args).stderr(Stdio::piped());
            let o = if how == "closed" {
                let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
                drop(child.stdout.take());
                child.wait_with_output().unwrap()
            } else {
                c.stdout(std::fs::File::create("/dev/full").unwrap())
                    .output()
                    .unwrap()
            };
            let err = stderr(&o);
            assert!(!err.contains("panicked"), "{how} {args:?}: {err}");
            let expected = if how == "closed" { 0 } else { 1 };
            assert_eq!(o.status.code(), Some(expected), "{how} {args:?}: {err}");
            if how == "full" {
                assert!(err.contains("cannot write to standard output"), "{err}");
            }
            if let Some(file) = file {
                let written = std::fs::read_to_string(out.join(file)).unwrap();
                assert!(
                    written.lines().count() > 1,
                    "{how} {args:?}: {file} is empty"
                );
            }
        }
    }
}

/// An output folder belongs to the command that made it: another command's `--out` over it is
/// refused before anything is written (a calibration over a sweep would replace the sweep's
/// settings.json); an existing checkpoint is replaced only with `import --overwrite`; a second
/// `train` on a run folder in use is refused.
#[test]
fn output_folders_belong_to_the_command_that_made_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = "results/models/baseline";
    // Each command, small enough to run in a second or two.
    let commands: Vec<(&str, Vec<&str>)> = vec![
        (
            "robust",
            [
                &TINY_FGSM_SWEEP[..],
                &["--n-examples", "5", "--models", model],
            ]
            .concat(),
        ),
        (
            "calibrate",
            vec!["calibrate", "--n", "20", "--models", model],
        ),
        (
            "ood",
            vec!["ood", "--n", "20", "--ood", "uniform", "--models", model],
        ),
        (
            "nonsense",
            vec![
                "nonsense",
                "--per-class",
                "1",
                "--max-iters",
                "2",
                "--models",
                model,
            ],
        ),
        (
            "train",
            vec![
                "train",
                "--train-subset",
                "64",
                "--test-subset",
                "100",
                "--val-size",
                "32",
                "--epochs",
                "1",
                "--batch-size",
                "32",
            ],
        ),
    ];
    // One folder of each kind, made by its own command.
    for (kind, args) in &commands {
        let o = cli()
            .args(args)
            .arg("--out")
            .arg(dir.path().join(kind))
            .output()
            .unwrap();
        assert_ok(&o);
    }
    let sweep = dir.path().join("robust");
    let calibration = dir.path().join("calibrate");
    let settings = std::fs::read(sweep.join("settings.json")).unwrap();
    // Every command refuses every other command's folder, naming its maker.
    for (command, args) in &commands {
        for (maker, _) in commands.iter().filter(|(kind, _)| kind != command) {
            let o = cli()
                .args(args)
                .arg("--out")
                .arg(dir.path().join(maker))
                .output()
                .unwrap();
            assert_fails_with(&o, &[&format!("`jem-bench {maker}`"), "another --out"]);
        }
    }
    assert_eq!(
        std::fs::read(sweep.join("settings.json")).unwrap(),
        settings
    );
    // The command's own folder is its to reuse.
    assert_ok(
        &cli()
            .args([
                "calibrate",
                "--models",
                "results/models/baseline",
                "--n",
                "20",
                "--out",
            ])
            .arg(&calibration)
            .output()
            .unwrap(),
    );
}

/// import: an existing checkpoint is kept unless --overwrite says otherwise.
#[test]
fn import_keeps_an_existing_checkpoint_unless_told_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("imported");
    let import = |extra: &[&str]| {
        cli()
            .arg("import")
            .arg(root().join("results/models/baseline.safetensors"))
            .args(["--depth", "10", "--width", "1", "--in-channels", "1"])
            .args(["--data", "mnist", "--out"])
            .arg(&imported)
            .args(extra)
            .output()
            .unwrap()
    };
    assert_ok(&import(&[]));
    let before = std::fs::read(imported.with_extension("json")).unwrap();
    assert_fails_with(&import(&[]), &["exists", "--overwrite"]);
    assert_eq!(
        std::fs::read(imported.with_extension("json")).unwrap(),
        before
    );
    assert_ok(&import(&["--overwrite"]));
}

/// train: one process per run folder.
#[test]
fn a_run_folder_takes_one_training_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let train = || {
        let mut c = cli();
        c.args([
            "train",
            "--train-subset",
            "256",
            "--val-size",
            "100",
            "--epochs",
            "50",
        ])
        .args(["--batch-size", "8", "--out"])
        .arg(&run);
        c
    };
    let mut first = train()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !run.join("jem-bench.lock").exists() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = train().output().unwrap();
    // Killed once its first state is saved, the run resumes, and says so where a log (not a
    // terminal) reads it: the progress bar is hidden there, its lines are not.
    while !run.join("state/progress.json").exists() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    assert_fails_with(&second, &["in use by another jem-bench"]);
    let resumed = train().args(["--max-iters", "1"]).output().unwrap();
    assert_ok(&resumed);
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert!(said.contains("resuming"), "{said}");
}

/// A job array larger than the sweep: a shard with no cells has nothing to do, exits 0 and
/// claims no folder.
#[test]
fn a_shard_without_cells_has_nothing_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shard");
    // One model × one attack × K = 0: a single cell, so shard 3/4 holds none.
    let o = small_sweep(&out, &["--shard", "3/4"]);
    assert_ok(&o);
    assert!(stderr(&o).contains("nothing to do"), "{}", stderr(&o));
    assert!(!out.exists());
}

/// A sweep's identity is everything that decides its numbers, not only the weights: a model
/// whose sidecar changed (input normalisation, SGLD settings) under the same path does not reuse
/// the cells computed before, and with settings.json deleted a command with other settings is
/// refused by the cell files themselves.
#[test]
fn cells_are_reused_only_by_the_sweep_that_computed_them() {
    let dir = tempfile::tempdir().unwrap();
    let model = doctored(dir.path(), "m", "jem", |_| {});
    let out = dir.path().join("sweep");
    let run = |n: &str| {
        cli()
            .args(TINY_FGSM_SWEEP)
            .args(["--n-examples", n, "--models"])
            .arg(&model)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap()
    };
    assert_ok(&run("5"));
    // Same weights, another input normalisation: other numbers, so not the same sweep.
    let sidecar = model.with_extension("json");
    let original = std::fs::read_to_string(&sidecar).unwrap();
    let mut edited: serde_json::Value = serde_json::from_str(&original).unwrap();
    edited["architecture"]["input_normalization"]["mean"] = serde_json::json!([0.3]);
    std::fs::write(&sidecar, edited.to_string()).unwrap();
    assert_fails_with(&run("5"), &["input_normalization", "another --out"]);
    // Its SGLD settings likewise.
    let mut edited: serde_json::Value = serde_json::from_str(&original).unwrap();
    edited["training"]["settings"]["jem"]["sgld_std"] = serde_json::json!(0.05);
    std::fs::write(&sidecar, edited.to_string()).unwrap();
    assert_fails_with(&run("5"), &["sgld", "another --out"]);
    std::fs::write(&sidecar, &original).unwrap();
    // settings.json deleted: the cell files still say which sweep computed them.
    std::fs::remove_file(out.join("settings.json")).unwrap();
    assert_fails_with(&run("3"), &["computed by another sweep", "cells"]);
    assert!(
        !out.join("settings.json").exists(),
        "the refused command recorded its settings"
    );
    // The same command still resumes its own cells.
    let again = run("5");
    assert_ok(&again);
    assert!(String::from_utf8_lossy(&again.stdout).contains("ran 0 cells"));
}

/// A tensor of the wrong shape is reported as the file holds it: a linear head stored as
/// `[in, out]` instead of PyTorch's `[out, in]` reads "[64, 10] in the file", not burn's
/// transposed view of it.
#[test]
fn import_reports_shapes_as_the_file_holds_them() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(root().join("results/models/baseline.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let mut shape = view.shape().to_vec();
            if name == "linear.weight" {
                shape.reverse();
            }
            (name, shape, view.data().to_vec())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .unwrap();
            (name.clone(), view)
        })
        .collect();
    let file = dir.path().join("transposed.safetensors");
    std::fs::write(&file, safetensors::serialize(views, None).unwrap()).unwrap();
    let o = cli()
        .arg("import")
        .arg(&file)
        .args(["--depth", "10", "--width", "1", "--in-channels", "1"])
        .args(["--data", "mnist", "--out"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &["`linear.weight` is [64, 10] in the file", "needs [10, 64]"],
    );
}

/// `curves` draws the committed training runs (one continued from another's iteration) and
/// refuses a log with a bad row, or a bad `@START`, naming them, before writing anything.
#[test]
fn curves_draw_real_training_logs_and_name_a_bad_row_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("curves");
    let o = cli()
        .args([
            "curves",
            "results/train/jem-1to1=1 : 1 JEM",
            "results/train/jem/epochs.csv=wider@12900",
            "results/train/baseline-sigma01",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let svg = std::fs::read_to_string(out.with_extension("svg")).unwrap();
    for label in ["1 : 1 JEM", "wider", "baseline-sigma01", "validation ECE"] {
        assert!(svg.contains(label), "{label} missing from the figure");
    }
    assert!(out.with_extension("png").exists());

    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    let log = std::fs::read_to_string(root().join("results/train/jem-1to1/epochs.csv"))
        .unwrap()
        .replacen(",0.26920,", ",0.2692x,", 1);
    std::fs::write(corrupt.join("epochs.csv"), log).unwrap();
    let refused = dir.path().join("refused");
    let o = cli()
        .args(["curves", "results/train/jem-1to1"])
        .arg(&corrupt)
        .arg("--out")
        .arg(&refused)
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &["corrupt/epochs.csv", "row 3", "`val_accuracy`", "0.2692x"],
    );
    assert!(!refused.with_extension("svg").exists());
    let o = cli()
        .args(["curves", "results/train/jem-1to1@soon", "--out"])
        .arg(&refused)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("DIR[=LABEL][@START]"), "{}", stderr(&o));
}

/// Flags a command takes are checked whether or not the settings use them, and ranges that
/// would train nothing, never lower a diverging rate or crop outside the image are refused —
/// all before the output folder exists.
#[test]
fn every_flag_is_checked_before_the_folder_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let train = |extra: &[&str]| {
        let run = dir.path().join("run");
        let o = cli()
            .args(["train", "--epochs", "1", "--train-subset", "64", "--out"])
            .arg(&run)
            .args(extra)
            .output()
            .unwrap();
        (o, run)
    };
    for (flags, named) in [
        (&["--kind", "baseline", "--pad", "28"][..], "--pad 28"),
        (&["--kind", "baseline", "--pad", "100"], "--pad 100"),
        (
            &["--kind", "baseline", "--guard-lr-factor", "0"],
            "--guard-lr-factor",
        ),
        (
            &["--kind", "baseline", "--guard-lr-factor", "2"],
            "--guard-lr-factor",
        ),
        (
            &["--kind", "baseline", "--guard-lr-factor", "NaN"],
            "--guard-lr-factor",
        ),
        (
            &["--kind", "adv", "--adv-rel-stepsize", "NaN"],
            "--adv-rel-stepsize",
        ),
        (&["--kind", "adv", "--eps", "1.5"], "--eps"),
        (
            &["--kind", "jem", "--px-weight", "0", "--pyx-weight", "0"],
            "--px-weight",
        ),
    ] {
        let (o, run) = train(flags);
        assert_fails_with(&o, &[named]);
        assert!(!run.exists(), "{flags:?} created {}", run.display());
    }
    // Chains that cannot fit in memory: refused by size, not by an aborted allocation.
    let out = dir.path().join("sweep");
    let o = small_sweep(&out, &["--steps", "1", "--chains", "100000000"]);
    assert_fails_with(&o, &["--chains 100000000", "GiB"]);
    assert!(!out.exists(), "--chains 1e8 created {}", out.display());
    // The defence's flags at K = 0, where no SGLD step runs: refused, whatever their value.
    for (flag, value) in [
        ("--init-noise", "NaN"),
        ("--sgld-noise", "inf"),
        ("--sgld-step-size", "-1"),
    ] {
        let out = dir.path().join("sweep");
        assert_fails_with(&small_sweep(&out, &[flag, value]), &[flag]);
        assert!(!out.exists(), "{flag} {value} created {}", out.display());
    }
}

/// A flag the other settings leave unused (a JEM setting of a baseline run, the defence's at
/// K = 0, a budget of an attack the sweep does not run) is refused by name, with what would use
/// it, before the output folder exists; the same flags where they are used are taken.
#[test]
fn flags_the_settings_leave_unused_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    for (flags, named) in [
        (
            &["--kind", "baseline", "--px-weight", "2"][..],
            "--px-weight is a setting of --kind jem only",
        ),
        (
            &["--kind", "baseline", "--guard-max-energy-gap", "5"],
            "--guard-max-energy-gap",
        ),
        (
            &["--kind", "jem", "--eps", "0.3"],
            "--eps is a setting of --kind adv only",
        ),
        (
            &["--kind", "adv", "--sgld-steps", "5"],
            "--sgld-steps is a setting of --kind jem only",
        ),
    ] {
        let o = cli()
            .args(["train", "--epochs", "1", "--train-subset", "64", "--out"])
            .arg(&run)
            .args(flags)
            .output()
            .unwrap();
        assert_fails_with(&o, &[named, "drop the flag"]);
        assert!(!run.exists(), "{flags:?} created {}", run.display());
    }
    let out = dir.path().join("sweep");
    for (flags, named) in [
        (
            &["--chains", "3"][..],
            "--chains is a setting of the SGLD defence",
        ),
        (
            &["--grad", "bpda"],
            "--grad is a setting of the SGLD defence",
        ),
        (
            &["--square-queries", "10"],
            "--square-queries is a budget of square only",
        ),
        (
            &["--fab-iterations", "10"],
            "--fab-iterations is a budget of fab-t only",
        ),
    ] {
        assert_fails_with(&small_sweep(&out, flags), &[named]);
        assert!(!out.exists(), "{flags:?} created {}", out.display());
    }
    // Where a K > 0 cell runs the defence, its flags are taken.
    let o = cli()
        .args([
            "robust",
            "--attacks",
            "fgsm",
            "--steps",
            "1",
            "--eps",
            "0,0.1",
        ])
        .args([
            "--chains",
            "2",
            "--convergence-sample",
            "0",
            "--n-examples",
            "3",
        ])
        .args(["--models", "results/models/baseline", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
}

/// Counts far beyond what evaluations use print what the sweep would take here, within
/// seconds, and stop before the folder exists unless `--allow-long` is given; a thread count
/// beyond the cores is refused before any work.
#[test]
fn counts_beyond_the_usual_need_their_estimate_and_a_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let started = std::time::Instant::now();
    let o = cli()
        .args([
            "robust",
            "--attacks",
            "fgsm",
            "--steps",
            "1000000",
            "--eps",
            "0,0.1",
        ])
        .args([
            "--n-examples",
            "2",
            "--models",
            "results/models/baseline",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &[
            "--steps 1000000",
            "more than 100 SGLD steps",
            "would take up to",
            "--allow-long",
        ],
    );
    assert!(
        started.elapsed().as_secs() < 60,
        "the estimate took {:?}",
        started.elapsed()
    );
    assert!(!out.exists(), "--steps 1000000 created {}", out.display());
    assert_fails_with(
        &small_sweep(&out, &["--attacks", "pgd", "--pgd-steps", "20000"][..]),
        &[
            "--pgd-steps 20000",
            "more than 10000 PGD steps",
            "--allow-long",
        ],
    );
    assert!(!out.exists());
    let o = cli()
        .env("RAYON_NUM_THREADS", "100000")
        .args(TINY_FGSM_SWEEP)
        .args(["--models", "results/models/baseline", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &["RAYON_NUM_THREADS=100000", "the cores this process may use"],
    );
    assert!(!out.exists());
}

/// Messages about architectures show them as the project writes them (`WRN-10-2, 1 input
/// channel, …`), never as Rust structures.
#[test]
fn architectures_in_messages_are_written_out_not_dumped() {
    let dir = tempfile::tempdir().unwrap();
    let o = cli()
        .args([
            "train",
            "--kind",
            "baseline",
            "--epochs",
            "1",
            "--train-subset",
            "64",
        ])
        .args([
            "--depth",
            "16",
            "--init-from",
            "results/models/baseline",
            "--out",
        ])
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    assert_fails_with(
        &o,
        &[
            "--init-from",
            "WRN-16-",
            "input channel",
            "only the width may differ",
        ],
    );
    let message = stderr(&o);
    for dump in ["Config {", "Shape {", "Cell {", "Some("] {
        assert!(!message.contains(dump), "{message}");
    }
}

/// Sizes no machine here can hold are refused by name, with the memory they need, before any
/// allocation: exit 1, never an abort; step counts far beyond the usual need `--allow-long`.
#[test]
fn sizes_that_cannot_fit_are_refused_in_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let model = "results/models/baseline";
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &[
                "calibrate",
                "--models",
                model,
                "--steps",
                "1",
                "--chains",
                "100000000",
            ],
            &["--chains 100000000", "GiB"],
        ),
        (
            &["calibrate", "--models", model, "--steps", "1000000"],
            &[
                "--steps 1000000",
                "more than 100 SGLD steps",
                "would take about",
                "--allow-long",
            ],
        ),
        (
            &[
                "sample",
                "--model",
                "results/models/jem",
                "--per-class",
                "1000000000",
            ],
            &["--per-class 1000000000", "GiB"],
        ),
        (
            &["bench", "--op", "forward", "--batch", "1000000000"],
            &["--batch 1000000000", "GiB"],
        ),
        (
            &[
                "bench", "--op", "forward", "--batch", "1", "--size", "100000",
            ],
            &["GiB", "--size"],
        ),
        (
            &[
                "bench", "--op", "pgd-step", "--batch", "1", "--k", "1000000",
            ],
            &["--k 1000000", "at most 100"],
        ),
    ];
    for (args, named) in cases {
        let mut c = cli();
        c.args(args);
        // bench writes nothing and takes no --out.
        if args[0] != "bench" {
            c.arg("--out").arg(&out);
        }
        assert_fails_with(&c.output().unwrap(), named);
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
}

/// `report` on a sweep that has not finished every cell it plans (here: one shard of two)
/// names the missing cells and exits 1; `--partial` draws the finished ones and lists the rest.
#[test]
fn report_names_the_cells_a_sweep_has_not_finished() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("shard");
    assert_ok(&small_sweep(&out, &["--attacks", "pgd", "--shard", "0/2"]));
    let report = |extra: &[&str]| cli().arg("report").arg(&out).args(extra).output().unwrap();
    assert_fails_with(
        &report(&[]),
        &["1 of its 2 cells are not finished", "pgd K=0", "--partial"],
    );
    let drawn = assert_ok(&report(&["--partial"]));
    assert!(
        drawn.contains("partial: 1 of 2 cells not finished"),
        "{drawn}"
    );
}

/// Every command that writes a folder takes the same lock on it: while another jem-bench holds
/// it (here a lock held by this test, as a running `robust` holds it), each is refused, naming
/// the holder, and writes nothing.
#[test]
fn every_command_refuses_a_folder_another_jem_bench_works_in() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("busy");
    let _held = jem_bench::output_folder::FolderLock::acquire(&out, "robust").unwrap();
    let model = "results/models/baseline";
    let commands: [&[&str]; 5] = [
        &[
            "robust",
            "--models",
            model,
            "--attacks",
            "fgsm",
            "--steps",
            "0",
            "--n-examples",
            "2",
        ],
        &["calibrate", "--models", model, "--steps", "0", "--n", "10"],
        &["ood", "--models", model, "--steps", "0", "--n", "10"],
        &[
            "nonsense",
            "--models",
            model,
            "--steps",
            "0",
            "--per-class",
            "1",
        ],
        &[
            "train",
            "--kind",
            "baseline",
            "--epochs",
            "1",
            "--train-subset",
            "64",
        ],
    ];
    for args in commands {
        let o = cli().args(args).arg("--out").arg(&out).output().unwrap();
        assert_fails_with(&o, &["in use by another jem-bench", "`jem-bench robust`"]);
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["jem-bench.lock"], "{args:?} wrote into the folder");
    }
}
