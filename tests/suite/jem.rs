//! JEM training on real digits: resume continues the same chains and the same log, and the
//! divergence guard rolls back and recovers on a deliberately unstable setting.

use crate::common;

use std::path::Path;

use jem_bench::backend::{self, Train};
use jem_bench::train::{train, JemObjective, ReplayBuffer, TrainKind, TrainSpec};

fn small_jem(out: &Path) -> TrainSpec {
    let mut cfg = TrainSpec {
        kind: TrainKind::Jem,
        data: "mnist".into(),
        val_size: 100,
        train_subset: Some(64),
        test_subset: Some(100),
        depth: 10,
        width: 1,
        epochs: 2,
        batch_size: 16,
        lr: 1e-3,
        warmup_iters: 2,
        decay_epochs: vec![],
        decay_rate: 0.3,
        sigma_data: 0.03,
        pad: 0,
        flip: None,
        seed: 11,
        out: out.to_path_buf(),
        checkpoint_every: 3,
        log_every: 1,
        init_from: None,
        jem: Default::default(),
        adv: Default::default(),
        guard: Default::default(),
        max_iters: None,
    };
    cfg.jem.sgld_steps = 3;
    cfg.jem.buffer_size = 40;
    cfg
}

fn run(cfg: &TrainSpec) -> anyhow::Result<jem_bench::train::TrainOutcome> {
    let mut jem = JemObjective::new(cfg.jem.clone(), cfg.guard.guard_max_energy_gap);
    train::<Train, _>(cfg, &mut jem, &backend::device())
}

fn rows(dir: &Path, name: &str) -> Vec<Vec<String>> {
    std::fs::read_to_string(dir.join(name))
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

fn file(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

#[test]
fn resumed_jem_run_continues_the_same_chains_and_log() {
    let whole = tempfile::tempdir().unwrap();
    let done = run(&small_jem(whole.path())).unwrap();
    assert!(done.finished);
    assert_eq!(done.iterations, 8);

    let parts = tempfile::tempdir().unwrap();
    for stop in [2, 5] {
        let mut cfg = small_jem(parts.path());
        cfg.max_iters = Some(stop);
        assert_eq!(run(&cfg).unwrap().iterations, stop);
    }
    assert_eq!(run(&small_jem(parts.path())).unwrap().iterations, 8);

    let (a, b) = (rows(whole.path(), "log.csv"), rows(parts.path(), "log.csv"));
    let header = &a[0];
    for column in [
        "cross_entropy",
        "gen_loss",
        "energy_data",
        "energy_samples",
        "lr",
    ] {
        assert!(
            header.iter().any(|h| h == column),
            "log lacks {column}: {header:?}"
        );
    }
    let iters: Vec<&str> = b[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        iters,
        ["1", "2", "3", "4", "5", "6", "7", "8"],
        "no lost or duplicated rows"
    );
    // Every column but the timings is identical: same data, same chains, same noise.
    let timing: Vec<usize> = header
        .iter()
        .enumerate()
        .filter(|(_, h)| h.ends_with("seconds") || h.ends_with("seconds_per_iteration"))
        .map(|(i, _)| i)
        .collect();
    for (ra, rb) in a.iter().zip(&b) {
        for (i, (x, y)) in ra.iter().zip(rb).enumerate() {
            if !timing.contains(&i) {
                assert_eq!(x, y, "column {}", header[i]);
            }
        }
    }
    assert!(a[1..].iter().all(|r| r.iter().all(|v| !v.contains("NaN"))));
    let (wa, wb) = (
        common::best_logits(whole.path()),
        common::best_logits(parts.path()),
    );
    let worst = wa
        .iter()
        .zip(&wb)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst == 0.0, "weights differ by up to {worst}");
    // The replay buffers (latest generation in each state folder) are identical too.
    let buffer = |d: &Path| {
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("state/progress.json")).unwrap())
                .unwrap();
        file(d, &format!("state/objective-{}.bin", p["generation"]))
    };
    assert!(
        buffer(whole.path()) == buffer(parts.path()),
        "replay buffers differ"
    );

    // buffer.png pictures the latest chains: 40 chains, 10 per row, 28×28 cells 2 pixels apart.
    let chains = ReplayBuffer::from_bytes(&buffer(whole.path()), "buffer").unwrap();
    let png = std::fs::File::open(whole.path().join("buffer.png")).unwrap();
    let mut reader = png::Decoder::new(std::io::BufReader::new(png))
        .read_info()
        .unwrap();
    let mut grid = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut grid).unwrap();
    assert_eq!((info.width, info.height), (10 * 30 + 2, 4 * 30 + 2));
    for (chain, (row, col)) in [(0, (0, 0)), (13, (1, 3)), (39, (3, 9))] {
        let (y0, x0) = (2 + row * 30, 2 + col * 30);
        for (i, &v) in chains.image(chain).iter().enumerate() {
            let (y, x) = (y0 + i / 28, x0 + i % 28);
            let want = (v.clamp(0.0, 1.0) * 255.0).round() as u8;
            assert_eq!(
                grid[y * info.width as usize + x],
                want,
                "chain {chain} pixel {i}"
            );
        }
    }
}

/// A small JEM run in a fresh folder, stopped after `iterations` so that it can be resumed.
fn stopped_after(iterations: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = small_jem(dir.path());
    cfg.max_iters = Some(iterations);
    assert_eq!(run(&cfg).unwrap().iterations, iterations);
    dir
}

/// A resume that finds no replay buffer is refused with an error that names the missing file,
/// before anything is written, rather than continuing with fresh chains without a word.
#[test]
fn resuming_without_the_replay_buffer_is_refused() {
    let dir = stopped_after(3);
    let progress: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("state/progress.json")).unwrap(),
    )
    .unwrap();
    let name = format!("objective-{}.bin", progress["generation"]);
    let buffer = dir.path().join("state").join(&name);
    std::fs::remove_file(&buffer).unwrap();
    let log_before = file(dir.path(), "log.csv");

    let err = format!("{:#}", run(&small_jem(dir.path())).unwrap_err());
    assert!(
        err.contains(&name) && err.contains("missing"),
        "error does not name the missing file: {err}"
    );
    assert_eq!(
        file(dir.path(), "log.csv"),
        log_before,
        "the refused resume wrote to the log"
    );
}

/// The weights of the two terms may change when a run resumes (the balance between classifier
/// and density is what a long run may need to shift); the change is recorded and the loss
/// logged from then on is the new weighted sum. Any other JEM setting is still refused.
#[test]
fn a_resumed_run_may_reweigh_its_two_terms() {
    let dir = stopped_after(3);

    let mut longer_chains = small_jem(dir.path());
    longer_chains.jem.sgld_steps += 1;
    let err = run(&longer_chains).unwrap_err().to_string();
    assert!(err.contains("other settings"), "{err}");

    let mut reweighed = small_jem(dir.path());
    reweighed.jem.pyx_weight = 2.0;
    reweighed.jem.px_weight = 0.5;
    assert_eq!(run(&reweighed).unwrap().iterations, 8);
    let changes = std::fs::read_to_string(dir.path().join("changes.csv")).unwrap();
    let lines: Vec<&str> = changes.lines().collect();
    assert_eq!(
        lines,
        [
            "iteration,setting,before,after",
            "3,jem.px_weight,1.0,0.5",
            "3,jem.pyx_weight,1.0,2.0"
        ],
        "{changes}"
    );
    // log_every is 1, so each row is one step's loss: weight · CE + weight · p(x) term, to the
    // log's five decimals.
    let log = rows(dir.path(), "log.csv");
    let col = |name: &str| log[0].iter().position(|h| h == name).unwrap();
    let (loss, ce, gen) = (col("loss"), col("cross_entropy"), col("gen_loss"));
    let value = |row: &[String], c: usize| row[c].parse::<f64>().unwrap();
    for (i, row) in log[1..].iter().enumerate() {
        let (wy, wx) = if i < 3 { (1.0, 1.0) } else { (2.0, 0.5) };
        let sum = wy * value(row, ce) + wx * value(row, gen);
        assert!(
            (value(row, loss) - sum).abs() < 3e-5,
            "iteration {}: loss {} against {sum}",
            i + 1,
            value(row, loss)
        );
    }
}

/// Deliberately unstable: a sound first epoch, then the learning rate jumps ×1000 to 1.0
/// (a "decay" of 1000), which throws the energies of data and samples apart within a step or
/// two; the gap threshold (10, against gaps below 0.2 in the sound epoch) is low enough to see
/// it at once — and to see a slower drift at a lowered rate before the epoch ends, since the
/// guard does not roll back across an epoch's end.
fn unstable(out: &Path) -> TrainSpec {
    let mut cfg = small_jem(out);
    cfg.epochs = 3;
    cfg.decay_epochs = vec![1];
    cfg.decay_rate = 1000.0;
    cfg.guard.guard_max_energy_gap = 10.0;
    cfg.guard.guard_lr_factor = 0.1;
    cfg.guard.guard_max_rollbacks = 6;
    cfg
}

#[test]
fn divergence_guard_rolls_back_lowers_the_rate_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = unstable(dir.path());
    let done = run(&cfg);
    if std::env::var("JEM_TEST_DEBUG").is_ok() {
        for f in ["log.csv", "rollbacks.csv", "epochs.csv"] {
            eprintln!(
                "{f}:\n{}",
                std::fs::read_to_string(dir.path().join(f)).unwrap_or_default()
            );
        }
    }
    assert!(done.unwrap().finished, "the run recovered and finished");
    let back = rows(dir.path(), "rollbacks.csv");
    assert!(
        back.len() >= 2,
        "at least one rollback was logged: {back:?}"
    );
    // Each rollback lowers the rate by the factor and returns to a saved iteration.
    for (k, r) in back[1..].iter().enumerate() {
        let scale: f64 = r[2].parse().unwrap();
        assert!(
            (scale / 0.1f64.powi(k as i32 + 1) - 1.0).abs() < 1e-9,
            "{r:?}"
        );
        let (seen, to): (usize, usize) = (r[0].parse().unwrap(), r[1].parse().unwrap());
        let saved = to % cfg.checkpoint_every == 0 || to % 4 == 0; // 4 iterations per epoch
        assert!(to < seen && saved, "{r:?}");
    }
    // The log runs 1..=8 once each, and its learning rate after the last rollback is lowered.
    let log = rows(dir.path(), "log.csv");
    let iters: Vec<usize> = log[1..].iter().map(|r| r[0].parse().unwrap()).collect();
    assert_eq!(iters, (1..=12).collect::<Vec<_>>());
    let lr_col = log[0].iter().position(|c| c == "lr").unwrap();
    let last: f64 = log.last().unwrap()[lr_col].parse().unwrap();
    assert!(last < 0.5 * cfg.lr * cfg.decay_rate, "lr {last}");
    assert!(log[1..]
        .iter()
        .all(|r| r.iter().all(|v| !v.contains("NaN") && !v.contains("inf"))));
}

#[test]
fn divergence_guard_gives_up_after_its_rollbacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = unstable(dir.path());
    cfg.guard.guard_max_rollbacks = 0;
    let err = format!("{:#}", run(&cfg).unwrap_err());
    assert!(
        err.contains("giving up") && err.contains("diverged"),
        "{err}"
    );
}

/// The energy penalty λ·(mean E(x)² + mean E(x̂)²): with everything else equal (same weights,
/// same chains, same seed), switching it on adds exactly λ·mean E(x)² over the data, which a
/// forward pass gives, plus λ·mean E(x̂)² over the samples, which is at least λ·(mean E(x̂))².
#[test]
fn energy_penalty_adds_the_squared_energies() {
    use jem_bench::model::WideResNetConfig;

    let arch = WideResNetConfig::new(10, 1, 1, 10);
    let model = arch.init_seeded::<Train>(3, &backend::device()).unwrap();
    let n = 8;
    let (x, _) = common::first_training_digits(n);
    let lambda = 0.5;
    let stats = |energy_reg: f64| {
        let mut cfg = small_jem(Path::new("unused")).jem;
        cfg.energy_reg = energy_reg;
        one_jem_step(cfg, &arch, &model, n)
    };
    let (plain, penalised) = (stats(0.0), stats(lambda));
    // Same chains: the sample energies agree.
    assert_eq!(plain.extra[2], penalised.extra[2]);
    let lse: Vec<f32> = jem_attacks::log_sum_exp(model.forward(x))
        .into_data()
        .to_vec()
        .unwrap();
    let data_term = lse.iter().map(|e| (*e as f64).powi(2)).sum::<f64>() / n as f64;
    let sample_term = (penalised.loss - plain.loss) / lambda - data_term;
    let mean_sample_energy = penalised.extra[2];
    assert!(
        sample_term >= mean_sample_energy.powi(2) * (1.0 - 1e-4) - 1e-4,
        "sample part of the penalty {sample_term} < (mean E(x̂))² = {}",
        mean_sample_energy.powi(2)
    );
    assert!(data_term > 0.0 && sample_term.is_finite());
}

/// The logged chain shift is the RMS pixel change of the step's chains: with the gradient
/// switched off (α = 0) and no clamp, η steps of noise σ move a pixel by σ·s·√η (s = 0.5 pixels
/// per network unit); with the gradient on, the chains of a WRN move further.
#[test]
fn chain_shift_measures_how_far_the_chains_moved() {
    use jem_bench::model::WideResNetConfig;

    let arch = WideResNetConfig::new(10, 1, 1, 10);
    let model = arch.init_seeded::<Train>(3, &backend::device()).unwrap();
    let shift = |step_size: f32, noise: f32| {
        let mut cfg = small_jem(Path::new("unused")).jem;
        (cfg.sgld_lr, cfg.sgld_std, cfg.sgld_clamp, cfg.sgld_steps) = (step_size, noise, false, 10);
        *one_jem_step(cfg, &arch, &model, 32).extra.last().unwrap()
    };
    let expected = 0.05 * 0.5 * 10f64.sqrt();
    let noise_only = shift(0.0, 0.05);
    assert!(
        (noise_only / expected - 1.0).abs() < 0.02,
        "noise alone moved the chains by {noise_only}, expected {expected}"
    );
    assert_eq!(shift(0.0, 0.0), 0.0);
    let drift_only = shift(1.0, 0.0);
    assert!(drift_only > 0.0, "the gradient did not move the chains");
}

/// The loss statistics of one JEM step on the first `n` digits, chains fresh from the buffer.
fn one_jem_step(
    cfg: jem_bench::train::JemConfig,
    arch: &jem_bench::model::WideResNetConfig,
    model: &jem_bench::model::WideResNet<Train>,
    n: usize,
) -> jem_bench::train::StepStats {
    use jem_bench::train::{Objective, Step};

    let (x, y) = common::first_training_digits(n);
    let mut jem = JemObjective::new(cfg, 1e4);
    let train = jem_datasets::embedded::mnist(jem_datasets::Split::Train).unwrap();
    Objective::<Train>::prepare(&mut jem, arch, &train, 5).unwrap();
    let step = Step {
        iteration: 0,
        seed: 9,
    };
    Objective::<Train>::loss(&mut jem, model, x, y, step).1
}

/// Sharded SGLD (the chains of a step split across threads) gives the chains of the one-thread
/// run on a WRN, to rounding (a shard's batch size moves the last bit of a few pixels): the
/// same noise reaches every chain, and a chain does not depend on the others.
#[test]
fn sharded_sgld_matches_one_thread() {
    use burn::module::Module;
    use burn::tensor::{Tensor, TensorData};
    use jem_attacks::SgldTarget;
    use jem_bench::model::WideResNetConfig;
    use jem_bench::train::{chain_init, JemConfig};
    use rand::SeedableRng;

    let device = backend::device();
    let arch = WideResNetConfig::new(10, 1, 1, 10);
    let model = arch.init_seeded::<Train>(4, &device).unwrap().no_grad();
    let config = JemConfig {
        sgld_steps: 4,
        ..JemConfig::default()
    };
    let sampler = config.sampler(&arch.input_normalization);
    let init = chain_init(&arch.input_normalization);
    let n = 7;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let x0: Vec<f32> = (0..n)
        .flat_map(|_| init.image([1, 28, 28], &mut rng))
        .collect();
    let x0 = || {
        Tensor::<<Train as burn::tensor::backend::AutodiffBackend>::InnerBackend, 4>::from_data(
            TensorData::new(x0.clone(), [n, 1, 28, 28]),
            &device,
        )
    };
    let chains = |threads: usize| -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        sampler
            .run_sharded::<Train, _>(&model, x0(), &SgldTarget::Marginal, &mut rng, threads)
            .into_data()
            .to_vec()
            .unwrap()
    };
    let one = chains(1);
    let start: Vec<f32> = x0().into_data().to_vec().unwrap();
    assert!(
        one.iter().zip(&start).any(|(a, b)| a != b),
        "the chains moved"
    );
    for threads in [2, 3] {
        let worst = chains(threads)
            .iter()
            .zip(&one)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{threads} threads: max |Δ| = {worst}");
    }
}

/// A run that leaves the SGLD shard count to the machine (`sgld_threads` 0) gets the count its
/// backend asks for (one on a GPU, where shards only multiply kernel launches; one per core on
/// the CPU); a count the run names wins.
#[test]
fn an_unset_shard_count_is_the_backends_default() {
    use jem_bench::backend::BenchBackend;
    use jem_bench::train::JemConfig;

    let jem = |threads: usize| {
        JemObjective::new(
            JemConfig {
                sgld_threads: threads,
                ..JemConfig::default()
            },
            1e4,
        )
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(jem(0).sgld_shards(), cores);
    let backends = if cfg!(feature = "cuda") { 1 } else { cores };
    assert_eq!(
        Train::default_sgld_shards(),
        backends,
        "one per core on the CPU, one on CUDA"
    );
    assert_eq!(jem(0).with_default_shards(1).sgld_shards(), 1);
    assert_eq!(jem(0).with_default_shards(0).sgld_shards(), 1);
    assert_eq!(jem(3).with_default_shards(1).sgld_shards(), 3);
}

/// `sample --from-class-gaussian --steps 0` starts row k from class k's Gaussian: the baseline
/// classifier reads most starts as their row's class, where uniform noise reads as one class
/// for every row.
#[test]
fn class_gaussian_starts_are_read_as_their_class() {
    use jem_bench::sample::{run, SampleSpec};

    let dir = tempfile::tempdir().unwrap();
    let args = |gaussian: bool, name: &str| SampleSpec {
        model: Path::new(env!("CARGO_MANIFEST_DIR")).join("results/models/baseline"),
        class: vec![],
        per_class: 6,
        steps: 0,
        sgld_lr: None,
        sgld_std: None,
        from_buffer: None,
        from_class_gaussian: gaussian,
        seed: 3,
        out: dir.path().join(name),
        judge: "none".into(),
        judge_threshold: 0.9,
        reference_images: 10_000,
    };
    let read_as_class = |name: &str| -> (f64, String) {
        let json = std::fs::read_to_string(dir.path().join(name).with_extension("json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let rows = v["classes"].as_array().unwrap();
        assert_eq!(rows.len(), 10);
        let mean = rows
            .iter()
            .map(|r| r["classified_as_class"].as_f64().unwrap())
            .sum::<f64>()
            / 10.0;
        (mean, v["start"].as_str().unwrap().to_string())
    };
    run::<Train>(args(true, "gaussian.png"), &backend::device()).unwrap();
    run::<Train>(args(false, "uniform.png"), &backend::device()).unwrap();
    let (gaussian, start) = read_as_class("gaussian.png");
    let (uniform, _) = read_as_class("uniform.png");
    assert!(
        start.contains("Gaussian per class") && start.contains("mnist/train"),
        "{start}"
    );
    assert!(
        gaussian > 0.7,
        "class-Gaussian starts read as their class {gaussian}"
    );
    assert!(
        uniform < 0.3,
        "uniform starts read as their row's class {uniform}"
    );
    // One row per class, one column per sample, 28×28 cells 2 pixels apart.
    let png = std::fs::File::open(dir.path().join("gaussian.png")).unwrap();
    let reader = png::Decoder::new(std::io::BufReader::new(png))
        .read_info()
        .unwrap();
    let info = reader.info();
    assert_eq!((info.width, info.height), (6 * 30 + 2, 10 * 30 + 2));
}
