//! Property test of the project's own readers: random truncations and byte flips of a real
//! checkpoint (sidecar and weights) and of a replay buffer give an `Err` or a well-formed value,
//! never a panic, and a truncated file is always an `Err`. Seeded: every run tries the same inputs.

use std::path::Path;

use jem_attacks::UniformInit;
use jem_bench::backend::{self, Inference};
use jem_bench::model::Checkpoint;
use jem_bench::train::{ChainStart, ReplayBuffer};
use rand::{Rng, SeedableRng};

/// Inputs tried per reader and kind of damage.
const TRIALS: usize = 100;

fn flipped(bytes: &[u8], header: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let i = if rng.random_bool(0.5) {
            rng.random_range(0..header.min(b.len()))
        } else {
            rng.random_range(0..b.len())
        };
        b[i] ^= rng.random_range(1..=255u8);
    }
    b
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn sidecars_survive_truncation_and_flips() {
    let good = std::fs::read(root().join("results/models/baseline.json")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::at(dir.path().join("m"));
    std::fs::copy(
        root().join("results/models/baseline.safetensors"),
        &ckpt.weights,
    )
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for _ in 0..TRIALS {
        let cut = rng.random_range(0..good.len());
        std::fs::write(&ckpt.sidecar, &good[..cut]).unwrap();
        assert!(ckpt.read_sidecar().is_err(), "truncated at {cut} bytes");
    }
    let device = backend::device();
    for _ in 0..TRIALS {
        std::fs::write(&ckpt.sidecar, flipped(&good, good.len(), &mut rng)).unwrap();
        if let Ok(sidecar) = ckpt.read_sidecar() {
            // Whatever reads as valid must load or be refused, not panic.
            if sidecar.architecture.width <= 4 && sidecar.architecture.depth <= 40 {
                let _ = ckpt.load::<Inference>(&device);
            }
        }
    }
}

#[test]
fn weights_survive_truncation_and_flips() {
    let good = std::fs::read(root().join("results/models/baseline.safetensors")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::at(dir.path().join("m"));
    std::fs::copy(root().join("results/models/baseline.json"), &ckpt.sidecar).unwrap();
    let header = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let device = backend::device();
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    for _ in 0..TRIALS {
        let cut = rng.random_range(0..good.len());
        std::fs::write(&ckpt.weights, &good[..cut]).unwrap();
        let err = ckpt.load::<Inference>(&device).err();
        let err = err.unwrap_or_else(|| panic!("truncated at {cut} bytes, yet loaded"));
        assert!(format!("{err:#}").contains("m.safetensors"), "{err:#}");
    }
    for _ in 0..TRIALS {
        std::fs::write(&ckpt.weights, flipped(&good, header, &mut rng)).unwrap();
        let _ = ckpt.load::<Inference>(&device);
    }
}

#[test]
fn replay_buffers_survive_truncation_and_flips() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let start = ChainStart::Uniform(UniformInit {
        mean: vec![0.5],
        scale: vec![0.5],
    });
    let good = ReplayBuffer::new(6, [1, 5, 5], &start, &mut rng).to_bytes();
    let back = ReplayBuffer::from_bytes(&good, "buffer").unwrap();
    assert_eq!(back.to_bytes(), good);
    for _ in 0..TRIALS {
        let cut = rng.random_range(0..good.len());
        assert!(ReplayBuffer::from_bytes(&good[..cut], "buffer").is_err());
    }
    for _ in 0..TRIALS {
        if let Ok(b) = ReplayBuffer::from_bytes(&flipped(&good, 40, &mut rng), "buffer") {
            assert!(b.capacity() >= 1);
            assert_eq!(b.image(b.capacity() - 1).len(), b.image_len());
        }
    }
}
