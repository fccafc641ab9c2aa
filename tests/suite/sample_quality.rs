//! The sample-quality judge of `jem-bench sample`: its verdict on real test digits and on
//! uniform noise, checked against the judge's own forward pass and against each other, and
//! the command's flags and bad input.

use std::path::Path;
use std::process::Command;

use burn::tensor::activation::softmax;
use burn::tensor::{Tensor, TensorData};
use jem_bench::backend::{self, Inference};
use jem_bench::batches;
use jem_bench::model::Checkpoint;
use jem_bench::sample::quality::Judge;
use jem_datasets::{embedded, DataSource, Split};
use rand::{Rng, SeedableRng};

const BASELINE: &str = "results/models/baseline";

fn judge() -> Judge<Inference> {
    Judge::load(BASELINE, "mnist", [1, 28, 28], 10, &backend::device()).unwrap()
}

#[test]
fn test_digits_pass_and_noise_fails() {
    let test = embedded::mnist(Split::Test).unwrap();
    let source = DataSource::parse("mnist").unwrap();
    let n = 300;
    let pixels = test.images[..n * test.image_len()].to_vec();
    let labels: Vec<usize> = test.labels[..n].iter().map(|&l| l as usize).collect();
    let classes: Vec<usize> = (0..10).collect();
    let digits = judge()
        .assess(&pixels, &labels, &classes, &source, 10_000, 0.9)
        .unwrap();

    // The fraction is the judge's own forward pass, counted independently.
    let (model, _) = Checkpoint::at(BASELINE)
        .load::<Inference>(&backend::device())
        .unwrap();
    let x = Tensor::<Inference, 4>::from_data(
        TensorData::new(pixels.clone(), [n, 1, 28, 28]),
        &backend::device(),
    );
    let probs = batches::to_vec(softmax(model.forward(x), 1));
    let hits = (0..n).filter(|&i| probs[i * 10 + labels[i]] >= 0.9).count();
    assert_eq!(digits.confident_fraction, hits as f64 / n as f64);
    assert!(digits.confident_fraction > 0.95, "{digits:?}");
    assert_eq!(digits.samples, n);
    assert_eq!(digits.feature_dim, 64);
    assert_eq!(digits.reference, "mnist/test, first 10000 images");
    // Per class: each class's share, and together the overall fraction.
    let per_class: f64 = (0..10)
        .map(|c| {
            let count = labels.iter().filter(|&&l| l == c).count();
            digits.confident_fraction_per_class[c] * count as f64
        })
        .sum();
    assert!((per_class / n as f64 - digits.confident_fraction).abs() < 1e-12);

    // Test digits sit as close to the test set as training digits do; noise far away.
    let floor = digits.frechet_distance_train_images;
    assert!(floor > 0.0);
    assert!(
        digits.frechet_distance < 2.0 * floor && floor < 2.0 * digits.frechet_distance,
        "test digits {} against training digits {floor}",
        digits.frechet_distance
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let noise: Vec<f32> = (0..pixels.len())
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let judged = judge()
        .assess(&noise, &labels, &classes, &source, 10_000, 0.9)
        .unwrap();
    assert_eq!(judged.frechet_distance_train_images, floor);
    assert!(
        judged.frechet_distance > 50.0 * floor,
        "noise {} against {floor}",
        judged.frechet_distance
    );
    assert!(judged.confident_fraction < 0.5, "{judged:?}");
}

#[test]
fn pixels_that_do_not_match_the_labels_and_too_few_samples_are_refused() {
    let test = embedded::mnist(Split::Test).unwrap();
    let source = DataSource::parse("mnist").unwrap();
    let classes: Vec<usize> = (0..10).collect();
    let pixels = test.images[..3 * test.image_len()].to_vec();
    // Three images for two labels: the judge's shape says how many pixels two images have.
    let e = judge()
        .assess(&pixels, &[0, 1], &classes, &source, 100, 0.9)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the judge got 2352 pixels for 2 labels: expected 1568 (2 images of [1, 28, 28])"
    );
    let e = judge()
        .assess(
            &pixels[..test.image_len()],
            &[0],
            &classes,
            &source,
            100,
            0.9,
        )
        .unwrap_err();
    assert!(e.to_string().contains("at least 2"), "{e}");
    let e = judge()
        .assess(&[], &[], &classes, &source, 100, 0.9)
        .unwrap_err();
    assert!(e.to_string().contains("got 0 samples"), "{e}");
}

fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_jem-bench"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

#[test]
fn the_command_records_the_verdict_and_refuses_bad_judges_before_sampling() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.png");
    let common = [
        "sample",
        "--model",
        "results/models/jem",
        "--steps",
        "2",
        "--reference-images",
        "500",
    ];
    // Runs `sample` with `extra` flags into `out` and returns its JSON record.
    let record_of = |extra: &[&str], out: &Path| -> serde_json::Value {
        let o = cli()
            .args(common)
            .args(extra)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&std::fs::read(out.with_extension("json")).unwrap()).unwrap()
    };
    let record = record_of(&["--per-class", "3"], &out);
    let q = &record["quality"];
    assert_eq!(q["judge"], BASELINE);
    assert_eq!(q["samples"], 30);
    assert_eq!(q["reference"], "mnist/test, first 500 images");
    let overall = q["confident_fraction"].as_f64().unwrap();
    let per_class: Vec<f64> = record["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["judge_confident"].as_f64().unwrap())
        .collect();
    let mean = per_class.iter().sum::<f64>() / per_class.len() as f64;
    assert!((mean - overall).abs() < 1e-12, "{mean} against {overall}");
    assert!(q["frechet_distance"].as_f64().unwrap().is_finite());

    // --judge none: no verdict.
    let record = record_of(
        &["--per-class", "3", "--judge", "none"],
        &dir.path().join("none.png"),
    );
    assert!(record.get("quality").is_none());
    assert!(record["classes"][0].get("judge_confident").is_none());

    // Bad judges: refused before anything is written.
    let never = dir.path().join("never.png");
    for (args, says) in [
        (
            vec!["--per-class", "3", "--judge", "results/models/missing"],
            "--judge results/models/missing",
        ),
        (
            vec!["--per-class", "3", "--judge-threshold", "1.5"],
            "--judge-threshold",
        ),
        (
            vec!["--per-class", "3", "--judge-threshold", "-0.1"],
            "--judge-threshold",
        ),
        (
            vec!["--class", "4", "--per-class", "1"],
            "at least 2 samples",
        ),
    ] {
        let o = cli()
            .args(common)
            .args(&args)
            .arg("--out")
            .arg(&never)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: expected `{says}` in {err}");
        assert!(!never.exists() && !never.with_extension("json").exists());
    }
}
