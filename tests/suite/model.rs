//! The Wide-ResNet: its size against the published cost table of the architecture family, the LSE input gradient against finite differences,
//! checkpoint round trips, and PyTorch import against logits computed by PyTorch.

use std::path::Path;

use burn::module::{AutodiffModule, Module};
use burn::tensor::{Tensor, TensorData};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches::to_vec;
use jem_bench::energy::{log_sum_exp, lse_input_gradient};
use jem_bench::model::{
    import_pytorch, Checkpoint, PytorchNaming, Sidecar, TrainingRecord, WideResNetConfig,
};
use rand::{Rng, SeedableRng};

fn mnist_wrn(depth: usize, width: usize) -> WideResNetConfig {
    WideResNetConfig::new(depth, width, 1, 10)
}

#[test]
fn sizes_match_the_spec_table() {
    // Parameters and MFLOP per image forward of the official architecture family.
    let cases = [
        (mnist_wrn(10, 1), 28, 77e3, 29.5),
        (mnist_wrn(10, 2), 28, 303e3, 111.0),
        (mnist_wrn(16, 2), 28, 691e3, 198.0),
        (WideResNetConfig::new(28, 10, 3, 10), 32, 36.5e6, 11_900.0),
    ];
    let device = backend::device();
    for (cfg, side, params, mflop) in cases {
        let got_mflop = cfg.forward_flops(side, side).unwrap() as f64 / 1e6;
        assert!(
            (got_mflop / mflop - 1.0).abs() < 0.02,
            "{}: {got_mflop} MFLOP",
            cfg.name()
        );
        if cfg.depth < 28 {
            let got = cfg.init::<Inference>(&device).unwrap().num_params() as f64;
            assert!(
                (got / params - 1.0).abs() < 0.02,
                "{}: {got} params",
                cfg.name()
            );
        }
    }
    assert!(mnist_wrn(12, 1).blocks_per_stage().is_err());
}

fn random_images(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n * 784).map(|_| rng.random::<f32>()).collect()
}

fn tensor(data: &[f32], n: usize) -> Tensor<Inference, 4> {
    Tensor::from_data(
        TensorData::new(data.to_vec(), [n, 1, 28, 28]),
        &backend::device(),
    )
}

#[test]
fn lse_input_gradient_matches_central_differences() {
    let device = backend::device();
    let model = mnist_wrn(10, 1)
        .init_seeded::<Train>(7, &device)
        .unwrap()
        .no_grad();
    let inference = model.valid();
    let n = 2;
    let x = random_images(n, 1);
    let grad = to_vec(lse_input_gradient(&model, tensor(&x, n)));
    let f =
        |x: &[f32]| -> f64 { to_vec(log_sum_exp(inference.forward(tensor(x, n))).sum())[0] as f64 };
    // Directional derivatives along random unit directions and along the largest gradient
    // coordinates, each against a central difference of the whole network (f32, so h = 1e-2).
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let mut directions: Vec<Vec<f32>> = (0..4)
        .map(|_| {
            let v: Vec<f32> = (0..x.len()).map(|_| rng.random::<f32>() - 0.5).collect();
            let norm = v.iter().map(|a| a * a).sum::<f32>().sqrt();
            v.into_iter().map(|a| a / norm).collect()
        })
        .collect();
    let mut order: Vec<usize> = (0..grad.len()).collect();
    order.sort_by(|&a, &b| grad[b].abs().total_cmp(&grad[a].abs()));
    for &i in &order[..4] {
        let mut e = vec![0.0; x.len()];
        e[i] = 1.0;
        directions.push(e);
    }
    let h = 1e-2f32;
    for v in &directions {
        let plus: Vec<f32> = x.iter().zip(v).map(|(a, b)| a + h * b).collect();
        let minus: Vec<f32> = x.iter().zip(v).map(|(a, b)| a - h * b).collect();
        let numeric = (f(&plus) - f(&minus)) / (2.0 * h as f64);
        let analytic: f64 = grad.iter().zip(v).map(|(g, b)| (g * b) as f64).sum();
        let tol = 2e-2 * analytic.abs().max(1e-2);
        assert!(
            (numeric - analytic).abs() < tol,
            "analytic {analytic}, numeric {numeric}"
        );
    }
    assert!(
        grad.iter().any(|g| g.abs() > 1e-4),
        "gradient should not vanish"
    );
}

#[test]
fn checkpoint_round_trip_gives_identical_logits() {
    let device = backend::device();
    let cfg = mnist_wrn(10, 1);
    let model = cfg.init::<Inference>(&device).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::at(dir.path().join("m"));
    let mut sidecar = Sidecar::new(
        cfg.clone(),
        TrainingRecord {
            kind: "baseline".into(),
            data: "mnist".into(),
            seed: 3,
            ..Default::default()
        },
    );
    sidecar.metrics.insert("val_accuracy".into(), 0.5);
    ckpt.save(&model, &sidecar).unwrap();
    let (loaded, side) = Checkpoint::at(dir.path().join("m.safetensors"))
        .load::<Inference>(&device)
        .unwrap();
    assert_eq!(side.training.seed, 3);
    assert_eq!(side.metrics["val_accuracy"], 0.5);
    assert_eq!(side.parameters, model.num_params());
    let x = tensor(&random_images(3, 5), 3);
    assert_eq!(to_vec(model.forward(x.clone())), to_vec(loaded.forward(x)));
    // A checkpoint of another architecture is refused with a message naming the file.
    let mut other = sidecar.clone();
    other.architecture = mnist_wrn(10, 2);
    std::fs::write(&ckpt.sidecar, serde_json::to_string(&other).unwrap()).unwrap();
    let err = ckpt.load::<Inference>(&device).unwrap_err().to_string();
    assert!(err.contains("m.safetensors"), "{err}");
    std::fs::write(&ckpt.sidecar, "{").unwrap();
    let err = format!("{:#}", ckpt.load::<Inference>(&device).unwrap_err());
    assert!(err.contains("m.json"), "{err}");
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch")
        .join(name)
}

fn expected(name: &str) -> (Vec<f32>, Vec<usize>) {
    expected_in("expected.safetensors", name)
}

fn expected_in(file: &str, name: &str) -> (Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(fixture(file)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let data = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (data, t.shape().to_vec())
}

fn assert_logits_match(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "max |burn − PyTorch| = {worst}");
}

#[test]
fn pytorch_safetensors_import_matches_pytorch_logits() {
    let device = backend::device();
    let model = import_pytorch::<Inference>(
        &fixture("wrn10_1.safetensors"),
        &mnist_wrn(10, 1),
        PytorchNaming::WideResnet,
        None,
        &device,
    )
    .unwrap();
    let (x, shape) = expected("x");
    assert_eq!(shape, [4, 1, 28, 28]);
    let got = to_vec(model.forward(tensor(&x, 4)));
    assert_logits_match(&got, &expected("logits").0);
    // The wrong architecture is refused, naming the file.
    let err = import_pytorch::<Inference>(
        &fixture("wrn10_1.safetensors"),
        &mnist_wrn(10, 2),
        PytorchNaming::WideResnet,
        None,
        &device,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("wrn10_1.safetensors"), "{err}");
}

#[test]
fn pytorch_pt_import_of_jem_checkpoint_matches_pytorch_logits() {
    let device = backend::device();
    let model = import_pytorch::<Inference>(
        &fixture("jem_f.pt"),
        &mnist_wrn(10, 1),
        PytorchNaming::Jem,
        Some("model_state_dict"),
        &device,
    )
    .unwrap();
    let (x, _) = expected("x");
    let got = to_vec(model.forward(tensor(&x, 4)));
    assert_logits_match(&got, &expected("jem_logits").0);
}

/// A CIFAR-shaped model that normalises its input with `mu`/`sigma` buffers (RobustBench's
/// convention), imported through the CLI: the buffers become the checkpoint's input
/// normalisation and the imported model gives PyTorch's logits on [0, 1] pixels.
#[test]
fn imported_model_with_stored_normalisation_matches_pytorch_logits() {
    let dir = tempfile::tempdir().unwrap();
    let import = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_jem-bench"))
            .arg("import")
            .arg(fixture("wrn10_1_cifar_normalized.safetensors"))
            .args([
                "--depth",
                "10",
                "--width",
                "1",
                "--in-channels",
                "3",
                "--data",
                "cifar10",
                "--out",
            ])
            .arg(dir.path().join("cifar"))
            .args(extra)
            .output()
            .unwrap()
    };
    let o = import(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (model, sidecar) = Checkpoint::at(dir.path().join("cifar"))
        .load::<Inference>(&backend::device())
        .unwrap();
    let norm = &sidecar.architecture.input_normalization;
    assert_eq!(norm.mean, vec![0.4914, 0.4822, 0.4465]);
    assert_eq!(norm.std, vec![0.2471, 0.2435, 0.2616]);
    let (x, shape) = expected_in("expected_normalized.safetensors", "x");
    assert_eq!(shape, [4, 3, 32, 32]);
    let input =
        Tensor::<Inference, 4>::from_data(TensorData::new(x, [4, 3, 32, 32]), &backend::device());
    let got = to_vec(model.forward(input));
    assert_logits_match(
        &got,
        &expected_in("expected_normalized.safetensors", "logits").0,
    );

    // --mean/--std that contradict the stored buffers are refused, naming the file.
    let o = import(&["--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("wrn10_1_cifar_normalized.safetensors"),
        "{err}"
    );
}

/// RobustBench's WRN layout (BatchNorm, ReLU, bias-free convs, stride on conv1, `convShortcut`
/// on the activated input) from a `.pt` whose keys carry DataParallel's `module.` prefix,
/// imported through the CLI and reloaded from jem-bench's own checkpoint: PyTorch's eval-mode
/// logits on [0, 1] pixels, also under autodiff (the attacks' backend), where BatchNorm must
/// keep its running statistics rather than use the batch's.
#[test]
fn robustbench_wrn_import_matches_pytorch_logits() {
    let dir = tempfile::tempdir().unwrap();
    let import = |naming: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_jem-bench"))
            .arg("import")
            .arg(fixture("robustbench_wrn16_1.pt"))
            .args(["--naming", naming, "--top-level-key", "state_dict"])
            .args(["--depth", "16", "--width", "1", "--in-channels", "3"])
            .args(["--data", "cifar10"])
            .arg("--out")
            .arg(dir.path().join("rb"))
            .output()
            .unwrap()
    };
    let o = import("robustbench");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let device = backend::device();
    let (model, sidecar) = Checkpoint::at(dir.path().join("rb"))
        .load::<Inference>(&device)
        .unwrap();
    let norm = &sidecar.architecture.input_normalization;
    assert_eq!(
        (norm.mean.clone(), norm.std.clone()),
        (vec![0.0; 3], vec![1.0; 3])
    );
    let (x, shape) = expected_in("expected_robustbench.safetensors", "x");
    assert_eq!(shape, [4, 3, 32, 32]);
    let want = expected_in("expected_robustbench.safetensors", "logits").0;
    let input =
        Tensor::<Inference, 4>::from_data(TensorData::new(x.clone(), shape.clone()), &device);
    assert_logits_match(&to_vec(model.forward(input)), &want);

    let (model, _) = Checkpoint::at(dir.path().join("rb"))
        .load::<Train>(&device)
        .unwrap();
    let input = Tensor::<Train, 4>::from_data(TensorData::new(x, shape), &device);
    let got: Vec<f32> = model.forward(input).into_data().to_vec().unwrap();
    assert_logits_match(&got, &want);

    // The same file under JEM's naming does not fit, and the error names it.
    let o = import("wide-resnet");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("robustbench_wrn16_1.pt"),
        "{err}"
    );
}
