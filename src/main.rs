//! The `jem-bench` command line: one subcommand per job (train, eval, import, and the
//! robustness harness as it is built).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use jem_bench::backend::{self, BenchBackend, Inference, Train};
use jem_bench::model::{
    import_pytorch, stored_normalization, to_f32, Checkpoint, PytorchNaming, Sidecar,
    TrainingRecord, WideResNetConfig,
};
use jem_bench::train::{
    self, AdversarialObjective, ClassifierObjective, JemObjective, TrainKind, TrainSpec,
};
use jem_bench::Choice;
use jem_datasets::DataSource;

mod cli;
use cli::choices::choices;

#[derive(Parser)]
#[command(
    name = "jem-bench",
    version,
    about = "Adversarial-robustness benchmarks for JEM and Wide-ResNet classifiers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Device to compute on: cpu (the default build), or cuda / cuda:N (a build with
    /// `--features cuda`; default its first GPU). Recorded in every output as the backend.
    #[arg(long, global = true)]
    device: Option<String>,
}

/// Every subcommand reads `-0.1` as a value (then refuses it with a message that says what is
/// allowed), not as an unknown flag.
#[derive(Subcommand)]
enum Command {
    /// Train a Wide-ResNet as a classifier (baseline), a JEM, or adversarially.
    #[command(allow_negative_numbers = true)]
    Train(cli::train::TrainFlags),
    /// Clean accuracy, NLL, Brier score and ECE (15 bins) of a model (a checkpoint or a graph
    /// imported from ONNX) on a test set.
    #[command(allow_negative_numbers = true)]
    Eval(cli::eval::EvalArgs),
    /// Calibration per model and K: accuracy, NLL, Brier score, ECE (15 bins), reliability
    /// diagram.
    #[command(allow_negative_numbers = true)]
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Turn a PyTorch checkpoint (.safetensors / .pt) into a jem-bench checkpoint.
    #[command(allow_negative_numbers = true)]
    Import(ImportArgs),
    /// Sweep models × attacks × ε × sampling steps K × gradient modes; CSV, summary, table.
    #[command(allow_negative_numbers = true)]
    Robust(cli::robust::RobustArgs),
    /// Nonsense-input (distal adversarial) search per model, K and class.
    #[command(allow_negative_numbers = true)]
    Nonsense(cli::nonsense::NonsenseArgs),
    /// Out-of-distribution detection per model, K and score (log p(x), max p(y|x), gradient
    /// norm): AUROC, AUPR, FPR at 95 % TPR against other data and noise; score histograms.
    #[command(allow_negative_numbers = true)]
    Ood(cli::ood::OodArgs),
    /// Compare a sweep against a stored reference; non-zero exit on regression.
    #[command(allow_negative_numbers = true)]
    Regress(cli::harness::RegressArgs),
    /// Draw class-conditional SGLD samples from a JEM (or any classifier's energy, an ONNX
    /// graph's included) into a PNG grid.
    #[command(allow_negative_numbers = true)]
    Sample(cli::sample::SampleArgs),
    /// Regenerate the summary, table and robustness curves (SVG, PNG) from sweeps' CSVs.
    #[command(allow_negative_numbers = true)]
    Report(cli::harness::ReportArgs),
    /// Plot training runs' validation accuracy, NLL and ECE against iterations (their
    /// epochs.csv) into SVG and PNG.
    Curves(cli::curves::CurvesArgs),
    /// Join finished sweep folders into one: the shards of a sweep (`robust --shard i/n`), or
    /// sweeps that differ only in their models (`--rename` for a checkpoint that moved) or in
    /// the backend that computed them.
    #[command(allow_negative_numbers = true)]
    Merge(cli::harness::MergeArgs),
    /// Time one hot operation (forward, train step, input gradient, SGLD step, JEM training
    /// iteration, PGD step through the SGLD defence) on a Wide-ResNet;
    /// benches/pytorch/compare.py runs it beside PyTorch.
    Bench(cli::bench::BenchArgs),
}

#[derive(clap::Args)]
struct ImportArgs {
    /// A network exported to ONNX (`torch.onnx.export`, any architecture the supported
    /// operators build: docs/import.md), or a PyTorch Wide-ResNet state_dict as .safetensors,
    /// or .pt / .pth written by torch.save.
    input: PathBuf,
    /// Output checkpoint NAME (writes NAME.safetensors and NAME.json; NAME.onnx and NAME.json
    /// for an ONNX file).
    #[arg(long)]
    out: PathBuf,
    /// Replace an existing checkpoint at --out (refused without it).
    #[arg(long)]
    overwrite: bool,
    #[arg(long, default_value = "wide-resnet", value_parser = choices::<PytorchNaming>())]
    naming: PytorchNaming,
    /// Key of the state_dict inside a .pt file (JEM checkpoints: model_state_dict).
    #[arg(long)]
    top_level_key: Option<String>,
    /// Wide-ResNet depth (a state_dict only).
    #[arg(long)]
    depth: Option<usize>,
    /// Wide-ResNet widening factor (a state_dict only).
    #[arg(long)]
    width: Option<usize>,
    #[arg(long, default_value_t = 3)]
    in_channels: usize,
    #[arg(long, default_value_t = 10)]
    num_classes: usize,
    /// Per-channel input mean the network expects after [0, 1] pixels (default: JEM's 0.5;
    /// 0 for --naming robustbench, whose models take [0, 1] pixels).
    #[arg(long, value_delimiter = ',')]
    mean: Option<Vec<f32>>,
    /// Per-channel input std (default: JEM's 0.5; 1 for --naming robustbench).
    #[arg(long, value_delimiter = ',')]
    std: Option<Vec<f32>>,
    /// Data set the model was trained on (mnist, fashion-mnist, cifar10:DIR, cifar100:DIR),
    /// recorded in the sidecar: the default data of every later command on this model.
    #[arg(long)]
    data: String,
}

/// Standard output closed early (`jem-bench … | head`) or full (`> /dev/full`): Rust's `println!`
/// panics on the failed write. Every command writes its result files before it prints, so a
/// closed pipe ends the program quietly (as `head` meant it to), and any other failure to write
/// to standard output is a one-line error with exit code 1, not a panic's 101.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(cause) = message.strip_prefix("failed printing to stdout: ") {
            if cause.contains("Broken pipe") {
                std::process::exit(0);
            }
            eprintln!("error: cannot write to standard output: {cause}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// Activation maps of 32 MiB or more on huge pages (see `jem_bench::memory`).
#[global_allocator]
static ALLOCATOR: jem_bench::memory::LargePages = jem_bench::memory::LargePages;

fn main() -> ExitCode {
    jem_bench::memory::keep_freed_memory();
    quiet_on_closed_stdout();
    let command = Cli::command();
    let matches = command.clone().get_matches();
    if let Err(e) = cli::lists::refuse_repeated_values(&command, &matches) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Flags the other settings leave unused are refused before anything runs.
    let unused = match &cli.command {
        Command::Train(flags) => flags.unused(),
        Command::Robust(args) => args.unused(),
        _ => Vec::new(),
    };
    if let Some((name, sub_matches)) = matches.subcommand() {
        let sub = command.find_subcommand(name).expect("a parsed subcommand");
        if let Err(e) = cli::unused::refuse_given(sub, sub_matches, &unused) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    // A bad JEM_BENCH_ISA or JEM_BENCH_GPU_CONV is an error before any work, before a device is
    // even opened, not a silent fallback.
    if let Err(e) = jem_kernels::isa_from_env() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = jem_bench::settings::rayon_threads_from_env() {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = backend::gpu_settings_from_env() {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    // A CUDA build selects its default GPU too, so that a missing one is an error, not a panic.
    let spec = cli
        .device
        .as_deref()
        .or(cfg!(feature = "cuda").then_some("cuda"));
    if let Some(spec) = spec {
        if let Err(e) = backend::select(spec) {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    // The one place that names the backend and device; everything below is generic over both.
    let device = backend::device();
    let result = match cli.command {
        Command::Train(flags) => run_train(flags.spec(), &device),
        Command::Eval(args) => args.run::<Train>(&device),
        Command::Calibrate(args) => args.run::<Train>(&device),
        Command::Import(args) => run_import(args),
        Command::Robust(args) => run_robust(args, &device),
        Command::Nonsense(args) => args.run::<Train>(&device),
        Command::Ood(args) => args.run::<Train>(&device),
        Command::Regress(args) => args.run::<Train>(&device),
        Command::Sample(args) => args.run::<Train>(&device),
        Command::Report(args) => args.run(),
        Command::Merge(args) => args.run::<Train>(&device),
        Command::Curves(args) => args.run(),
        Command::Bench(args) => args.run::<Train>(&device),
    };
    // The subcommand that ran, whose flags name the fields its errors refuse.
    let ran = matches
        .subcommand_name()
        .and_then(|name| command.find_subcommand(name));
    let shown = |e| match ran {
        Some(sub) => cli::with_flags(e, sub),
        None => e,
    };
    match result.map_err(shown) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_robust(args: cli::robust::RobustArgs, device: &backend::Device) -> anyhow::Result<()> {
    let (slurm, allow_long) = (args.slurm.spec(), args.allow_long);
    let cli::robust::RobustSettings {
        spec,
        checkpoints,
        out,
        shard,
        jobs,
    } = args.into_parts()?;
    if let Some(slurm) = slurm {
        // Each shard runs `robust` with these flags, --allow-long included: refused here at
        // once rather than by every shard in its log.
        if let (Some(mut beyond), false) = (spec.beyond_usual(), allow_long) {
            beyond.problem += "; pass --allow-long to submit a sweep this long";
            return Err(beyond.into());
        }
        return submit_to_slurm(&slurm, &spec, &checkpoints, &out, device);
    }
    let progress = jem_bench::harness::TerminalProgress::default();
    let runner = jem_bench::harness::Runner {
        out,
        shard,
        jobs,
        observer: &progress,
        allow_long,
    };
    jem_bench::harness::run::<Train>(&spec, &checkpoints, &runner, device).map(|_| ())
}

/// `robust --slurm N`: the sweep checked here (settings, models, data), its scripts written to
/// OUT/slurm/, then submitted; the job ids and the merged folder printed.
fn submit_to_slurm(
    slurm: &jem_bench::slurm::SlurmSpec,
    spec: &jem_bench::harness::SweepSpec,
    checkpoints: &jem_bench::harness::Checkpoints,
    out: &std::path::Path,
    device: &backend::Device,
) -> anyhow::Result<()> {
    jem_bench::harness::check::<Train>(spec, checkpoints, device)?;
    let absolute = |p: &std::path::Path| std::path::absolute(p);
    let program = std::env::current_exe().context("cannot locate the jem-bench binary")?;
    let workdir = std::env::current_dir().context("cannot read the working folder")?;
    let out = absolute(out).with_context(|| format!("cannot resolve {}", out.display()))?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sweep = cli::robust::sweep_arguments(&args);
    let scripts = slurm.write(&jem_bench::slurm::SweepCommand {
        program: &program,
        workdir: &workdir,
        sweep: &sweep,
        out: &out,
    })?;
    let jobs = jem_bench::slurm::submit(&scripts)?;
    println!(
        "submitted {} shards as job array {} ({}) and their merge as job {} ({}, after every \
         shard succeeded); the merged sweep will be in {} (logs in {})",
        slurm.shards,
        jobs.array,
        scripts.array.display(),
        jobs.merge,
        scripts.merge.display(),
        out.display(),
        out.join("slurm/logs").display()
    );
    Ok(())
}

/// `import MODEL.onnx`: the graph checked (operators, shapes) against `--data`, then copied
/// to OUT.onnx beside its sidecar OUT.json. The Wide-ResNet flags do not apply.
fn run_import_onnx(args: &ImportArgs) -> anyhow::Result<()> {
    let wrn_only = [
        ("--depth", args.depth.is_some()),
        ("--width", args.width.is_some()),
        ("--top-level-key", args.top_level_key.is_some()),
    ];
    for (flag, given) in wrn_only {
        anyhow::ensure!(
            !given,
            "{flag} describes a Wide-ResNet state_dict; an ONNX file carries its own graph"
        );
    }
    let mut existing = args.out.as_os_str().to_owned();
    existing.push(".onnx");
    let mut sidecar = args.out.as_os_str().to_owned();
    sidecar.push(".json");
    for path in [
        std::path::PathBuf::from(existing),
        std::path::PathBuf::from(sidecar),
    ] {
        anyhow::ensure!(
            args.overwrite || !path.exists(),
            "{} exists; pass --overwrite to replace it",
            path.display()
        );
    }
    let sidecar = jem_bench::model::import_onnx(
        &args.input,
        &args.data,
        args.mean.clone(),
        args.std.clone(),
        &args.out,
    )?;
    println!(
        "imported {} (opset {}, input {:?}, {} classes) as {}.onnx + {}.json",
        args.input.display(),
        sidecar.opset,
        sidecar.input_shape,
        sidecar.classes,
        args.out.display(),
        args.out.display()
    );
    Ok(())
}

fn run_train(cfg: TrainSpec, device: &backend::Device) -> anyhow::Result<()> {
    let outcome = match cfg.kind {
        TrainKind::Baseline => train::train::<Train, _>(&cfg, &mut ClassifierObjective, device)?,
        TrainKind::Jem => {
            let mut jem = JemObjective::new(cfg.jem.clone(), cfg.guard.guard_max_energy_gap)
                .with_default_shards(Train::default_sgld_shards());
            train::train::<Train, _>(&cfg, &mut jem, device)?
        }
        TrainKind::Adv => {
            let mut adv = AdversarialObjective::new(cfg.adv.clone());
            train::train::<Train, _>(&cfg, &mut adv, device)?
        }
    };
    println!(
        "{} after {} iterations, {:.0} s; best checkpoint {} (val accuracy {}{})",
        if outcome.finished {
            "finished"
        } else {
            "paused (run the same command to resume)"
        },
        outcome.iterations,
        outcome.wall_seconds,
        outcome.best.weights.display(),
        outcome
            .best_val_accuracy
            .map_or("-".into(), |a| format!("{:.4}", a)),
        outcome
            .best_val_robust_accuracy
            .map_or(String::new(), |a| format!(
                ", under the training attack {a:.4}"
            )),
    );
    if let Some(m) = outcome.test {
        println!(
            "test: accuracy {:.4}, nll {:.4}, ece {:.4} (n = {})",
            m.accuracy, m.nll, m.ece, m.n
        );
    }
    Ok(())
}

fn run_import(args: ImportArgs) -> anyhow::Result<()> {
    if args
        .input
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
    {
        return run_import_onnx(&args);
    }
    let device = backend::device();
    let required = |value: Option<usize>, flag: &str| {
        value.with_context(|| format!("{flag} is required to import a state_dict"))
    };
    let (depth, width, channels, classes) = (
        required(args.depth, "--depth")?,
        required(args.width, "--width")?,
        args.in_channels,
        args.num_classes,
    );
    let mut arch =
        WideResNetConfig::of_layout(args.naming.variant(), depth, width, channels, classes);
    if let Some(mean) = args.mean.clone() {
        arch.input_normalization.mean = mean;
    }
    if let Some(std) = args.std.clone() {
        arch.input_normalization.std = std;
    }
    if let Some(stored) = stored_normalization(&args.input)? {
        anyhow::ensure!(
            args.mean.is_none() && args.std.is_none() || arch.input_normalization == stored,
            "{} stores its input normalisation (mean {:?}, std {:?}), which --mean/--std \
             contradict; leave them out to use the stored one",
            args.input.display(),
            stored.mean,
            stored.std
        );
        println!(
            "input normalisation from the file's buffers: mean {:?}, std {:?}",
            stored.mean, stored.std
        );
        arch.input_normalization = stored;
    }
    let norm = &arch.input_normalization;
    anyhow::ensure!(
        norm.mean.len() == args.in_channels && norm.std.len() == args.in_channels,
        "the input normalisation has {} mean and {} std values; --in-channels is {}",
        norm.mean.len(),
        norm.std.len(),
        args.in_channels
    );
    let source = DataSource::parse_name(&args.data).context("--data")?;
    anyhow::ensure!(
        source.image_shape()[0] == args.in_channels
            && source.class_names().len() == args.num_classes,
        "--data {}: its images have {} channel(s) and {} classes; --in-channels is {} and \
         --num-classes {}",
        args.data,
        source.image_shape()[0],
        source.class_names().len(),
        args.in_channels,
        args.num_classes
    );
    let mut sidecar = Sidecar::new(
        arch.clone(),
        TrainingRecord {
            kind: "imported".into(),
            data: args.data.clone(),
            settings: serde_json::json!({ "source": args.input, "naming": args.naming.name() }),
            ..Default::default()
        },
    );
    // The same checks as every reader of the sidecar (std > 0 above all), before writing.
    let out = Checkpoint::at(&args.out);
    sidecar.validate(&out.sidecar)?;
    let model = import_pytorch::<Inference>(
        &args.input,
        &arch,
        args.naming,
        args.top_level_key.as_deref(),
        &device,
    )?;
    // Stored in f32 whatever the file's float type (f16, bf16, f64); the sidecar says which.
    let (model, found) = to_f32(model);
    found.ensure_finite(&args.input)?;
    sidecar.training.settings["source_dtype"] = found.source_dtypes.join(",").into();
    // Last, so that every problem with the input is reported first.
    for file in [&out.weights, &out.sidecar] {
        anyhow::ensure!(
            args.overwrite || !file.exists(),
            "--out: {} exists; pass --overwrite to replace that checkpoint, or choose another NAME",
            file.display()
        );
    }
    out.save(&model, &sidecar)
        .context("writing the imported checkpoint")?;
    println!(
        "wrote {} and {}",
        out.weights.display(),
        out.sidecar.display()
    );
    Ok(())
}
