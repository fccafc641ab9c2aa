//! The Square attack (score-based, no gradients) against a linear classifier, whose minimal L∞
//! perturbation is known in closed form, and its window schedule against the published one.

use jem_attacks::{LinearClassifier, Norm, SquareConfig, Undefended};

mod common;
use common::{cases, image, label, B};

#[test]
fn window_fraction_follows_the_published_schedule() {
    let mut cfg = SquareConfig::new(Norm::Linf);
    cfg.queries = 10_000;
    let p = |q| cfg.window_fraction(q);
    assert_eq!(
        (p(1), p(10), p(11), p(50), p(51)),
        (0.8, 0.8, 0.4, 0.4, 0.2)
    );
    assert_eq!((p(8000), p(8001)), (0.8 / 256.0, 0.8 / 512.0));
    // Rescaled to a budget of 1 000: the first halving after query 1.
    cfg.queries = 1000;
    assert_eq!((cfg.window_fraction(1), cfg.window_fraction(2)), (0.8, 0.4));
}

#[test]
fn square_finds_the_minimal_linf_perturbation_of_a_linear_model() {
    let cfg = SquareConfig::new(Norm::Linf);
    for c in cases(6) {
        let model = Undefended::new(LinearClassifier::<B>::new(
            c.w.clone(),
            c.b.clone(),
            2,
            &Default::default(),
        ));
        let run = |eps: f32| {
            let out = cfg
                .run::<B, _>(&model, image(&c.x), label(c.y), eps)
                .unwrap();
            let e = &out.examples[0];
            assert!(e.clean_correct && e.linf <= eps * 1.0001 + 1e-6, "{e:?}");
            assert!(e.gradient_evals == 0, "a black box takes no gradients");
            e.adversarial
        };
        assert!(run(1.02 * c.min_linf), "just above {}", c.min_linf);
        assert!(!run(0.98 * c.min_linf), "just below {}", c.min_linf);
    }
    let l2 = SquareConfig::new(Norm::L2);
    let c = &cases(1)[0];
    let model = Undefended::new(LinearClassifier::<B>::new(
        c.w.clone(),
        c.b.clone(),
        2,
        &Default::default(),
    ));
    assert!(l2
        .run::<B, _>(&model, image(&c.x), label(c.y), 0.5)
        .is_err());
}
