//! What a sweep will compute, checked before anything is written: its subjects (models with
//! their data), ε grid and cells ([`Plan`]); the settings and identity recorded in its folder,
//! and the claim on that folder that refuses another sweep's.

use std::path::PathBuf;

use anyhow::Context;
use burn::module::Module;
use jem_attacks::{Classifier, Norm};

use super::cells::{self, AttackKind, Cell};
use super::outputs::{self, CellResult};
use super::robust_args::RobustArgs;
use super::subject::Subject;
use crate::backend::BenchBackend;
use crate::model::{write_atomic, WideResNet, SOFTWARE};
use crate::output_folder::FolderLock;

/// What the sweep's flags need of one model, checked before anything is written: enough test
/// images, ε within reach under L2, enough classes for the DLR losses, SGLD settings for K > 0.
pub(super) fn check_subject<B: BenchBackend, N: Module<B>>(
    args: &RobustArgs,
    subject: &Subject<B, N>,
) -> anyhow::Result<()> {
    let (data, spec, name) = (subject.test_set(), subject.data_name(), subject.name());
    anyhow::ensure!(
        args.n_examples <= data.len(),
        "--n-examples {}: the test split of {spec} has only {} images",
        args.n_examples,
        data.len()
    );
    if args.norm == Norm::L2 {
        let largest = (data.image_len() as f32).sqrt();
        for &e in &args.eps_grid() {
            anyhow::ensure!(
                e <= largest,
                "--eps: {e} exceeds {largest:.2}, the largest L2 distance between [0, 1] images \
                 of {spec}"
            );
        }
    }
    let classes = data.num_classes();
    for (attack, needs) in [(AttackKind::ApgdDlr, 3), (AttackKind::ApgdT, 4)] {
        anyhow::ensure!(
            !args.single_attacks().contains(&attack) || classes >= needs,
            "--attacks {}: its loss needs at least {needs} classes; {name} has {classes}",
            attack.name()
        );
    }
    anyhow::ensure!(
        args.ks.iter().all(|&k| k == 0) || subject.sgld().is_some(),
        "--steps: {name} has no SGLD settings for the defence at K > 0"
    );
    Ok(())
}

/// What a sweep will do, derived from its arguments.
pub(super) struct Plan<B: BenchBackend, N> {
    pub(super) out: PathBuf,
    pub(super) subjects: Vec<Subject<B, N>>,
    pub(super) eps_grid: Vec<f32>,
    /// Every cell of the whole sweep, in order.
    pub(super) cells: Vec<Cell>,
}

impl<B: BenchBackend> Plan<B, WideResNet<B>> {
    /// The command line's sweep: `--models` (or the embedded ones) on `--data` (or each
    /// model's own data set), loaded onto `device` and checked before anything touches the
    /// disk.
    pub(super) fn from_args(args: &RobustArgs, device: &B::Device) -> anyhow::Result<Self> {
        args.validate()?;
        let paths = args.model_paths();
        anyhow::ensure!(!paths.is_empty(), "--models: name at least one checkpoint");
        let subjects = paths
            .iter()
            .map(|p| {
                let m = p.display().to_string();
                Subject::from_checkpoint(&m, args.data.as_deref(), device)
                    .with_context(|| format!("--models {m}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Plan::new(args, subjects)
    }
}

impl<B: BenchBackend, N: Classifier<B> + Module<B>> Plan<B, N> {
    /// Everything a sweep needs, checked before anything touches the disk: the flags, and
    /// per model its data and the settings its cells need.
    pub(super) fn new(args: &RobustArgs, subjects: Vec<Subject<B, N>>) -> anyhow::Result<Self> {
        args.validate()?;
        anyhow::ensure!(!subjects.is_empty(), "a sweep needs at least one model");
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("runs/robust-{}", args.norm)));
        let mut names = std::collections::BTreeSet::new();
        for subject in &subjects {
            anyhow::ensure!(
                names.insert(subject.name()),
                "two models are named {}: every model of a sweep needs its own name",
                subject.name()
            );
            check_subject(args, subject)?;
        }
        let models: Vec<String> = subjects.iter().map(|s| s.name().to_string()).collect();
        let eps_grid = args.eps_grid();
        let cells = cells::list(&models, &args.attack_list(), &args.ks, &args.grad);
        Ok(Self {
            out,
            subjects,
            eps_grid,
            cells,
        })
    }

    /// The model a cell attacks.
    pub(super) fn subject(&self, cell: &Cell) -> &Subject<B, N> {
        self.subjects
            .iter()
            .find(|s| s.name() == cell.model)
            .expect("cells are listed from the subjects")
    }

    /// The settings that identify the sweep (the shard and output folder aside), recorded in
    /// `settings.json`: a resume or a merge must find the same, the models' weights included
    /// (a checkpoint retrained under the same path must not resume an old sweep).
    pub(super) fn settings(&self, args: &RobustArgs) -> serde_json::Value {
        let mut a = args.clone();
        a.shard = None;
        a.out = None;
        serde_json::json!({
            "software": SOFTWARE,
            "backend": B::recorded_name(self.subjects[0].device()),
            "args": &a,
            // The EOT each K gets, `--eot` or its default, spelled out: a folder of a version
            // whose default differed must not resume.
            "eot_at_k": args.ks.iter().map(|&k| (k, args.eot_at(k))).collect::<Vec<_>>(),
            "eps": &self.eps_grid,
            "models": self.subjects.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "weights": self.subjects.iter().map(|s| s.digest()).collect::<Vec<_>>(),
            "subjects": self.subjects.iter().map(|s| s.configuration()).collect::<Vec<_>>(),
        })
    }

    /// `sha256:<hex>` of [`Plan::settings`]: what every cell file of the sweep carries, so that
    /// a cell is reused only by the sweep that computed it (even with settings.json deleted).
    pub(super) fn identity(&self, args: &RobustArgs) -> String {
        crate::digest::of(self.settings(args).to_string().as_bytes())
    }
}

/// Refuses a folder that holds a sweep with other settings, naming each setting that differs,
/// or cells of another sweep; records the settings in a new one, and returns the finished
/// `cells` (`None` for those still to run). Call with the folder's [`FolderLock`] held.
pub(super) fn claim_folder(
    out: &std::path::Path,
    settings: &serde_json::Value,
    identity: &str,
    cells: &[&Cell],
    _lock: &FolderLock,
) -> anyhow::Result<Vec<Option<CellResult>>> {
    std::fs::create_dir_all(out.join("cells"))
        .with_context(|| format!("cannot create {}", out.display()))?;
    let settings_path = out.join("settings.json");
    if settings_path.exists() {
        let text = std::fs::read_to_string(&settings_path)
            .with_context(|| format!("cannot read {}", settings_path.display()))?;
        let saved: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a sweep's settings", settings_path.display()))?;
        if saved["models"] == settings["models"] && saved["weights"] != settings["weights"] {
            anyhow::bail!(
                "{} holds a sweep of other weights under the same model paths (its settings.json \
                 records {}, the models now hold {}); delete the folder or use another --out",
                out.display(),
                saved["weights"],
                settings["weights"]
            );
        }
        let differences = settings_differences(&saved, settings);
        anyhow::ensure!(
            differences.is_empty(),
            "{} holds a sweep with other settings ({}); run that sweep's command to resume it, \
             or use another --out",
            out.display(),
            differences.join("; ")
        );
    }
    // The cells finished before: each must have been computed by this very sweep (its file
    // says so even where settings.json was deleted). Read before the settings are recorded,
    // so that a refused command records nothing.
    let done = cells
        .iter()
        .map(|cell| outputs::load_cell(out, cell, identity))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !settings_path.exists() {
        write_atomic(
            &settings_path,
            serde_json::to_string_pretty(settings)?.as_bytes(),
        )?;
    }
    Ok(done)
}

/// `field: the folder has A, this command B` for each leaf setting that differs.
pub(crate) fn settings_differences(
    saved: &serde_json::Value,
    now: &serde_json::Value,
) -> Vec<String> {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        use serde_json::Value::Object;
        match (a, b) {
            (Object(x), Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let null = serde_json::Value::Null;
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(
                        &p,
                        x.get(k).unwrap_or(&null),
                        y.get(k).unwrap_or(&null),
                        out,
                    );
                }
            }
            _ if a != b => out.push(format!("{path}: the folder has {a}, this command {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", saved, now, &mut out);
    out
}
