//! Where JEM's SGLD chains start. The paper starts them from U(−1, 1) noise; JEM++ (Yang & Ji,
//! ICCV 2021, "informative initialisation") starts them from a Gaussian per class fitted to the
//! training images, full covariance, so that short chains begin near the data instead of
//! having to find it from noise — the part a small model on a CPU cannot afford.

use anyhow::Context;
use jem_attacks::UniformInit;
use jem_datasets::ImageSet;
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

/// Which distribution starts (and re-starts) the chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChainStartKind {
    #[default]
    Uniform,
    ClassGaussian,
}

impl crate::Choice for ChainStartKind {
    const WHAT: &'static str = "chain start";

    const ALL: &'static [Self] = &[ChainStartKind::Uniform, ChainStartKind::ClassGaussian];

    fn name(self) -> &'static str {
        match self {
            ChainStartKind::Uniform => "uniform",
            ChainStartKind::ClassGaussian => "class-gaussian",
        }
    }

    fn description(self) -> &'static str {
        match self {
            ChainStartKind::Uniform => "U(−1, 1) on the network's scale (the paper)",
            ChainStartKind::ClassGaussian => {
                "A Gaussian per class fitted to the training images (JEM++)"
            }
        }
    }
}

/// A chain-start distribution, ready to draw from.
#[derive(Debug, Clone)]
pub enum ChainStart {
    Uniform(UniformInit),
    ClassGaussian(ClassGaussians),
}

impl ChainStart {
    /// The distribution `kind` on the network's scale described by `bounds` (U(−1, 1) per
    /// channel); the class Gaussians are fitted to `train`.
    pub fn new(
        kind: ChainStartKind,
        bounds: UniformInit,
        train: &ImageSet,
    ) -> anyhow::Result<Self> {
        Ok(match kind {
            ChainStartKind::Uniform => Self::Uniform(bounds),
            ChainStartKind::ClassGaussian => {
                Self::ClassGaussian(ClassGaussians::fit(train, bounds)?)
            }
        })
    }

    /// One start of shape (C, H, W); for the class Gaussians, of a class drawn uniformly.
    pub fn image(&self, shape: [usize; 3], rng: &mut impl Rng) -> Vec<f32> {
        match self {
            Self::Uniform(u) => u.image(shape, rng),
            Self::ClassGaussian(g) => {
                let class = rng.random_range(0..g.num_classes());
                g.sample(class, rng)
            }
        }
    }

    /// One start for a chain meant to end in `class` (uniform noise ignores the class).
    pub fn image_of_class(&self, class: usize, shape: [usize; 3], rng: &mut impl Rng) -> Vec<f32> {
        match self {
            Self::Uniform(u) => u.image(shape, rng),
            Self::ClassGaussian(g) => g.sample(class, rng),
        }
    }

    /// How the starts are drawn, for records.
    pub fn describe(&self) -> &'static str {
        match self {
            Self::Uniform(_) => "uniform noise U(-1, 1) on the network scale",
            Self::ClassGaussian(_) => {
                "a Gaussian per class fitted to the training images (full covariance), \
                 clamped to [-1, 1] on the network scale"
            }
        }
    }
}

/// N(μ_c, Σ_c + ridge·I) per class c, fitted to the training images, drawn as μ + L·z with
/// L the Cholesky factor, then clamped to the U(−1, 1) box of the network's scale.
#[derive(Debug, Clone)]
pub struct ClassGaussians {
    dim: usize,
    /// `means[c]`: `dim` pixels.
    means: Vec<Vec<f64>>,
    /// `factors[c]`: lower-triangular L, `dim × dim` row-major, with L·Lᵀ = Σ_c + ridge·I.
    factors: Vec<Vec<f64>>,
    /// The clamp bounds, per channel (pixels: mean ± scale).
    bounds: UniformInit,
}

/// Added to each class covariance, on the network's scale (as JEM++ does): pixels that never
/// change (MNIST's border) would make Σ singular.
const RIDGE: f64 = 1e-4;

impl ClassGaussians {
    /// Fits one Gaussian per class of `train`; every class needs two images or more.
    pub fn fit(train: &ImageSet, bounds: UniformInit) -> anyhow::Result<Self> {
        let dim = train.image_len();
        let plane = train.height * train.width;
        anyhow::ensure!(
            bounds.mean.len() == train.channels,
            "one chain-start bound per channel: {} for {} channels",
            bounds.mean.len(),
            train.channels
        );
        let mut means = Vec::new();
        let mut factors = Vec::new();
        for class in 0..train.num_classes() {
            let members: Vec<usize> = (0..train.len())
                .filter(|&i| usize::from(train.labels[i]) == class)
                .collect();
            anyhow::ensure!(
                members.len() >= 2,
                "{}: class {class} has {} images; a class Gaussian needs at least 2",
                train.name,
                members.len()
            );
            let n = members.len() as f64;
            let mut mean = vec![0.0f64; dim];
            for &i in &members {
                for (m, &p) in mean.iter_mut().zip(train.image(i)) {
                    *m += f64::from(p);
                }
            }
            mean.iter_mut().for_each(|m| *m /= n);
            // The lower triangle of Σ = (1/n) Σ_i (x_i − μ)(x_i − μ)ᵀ.
            let mut cov = vec![0.0f64; dim * dim];
            let mut centred = vec![0.0f64; dim];
            for &i in &members {
                for ((d, &p), m) in centred.iter_mut().zip(train.image(i)).zip(&mean) {
                    *d = f64::from(p) - m;
                }
                for r in 0..dim {
                    let a = centred[r];
                    let row = &mut cov[r * dim..r * dim + r + 1];
                    for (v, &b) in row.iter_mut().zip(&centred[..=r]) {
                        *v += a * b;
                    }
                }
            }
            for r in 0..dim {
                let scale = f64::from(bounds.scale[r / plane]);
                for v in &mut cov[r * dim..r * dim + r + 1] {
                    *v /= n;
                }
                cov[r * dim + r] += RIDGE * scale * scale;
            }
            let factor = cholesky(cov, dim)
                .with_context(|| format!("{}: the Gaussian of class {class}", train.name))?;
            means.push(mean);
            factors.push(factor);
        }
        Ok(Self {
            dim,
            means,
            factors,
            bounds,
        })
    }

    pub fn num_classes(&self) -> usize {
        self.means.len()
    }

    /// The fitted mean of `class`, in pixels.
    pub fn mean(&self, class: usize) -> &[f64] {
        &self.means[class]
    }

    /// The fitted covariance entry `Σ[r][c]` (ridge included) of `class`, from the factor.
    pub fn covariance(&self, class: usize, r: usize, c: usize) -> f64 {
        let l = &self.factors[class];
        let k = r.min(c) + 1;
        (0..k)
            .map(|j| l[r * self.dim + j] * l[c * self.dim + j])
            .sum()
    }

    /// One image of `class`: μ + L·z, z ~ N(0, I), clamped to the bounds.
    pub fn sample(&self, class: usize, rng: &mut impl Rng) -> Vec<f32> {
        let z: Vec<f64> = (0..self.dim).map(|_| StandardNormal.sample(rng)).collect();
        let (mean, l) = (&self.means[class], &self.factors[class]);
        let plane = self.dim / self.bounds.mean.len();
        (0..self.dim)
            .map(|r| {
                let row = &l[r * self.dim..r * self.dim + r + 1];
                let v = mean[r] + row.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>();
                let (m, s) = (self.bounds.mean[r / plane], self.bounds.scale[r / plane]);
                (v as f32).clamp(m - s, m + s)
            })
            .collect()
    }
}

/// The lower Cholesky factor of the symmetric matrix whose lower triangle `a` holds (n × n,
/// row-major); fails on a matrix that is not positive definite.
fn cholesky(mut a: Vec<f64>, n: usize) -> anyhow::Result<Vec<f64>> {
    for j in 0..n {
        let (done, rest) = a.split_at_mut(j * n);
        let row_j = &mut rest[..n];
        // L[j][k] for k < j, then the pivot.
        for k in 0..j {
            let row_k = &done[k * n..k * n + k + 1];
            let dot: f64 = row_j[..k].iter().zip(&row_k[..k]).map(|(x, y)| x * y).sum();
            row_j[k] = (row_j[k] - dot) / row_k[k];
        }
        let pivot = row_j[j] - row_j[..j].iter().map(|x| x * x).sum::<f64>();
        anyhow::ensure!(
            pivot > 0.0 && pivot.is_finite(),
            "covariance is not positive definite (pivot {pivot:e} at row {j})"
        );
        row_j[j] = pivot.sqrt();
        row_j[j + 1..].iter_mut().for_each(|v| *v = 0.0);
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn unit_box(channels: usize) -> UniformInit {
        UniformInit {
            mean: vec![0.5; channels],
            scale: vec![0.5; channels],
        }
    }

    #[test]
    fn cholesky_reproduces_the_matrix_and_refuses_an_indefinite_one() {
        // A = B·Bᵀ + I for a fixed B: positive definite.
        let n = 5;
        let b: Vec<f64> = (0..n * n)
            .map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0)
            .collect();
        let mut a = vec![0.0; n * n];
        for r in 0..n {
            for c in 0..n {
                a[r * n + c] = (0..n).map(|k| b[r * n + k] * b[c * n + k]).sum::<f64>()
                    + f64::from(u8::from(r == c));
            }
        }
        let l = cholesky(a.clone(), n).unwrap();
        for r in 0..n {
            for c in 0..n {
                let llt: f64 = (0..n).map(|k| l[r * n + k] * l[c * n + k]).sum();
                assert!((llt - a[r * n + c]).abs() < 1e-9, "({r}, {c})");
                if c > r {
                    assert_eq!(l[r * n + c], 0.0);
                }
            }
        }
        let indefinite = vec![1.0, 0.0, 2.0, 1.0];
        let err = cholesky(indefinite, 2).unwrap_err().to_string();
        assert!(err.contains("not positive definite"), "{err}");
    }

    /// Two classes of 2-pixel images with known means and covariances: the fit recovers them,
    /// and draws have that mean and covariance.
    #[test]
    fn fits_each_class_and_draws_with_its_moments() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        // Class 0 around (0.3, 0.6), pixels correlated; class 1 around (0.7, 0.4), independent.
        let mut images = Vec::new();
        let mut labels = Vec::new();
        for i in 0..4000 {
            let (a, b): (f64, f64) = (
                StandardNormal.sample(&mut rng),
                StandardNormal.sample(&mut rng),
            );
            let class = i % 2;
            let px = if class == 0 {
                [0.3 + 0.05 * a, 0.6 + 0.04 * a + 0.03 * b]
            } else {
                [0.7 + 0.02 * a, 0.4 + 0.06 * b]
            };
            images.extend(px.map(|v| v as f32));
            labels.push(class as u8);
        }
        let set = ImageSet {
            name: "toy".into(),
            images,
            labels,
            channels: 1,
            height: 1,
            width: 2,
            class_names: vec!["a".into(), "b".into()],
        };
        let g = ClassGaussians::fit(&set, unit_box(1)).unwrap();
        let ridge = RIDGE * 0.25;
        let want = [
            ([0.3, 0.6], [[0.0025, 0.002], [0.002, 0.0016 + 0.0009]]),
            ([0.7, 0.4], [[0.0004, 0.0], [0.0, 0.0036]]),
        ];
        for (class, (mean, cov)) in want.iter().enumerate() {
            for r in 0..2 {
                assert!(
                    (g.mean(class)[r] - mean[r]).abs() < 0.005,
                    "mean {class} {r}"
                );
                for (c, &want) in cov[r].iter().enumerate() {
                    let expect = want + if r == c { ridge } else { 0.0 };
                    let got = g.covariance(class, r, c);
                    assert!(
                        (got - expect).abs() < 0.1 * 0.0025,
                        "cov {class} ({r},{c}): {got}"
                    );
                }
            }
            // Draws: their sample moments match the fitted ones.
            let n = 20_000;
            let draws: Vec<Vec<f32>> = (0..n).map(|_| g.sample(class, &mut rng)).collect();
            let m: Vec<f64> = (0..2)
                .map(|r| draws.iter().map(|d| f64::from(d[r])).sum::<f64>() / n as f64)
                .collect();
            for r in 0..2 {
                assert!(
                    (m[r] - g.mean(class)[r]).abs() < 0.002,
                    "draw mean {class} {r}"
                );
                for c in 0..2 {
                    let s: f64 = draws
                        .iter()
                        .map(|d| (f64::from(d[r]) - m[r]) * (f64::from(d[c]) - m[c]))
                        .sum::<f64>()
                        / n as f64;
                    let fitted = g.covariance(class, r, c);
                    assert!(
                        (s - fitted).abs() < 0.05 * 0.0036,
                        "draw cov {class} ({r},{c})"
                    );
                }
            }
        }
    }

    #[test]
    fn draws_are_clamped_to_the_bounds_and_a_class_of_one_image_is_refused() {
        let set = ImageSet {
            name: "wide".into(),
            images: vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.4, 0.6],
            labels: vec![0, 0, 0, 0, 1],
            channels: 1,
            height: 1,
            width: 2,
            class_names: vec!["a".into(), "b".into()],
        };
        let err = ClassGaussians::fit(&set, unit_box(1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("wide") && err.contains("class 1 has 1 images"),
            "{err}"
        );
        let set = ImageSet {
            labels: vec![0, 0, 0, 1, 1],
            ..set
        };
        let g = ClassGaussians::fit(&set, unit_box(1)).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let all: Vec<f32> = (0..500).flat_map(|_| g.sample(0, &mut rng)).collect();
        assert!(all.iter().all(|v| (0.0..=1.0).contains(v)));
        assert!(
            all.iter().any(|&v| v == 0.0 || v == 1.0),
            "wide class never clamped"
        );
    }
}
