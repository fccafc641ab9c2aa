//! What a sweep will compute, checked before anything is written: its subjects (models with
//! their data), ε grid and cells ([`Plan`]); the settings and identity recorded in its folder,
//! and the claim on that folder that refuses another sweep's.

use crate::Choice;
use std::path::PathBuf;

use anyhow::Context;
use burn::module::Module;
use jem_attacks::{Classifier, Norm};

use super::cells::{self, Cell};
use super::outputs;
use super::own_attack::{check_names, gradient_use, OwnAttack};
use super::rows::CellResult;
use super::spec::{Checkpoints, SweepSpec};
use super::subject::Subject;
use crate::backend::BenchBackend;
use crate::model::{write_atomic, LoadedNetwork, SOFTWARE};
use crate::output_folder::FolderLock;
use crate::settings::{refusal, InvalidSetting};

/// What the sweep's settings need of one model, checked before anything is written: enough
/// test images, ε within reach under L2, enough classes for the DLR losses, SGLD settings for
/// K > 0.
pub(super) fn check_subject<B: BenchBackend, N: Module<B>>(
    spec: &SweepSpec,
    subject: &Subject<B, N>,
) -> anyhow::Result<()> {
    let (data, data_name, name) = (subject.test_set(), subject.data_name(), subject.name());
    if spec.examples.count() > data.len() {
        return Err(InvalidSetting::new(
            "n_examples",
            spec.examples.count().to_string(),
            &format!(
                "the test split of {data_name} has only {} images",
                data.len()
            ),
        )
        .into());
    }
    if spec.threat.norm == Norm::L2 {
        let largest = (data.image_len() as f32).sqrt();
        for &e in &spec.threat.eps_grid() {
            if e > largest {
                return Err(InvalidSetting::bare(
                    "eps",
                    &format!(
                        "{e} exceeds {largest:.2}, the largest L2 distance between [0, 1] \
                         images of {data_name}"
                    ),
                )
                .into());
            }
        }
    }
    let classes = data.num_classes();
    for attack in spec.single_attacks() {
        let needs = attack.entry().min_classes;
        if classes < needs {
            return Err(InvalidSetting::new(
                "attacks",
                attack.name().to_string(),
                &format!("its loss needs at least {needs} classes; {name} has {classes}"),
            )
            .into());
        }
    }
    if spec.ks.iter().any(|&k| k > 0) {
        // The defence holds every chain of every example of a batch at once (the network's
        // activations of each come on top): what cannot hold even the images is refused here,
        // not by an aborted allocation.
        let chains = spec.defence.chains.max(spec.defence.recheck_chains) as u128;
        let batch = spec.examples.largest_batch() as u128;
        let bytes = chains * batch * data.image_len() as u128 * 4;
        crate::settings::fits_in_memory(
            "chains",
            spec.defence.chains,
            bytes,
            &format!("{chains} chains × {batch} images of {data_name}, for the images alone,"),
            "lower --chains, --recheck-chains or --batch-size",
        )?;
    }
    if spec.ks.iter().any(|&k| k > 0) && subject.sgld().is_none() {
        return Err(InvalidSetting::bare(
            "ks",
            &format!("{name} has no SGLD settings for the defence at K > 0"),
        )
        .into());
    }
    Ok(())
}

/// What a sweep will do, derived from its arguments.
pub(super) struct Plan<B: BenchBackend, N: Classifier<B> + 'static> {
    pub(super) out: PathBuf,
    pub(super) subjects: Vec<Subject<B, N>>,
    pub(super) eps_grid: Vec<f32>,
    /// Every cell of the whole sweep, in order.
    pub(super) cells: Vec<Cell>,
    /// Attacks of the caller's own, run after the spec's.
    pub(super) own: Vec<OwnAttack<B, N>>,
    /// The checkpoints the subjects were loaded from (none for a library sweep of its own
    /// subjects), as the folder records them.
    pub(super) checkpoints: Checkpoints,
}

impl<B: BenchBackend> Plan<B, LoadedNetwork<B>> {
    /// The command line's sweep: `--models` (or the embedded ones) on `--data` (or each
    /// model's own data set), loaded onto `device` and checked before anything touches the
    /// disk.
    pub(super) fn from_args(
        spec: &SweepSpec,
        checkpoints: &Checkpoints,
        out: &std::path::Path,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        spec.validate()?;
        let paths = checkpoints.paths();
        if paths.is_empty() {
            return Err(InvalidSetting::bare("models", "name at least one checkpoint").into());
        }
        let subjects = paths
            .iter()
            .map(|p| {
                let m = p.display().to_string();
                // A field of the spec names what failed (the command line shows its flag).
                // (A refused data set names `data` itself.)
                Subject::from_checkpoint(&m, checkpoints.data.as_deref(), device).map_err(|e| {
                    match e.downcast::<InvalidSetting>() {
                        Ok(refused) => refused.into(),
                        Err(e) => refusal("models", &m, e).into(),
                    }
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let plan = Plan::new(spec, subjects, Vec::new(), out)?;
        Ok(Plan {
            checkpoints: checkpoints.clone(),
            ..plan
        })
    }
}

impl<B: BenchBackend, N: Classifier<B> + Module<B> + 'static> Plan<B, N> {
    /// Everything a sweep in `out` needs, checked before anything touches the disk: the
    /// settings, and per model its data and the settings its cells need.
    pub(super) fn new(
        spec: &SweepSpec,
        subjects: Vec<Subject<B, N>>,
        own: Vec<OwnAttack<B, N>>,
        out: &std::path::Path,
    ) -> anyhow::Result<Self> {
        spec.validate()?;
        check_names(&own)?;
        anyhow::ensure!(!subjects.is_empty(), "a sweep needs at least one model");
        let mut names = std::collections::BTreeSet::new();
        for subject in &subjects {
            anyhow::ensure!(
                names.insert(subject.name()),
                "two models are named {}: every model of a sweep needs its own name",
                subject.name()
            );
            check_subject(spec, subject)?;
        }
        let models: Vec<String> = subjects.iter().map(|s| s.name().to_string()).collect();
        let eps_grid = spec.threat.eps_grid();
        let cells = cells::list(
            &models,
            &spec.attack_list(),
            &gradient_use(&own),
            &spec.ks,
            &spec.grad,
        );
        Ok(Self {
            out: out.to_path_buf(),
            subjects,
            eps_grid,
            cells,
            own,
            checkpoints: Checkpoints::default(),
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
    pub(super) fn settings(&self, spec: &SweepSpec) -> serde_json::Value {
        // Recorded by version (super::record), not as the spec's own shape.
        let args = super::record::args(spec, &self.checkpoints);
        let mut settings = serde_json::json!({
            "format": super::record::SWEEP_FORMAT,
            "software": SOFTWARE,
            "backend": B::recorded_name(self.subjects[0].device()),
            "args": args,
            // The EOT each K gets, `--eot` or its default, spelled out: a folder of a version
            // whose default differed must not resume.
            "eot_at_k": spec.ks.iter().map(|&k| (k, spec.eot_at(k))).collect::<Vec<_>>(),
            "eps": &self.eps_grid,
            "models": self.subjects.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "weights": self.subjects.iter().map(|s| s.digest()).collect::<Vec<_>>(),
            "subjects": self.subjects.iter().map(|s| s.configuration()).collect::<Vec<_>>(),
        });
        // Only where there are some, so that the settings (and identity) of every other sweep
        // stay as they were.
        if !self.own.is_empty() {
            let own: Vec<_> = self.own.iter().map(|o| o.record(spec)).collect();
            settings["own_attacks"] = serde_json::Value::Array(own);
        }
        settings
    }

    /// `sha256:<hex>` of [`Plan::settings`]: what every cell file of the sweep carries, so that
    /// a cell is reused only by the sweep that computed it (even with settings.json deleted).
    pub(super) fn identity(&self, spec: &SweepSpec) -> String {
        super::record::identity(&self.settings(spec))
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
    if let Some(saved) = super::record::read_settings(out)? {
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
    // Every file under cells/ is one of this sweep's cells' (a finished cell, or the kept parts
    // of one): anything else was written by another sweep or another version's naming, and
    // would otherwise lie there unnoticed while its cell is computed again.
    let ids: std::collections::BTreeSet<String> = cells.iter().map(|c| c.id()).collect();
    let cells_dir = out.join("cells");
    for entry in std::fs::read_dir(&cells_dir)
        .with_context(|| format!("cannot read {}", cells_dir.display()))?
    {
        let path = entry
            .with_context(|| format!("cannot read {}", cells_dir.display()))?
            .path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let stem = name.as_deref().and_then(|n| {
            n.strip_suffix(outputs::CELL_FILE_SUFFIX)
                .or_else(|| n.strip_suffix(".batches"))
        });
        // Atomic writes leave `NAME.tmp` files only while they run (or after a crash).
        let temporary = name.as_deref().is_some_and(|n| n.ends_with(".tmp"));
        // jem-bench wrote cell files uncompressed before: the same JSON, which gzip makes a
        // cell file of this version again.
        let uncompressed = name
            .as_deref()
            .and_then(|n| n.strip_suffix(".json"))
            .is_some_and(|s| ids.contains(s));
        anyhow::ensure!(
            !uncompressed,
            "{}: an uncompressed cell file of an earlier jem-bench; `gzip` it to reuse the \
             cell, or delete it to run the cell again",
            path.display()
        );
        anyhow::ensure!(
            temporary || stem.is_some_and(|s| ids.contains(s)),
            "{}: not a cell of this sweep (another sweep or jem-bench version wrote it); \
             delete it, or use another --out",
            path.display()
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
