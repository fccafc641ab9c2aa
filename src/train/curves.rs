//! Training curves: what `train` logs after each epoch in `epochs.csv` (validation accuracy,
//! NLL and ECE), of one or more runs, against training iterations, drawn as SVG and PNG — to
//! compare attempts (a JEM against its control, a wider network against a narrower one) at a
//! glance, and to see where a run stopped improving.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::plot::{Dash, Figure, Panel, Series, PALETTE};

/// The validation measurements of one epoch, as `epochs.csv` records them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochRow {
    /// Training iterations done at the epoch's end.
    pub iteration: f64,
    /// Validation accuracy, a fraction in [0, 1].
    pub val_accuracy: f64,
    /// Validation negative log-likelihood, in nats per example.
    pub val_nll: f64,
    /// Validation expected calibration error (15 bins), a fraction.
    pub val_ece: f64,
}

/// Reads a run's `epochs.csv` (the run folder, or the file itself). Every row must hold the
/// four columns as finite numbers; an error names the file, the row and the column.
pub fn read_epochs(run: &Path) -> anyhow::Result<Vec<EpochRow>> {
    let path: PathBuf = if run.is_dir() {
        run.join("epochs.csv")
    } else {
        run.to_path_buf()
    };
    let mut reader = csv::Reader::from_path(&path).with_context(|| {
        format!(
            "cannot read {}: expected a training run's folder or its epochs.csv",
            path.display()
        )
    })?;
    let header = reader
        .headers()
        .with_context(|| format!("{}: unreadable header", path.display()))?
        .clone();
    const COLUMNS: [&str; 4] = ["iteration", "val_accuracy", "val_nll", "val_ece"];
    let mut at = [0; 4];
    for (slot, name) in at.iter_mut().zip(COLUMNS) {
        *slot = header.iter().position(|h| h == name).with_context(|| {
            format!(
                "{}: no column `{name}` (the header is `{}`); expected the epochs.csv that \
                 `jem-bench train` writes",
                path.display(),
                header.iter().collect::<Vec<_>>().join(",")
            )
        })?;
    }
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        // Row 1 is the header.
        let row = i + 2;
        let record = record.with_context(|| format!("{}: row {row} unreadable", path.display()))?;
        let mut values = [0.0; 4];
        for ((value, &column), name) in values.iter_mut().zip(&at).zip(COLUMNS) {
            let text = record.get(column).unwrap_or("");
            *value = text
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .with_context(|| {
                    format!(
                        "{}: row {row}, column `{name}` is `{text}`, expected a finite number",
                        path.display()
                    )
                })?;
        }
        anyhow::ensure!(
            (0.0..=1.0).contains(&values[1]),
            "{}: row {row}, column `val_accuracy` is {}, expected a fraction in [0, 1]",
            path.display(),
            values[1]
        );
        rows.push(EpochRow {
            iteration: values[0],
            val_accuracy: values[1],
            val_nll: values[2],
            val_ece: values[3],
        });
    }
    anyhow::ensure!(
        !rows.is_empty(),
        "{}: no epoch logged yet (nothing to draw)",
        path.display()
    );
    Ok(rows)
}

/// A run to draw: its legend label, its folder (or epochs.csv), and where its iterations start
/// on the common axis (a run that continued another from that one's iteration `start`).
#[derive(Debug, Clone, PartialEq)]
pub struct CurveRun {
    /// The legend's label.
    pub label: String,
    /// The run's folder (`train --out`) or its `epochs.csv`.
    pub dir: PathBuf,
    /// Added to the run's iterations: where it took over from the run it continued.
    pub start: f64,
}

/// One panel per measurement, one line per run (`(label, epochs)`, iterations already on the
/// common axis): validation accuracy (%), the same above `zoom_from` % (where runs that all
/// end near the top differ; points below it are left out of that panel), validation NLL and
/// ECE (%). Iterations are drawn in thousands.
pub fn figure(runs: &[(String, Vec<EpochRow>)], title: &str, zoom_from: f64) -> Figure {
    let panel = |title: &str, y_label: &str, value: &dyn Fn(&EpochRow) -> Option<f64>| Panel {
        title: title.to_string(),
        x_label: "training iterations (thousands)".to_string(),
        y_label: y_label.to_string(),
        series: runs
            .iter()
            .enumerate()
            .map(|(i, (label, rows))| Series {
                label: label.clone(),
                color: PALETTE[i % PALETTE.len()],
                dash: Dash::ALL[(i / PALETTE.len()) % Dash::ALL.len()],
                points: rows
                    .iter()
                    .filter_map(|r| Some((r.iteration / 1000.0, value(r)?)))
                    .collect(),
                intervals: Vec::new(),
            })
            .collect(),
        ..Panel::default()
    };
    let accuracy = |r: &EpochRow| Some(100.0 * r.val_accuracy);
    let zoomed = |r: &EpochRow| Some(100.0 * r.val_accuracy).filter(|&a| a >= zoom_from);
    let mut zoom = panel(
        &format!("validation accuracy ≥ {zoom_from} %"),
        "%",
        &zoomed,
    );
    zoom.y_range = Some((zoom_from, 100.0));
    Figure {
        title: title.to_string(),
        columns: 2,
        panels: vec![
            panel("validation accuracy", "%", &accuracy),
            zoom,
            panel("validation NLL", "nats", &|r| Some(r.val_nll)),
            panel("validation ECE", "%", &|r| Some(100.0 * r.val_ece)),
        ],
    }
}

/// Reads every run before anything is written, then draws [`figure`] to `out_stem`.svg and
/// .png.
pub fn write(runs: &[CurveRun], out_stem: &Path, zoom_from: f64) -> anyhow::Result<()> {
    anyhow::ensure!(!runs.is_empty(), "no training runs to draw");
    anyhow::ensure!(
        zoom_from.is_finite() && (0.0..100.0).contains(&zoom_from),
        "--zoom-from {zoom_from}: expected a percentage in [0, 100)"
    );
    let read = runs
        .iter()
        .map(|run| {
            anyhow::ensure!(
                run.start.is_finite() && run.start >= 0.0,
                "{}: start {} is not an iteration count",
                run.dir.display(),
                run.start
            );
            let mut rows = read_epochs(&run.dir)?;
            rows.iter_mut().for_each(|r| r.iteration += run.start);
            Ok((run.label.clone(), rows))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    figure(&read, "training curves", zoom_from).write(out_stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_log(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("epochs.csv");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn reads_a_log_and_names_the_row_and_column_of_a_bad_value() {
        let dir = tempfile::tempdir().unwrap();
        let header = "epoch,iteration,lr,val_accuracy,val_nll,val_ece,best,wall_seconds\n";
        write_log(
            dir.path(),
            &format!("{header}0,860,2e-4,0.9664,0.2071,0.1133,true,3508\n1,1720,2e-4,0.9744,0.1945,0.1164,true,6873\n"),
        );
        let rows = read_epochs(dir.path()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[1],
            EpochRow {
                iteration: 1720.0,
                val_accuracy: 0.9744,
                val_nll: 0.1945,
                val_ece: 0.1164
            }
        );
        let err = |text: &str| {
            let path = write_log(dir.path(), text);
            format!("{:#}", read_epochs(&path).unwrap_err())
        };
        let e = err(&format!("{header}0,860,2e-4,0.96,NaN,0.11,true,3508\n"));
        assert!(
            e.contains("row 2") && e.contains("`val_nll`") && e.contains("NaN"),
            "{e}"
        );
        let e = err(&format!(
            "{header}0,860,2e-4,0.96,0.2,0.11,true,3508\n1,1720,2e-4,,0.2,0.1,true,1\n"
        ));
        assert!(e.contains("row 3") && e.contains("`val_accuracy`"), "{e}");
        let e = err(&format!("{header}0,860,2e-4,96.4,0.2,0.11,true,3508\n"));
        assert!(e.contains("fraction in [0, 1]"), "{e}");
        let e = err("epoch,iteration,lr,accuracy\n0,860,2e-4,0.9\n");
        assert!(e.contains("no column `val_accuracy`"), "{e}");
        let e = err(header);
        assert!(e.contains("no epoch logged yet"), "{e}");
        let missing = format!(
            "{:#}",
            read_epochs(&dir.path().join("nowhere")).unwrap_err()
        );
        assert!(missing.contains("nowhere"), "{missing}");
    }

    #[test]
    fn the_zoomed_panel_keeps_only_points_at_or_above_its_floor() {
        let rows = vec![
            EpochRow {
                iteration: 1000.0,
                val_accuracy: 0.5,
                val_nll: 1.0,
                val_ece: 0.1,
            },
            EpochRow {
                iteration: 2000.0,
                val_accuracy: 0.97,
                val_nll: 0.2,
                val_ece: 0.05,
            },
        ];
        let figure = figure(&[("run".into(), rows)], "t", 90.0);
        assert_eq!(figure.panels.len(), 4);
        assert_eq!(
            figure.panels[0].series[0].points,
            vec![(1.0, 50.0), (2.0, 97.0)]
        );
        assert_eq!(figure.panels[1].series[0].points, vec![(2.0, 97.0)]);
        assert_eq!(figure.panels[1].y_range, Some((90.0, 100.0)));
        assert_eq!(
            figure.panels[3].series[0].points,
            vec![(1.0, 10.0), (2.0, 5.0)]
        );
    }
}
