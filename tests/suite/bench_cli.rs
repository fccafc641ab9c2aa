//! `jem-bench bench` prints one JSON line per operation, with the FLOP count of the forward pass
//! that PyTorch's own count gives for the same network (benches/pytorch/ops.py hooks every
//! convolution and the head: 1.889910784 GFLOP for WRN-10-1 and 12.654149632 for WRN-16-2 on 64
//! MNIST images), times the factor each row's comment in src/bench.rs derives. With a Python
//! that has torch (`JEM_BENCH_PYTHON`, else `python3`), ignored tests run every row through
//! ops.py too, which must report the same row, model, batch and FLOPs, and time a
//! PreAct-ResNet-18 it exports to ONNX with `bench --model` on the same row
//! (`-- --ignored pytorch`).

use std::path::Path;
use std::process::Command;

use crate::common;

/// PyTorch's forward FLOPs of one MNIST image (its hook count over 64 images / 64).
const WRN_10_1: f64 = 1.889910784 / 64.0;
const WRN_16_2: f64 = 12.654149632 / 64.0;

/// `jem-bench bench ARGS` at one thread; its JSON line.
fn bench(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_jem-bench"))
        .arg("bench")
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every row with tiny settings: its flags and its FLOPs in units of one image's forward pass.
/// (JEM iteration: 2·20 + 6 per chain; PGD: 2 at K = 0, n·(2K + 2) for BPDA, n·(4K + 2) for
/// jem-bench's full gradient, n = 2 chains here.)
fn rows() -> Vec<(Vec<&'static str>, &'static str, f64)> {
    let tiny = ["--batch", "2", "--reps", "1", "--warmup", "0"];
    let with = |extra: &[&'static str]| [&tiny[..], extra].concat();
    vec![
        (with(&["--op", "forward"]), "forward", 2.0),
        (with(&["--op", "train-step"]), "train-step", 6.0),
        (with(&["--op", "input-gradient"]), "input-gradient", 4.0),
        (with(&["--op", "sgld-step"]), "sgld-step", 4.0),
        (
            with(&["--op", "jem-iteration"]),
            "jem-iteration",
            46.0 * 2.0,
        ),
        (with(&["--op", "pgd-step", "--k", "0"]), "pgd-step k0", 4.0),
        (
            with(&[
                "--op", "pgd-step", "--k", "1", "--grad", "bpda", "--chains", "2",
            ]),
            "pgd-step k1 bpda",
            2.0 * 4.0 * 2.0,
        ),
        (
            with(&[
                "--op", "pgd-step", "--k", "2", "--grad", "full", "--chains", "2",
            ]),
            "pgd-step k2 full",
            // 2 chains × (4K + 2) forward passes × 2 images.
            2.0 * 10.0 * 2.0,
        ),
    ]
}

#[test]
fn every_operation_reports_its_time_and_flops() {
    for (args, row, factor) in rows() {
        let v = bench(&args);
        assert_eq!(v["row"], row);
        assert_eq!(
            v["op"],
            args[args.iter().position(|&a| a == "--op").unwrap() + 1]
        );
        assert_eq!(v["model"], "WRN-10-1");
        assert_eq!(v["batch"], 2);
        assert_eq!(v["threads"], 1);
        assert_eq!(v["reps"], 1);
        let expected = factor * WRN_10_1;
        let gflop = v["gflop_per_call"].as_f64().unwrap();
        assert!(
            (gflop - expected).abs() < 1e-9,
            "{row}: {gflop} GFLOP, expected {expected}"
        );
        assert!(v["median_ms"].as_f64().unwrap() > 0.0);
        // The settings of the row, and only those.
        let pgd = row.starts_with("pgd-step");
        assert_eq!(v.get("k").is_some(), pgd, "{row}: {v}");
        assert_eq!(
            v.get("grad").is_some(),
            pgd && row != "pgd-step k0",
            "{row}: {v}"
        );
        assert_eq!(
            v.get("chains").is_some(),
            pgd && row != "pgd-step k0",
            "{row}: {v}"
        );
        if v.get("chains").is_some() {
            assert_eq!(v["chains"], 2);
        }
        assert_eq!(
            v.get("sgld_steps").and_then(|s| s.as_u64()),
            (row == "jem-iteration").then_some(20)
        );
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_jem-bench"))
        .args(["bench", "--op", "forward", "--batch", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--batch"));
}

#[test]
fn wrn_16_2_counts_as_pytorch_does() {
    let v = bench(&[
        "--op", "pgd-step", "--k", "0", "--depth", "16", "--width", "2", "--batch", "1", "--reps",
        "1", "--warmup", "0",
    ]);
    assert_eq!(v["model"], "WRN-16-2");
    let gflop = v["gflop_per_call"].as_f64().unwrap();
    assert!((gflop - 2.0 * WRN_16_2).abs() < 1e-9, "{gflop}");
}

#[test]
fn max_seconds_bounds_the_timed_calls() {
    let v = bench(&[
        "--op",
        "forward",
        "--batch",
        "1",
        "--reps",
        "50",
        "--warmup",
        "5",
        "--max-seconds",
        "0",
    ]);
    assert_eq!(
        v["reps"], 3,
        "at least 3 timed calls, and no more once the time is out"
    );
}

#[test]
#[ignore = "needs a Python with torch: JEM_BENCH_PYTHON=PYTHON cargo test --release --test suite -- --ignored pytorch"]
fn pytorch_twin_reports_the_same_rows_and_flops() {
    let python = common::python_with_torch();
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pytorch/ops.py");
    let mut rows = rows();
    rows.push((
        vec![
            "--op", "forward", "--depth", "16", "--width", "2", "--batch", "2", "--reps", "1",
            "--warmup", "0",
        ],
        "forward",
        2.0,
    ));
    for (args, row, _) in rows {
        let ours = bench(&args);
        let out = Command::new(&python)
            .arg(&ops)
            .args(&args)
            .args(["--threads", "1"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ops.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in [
            "op",
            "row",
            "model",
            "batch",
            "threads",
            "sgld_steps",
            "k",
            "grad",
            "chains",
        ] {
            assert_eq!(ours.get(key), theirs.get(key), "{row}: {key}");
        }
        let (a, b) = (
            ours["gflop_per_call"].as_f64().unwrap(),
            theirs["gflop_per_call"].as_f64().unwrap(),
        );
        // Both count n·(4K + 2)F for a full gradient: jem-bench's linearised Hessian-vector
        // products and PyTorch's double backward both cost about 2F per step back.
        let expected = a;
        assert!(
            (b - expected).abs() < 1e-9,
            "{row}: PyTorch {b} GFLOP, expected {expected}"
        );
    }
}

/// `JEM_BENCH_ISA` forces the convolution kernels' path, which `bench` reports with the matrix
/// products' (`portable+gemm-avx512`), capped by what the CPU has; a bad value is refused
/// before anything runs, naming the variable and the values it takes.
#[test]
fn the_forced_instruction_set_is_reported_and_a_bad_one_refused() {
    let run = |isa: &str| {
        Command::new(env!("CARGO_BIN_EXE_jem-bench"))
            .args(["bench", "--op", "forward", "--batch", "2", "--reps", "1"])
            .args(["--warmup", "0"])
            .env("RAYON_NUM_THREADS", "1")
            .env("JEM_BENCH_ISA", isa)
            .output()
            .unwrap()
    };
    let reported = |isa: &str| -> String {
        let out = run(isa);
        assert!(
            out.status.success(),
            "{isa}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        line["isa"].as_str().unwrap().to_string()
    };
    let gemm = jem_kernels::gemm_isa();
    assert_eq!(reported("portable"), format!("portable+gemm-{gemm}"));
    // Forcing the widest set is no cap: the CPU's best.
    let best = jem_kernels::Isa::best_available();
    assert_eq!(reported("avx512"), format!("{best}+gemm-{gemm}"));
    assert_eq!(reported(""), format!("{best}+gemm-{gemm}"), "empty: no cap");

    let out = run("avx-512");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("JEM_BENCH_ISA=\"avx-512\"") && stderr.contains("avx512, avx2, portable"),
        "{stderr}"
    );
}

/// The CIFAR PreAct-ResNet-18 row of compare.py: ops.py exports its seeded network to ONNX and
/// times it; `bench --model` times the same graph through the ONNX interpreter, on the same
/// row, batch and image shape, with no FLOP count of its own (compare.py takes PyTorch's).
#[test]
#[ignore = "needs a Python with torch: JEM_BENCH_PYTHON=PYTHON cargo test --release --test suite -- --ignored pytorch"]
fn pytorch_twin_exports_a_preact_resnet_that_bench_times() {
    let python = common::python_with_torch();
    let dir = tempfile::tempdir().unwrap();
    let graph = dir.path().join("preact.onnx");
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/pytorch/ops.py");
    let shape = ["--channels", "3", "--size", "32"];
    let net = ["--arch", "preact-resnet18", "--preact-width", "8"];
    let exported = Command::new(&python)
        .arg(&ops)
        .args(["--op", "forward"])
        .args(net)
        .args(shape)
        .arg("--export")
        .arg(&graph)
        .output()
        .unwrap();
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let tiny = ["--batch", "2", "--reps", "1", "--warmup", "0"];
    for op in ["forward", "input-gradient"] {
        let ours = bench(&[&["--op", op, "--model", graph.to_str().unwrap()][..], &tiny].concat());
        let out = Command::new(&python)
            .arg(&ops)
            .args(["--op", op])
            .args(net)
            .args(shape)
            .args(tiny)
            .args(["--threads", "1"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in ["op", "row", "batch", "threads"] {
            assert_eq!(ours.get(key), theirs.get(key), "{op}: {key}");
        }
        assert_eq!(ours["input"], "3×32×32");
        assert_eq!(ours["model"], "ONNX preact.onnx");
        assert_eq!(theirs["model"], "PreAct-ResNet-18 (width 8)");
        assert!(ours["gflop_per_call"].is_null());
        assert!(theirs["gflop_per_call"].as_f64().unwrap() > 0.0);
    }
}
