//! A checkpoint as the attacks see it: the plain network for K = 0, or JEM's test-time
//! defence (K SGLD steps in n chains, SPEC §3) in front of it, with the SGLD step size and noise
//! taken from the model's own training settings (official JEM values for non-JEM models).

use burn::tensor::Tensor;
use jem_attacks::{
    GradMode, HessianVector, LossFn, Model, SgldDefence, SgldDefenceConfig, Undefended,
};
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::backend::{Inference, Train};
use crate::model::{Sidecar, WideResNet};
use crate::train::JemConfig;

/// How the defence runs, recorded with every result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct DefenceArgs {
    /// SGLD chains per input whose logits are averaged (official attack code: 5).
    #[arg(long, default_value_t = 5)]
    pub chains: usize,
    /// Chains that confirm a break of a stochastic defence (Hill et al. 2021 used 150).
    #[arg(long, default_value_t = 20)]
    pub recheck_chains: usize,
    /// Gaussian noise added to the input before the chains start, on the network scale.
    #[arg(long, default_value_t = 0.0)]
    pub init_noise: f32,
}

pub enum Defended {
    Plain(Undefended<WideResNet<Train>>),
    Sgld(SgldDefence<WideResNet<Train>>),
}

impl Defended {
    /// `steps` = K; K = 0 is the plain classifier.
    pub fn new(
        model: WideResNet<Train>,
        sidecar: &Sidecar,
        steps: usize,
        grad: GradMode,
        args: &DefenceArgs,
    ) -> anyhow::Result<Self> {
        if steps == 0 {
            return Ok(Defended::Plain(Undefended::new(model)));
        }
        let jem = JemConfig::of(sidecar)?;
        let mut sampler = jem.sampler(&sidecar.architecture.input_normalization);
        sampler.config.steps = steps;
        let config = SgldDefenceConfig {
            chains: args.chains,
            recheck_chains: args.recheck_chains,
            init_noise: args.init_noise,
            grad,
            hvp: HessianVector::PiecewiseLinear,
            hvp_step: 1e-3,
        };
        Ok(Defended::Sgld(SgldDefence::new(model, sampler, config)))
    }
}

impl Model<Train> for Defended {
    fn logits(&self, x: Tensor<Inference, 4>, rng: &mut StdRng) -> Tensor<Inference, 2> {
        match self {
            Defended::Plain(m) => m.logits(x, rng),
            Defended::Sgld(m) => m.logits(x, rng),
        }
    }

    fn loss_gradient(
        &self,
        x: Tensor<Inference, 4>,
        loss: LossFn<'_, Train>,
        rng: &mut StdRng,
    ) -> (Tensor<Inference, 4>, Tensor<Inference, 2>) {
        match self {
            Defended::Plain(m) => m.loss_gradient(x, loss, rng),
            Defended::Sgld(m) => m.loss_gradient(x, loss, rng),
        }
    }

    fn is_stochastic(&self) -> bool {
        match self {
            Defended::Plain(m) => Model::<Train>::is_stochastic(m),
            Defended::Sgld(m) => Model::<Train>::is_stochastic(m),
        }
    }

    fn recheck_logits(&self, x: Tensor<Inference, 4>, rng: &mut StdRng) -> Tensor<Inference, 2> {
        match self {
            Defended::Plain(m) => m.recheck_logits(x, rng),
            Defended::Sgld(m) => m.recheck_logits(x, rng),
        }
    }

    fn describe(&self) -> String {
        match self {
            Defended::Plain(m) => Model::<Train>::describe(m),
            Defended::Sgld(m) => Model::<Train>::describe(m),
        }
    }
}
