//! The sweep as a library call on a network that is not a jem-bench checkpoint: a linear
//! nearest-centroid classifier of MNIST, wrapped as a `Subject`. Bad pairings of network and
//! data are errors, not panics; a finished sweep writes the command's outputs and resumes.

use jem_attacks::LinearClassifier;
use jem_attacks::Norm;
use jem_bench::backend::Train;
use jem_bench::harness::{
    sweep, AttackKind, Budgets, Examples, Runner, Subject, SweepSpec, Threat, WORST_CASE,
};
use jem_datasets::{DataSource, Split};
use std::num::NonZeroUsize;

/// Logit k = ⟨x, m_k⟩ − ½‖m_k‖² (the nearest class mean m_k of 2 000 training digits).
fn centroid_classifier() -> LinearClassifier<Train> {
    let train = DataSource::parse("mnist")
        .unwrap()
        .load(Split::Train)
        .unwrap();
    let (d, k) = (train.image_len(), train.num_classes());
    let mut means = vec![0.0f32; k * d];
    let mut counts = vec![0usize; k];
    for i in 0..2000 {
        let y = train.labels[i] as usize;
        counts[y] += 1;
        for (m, &p) in means[y * d..(y + 1) * d].iter_mut().zip(train.image(i)) {
            *m += p;
        }
    }
    for (row, &c) in means.chunks_mut(d).zip(&counts) {
        row.iter_mut().for_each(|m| *m /= c as f32);
    }
    let bias: Vec<f32> = means
        .chunks(d)
        .map(|m| -0.5 * m.iter().map(|v| v * v).sum::<f32>())
        .collect();
    LinearClassifier::new(means, bias, k, &Default::default())
}

#[test]
fn a_network_that_does_not_fit_the_data_is_refused() {
    // 3 classes where MNIST has 10.
    let three =
        LinearClassifier::<Train>::new(vec![0.0; 3 * 784], vec![0.0; 3], 3, &Default::default());
    let e = Subject::new("three", three, "mnist")
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("gives 3 logits"), "{e:#}");
    // Inputs of another size: the forward pass fails, reported as an error.
    let small =
        LinearClassifier::<Train>::new(vec![0.0; 10 * 16], vec![0.0; 10], 10, &Default::default());
    let e = Subject::new("small", small, "mnist")
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("cannot classify"), "{e:#}");
    let e = Subject::new("x", centroid_classifier(), "no-such-data")
        .err()
        .expect("refused");
    assert!(format!("{e:#}").contains("no-such-data"), "{e:#}");
}

#[test]
fn a_sweep_of_an_own_network_writes_the_outputs_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SweepSpec {
        attacks: vec![AttackKind::Fgsm, AttackKind::Pgd],
        threat: Threat {
            norm: Norm::Linf,
            eps: vec![0.0, 0.05, 0.1],
        },
        ks: vec![0],
        examples: Examples::first(NonZeroUsize::new(30).unwrap()),
        budgets: Budgets {
            pgd_steps: NonZeroUsize::new(10).unwrap(),
            ..Budgets::default()
        },
        ..SweepSpec::default()
    };
    let runner = Runner::new(dir.path().join("sweep"));
    let subject = || Subject::new("centroids", centroid_classifier(), "mnist").unwrap();
    // Settings are refused by the name of their field.
    let none = SweepSpec {
        eot: Some(0),
        ..spec.clone()
    };
    let e = sweep(vec![subject()], &none, &runner).unwrap_err();
    assert_eq!(format!("{e}"), "eot: expected at least 1, found 0");
    assert!(
        !dir.path().join("sweep").exists(),
        "refused before anything is written"
    );

    let rows = sweep(vec![subject()], &spec, &runner).unwrap();
    let worst: Vec<_> = rows.iter().filter(|r| r.attack == WORST_CASE).collect();
    assert_eq!(worst.len(), 3, "one worst-case row per ε");
    assert!(
        worst[0].clean_accuracy > 0.6,
        "the centroids classify MNIST"
    );
    assert_eq!(worst[0].robust_accuracy, worst[0].clean_accuracy, "ε = 0");
    for w in worst.windows(2) {
        assert!(w[1].robust_accuracy <= w[0].robust_accuracy);
    }
    for r in &rows {
        assert!(r.robust_lo <= r.robust_accuracy && r.robust_accuracy <= r.robust_hi);
        assert_eq!(r.model, "centroids");
    }
    for file in [
        "robust.csv",
        "examples.csv",
        "summary.json",
        "settings.json",
    ] {
        assert!(dir.path().join("sweep").join(file).exists(), "{file}");
    }
    // The same network again: every cell is finished, the same rows come back.
    assert_eq!(sweep(vec![subject()], &spec, &runner).unwrap(), rows);
}

/// FGSM under another name: an attack of the caller's own, defined here.
#[derive(Clone)]
struct Renamed(&'static str, jem_attacks::PgdConfig);

impl jem_attacks::Describe for Renamed {
    fn name(&self) -> &'static str {
        self.0
    }
    fn settings(&self) -> serde_json::Value {
        jem_attacks::Describe::settings(&self.1)
    }
    fn access(&self) -> jem_attacks::Access {
        jem_attacks::Access::Gradients
    }
    fn randomised(&self) -> bool {
        false
    }
}

impl<B, M> jem_attacks::FixedEpsilon<B, M> for Renamed
where
    B: burn::tensor::backend::AutodiffBackend,
    M: jem_attacks::Model<B>,
{
    fn run_at(
        &self,
        model: &M,
        x: burn::tensor::Tensor<B::InnerBackend, 4>,
        y: burn::tensor::Tensor<B::InnerBackend, 1, burn::tensor::Int>,
        eps: f32,
    ) -> Result<jem_attacks::AttackOutcome, jem_attacks::AttackError> {
        jem_attacks::FixedEpsilon::<B, M>::run_at(&self.1, model, x, y, eps)
    }
}

#[test]
fn an_own_attack_runs_in_the_sweep_beside_the_built_in_ones() {
    use jem_bench::harness::{sweep_with_attacks, OwnAttack, RunContext};
    let dir = tempfile::tempdir().unwrap();
    let spec = SweepSpec {
        attacks: vec![AttackKind::Fgsm],
        threat: Threat {
            norm: Norm::Linf,
            eps: vec![0.0, 0.05, 0.1],
        },
        // K = 1: gradient modes, EOT draws and convergence checks for the own attack too.
        ks: vec![0, 1],
        examples: Examples::first(NonZeroUsize::new(30).unwrap()),
        ..SweepSpec::default()
    };
    let runner = Runner::new(dir.path().join("sweep"));
    let subject = || Subject::new("centroids", centroid_classifier(), "mnist").unwrap();
    let named = |name: &'static str| {
        OwnAttack::new(
            move |run: &RunContext| {
                let mut fgsm = jem_attacks::PgdConfig::fgsm(run.norm);
                fgsm.seed = run.seed;
                fgsm.eot = run.eot;
                jem_attacks::PerEpsilon(Renamed(name, fgsm))
            },
            1.0,
        )
    };
    // A name the sweep's own attacks or rows already use is refused.
    for taken in ["fgsm", "PGD", "autoattack", "worst-case", "a/b"] {
        let e =
            sweep_with_attacks(vec![subject()], vec![named(taken)], &spec, &runner).unwrap_err();
        assert!(
            format!("{e}").starts_with(&format!("attacks {taken}: ")),
            "{e}"
        );
    }
    let rows = sweep_with_attacks(vec![subject()], vec![named("my-fgsm")], &spec, &runner).unwrap();
    // FGSM under another name breaks what FGSM breaks, in rows of its own, with the same EOT
    // draws and convergence checks at K = 1.
    for (k, &eps) in [0, 1]
        .into_iter()
        .flat_map(|k| spec.threat.eps.iter().map(move |e| (k, e)))
    {
        let at = |attack: &str| {
            let row = rows
                .iter()
                .find(|r| r.attack == attack && r.eps == eps && r.k == k);
            row.unwrap_or_else(|| panic!("no {attack} row at K = {k}, ε = {eps}"))
        };
        let (own, fgsm) = (at("my-fgsm"), at("fgsm"));
        assert_eq!(
            own.robust_accuracy, fgsm.robust_accuracy,
            "K = {k}, ε = {eps}"
        );
        assert_eq!(
            (own.eot, own.restarts, own.grad),
            (fgsm.eot, fgsm.restarts, fgsm.grad)
        );
        assert_eq!(own.check_sampled, fgsm.check_sampled, "K = {k}, ε = {eps}");
        assert!(at(&WORST_CASE.to_string()).robust_accuracy <= own.robust_accuracy);
    }
    let checked = rows
        .iter()
        .filter(|r| r.attack == "my-fgsm" && r.check_sampled.is_some());
    assert!(
        checked.count() > 0,
        "the own attack's K = 1 cell had a convergence check"
    );
    assert!(rows.iter().any(|r| r.eps > 0.0 && r.robust_accuracy < 1.0));
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(runner.out.join("settings.json")).unwrap())
            .unwrap();
    assert_eq!(settings["own_attacks"][0]["name"], "my-fgsm");
    assert_eq!(settings["own_attacks"][0]["access"], "gradients");
    // The same sweep resumes from its cells; without its own attack it is another sweep.
    let again =
        sweep_with_attacks(vec![subject()], vec![named("my-fgsm")], &spec, &runner).unwrap();
    assert_eq!(again, rows);
    let e = sweep(vec![subject()], &spec, &runner).unwrap_err();
    assert!(format!("{e}").contains("own_attacks"), "{e}");
}
