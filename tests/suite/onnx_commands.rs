//! Every command that takes a model takes a graph imported from ONNX, through the same code as
//! a Wide-ResNet: the embedded baseline exported by PyTorch
//! (tests/fixtures/onnx/embedded_baseline.onnx) and imported back gives the native checkpoint's
//! numbers — `eval`'s accuracy, `calibrate`'s rows (with and without the SGLD defence),
//! `ood`'s AUROCs, `nonsense`'s searches — within float tolerance; `sample` draws from a
//! graph's energy and writes its grid; `bench` times a graph. What cannot take a graph says
//! why: a sample judge (it reads a Wide-ResNet's features) and the training rows of `bench`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{csv_rows as rows, num};

const NATIVE: &str = "results/models/baseline";

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[track_caller]
fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn fails_with(o: Output, what: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for w in what {
        assert!(err.contains(w), "expected `{w}` in: {err}");
    }
}

/// `fixture` (under tests/fixtures/onnx/) imported into `dir` as NAME (`extra`: --mean/--std).
fn imported(dir: &Path, fixture: &str, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    ok(cli()
        .args(["import", &format!("tests/fixtures/onnx/{fixture}")])
        .args(["--data", "mnist"])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    out
}

/// The embedded baseline exported to ONNX, imported with its normalisation (mean 0.5, std 0.5).
fn onnx_baseline(dir: &Path) -> PathBuf {
    imported(
        dir,
        "embedded_baseline.onnx",
        "baseline",
        &["--mean", "0.5", "--std", "0.5"],
    )
}

/// The rows of `all` whose `model` column is `model`, in order.
fn of<'a>(all: &'a [HashMap<String, String>], model: &str) -> Vec<&'a HashMap<String, String>> {
    all.iter().filter(|r| r["model"] == model).collect()
}

#[track_caller]
fn close(a: f64, b: f64, tolerance: f64, what: &str) {
    assert!(
        (a - b).abs() <= tolerance,
        "{what}: native {a}, ONNX {b} (tolerance {tolerance})"
    );
}

#[test]
fn eval_and_calibrate_give_the_native_numbers_for_the_baseline_through_onnx() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = onnx_baseline(dir.path());
    let name = onnx.display().to_string();

    let eval = |model: &str| -> serde_json::Value {
        let out = ok(cli()
            .args(["eval", "--model", model, "--n", "500", "--json"])
            .output()
            .unwrap());
        serde_json::from_str(&out).unwrap()
    };
    let (native, graph) = (eval(NATIVE), eval(&name));
    assert_eq!(native["n"], 500);
    assert_eq!(native["accuracy"], graph["accuracy"], "{native} {graph}");
    assert!(native["accuracy"].as_f64().unwrap() > 0.95, "{native}");
    for field in ["nll", "brier", "ece"] {
        let (a, b) = (
            native[field].as_f64().unwrap(),
            graph[field].as_f64().unwrap(),
        );
        close(a, b, 1e-5, field);
    }
    // The report names the graph and what it was imported from.
    let said = ok(cli()
        .args(["eval", "--model", &name, "--n", "10"])
        .output()
        .unwrap());
    assert!(
        said.contains("baseline.onnx") && said.contains("ONNX graph (opset 17)"),
        "{said}"
    );

    // Calibration at K = 0 and through one SGLD step (the same seeded noise for both).
    let out = dir.path().join("calibration");
    ok(cli()
        .args(["calibrate", "--models"])
        .arg(format!("{NATIVE},{name}"))
        .args(["--steps", "0,1", "--n", "200", "--chains", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap());
    let all = rows(&out.join("calibration.csv"));
    let (native, graph) = (of(&all, NATIVE), of(&all, &name));
    assert_eq!((native.len(), graph.len()), (2, 2), "{all:?}");
    for (a, b) in native.iter().zip(&graph) {
        assert_eq!(
            (&a["k"], &a["n"], &a["accuracy"]),
            (&b["k"], &b["n"], &b["accuracy"])
        );
        // The defence in force is the same: the graph's SGLD runs on its normalisation's scale.
        assert_eq!(a["defence"], b["defence"]);
        for field in ["nll", "brier", "ece"] {
            close(
                num(a, field),
                num(b, field),
                1e-5,
                &format!("K = {} {field}", a["k"]),
            );
        }
    }
    assert!(
        native[1]["defence"].contains("\"pixel_scale\":[0.5]"),
        "{:?}",
        native[1]
    );
    // The reliability bins hold the same examples.
    let bins = rows(&out.join("calibration-bins.csv"));
    let counts = |model: &str| -> Vec<String> {
        of(&bins, model)
            .iter()
            .map(|b| b["count"].clone())
            .collect()
    };
    assert_eq!(counts(NATIVE), counts(&name));
    assert_eq!(counts(NATIVE).len(), 2 * 15);
}

#[test]
fn ood_and_nonsense_give_the_native_numbers_for_the_baseline_through_onnx() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = onnx_baseline(dir.path());
    let name = onnx.display().to_string();
    let models = format!("{NATIVE},{name}");

    // Every score, at K = 0 and through one SGLD step (grad-norm differentiates through it).
    let out = dir.path().join("ood");
    ok(cli()
        .args(["ood", "--models", &models, "--steps", "0,1", "--n", "60"])
        .args(["--ood", "uniform,fashion-mnist", "--chains", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap());
    let all = rows(&out.join("ood.csv"));
    let (native, graph) = (of(&all, NATIVE), of(&all, &name));
    assert_eq!(native.len(), 2 * 3 * 2, "K × scores × sets: {all:?}");
    assert_eq!(native.len(), graph.len());
    for (a, b) in native.iter().zip(&graph) {
        let cell = format!("K = {} {} against {}", a["k"], a["score"], a["ood_set"]);
        assert_eq!(
            (&a["k"], &a["score"], &a["ood_set"], &a["defence"]),
            (&b["k"], &b["score"], &b["ood_set"], &b["defence"]),
            "{cell}"
        );
        for field in ["auroc", "aupr", "fpr95"] {
            close(
                num(a, field),
                num(b, field),
                2e-3,
                &format!("{cell} {field}"),
            );
        }
    }

    // Nonsense searches from the same noise: the same searches reach the threshold, in the
    // same number of iterations, at the same confidence (K = 0, and K = 1 by BPDA).
    let out = dir.path().join("nonsense");
    ok(cli()
        .args([
            "nonsense", "--models", &models, "--steps", "0,1", "--grad", "bpda",
        ])
        .args(["--per-class", "1", "--max-iters", "30", "--chains", "2"])
        .args(["--recheck-chains", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap());
    let all = rows(&out.join("searches.csv"));
    let native = of(&all, "results/models/baseline.safetensors");
    let graph = of(&all, &format!("{name}.onnx"));
    assert_eq!(native.len(), 2 * 10, "K × classes: {all:?}");
    assert_eq!(native.len(), graph.len());
    assert!(native.iter().any(|r| r["reached"] == "true"), "{native:?}");
    for (a, b) in native.iter().zip(&graph) {
        let search = format!("K = {} class {}", a["k"], a["target"]);
        assert_eq!(
            (&a["k"], &a["target"], &a["reached"], &a["iterations"]),
            (&b["k"], &b["target"], &b["reached"], &b["iterations"]),
            "{search}"
        );
        close(num(a, "confidence"), num(b, "confidence"), 2e-2, &search);
    }
    assert!(out.join("grid-k1.png").exists());
}

#[test]
fn sample_draws_from_a_graphs_energy_and_a_graph_cannot_judge() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = onnx_baseline(dir.path());
    let png = dir.path().join("samples.png");
    let said = ok(cli()
        .args(["sample", "--model"])
        .arg(&onnx)
        .args(["--class", "3,7", "--per-class", "3", "--steps", "4"])
        .args(["--reference-images", "50", "--out"])
        .arg(&png)
        .output()
        .unwrap());
    assert!(said.contains("judge results/models/baseline"), "{said}");
    // A grid of two rows of three 28×28 digits, 2-pixel separators around every cell.
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let info = decoder.read_info().unwrap();
    let (w, h) = (info.info().width, info.info().height);
    assert_eq!((w, h), (3 * 30 + 2, 2 * 30 + 2));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(png.with_extension("json")).unwrap())
            .unwrap();
    // The paper's SGLD on the graph's normalisation scale (std 0.5), four steps.
    assert_eq!(record["sgld"]["steps"], 4);
    assert_eq!(record["sgld"]["pixel_scale"], serde_json::json!([0.5]));
    let classes = record["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    assert_eq!(
        (&classes[0]["class"], &classes[1]["class"]),
        (&3.into(), &7.into())
    );
    assert_eq!(record["quality"]["samples"], 6);

    // A graph without normalisation samples on the [0, 1] scale.
    let cnn = imported(dir.path(), "small_cnn_mnist.onnx", "cnn", &[]);
    let png = dir.path().join("cnn.png");
    ok(cli()
        .args(["sample", "--model"])
        .arg(&cnn)
        .args([
            "--per-class",
            "1",
            "--steps",
            "2",
            "--judge",
            "none",
            "--out",
        ])
        .arg(&png)
        .output()
        .unwrap());
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(png.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(record["sgld"]["pixel_scale"], serde_json::json!([1.0]));
    assert_eq!(record["classes"].as_array().unwrap().len(), 10);

    // The judge reads a Wide-ResNet's penultimate features, which a graph does not expose.
    let never = dir.path().join("never.png");
    fails_with(
        cli()
            .args(["sample", "--model", NATIVE, "--judge"])
            .arg(&onnx)
            .arg("--out")
            .arg(&never)
            .output()
            .unwrap(),
        &["--judge", "penultimate features", "Wide-ResNet"],
    );
    assert!(!never.exists());
}

#[test]
fn bench_times_a_graph_and_refuses_to_train_one() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = onnx_baseline(dir.path());
    let bench = |model: &str, extra: &[&str]| {
        cli()
            .args(["bench", "--model", model, "--batch", "2", "--reps", "1"])
            .args(["--warmup", "0"])
            .args(extra)
            .env("RAYON_NUM_THREADS", "1")
            .output()
            .unwrap()
    };
    let name = onnx.display().to_string();
    let bare = "tests/fixtures/onnx/embedded_baseline.onnx";
    for (model, shown) in [
        (name.as_str(), "ONNX baseline.onnx"),
        (bare, "ONNX embedded_baseline.onnx"),
    ] {
        for (op, row) in [
            (&["--op", "forward"][..], "forward"),
            (&["--op", "input-gradient"], "input-gradient"),
            (&["--op", "sgld-step"], "sgld-step"),
            (
                &[
                    "--op", "pgd-step", "--k", "1", "--grad", "full", "--chains", "2",
                ],
                "pgd-step k1 full",
            ),
        ] {
            let v: serde_json::Value = serde_json::from_str(&ok(bench(model, op))).unwrap();
            assert_eq!(v["row"], row);
            assert_eq!(v["model"], shown);
            assert_eq!(v["input"], "1×28×28");
            assert_eq!(v["model_file"], model);
            // jem-bench counts no graph's FLOPs.
            assert!(v["gflop_per_call"].is_null(), "{v}");
            assert!(v["median_ms"].as_f64().unwrap() > 0.0);
        }
    }
    // The native checkpoint: its architecture and FLOPs.
    let v: serde_json::Value =
        serde_json::from_str(&ok(bench(NATIVE, &["--op", "forward"]))).unwrap();
    assert_eq!(v["model"], "WRN-10-1");
    assert!(v["gflop_per_call"].as_f64().unwrap() > 0.0);
    fails_with(
        bench(&name, &["--op", "train-step"]),
        &["--model", "train-step", "Wide-ResNets only"],
    );
    fails_with(bench(&name, &["--op", "jem-iteration"]), &["jem-iteration"]);
}
