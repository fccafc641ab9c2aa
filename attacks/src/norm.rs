//! The two threat models, L∞ and L2, as one type: every attack is written once against
//! [`Norm`]'s operations (steepest-ascent direction, projection onto the ε-ball, random start,
//! size), so that no attack exists in a copy per norm. Sizes are in [0, 1] pixel units
//! (L2 is the plain Euclidean norm, not foolbox 1.x's RMS).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::noise;

/// A threat model: the norm in which perturbations and ε are measured, in [0, 1] pixel units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// L∞: the largest change of any pixel.
    Linf,
    /// L2: the Euclidean length of the whole perturbation (not foolbox 1.x's RMS).
    L2,
}

/// Keeps divisions by a zero gradient or perturbation finite.
const TINY: f32 = 1e-12;

impl Norm {
    /// Whether a perturbation of size `distance` (in this norm) lies within the budget `eps`,
    /// up to the f32 rounding of a projection onto the ball (relative 1e-5, absolute 1e-7):
    /// the one rule by which every break within ε is counted.
    pub fn within(distance: f32, eps: f32) -> bool {
        distance <= eps * (1.0 + 1e-5) + 1e-7
    }

    /// `linf` or `l2`, as displayed and parsed.
    pub fn name(self) -> &'static str {
        match self {
            Norm::Linf => "linf",
            Norm::L2 => "l2",
        }
    }

    /// Per-example size of `[N, …]` perturbations, `[N]`.
    pub fn size<B: Backend>(self, delta: Tensor<B, 4>) -> Tensor<B, 1> {
        let [n, ..] = delta.dims();
        let flat = delta.flatten::<2>(1, 3);
        match self {
            Norm::Linf => flat.abs().max_dim(1).reshape([n]),
            Norm::L2 => flat.powf_scalar(2.0).sum_dim(1).sqrt().reshape([n]),
        }
    }

    /// The unit-size direction of steepest ascent of a linearised loss with gradient `g`:
    /// sign(g) for L∞, g / ‖g‖₂ for L2.
    pub fn steepest<B: Backend>(self, g: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Norm::Linf => g.sign(),
            Norm::L2 => {
                let [n, ..] = g.dims();
                let len = Norm::L2
                    .size(g.clone())
                    .clamp_min(TINY)
                    .reshape([n, 1, 1, 1]);
                g / len
            }
        }
    }

    /// Projects perturbations onto the ball of radius `eps` (per example, `[N]`).
    pub fn project<B: Backend>(self, delta: Tensor<B, 4>, eps: Tensor<B, 1>) -> Tensor<B, 4> {
        let [n, ..] = delta.dims();
        let eps = eps.reshape([n, 1, 1, 1]);
        match self {
            Norm::Linf => {
                let eps = eps.expand(delta.dims());
                delta.max_pair(eps.clone().neg()).min_pair(eps)
            }
            Norm::L2 => {
                let len = Norm::L2
                    .size(delta.clone())
                    .clamp_min(TINY)
                    .reshape([n, 1, 1, 1]);
                let factor = (eps / len).clamp_max(1.0);
                delta * factor
            }
        }
    }

    /// A uniform draw from the ball of radius `eps` (per example): uniform in the cube for
    /// L∞; for L2 a Gaussian direction scaled by ε·U^(1/D), which is uniform in volume.
    pub fn random_in_ball<B: Backend>(
        self,
        dims: [usize; 4],
        eps: Tensor<B, 1>,
        rng: &mut impl Rng,
        device: &B::Device,
    ) -> Tensor<B, 4> {
        let n = dims[0];
        let d: usize = dims[1..].iter().product();
        match self {
            Norm::Linf => noise::uniform(dims, -1.0, 1.0, rng, device) * eps.reshape([n, 1, 1, 1]),
            Norm::L2 => {
                let dir = Norm::L2.steepest(noise::gaussian::<B, 4>(dims, rng, device));
                let radius: Tensor<B, 1> =
                    noise::uniform([n], 0.0, 1.0, rng, device).powf_scalar(1.0 / d as f32);
                dir * (radius * eps).reshape([n, 1, 1, 1])
            }
        }
    }
}

impl std::str::FromStr for Norm {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        match s.to_ascii_lowercase().as_str() {
            "linf" | "inf" | "l_inf" => Ok(Norm::Linf),
            "l2" | "2" => Ok(Norm::L2),
            _ => Err(crate::UnknownName {
                what: "norm",
                found: s.to_string(),
                expected: "linf or l2",
            }),
        }
    }
}

impl std::fmt::Display for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
