//! Clean-data metrics of a classifier: accuracy, negative log-likelihood, Brier score and
//! expected calibration error with its reliability bins (15 equal-width confidence bins, as in
//! the JEM calibration figure; Guo et al. 2017 define ECE and the reliability diagram, Brier
//! 1950 the score).

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use jem_attacks::Classifier;
use jem_datasets::ImageSet;
use serde::Serialize;

use crate::batches;

/// Accuracy, NLL, Brier score and ECE of a model on a set of images.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CleanMetrics {
    pub n: usize,
    pub accuracy: f64,
    /// Mean −log p(y|x) in nats.
    pub nll: f64,
    /// Mean over examples of Σ_k (p_k − [k = y])²: 0 for certain and right, 2 for certain and
    /// wrong.
    pub brier: f64,
    /// Expected calibration error with 15 bins, as a fraction.
    pub ece: f64,
}

pub const ECE_BINS: usize = 15;

/// The examples whose confidence max_k p_k falls in (lo, hi]: what a reliability diagram
/// draws. A confidence of exactly 0 cannot occur (max_k p_k ≥ 1 / classes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReliabilityBin {
    pub lo: f64,
    pub hi: f64,
    pub count: usize,
    /// Fraction of the bin's examples classified correctly; `None` for an empty bin.
    pub accuracy: Option<f64>,
    /// Mean confidence of the bin's examples; `None` for an empty bin.
    pub confidence: Option<f64>,
}

/// What one pass over the predictions gives: the summary metrics and the reliability bins
/// they were computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub metrics: CleanMetrics,
    pub bins: Vec<ReliabilityBin>,
}

/// The bin of a confidence: bins are (k/15, (k+1)/15]; exactly 1 falls in the last one.
fn bin_of(confidence: f64) -> usize {
    ((confidence * ECE_BINS as f64).ceil() as usize).clamp(1, ECE_BINS) - 1
}

/// Computes the metrics and reliability bins from per-example log-probabilities
/// (`[n × classes]`, row-major).
pub fn calibration(log_probs: &[f32], labels: &[u8], classes: usize) -> Calibration {
    let n = labels.len();
    assert_eq!(
        log_probs.len(),
        n * classes,
        "one row of log-probabilities per label"
    );
    let mut correct = 0usize;
    let (mut nll, mut brier) = (0.0f64, 0.0f64);
    let mut bin_conf = [0.0f64; ECE_BINS];
    let mut bin_hits = [0usize; ECE_BINS];
    let mut bin_n = [0usize; ECE_BINS];
    for (row, &y) in log_probs.chunks_exact(classes).zip(labels) {
        let (pred, &best) = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one class");
        let hit = pred == y as usize;
        correct += hit as usize;
        nll -= row[y as usize] as f64;
        brier += row
            .iter()
            .enumerate()
            .map(|(k, &lp)| ((lp as f64).exp() - (k == y as usize) as u8 as f64).powi(2))
            .sum::<f64>();
        let conf = (best as f64).exp();
        let b = bin_of(conf);
        bin_conf[b] += conf;
        bin_hits[b] += hit as usize;
        bin_n[b] += 1;
    }
    let bins: Vec<ReliabilityBin> = (0..ECE_BINS)
        .map(|b| {
            let count = bin_n[b];
            let mean = |total: f64| (count > 0).then(|| total / count as f64);
            ReliabilityBin {
                lo: b as f64 / ECE_BINS as f64,
                hi: (b + 1) as f64 / ECE_BINS as f64,
                count,
                accuracy: mean(bin_hits[b] as f64),
                confidence: mean(bin_conf[b]),
            }
        })
        .collect();
    // ECE = Σ_b (n_b / n) |accuracy_b − confidence_b|.
    let ece = bins
        .iter()
        .filter_map(|b| Some(b.count as f64 * (b.accuracy? - b.confidence?).abs()))
        .sum::<f64>()
        / n as f64;
    Calibration {
        metrics: CleanMetrics {
            n,
            accuracy: correct as f64 / n as f64,
            nll: nll / n as f64,
            brier: brier / n as f64,
            ece,
        },
        bins,
    }
}

/// The summary metrics alone (see [`calibration`]).
pub fn from_log_probs(log_probs: &[f32], labels: &[u8], classes: usize) -> CleanMetrics {
    calibration(log_probs, labels, classes).metrics
}

/// Log-probabilities of the model (any classifier: a Wide-ResNet, a graph imported from ONNX,
/// a network of the caller's) on `set[indices]`, computed in batches.
pub fn log_probs<B: Backend, N: Classifier<B>>(
    model: &N,
    set: &ImageSet,
    indices: &[usize],
    batch_size: usize,
    device: &B::Device,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(indices.len() * set.num_classes());
    for chunk in indices.chunks(batch_size.max(1)) {
        let x = batches::images::<B>(set, chunk, device);
        out.extend(batches::to_vec(log_softmax(model.logits(x), 1)));
    }
    out
}

/// Accuracy, NLL, Brier score and ECE of `model` (any classifier) on the whole of `set`.
pub fn evaluate<B: Backend, N: Classifier<B>>(
    model: &N,
    set: &ImageSet,
    batch_size: usize,
    device: &B::Device,
) -> CleanMetrics {
    let indices: Vec<usize> = (0..set.len()).collect();
    let lp = log_probs(model, set, &indices, batch_size, device);
    from_log_probs(&lp, &set.labels, set.num_classes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ece_of_a_hand_computed_case() {
        // Two examples at confidence 0.9 (one right), two at 0.6 (both right):
        // bin of 0.9: |1 − 1.8| / 4 = 0.2; bin of 0.6: |2 − 1.2| / 4 = 0.2 → ECE 0.4.
        let rows = [[0.9f32, 0.1], [0.9, 0.1], [0.6, 0.4], [0.4, 0.6]];
        let lp: Vec<f32> = rows.iter().flatten().map(|p| p.ln()).collect();
        let m = from_log_probs(&lp, &[0, 1, 0, 1], 2);
        assert!((m.ece - 0.4).abs() < 1e-6, "{m:?}");
        assert!((m.accuracy - 0.75).abs() < 1e-12);
        let nll = -(0.9f64.ln() + 0.1f64.ln() + 0.6f64.ln() + 0.6f64.ln()) / 4.0;
        assert!((m.nll - nll).abs() < 1e-6);
    }

    #[test]
    fn brier_ece_and_bins_of_a_hand_computed_case() {
        // Confidences 0.7, 0.7, 0.5, 0.82 lie inside bins 10, 10, 7 and 12 (of 0..15), away
        // from the edges, so that rounding cannot move them.
        let rows = [
            [0.7f32, 0.2, 0.1], // y = 0, right
            [0.2, 0.7, 0.1],    // y = 0, wrong
            [0.5, 0.3, 0.2],    // y = 2, wrong
            [0.1, 0.08, 0.82],  // y = 2, right
        ];
        let lp: Vec<f32> = rows.iter().flatten().map(|p| p.ln()).collect();
        let c = calibration(&lp, &[0, 0, 2, 2], 3);
        // Brier: 0.14 + 1.14 + 0.98 + 0.0488 = 2.3088, over 4.
        assert!((c.metrics.brier - 0.5772).abs() < 1e-6, "{c:?}");
        // ECE: bin 10 holds two at 0.7 with one right (2 × 0.2), bin 7 one wrong at 0.5 (0.5),
        // bin 12 one right at 0.82 (0.18): 1.08 / 4.
        assert!((c.metrics.ece - 0.27).abs() < 1e-6, "{c:?}");
        assert!((c.metrics.accuracy - 0.5).abs() < 1e-12);
        let nll = -(0.7f64.ln() + 0.2f64.ln() + 0.2f64.ln() + 0.82f64.ln()) / 4.0;
        assert!((c.metrics.nll - nll).abs() < 1e-6);
        assert_eq!(c.bins.len(), ECE_BINS);
        for (b, bin) in c.bins.iter().enumerate() {
            assert!(
                (bin.lo - b as f64 / 15.0).abs() < 1e-12
                    && (bin.hi - bin.lo - 1.0 / 15.0).abs() < 1e-12
            );
            let expected = match b {
                10 => Some((2, 0.5, 0.7)),
                7 => Some((1, 0.0, 0.5)),
                12 => Some((1, 1.0, 0.82)),
                _ => None,
            };
            match expected {
                Some((count, acc, conf)) => {
                    assert_eq!(bin.count, count, "bin {b}");
                    assert!((bin.accuracy.unwrap() - acc).abs() < 1e-12, "bin {b}");
                    assert!((bin.confidence.unwrap() - conf).abs() < 1e-6, "bin {b}");
                }
                None => assert_eq!((bin.count, bin.accuracy, bin.confidence), (0, None, None)),
            }
        }
    }

    #[test]
    fn brier_is_zero_when_certain_and_right_and_two_when_certain_and_wrong() {
        let lp = [0.0f32, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0];
        assert_eq!(from_log_probs(&lp, &[0, 1], 2).brier, 0.0);
        assert_eq!(from_log_probs(&lp, &[1, 0], 2).brier, 2.0);
    }
}
