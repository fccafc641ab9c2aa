//! Shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches::{self, to_vec};
use jem_bench::model::Checkpoint;
use jem_datasets::{embedded, Split};

/// A sweep small enough for a test: FGSM at K = 0, ε 0 and 0.1 (models, examples and folder
/// added by each test).
pub const TINY_FGSM_SWEEP: [&str; 7] = [
    "robust",
    "--attacks",
    "fgsm",
    "--steps",
    "0",
    "--eps",
    "0,0.1",
];

/// Logits of a run's best checkpoint (`DIR/model`) on three test digits: equal weights give
/// equal logits.
pub fn best_logits(dir: &Path) -> Vec<f32> {
    let (model, _) = Checkpoint::at(dir.join("model"))
        .load::<Inference>(&backend::device())
        .unwrap();
    let data = embedded::mnist(Split::Test).unwrap();
    to_vec(model.forward(batches::images::<Inference>(
        &data,
        &[0, 1, 2],
        &backend::device(),
    )))
}

/// The first `n` MNIST training digits and their labels.
pub fn first_training_digits(
    n: usize,
) -> (
    burn::tensor::Tensor<Train, 4>,
    burn::tensor::Tensor<Train, 1, burn::tensor::Int>,
) {
    let device = backend::device();
    let data = embedded::mnist(Split::Train).unwrap();
    let idx: Vec<usize> = (0..n).collect();
    (
        batches::images::<Train>(&data, &idx, &device),
        batches::labels::<Train>(&data, &idx, &device),
    )
}

/// The Python that the PyTorch halves of the tests run (`JEM_BENCH_PYTHON`, else `python3`);
/// those tests are ignored by default and fail, rather than pass, where it cannot import torch.
pub fn python_with_torch() -> String {
    let python = std::env::var("JEM_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let imported = std::process::Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        imported,
        "{python} cannot import torch: set JEM_BENCH_PYTHON to a Python that can"
    );
    python
}
