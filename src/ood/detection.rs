//! How well a score tells in-distribution inputs (the positives) from out-of-distribution ones,
//! a higher score meaning "more in-distribution", as JEM's out-of-distribution section measures
//! it (Grathwohl et al. 2020; Hendrycks & Gimpel 2017 for AUROC and AUPR, Liang et al. 2018 for
//! the FPR at 95 % TPR). Every metric is computed at the distinct score values as thresholds,
//! "x is in-distribution if score ≥ t", so examples with equal scores always fall on the same
//! side together:
//!
//! - AUROC = P(s_in > s_out) + ½ P(s_in = s_out) over all in/out pairs (Mann–Whitney U / n·m):
//!   1 for a perfect score, ½ for a constant one, 0 for a reversed one.
//! - AUPR = average precision, Σ_t (R(t) − R(t′)) P(t) over the thresholds t in descending
//!   order (t′ the one before; R = recall = TPR, P = precision): the step-wise area under the
//!   precision–recall curve, without interpolation (scikit-learn's `average_precision_score`).
//! - FPR95 = the fraction of out-of-distribution inputs accepted at the largest threshold that
//!   accepts at least 95 % of the in-distribution ones.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Detection {
    pub auroc: f64,
    pub aupr: f64,
    pub fpr95: f64,
}

/// Numbers of in- and out-of-distribution examples at each distinct score, highest first.
fn tied_groups(in_scores: &[f64], out_scores: &[f64]) -> Vec<(usize, usize)> {
    let mut all: Vec<(f64, bool)> = in_scores
        .iter()
        .map(|&s| (s, true))
        .chain(out_scores.iter().map(|&s| (s, false)))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut groups: Vec<(f64, usize, usize)> = Vec::new();
    for (s, is_in) in all {
        match groups.last_mut() {
            // `==`, not the bits: 0.0 and −0.0 are one threshold.
            Some(g) if g.0 == s => {
                if is_in {
                    g.1 += 1
                } else {
                    g.2 += 1
                }
            }
            _ => groups.push((s, is_in as usize, !is_in as usize)),
        }
    }
    groups.into_iter().map(|(_, i, o)| (i, o)).collect()
}

/// AUROC, AUPR and FPR at 95 % TPR of a score; an error for an empty set or a NaN score, which
/// no threshold orders.
pub fn detection(in_scores: &[f64], out_scores: &[f64]) -> anyhow::Result<Detection> {
    anyhow::ensure!(
        !in_scores.is_empty() && !out_scores.is_empty(),
        "no scores to compare ({} in-distribution, {} out-of-distribution)",
        in_scores.len(),
        out_scores.len()
    );
    for (what, set) in [
        ("in-distribution", in_scores),
        ("out-of-distribution", out_scores),
    ] {
        let nan = set.iter().filter(|s| s.is_nan()).count();
        anyhow::ensure!(nan == 0, "{nan} of {} {what} scores are NaN", set.len());
    }
    let (n, m) = (in_scores.len(), out_scores.len());
    let (mut tp, mut fp) = (0usize, 0usize);
    let (mut pairs, mut ap) = (0.0f64, 0.0f64);
    let mut fpr95 = None;
    for (a, b) in tied_groups(in_scores, out_scores) {
        // In-distribution examples of this group beat every out-of-distribution one below it
        // and tie with the b here.
        pairs += a as f64 * (m - fp - b) as f64 + 0.5 * a as f64 * b as f64;
        tp += a;
        fp += b;
        // Σ a · precision, divided by n at the end: each term is at most a, so the rounded sum
        // stays at most n (a perfect score gives exactly 1, not 1 + 4e-16).
        ap += a as f64 * (tp as f64 / (tp + fp) as f64);
        // Integer comparison: TPR ≥ 95 % exactly, without rounding.
        if fpr95.is_none() && 100 * tp >= 95 * n {
            fpr95 = Some(fp as f64 / m as f64);
        }
    }
    Ok(Detection {
        auroc: pairs / (n as f64 * m as f64),
        aupr: ap / n as f64,
        fpr95: fpr95.expect("every example accepted at the lowest threshold: TPR 1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn auroc_counts_ties_as_one_half() {
        // Pairs (in, out): (1,2) 0, (1,0) 1, (2,2) ½, (2,0) 1, (3,2) 1, (3,0) 1 → 4.5 / 6.
        let d = detection(&[1.0, 2.0, 3.0], &[2.0, 0.0]).unwrap();
        assert!(close(d.auroc, 0.75), "{d:?}");
    }

    #[test]
    fn perfect_constant_and_reversed_scores() {
        let (inside, outside) = ([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]);
        let perfect = detection(&inside, &outside).unwrap();
        assert_eq!(
            perfect,
            Detection {
                auroc: 1.0,
                aupr: 1.0,
                fpr95: 0.0
            }
        );
        let constant = detection(&[7.0; 3], &[7.0; 4]).unwrap();
        assert!(close(constant.auroc, 0.5), "{constant:?}");
        // One threshold accepts everything: precision 3/7 at recall 1; every OOD input accepted.
        assert!(close(constant.aupr, 3.0 / 7.0) && constant.fpr95 == 1.0);
        let reversed = detection(&outside, &inside).unwrap();
        assert_eq!(reversed.auroc, 0.0);
        assert_eq!(reversed.fpr95, 1.0);
    }

    #[test]
    fn aupr_by_hand_with_and_without_ties() {
        // 3 (in), 2 (out), 1 (in), 0 (out): recall ½ at precision 1, recall 1 at precision ⅔.
        let d = detection(&[3.0, 1.0], &[2.0, 0.0]).unwrap();
        assert!(close(d.aupr, 0.5 + 0.5 * 2.0 / 3.0), "{d:?}");
        // A tie at the top: the threshold 2 accepts one in and one out together (precision ½).
        let d = detection(&[2.0, 1.0], &[2.0, 0.0]).unwrap();
        assert!(close(d.aupr, 0.5 * 0.5 + 0.5 * 2.0 / 3.0), "{d:?}");
        assert!(close(d.auroc, (1.0 + 0.5 + 1.0) / 4.0), "{d:?}");
    }

    #[test]
    fn fpr95_by_hand() {
        // 20 in-distribution scores 1..=20: TPR ≥ 95 % first at the threshold 2 (19 of 20),
        // which accepts 2 and 5 of the four OOD scores.
        let inside: Vec<f64> = (1..=20).map(f64::from).collect();
        let d = detection(&inside, &[0.0, 1.5, 2.0, 5.0]).unwrap();
        assert!(close(d.fpr95, 0.5), "{d:?}");
        // Four in-distribution scores: 95 % needs all four, so the threshold is 1, which
        // accepts 1, 2 and 5.
        let d = detection(&[1.0, 2.0, 3.0, 4.0], &[0.0, 1.0, 2.0, 5.0]).unwrap();
        assert!(close(d.fpr95, 0.75), "{d:?}");
    }

    #[test]
    fn a_perfect_score_of_many_examples_has_aupr_exactly_one() {
        let inside: Vec<f64> = (0..50).map(|i| 100.0 + i as f64).collect();
        let outside: Vec<f64> = (0..50).map(f64::from).collect();
        assert_eq!(detection(&inside, &outside).unwrap().aupr, 1.0);
    }

    #[test]
    fn nan_and_empty_sets_are_errors() {
        let err = detection(&[1.0, f64::NAN], &[0.0]).unwrap_err().to_string();
        assert!(
            err.contains("1 of 2 in-distribution scores are NaN"),
            "{err}"
        );
        assert!(detection(&[], &[0.0]).is_err());
        // Infinite scores still order.
        let d = detection(&[f64::INFINITY], &[f64::NEG_INFINITY]).unwrap();
        assert_eq!(d.auroc, 1.0);
    }
}
