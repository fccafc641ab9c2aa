//! A network as the attacks see it: the plain classifier for K = 0, or JEM's test-time
//! defence (K SGLD steps in n chains) in front of it, with the SGLD step size and noise
//! taken from the model's own settings (a checkpoint's JEM training settings; the paper's
//! values for other models), each overridable in [`DefenceSpec`].

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use jem_attacks::{
    Classifier, GradMode, HessianVector, LossFn, Model, SgldConfig, SgldDefence, SgldDefenceConfig,
    SgldSampler, Undefended,
};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use std::path::Path;

use crate::model::{LoadedNetwork, ModelInfo, Sidecar};
use crate::settings::{self, InvalidSetting};
use crate::tables::first_repeat;
use crate::train::JemConfig;

/// How the defence runs, recorded with every result: chains, confirmation chains, initial
/// noise, and overrides of the model's own SGLD settings (the command line's `--chains`,
/// `--recheck-chains`, … set them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DefenceSpec {
    /// SGLD chains per input whose logits are averaged (official attack code: 5).
    pub chains: usize,
    /// Chains that confirm a break of a stochastic defence (Hill et al. 2021 used 150).
    pub recheck_chains: usize,
    /// Gaussian noise added to the input before the chains start, on the network scale.
    pub init_noise: f32,
    /// SGLD step size α on the network's scale (`None`: the model's own JEM training setting;
    /// the paper's 1.0 for models trained otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sgld_step_size: Option<f32>,
    /// SGLD noise σ on the network's scale (`None`: the model's setting; the paper's 0.01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sgld_noise: Option<f32>,
    /// Clamp the defence's chains to [0, 1] pixels after every step (`None`: the model's
    /// training setting; the official defence does not clamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sgld_clamp: Option<bool>,
}

impl Default for DefenceSpec {
    /// 5 chains, 20 to confirm a break, no initial noise, the model's own SGLD settings.
    fn default() -> Self {
        DefenceSpec {
            chains: 5,
            recheck_chains: 20,
            init_noise: 0.0,
            sgld_step_size: None,
            sgld_noise: None,
            sgld_clamp: None,
        }
    }
}

impl DefenceSpec {
    /// Checks the settings (counts at least 1, finite non-negative step sizes); an error is an
    /// [`InvalidSetting`] naming the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (field, value) in [
            ("chains", self.chains),
            ("recheck_chains", self.recheck_chains),
        ] {
            settings::at_least_one(field, value)?;
        }
        for (field, value) in [
            ("init_noise", Some(self.init_noise)),
            ("sgld_step_size", self.sgld_step_size),
            ("sgld_noise", self.sgld_noise),
        ] {
            value.map_or(Ok(()), |v| settings::finite_non_negative(field, v))?;
        }
        Ok(())
    }
}

/// The defence's sampler settings of a checkpoint: its own JEM training settings (the paper's
/// for models trained otherwise), on its input normalisation's scale.
pub fn sgld_of(sidecar: &Sidecar) -> anyhow::Result<SgldConfig> {
    Ok(JemConfig::of(sidecar)
        .map_err(|e| anyhow::anyhow!("the SGLD defence (K > 0): {e}"))?
        .sampler(&sidecar.architecture.input_normalization)
        .config)
}

/// Everything the defence of a model at K steps runs with: the model's own SGLD settings
/// (`base`) with the flags' overrides. `None` for K = 0.
fn configs(
    base: Option<&SgldConfig>,
    steps: usize,
    grad: GradMode,
    args: &DefenceSpec,
) -> anyhow::Result<Option<(SgldConfig, SgldDefenceConfig)>> {
    if steps == 0 {
        return Ok(None);
    }
    let mut sgld = base.cloned().ok_or_else(|| {
        anyhow::anyhow!("K = {steps}: the model has no SGLD settings for the defence")
    })?;
    sgld.steps = steps;
    sgld.step_size = args.sgld_step_size.unwrap_or(sgld.step_size);
    sgld.noise = args.sgld_noise.unwrap_or(sgld.noise);
    sgld.clamp = args.sgld_clamp.unwrap_or(sgld.clamp);
    let defence = SgldDefenceConfig {
        chains: args.chains,
        recheck_chains: args.recheck_chains,
        init_noise: args.init_noise,
        grad,
        hvp: HessianVector::PiecewiseLinear,
        hvp_step: 1e-3,
    };
    Ok(Some((sgld, defence)))
}

/// The settings of the defence in force, for every output row: `{}` for K = 0.
pub fn settings(
    base: Option<&SgldConfig>,
    steps: usize,
    grad: GradMode,
    args: &DefenceSpec,
) -> anyhow::Result<serde_json::Value> {
    Ok(match configs(base, steps, grad, args)? {
        None => serde_json::json!({}),
        Some((sgld, defence)) => serde_json::json!({ "sgld": sgld, "defence": defence }),
    })
}

/// [`settings`] for a run that takes no gradient through the defence (logits only), of the
/// model `model` (its SGLD settings, read only for K > 0): the gradient mode, which then plays
/// no part, is left out.
pub fn forward_settings(
    model: &ModelInfo,
    steps: usize,
    args: &DefenceSpec,
) -> anyhow::Result<serde_json::Value> {
    let base = if steps > 0 { Some(model.sgld()?) } else { None };
    let mut s = settings(base.as_ref(), steps, GradMode::Bpda, args)?;
    if let Some(d) = s.get_mut("defence").and_then(|d| d.as_object_mut()) {
        d.remove("grad");
    }
    Ok(s)
}

/// The models `models` (`--models`: Wide-ResNet checkpoints or graphs imported from ONNX), each
/// loaded onto `device`, and checked by `check` for what the defence needs at every K of
/// `steps`, before a command does any work: the first step of every command that evaluates a
/// list of models under the defence. A failure is a refusal of `models` naming the model.
pub fn checked_models<B: jem_kernels::Kernels>(
    models: &[std::path::PathBuf],
    steps: &[usize],
    device: &B::Device,
    check: impl Fn(&ModelInfo, usize) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<(LoadedNetwork<B>, ModelInfo)>> {
    if let Some(m) = first_repeat(models) {
        let value = m.display().to_string();
        return Err(InvalidSetting::new("models", value, "named twice").into());
    }
    models
        .iter()
        .map(|path| {
            let (network, info) = ModelInfo::load_setting::<B>(path, "models", device)?;
            for &k in steps {
                check(&info, k).map_err(|e| {
                    let e = e.context(format!("the SGLD defence (K = {k})"));
                    settings::refusal("models", path.display(), e)
                })?;
            }
            Ok((network, info))
        })
        .collect()
}

/// A network as the attacks see it at K sampling steps.
pub enum Defended<N> {
    Plain(Undefended<N>),
    Sgld(SgldDefence<N>),
}

impl<B: crate::backend::BenchBackend> Defended<LoadedNetwork<B>> {
    /// The model at `path` (a Wide-ResNet checkpoint or a graph imported from ONNX) behind the
    /// defence at K = `steps`, run with the model's own SGLD settings
    /// ([`ModelInfo::sgld`], read for K > 0 only) and `spec`'s overrides.
    pub fn load(
        path: &Path,
        steps: usize,
        grad: GradMode,
        spec: &DefenceSpec,
        device: &B::Device,
    ) -> anyhow::Result<Self> {
        let (model, info) = ModelInfo::load::<B>(path, device)?;
        let base = if steps > 0 { Some(info.sgld()?) } else { None };
        Defended::new(model, base.as_ref(), steps, grad, spec)
    }
}

impl<N> Defended<N> {
    /// `steps` = K; K = 0 is the plain classifier. `base`: the model's SGLD settings.
    pub fn new<B>(
        model: N,
        base: Option<&SgldConfig>,
        steps: usize,
        grad: GradMode,
        args: &DefenceSpec,
    ) -> anyhow::Result<Self>
    where
        B: AutodiffBackend,
        N: Classifier<B> + Module<B>,
    {
        Ok(match configs(base, steps, grad, args)? {
            None => Defended::Plain(Undefended::new(model)),
            Some((sgld, defence)) => {
                Defended::Sgld(SgldDefence::new(model, SgldSampler::new(sgld), defence))
            }
        })
    }
}

impl<B: AutodiffBackend, N: Classifier<B>> Model<B> for Defended<N> {
    fn logits(
        &self,
        x: Tensor<B::InnerBackend, 4>,
        rng: &mut StdRng,
    ) -> Tensor<B::InnerBackend, 2> {
        match self {
            Defended::Plain(m) => m.logits(x, rng),
            Defended::Sgld(m) => m.logits(x, rng),
        }
    }

    fn loss_gradient(
        &self,
        x: Tensor<B::InnerBackend, 4>,
        loss: LossFn<'_, B>,
        rng: &mut StdRng,
    ) -> (Tensor<B::InnerBackend, 4>, Tensor<B::InnerBackend, 2>) {
        match self {
            Defended::Plain(m) => m.loss_gradient(x, loss, rng),
            Defended::Sgld(m) => m.loss_gradient(x, loss, rng),
        }
    }

    fn is_stochastic(&self) -> bool {
        match self {
            Defended::Plain(m) => Model::<B>::is_stochastic(m),
            Defended::Sgld(m) => Model::<B>::is_stochastic(m),
        }
    }

    fn recheck_logits(
        &self,
        x: Tensor<B::InnerBackend, 4>,
        rng: &mut StdRng,
    ) -> Tensor<B::InnerBackend, 2> {
        match self {
            Defended::Plain(m) => m.recheck_logits(x, rng),
            Defended::Sgld(m) => m.recheck_logits(x, rng),
        }
    }

    fn describe(&self) -> String {
        match self {
            Defended::Plain(m) => Model::<B>::describe(m),
            Defended::Sgld(m) => Model::<B>::describe(m),
        }
    }
}
