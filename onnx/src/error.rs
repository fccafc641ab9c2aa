//! The one error type of loading an ONNX file: what went wrong ([`ErrorKind`]) and in which file.

use std::fmt;
use std::path::PathBuf;

/// Why an ONNX file could not be loaded, with the file's path where there is one.
#[derive(Debug)]
pub struct OnnxError {
    /// The file (absent for models parsed from bytes).
    pub path: Option<PathBuf>,
    /// What went wrong.
    pub kind: ErrorKind,
}

/// What went wrong while loading an ONNX file.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Io(#[source] std::io::Error),

    /// The bytes are not an ONNX model: a corrupt or truncated file.
    #[error("not a valid ONNX model (corrupt or truncated file?): {0}")]
    Corrupt(String),

    /// The model's opset of the default domain is missing or too old.
    #[error("{0}")]
    Opset(String),

    /// A node whose operator is outside the supported set.
    #[error(
        "node '{node}': operator '{op_type}'{} is not supported; supported operators: {supported}",
        if domain.is_empty() { String::new() } else { format!(" of domain '{domain}'") }
    )]
    UnsupportedOperator {
        /// The ONNX operator, e.g. `Round`.
        op_type: String,
        /// Its domain (empty for the default ONNX domain).
        domain: String,
        /// The node's name in the file (or its position, where it has none).
        node: String,
        /// The supported operators, comma-separated.
        supported: String,
    },

    /// A dimension of the input other than the batch is dynamic.
    #[error(
        "input '{input}' has a dynamic dimension {axis} ('{dim}'); only the batch dimension (0) \
         may be dynamic: export with dynamic_axes for the batch only"
    )]
    DynamicDimension {
        /// The graph input.
        input: String,
        /// Which dimension (1, 2 or 3 of N, C, H, W).
        axis: usize,
        /// Its symbolic name, or `?` where it has none.
        dim: String,
    },

    /// The graph's input is not one `[N, C, H, W]` float tensor.
    #[error("graph input: {0}")]
    Input(String),

    /// The graph's output is not one `[N, K]` tensor.
    #[error("graph output: {0}")]
    Output(String),

    /// A node that is malformed, or uses a supported operator in an unsupported way.
    #[error("node '{node}' ({op_type}): {message}")]
    Node {
        /// The node's name in the file (or its position).
        node: String,
        /// Its operator.
        op_type: String,
        /// What is wrong.
        message: String,
    },

    /// A stored tensor (initializer or constant) that cannot be decoded.
    #[error("tensor '{name}': {message}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

impl OnnxError {
    pub(crate) fn new(kind: ErrorKind) -> Self {
        Self { path: None, kind }
    }

    pub(crate) fn in_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }
}

impl From<ErrorKind> for OnnxError {
    fn from(kind: ErrorKind) -> Self {
        Self::new(kind)
    }
}

impl fmt::Display for OnnxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {}", p.display(), self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl std::error::Error for OnnxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}
