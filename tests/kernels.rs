//! The embedded JEM network computed with jem-kernels (convolutions, LeakyReLU), and with the
//! portable gradients the CUDA backend runs, against burn's own operations: logits and the input
//! gradient of LogSumExp (what SGLD and every white-box attack follow), on real test digits; and,
//! for the portable gradients, the parameter gradients of a training loss.
//!
//! The logits agree to 1e-4 of their scale. The input gradient of a LeakyReLU network is
//! discontinuous: a pre-activation within rounding of zero takes either slope, so no two
//! float implementations agree on every pixel. burn's own gradient moves by 1e-4 to 2e-3 of its
//! scale (in its largest pixel) when the input is scaled by 1 ± 1e-6 or 3e-6, a change of an ulp
//! or a few, and by the same jump where an implementation flips the same kink. So the gradients
//! must agree to 1e-3 in L2 norm, and in their largest pixel by no more than burn's own answer
//! moves under those ulp-sized changes of input (10 % more for rounding); a wrong kernel is off
//! by the order of the gradient itself.
//!
//! One test in this file, and this file a test binary of its own, on purpose: the choice of
//! kernels is process-wide.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use jem_bench::backend::{self, Inference, Train};
use jem_bench::batches;
use jem_bench::energy::lse_input_gradient;
use jem_bench::model::Checkpoint;
use jem_datasets::{embedded, Split};
use jem_kernels::{set_implementation, Implementation};

/// The gradients of every 4-D parameter (the convolutions' weights), flattened in visiting order.
struct ConvolutionGradients {
    grads: <Train as AutodiffBackend>::Gradients,
    flat: Vec<f32>,
}

impl ModuleVisitor<Train> for ConvolutionGradients {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Train, D>>) {
        if D == 4 {
            let grad = param
                .val()
                .grad(&self.grads)
                .expect("every weight has a gradient");
            self.flat.extend(batches::to_vec(grad));
        }
    }
}

fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-12);
    let worst = a
        .iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
    worst / scale
}

#[test]
fn logits_and_input_gradients_match_burns_operations() {
    let device = backend::device();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/models/jem");
    let (model, _) = Checkpoint::at(path).load::<Train>(&device).unwrap();
    let set = embedded::mnist(Split::Test).unwrap();
    let indices: Vec<usize> = (0..37).collect();
    let x: Tensor<Inference, 4> = batches::images::<Inference>(&set, &indices, &device);
    let inference = burn::module::AutodiffModule::valid(&model);

    let compute = |choice| {
        set_implementation(choice);
        let logits = batches::to_vec(inference.forward(x.clone()));
        let gradient = batches::to_vec(lse_input_gradient(&model, x.clone()));
        (logits, gradient)
    };
    let (logits_burn, gradient_burn) = compute(Implementation::Burn);
    let (logits_own, gradient_own) = compute(Implementation::Own);
    let (logits_portable, gradient_portable) = compute(Implementation::Portable);

    // How far burn's own answer moves when the input changes by an ulp or a few, up and down:
    // whether a nudge flips a kink is luck, so the largest of several.
    set_implementation(Implementation::Burn);
    let burn_moves = [1.000001f32, 0.999999, 1.000003, 0.999997]
        .iter()
        .map(|&f| {
            let nudged = batches::to_vec(lse_input_gradient(&model, x.clone() * f));
            relative_difference(&nudged, &gradient_burn)
        })
        .fold(0.0f32, f32::max);
    set_implementation(Implementation::Own);
    println!("burn's input gradient moves by {burn_moves} of its scale under ulp-sized nudges");

    for (what, logits_ours, gradient_ours) in [
        ("jem-kernels", &logits_own, &gradient_own),
        ("portable gradients", &logits_portable, &gradient_portable),
    ] {
        let logits = relative_difference(logits_ours, &logits_burn);
        assert!(
            logits < 1e-4,
            "{what}: logits differ by {logits} of their scale"
        );
        let l2 = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let difference: Vec<f32> = gradient_ours
            .iter()
            .zip(&gradient_burn)
            .map(|(a, b)| a - b)
            .collect();
        let in_norm = l2(&difference) / l2(&gradient_burn);
        assert!(
            in_norm < 1e-3,
            "{what}: input gradients differ by {in_norm} of their norm"
        );
        let largest = relative_difference(gradient_ours, &gradient_burn);
        assert!(
            largest <= 1.1 * burn_moves.max(1e-4),
            "{what}: input gradients differ by {largest} of their scale in one pixel, more than \
             burn's own moves ({burn_moves}, with 10 % for rounding) when the input is scaled \
             by 1 ± 1e-6 or 3e-6"
        );
    }

    // The parameter gradients of a training loss (every convolution's weight and bias gradient,
    // through the fused activations), portable against burn's.
    let labels = batches::labels::<Inference>(&set, &indices, &device);
    let parameter_gradients = |choice| {
        set_implementation(choice);
        let logits = model.forward(Tensor::from_inner(x.clone()));
        let loss = burn::nn::loss::CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, Tensor::from_inner(labels.clone()));
        let mut collect = ConvolutionGradients {
            grads: loss.backward(),
            flat: Vec::new(),
        };
        model.visit(&mut collect);
        collect.flat
    };
    let weights_burn = parameter_gradients(Implementation::Burn);
    let weights_portable = parameter_gradients(Implementation::Portable);
    set_implementation(Implementation::Own);
    let weights = relative_difference(&weights_portable, &weights_burn);
    assert!(
        weights < 1e-3,
        "portable weight gradients differ by {weights} of their scale"
    );
    assert!(weights_burn.iter().any(|v| v.abs() > 1e-6));

    // Not vacuous: the gradient is not zero, and the two paths are really different code.
    assert!(gradient_burn.iter().any(|v| v.abs() > 1e-6));
}
