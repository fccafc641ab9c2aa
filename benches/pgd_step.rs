//! Cost of one PGD step (one gradient of the attack loss through the defence) on the embedded
//! default baseline, for K = 0, 1, 10 SGLD sampling steps with JEM's 5 chains, in both gradient
//! modes; throughput in images per second.
//!
//! cargo bench --bench pgd_step

use burn::tensor::{Int, Tensor, TensorData};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use jem_attacks::{
    AttackLoss, GradMode, HessianVector, Model, SgldDefence, SgldDefenceConfig, Undefended,
};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches;
use jem_bench::model::{Checkpoint, InputNormalization};
use jem_bench::train::JemConfig;
use jem_datasets::{embedded, Split};
use rand::rngs::StdRng;
use rand::SeedableRng;

const BATCH: usize = 16;

fn bench(c: &mut Criterion) {
    let device = backend::device();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/baseline");
    let (model, _) = Checkpoint::at(path).load::<Train>(&device).unwrap();
    let set = embedded::mnist(Split::Test).unwrap();
    let idx: Vec<usize> = (0..BATCH).collect();
    let x = batches::images::<Inference>(&set, &idx, &device);
    let labels: Vec<i64> = idx.iter().map(|&i| set.labels[i] as i64).collect();
    let y = Tensor::<Inference, 1, Int>::from_data(TensorData::new(labels, [BATCH]), &device);
    let yt = Tensor::<Train, 1, Int>::from_inner(y);
    let loss = |l| AttackLoss::CrossEntropy.of(l, yt.clone());

    let mut group = c.benchmark_group(format!("PGD step, WRN-10-1, batch {BATCH}"));
    group.sample_size(10);
    group.throughput(Throughput::Elements(BATCH as u64));
    let plain = Undefended::new(model.clone());
    let mut rng = StdRng::seed_from_u64(0);
    group.bench_function("K=0", |b| {
        b.iter(|| {
            plain
                .loss_gradient(x.clone(), &loss, &mut rng)
                .0
                .into_data()
        })
    });
    let jem = JemConfig::default();
    for k in [1, 10] {
        for grad in [GradMode::Bpda, GradMode::Full] {
            let mut sampler = jem.sampler(&InputNormalization::symmetric(1));
            sampler.config.steps = k;
            let cfg = SgldDefenceConfig {
                chains: 5,
                recheck_chains: 5,
                init_noise: 0.0,
                grad,
                hvp: HessianVector::PiecewiseLinear,
                hvp_step: 1e-3,
            };
            let defended = SgldDefence::new(model.clone(), sampler, cfg);
            group.bench_function(format!("K={k} n=5 {grad}"), |b| {
                b.iter(|| {
                    defended
                        .loss_gradient(x.clone(), &loss, &mut rng)
                        .0
                        .into_data()
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
