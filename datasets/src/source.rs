//! Naming a data set on the command line (`mnist`, `cifar10:DIR`, …) and loading it.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::{embedded, load_cifar10, load_cifar100, load_idx_pair, DatasetError, ImageSet, Result};

/// The class names of MNIST, by label: the digits `0` to `9`.
pub const MNIST_CLASSES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The 10 class names of Fashion-MNIST, by label.
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Which part of a data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training split (60 000 images for (Fashion-)MNIST, 50 000 for CIFAR).
    Train,
    /// The test split (10 000 images).
    Test,
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Test => "test",
        })
    }
}

/// A data set named as on the command line: `mnist` and `fashion-mnist` alone mean the embedded
/// copies; `NAME:DIR` reads the standard files from a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// MNIST: the embedded copy (`None`), or the IDX files in a directory.
    Mnist(Option<PathBuf>),
    /// Fashion-MNIST: the IDX files in a directory; `None` means the embedded test images (the
    /// first 1 000), and for the training split Debian's `/usr/share/datasets/fashion-mnist`.
    FashionMnist(Option<PathBuf>),
    /// CIFAR-10 from the directory of its binary batches (not embedded).
    Cifar10(PathBuf),
    /// CIFAR-100 (fine labels) from the directory of its binary files (not embedded).
    Cifar100(PathBuf),
}

/// Where Debian's `dataset-fashion-mnist` package puts the full set.
const DEBIAN_FASHION_MNIST: &str = "/usr/share/datasets/fashion-mnist";

impl DataSource {
    /// Parses `mnist`, `mnist:DIR`, `fashion-mnist[:DIR]`, `cifar10:DIR`, `cifar100:DIR`.
    pub fn parse(spec: &str) -> Result<Self> {
        let (name, dir) = match spec.split_once(':') {
            Some((n, d)) if !d.is_empty() => (n, Some(PathBuf::from(d))),
            Some((n, _)) => (n, None),
            None => (spec, None),
        };
        let need_dir = |dir: Option<PathBuf>| {
            dir.ok_or_else(|| DatasetError::Spec {
                spec: spec.into(),
                reason: format!(
                    "{name} is not embedded; name the directory of its binary files, \
                     e.g. `{name}:/data/{name}`"
                ),
            })
        };
        Ok(match name.to_ascii_lowercase().as_str() {
            "mnist" => DataSource::Mnist(dir),
            "fashion-mnist" | "fashion_mnist" | "fmnist" => DataSource::FashionMnist(dir),
            "cifar10" | "cifar-10" => DataSource::Cifar10(need_dir(dir)?),
            "cifar100" | "cifar-100" => DataSource::Cifar100(need_dir(dir)?),
            other => {
                return Err(DatasetError::Spec {
                    spec: spec.into(),
                    reason: format!(
                        "unknown data set `{other}`; expected mnist, fashion-mnist, \
                         cifar10:DIR or cifar100:DIR"
                    ),
                })
            }
        })
    }

    /// Short name for reports and checkpoint sidecars (`mnist`, `cifar10`, …).
    pub fn name(&self) -> &'static str {
        match self {
            DataSource::Mnist(_) => "mnist",
            DataSource::FashionMnist(_) => "fashion-mnist",
            DataSource::Cifar10(_) => "cifar10",
            DataSource::Cifar100(_) => "cifar100",
        }
    }

    /// Image shape (C, H, W) of every split of this source.
    pub fn image_shape(&self) -> [usize; 3] {
        match self {
            DataSource::Mnist(_) | DataSource::FashionMnist(_) => [1, 28, 28],
            DataSource::Cifar10(_) | DataSource::Cifar100(_) => [3, 32, 32],
        }
    }

    /// Parses a spec that names a data set without necessarily saying where its files are
    /// (`cifar10` as well as `cifar10:DIR`): enough for its image shape and classes, as when
    /// recording what a model was trained on. Loading the returned source reads the
    /// placeholder directory `-` where none was given, and fails.
    pub fn parse_name(spec: &str) -> Result<Self> {
        DataSource::parse(spec).or_else(|first| {
            let name = spec.split_once(':').map_or(spec, |(n, _)| n);
            DataSource::parse(&format!("{name}:-")).map_err(|_| first)
        })
    }

    /// Image shape (C, H, W) of the data set a spec names (`mnist`, `cifar10:DIR`, …), without
    /// reading anything; `None` for a spec that names no known data set.
    pub fn image_shape_of(spec: &str) -> Option<[usize; 3]> {
        DataSource::parse_name(spec).ok().map(|s| s.image_shape())
    }

    /// Class names, by label.
    pub fn class_names(&self) -> Vec<String> {
        let names: &[&str] = match self {
            DataSource::Mnist(_) => &MNIST_CLASSES,
            DataSource::FashionMnist(_) => &FASHION_MNIST_CLASSES,
            DataSource::Cifar10(_) => &crate::cifar::CIFAR10_CLASSES,
            DataSource::Cifar100(_) => &crate::cifar::CIFAR100_CLASSES,
        };
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The spec string that names this source again.
    pub fn spec(&self) -> String {
        match self {
            DataSource::Mnist(None) | DataSource::FashionMnist(None) => self.name().into(),
            DataSource::Mnist(Some(d)) | DataSource::FashionMnist(Some(d)) => {
                format!("{}:{}", self.name(), d.display())
            }
            DataSource::Cifar10(d) | DataSource::Cifar100(d) => {
                format!("{}:{}", self.name(), d.display())
            }
        }
    }

    /// Loads `split`, from the embedded copy where this source names no directory.
    pub fn load(&self, split: Split) -> Result<ImageSet> {
        match self {
            DataSource::Mnist(None) => embedded::mnist(split),
            DataSource::Mnist(Some(dir)) => load_mnist_dir(dir, split, "mnist", &MNIST_CLASSES),
            DataSource::FashionMnist(None) if split == Split::Test => {
                embedded::fashion_mnist_test()
            }
            DataSource::FashionMnist(None) => load_mnist_dir(
                Path::new(DEBIAN_FASHION_MNIST),
                split,
                "fashion-mnist",
                &FASHION_MNIST_CLASSES,
            ),
            DataSource::FashionMnist(Some(dir)) => {
                load_mnist_dir(dir, split, "fashion-mnist", &FASHION_MNIST_CLASSES)
            }
            DataSource::Cifar10(dir) => load_cifar10(dir, split),
            DataSource::Cifar100(dir) => load_cifar100(dir, split),
        }
    }
}

/// The first of `base` and `base.gz` that exists in `dir` (or `base`, so that the error names it).
fn find_file(dir: &Path, base: &str) -> PathBuf {
    let gz = dir.join(format!("{base}.gz"));
    let raw = dir.join(base);
    if !raw.exists() && gz.exists() {
        gz
    } else {
        raw
    }
}

/// Loads an MNIST-layout directory (`train-images-idx3-ubyte[.gz]`, `t10k-labels-idx1-ubyte[.gz]`, …).
pub fn load_mnist_dir(dir: &Path, split: Split, name: &str, classes: &[&str]) -> Result<ImageSet> {
    let prefix = match split {
        Split::Train => "train",
        Split::Test => "t10k",
    };
    let images = find_file(dir, &format!("{prefix}-images-idx3-ubyte"));
    let labels = find_file(dir, &format!("{prefix}-labels-idx1-ubyte"));
    load_idx_pair(format!("{name}/{split}"), &images, &labels, classes)
}
