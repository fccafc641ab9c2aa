//! The one-call interface ([`Attack`]): a model, a batch, labels and a list of ε in, one outcome
//! per ε out, checked on a linear model whose minimal perturbation per example is known in
//! closed form: each example is broken exactly at the ε that reach its minimum (never 2 %
//! below it), breaks carry to every larger ε at no further cost, and ε = 0 changes nothing.

use crate::common;

use common::{batch, image, labels, B, D};
use jem_attacks::{
    ApgdConfig, ApgdLoss, Attack, BoundaryConfig, Cascade, MinimumNorm, Norm, PgdConfig,
};

type M = common::Linear;

#[test]
fn fixed_eps_attacks_answer_every_eps_with_breaks_carried() {
    let b = batch();
    assert!(
        b.margin.iter().any(|&m| m < 0.0) && b.margin.iter().filter(|&&m| m > 0.0).count() >= 3,
        "the batch mixes misclassified and correct inputs: {:?}",
        b.margin
    );
    // Unsorted on purpose: outcomes come back in the order asked.
    let eps = [0.3, 0.0, 0.01, 0.02, 0.04, 0.08, 0.005];
    let attacks: Vec<Box<dyn Attack<B, M>>> = vec![
        // Enough steps to cross the ball from any random start (as in the PGD tests).
        Box::new(PgdConfig {
            steps: 100,
            rel_stepsize: 0.05,
            ..PgdConfig::pgd(Norm::Linf)
        }),
        Box::new(ApgdConfig::new(Norm::Linf, ApgdLoss::CrossEntropy)),
    ];
    for attack in &attacks {
        let out = attack
            .attack(&b.model, image(&b.x), labels(8), &eps)
            .expect("runs");
        assert_eq!(out.len(), eps.len());
        for (j, &e) in eps.iter().enumerate() {
            for i in 0..8 {
                let ex = &out[j].examples[i];
                assert_eq!(
                    ex.clean_correct,
                    b.margin[i] > 0.0,
                    "{} {ex:?}",
                    attack.name()
                );
                if !ex.clean_correct {
                    continue;
                }
                let min = b.min_linf[i];
                if e == 0.0 || e <= 0.98 * min {
                    assert!(!ex.adversarial, "{} ε {e} < minimum {min}", attack.name());
                }
                if e >= 1.02 * min {
                    assert!(
                        ex.adversarial,
                        "{} ε {e} ≥ 1.02 × minimum {min}",
                        attack.name()
                    );
                }
                if ex.adversarial {
                    assert!(ex.linf <= e * (1.0 + 1e-5) + 1e-7, "{ex:?} at ε {e}");
                }
            }
        }
        // A break carries to every larger ε at no cost; ε = 0 returns the clean inputs.
        let zero = eps.iter().position(|&e| e == 0.0).unwrap();
        assert_eq!(out[zero].inputs, b.x);
        let mut order: Vec<usize> = (0..eps.len()).collect();
        order.sort_by(|&p, &q| eps[p].total_cmp(&eps[q]));
        for i in 0..8 {
            for w in order.windows(2) {
                let (lo, hi) = (&out[w[0]].examples[i], &out[w[1]].examples[i]);
                if lo.adversarial {
                    assert!(
                        hi.adversarial,
                        "example {i}: broken at ε {} not at ε {}",
                        eps[w[0]], eps[w[1]]
                    );
                    assert_eq!((hi.gradient_evals, hi.forward_evals), (0, 0));
                    assert_eq!(hi.linf, lo.linf, "the same adversarial input is carried");
                }
            }
        }
    }
}

#[test]
fn minimum_norm_attacks_answer_each_eps_by_their_distance() {
    let b = batch();
    let attack = MinimumNorm {
        attack: BoundaryConfig {
            steps: 3000,
            seed: 5,
            ..Default::default()
        },
        norm: Norm::L2,
    };
    let eps = [0.0, 0.01, 0.02, 0.05, 0.1, 0.5];
    let out =
        Attack::<B, M>::attack(&attack, &b.model, image(&b.x), labels(8), &eps).expect("runs");
    for (j, &e) in eps.iter().enumerate() {
        for i in (0..8).filter(|&i| b.margin[i] > 0.0) {
            let ex = &out[j].examples[i];
            let min = b.min_l2[i];
            if e < min {
                assert!(!ex.adversarial, "ε {e} below the minimum {min}: {ex:?}");
                assert_eq!(ex.l2, 0.0, "a held example reports the clean input");
                assert_eq!(out[j].inputs[i * D..(i + 1) * D], b.x[i * D..(i + 1) * D]);
            }
            if e >= 1.05 * min {
                assert!(ex.adversarial, "ε {e} ≥ 1.05 × minimum {min}: {ex:?}");
                assert!(ex.l2 <= e * (1.0 + 1e-5));
            }
        }
    }
}

#[test]
fn a_cascade_attacks_only_what_the_attacks_before_it_left_standing() {
    let b = batch();
    let eps = [0.0, 0.01, 0.02, 0.04, 0.08, 0.3];
    // A weak first attack (one short step from the clean input) breaks only the easy examples
    // at the larger ε; APGD and then the boundary attack (minimum-norm, judged per ε) follow.
    let weak = PgdConfig {
        steps: 1,
        rel_stepsize: 0.6,
        random_start: false,
        ..PgdConfig::pgd(Norm::Linf)
    };
    let cascade = Cascade::<B, M> {
        name: "test",
        attacks: vec![
            Box::new(weak.clone()) as Box<dyn Attack<B, M>>,
            Box::new(ApgdConfig::new(Norm::Linf, ApgdLoss::CrossEntropy)),
            Box::new(MinimumNorm {
                attack: BoundaryConfig {
                    steps: 500,
                    seed: 5,
                    ..Default::default()
                },
                norm: Norm::Linf,
            }),
        ],
    };
    let stages = cascade
        .stages(&b.model, image(&b.x), labels(8), &eps)
        .expect("runs");
    assert_eq!(stages.len(), 3);
    let alone = Attack::<B, M>::attack(&weak, &b.model, image(&b.x), labels(8), &eps).unwrap();
    let mut weak_broke = 0;
    for (j, &e) in eps.iter().enumerate() {
        for i in 0..8 {
            let (first, second, third) = (
                &stages[0][j].examples[i],
                &stages[1][j].examples[i],
                &stages[2][j].examples[i],
            );
            // The first stage is the attack on its own.
            assert_eq!(first, &alone[j].examples[i]);
            if first.clean_correct && first.adversarial {
                weak_broke += 1;
                // Carried into the later stages at no further cost (or an own break at a smaller ε,
                // carried up).
                for later in [second, third] {
                    assert!(later.adversarial && later.linf <= e * (1.0 + 1e-5) + 1e-7);
                    assert_eq!((later.gradient_evals, later.forward_evals), (0, 0));
                }
            } else if first.clean_correct
                && e > 0.0
                && !(j > 0 && stages[1][j - 1].examples[i].adversarial)
            {
                assert!(
                    second.gradient_evals > 0,
                    "APGD attacked the survivor: {second:?}"
                );
            }
            // Joint outcomes only gain breaks from stage to stage.
            assert!(!first.adversarial || second.adversarial);
            assert!(!second.adversarial || third.adversarial);
            // And the joint outcome is exact on a linear model.
            if b.margin[i] > 0.0 {
                let min = b.min_linf[i];
                if e <= 0.98 * min {
                    assert!(!third.adversarial, "ε {e} below the minimum {min}");
                }
                if e >= 1.02 * min {
                    assert!(third.adversarial, "ε {e} ≥ 1.02 × minimum {min}");
                }
            }
        }
    }
    assert!(weak_broke > 0, "the weak attack broke something to carry");
    for i in 0..8 {
        // The minimum-norm stage runs once per example: its cost appears at one ε at most.
        let charged = (0..eps.len())
            .filter(|&j| stages[2][j].examples[i].forward_evals > 0)
            .count();
        assert!(
            charged <= 1,
            "example {i}: boundary cost counted at {charged} ε"
        );
        // Every stage agrees with the first on the clean pass (at ε = 0 too).
        for stage in &stages {
            assert_eq!(stage[0].examples[i].clean_correct, b.margin[i] > 0.0);
        }
    }
    // `attack` on a cascade is its last stage.
    let joint = cascade
        .attack(&b.model, image(&b.x), labels(8), &eps)
        .unwrap();
    for j in 0..eps.len() {
        assert_eq!(joint[j].examples, stages[2][j].examples);
    }
}

#[test]
fn attacks_declare_what_they_need_and_wrappers_pass_it_through() {
    use jem_attacks::{Access, Describe, FabConfig, PerEpsilon, PointwiseConfig, SquareConfig};
    let fgsm = PgdConfig::fgsm(Norm::Linf);
    let pgd = PgdConfig::pgd(Norm::L2);
    let square = SquareConfig::new(Norm::Linf);
    let described: [(&dyn Describe, &str, Access, bool); 6] = [
        (&fgsm, "fgsm", Access::Gradients, false),
        (&pgd, "pgd", Access::Gradients, true),
        (&square, "square", Access::Scores, true),
        (
            &FabConfig::new(Norm::Linf),
            "fab-t",
            Access::Gradients,
            false,
        ),
        (
            &BoundaryConfig::default(),
            "boundary",
            Access::Decisions,
            true,
        ),
        (
            &PointwiseConfig::default(),
            "pointwise",
            Access::Decisions,
            true,
        ),
    ];
    for (attack, name, access, randomised) in described {
        assert_eq!(
            (attack.name(), attack.access(), attack.randomised()),
            (name, access, randomised)
        );
        assert!(
            attack.settings().is_object(),
            "{name}: settings as a JSON object"
        );
    }
    // FAB's restarts start at random points.
    let fab = FabConfig {
        restarts: 2,
        ..FabConfig::new(Norm::Linf)
    };
    assert!(fab.randomised());
    // Wrappers say what the attack they wrap says.
    let per_eps = PerEpsilon(square.clone());
    assert_eq!(
        (per_eps.name(), per_eps.access()),
        ("square", Access::Scores)
    );
    assert_eq!(per_eps.settings(), square.settings());
    let minimum = MinimumNorm {
        attack: BoundaryConfig::default(),
        norm: Norm::L2,
    };
    assert_eq!(
        (minimum.name(), minimum.access()),
        ("boundary", Access::Decisions)
    );
    // A cascade needs what its most demanding stage needs.
    let black_box: Cascade<B, M> = Cascade {
        name: "black-box",
        attacks: vec![Box::new(minimum.clone()), Box::new(square.clone())],
    };
    assert_eq!(black_box.access(), Access::Scores);
    let white_box: Cascade<B, M> = Cascade {
        name: "white-box",
        attacks: vec![Box::new(minimum), Box::new(fgsm)],
    };
    assert_eq!(white_box.access(), Access::Gradients);
    assert!(white_box.randomised(), "the boundary attack is");
}
