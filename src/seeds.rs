//! Seeds for independent random streams, derived from a run's seed.

/// SplitMix64's finaliser (Steele et al. 2014): nearby inputs give unrelated outputs, so
/// seeds mixed from (seed, stream, index) by XOR with odd multiples draw independent streams.
pub fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The golden-ratio increment of SplitMix64, which spreads consecutive integers apart.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
