//! Training on real MNIST: steps lower the loss, adversarial training steps lower the
//! adversarial loss, and an interrupted run resumes to exactly the weights and log of an
//! uninterrupted one.

use crate::common;

use std::path::Path;

use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use jem_attacks::{Norm, PgdConfig, Undefended};
use jem_bench::backend::{self, Train};
use jem_bench::batches::to_vec;
use jem_bench::model::Checkpoint;
use jem_bench::model::WideResNetConfig;
use jem_bench::train::{
    cross_entropy, train, AdvConfig, AdversarialObjective, ClassifierObjective, GuardConfig,
    JemConfig, Objective, Step, TrainKind, TrainSpec,
};

#[test]
fn adam_steps_on_real_digits_lower_the_loss() {
    let device = backend::device();
    let (x, y) = common::first_training_digits(64);
    let mut model = WideResNetConfig::new(10, 1, 1, 10)
        .init_seeded::<Train>(11, &device)
        .unwrap();
    let mut optim = AdamConfig::new().with_epsilon(1e-8).init::<Train, _>();
    let loss_of = |m: &jem_bench::model::WideResNet<Train>| {
        to_vec(cross_entropy(
            m.valid().forward(x.clone().inner()),
            y.clone().inner(),
        ))[0]
    };
    let before = loss_of(&model);
    for _ in 0..25 {
        let loss = cross_entropy(model.forward(x.clone()), y.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(2e-3, model, grads);
    }
    let after = loss_of(&model);
    assert!(
        (before - 2.303).abs() < 0.2,
        "initial loss {before} should be near ln 10"
    );
    // Without normalisation layers the first steps are slow; 25 steps still cut the loss clearly.
    assert!(after < 0.85 * before, "loss {before} -> {after}");
}

fn small_run(out: &Path) -> TrainSpec {
    TrainSpec {
        kind: TrainKind::Baseline,
        data: "mnist".into(),
        val_size: 200,
        train_subset: Some(192),
        test_subset: Some(100),
        depth: 10,
        width: 1,
        epochs: 2,
        batch_size: 32,
        lr: 1e-3,
        warmup_iters: 3,
        decay_epochs: vec![1],
        decay_rate: 0.5,
        sigma_data: 0.03,
        pad: 2,
        flip: None,
        seed: 5,
        out: out.to_path_buf(),
        checkpoint_every: 4,
        log_every: 1,
        init_from: None,
        jem: JemConfig::default(),
        adv: AdvConfig::default(),
        guard: GuardConfig::default(),
        max_iters: None,
    }
}

#[test]
fn interrupted_run_resumes_to_the_same_result() {
    let device = backend::device();
    let whole = tempfile::tempdir().unwrap();
    let done =
        train::<Train, _>(&small_run(whole.path()), &mut ClassifierObjective, &device).unwrap();
    assert!(done.finished);
    assert_eq!(done.iterations, 12);
    assert!(done.test.is_some());

    // Stop mid-epoch (iteration 5 is between state saves at 4 and 6), then twice more.
    let parts = tempfile::tempdir().unwrap();
    for stop in [5, 9] {
        let mut cfg = small_run(parts.path());
        cfg.max_iters = Some(stop);
        let o = train::<Train, _>(&cfg, &mut ClassifierObjective, &device).unwrap();
        assert!(!o.finished);
        assert_eq!(o.iterations, stop);
    }
    let resumed =
        train::<Train, _>(&small_run(parts.path()), &mut ClassifierObjective, &device).unwrap();
    assert!(resumed.finished);
    assert_eq!(resumed.iterations, 12);

    // Same seed, same data order, same noise: identical logs and weights.
    let (a, b) = (log(whole.path(), "log.csv"), log(parts.path(), "log.csv"));
    assert_eq!(a.len(), 13, "header + one row per iteration");
    let iters: Vec<&str> = b[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        iters,
        (1..=12).map(|i| i.to_string()).collect::<Vec<_>>(),
        "no lost or duplicated rows"
    );
    for (ra, rb) in a.iter().zip(&b) {
        // every column but the timing one
        assert_eq!(ra[..ra.len() - 1], rb[..rb.len() - 1]);
    }
    assert_eq!(log(parts.path(), "epochs.csv").len(), 3);
    assert_eq!(
        common::best_logits(whole.path()),
        common::best_logits(parts.path())
    );

    assert_eq!(done.best_val_accuracy, resumed.best_val_accuracy);
    let moved = tempfile::tempdir().unwrap();
    let target = extended_moved_and_refused(parts.path(), moved.path());
    let base = schedule_changes_apply_from_where_the_run_stands(&target);
    backends_recorded_and_a_cut_state_refused(&target, base);
}

/// A run's CSV log `name` in `d`, as rows of cells.
fn log(d: &Path, name: &str) -> Vec<Vec<String>> {
    std::fs::read_to_string(d.join(name))
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

/// The finished run in `parts` grows by an epoch, is moved into `moved` (and resumes there, to
/// 24 iterations), and is refused other settings or a rewritten past schedule. Returns where it
/// is.
fn extended_moved_and_refused(parts: &Path, moved: &Path) -> std::path::PathBuf {
    let device = backend::device();
    // A finished run can be extended by more epochs: it continues from where it stopped.
    let mut longer = small_run(parts);
    longer.epochs = 3;
    let extended = train::<Train, _>(&longer, &mut ClassifierObjective, &device).unwrap();
    assert_eq!(extended.iterations, 18);
    assert_eq!(log(parts, "epochs.csv").len(), 4);

    // A run folder can be moved and still resumes.
    let target = moved.join("run");
    std::fs::rename(parts, &target).unwrap();
    let mut again = small_run(&target);
    again.epochs = 4;
    assert_eq!(
        train::<Train, _>(&again, &mut ClassifierObjective, &device)
            .unwrap()
            .iterations,
        24
    );

    // A resume with other settings is refused, naming the folder; so is a change of the past
    // learning-rate schedule (a decay moved to an epoch already trained).
    let refused = |cfg: &TrainSpec| {
        let err = train::<Train, _>(cfg, &mut ClassifierObjective, &device)
            .unwrap_err()
            .to_string();
        assert!(err.contains("other settings"), "{err}");
    };
    let mut other = small_run(&target);
    other.seed += 1;
    refused(&other);
    let mut rewritten = small_run(&target);
    rewritten.epochs = 5;
    rewritten.decay_epochs = vec![2];
    refused(&rewritten);

    target
}

/// Decays added ahead and a new base rate or σ_data apply from where the run stands, and are
/// recorded in changes.csv. Returns the base learning rate.
fn schedule_changes_apply_from_where_the_run_stands(target: &Path) -> f64 {
    let device = backend::device();
    // A decay added at an epoch not reached yet only changes the future, and is applied.
    let mut decayed = small_run(target);
    decayed.epochs = 5;
    decayed.decay_epochs = vec![1, 4];
    let o = train::<Train, _>(&decayed, &mut ClassifierObjective, &device).unwrap();
    assert_eq!(o.iterations, 30);
    let rows = log(target, "log.csv");
    let lr_col = rows[0].iter().position(|c| c == "lr").unwrap();
    let lr_at = |iter: usize| rows[iter][lr_col].parse::<f64>().unwrap();
    let base = small_run(target).lr;
    assert!(
        (lr_at(24) / base - 0.5).abs() < 1e-6,
        "epoch 3 keeps one decay"
    );
    assert!(
        (lr_at(25) / base - 0.25).abs() < 1e-6,
        "epoch 4 has both decays"
    );

    // A new base learning rate applies from where the run stands, with the decays it has
    // reached, and the change is recorded in changes.csv with the epochs that grew; so is a
    // new σ_data.
    let mut faster = small_run(target);
    faster.epochs = 6;
    faster.decay_epochs = vec![1, 4];
    faster.lr = 4.0 * base;
    faster.sigma_data = 0.05;
    let o = train::<Train, _>(&faster, &mut ClassifierObjective, &device).unwrap();
    assert_eq!(o.iterations, 36);
    let rows = log(target, "log.csv");
    assert!((lr_at(30) / base - 0.25).abs() < 1e-6, "before the change");
    assert!(
        (rows[31][lr_col].parse::<f64>().unwrap() / (4.0 * base) - 0.25).abs() < 1e-6,
        "after the change, both decays on the new rate"
    );
    let changes = std::fs::read_to_string(target.join("changes.csv")).unwrap();
    let lines: Vec<&str> = changes.lines().collect();
    assert_eq!(lines[0], "iteration,setting,before,after");
    assert!(lines.contains(&"30,lr,0.001,0.004"), "{changes}");
    assert!(lines.contains(&"30,epochs,5,6"), "{changes}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("30,sigma_data,0.0299") && l.contains(",0.05")),
        "{changes}"
    );
    assert!(
        lines.contains(&r#"24,decay_epochs,[1],"[1,4]""#),
        "{changes}"
    );

    base
}

/// backends.csv names the backend of every start and resume; a cut model record is refused
/// naming the file.
fn backends_recorded_and_a_cut_state_refused(target: &Path, base: f64) {
    let device = backend::device();
    // Each start and resume names the backend it computed on, from the iteration it began at.
    let backends = std::fs::read_to_string(target.join("backends.csv")).unwrap();
    let lines: Vec<&str> = backends.lines().collect();
    assert_eq!(
        lines[..2],
        ["iteration,backend", "0,burn-flex"],
        "{backends}"
    );
    assert_eq!(lines.last(), Some(&"30,burn-flex"), "{backends}");

    // A state whose model record cannot be read (here cut short, as by an older layout) is
    // refused with an error naming the file, not a panic.
    let progress: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(target.join("state/progress.json")).unwrap())
            .unwrap();
    let record = target.join(format!("state/model-{}.bin", progress["generation"]));
    let bytes = std::fs::read(&record).unwrap();
    std::fs::write(&record, &bytes[..bytes.len() / 2]).unwrap();
    let mut more = small_run(target);
    more.epochs = 7;
    more.decay_epochs = vec![1, 4];
    more.lr = 4.0 * base;
    let err = train::<Train, _>(&more, &mut ClassifierObjective, &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&record.display().to_string()), "{err}");
}

/// Cross-entropy of `model` on PGD examples (10 steps, fixed seed) of `x` at L∞ radius `eps`.
fn adversarial_loss(
    model: &jem_bench::model::WideResNet<Train>,
    x: &burn::tensor::Tensor<Train, 4>,
    y: &burn::tensor::Tensor<Train, 1, burn::tensor::Int>,
    eps: f32,
) -> f32 {
    let attack = PgdConfig {
        steps: 10,
        rel_stepsize: 0.25,
        early_stop: false,
        seed: 99,
        ..PgdConfig::pgd(Norm::Linf)
    };
    let x_adv = attack.perturb::<Train, _>(
        &Undefended::new(model.clone()),
        x.clone().inner(),
        y.clone().inner(),
        eps,
    );
    to_vec(cross_entropy(
        model.valid().forward(x_adv),
        y.clone().inner(),
    ))[0]
}

#[test]
fn adversarial_training_steps_lower_the_adversarial_loss() {
    let device = backend::device();
    let (x, y) = common::first_training_digits(64);
    let (start, _) = Checkpoint::at("results/models/baseline")
        .load::<Train>(&device)
        .unwrap();
    let eps = 0.1;
    let before = adversarial_loss(&start, &x, &y, eps);

    // The same number of Adam steps on the same batch, with the PGD objectives (Madry's and
    // TRADES') and with the clean one: only the first two should make the batch robust.
    let steps = |objective: &mut dyn Objective<Train>| {
        let mut model = start.clone();
        let mut optim = AdamConfig::new().with_epsilon(1e-8).init::<Train, _>();
        for iteration in 0..10 {
            let step = Step {
                iteration,
                seed: iteration as u64,
            };
            let (loss, stats) = objective.loss(&model, x.clone(), y.clone(), step);
            assert!(stats.loss.is_finite());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-3, model, grads);
        }
        model
    };
    let after_clean = adversarial_loss(&steps(&mut ClassifierObjective), &x, &y, eps);
    assert!(
        before > 0.5,
        "the baseline should not be robust at ε = {eps}: {before}"
    );
    for trades_beta in [None, Some(6.0)] {
        let config = AdvConfig {
            eps,
            adv_steps: 5,
            adv_rel_stepsize: 0.5,
            trades_beta,
            ..AdvConfig::default()
        };
        let after_adv =
            adversarial_loss(&steps(&mut AdversarialObjective::new(config)), &x, &y, eps);
        eprintln!(
            "TRADES β {trades_beta:?}: adversarial loss at ε = {eps}: {before} -> {after_adv} \
             (clean steps: {after_clean})"
        );
        assert!(
            after_adv < 0.5 * before && after_adv < 0.5 * after_clean,
            "TRADES β {trades_beta:?}: adversarial loss {before} -> {after_adv} (clean \
             training: {after_clean})"
        );
    }
}

/// A short PGD fine-tune of the embedded baseline at ε = 0.1, validated under its own attack.
fn small_adversarial_run(out: &Path, epochs: usize) -> TrainSpec {
    TrainSpec {
        kind: TrainKind::Adv,
        train_subset: Some(128),
        test_subset: Some(100),
        epochs,
        decay_epochs: vec![],
        lr: 1e-2,
        init_from: Some("results/models/baseline".into()),
        adv: AdvConfig {
            eps: 0.1,
            adv_steps: 3,
            adv_rel_stepsize: 0.5,
            adv_val_size: 100,
            ..AdvConfig::default()
        },
        ..small_run(out)
    }
}

#[test]
fn adversarial_training_keeps_its_most_robust_epoch_and_older_states_are_refused() {
    let device = backend::device();
    let objective = |cfg: &TrainSpec| AdversarialObjective::new(cfg.adv.clone());
    let whole = tempfile::tempdir().unwrap();
    let cfg = small_adversarial_run(whole.path(), 3);
    let done = train::<Train, _>(&cfg, &mut objective(&cfg), &device).unwrap();
    assert!(done.finished);

    // The best flag marks exactly the epochs that beat every earlier one under attack, and the
    // kept checkpoint is the most robust (not the most accurate) epoch.
    let text = std::fs::read_to_string(whole.path().join("epochs.csv")).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
    let col = |name: &str| rows[0].iter().position(|c| *c == name).unwrap();
    let (robust_col, best_col) = (col("val_robust_accuracy"), col("best"));
    let robust: Vec<f64> = rows[1..]
        .iter()
        .map(|r| r[robust_col].parse().unwrap())
        .collect();
    assert_eq!(robust.len(), 3);
    let mut max = f64::NEG_INFINITY;
    for (r, row) in robust.iter().zip(&rows[1..]) {
        assert!((0.0..=1.0).contains(r), "{r}");
        assert_eq!(row[best_col] == "true", *r > max, "{text}");
        max = max.max(*r);
    }
    assert_eq!(done.best_val_robust_accuracy, Some(max));
    let (_, sidecar) = Checkpoint::at(whole.path().join("model"))
        .load::<Train>(&device)
        .unwrap();
    assert_eq!(sidecar.metrics["val_robust_accuracy"], max);

    // A state of an earlier format (before states recorded one) is refused with what to do,
    // before anything of the run changes.
    let old = tempfile::tempdir().unwrap();
    let two = small_adversarial_run(old.path(), 2);
    train::<Train, _>(&two, &mut objective(&two), &device).unwrap();
    let progress_path = old.path().join("state/progress.json");
    let mut progress: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&progress_path).unwrap()).unwrap();
    progress.as_object_mut().unwrap().remove("format");
    std::fs::write(&progress_path, progress.to_string()).unwrap();
    let epochs = std::fs::read_to_string(old.path().join("epochs.csv")).unwrap();
    let three = small_adversarial_run(old.path(), 3);
    let err = train::<Train, _>(&three, &mut objective(&three), &device)
        .err()
        .expect("an earlier format is refused")
        .to_string();
    assert!(
        err.contains("progress.json: format") && err.contains("format 1"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(old.path().join("epochs.csv")).unwrap(),
        epochs
    );
}

/// A warm start from a narrower network of the same depth is widened first (Net2WiderNet): at
/// a learning rate too small to move it, the WRN-10-2 run ends with the test metrics of the
/// embedded WRN-10-1 it started from, as a WRN-10-1 run from the same weights does. A warm
/// start that cannot be widened (another depth) is refused before anything is written.
#[test]
fn a_narrower_warm_start_is_widened_without_changing_what_it_computes() {
    let device = backend::device();
    let run = |width: usize, depth: usize| {
        let out = tempfile::tempdir().unwrap();
        let cfg = TrainSpec {
            width,
            depth,
            epochs: 1,
            train_subset: Some(32),
            lr: 1e-12,
            init_from: Some("results/models/baseline".into()),
            ..small_run(out.path())
        };
        let outcome = train::<Train, _>(&cfg, &mut ClassifierObjective, &device);
        (outcome, out)
    };
    let (narrow, _kept) = run(1, 10);
    let (wide, _kept_too) = run(2, 10);
    let (narrow, wide) = (narrow.unwrap().test.unwrap(), wide.unwrap().test.unwrap());
    assert_eq!(narrow.n, wide.n);
    assert_eq!(narrow.accuracy, wide.accuracy);
    assert!(
        (narrow.nll - wide.nll).abs() < 1e-4 * narrow.nll.max(1e-3),
        "{narrow:?} {wide:?}"
    );

    let (refused, folder) = run(1, 16);
    let message = format!("{:#}", refused.unwrap_err());
    assert!(
        message.contains("init_from") && message.contains("widens"),
        "{message}"
    );
    assert_eq!(
        std::fs::read_dir(folder.path()).unwrap().count(),
        0,
        "{message}"
    );
}
