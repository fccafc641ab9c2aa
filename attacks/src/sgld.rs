//! Stochastic-gradient Langevin dynamics on JEM's energy (Grathwohl et al. 2020):
//! x ← x + α ∇ₓ LogSumExp f(x) + σ ε (unconditional), or with f(x)[y] (class-conditional).
//!
//! The same sampler draws JEM's training samples and is the test-time defence ("K sampling
//! steps"). α and σ are stated on the network's input scale (JEM: [−1, 1]); the sampler works on
//! [0, 1] pixels, so with s the pixels per network unit of channel c (the normalisation's std),
//! one step is x ← x + α s² ∇ₓ + σ s ε, which is the official update seen in pixel units.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use rand::Rng;

use crate::channels::scale_channels;
use crate::classifier::{input_gradient, log_sum_exp, Classifier};
use crate::noise;

/// Settings of an SGLD chain.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SgldConfig {
    /// Number of steps η (training) or K (defence).
    pub steps: usize,
    /// α, on the network's input scale.
    pub step_size: f32,
    /// σ, on the network's input scale.
    pub noise: f32,
    /// Pixels per network unit for each channel (the std of the model's input normalisation;
    /// 0.5 for JEM's [−1, 1] convention).
    pub pixel_scale: Vec<f32>,
    /// Clamp to [0, 1] pixels after every step (the official JEM does not).
    pub clamp: bool,
}

/// One SGLD step on [0, 1] pixels, per channel c: `x + g · drift[c] + ε · noise[c]`, with
/// `drift[c]` = α s_c² and `noise[c]` = σ s_c, then clamped to [0, 1] if `clamp`.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelStep {
    /// The gradient's factor for each channel.
    pub drift: Vec<f32>,
    /// The noise's factor for each channel.
    pub noise: Vec<f32>,
    /// Clamp to [0, 1] after the step.
    pub clamp: bool,
}

/// What the chain climbs: the unconditional LogSumExp f(x) (p(x)), or `f(x)[y]` (p(x, y)).
#[derive(Debug, Clone)]
pub enum SgldTarget<B: Backend> {
    /// The unconditional LogSumExp f(x) = −E(x): samples from p(x) (the defence's target).
    Marginal,
    /// `f(x)[y]` for these labels `y` (`[N]`): samples from p(x, y).
    Class(Tensor<B, 1, Int>),
}

impl<I: Backend> SgldTarget<I> {
    /// The target of the examples in `rows` (a shard of the batch).
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Self {
        match self {
            SgldTarget::Marginal => SgldTarget::Marginal,
            SgldTarget::Class(y) => SgldTarget::Class(y.clone().slice([rows])),
        }
    }

    /// The per-example score whose input gradient drives the chain.
    pub fn score<B: AutodiffBackend<InnerBackend = I>>(
        &self,
        logits: Tensor<B, 2>,
    ) -> Tensor<B, 1> {
        match self {
            SgldTarget::Marginal => log_sum_exp(logits),
            SgldTarget::Class(y) => {
                let [n, _] = logits.dims();
                let y = Tensor::<B, 1, Int>::from_inner(y.clone()).reshape([n, 1]);
                logits.gather(1, y).reshape([n])
            }
        }
    }
}

/// SGLD on a [`Classifier`]'s energy as in JEM (Grathwohl et al. 2020), on [0, 1] pixels: one
/// step is x ← x + α s² ∇ₓ score(x) + σ s ξ, ξ standard normal, s the per-channel pixel scale.
#[derive(Debug, Clone)]
pub struct SgldSampler {
    /// Steps, α, σ, pixel scale and clamping.
    pub config: SgldConfig,
}

impl SgldSampler {
    /// A sampler with these settings.
    pub fn new(config: SgldConfig) -> Self {
        Self { config }
    }

    /// `f(s)` per channel, s the channel's pixel scale: a factor for [`scale_channels`].
    pub(crate) fn pixel_factor<B: Backend>(
        &self,
        f: impl Fn(f32) -> f32,
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let s = &self.config.pixel_scale;
        let v: Vec<f32> = s.iter().map(|&s| f(s)).collect();
        Tensor::from_data(TensorData::new(v, [s.len()]), device)
    }

    /// Fresh standard-normal noise for one step of a batch shaped like `x`.
    pub fn draw_noise<B: Backend>(&self, x: &Tensor<B, 4>, rng: &mut impl Rng) -> Tensor<B, 4> {
        noise::gaussian(x.dims(), rng, &x.device())
    }

    /// One step with the given standard-normal noise `eps` (so that a caller can replay a chain
    /// with its noise held fixed).
    pub fn step<B, M>(
        &self,
        model: &M,
        x: Tensor<B::InnerBackend, 4>,
        target: &SgldTarget<B::InnerBackend>,
        eps: Tensor<B::InnerBackend, 4>,
    ) -> Tensor<B::InnerBackend, 4>
    where
        B: AutodiffBackend,
        M: Classifier<B>,
    {
        let (g, _) = input_gradient::<B, M>(model, x.clone(), |l| target.score::<B>(l));
        self.update::<B, M>(model, x, g, eps)
    }

    /// This sampler's step on [0, 1] pixels: each channel's factors and the clamp.
    pub fn pixel_step(&self) -> PixelStep {
        let (a, sigma) = (self.config.step_size, self.config.noise);
        let s = &self.config.pixel_scale;
        PixelStep {
            drift: s.iter().map(|&s| a * s * s).collect(),
            noise: s.iter().map(|&s| sigma * s).collect(),
            clamp: self.config.clamp,
        }
    }

    /// The step from `x` given the score's input gradient `g` there and the standard-normal
    /// noise `eps`: x + α s² g + σ s eps, clamped if the settings say so. For callers that take
    /// the gradient themselves (the defence, which also linearises the network there). By the
    /// model's fused kernel where it has one ([`Classifier::sgld_update`]), else composed here;
    /// the same numbers either way.
    pub fn update<B, M>(
        &self,
        model: &M,
        x: Tensor<B::InnerBackend, 4>,
        g: Tensor<B::InnerBackend, 4>,
        eps: Tensor<B::InnerBackend, 4>,
    ) -> Tensor<B::InnerBackend, 4>
    where
        B: AutodiffBackend,
        M: Classifier<B>,
    {
        let step = self.pixel_step();
        let [fx, fg, feps] = [&x, &g, &eps].map(|t| Tensor::<B, 4>::from_inner(t.clone()));
        if let Some(next) = model.sgld_update(fx, fg, feps, &step) {
            return next.inner();
        }
        let device = x.device();
        let factor = |v: &[f32]| Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &device);
        let drift = scale_channels(g, factor(&step.drift));
        let next = x + drift + scale_channels(eps, factor(&step.noise));
        if step.clamp {
            next.clamp(0.0, 1.0)
        } else {
            next
        }
    }

    /// Runs the chain from `x0` for `config.steps` steps, drawing noise from `rng`.
    pub fn run<B, M>(
        &self,
        model: &M,
        x0: Tensor<B::InnerBackend, 4>,
        target: &SgldTarget<B::InnerBackend>,
        rng: &mut impl Rng,
    ) -> Tensor<B::InnerBackend, 4>
    where
        B: AutodiffBackend,
        M: Classifier<B>,
    {
        let mut x = x0;
        for _ in 0..self.config.steps {
            let eps = self.draw_noise(&x, rng);
            x = self.step::<B, M>(model, x, target, eps);
        }
        x
    }

    /// [`run`](Self::run) with the batch split into `threads` shards that run side by side, each
    /// on its own copy of the model: chains are independent, and a CPU backend computes one
    /// batch on one core. The noise is drawn up front in `run`'s order, so every chain gets the
    /// same noise whatever the number of threads.
    pub fn run_sharded<B, M>(
        &self,
        model: &M,
        x0: Tensor<B::InnerBackend, 4>,
        target: &SgldTarget<B::InnerBackend>,
        rng: &mut impl Rng,
        threads: usize,
    ) -> Tensor<B::InnerBackend, 4>
    where
        B: AutodiffBackend,
        M: Classifier<B> + Clone + Send,
    {
        let n = x0.dims()[0];
        let threads = threads.clamp(1, n.max(1));
        if threads == 1 {
            return self.run::<B, M>(model, x0, target, rng);
        }
        let noise: Vec<_> = (0..self.config.steps)
            .map(|_| self.draw_noise(&x0, rng))
            .collect();
        let shards: Vec<_> = (0..threads)
            .map(|t| t * n / threads..(t + 1) * n / threads)
            .collect();
        std::thread::scope(|scope| {
            let running: Vec<_> = shards
                .into_iter()
                .map(|rows| {
                    let model = model.clone();
                    let x = x0.clone().slice([rows.clone()]);
                    let eps: Vec<_> = noise
                        .iter()
                        .map(|e| e.clone().slice([rows.clone()]))
                        .collect();
                    let target = target.rows(rows);
                    scope.spawn(move || {
                        eps.into_iter()
                            .fold(x, |x, e| self.step::<B, M>(&model, x, &target, e))
                    })
                })
                .collect();
            let parts = running
                .into_iter()
                .map(|h| h.join().expect("an SGLD shard panicked"))
                .collect();
            Tensor::cat(parts, 0)
        })
    }
}

/// JEM's chain initialisation: U(−1, 1) on the network's input scale, i.e. per channel c
/// pixels uniform on `mean[c] ± scale[c]`.
#[derive(Debug, Clone, PartialEq)]
pub struct UniformInit {
    /// Pixel value of the network's 0, per channel.
    pub mean: Vec<f32>,
    /// Pixels per network unit, per channel.
    pub scale: Vec<f32>,
}

impl UniformInit {
    /// One image of shape (C, H, W), row-major.
    pub fn image(&self, [c, h, w]: [usize; 3], rng: &mut impl Rng) -> Vec<f32> {
        assert_eq!(self.mean.len(), c, "one mean per channel");
        (0..c * h * w)
            .map(|i| {
                let ch = i / (h * w);
                self.mean[ch] + self.scale[ch] * rng.random_range(-1.0f32..1.0)
            })
            .collect()
    }

    /// A batch `[n, C, H, W]` on the device.
    pub fn batch<B: Backend>(
        &self,
        [n, c, h, w]: [usize; 4],
        rng: &mut impl Rng,
        device: &B::Device,
    ) -> Tensor<B, 4> {
        let v: Vec<f32> = (0..n).flat_map(|_| self.image([c, h, w], rng)).collect();
        Tensor::from_data(TensorData::new(v, [n, c, h, w]), device)
    }
}
