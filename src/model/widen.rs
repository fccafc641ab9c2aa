//! Net2WiderNet (Chen, Goodfellow and Shlens 2016, "Net2Net: Accelerating Learning via
//! Knowledge Transfer"): a trained WRN-d-k made into a WRN-d-(r·k) that computes the same
//! function, so that a wider network can continue training where a narrow one stopped instead
//! of starting again from random weights.
//!
//! Every widened channel `j` is a copy of the narrow channel `j mod C`: it gets that channel's
//! incoming weights and bias, so all copies of a channel carry the same values. A layer reading
//! a widened input splits each narrow weight among the copies of its input channel, in fractions
//! that sum to 1, so its output is unchanged. The fractions are random (each in about
//! [1/(3r), 3/r]), not 1/r: equal fractions would give the copies equal gradients for ever,
//! and the wider network would never be more than the narrow one. A block whose shortcut was the
//! identity and becomes a 1×1 convolution (WRN-d-1's first block: 16 stem channels in, 16·k out)
//! gets the identity as that convolution, then widened like the rest.
//!
//! Only the JEM variant (no normalisation layers) is widened; the function is preserved up to
//! f32 rounding of the split sums.

use super::{WideBasic, WideResNet, WideResNetConfig, WrnVariant};
use burn::module::Param;
use burn::nn::conv::Conv2d;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Whether `narrow` can be widened into `wide`, and by what factor: the same network in every
/// respect but its width, which must be a multiple of the narrow one's.
pub fn widening_factor(
    narrow: &WideResNetConfig,
    wide: &WideResNetConfig,
) -> Result<usize, String> {
    if narrow.variant != WrnVariant::Jem || wide.variant != WrnVariant::Jem {
        return Err(
            "only JEM-variant Wide-ResNets (no normalisation layers) can be widened".into(),
        );
    }
    let same_but_width = WideResNetConfig {
        width: wide.width,
        ..narrow.clone()
    };
    if &same_but_width != wide {
        return Err(format!(
            "only the width may differ: {narrow} against {wide}"
        ));
    }
    if narrow.width == 0 || !wide.width.is_multiple_of(narrow.width) || wide.width < narrow.width {
        return Err(format!(
            "the width {} is not a multiple of the narrow network's {}",
            wide.width, narrow.width
        ));
    }
    Ok(wide.width / narrow.width)
}

/// `narrow` as the wider network `wide` describes, computing the same logits. `seed` draws the
/// fractions that split each weight among the copies of its input channel.
pub fn widen<B: Backend>(
    narrow: &WideResNet<B>,
    wide: &WideResNetConfig,
    seed: u64,
    device: &B::Device,
) -> anyhow::Result<WideResNet<B>> {
    widening_factor(narrow.config(), wide).map_err(anyhow::Error::msg)?;
    let mut target = wide.init::<B>(device)?;
    let mut rng = StdRng::seed_from_u64(seed);
    widen_conv(&narrow.conv1, &mut target.conv1, &mut rng, device);
    let narrow_blocks = narrow
        .layer1
        .iter()
        .chain(&narrow.layer2)
        .chain(&narrow.layer3);
    let wide_blocks = target
        .layer1
        .iter_mut()
        .chain(&mut target.layer2)
        .chain(&mut target.layer3);
    for (from, to) in narrow_blocks.zip(wide_blocks) {
        widen_block(from, to, &mut rng, device);
    }
    widen_linear(&narrow.linear, &mut target.linear, &mut rng, device);
    Ok(target)
}

fn widen_block<B: Backend>(
    from: &WideBasic<B>,
    to: &mut WideBasic<B>,
    rng: &mut StdRng,
    device: &B::Device,
) {
    widen_conv(&from.conv1, &mut to.conv1, rng, device);
    widen_conv(&from.conv2, &mut to.conv2, rng, device);
    if let Some(target) = to.shortcut.first_mut() {
        match from.shortcut.first() {
            Some(conv) => widen_conv(conv, target, rng, device),
            None => {
                // The narrow block's identity, as the 1×1 convolution its wide twin has.
                let c = from.conv2.weight.dims()[0];
                let eye: Vec<f32> = (0..c * c)
                    .map(|i| if i / c == i % c { 1.0 } else { 0.0 })
                    .collect();
                let bias = target.bias.is_some().then(|| vec![0.0; c]);
                let widened = widen_weights(&eye, [c, c, 1], bias.as_deref(), target, rng);
                set_conv(target, widened, device);
            }
        }
    }
}

/// A convolution's weights `[out, in, kh, kw]` and bias, as plain numbers.
struct ConvWeights {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

fn widen_conv<B: Backend>(
    from: &Conv2d<B>,
    to: &mut Conv2d<B>,
    rng: &mut StdRng,
    device: &B::Device,
) {
    let [out, cin, kh, kw] = from.weight.dims();
    let weight = values(from.weight.val());
    let bias = from.bias.as_ref().map(|b| values(b.val()));
    let widened = widen_weights(&weight, [out, cin, kh * kw], bias.as_deref(), to, rng);
    set_conv(to, widened, device);
}

/// The narrow convolution `[out, cin, taps]` spread over `to`'s shape: output channel `o` copies
/// `o mod out`, and input channel `i` takes a share of `i mod cin`'s weight.
fn widen_weights<B: Backend>(
    weight: &[f32],
    [out, cin, taps]: [usize; 3],
    bias: Option<&[f32]>,
    to: &Conv2d<B>,
    rng: &mut StdRng,
) -> ConvWeights {
    let [wide_out, wide_in, _, _] = to.weight.dims();
    ConvWeights {
        weight: split_inputs(weight, [out, cin, taps], [wide_out, wide_in], rng),
        bias: bias.map(|b| (0..wide_out).map(|o| b[o % out]).collect()),
    }
}

/// A weight laid out `[outer, inputs, inner]` widened to `[wide_outer, wide_inputs, inner]`: row
/// `a` copies row `a mod outer`, and input `i` takes a share of input `i mod inputs`'s weight. A
/// convolution is `[out, in, taps]`; burn's linear layer, `[in, out]`, is `[1, in, out]`. The
/// shares are drawn in the weight's own order, so both layers draw as they always did.
fn split_inputs(
    weight: &[f32],
    [outer, inputs, inner]: [usize; 3],
    [wide_outer, wide_inputs]: [usize; 2],
    rng: &mut StdRng,
) -> Vec<f32> {
    let copies = wide_inputs / inputs;
    let shares = split_shares(wide_outer * inputs * inner, copies, rng);
    let mut widened = vec![0.0; wide_outer * wide_inputs * inner];
    for a in 0..wide_outer {
        for i in 0..wide_inputs {
            let (source, copy) = (i % inputs, i / inputs);
            for t in 0..inner {
                let narrow = weight[((a % outer) * inputs + source) * inner + t];
                let share = shares[((a * inputs + source) * inner + t) * copies + copy];
                widened[(a * wide_inputs + i) * inner + t] = narrow * share;
            }
        }
    }
    widened
}

fn set_conv<B: Backend>(to: &mut Conv2d<B>, widened: ConvWeights, device: &B::Device) {
    let shape = to.weight.dims();
    to.weight = Param::from_tensor(Tensor::from_data(
        TensorData::new(widened.weight, shape),
        device,
    ));
    if let (Some(bias), Some(values)) = (&mut to.bias, widened.bias) {
        let n = values.len();
        *bias = Param::from_tensor(Tensor::from_data(TensorData::new(values, [n]), device));
    }
}

/// The head reads the widened features, each input's share as in a convolution; the bias is
/// unchanged.
fn widen_linear<B: Backend>(
    from: &Linear<B>,
    to: &mut Linear<B>,
    rng: &mut StdRng,
    device: &B::Device,
) {
    let [features, classes] = from.weight.dims();
    let wide_features = to.weight.dims()[0];
    let weight = values(from.weight.val());
    let widened = split_inputs(&weight, [1, features, classes], [1, wide_features], rng);
    to.weight = Param::from_tensor(Tensor::from_data(
        TensorData::new(widened, [wide_features, classes]),
        device,
    ));
    if let (Some(bias), Some(narrow)) = (&mut to.bias, &from.bias) {
        *bias = Param::from_tensor(narrow.val());
    }
}

/// `groups` groups of `copies` positive fractions, each group summing to 1 (uniform draws in
/// [0.5, 1.5], normalised). One copy is the whole weight.
fn split_shares(groups: usize, copies: usize, rng: &mut StdRng) -> Vec<f32> {
    if copies == 1 {
        return vec![1.0; groups];
    }
    let mut shares = Vec::with_capacity(groups * copies);
    for _ in 0..groups {
        let draws: Vec<f64> = (0..copies).map(|_| rng.random_range(0.5..1.5)).collect();
        let total: f64 = draws.iter().sum();
        shares.extend(draws.iter().map(|d| (d / total) as f32));
    }
    shares
}

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec()
        .expect("a float tensor converted to f32 reads as f32")
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    type B = Flex;

    fn logits(model: &WideResNet<B>, x: &Tensor<B, 4>) -> Vec<f32> {
        values(model.forward(x.clone()))
    }

    /// Relative max difference between two vectors.
    fn max_relative(a: &[f32], b: &[f32]) -> f32 {
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    fn check(depth: usize, width: usize, factor: usize) {
        let device = Default::default();
        let narrow_cfg = WideResNetConfig::new(depth, width, 1, 10);
        let narrow = narrow_cfg.init_seeded::<B>(3, &device).unwrap();
        let wide_cfg = WideResNetConfig {
            width: width * factor,
            ..narrow_cfg
        };
        let wide = widen(&narrow, &wide_cfg, 7, &device).unwrap();
        assert_eq!(wide.config(), &wide_cfg);
        let x = Tensor::<B, 4>::random(
            [4, 1, 28, 28],
            burn::tensor::Distribution::Uniform(0.0, 1.0),
            &device,
        );
        let (a, b) = (logits(&narrow, &x), logits(&wide, &x));
        let diff = max_relative(&a, &b);
        assert!(
            diff < 1e-5,
            "WRN-{depth}-{width} ×{factor}: logits differ by {diff}"
        );
        // Copies of a channel must not be twins: the second layer-1 convolution's weights for
        // input channel 0 and its first copy differ.
        let w = values(wide.layer1[0].conv2.weight.val());
        let [_, wide_in, kh, kw] = wide.layer1[0].conv2.weight.dims();
        let narrow_in = wide_in / factor;
        let taps = kh * kw;
        assert!((0..taps).any(|t| (w[t] - w[narrow_in * taps + t]).abs() > 1e-6 * w[t].abs()));
    }

    #[test]
    fn a_widened_network_computes_the_narrow_ones_logits() {
        // WRN-10-1 → 10-2: the first block's identity shortcut becomes a convolution.
        check(10, 1, 2);
        // Three copies, and blocks whose identity shortcuts stay identities.
        check(16, 1, 3);
        check(10, 2, 2);
    }

    #[test]
    fn widening_refuses_what_it_cannot_preserve() {
        let narrow = WideResNetConfig::new(10, 2, 1, 10);
        for wide in [
            WideResNetConfig::new(10, 3, 1, 10),
            WideResNetConfig::new(16, 4, 1, 10),
            WideResNetConfig::new(10, 4, 3, 10),
            WideResNetConfig::new(10, 1, 1, 10),
            WideResNetConfig::robustbench(10, 4, 1, 10),
        ] {
            assert!(widening_factor(&narrow, &wide).is_err(), "{wide:?}");
        }
        assert_eq!(
            widening_factor(&narrow, &WideResNetConfig::new(10, 6, 1, 10)),
            Ok(3)
        );
    }
}
