//! `--save-adversarials`: a cell's returned inputs at each ε, as safetensors with the clean
//! images, labels, test-set indices and broken flags (its metadata naming the cell, ε and sweep),
//! and a picture of a few breaks.

use jem_attacks::AttackOutcome;

use super::work::Loaded;
use crate::harness::cells::Cell;
use crate::model::write_atomic;

/// `--save-adversarials`: the inputs an attack returned for the examples at `rows` (of the
/// sweep's examples) at one ε, and a picture of a few breaks. The file's metadata records the
/// cell, the ε and the sweep's identity (`identity`).
pub(in crate::harness) fn save_adversarials(
    out: &std::path::Path,
    identity: &str,
    cell: &Cell,
    eps: Option<f32>,
    loaded: &Loaded,
    rows: &[usize],
    outcome: &AttackOutcome,
) -> anyhow::Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let out = out.join("adversarials");
    let [n, c, h, w] = outcome.shape;
    let indices: Vec<usize> = rows.iter().map(|&r| loaded.indices[r]).collect();
    let clean: Vec<f32> = indices
        .iter()
        .flat_map(|&i| loaded.data.image(i).iter().copied())
        .collect();
    let labels: Vec<u8> = indices.iter().map(|&i| loaded.data.labels[i]).collect();
    let examples: Vec<u32> = indices.iter().map(|&i| i as u32).collect();
    let broken: Vec<u8> = outcome
        .examples
        .iter()
        .map(|e| u8::from(e.adversarial))
        .collect();
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let u32_bytes = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (inputs_b, clean_b, examples_b) = (
        f32_bytes(&outcome.inputs),
        f32_bytes(&clean),
        u32_bytes(&examples),
    );
    fn view(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> anyhow::Result<TensorView<'_>> {
        TensorView::new(dtype, shape, data).map_err(|e| anyhow::anyhow!("{e}"))
    }
    let tensors = vec![
        ("inputs", view(Dtype::F32, vec![n, c, h, w], &inputs_b)?),
        ("clean", view(Dtype::F32, vec![n, c, h, w], &clean_b)?),
        ("labels", view(Dtype::U8, vec![n], &labels)?),
        ("examples", view(Dtype::U32, vec![n], &examples_b)?),
        ("adversarial", view(Dtype::U8, vec![n], &broken)?),
    ];
    let metadata = std::collections::HashMap::from([
        ("cell".to_string(), serde_json::to_string(cell)?),
        ("eps".to_string(), serde_json::to_string(&eps)?),
        ("sweep".to_string(), identity.to_string()),
    ]);
    let bytes = safetensors::serialize(tensors, Some(metadata))?;
    // Cell ids contain dots (`eps0.2`): append the extension rather than replace one.
    let stem = match eps {
        Some(e) => format!("{}.eps{e}", cell.id()),
        None => cell.id(),
    };
    let file = |ext: &str| out.join(format!("{stem}.{ext}"));
    write_atomic(&file("safetensors"), &bytes)?;
    let len = c * h * w;
    let shown: Vec<usize> = (0..n).filter(|&i| broken[i] == 1).take(8).collect();
    if !shown.is_empty() {
        let mut pixels = Vec::with_capacity(2 * shown.len() * len);
        for source in [&clean, &outcome.inputs] {
            for &i in &shown {
                pixels.extend_from_slice(&source[i * len..(i + 1) * len]);
            }
        }
        let batch = crate::image_grid::ImageBatch {
            pixels: &pixels,
            channels: c,
            height: h,
            width: w,
        };
        crate::image_grid::write_grid(&file("png"), &batch, 2, shown.len())?;
    }
    Ok(())
}
