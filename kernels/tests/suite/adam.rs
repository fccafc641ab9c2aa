//! [`FusedAdam`] against burn's `Adam` with the same settings: the same weights to the bit after
//! every step, and a state saved by either (as bytes, the way a training state is saved)
//! resumed by the other.

use burn::backend::{Autodiff, Flex};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Record, Recorder};
use burn::tensor::{Tensor, TensorData};
use jem_kernels::FusedAdam;

type B = Autodiff<Flex>;

/// Learning rates of the steps taken (a warm-up and a decay, as training changes them).
const RATES: [f64; 6] = [1e-4, 5e-4, 1e-3, 1e-3, 3e-4, 3e-4];

/// The weight and bias bits of `layer`.
fn bits(layer: &Linear<B>) -> Vec<u32> {
    let mut values = layer.weight.val().into_data().to_vec::<f32>().unwrap();
    values.extend(
        layer
            .bias
            .as_ref()
            .unwrap()
            .val()
            .into_data()
            .to_vec::<f32>()
            .unwrap(),
    );
    values.iter().map(|v| v.to_bits()).collect()
}

/// A `[rows, columns]` matrix of values in [−1, 1) that depend only on `seed`: not the backend's
/// random generator, which tests running beside this one draw from too.
fn matrix(rows: usize, columns: usize, seed: usize) -> Tensor<B, 2> {
    let values = (0..rows * columns)
        .map(|i| ((i * 7_919 + seed * 104_729) % 1_000) as f32 / 500.0 - 1.0)
        .collect();
    Tensor::from_data(
        TensorData::new(values, [rows, columns]),
        &Default::default(),
    )
}

/// `steps` steps of `optim` from `layer` on a least-squares loss whose batch changes each step
/// (made from the step's number, so both optimisers see the same ones); the bits after each.
fn descend<O: Optimizer<Linear<B>, B>>(
    mut layer: Linear<B>,
    optim: &mut O,
    steps: std::ops::Range<usize>,
) -> (Linear<B>, Vec<Vec<u32>>) {
    let mut after = Vec::new();
    for step in steps {
        let (x, target) = (matrix(16, 37, 2 * step), matrix(16, 5, 2 * step + 1));
        let loss = (layer.forward(x) - target).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &layer);
        layer = optim.step(RATES[step], layer, grads);
        after.push(bits(&layer));
    }
    (layer, after)
}

/// `record` saved as bytes and loaded as another record type with the same serialised form.
fn carried<Saved: Record<B>, Loaded: Record<B>>(record: Saved) -> Loaded {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = Recorder::<B>::record(&recorder, record, ()).unwrap();
    Recorder::<B>::load(&recorder, bytes, &Default::default()).unwrap()
}

#[test]
fn fused_adam_takes_burns_steps_to_the_bit_and_resumes_its_state() {
    let start: Linear<B> = LinearConfig::new(37, 5).init(&Default::default());
    // burn initialises parameters lazily, and each clone of an unread one on its own draw:
    // reading them fixes the starting point every run below shares.
    let initial = bits(&start);
    let burns = || AdamConfig::new().with_epsilon(1e-8).init::<B, Linear<B>>();
    let fused = || FusedAdam::new(0.9, 0.999, 1e-8).init::<B, Linear<B>>();
    let n = RATES.len();
    let layer = || start.clone();

    let (_, burn_steps) = descend(layer(), &mut burns(), 0..n);
    let (_, fused_steps) = descend(layer(), &mut fused(), 0..n);
    // A step that moved nothing would make the comparison vacuous.
    assert_eq!(
        bits(&layer()),
        initial,
        "every run starts from the same weights"
    );
    assert_ne!(
        burn_steps[0], initial,
        "Adam's first step moves the weights"
    );
    for (step, (a, b)) in burn_steps.iter().zip(&fused_steps).enumerate() {
        assert_eq!(a, b, "weights after step {step}");
    }

    // burn's state, saved after two steps, resumed by the fused optimiser, and the other way.
    let mut saved = burns();
    let (half, _) = descend(layer(), &mut saved, 0..2);
    let mut resumed = fused().load_record(carried(saved.to_record()));
    let (_, rest) = descend(half, &mut resumed, 2..n);
    assert_eq!(
        rest,
        burn_steps[2..],
        "burn's state resumed by the fused optimiser"
    );

    let mut saved = fused();
    let (half, _) = descend(layer(), &mut saved, 0..2);
    let mut resumed = burns().load_record(carried(saved.to_record()));
    let (_, rest) = descend(half, &mut resumed, 2..n);
    assert_eq!(
        rest,
        burn_steps[2..],
        "the fused optimiser's state resumed by burn's"
    );
}
