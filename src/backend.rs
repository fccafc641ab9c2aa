//! The tensor backends the binary runs on: burn's `flex` CPU backend by default, burn's CUDA
//! backend with the cargo feature `cuda`. Everything else is generic over `burn::Backend`.

use burn::backend::Autodiff;

#[cfg(not(feature = "cuda"))]
pub type Inference = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type Inference = burn::backend::Cuda;

/// The inference backend with automatic differentiation, for training and attacks.
pub type Train = Autodiff<Inference>;

pub type Device = burn::tensor::Device<Inference>;

/// The device the binary computes on (the first GPU with `cuda`).
pub fn device() -> Device {
    Device::default()
}

/// Human-readable name of the compiled backend, recorded in outputs.
pub fn name() -> &'static str {
    if cfg!(feature = "cuda") {
        "burn-cuda"
    } else {
        "burn-flex"
    }
}
