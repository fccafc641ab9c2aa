//! The parts of an unfinished cell kept on disk as they finish (its attack's batches, the
//! parts of its convergence check's re-attacks) under `cells/<id>.batches/`, so that a killed
//! sweep resumes at the first unfinished part; each part bound to its sweep, cell, kind, index
//! and content, and refused where any of them does not match.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::cells::Cell;
use crate::model::write_atomic;

/// Where the finished batches of an unfinished `cell` are kept: `cells/<id>.batches/`.
pub fn batches_dir(out: &Path, cell: &Cell) -> std::path::PathBuf {
    out.join("cells").join(format!("{}.batches", cell.id()))
}

/// Whose a kept part is: the sweep (its identity), the cell and the kind of part. Every kept
/// part file records them with its index and a digest of its content, and is refused where any
/// of them does not match where it was found (a part copied over another, another cell's or
/// sweep's parts copied in, an edited outcome).
#[derive(Debug, Clone, Copy)]
pub struct PartOwner<'a> {
    pub sweep: &'a str,
    pub cell: &'a Cell,
    pub kind: super::spec::PartKind,
}

/// A kept part as its file holds it.
#[derive(Serialize, Deserialize)]
struct KeptFile<T> {
    sweep: String,
    cell: Cell,
    kind: super::spec::PartKind,
    index: usize,
    /// `sha256:<hex>` of the part's JSON (as [`content_digest`] writes it).
    digest: String,
    /// The part's share of its cell's estimated cost, which a resumed sweep's estimate leaves
    /// out ([`kept_share`]); absent from parts kept before jem-bench recorded it, which that
    /// estimate counts as still to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    share: Option<f64>,
    part: T,
}

/// The digest a kept part's file records of its content: of its JSON text read back as a
/// `serde_json::Value` and written again (keys sorted, numbers as read), a form that anything
/// reading the file can recompute from the text it finds.
fn content_digest<T: Serialize>(part: &T) -> anyhow::Result<String> {
    let canonical: serde_json::Value = serde_json::from_str(&serde_json::to_string(part)?)?;
    Ok(crate::digest::of(canonical.to_string().as_bytes()))
}

/// Reads kept part `index` of `owner` from `path`: `Ok(None)` where there is no file; refused,
/// naming the file and what does not match, where it is not that part as it was written.
fn read_kept<T: Serialize + serde::de::DeserializeOwned>(
    path: &Path,
    owner: &PartOwner,
    index: usize,
) -> anyhow::Result<Option<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let delete = "delete the file to run the part again";
    let kept: KeptFile<T> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a part this jem-bench kept ({delete})",
            path.display()
        )
    })?;
    let mismatch = if kept.sweep != owner.sweep {
        Some(format!(
            "it was computed by another sweep (identity `{}`, this sweep's `{}`)",
            kept.sweep, owner.sweep
        ))
    } else if &kept.cell != owner.cell {
        Some(format!("it belongs to another cell ({})", kept.cell.id()))
    } else if kept.kind != owner.kind {
        Some(format!("it is a {}, not a {}", kept.kind, owner.kind))
    } else if kept.index != index {
        Some(format!("it is part {}, not part {index}", kept.index))
    } else if content_digest(&kept.part)? != kept.digest {
        Some("its content does not match the digest it was written with (edited?)".into())
    } else {
        None
    };
    match mismatch {
        Some(why) => anyhow::bail!("{}: {why} ({delete})", path.display()),
        None => Ok(Some(kept.part)),
    }
}

/// Computes the `count` parts of one kind of a cell in order, keeping each one in `dir` (as
/// `<j>.json`, recording its `owner` and index) the moment it is done and reading back,
/// instead of computing again, those an interrupted run of the same sweep left there (the
/// folder's settings, `--batch-size` and the seed among them, are checked before any cell
/// runs, so a kept part is what `compute` would return). The folder is removed by
/// [`remove_batches`] once the cell's own file is written. Every kept part is read and checked
/// (its owner, index and digest, then by `fits`: is it what part `j` holds, its number of
/// examples?) before anything is computed, so a file another layout left is refused at once
/// rather than after hours of the parts before it. `kept` is told of each part read back
/// (`None`), then of each part computed now, once it is on disk, with the seconds it took; its
/// error stops the cell there. Each file records its part's `share` of the cell's estimated
/// cost, for the estimate of a run that resumes the cell.
pub fn resumable_batches<T: Serialize + serde::de::DeserializeOwned>(
    dir: &Path,
    owner: PartOwner,
    count: usize,
    share: impl Fn(usize) -> f64,
    fits: impl Fn(usize, &T) -> Result<(), String>,
    mut compute: impl FnMut(usize) -> anyhow::Result<T>,
    mut kept: impl FnMut(usize, Option<f64>) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<T>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = |j: usize| dir.join(format!("{j}.json"));
    let mut found: Vec<Option<T>> = (0..count)
        .map(|j| {
            let p = file(j);
            let Some(part) = read_kept::<T>(&p, &owner, j)? else {
                return Ok(None);
            };
            fits(j, &part).map_err(|why| {
                anyhow::anyhow!(
                    "{}: not part {j} of this cell as this jem-bench cuts it: {why} (delete \
                     the file to run the part again)",
                    p.display()
                )
            })?;
            Ok(Some(part))
        })
        .collect::<anyhow::Result<_>>()?;
    for j in (0..count).filter(|&j| found[j].is_some()) {
        kept(j, None)?;
    }
    (0..count)
        .map(|j| {
            if let Some(part) = found[j].take() {
                return Ok(part);
            }
            let started = std::time::Instant::now();
            let part = compute(j)?;
            let seconds = started.elapsed().as_secs_f64();
            let record = KeptFile {
                sweep: owner.sweep.to_string(),
                cell: owner.cell.clone(),
                kind: owner.kind,
                index: j,
                digest: content_digest(&part)?,
                share: Some(share(j)),
                part,
            };
            write_atomic(&file(j), serde_json::to_string(&record)?.as_bytes())?;
            kept(j, Some(seconds))?;
            Ok(record.part)
        })
        .collect()
}

/// The share of `cell`'s estimated cost that an interrupted run of the sweep `sweep` kept in
/// the cell's batch folder under `out` (its attack's batches and its convergence check's
/// parts), as their files record it: what a run that resumes the cell will read back instead
/// of computing, and its estimate leaves out. Only counts: a file that cannot be read, belongs
/// elsewhere or records no share counts as still to run (the cell itself refuses a damaged
/// file, by name, when it reads its parts back).
pub fn kept_share(out: &Path, sweep: &str, cell: &Cell) -> f64 {
    let dir = batches_dir(out, cell);
    let mut share = 0.0;
    for folder in [dir.clone(), dir.join("convergence")] {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            // The record without its part: only whose it is and its share are needed.
            let Ok(kept) = serde_json::from_str::<KeptFile<serde::de::IgnoredAny>>(&text) else {
                continue;
            };
            if let (true, Some(s)) = (kept.sweep == sweep && &kept.cell == cell, kept.share) {
                if s.is_finite() && s > 0.0 {
                    share += s;
                }
            }
        }
    }
    share.min(1.0)
}

/// Removes the batch files of a cell whose own file is written (nothing if there are none).
pub fn remove_batches(out: &Path, cell: &Cell) -> anyhow::Result<()> {
    let dir = batches_dir(out, cell);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::cells::AttackKind;
    use super::*;

    /// Batch j's result: a value that depends on j only, as a batch of a sweep depends on its
    /// examples and seed only.
    fn batch(j: usize) -> Vec<f64> {
        vec![j as f64 * 1.5, (j as f64).sqrt()]
    }

    /// Every kept batch fits (the tests of a layout's check are below).
    fn any_batch(_: usize, _: &Vec<f64>) -> Result<(), String> {
        Ok(())
    }

    /// The cells the tests' parts belong to.
    static CELLS: std::sync::LazyLock<[Cell; 2]> = std::sync::LazyLock::new(|| {
        let cell = |model: &str| Cell {
            model: model.into(),
            attack: super::super::cells::CellAttack::Kind(AttackKind::Pgd),
            k: 0,
            grad: None,
        };
        [cell("a/b/m"), cell("a_b/m")]
    });

    /// The attack batches of the sweep `sweep`'s first test cell.
    fn owner(sweep: &str) -> PartOwner<'_> {
        PartOwner {
            sweep,
            cell: &CELLS[0],
            kind: super::super::spec::PartKind::AttackBatch,
        }
    }

    /// The `count` batches of `batch` in `kept`, told to no one.
    fn every_batch(kept: &Path, owner: PartOwner, count: usize) -> anyhow::Result<Vec<Vec<f64>>> {
        resumable_batches(
            kept,
            owner,
            count,
            |_| 0.25,
            any_batch,
            |j| Ok(batch(j)),
            |_, _| Ok(()),
        )
    }

    /// What a resumed run's estimate leaves out: the shares this sweep's cell's parts recorded,
    /// its attack's batches and its check's parts, and nothing of a file it cannot count.
    #[test]
    fn the_share_kept_is_what_the_cells_own_parts_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let kept = batches_dir(out, &CELLS[0]);
        assert_eq!(kept_share(out, "sweep", &CELLS[0]), 0.0);
        let fifths = |j: usize| 0.1 * (j + 1) as f64;
        let keep = |dir: &Path, owner, count, share: &dyn Fn(usize) -> f64| {
            resumable_batches(
                dir,
                owner,
                count,
                share,
                any_batch,
                |j| Ok(batch(j)),
                |_, _| Ok(()),
            )
            .unwrap()
        };
        keep(&kept, owner("sweep"), 3, &fifths);
        let check = PartOwner {
            kind: super::super::spec::PartKind::ConvergenceCheck,
            ..owner("sweep")
        };
        keep(&kept.join("convergence"), check, 1, &|_| 0.15);
        let share = |sweep, cell| kept_share(out, sweep, cell);
        assert!((share("sweep", &CELLS[0]) - 0.75).abs() < 1e-12);
        // Another sweep's; another cell's, its files copied into that cell's folder.
        assert_eq!(share("other", &CELLS[0]), 0.0);
        let elsewhere = batches_dir(out, &CELLS[1]);
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::copy(kept.join("2.json"), elsewhere.join("2.json")).unwrap();
        assert_eq!(share("sweep", &CELLS[1]), 0.0);
        // A damaged file, and one kept before shares were recorded: still to run.
        std::fs::write(kept.join("0.json"), "{").unwrap();
        let path = kept.join("1.json");
        let mut record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        record.as_object_mut().unwrap().remove("share").unwrap();
        std::fs::write(&path, record.to_string()).unwrap();
        assert!((share("sweep", &CELLS[0]) - 0.45).abs() < 1e-12);
    }

    #[test]
    fn a_kept_batch_of_another_layout_is_refused_before_anything_is_computed() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("cell.batches");
        every_batch(&kept, owner("sweep"), 2).unwrap();
        std::fs::remove_file(kept.join("0.json")).unwrap();
        // Batch 1 on disk holds two values; this layout's batch 1 holds three.
        let three = |j: usize, b: &Vec<f64>| {
            (b.len() == 3)
                .then_some(())
                .ok_or(format!("{} values, not 3 (batch {j})", b.len()))
        };
        let mut computed = Vec::new();
        let err = resumable_batches(
            &kept,
            owner("sweep"),
            2,
            |_| 0.25,
            three,
            |j| {
                computed.push(j);
                Ok(vec![0.0; 3])
            },
            |_, _| Ok(()),
        )
        .unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("1.json") && message.contains("2 values, not 3"),
            "{message}"
        );
        assert!(
            computed.is_empty(),
            "batch 0 was computed first: {computed:?}"
        );
        assert!(!kept.join("0.json").exists());
    }

    #[test]
    fn an_interrupted_cell_resumes_at_its_first_unfinished_batch() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("cell.batches");
        let whole: Vec<Vec<f64>> = (0..5).map(batch).collect();

        // The first run dies in batch 3: batches 0–2 are on disk.
        let (mut computed, mut on_disk, mut read_back) = (Vec::new(), Vec::new(), Vec::new());
        let died = resumable_batches(
            &kept,
            owner("sweep"),
            5,
            |_| 0.25,
            any_batch,
            |j| {
                computed.push(j);
                anyhow::ensure!(j < 3, "killed in batch {j}");
                Ok(batch(j))
            },
            |j, seconds: Option<f64>| {
                // Told only once the batch is kept.
                assert!(kept.join(format!("{j}.json")).exists() && seconds.is_some());
                on_disk.push(j);
                Ok(())
            },
        );
        assert!(died.is_err());
        assert_eq!(computed, [0, 1, 2, 3]);
        assert_eq!(on_disk, [0, 1, 2]);

        // The same command again computes only batches 3 and 4, and ends where a run that
        // was never interrupted ends.
        computed.clear();
        on_disk.clear();
        let resumed = resumable_batches(
            &kept,
            owner("sweep"),
            5,
            |_| 0.25,
            any_batch,
            |j| {
                computed.push(j);
                Ok(batch(j))
            },
            |j, seconds: Option<f64>| {
                match seconds {
                    Some(_) => on_disk.push(j),
                    None => read_back.push(j),
                }
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(computed, [3, 4]);
        assert_eq!(on_disk, [3, 4]);
        // The kept batches are told of first, as read back, before anything is computed.
        assert_eq!(read_back, [0, 1, 2]);
        assert_eq!(resumed, whole);
    }

    /// An error from the one told stops the cell after the batch it was told of, which is kept;
    /// another sweep's batches are never read as this one's; a damaged batch file is an error
    /// that names it, not a silent recomputation.
    #[test]
    fn a_stopped_cell_keeps_its_batch_and_foreign_or_damaged_batches_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("cell.batches");
        every_batch(&kept, owner("sweep"), 5).unwrap();

        // Here the sweep stopped while batch 0 of a new cell ran.
        let other = dir.path().join("other.batches");
        let stopped = resumable_batches(
            &other,
            owner("sweep"),
            5,
            |_| 0.25,
            any_batch,
            |j| Ok(batch(j)),
            |_, _| anyhow::bail!("the sweep stopped"),
        );
        assert!(stopped.is_err());
        assert!(other.join("0.json").exists() && !other.join("1.json").exists());

        // Another sweep's batches are never read as this one's.
        let err = every_batch(&kept, owner("another sweep"), 5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("another sweep"), "{err}");

        // A damaged batch file is an error that names it, not a silent recomputation.
        std::fs::write(kept.join("1.json"), "{ truncated").unwrap();
        let err = every_batch(&kept, owner("sweep"), 5).unwrap_err();
        let message = format!("{err:#}");
        assert!(
            message.contains("1.json") && message.contains("delete the file"),
            "{message}"
        );
    }

    /// Each kept part is bound to its sweep, cell, kind and index, and to its content: a part
    /// copied over another, another cell's or kind's part, and an edited value are refused,
    /// naming the file and the mismatch.
    #[test]
    fn a_kept_part_is_read_back_only_where_and_as_it_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("cell.batches");
        every_batch(&kept, owner("sweep"), 3).unwrap();
        let original = std::fs::read_to_string(kept.join("1.json")).unwrap();
        let refused = |why: &str| {
            let err = format!("{:#}", every_batch(&kept, owner("sweep"), 3).unwrap_err());
            assert!(err.contains("1.json") && err.contains(why), "{err}");
            std::fs::write(kept.join("1.json"), &original).unwrap();
        };
        std::fs::copy(kept.join("2.json"), kept.join("1.json")).unwrap();
        refused("it is part 2, not part 1");
        let mut part: serde_json::Value = serde_json::from_str(&original).unwrap();
        part["part"][0] = serde_json::json!(1000.0);
        std::fs::write(kept.join("1.json"), part.to_string()).unwrap();
        refused("does not match the digest");
        // The same part of a cell whose model reads alike, and a convergence check's part.
        let other = dir.path().join("other.batches");
        let alike = PartOwner {
            cell: &CELLS[1],
            ..owner("sweep")
        };
        every_batch(&other, alike, 3).unwrap();
        std::fs::copy(other.join("1.json"), kept.join("1.json")).unwrap();
        refused("another cell");
        let check = PartOwner {
            kind: super::super::spec::PartKind::ConvergenceCheck,
            ..owner("sweep")
        };
        let err = format!("{:#}", every_batch(&kept, check, 3).unwrap_err());
        assert!(err.contains("not a convergence check part"), "{err}");
        // As written, every part reads back without computing anything.
        let read = resumable_batches(
            &kept,
            owner("sweep"),
            3,
            |_| 0.25,
            any_batch,
            |j| anyhow::bail!("batch {j} computed again"),
            |_, _| Ok(()),
        )
        .unwrap();
        assert_eq!(read, (0..3).map(batch).collect::<Vec<_>>());
    }
}
