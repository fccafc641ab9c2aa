//! jem-onnx: PyTorch classifiers exported to ONNX (`torch.onnx.export`, opset 13 and later),
//! run by jem-bench on burn tensors, differentiably.
//!
//! [`OnnxModel::load`] reads a file (protobuf decoded with onnx-ir's bindings), refuses what it
//! cannot run — an operator outside [`SUPPORTED_OPERATORS`] (the error names the operator, the
//! node and the supported set), a dynamic dimension other than the batch, an input that is not
//! `[N, C, H, W]` or an output that is not `[N, K]`, a corrupt or truncated file (the error
//! names the file) — and folds the exporter's shape arithmetic (`Shape`, `Gather`, `Slice`,
//! `Concat`, `Unsqueeze`, `Reshape` targets, ...) to constants, symbolically in the batch size.
//! The resulting [`OnnxGraph`] becomes an [`OnnxNetwork`] on a device: its weights as burn
//! tensors and a forward pass that interprets the graph with burn tensor operations only, so
//! burn's autodiff gives input gradients — and gradients of gradients, with
//! `Autodiff<Autodiff<B>>` — on any backend. [`OnnxNetwork`] implements
//! [`jem_attacks::Classifier`]; pixels are in [0, 1], and a per-channel [`Normalisation`] can
//! be applied before the graph for networks exported without theirs.
//!
//! Every operator also has a tangent rule, so the interpreter runs in forward mode too:
//! [`OnnxNetwork::jacobian_vector_product`] gives f(x) and J(x) v in one pass, differentiable in
//! x and v (reverse mode over it gives exact Hessian-vector products with single-level
//! autodiff: the SGLD defence's gradients through its steps, smooth networks included), and a
//! graph that is piecewise linear in its input ([`OnnxGraph::is_piecewise_linear`]: ReLU,
//! max-pooling, BatchNorm, …) linearises exactly at a point ([`OnnxNetwork::linearise`]).
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::Tensor;
//! use jem_onnx::{OnnxModel, OnnxNetwork};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/onnx/small_cnn_mnist.onnx");
//! let graph = OnnxModel::load(path)?;
//! assert_eq!((graph.input_shape(), graph.classes()), ([1, 28, 28], 10));
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let net = OnnxNetwork::<B>::new(graph, &device);
//! let x = Tensor::<B, 4>::full([2, 1, 28, 28], 0.5, &device).require_grad();
//! let logits = net.logits(x.clone());
//! assert_eq!(logits.dims(), [2, 10]);
//!
//! // The input gradient of the summed logits, through autodiff.
//! let grads = logits.sum().backward();
//! assert_eq!(x.grad(&grads).unwrap().dims(), [2, 1, 28, 28]);
//! # Ok::<(), jem_onnx::OnnxError>(())
//! ```

#![warn(missing_docs)]

mod compile;
mod error;
mod fuse;
mod graph;
mod host;
mod load;
mod network;
mod ops;
mod sym;
mod tangent;

pub use error::{ErrorKind, OnnxError};
pub use graph::{OnnxGraph, OnnxModel, MIN_OPSET};
pub use network::{Normalisation, OnnxNetwork};
pub use ops::SUPPORTED_OPERATORS;
