//! The convolutions under each instruction-set cap (`set_isa`) against the portable path, the
//! same bits on integer data: the direct kernels' plumbing (scratch, tiles, the choice by
//! `isa()`) for each set this CPU has. One test in its own process, since the cap is global.

use std::io::Write;

use jem_kernels::{
    conv2d_input_grad, conv2d_slices, conv2d_weight_grad, isa, set_isa, ConvGeometry, Isa,
};

/// The forward pass, the input gradient and the weight gradient of `g` on integer data, with a
/// fused LeakyReLU of slope 1/2 (exact in `f32`).
fn run(g: &ConvGeometry) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..g.batch * g.in_channels * g.height * g.width)
        .map(|v| ((v * 7919) % 9) as f32 - 4.0)
        .collect();
    let patch = g.in_channels * g.kernel[0] * g.kernel[1];
    let weight: Vec<f32> = (0..g.out_channels * patch)
        .map(|v| ((v * 104_729) % 5) as f32 - 2.0)
        .collect();
    let bias: Vec<f32> = (0..g.out_channels).map(|o| o as f32 - 3.0).collect();
    let out = conv2d_slices(&x, &weight, Some(&bias), g, Some(0.5));
    let grad: Vec<f32> = (0..out.len())
        .map(|v| ((v * 31) % 7) as f32 - 3.0)
        .collect();
    let dx = conv2d_input_grad(&grad, &weight, g, Some((&x, 0.5)));
    let dw = conv2d_weight_grad(&x, &grad, g, Some(0.5));
    (out, dx, dw)
}

#[test]
fn every_cap_gives_the_portable_paths_bits() {
    // Wide-ResNet shapes that take the direct kernels (3×3, stride 1), an odd width whose
    // pixels fill no whole vector, and 7×7 maps (the forward kernel on AVX-512 only).
    let shapes = [
        (2, 16, 32, 28, 28),
        (2, 32, 32, 14, 14),
        (1, 5, 13, 13, 11),
        (2, 8, 8, 7, 7),
    ];
    let geometries: Vec<ConvGeometry> = shapes
        .iter()
        .map(|&(batch, cin, cout, h, w)| ConvGeometry {
            batch,
            in_channels: cin,
            height: h,
            width: w,
            out_channels: cout,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
        })
        .collect();
    set_isa(Isa::Portable);
    assert_eq!(isa(), Isa::Portable);
    let portable: Vec<_> = geometries.iter().map(run).collect();
    for cap in [Isa::Avx2, Isa::Avx512] {
        set_isa(cap);
        if !cap.is_available() {
            assert!(isa() < cap, "{cap} capped to {}", isa());
            let line = format!("every_cap_gives_the_portable_paths_bits: NOT RUN for {cap}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            continue;
        }
        assert_eq!(isa(), cap);
        for (g, want) in geometries.iter().zip(&portable) {
            assert!(run(g) == *want, "{cap}: {g:?}");
        }
    }
    set_isa(Isa::Avx512);
    assert_eq!(isa(), Isa::best_available());
}
