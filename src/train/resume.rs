//! Resuming a training run: which settings a resumed run may change (and the record of what it
//! changed, `changes.csv`), and the divergence guard's roll-back to an earlier saved state
//! (`rollbacks.csv`).

use anyhow::Context;

use super::state::{Progress, StateDir};
use super::TrainSpec;

/// Settings a resumed run may change, named as `changes.csv` names them: more epochs, a new base
/// learning rate, a new σ_data (noise that can steady an energy model early and cost accuracy
/// late) and new weights of JEM's two terms (the balance between classifier and density) change
/// only its future; so do the guard's thresholds, and its folder may move. Learning-rate decays
/// may also be added at epochs it has not reached (checked apart, since they are a list).
const RESUMABLE: [&str; 7] = [
    "epochs",
    "out",
    "guard",
    "lr",
    "sigma_data",
    "jem.px_weight",
    "jem.pyx_weight",
];

/// Refuses to resume the run saved in `saved` with `settings` unless they differ only in the
/// [`RESUMABLE`] settings and in decays added at epochs the run has not started: otherwise the
/// resumed run would not be the run its log describes.
pub(super) fn check_resumable(
    cfg: &TrainSpec,
    saved: &Progress,
    settings: &serde_json::Value,
) -> anyhow::Result<()> {
    let started = saved.epoch + usize::from(saved.batch_in_epoch > 0);
    let comparable = |v: &serde_json::Value| {
        let mut v = v.clone();
        for path in RESUMABLE {
            remove_setting(&mut v, path);
        }
        if let Some(d) = v.get_mut("decay_epochs").and_then(|d| d.as_array_mut()) {
            d.retain(|e| e.as_u64().is_some_and(|e| (e as usize) < started));
        }
        v
    };
    anyhow::ensure!(
        comparable(&saved.settings) == comparable(settings) && cfg.epochs >= saved.epoch,
        "{} holds a run with other settings; resume with the same command (--epochs may \
         grow, --lr, --sigma-data, --px-weight and --pyx-weight may change, and \
         --decay-epochs may gain epochs from {started} on) or use another --out\n  \
         saved: {}\n  now:   {}",
        cfg.out.display(),
        saved.settings,
        settings
    );
    Ok(())
}

/// Removes the setting at a dotted path (`jem.px_weight`) from a settings object, if present.
fn remove_setting(settings: &mut serde_json::Value, path: &str) {
    match path.split_once('.') {
        Some((group, rest)) => {
            if let Some(g) = settings.get_mut(group) {
                remove_setting(g, rest);
            }
        }
        None => {
            if let Some(o) = settings.as_object_mut() {
                o.remove(path);
            }
        }
    }
}

/// The settings that differ between two settings objects, as (name, before, after); a group
/// of settings (`jem`, `guard`) is compared setting by setting and named `group.setting`.
fn changed_settings(
    prefix: &str,
    before: &serde_json::Map<String, serde_json::Value>,
    after: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let null = serde_json::Value::Null;
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut changed = Vec::new();
    for k in keys {
        let (b, a) = (
            before.get(k).unwrap_or(&null),
            after.get(k).unwrap_or(&null),
        );
        match (b.as_object(), a.as_object()) {
            (Some(b), Some(a)) => changed.extend(changed_settings(&format!("{prefix}{k}."), b, a)),
            _ if b != a => changed.push((format!("{prefix}{k}"), b.clone(), a.clone())),
            _ => {}
        }
    }
    changed
}

/// Appends one row per setting that a resumed run changed (`iteration,setting,before,after`,
/// values as JSON) to `out/changes.csv`, so that a run's history stays readable from its folder
/// when its sidecar shows only the latest settings. The output folder itself is not a change.
pub(super) fn record_changes(
    out: &std::path::Path,
    iteration: usize,
    before: &serde_json::Value,
    after: &serde_json::Value,
) -> anyhow::Result<()> {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
        return Ok(());
    };
    let changed: Vec<_> = changed_settings("", before, after)
        .into_iter()
        .filter(|(k, _, _)| k != "out")
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let path = out.join("changes.csv");
    let mut table = csv::Writer::from_writer(Vec::new());
    if !path.exists() {
        table.write_record(["iteration", "setting", "before", "after"])?;
    }
    for (k, b, a) in changed {
        table.write_record([&iteration.to_string(), &k, &b.to_string(), &a.to_string()])?;
    }
    let text = table.into_inner().context("cannot format changes.csv")?;
    append(&path, &text)
}

/// The saved state to return to after divergence was seen at `now`, with the learning rate
/// lowered; the rollback is appended to `rollbacks.csv`. Fails once the rollbacks are spent.
pub(super) fn roll_back(
    cfg: &TrainSpec,
    state: &StateDir,
    now: &Progress,
    symptom: &str,
) -> anyhow::Result<Progress> {
    let guard = &cfg.guard;
    anyhow::ensure!(
        now.rollbacks < guard.guard_max_rollbacks,
        "training diverged at iteration {} ({symptom}) after {} rollbacks, each lowering the \
         learning rate × {}; giving up. The last good state is in {}: resume it with a lower --lr, \
         a smaller --sgld-lr or more --guard-max-rollbacks",
        now.global_iter + 1,
        now.rollbacks,
        guard.guard_lr_factor,
        cfg.out.join("state").display()
    );
    // The generation before the latest: the latest save may already hold the first diverging
    // steps, since a symptom shows only in the step after them. Stay within the epoch, so that
    // no finished epoch (its validation, its best checkpoint) is undone.
    let latest = state
        .load_progress()?
        .context("the divergence guard found no saved state to roll back to")?;
    let mut back = match state.previous(&latest)? {
        Some(p) if p.epoch == now.epoch => p,
        _ => latest,
    };
    back.lr_scale = now.lr_scale * guard.guard_lr_factor;
    back.rollbacks = now.rollbacks + 1;
    back.wall_seconds = now.wall_seconds;
    back.settings = now.settings.clone();
    let path = cfg.out.join("rollbacks.csv");
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    use std::io::Write;
    if fresh {
        writeln!(
            f,
            "detected_at_iteration,rolled_back_to_iteration,lr_scale,symptom"
        )?;
    }
    writeln!(
        f,
        "{},{},{:e},\"{}\"",
        now.global_iter + 1,
        back.global_iter,
        back.lr_scale,
        symptom.replace('"', "'")
    )?;
    Ok(back)
}

/// Appends `iteration,backend` to `out/backends.csv` each time a run starts or resumes, so that
/// a run continued on another device (`scripts/gpu-train.sh`) says from which iteration each
/// computed it.
pub(super) fn record_backend(out: &std::path::Path, iteration: usize) -> anyhow::Result<()> {
    let path = out.join("backends.csv");
    let mut text = String::new();
    if !path.exists() {
        text.push_str("iteration,backend\n");
    }
    text.push_str(&format!("{iteration},{}\n", crate::backend::name()));
    append(&path, text.as_bytes())
}

/// Appends `bytes` to the file at `path`, creating it if need be.
fn append(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .with_context(|| format!("cannot append to {}", path.display()))
}
