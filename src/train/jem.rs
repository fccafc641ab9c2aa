//! The JEM objective (Grathwohl et al. 2020, Algorithm 1): cross-entropy for p(y|x)
//! plus the contrastive p(x) term LSE f(x̂) − LSE f(x), with x̂ from persistent SGLD chains.

use jem_kernels::KernelsAutodiff;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use jem_attacks::{log_sum_exp, SgldConfig, SgldSampler, SgldTarget, UniformInit};
use jem_datasets::ImageSet;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::chain_start::{ChainStart, ChainStartKind};
use super::objective::{accuracy, cross_entropy, Objective, Step, StepStats};
use super::replay_buffer::ReplayBuffer;
use crate::model::{InputNormalization, WideResNet, WideResNetConfig};
use crate::settings::{self, InvalidSetting};

/// JEM's settings; defaults are the official ones (`train_wrn_ebm.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JemConfig {
    /// Weight of the p(x) (generative) term. A resumed run may change it (recorded in the run
    /// folder's changes.csv), as it may `pyx_weight`.
    pub px_weight: f64,
    /// Weight of the p(y|x) (cross-entropy) term; a resumed run may change it.
    pub pyx_weight: f64,
    /// SGLD steps η per iteration.
    pub sgld_steps: usize,
    /// SGLD step size α, on the network's [−1, 1] scale.
    pub sgld_lr: f32,
    /// SGLD noise σ, on the network's [−1, 1] scale.
    pub sgld_std: f32,
    /// Clamp SGLD samples to [0, 1] pixels after each step (the official code does not).
    pub sgld_clamp: bool,
    /// Persistent chains in the replay buffer.
    pub buffer_size: usize,
    /// Probability ρ that a chain restarts from U(−1, 1).
    pub reinit_freq: f64,
    /// Weight λ of an energy penalty λ·(E(x)² + E(x̂)²) (Du & Mordatch 2019), which keeps the
    /// energies of data and samples near zero; 0 (the official JEM) turns it off. Meant for a
    /// JEM started from a trained classifier, whose first samples have LogSumExp near 165
    /// against 17 for data: the official loss then wipes out its accuracy.
    #[serde(default)]
    pub energy_reg: f64,
    /// Threads that share the SGLD chains of a step (0: the machine's choice, one per core on
    /// the CPU and one on a GPU: [`JemObjective::with_default_shards`]). Every chain gets the
    /// same noise whatever the count, but a shard's batch size moves the last bit of some
    /// results, so runs with different counts drift apart: the count is a setting of the run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sgld_threads: usize,
    /// Where chains start and restart: `uniform`, U(−1, 1) (the paper), or `class-gaussian`, a
    /// Gaussian per class fitted to the training images (JEM++'s informative initialisation),
    /// which puts short chains near the data from the first step.
    #[serde(default, skip_serializing_if = "is_uniform")]
    pub chain_start: ChainStartKind,
}

impl Default for JemConfig {
    /// The official settings.
    fn default() -> Self {
        JemConfig {
            px_weight: 1.0,
            pyx_weight: 1.0,
            sgld_steps: 20,
            sgld_lr: 1.0,
            sgld_std: 0.01,
            sgld_clamp: false,
            buffer_size: 10_000,
            reinit_freq: 0.05,
            energy_reg: 0.0,
            sgld_threads: 0,
            chain_start: ChainStartKind::Uniform,
        }
    }
}

/// The paper's chain start is left out of sidecars, which then read as before.
fn is_uniform(kind: &ChainStartKind) -> bool {
    *kind == ChainStartKind::Uniform
}

/// The default thread count (one per core) is left out of sidecars, which then read as before.
fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl JemConfig {
    /// The SGLD settings a checkpoint was trained with; the official ones for models that were
    /// not trained as a JEM.
    pub fn of(sidecar: &crate::model::Sidecar) -> anyhow::Result<Self> {
        sidecar
            .training
            .settings
            .get("jem")
            .map(|v| serde_json::from_value(v.clone()))
            .transpose()
            .map_err(|e| anyhow::anyhow!("unreadable JEM settings in the sidecar: {e}"))
            .map(Option::unwrap_or_default)
    }

    /// Checks every setting's range: counts at least 1, weights, rates and noise finite and
    /// ≥ 0, the restart frequency a probability. An error names the field.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        settings::at_least_one("sgld_steps", self.sgld_steps)?;
        settings::at_least_one("buffer_size", self.buffer_size)?;
        for (field, value) in [
            ("px_weight", self.px_weight),
            ("pyx_weight", self.pyx_weight),
            ("sgld_lr", self.sgld_lr as f64),
            ("sgld_std", self.sgld_std as f64),
            ("energy_reg", self.energy_reg),
        ] {
            settings::finite_non_negative(field, value)?;
        }
        if self.px_weight == 0.0 && self.pyx_weight == 0.0 {
            return Err(InvalidSetting::bare(
                "px_weight",
                "is 0 and so is the weight of log p(y|x): the objective would train nothing",
            ));
        }
        settings::probability("reinit_freq", self.reinit_freq)
    }

    pub fn sampler(&self, norm: &InputNormalization) -> SgldSampler {
        SgldSampler::new(SgldConfig {
            steps: self.sgld_steps,
            step_size: self.sgld_lr,
            noise: self.sgld_std,
            pixel_scale: norm.std.clone(),
            clamp: self.sgld_clamp,
        })
    }
}

/// JEM's U(−1, 1) box on the network's scale, per channel: the paper's chain start, and the
/// bounds every chain start is clamped to.
pub fn chain_init(norm: &InputNormalization) -> UniformInit {
    UniformInit {
        mean: norm.mean.clone(),
        scale: norm.std.clone(),
    }
}

pub struct JemObjective {
    config: JemConfig,
    /// Divergence threshold on |E(data) − E(samples)|.
    max_energy_gap: f64,
    /// Set up by [`Objective::prepare`], once the data's shape is known.
    chains: Option<Chains>,
    /// SGLD shards where `config.sgld_threads` is 0.
    default_shards: usize,
}

struct Chains {
    sampler: SgldSampler,
    init: ChainStart,
    buffer: ReplayBuffer,
}

impl JemObjective {
    pub fn new(config: JemConfig, max_energy_gap: f64) -> Self {
        Self {
            config,
            max_energy_gap,
            chains: None,
            default_shards: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// The number of SGLD shards where the run leaves it to the machine (`sgld_threads` 0;
    /// one per core unless set): a GPU backend computes a step best as one batch.
    pub fn with_default_shards(mut self, shards: usize) -> Self {
        self.default_shards = shards.max(1);
        self
    }

    /// How many shards a step splits its SGLD chains into: the run's `sgld_threads`, else the
    /// machine's default ([`with_default_shards`](Self::with_default_shards)).
    pub fn sgld_shards(&self) -> usize {
        match self.config.sgld_threads {
            0 => self.default_shards,
            t => t,
        }
    }

    /// The persistent chains (after `prepare`).
    pub fn buffer(&self) -> Option<&ReplayBuffer> {
        self.chains.as_ref().map(|c| &c.buffer)
    }

    fn chains(&mut self) -> &mut Chains {
        self.chains
            .as_mut()
            .expect("the trainer prepares the objective before the first step")
    }
}

/// Chains drawn in the run folder's `buffer.png`.
const BUFFER_PICTURE_CHAINS: usize = 100;

/// Extra log columns, in order.
const COLUMNS: [&str; 6] = [
    "gen_loss",
    "energy_data",
    "energy_samples",
    "reinitialised",
    "sgld_seconds",
    "chain_shift",
];

impl<B: KernelsAutodiff> Objective<B> for JemObjective {
    fn kind(&self) -> &'static str {
        "jem"
    }

    fn extra_columns(&self) -> Vec<&'static str> {
        COLUMNS.to_vec()
    }

    fn prepare(
        &mut self,
        arch: &WideResNetConfig,
        train: &ImageSet,
        seed: u64,
    ) -> anyhow::Result<()> {
        let norm = &arch.input_normalization;
        let init = ChainStart::new(self.config.chain_start, chain_init(norm), train)?;
        let shape = [train.channels, train.height, train.width];
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let buffer = ReplayBuffer::new(self.config.buffer_size, shape, &init, &mut rng);
        self.chains = Some(Chains {
            sampler: self.config.sampler(norm),
            init,
            buffer,
        });
        Ok(())
    }

    fn loss(
        &mut self,
        model: &WideResNet<B>,
        x: Tensor<B, 4>,
        y: Tensor<B, 1, Int>,
        step: Step,
    ) -> (Tensor<B, 1>, StepStats) {
        let [n, c, h, w] = x.dims();
        let device = x.device();
        let mut rng = rand::rngs::StdRng::seed_from_u64(step.seed);

        // Advance persistent chains with the current parameters frozen: input gradients only.
        let sgld_start = Instant::now();
        let reinit = self.config.reinit_freq;
        let threads = self.sgld_shards();
        let chains = self.chains();
        let draw = chains.buffer.draw(n, reinit, &chains.init, &mut rng);
        let x0 = Tensor::<B::InnerBackend, 4>::from_data(
            TensorData::new(draw.images, [n, c, h, w]),
            &device,
        );
        let frozen = model.clone().no_grad();
        let samples = chains.sampler.run_sharded::<B, _>(
            &frozen,
            x0.clone(),
            &SgldTarget::Marginal,
            &mut rng,
            threads,
        );
        // How far the chains moved this step (RMS over pixels, [0, 1] units): noise alone moves
        // them by σ·s·√η, so a value near that says the energy gradient does not move them.
        let chain_shift = (samples.clone() - x0).powi_scalar(2).mean().sqrt();
        let chain_shift: f64 = chain_shift.into_scalar().elem();
        let pixels: Vec<f32> = samples.clone().into_data().to_vec().expect("f32 samples");
        chains.buffer.store(&draw.slots, &pixels);
        let sgld_seconds = sgld_start.elapsed().as_secs_f64();

        // Data and samples in one forward pass.
        let both = Tensor::cat(vec![x, Tensor::from_inner(samples)], 0);
        let logits = model.forward(both);
        let data_logits = logits.clone().slice([0..n]);
        let lse = log_sum_exp(logits);
        // E(x)² averaged over data plus the same over samples: twice the mean over both halves.
        let energy_penalty =
            (self.config.energy_reg > 0.0).then(|| lse.clone().square().mean() * 2.0);
        let (lse_data, lse_samples) = (
            lse.clone().slice([0..n]).mean(),
            lse.slice([n..2 * n]).mean(),
        );
        let acc = accuracy(data_logits.clone().detach(), y.clone());
        let ce = cross_entropy(data_logits, y);
        // −(f_p − f_q): lowers the energy of data, raises that of samples.
        let gen = lse_samples.clone() - lse_data.clone();
        let mut loss = ce.clone() * self.config.pyx_weight + gen.clone() * self.config.px_weight;
        if let Some(penalty) = energy_penalty {
            loss = loss + penalty * self.config.energy_reg;
        }

        let scalar = |t: Tensor<B, 1>| t.into_scalar().elem::<f64>();
        let stats = StepStats {
            loss: scalar(loss.clone()),
            cross_entropy: scalar(ce),
            accuracy: acc,
            extra: vec![
                scalar(gen),
                -scalar(lse_data),
                -scalar(lse_samples),
                draw.reinitialised as f64 / n as f64,
                sgld_seconds,
                chain_shift,
            ],
        };
        (loss, stats)
    }

    fn symptom(&self, stats: &StepStats) -> Option<String> {
        let gap = (stats.extra[1] - stats.extra[2]).abs();
        (!gap.is_finite() || gap > self.max_energy_gap).then(|| {
            format!(
                "energy gap |E(data) − E(samples)| = {gap:.3e} exceeds {:.1e}",
                self.max_energy_gap
            )
        })
    }

    fn state(&self) -> Option<Vec<u8>> {
        self.buffer().map(ReplayBuffer::to_bytes)
    }

    fn keeps_state(&self) -> bool {
        self.buffer().is_some()
    }

    /// `buffer.png`: the first 100 chains, 10 per row, as they are now (the same picture as
    /// `sample --from-buffer RUN --steps 0`, without a model).
    fn snapshot(&self, run: &std::path::Path) -> anyhow::Result<()> {
        let Some(buffer) = self.buffer() else {
            return Ok(());
        };
        let shown = buffer.capacity().min(BUFFER_PICTURE_CHAINS);
        let pixels: Vec<f32> = (0..shown).flat_map(|i| buffer.image(i)).copied().collect();
        let [channels, height, width] = buffer.shape();
        let images = crate::image_grid::ImageBatch {
            pixels: &pixels,
            channels,
            height,
            width,
        };
        crate::image_grid::write_grid(&run.join("buffer.png"), &images, shown.div_ceil(10), 10)
    }

    fn restore(&mut self, bytes: &[u8], what: &str) -> anyhow::Result<()> {
        let buffer = ReplayBuffer::from_bytes(bytes, what)?;
        let chains = self.chains();
        anyhow::ensure!(
            buffer.capacity() == chains.buffer.capacity()
                && buffer.image_len() == chains.buffer.image_len(),
            "{what}: a replay buffer of {} chains of {} pixels does not fit this run's {} of {}",
            buffer.capacity(),
            buffer.image_len(),
            chains.buffer.capacity(),
            chains.buffer.image_len()
        );
        chains.buffer = buffer;
        Ok(())
    }
}
