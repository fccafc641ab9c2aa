//! The shapes and floating-point operations of a Wide-ResNet's convolutions, from its
//! configuration alone: what `bench` reports as FLOPs and the GPU tests walk layer by layer.

use super::wrn::WideResNetConfig;

/// One convolution of a [`WideResNet`](super::WideResNet): square kernel, "same" padding (`kernel / 2`), its
/// input's spatial size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    /// Input height and width.
    pub input: [usize; 2],
}

impl ConvShape {
    /// Output height and width.
    pub fn output(&self) -> [usize; 2] {
        self.input
            .map(|n| (n + 2 * self.padding - self.kernel) / self.stride + 1)
    }

    /// Multiply-adds × 2 of this convolution on one image.
    pub fn forward_flops(&self) -> u64 {
        let [h, w] = self.output();
        let k2 = self.kernel * self.kernel;
        2 * (self.in_channels * self.out_channels * k2 * h * w) as u64
    }
}

impl WideResNetConfig {
    /// Every convolution of the network on an `h`×`w` input, in the order of the forward pass
    /// (stem; then per block its first and second convolution and its shortcut, if any).
    pub fn convolutions(&self, h: usize, w: usize) -> anyhow::Result<Vec<ConvShape>> {
        let n = self.blocks_per_stage()?;
        let s = self.stages();
        let conv = |cin, cout, kernel, stride, input: [usize; 2]| ConvShape {
            in_channels: cin,
            out_channels: cout,
            kernel,
            stride,
            padding: kernel / 2,
            input,
        };
        let mut shapes = vec![conv(self.in_channels, s[0], 3, 1, [h, w])];
        let (mut h, mut w, mut cin) = (h, w, s[0]);
        for (stage, &cout) in s[1..].iter().enumerate() {
            for b in 0..n {
                let stride = if b == 0 && stage > 0 { 2 } else { 1 };
                let (ho, wo) = (h.div_ceil(stride), w.div_ceil(stride));
                if self.stride_on_conv1() {
                    shapes.push(conv(cin, cout, 3, stride, [h, w]));
                    shapes.push(conv(cout, cout, 3, 1, [ho, wo]));
                } else {
                    shapes.push(conv(cin, cout, 3, 1, [h, w]));
                    shapes.push(conv(cout, cout, 3, stride, [h, w]));
                }
                if stride != 1 || cin != cout {
                    shapes.push(conv(cin, cout, 1, stride, [h, w]));
                }
                (h, w, cin) = (ho, wo, cout);
            }
        }
        Ok(shapes)
    }

    /// Multiply-adds × 2 of one forward pass on an `h`×`w` image (convolutions and the head).
    pub fn forward_flops(&self, h: usize, w: usize) -> anyhow::Result<u64> {
        let convolutions: u64 = self
            .convolutions(h, w)?
            .iter()
            .map(ConvShape::forward_flops)
            .sum();
        let features = self.stages()[3];
        Ok(convolutions + 2 * (features * self.num_classes) as u64)
    }
}
