//! What the loader must refuse, with errors that say what and where: an unsupported operator
//! (op type, node name, supported list), a dynamic spatial dimension, a batch size baked into
//! the export, corrupt, truncated and missing files (named) — and never a panic. Also the
//! `Classifier` implementation and the input normalisation.

use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use jem_attacks::{input_gradient, log_sum_exp};
use jem_onnx::{ErrorKind, Normalisation, OnnxModel, OnnxNetwork, SUPPORTED_OPERATORS};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(name)
}

/// A file of this test's own under the system's temporary folder.
fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("jem-onnx-{}-{name}", std::process::id()))
}

#[test]
fn unsupported_operator_is_named_with_its_node() {
    let path = fixture("unsupported_round.onnx");
    let err = OnnxModel::load(&path).unwrap_err();
    println!("{err}");
    match &err.kind {
        ErrorKind::UnsupportedOperator {
            op_type,
            node,
            domain,
            supported,
        } => {
            assert_eq!(op_type, "Round");
            assert_eq!(node, "/Round");
            assert!(domain.is_empty());
            assert_eq!(supported, &SUPPORTED_OPERATORS.join(", "));
        }
        other => panic!("expected an unsupported operator, got {other:?}"),
    }
    let message = err.to_string();
    for part in [
        "operator 'Round'",
        "node '/Round'",
        "supported operators: Abs, Add,",
        "unsupported_round.onnx",
    ] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
}

#[test]
fn dynamic_spatial_dimension_is_refused() {
    let err = OnnxModel::load(fixture("dynamic_spatial.onnx")).unwrap_err();
    println!("{err}");
    match &err.kind {
        ErrorKind::DynamicDimension { input, axis, dim } => {
            assert_eq!(
                (input.as_str(), *axis, dim.as_str()),
                ("input", 2, "height")
            );
        }
        other => panic!("expected a dynamic dimension, got {other:?}"),
    }
    assert!(err.to_string().contains("dynamic_spatial.onnx"));
}

#[test]
fn batch_size_baked_into_the_export_is_refused() {
    // Exported without dynamic axes: `view(x.size(0), -1)` became a Reshape to [1, -1], which
    // folds the batch into the features, and the Linear layer's Gemm cannot take 4N of them.
    let err = OnnxModel::load(fixture("fixed_batch.onnx")).unwrap_err();
    println!("{err}");
    match &err.kind {
        ErrorKind::Node {
            op_type, message, ..
        } => {
            assert_eq!(op_type, "Gemm");
            assert!(
                message.contains("4N") && message.contains("dynamic_axes"),
                "{message}"
            );
        }
        other => panic!("expected a refusal at the Gemm, got {other:?}"),
    }
}

#[test]
fn truncated_files_are_refused_naming_the_file() {
    let bytes = std::fs::read(fixture("vit_tiny.onnx")).unwrap();
    let path = scratch("truncated.onnx");
    let n = bytes.len();
    for cut in [0, 1, 7, 100, 1000, n / 3, n / 2, n - 100, n - 1] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let err = OnnxModel::load(&path).expect_err("a truncated file loads");
        let message = err.to_string();
        assert!(
            message.contains(&*path.to_string_lossy()),
            "cut at {cut}: {message}"
        );
    }
    std::fs::write(&path, &bytes[..n / 2]).unwrap();
    let err = OnnxModel::load(&path).unwrap_err();
    println!("{err}");
    assert!(matches!(err.kind, ErrorKind::Corrupt(_)), "{err}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn corrupt_bytes_and_missing_files_are_errors() {
    // Flipped bytes across a real file: an error or a model, never a panic.
    let bytes = std::fs::read(fixture("small_cnn_mnist.onnx")).unwrap();
    for (i, step) in [(13usize, 997usize), (5, 4099), (1, 65537)] {
        let mut b = bytes.clone();
        for j in (i..b.len()).step_by(step) {
            b[j] ^= 0x5a;
        }
        let _ = OnnxModel::from_bytes(&b);
    }
    assert!(matches!(
        OnnxModel::from_bytes(b"not an onnx file").unwrap_err().kind,
        ErrorKind::Corrupt(_)
    ));
    let missing = scratch("missing.onnx");
    let err = OnnxModel::load(&missing).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::Io(_)));
    assert!(err.to_string().contains("missing.onnx"));
}

#[test]
fn classifier_trait_and_normalisation() {
    type B = Autodiff<Flex>;
    let device = Default::default();
    let graph = OnnxModel::load(fixture("jem_wrn.onnx")).unwrap();
    assert_eq!((graph.input_shape(), graph.classes()), ([3, 32, 32], 10));
    let net = OnnxNetwork::<B>::new(graph, &device);
    let half = Normalisation {
        mean: vec![0.5; 3],
        std: vec![0.5; 3],
    };
    assert!(net
        .clone()
        .with_normalisation(Some(Normalisation {
            mean: vec![0.5],
            std: vec![0.5]
        }))
        .is_err());
    let normalised = net.clone().with_normalisation(Some(half.clone())).unwrap();
    assert_eq!(normalised.normalisation(), Some(&half));

    // (x − 0.5) / 0.5 before the graph is the graph at 2x − 1.
    let x: Vec<f32> = (0..2 * 3 * 32 * 32)
        .map(|i| ((i * 37) % 101) as f32 / 100.0)
        .collect();
    let shifted: Vec<f32> = x.iter().map(|v| 2.0 * v - 1.0).collect();
    let t = |v: Vec<f32>| Tensor::<Flex, 4>::from_data(TensorData::new(v, [2, 3, 32, 32]), &device);
    let (g, logits) = input_gradient::<B, _>(&normalised, t(x), log_sum_exp);
    let (g0, logits0) = input_gradient::<B, _>(&net, t(shifted), log_sum_exp);
    let close = |a: Tensor<Flex, 2>, b: Tensor<Flex, 2>| (a - b).abs().max().into_scalar() < 1e-5;
    assert!(close(logits, logits0));
    // The chain rule's factor 1 / std.
    assert!(close(
        g.reshape([2, 3072]),
        g0.mul_scalar(2.0).reshape([2, 3072])
    ));
}
