//! Score histograms of an `ood` run, one figure: a row per model × K, a column per score; in
//! each panel the in-distribution images as filled grey bars and every OOD set as an outline
//! in its colour, each as a share of its own images over 30 common bins. Where the outlines
//! sit apart from the grey bars, the score separates that set.

use crate::plot::{model_labels, BarRect, Bars, Figure, Panel, PALETTE};
use crate::Choice;

use super::scores::{histogram_label, histogram_value, Score};
use super::ScoredCell;

const BINS: usize = 30;
const IN_FILL: [u8; 3] = [200, 200, 200];
const IN_EDGE: [u8; 3] = [120, 120, 120];

/// Shares (%) of `values` in `BINS` equal-width bins over [lo, hi]; values outside (the
/// infinite ones) count in the end bins.
fn shares(values: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let mut counts = vec![0usize; BINS];
    let width = (hi - lo) / BINS as f64;
    for &v in values {
        let b = if width > 0.0 {
            ((v - lo) / width).floor().clamp(0.0, (BINS - 1) as f64) as usize
        } else {
            0
        };
        counts[b] += 1;
    }
    let n = values.len().max(1) as f64;
    counts.iter().map(|&c| 100.0 * c as f64 / n).collect()
}

fn bars(
    label: String,
    fill: Option<[u8; 3]>,
    stroke: [u8; 3],
    shares: &[f64],
    lo: f64,
    hi: f64,
) -> Bars {
    let width = (hi - lo) / BINS as f64;
    Bars {
        label,
        fill,
        stroke: Some(stroke),
        rects: shares
            .iter()
            .enumerate()
            .filter(|(_, &s)| s > 0.0)
            .map(|(b, &s)| BarRect {
                x: (lo + b as f64 * width, lo + (b + 1) as f64 * width),
                y: (0.0, s),
            })
            .collect(),
    }
}

fn panel(title: String, cell: &ScoredCell, s: usize, score: Score) -> Panel {
    let shown: Vec<Vec<f64>> = cell
        .sets
        .iter()
        .map(|set| {
            set.values[s]
                .iter()
                .map(|&v| histogram_value(score, v))
                .collect()
        })
        .collect();
    let finite = shown.iter().flatten().copied().filter(|v| v.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = match (lo.is_finite(), hi > lo) {
        (true, true) => (lo, hi),
        (true, false) => (lo - 0.5, lo + 0.5),
        _ => (0.0, 1.0),
    };
    let mut all_bars = Vec::new();
    for (i, (set, values)) in cell.sets.iter().zip(&shown).enumerate() {
        let h = shares(values, lo, hi);
        all_bars.push(if i == 0 {
            bars(
                format!("{} (in-distribution)", set.name),
                Some(IN_FILL),
                IN_EDGE,
                &h,
                lo,
                hi,
            )
        } else {
            bars(
                set.name.clone(),
                None,
                PALETTE[(i - 1) % PALETTE.len()],
                &h,
                lo,
                hi,
            )
        });
    }
    Panel {
        title,
        x_label: histogram_label(score).into(),
        y_label: "images of the set (%)".into(),
        x_range: Some((lo, hi)),
        y_range: None,
        series: Vec::new(),
        bars: all_bars,
    }
}

pub fn figure(cells: &[ScoredCell], scores: &[Score], title: &str) -> Figure {
    let mut models: Vec<&str> = Vec::new();
    for c in cells {
        if !models.contains(&c.model.as_str()) {
            models.push(&c.model);
        }
    }
    let labels = model_labels(&models);
    let mut panels = Vec::new();
    for cell in cells {
        let label = &labels[models
            .iter()
            .position(|m| *m == cell.model)
            .expect("listed")];
        for (s, &score) in scores.iter().enumerate() {
            let title = format!("{label}, K = {}: {}", cell.k, score.name());
            panels.push(panel(title, cell, s, score));
        }
    }
    Figure {
        title: title.to_string(),
        columns: scores.len(),
        panels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_sum_to_100_and_keep_the_extremes() {
        let h = shares(&[0.0, 0.5, 1.0, f64::INFINITY, f64::NEG_INFINITY], 0.0, 1.0);
        assert_eq!(h.len(), BINS);
        assert!((h.iter().sum::<f64>() - 100.0).abs() < 1e-9);
        assert_eq!(h[0], 40.0);
        assert_eq!(h[BINS - 1], 40.0);
        assert_eq!(h[BINS / 2], 20.0);
    }
}
