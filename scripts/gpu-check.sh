#!/usr/bin/env bash
# The GPU check, on any machine with an NVIDIA GPU, from the repository root:
#
#   scripts/gpu-check.sh [OUT]     # OUT defaults to results/gpu
#
# 1. correctness: the GPU tests (tests/gpu.rs, `cargo test --release --features cuda --test gpu
#    -- --ignored`: CPU and GPU agree on every convolution, gradient, SGLD step, PGD step, Adam
#    step and JEM iteration), the default sweep's K = 0 and K = 1 cells of the embedded baseline
#    on the GPU compared example by example with the committed CPU sweep results/sweeps/linf,
#    and every other command once with --device cuda;
# 2. timings against PyTorch on the same GPU (benches/pytorch/compare.py --device cuda), only the
#    rows results/perf/gpu.csv lacks (--resume), while the time budget lasts.
#
# It writes to OUT: machine.txt, agreement.log, k0.log, k1.log, commands.log, compare.log,
# gpu.csv, gpu.md. It builds with `cargo build --release --features cuda` (no CUDA toolkit
# needed: burn loads the driver and compiles its kernels with NVRTC at run time), unless
# binaries packed elsewhere by scripts/gpu-pack.sh lie in .gpu-check/bin (for a GPU machine
# without a Rust toolchain).
#
# Needed: the NVIDIA driver and libnvrtc; python3 (the example-by-example comparison), with
# torch and safetensors for the timings (skipped, and said so, without them).
#
# GPU_CHECK_PHASES chooses what runs: `all` (default) or `timings` (phase 2 only: a second call
# on a machine still warm). GPU_CHECK_SECONDS (default 420) bounds the two phases together, so
# that the check fits 8 minutes; each step has its own time limit and the script goes on to the
# next when one runs out, so a slow step costs its own result only; every log says how it ended.
set -uo pipefail
cd "$(dirname "$0")/.."

packed=.gpu-check/bin

# The jem-bench binary and the GPU test binary, in $1: unpacked from $packed where
# scripts/gpu-pack.sh put them, else built here.
binaries() {
    local work=$1
    if [ -f "$packed/jem-bench.xz" ]; then
        xz -dc "$packed/jem-bench.xz" >"$work/jem-bench" && chmod +x "$work/jem-bench"
        xz -dc "$packed/gpu-tests.xz" >"$work/gpu-tests" && chmod +x "$work/gpu-tests"
        cp "$packed/built-from.txt" "$work/built-from.txt"
        return
    fi
    cargo build --release --features cuda || return 1
    local test_bin
    test_bin=$(scripts/gpu-pack.sh test-binary) || return 1
    cp target/release/jem-bench "$work/jem-bench"
    cp "$test_bin" "$work/gpu-tests"
    {
        echo "built from: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . ':!results' 2>/dev/null || echo ' with uncommitted changes')"
        echo "built on: $(date -u +%FT%TZ), here"
    } >"$work/built-from.txt"
}

# `timeout` that says how the step ended, in the log and on stdout.
step() {
    local seconds=$1 log=$2
    shift 2
    local started=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" >"$log" 2>&1
    local rc=$?
    local how="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && how="stopped at its limit of $seconds s"
    echo "[$(basename "$log")] $how after $((SECONDS - started)) s" | tee -a "$log"
    return $rc
}

run() {
    local out=${1:-results/gpu}
    local phases=${GPU_CHECK_PHASES:-all}
    case $phases in
    all | timings) ;;
    *)
        echo "GPU_CHECK_PHASES=$phases: expected all or timings" >&2
        return 2
        ;;
    esac
    mkdir -p "$out"
    local work
    work=$(mktemp -d)
    binaries "$work" || {
        echo "cannot build or unpack the binaries" >&2
        return 1
    }
    # cubecl caches compiled kernels under target/ by kernel id, not by source: packed binaries
    # built from other source must not reuse what an earlier build compiled there.
    if [ -f "$packed/jem-bench.xz" ] && ! cmp -s "$work/built-from.txt" target/built-from.txt; then
        rm -rf target && mkdir -p target && cp "$work/built-from.txt" target/built-from.txt
    fi
    {
        echo "date: $(date -u +%FT%TZ)"
        cat "$work/built-from.txt"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        nproc | sed 's/^/host CPU cores: /'
    } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    local started=$SECONDS
    # The forward convolutions checked (the default, jem-kernels' tiled kernels, the same on
    # 128-pixel tiles, and burn's kernels chosen per layer) and those timed (every one, the
    # default first, then the wide tiles it may give way to).
    local convs=(tiled tiled-wide auto) timed=tiled,tiled-wide,auto,im2col,direct

    # GPU_CHECK_PHASES=timings skips phase 1: a second, short call on a machine still warm
    # completes the timing table without checking again what the first call checked.
    if [ "$phases" != timings ]; then
        # Phase 1, correctness, in parallel (the GPU has room; a device call has minutes): each
        # agreement test in its own process, with the default forward convolution (jem-kernels'
        # tiled kernels) and with burn's (auto: its direct kernel and the unfolded product, by
        # layer; JEM_BENCH_GPU_CONV);
        # the baseline's K = 0 and K = 1 sweep cells against the committed CPU sweep; every other
        # command once on the GPU.
        local tests=(cpu_and_gpu_agree_on_every_convolution_gradient_of_the_wide_resnets
            cpu_and_gpu_agree_on_a_wide_resnet_its_sgld_defence_and_pgd
            cpu_and_gpu_agree_on_an_adam_step_and_a_jem_training_iteration
            outputs_name_the_gpu)
        local t conv
        for conv in "${convs[@]}"; do
            for t in "${tests[@]}"; do
                step 150 "$work/agreement-$conv-$t.log" env RAYON_NUM_THREADS=4 JEM_BENCH_GPU_CONV=$conv \
                    "$work/gpu-tests" --ignored --exact "on_gpu::$t" --nocapture --test-threads 1 &
            done
        done
        k_sweep 0 "$work" "$out" &
        k_sweep 1 "$work" "$out" &
        commands "$work" "$out" &
        wait
        for conv in "${convs[@]}"; do
            for t in "${tests[@]}"; do
                echo "=== $t (JEM_BENCH_GPU_CONV=$conv)"
                cat "$work/agreement-$conv-$t.log"
            done
        done >"$out/agreement.log"
        grep -E "test result|^\[agreement" "$out/agreement.log"
        echo "phase 1 (correctness) took $((SECONDS - started)) s"
    fi

    # Phase 2, timings, alone on the GPU, both sides in true f32, while time is left
    # (compare.py writes each row as it is measured). The autotune choices phase 1 made under
    # contention are dropped first; the compiled kernels are kept. The rows already in
    # results/perf/gpu.csv are kept and only the missing ones measured (--resume), so that
    # successive short GPU calls complete the table; delete that file to measure every row again
    # (after a change to the GPU kernels). The default convolution's rows (tiled) come first,
    # then burn's chosen per layer (auto), the unfolded product's, and burn's direct kernel's
    # last: WRN-28-10's JEM iteration alone can take minutes on the direct one.
    rm -rf target/autotune
    [ -f results/perf/gpu.csv ] && cp results/perf/gpu.csv "$out/gpu.csv"
    local left=$((${GPU_CHECK_SECONDS:-420} - (SECONDS - started)))
    if [ "$left" -lt 30 ]; then
        echo "timings not run: $left s left" | tee "$out/compare.log"
    elif python3 -c 'import torch, safetensors; assert torch.cuda.is_available()' 2>/dev/null; then
        step "$left" "$out/compare.log" python3 benches/pytorch/compare.py --device cuda \
            --bin "$work/jem-bench" --sides ours,pytorch --threads 1 --rounds 1 --reps 10 \
            --warmup 2 --max-seconds 1 --models 10-1,28-10:cifar --batch 64,256 --resume \
            --isa "$timed" \
            --out "$out"
    else
        echo "timings not run: python3 with torch, safetensors and CUDA not found" | tee "$out/compare.log"
    fi
    rm -rf "$work"
}

# The default sweep's cells of the baseline on the GPU against the committed CPU sweep
# `results/sweeps/linf`, example by example: K = 0 (the AutoAttack cascade) and K = 1 (the
# adaptive attack, gradients through the SGLD step with EOT).
k_sweep() {
    local k=$1 work=$2 out=$3
    step 200 "$work/k$k-sweep.log" "$work/jem-bench" \
        --device cuda robust --norm linf --steps "$k" --convergence-sample 0 \
        --models results/models/baseline --out "$work/k$k" &&
        python3 - "$k" "$work/k$k/examples.csv" results/sweeps/linf/examples.csv \
            >"$work/k$k-equality.txt" <<'EOF'
import csv, sys
k = sys.argv[1]
def outcomes(path):
    rows = csv.DictReader(open(path))
    return {(r["model"], r["attack"], r["eps"], r["example"]): (r["clean_correct"], r["adversarial"])
            for r in rows if r["k"] == k and r["model"] == "results/models/baseline"}
gpu, cpu = outcomes(sys.argv[2]), outcomes(sys.argv[3])
shared = sorted(set(gpu) & set(cpu))
differ = [key for key in shared if gpu[key] != cpu[key]]
print(f"K = {k} cells: {len(gpu)} examples on the GPU, {len(cpu)} in the committed CPU sweep, "
      f"{len(shared)} compared; {len(differ)} differ")
for key in differ:
    print("differs:", key, "gpu", gpu[key], "cpu", cpu[key])
sys.exit(1 if differ or not shared else 0)
EOF
    cat "$work/k$k-sweep.log" "$work/k$k-equality.txt" "$work/k$k/robust.csv" >"$out/k$k.log" 2>&1
    tail -n 3 "$work/k$k-equality.txt" 2>/dev/null
}

# Every other command once on the GPU, small: each log says how it ended; the outputs'
# `backend` field says where they were computed.
commands() {
    local work=$1 out=$2
    local jb="$work/jem-bench" c="$work/commands"
    mkdir -p "$c"
    # In parallel, like the rest of phase 1: each within its own limit.
    step 150 "$c/eval.log" "$jb" --device cuda eval --model results/models/baseline --n 1000 &
    step 150 "$c/train-baseline.log" "$jb" --device cuda train --kind baseline \
        --train-subset 1024 --epochs 1 --batch-size 64 --max-iters 16 --out "$c/train-baseline" &
    step 150 "$c/train-jem.log" "$jb" --device cuda train --kind jem --train-subset 1024 \
        --epochs 1 --batch-size 32 --max-iters 4 --buffer-size 256 --out "$c/train-jem" &
    step 150 "$c/train-adv.log" "$jb" --device cuda train --kind adv --train-subset 1024 \
        --epochs 1 --batch-size 32 --max-iters 4 --out "$c/train-adv" &
    step 150 "$c/sample.log" "$jb" --device cuda sample --model results/models/jem \
        --per-class 2 --steps 20 --out "$c/sample" &
    step 150 "$c/calibrate.log" "$jb" --device cuda calibrate --models results/models/baseline \
        --steps 0,1 --n 100 --out "$c/calibrate" &
    step 150 "$c/ood.log" "$jb" --device cuda ood --models results/models/baseline --n 100 \
        --out "$c/ood" &
    step 150 "$c/nonsense.log" "$jb" --device cuda nonsense --models results/models/baseline \
        --per-class 1 --max-iters 50 --out "$c/nonsense" &
    wait
    for f in "$c"/*.log; do
        echo "=== $(basename "$f" .log)"
        tail -n 25 "$f"
    done >"$out/commands.log"
    grep -h "^\[" "$c"/*.log
}

run "${1:-}"
