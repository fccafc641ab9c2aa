//! Classifiers imported from ONNX, through the command line: the embedded baseline exported by
//! PyTorch (tests/fixtures/onnx/export_embedded.py) and imported back is attacked like the
//! native checkpoint, example for example; other networks sweep with and without the SGLD
//! defence; a graph jem-bench cannot run, or one edited after import, is refused by name.

use std::path::Path;
use std::process::{Command, Output};

use jem_bench::harness::{read_tidy, ExampleRow};

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn fixture(name: &str) -> String {
    format!("tests/fixtures/onnx/{name}")
}

#[track_caller]
fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `import SOURCE --data DATA [extra] --out OUT`.
fn import(source: &str, data: &str, extra: &[&str], out: &Path) -> Output {
    cli()
        .args(["import", source, "--data", data])
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

/// A PGD sweep of `models` on 20 digits at K = 0 and 1 (`grad`), into `out`.
fn sweep(models: &str, grad: &str, out: &Path) -> Output {
    cli()
        .args([
            "robust",
            "--models",
            models,
            "--attacks",
            "pgd",
            "--pgd-steps",
            "5",
            "--steps",
            "0,1",
            "--grad",
            grad,
            "--eps",
            "0,0.1,0.2",
            "--n-examples",
            "20",
            "--chains",
            "2",
            "--recheck-chains",
            "2",
            "--eot",
            "1",
            "--convergence-sample",
            "0",
            "--jobs",
            "1",
            "--out",
        ])
        .arg(out)
        .output()
        .unwrap()
}

fn examples(out: &Path) -> Vec<ExampleRow> {
    csv::Reader::from_path(out.join("examples.csv"))
        .unwrap()
        .deserialize()
        .map(|r| r.unwrap())
        .collect()
}

#[test]
fn the_embedded_baseline_through_onnx_breaks_the_examples_the_native_one_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let imported = dir.path().join("baseline");
    let said = ok(import(
        &fixture("embedded_baseline.onnx"),
        "mnist",
        &["--mean", "0.5", "--std", "0.5"],
        &imported,
    ));
    assert!(
        said.contains("opset 17") && said.contains("10 classes"),
        "{said}"
    );
    let name = imported.display().to_string();
    let out = dir.path().join("sweep");
    ok(sweep(
        &format!("results/models/baseline,{name}"),
        "bpda",
        &out,
    ));
    let all = examples(&out);
    let of = |model: &str| -> Vec<(usize, Option<u32>, usize, bool, bool)> {
        all.iter()
            .filter(|e| e.model == model)
            .map(|e| {
                (
                    e.k,
                    e.eps.map(f32::to_bits),
                    e.example,
                    e.clean_correct,
                    e.adversarial,
                )
            })
            .collect()
    };
    let native = of("results/models/baseline");
    assert_eq!(native.len(), 2 * 3 * 20, "K 0 and 1, three ε, 20 digits");
    assert!(native.iter().any(|e| e.4), "PGD breaks some digits");
    assert_eq!(
        of(&name),
        native,
        "the same examples broken, at every K and ε"
    );
    let rows = read_tidy(&out.join("robust.csv")).unwrap();
    for r in rows.iter().filter(|r| r.model == name) {
        let twin = rows
            .iter()
            .find(|n| {
                n.model == "results/models/baseline"
                    && n.attack == r.attack
                    && n.k == r.k
                    && n.eps == r.eps
            })
            .unwrap();
        assert_eq!(
            (r.robust_accuracy, r.clean_accuracy),
            (twin.robust_accuracy, twin.clean_accuracy)
        );
    }
}

#[test]
fn other_architectures_sweep_with_and_without_the_defence_and_bad_graphs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cnn = dir.path().join("cnn");
    ok(import(&fixture("small_cnn_mnist.onnx"), "mnist", &[], &cnn));
    let out = dir.path().join("sweep");
    ok(sweep(&cnn.display().to_string(), "full", &out));
    let rows = read_tidy(&out.join("robust.csv")).unwrap();
    assert!(
        rows.iter().any(|r| r.k == 1 && r.attack == "pgd"),
        "{rows:?}"
    );

    // An operator outside the supported set: refused at import, naming it, writing nothing.
    let refused = dir.path().join("refused");
    let o = import(&fixture("unsupported_round.onnx"), "mnist", &[], &refused);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("Round") && err.contains("supported"), "{err}");
    assert!(!refused.with_extension("json").exists());
    // A CIFAR-shaped graph on digits, and Wide-ResNet flags on a graph.
    let o = import(&fixture("resnet18_cifar.onnx"), "mnist", &[], &refused);
    assert!(String::from_utf8_lossy(&o.stderr).contains("[3, 32, 32]"));
    let o = import(
        &fixture("small_cnn_mnist.onnx"),
        "mnist",
        &["--depth", "10"],
        &refused,
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("--depth"));
    // A command that takes Wide-ResNets only says so.
    let o = cli()
        .args(["calibrate", "--models"])
        .arg(&cnn)
        .args(["--steps", "0", "--n", "10", "--out"])
        .arg(dir.path().join("calibration"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("imported from ONNX") && err.contains("robust"),
        "{err}"
    );
    // A graph edited after import is not the graph its sidecar describes.
    let mut bytes = std::fs::read(cnn.with_extension("onnx")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(cnn.with_extension("onnx"), bytes).unwrap();
    let o = sweep(
        &cnn.display().to_string(),
        "full",
        &dir.path().join("edited"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("import it again"), "{err}");
}
