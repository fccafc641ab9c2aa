//! Cost of the two hot loops on this machine: one Adam training step, and one d(Σ LSE)/d input
//! (the SGLD / attack gradient), for the default WRN-10-1 on MNIST-shaped batches of 64, plus the
//! WRN-16-2 row for comparison with PyTorch figures measured on the same machine.
//!
//! cargo bench --bench train_step

use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Distribution, Int, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::energy::lse_input_gradient;
use jem_bench::model::WideResNetConfig;
use jem_bench::train::cross_entropy;

fn bench(c: &mut Criterion) {
    let device = backend::device();
    for (depth, width) in [(10, 1), (16, 2)] {
        let cfg = WideResNetConfig::new(depth, width, 1, 10);
        let name = cfg.name();
        let x =
            Tensor::<Train, 4>::random([64, 1, 28, 28], Distribution::Uniform(0.0, 1.0), &device);
        let y = Tensor::<Train, 1, Int>::random([64], Distribution::Uniform(0.0, 10.0), &device);
        let mut model = Some(cfg.init::<Train>(&device).unwrap());
        let mut optim = AdamConfig::new().init::<Train, _>();
        let mut group = c.benchmark_group(format!("{name} batch 64"));
        group.sample_size(10);
        group.bench_function("train step (forward, backward, Adam)", |b| {
            b.iter(|| {
                let m = model.take().unwrap();
                let loss = cross_entropy(m.forward(x.clone()), y.clone());
                let grads = GradientsParams::from_grads(loss.backward(), &m);
                model = Some(optim.step(1e-4, m, grads));
            })
        });
        let frozen = model.as_ref().unwrap().clone().no_grad();
        let xi: Tensor<Inference, 4> = x.clone().inner();
        group.bench_function("d(sum LSE)/d input", |b| {
            b.iter(|| lse_input_gradient(&frozen, xi.clone()).into_data())
        });
        let inference = frozen.valid();
        group.bench_function("forward", |b| {
            b.iter(|| inference.forward(xi.clone()).into_data())
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
