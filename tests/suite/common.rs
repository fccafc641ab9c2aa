//! Shared by the integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
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

/// Whether `p` is a finished cell's file (`cells/ID.json.gz`).
pub fn is_cell_file(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(".json.gz"))
}

/// The cell id a cell file is named by (`cells/ID.json.gz`).
pub fn cell_id(p: &Path) -> String {
    let name = p.file_name().unwrap().to_string_lossy();
    name.strip_suffix(".json.gz")
        .expect("a cell file")
        .to_string()
}

/// A finished cell file's JSON (gzip-compressed on disk).
pub fn read_cell(p: &Path) -> serde_json::Value {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()),
        &mut text,
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Writes `cell` as a cell file, as jem-bench writes them (to doctor one in a test).
pub fn write_cell(p: &Path, cell: &serde_json::Value) {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(cell.to_string().as_bytes()).unwrap();
    std::fs::write(p, gz.finish().unwrap()).unwrap();
}

/// A CSV's rows as maps of column to value.
pub fn csv_rows(path: &Path) -> Vec<HashMap<String, String>> {
    csv::Reader::from_path(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .deserialize()
        .map(|r| r.unwrap())
        .collect()
}

/// A CSV field read as a number.
pub fn num(row: &HashMap<String, String>, field: &str) -> f64 {
    row[field]
        .parse()
        .unwrap_or_else(|_| panic!("{field} = {:?} is not a number", row[field]))
}
