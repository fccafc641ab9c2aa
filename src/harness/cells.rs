//! The unit of work of a sweep: one model, attack, K, gradient mode and (for fixed-ε attacks)
//! one ε. A minimum-perturbation attack runs once per model × K and answers every ε. Cells are
//! listed in a fixed order, so that a re-run finds the same cells and skips the finished ones.

use jem_attacks::GradMode;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AttackKind {
    Pgd,
    /// PGD with 4× the steps (each 4× shorter) and 2× the restarts: the convergence check
    /// (more steps and restarts should not help much; Carlini et al. 2019).
    #[serde(rename = "pgd-long")]
    PgdLong,
    Fgsm,
    Boundary,
    Pointwise,
}

impl AttackKind {
    pub fn name(self) -> &'static str {
        match self {
            AttackKind::Pgd => "pgd",
            AttackKind::PgdLong => "pgd-long",
            AttackKind::Fgsm => "fgsm",
            AttackKind::Boundary => "boundary",
            AttackKind::Pointwise => "pointwise",
        }
    }

    /// Decision-based attacks find a minimum perturbation; gradient attacks work at a fixed ε.
    pub fn fixed_eps(self) -> bool {
        matches!(
            self,
            AttackKind::Pgd | AttackKind::PgdLong | AttackKind::Fgsm
        )
    }

    pub fn uses_gradients(self) -> bool {
        self.fixed_eps()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub model: String,
    pub attack: AttackKind,
    pub k: usize,
    /// Gradient mode through the SGLD steps: only for gradient attacks with K > 0.
    pub grad: Option<GradMode>,
    /// The ε of a fixed-ε attack; `None` for a minimum-perturbation attack (all ε at once).
    pub eps: Option<f32>,
}

impl Cell {
    /// A file-name-safe identifier, unique within a sweep.
    pub fn id(&self) -> String {
        let model: String = self
            .model
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!(
            "{model}.{}.k{}.{}.{}",
            self.attack.name(),
            self.k,
            self.grad.map_or("none".into(), |g| g.to_string()),
            self.eps.map_or("min".into(), |e| format!("eps{e}"))
        )
    }
}

/// Every cell of a sweep, in order: models, then K, then gradient modes, then attacks, then ε.
pub fn list(
    models: &[String],
    attacks: &[AttackKind],
    ks: &[usize],
    grads: &[GradMode],
    eps: &[f32],
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for model in models {
        for &k in ks {
            for &attack in attacks {
                let modes: Vec<Option<GradMode>> = if attack.uses_gradients() && k > 0 {
                    grads.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for grad in modes {
                    if attack.fixed_eps() {
                        for &e in eps {
                            cells.push(Cell {
                                model: model.clone(),
                                attack,
                                k,
                                grad,
                                eps: Some(e),
                            });
                        }
                    } else {
                        cells.push(Cell {
                            model: model.clone(),
                            attack,
                            k,
                            grad,
                            eps: None,
                        });
                    }
                }
            }
        }
    }
    cells
}
