//! A PyTorch model through ONNX, with the library API: the embedded baseline as PyTorch exported
//! it (`tests/fixtures/onnx/embedded_baseline.onnx`, made by `export_embedded.py`) is imported
//! (what `jem-bench import MODEL.onnx --data mnist --mean 0.5 --std 0.5` does), evaluated on
//! clean digits, and swept with PGD under L∞ at K = 0 (no defence) and K = 1 (one step of JEM's
//! SGLD defence in front of it) beside the native checkpoint it was exported from. The graph
//! holds the same weights, so every number must be the native one; the example checks that, and
//! that the sweep measured something (clean accuracy high, robust accuracy falling with ε), and
//! exits with an error naming the first check that fails.
//!
//! ```text
//! cargo run --release --example onnx_model -- [--out DIR] [--n-examples N]
//! ```
//!
//! Your own network goes the same way: `torch.onnx.export(model.eval(), …, "model.onnx")`, then
//! `import_onnx` (or `jem-bench import`) and `Subject::from_checkpoint` (README, docs/import.md).

use std::path::{Path, PathBuf};

use anyhow::Context;
use jem_attacks::{GradMode, Norm};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::harness::{
    sweep, AttackKind, Budgets, Examples, RowAttack, Runner, Subject, SweepSpec, Threat, TidyRow,
};
use jem_bench::metrics;
use jem_bench::model::{import_onnx, LoadedNetwork, ModelInfo};
use jem_datasets::{DataSource, Split};
use std::num::NonZeroUsize;

/// The committed export of the embedded baseline (WRN-10-1 on MNIST, mean 0.5, std 0.5 outside
/// the graph).
const GRAPH: &str = "tests/fixtures/onnx/embedded_baseline.onnx";
/// The checkpoint it was exported from (compiled into jem-bench).
const NATIVE: &str = "results/models/baseline";

/// The fixture's path from any working folder.
fn graph_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(GRAPH)
}

/// Fails with `what` unless `holds`.
fn check(holds: bool, what: impl FnOnce() -> String) -> anyhow::Result<()> {
    anyhow::ensure!(holds, "check failed: {}", what());
    Ok(())
}

/// Accuracy and NLL of the model at `path` (either kind) on the first `n` test digits.
fn clean(path: &Path, n: usize) -> anyhow::Result<metrics::CleanMetrics> {
    let device = backend::device();
    let (network, info) = ModelInfo::load::<Inference>(path, &device)?;
    let test = DataSource::parse(info.data())?.load(Split::Test)?;
    let test = test.select(&(0..n).collect::<Vec<_>>());
    Ok(metrics::evaluate(&network, &test, 250, &device))
}

fn main() -> anyhow::Result<()> {
    let mut out = PathBuf::from("runs/example-onnx-model");
    let mut n_examples = 20;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--out", Some(v)) => out = v.into(),
            ("--n-examples", Some(v)) => n_examples = v.parse()?,
            (other, _) => anyhow::bail!("{other}: expected --out DIR or --n-examples N"),
        }
    }
    let imported = import(&out)?;
    compare_clean(&imported)?;
    let rows = compare_sweeps(&out, &imported, n_examples)?;
    println!(
        "ok: the ONNX graph gives the native numbers ({rows} rows in {})",
        out.join("sweep/robust.csv").display()
    );
    Ok(())
}

/// 1. Import: the graph checked against MNIST (operators, input [1, 28, 28], 10 logits) and
///    written beside its sidecar under `out`, with the normalisation its network expects.
fn import(out: &Path) -> anyhow::Result<PathBuf> {
    let imported = out.join("model/baseline");
    let sidecar = import_onnx(
        &graph_file(),
        "mnist",
        Some(vec![0.5]),
        Some(vec![0.5]),
        &imported,
    )?;
    println!(
        "imported {GRAPH}: opset {}, input {:?}, {} classes -> {}.onnx",
        sidecar.opset,
        sidecar.input_shape,
        sidecar.classes,
        imported.display()
    );
    check(
        sidecar.input_shape == [1, 28, 28] && sidecar.classes == 10,
        || {
            format!(
                "the graph takes {:?} to {}",
                sidecar.input_shape, sidecar.classes
            )
        },
    )?;

    Ok(imported)
}

/// 2. Clean digits: the same accuracy and NLL as the native network.
fn compare_clean(imported: &Path) -> anyhow::Result<()> {
    let (native, graph) = (clean(Path::new(NATIVE), 1000)?, clean(imported, 1000)?);
    println!(
        "clean, first 1000 test digits: native {:.2} % (NLL {:.5}), ONNX {:.2} % (NLL {:.5})",
        100.0 * native.accuracy,
        native.nll,
        100.0 * graph.accuracy,
        graph.nll
    );
    check(native.accuracy == graph.accuracy, || {
        format!(
            "accuracy {} (native) vs {} (ONNX)",
            native.accuracy, graph.accuracy
        )
    })?;
    check((native.nll - graph.nll).abs() < 1e-4, || {
        format!("NLL {} (native) vs {} (ONNX)", native.nll, graph.nll)
    })?;
    check(graph.accuracy > 0.95, || {
        format!("accuracy {}", graph.accuracy)
    })?;

    Ok(())
}

/// 3. A short PGD sweep of both, at K = 0 and through one SGLD step (gradients through it by
///    BPDA), as `jem-bench robust` runs it: the same rows. Returns how many rows it wrote.
fn compare_sweeps(out: &Path, imported: &Path, n_examples: usize) -> anyhow::Result<usize> {
    let device = backend::device();
    let subjects = [NATIVE, &imported.display().to_string()]
        .into_iter()
        .map(|m| Subject::<Train, LoadedNetwork<Train>>::from_checkpoint(m, None, &device))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let spec = SweepSpec {
        attacks: vec![AttackKind::Pgd],
        budgets: Budgets {
            pgd_steps: NonZeroUsize::new(10).expect("10 is not 0"),
            ..Budgets::default()
        },
        threat: Threat {
            norm: Norm::Linf,
            eps: vec![0.0, 0.1, 0.2],
        },
        ks: vec![0, 1],
        grad: vec![GradMode::Bpda],
        eot: Some(1),
        examples: Examples::first(
            NonZeroUsize::new(n_examples).context("--n-examples: expected at least 1")?,
        ),
        convergence_sample: 0,
        defence: jem_bench::defended::DefenceSpec {
            chains: 2,
            recheck_chains: 2,
            ..Default::default()
        },
        ..SweepSpec::default()
    };
    let rows = sweep(subjects, &spec, &Runner::new(out.join("sweep")))?;
    let graph_name = imported.display().to_string();
    let of = |model: &str| -> Vec<&TidyRow> { rows.iter().filter(|r| r.model == model).collect() };
    let (native_rows, graph_rows) = (of(NATIVE), of(&graph_name));
    let pgd = RowAttack::Attack(AttackKind::Pgd);
    println!("PGD, L∞, first {n_examples} test digits: robust accuracy");
    println!("K  ε     native  ONNX");
    for (a, b) in native_rows.iter().zip(&graph_rows) {
        if a.attack == pgd {
            let (k, eps) = (a.k, a.eps);
            let (x, y) = (a.robust_accuracy, b.robust_accuracy);
            println!("{k}  {eps:<4}  {x:>6.2}  {y:>4.2}");
        }
    }
    check(
        !native_rows.is_empty() && native_rows.len() == graph_rows.len(),
        || {
            format!(
                "{} native rows, {} ONNX rows",
                native_rows.len(),
                graph_rows.len()
            )
        },
    )?;
    same_rows(&native_rows, &graph_rows)?;
    Ok(rows.len())
}

/// The graph's rows are the native network's, and PGD breaks more digits at larger ε.
fn same_rows(native_rows: &[&TidyRow], graph_rows: &[&TidyRow]) -> anyhow::Result<()> {
    let pgd = RowAttack::Attack(AttackKind::Pgd);
    for (a, b) in native_rows.iter().zip(graph_rows) {
        let same = (a.attack == b.attack, a.k == b.k, a.eps == b.eps);
        check(same == (true, true, true), || {
            "the rows in another order".into()
        })?;
        check(
            (a.clean_accuracy, a.robust_accuracy) == (b.clean_accuracy, b.robust_accuracy),
            || {
                format!(
                    "K = {} ε = {}: native clean {} robust {}, ONNX clean {} robust {}",
                    a.k,
                    a.eps,
                    a.clean_accuracy,
                    a.robust_accuracy,
                    b.clean_accuracy,
                    b.robust_accuracy
                )
            },
        )?;
    }
    for k in [0, 1] {
        let at = |eps: f32| {
            graph_rows
                .iter()
                .find(|r| r.attack == pgd && r.k == k && r.eps == eps)
                .map(|r| r.robust_accuracy)
        };
        let (zero, small, large) = (at(0.0), at(0.1), at(0.2));
        check(zero.is_some_and(|a| a >= 0.9), || {
            format!("K = {k}: clean {zero:?}")
        })?;
        check(small <= zero && large <= small, || {
            format!("K = {k}: robust accuracy rises with ε: {zero:?}, {small:?}, {large:?}")
        })?;
        check(large < zero, || {
            format!("K = {k}: PGD at ε = 0.2 broke no digit")
        })?;
    }
    Ok(())
}
