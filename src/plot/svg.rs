//! The SVG canvas: one element per drawing call; text stays text (sans-serif), so the figure
//! scales and its labels can be searched and edited.

use std::fmt::Write;

use super::{Anchor, Canvas, Dash, Rgb};

pub(crate) struct SvgCanvas {
    body: String,
    width: u32,
    height: u32,
}

fn hex(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl SvgCanvas {
    pub fn new(width: u32, height: u32) -> Self {
        Self {
            body: String::new(),
            width,
            height,
        }
    }

    pub fn finish(self) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" \
             width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"DejaVu Sans, Arial, \
             sans-serif\">\n{}</svg>\n",
            self.body,
            w = self.width,
            h = self.height
        )
    }
}

impl Canvas for SvgCanvas {
    fn polyline(&mut self, points: &[(f32, f32)], color: Rgb, width: f32, dash: Dash) {
        if points.is_empty() {
            return;
        }
        let pts: Vec<String> = points
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let pattern = dash.pattern();
        let dasharray = if pattern.is_empty() {
            String::new()
        } else {
            let p: Vec<String> = pattern.iter().map(|v| v.to_string()).collect();
            format!(" stroke-dasharray=\"{}\"", p.join(" "))
        };
        let _ = writeln!(
            self.body,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{width}\"{dasharray}/>",
            pts.join(" "),
            hex(color)
        );
    }

    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, stroke: Option<Rgb>, fill: Option<Rgb>) {
        let _ = writeln!(
            self.body,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{}\" stroke=\"{}\"/>",
            fill.map_or("none".into(), hex),
            stroke.map_or("none".into(), hex)
        );
    }

    fn marker(&mut self, x: f32, y: f32, radius: f32, color: Rgb) {
        let _ = writeln!(
            self.body,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{radius}\" fill=\"{}\"/>",
            hex(color)
        );
    }

    fn text(&mut self, x: f32, y: f32, s: &str, size: f32, anchor: Anchor, vertical: bool) {
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let rotate = if vertical {
            format!(" transform=\"rotate(-90 {x:.1} {y:.1})\"")
        } else {
            String::new()
        };
        let _ = writeln!(
            self.body,
            "<text x=\"{x:.1}\" y=\"{y:.1}\" font-size=\"{size}\" text-anchor=\"{anchor}\"{rotate}>{}</text>",
            escape(s)
        );
    }
}
