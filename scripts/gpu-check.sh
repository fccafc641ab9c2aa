#!/usr/bin/env bash
# The GPU check: CPU–GPU agreement (tests/gpu.rs), the default sweep's K = 0 cells on the GPU
# against the committed CPU sweep, and timings against PyTorch on the same GPU — in one run on a
# machine with an NVIDIA GPU, from binaries built on a machine without one.
#
#   scripts/gpu-check.sh build          # here: --features cuda builds, stripped and xz'd into
#                                       # .gpu-check/bin (git-ignored), about 30 MB
#   scripts/gpu-check.sh stash          # here, before the device call: moves the large tracked
#                                       # folders not read there (datasets/data, the sweeps, …)
#                                       # into .gpu-check/stash, so that what travels fits 64 MiB
#   scripts/gpu-check.sh unstash        # here, after it: puts them back
#   scripts/gpu-check.sh run [OUT]      # on the GPU machine, from the repository root: writes
#                                       # OUT (default results/gpu): machine.txt,
#                                       # agreement.log, k0.log, k1.log, commands.log,
#                                       # compare.log, gpu.csv, gpu.md
#                                       # (8 files: what a device call brings back at most)
#
# Needed on the GPU machine: the NVIDIA driver and libnvrtc (burn compiles its kernels at run
# time), xz, and python3 with torch for the timings (skipped, and said so, without it); the
# repository's results/models and results/sweeps/linf (the CPU sweep compared against) — not
# results/train or datasets/data, which the binaries do not read.
#
# GPU_CHECK_PHASES chooses what runs: `all` (default) or `timings` (phase 2 only: a second call
# on a machine still warm).
#
# Budget: about 7 minutes (GPU_CHECK_SECONDS, default 420, bounds the two phases together).
# Each step has its own time limit and the script goes on to the next when one runs out, so a
# slow step costs its own result only; every log says how it ended.
set -uo pipefail
cd "$(dirname "$0")/.."

bin=.gpu-check/bin

build() {
    set -e
    cargo build --release --features cuda
    # The test binary's path has a hash: ask cargo for it.
    local test_bin
    test_bin=$(cargo test --release --features cuda --test gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gpu" and m.get("executable"):
        print(m["executable"])')
    rm -rf "$bin" && mkdir -p "$bin"
    cp target/release/jem-bench "$bin/jem-bench"
    cp "$test_bin" "$bin/gpu-tests"
    strip "$bin/jem-bench" "$bin/gpu-tests"
    xz -T2 -6 "$bin/jem-bench" "$bin/gpu-tests"
    # What the binaries were built from (the GPU machine's copy of the tree cannot say: its
    # large folders are stashed, and uncommitted changes travel too).
    {
        echo "built from: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!results' || echo ' with uncommitted changes')"
        echo "built on: $(date -u +%FT%TZ)"
    } >"$bin/built-from.txt"
    ls -l "$bin"
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
    # cubecl caches compiled kernels under target/ by kernel id, not by source: binaries built
    # from other source (a new build) must not reuse what an earlier one compiled there.
    if ! cmp -s "$bin/built-from.txt" target/built-from.txt; then
        rm -rf target && mkdir -p target && cp "$bin/built-from.txt" target/built-from.txt
    fi
    local work
    work=$(mktemp -d)
    xz -dc "$bin/jem-bench.xz" >"$work/jem-bench" && chmod +x "$work/jem-bench"
    xz -dc "$bin/gpu-tests.xz" >"$work/gpu-tests" && chmod +x "$work/gpu-tests"
    {
        echo "date: $(date -u +%FT%TZ)"
        cat "$bin/built-from.txt" 2>/dev/null || echo "built from: unknown"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        nproc | sed 's/^/host CPU cores: /'
    } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    local started=$SECONDS
    # The forward convolutions checked (the default, jem-kernels' tiled kernels, and burn's
    # kernels chosen per layer) and those timed (every one, the default first).
    local convs=(tiled auto) timed=tiled,auto,im2col,direct

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

# Tracked folders the GPU machine does not read (the binaries embed the data sets): every
# committed sweep but results/sweeps/linf (what the K = 0 and 1 cells are compared with) and the
# large folders below. With them aside, the tree is about 7 MiB and the two binaries about
# 45 MiB of the 64 MiB that travel.
big=(results/train datasets/data results/samples results/reference results/ood)

# `stash [PATH...]`: the PATHs go aside too (results/sweeps/linf among them, if named).
stash() {
    mkdir -p .gpu-check/stash
    local d
    for d in "${big[@]}" results/sweeps/* "$@"; do
        [ "$d" = results/sweeps/linf ] && [[ " $* " != *" results/sweeps/linf "* ]] && continue
        [ -e "$d" ] || continue
        mkdir -p ".gpu-check/stash/$(dirname "$d")"
        mv "$d" ".gpu-check/stash/$d" && echo "$d" >>.gpu-check/stash/moved
    done
}

unstash() {
    local d
    while read -r d; do
        mv ".gpu-check/stash/$d" "$d"
    done <.gpu-check/stash/moved
    rm .gpu-check/stash/moved
}

case "${1:-}" in
build) build ;;
stash) shift && stash "$@" ;;
unstash) unstash ;;
run) run "${2:-}" ;;
*)
    echo "usage: scripts/gpu-check.sh build | stash [PATH...] | unstash | run [OUT]" >&2
    exit 2
    ;;
esac
