//! The kernels against burn's own convolution and its autodiff gradients, on random shapes of
//! the Wide-ResNet family and beyond: odd sizes, strides 1 and 2, 1×1 and 3×3 kernels, 1 to 64
//! input channels, batches of 1, 7 and 64, with and without bias, with and without a fused
//! LeakyReLU in front (against burn's LeakyReLU followed by its convolution).

use burn::backend::{Autodiff, Flex};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::PaddingConfig2d;
use burn::tensor::{Distribution, Tensor};
use jem_kernels::{conv2d, conv2d_slices, leaky_relu_conv2d, leaky_relu_conv2d_add, ConvGeometry};
use rand::{Rng, SeedableRng};

type B = Autodiff<Flex>;

struct Case {
    batch: usize,
    cin: usize,
    cout: usize,
    size: [usize; 2],
    kernel: usize,
    stride: usize,
    padding: usize,
    bias: bool,
    /// A LeakyReLU fused in front of the convolution.
    slope: Option<f64>,
}

/// Largest |a − b| relative to the largest |b| (1 where b is all zeros).
fn relative_error(a: Tensor<Flex, 4>, b: Tensor<Flex, 4>) -> f32 {
    let scale = b.clone().abs().max().into_scalar().max(1e-6);
    a.sub(b).abs().max().into_scalar() / scale
}

fn check(case: &Case, seed: u64) {
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, seed);
    let conv: Conv2d<B> = Conv2dConfig::new([case.cin, case.cout], [case.kernel, case.kernel])
        .with_stride([case.stride, case.stride])
        .with_padding(PaddingConfig2d::Explicit(
            case.padding,
            case.padding,
            case.padding,
            case.padding,
        ))
        .with_bias(case.bias)
        .init(&device);
    let [h, w] = case.size;
    let x = Tensor::<B, 4>::random(
        [case.batch, case.cin, h, w],
        Distribution::Normal(0.0, 1.0),
        &device,
    )
    .require_grad();
    let (ours, burns) = match case.slope {
        Some(slope) => (
            leaky_relu_conv2d(&conv, x.clone(), slope),
            conv.forward(burn::tensor::activation::leaky_relu(x.clone(), slope)),
        ),
        None => (conv2d(&conv, x.clone()), conv.forward(x.clone())),
    };
    let label = format!(
        "batch {} in {} out {} size {h}×{w} kernel {} stride {} pad {} bias {} leaky {:?}",
        case.batch,
        case.cin,
        case.cout,
        case.kernel,
        case.stride,
        case.padding,
        case.bias,
        case.slope
    );
    assert_eq!(ours.dims(), burns.dims(), "{label}: shape");
    let forward = relative_error(ours.clone().inner(), burns.clone().inner());
    assert!(forward < 1e-4, "{label}: forward off by {forward}");

    // A random output gradient, so that every output element matters differently.
    let weights = Tensor::<B, 4>::random(ours.dims(), Distribution::Normal(0.0, 1.0), &device);
    let grads_ours = (ours * weights.clone()).sum().backward();
    let grads_burns = (burns * weights).sum().backward();
    let dx = relative_error(x.grad(&grads_ours).unwrap(), x.grad(&grads_burns).unwrap());
    assert!(dx < 1e-4, "{label}: input gradient off by {dx}");
    let dw = relative_error(
        conv.weight.val().grad(&grads_ours).unwrap(),
        conv.weight.val().grad(&grads_burns).unwrap(),
    );
    assert!(dw < 1e-4, "{label}: weight gradient off by {dw}");
    if let Some(bias) = &conv.bias {
        let (a, b) = (
            bias.val().grad(&grads_ours).unwrap(),
            bias.val().grad(&grads_burns).unwrap(),
        );
        let scale = b.clone().abs().max().into_scalar().max(1e-6);
        let db = a.sub(b).abs().max().into_scalar() / scale;
        assert!(db < 1e-4, "{label}: bias gradient off by {db}");
    }
}

#[test]
fn the_wide_resnet_layers_match_burn() {
    // Every convolution of WRN-10-1 and WRN-16-2 on 28×28 and 32×32 inputs, batch 7.
    let layers = [
        (1, 16, 3, 1, [28, 28]),
        (3, 16, 3, 1, [32, 32]),
        (16, 16, 3, 1, [28, 28]),
        (16, 32, 3, 1, [28, 28]),
        (32, 32, 3, 2, [28, 28]),
        (16, 32, 1, 2, [28, 28]),
        (32, 64, 3, 1, [14, 14]),
        (64, 64, 3, 2, [14, 14]),
        (32, 64, 1, 2, [14, 14]),
        (16, 32, 1, 1, [16, 16]),
        (64, 128, 3, 2, [16, 16]),
    ];
    for (i, &(cin, cout, kernel, stride, size)) in layers.iter().enumerate() {
        let padding = kernel / 2;
        // As a plain convolution and with the block's LeakyReLU (slope 0.2) fused in front.
        for slope in [None, Some(0.2)] {
            check(
                &Case {
                    batch: 7,
                    cin,
                    cout,
                    size,
                    kernel,
                    stride,
                    padding,
                    bias: true,
                    slope,
                },
                i as u64,
            );
        }
    }
}

#[test]
fn random_shapes_match_burn() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(2020);
    for trial in 0..40 {
        let kernel = [1, 3][rng.random_range(0..2)];
        let padding = if kernel == 1 {
            rng.random_range(0..2)
        } else {
            rng.random_range(0..3)
        };
        let size = [rng.random_range(kernel..14), rng.random_range(kernel..14)];
        let case = Case {
            batch: [1, 7, 64][rng.random_range(0..3)],
            cin: [1, 3, 16, 64][rng.random_range(0..4)],
            cout: rng.random_range(1..40),
            size,
            kernel,
            stride: rng.random_range(1..3),
            padding,
            bias: rng.random_bool(0.5),
            slope: [None, Some(0.2), Some(0.01)][rng.random_range(0..3)],
        };
        check(&case, 100 + trial);
    }
}

#[test]
fn batch_64_on_a_full_layer_matches_burn() {
    check(
        &Case {
            batch: 64,
            cin: 16,
            cout: 16,
            size: [28, 28],
            kernel: 3,
            stride: 1,
            padding: 1,
            bias: true,
            slope: Some(0.2),
        },
        7,
    );
    check(
        &Case {
            batch: 64,
            cin: 32,
            cout: 32,
            size: [28, 28],
            kernel: 3,
            stride: 2,
            padding: 1,
            bias: true,
            slope: None,
        },
        8,
    );
}

#[test]
fn same_padding_with_an_even_kernel_goes_through_burn() {
    // Asymmetric padding: the module helper must give burn's answer, not a shifted one.
    let device = Default::default();
    let conv: Conv2d<Flex> = Conv2dConfig::new([2, 3], [2, 2])
        .with_padding(PaddingConfig2d::Same)
        .init(&device);
    let x = Tensor::<Flex, 4>::random([2, 2, 5, 6], Distribution::Default, &device);
    let error = relative_error(conv2d(&conv, x.clone()), conv.forward(x));
    assert!(error < 1e-6, "off by {error}");
}

#[test]
fn results_are_the_same_bits_for_one_and_two_threads() {
    let g = ConvGeometry {
        batch: 64,
        in_channels: 16,
        height: 28,
        width: 28,
        out_channels: 32,
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut draw = |n: usize| {
        (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect::<Vec<_>>()
    };
    let x = draw(64 * 16 * 28 * 28);
    let w = draw(32 * 16 * 9);
    let grad = draw(64 * 32 * 14 * 14);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            (
                conv2d_slices(&x, &w, None, &g, Some(0.2)),
                jem_kernels::conv2d_input_grad(&grad, &w, &g, Some((&x, 0.2))),
                jem_kernels::conv2d_weight_grad(&x, &grad, &g, Some(0.2)),
            )
        })
    };
    assert!(run(1) == run(2), "a result depends on the thread count");
}

/// A block's last convolution with its shortcut added in the same operation
/// ([`leaky_relu_conv2d_add`]) against burn's convolution of the LeakyReLU followed by the
/// addition: the output, and the gradients of the input, the weight, the bias and the
/// residual (which must get the output's own).
#[test]
fn the_residual_addition_matches_burn() {
    let device = Default::default();
    for (cin, cout, stride, size) in [(16, 16, 1, 28), (16, 32, 2, 28), (32, 64, 1, 14)] {
        <B as burn::tensor::backend::Backend>::seed(&device, cin as u64 + cout as u64);
        let conv: Conv2d<B> = Conv2dConfig::new([cin, cout], [3, 3])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
            .init(&device);
        let out_size = (size - 1) / stride + 1;
        let random = |dims: [usize; 4]| {
            Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), &device).require_grad()
        };
        let x = random([5, cin, size, size]);
        let residual = random([5, cout, out_size, out_size]);
        let ours = leaky_relu_conv2d_add(&conv, x.clone(), 0.2, residual.clone());
        let burns =
            conv.forward(burn::tensor::activation::leaky_relu(x.clone(), 0.2)) + residual.clone();
        let label = format!("{cin}→{cout} stride {stride} on {size}×{size}");
        let forward = relative_error(ours.clone().inner(), burns.clone().inner());
        assert!(forward < 1e-4, "{label}: forward off by {forward}");

        let weights = Tensor::<B, 4>::random(ours.dims(), Distribution::Normal(0.0, 1.0), &device);
        let grads_ours = (ours * weights.clone()).sum().backward();
        let grads_burns = (burns * weights.clone()).sum().backward();
        let grad = |t: &Tensor<B, 4>| (t.grad(&grads_ours).unwrap(), t.grad(&grads_burns).unwrap());
        for (what, (a, b)) in [("input", grad(&x)), ("residual", grad(&residual))] {
            let d = relative_error(a, b);
            assert!(d < 1e-4, "{label}: {what} gradient off by {d}");
        }
        let (dr, _) = grad(&residual);
        assert_eq!(
            dr.into_data().to_vec::<f32>().unwrap(),
            weights.inner().into_data().to_vec::<f32>().unwrap(),
            "{label}: the residual's gradient is the output's"
        );
        let weight = conv.weight.val();
        let dw = relative_error(
            weight.grad(&grads_ours).unwrap(),
            weight.grad(&grads_burns).unwrap(),
        );
        assert!(dw < 1e-4, "{label}: weight gradient off by {dw}");
        let bias = conv.bias.as_ref().unwrap().val();
        let (a, b) = (
            bias.grad(&grads_ours).unwrap(),
            bias.grad(&grads_burns).unwrap(),
        );
        let db = a.sub(b.clone()).abs().max().into_scalar() / b.abs().max().into_scalar();
        assert!(db < 1e-4, "{label}: bias gradient off by {db}");
    }
}
