//! Data augmentation on host-side batches: reflect-padded random crops and horizontal flips
//! (JEM's CIFAR pipeline: pad 4, reflect, crop, flip). Flips are off for digits.

use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Augmentation {
    /// Pixels of reflect padding before the random crop back to the original size (0 = none).
    pub pad: usize,
    pub flip: bool,
}

impl Augmentation {
    pub const NONE: Augmentation = Augmentation {
        pad: 0,
        flip: false,
    };

    /// Augments `images` (`n` images of `c`×`h`×`w`, row-major) in place.
    pub fn apply(&self, images: &mut [f32], c: usize, h: usize, w: usize, rng: &mut impl Rng) {
        if self.pad == 0 && !self.flip {
            return;
        }
        let p = self.pad as isize;
        let reflect = |i: isize, n: usize| -> usize {
            let n = n as isize;
            let i = if i < 0 { -i } else { i };
            (if i >= n { 2 * (n - 1) - i } else { i }) as usize
        };
        let mut src = vec![0.0f32; c * h * w];
        for img in images.chunks_exact_mut(c * h * w) {
            src.copy_from_slice(img);
            let dy = rng.random_range(-(p as i64)..=p as i64) as isize;
            let dx = rng.random_range(-(p as i64)..=p as i64) as isize;
            let flip = self.flip && rng.random::<bool>();
            for ch in 0..c {
                for y in 0..h {
                    let sy = reflect(y as isize + dy, h);
                    for x in 0..w {
                        let xx = if flip { w - 1 - x } else { x };
                        let sx = reflect(xx as isize + dx, w);
                        img[(ch * h + y) * w + x] = src[(ch * h + sy) * w + sx];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn crops_are_shifts_with_reflection_and_flips_mirror() {
        let (h, w) = (5, 6);
        let img: Vec<f32> = (0..h * w).map(|i| i as f32).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for _ in 0..20 {
            let mut out = img.clone();
            Augmentation {
                pad: 2,
                flip: false,
            }
            .apply(&mut out, 1, h, w, &mut rng);
            // Some shift (dy, dx) in [-2, 2]² reproduces the output with reflection.
            let found = (-2isize..=2).any(|dy| {
                (-2isize..=2).any(|dx| {
                    (0..h).all(|y| {
                        (0..w).all(|x| {
                            let r = |i: isize, n: isize| {
                                let i = i.abs();
                                if i >= n {
                                    2 * (n - 1) - i
                                } else {
                                    i
                                }
                            };
                            let sy = r(y as isize + dy, h as isize) as usize;
                            let sx = r(x as isize + dx, w as isize) as usize;
                            out[y * w + x] == img[sy * w + sx]
                        })
                    })
                })
            });
            assert!(found);
        }
        let mut out = img.clone();
        let mut flipped_once = false;
        for _ in 0..10 {
            out.copy_from_slice(&img);
            Augmentation { pad: 0, flip: true }.apply(&mut out, 1, h, w, &mut rng);
            if out != img {
                flipped_once = true;
                assert_eq!(out[0], img[w - 1]);
            }
        }
        assert!(flipped_once);
    }
}
