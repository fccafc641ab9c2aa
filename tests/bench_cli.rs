//! `jem-bench bench` prints one JSON line per operation, with the FLOP count of the forward pass
//! that PyTorch's own count gives for the same network (benches/pytorch/ops.py hooks every
//! convolution and the head: 1.889910784 GFLOP for WRN-10-1 on 64 MNIST images).

use std::process::Command;

#[test]
fn every_operation_reports_its_time_and_flops() {
    for (op, factor) in [
        ("forward", 1.0),
        ("train-step", 3.0),
        ("input-gradient", 2.0),
        ("sgld-step", 2.0),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_jem-bench"))
            .args([
                "bench", "--op", op, "--batch", "4", "--reps", "1", "--warmup", "0",
            ])
            .env("RAYON_NUM_THREADS", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["op"], op);
        assert_eq!(v["threads"], 1);
        let expected = factor * 1.889910784 * 4.0 / 64.0;
        let gflop = v["gflop_per_call"].as_f64().unwrap();
        assert!(
            (gflop - expected).abs() < 1e-9,
            "{op}: {gflop} GFLOP, expected {expected}"
        );
        assert!(v["median_ms"].as_f64().unwrap() > 0.0);
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_jem-bench"))
        .args(["bench", "--op", "forward", "--batch", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--batch"));
}
