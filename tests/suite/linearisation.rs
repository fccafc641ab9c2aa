//! A Wide-ResNet's linearisation (`Classifier::linearise`), which the SGLD defence's exact
//! Hessian-vector products use: J v against central differences of the logits (continuous and
//! piecewise linear, so differences converge), Jᵀ u against reverse mode through the network
//! itself, and the full gradient through SGLD steps against the defence's fallback that differences
//! logits instead — on the embedded JEM (LeakyReLU, biases) and a RobustBench-layout network
//! (BatchNorm with running statistics, ReLU, bias-free convolutions).
//!
//! (The defended map itself is checked against finite differences in jem-attacks' tests, on a
//! linear and a smooth network: on a LeakyReLU WRN it is discontinuous, since ∇ₓLSE jumps at
//! every activation kink and an SGLD step moves by it.)

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use jem_attacks::{
    AttackLoss, Classifier, GradMode, HessianVector, Model, SgldConfig, SgldDefence,
    SgldDefenceConfig, SgldSampler,
};
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches::{self, to_vec};
use jem_bench::model::{Checkpoint, WideResNet, WideResNetConfig};
use jem_datasets::{embedded, Split};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn embedded_jem() -> WideResNet<Train> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/jem");
    Checkpoint::at(path)
        .load::<Train>(&backend::device())
        .unwrap()
        .0
}

/// A RobustBench-layout WRN-10-1 for one-channel digits, with weights drawn from seed 3 and
/// BatchNorm statistics set away from the identity, so that scale and shift both matter.
fn robustbench_network() -> WideResNet<Train> {
    let device = backend::device();
    let mut net = WideResNetConfig::robustbench(10, 1, 1, 10)
        .init_seeded::<Train>(3, &device)
        .unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let mut perturb = |bn: &mut Option<burn::nn::BatchNorm<Train>>| {
        if let Some(bn) = bn {
            let c = bn.gamma.dims()[0];
            let mut draw = |lo: f32, hi: f32| {
                let v: Vec<f32> = (0..c).map(|_| rng.random_range(lo..hi)).collect();
                Tensor::<Train, 1>::from_data(TensorData::new(v, [c]), &device)
            };
            bn.gamma = burn::module::Param::from_tensor(draw(0.5, 1.5));
            bn.beta = burn::module::Param::from_tensor(draw(-0.3, 0.3));
            bn.running_mean = burn::module::RunningState::new(draw(-0.2, 0.2));
            bn.running_var = burn::module::RunningState::new(draw(0.5, 2.0));
        }
    };
    for block in net
        .layer1
        .iter_mut()
        .chain(&mut net.layer2)
        .chain(&mut net.layer3)
    {
        perturb(&mut block.bn1);
        perturb(&mut block.bn2);
    }
    perturb(&mut net.bn1);
    net
}

fn digits(n: usize) -> Tensor<Inference, 4> {
    let set = embedded::mnist(Split::Test).unwrap();
    let idx: Vec<usize> = (0..n).collect();
    batches::images::<Inference>(&set, &idx, &backend::device())
}

fn random_direction(like: &Tensor<Inference, 4>, seed: u64) -> Tensor<Inference, 4> {
    let mut rng = StdRng::seed_from_u64(seed);
    let dims = like.dims();
    let v: Vec<f32> = (0..dims.iter().product::<usize>())
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    Tensor::from_data(TensorData::new(v, dims), &backend::device())
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt()
}

fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: Vec<f32> = a.iter().zip(b).map(|(a, b)| a - b).collect();
    norm(&diff) / norm(b).max(1e-12)
}

/// Checks one network's linearisation at three test digits.
fn check_linearisation(net: &WideResNet<Train>, what: &str) {
    let net = net.clone().no_grad();
    let x = digits(3);
    let v = random_direction(&x, 11);

    // The recording pass computes the same logits as the plain one.
    let (logits, jacobian) = net
        .linearise(Tensor::from_inner(x.clone()))
        .expect("a WRN linearises itself");
    let plain = net.forward(Tensor::from_inner(x.clone()));
    assert_eq!(
        to_vec(logits.clone().inner()),
        to_vec(plain.inner()),
        "{what}: logits"
    );

    // J v against central differences of the logits (h in pixels, away from f32 noise but
    // short enough that few kinks are crossed).
    let jv = to_vec(jacobian(Tensor::from_inner(v.clone())).inner());
    // Row k of J is ∇ₓ f_k, which reverse mode through the network itself gives exactly:
    // (J v)_k = ⟨∇ₓ f_k, v⟩ for every class k.
    let [n, k] = logits.dims();
    let mut reference = vec![0.0f32; n * k];
    for class in 0..k {
        let at = Tensor::<Train, 4>::from_inner(x.clone()).require_grad();
        let logit = net.forward(at.clone()).slice([0..n, class..class + 1]);
        let grads = logit.sum().backward();
        let row = at.grad(&grads).unwrap();
        let dots = to_vec(
            (row * v.clone())
                .sum_dim(3)
                .sum_dim(2)
                .sum_dim(1)
                .reshape([n]),
        );
        for (i, d) in dots.iter().enumerate() {
            reference[i * k + class] = *d;
        }
    }
    let err = relative_difference(&jv, &reference);
    println!("{what}: |Jv - rows of J by reverse mode| / |Jv| = {err:.2e}");
    assert!(
        err < 1e-5,
        "{what}: J v differs from the network's own gradients by {err}"
    );

    // And against central differences of the logits, the smallest error over four step
    // lengths h (pixels): long steps cross kinks, short ones drown in f32 rounding. On the
    // WRN-10-2 JEM the two meet near h = 3e-4, under 1 % (0.6 % on these digits; 0.3–2 % each
    // on the first eight, against 3–26 % at 1e-2 and 1–8 % at 1e-4), hence 2 %: a wrong
    // Jacobian (a slope, a bias, the input normalisation) is off by tens of percent. Only the
    // JEM: a freshly drawn ReLU network has whole channels of background pixels sitting at
    // nearly the same pre-activation, so any step flips many kinks at once.
    if what.contains("JEM") {
        let at = |s: f32| {
            to_vec(
                net.forward(Tensor::from_inner(x.clone() + v.clone() * s))
                    .inner(),
            )
        };
        let steps = [1e-2f32, 1e-3, 3e-4, 1e-4];
        let errors: Vec<f64> = steps
            .iter()
            .map(|&h| {
                let fd: Vec<f32> = at(h)
                    .iter()
                    .zip(at(-h))
                    .map(|(p, m)| (p - m) / (2.0 * h))
                    .collect();
                relative_difference(&jv, &fd)
            })
            .collect();
        println!("{what}: |Jv - central differences| / |Jv| at h = {steps:?}: {errors:?}");
        let err = errors.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!(
            err < 2e-2,
            "{what}: J v differs from central differences by {err}"
        );
    }

    // Linear in v, as a Jacobian is: J(2v) = 2 J v.
    let j2v = to_vec(jacobian(Tensor::from_inner(v.clone() * 2.0)).inner());
    let doubled: Vec<f32> = jv.iter().map(|a| 2.0 * a).collect();
    assert!(
        relative_difference(&j2v, &doubled) < 1e-6,
        "{what}: not linear"
    );

    // Jᵀ u by reverse mode through the linearisation equals reverse mode through the network.
    let u: Tensor<Inference, 2> = random_direction(&x, 12)
        .reshape([n, 28 * 28])
        .slice([0..n, 0..k]);
    let through = |f: &dyn Fn(Tensor<Train, 4>) -> Tensor<Train, 2>, at: Tensor<Inference, 4>| {
        let at = Tensor::<Train, 4>::from_inner(at).require_grad();
        let grads = (f(at.clone()) * Tensor::from_inner(u.clone()))
            .sum()
            .backward();
        to_vec(at.grad(&grads).unwrap())
    };
    let jtu_linearised = through(&|t| jacobian(t), v.clone());
    let jtu_network = through(&|t| net.forward(t), x.clone());
    let err = relative_difference(&jtu_linearised, &jtu_network);
    println!("{what}: |Jᵀu (linearised) - Jᵀu (network)| / |Jᵀu| = {err:.2e}");
    assert!(err < 1e-5, "{what}: Jᵀ u differs by {err}");
}

#[test]
fn a_wide_resnet_linearises_exactly() {
    check_linearisation(&embedded_jem(), "embedded JEM");
    check_linearisation(&robustbench_network(), "RobustBench layout");
}

/// The classifier without its linearisation: the defence forms J v by central differences.
#[derive(Module, Debug)]
struct LogitsOnly<B: Backend> {
    net: WideResNet<B>,
}

impl<B: jem_kernels::Kernels> Classifier<B> for LogitsOnly<B> {
    fn logits(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        self.net.forward(x)
    }
}

fn defence<M: Classifier<Train> + Module<Train>>(net: M, steps: usize) -> SgldDefence<M> {
    let sampler = SgldSampler::new(SgldConfig {
        steps,
        step_size: 1.0,
        noise: 0.01,
        pixel_scale: vec![0.5],
        clamp: false,
    });
    let config = SgldDefenceConfig {
        chains: 2,
        recheck_chains: 2,
        init_noise: 0.0,
        grad: GradMode::Full,
        hvp: HessianVector::PiecewiseLinear,
        hvp_step: 1e-3,
    };
    SgldDefence::new(net, sampler, config)
}

#[test]
fn full_gradients_through_sgld_from_the_linearisation_match_the_difference_fallback() {
    let net = embedded_jem();
    let x = digits(4);
    let set = embedded::mnist(Split::Test).unwrap();
    let y: Vec<i64> = set.labels[..4].iter().map(|&l| l as i64).collect();
    let y = Tensor::<Inference, 1, Int>::from_data(TensorData::new(y, [4]), &backend::device());
    let loss = |l: Tensor<Train, 2>| AttackLoss::CrossEntropy.of(l, Tensor::from_inner(y.clone()));
    for steps in [1, 5] {
        let exact = defence(net.clone(), steps);
        let differences = defence(LogitsOnly { net: net.clone() }, steps);
        let gradient = |m: &dyn Model<Train>| {
            let (g, logits) = m.loss_gradient(x.clone(), &loss, &mut StdRng::seed_from_u64(9));
            (to_vec(g), to_vec(logits))
        };
        let (g_exact, l_exact) = gradient(&exact);
        let (g_diff, l_diff) = gradient(&differences);
        // Same chains (same noise), same logits: only the Hessian-vector products differ.
        assert!(
            relative_difference(&l_exact, &l_diff) < 1e-5,
            "K={steps}: logits"
        );
        // What the Hessian-vector products contribute is the full gradient minus BPDA's (the
        // steps taken as the identity): compare that part, so that a small contribution
        // cannot hide an error in it.
        let bpda = SgldDefence::new(
            net.clone(),
            exact.sampler.clone(),
            SgldDefenceConfig {
                grad: GradMode::Bpda,
                ..exact.config.clone()
            },
        );
        let (g_bpda, _) = gradient(&bpda);
        let minus_bpda =
            |g: &[f32]| -> Vec<f32> { g.iter().zip(&g_bpda).map(|(a, b)| a - b).collect() };
        let (steps_exact, steps_diff) = (minus_bpda(&g_exact), minus_bpda(&g_diff));
        let err = relative_difference(&steps_exact, &steps_diff);
        println!(
            "K={steps}: steps' contribution {:.2e} of the gradient; exact vs differences {err:.2e}",
            norm(&steps_diff) / norm(&g_diff)
        );
        assert!(
            err < 2e-2,
            "K={steps}: the steps' contributions differ by {err}"
        );
    }
}
