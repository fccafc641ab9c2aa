//! The sanity checks of a sweep (after Carlini et al. 2019, "On Evaluating Adversarial
//! Robustness"), computed from its rows. A
//! check that the sweep has no data for says `not run`; none is passed by default.

use std::collections::BTreeMap;

use serde::Serialize;

use super::cells::AttackKind;
use super::robustness::WORST_CASE;
use super::rows::{GradColumn, RowAttack, TidyRow};

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    /// `pass`, `warn` or `not run`.
    pub status: &'static str,
    pub detail: String,
}

fn verdict(name: &'static str, compared: usize, problems: Vec<String>, what: &str) -> Check {
    let (status, detail) = match (compared, problems.is_empty()) {
        (0, _) => ("not run", format!("the sweep has no {what} to compare")),
        (_, true) => ("pass", format!("{compared} comparisons")),
        (_, false) => ("warn", problems.join("; ")),
    };
    Check {
        name,
        status,
        detail,
    }
}

/// Whether a row's attack follows gradients of the (defended) model (`Some(true)`), sees only
/// scores or decisions (`Some(false)`), or is no single attack (`worst-case`): what each
/// attack declares ([`AttackKind::access`], an own attack's recorded access). A cascade's stage
/// (`autoattack/square`) is of its own attack; its row holds the joint outcome of it and the
/// stages before it, so a black-box stage below the white-box stage before it broke examples no
/// white-box attack could.
type WhiteBox<'a> = dyn Fn(&RowAttack) -> Option<bool> + 'a;

/// Largest drop in robust accuracy from PGD to `pgd-long` that still counts as converged.
const CONVERGED: f64 = 0.05;

/// Every check, in the order the summary lists them. `classes`: number of classes of the data
/// (chance = 1 / classes); `own`: the sweep's own attacks, each with whether it follows
/// gradients (as its settings record it).
pub fn run(rows: &[TidyRow], classes: usize, own: &[(String, bool)]) -> Vec<Check> {
    let white_box = |attack: &RowAttack| attack.follows_gradients(own);
    vec![
        falls_toward_chance(rows, classes),
        does_not_rise_with_eps(rows),
        iterative_beats_single_step(rows),
        more_steps_do_not_help(rows),
        black_box_does_not_beat_white_box(rows, &white_box),
        gradients_are_not_zero(rows),
        stochastic_models_get_eot(rows, &white_box),
        more_eot_does_not_lower_robustness(rows),
    ]
}

/// Robust accuracy of each cell (model, K, gradient mode, ε) of one attack.
fn robust_by_cell(
    rows: &[TidyRow],
    attack: RowAttack,
) -> BTreeMap<(String, usize, GradColumn, u32), f64> {
    rows.iter()
        .filter(|r| r.attack == attack)
        .map(|r| {
            (
                (r.model.clone(), r.k, r.grad, r.eps.to_bits()),
                r.robust_accuracy,
            )
        })
        .collect()
}

/// Accuracy falls toward chance at the largest ε (per-example worst case over attacks; the
/// per-attack rows where a sweep has no worst-case rows).
fn falls_toward_chance(rows: &[TidyRow], classes: usize) -> Check {
    let has_worst = rows.iter().any(|r| r.attack == WORST_CASE);
    let mut worst: BTreeMap<(String, usize), (f32, f64)> = BTreeMap::new();
    for r in rows.iter().filter(|r| !has_worst || r.attack == WORST_CASE) {
        let e = worst
            .entry((r.model.clone(), r.k))
            .or_insert((r.eps, r.robust_accuracy));
        if r.eps > e.0 {
            *e = (r.eps, r.robust_accuracy);
        } else if r.eps == e.0 {
            e.1 = e.1.min(r.robust_accuracy);
        }
    }
    let chance = 1.0 / classes.max(1) as f64;
    let problems: Vec<String> = worst
        .iter()
        .filter(|(_, (_, acc))| *acc > chance + 0.1)
        .map(|((m, k), (eps, acc))| {
            format!("{m} K={k}: {:.1} % robust at the largest ε = {eps} (chance {:.0} %): extend --eps until no model can withstand it (L∞ 0.5 can turn any image grey) — if accuracy stays up there, the attack is too weak or the gradients are masked", 100.0 * acc, 100.0 * chance)
        })
        .collect();
    verdict(
        "accuracy falls toward chance as ε grows",
        worst.len(),
        problems,
        "rows",
    )
}

/// Robust accuracy cannot rise with ε: an adversarial within ε is one within any larger ε.
fn does_not_rise_with_eps(rows: &[TidyRow]) -> Check {
    // Per model, K, gradient mode and attack: its (ε, robust accuracy) points.
    type Series = BTreeMap<(String, usize, GradColumn, RowAttack), Vec<(f32, f64)>>;
    let mut series = Series::new();
    for r in rows {
        series
            .entry((r.model.clone(), r.k, r.grad, r.attack.clone()))
            .or_default()
            .push((r.eps, r.robust_accuracy));
    }
    let mut problems = Vec::new();
    for ((m, k, g, a), points) in &mut series {
        points.sort_by(|x, y| x.0.total_cmp(&y.0));
        for w in points.windows(2) {
            if w[1].1 > w[0].1 + 1e-12 {
                problems.push(format!(
                    "{m} K={k} {g} {a}: {:.3} at ε={} > {:.3} at ε={}",
                    w[1].1, w[1].0, w[0].1, w[0].0
                ));
            }
        }
    }
    verdict(
        "robust accuracy does not rise with ε",
        series.len(),
        problems,
        "rows",
    )
}

/// Iterative attacks beat single-step ones.
fn iterative_beats_single_step(rows: &[TidyRow]) -> Check {
    let (pgd, fgsm) = (
        robust_by_cell(rows, RowAttack::Attack(AttackKind::Pgd)),
        robust_by_cell(rows, RowAttack::Attack(AttackKind::Fgsm)),
    );
    let mut compared = 0;
    let mut problems = Vec::new();
    for (k, p) in &pgd {
        if let Some(f) = fgsm.get(k) {
            compared += 1;
            if p > f {
                problems.push(format!(
                    "{} K={} {} ε={}: PGD {:.3} > FGSM {:.3}",
                    k.0,
                    k.1,
                    k.2,
                    f32::from_bits(k.3),
                    p,
                    f
                ));
            }
        }
    }
    verdict(
        "iterative attacks beat single-step attacks",
        compared,
        problems,
        "PGD and FGSM cells",
    )
}

/// More steps and restarts do not help much (PGD has converged).
fn more_steps_do_not_help(rows: &[TidyRow]) -> Check {
    let (pgd, long) = (
        robust_by_cell(rows, RowAttack::Attack(AttackKind::Pgd)),
        robust_by_cell(rows, RowAttack::Attack(AttackKind::PgdLong)),
    );
    let mut compared = 0;
    let mut changes = Vec::new();
    let mut problems = Vec::new();
    for (k, p) in &pgd {
        if let Some(l) = long.get(k) {
            compared += 1;
            let cell = format!("{} K={} {} ε={}", k.0, k.1, k.2, f32::from_bits(k.3));
            changes.push(p - l);
            if p - l > CONVERGED {
                problems.push(format!(
                    "{cell}: PGD {p:.3}, 4× steps and 2× restarts {l:.3}: PGD has not converged, \
                     raise --pgd-steps / --restarts"
                ));
            }
        }
    }
    let mut check = verdict(
        "more steps and restarts do not help much",
        compared,
        problems,
        "PGD and pgd-long cells (add pgd-long to --attacks)",
    );
    if check.status == "pass" {
        let largest = changes.iter().copied().fold(f64::MIN, f64::max);
        check.detail = format!(
            "{compared} comparisons; largest drop in robust accuracy {:.3} (threshold {CONVERGED})",
            largest.max(0.0)
        );
    }
    check
}

/// Black-box and decision-based attacks do not beat the white-box ones (else the gradients
/// are masked: the white-box attacks are not finding what exists).
fn black_box_does_not_beat_white_box(rows: &[TidyRow], white_box: &WhiteBox) -> Check {
    let mut compared = 0;
    let mut problems = Vec::new();
    for r in rows.iter().filter(|r| white_box(&r.attack) == Some(false)) {
        let best_white = rows
            .iter()
            .filter(|p| {
                white_box(&p.attack) == Some(true)
                    && p.model == r.model
                    && p.k == r.k
                    && p.eps == r.eps
                    // A cascade's stage against the white-box stages of the same cascade.
                    && (r.attack.preset().is_none()
                        || (p.attack.preset() == r.attack.preset() && p.grad == r.grad))
            })
            .map(|p| p.robust_accuracy)
            .reduce(f64::min);
        if let Some(w) = best_white {
            compared += 1;
            // One example's worth of slack.
            if r.robust_accuracy + 1.0 / r.n.max(1) as f64 <= w {
                problems.push(format!(
                    "{} K={} ε={}: {} {:.3} below the best white-box attack's {:.3}: the \
                     gradients may be masked",
                    r.model, r.k, r.eps, r.attack, r.robust_accuracy, w
                ));
            }
        }
    }
    verdict(
        "black-box and decision-based attacks do not beat white-box ones",
        compared,
        problems,
        "black-box or decision-based cells beside white-box ones",
    )
}

/// Zero gradients on correctly classified inputs (AutoAttack's check).
fn gradients_are_not_zero(rows: &[TidyRow]) -> Check {
    let probed: Vec<&TidyRow> = rows.iter().filter(|r| r.attack != WORST_CASE).collect();
    let mut zero: BTreeMap<(String, usize, GradColumn), usize> = BTreeMap::new();
    for r in &probed {
        if r.zero_gradients > 0 {
            zero.insert((r.model.clone(), r.k, r.grad), r.zero_gradients);
        }
    }
    Check {
        name: "gradients are not zero at correctly classified inputs",
        status: if probed.is_empty() {
            "not run"
        } else if zero.is_empty() {
            "pass"
        } else {
            "warn"
        },
        detail: if zero.is_empty() {
            format!("{} rows probed", probed.len())
        } else {
            zero.iter()
                .map(|((m, k, g), z)| {
                    format!("{m} K={k} {g}: {z} probed inputs with an all-zero loss gradient: gradient attacks cannot move them; trust the black-box attacks there")
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
    }
}

/// Stochastic models are attacked with EOT.
fn stochastic_models_get_eot(rows: &[TidyRow], white_box: &WhiteBox) -> Check {
    let stochastic: Vec<&TidyRow> = rows
        .iter()
        .filter(|r| r.stochastic && white_box(&r.attack) == Some(true))
        .collect();
    let mut without: Vec<String> = Vec::new();
    let mut lacking = 0;
    for r in stochastic.iter().filter(|r| r.eot <= 1) {
        lacking += 1;
        let what = format!("{} K={} {}", r.model, r.k, r.attack);
        if !without.contains(&what) {
            without.push(what);
        }
    }
    Check {
        name: "stochastic models are attacked with EOT",
        status: if stochastic.is_empty() {
            "not run"
        } else if without.is_empty() {
            "pass"
        } else {
            "warn"
        },
        detail: if stochastic.is_empty() {
            "no model gave different logits on two passes of the same inputs".into()
        } else {
            format!(
                "{} of {} white-box rows on a stochastic model (two passes gave different logits) use EOT (> 1 draw); breaks are re-checked with the recheck chains{}",
                stochastic.len() - lacking,
                stochastic.len(),
                if without.is_empty() { String::new() } else { format!("; without: {}", without.join(", ")) }
            )
        },
    }
}

/// The attack had converged on stochastic models: re-attacking survivors with 4× the EOT
/// draws or 2× the iterations does not push robust accuracy below its interval.
fn more_eot_does_not_lower_robustness(rows: &[TidyRow]) -> Check {
    let checked: Vec<&TidyRow> = rows.iter().filter(|r| r.check_sampled.is_some()).collect();
    let problems: Vec<String> = checked
        .iter()
        .filter(|r| r.check_moved())
        .map(|r| {
            format!(
                "{} K={} {} {} ε={}: {:.1} % → {:.1} % ({}; the first estimate's interval starts at {:.1} %): raise --eot / --apgd-iterations and rerun",
                r.model,
                r.k,
                r.grad,
                r.attack,
                r.eps,
                100.0 * r.robust_accuracy,
                100.0 * r.checked_robust_accuracy().unwrap_or(f64::NAN),
                r.check_detail().unwrap_or_default(),
                100.0 * r.robust_lo
            )
        })
        .collect();
    let mut check = verdict(
        "more EOT draws and iterations do not lower robust accuracy (stochastic models)",
        checked.len(),
        problems,
        "convergence checks (stochastic cells, --convergence-sample > 0)",
    );
    if check.status == "pass" {
        let broken: usize = checked.iter().filter_map(|r| r.check_broken).sum();
        let sampled: usize = checked.iter().filter_map(|r| r.check_sampled).sum();
        check.detail = format!(
            "{} checks; the re-attacks broke {broken} of {sampled} sampled survivors",
            checked.len()
        );
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(attack: &str, eps: f32, robust_accuracy: f64) -> TidyRow {
        TidyRow {
            model: "m".into(),
            attack: attack.parse().expect("an attack's name"),
            norm: jem_attacks::Norm::Linf,
            eps,
            k: 0,
            grad: GradColumn::None,
            n: 20,
            clean_accuracy: 1.0,
            clean_lo: 0.8,
            clean_hi: 1.0,
            robust_accuracy,
            robust_lo: 0.0,
            robust_hi: 1.0,
            eot: 1,
            restarts: 1,
            chains: 0,
            recheck_chains: 0,
            seed: 0,
            attack_settings: "{}".into(),
            defence: "{}".into(),
            stochastic: false,
            zero_gradients: 0,
            upper_bound: false,
            check_sampled: None,
            check_broken_eot: None,
            check_broken_iterations: None,
            check_broken: None,
            data: "mnist".into(),
            software: "test".into(),
            backend: "test".into(),
        }
    }

    fn check<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn convergence_check_warns_when_more_steps_break_more_and_names_the_cell() {
        let name = "more steps and restarts do not help much";
        let converged = run(
            &[
                row("pgd", 0.1, 0.50),
                row("pgd-long", 0.1, 0.45),
                row("pgd", 0.3, 0.0),
                row("pgd-long", 0.3, 0.0),
            ],
            10,
            &[],
        );
        let c = check(&converged, name);
        assert_eq!(c.status, "pass", "{}", c.detail);
        assert!(c.detail.contains("0.050"), "{}", c.detail);

        let unconverged = run(
            &[row("pgd", 0.1, 0.50), row("pgd-long", 0.1, 0.40)],
            10,
            &[],
        );
        let c = check(&unconverged, name);
        assert_eq!(c.status, "warn");
        assert!(c.detail.contains("m K=0 none ε=0.1"), "{}", c.detail);

        let absent = run(&[row("pgd", 0.1, 0.50)], 10, &[]);
        assert_eq!(check(&absent, name).status, "not run");
    }

    /// A stochastic cell's row at 50 % [40, 60] whose sampled survivors the re-attacks broke.
    fn checked(
        sampled: usize,
        broken_eot: usize,
        broken_iterations: usize,
        broken: usize,
    ) -> TidyRow {
        TidyRow {
            k: 1,
            grad: GradColumn::Full,
            robust_lo: 0.40,
            robust_hi: 0.60,
            check_sampled: Some(sampled),
            check_broken_eot: Some(broken_eot),
            check_broken_iterations: Some(broken_iterations),
            check_broken: Some(broken),
            ..row("autoattack-rand/apgd-dlr", 0.2, 0.50)
        }
    }

    #[test]
    fn the_stochastic_convergence_check_flags_an_estimate_that_more_eot_moves() {
        let name = "more EOT draws and iterations do not lower robust accuracy (stochastic models)";
        // 2 of 20 broken: 50 % × 18/20 = 45 %, inside [40, 60].
        let steady = checked(20, 2, 0, 2);
        assert_eq!(steady.checked_robust_accuracy(), Some(0.45));
        assert!(!steady.check_moved());
        let c = run(&[steady], 10, &[]);
        assert_eq!(check(&c, name).status, "pass", "{}", check(&c, name).detail);

        // 8 of 20 broken, 7 of them by 4× EOT: 50 % × 12/20 = 30 %, below 40 %.
        let moved = checked(20, 7, 2, 8);
        assert!((moved.checked_robust_accuracy().unwrap() - 0.30).abs() < 1e-12);
        assert!(moved.check_moved());
        let c = run(&[moved], 10, &[]);
        let c = check(&c, name);
        assert_eq!(c.status, "warn");
        assert!(
            c.detail
                .contains("m K=1 full autoattack-rand/apgd-dlr ε=0.2")
                && c.detail
                    .contains("4× EOT broke 7 of 20 sampled survivors, 2× iterations 2"),
            "{}",
            c.detail
        );

        // Nothing left standing to sample, or no check: not run.
        let nothing = checked(0, 0, 0, 0);
        assert_eq!(nothing.checked_robust_accuracy(), None);
        let c = run(&[row("apgd-ce", 0.2, 0.5)], 10, &[]);
        assert_eq!(check(&c, name).status, "not run");
    }
}
