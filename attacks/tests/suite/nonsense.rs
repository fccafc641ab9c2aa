//! Nonsense-input search on linear models: with strong weights every class can be driven past
//! the threshold from noise; with zero weights p(y|x) is 1/K everywhere and no search may claim
//! success.

use crate::common;

use common::{B, D};
use jem_attacks::{LinearClassifier, Model, NonsenseConfig, Undefended};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const K: usize = 3;

fn model(w: Vec<f32>) -> Undefended<LinearClassifier<B>> {
    Undefended::new(LinearClassifier::<B>::new(
        w,
        vec![0.0; K],
        K,
        &Default::default(),
    ))
}

#[test]
fn every_class_is_reached_on_a_strong_linear_model() {
    let mut rng = StdRng::seed_from_u64(1);
    let m = model((0..K * D).map(|_| rng.random_range(-1.0..1.0)).collect());
    let cfg = NonsenseConfig {
        max_iters: 500,
        seed: 4,
        ..Default::default()
    };
    let targets: Vec<usize> = (0..K).flat_map(|c| [c, c]).collect();
    let out = cfg.run::<B, _>(&m, [1, 4, 4], &targets, &Default::default());
    assert!(
        out.iterations.iter().any(|&i| i > 0),
        "noise alone was already confident"
    );
    eprintln!("{out:?}");
    assert!(out.images.iter().all(|v| (0.0..=1.0).contains(v)));
    // Re-classify the returned inputs: their target is the arg-max with the reported confidence.
    let logits: Vec<f32> = Model::<B>::logits(
        &m,
        common::image(&out.images),
        &mut StdRng::seed_from_u64(0),
    )
    .into_data()
    .to_vec()
    .unwrap();
    for (i, &t) in targets.iter().enumerate() {
        assert!(
            out.reached[i] && out.confidence[i] >= 0.9,
            "search {i}: {out:?}"
        );
        assert!(out.iterations[i] < cfg.max_iters);
        let row = &logits[i * K..(i + 1) * K];
        let z = row.iter().map(|l| (l - row[t]).exp()).sum::<f32>();
        assert!((1.0 / z - out.confidence[i]).abs() < 1e-4);
    }
}

#[test]
fn an_uninformative_model_is_never_fooled() {
    let m = model(vec![0.0; K * D]);
    let cfg = NonsenseConfig {
        max_iters: 50,
        ..Default::default()
    };
    let out = cfg.run::<B, _>(&m, [1, 4, 4], &[0, 1, 2], &Default::default());
    for i in 0..K {
        assert!(!out.reached[i] && out.iterations[i] == 50, "{out:?}");
        assert!((out.confidence[i] - 1.0 / K as f32).abs() < 1e-6);
    }
}
