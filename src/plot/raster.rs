//! The raster canvas: draws into an RGB image and encodes it as PNG. Text uses the public-domain
//! 8×8 bitmap font of the `font8x8` crate, scaled by whole pixels, so no font file or system
//! library is needed; characters the font lacks are spelled out (∞ → "inf") or shown as '?'.

use font8x8::{UnicodeFonts, BASIC_FONTS, GREEK_FONTS, LATIN_FONTS};

use super::{Anchor, Canvas, Dash, Rgb};

pub(crate) struct RasterCanvas {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

fn glyph(c: char) -> [u8; 8] {
    BASIC_FONTS
        .get(c)
        .or_else(|| GREEK_FONTS.get(c))
        .or_else(|| LATIN_FONTS.get(c))
        .or_else(|| BASIC_FONTS.get('?'))
        .unwrap_or([0; 8])
}

/// Characters of the labels that the bitmap font lacks, written out.
fn spell_out(s: &str) -> String {
    s.replace('∞', "inf").replace('×', "x").replace('≥', ">=")
}

impl RasterCanvas {
    pub fn new(width: u32, height: u32) -> Self {
        let (width, height) = (width as usize, height as usize);
        Self {
            width,
            height,
            rgb: vec![255; width * height * 3],
        }
    }

    pub fn encode_png(&self) -> anyhow::Result<Vec<u8>> {
        crate::image_grid::encode_png(&self.rgb, self.width as u32, self.height as u32, 3)
    }

    fn put(&mut self, x: i64, y: i64, c: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < self.width && (y as usize) < self.height {
            let i = (y as usize * self.width + x as usize) * 3;
            self.rgb[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A filled disc; radius below one pixel draws the pixel itself.
    fn disc(&mut self, x: f32, y: f32, r: f32, c: Rgb) {
        let reach = r.ceil() as i64;
        let (cx, cy) = (x.round() as i64, y.round() as i64);
        for dy in -reach..=reach {
            for dx in -reach..=reach {
                let (px, py) = ((cx + dx) as f32, (cy + dy) as f32);
                if (px - x).powi(2) + (py - y).powi(2) <= r * r + 0.25 {
                    self.put(cx + dx, cy + dy, c);
                }
            }
        }
    }
}

impl Canvas for RasterCanvas {
    fn polyline(&mut self, points: &[(f32, f32)], color: Rgb, width: f32, dash: Dash) {
        let pattern = dash.pattern();
        let period: f32 = pattern.iter().sum();
        // Distance along the whole line, so dashes continue across vertices.
        let mut travelled = 0.0f32;
        let on = |t: f32| {
            if pattern.is_empty() {
                return true;
            }
            let mut phase = t % period;
            for (i, len) in pattern.iter().enumerate() {
                if phase < *len {
                    return i % 2 == 0;
                }
                phase -= len;
            }
            false
        };
        for pair in points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            let len = ((x1 - x0).powi(2) + (y1 - y0).powi(2)).sqrt();
            let steps = (len * 2.0).ceil().max(1.0) as usize;
            for s in 0..=steps {
                let f = s as f32 / steps as f32;
                if on(travelled + f * len) {
                    self.disc(x0 + f * (x1 - x0), y0 + f * (y1 - y0), width / 2.0, color);
                }
            }
            travelled += len;
        }
    }

    fn rect(&mut self, x: f32, y: f32, w: f32, h: f32, stroke: Option<Rgb>, fill: Option<Rgb>) {
        if let Some(c) = fill {
            for py in y.round() as i64..(y + h).round() as i64 {
                for px in x.round() as i64..(x + w).round() as i64 {
                    self.put(px, py, c);
                }
            }
        }
        if let Some(c) = stroke {
            let corners = [(x, y), (x + w, y), (x + w, y + h), (x, y + h), (x, y)];
            self.polyline(&corners, c, 1.0, Dash::Solid);
        }
    }

    fn marker(&mut self, x: f32, y: f32, radius: f32, color: Rgb) {
        self.disc(x, y, radius, color);
    }

    fn text(&mut self, x: f32, y: f32, s: &str, size: f32, anchor: Anchor, vertical: bool) {
        let chars: Vec<char> = spell_out(s).chars().collect();
        let scale = (size / 8.0).round().max(1.0) as i64;
        let length = chars.len() as i64 * 8 * scale;
        let start = match anchor {
            Anchor::Start => 0,
            Anchor::Middle => -length / 2,
            Anchor::End => -length,
        };
        let (x, y) = (x.round() as i64, y.round() as i64);
        for (i, &c) in chars.iter().enumerate() {
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..8 {
                    if bits >> col & 1 == 0 {
                        continue;
                    }
                    for sy in 0..scale {
                        for sx in 0..scale {
                            // u along the text, v down from the baseline (glyph row 7).
                            let u = start + (i as i64 * 8 + col) * scale + sx;
                            let v = (row as i64 - 7) * scale + sy;
                            let (px, py) = if vertical {
                                (x + v, y - u)
                            } else {
                                (x + u, y + v)
                            };
                            self.put(px, py, [0, 0, 0]);
                        }
                    }
                }
            }
        }
    }
}
