//! The reliability diagram of a `calibrate` run (Guo et al. 2017, Figure 1): per model × K, the
//! accuracy of each confidence bin as a bar, the gap to the bin's mean confidence as a strip, the
//! diagonal of perfect calibration, and below it the share of the examples in each bin (a bin
//! of three examples says little). One column per K, two rows per model.

use crate::metrics::{Calibration, ReliabilityBin};
use crate::plot::{model_labels, BarRect, Bars, Dash, Figure, Panel, Series};

const ACCURACY_FILL: [u8; 3] = [31, 119, 180];
const ACCURACY_EDGE: [u8; 3] = [16, 62, 94];
const GAP_FILL: [u8; 3] = [255, 170, 170];
const GAP_EDGE: [u8; 3] = [214, 39, 40];
const COUNT_FILL: [u8; 3] = [170, 170, 170];
const COUNT_EDGE: [u8; 3] = [90, 90, 90];
const GREY: [u8; 3] = [127, 127, 127];
const BLACK: [u8; 3] = [0, 0, 0];

/// Accuracy and confidence of the bins that hold examples.
fn filled(bins: &[ReliabilityBin]) -> impl Iterator<Item = (&ReliabilityBin, f64, f64)> {
    bins.iter()
        .filter_map(|b| Some((b, b.accuracy?, b.confidence?)))
}

fn reliability_panel(title: String, c: &Calibration) -> Panel {
    let accuracy = filled(&c.bins)
        .map(|(b, acc, _)| BarRect {
            x: (b.lo, b.hi),
            y: (0.0, acc),
        })
        .collect();
    // The gap as a strip half the bin wide, so that the accuracy bar's top stays visible on
    // both sides: a strip above it is over-confidence, one inside it under-confidence.
    let gaps = filled(&c.bins)
        .map(|(b, acc, conf)| {
            let quarter = (b.hi - b.lo) / 4.0;
            BarRect {
                x: (b.lo + quarter, b.hi - quarter),
                y: (acc.min(conf), acc.max(conf)),
            }
        })
        .collect();
    let confidence = filled(&c.bins)
        .map(|(b, _, conf)| ((b.lo + b.hi) / 2.0, conf))
        .collect();
    Panel {
        title,
        x_label: "confidence max p(y|x)".into(),
        y_label: "accuracy".into(),
        x_range: Some((0.0, 1.0)),
        y_range: Some((0.0, 1.0)),
        bars: vec![
            Bars {
                label: "accuracy of the bin".into(),
                fill: Some(ACCURACY_FILL),
                stroke: Some(ACCURACY_EDGE),
                rects: accuracy,
            },
            Bars {
                label: "gap to its mean confidence".into(),
                fill: Some(GAP_FILL),
                stroke: Some(GAP_EDGE),
                rects: gaps,
            },
        ],
        series: vec![
            Series {
                label: "perfect calibration".into(),
                color: GREY,
                dash: Dash::Dashed,
                points: vec![(0.0, 0.0), (1.0, 1.0)],
                intervals: Vec::new(),
            },
            Series {
                label: "mean confidence of the bin".into(),
                color: BLACK,
                dash: Dash::Dotted,
                points: confidence,
                intervals: Vec::new(),
            },
        ],
    }
}

fn count_panel(title: String, c: &Calibration) -> Panel {
    let n = c.metrics.n.max(1) as f64;
    Panel {
        title,
        x_label: "confidence max p(y|x)".into(),
        y_label: "examples (%)".into(),
        x_range: Some((0.0, 1.0)),
        y_range: None,
        bars: vec![Bars {
            label: "examples in the bin".into(),
            fill: Some(COUNT_FILL),
            stroke: Some(COUNT_EDGE),
            rects: c
                .bins
                .iter()
                .filter(|b| b.count > 0)
                .map(|b| BarRect {
                    x: (b.lo, b.hi),
                    y: (0.0, 100.0 * b.count as f64 / n),
                })
                .collect(),
        }],
        series: Vec::new(),
    }
}

/// `results`: (model, K, calibration) in the order run, every model at the same Ks.
pub fn figure(results: &[(String, usize, Calibration)], title: &str) -> Figure {
    let mut models: Vec<&String> = Vec::new();
    let mut ks: Vec<usize> = Vec::new();
    for (m, k, _) in results {
        if !models.contains(&m) {
            models.push(m);
        }
        if !ks.contains(k) {
            ks.push(*k);
        }
    }
    let labels = model_labels(&models);
    let mut panels = Vec::new();
    for (m, label) in models.iter().zip(&labels) {
        let mine: Vec<&(String, usize, Calibration)> =
            results.iter().filter(|(r, _, _)| r == *m).collect();
        for (_, k, c) in &mine {
            let title = format!("{label}, K = {k}: ECE {:.2} %", 100.0 * c.metrics.ece);
            panels.push(reliability_panel(title, c));
        }
        for (_, k, c) in &mine {
            let title = format!("{label}, K = {k}: n = {}", c.metrics.n);
            panels.push(count_panel(title, c));
        }
    }
    Figure {
        title: title.to_string(),
        columns: ks.len(),
        panels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::calibration;

    #[test]
    fn one_column_per_k_and_two_rows_per_model() {
        let lp: Vec<f32> = [[0.7f32, 0.3], [0.2, 0.8]]
            .iter()
            .flatten()
            .map(|p| p.ln())
            .collect();
        let c = calibration(&lp, &[0, 0], 2);
        let results: Vec<(String, usize, Calibration)> = ["a/baseline", "a/jem"]
            .iter()
            .flat_map(|m| [0, 1].map(|k| (m.to_string(), k, c.clone())))
            .collect();
        let f = figure(&results, "t");
        assert_eq!(f.columns, 2);
        let titles: Vec<&str> = f.panels.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(titles.len(), 8);
        assert!(titles[0].starts_with("baseline, K = 0: ECE"), "{titles:?}");
        assert_eq!(titles[3], "baseline, K = 1: n = 2");
        assert!(titles[5].starts_with("jem, K = 1"), "{titles:?}");
        // Two bins hold an example each: two accuracy bars, two gaps, two count bars.
        assert_eq!(f.panels[0].bars[0].rects.len(), 2);
        assert_eq!(f.panels[0].bars[1].rects.len(), 2);
        assert_eq!(f.panels[2].bars[0].rects.len(), 2);
        assert!(f.to_svg().contains("perfect calibration"));
    }
}
