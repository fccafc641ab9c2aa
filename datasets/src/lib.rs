//! Image-classification data for jem-bench: MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100.
//!
//! Every loader returns an [`ImageSet`]: images as `f32` in [0, 1], laid out N×C×H×W
//! (channel-major, like PyTorch), `u8` labels, and the class names. The full MNIST and the
//! Fashion-MNIST test set are compiled into the crate ([`embedded`]), so the default job needs no
//! download. Loaders check every header field and report the file, the field and what was
//! expected ([`DatasetError`]).

#![warn(missing_docs)]

mod cifar;
pub mod embedded;
mod error;
mod idx;
mod image_set;
mod source;

pub use cifar::{load_cifar10, load_cifar100, CIFAR100_CLASSES, CIFAR10_CLASSES};
pub use error::DatasetError;
pub use idx::{load_idx_pair, read_idx_images, read_idx_labels, IdxImages};
pub use image_set::ImageSet;
pub use source::{load_mnist_dir, DataSource, Split, FASHION_MNIST_CLASSES, MNIST_CLASSES};

/// Result type of every loader in this crate.
pub type Result<T> = std::result::Result<T, DatasetError>;
