//! The attack library on the embedded default baseline (a real WRN on real digits): PGD at
//! ε = 0.3 (L∞) breaks an undefended MNIST classifier and beats FGSM.
//!
//! (The `full` gradient through SGLD is checked against finite differences in jem-attacks'
//! tests on a linear and a smooth network. On a LeakyReLU WRN the defended map itself is
//! discontinuous — ∇ₓLSE jumps at every activation kink, and an SGLD step moves by it — so
//! central differences there grow without bound as h shrinks and cannot serve as a reference.)

use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{Norm, PgdConfig, Undefended};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches;
use jem_bench::model::{Checkpoint, WideResNet};
use jem_datasets::{embedded, ImageSet, Split};

fn baseline() -> WideResNet<Train> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/baseline");
    Checkpoint::at(path)
        .load::<Train>(&backend::device())
        .unwrap()
        .0
}

fn digits(n: usize) -> (ImageSet, Vec<usize>) {
    (embedded::mnist(Split::Test).unwrap(), (0..n).collect())
}

fn labels(set: &ImageSet, idx: &[usize]) -> Tensor<Inference, 1, Int> {
    let v: Vec<i64> = idx.iter().map(|&i| set.labels[i] as i64).collect();
    Tensor::from_data(TensorData::new(v, [idx.len()]), &backend::device())
}

#[test]
fn pgd_breaks_the_undefended_baseline_at_eps_0_3_and_beats_fgsm() {
    let (set, idx) = digits(100);
    let x = batches::images::<Inference>(&set, &idx, &backend::device());
    let model = Undefended::new(baseline());
    let y = labels(&set, &idx);
    let pgd = PgdConfig::pgd(Norm::Linf).run::<Train, _>(&model, x.clone(), y.clone(), 0.3);
    let fgsm = PgdConfig::fgsm(Norm::Linf).run::<Train, _>(&model, x, y, 0.3);
    let clean = pgd.clean_accuracy();
    let (p, f) = (
        pgd.robust_accuracy(Norm::Linf, 0.3),
        fgsm.robust_accuracy(Norm::Linf, 0.3),
    );
    eprintln!("clean {clean}, PGD-40 robust {p}, FGSM robust {f} at ε = 0.3 (L∞, 100 digits)");
    assert!(clean >= 0.95, "clean accuracy {clean}");
    assert!(p <= 0.05, "PGD leaves {p} robust accuracy at ε = 0.3");
    assert!(p < f, "PGD {p} should beat FGSM {f}");
    for e in pgd.examples.iter().chain(&fgsm.examples) {
        assert!(e.linf <= 0.3 + 1e-6, "{e:?}");
    }
}
