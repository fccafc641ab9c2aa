//! The load-time rewriting of a ReLU or LeakyReLU whose input comes from a linear step (a
//! convolution, a folded BatchNorm, a matrix product, a sum or difference): where nothing but
//! convolutions read it (as their input `x`, and it is not the graph's output), it is fused
//! into them — `Conv(act(x))` becomes one convolution that applies the activation as
//! jem-kernels reads its input (`input_slope`), as the native Wide-ResNet runs its
//! pre-activation blocks, so the activated map is never stored; elsewhere it runs on
//! jem-kernels' activation ([`Op::Activation`]), multi-threaded.
//!
//! jem-kernels take the derivative at exactly 0 as 1, PyTorch as the slope. A linear step's
//! output is exactly 0 only by coincidence, whereas a graph input (an image's black pixels)
//! or the output of another activation, a pad or a pool of activations can be 0 by
//! construction: those activations stay burn's, with PyTorch's derivative.

use crate::compile::{Operand, Step};
use crate::ops::elementwise::{Binary, Unary};
use crate::ops::Op;

/// Fuses every eligible activation of `steps` (in order) into the convolutions that read it,
/// and runs the other eligible ones on jem-kernels; `output` is the graph output's slot. Runs
/// before [`crate::compile::Compiler::schedule_frees`].
pub(crate) fn fuse_activations(steps: &mut Vec<Step>, output: usize) {
    let mut s = 0;
    while s < steps.len() {
        if !fuse_at(steps, s, output) {
            s += 1;
        }
    }
}

/// The slope of a step's activation, if it is one that fuses.
fn slope(op: &Op) -> Option<f32> {
    match op {
        Op::Unary(Unary::Relu) => Some(0.0),
        Op::Unary(Unary::LeakyRelu(a)) => Some(*a),
        _ => None,
    }
}

/// Whether a step's output can be exactly 0 only by coincidence.
fn linear_output(op: &Op) -> bool {
    matches!(
        op,
        Op::Conv(_) | Op::Affine | Op::Gemm(_) | Op::MatMul | Op::Binary(Binary::Add | Binary::Sub)
    )
}

/// Fuses step `s` into its readers where it is eligible; whether it did (and removed it).
fn fuse_at(steps: &mut Vec<Step>, s: usize, output: usize) -> bool {
    let Some(slope) = slope(&steps[s].op) else {
        return false;
    };
    let (out, input) = (steps[s].outputs[0], steps[s].inputs[0]);
    let Operand::Slot(input_slot) = input else {
        return false;
    };
    let produced_linearly = steps[..s]
        .iter()
        .any(|p| p.outputs.contains(&input_slot) && linear_output(&p.op));
    if !produced_linearly {
        return false;
    }
    let reads = |step: &Step| step.inputs.contains(&Operand::Slot(out));
    let readers: Vec<usize> = (s + 1..steps.len()).filter(|&r| reads(&steps[r])).collect();
    let fusible = |step: &Step| match &step.op {
        Op::Conv(c) => {
            c.input_slope.is_none()
                && step.inputs[0] == Operand::Slot(out)
                && !step.inputs[1..].contains(&Operand::Slot(out))
        }
        _ => false,
    };
    if out == output || readers.is_empty() || !readers.iter().all(|&r| fusible(&steps[r])) {
        steps[s].op = Op::Activation(slope);
        return false;
    }
    for r in readers {
        let step = &mut steps[r];
        step.inputs[0] = input;
        if let Op::Conv(c) = &mut step.op {
            c.input_slope = Some(slope);
        }
    }
    steps.remove(s);
    true
}

#[cfg(test)]
mod tests {
    use super::fuse_activations;
    use crate::compile::{Operand, Step};
    use crate::ops::conv::Conv;
    use crate::ops::elementwise::Unary;
    use crate::ops::Op;
    use crate::OnnxModel;

    /// A step reading `inputs` (slots; a convolution's weights are constant 0) into slot `out`.
    fn step(op: Op, inputs: &[usize], out: usize) -> Step {
        let mut inputs: Vec<Operand> = inputs.iter().map(|&i| Operand::Slot(i)).collect();
        if matches!(op, Op::Conv(_)) && inputs.len() == 1 {
            inputs.push(Operand::Const(0));
        }
        Step {
            op,
            inputs,
            outputs: vec![out],
            shapes: Vec::new(),
            free: Vec::new(),
            node: format!("s{out}"),
        }
    }

    fn conv() -> Op {
        Op::Conv(Conv {
            stride: [1, 1],
            dilation: [1, 1],
            groups: 1,
            pads: [1, 1, 1, 1],
            input_slope: None,
        })
    }

    /// Each step after fusing: `conv`, `conv(act 0.1)` (a fused slope), `act 0.1` (on the
    /// kernels), or `burn` (an activation left to burn).
    fn fused(mut steps: Vec<Step>, output: usize) -> Vec<String> {
        fuse_activations(&mut steps, output);
        steps
            .iter()
            .map(|s| match &s.op {
                Op::Conv(Conv {
                    input_slope: Some(a),
                    ..
                }) => format!("conv(act {a})"),
                Op::Conv(_) => "conv".into(),
                Op::Activation(a) => format!("act {a}"),
                _ => "burn".into(),
            })
            .collect()
    }

    #[test]
    fn only_a_linear_steps_activation_runs_on_the_kernels_fused_where_convolutions_alone_read_it() {
        let relu = || Op::Unary(Unary::Relu);
        // conv → LeakyReLU → two convolutions: one step less, both convolutions carry it.
        let steps = vec![
            step(conv(), &[0], 1),
            step(Op::Unary(Unary::LeakyRelu(0.1)), &[1], 2),
            step(conv(), &[2], 3),
            step(conv(), &[2], 4),
        ];
        assert_eq!(fused(steps, 4), ["conv", "conv(act 0.1)", "conv(act 0.1)"]);
        // The graph input's ReLU (black pixels are exactly 0) stays burn's.
        let steps = vec![step(relu(), &[0], 1), step(conv(), &[1], 2)];
        assert_eq!(fused(steps, 2), ["burn", "conv"]);
        // A ReLU of a ReLU: the first, read by an activation, runs on the kernels; the second
        // reads an activation and stays burn's.
        let steps = vec![
            step(conv(), &[0], 1),
            step(relu(), &[1], 2),
            step(relu(), &[2], 3),
            step(conv(), &[3], 4),
        ];
        assert_eq!(fused(steps, 4), ["conv", "act 0", "burn", "conv"]);
        // The graph's output, and an activation a convolution reads as its weights, are not
        // fused.
        let steps = vec![step(conv(), &[0], 1), step(relu(), &[1], 2)];
        assert_eq!(fused(steps, 2), ["conv", "act 0"]);
        let mut weights = step(conv(), &[1], 3);
        weights.inputs[1] = Operand::Slot(2);
        let steps = vec![step(conv(), &[0], 1), step(relu(), &[1], 2), weights];
        assert_eq!(fused(steps, 3), ["conv", "act 0", "conv"]);
    }

    /// The forward pass of a committed fixture: its step lines, and how many convolutions carry
    /// a fused activation.
    fn steps(name: &str) -> (Vec<String>, usize) {
        let path = format!(
            "{}/../tests/fixtures/onnx/{name}.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let described = OnnxModel::load(path).unwrap().describe();
        let lines: Vec<String> = described.lines().map(str::to_string).collect();
        let fused = lines
            .iter()
            .filter(|l| l.contains("Conv(") && l.contains("input_slope: Some"))
            .count();
        (lines, fused)
    }

    /// The activations left as steps of their own (on the kernels or burn's).
    fn activations(lines: &[String]) -> usize {
        lines
            .iter()
            .filter(|l| {
                l.contains("Unary(Relu)")
                    || l.contains("Unary(LeakyRelu")
                    || l.contains("Activation(")
            })
            .count()
    }

    #[test]
    fn activations_read_only_by_convolutions_fuse_and_others_stay() {
        // JEM's Wide-ResNet: every LeakyReLU but the last (read by the pooling) feeds
        // convolutions only.
        let (lines, fused) = steps("jem_wrn");
        assert!(
            fused >= 6,
            "{fused} fused convolutions:\n{}",
            lines.join("\n")
        );
        assert_eq!(activations(&lines), 1, "{}", lines.join("\n"));
        // A PreAct-ResNet's BatchNorm + ReLU before each convolution fuse too.
        let (lines, fused) = steps("preact_resnet18");
        assert!(
            fused >= 8,
            "{fused} fused convolutions:\n{}",
            lines.join("\n")
        );
        // A ReLU read by a max-pool stays a step of its own.
        let (lines, fused) = steps("small_cnn_mnist");
        assert_eq!(fused, 0, "{}", lines.join("\n"));
        assert!(activations(&lines) >= 2);
        // ResNet-18: the ReLU inside each of the 8 blocks fuses into its second convolution,
        // and a block's output ReLU into the next block's two convolutions where that block
        // downsamples (3 blocks); the stem's and the other blocks' output ReLUs (6) are read by
        // an identity shortcut's sum as well, and stay.
        let (lines, fused) = steps("resnet18_cifar");
        assert_eq!(
            (fused, activations(&lines)),
            (8 + 3 * 2, 6),
            "{}",
            lines.join("\n")
        );
    }
}
