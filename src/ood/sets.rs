//! The out-of-distribution inputs `ood` compares a model's in-distribution test images with:
//! another data set's test split, or one of four sets made from the seed: uniform noise,
//! clipped Gaussian noise, constant grey images, and interpolations of two test images (the
//! "Interp" set of JEM's out-of-distribution section, Grathwohl et al. 2020).
//!
//! Each noise set has a random stream of its own, derived from the seed and the set's kind
//! alone, so the same seed gives the same images whatever other sets or models a run names.

use crate::settings::{self, InvalidSetting};
use jem_datasets::{DataSource, ImageSet, Split};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};

/// Mean and standard deviation of the `gaussian` set's pixels before clipping to [0, 1]: centred
/// on mid-grey, with σ = 0.25 so that about 95 % of the pixels stay unclipped (clipping more
/// would turn the set into a mix of black, white and uniform-looking pixels).
pub const GAUSSIAN_MEAN: f64 = 0.5;
pub const GAUSSIAN_STD: f64 = 0.25;

/// The noise sets by name, in the order help texts list them.
pub const NOISE_SETS: [&str; 4] = ["uniform", "gaussian", "interp", "constant"];

#[derive(Debug, Clone, PartialEq)]
pub enum OodSet {
    /// The test split of a data set, as `--data` names it (`fashion-mnist`, `cifar10:DIR`).
    Data(String),
    /// Every pixel uniform in [0, 1).
    Uniform,
    /// Every pixel N(0.5, 0.25²), clipped to [0, 1].
    Gaussian,
    /// The pixel-wise mean of two in-distribution test images of different classes.
    Interp,
    /// One grey level per image, uniform in [0, 1), in every pixel and channel.
    Constant,
}

impl OodSet {
    /// A noise set's name, else a data set spec; an error that lists both kinds otherwise.
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "uniform" => OodSet::Uniform,
            "gaussian" => OodSet::Gaussian,
            "interp" => OodSet::Interp,
            "constant" => OodSet::Constant,
            spec => {
                DataSource::parse(spec).map_err(|e| {
                    let problem = format!(
                        "expected a noise set ({}) or a data set (mnist, fashion-mnist, \
                         cifar10:DIR, cifar100:DIR): {e}",
                        NOISE_SETS.join(", ")
                    );
                    InvalidSetting::new("ood", spec.into(), &problem)
                })?;
                OodSet::Data(spec.to_string())
            }
        })
    }

    /// The name rows and figures use: the noise set's name or the data spec.
    pub fn name(&self) -> &str {
        match self {
            OodSet::Data(spec) => spec,
            OodSet::Uniform => "uniform",
            OodSet::Gaussian => "gaussian",
            OodSet::Interp => "interp",
            OodSet::Constant => "constant",
        }
    }

    /// What the set is, for the settings record.
    pub fn describe(&self) -> String {
        match self {
            OodSet::Data(spec) => format!("the first n test images of {spec}"),
            OodSet::Uniform => "every pixel (and channel) uniform in [0, 1)".into(),
            OodSet::Gaussian => {
                format!("every pixel N({GAUSSIAN_MEAN}, {GAUSSIAN_STD}²), clipped to [0, 1]")
            }
            OodSet::Interp => "0.5 · a + 0.5 · b for test images a, b of the in-distribution \
                               set drawn uniformly from its whole test split, b redrawn until \
                               its class differs from a's"
                .into(),
            OodSet::Constant => {
                "one grey level uniform in [0, 1) per image, in every pixel and channel".into()
            }
        }
    }

    /// The random stream of a noise set: one per kind.
    fn stream(&self) -> u64 {
        match self {
            OodSet::Data(_) => 0,
            OodSet::Uniform => 1,
            OodSet::Gaussian => 2,
            OodSet::Interp => 3,
            OodSet::Constant => 4,
        }
    }

    /// `n` images of this set shaped like `like` (the in-distribution images). `in_split`: the
    /// whole in-distribution test split, which `interp` mixes. Refuses a data set of another
    /// image shape, or with fewer than `n` test images.
    pub fn build(
        &self,
        like: &ImageSet,
        in_split: &ImageSet,
        n: usize,
        seed: u64,
    ) -> anyhow::Result<ImageSet> {
        let mut rng =
            StdRng::seed_from_u64(crate::train::stream_seed(seed, NOISE_STREAM, self.stream()));
        let len = like.image_len();
        let images: Vec<f32> = match self {
            OodSet::Data(spec) => return load_data(spec, like, n),
            OodSet::Uniform => (0..n * len).map(|_| rng.random::<f32>()).collect(),
            OodSet::Gaussian => {
                let normal = Normal::new(GAUSSIAN_MEAN, GAUSSIAN_STD).expect("σ > 0");
                (0..n * len)
                    .map(|_| normal.sample(&mut rng).clamp(0.0, 1.0) as f32)
                    .collect()
            }
            OodSet::Interp => interpolations(in_split, n, &mut rng)?,
            OodSet::Constant => (0..n)
                .flat_map(|_| std::iter::repeat_n(rng.random::<f32>(), len))
                .collect(),
        };
        Ok(ImageSet {
            name: self.name().to_string(),
            images,
            // Unused: detection needs no labels.
            labels: vec![0; n],
            channels: like.channels,
            height: like.height,
            width: like.width,
            class_names: like.class_names.clone(),
        })
    }
}

const NOISE_STREAM: u64 = 0x00D_5E75;

fn load_data(spec: &str, like: &ImageSet, n: usize) -> anyhow::Result<ImageSet> {
    let set = DataSource::parse(spec)
        .and_then(|s| s.load(Split::Test))
        .map_err(|e| settings::refusal("ood", spec, e.into()))?;
    let shape = |s: &ImageSet| format!("{}×{}×{}", s.channels, s.height, s.width);
    if (set.channels, set.height, set.width) != (like.channels, like.height, like.width) {
        let problem = format!(
            "its images are {} (channels × height × width), the in-distribution images of {} \
             are {}: the model cannot take them",
            shape(&set),
            like.name,
            shape(like)
        );
        return Err(InvalidSetting::new("ood", spec.into(), &problem).into());
    }
    if n > set.len() {
        let problem = format!("the OOD set {spec} has only {} test images", set.len());
        return Err(InvalidSetting::new("n", n.to_string(), &problem).into());
    }
    let mut first = set.select(&(0..n).collect::<Vec<_>>());
    // Rows and figures name the set as the flag did.
    first.name = spec.to_string();
    Ok(first)
}

/// `n` pixel-wise means of two images of different classes from `split`.
fn interpolations(split: &ImageSet, n: usize, rng: &mut StdRng) -> anyhow::Result<Vec<f32>> {
    if split.labels.iter().all(|&l| l == split.labels[0]) {
        let problem = format!(
            "the test split of {} holds one class only; interpolations need two",
            split.name
        );
        return Err(InvalidSetting::new("ood", "interp".into(), &problem).into());
    }
    let mut images = Vec::with_capacity(n * split.image_len());
    for _ in 0..n {
        let a = rng.random_range(0..split.len());
        let b = loop {
            let b = rng.random_range(0..split.len());
            if split.labels[b] != split.labels[a] {
                break b;
            }
        };
        let mixed = split
            .image(a)
            .iter()
            .zip(split.image(b))
            .map(|(p, q)| 0.5 * p + 0.5 * q);
        images.extend(mixed);
    }
    Ok(images)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(labels: Vec<u8>) -> ImageSet {
        let n = labels.len();
        ImageSet {
            name: "tiny".into(),
            images: (0..n * 4).map(|i| (i / 4) as f32 / n as f32).collect(),
            labels,
            channels: 1,
            height: 2,
            width: 2,
            class_names: vec!["a".into(), "b".into()],
        }
    }

    #[test]
    fn noise_sets_are_seeded_in_range_and_shaped_like_the_data() {
        let like = tiny(vec![0, 1, 0, 1]);
        for name in NOISE_SETS {
            let set = OodSet::parse(name).unwrap();
            let a = set.build(&like, &like, 50, 7).unwrap();
            assert_eq!(
                a,
                set.build(&like, &like, 50, 7).unwrap(),
                "{name}: same seed"
            );
            assert_ne!(
                a.images,
                set.build(&like, &like, 50, 8).unwrap().images,
                "{name}"
            );
            assert_eq!(
                (a.len(), a.images.len(), a.channels),
                (50, 200, 1),
                "{name}"
            );
            assert!(a.images.iter().all(|p| (0.0..=1.0).contains(p)), "{name}");
        }
        let constant = OodSet::Constant.build(&like, &like, 3, 1).unwrap();
        for img in constant.images.chunks(4) {
            assert!(img.iter().all(|&p| p == img[0]), "{img:?}");
        }
    }

    #[test]
    fn interpolations_mix_two_classes() {
        // Images of class 0 are 0 and 0.5, of class 1 are 0.25 and 0.75: every mean of two
        // images of different classes is 0.125, 0.375 or 0.625 — never 0.25 or 0.5.
        let split = tiny(vec![0, 1, 0, 1]);
        let set = OodSet::Interp.build(&split, &split, 100, 3).unwrap();
        for &p in &set.images {
            assert!([0.125, 0.375, 0.625].contains(&p), "{p}");
        }
        let err = OodSet::Interp
            .build(&split, &tiny(vec![1, 1]), 5, 3)
            .unwrap_err();
        assert!(err.to_string().contains("one class only"), "{err}");
    }

    #[test]
    fn unknown_names_list_the_valid_ones() {
        let err = format!("{:#}", OodSet::parse("svhn").unwrap_err());
        for valid in NOISE_SETS.iter().chain(&["fashion-mnist", "cifar10:DIR"]) {
            assert!(err.contains(valid), "{valid} missing in: {err}");
        }
        assert_eq!(
            OodSet::parse("fashion-mnist").unwrap(),
            OodSet::Data("fashion-mnist".into())
        );
    }
}
