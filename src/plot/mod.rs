//! Line and bar charts (robustness curves, reliability diagrams, histograms) written as SVG and
//! PNG from one description.
//!
//! A [`Figure`] is a grid of [`Panel`]s sharing one legend; a panel holds lines ([`Series`])
//! drawn over filled or outlined rectangles ([`Bars`]). The layout is computed once, in
//! pixels, and drawn on a `Canvas`: the SVG canvas writes vector elements (text stays text),
//! the raster canvas draws into an RGB image with an embedded 8×8 bitmap font. Neither needs a
//! system font or a graphics library, so plots work on a bare CI machine.

mod raster;
mod svg;

use std::path::{Path, PathBuf};

use crate::model::write_atomic;

/// An RGB colour.
pub type Rgb = [u8; 3];

/// Line colours, one per model (the Tableau 10 palette: distinct in print and for most forms of
/// colour blindness).
pub const PALETTE: [Rgb; 8] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
];

/// Stroke patterns, one per sampling-step count K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dash {
    Solid,
    Dashed,
    Dotted,
    DashDot,
}

impl Dash {
    pub const ALL: [Dash; 4] = [Dash::Solid, Dash::Dashed, Dash::Dotted, Dash::DashDot];

    /// On/off lengths in pixels (empty: solid).
    fn pattern(self) -> &'static [f32] {
        match self {
            Dash::Solid => &[],
            Dash::Dashed => &[12.0, 7.0],
            Dash::Dotted => &[3.0, 5.0],
            Dash::DashDot => &[12.0, 5.0, 3.0, 5.0],
        }
    }
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub color: Rgb,
    pub dash: Dash,
    /// (x, y) in data units; drawn in this order.
    pub points: Vec<(f64, f64)>,
    /// (low, high) in y units per point, drawn as error bars (e.g. a 95 % interval); empty for
    /// none.
    pub intervals: Vec<(f64, f64)>,
}

/// Rectangles in data units, drawn under the panel's lines: histograms, bar charts, shaded
/// gaps. Parts outside the panel's axis ranges are cut off.
#[derive(Debug, Clone)]
pub struct Bars {
    pub label: String,
    /// Fill colour; `None` draws outlines only (several histograms over each other).
    pub fill: Option<Rgb>,
    pub stroke: Option<Rgb>,
    /// One rectangle per bar: x from `x.0` to `x.1`, y from `y.0` to `y.1`.
    pub rects: Vec<BarRect>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BarRect {
    pub x: (f64, f64),
    pub y: (f64, f64),
}

#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Axis ranges in data units; `None` fits the data.
    pub x_range: Option<(f64, f64)>,
    pub y_range: Option<(f64, f64)>,
    pub series: Vec<Series>,
    /// Drawn first, in this order.
    pub bars: Vec<Bars>,
}

#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub columns: usize,
    pub panels: Vec<Panel>,
}

/// Where a figure is drawn. Coordinates are pixels from the top-left corner.
pub(crate) trait Canvas {
    fn polyline(&mut self, points: &[(f32, f32)], color: Rgb, width: f32, dash: Dash);
    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, stroke: Option<Rgb>, fill: Option<Rgb>);
    fn marker(&mut self, x: f32, y: f32, radius: f32, color: Rgb);
    /// `size`: text height in pixels; `anchor`: where (x, y) sits on the text's baseline;
    /// `vertical`: rotated 90° counter-clockwise (y-axis labels).
    fn text(&mut self, x: f32, y: f32, s: &str, size: f32, anchor: Anchor, vertical: bool);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

const PANEL_W: f32 = 460.0;
const PANEL_H: f32 = 340.0;
const MARGIN_L: f32 = 70.0;
const MARGIN_R: f32 = 20.0;
const MARGIN_T: f32 = 36.0;
const MARGIN_B: f32 = 56.0;
const TITLE_H: f32 = 44.0;
/// Legend width before its longest label.
const LEGEND_PAD: f32 = 90.0;
/// Width of a legend character in the raster font (8 pixels × 2 at the legend's text size),
/// the wider of the two backends.
const LEGEND_CHAR: f32 = 16.0;
const LEGEND_ROW: f32 = 24.0;
const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [225, 225, 225];
const TEXT: f32 = 16.0;

impl Figure {
    fn rows(&self) -> usize {
        self.panels.len().div_ceil(self.columns.max(1))
    }

    /// Pixel size of the whole figure.
    pub fn size(&self) -> (u32, u32) {
        let cols = self.columns.max(1).min(self.panels.len().max(1));
        let legend_rows = self.legend().len() as f32;
        let w = cols as f32 * (PANEL_W + MARGIN_L + MARGIN_R) + self.legend_width();
        let h = (self.rows() as f32 * (PANEL_H + MARGIN_T + MARGIN_B))
            .max(legend_rows * LEGEND_ROW + 20.0)
            + TITLE_H;
        (w.ceil() as u32, h.ceil() as u32)
    }

    fn legend_width(&self) -> f32 {
        let longest = self
            .legend()
            .iter()
            .map(|e| e.label().chars().count())
            .max()
            .unwrap_or(0);
        LEGEND_PAD + longest as f32 * LEGEND_CHAR
    }

    /// One legend entry per distinct label, bars before lines (as drawn), in first-seen order.
    fn legend(&self) -> Vec<LegendEntry<'_>> {
        let bars = self
            .panels
            .iter()
            .flat_map(|p| &p.bars)
            .map(LegendEntry::Bars);
        let lines = self
            .panels
            .iter()
            .flat_map(|p| &p.series)
            .map(LegendEntry::Line);
        let mut seen: Vec<LegendEntry> = Vec::new();
        for e in bars.chain(lines) {
            if !seen.iter().any(|t| t.label() == e.label()) {
                seen.push(e);
            }
        }
        seen
    }

    fn draw(&self, c: &mut dyn Canvas) {
        let (w, h) = self.size();
        c.rect(0.0, 0.0, w as f32, h as f32, None, Some([255, 255, 255]));
        // Smaller where a long title would not fit the figure's width: the PNG's 8-pixel
        // glyphs scale by whole steps, up to about 1.35 × the size per character.
        let chars = self.title.chars().count().max(1) as f32;
        let size = TITLE_SIZE.min(0.95 * w as f32 / (1.35 * chars));
        c.text(
            w as f32 / 2.0,
            30.0,
            &self.title,
            size,
            Anchor::Middle,
            false,
        );
        let cols = self.columns.max(1);
        for (i, panel) in self.panels.iter().enumerate() {
            let (row, col) = (i / cols, i % cols);
            let x0 = col as f32 * (PANEL_W + MARGIN_L + MARGIN_R) + MARGIN_L;
            let y0 = TITLE_H + row as f32 * (PANEL_H + MARGIN_T + MARGIN_B) + MARGIN_T;
            panel.draw(c, x0, y0);
        }
        let lx = w as f32 - self.legend_width() + 16.0;
        for (i, e) in self.legend().iter().enumerate() {
            let y = TITLE_H + MARGIN_T + i as f32 * LEGEND_ROW + 8.0;
            match e {
                LegendEntry::Line(s) => {
                    c.polyline(&[(lx, y), (lx + 44.0, y)], s.color, 2.5, s.dash);
                    c.marker(lx + 22.0, y, 3.5, s.color);
                }
                LegendEntry::Bars(b) => c.rect(lx + 6.0, y - 7.0, 32.0, 14.0, b.stroke, b.fill),
            }
            c.text(
                lx + 54.0,
                y + 5.0,
                e.label(),
                TEXT * 0.875,
                Anchor::Start,
                false,
            );
        }
    }

    pub fn to_svg(&self) -> String {
        let (w, h) = self.size();
        let mut c = svg::SvgCanvas::new(w, h);
        self.draw(&mut c);
        c.finish()
    }

    pub fn to_png(&self) -> anyhow::Result<Vec<u8>> {
        let (w, h) = self.size();
        let mut c = raster::RasterCanvas::new(w, h);
        self.draw(&mut c);
        c.encode_png()
    }

    /// Writes `stem.svg` and `stem.png`, each atomically.
    pub fn write(&self, stem: &Path) -> anyhow::Result<()> {
        for (path, bytes) in self.files(stem)? {
            write_atomic(&path, &bytes)?;
        }
        Ok(())
    }

    /// `stem.svg` and `stem.png` with their bytes, to be written with other files together
    /// ([`FileSet`](crate::output_folder::FileSet)).
    pub fn files(&self, stem: &Path) -> anyhow::Result<[(PathBuf, Vec<u8>); 2]> {
        Ok([
            (stem.with_extension("svg"), self.to_svg().into_bytes()),
            (stem.with_extension("png"), self.to_png()?),
        ])
    }
}

/// What a legend row shows: a line with its marker, or a box filled like the bars.
enum LegendEntry<'a> {
    Line(&'a Series),
    Bars(&'a Bars),
}

impl LegendEntry<'_> {
    fn label(&self) -> &str {
        match self {
            LegendEntry::Line(s) => &s.label,
            LegendEntry::Bars(b) => &b.label,
        }
    }
}

impl Panel {
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let corners = self
            .bars
            .iter()
            .flat_map(|b| &b.rects)
            .flat_map(|r| [(r.x.0, r.y.0), (r.x.1, r.y.1)]);
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .chain(corners)
            .collect();
        let fit = |v: Vec<f64>| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            match (lo.is_finite(), hi > lo) {
                (true, true) => (lo, hi),
                (true, false) => (lo - 0.5, lo + 0.5),
                _ => (0.0, 1.0),
            }
        };
        let x = self
            .x_range
            .unwrap_or_else(|| fit(pts.iter().map(|p| p.0).collect()));
        let y = self
            .y_range
            .unwrap_or_else(|| fit(pts.iter().map(|p| p.1).collect()));
        (x, y)
    }

    fn draw(&self, c: &mut dyn Canvas, x0: f32, y0: f32) {
        let ((xa, xb), (ya, yb)) = self.ranges();
        let px = |x: f64| x0 + ((x - xa) / (xb - xa)) as f32 * PANEL_W;
        let py = |y: f64| y0 + PANEL_H - ((y - ya) / (yb - ya)) as f32 * PANEL_H;
        for t in ticks(xa, xb) {
            let x = px(t);
            c.polyline(&[(x, y0), (x, y0 + PANEL_H)], GRID, 1.0, Dash::Solid);
            c.polyline(
                &[(x, y0 + PANEL_H), (x, y0 + PANEL_H + 5.0)],
                BLACK,
                1.0,
                Dash::Solid,
            );
            let label = tick_label(t);
            c.text(
                x,
                y0 + PANEL_H + 22.0,
                &label,
                TEXT * 0.875,
                Anchor::Middle,
                false,
            );
        }
        for t in ticks(ya, yb) {
            let y = py(t);
            c.polyline(&[(x0, y), (x0 + PANEL_W, y)], GRID, 1.0, Dash::Solid);
            c.polyline(&[(x0 - 5.0, y), (x0, y)], BLACK, 1.0, Dash::Solid);
            let label = tick_label(t);
            c.text(x0 - 9.0, y + 5.0, &label, TEXT * 0.875, Anchor::End, false);
        }
        for b in &self.bars {
            for r in &b.rects {
                // Cut to the panel: a bar beyond a fixed axis range ends at the frame.
                let (left, right) = (px(r.x.0.min(r.x.1)), px(r.x.0.max(r.x.1)));
                let (top, bottom) = (py(r.y.0.max(r.y.1)), py(r.y.0.min(r.y.1)));
                let (left, right) = (left.max(x0), right.min(x0 + PANEL_W));
                let (top, bottom) = (top.max(y0), bottom.min(y0 + PANEL_H));
                if right > left && bottom >= top {
                    c.rect(left, top, right - left, bottom - top, b.stroke, b.fill);
                }
            }
        }
        c.rect(x0, y0, PANEL_W, PANEL_H, Some(BLACK), None);
        c.text(
            x0 + PANEL_W / 2.0,
            y0 - 12.0,
            &self.title,
            TEXT,
            Anchor::Middle,
            false,
        );
        c.text(
            x0 + PANEL_W / 2.0,
            y0 + PANEL_H + 46.0,
            &self.x_label,
            TEXT,
            Anchor::Middle,
            false,
        );
        c.text(
            x0 - 52.0,
            y0 + PANEL_H / 2.0,
            &self.y_label,
            TEXT,
            Anchor::Middle,
            true,
        );
        for (i, s) in self.series.iter().enumerate() {
            let pts: Vec<(f32, f32)> = s.points.iter().map(|&(x, y)| (px(x), py(y))).collect();
            // Bars of series that share an x sit side by side rather than on top of each other.
            let shift = (i as f32 - (self.series.len() as f32 - 1.0) / 2.0) * 3.0;
            for (&(x, _), &(lo, hi)) in pts.iter().zip(&s.intervals) {
                let (x, top, bottom) = (x + shift, py(hi), py(lo));
                c.polyline(&[(x, top), (x, bottom)], s.color, 1.5, Dash::Solid);
                for y in [top, bottom] {
                    c.polyline(&[(x - 4.0, y), (x + 4.0, y)], s.color, 1.5, Dash::Solid);
                }
            }
            c.polyline(&pts, s.color, 2.5, s.dash);
            for &(x, y) in &pts {
                c.marker(x, y, 3.5, s.color);
            }
        }
    }
}

/// The title's font size, where it fits.
const TITLE_SIZE: f32 = 20.0;

/// Short legend names for model paths: the file stem of each (for a training run's best
/// checkpoint, `RUN/model`, the run's folder and the folder above it: `jem-attempts/ad`), or
/// the whole path where those collide.
pub fn model_labels<S: AsRef<str>>(models: &[S]) -> Vec<String> {
    let stem = |m: &str| {
        let path = Path::new(m);
        let name = |p: &Path| p.file_name().map(|s| s.to_string_lossy().into_owned());
        let run = path
            .parent()
            .filter(|_| path.file_stem().is_some_and(|s| s == "model"));
        match run.and_then(|r| Some((r.parent().and_then(name), name(r)?))) {
            Some((Some(above), run)) => format!("{above}/{run}"),
            Some((None, run)) => run,
            None => path
                .file_stem()
                .map_or(m.to_string(), |s| s.to_string_lossy().into_owned()),
        }
    };
    let stems: Vec<String> = models.iter().map(|m| stem(m.as_ref())).collect();
    models
        .iter()
        .zip(&stems)
        .map(|(m, s)| {
            if stems.iter().filter(|t| *t == s).count() > 1 {
                m.as_ref().to_string()
            } else {
                s.clone()
            }
        })
        .collect()
}

/// Round tick positions covering [lo, hi]: steps of 1, 2, 2.5 or 5 × 10^k, 4 to 8 of them.
pub fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = hi - lo;
    if !span.is_finite() || span <= 0.0 {
        return vec![lo];
    }
    let magnitude = 10f64.powf((span / 5.0).log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| span / s <= 8.0)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick value without trailing zeros: 0.1, not 0.100000001.
fn tick_label(v: f64) -> String {
    let s = format!("{:.4}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_short_and_a_run_is_named_by_its_folders() {
        let labels = model_labels(&[
            "results/models/jem",
            "runs/jem-attempts/ad/model",
            "runs/a/baseline.safetensors",
        ]);
        assert_eq!(
            labels,
            ["jem", "jem-attempts/ad", "baseline"].map(String::from)
        );
        // … unless two collide: then the whole paths.
        let labels = model_labels(&["a/jem", "b/jem", "model"]);
        assert_eq!(labels, ["a/jem", "b/jem", "model"].map(String::from));
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let t = ticks(0.0, 0.3);
        assert_eq!(t.len(), 7, "{t:?}");
        assert!((t[6] - 0.3).abs() < 1e-12);
        assert_eq!(tick_label(t[1]), "0.05");
        assert_eq!(ticks(0.0, 3.0), vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    }

    fn one_bar(range: Option<(f64, f64)>) -> Figure {
        Figure {
            title: String::new(),
            columns: 1,
            panels: vec![Panel {
                x_range: range,
                y_range: range,
                bars: vec![Bars {
                    label: "bar".into(),
                    fill: Some([255, 0, 0]),
                    stroke: None,
                    rects: vec![BarRect {
                        x: (0.0, 0.5),
                        y: (0.0, 2.0),
                    }],
                }],
                ..Panel::default()
            }],
        }
    }

    #[test]
    fn bars_fit_the_axes_are_cut_at_the_frame_and_enter_the_legend() {
        let ((xa, xb), (ya, yb)) = one_bar(None).panels[0].ranges();
        assert_eq!((xa, xb, ya, yb), (0.0, 0.5, 0.0, 2.0));
        // On fixed [0, 1] axes the bar covers the left half of the panel, cut at its top.
        let svg = one_bar(Some((0.0, 1.0))).to_svg();
        let (x, y) = (MARGIN_L, TITLE_H + MARGIN_T);
        let expected = format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{PANEL_H:.1}\" fill=\"#ff0000\"",
            PANEL_W / 2.0
        );
        assert!(svg.contains(&expected), "{expected} not in {svg}");
        // Drawn twice: the bar and its legend box.
        assert_eq!(svg.matches("fill=\"#ff0000\"").count(), 2, "{svg}");
        assert!(svg.contains(">bar</text>"));
        assert!(one_bar(None).to_png().is_ok());
    }
}
