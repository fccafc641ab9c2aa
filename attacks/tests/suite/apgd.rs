//! APGD against what is known by hand or in closed form: its checkpoint schedule and step-size
//! rule, the DLR losses on fixed logits, and the minimal perturbation of linear classifiers
//! (found at 1.02× the minimum, never at 0.98×) for every loss and both norms.

use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{
    apgd_checkpoints, apgd_should_halve, targeted_dlr, ApgdConfig, ApgdLoss, AttackLoss, Describe,
    LinearClassifier, Norm, Undefended,
};

use crate::common;
use common::{cases, image, label, Case, B, D, I};

#[test]
fn checkpoints_follow_the_published_schedule() {
    // p: 0, .22, .41, .57, .70, .80, .87, .93, .99 (steps 19, 16, 13, 10, 7, then 6).
    assert_eq!(apgd_checkpoints(100), [0, 22, 41, 57, 70, 80, 87, 93, 99]);
    // ⌈p N⌉ for N = 10: 2.2 → 3, 4.1 → 5, 5.7 → 6, 7, 8, 8.7 → 9, 9.3 → 10 (9.9 → 10 again).
    assert_eq!(apgd_checkpoints(10), [0, 3, 5, 6, 7, 8, 9, 10]);
    assert_eq!(apgd_checkpoints(1000)[1..4], [220, 410, 570]);
}

#[test]
fn the_step_is_halved_on_oscillation_or_stall() {
    // 22 steps since the last checkpoint, ρ = 0.75: 16.5 increases is the line.
    assert!(
        apgd_should_halve(16, 22, 0.75, true, 1.0, 2.0),
        "16 < 16.5: oscillating"
    );
    assert!(
        !apgd_should_halve(17, 22, 0.75, true, 1.0, 2.0),
        "17 raised the loss enough"
    );
    // Not halved last time and the best loss did not improve: halve.
    assert!(apgd_should_halve(17, 22, 0.75, false, 2.0, 2.0));
    // Halved last time: a stall alone does not halve again.
    assert!(!apgd_should_halve(17, 22, 0.75, true, 2.0, 2.0));
    assert!(
        !apgd_should_halve(20, 22, 0.75, false, 1.0, 1.5),
        "improved"
    );
}

fn logits(v: &[f32], rows: usize) -> Tensor<I, 2> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [rows, v.len() / rows]),
        &Default::default(),
    )
}

fn ints(v: &[i64]) -> Tensor<I, 1, Int> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

fn values(t: Tensor<I, 1>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

#[test]
fn dlr_losses_match_hand_computed_values() {
    // Logits [3, 1, 2, 0.5]: sorted 3, 2, 1, 0.5.
    let z = logits(&[3.0, 1.0, 2.0, 0.5, 3.0, 1.0, 2.0, 0.5], 2);
    // y = 0: −(3 − 2) / (3 − 1) = −0.5; y = 2: −(2 − 3) / (3 − 1) = 0.5.
    let dlr = values(AttackLoss::Dlr.of(z.clone(), ints(&[0, 2])));
    assert!(
        (dlr[0] + 0.5).abs() < 1e-6 && (dlr[1] - 0.5).abs() < 1e-6,
        "{dlr:?}"
    );
    // Targeted, y = 0, t = 3: −(3 − 0.5) / (3 − (1 + 0.5) / 2) = −2.5 / 2.25;
    // y = 2, t = 0: −(2 − 3) / 2.25.
    let t = values(targeted_dlr(z.clone(), ints(&[0, 2]), ints(&[3, 0])));
    assert!((t[0] + 2.5 / 2.25).abs() < 1e-6, "{t:?}");
    assert!((t[1] - 1.0 / 2.25).abs() < 1e-6, "{t:?}");
    // Shift and scale invariance.
    let moved = logits(&[8.0, 4.0, 6.0, 3.0, 8.0, 4.0, 6.0, 3.0], 2); // 2z + 2
    assert_eq!(
        values(AttackLoss::Dlr.of(moved, ints(&[0, 2]))),
        values(AttackLoss::Dlr.of(z, ints(&[0, 2])))
    );
}

/// A binary case with two more classes far behind: the minimal perturbation is still the
/// binary one (toward class 1), but DLR and the targeted loss see four classes.
fn four_classes(c: &Case) -> Undefended<LinearClassifier<B>> {
    let mut w = c.w.clone();
    w.extend((0..2 * D).map(|d| ((d * 7 % 11) as f32 - 5.0) * 0.05));
    let mut b = c.b.clone();
    b.extend([-50.0, -60.0]);
    Undefended::new(LinearClassifier::<B>::new(w, b, 4, &Default::default()))
}

#[test]
fn apgd_finds_the_minimal_perturbation_of_a_linear_model_with_every_loss() {
    for norm in [Norm::Linf, Norm::L2] {
        for loss in [ApgdLoss::CrossEntropy, ApgdLoss::Dlr, ApgdLoss::TargetedDlr] {
            let cfg = ApgdConfig::new(norm, loss);
            for c in cases(4) {
                let model = four_classes(&c);
                let min = match norm {
                    Norm::Linf => c.min_linf,
                    Norm::L2 => c.min_l2,
                };
                let run = |eps: f32| {
                    let out = cfg.run::<B, _>(&model, image(&c.x), label(c.y), eps);
                    let e = &out.examples[0];
                    assert!(e.clean_correct);
                    assert!(e.distance(norm) <= eps * 1.0001 + 1e-6, "{e:?} at {eps}");
                    assert!(out.inputs.iter().all(|v| (0.0..=1.0).contains(v)));
                    e.adversarial
                };
                assert!(run(1.02 * min), "{} {norm} just above {min}", cfg.name());
                assert!(!run(0.98 * min), "{} {norm} just below {min}", cfg.name());
            }
        }
    }
}
