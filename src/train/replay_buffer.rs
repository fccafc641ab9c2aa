//! JEM's replay buffer of persistent SGLD chains (Grathwohl et al. 2020, Algorithm 1): each iteration draws chain starts
//! from the buffer, re-initialising each with probability ρ from the chain-start distribution
//! (U(−1, 1) on the network's scale in the paper), and writes the advanced chains back. It is saved with the training state, so that a
//! resumed run continues the same chains.

use super::chain_start::ChainStart;
use anyhow::Context;
use rand::Rng;

/// Persistent chains: `capacity` images of `shape` (C, H, W), in [0, 1] pixel units.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayBuffer {
    shape: [usize; 3],
    data: Vec<f32>,
}

/// Starts drawn from the buffer for one iteration.
#[derive(Debug, Clone)]
pub struct Draw {
    /// Buffer slots the starts came from (drawn with replacement, as the official code does).
    pub slots: Vec<usize>,
    /// `slots.len()` images, row-major.
    pub images: Vec<f32>,
    /// How many starts were re-initialised from noise.
    pub reinitialised: usize,
}

const MAGIC: &[u8; 8] = b"JEMRBUF1";

impl ReplayBuffer {
    /// A buffer filled from `noise`, the chain-start distribution.
    pub fn new(capacity: usize, shape: [usize; 3], noise: &ChainStart, rng: &mut impl Rng) -> Self {
        let len = shape.iter().product::<usize>();
        let mut data = Vec::with_capacity(capacity * len);
        for _ in 0..capacity {
            data.extend(noise.image(shape, rng));
        }
        Self { shape, data }
    }

    pub fn capacity(&self) -> usize {
        self.data.len() / self.image_len()
    }

    pub fn image_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// `n` chain starts: a random slot each, replaced by a fresh start with probability `reinit`.
    pub fn draw(&self, n: usize, reinit: f64, noise: &ChainStart, rng: &mut impl Rng) -> Draw {
        let len = self.image_len();
        let mut draw = Draw {
            slots: Vec::with_capacity(n),
            images: Vec::with_capacity(n * len),
            reinitialised: 0,
        };
        for _ in 0..n {
            let slot = rng.random_range(0..self.capacity());
            draw.slots.push(slot);
            if rng.random_bool(reinit) {
                draw.reinitialised += 1;
                draw.images.extend(noise.image(self.shape, rng));
            } else {
                draw.images
                    .extend_from_slice(&self.data[slot * len..(slot + 1) * len]);
            }
        }
        draw
    }

    /// Writes advanced chains back to their slots (a slot drawn twice keeps the last).
    pub fn store(&mut self, slots: &[usize], images: &[f32]) {
        let len = self.image_len();
        assert_eq!(images.len(), slots.len() * len, "one image per slot");
        for (i, &slot) in slots.iter().enumerate() {
            self.data[slot * len..(slot + 1) * len]
                .copy_from_slice(&images[i * len..(i + 1) * len]);
        }
    }

    /// The image shape (C, H, W) of every chain.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }

    /// Slot `i` as pixels.
    pub fn image(&self, i: usize) -> &[f32] {
        let len = self.image_len();
        &self.data[i * len..(i + 1) * len]
    }

    /// Little-endian: magic, capacity (u64), C, H, W (u64 each), then the pixels (f32).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.data.len() * 4);
        out.extend_from_slice(MAGIC);
        out.extend((self.capacity() as u64).to_le_bytes());
        for d in self.shape {
            out.extend((d as u64).to_le_bytes());
        }
        for v in &self.data {
            out.extend(v.to_le_bytes());
        }
        out
    }

    /// Reads [`Self::to_bytes`]; `what` names the source in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> anyhow::Result<Self> {
        anyhow::ensure!(
            bytes.len() >= 40 && &bytes[..8] == MAGIC,
            "{what}: not a jem-bench replay buffer (expected the magic `JEMRBUF1`)"
        );
        let word = |i: usize| {
            u64::from_le_bytes(bytes[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes")) as usize
        };
        let (capacity, shape) = (word(0), [word(1), word(2), word(3)]);
        anyhow::ensure!(
            capacity >= 1 && shape.iter().all(|&d| d >= 1),
            "{what}: replay buffer header is corrupt: capacity {capacity}, image shape {shape:?} \
             (expected at least one image of at least one pixel)"
        );
        let want = capacity
            .checked_mul(shape.iter().product::<usize>())
            .and_then(|n| n.checked_mul(4))
            .and_then(|n| n.checked_add(40))
            .context("replay buffer header is corrupt")?;
        anyhow::ensure!(
            bytes.len() == want,
            "{what}: replay buffer of {capacity} × {shape:?} needs {want} bytes, found {} \
             (truncated or corrupt)",
            bytes.len()
        );
        let data = bytes[40..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(Self { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jem_attacks::UniformInit;
    use rand::SeedableRng;

    fn init() -> ChainStart {
        ChainStart::Uniform(UniformInit {
            mean: vec![0.5],
            scale: vec![0.5],
        })
    }

    #[test]
    fn reinitialisation_rate_is_close_to_rho() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let buf = ReplayBuffer::new(100, [1, 2, 2], &init(), &mut rng);
        let (draws, rho) = (200, 0.05);
        let n: usize = (0..draws)
            .map(|_| buf.draw(64, rho, &init(), &mut rng).reinitialised)
            .sum();
        let total = (draws * 64) as f64;
        let rate = n as f64 / total;
        // Binomial: standard deviation sqrt(ρ(1−ρ)/n) ≈ 0.0019; allow four of them.
        assert!(
            (rate - rho).abs() < 4.0 * (rho * (1.0 - rho) / total).sqrt(),
            "rate {rate}"
        );
    }

    #[test]
    fn draws_come_from_the_buffer_and_stores_land_in_their_slots() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut buf = ReplayBuffer::new(10, [1, 2, 2], &init(), &mut rng);
        let d = buf.draw(6, 0.0, &init(), &mut rng);
        for (i, &s) in d.slots.iter().enumerate() {
            assert_eq!(&d.images[i * 4..(i + 1) * 4], buf.image(s));
        }
        let advanced: Vec<f32> = (0..24).map(|v| v as f32).collect();
        buf.store(&d.slots, &advanced);
        // The last write to a slot wins.
        for (i, &s) in d.slots.iter().enumerate() {
            let last = d.slots.iter().rposition(|&t| t == s).unwrap();
            assert_eq!(
                buf.image(s),
                &advanced[last * 4..(last + 1) * 4],
                "draw {i}"
            );
        }
    }

    #[test]
    fn survives_a_save_and_load_and_rejects_corrupt_bytes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let buf = ReplayBuffer::new(7, [3, 4, 5], &init_rgb(), &mut rng);
        let bytes = buf.to_bytes();
        assert_eq!(ReplayBuffer::from_bytes(&bytes, "buf").unwrap(), buf);
        let err = ReplayBuffer::from_bytes(&bytes[..bytes.len() - 4], "state/objective-3.bin")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("state/objective-3.bin") && err.contains("truncated"),
            "{err}"
        );
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(ReplayBuffer::from_bytes(&bad, "b")
            .unwrap_err()
            .to_string()
            .contains("magic"));
    }

    fn init_rgb() -> ChainStart {
        ChainStart::Uniform(UniformInit {
            mean: vec![0.4914, 0.4822, 0.4465],
            scale: vec![0.247, 0.243, 0.261],
        })
    }
}
