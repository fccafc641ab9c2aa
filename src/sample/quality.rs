//! How much a JEM's samples look like its data, as two numbers judged by an independent
//! classifier (by default the embedded baseline, trained without any generative term):
//!
//! - the fraction of class-conditional samples that the judge assigns to their intended class
//!   with probability at least a threshold (0.9);
//! - the Fréchet distance between the samples and the test images in the judge's penultimate
//!   layer (an MNIST analogue of FID, Heusel et al. 2017), beside the same distance for as many
//!   training images: the value a perfect sampler would reach with that many samples, since the
//!   distance is biased upwards for small sets.

use anyhow::Context;
use burn::tensor::activation::softmax;
use burn::tensor::Tensor;
use jem_datasets::{DataSource, ImageSet, Split};
use serde::Serialize;

use super::frechet::{frechet_distance, Moments};
use jem_kernels::Kernels;

use crate::batches;
use crate::model::{Checkpoint, WideResNet};
use crate::settings::{self, InvalidSetting};

/// Images per forward pass of the judge.
const BATCH: usize = 256;

/// The judge's verdict on a set of class-conditional samples.
#[derive(Debug, Serialize)]
pub struct Quality {
    /// The judging classifier's checkpoint.
    pub judge: String,
    /// The probability a sample's intended class must reach.
    pub threshold: f64,
    /// Samples judged.
    pub samples: usize,
    /// Fraction of the samples that the judge gives their intended class with p ≥ threshold.
    pub confident_fraction: f64,
    /// The same, per class (in the order of the sampled classes).
    pub confident_fraction_per_class: Vec<f64>,
    /// Fréchet distance between the samples and the reference test images in the judge's
    /// penultimate-layer features.
    pub frechet_distance: f64,
    /// The Fréchet distance between as many training images as there are samples and the same
    /// reference: the floor for this number of samples.
    pub frechet_distance_train_images: f64,
    /// The reference: `name`, first N images.
    pub reference: String,
    /// Dimension of the feature space.
    pub feature_dim: usize,
}

/// A classifier checkpoint that judges samples of images shaped `[c, h, w]` with `classes`
/// classes, checked against the sampled model's data set before anything is computed.
pub struct Judge<B: Kernels> {
    path: String,
    model: WideResNet<B>,
    /// The `[c, h, w]` shape of the images it judges (checked at `load`).
    shape: [usize; 3],
    device: B::Device,
}

impl<B: Kernels> Judge<B> {
    /// Loads the judge at `path` onto `device`, refused unless it takes images of `shape` with
    /// `classes` classes (those of `data`, the sampled model's data set).
    pub fn load(
        path: &str,
        data: &str,
        shape: [usize; 3],
        classes: usize,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        if crate::model::OnnxCheckpoint::find(path).is_some() {
            // The sampled model may be any classifier; the judge reads features, not logits.
            let problem = "a graph imported from ONNX gives logits only, and the judge's Fréchet \
                           distance is measured in a Wide-ResNet's penultimate features (its \
                           pooled layer before the head): name a jem-bench Wide-ResNet \
                           checkpoint trained on the model's data set, or none";
            return Err(InvalidSetting::new("judge", path.into(), problem).into());
        }
        let (model, sidecar) = Checkpoint::load_setting::<B>(path.as_ref(), "judge", device)?;
        let judge_shape = sidecar
            .image_shape()
            .map_err(|e| settings::refusal("judge", path, e))?;
        let judge_classes = sidecar.architecture.num_classes;
        if (judge_shape, judge_classes) != (shape, classes) {
            let problem = format!(
                "it takes {judge_shape:?} images ({}) with {judge_classes} classes; the sampled \
                 model takes {shape:?} images ({data}) with {classes} classes: name a classifier \
                 trained on the model's data set, or none",
                sidecar.training.data
            );
            return Err(InvalidSetting::new("judge", path.into(), &problem).into());
        }
        Ok(Self {
            path: path.to_string(),
            model,
            shape,
            device: device.clone(),
        })
    }

    /// Penultimate features (`n × dim`) and class probabilities (`n × classes`) of `n` images.
    fn read(&self, pixels: &[f32]) -> (Vec<f32>, Vec<f32>, usize) {
        let shape = self.shape;
        let per_image = shape.iter().product::<usize>();
        let (mut features, mut probs, mut dim) = (Vec::new(), Vec::new(), 0);
        for chunk in pixels.chunks(BATCH * per_image) {
            let n = chunk.len() / per_image;
            let [c, h, w] = shape;
            let x = Tensor::<B, 4>::from_data(
                burn::tensor::TensorData::new(chunk.to_vec(), [n, c, h, w]),
                &self.device,
            );
            let f = self.model.features(x);
            dim = f.dims()[1];
            probs.extend(batches::to_vec(softmax(
                self.model.linear.forward(f.clone()),
                1,
            )));
            features.extend(batches::to_vec(f));
        }
        (features, probs, dim)
    }

    /// Judges `samples` (images of the shape the judge was loaded for; `labels[i]` is sample
    /// i's intended class; `classes` the sampled classes in report order) against the first
    /// `reference_images` test images of `source`.
    pub fn assess(
        &self,
        samples: &[f32],
        labels: &[usize],
        classes: &[usize],
        source: &DataSource,
        reference_images: usize,
        threshold: f64,
    ) -> anyhow::Result<Quality> {
        let n = labels.len();
        let per_image = self.shape.iter().product::<usize>();
        anyhow::ensure!(
            samples.len() == n * per_image,
            "the judge got {} pixels for {n} labels: expected {} ({n} images of {:?})",
            samples.len(),
            n * per_image,
            self.shape
        );
        anyhow::ensure!(
            n >= 2,
            "the judge got {n} samples: a Fréchet distance needs at least 2"
        );
        let (features, probs, dim) = self.read(samples);
        let k = probs.len() / n;
        let confident: Vec<bool> = labels
            .iter()
            .enumerate()
            .map(|(i, &y)| probs[i * k + y] as f64 >= threshold)
            .collect();
        let fraction = |of: &dyn Fn(usize) -> bool| {
            let (hits, total) = (0..n)
                .filter(|&i| of(i))
                .fold((0, 0), |(h, t), i| (h + usize::from(confident[i]), t + 1));
            hits as f64 / total.max(1) as f64
        };
        let per_class = classes
            .iter()
            .map(|&c| fraction(&|i| labels[i] == c))
            .collect();

        let test = source.load(Split::Test)?;
        let train = source.load(Split::Train)?;
        let reference = first(&test, reference_images);
        let (reference_features, _, _) = self.read(&reference);
        let (train_features, _, _) = self.read(&first(&train, n));
        let moments = |rows: &[f32], what: &str| {
            Moments::of(rows, dim).with_context(|| format!("the judge's features of {what}"))
        };
        let reference_moments = moments(&reference_features, "the reference images")?;
        let sample_moments = moments(&features, "the samples (sample at least 2)")?;
        let train_moments = moments(&train_features, "the training images")?;
        let used = reference.len() / test.image_len();
        Ok(Quality {
            judge: self.path.clone(),
            threshold,
            samples: n,
            confident_fraction: fraction(&|_| true),
            confident_fraction_per_class: per_class,
            frechet_distance: frechet_distance(&sample_moments, &reference_moments),
            frechet_distance_train_images: frechet_distance(&train_moments, &reference_moments),
            reference: format!("{}, first {used} images", test.name),
            feature_dim: dim,
        })
    }
}

/// The pixels of the first `n` images of a set (all of them if it has fewer).
fn first(set: &ImageSet, n: usize) -> Vec<f32> {
    set.images[..n.min(set.len()) * set.image_len()].to_vec()
}
