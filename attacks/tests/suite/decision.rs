//! Decision-based attacks against a binary linear model, whose minimal L2 perturbation is
//! |margin| / ‖w₀ − w₁‖₂: the boundary and pointwise attacks must end adversarial and within a
//! few percent of it (and never below it).

use crate::common;

use common::{cases, image, label, Case, B, D};
use jem_attacks::{BoundaryConfig, LinearClassifier, Model, PointwiseConfig, Undefended};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn model(c: &common::Case) -> Undefended<LinearClassifier<B>> {
    Undefended::new(LinearClassifier::<B>::new(
        c.w.clone(),
        c.b.clone(),
        2,
        &Default::default(),
    ))
}

/// The returned input is misclassified (re-checked here) and inside the box.
fn check_returned(m: &Undefended<LinearClassifier<B>>, inputs: &[f32]) {
    assert!(inputs.iter().all(|v| (0.0..=1.0).contains(v)));
    let logits: Vec<f32> = Model::<B>::logits(m, image(inputs), &mut StdRng::seed_from_u64(0))
        .into_data()
        .to_vec()
        .unwrap();
    assert!(logits[1] > logits[0], "not adversarial: {logits:?}");
}

#[test]
fn boundary_attack_ends_near_the_minimal_l2_perturbation() {
    let attack = BoundaryConfig {
        steps: 5000,
        seed: 3,
        ..Default::default()
    };
    let batch = cases(4);
    for c in &batch {
        let m = model(c);
        let out = attack.run::<B, _>(&m, image(&c.x), label(c.y));
        let e = &out.examples[0];
        assert!(e.clean_correct && e.adversarial, "{e:?}");
        check_returned(&m, &out.inputs);
        let ratio = e.l2 / c.min_l2;
        eprintln!(
            "boundary: L2 {} / minimum {} = {ratio:.4}, {} queries",
            e.l2, c.min_l2, e.forward_evals
        );
        assert!(
            (0.9999..1.05).contains(&ratio),
            "boundary L2 {} vs minimum {} ({ratio})",
            e.l2,
            c.min_l2
        );
        assert!(
            e.forward_evals > 5000,
            "queries are counted: {}",
            e.forward_evals
        );
    }
}

#[test]
fn pointwise_attack_finds_the_single_pixel_that_decides() {
    // w₀ − w₁ is zero except at one pixel, so the minimal L0 and L2 perturbations coincide:
    // move that pixel until the margin closes.
    let mut x = vec![0.5f32; D];
    x[5] = 0.45;
    let mut w = vec![0.0f32; 2 * D];
    (w[5], w[D + 5]) = (1.0, -1.0);
    let margin = 0.3;
    let b = vec![0.0, 2.0 * x[5] - margin];
    let c = Case {
        w,
        b,
        x,
        y: 0,
        min_l2: margin / 2.0,
        min_linf: margin / 2.0,
    };
    let m = model(&c);
    let out = PointwiseConfig {
        seed: 1,
        ..Default::default()
    }
    .run::<B, _>(&m, image(&c.x), label(0));
    let e = &out.examples[0];
    eprintln!("pointwise, one pixel: {e:?}");
    assert!(e.adversarial && e.l0 == 1.0, "{e:?}");
    check_returned(&m, &out.inputs);
    let ratio = e.l2 / c.min_l2;
    assert!(
        (0.9999..1.03).contains(&ratio),
        "pointwise L2 {} vs minimum {}",
        e.l2,
        c.min_l2
    );
}

#[test]
fn pointwise_attack_reaches_the_minimal_l0_of_linear_models() {
    // Pixel d can lower the margin by at most cap_d (moving it to 0 or 1), so the minimal L0
    // is the smallest k whose k largest caps exceed the margin.
    for c in &cases(4) {
        let diff: Vec<f32> = (0..D).map(|d| c.w[d] - c.w[D + d]).collect();
        let mut caps: Vec<f32> = diff
            .iter()
            .zip(&c.x)
            .map(|(&g, &v)| if g > 0.0 { g * v } else { -g * (1.0 - v) })
            .collect();
        caps.sort_by(|a, b| b.total_cmp(a));
        let margin = c.min_l2 * diff.iter().map(|g| g * g).sum::<f32>().sqrt();
        let min_l0 = (1..=D)
            .find(|&k| caps[..k].iter().sum::<f32>() > margin)
            .unwrap() as f32;
        let m = model(c);
        let out = PointwiseConfig {
            seed: 2,
            ..Default::default()
        }
        .run::<B, _>(&m, image(&c.x), label(c.y));
        let e = &out.examples[0];
        eprintln!(
            "pointwise: L0 {} (minimum {min_l0}), L2 {} (L2 minimum {})",
            e.l0, e.l2, c.min_l2
        );
        assert!(e.adversarial, "{e:?}");
        check_returned(&m, &out.inputs);
        assert!(
            e.l0 >= min_l0 && e.l0 <= min_l0 + 1.0,
            "L0 {} vs minimum {min_l0}",
            e.l0
        );
    }
}
