//! Property test of the file readers: random truncations and byte flips of real files (MNIST's
//! IDX images and labels, the CIFAR-10 fixture) give an `Err` or a well-formed set — never a
//! panic — and a truncated file is always an `Err`. The generator is seeded: every run tries the
//! same inputs.

use std::path::Path;

use jem_datasets::{embedded, load_cifar10, read_idx_images, read_idx_labels, Split};

/// Inputs tried per reader and kind of damage.
const TRIALS: usize = 150;

/// SplitMix64: a small seeded generator, so that this crate needs no `rand`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `bytes` with 1 to 4 bytes replaced by random values, biased toward the header (where a flip
/// changes the meaning of the rest).
fn flipped(bytes: &[u8], header: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..1 + rng.below(4) {
        let i = if rng.below(2) == 0 {
            rng.below(header.min(b.len()))
        } else {
            rng.below(b.len())
        };
        b[i] ^= 1 + rng.below(255) as u8;
    }
    b
}

/// A real IDX image file cut down to its first `n` images (header count rewritten).
fn small_idx_images(n: usize) -> Vec<u8> {
    let raw = embedded::MNIST_TEST_IMAGES.decompress().unwrap();
    let mut b = raw[..16 + n * 28 * 28].to_vec();
    b[4..8].copy_from_slice(&(n as u32).to_be_bytes());
    b
}

fn small_idx_labels(n: usize) -> Vec<u8> {
    let raw = embedded::MNIST_TEST_LABELS.decompress().unwrap();
    let mut b = raw[..8 + n].to_vec();
    b[4..8].copy_from_slice(&(n as u32).to_be_bytes());
    b
}

#[test]
fn idx_images_survive_truncation_and_flips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("images-idx3-ubyte");
    let good = small_idx_images(20);
    std::fs::write(&path, &good).unwrap();
    assert_eq!(
        read_idx_images(&path).unwrap().count,
        20,
        "the cut-down file is valid"
    );
    let mut rng = Rng(1);
    for _ in 0..TRIALS {
        let cut = rng.below(good.len());
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(read_idx_images(&path).is_err(), "truncated at {cut} bytes");
    }
    for _ in 0..TRIALS {
        std::fs::write(&path, flipped(&good, 16, &mut rng)).unwrap();
        if let Ok(set) = read_idx_images(&path) {
            assert_eq!(set.pixels.len(), set.count * set.rows * set.cols);
        }
    }
}

#[test]
fn idx_labels_survive_truncation_and_flips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("labels-idx1-ubyte");
    let good = small_idx_labels(50);
    std::fs::write(&path, &good).unwrap();
    assert_eq!(read_idx_labels(&path, 10).unwrap().len(), 50);
    let mut rng = Rng(2);
    for _ in 0..TRIALS {
        let cut = rng.below(good.len());
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(
            read_idx_labels(&path, 10).is_err(),
            "truncated at {cut} bytes"
        );
    }
    for _ in 0..TRIALS {
        std::fs::write(&path, flipped(&good, 8, &mut rng)).unwrap();
        if let Ok(labels) = read_idx_labels(&path, 10) {
            assert!(labels.iter().all(|&l| l < 10));
        }
    }
}

#[test]
fn gzipped_idx_survives_truncation_and_flips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("labels-idx1-ubyte.gz");
    let good = embedded::MNIST_TEST_LABELS.gz;
    std::fs::write(&path, good).unwrap();
    assert_eq!(read_idx_labels(&path, 10).unwrap().len(), 10_000);
    let mut rng = Rng(3);
    for _ in 0..TRIALS {
        let cut = rng.below(good.len());
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(
            read_idx_labels(&path, 10).is_err(),
            "truncated at {cut} bytes"
        );
    }
    for _ in 0..TRIALS {
        std::fs::write(&path, flipped(good, 32, &mut rng)).unwrap();
        if let Ok(labels) = read_idx_labels(&path, 10) {
            assert!(labels.iter().all(|&l| l < 10));
        }
    }
}

#[test]
fn cifar_records_survive_truncation_and_flips() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cifar10-first20");
    let good = std::fs::read(fixture.join("test_batch.bin")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test_batch.bin");
    let mut rng = Rng(4);
    const RECORD: usize = 1 + 3 * 32 * 32;
    for _ in 0..TRIALS {
        let cut = rng.below(good.len());
        std::fs::write(&path, &good[..cut]).unwrap();
        let loaded = load_cifar10(dir.path(), Split::Test);
        // A cut on a record boundary is a smaller valid file; anywhere else it is an error.
        if cut > 0 && cut.is_multiple_of(RECORD) {
            assert_eq!(loaded.unwrap().len(), cut / RECORD);
        } else {
            assert!(loaded.is_err(), "truncated at {cut} bytes");
        }
    }
    for _ in 0..TRIALS {
        std::fs::write(&path, flipped(&good, RECORD, &mut rng)).unwrap();
        if let Ok(set) = load_cifar10(dir.path(), Split::Test) {
            assert!(set.labels.iter().all(|&l| l < 10));
            assert_eq!(set.images.len(), set.len() * 3 * 32 * 32);
        }
    }
}
