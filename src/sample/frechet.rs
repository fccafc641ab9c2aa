//! The Fréchet distance between two sets of feature vectors, each summarised by a Gaussian
//! (mean, covariance): ‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^½) (Dowson & Landau 1982; Heusel et
//! al. 2017 in Inception features, "FID"). Computed in f64 with the symmetric form
//! Tr (Σ₁^½ Σ₂ Σ₁^½)^½, whose matrix is symmetric positive semi-definite, so both square roots
//! come from a symmetric eigendecomposition (cyclic Jacobi: exact to rounding for the few
//! hundred dimensions of a penultimate layer, and dependency-free).

/// Mean and covariance (divided by n − 1, as numpy's `cov` and the FID reference code) of `n`
/// vectors of dimension `d`, stored row after row in `rows`.
#[derive(Debug, Clone, PartialEq)]
pub struct Moments {
    pub dim: usize,
    pub count: usize,
    pub mean: Vec<f64>,
    /// `dim × dim`, row-major.
    pub covariance: Vec<f64>,
}

impl Moments {
    /// The moments of `rows` (`count × dim` values). Needs at least two vectors.
    pub fn of(rows: &[f32], dim: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(dim >= 1, "feature vectors of dimension 0");
        anyhow::ensure!(
            rows.len().is_multiple_of(dim),
            "{} values do not split into vectors of {dim}",
            rows.len()
        );
        let count = rows.len() / dim;
        anyhow::ensure!(
            count >= 2,
            "a covariance needs at least 2 vectors, found {count}"
        );
        anyhow::ensure!(
            rows.iter().all(|v| v.is_finite()),
            "the feature vectors hold a NaN or an infinity"
        );
        let mut mean = vec![0.0; dim];
        for row in rows.chunks_exact(dim) {
            for (m, &v) in mean.iter_mut().zip(row) {
                *m += v as f64;
            }
        }
        mean.iter_mut().for_each(|m| *m /= count as f64);
        let mut covariance = vec![0.0; dim * dim];
        let mut centred = vec![0.0; dim];
        for row in rows.chunks_exact(dim) {
            for ((c, &v), m) in centred.iter_mut().zip(row).zip(&mean) {
                *c = v as f64 - m;
            }
            for i in 0..dim {
                let ci = centred[i];
                for j in i..dim {
                    covariance[i * dim + j] += ci * centred[j];
                }
            }
        }
        for i in 0..dim {
            for j in i..dim {
                let v = covariance[i * dim + j] / (count - 1) as f64;
                covariance[i * dim + j] = v;
                covariance[j * dim + i] = v;
            }
        }
        Ok(Self {
            dim,
            count,
            mean,
            covariance,
        })
    }
}

/// The Fréchet distance between the Gaussians of `a` and `b` (same dimension).
pub fn frechet_distance(a: &Moments, b: &Moments) -> f64 {
    assert_eq!(a.dim, b.dim, "feature dimensions differ");
    let d = a.dim;
    let mean_term: f64 = a
        .mean
        .iter()
        .zip(&b.mean)
        .map(|(x, y)| (x - y).powi(2))
        .sum();
    let trace = |m: &[f64]| (0..d).map(|i| m[i * d + i]).sum::<f64>();
    let root_a = psd_sqrt(&a.covariance, d);
    let inner = matmul(&matmul(&root_a, &b.covariance, d), &root_a, d);
    let (values, _) = symmetric_eigen(&inner, d);
    let cross: f64 = values.iter().map(|&l| l.max(0.0).sqrt()).sum();
    mean_term + trace(&a.covariance) + trace(&b.covariance) - 2.0 * cross
}

/// The square root of a symmetric positive semi-definite matrix (negative eigenvalues, which
/// only rounding produces, count as 0).
fn psd_sqrt(m: &[f64], d: usize) -> Vec<f64> {
    let (values, vectors) = symmetric_eigen(m, d);
    let mut out = vec![0.0; d * d];
    for (k, &l) in values.iter().enumerate() {
        let s = l.max(0.0).sqrt();
        for i in 0..d {
            let vik = vectors[i * d + k] * s;
            for j in 0..d {
                out[i * d + j] += vik * vectors[j * d + k];
            }
        }
    }
    out
}

fn matmul(a: &[f64], b: &[f64], d: usize) -> Vec<f64> {
    let mut out = vec![0.0; d * d];
    for i in 0..d {
        for k in 0..d {
            let aik = a[i * d + k];
            for j in 0..d {
                out[i * d + j] += aik * b[k * d + j];
            }
        }
    }
    out
}

/// Eigenvalues and eigenvectors (columns of a row-major `d × d` matrix) of a symmetric matrix,
/// by cyclic Jacobi rotations until the off-diagonal mass is below 1e-24 of the total.
pub fn symmetric_eigen(m: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = m.to_vec();
    let mut v = vec![0.0; d * d];
    (0..d).for_each(|i| v[i * d + i] = 1.0);
    let total: f64 = a.iter().map(|x| x * x).sum();
    for _sweep in 0..100 {
        let off: f64 = (0..d)
            .flat_map(|i| (0..d).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i * d + j].powi(2))
            .sum();
        if off <= 1e-24 * total || off == 0.0 {
            break;
        }
        for p in 0..d {
            for q in p + 1..d {
                let apq = a[p * d + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation that zeroes a[p][q] (Golub & Van Loan, Algorithm 8.4.1).
                let theta = (a[q * d + q] - a[p * d + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..d {
                    let (akp, akq) = (a[k * d + p], a[k * d + q]);
                    a[k * d + p] = c * akp - s * akq;
                    a[k * d + q] = s * akp + c * akq;
                }
                for k in 0..d {
                    let (apk, aqk) = (a[p * d + k], a[q * d + k]);
                    a[p * d + k] = c * apk - s * aqk;
                    a[q * d + k] = s * apk + c * aqk;
                }
                for k in 0..d {
                    let (vkp, vkq) = (v[k * d + p], v[k * d + q]);
                    v[k * d + p] = c * vkp - s * vkq;
                    v[k * d + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..d).map(|i| a[i * d + i]).collect(), v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn moments(mean: Vec<f64>, covariance: Vec<f64>) -> Moments {
        Moments {
            dim: mean.len(),
            count: 0,
            mean,
            covariance,
        }
    }

    /// A random orthogonal matrix (Gram–Schmidt on Gaussian columns).
    fn rotation(d: usize, rng: &mut impl Rng) -> Vec<f64> {
        let mut q = vec![0.0; d * d];
        for k in 0..d {
            let mut col: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
            for j in 0..k {
                let dot: f64 = (0..d).map(|i| col[i] * q[i * d + j]).sum();
                (0..d).for_each(|i| col[i] -= dot * q[i * d + j]);
            }
            let norm = col.iter().map(|x| x * x).sum::<f64>().sqrt();
            (0..d).for_each(|i| q[i * d + k] = col[i] / norm);
        }
        q
    }

    fn transpose(a: &[f64], d: usize) -> Vec<f64> {
        (0..d * d).map(|k| a[(k % d) * d + k / d]).collect()
    }

    #[test]
    fn eigen_decomposition_rebuilds_the_matrix() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for d in [1, 2, 5, 17, 64] {
            let r = rotation(d, &mut rng);
            let values: Vec<f64> = (0..d).map(|i| i as f64 - 3.0).collect();
            let mut diag = vec![0.0; d * d];
            (0..d).for_each(|i| diag[i * d + i] = values[i]);
            let m = matmul(&matmul(&r, &diag, d), &transpose(&r, d), d);
            let (mut found, vectors) = symmetric_eigen(&m, d);
            let mut lambda = vec![0.0; d * d];
            (0..d).for_each(|i| lambda[i * d + i] = found[i]);
            let rebuilt = matmul(&matmul(&vectors, &lambda, d), &transpose(&vectors, d), d);
            let err = rebuilt
                .iter()
                .zip(&m)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(err < 1e-9, "d {d}: rebuilt off by {err}");
            found.sort_by(f64::total_cmp);
            for (f, v) in found.iter().zip(&values) {
                assert!((f - v).abs() < 1e-9, "d {d}: eigenvalue {f} against {v}");
            }
        }
    }

    #[test]
    fn distance_matches_the_closed_form_for_commuting_covariances() {
        // Σ₁ = R diag(a) Rᵀ, Σ₂ = R diag(b) Rᵀ commute: Tr(Σ₁Σ₂)^½ = Σ √(aᵢbᵢ), so the distance
        // is ‖μ₁ − μ₂‖² + Σ (√aᵢ − √bᵢ)².
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let d = 12;
        let r = rotation(d, &mut rng);
        let a: Vec<f64> = (0..d).map(|_| rng.random_range(0.1..3.0)).collect();
        let b: Vec<f64> = (0..d).map(|_| rng.random_range(0.1..3.0)).collect();
        let cov = |v: &[f64]| {
            let mut diag = vec![0.0; d * d];
            (0..d).for_each(|i| diag[i * d + i] = v[i]);
            matmul(&matmul(&r, &diag, d), &transpose(&r, d), d)
        };
        let m1: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let m2: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        let expected: f64 = m1
            .iter()
            .zip(&m2)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            + a.iter()
                .zip(&b)
                .map(|(x, y)| (x.sqrt() - y.sqrt()).powi(2))
                .sum::<f64>();
        let got = frechet_distance(&moments(m1.clone(), cov(&a)), &moments(m2.clone(), cov(&b)));
        assert!((got - expected).abs() < 1e-9, "{got} against {expected}");
        // Symmetric in its arguments, and 0 between a Gaussian and itself.
        let back = frechet_distance(&moments(m2, cov(&b)), &moments(m1.clone(), cov(&a)));
        assert!((back - expected).abs() < 1e-9, "{back} against {expected}");
        let same = frechet_distance(&moments(m1.clone(), cov(&a)), &moments(m1, cov(&a)));
        assert!(same.abs() < 1e-9, "distance to itself {same}");
    }

    #[test]
    fn distance_matches_the_closed_form_in_one_dimension_and_for_scaled_covariances() {
        // 1-D: (μ₁ − μ₂)² + (σ₁ − σ₂)².
        let got = frechet_distance(
            &moments(vec![1.0], vec![4.0]),
            &moments(vec![-2.0], vec![9.0]),
        );
        assert!((got - (9.0 + 1.0)).abs() < 1e-12, "{got}");
        // Σ₂ = c²Σ₁ with Σ₁ not diagonal: Tr(Σ₁ + c²Σ₁ − 2cΣ₁) = (1 − c)² Tr Σ₁.
        let s = vec![2.0, 0.5, 0.3, 0.5, 1.0, -0.2, 0.3, -0.2, 1.5];
        let c = 1.7f64;
        let scaled: Vec<f64> = s.iter().map(|v| v * c * c).collect();
        let got = frechet_distance(&moments(vec![0.0; 3], s), &moments(vec![0.0; 3], scaled));
        let expected = (1.0 - c).powi(2) * 4.5;
        assert!((got - expected).abs() < 1e-9, "{got} against {expected}");
    }

    #[test]
    fn moments_are_numpys_and_bad_sets_are_refused() {
        let rows = [1.0f32, 2.0, 3.0, 6.0, 5.0, 10.0];
        let m = Moments::of(&rows, 2).unwrap();
        assert_eq!(m.count, 3);
        assert_eq!(m.mean, vec![3.0, 6.0]);
        // numpy.cov([[1, 3, 5], [2, 6, 10]]) = [[4, 8], [8, 16]].
        assert_eq!(m.covariance, vec![4.0, 8.0, 8.0, 16.0]);
        assert!(Moments::of(&[1.0, 2.0], 2).is_err(), "one vector");
        assert!(Moments::of(&[1.0, 2.0, 3.0], 2).is_err(), "ragged");
        assert!(Moments::of(&[1.0, f32::NAN, 3.0, 4.0], 2).is_err(), "NaN");
    }
}
