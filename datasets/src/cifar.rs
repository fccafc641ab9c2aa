//! CIFAR-10 and CIFAR-100 in their standard binary format.
//!
//! CIFAR-10: `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`, records of 1 label byte
//! and 3072 pixel bytes (1024 red, 1024 green, 1024 blue, row-major 32×32).
//! CIFAR-100: `train.bin` and `test.bin`, records of 1 coarse label byte, 1 fine label byte and
//! 3072 pixel bytes; the fine labels (100 classes) are used.
//! A directory may hold the files directly or in the archive's folder
//! (`cifar-10-batches-bin/`, `cifar-100-binary/`).

use std::path::{Path, PathBuf};

use crate::idx::read_maybe_gz;
use crate::{DatasetError, ImageSet, Result, Split};

const PIXELS: usize = 3 * 32 * 32;

/// The 10 class names of CIFAR-10, by label.
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// The 100 fine class names of CIFAR-100, by fine label.
pub const CIFAR100_CLASSES: [&str; 100] = [
    "apple",
    "aquarium_fish",
    "baby",
    "bear",
    "beaver",
    "bed",
    "bee",
    "beetle",
    "bicycle",
    "bottle",
    "bowl",
    "boy",
    "bridge",
    "bus",
    "butterfly",
    "camel",
    "can",
    "castle",
    "caterpillar",
    "cattle",
    "chair",
    "chimpanzee",
    "clock",
    "cloud",
    "cockroach",
    "couch",
    "crab",
    "crocodile",
    "cup",
    "dinosaur",
    "dolphin",
    "elephant",
    "flatfish",
    "forest",
    "fox",
    "girl",
    "hamster",
    "house",
    "kangaroo",
    "keyboard",
    "lamp",
    "lawn_mower",
    "leopard",
    "lion",
    "lizard",
    "lobster",
    "man",
    "maple_tree",
    "motorcycle",
    "mountain",
    "mouse",
    "mushroom",
    "oak_tree",
    "orange",
    "orchid",
    "otter",
    "palm_tree",
    "pear",
    "pickup_truck",
    "pine_tree",
    "plain",
    "plate",
    "poppy",
    "porcupine",
    "possum",
    "rabbit",
    "raccoon",
    "ray",
    "road",
    "rocket",
    "rose",
    "sea",
    "seal",
    "shark",
    "shrew",
    "skunk",
    "skyscraper",
    "snail",
    "snake",
    "spider",
    "squirrel",
    "streetcar",
    "sunflower",
    "sweet_pepper",
    "table",
    "tank",
    "telephone",
    "television",
    "tiger",
    "tractor",
    "train",
    "trout",
    "tulip",
    "turtle",
    "wardrobe",
    "whale",
    "willow_tree",
    "wolf",
    "woman",
    "worm",
];

/// Parses one binary batch file: `label_bytes` leading bytes per record, the last of which is
/// the label that is kept.
pub(crate) fn parse_records(
    path: &Path,
    bytes: &[u8],
    label_bytes: usize,
    num_classes: usize,
    images: &mut Vec<f32>,
    labels: &mut Vec<u8>,
) -> Result<()> {
    let record = label_bytes + PIXELS;
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(DatasetError::format(
            path,
            "length",
            format!("a positive multiple of the {record}-byte record"),
            format!(
                "{} bytes ({} whole records and {} bytes over: file truncated or not CIFAR)",
                bytes.len(),
                bytes.len() / record,
                bytes.len() % record
            ),
        ));
    }
    for (i, rec) in bytes.chunks_exact(record).enumerate() {
        let label = rec[label_bytes - 1];
        if label as usize >= num_classes {
            return Err(DatasetError::format(
                path,
                "label",
                format!("a class index below {num_classes}"),
                format!("{label} at record {i}"),
            ));
        }
        labels.push(label);
        images.extend(rec[label_bytes..].iter().map(|&p| p as f32 / 255.0));
    }
    Ok(())
}

/// `dir` itself if it holds `probe`, else `dir/sub` if that does, else `dir` (the error then
/// names the missing file under `dir`).
fn resolve_dir(dir: &Path, sub: &str, probe: &str) -> PathBuf {
    if !dir.join(probe).exists() && dir.join(sub).join(probe).exists() {
        dir.join(sub)
    } else {
        dir.to_path_buf()
    }
}

fn load(
    name: &str,
    dir: &Path,
    files: &[String],
    label_bytes: usize,
    classes: &[&str],
) -> Result<ImageSet> {
    let mut images = Vec::new();
    let mut labels = Vec::new();
    for f in files {
        let path = dir.join(f);
        let bytes = read_maybe_gz(&path)?;
        parse_records(
            &path,
            &bytes,
            label_bytes,
            classes.len(),
            &mut images,
            &mut labels,
        )?;
    }
    Ok(ImageSet {
        name: name.to_string(),
        images,
        labels,
        channels: 3,
        height: 32,
        width: 32,
        class_names: classes.iter().map(|s| s.to_string()).collect(),
    })
}

/// Loads CIFAR-10 from a directory of `.bin` batches.
pub fn load_cifar10(dir: &Path, split: Split) -> Result<ImageSet> {
    let files: Vec<String> = match split {
        Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
        Split::Test => vec!["test_batch.bin".into()],
    };
    let dir = resolve_dir(dir, "cifar-10-batches-bin", &files[0]);
    load(
        &format!("cifar10/{split}"),
        &dir,
        &files,
        1,
        &CIFAR10_CLASSES,
    )
}

/// Loads CIFAR-100 (fine labels) from a directory holding `train.bin` / `test.bin`.
pub fn load_cifar100(dir: &Path, split: Split) -> Result<ImageSet> {
    let file = format!("{split}.bin");
    let dir = resolve_dir(dir, "cifar-100-binary", &file);
    load(
        &format!("cifar100/{split}"),
        &dir,
        &[file],
        2,
        &CIFAR100_CLASSES,
    )
}
