//! Evaluating a model of your own: a small burn CNN (not a Wide-ResNet) is trained on MNIST
//! for one epoch, wrapped as a sweep subject, and attacked with PGD under L∞ without a
//! defence (K = 0) and behind JEM's SGLD defence (K = 1, gradients through the sampler by BPDA
//! and in full). The sweep writes what `jem-bench robust` writes: `robust.csv` (with 95 %
//! intervals and the per-example worst case), `examples.csv`, `summary.json` with the sanity
//! checks, and the robustness curves.
//!
//! ```text
//! cargo run --release --example own_model -- [--out DIR] [--n-examples N]
//! ```
//!
//! Rerunning the same command resumes (finished cells are kept): training is seeded, so the
//! weights, and hence the sweep's settings, are the same every time.

use anyhow::Context;
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use jem_attacks::{Classifier, GradMode, Norm};
use jem_bench::backend::{self, Train};
use jem_bench::harness::{
    sweep, AttackKind, Examples, Runner, Subject, SweepSpec, TerminalProgress, Threat,
};
use jem_datasets::{DataSource, ImageSet, Split};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::num::NonZeroUsize;

/// Two strided 3×3 convolutions and a linear layer: 28×28 → 14×14×8 → 7×7×16 → 10 logits.
#[derive(Module, Debug)]
struct SmallCnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    head: Linear<B>,
}

impl<B: Backend> SmallCnn<B> {
    fn new(classes: usize, device: &B::Device) -> Self {
        let conv = |cin, cout| {
            Conv2dConfig::new([cin, cout], [3, 3])
                .with_stride([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        Self {
            conv1: conv(1, 8),
            conv2: conv(8, 16),
            head: LinearConfig::new(16 * 7 * 7, classes).init(device),
        }
    }
}

/// What the attacks and the sweep need: [0, 1] pixels in, logits out.
impl<B: Backend> Classifier<B> for SmallCnn<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = x * 2.0 - 1.0; // JEM's [−1, 1] input scale
        let x = relu(self.conv1.forward(x));
        let x = relu(self.conv2.forward(x));
        self.head.forward(x.flatten(1, 3))
    }
}

/// Adam, batch 64, `steps` steps over a seeded shuffle of the training images.
fn train(train: &ImageSet, steps: usize, seed: u64) -> SmallCnn<Train> {
    let device = backend::device();
    Train::seed(&device, seed);
    let mut model = SmallCnn::<Train>::new(train.num_classes(), &device);
    let mut optim = AdamConfig::new().init::<Train, SmallCnn<Train>>();
    let mut order: Vec<usize> = (0..train.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let loss = CrossEntropyLossConfig::new().init(&device);
    for (step, batch) in order.chunks(64).take(steps).enumerate() {
        let x = jem_bench::batches::images::<Train>(train, batch, &device);
        let y = jem_bench::batches::labels::<Train>(train, batch, &device);
        let l = loss.forward(model.logits(x), y);
        if step % 100 == 0 {
            println!("step {step}: loss {:.3}", l.clone().into_scalar());
        }
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    model
}

fn accuracy(model: &SmallCnn<Train>, test: &ImageSet) -> f64 {
    let device = backend::device();
    let idx: Vec<usize> = (0..test.len()).collect();
    let mut correct = 0;
    for chunk in idx.chunks(500) {
        let x = jem_bench::batches::images::<Train>(test, chunk, &device);
        let predicted: Vec<i64> = model
            .logits(x)
            .argmax(1)
            .into_data()
            .convert::<i64>()
            .to_vec()
            .unwrap();
        correct += chunk
            .iter()
            .zip(&predicted)
            .filter(|(&i, &p)| test.labels[i] as i64 == p)
            .count();
    }
    correct as f64 / test.len() as f64
}

fn main() -> anyhow::Result<()> {
    let mut out = std::path::PathBuf::from("runs/example-own-model");
    let mut n_examples = 100;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--out", Some(v)) => out = v.into(),
            ("--n-examples", Some(v)) => n_examples = v.parse()?,
            (other, _) => anyhow::bail!("{other}: expected --out DIR or --n-examples N"),
        }
    }
    let mnist = DataSource::parse("mnist")?;
    let (train_set, test_set) = (mnist.load(Split::Train)?, mnist.load(Split::Test)?);
    let model = train(&train_set, 900, 0);
    println!(
        "clean test accuracy: {:.2} %",
        100.0 * accuracy(&model, &test_set)
    );

    let subject = Subject::new("small-cnn", model, "mnist")?;
    let spec = SweepSpec {
        attacks: vec![AttackKind::Pgd],
        threat: Threat {
            norm: Norm::Linf,
            eps: vec![0.0, 0.05, 0.1, 0.2],
        },
        ks: vec![0, 1],
        grad: vec![GradMode::Bpda, GradMode::Full],
        examples: Examples::first(
            NonZeroUsize::new(n_examples).context("--n-examples: expected at least 1")?,
        ),
        ..SweepSpec::default()
    };
    // The command line's progress bar and table; `Runner::new(out)` alone runs silently.
    let progress = TerminalProgress::default();
    let runner = Runner {
        observer: &progress,
        ..Runner::new(out)
    };
    let rows = sweep(vec![subject], &spec, &runner)?;
    println!("{} rows in robust.csv", rows.len());
    Ok(())
}
