//! The convolution gradients the CUDA backend computes (jem-kernels' portable construction: the
//! input gradient from a forward convolution, the weight gradient from a matrix product) against
//! burn's own convolution gradients, on the CPU, for every convolution of WRN-10-1 on MNIST and of
//! WRN-16-2 and WRN-28-10 on 3×32×32 inputs, and on geometries beyond them (padding wider than
//! the kernel's reach, strides that leave rows unread, rectangular maps, stride 3).
//!
//! The forward convolution as an unfolded input times the weight (`conv2d_from_matmul`, what a
//! GPU build computes with `JEM_BENCH_GPU_CONV=im2col`) is checked the same way, against burn's
//! forward convolution.
//!
//! CI runs this on every commit, so the construction is proven here; a GPU run then has only its
//! forward convolution and matrix product left to agree with the CPU's (`tests/gpu.rs`).

use burn::backend::Flex;
use burn::tensor::module::conv2d;
use burn::tensor::ops::{ConvOptions, FloatTensor, ModuleOps};
use burn::tensor::{Tensor, TensorPrimitive};
use jem_attacks::noise;
use jem_bench::model::{ConvShape, WideResNetConfig};
use jem_kernels::{
    conv2d_from_matmul, conv2d_input_grad_from_forward, conv2d_weight_grad_from_matmul,
    conv2d_weight_grad_in_chunks, weight_grad_chunks,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

type T = Tensor<Flex, 4>;

fn primitive(t: T) -> FloatTensor<Flex> {
    t.into_primitive().tensor()
}

fn tensor(p: FloatTensor<Flex>) -> T {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// max |a − b| / max |b|.
fn relative_difference(a: T, b: T) -> f32 {
    let scale = b.clone().abs().max().into_scalar();
    assert!(scale > 0.0, "the reference gradient is all zeros");
    a.sub(b).abs().max().into_scalar() / scale
}

/// Both gradients of one convolution and its im2col forward pass, ours against burn's, on
/// standard normal data; the relative differences (input, weight, forward).
fn compare(shape: &ConvShape, batch: usize, rng: &mut StdRng) -> (f32, f32, f32) {
    let device = Default::default();
    let [h, w] = shape.input;
    let [oh, ow] = shape.output();
    let (k, cin, cout) = (shape.kernel, shape.in_channels, shape.out_channels);
    let x: T = noise::gaussian([batch, cin, h, w], rng, &device);
    let weight: T = noise::gaussian([cout, cin, k, k], rng, &device);
    let grad: T = noise::gaussian([batch, cout, oh, ow], rng, &device);
    let options = ConvOptions::new([shape.stride; 2], [shape.padding; 2], [1, 1], 1);
    // The shapes really are one convolution's.
    let y = conv2d(x.clone(), weight.clone(), None, options.clone());
    assert_eq!(y.dims(), grad.dims(), "{shape:?}: output shape");
    let ours_y = tensor(conv2d_from_matmul::<Flex>(
        primitive(x.clone()),
        primitive(weight.clone()),
        None,
        &options,
    ));
    assert_eq!(ours_y.dims(), y.dims(), "{shape:?}: im2col output shape");
    let forward = relative_difference(ours_y, y);

    let (xp, wp, gp) = (
        primitive(x.clone()),
        primitive(weight.clone()),
        primitive(grad),
    );
    let burns_dx = tensor(Flex::conv2d_x_backward(
        xp.clone(),
        wp.clone(),
        gp.clone(),
        options.clone(),
    ));
    let burns_dw = tensor(Flex::conv2d_weight_backward(
        xp.clone(),
        wp.clone(),
        gp.clone(),
        options.clone(),
    ));
    let ours_dx = tensor(conv2d_input_grad_from_forward::<Flex>(
        wp,
        gp.clone(),
        [h, w],
        &options,
    ));
    let ours_dw = tensor(conv2d_weight_grad_from_matmul::<Flex>(
        xp,
        gp,
        [k, k],
        &options,
    ));
    assert_eq!(
        ours_dx.dims(),
        burns_dx.dims(),
        "{shape:?}: input gradient shape"
    );
    assert_eq!(
        ours_dw.dims(),
        burns_dw.dims(),
        "{shape:?}: weight gradient shape"
    );
    (
        relative_difference(ours_dx, burns_dx),
        relative_difference(ours_dw, burns_dw),
        forward,
    )
}

/// f32 sums of up to 640 · 9 products in another order: 1e-5 of the scale is typical, 1e-4
/// leaves room; a wrong index is off by the order of the gradient itself.
const TOLERANCE: f32 = 1e-4;

fn check_all(name: &str, shapes: &[ConvShape], batch: usize) {
    let mut rng = StdRng::seed_from_u64(7);
    let mut failures = Vec::new();
    for shape in shapes {
        let (dx, dw, y) = compare(shape, batch, &mut rng);
        let line = format!("{shape:?}: input {dx:.1e}, weight {dw:.1e}, im2col forward {y:.1e}");
        eprintln!("{name} {line}");
        if dx > TOLERANCE || dw > TOLERANCE || y > TOLERANCE {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: the portable gradients differ from burn's on\n{}",
        failures.join("\n")
    );
}

/// Each distinct convolution of a network, once.
fn distinct(config: &WideResNetConfig, side: usize) -> Vec<ConvShape> {
    let mut shapes = config.convolutions(side, side).unwrap();
    let mut seen = Vec::new();
    shapes.retain(|s| {
        let new = !seen.contains(s);
        seen.push(*s);
        new
    });
    shapes
}

#[test]
fn portable_gradients_match_burns_on_every_wrn_10_1_convolution_on_mnist() {
    let shapes = distinct(&WideResNetConfig::new(10, 1, 1, 10), 28);
    // The two shapes burn 0.21's CUDA backward kernels got wrong are among them.
    let stem = ConvShape {
        in_channels: 1,
        out_channels: 16,
        kernel: 3,
        stride: 1,
        padding: 1,
        input: [28, 28],
    };
    let shortcut = ConvShape {
        in_channels: 32,
        out_channels: 64,
        kernel: 1,
        stride: 2,
        padding: 0,
        input: [14, 14],
    };
    assert!(shapes.contains(&stem) && shapes.contains(&shortcut));
    check_all("WRN-10-1", &shapes, 4);
}

#[test]
fn portable_gradients_match_burns_on_every_wrn_16_2_convolution_on_cifar() {
    check_all(
        "WRN-16-2",
        &distinct(&WideResNetConfig::new(16, 2, 3, 10), 32),
        2,
    );
}

#[test]
fn portable_gradients_match_burns_on_every_wrn_28_10_convolution_on_cifar() {
    let shapes = distinct(&WideResNetConfig::new(28, 10, 3, 10), 32);
    assert!(shapes.iter().any(|s| s.in_channels == 640));
    check_all("WRN-28-10", &shapes, 1);
}

#[test]
fn portable_gradients_match_burns_beyond_the_wide_resnets() {
    let shape = |cin, cout, kernel, stride, padding, input| ConvShape {
        in_channels: cin,
        out_channels: cout,
        kernel,
        stride,
        padding,
        input,
    };
    let shapes = [
        // Padding wider than the kernel reaches: the construction must crop, not pad.
        shape(3, 5, 1, 1, 1, [6, 6]),
        shape(2, 4, 3, 1, 3, [5, 7]),
        // Strides that leave the last rows and columns of the padded input unread.
        shape(4, 6, 3, 2, 0, [10, 9]),
        shape(3, 2, 2, 3, 1, [11, 8]),
        shape(5, 3, 5, 3, 2, [13, 12]),
        // A kernel as large as the padded input: one output pixel.
        shape(2, 3, 5, 1, 0, [5, 5]),
        // One input and one output channel.
        shape(1, 1, 3, 2, 1, [9, 9]),
    ];
    check_all("geometry", &shapes, 3);
}

/// The weight gradient with its reduction (batch × output pixels) split into every number of
/// chunks that divides it, against burn's, on shapes whose sums are short enough to try each:
/// a chunk boundary inside an example, at an example's end, and one chunk per product.
#[test]
fn the_weight_gradient_in_chunks_matches_burns_for_every_chunk_count() {
    let mut rng = StdRng::seed_from_u64(11);
    let device = Default::default();
    let shapes = [
        ConvShape {
            in_channels: 3,
            out_channels: 4,
            kernel: 3,
            stride: 2,
            padding: 1,
            input: [7, 6],
        },
        ConvShape {
            in_channels: 2,
            out_channels: 5,
            kernel: 1,
            stride: 1,
            padding: 0,
            input: [4, 3],
        },
    ];
    let mut tried = 0;
    for shape in shapes {
        let [oh, ow] = shape.output();
        let (k, cin, cout, batch) = (shape.kernel, shape.in_channels, shape.out_channels, 3);
        let x: T = noise::gaussian(
            [batch, cin, shape.input[0], shape.input[1]],
            &mut rng,
            &device,
        );
        let grad: T = noise::gaussian([batch, cout, oh, ow], &mut rng, &device);
        let options = ConvOptions::new([shape.stride; 2], [shape.padding; 2], [1, 1], 1);
        let weight: T = noise::gaussian([cout, cin, k, k], &mut rng, &device);
        let burns = tensor(Flex::conv2d_weight_backward(
            primitive(x.clone()),
            primitive(weight),
            primitive(grad.clone()),
            options.clone(),
        ));
        let products = batch * oh * ow;
        for chunks in (1..=products).filter(|c| products % c == 0) {
            let ours = tensor(conv2d_weight_grad_in_chunks::<Flex>(
                primitive(x.clone()),
                primitive(grad.clone()),
                [k, k],
                &options,
                chunks,
            ));
            let difference = relative_difference(ours, burns.clone());
            assert!(
                difference <= TOLERANCE,
                "{shape:?} in {chunks} chunks: {difference:.1e}"
            );
            tried += 1;
        }
    }
    assert!(tried > 10, "only {tried} chunk counts tried");
    // The WRN-10-1 shapes above run in chunks at their own batch: the split is exercised there.
    assert!(weight_grad_chunks(4 * 28 * 28, 16 * 9) > 1);
}

/// burn's kernels chosen per layer on a GPU (`JEM_BENCH_GPU_CONV=auto`) take the direct kernel
/// on every layer of WRN-10-1 — the network whose direct-kernel timings the rule was chosen by —
/// and the unfolded product on every 3×3 layer of WRN-28-10 but the first two (docs/gpu.md).
#[test]
fn the_auto_gpu_convolution_is_direct_on_wrn_10_1_and_unfolded_on_wrn_28_10s_wide_layers() {
    use jem_kernels::GpuConv;
    let choice = |s: &ConvShape| {
        GpuConv::Auto.for_weight([s.out_channels, s.in_channels, s.kernel, s.kernel])
    };
    let wrn_10_1 = WideResNetConfig::new(10, 1, 1, 10)
        .convolutions(28, 28)
        .unwrap();
    assert!(wrn_10_1.iter().all(|s| choice(s) == GpuConv::Direct));
    let wrn_28_10 = WideResNetConfig::new(28, 10, 3, 10)
        .convolutions(32, 32)
        .unwrap();
    for (i, s) in wrn_28_10.iter().enumerate() {
        let expected = if s.kernel == 3 && i >= 2 {
            GpuConv::Im2col
        } else {
            GpuConv::Direct
        };
        assert_eq!(choice(s), expected, "layer {i}: {s:?}");
    }
}
