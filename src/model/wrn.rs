//! Wide-ResNet in two variants. [`WrnVariant::Jem`], the official JEM code (`wideresnet.py`,
//! `norm=None`): no normalisation layers, LeakyReLU(0.2) before every convolution, conv biases,
//! no dropout, the stride on each stage's second convolution. [`WrnVariant::RobustBench`], the
//! `WideResNet` of RobustBench (and of TRADES, MART, Carmon et al.) that published adversarially
//! trained CIFAR-10 models use: BatchNorm + ReLU before every convolution, no conv biases, the
//! stride on the first convolution, and a shortcut that sees the activated input when the shape
//! changes. Both end in an activation, global average pooling and a linear head.
//!
//! Field names follow PyTorch's `Wide_ResNet` state_dict (`conv1`, `layer1.0.conv1`,
//! `layer2.0.shortcut.0`, `bn1`, `linear`), so a PyTorch checkpoint of the JEM architecture
//! loads without renaming (RobustBench's names are remapped on import). The model takes pixels
//! in [0, 1] (the unit of every attack) and applies its own input normalisation first; JEM's is
//! mean 0.5, std 0.5, i.e. data in [−1, 1].

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use jem_attacks::{scale_channels, shift_channels};
use jem_kernels::{
    conv2d, conv2d_without_bias, leaky_relu, leaky_relu_conv2d, leaky_relu_conv2d_add,
    leaky_relu_derivative, Kernels,
};
use serde::{Deserialize, Serialize};

/// Per-channel `(x − mean) / std` applied to [0, 1] pixels before the network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputNormalization {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl InputNormalization {
    /// JEM's convention: [0, 1] pixels mapped to [−1, 1].
    pub fn symmetric(channels: usize) -> Self {
        Self {
            mean: vec![0.5; channels],
            std: vec![0.5; channels],
        }
    }

    /// The factor by which the normalised input changes per unit change of a pixel (1 / std);
    /// used to convert SGLD step sizes stated on the normalised scale into pixel units.
    pub fn scale(&self) -> f32 {
        1.0 / self.std[0]
    }
}

/// Which layout of Wide-ResNet (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WrnVariant {
    /// The official JEM network: no normalisation layers, conv biases, stride on conv2.
    #[default]
    Jem,
    /// RobustBench's: BatchNorm (running statistics, always) and ReLU, bias-free convolutions,
    /// stride on conv1, shortcut on the activated input.
    RobustBench,
}

impl crate::Choice for WrnVariant {
    const WHAT: &'static str = "Wide-ResNet layout";

    const ALL: &'static [Self] = &[WrnVariant::Jem, WrnVariant::RobustBench];

    fn name(self) -> &'static str {
        match self {
            WrnVariant::Jem => "jem",
            WrnVariant::RobustBench => "robustbench",
        }
    }

    fn description(self) -> &'static str {
        match self {
            WrnVariant::Jem => "the official JEM network: LeakyReLU, no normalisation layers",
            WrnVariant::RobustBench => {
                "RobustBench's: BatchNorm with running statistics, ReLU, bias-free convolutions"
            }
        }
    }
}

/// Architecture of a [`WideResNet`]: WRN-`depth`-`width`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WideResNetConfig {
    /// 6n + 4 (10, 16, 28, …).
    pub depth: usize,
    /// Widening factor k: stages of 16k, 32k, 64k channels.
    pub width: usize,
    pub in_channels: usize,
    pub num_classes: usize,
    /// Slope of LeakyReLU for negative inputs (0.2 in JEM).
    pub leak: f64,
    pub input_normalization: InputNormalization,
    /// The block layout: JEM's own, or RobustBench's (an imported network).
    pub variant: WrnVariant,
}

/// `WRN-10-2, 1 input channel, 10 classes, LeakyReLU 0.2`: what a message shows of an
/// architecture (its name, then what else a checkpoint must match).
impl std::fmt::Display for WideResNetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{}, {} input channel{}, {} class{}, LeakyReLU {}",
            self.name(),
            self.in_channels,
            plural(self.in_channels),
            self.num_classes,
            if self.num_classes == 1 { "" } else { "es" },
            self.leak
        )
    }
}

impl WideResNetConfig {
    pub fn new(depth: usize, width: usize, in_channels: usize, num_classes: usize) -> Self {
        Self {
            depth,
            width,
            in_channels,
            num_classes,
            leak: 0.2,
            input_normalization: InputNormalization::symmetric(in_channels),
            variant: WrnVariant::Jem,
        }
    }

    /// RobustBench's WRN-`depth`-`width`: ReLU, and no input normalisation unless the
    /// checkpoint says otherwise (its models take [0, 1] pixels).
    pub fn robustbench(depth: usize, width: usize, in_channels: usize, num_classes: usize) -> Self {
        Self {
            leak: 0.0,
            input_normalization: InputNormalization {
                mean: vec![0.0; in_channels],
                std: vec![1.0; in_channels],
            },
            variant: WrnVariant::RobustBench,
            ..Self::new(depth, width, in_channels, num_classes)
        }
    }

    /// WRN-`depth`-`width` in `layout`: [`new`](Self::new) or [`robustbench`](Self::robustbench).
    pub fn of_layout(
        layout: WrnVariant,
        depth: usize,
        width: usize,
        in_channels: usize,
        num_classes: usize,
    ) -> Self {
        match layout {
            WrnVariant::Jem => Self::new(depth, width, in_channels, num_classes),
            WrnVariant::RobustBench => Self::robustbench(depth, width, in_channels, num_classes),
        }
    }

    /// Blocks per stage, n = (depth − 4) / 6; an error for depths that are not 6n + 4.
    pub fn blocks_per_stage(&self) -> anyhow::Result<usize> {
        anyhow::ensure!(
            self.depth >= 10 && (self.depth - 4).is_multiple_of(6),
            "Wide-ResNet depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, …), got {}",
            self.depth
        );
        anyhow::ensure!(self.width >= 1, "Wide-ResNet width must be >= 1");
        anyhow::ensure!(
            self.input_normalization.mean.len() == self.in_channels
                && self.input_normalization.std.len() == self.in_channels,
            "input normalisation needs one mean and one std per input channel ({})",
            self.in_channels
        );
        Ok((self.depth - 4) / 6)
    }

    /// Channel counts of the stem and the three stages.
    pub fn stages(&self) -> [usize; 4] {
        [16, 16 * self.width, 32 * self.width, 64 * self.width]
    }

    /// Short name, e.g. `WRN-10-1`, or `WRN-28-10 (RobustBench)`.
    pub fn name(&self) -> String {
        match self.variant {
            WrnVariant::Jem => format!("WRN-{}-{}", self.depth, self.width),
            WrnVariant::RobustBench => format!("WRN-{}-{} (RobustBench)", self.depth, self.width),
        }
    }

    /// Whether a stage's stride sits on a block's first convolution (RobustBench) rather than
    /// its second (JEM).
    pub(super) fn stride_on_conv1(&self) -> bool {
        self.variant == WrnVariant::RobustBench
    }

    /// [`init`](Self::init) with the backend's generator seeded by `seed`: the same seed gives
    /// the same weights even while other threads draw random tensors. burn draws a parameter
    /// lazily, on first use, from a process-wide generator, so this holds a lock from seeding
    /// until every parameter has been drawn.
    pub fn init_seeded<B: Backend>(
        &self,
        seed: u64,
        device: &B::Device,
    ) -> anyhow::Result<WideResNet<B>> {
        static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _held = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
        B::seed(device, seed);
        let model = self.init(device)?;
        struct Draw;
        impl<B: Backend> ModuleVisitor<B> for Draw {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let _ = param.val();
            }
        }
        model.visit(&mut Draw);
        Ok(model)
    }

    pub fn init<B: Backend>(&self, device: &B::Device) -> anyhow::Result<WideResNet<B>> {
        let n = self.blocks_per_stage()?;
        let s = self.stages();
        let robustbench = self.variant == WrnVariant::RobustBench;
        let conv3 = |cin, cout, stride| {
            Conv2dConfig::new([cin, cout], [3, 3])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .with_bias(!robustbench)
                .init(device)
        };
        let norm = |channels| robustbench.then(|| BatchNormConfig::new(channels).init(device));
        let stride_on_conv1 = self.stride_on_conv1();
        let mut cin = s[0];
        let mut stage = |cout: usize, stride: usize| {
            (0..n)
                .map(|b| {
                    let stride = if b == 0 { stride } else { 1 };
                    let shortcut = if stride != 1 || cin != cout {
                        vec![Conv2dConfig::new([cin, cout], [1, 1])
                            .with_stride([stride, stride])
                            .with_bias(!robustbench)
                            .init(device)]
                    } else {
                        vec![]
                    };
                    let (stride1, stride2) = if stride_on_conv1 {
                        (stride, 1)
                    } else {
                        (1, stride)
                    };
                    let block = WideBasic {
                        bn1: norm(cin),
                        conv1: conv3(cin, cout, stride1),
                        bn2: norm(cout),
                        conv2: conv3(cout, cout, stride2),
                        shortcut,
                    };
                    cin = cout;
                    block
                })
                .collect::<Vec<_>>()
        };
        let layer1 = stage(s[1], 1);
        let layer2 = stage(s[2], 2);
        let layer3 = stage(s[3], 2);
        Ok(WideResNet {
            conv1: conv3(self.in_channels, s[0], 1),
            layer1,
            layer2,
            layer3,
            bn1: norm(s[3]),
            linear: LinearConfig::new(s[3], self.num_classes).init(device),
            config: self.clone(),
        })
    }
}

/// BatchNorm with its running statistics (RobustBench; the identity without it), the part of
/// a block's activation before the (Leaky)ReLU, which the next convolution fuses. The statistics
/// are used even under autodiff, where burn's `BatchNorm` would switch to batch statistics: an
/// attacked or sampled model must not depend on its batch.
fn normalize<B: Kernels>(
    pass: &impl Pass<B>,
    x: Tensor<B, 4>,
    norm: &Option<BatchNorm<B>>,
) -> Tensor<B, 4> {
    match norm {
        Some(bn) => {
            let scale = bn.gamma.val() / (bn.running_var.value() + bn.epsilon).sqrt();
            let shift = bn.beta.val() - bn.running_mean.value() * scale.clone();
            pass.scale_shift(x, scale, shift)
        }
        None => x,
    }
}

/// What one walk over the network's layers ([`WideResNet::run`]) computes at each of them: the
/// network itself ([`Network`]), or the network linearised at a recorded activation pattern
/// ([`Linearisation`]: shifts and biases dropped, every activation replaced by its slope
/// there, i.e. v ↦ J(x) v). One walk serves both, so the two cannot drift apart.
trait Pass<B: Kernels> {
    /// `conv(act(x))`, or `conv(x)` when `leak` is `None`.
    fn conv(&mut self, conv: &Conv2d<B>, x: Tensor<B, 4>, leak: Option<f64>) -> Tensor<B, 4>;
    /// `conv(act(x)) + residual`: a block's last convolution and its shortcut's addition.
    fn conv_add(
        &mut self,
        conv: &Conv2d<B>,
        x: Tensor<B, 4>,
        leak: f64,
        residual: Tensor<B, 4>,
    ) -> Tensor<B, 4>;
    /// The activation on its own (the last one, before pooling).
    fn activation(&mut self, x: Tensor<B, 4>, leak: f64) -> Tensor<B, 4>;
    /// `(x − mean) · inv_std` per channel, given `−mean`: the input normalisation.
    fn standardise(
        &self,
        x: Tensor<B, 4>,
        minus_mean: Tensor<B, 1>,
        inv_std: Tensor<B, 1>,
    ) -> Tensor<B, 4>;
    /// `x · scale + shift` per channel: BatchNorm with running statistics.
    fn scale_shift(
        &self,
        x: Tensor<B, 4>,
        scale: Tensor<B, 1>,
        shift: Tensor<B, 1>,
    ) -> Tensor<B, 4>;
    /// The linear head.
    fn head(&self, linear: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2>;
}

/// The network itself. With `pattern`, each activation's slope at its input (1 where the input
/// is ≥ 0, else the leak) is recorded, in the order of the walk, for a [`Linearisation`] at the
/// same point: as a factor, so that a tangent through it costs one product.
struct Network<B: Backend> {
    pattern: Option<Vec<Tensor<B, 4>>>,
}

impl<B: Kernels> Network<B> {
    fn record(&mut self, x: &Tensor<B, 4>, leak: f64) {
        if let Some(pattern) = &mut self.pattern {
            pattern.push(leaky_relu_derivative(x.clone(), leak));
        }
    }
}

impl<B: Kernels> Pass<B> for Network<B> {
    fn conv(&mut self, conv: &Conv2d<B>, x: Tensor<B, 4>, leak: Option<f64>) -> Tensor<B, 4> {
        match leak {
            Some(leak) => {
                self.record(&x, leak);
                leaky_relu_conv2d(conv, x, leak)
            }
            None => conv2d(conv, x),
        }
    }

    /// In one operation: on a GPU the residual is added as the convolution's sums are written.
    fn conv_add(
        &mut self,
        conv: &Conv2d<B>,
        x: Tensor<B, 4>,
        leak: f64,
        residual: Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        self.record(&x, leak);
        leaky_relu_conv2d_add(conv, x, leak, residual)
    }

    fn activation(&mut self, x: Tensor<B, 4>, leak: f64) -> Tensor<B, 4> {
        self.record(&x, leak);
        leaky_relu(x, leak)
    }

    fn standardise(
        &self,
        x: Tensor<B, 4>,
        minus_mean: Tensor<B, 1>,
        inv_std: Tensor<B, 1>,
    ) -> Tensor<B, 4> {
        scale_channels(shift_channels(x, minus_mean), inv_std)
    }

    fn scale_shift(
        &self,
        x: Tensor<B, 4>,
        scale: Tensor<B, 1>,
        shift: Tensor<B, 1>,
    ) -> Tensor<B, 4> {
        shift_channels(scale_channels(x, scale), shift)
    }

    fn head(&self, linear: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
        jem_kernels::linear(
            x,
            linear.weight.val(),
            linear.bias.as_ref().map(|b| b.val()),
        )
    }
}

/// The network linearised at the point whose activation pattern [`Network`] recorded.
struct Linearisation<'a, B: Backend> {
    pattern: &'a [Tensor<B, 4>],
    next: usize,
}

impl<B: Backend> Linearisation<'_, B> {
    /// `x` times the slope of the next activation of the pattern (recorded with its leak).
    fn slope(&mut self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let slope = self
            .pattern
            .get(self.next)
            .expect("the linearisation walks the network its pattern was recorded on")
            .clone();
        self.next += 1;
        x * slope
    }
}

impl<B: Kernels> Pass<B> for Linearisation<'_, B> {
    fn conv(&mut self, conv: &Conv2d<B>, x: Tensor<B, 4>, leak: Option<f64>) -> Tensor<B, 4> {
        let x = match leak {
            Some(_) => self.slope(x),
            None => x,
        };
        conv2d_without_bias(conv, x)
    }

    fn conv_add(
        &mut self,
        conv: &Conv2d<B>,
        x: Tensor<B, 4>,
        leak: f64,
        residual: Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        self.conv(conv, x, Some(leak)) + residual
    }

    fn activation(&mut self, x: Tensor<B, 4>, _: f64) -> Tensor<B, 4> {
        self.slope(x)
    }

    fn standardise(&self, x: Tensor<B, 4>, _: Tensor<B, 1>, inv_std: Tensor<B, 1>) -> Tensor<B, 4> {
        scale_channels(x, inv_std)
    }

    fn scale_shift(&self, x: Tensor<B, 4>, scale: Tensor<B, 1>, _: Tensor<B, 1>) -> Tensor<B, 4> {
        scale_channels(x, scale)
    }

    fn head(&self, linear: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
        jem_kernels::linear(x, linear.weight.val(), None)
    }
}

/// One pre-activation residual block (`wide_basic` in the official JEM code, `BasicBlock` in
/// RobustBench's).
#[derive(Module, Debug)]
pub struct WideBasic<B: Backend> {
    /// BatchNorm before conv1 (RobustBench only).
    pub bn1: Option<BatchNorm<B>>,
    pub conv1: Conv2d<B>,
    /// BatchNorm before conv2 (RobustBench only).
    pub bn2: Option<BatchNorm<B>>,
    pub conv2: Conv2d<B>,
    /// Empty, or one 1×1 convolution when the shape changes; a `Vec` mirrors PyTorch's
    /// `nn.Sequential`, so the weight is named `shortcut.0.weight` as in its state_dict.
    pub shortcut: Vec<Conv2d<B>>,
}

impl<B: Kernels> WideBasic<B> {
    /// `conv2(act(conv1(act(x)))) + shortcut`, each activation fused into the convolution
    /// that reads it ([`leaky_relu_conv2d`]), the shortcut's addition into the last one
    /// ([`leaky_relu_conv2d_add`]).
    pub fn forward(&self, x: Tensor<B, 4>, leak: f64) -> Tensor<B, 4> {
        self.run(&mut Network { pattern: None }, x, leak)
    }

    fn run(&self, pass: &mut impl Pass<B>, x: Tensor<B, 4>, leak: f64) -> Tensor<B, 4> {
        let normalized = normalize(pass, x.clone(), &self.bn1);
        let out = pass.conv(&self.conv1, normalized.clone(), Some(leak));
        let out = normalize(pass, out, &self.bn2);
        let skip = match self.shortcut.first() {
            // RobustBench's block projects the activated input, JEM's the raw one.
            Some(conv) if self.bn1.is_some() => pass.conv(conv, normalized, Some(leak)),
            Some(conv) => pass.conv(conv, x, None),
            None => x,
        };
        pass.conv_add(&self.conv2, out, leak, skip)
    }
}

/// The classifier f_θ: [0, 1] pixels (N×C×H×W) → logits (N×classes).
#[derive(Module, Debug)]
pub struct WideResNet<B: Backend> {
    pub conv1: Conv2d<B>,
    pub layer1: Vec<WideBasic<B>>,
    pub layer2: Vec<WideBasic<B>>,
    pub layer3: Vec<WideBasic<B>>,
    /// BatchNorm before the final activation (RobustBench only).
    pub bn1: Option<BatchNorm<B>>,
    pub linear: Linear<B>,
    #[module(skip)]
    pub config: WideResNetConfig,
}

impl<B: Backend> WideResNet<B> {
    pub fn config(&self) -> &WideResNetConfig {
        &self.config
    }
}

impl<B: Kernels> WideResNet<B> {
    /// Logits of a batch of [0, 1] images.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.run(&mut Network { pattern: None }, x)
    }

    /// The penultimate layer: the globally pooled activations the linear head reads
    /// (`[batch, channels]`), e.g. the feature space of a Fréchet distance between image sets.
    pub fn features(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.features_in(&mut Network { pattern: None }, x)
    }

    /// The logits as `pass` computes them: the network's, or its linearisation's.
    fn run(&self, pass: &mut impl Pass<B>, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let features = self.features_in(pass, x);
        pass.head(&self.linear, features)
    }

    fn features_in(&self, pass: &mut impl Pass<B>, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let cfg = self.config();
        let norm = &cfg.input_normalization;
        let c = norm.mean.len();
        let device = x.device();
        let per_channel = |v: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(v, [c]), &device);
        let minus_mean = per_channel(norm.mean.iter().map(|m| -m).collect());
        let inv_std = per_channel(norm.std.iter().map(|s| 1.0 / s).collect());
        let input = pass.standardise(x, minus_mean, inv_std);
        let mut out = pass.conv(&self.conv1, input, None);
        for block in self.layer1.iter().chain(&self.layer2).chain(&self.layer3) {
            out = block.run(pass, out, cfg.leak);
        }
        let out = normalize(pass, out, &self.bn1);
        let out = pass.activation(out, cfg.leak);
        let [n, ch, _, _] = out.dims();
        // Global average pool (the official code's avg_pool2d(out, 8) on 8×8 maps).
        out.mean_dim(3).mean_dim(2).reshape([n, ch])
    }
}

/// Attacks and the SGLD sampler see a WRN through the attack library's interface.
impl<B: Kernels> jem_attacks::Classifier<B> for WideResNet<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.forward(x)
    }

    /// Exact: every layer is linear or (Leaky)ReLU, so recording which side of 0 each
    /// activation's input lies on fixes J(x).
    fn linearise(&self, x: Tensor<B, 4>) -> Option<(Tensor<B, 2>, jem_attacks::Linearised<'_, B>)> {
        let mut network = Network {
            pattern: Some(Vec::new()),
        };
        let logits = self.run(&mut network, x);
        let pattern = network.pattern.unwrap_or_default();
        let jacobian = move |v| {
            let mut pass = Linearisation {
                pattern: &pattern,
                next: 0,
            };
            self.run(&mut pass, v)
        };
        Some((logits, Box::new(jacobian)))
    }

    /// jem-kernels' one-pass update ([`jem_kernels::FastSgld`]).
    fn sgld_update(
        &self,
        x: Tensor<B, 4>,
        g: Tensor<B, 4>,
        eps: Tensor<B, 4>,
        step: &jem_attacks::PixelStep,
    ) -> Option<Tensor<B, 4>> {
        let (drift, noise) = (&step.drift, &step.noise);
        Some(jem_kernels::sgld_update(
            x, g, eps, drift, noise, step.clamp,
        ))
    }
}
