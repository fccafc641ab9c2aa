//! The rows a sweep writes, as types: a `robust.csv` row ([`TidyRow`], with the `grad` and
//! `attack` columns' types), a per-example `examples.csv` row ([`ExampleRow`]), and a finished
//! cell ([`CellResult`]) holding both. How they are computed lies above (`robustness`), how they
//! are stored above that (`outputs`).

use jem_attacks::{ExampleOutcome, GradMode, Norm};
use serde::{Deserialize, Serialize};

use super::cells::{AttackKind, Cell};
use crate::Choice;

/// The `grad` column of a row: how the attack's gradients pass the SGLD steps.
///
/// The variants are declared in the order of their names, so that rows sort as their text does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradColumn {
    /// A worst case over every gradient mode of a model and K.
    All,
    /// Through BPDA (the steps as the identity on the way back): robust accuracy at K > 0 is an
    /// upper bound.
    Bpda,
    /// Through every SGLD step, exactly.
    Full,
    /// No SGLD steps to pass (K = 0), or an attack that takes no gradients.
    None,
}

impl GradColumn {
    /// The column of a cell of gradient mode `mode` (`None`: K = 0 or no gradients).
    pub fn of(mode: Option<GradMode>) -> Self {
        match mode {
            Option::None => GradColumn::None,
            Some(GradMode::Bpda) => GradColumn::Bpda,
            Some(GradMode::Full) => GradColumn::Full,
        }
    }

    /// The text in the CSV: `all`, `bpda`, `full`, `none`.
    pub fn name(self) -> &'static str {
        match self {
            GradColumn::All => "all",
            GradColumn::Bpda => "bpda",
            GradColumn::Full => "full",
            GradColumn::None => "none",
        }
    }
}

impl std::fmt::Display for GradColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that table widths apply.
        f.pad(self.name())
    }
}

/// The `attack` column of a row: one attack (`pgd`), one stage of a preset's cascade
/// (`autoattack/square`: the joint outcome of that stage and the stages before it), an attack
/// of the caller's own (by its name), or the per-example worst case over every attack of a
/// model, K and gradient mode (`worst-case`). Written as that text in the CSV and JSON files,
/// and ordered as the text is, so that rows sort as they read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RowAttack {
    Attack(AttackKind),
    Stage {
        preset: AttackKind,
        stage: AttackKind,
    },
    Own(String),
    WorstCase,
}

impl RowAttack {
    /// The built-in attack the row is of (a stage's own attack); `None` for an own attack and
    /// the worst case.
    pub fn single(&self) -> Option<AttackKind> {
        match self {
            RowAttack::Attack(kind) | RowAttack::Stage { stage: kind, .. } => Some(*kind),
            RowAttack::Own(_) | RowAttack::WorstCase => None,
        }
    }

    /// Whether the row's attack follows the (defended) model's gradients (`Some(true)`) or sees
    /// only scores or decisions (`Some(false)`), as the attack declares it ([`AttackKind::access`];
    /// an own attack: its entry in `own`, name and whether it follows gradients); `None` for the
    /// worst case and an own attack not in `own`.
    pub fn follows_gradients(&self, own: &[(String, bool)]) -> Option<bool> {
        match self {
            RowAttack::Own(name) => own.iter().find(|(n, _)| n == name).map(|&(_, g)| g),
            attack => attack.single().map(AttackKind::uses_gradients),
        }
    }

    /// The preset whose cascade the row is a stage of.
    pub fn preset(&self) -> Option<AttackKind> {
        match self {
            RowAttack::Stage { preset, .. } => Some(*preset),
            _ => None,
        }
    }
}

/// The text of the worst-case rows' `attack`.
const WORST_CASE_NAME: &str = "worst-case";

impl std::fmt::Display for RowAttack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that table widths apply.
        match self {
            RowAttack::Attack(kind) => f.pad(kind.name()),
            RowAttack::Stage { preset, stage } => {
                f.pad(&format!("{}/{}", preset.name(), stage.name()))
            }
            RowAttack::Own(name) => f.pad(name),
            RowAttack::WorstCase => f.pad(WORST_CASE_NAME),
        }
    }
}

impl std::str::FromStr for RowAttack {
    type Err = String;

    /// A built-in attack's name, `preset/stage`, `worst-case`, or else an own attack's name.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == WORST_CASE_NAME {
            return Ok(RowAttack::WorstCase);
        }
        Ok(match s.split_once('/') {
            Some((preset, stage)) => RowAttack::Stage {
                preset: AttackKind::parse(preset)?,
                stage: AttackKind::parse(stage)?,
            },
            None if s.is_empty() => return Err("an empty attack name".into()),
            None => AttackKind::parse(s).map_or(RowAttack::Own(s.to_string()), RowAttack::Attack),
        })
    }
}

/// A row's attack against its text (`row.attack == "autoattack/square"`).
impl PartialEq<&str> for RowAttack {
    // The row's text is built to compare: rows are few, and the text is what the files hold.
    #[allow(clippy::cmp_owned)]
    fn eq(&self, text: &&str) -> bool {
        self.to_string() == *text
    }
}

impl PartialOrd for RowAttack {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RowAttack {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

impl Serialize for RowAttack {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RowAttack {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One row per model × attack × norm × ε × K × gradient mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TidyRow {
    pub model: String,
    pub attack: RowAttack,
    /// `linf` or `l2` in the CSV.
    pub norm: Norm,
    /// Perturbation budget in [0, 1] pixel units (L2: Euclidean norm, not RMS).
    pub eps: f32,
    pub k: usize,
    pub grad: GradColumn,
    pub n: usize,
    pub clean_accuracy: f64,
    /// 95 % Wilson interval of the clean accuracy.
    pub clean_lo: f64,
    pub clean_hi: f64,
    /// Fraction of the examples no attack of the row broke within ε; an example broken at a
    /// smaller ε counts as broken here too. `attack` = `worst-case`: over every attack of the
    /// model, K and gradient mode, per example.
    pub robust_accuracy: f64,
    /// 95 % Wilson interval of the robust accuracy.
    pub robust_lo: f64,
    pub robust_hi: f64,
    pub eot: usize,
    pub restarts: usize,
    pub chains: usize,
    pub recheck_chains: usize,
    pub seed: u64,
    /// Every setting of the attack, as JSON.
    pub attack_settings: String,
    /// Every setting of the SGLD defence in force (steps, α, σ, clamping, chains, re-check
    /// chains, input noise, gradient mode), as JSON; `{}` for K = 0.
    pub defence: String,
    /// Two clean passes on the same inputs gave different logits (attack such a model with EOT).
    pub stochastic: bool,
    /// Correctly classified probed inputs whose loss gradient was exactly zero (masked
    /// gradients).
    pub zero_gradients: usize,
    /// The robust accuracy is an upper bound, which a stronger attack may lower: the gradients
    /// through the K > 0 SGLD steps were approximated by BPDA (an adaptive attack, `--grad full`
    /// with EOT, may find more), or the row is a quick look's (`--quick`: weaker budgets).
    pub upper_bound: bool,
    /// The convergence check of a stochastic cell, on the rows of its attack's last stage (a
    /// cascade's joint outcome): how many of the examples still standing at this ε were
    /// sampled and attacked again, once with 4× the EOT draws and once with 2× the
    /// iterations. Empty where no check ran (deterministic models, nothing left standing).
    pub check_sampled: Option<usize>,
    /// Of the sampled examples, those the 4× EOT re-attack broke.
    pub check_broken_eot: Option<usize>,
    /// Of the sampled examples, those the 2× iterations re-attack broke.
    pub check_broken_iterations: Option<usize>,
    /// Of the sampled examples, those either re-attack broke.
    pub check_broken: Option<usize>,
    pub data: String,
    pub software: String,
    pub backend: String,
}

impl TidyRow {
    /// Whether the row's robust accuracy is only an upper bound from a non-adaptive gradient
    /// (BPDA through K > 0 SGLD steps, see [`TidyRow::upper_bound`]).
    pub fn is_bpda_bound(&self) -> bool {
        self.k > 0 && self.grad == GradColumn::Bpda
    }

    /// The robust accuracy with the convergence check's breaks counted: the first estimate
    /// times the fraction of the sampled survivors that withstood both re-attacks.
    pub fn checked_robust_accuracy(&self) -> Option<f64> {
        let (sampled, broken) = (self.check_sampled?, self.check_broken?);
        (sampled > 0)
            .then(|| self.robust_accuracy * (sampled - broken.min(sampled)) as f64 / sampled as f64)
    }

    /// The convergence check's estimate fell below the first estimate's 95 % interval: the
    /// attack had not converged.
    pub fn check_moved(&self) -> bool {
        self.checked_robust_accuracy()
            .is_some_and(|checked| checked < self.robust_lo)
    }

    /// What a row must be to be used or reported: ε ≥ 0; n ≥ 1; each accuracy a count of the n
    /// examples, in its interval within [0, 1]; robust ≤ clean; the convergence check's counts
    /// within its sample. The reason, where it is not.
    pub fn check(&self) -> Result<(), String> {
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(format!("eps {} is not a budget ≥ 0", self.eps));
        }
        if self.n == 0 {
            return Err("n is 0: an accuracy of no examples".into());
        }
        let n = self.n as f64;
        for (what, value, lo, hi) in [
            (
                "clean_accuracy",
                self.clean_accuracy,
                self.clean_lo,
                self.clean_hi,
            ),
            (
                "robust_accuracy",
                self.robust_accuracy,
                self.robust_lo,
                self.robust_hi,
            ),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!("{what} {value} is not in [0, 1]"));
            }
            if ((value * n).round() - value * n).abs() > 1e-6 * n {
                return Err(format!("{what} {value} is no count of its {n} examples"));
            }
            // Intervals are written to 17 digits; allow their last.
            let slack = 1e-12;
            if !(lo >= -slack && lo <= value + slack && value <= hi + slack && hi <= 1.0 + slack) {
                return Err(format!(
                    "{what} {value} is outside its interval [{lo}, {hi}] or that is not within \
                     [0, 1]"
                ));
            }
        }
        if self.robust_accuracy > self.clean_accuracy + 1e-12 {
            return Err(format!(
                "robust_accuracy {} exceeds clean_accuracy {}",
                self.robust_accuracy, self.clean_accuracy
            ));
        }
        let counts = [
            self.check_sampled,
            self.check_broken_eot,
            self.check_broken_iterations,
            self.check_broken,
        ];
        match counts {
            [None, None, None, None] => {}
            [Some(sampled), Some(eot), Some(iterations), Some(broken)]
                if eot.max(iterations) <= broken
                    && broken <= (eot + iterations).min(sampled)
                    && sampled <= self.n => {}
            _ => {
                // An absent count is written as the empty field the CSV holds.
                let [sampled, eot, iterations, broken] =
                    counts.map(|c| c.map_or("empty".to_string(), |c| c.to_string()));
                return Err(format!(
                    "the convergence check's counts (sampled {sampled}, broken by 4× EOT {eot}, \
                     by 2× iterations {iterations}, by either {broken}) do not fit together or \
                     exceed n {}",
                    self.n
                ));
            }
        }
        Ok(())
    }

    /// What moved the estimate, e.g. `4× EOT broke 3 of 20 sampled survivors, 2× iterations 1`.
    pub fn check_detail(&self) -> Option<String> {
        let sampled = self.check_sampled?;
        Some(format!(
            "4× EOT broke {} of {sampled} sampled survivors, 2× iterations {}",
            self.check_broken_eot?, self.check_broken_iterations?
        ))
    }
}

/// One row per example of a cell; `eps` is empty for minimum-perturbation attacks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExampleRow {
    pub model: String,
    pub attack: RowAttack,
    /// `linf` or `l2` in the CSV.
    pub norm: Norm,
    pub eps: Option<f32>,
    pub k: usize,
    pub grad: GradColumn,
    /// Index of the image in the test split.
    pub example: usize,
    pub label: u8,
    pub clean_correct: bool,
    pub adversarial: bool,
    pub l0: f32,
    pub l2: f32,
    pub linf: f32,
    pub gradient_evals: usize,
    pub forward_evals: usize,
}

impl ExampleRow {
    /// The attack's outcome on this example, as the attack library reports it: the one
    /// definition of "robust at ε" ([`ExampleOutcome::robust_under`]) then applies to rows too.
    pub fn outcome(&self) -> ExampleOutcome {
        ExampleOutcome {
            clean_correct: self.clean_correct,
            adversarial: self.adversarial,
            l0: self.l0,
            l2: self.l2,
            linf: self.linf,
            gradient_evals: self.gradient_evals,
            forward_evals: self.forward_evals,
        }
    }
}

/// A finished cell: its rows and per-example records, the sweep that computed it, its time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub cell: Cell,
    /// The identity of the sweep that computed it (a hash of everything that decides its
    /// numbers: models, their weights and configuration, data, attack and defence settings,
    /// seed).
    pub identity: String,
    pub seconds: f64,
    pub rows: Vec<TidyRow>,
    pub examples: Vec<ExampleRow>,
}

/// The key of a row: one row per model × attack × norm × ε × K × gradient mode.
pub type RowKey = (String, RowAttack, Norm, u32, usize, GradColumn);

/// `row`'s key.
pub fn row_key(row: &TidyRow) -> RowKey {
    (
        row.model.clone(),
        row.attack.clone(),
        row.norm,
        row.eps.to_bits(),
        row.k,
        row.grad,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_attack_reads_back_from_its_text_and_sorts_as_the_text_does() {
        let mut all = vec![RowAttack::WorstCase];
        for &kind in AttackKind::ALL {
            all.push(RowAttack::Attack(kind));
            for stage in kind.stages().into_iter().filter(|_| kind.is_preset()) {
                all.push(RowAttack::Stage {
                    preset: kind,
                    stage,
                });
            }
        }
        all.push(RowAttack::Own("random-corners".into()));
        for attack in all.clone() {
            let text = attack.to_string();
            assert_eq!(text.parse::<RowAttack>(), Ok(attack.clone()));
            let json = serde_json::to_string(&attack).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<RowAttack>(&json).unwrap(), attack);
        }
        let mut by_value = all.clone();
        by_value.sort();
        let mut by_text: Vec<String> = all.iter().map(ToString::to_string).collect();
        by_text.sort();
        let sorted: Vec<String> = by_value.iter().map(ToString::to_string).collect();
        assert_eq!(sorted, by_text);
        assert_eq!(
            "autoattack/square".parse::<RowAttack>(),
            Ok(RowAttack::Stage {
                preset: AttackKind::AutoAttack,
                stage: AttackKind::Square
            })
        );
        assert!("autoattack/nothing".parse::<RowAttack>().is_err());
        assert_eq!(
            "random-corners".parse::<RowAttack>(),
            Ok(RowAttack::Own("random-corners".into()))
        );
    }
}
