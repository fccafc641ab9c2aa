//! What every part of one cell's run shares: the examples it attacks, the cell's attack on its
//! defended model, the ε grid, and how each part (an attack batch, a part of the convergence
//! check) is kept as it finishes and read back by a rerun.

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use jem_attacks::Model;
use jem_datasets::ImageSet;
use serde::Serialize;

use super::attack::{attack_batch, BatchResult, Build, Stage};
use crate::backend::BenchBackend;
use crate::harness::cells::Cell;
use crate::harness::kept_parts;
use crate::harness::spec::{CellPart, PartKind, SweepSpec};
use crate::harness::subject::Subject;

/// A batch of test images and their labels.
pub(in crate::harness) type Examples<B> = (
    Tensor<<B as AutodiffBackend>::InnerBackend, 4>,
    Tensor<<B as AutodiffBackend>::InnerBackend, 1, Int>,
);

/// The test images a cell attacks: the first `--n-examples` of its subject's test set.
pub(in crate::harness) struct Loaded<'a> {
    pub(in crate::harness) data: &'a ImageSet,
    pub(in crate::harness) spec: &'a str,
    pub(in crate::harness) indices: Vec<usize>,
}

impl<'a> Loaded<'a> {
    pub(in crate::harness) fn of<B: BenchBackend, N: Module<B>>(
        spec: &SweepSpec,
        subject: &'a Subject<B, N>,
    ) -> Self {
        Loaded {
            data: subject.test_set(),
            spec: subject.data_name(),
            indices: (0..spec.examples.count()).collect(),
        }
    }
}

/// What every kept part of one cell's run (an attack batch, a part of its convergence check)
/// needs: the sweep's identity and settings, the cell, its attack on the defended model, the
/// ε grid, how to load a batch of its examples, where its parts are kept and whom to tell.
pub(in crate::harness) struct CellWork<'a, 'b, B: BenchBackend, M: Model<B>> {
    /// The sweep's identity, which every kept part records.
    pub(in crate::harness) identity: &'a str,
    pub(in crate::harness) spec: &'a SweepSpec,
    pub(in crate::harness) cell: &'a Cell,
    pub(in crate::harness) build: &'a Build<'b, B, M>,
    pub(in crate::harness) defended: &'a M,
    /// The ε grid, ascending.
    pub(in crate::harness) grid: &'a [f32],
    /// The images and labels of the given rows of the cell's examples.
    pub(in crate::harness) batch: &'a dyn Fn(&[usize]) -> Examples<B>,
    /// The cell's batch folder, where its parts are kept until it finishes.
    pub(in crate::harness) keep: std::path::PathBuf,
    /// Told of each part as it is kept or read back.
    pub(in crate::harness) report: &'a dyn Fn(CellPart) -> anyhow::Result<()>,
}

impl<B: BenchBackend, M: Model<B>> CellWork<'_, '_, B, M> {
    /// The cell's attack, with `settings` (the sweep's, or a batch's or a re-attack's variant
    /// of them), on the given rows of its examples at every ε of `grid`.
    pub(in crate::harness) fn attack(
        &self,
        settings: &SweepSpec,
        strength: usize,
        rows: &[usize],
        grid: &[f32],
    ) -> anyhow::Result<Vec<Stage>> {
        let (x, y) = (self.batch)(rows);
        let build = self.build;
        attack_batch(
            settings,
            strength,
            self.cell,
            build,
            self.defended,
            x,
            y,
            grid,
        )
    }

    /// The cell's `count` parts of one `kind`, each kept in `dir` as `compute` finishes it and
    /// read back by a rerun (refused unless it `fits`: see [`kept_parts::resumable_batches`]), the
    /// observer told of each with its `share` of the cell's estimated cost. Returns the parts in
    /// order and the seconds that those read back had taken in the earlier, interrupted runs
    /// that kept them (the cell's time counts them).
    pub(in crate::harness) fn parts<T: KeptPart>(
        &self,
        kind: PartKind,
        dir: &std::path::Path,
        count: usize,
        share: impl Fn(usize) -> f64,
        fits: impl Fn(usize, &T) -> Result<(), String>,
        compute: impl FnMut(usize) -> anyhow::Result<T>,
    ) -> anyhow::Result<(Vec<T>, f64)> {
        let mut read_back = Vec::new();
        let kept = |index: usize, seconds: Option<f64>| {
            if seconds.is_none() {
                read_back.push(index);
            }
            (self.report)(CellPart {
                cell: self.cell.clone(),
                kind,
                index,
                count,
                seconds: seconds.unwrap_or(0.0),
                share: share(index),
                resumed: seconds.is_none(),
            })
        };
        let owner = kept_parts::PartOwner {
            sweep: self.identity,
            cell: self.cell,
            kind,
        };
        // A part's time counts in the cell's: it must be one.
        let fits = |j: usize, part: &T| {
            let seconds = part.seconds();
            if !(seconds.is_finite() && seconds >= 0.0) {
                return Err(format!("it took {seconds} s, not a time"));
            }
            fits(j, part)
        };
        let parts = kept_parts::resumable_batches(dir, owner, count, &share, fits, compute, kept)?;
        let read_back_seconds = read_back.iter().map(|&j| parts[j].seconds()).sum();
        Ok((parts, read_back_seconds))
    }
}

/// A kept part of a cell's run, as a rerun reads it back: it records the seconds it took.
pub(in crate::harness) trait KeptPart:
    Serialize + serde::de::DeserializeOwned
{
    /// The seconds computing the part took.
    fn seconds(&self) -> f64;
}

impl KeptPart for BatchResult {
    fn seconds(&self) -> f64 {
        self.seconds
    }
}
