//! The test images a command evaluates a model on: the data set a flag names, or else the one
//! the model was trained on, checked against the model (channels, size, classes) and cut to
//! its first n images. One function, so that every command refuses the same mistakes in the
//! same words.

use jem_datasets::{DataSource, ImageSet, Split};

use crate::model::{ModelInfo, Sidecar};
use crate::settings::{self, InvalidSetting};

/// What choosing and checking a model's test data asks of its sidecar: a Wide-ResNet's
/// ([`Sidecar`]) or any model's ([`ModelInfo`]: a Wide-ResNet or a graph imported from ONNX).
pub trait ModelData {
    /// The data set the model classifies, as `--data` names it: the default test data.
    fn own_data(&self) -> &str;
    /// Where its sidecar records [`own_data`](Self::own_data), for messages (`training.data`).
    fn own_data_field(&self) -> &'static str;
    /// Refuses data whose images or classes the model cannot take; `model` names it.
    fn takes(&self, model: &str, data: &ImageSet) -> anyhow::Result<()>;
}

impl ModelData for Sidecar {
    fn own_data(&self) -> &str {
        &self.training.data
    }

    fn own_data_field(&self) -> &'static str {
        "training.data"
    }

    fn takes(&self, model: &str, data: &ImageSet) -> anyhow::Result<()> {
        self.check_data(model, data)
    }
}

impl ModelData for ModelInfo {
    fn own_data(&self) -> &str {
        self.data()
    }

    fn own_data_field(&self) -> &'static str {
        self.data_field()
    }

    fn takes(&self, model: &str, data: &ImageSet) -> anyhow::Result<()> {
        self.check_data(model, data)
    }
}

/// The first `n` test images of a data set, with the spec that named it.
#[derive(Debug, Clone)]
pub struct TestImages {
    /// As `--data` takes it (`mnist`, `cifar10:DIR`, …).
    pub spec: String,
    pub set: ImageSet,
}

/// Loads the test split named by `spec` (the value of the settings field `field`), or the
/// model's own data set when `spec` is `None`; refuses data the model cannot take and an `n`
/// outside 1 to the split's size (the field `n`).
pub fn load(
    model: &str,
    sidecar: &impl ModelData,
    field: &'static str,
    spec: Option<&str>,
    n: usize,
) -> anyhow::Result<TestImages> {
    let (chosen, set) = test_split(model, sidecar, field, spec)?;
    let set = settings::first_images(&set, "n", n, &format!("the test images of {chosen}"))?;
    Ok(TestImages { spec: chosen, set })
}

/// The whole test split named by `spec` (the value of the settings field `field`), or of the
/// model's own data set when `spec` is `None`, with the spec that names it; refused (naming
/// `field`) when it does not load or the model cannot take its images.
pub fn test_split(
    model: &str,
    sidecar: &impl ModelData,
    field: &'static str,
    spec: Option<&str>,
) -> anyhow::Result<(String, ImageSet)> {
    let chosen = spec.map_or_else(|| sidecar.own_data().to_string(), str::to_string);
    let set = DataSource::parse(&chosen)
        .and_then(|s| s.load(Split::Test))
        .map_err(|e| match spec {
            Some(spec) => settings::refusal(field, spec, e.into()),
            None => InvalidSetting::bare(
                field,
                &format!(
                    "none given, and the data set of {model} (its sidecar's {}) does not load: \
                     {e:#}",
                    sidecar.own_data_field()
                ),
            ),
        })?;
    sidecar
        .takes(model, &set)
        .map_err(|e| InvalidSetting::new(field, chosen.clone(), &format!("{e:#}")))?;
    Ok((chosen, set))
}
