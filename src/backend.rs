//! The tensor backends the binary runs on: burn's `flex` CPU backend by default, burn's CUDA
//! backend with the cargo feature `cuda`. Everything else is generic over `burn::Backend`; the
//! backend is chosen when building (burn's backends are types), the device at run time with
//! `--device` (`cpu`, or `cuda` / `cuda:N` for the N-th GPU of a `cuda` build).

use std::sync::OnceLock;

use burn::backend::Autodiff;

#[cfg(not(feature = "cuda"))]
pub type Inference = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type Inference = burn::backend::Cuda;

/// The inference backend with automatic differentiation, for training and attacks.
pub type Train = Autodiff<Inference>;

pub type Device = burn::tensor::Device<Inference>;

/// A backend every command of the library runs on, generic until `main`: jem-kernels'
/// convolutions and activations with automatic differentiation, and the name outputs record
/// for a device (`burn-flex`, `burn-cuda:0`), so that a result says where it was computed.
pub trait BenchBackend: jem_kernels::KernelsAutodiff {
    /// The backend and device as every output records them.
    fn recorded_name(device: &Self::Device) -> String;
}

impl BenchBackend for Autodiff<burn::backend::Flex> {
    fn recorded_name(_device: &Self::Device) -> String {
        "burn-flex".into()
    }
}

#[cfg(feature = "cuda")]
impl BenchBackend for Autodiff<burn::backend::Cuda> {
    fn recorded_name(device: &Self::Device) -> String {
        format!("burn-cuda:{}", device.index)
    }
}

/// The device `--device` chose, if any.
static SELECTED: OnceLock<(Device, String)> = OnceLock::new();

/// Chooses the device every command computes on, from `--device`: `cpu`, `cuda` (the first
/// GPU) or `cuda:N`. Refused when this build's backend cannot reach it, and when another
/// device was chosen already.
pub fn select(spec: &str) -> anyhow::Result<()> {
    let chosen = parse(spec)?;
    let name = chosen.1.clone();
    SELECTED.set(chosen).or_else(|_| match SELECTED.get() {
        Some((_, previous)) if *previous == name => Ok(()),
        Some((_, previous)) => Err(anyhow::anyhow!(
            "--device {spec}: this process already computes on {previous}"
        )),
        None => unreachable!("set failed, so a value is present"),
    })
}

#[cfg(not(feature = "cuda"))]
fn parse(spec: &str) -> anyhow::Result<(Device, String)> {
    match spec {
        "cpu" => Ok((Device::default(), "cpu".into())),
        s if s == "cuda" || s.starts_with("cuda:") => anyhow::bail!(
            "--device {s}: this jem-bench was built for the CPU; build it with \
             `cargo build --release --features cuda` to compute on a GPU"
        ),
        s => anyhow::bail!("--device {s}: expected cpu, cuda or cuda:N (N = 0, 1, …)"),
    }
}

#[cfg(feature = "cuda")]
fn parse(spec: &str) -> anyhow::Result<(Device, String)> {
    use burn::backend::cuda::CudaDevice;
    let index = match spec {
        "cuda" => 0,
        s if s.starts_with("cuda:") => s["cuda:".len()..].parse::<usize>().map_err(|_| {
            anyhow::anyhow!("--device {s}: expected cuda:N with N a GPU index (0, 1, …)")
        })?,
        "cpu" => anyhow::bail!(
            "--device cpu: this jem-bench was built for CUDA (`--features cuda`); the CPU build \
             is `cargo build --release` without it"
        ),
        s => anyhow::bail!("--device {s}: expected cuda or cuda:N (N = 0, 1, …)"),
    };
    let device = CudaDevice::new(index);
    opens(&device, spec)?;
    // Forward passes were measured equal to the CPU's on an H200; the convolution gradients
    // now come from jem-kernels' construction (proven on the CPU), not yet run on a GPU.
    eprintln!(
        "warning: on CUDA the convolution gradients are computed by a construction checked on \
         the CPU but not yet on a GPU (tests/gpu.rs, scripts/gpu-check.sh; docs/gpu.md): \
         evaluations are verified, attacks, sampling and training on this device are not yet"
    );
    Ok((device, format!("cuda:{index}")))
}

/// Whether `device` answers: burn's CUDA backend panics (with a backtrace) when the driver
/// library is missing or no GPU has that index, so a tiny allocation is tried first, silently,
/// to turn that into an error the user can act on.
#[cfg(feature = "cuda")]
fn opens(device: &burn::backend::cuda::CudaDevice, spec: &str) -> anyhow::Result<()> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(|| {
        burn::tensor::Tensor::<Inference, 1>::zeros([1], device).into_data();
    });
    std::panic::set_hook(hook);
    opened.map_err(|_| {
        anyhow::anyhow!(
            "--device {spec}: no CUDA device could be opened (it needs an NVIDIA driver, its \
             libcuda on the library path, and a GPU of that index); the CPU build \
             (`cargo build --release`) computes without one"
        )
    })
}

/// The device the binary computes on: `--device`, else the CPU (or the first GPU with `cuda`).
pub fn device() -> Device {
    SELECTED
        .get()
        .map_or_else(Device::default, |(device, _)| device.clone())
}

/// The backend and, on a GPU, the device (`burn-flex`, `burn-cuda:0`), recorded in outputs.
pub fn name() -> String {
    if cfg!(feature = "cuda") {
        let device = SELECTED.get().map_or("cuda:0", |(_, name)| name.as_str());
        format!("burn-{device}")
    } else {
        "burn-flex".into()
    }
}
