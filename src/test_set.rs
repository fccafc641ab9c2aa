//! The test images a command evaluates a model on: the data set a flag names, or else the one
//! the model was trained on, checked against the model (channels, size, classes) and cut to
//! its first n images. One function, so that every command refuses the same mistakes in the
//! same words.

use anyhow::Context;
use jem_datasets::{DataSource, ImageSet, Split};

use crate::model::Sidecar;

/// The first `n` test images of a data set, with the spec that named it.
#[derive(Debug, Clone)]
pub struct TestImages {
    /// As `--data` takes it (`mnist`, `cifar10:DIR`, …).
    pub spec: String,
    pub set: ImageSet,
}

/// Loads the test split named by `spec` (the value of `flag`), or the model's own data set
/// when `spec` is `None`; refuses data the model cannot take and an `n` outside 1 to the
/// split's size.
pub fn load(
    model: &str,
    sidecar: &Sidecar,
    flag: &str,
    spec: Option<&str>,
    n: usize,
) -> anyhow::Result<TestImages> {
    let chosen = spec.map_or_else(|| sidecar.training.data.clone(), str::to_string);
    let set = DataSource::parse(&chosen)
        .and_then(|s| s.load(Split::Test))
        .with_context(|| match spec {
            Some(_) => flag.to_string(),
            None => format!("the data set of {model} (its sidecar's training.data; pass {flag})"),
        })?;
    sidecar.check_data(model, &set)?;
    anyhow::ensure!(
        (1..=set.len()).contains(&n),
        "--n {n}: expected 1 to {} (the test images of {chosen})",
        set.len()
    );
    Ok(TestImages {
        spec: chosen,
        set: set.select(&(0..n).collect::<Vec<_>>()),
    })
}
