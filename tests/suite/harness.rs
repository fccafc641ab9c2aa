//! The sweep harness: its CSV reads back into its own schema, and a sweep killed at any point
//! and run again ends with exactly the rows of an uninterrupted sweep (none lost, none twice).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use jem_bench::harness::{read_tidy, TidyRow};

use crate::common;

/// The `jem-bench` binary, run from the repository root (where the models' paths start).
fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

fn sweep(out: &Path) -> Command {
    sweep_of("results/models/baseline", out)
}

/// The small sweeps' K = 1 cells are stochastic and get a convergence check; 2 EOT draws and 2
/// sampled survivors keep each sweep a few seconds (the defaults, 10 draws with 2 chains and 20
/// survivors, made it six times as long).
const CHEAP_STOCHASTIC_CELLS: [&str; 4] = ["--eot", "2", "--convergence-sample", "2"];

/// The small sweep of `sweep`, of the models `models` (comma-separated).
fn sweep_of(models: &str, out: &Path) -> Command {
    let mut c = cli();
    c.args([
        "robust",
        "--norm",
        "linf",
        "--models",
        models,
        "--attacks",
        "pgd,fgsm",
        "--steps",
        "0,1",
        "--grad",
        "bpda",
        "--eps",
        "0,0.1,0.3",
        "--n-examples",
        "6",
        "--pgd-steps",
        "4",
        "--chains",
        "2",
        "--recheck-chains",
        "3",
    ]);
    c.args(CHEAP_STOCHASTIC_CELLS).arg("--out").arg(out);
    c
}

/// The command failed and its error output says `what`.
fn assert_fails_with(o: &std::process::Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(what), "{err}");
}

/// Runs a command that must succeed.
#[track_caller]
fn run(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn rows(out: &Path) -> Vec<TidyRow> {
    read_tidy(&out.join("robust.csv")).unwrap()
}

#[test]
fn killed_sweeps_resume_without_lost_or_duplicated_rows() {
    let whole = tempfile::tempdir().unwrap();
    let status = sweep(whole.path()).output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let reference = rows(whole.path());
    // 2 attacks × (K = 0, and K = 1 with bpda) = 4 cells of 3 ε each, and a worst-case row
    // per K and ε.
    assert_eq!(reference.len(), 12 + 2 * 3);
    assert!(reference
        .iter()
        .all(|r| r.n == 6 && r.software.starts_with("jem-bench")));
    let examples = std::fs::read_to_string(whole.path().join("examples.csv")).unwrap();
    assert_eq!(
        examples.lines().count(),
        1 + 12 * 6,
        "header + one row per example per cell"
    );

    // Kill a sweep part-way (wherever it happens to be), then run the same command again.
    let parts = tempfile::tempdir().unwrap();
    let mut child = sweep(parts.path()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = child.kill();
    let _ = child.wait();
    // And make sure the state "killed inside a cell" is covered: drop the last finished cell
    // and leave a half-written file behind, as an interrupted atomic write would.
    let cells = parts.path().join("cells");
    // (Beside the cells' files, the killed cell's kept batches: `CELL.batches/`.)
    let mut finished: Vec<_> = std::fs::read_dir(&cells)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| common::is_cell_file(p))
                .collect()
        })
        .unwrap_or_default();
    finished.sort();
    if let Some(last) = finished.last() {
        std::fs::remove_file(last).unwrap();
        std::fs::write(last.with_extension("gz.tmp"), b"{\"cell\": trunc").unwrap();
    }
    let status = sweep(parts.path()).output().unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(
        rows(parts.path()),
        reference,
        "same rows, same order, nothing lost or doubled"
    );
    assert_eq!(
        std::fs::read_to_string(parts.path().join("examples.csv")).unwrap(),
        examples
    );

    // A different command on the same folder is refused, naming it.
    let out = cli()
        .args([
            "robust",
            "--models",
            "results/models/baseline",
            "--n-examples",
            "3",
            "--out",
        ])
        .arg(parts.path())
        .output()
        .unwrap();
    assert_fails_with(&out, "other settings");
}

#[test]
fn a_sweep_logged_to_a_file_reports_each_finished_part_and_cell_on_a_line() {
    // Captured stderr is not a terminal: no bar, one line per cell with the time left, and one
    // per kept part of a cell (its attack, then its convergence check).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let o = sweep(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let rows = rows(&out);
    let cells: Vec<&str> = err.lines().filter(|l| l.contains("; last: ")).collect();
    assert_eq!(cells.len(), 4, "one line per cell of the four:\n{err}");
    for (i, line) in cells.iter().enumerate() {
        assert!(
            line.contains(&format!(" elapsed, {}/4 cells, about ", i + 1)),
            "{line}"
        );
        assert!(line.contains("robust "), "{line}");
    }
    assert!(cells[3].contains("about 0 s left"), "{}", cells[3]);
    // Each cell reports its attack (one batch), and a K = 1 cell, stochastic, then each
    // re-attack of its convergence check (two per ε with survivors to check), in order.
    let parts: Vec<&str> = err.lines().filter(|l| l.contains(" done in ")).collect();
    for (attack, k) in [("pgd", 0), ("fgsm", 0), ("pgd", 1), ("fgsm", 1)] {
        let of_cell: Vec<&str> = parts
            .iter()
            .filter_map(|l| l.split_once(&format!("; {attack} results/models/baseline K={k}: ")))
            .map(|(_, what)| what)
            .collect();
        assert!(
            of_cell
                .first()
                .is_some_and(|w| w.starts_with("attack done in ")),
            "{err}"
        );
        let checks = &of_cell[1..];
        let checked = rows
            .iter()
            .filter(|r| r.attack == attack && r.k == k && r.check_sampled.is_some())
            .count();
        assert_eq!(checks.len(), 2 * checked, "{err}");
        assert_eq!(checked > 0, k == 1, "{err}");
        for (j, what) in checks.iter().enumerate() {
            let expected = format!("convergence check {}/{} done in ", j + 1, checks.len());
            assert!(what.starts_with(&expected), "{what}\n{err}");
        }
    }
}

#[test]
fn tidy_csv_round_trips_its_schema_and_rejects_a_broken_row() {
    let dir = tempfile::tempdir().unwrap();
    let row = TidyRow {
        model: "results/models/baseline".into(),
        attack: "pgd".parse().unwrap(),
        norm: jem_attacks::Norm::Linf,
        eps: 0.1,
        k: 10,
        grad: jem_bench::harness::GradColumn::Full,
        n: 20,
        clean_accuracy: 0.95,
        clean_lo: 0.76,
        clean_hi: 0.99,
        robust_accuracy: 0.35,
        robust_lo: 0.18,
        robust_hi: 0.57,
        eot: 15,
        restarts: 2,
        chains: 5,
        recheck_chains: 150,
        seed: 7,
        attack_settings: "{\"steps\":50,\"loss\":\"ce\"}".into(),
        defence: "{\"sgld\":{\"steps\":10}}".into(),
        stochastic: false,
        zero_gradients: 0,
        upper_bound: false,
        check_sampled: None,
        check_broken_eot: None,
        check_broken_iterations: None,
        check_broken: None,
        data: "mnist".into(),
        software: "jem-bench 0.1.0".into(),
        backend: "burn-flex".into(),
    };
    let path = dir.path().join("robust.csv");
    let mut w = csv::Writer::from_path(&path).unwrap();
    w.serialize(&row).unwrap();
    w.flush().unwrap();
    assert_eq!(read_tidy(&path).unwrap(), vec![row]);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(",0.35,", ",not-a-number,")).unwrap();
    let err = format!("{:#}", read_tidy(&path).unwrap_err());
    assert!(err.contains("robust.csv") && err.contains("row 2"), "{err}");
}

#[test]
fn shards_merged_equal_the_whole_sweep() {
    let whole = tempfile::tempdir().unwrap();
    run(&mut sweep(whole.path()));
    let shards: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    for (i, dir) in shards.iter().enumerate() {
        // One cell at a time here, several at once in the whole sweep (--jobs defaults to
        // the cores): the results must not depend on it.
        run(sweep(dir.path()).args(["--shard", &format!("{i}/3"), "--jobs", "1"]));
        // Each shard ran only its own cells: 4 cells (2 attacks × 2 K, 3 ε each) over 3
        // shards (plus the worst case over what the shard has).
        let per_attack = rows(dir.path())
            .into_iter()
            .filter(|r| r.attack != "worst-case");
        assert_eq!(per_attack.count(), if i == 0 { 6 } else { 3 });
    }
    let merged = tempfile::tempdir().unwrap();
    let mut merge = cli();
    merge.arg("merge");
    shards.iter().for_each(|d| {
        merge.arg(d.path());
    });
    run(merge.arg("--out").arg(merged.path()));
    assert_eq!(rows(merged.path()), rows(whole.path()));
    let examples = |d: &Path| std::fs::read_to_string(d.join("examples.csv")).unwrap();
    assert_eq!(examples(merged.path()), examples(whole.path()));

    // Shards run one after another in one folder: each run's tables hold every cell finished
    // there, not only its own shard's, and the last run's equal the whole sweep's.
    let one = tempfile::tempdir().unwrap();
    let copy_cells = |from: &Path| {
        std::fs::create_dir_all(one.path().join("cells")).unwrap();
        std::fs::copy(from.join("settings.json"), one.path().join("settings.json")).unwrap();
        for f in std::fs::read_dir(from.join("cells")).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, one.path().join("cells").join(f.file_name().unwrap())).unwrap();
        }
    };
    copy_cells(shards[0].path());
    run(sweep(one.path()).args(["--shard", "1/3", "--jobs", "1"]));
    let per_attack = rows(one.path())
        .into_iter()
        .filter(|r| r.attack != "worst-case");
    assert_eq!(per_attack.count(), 9);
    copy_cells(shards[2].path());
    run(sweep(one.path()).args(["--shard", "2/3", "--jobs", "1"]));
    assert_eq!(rows(one.path()), rows(whole.path()));
    assert_eq!(examples(one.path()), examples(whole.path()));

    // A missing shard is named, not silently skipped.
    let partial = tempfile::tempdir().unwrap();
    let o = cli()
        .arg("merge")
        .args([shards[0].path(), shards[1].path()])
        .arg("--out")
        .arg(partial.path())
        .output()
        .unwrap();
    assert_fails_with(&o, "no folder holds the finished cell");
    assert!(!partial.path().join("settings.json").exists());
}

#[test]
fn sweeps_of_other_models_merge_into_the_sweep_of_all_and_a_moved_checkpoint_keeps_its_cells() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    let text = |p: &Path| p.display().to_string();
    // The adversarially trained model, also at a path of its own.
    let moved = at("moved");
    for ext in ["safetensors", "json"] {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("results/models/adv.{ext}"));
        std::fs::copy(from, moved.with_extension(ext)).unwrap();
    }
    run(&mut sweep_of("results/models/baseline", &at("baseline")));
    run(&mut sweep_of("results/models/adv", &at("adv")));
    run(&mut sweep_of(
        &format!("{},results/models/baseline", text(&moved)),
        &at("whole"),
    ));
    let merge = |args: &[&str], out: &Path| {
        let mut c = cli();
        c.arg("merge").args(args).arg("--out").arg(out);
        c.output().unwrap()
    };
    let (baseline, adv) = (text(&at("baseline")), text(&at("adv")));
    let rename = format!("results/models/adv={}", text(&moved));
    let models = format!("{},results/models/baseline", text(&moved));
    let o = merge(
        &[&baseline, &adv, "--rename", &rename, "--models", &models],
        &at("merged"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The same rows and examples, model names included, as the sweep of both run at once.
    assert_eq!(rows(&at("merged")), rows(&at("whole")));
    let examples = |d: &Path| std::fs::read_to_string(d.join("examples.csv")).unwrap();
    assert_eq!(examples(&at("merged")), examples(&at("whole")));
    // … and the merged folder is that sweep's own: running it again resumes, computing nothing.
    let o = sweep_of(&models, &at("merged")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(rows(&at("merged")), rows(&at("whole")));

    // A rename to a checkpoint with other weights is refused, and names them.
    let wrong = format!("results/models/adv={}", "results/models/baseline");
    let o = merge(&[&adv, "--rename", &wrong], &at("wrong"));
    assert_fails_with(&o, "weights");
    assert!(!at("wrong").exists());
    // So are sweeps with other settings than the models', naming the setting.
    let mut other = sweep_of("results/models/adv", &at("other"));
    run(other.args(["--seed", "5"]));
    let o = merge(&[&baseline, &text(&at("other"))], &at("mixed"));
    assert_fails_with(&o, "seed");
    // And a kept or renamed model that no folder swept.
    let o = merge(&[&baseline, "--models", "results/models/jem"], &at("none"));
    assert_fails_with(&o, "which no folder swept");
    let o = merge(
        &[&baseline, "--rename", "results/models/jem=x"],
        &at("none"),
    );
    assert_fails_with(
        &o,
        "--rename names results/models/jem, which no folder swept",
    );
    assert!(!at("none").exists());
}

/// `folder`'s sweep as if the backend `backend` had computed it: its settings and every row of
/// its cells name that backend, and the cells carry the identity of those settings.
fn as_if_swept_on(folder: &Path, backend: &str) {
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let path = folder.join("settings.json");
    let mut settings = read(&path);
    settings["backend"] = backend.into();
    std::fs::write(&path, settings.to_string()).unwrap();
    let identity = jem_bench::harness::sweep_identity(&settings);
    for entry in std::fs::read_dir(folder.join("cells")).unwrap() {
        let path = entry.unwrap().path();
        if common::is_cell_file(&path) {
            let mut cell = common::read_cell(&path);
            cell["identity"] = identity.clone().into();
            for row in cell["rows"].as_array_mut().unwrap() {
                row["backend"] = backend.into();
            }
            common::write_cell(&path, &cell);
        }
    }
}

/// Cells computed on another backend (a GPU's beside a CPU table) merge: each row keeps the
/// backend that computed it and settings.json names each model's; such a folder is no sweep's
/// own, so a sweep refuses to resume it (naming the backend), and it merges again as it is.
#[test]
fn sweeps_of_other_backends_merge_each_row_keeping_its_backend() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    let (baseline, adv) = ("results/models/baseline", "results/models/adv");
    run(&mut sweep_of(baseline, &at("baseline")));
    run(&mut sweep_of(adv, &at("adv")));
    let cpu = rows(&at("baseline"))[0].backend.clone();
    let gpu = "burn-cuda:0";
    assert_ne!(cpu, gpu);
    as_if_swept_on(&at("adv"), gpu);
    let merge = |folders: &[&Path], out: &Path| {
        let mut c = cli();
        c.arg("merge").args(folders).arg("--out").arg(out);
        c.output().unwrap()
    };
    let settings = |folder: &Path| -> serde_json::Value {
        let text = std::fs::read_to_string(folder.join("settings.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };

    let o = merge(&[&at("baseline"), &at("adv")], &at("merged"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged = settings(&at("merged"));
    assert_eq!(merged["backend"], "mixed");
    assert_eq!(merged["backends"], serde_json::json!([cpu, gpu]));
    // Every row is its folder's own, backend included.
    let mut expected = rows(&at("baseline"));
    expected.extend(rows(&at("adv")).into_iter().map(|mut r| {
        r.backend = gpu.to_string();
        r
    }));
    let key = |r: &TidyRow| (r.model.clone(), r.attack.clone(), r.k, r.eps.to_bits());
    let sorted = |mut v: Vec<TidyRow>| {
        v.retain(|r| r.attack != "worst-case");
        v.sort_by_key(key);
        v
    };
    assert_eq!(sorted(rows(&at("merged"))), sorted(expected));
    for r in rows(&at("merged")) {
        let want = if r.model == adv { gpu } else { cpu.as_str() };
        assert_eq!(r.backend, want, "{} {}", r.model, r.attack);
    }

    // A sweep of both models does not resume it: the backend differs.
    let o = sweep_of(&format!("{baseline},{adv}"), &at("merged"))
        .output()
        .unwrap();
    assert_fails_with(&o, "backend");
    // Merged again, alone, it stays what it is.
    let o = merge(&[&at("merged")], &at("again"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(rows(&at("again")), rows(&at("merged")));
    assert_eq!(settings(&at("again")), merged);
    // The other backend's folder alone, merged here: its backend, not this one's.
    let o = merge(&[&at("adv")], &at("gpu-only"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let gpu_only = settings(&at("gpu-only"));
    assert_eq!(gpu_only["backend"], gpu);
    assert!(gpu_only.get("backends").is_none(), "{gpu_only}");
}

#[test]
fn regress_passes_an_identical_sweep_and_names_a_doctored_cell() {
    let reference = tempfile::tempdir().unwrap();
    let o = sweep(reference.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let regress = |run: &Path| {
        cli()
            .args(["regress", "--tolerance", "0.02", "--reference"])
            .arg(reference.path())
            .arg("--run")
            .arg(run)
            .output()
            .unwrap()
    };
    assert!(regress(reference.path()).status.success());

    // Lower one cell's robust accuracy by one example (K=1, FGSM at ε=0.1) in a copy, its
    // interval with it, so that the row is a valid one that regressed.
    let doctored = tempfile::tempdir().unwrap();
    let mut rs = rows(reference.path());
    let target = rs
        .iter()
        .position(|r| r.attack == "fgsm" && r.k == 1 && r.eps == 0.1)
        .unwrap();
    let row = &mut rs[target];
    let robust = (row.robust_accuracy * row.n as f64).round() as usize;
    assert!(robust > 0, "nothing to lower: {row:?}");
    row.robust_accuracy = (robust - 1) as f64 / row.n as f64;
    (row.robust_lo, row.robust_hi) = jem_bench::harness::wilson(robust - 1, row.n);
    let mut w = csv::Writer::from_path(doctored.path().join("robust.csv")).unwrap();
    rs.iter().for_each(|r| w.serialize(r).unwrap());
    w.flush().unwrap();
    let o = regress(doctored.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("fgsm linf ε=0.1 K=1 grad=bpda") && err.contains("1 of 18"),
        "{err}"
    );
}

/// A `--run` whose cells were computed with other settings (fewer examples, fewer PGD steps)
/// than the reference's is refused, each difference named, even where its accuracies hold;
/// `--allow-other-settings` compares it anyway.
#[test]
fn regress_refuses_a_run_computed_with_other_settings() {
    let reference = tempfile::tempdir().unwrap();
    let o = sweep(reference.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let other = tempfile::tempdir().unwrap();
    let mut rs = rows(reference.path());
    for r in rs.iter_mut() {
        r.n /= 2;
        r.attack_settings = r.attack_settings.replace("\"steps\":4", "\"steps\":1");
    }
    let mut w = csv::Writer::from_path(other.path().join("robust.csv")).unwrap();
    rs.iter().for_each(|r| w.serialize(r).unwrap());
    w.flush().unwrap();
    let regress = |extra: &[&str]| {
        cli()
            .args(["regress", "--reference"])
            .arg(reference.path())
            .arg("--run")
            .arg(other.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let o = regress(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("other settings") && err.contains(": n "),
        "{err}"
    );
    assert!(err.contains("\"steps\":1"), "{err}");
    let o = regress(&["--allow-other-settings"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: comparing cells computed with other settings"),
        "{err}"
    );
}

/// Rows whose gradients through K > 0 SGLD steps were approximated by BPDA are upper bounds:
/// marked in robust.csv (`upper_bound`), in summary.json's curves and in the printed table;
/// CSVs written before the column read the same.
#[test]
fn bpda_rows_at_k_above_0_are_marked_as_upper_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let o = sweep(dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rs = rows(dir.path());
    assert!(rs.iter().any(|r| r.k == 1) && rs.iter().any(|r| r.k == 0));
    for r in &rs {
        assert_eq!(r.upper_bound, r.k > 0 && r.grad.name() == "bpda", "{r:?}");
    }
    let header = std::fs::read_to_string(dir.path().join("robust.csv")).unwrap();
    assert!(header.lines().next().unwrap().contains("upper_bound"));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("bpda*") && table.contains("an upper bound"),
        "{table}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    for c in summary["curves"].as_array().unwrap() {
        assert_eq!(c["upper_bound"], c["k"].as_u64().unwrap() > 0, "{c}");
    }
    // The committed reference predates the column: read as if written now.
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/reference/linf-small");
    let old = rows(&reference);
    assert!(old.iter().any(|r| r.upper_bound));
    assert!(old
        .iter()
        .all(|r| r.upper_bound == (r.k > 0 && r.grad.name() == "bpda")));
}

/// `report` rebuilds a sweep's summary and plots from its `robust.csv` alone; the plots are a
/// PNG that decodes and an SVG that parses, and both draw every model × K line in every panel.
#[test]
fn report_regenerates_valid_plots_and_summary_from_the_csv() {
    let dir = tempfile::tempdir().unwrap();
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/reference/linf-small");
    std::fs::copy(reference.join("robust.csv"), dir.path().join("robust.csv")).unwrap();
    let o = cli().arg("report").arg(dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("robust accuracy, per-example worst case over attacks"),
        "{table}"
    );

    // The summary's curves are the worst-case rows, never above any attack's row.
    let rs = rows(dir.path());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    let curves = summary["curves"].as_array().unwrap();
    let ks: Vec<usize> = {
        let mut k: Vec<usize> = rs.iter().map(|r| r.k).collect();
        k.sort();
        k.dedup();
        k
    };
    let mut models: Vec<&str> = rs.iter().map(|r| r.model.as_str()).collect();
    models.sort();
    models.dedup();
    assert_eq!(
        curves.len(),
        models.len() * ks.len(),
        "one curve per model × K"
    );
    for c in curves {
        let (model, k) = (
            c["model"].as_str().unwrap(),
            c["k"].as_u64().unwrap() as usize,
        );
        for point in c["worst_case"].as_array().unwrap() {
            let eps = point["eps"].as_f64().unwrap() as f32;
            let at = |r: &&TidyRow| r.model == model && r.k == k && r.eps == eps;
            let worst = rs
                .iter()
                .filter(at)
                .find(|r| r.attack == "worst-case")
                .unwrap();
            let lowest = rs
                .iter()
                .filter(at)
                .map(|r| r.robust_accuracy)
                .fold(f64::INFINITY, f64::min);
            let got = point["robust_accuracy"].as_f64().unwrap();
            assert_eq!(got, worst.robust_accuracy, "{model} K={k} ε={eps}");
            assert_eq!(
                got, lowest,
                "{model} K={k} ε={eps}: the worst case is the lowest row"
            );
            assert_eq!(point["interval"][0].as_f64().unwrap(), worst.robust_lo);
        }
    }

    // SVG: well-formed XML whose size matches the PNG's; in the first model's colour, one line
    // per K per panel (worst case + one panel per attack) plus its legend sample, the K = 1
    // lines dashed.
    let svg = std::fs::read_to_string(dir.path().join("curves.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("curves.svg parses as XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let size = |a: &str| root.attribute(a).unwrap().parse::<u32>().unwrap();
    let (width, height) = (size("width"), size("height"));
    let attacks = {
        let mut a: Vec<String> = rs
            .iter()
            .map(|r| r.attack.to_string())
            .filter(|a| *a != "worst-case")
            .collect();
        a.sort();
        a.dedup();
        a.len()
    };
    let series_lines: Vec<_> = doc
        .descendants()
        .filter(|n| {
            n.has_tag_name("polyline")
                && n.attribute("stroke") == Some("#1f77b4")
                && n.attribute("stroke-width") == Some("2.5")
        })
        .collect();
    assert_eq!(series_lines.len(), (attacks + 2) * ks.len());
    let dashed = series_lines
        .iter()
        .filter(|n| n.attribute("stroke-dasharray").is_some())
        .count();
    assert_eq!(dashed, (attacks + 2) * (ks.len() - 1));

    // PNG: decodes, same size, and the series colour is really painted.
    let file = std::fs::File::open(dir.path().join("curves.png")).unwrap();
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .expect("curves.png has a valid PNG header");
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).expect("curves.png decodes");
    assert_eq!((info.width, info.height), (width, height));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let painted = pixels.chunks(3).filter(|p| *p == [31, 119, 180]).count();
    assert!(painted > 1000, "only {painted} pixels of the series colour");
}

/// Sweeps record the sha256 of each model's weights: a checkpoint retrained under the same
/// path must neither resume an old sweep nor be "regressed" against a reference of other weights.
#[test]
fn sweeps_of_other_weights_under_the_same_path_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/models");
    for ext in ["safetensors", "json"] {
        std::fs::copy(
            root.join(format!("baseline.{ext}")),
            model.with_extension(ext),
        )
        .unwrap();
    }
    let out = dir.path().join("sweep");
    let small = |out: &Path| {
        let mut c = cli();
        c.args(common::TINY_FGSM_SWEEP)
            .args(["--n-examples", "4", "--models"])
            .arg(&model)
            .arg("--out")
            .arg(out);
        c.output().unwrap()
    };
    let o = small(&out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let settings = std::fs::read_to_string(out.join("settings.json")).unwrap();
    assert!(settings.contains("sha256:"), "{settings}");

    // Same path, other weights (the adversarially trained model has the same architecture).
    std::fs::copy(
        root.join("adv.safetensors"),
        model.with_extension("safetensors"),
    )
    .unwrap();
    let o = small(&out);
    assert_fails_with(&o, "other weights");
    let o = cli()
        .args(["regress", "--reference"])
        .arg(&out)
        .arg("--out")
        .arg(dir.path().join("rerun"))
        .output()
        .unwrap();
    assert_fails_with(&o, "other weights");
}

/// The worst case over attacks is per example: recomputed here from examples.csv alone (an
/// example is robust at ε only if every attack's clean pass got it right and no attack broke it
/// at any ε' ≤ ε), it equals the sweep's worst-case rows, which never rise with ε; every row's
/// interval contains its accuracy.
#[test]
fn worst_case_rows_equal_a_recomputation_from_the_examples() {
    let dir = tempfile::tempdir().unwrap();
    let o = cli()
        .args([
            "robust",
            "--models",
            "results/models/baseline,results/models/jem",
        ])
        .args([
            "--attacks",
            "pgd,fgsm",
            "--steps",
            "0",
            "--eps",
            "0,0.05,0.1,0.2",
        ])
        .args(["--n-examples", "12", "--pgd-steps", "3", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = rows(dir.path());
    let mut reader = csv::Reader::from_path(dir.path().join("examples.csv")).unwrap();
    let examples: Vec<jem_bench::harness::ExampleRow> =
        reader.deserialize().map(|r| r.unwrap()).collect();
    let worst: Vec<&TidyRow> = rows.iter().filter(|r| r.attack == "worst-case").collect();
    assert_eq!(worst.len(), 2 * 4, "a worst-case row per model and ε");
    for w in &worst {
        let mine: Vec<_> = examples
            .iter()
            .filter(|e| e.model == w.model && e.k == w.k)
            .collect();
        let ids: std::collections::BTreeSet<usize> = mine.iter().map(|e| e.example).collect();
        let robust = ids
            .iter()
            .filter(|&&i| {
                mine.iter()
                    .filter(|e| e.example == i)
                    .all(|e| e.clean_correct && !(e.adversarial && e.eps.unwrap() <= w.eps))
            })
            .count();
        assert_eq!(w.n, ids.len());
        assert_eq!(w.robust_accuracy, robust as f64 / ids.len() as f64, "{w:?}");
        // Never above the lowest per-attack row at the same ε.
        let lowest = rows
            .iter()
            .filter(|r| r.model == w.model && r.eps == w.eps && r.attack != "worst-case")
            .map(|r| r.robust_accuracy)
            .fold(f64::INFINITY, f64::min);
        assert!(w.robust_accuracy <= lowest);
    }
    for r in &rows {
        assert!(
            r.robust_lo <= r.robust_accuracy && r.robust_accuracy <= r.robust_hi,
            "{r:?}"
        );
        let later = rows.iter().filter(|o| {
            (&o.model, o.k, &o.grad, &o.attack) == (&r.model, r.k, &r.grad, &r.attack)
                && o.eps > r.eps
        });
        for o in later {
            assert!(
                o.robust_accuracy <= r.robust_accuracy,
                "{o:?} rises above {r:?}"
            );
        }
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    let check = summary["sanity_checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "robust accuracy does not rise with ε")
        .unwrap();
    assert_eq!(check["status"], "pass", "{check}");
}

/// `--save-adversarials` keeps what each cell returned: the inputs lie within ε of the clean
/// images, and their flags are those of examples.csv; the probe marks K > 0 (SGLD noise) as
/// stochastic and K = 0 as not.
#[test]
fn saved_adversarials_match_the_cells_and_stochastic_models_are_flagged() {
    let dir = tempfile::tempdir().unwrap();
    let o = cli()
        .args([
            "robust",
            "--models",
            "results/models/baseline",
            "--attacks",
            "fgsm",
        ])
        .args([
            "--steps",
            "0,1",
            "--eps",
            "0,0.2",
            "--n-examples",
            "6",
            "--chains",
            "2",
        ])
        .args(["--recheck-chains", "2", "--save-adversarials", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The cell's ε = 0.2 run: `<cell id>.eps0.2`, the id readable and ending in a digest.
    let file = std::fs::read_dir(dir.path().join("adversarials"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|name| {
            name.starts_with("results_models_baseline.fgsm.k0.none.")
                && name.ends_with(".eps0.2.safetensors")
        })
        .expect("the cell's adversarials at ε 0.2");
    let stem = file.strip_suffix(".safetensors").unwrap().to_string();
    let bytes = std::fs::read(dir.path().join("adversarials").join(&file)).unwrap();
    // The file records whose adversarials it holds.
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let recorded = header.metadata().as_ref().expect("metadata");
    let whose: serde_json::Value = serde_json::from_str(&recorded["cell"]).unwrap();
    assert_eq!(
        (
            whose["model"].as_str(),
            whose["attack"].as_str(),
            whose["k"].as_u64()
        ),
        (Some("results/models/baseline"), Some("fgsm"), Some(0))
    );
    assert_eq!(recorded["eps"], "0.2");
    assert!(recorded["sweep"].starts_with("sha256:"), "{recorded:?}");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        st.tensor(name)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let (inputs, clean) = (f32s("inputs"), f32s("clean"));
    assert_eq!(st.tensor("inputs").unwrap().shape(), [6, 1, 28, 28]);
    let flags = st.tensor("adversarial").unwrap().data().to_vec();
    let mut reader = csv::Reader::from_path(dir.path().join("examples.csv")).unwrap();
    let expected: Vec<u8> = reader
        .deserialize::<jem_bench::harness::ExampleRow>()
        .map(|r| r.unwrap())
        .filter(|r| r.k == 0 && r.eps == Some(0.2))
        .map(|r| u8::from(r.adversarial))
        .collect();
    assert_eq!(flags, expected);
    assert!(
        flags.contains(&1),
        "FGSM at 0.2 breaks some of the baseline's digits"
    );
    for (a, c) in inputs.iter().zip(&clean) {
        assert!((a - c).abs() <= 0.2 + 1e-6 && (0.0..=1.0).contains(a));
    }
    assert!(dir.path().join(format!("adversarials/{stem}.png")).exists());
    for r in rows(dir.path()).iter().filter(|r| r.attack == "fgsm") {
        assert_eq!(r.stochastic, r.k > 0, "{r:?}");
        assert!(
            r.defence.contains("\"chains\":2") == (r.k > 0),
            "{}",
            r.defence
        );
    }
}

/// `--attacks autoattack` runs AutoAttack's four attacks as a cascade, under L∞ and L2: each
/// stage's row holds the joint outcome of it and the stages before (so it never rises above
/// them), an example broken by a stage counts as broken in every later stage at no further
/// cost, FAB-T's single run is paid once per example, and the worst case is the last stage.
#[test]
fn autoattack_runs_its_attacks_as_a_cascade_on_what_is_left_standing() {
    for (norm, eps) in [("linf", "0,0.1,0.2"), ("l2", "0,1,2")] {
        let dir = tempfile::tempdir().unwrap();
        let o = cli()
            .args([
                "robust",
                "--norm",
                norm,
                "--models",
                "results/models/baseline",
            ])
            .args(["--attacks", "autoattack", "--steps", "0", "--eps", eps])
            .args(["--n-examples", "8", "--apgd-iterations", "8"])
            .args(["--fab-iterations", "8", "--square-queries", "60", "--out"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = rows(dir.path());
        let stages = ["apgd-ce", "apgd-t", "fab-t", "square"].map(|a| format!("autoattack/{a}"));
        let mut reader = csv::Reader::from_path(dir.path().join("examples.csv")).unwrap();
        let examples: Vec<jem_bench::harness::ExampleRow> =
            reader.deserialize().map(|r| r.unwrap()).collect();
        for e in eps.split(',').map(|e| e.parse::<f32>().unwrap()) {
            let at = |attack: &str| {
                rows.iter()
                    .find(|r| r.attack == attack && r.eps == e)
                    .unwrap_or_else(|| panic!("{norm}: no {attack} row at ε {e}"))
                    .robust_accuracy
            };
            let joint: Vec<f64> = stages.iter().map(|s| at(s)).collect();
            assert!(
                joint.windows(2).all(|w| w[1] <= w[0]),
                "{norm} ε {e}: {joint:?}"
            );
            assert_eq!(at("worst-case"), joint[3], "{norm} ε {e}");
            for i in 0..8 {
                let of = |s: &str| {
                    examples
                        .iter()
                        .find(|x| x.attack == s && x.example == i && x.eps == Some(e))
                        .unwrap()
                };
                for w in stages.windows(2) {
                    let (before, after) = (of(&w[0]), of(&w[1]));
                    if before.adversarial {
                        assert!(after.adversarial, "{norm} ε {e} example {i}: {after:?}");
                        assert_eq!((after.gradient_evals, after.forward_evals), (0, 0));
                    }
                }
            }
        }
        for i in 0..8 {
            let charged = examples
                .iter()
                .filter(|x| {
                    x.attack == stages[2].as_str() && x.example == i && x.gradient_evals > 0
                })
                .count();
            assert!(
                charged <= 1,
                "{norm}: FAB-T paid {charged} times for example {i}"
            );
        }
    }
}

#[test]
fn batches_count_every_example_once_and_one_batch_changes_nothing() {
    let whole = tempfile::tempdir().unwrap();
    run(&mut sweep(whole.path()));
    // One batch as large as the set: the same computation, the same seeds, the same rows.
    let one = tempfile::tempdir().unwrap();
    run(sweep(one.path()).args(["--batch-size", "6"]));
    assert_eq!(rows(one.path()), rows(whole.path()));

    // Batches of 4 and 2: every example counted once, clean results untouched, and FGSM at
    // K = 0 (no randomness) the same example by example.
    let split = tempfile::tempdir().unwrap();
    run(sweep(split.path()).args(["--batch-size", "4"]));
    let (a, b) = (rows(whole.path()), rows(split.path()));
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(&b) {
        assert_eq!((&a.attack, a.k, a.eps, b.n), (&b.attack, b.k, b.eps, 6));
        assert_eq!(a.clean_accuracy, b.clean_accuracy, "{} K={}", a.attack, a.k);
        if a.eps == 0.0 || (a.attack == "fgsm" && a.k == 0) {
            assert_eq!(
                a.robust_accuracy, b.robust_accuracy,
                "{} K={} ε={}",
                a.attack, a.k, a.eps
            );
        }
    }
    let settings = std::fs::read_to_string(split.path().join("settings.json")).unwrap();
    assert!(settings.contains("\"batch_size\": 4"), "{settings}");
    // Each batch was kept while its cell ran; a finished cell leaves only its own file.
    let leftovers: Vec<_> = std::fs::read_dir(split.path().join("cells"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| !name.ends_with(".json.gz"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let o = sweep(tempfile::tempdir().unwrap().path())
        .args(["--batch-size", "0"])
        .output()
        .unwrap();
    assert_fails_with(&o, "--batch-size: expected at least 1");
}

/// With no attack flags a sweep is adaptive: AutoAttack's cascade at K = 0; at K > 0 its
/// version for randomised defences with gradients through the SGLD steps, EOT for 20 noise
/// samples per gradient, and a convergence check on the survivors; its time estimated up front.
#[test]
fn the_default_sweep_is_adaptive_and_checks_its_convergence() {
    let dir = tempfile::tempdir().unwrap();
    // The WRN-10-1 JEM: the same defence at a quarter of the default WRN-10-2 JEM's cost.
    let o = cli()
        .args(["robust", "--models", "results/models/jem-ce1000"])
        .args(["--steps", "0,1"])
        .args([
            "--eps",
            "0,0.05",
            "--n-examples",
            "4",
            "--apgd-iterations",
            "3",
        ])
        .args([
            "--fab-iterations",
            "2",
            "--square-queries",
            "10",
            "--chains",
            "2",
        ])
        .args([
            "--recheck-chains",
            "2",
            "--convergence-sample",
            "2",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // Said before the gradients are timed and the pilots run, then the estimate.
    let estimating = err.find("2 cells to run; estimating their time first");
    let estimate = err.find("2 cells to run, ");
    assert!(
        estimating.is_some() && estimating < estimate && err.contains("at most"),
        "{err}"
    );
    // The estimate is kept beside the results, cell by cell, to set against their times.
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("estimate.json")).unwrap())
            .unwrap();
    let cells = kept["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{kept}");
    for cell in cells {
        let (alone, most) = (
            cell["seconds_alone"].as_f64().unwrap(),
            cell["bound_alone"].as_f64().unwrap(),
        );
        assert!(alone > 0.0 && alone <= most + 1e-9, "{cell}");
        assert!(
            cell["expected_seconds"].as_f64().unwrap() >= alone - 1e-9,
            "{cell}"
        );
        // What it is made of: the 4 examples' gradients (attack and convergence check) times
        // the seconds each takes.
        let part = |what: &str, of: &str| cell[what][of].as_f64().unwrap();
        let made_of = 4.0
            * (part("gradients_per_example", "attack") * part("seconds_per_gradient", "attack")
                + part("gradients_per_example", "convergence_check")
                    * part("seconds_per_gradient", "convergence_check"));
        assert!((made_of - alone).abs() <= 1e-6 * alone, "{cell}");
    }
    assert!(
        kept["bound_seconds"].as_f64() >= kept["expected_seconds"].as_f64(),
        "{kept}"
    );

    let rs = rows(dir.path());
    let attacks = |k: usize| -> Vec<String> {
        let mut a: Vec<String> = rs
            .iter()
            .filter(|r| r.k == k && r.attack != "worst-case")
            .map(|r| r.attack.to_string())
            .collect();
        a.dedup();
        a
    };
    assert_eq!(
        attacks(0),
        [
            "autoattack/apgd-ce",
            "autoattack/apgd-t",
            "autoattack/fab-t",
            "autoattack/square"
        ]
    );
    assert_eq!(
        attacks(1),
        ["autoattack-rand/apgd-ce", "autoattack-rand/apgd-dlr"]
    );
    for r in rs.iter().filter(|r| r.attack != "worst-case") {
        let gradient = !r.attack.to_string().ends_with("square");
        let (grad, eot) = match r.k {
            0 => ("none", if gradient { 1 } else { 0 }),
            // ⌈20 / 2 chains⌉ draws.
            _ => ("full", 10),
        };
        assert_eq!((r.grad.name(), r.eot), (grad, eot), "{r:?}");
        assert!(!r.upper_bound);
    }
    let settings = std::fs::read_to_string(dir.path().join("settings.json")).unwrap();
    let settings: serde_json::Value = serde_json::from_str(&settings).unwrap();
    assert_eq!(settings["eot_at_k"], serde_json::json!([[0, 1], [1, 10]]));

    // The check ran on the last stage of the stochastic cell, on up to 2 survivors per ε > 0.
    for r in &rs {
        let survivors = (r.robust_accuracy * r.n as f64).round() as usize;
        let checked = r.k == 1 && r.attack == "autoattack-rand/apgd-dlr" && r.eps > 0.0;
        let expected = (checked && survivors > 0).then_some(survivors.min(2));
        assert_eq!(r.check_sampled, expected, "{r:?}");
        if let (Some(s), Some(b)) = (r.check_sampled, r.check_broken) {
            assert!(
                b <= s
                    && b >= r
                        .check_broken_eot
                        .unwrap()
                        .max(r.check_broken_iterations.unwrap())
            );
        }
    }
    let summary = std::fs::read_to_string(dir.path().join("summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    let listed = summary["convergence_checks"].as_array().unwrap().len();
    assert_eq!(
        listed,
        rs.iter().filter(|r| r.check_sampled.is_some()).count()
    );
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("more EOT draws and iterations do not lower robust accuracy"),
        "{table}"
    );
}

/// `report` over sweeps that together hold three or more K draws robust accuracy against K,
/// one line per model and ε, and writes it as CSV; two K are no such curve.
#[test]
fn report_draws_robust_accuracy_against_k() {
    let sweep_at = |steps: &str, dir: &Path| {
        let o = cli()
            .args([
                "robust",
                "--models",
                "results/models/jem",
                "--attacks",
                "fgsm",
            ])
            .args(["--grad", "bpda", "--steps", steps, "--eps", "0,0.1"])
            .args([
                "--n-examples",
                "4",
                "--chains",
                "2",
                "--recheck-chains",
                "2",
            ])
            .args(["--convergence-sample", "0", "--out"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (low, high, joined) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    sweep_at("0,1", low.path());
    sweep_at("2", high.path());
    assert!(!low.path().join("k-curve.csv").exists());
    let o = cli()
        .arg("report")
        .args([low.path(), high.path()])
        .arg("--out")
        .arg(joined.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(joined.path().join("k-curve.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "model,norm,eps,k,grad,n,robust_accuracy,robust_lo,robust_hi,upper_bound"
    );
    // One line per K at ε = 0.1, in order of K, each the worst case of its sweep.
    let ks: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').nth(3).unwrap())
        .collect();
    assert_eq!(ks, ["0", "1", "2"], "{csv}");
    for (line, dir, k) in [(lines[2], &low, 1), (lines[3], &high, 2)] {
        let worst = rows(dir.path())
            .into_iter()
            .find(|r| r.attack == "worst-case" && r.k == k && r.eps == 0.1)
            .unwrap();
        let robust: f64 = line.split(',').nth(6).unwrap().parse().unwrap();
        assert_eq!(robust, worst.robust_accuracy, "{line}");
        assert!(
            line.ends_with(",true"),
            "BPDA at K > 0 is an upper bound: {line}"
        );
    }
    assert!(
        joined.path().join("k-curve.svg").exists() && joined.path().join("k-curve.png").exists()
    );
}

/// A convergence check interrupted mid-way resumes from the parts it kept: a part found in the
/// cell's batch folder is read back, not computed again — in a cell run in batches and in one
/// run whole alike (an unbatched cell's check can take hours too). A re-attack is kept in parts
/// of a quarter of a batch's examples at 4× the EOT draws (rounded up: 1 of a 4-example batch,
/// 2 of the unbatched 6). (The parts here are doctored to say every sampled survivor broke,
/// which no rerun would compute, so the cell's record shows whether they were read, and to have
/// taken far longer than the run, so that the cell's time shows that it counts them; the
/// attack's kept batches are doctored to have taken long too, each written with the digest a
/// genuine part would carry.) A part of another size, as a jem-bench that cut the check
/// otherwise kept it, is refused by name. The resumed run's estimate leaves out the parts it
/// reads back (the batches, at the shares they recorded).
#[test]
fn an_interrupted_convergence_check_resumes_from_its_kept_parts() {
    for (batching, part_len) in [(&["--batch-size", "4"][..], 1), (&[], 2)] {
        interrupted_convergence_check_resumes(batching, part_len);
    }
}

fn interrupted_convergence_check_resumes(batching: &[&str], part_len: usize) {
    let dir = tempfile::tempdir().unwrap();
    let sweep = || {
        let mut c = cli();
        c.args([
            "robust",
            "--models",
            "results/models/baseline",
            "--attacks",
            "pgd",
        ])
        .args([
            "--steps",
            "1",
            "--grad",
            "bpda",
            "--eps",
            "0,0.1",
            "--n-examples",
            "6",
        ])
        .args(["--pgd-steps", "2", "--chains", "2", "--recheck-chains", "3"])
        .args(CHEAP_STOCHASTIC_CELLS)
        .args(batching)
        .arg("--out")
        .arg(dir.path());
        c
    };
    run(&mut sweep());
    let cells = dir.path().join("cells");
    let file = std::fs::read_dir(&cells)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| common::is_cell_file(p))
        .expect("the cell's file");
    let cell = common::read_cell(&file);
    let (sampled, broken_eot) = checked(&cell);
    let sampled = sampled.expect("a stochastic cell is checked") as usize;
    assert!(sampled > 0 && broken_eot < Some(sampled as u64), "{cell}");

    // As if killed during the check: the cell's file gone, its batch folder holding the first
    // re-attack (4× EOT at ε 0.1), doctored.
    std::fs::remove_file(&file).unwrap();
    let kept = cells.join(format!("{}.batches", common::cell_id(&file)));
    std::fs::create_dir_all(kept.join("convergence")).unwrap();
    // The first re-attack's parts come first: ε 0.1 is the grid's only ε > 0.
    let parts = sampled.div_ceil(part_len);
    let part = |j: usize| kept.join(format!("convergence/{j}.json"));
    const PART_SECONDS: f64 = 100_000.0;
    let doctored = |j: usize, len: usize| {
        let broken = vec![true; len];
        envelope(
            &cell,
            "convergence-check",
            j,
            serde_json::json!({ "broken": broken, "seconds": PART_SECONDS }),
        )
    };
    // One outcome too many in the last part: refused before any part of the check runs.
    for j in 0..parts {
        let len = part_len.min(sampled - j * part_len);
        std::fs::write(part(j), doctored(j, len + usize::from(j + 1 == parts))).unwrap();
    }
    let out = sweep().output().unwrap();
    assert_fails_with(&out, &format!("convergence/{}.json", parts - 1));
    assert_fails_with(&out, "delete the file");
    for j in 0..parts {
        std::fs::write(part(j), doctored(j, part_len.min(sampled - j * part_len))).unwrap();
    }
    // The attack's batches the refused run kept, doctored to have taken far longer too.
    const BATCH_SECONDS: f64 = 200_000.0;
    let batches = doctor_batches(&kept, &cell, BATCH_SECONDS);
    assert!(batches >= 1, "the refused run kept the attack's batches");
    let out = sweep().output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Each part read back is reported as such (it leaves the time to run, not the time run):
    // the check's doctored parts, and the attack's batches the refused run kept.
    let read_back = |what: &str| {
        err.lines()
            .filter(|l| l.contains(what) && l.contains(" read back (kept by an earlier run)"))
            .count()
    };
    assert_eq!(read_back(": convergence check "), parts, "{err}");
    assert!(read_back(": attack") >= 1, "{err}");
    // The estimate is of what is left: the attack's batches are left out (at the share each
    // recorded), the check's parts doctored without one are not, and it says so.
    assert!(
        err.contains("the parts an earlier run kept left out"),
        "{err}"
    );
    let estimate: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("estimate.json")).unwrap())
            .unwrap();
    let only = &estimate["cells"][0];
    let kept_share = only["kept_by_an_earlier_run"].as_f64().unwrap();
    assert!(kept_share > 0.0 && kept_share < 1.0, "{estimate}");
    let (alone, left) = (
        only["seconds_alone"].as_f64().unwrap(),
        only["expected_seconds"].as_f64().unwrap(),
    );
    assert!(
        (left - alone * (1.0 - kept_share)).abs() <= 1e-9 * alone,
        "{estimate}"
    );
    assert_eq!(
        estimate["expected_seconds"].as_f64(),
        Some(left),
        "{estimate}"
    );
    let resumed = common::read_cell(&file);
    assert_eq!(
        checked(&resumed),
        (Some(sampled as u64), Some(sampled as u64)),
        "{batching:?}"
    );
    assert!(
        !kept.exists(),
        "the batch folder is removed once the cell is written"
    );
    // The cell's time: what the kept batches and parts took and this run's seconds.
    let timed = parts as f64 * PART_SECONDS + batches as f64 * BATCH_SECONDS;
    let seconds = resumed["seconds"].as_f64().unwrap();
    assert!(
        (timed..timed + 3_600.0).contains(&seconds),
        "{seconds} s, where the kept batches and parts took {timed} s"
    );
}

/// A checked cell's convergence check at ε 0.1: examples sampled, and broken with more EOT.
fn checked(cell: &serde_json::Value) -> (Option<u64>, Option<u64>) {
    let row = cell["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| (r["eps"].as_f64().unwrap() - 0.1).abs() < 1e-6)
        .unwrap()
        .clone();
    (
        row["check_sampled"].as_u64(),
        row["check_broken_eot"].as_u64(),
    )
}

/// A kept part of `cell` as jem-bench writes it: bound to its sweep, cell, kind and index, with
/// a digest of its content (so a doctored part is written as a genuine one would be).
fn envelope(cell: &serde_json::Value, kind: &str, index: usize, part: serde_json::Value) -> String {
    serde_json::json!({
        "sweep": cell["identity"],
        "cell": cell["cell"],
        "kind": kind,
        "index": index,
        "digest": jem_bench::digest::of(part.to_string().as_bytes()),
        "part": part,
    })
    .to_string()
}

/// Rewrites every attack batch kept in `kept` as having taken `seconds`; how many there were.
fn doctor_batches(kept: &std::path::Path, cell: &serde_json::Value, seconds: f64) -> usize {
    let mut batches = 0;
    for entry in std::fs::read_dir(kept).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|x| x == "json") {
            let batch: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let mut part = batch["part"].clone();
            part["seconds"] = serde_json::json!(seconds);
            let index = batch["index"].as_u64().unwrap() as usize;
            let mut doctored: serde_json::Value =
                serde_json::from_str(&envelope(cell, "attack-batch", index, part)).unwrap();
            // Its share of the cell's cost, as jem-bench recorded it.
            doctored["share"] = batch["share"].clone();
            std::fs::write(&path, doctored.to_string()).unwrap();
            batches += 1;
        }
    }
    batches
}

/// Models whose paths read alike once made file-safe (`a/b/m`, `a_b/m` and `a b/m`; `α/m` and
/// `β/m`) each keep their own results, files and saved adversarials, with one worker and with
/// two: every model's rows in the sweep of all five equal its rows swept alone. (Cells of such
/// models once shared a file name, and the second model was credited with the first's batch.)
#[test]
fn models_whose_paths_read_alike_keep_their_own_results() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let models: Vec<(String, &str)> = [
        ("X/a/b/m", "baseline"),
        ("X/a_b/m", "adv"),
        ("X/a b/m", "jem"),
        ("X/α/m", "adv"),
        ("X/β/m", "baseline"),
    ]
    .into_iter()
    .map(|(path, source)| {
        let at = root.join(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        for ext in ["safetensors", "json"] {
            let from = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("results/models/{source}.{ext}"));
            std::fs::copy(from, at.with_extension(ext)).unwrap();
        }
        (at.display().to_string(), source)
    })
    .collect();
    let sweep = |models: &str, out: &Path, jobs: &str| {
        let mut c = cli();
        c.args([
            "robust",
            "--models",
            models,
            "--attacks",
            "pgd",
            "--pgd-steps",
            "5",
            "--steps",
            "0",
            "--eps",
            "0,0.3",
            "--n-examples",
            "10",
            "--batch-size",
            "5",
            "--save-adversarials",
            "--jobs",
            jobs,
            "--out",
        ])
        .arg(out);
        run(&mut c);
        rows(out)
    };
    let adversarials = |out: &Path| std::fs::read_dir(out.join("adversarials")).unwrap().count();
    let alone: Vec<(Vec<TidyRow>, usize)> = models
        .iter()
        .enumerate()
        .map(|(i, (m, _))| {
            let out = root.join(format!("alone{i}"));
            (sweep(m, &out, "1"), adversarials(&out))
        })
        .collect();
    // The adversarially trained copies hold at ε 0.3 where the baseline's break: the sweeps
    // alone tell the models apart, so a result credited to the wrong model shows.
    let at_03 = |rows: &[TidyRow]| {
        rows.iter()
            .find(|r| r.eps == 0.3 && r.attack == "pgd")
            .unwrap()
            .robust_accuracy
    };
    assert!(at_03(&alone[1].0) > at_03(&alone[0].0) + 0.5, "{alone:?}");
    let all: Vec<&str> = models.iter().map(|(m, _)| m.as_str()).collect();
    for jobs in ["1", "2"] {
        let out = root.join(format!("all-jobs{jobs}"));
        let together = sweep(&all.join(","), &out, jobs);
        for ((m, source), (rows_alone, _)) in models.iter().zip(&alone) {
            let mine: Vec<&TidyRow> = together.iter().filter(|r| &r.model == m).collect();
            assert_eq!(mine.len(), rows_alone.len(), "{m}");
            for (a, b) in mine.iter().zip(rows_alone) {
                assert_eq!(
                    (a.robust_accuracy, a.clean_accuracy, a.n),
                    (b.robust_accuracy, b.clean_accuracy, b.n),
                    "{m} (a copy of {source}) with --jobs {jobs}: {} ε={}",
                    a.attack,
                    a.eps
                );
            }
        }
        // One cell file and one set of saved adversarials per model.
        let cells = std::fs::read_dir(out.join("cells")).unwrap().count();
        assert_eq!(cells, models.len(), "--jobs {jobs}");
        let saved: usize = alone.iter().map(|(_, n)| n).sum();
        assert_eq!(adversarials(&out), saved, "--jobs {jobs}");
    }
}

/// A quick look marks every row as an upper bound in robust.csv and in the table, ends with
/// the full evaluation's estimated time, and is refused as a reference.
#[test]
fn a_quick_look_marks_its_rows_as_upper_bounds_and_is_no_reference() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("quick");
    let o = cli()
        .args([
            "robust",
            "--quick",
            "--models",
            "results/models/baseline",
            "--steps",
            "0",
            "--eps",
            "0,0.1",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let written = rows(&out);
    assert!(!written.is_empty());
    for row in &written {
        assert!(row.upper_bound, "{row:?}");
        assert_eq!(
            (row.n, row.attack.to_string().as_str()),
            (
                20,
                if row.attack == "worst-case" {
                    "worst-case"
                } else {
                    "apgd-ce"
                }
            )
        );
    }
    assert!(
        table.contains("none*") && table.contains("a quick look (--quick)"),
        "{table}"
    );
    let last = table
        .lines()
        .rev()
        .find(|l| l.contains("full evaluation"))
        .expect(&table);
    assert!(
        last.contains("jem-bench robust --norm linf") && last.contains("at most"),
        "{last}"
    );
    let o = cli()
        .args(["regress", "--reference"])
        .arg(&out)
        .arg("--run")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("is a quick look"),
        "{err}"
    );
}

/// Finished cells are stored gzip-compressed; the uncompressed file an earlier jem-bench wrote
/// is refused by name with what to do (`gzip` it), and once compressed it is reused as it is.
#[test]
fn an_uncompressed_cell_file_is_named_and_reused_once_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = |out: &Path| {
        let mut c = cli();
        c.args(common::TINY_FGSM_SWEEP)
            .args(["--models", "results/models/baseline", "--n-examples", "4"])
            .arg("--out")
            .arg(out);
        c
    };
    run(&mut tiny(dir.path()));
    let before = std::fs::read_to_string(dir.path().join("robust.csv")).unwrap();
    let file = std::fs::read_dir(dir.path().join("cells"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| common::is_cell_file(p))
        .expect("the cell's file");
    let cell = common::read_cell(&file);
    let uncompressed = file.with_extension("");
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&uncompressed, cell.to_string()).unwrap();
    let o = tiny(dir.path()).output().unwrap();
    assert_fails_with(
        &o,
        "an uncompressed cell file of an earlier jem-bench; `gzip` it",
    );
    std::fs::remove_file(&uncompressed).unwrap();
    common::write_cell(&file, &cell);
    let o = tiny(dir.path()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ran 0 cells"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("robust.csv")).unwrap(),
        before
    );
}

/// A sweep folder records its layout (`format`), which every command that reads the folder
/// checks first: one of another layout (a newer jem-bench's, or none recorded) is refused by
/// the field, never resumed, reported, merged or compared as this one.
#[test]
fn a_sweep_folder_of_another_format_is_refused_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("sweep");
    run(&mut sweep_of("results/models/baseline", &folder));
    let path = folder.join("settings.json");
    let original = std::fs::read_to_string(&path).unwrap();
    let settings: serde_json::Value = serde_json::from_str(&original).unwrap();
    assert_eq!(settings["format"], jem_bench::harness::SWEEP_FORMAT);
    for (format, why) in [
        (
            serde_json::json!(jem_bench::harness::SWEEP_FORMAT + 1),
            "newer jem-bench",
        ),
        (serde_json::Value::Null, "another layout"),
    ] {
        let mut other = settings.clone();
        match format {
            serde_json::Value::Null => other.as_object_mut().unwrap().remove("format"),
            f => other.as_object_mut().unwrap().insert("format".into(), f),
        };
        std::fs::write(&path, other.to_string()).unwrap();
        let report = || {
            let mut c = cli();
            c.arg("report")
                .arg(&folder)
                .arg("--out")
                .arg(dir.path().join("r"));
            c
        };
        let merge = || {
            let mut c = cli();
            c.arg("merge")
                .arg(&folder)
                .arg("--out")
                .arg(dir.path().join("m"));
            c
        };
        let regress = || {
            let mut c = cli();
            c.arg("regress").arg("--reference").arg(&folder);
            c.arg("--run").arg(&folder);
            c
        };
        for mut command in [
            sweep_of("results/models/baseline", &folder),
            report(),
            merge(),
            regress(),
        ] {
            let o = command.output().unwrap();
            assert_fails_with(&o, "field `format`");
            assert_fails_with(&o, why);
        }
    }
    // Restored, the folder is this version's again: the sweep resumes with nothing to run.
    std::fs::write(&path, &original).unwrap();
    run(&mut sweep_of("results/models/baseline", &folder));
}
