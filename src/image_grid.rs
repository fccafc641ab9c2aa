//! PNG grids of images (samples, nonsense inputs): one image per cell, rows × columns, with a
//! thin separator, pixels clipped to [0, 1]. Written atomically.

use std::path::Path;

use anyhow::Context;

/// Images `[N, C, H, W]` row-major in [0, 1] (values outside are clipped), C = 1 or 3.
pub struct ImageBatch<'a> {
    pub pixels: &'a [f32],
    pub channels: usize,
    pub height: usize,
    pub width: usize,
}

/// Writes `rows × cols` cells to `path` (see [`grid_png`]).
pub fn write_grid(
    path: &Path,
    images: &ImageBatch,
    rows: usize,
    cols: usize,
) -> anyhow::Result<()> {
    let bytes = grid_png(images, rows, cols)?;
    crate::model::write_atomic(path, &bytes)
        .with_context(|| format!("cannot write the image grid {}", path.display()))
}

/// A PNG of `rows × cols` cells; cell (r, c) shows image `r * cols + c`, empty when missing.
pub fn grid_png(images: &ImageBatch, rows: usize, cols: usize) -> anyhow::Result<Vec<u8>> {
    let (c, h, w) = (images.channels, images.height, images.width);
    anyhow::ensure!(c == 1 || c == 3, "a grid needs 1 or 3 channels, not {c}");
    const GAP: usize = 2;
    let (gw, gh) = (cols * (w + GAP) + GAP, rows * (h + GAP) + GAP);
    // The separator is mid grey, so that both black and white cells stand out.
    let mut canvas = vec![128u8; gw * gh * c];
    for (i, img) in images
        .pixels
        .chunks_exact(c * h * w)
        .enumerate()
        .take(rows * cols)
    {
        let (r, col) = (i / cols, i % cols);
        let (y0, x0) = (GAP + r * (h + GAP), GAP + col * (w + GAP));
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    let v = img[ch * h * w + y * w + x].clamp(0.0, 1.0);
                    canvas[((y0 + y) * gw + x0 + x) * c + ch] = (v * 255.0).round() as u8;
                }
            }
        }
    }
    encode_png(&canvas, gw as u32, gh as u32, c)
}

/// 8-bit PNG of row-major pixels with 1 (grey) or 3 (RGB) interleaved channels.
pub fn encode_png(
    pixels: &[u8],
    width: u32,
    height: u32,
    channels: usize,
) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(if channels == 1 {
        png::ColorType::Grayscale
    } else {
        png::ColorType::Rgb
    });
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().context("PNG header")?;
    writer.write_image_data(pixels).context("PNG data")?;
    writer.finish().context("PNG end")?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_is_a_valid_png_with_cells_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.png");
        // Three 2×2 grey images: 0, 0.5, 1.
        let pixels: Vec<f32> = [0.0, 0.5, 1.0].iter().flat_map(|&v| [v; 4]).collect();
        let images = ImageBatch {
            pixels: &pixels,
            channels: 1,
            height: 2,
            width: 2,
        };
        write_grid(&path, &images, 2, 2).unwrap();
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (2 * 4 + 2, 2 * 4 + 2));
        let at = |x: usize, y: usize| buf[y * info.width as usize + x];
        assert_eq!(at(2, 2), 0); // image 0
        assert_eq!(at(6, 2), 128); // image 1: 0.5 → 128
        assert_eq!(at(2, 6), 255); // image 2
        assert_eq!(at(0, 0), 128); // separator
        assert_eq!(at(7, 7), 128); // empty cell 3 keeps the background
    }
}
