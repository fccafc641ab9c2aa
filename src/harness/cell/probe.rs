//! AutoAttack's checks of the defended model before its rows are trusted: two clean passes (is
//! it stochastic, so attacked with EOT?) and one gradient (is it zero where the model is right:
//! masked gradients?), and an error where logits or gradients are not finite.

use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::Model;

use super::work::Loaded;
use crate::backend::BenchBackend;
use crate::batches;

/// What two clean passes and one gradient say about the defended model (AutoAttack's checks
/// for randomness and for masked gradients), on the first [`PROBED`] attacked images; an error
/// where the logits or the gradient are not finite, from which no accuracy means anything.
pub(in crate::harness) struct Probe {
    /// Two passes on the same inputs gave different logits: attack with EOT.
    pub(in crate::harness) stochastic: bool,
    /// Correctly classified probed images whose loss gradient is exactly zero.
    pub(in crate::harness) zero_gradients: usize,
}

pub(in crate::harness) const PROBED: usize = 16;

pub(in crate::harness) fn probe<B: BenchBackend, M: Model<B>>(
    model: &M,
    loaded: &Loaded,
    seed: u64,
    device: &B::Device,
) -> anyhow::Result<Probe> {
    use jem_attacks::AttackLoss;
    use rand::SeedableRng;
    let idx = &loaded.indices[..loaded.indices.len().min(PROBED)];
    let x = batches::images::<B::InnerBackend>(loaded.data, idx, device);
    let labels: Vec<i64> = idx.iter().map(|&i| loaded.data.labels[i] as i64).collect();
    let n = labels.len();
    let y =
        Tensor::<B::InnerBackend, 1, Int>::from_data(TensorData::new(labels.clone(), [n]), device);
    // A stream of its own, so that probing does not change any attack's draws.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5052_4f42_4521);
    let first = model.logits(x.clone(), &mut rng);
    let second = model.logits(x.clone(), &mut rng);
    let differ = batches::to_vec((first.clone() - second).abs().max());
    let y_tracked = Tensor::<B, 1, Int>::from_inner(y);
    let loss = |logits: Tensor<B, 2>| AttackLoss::CrossEntropy.of(logits, y_tracked.clone());
    let (g, _) = model.loss_gradient(x, &loss, &mut rng);
    for (what, values) in [
        ("logits", batches::to_vec(first.clone())),
        ("input gradient", batches::to_vec(g.clone())),
    ] {
        anyhow::ensure!(
            values.iter().all(|v| v.is_finite()),
            "the model's {what} on the first {n} test images are not finite: no accuracy \
             computed from it would mean anything"
        );
    }
    let largest = batches::to_vec(g.abs().flatten::<2>(1, 3).max_dim(1));
    let predicted = batches::to_vec(first.argmax(1).float());
    let zero_gradients = (0..n)
        .filter(|&i| predicted[i] as i64 == labels[i] && largest[i] == 0.0)
        .count();
    Ok(Probe {
        stochastic: differ[0] > 1e-6,
        zero_gradients,
    })
}
