//! Times each 3×3 convolution shape of WRN-10-1 and WRN-16-2 (batch 64, 28×28 input) under
//! every instruction-set cap this CPU has: forward, input gradient and weight gradient, the
//! lowest of `--reps` calls, one thread unless `RAYON_NUM_THREADS` says otherwise. A tool for
//! comparing the kernels' paths side by side on one machine (ratios, not absolute times, on a
//! noisy one).
//!
//!     cargo run --release -p jem-kernels --example layer_times [-- --reps 10 --op weight]

use std::time::Instant;

use jem_kernels::{
    conv2d_input_grad, conv2d_slices, conv2d_weight_grad, isa, set_isa, ConvGeometry, Isa,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let reps: usize = value("--reps").map_or(10, |v| v.parse().expect("--reps: a count"));
    let ops: Vec<&str> = match value("--op") {
        Some(op) => vec![op.as_str()],
        None => vec!["forward", "input", "weight"],
    };
    // (input channels, output channels, side): the stride-1 3×3 convolutions of both networks.
    let shapes = [
        (1, 16, 28),
        (16, 16, 28),
        (16, 32, 28),
        (32, 32, 28),
        (32, 32, 14),
        (64, 64, 14),
        (64, 64, 7),
        (128, 128, 7),
    ];
    println!("op,isa,in,out,side,ms,gflops");
    for &(ci, co, side) in &shapes {
        let g = ConvGeometry {
            batch: 64,
            in_channels: ci,
            height: side,
            width: side,
            out_channels: co,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
        };
        let x: Vec<f32> = (0..64 * ci * side * side)
            .map(|v| ((v * 7919) % 97) as f32 / 97.0 - 0.5)
            .collect();
        let weight: Vec<f32> = (0..co * ci * 9)
            .map(|v| ((v * 104_729) % 89) as f32 / 89.0 - 0.5)
            .collect();
        let grad: Vec<f32> = (0..64 * co * side * side)
            .map(|v| ((v * 31) % 83) as f32 / 83.0 - 0.5)
            .collect();
        let flops = 2.0 * (64 * side * side * co * ci * 9) as f64;
        for cap in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            set_isa(cap);
            if isa() != cap {
                continue;
            }
            for &op in &ops {
                let mut best = f64::INFINITY;
                for _ in 0..reps {
                    let start = Instant::now();
                    let out = match op {
                        "forward" => conv2d_slices(&x, &weight, None, &g, Some(0.2)),
                        "input" => conv2d_input_grad(&grad, &weight, &g, Some((&x, 0.2))),
                        "weight" => conv2d_weight_grad(&x, &grad, &g, Some(0.2)),
                        other => panic!("--op {other}: expected forward, input or weight"),
                    };
                    best = best.min(start.elapsed().as_secs_f64());
                    std::hint::black_box(out);
                }
                println!(
                    "{op},{cap},{ci},{co},{side},{:.3},{:.1}",
                    best * 1e3,
                    flops / best / 1e9
                );
            }
        }
    }
}
