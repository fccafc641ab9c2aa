//! The network a benchmark row times: a seeded Wide-ResNet of the shape asked for, or a model
//! from a file (a checkpoint, a graph imported from ONNX, or a bare `.onnx` file), with what
//! the row records of it.

use super::BenchSpec;
use crate::backend::BenchBackend;
use crate::model::{
    InputNormalization, LoadedNetwork, ModelInfo, ModelSidecar, OnnxCheckpoint, WideResNet,
    WideResNetConfig,
};
use crate::settings;

/// The network a row times, with what the row records of it.
pub(super) struct Timed<B: BenchBackend> {
    pub(super) network: LoadedNetwork<B>,
    /// `WRN-10-1`, or `ONNX FILE`.
    pub(super) name: String,
    /// `[C, H, W]` of its images.
    pub(super) shape: [usize; 3],
    /// Its pixels' scale, on which the SGLD steps are stated.
    pub(super) normalization: InputNormalization,
    /// Forward FLOPs of one image; `None` for a graph.
    pub(super) flops_per_image: Option<u64>,
    /// Logits per image: the random labels of the rows that need them are below it.
    pub(super) classes: usize,
}

/// The seeded Wide-ResNet `args` describes, or the network of `args.model`.
pub(super) fn timed_network<B: BenchBackend>(
    args: &BenchSpec,
    device: &B::Device,
) -> anyhow::Result<Timed<B>> {
    let wrn = |network: WideResNet<B>, [c, h, w]: [usize; 3]| -> anyhow::Result<Timed<B>> {
        let cfg = network.config().clone();
        Ok(Timed {
            name: cfg.name(),
            shape: [c, h, w],
            normalization: cfg.input_normalization.clone(),
            flops_per_image: Some(cfg.forward_flops(h, w)?),
            classes: cfg.num_classes,
            network: LoadedNetwork::Wrn(network),
        })
    };
    let Some(path) = &args.model else {
        let cfg =
            WideResNetConfig::of_layout(args.layout, args.depth, args.width, args.channels, 10);
        cfg.blocks_per_stage()
            .map_err(|e| anyhow::anyhow!("--depth {}: {e}", args.depth))?;
        let network = cfg.init_seeded::<B>(0, device)?;
        return wrn(network, [args.channels, args.size, args.size]);
    };
    let file_name = |p: &std::path::Path| {
        p.file_name()
            .map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into())
    };
    let bare_graph = path.extension().is_some_and(|e| e == "onnx")
        && OnnxCheckpoint::find(path).is_some_and(|c| !c.sidecar.exists());
    if bare_graph {
        let network = jem_onnx::OnnxNetwork::<B>::load(path, device)
            .map_err(|e| settings::refusal("model", path.display(), e.into()))?;
        let shape = network.graph().input_shape();
        return Ok(Timed {
            name: format!("ONNX {}", file_name(path)),
            shape,
            normalization: InputNormalization {
                mean: vec![0.0; shape[0]],
                std: vec![1.0; shape[0]],
            },
            flops_per_image: None,
            classes: network.graph().classes(),
            network: LoadedNetwork::Onnx(network),
        });
    }
    let (network, info) = ModelInfo::load_setting::<B>(path, "model", device)?;
    let shape = info.image_shape()?;
    match (network, &info.sidecar) {
        (LoadedNetwork::Wrn(network), _) => wrn(network, shape),
        (network, ModelSidecar::Onnx(_)) => Ok(Timed {
            name: format!("ONNX {}", file_name(&info.file)),
            shape,
            normalization: info.input_normalization(),
            flops_per_image: None,
            classes: info.classes(),
            network,
        }),
        (LoadedNetwork::Onnx(_), ModelSidecar::Wrn(_)) => {
            unreachable!("a Wide-ResNet sidecar loads a Wide-ResNet")
        }
    }
}
