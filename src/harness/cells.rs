//! The unit of work of a sweep: one model, attack, K and gradient mode, over every ε. A
//! fixed-ε attack runs ε in ascending order on the examples still unbroken (a break at ε is one
//! at every larger ε); a minimum-perturbation attack runs once and answers every ε. Cells are
//! listed in a fixed order, so that a re-run finds the same cells and skips the finished ones.
//! A preset (`autoattack`, `autoattack-rand`) is one cell that runs its attacks as a cascade:
//! each on the examples the ones before it left standing at each ε. `adaptive`, the default,
//! stands for one of them per K: `autoattack` on the plain classifier (K = 0), `autoattack-rand`
//! through the stochastic SGLD defence (K > 0).

use crate::Choice;
use jem_attacks::{AutoAttack, AutoAttackVersion, GradMode};
use serde::{Deserialize, Serialize};

/// An attack of the sweep, or a preset of several run as a cascade. Its name ([`AttackKind::name`],
/// parsed back by [`FromStr`](std::str::FromStr)) is how the command line, `settings.json` and
/// the CSV files call it; [`AttackKind::description`] says what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttackKind {
    Pgd,
    PgdLong,
    Fgsm,
    ApgdCe,
    ApgdDlr,
    ApgdT,
    Square,
    FabT,
    Boundary,
    Pointwise,
    #[serde(rename = "autoattack")]
    AutoAttack,
    #[serde(rename = "autoattack-rand")]
    AutoAttackRand,
    Adaptive,
}

impl Choice for AttackKind {
    const WHAT: &'static str = "attack";

    const ALL: &'static [Self] = &[
        AttackKind::Pgd,
        AttackKind::PgdLong,
        AttackKind::Fgsm,
        AttackKind::ApgdCe,
        AttackKind::ApgdDlr,
        AttackKind::ApgdT,
        AttackKind::Square,
        AttackKind::FabT,
        AttackKind::Boundary,
        AttackKind::Pointwise,
        AttackKind::AutoAttack,
        AttackKind::AutoAttackRand,
        AttackKind::Adaptive,
    ];

    /// The attack's name: `pgd`, `apgd-ce`, `autoattack-rand`, ….
    fn name(self) -> &'static str {
        match self {
            AttackKind::Pgd => "pgd",
            AttackKind::PgdLong => "pgd-long",
            AttackKind::Fgsm => "fgsm",
            AttackKind::ApgdCe => "apgd-ce",
            AttackKind::ApgdDlr => "apgd-dlr",
            AttackKind::ApgdT => "apgd-t",
            AttackKind::Square => "square",
            AttackKind::FabT => "fab-t",
            AttackKind::Boundary => "boundary",
            AttackKind::Pointwise => "pointwise",
            AttackKind::AutoAttack => "autoattack",
            AttackKind::AutoAttackRand => "autoattack-rand",
            AttackKind::Adaptive => "adaptive",
        }
    }

    /// What the attack is, in one sentence (the command line's help shows it).
    fn description(self) -> &'static str {
        match self {
            AttackKind::Pgd => {
                "PGD (Madry et al. 2018): random start, --pgd-steps steps, --restarts"
            }
            AttackKind::PgdLong => {
                "PGD with 4× the steps (each 4× shorter) and 2× the restarts: the convergence \
                 check (more steps and restarts should not help much; Carlini et al. 2019)"
            }
            AttackKind::Fgsm => "One step of size ε (FGSM under L∞, FGM under L2)",
            AttackKind::ApgdCe => "APGD with cross-entropy (Croce & Hein 2020)",
            AttackKind::ApgdDlr => "APGD with the difference-of-logits-ratio loss",
            AttackKind::ApgdT => {
                "APGD with the targeted DLR loss against each of the 9 most likely other classes"
            }
            AttackKind::Square => {
                "The Square attack (Andriushchenko et al. 2020): score-based black box"
            }
            AttackKind::FabT => {
                "FAB-T (Croce & Hein 2020): minimum-norm, toward each of the 9 most likely \
                 other classes"
            }
            AttackKind::Boundary => {
                "Decision-based boundary attack (Brendel et al. 2018): a minimum perturbation \
                 per image"
            }
            AttackKind::Pointwise => {
                "Pointwise attack (Schott et al. 2019): a minimum L0 / L2 perturbation per image"
            }
            AttackKind::AutoAttack => {
                "Preset: AutoAttack's standard version: APGD-CE, APGD-T, FAB-T and Square, each \
                 on the examples the ones before it left standing"
            }
            AttackKind::AutoAttackRand => {
                "Preset: AutoAttack's version for randomised defences: APGD-CE, then APGD-DLR on \
                 what it left standing, each gradient averaged over EOT draws (see --eot)"
            }
            AttackKind::Adaptive => {
                "Preset, the default: an adaptive evaluation (Tramer et al. 2020; Croce et al. \
                 2022). `autoattack` at K = 0; at K > 0, where the SGLD steps make the model \
                 stochastic, `autoattack-rand` with gradients through the steps (--grad full) \
                 and EOT"
            }
        }
    }
}

impl AttackKind {
    /// The attack a cell at K runs: `adaptive` resolved (`autoattack` at K = 0,
    /// `autoattack-rand` at K > 0), any other attack itself.
    pub fn at(self, k: usize) -> AttackKind {
        match self {
            AttackKind::Adaptive if k == 0 => AttackKind::AutoAttack,
            AttackKind::Adaptive => AttackKind::AutoAttackRand,
            attack => attack,
        }
    }

    /// The version of AutoAttack a preset runs (jem-attacks' [`AutoAttack`]); `None` for a
    /// single attack and for `adaptive`, which is one of them per K.
    pub fn autoattack_version(self) -> Option<AutoAttackVersion> {
        match self {
            AttackKind::AutoAttack => Some(AutoAttackVersion::Standard),
            AttackKind::AutoAttackRand => Some(AutoAttackVersion::Rand),
            _ => None,
        }
    }

    /// The attacks a preset runs, in order (itself for a single attack).
    pub fn stages(self) -> Vec<AttackKind> {
        if let Some(version) = self.autoattack_version() {
            return AutoAttack::stage_names(version)
                .iter()
                .map(|name| {
                    AttackKind::parse(name).expect("AutoAttack's stages are attacks of the sweep")
                })
                .collect();
        }
        match self {
            // Every attack it may run, at one K or another.
            AttackKind::Adaptive => vec![
                AttackKind::ApgdCe,
                AttackKind::ApgdT,
                AttackKind::FabT,
                AttackKind::Square,
                AttackKind::ApgdDlr,
            ],
            single => vec![single],
        }
    }

    /// A preset: several attacks in a cascade.
    pub fn is_preset(self) -> bool {
        self.stages() != [self]
    }

    /// Attacks that follow the (defended) model's gradients, and so have a gradient mode
    /// through the SGLD steps and EOT draws (a preset has them when any of its attacks does):
    /// what each attack declares of itself ([`AttackKind::access`]).
    pub fn uses_gradients(self) -> bool {
        self.access() == jem_attacks::Access::Gradients
    }
}

/// What a cell runs: one of the sweep's attacks or presets, or an attack of the caller's own
/// ([`OwnAttack`](super::OwnAttack)), named as its [`Describe::name`](jem_attacks::Describe)
/// says. Written as that name in the cell files.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CellAttack {
    Kind(AttackKind),
    Own(String),
}

impl CellAttack {
    /// The attack's name: `pgd`, `autoattack-rand`, or an own attack's.
    pub fn name(&self) -> &str {
        match self {
            CellAttack::Kind(kind) => kind.name(),
            CellAttack::Own(name) => name,
        }
    }

    /// The built-in attack or preset, unless it is an own attack.
    pub fn kind(&self) -> Option<AttackKind> {
        match self {
            CellAttack::Kind(kind) => Some(*kind),
            CellAttack::Own(_) => None,
        }
    }
}

impl Serialize for CellAttack {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for CellAttack {
    /// A built-in attack's name (in any case) is that attack; any other name is an own one.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(AttackKind::parse(&name).map_or(CellAttack::Own(name), CellAttack::Kind))
    }
}

/// One model, attack, K and gradient mode, over every ε of the sweep: fixed-ε attacks run ε in
/// ascending order on the examples no smaller ε broke.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub model: String,
    pub attack: CellAttack,
    pub k: usize,
    /// Gradient mode through the SGLD steps: only for gradient attacks with K > 0.
    pub grad: Option<GradMode>,
}

impl Cell {
    /// The stem of the cell's files (`cells/<id>.json`, `cells/<id>.batches/`, saved
    /// adversarials): readable — the model's path with each character outside `[A-Za-z0-9-]`
    /// as `_` (its last 40), the attack, K and gradient mode — and unique: it ends in a digest
    /// of the cell's exact identity (model path, attack, K, gradient mode), so models whose
    /// paths read alike (`a/b/m` and `a_b/m`, `α/m` and `β/m`) never share a file. The files
    /// record the cell and the sweep's identity too, and are refused where they do not match.
    pub fn id(&self) -> String {
        let readable: Vec<char> = self
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
        let model: String = readable[readable.len().saturating_sub(40)..]
            .iter()
            .collect();
        let identity = serde_json::to_string(self).expect("a cell serialises");
        let digest = crate::digest::of(identity.as_bytes());
        // 64 bits of the digest: no two cells of one folder share them by chance.
        format!(
            "{model}.{}.k{}.{}.{}",
            self.attack.name(),
            self.k,
            self.grad.map_or("none".into(), |g| g.to_string()),
            &digest["sha256:".len()..][..16],
        )
    }
}

/// Every cell of a sweep, in order: models, then K, then attacks (`adaptive` resolved for
/// the K; an attack named twice that way runs once; then the own attacks, each with whether it
/// follows gradients), then gradient modes.
pub fn list(
    models: &[String],
    attacks: &[AttackKind],
    own: &[(String, bool)],
    ks: &[usize],
    grads: &[GradMode],
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for model in models {
        for &k in ks {
            let built_in = attacks
                .iter()
                .map(|a| (CellAttack::Kind(a.at(k)), a.at(k).uses_gradients()));
            let own = own
                .iter()
                .map(|(name, gradients)| (CellAttack::Own(name.clone()), *gradients));
            for (attack, gradients) in built_in.chain(own) {
                let modes: Vec<Option<GradMode>> = if gradients && k > 0 {
                    grads.iter().copied().map(Some).collect()
                } else {
                    vec![None]
                };
                for grad in modes {
                    let cell = Cell {
                        model: model.clone(),
                        attack: attack.clone(),
                        k,
                        grad,
                    };
                    if !cells.contains(&cell) {
                        cells.push(cell);
                    }
                }
            }
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_whose_models_read_alike_get_their_own_file_names() {
        let cell = |model: &str, k: usize| Cell {
            model: model.into(),
            attack: CellAttack::Kind(AttackKind::Pgd),
            k,
            grad: None,
        };
        let cells = [
            cell("X/a/b/m", 0),
            cell("X/a_b/m", 0),
            cell("X/a b/m", 0),
            cell("X/α/m", 0),
            cell("X/β/m", 0),
            cell("X/a/b/m", 1),
        ];
        let ids: std::collections::BTreeSet<String> = cells.iter().map(Cell::id).collect();
        assert_eq!(ids.len(), cells.len(), "{ids:?}");
        // Readable, file-safe, and the same for the same cell.
        let id = cells[0].id();
        assert!(id.starts_with("X_a_b_m.pgd.k0.none."), "{id}");
        assert!(
            id.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{id}"
        );
        assert_eq!(id, cell("X/a/b/m", 0).id());
        // A long path keeps its end, within a file name's limits.
        let long = cell(&"d/".repeat(200), 0).id();
        assert!(long.len() < 100, "{long}");
    }

    #[test]
    fn names_parse_back_and_are_the_serialised_names() {
        for &kind in AttackKind::ALL {
            assert_eq!(AttackKind::parse(kind.name()), Ok(kind));
            assert_eq!(AttackKind::parse(&kind.name().to_uppercase()), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert!(!kind.description().is_empty());
        }
        let names: std::collections::BTreeSet<&str> =
            AttackKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), AttackKind::ALL.len(), "names are unique");
        let error = AttackKind::parse("apgd").unwrap_err();
        assert!(
            error.contains("apgd-ce") && error.contains("\"apgd\""),
            "{error}"
        );
    }
}
