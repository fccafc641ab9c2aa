//! `calibrate` and `ood` run as a user runs them, on the embedded models and a few test digits:
//! the tables hold one row per model × K (× score × set) with values in range, the figures and
//! settings are written, the same seed repeats the same numbers, and bad input is refused
//! before the output folder exists.

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::{csv_rows as rows, num};

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Failed with exit code 1 (an error, not a panic), saying every one of `what`.
#[track_caller]
fn assert_fails_with(o: &Output, what: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a clean error: {err}");
    for w in what {
        assert!(err.contains(w), "expected `{w}` in: {err}");
    }
}

const TWO_MODELS: &str = "results/models/baseline,results/models/jem";

#[test]
fn calibrate_writes_sane_metrics_bins_and_a_diagram() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cal");
    let o = cli()
        .args([
            "calibrate",
            "--models",
            TWO_MODELS,
            "--steps",
            "0",
            "--n",
            "50",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let table = rows(&out.join("calibration.csv"));
    assert_eq!(table.len(), 2);
    for r in &table {
        assert_eq!(
            (r["k"].as_str(), r["n"].as_str(), r["seed"].as_str()),
            ("0", "50", "1")
        );
        assert_eq!(r["data"], "mnist");
        assert!(num(r, "accuracy") >= 0.9, "{r:?}");
        assert!((0.0..=1.0).contains(&num(r, "ece")), "{r:?}");
        assert!((0.0..=2.0).contains(&num(r, "brier")), "{r:?}");
        assert!(num(r, "nll") >= 0.0, "{r:?}");
    }
    let bins = rows(&out.join("calibration-bins.csv"));
    assert_eq!(bins.len(), 2 * 15);
    for model in ["results/models/baseline", "results/models/jem"] {
        let mine: Vec<_> = bins.iter().filter(|b| b["model"] == model).collect();
        let total: f64 = mine.iter().map(|b| num(b, "count")).sum();
        assert_eq!(total, 50.0, "{model}");
        // ECE recomputed from the bins is the ECE of the table.
        let ece: f64 = mine
            .iter()
            .filter(|b| b["count"] != "0")
            .map(|b| num(b, "count") * (num(b, "accuracy") - num(b, "confidence")).abs())
            .sum::<f64>()
            / 50.0;
        let row = table.iter().find(|r| r["model"] == model).unwrap();
        assert!((ece - num(row, "ece")).abs() < 1e-9, "{ece} vs {row:?}");
        for b in mine.iter().filter(|b| b["count"] == "0") {
            assert_eq!((b["accuracy"].as_str(), b["confidence"].as_str()), ("", ""));
        }
    }
    for f in ["reliability.png", "reliability.svg", "settings.json"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("settings.json")).unwrap()).unwrap();
    assert_eq!(settings["settings"]["seed"], 1);
    assert_eq!(settings["settings"]["n"], 50);
}

#[test]
fn calibrate_repeats_its_numbers_under_the_same_seed_through_sgld() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let out = dir.path().join(name);
        let o = cli()
            .args([
                "calibrate",
                "--models",
                "results/models/jem",
                "--steps",
                "1",
            ])
            .args(["--n", "10", "--chains", "2", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert_ok(&o);
        let table = rows(&out.join("calibration.csv"));
        assert!(table[0]["defence"].contains("\"steps\":1"), "{table:?}");
        std::fs::read(out.join("calibration.csv")).unwrap()
    };
    assert_eq!(run("a"), run("b"));
}

#[test]
fn ood_writes_one_row_per_model_score_and_set_with_metrics_in_range() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ood");
    let o = cli()
        .args([
            "ood",
            "--models",
            TWO_MODELS,
            "--ood",
            "uniform,fashion-mnist",
        ])
        .args(["--n", "50", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&o);
    let table = rows(&out.join("ood.csv"));
    assert_eq!(table.len(), 2 * 3 * 2, "models × scores × sets");
    for r in &table {
        for f in ["auroc", "aupr", "fpr95"] {
            assert!((0.0..=1.0).contains(&num(r, f)), "{f}: {r:?}");
        }
        assert_eq!((r["n_in"].as_str(), r["n_out"].as_str()), ("50", "50"));
        assert_eq!((r["k"].as_str(), r["data"].as_str()), ("0", "mnist"));
    }
    let auroc = |model: &str, score: &str, set: &str| {
        num(
            table
                .iter()
                .find(|r| r["model"] == model && r["score"] == score && r["ood_set"] == set)
                .unwrap_or_else(|| panic!("no row {model} {score} {set}")),
            "auroc",
        )
    };
    // JEM's claim, measured on the embedded JEM: its density log p(x) puts uniform noise far
    // below the test digits.
    assert!(auroc("results/models/jem", "lse", "uniform") > 0.9);
    for f in ["histograms.png", "histograms.svg", "settings.json"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("settings.json")).unwrap()).unwrap();
    assert_eq!(settings["settings"]["seed"], 1);
    let uniform = settings["sets"]["uniform"].as_str().unwrap();
    assert!(uniform.contains("uniform in [0, 1)"), "{uniform}");
}

#[test]
fn bad_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    let run = |args: &[&str]| cli().args(args).arg("--out").arg(&out).output().unwrap();
    assert_fails_with(&run(&["calibrate", "--n", "0"]), &["--n", "at least 1"]);
    assert_fails_with(
        &run(&["calibrate", "--n", "10001"]),
        &["--n 10001", "1 to 10000"],
    );
    assert_fails_with(
        &run(&["calibrate", "--steps", "0,0"]),
        &["--steps", "twice"],
    );
    assert_fails_with(&run(&["ood", "--n", "0"]), &["--n", "at least 1"]);
    assert_fails_with(
        &run(&["ood", "--ood", "svhn"]),
        &[
            "--ood svhn",
            "uniform, gaussian, interp, constant",
            "fashion-mnist",
        ],
    );
    assert_fails_with(
        &run(&["ood", "--ood", "uniform,uniform"]),
        &["--ood", "twice"],
    );
    assert_fails_with(
        &run(&["ood", "--ood", "uniform,mnist"]),
        &["--ood mnist", "in-distribution"],
    );
    assert_fails_with(&run(&["ood", "--n", "10001"]), &["--n 10001", "1 to 10000"]);
    // A 3-channel model on 1-channel digits.
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
    let model = cifar.display().to_string();
    assert_fails_with(
        &run(&["calibrate", "--data", "mnist", "--models", &model]),
        &["3 channel(s)", "mnist"],
    );
    assert_fails_with(
        &run(&["ood", "--in", "mnist", "--models", &model]),
        &["3 channel(s)", "mnist"],
    );
    assert!(!out.exists(), "a refused run created {}", out.display());
}
