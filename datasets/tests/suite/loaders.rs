//! Loaders against the real embedded files, the CIFAR-10 fixture, and each kind of corrupt input.

use std::io::Write;
use std::path::{Path, PathBuf};

use jem_datasets::{
    embedded, load_cifar10, load_cifar100, load_mnist_dir, DataSource, DatasetError, Split,
    MNIST_CLASSES,
};
use md5::{Digest, Md5};

fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn embedded_mnist_matches_canonical_md5() {
    // MD5s of the raw IDX files as published with MNIST.
    let cases = [
        (
            &embedded::MNIST_TRAIN_IMAGES,
            "6bbc9ace898e44ae57da46a324031adb",
        ),
        (
            &embedded::MNIST_TEST_IMAGES,
            "2646ac647ad5339dbf082846283269ea",
        ),
        (
            &embedded::MNIST_TRAIN_LABELS,
            "a25bea736e30d166cdddb491f175f624",
        ),
        (
            &embedded::MNIST_TEST_LABELS,
            "27ae3e4e09519cfbb04c329615203637",
        ),
    ];
    for (file, want) in cases {
        assert_eq!(md5_hex(&file.decompress().unwrap()), want, "{}", file.name);
    }
}

#[test]
fn embedded_mnist_shapes_and_known_labels() {
    let train = embedded::mnist(Split::Train).unwrap();
    let test = embedded::mnist(Split::Test).unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!((test.channels, test.height, test.width), (1, 28, 28));
    assert_eq!(train.images.len(), 60_000 * 784);
    // The first training digit is a 5, the first test digits are 7, 2, 1, 0, 4.
    assert_eq!(train.labels[0], 5);
    assert_eq!(&test.labels[..5], &[7, 2, 1, 0, 4]);
    assert!(test.images.iter().all(|&p| (0.0..=1.0).contains(&p)));
    // Every class appears, roughly balanced (the rarest MNIST test class has 892 images).
    let mut counts = [0usize; 10];
    test.labels.iter().for_each(|&l| counts[l as usize] += 1);
    assert_eq!(counts[5], 892);
    assert_eq!(counts.iter().sum::<usize>(), 10_000);
}

#[test]
fn embedded_fashion_mnist_test() {
    let f = embedded::fashion_mnist_test().unwrap();
    assert_eq!(f.len(), 1_000, "the first 1 000 test images");
    assert_eq!(
        f.labels[0], 9,
        "first Fashion-MNIST test item is an ankle boot"
    );
    assert_eq!(f.class_names[9], "Ankle boot");
    let mut counts = [0usize; 10];
    f.labels.iter().for_each(|&l| counts[l as usize] += 1);
    // Counted from Debian's full test set's first 1 000 labels.
    assert_eq!(counts, [107, 105, 111, 93, 115, 87, 97, 95, 95, 95]);
}

/// Writes the embedded MNIST test files into `dir`, gzipped or raw.
fn write_mnist_test(dir: &Path, gz: bool) {
    for f in [&embedded::MNIST_TEST_IMAGES, &embedded::MNIST_TEST_LABELS] {
        let base = f.name.rsplit('/').next().unwrap().trim_end_matches(".gz");
        if gz {
            std::fs::write(dir.join(format!("{base}.gz")), f.gz).unwrap();
        } else {
            std::fs::write(dir.join(base), f.decompress().unwrap()).unwrap();
        }
    }
}

#[test]
fn mnist_directory_raw_and_gz_equal_embedded() {
    let want = embedded::mnist(Split::Test).unwrap();
    for gz in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        write_mnist_test(dir.path(), gz);
        let got = DataSource::parse(&format!("mnist:{}", dir.path().display()))
            .unwrap()
            .load(Split::Test)
            .unwrap();
        assert_eq!(got.images, want.images);
        assert_eq!(got.labels, want.labels);
    }
}

/// Rewrites the raw MNIST test label / image files in a fresh directory with `edit`.
fn corrupted(file: &str, edit: impl Fn(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_mnist_test(dir.path(), false);
    let path = dir.path().join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    edit(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn expect_format_error(dir: &Path, path: &Path, field: &str) -> String {
    let err = load_mnist_dir(dir, Split::Test, "mnist", &MNIST_CLASSES).unwrap_err();
    let msg = err.to_string();
    match &err {
        DatasetError::Format {
            path: p, field: f, ..
        } => {
            assert_eq!(p, path, "{msg}");
            assert_eq!(*f, field, "{msg}");
        }
        other => panic!("expected a format error on `{field}`, got {other}"),
    }
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    msg
}

#[test]
fn wrong_magic_is_reported() {
    let (dir, path) = corrupted("t10k-images-idx3-ubyte", |b| b[3] = 0x01);
    let msg = expect_format_error(dir.path(), &path, "magic");
    assert!(msg.contains("0x00000803"), "{msg}");
}

#[test]
fn truncated_file_is_reported() {
    let (dir, path) = corrupted("t10k-images-idx3-ubyte", |b| b.truncate(b.len() - 100));
    let msg = expect_format_error(dir.path(), &path, "payload");
    assert!(msg.contains("truncated"), "{msg}");
    let (dir, path) = corrupted("t10k-labels-idx1-ubyte", |b| b.truncate(6));
    let msg = expect_format_error(dir.path(), &path, "header");
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn count_mismatch_is_reported() {
    // 9 999 labels declared and present: both files are well-formed but disagree.
    let (dir, path) = corrupted("t10k-labels-idx1-ubyte", |b| {
        b[4..8].copy_from_slice(&9_999u32.to_be_bytes());
        b.pop();
    });
    let msg = expect_format_error(dir.path(), &path, "count");
    assert!(msg.contains("10000 labels"), "{msg}");
}

#[test]
fn label_out_of_range_is_reported() {
    let (dir, path) = corrupted("t10k-labels-idx1-ubyte", |b| b[8 + 17] = 10);
    let msg = expect_format_error(dir.path(), &path, "label");
    assert!(msg.contains("record 17"), "{msg}");
}

#[test]
fn missing_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_mnist_dir(dir.path(), Split::Test, "mnist", &MNIST_CLASSES).unwrap_err();
    assert!(matches!(err, DatasetError::Io { .. }));
    assert!(err.to_string().contains("t10k-images-idx3-ubyte"), "{err}");
}

#[test]
fn bad_gzip_stream_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    write_mnist_test(dir.path(), true);
    let path = dir.path().join("t10k-images-idx3-ubyte.gz");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(1000);
    std::fs::write(&path, bytes).unwrap();
    let err = load_mnist_dir(dir.path(), Split::Test, "mnist", &MNIST_CLASSES).unwrap_err();
    assert!(
        err.to_string().contains("t10k-images-idx3-ubyte.gz"),
        "{err}"
    );
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cifar10-first20")
}

#[test]
fn cifar10_fixture_loads_with_channel_major_layout() {
    let set = load_cifar10(&fixture_dir(), Split::Test).unwrap();
    assert_eq!(set.len(), 20);
    assert_eq!((set.channels, set.height, set.width), (3, 32, 32));
    // The first 20 CIFAR-10 test labels.
    assert_eq!(
        set.labels,
        [3, 8, 8, 0, 6, 6, 1, 6, 3, 1, 0, 9, 5, 7, 9, 8, 5, 7, 8, 6]
    );
    assert_eq!(set.class_names[3], "cat");
    // Channel sums computed by PIL from the source PNGs, by the script that made the fixture.
    let sums: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("channel_sums.json")).unwrap(),
    )
    .unwrap();
    for (i, entry) in sums.as_array().unwrap().iter().enumerate() {
        for c in 0..3 {
            let want = entry["channel_sums"][c].as_u64().unwrap();
            let got: f64 = set.image(i)[c * 1024..(c + 1) * 1024]
                .iter()
                .map(|&p| (p * 255.0).round() as f64)
                .sum();
            assert_eq!(got as u64, want, "image {i} channel {c}");
        }
    }
}

#[test]
fn cifar10_truncated_and_bad_label() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(fixture_dir().join("test_batch.bin")).unwrap();
    let path = dir.path().join("test_batch.bin");
    std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
    let err = load_cifar10(dir.path(), Split::Test).unwrap_err();
    assert!(
        matches!(
            err,
            DatasetError::Format {
                field: "length",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("test_batch.bin"), "{err}");

    bytes[3073 * 2] = 12;
    std::fs::write(&path, &bytes).unwrap();
    let err = load_cifar10(dir.path(), Split::Test).unwrap_err();
    assert!(err.to_string().contains("12 at record 2"), "{err}");

    let err = load_cifar10(dir.path(), Split::Train).unwrap_err();
    assert!(err.to_string().contains("data_batch_1.bin"), "{err}");
}

#[test]
fn cifar100_uses_fine_labels_and_archive_folder() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("cifar-100-binary");
    std::fs::create_dir(&sub).unwrap();
    let mut f = std::fs::File::create(sub.join("test.bin")).unwrap();
    for (coarse, fine) in [(4u8, 99u8), (19, 0), (0, 57)] {
        f.write_all(&[coarse, fine]).unwrap();
        f.write_all(&vec![fine; 3072]).unwrap();
    }
    drop(f);
    let set = load_cifar100(dir.path(), Split::Test).unwrap();
    assert_eq!(set.labels, [99, 0, 57]);
    assert_eq!(set.num_classes(), 100);
    assert_eq!(set.class_names[99], "worm");
    assert!((set.image(2)[0] - 57.0 / 255.0).abs() < 1e-7);
}

#[test]
fn data_source_specs() {
    assert_eq!(DataSource::parse("mnist").unwrap(), DataSource::Mnist(None));
    assert!(matches!(
        DataSource::parse("cifar10:/x").unwrap(),
        DataSource::Cifar10(_)
    ));
    let err = DataSource::parse("cifar10").unwrap_err().to_string();
    assert!(err.contains("cifar10:"), "{err}");
    let err = DataSource::parse("imagenet").unwrap_err().to_string();
    assert!(err.contains("unknown data set"), "{err}");
}
