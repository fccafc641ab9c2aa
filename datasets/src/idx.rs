//! The IDX format of MNIST and Fashion-MNIST (raw or gzipped; gzip is detected by its magic
//! bytes, not by the file name).
//!
//! Header: two zero bytes, a type byte (0x08 = u8), a dimension count, then one big-endian u32
//! per dimension. Images have 3 dimensions (magic 0x00000803), labels 1 (0x00000801).

use std::io::Read;
use std::path::Path;

use crate::{DatasetError, ImageSet, Result};

/// Raw images of an IDX file, before conversion to [0, 1].
pub struct IdxImages {
    /// Number of images (the first dimension).
    pub count: usize,
    /// Image height in pixels (the second dimension).
    pub rows: usize,
    /// Image width in pixels (the third dimension).
    pub cols: usize,
    /// `count · rows · cols` bytes, 0–255, image after image, row-major.
    pub pixels: Vec<u8>,
}

/// Reads a whole file, inflating it when it starts with the gzip magic.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let io = |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    decode_maybe_gz(path, raw)
}

pub(crate) fn decode_maybe_gz(path: &Path, raw: Vec<u8>) -> Result<Vec<u8>> {
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|source| DatasetError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks the magic number and returns the dimensions of an IDX payload.
fn parse_header(path: &Path, bytes: &[u8], want_dims: usize) -> Result<(Vec<usize>, usize)> {
    let header_len = 4 + 4 * want_dims;
    if bytes.len() < header_len {
        return Err(DatasetError::format(
            path,
            "header",
            format!("at least {header_len} bytes"),
            format!("{} bytes (file truncated)", bytes.len()),
        ));
    }
    let magic = be_u32(bytes, 0);
    let want_magic = 0x0000_0800 | want_dims as u32;
    if magic != want_magic {
        return Err(DatasetError::format(
            path,
            "magic",
            format!("{want_magic:#010x} (IDX, u8, {want_dims} dimension(s))"),
            format!("{magic:#010x}"),
        ));
    }
    let dims: Vec<usize> = (0..want_dims)
        .map(|d| be_u32(bytes, 4 + 4 * d) as usize)
        .collect();
    let payload: usize = dims.iter().product();
    if bytes.len() != header_len + payload {
        return Err(DatasetError::format(
            path,
            "payload",
            format!("{payload} bytes for dimensions {dims:?}"),
            format!(
                "{} bytes{}",
                bytes.len() - header_len,
                if bytes.len() < header_len + payload {
                    " (file truncated)"
                } else {
                    " (trailing data)"
                }
            ),
        ));
    }
    Ok((dims, header_len))
}

/// Parses an IDX image file already in memory (`path` is only used in errors).
pub(crate) fn parse_idx_images(path: &Path, bytes: &[u8]) -> Result<IdxImages> {
    let (dims, start) = parse_header(path, bytes, 3)?;
    Ok(IdxImages {
        count: dims[0],
        rows: dims[1],
        cols: dims[2],
        pixels: bytes[start..].to_vec(),
    })
}

/// Parses an IDX label file already in memory, checking every label is below `num_classes`.
pub(crate) fn parse_idx_labels(path: &Path, bytes: &[u8], num_classes: usize) -> Result<Vec<u8>> {
    let (_, start) = parse_header(path, bytes, 1)?;
    let labels = bytes[start..].to_vec();
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= num_classes)
    {
        return Err(DatasetError::format(
            path,
            "label",
            format!("a class index below {num_classes}"),
            format!("{l} at record {i}"),
        ));
    }
    Ok(labels)
}

/// Reads an IDX image file (magic 0x00000803), raw or gzipped.
pub fn read_idx_images(path: &Path) -> Result<IdxImages> {
    parse_idx_images(path, &read_maybe_gz(path)?)
}

/// Reads an IDX label file (magic 0x00000801), raw or gzipped.
pub fn read_idx_labels(path: &Path, num_classes: usize) -> Result<Vec<u8>> {
    parse_idx_labels(path, &read_maybe_gz(path)?, num_classes)
}

/// Joins an image file and a label file into an [`ImageSet`], checking that the counts agree.
pub(crate) fn join_idx(
    name: String,
    images_path: &Path,
    images: IdxImages,
    labels_path: &Path,
    labels: Vec<u8>,
    class_names: &[&str],
) -> Result<ImageSet> {
    if images.count != labels.len() {
        return Err(DatasetError::format(
            labels_path,
            "count",
            format!(
                "{} labels, as many as images in {}",
                images.count,
                images_path.display()
            ),
            format!("{} labels", labels.len()),
        ));
    }
    Ok(ImageSet {
        name,
        images: images.pixels.iter().map(|&p| p as f32 / 255.0).collect(),
        labels,
        channels: 1,
        height: images.rows,
        width: images.cols,
        class_names: class_names.iter().map(|s| s.to_string()).collect(),
    })
}

/// Loads an image file and its label file.
pub fn load_idx_pair(
    name: impl Into<String>,
    images_path: &Path,
    labels_path: &Path,
    class_names: &[&str],
) -> Result<ImageSet> {
    let images = read_idx_images(images_path)?;
    let labels = read_idx_labels(labels_path, class_names.len())?;
    join_idx(
        name.into(),
        images_path,
        images,
        labels_path,
        labels,
        class_names,
    )
}
