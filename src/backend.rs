//! The tensor backends the binary runs on: burn's `flex` CPU backend by default, burn's CUDA
//! backend with the cargo feature `cuda`. Everything else is generic over `burn::Backend`; the
//! backend is chosen when building (burn's backends are types), the device at run time with
//! `--device` (`cpu`, or `cuda` / `cuda:N` for the N-th GPU of a `cuda` build).

use std::sync::OnceLock;

use burn::backend::Autodiff;

#[cfg(not(feature = "cuda"))]
pub type Inference = burn::backend::Flex;
#[cfg(feature = "cuda")]
pub type Inference = jem_kernels::Cuda;

/// The inference backend with automatic differentiation, for training and attacks.
pub type Train = Autodiff<Inference>;

pub type Device = burn::tensor::Device<Inference>;

/// A backend every command of the library runs on, generic until `main`: jem-kernels'
/// convolutions and activations with automatic differentiation, and the name outputs record
/// for a device (`burn-flex`, `burn-cuda:0`), so that a result says where it was computed.
pub trait BenchBackend: jem_kernels::KernelsAutodiff {
    /// The backend and device as every output records them.
    fn recorded_name(device: &Self::Device) -> String;

    /// Which kernels compute: on the CPU, the instruction set of jem-kernels' direct
    /// convolution (`JEM_BENCH_ISA` caps it) and that of the matrix products (the
    /// `avx512-gemm` build feature and the CPU decide it), e.g. `avx2+gemm-avx2`; on CUDA, the
    /// arithmetic and the forward convolution (`f32+auto`, `f32+direct`, `f32+im2col`, `f32+tiled`:
    /// `JEM_BENCH_GPU_CONV`; jem-kernels' CUDA convolutions and products never use TF32).
    fn kernel_path() -> String;

    /// How many shards a JEM step splits its SGLD chains into when the run leaves the count to
    /// the machine (`--sgld-threads 0`): one per core on the CPU, where a shard's batch
    /// computes on one core; one on a GPU, where shards only multiply small kernel launches
    /// that contend for the same device.
    fn default_sgld_shards() -> usize;
}

impl BenchBackend for Autodiff<burn::backend::Flex> {
    fn recorded_name(_device: &Self::Device) -> String {
        "burn-flex".into()
    }

    fn kernel_path() -> String {
        format!("{}+gemm-{}", jem_kernels::isa(), jem_kernels::gemm_isa())
    }

    fn default_sgld_shards() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(feature = "cuda")]
impl BenchBackend for Autodiff<jem_kernels::Cuda> {
    fn recorded_name(device: &Self::Device) -> String {
        format!("burn-cuda:{}", device.index)
    }

    fn kernel_path() -> String {
        format!("f32+{}", jem_kernels::gpu_conv().name())
    }

    fn default_sgld_shards() -> usize {
        1
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
        // `clone`: the CPU device is `Copy`, the CUDA one is not.
        .map_or_else(
            Device::default,
            #[allow(clippy::clone_on_copy)]
            |(device, _)| device.clone(),
        )
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

/// Applies `JEM_BENCH_GPU_CONV` (`tiled`, the default, `tiled-wide`, `auto`, `direct` or
/// `im2col`: how a GPU build computes forward convolutions, all in true f32); an error for any
/// other value, before any work. A CPU build ignores it.
pub fn gpu_settings_from_env() -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    if let Some(conv) = jem_kernels::GpuConv::from_env().map_err(anyhow::Error::msg)? {
        jem_kernels::set_gpu_conv(conv);
    }
    Ok(())
}
