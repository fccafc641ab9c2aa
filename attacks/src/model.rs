//! What an attack sees: a classifier, possibly behind a stochastic defence, that gives logits
//! and input gradients of a loss. Attacks are written against [`Model`] only, so that the
//! same attack runs on an undefended network, on JEM-K (SGLD before classifying), and on any
//! other network that implements [`Classifier`].

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use rand::rngs::StdRng;

use crate::classifier::{input_gradient, Classifier};

/// A per-example loss of the logits that an attack maximises.
pub type LossFn<'a, B> = &'a dyn Fn(Tensor<B, 2>) -> Tensor<B, 1>;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A classifier as an attack sees it, possibly behind a stochastic defence: logits, and input
/// gradients of a loss. Tensors live on `B`'s inner backend; inputs are `[N, C, H, W]` in [0, 1].
pub trait Model<B: AutodiffBackend> {
    /// Logits of one forward pass; a stochastic model draws its noise from `rng`.
    fn logits(&self, x: Tensor<Inner<B>, 4>, rng: &mut StdRng) -> Tensor<Inner<B>, 2>;

    /// d Σ loss(logits) / d input for one draw of the noise, and that draw's logits.
    fn loss_gradient(
        &self,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        rng: &mut StdRng,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>);

    /// Whether two forward passes of the same input can differ.
    fn is_stochastic(&self) -> bool {
        false
    }

    /// Logits to confirm a break with: a stochastic model uses many more chains than during
    /// the attack (Hill et al. 2021 re-check with 150). Deterministic models: [`Model::logits`].
    fn recheck_logits(&self, x: Tensor<Inner<B>, 4>, rng: &mut StdRng) -> Tensor<Inner<B>, 2> {
        self.logits(x, rng)
    }

    /// A short description for reports (`undefended`, `sgld K=10 n=5 full`, …).
    fn describe(&self) -> String;
}

/// A classifier with no defence (JEM's K = 0).
pub struct Undefended<M> {
    classifier: M,
}

impl<M> Undefended<M> {
    /// `classifier` should not track parameter gradients (`Module::no_grad`); this does it.
    pub fn new<B: AutodiffBackend>(classifier: M) -> Self
    where
        M: Module<B>,
    {
        Self {
            classifier: classifier.no_grad(),
        }
    }

    /// The wrapped classifier.
    pub fn classifier(&self) -> &M {
        &self.classifier
    }
}

impl<B: AutodiffBackend, M: Classifier<B>> Model<B> for Undefended<M> {
    fn logits(&self, x: Tensor<Inner<B>, 4>, _rng: &mut StdRng) -> Tensor<Inner<B>, 2> {
        self.classifier.logits(Tensor::from_inner(x)).inner()
    }

    fn loss_gradient(
        &self,
        x: Tensor<Inner<B>, 4>,
        loss: LossFn<'_, B>,
        _rng: &mut StdRng,
    ) -> (Tensor<Inner<B>, 4>, Tensor<Inner<B>, 2>) {
        input_gradient::<B, M>(&self.classifier, x, loss)
    }

    fn describe(&self) -> String {
        "undefended".into()
    }
}
