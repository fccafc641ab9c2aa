//! Clean-data metrics of a classifier: accuracy, negative log-likelihood and expected
//! calibration error (15 equal-width confidence bins, as in the JEM calibration figure).

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use jem_datasets::ImageSet;
use serde::Serialize;

use crate::batches;
use crate::model::WideResNet;

/// Accuracy, NLL and ECE of a model on a set of images.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CleanMetrics {
    pub n: usize,
    pub accuracy: f64,
    /// Mean −log p(y|x) in nats.
    pub nll: f64,
    /// Expected calibration error with 15 bins, as a fraction.
    pub ece: f64,
}

pub const ECE_BINS: usize = 15;

/// Computes the metrics from per-example log-probabilities (`[n × classes]`, row-major).
pub fn from_log_probs(log_probs: &[f32], labels: &[u8], classes: usize) -> CleanMetrics {
    let n = labels.len();
    assert_eq!(
        log_probs.len(),
        n * classes,
        "one row of log-probabilities per label"
    );
    let mut correct = 0usize;
    let mut nll = 0.0f64;
    let mut bin_conf = [0.0f64; ECE_BINS];
    let mut bin_acc = [0.0f64; ECE_BINS];
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
        let conf = (best as f64).exp();
        // Bins are (k/15, (k+1)/15]; a confidence of exactly 1 falls in the last one.
        let b = ((conf * ECE_BINS as f64).ceil() as usize).clamp(1, ECE_BINS) - 1;
        bin_conf[b] += conf;
        bin_acc[b] += hit as u8 as f64;
        bin_n[b] += 1;
    }
    let ece = (0..ECE_BINS)
        .filter(|&b| bin_n[b] > 0)
        .map(|b| (bin_acc[b] - bin_conf[b]).abs() / n as f64)
        .sum();
    CleanMetrics {
        n,
        accuracy: correct as f64 / n as f64,
        nll: nll / n as f64,
        ece,
    }
}

/// Log-probabilities of the model on `set[indices]`, computed in batches.
pub fn log_probs<B: Backend>(
    model: &WideResNet<B>,
    set: &ImageSet,
    indices: &[usize],
    batch_size: usize,
    device: &B::Device,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(indices.len() * set.num_classes());
    for chunk in indices.chunks(batch_size.max(1)) {
        let x = batches::images::<B>(set, chunk, device);
        out.extend(batches::to_vec(log_softmax(model.forward(x), 1)));
    }
    out
}

/// Accuracy, NLL and ECE of `model` on the whole of `set`.
pub fn evaluate<B: Backend>(
    model: &WideResNet<B>,
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
}
