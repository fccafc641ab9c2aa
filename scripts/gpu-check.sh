#!/usr/bin/env bash
# The GPU check: CPU–GPU agreement (tests/gpu.rs), the default sweep's K = 0 cells on the GPU
# against the committed CPU sweep, and timings against PyTorch on the same GPU — in one run on a
# machine with an NVIDIA GPU, from binaries built on a machine without one.
#
#   scripts/gpu-check.sh build          # here: --features cuda builds, stripped and xz'd into
#                                       # .gpu-check/bin (git-ignored), about 30 MB
#   scripts/gpu-check.sh stash          # here, before the device call: moves the large tracked
#                                       # folders not read there (results/train, datasets/data, …)
#                                       # into .gpu-check/stash, so that what travels fits 64 MiB
#   scripts/gpu-check.sh unstash        # here, after it: puts them back
#   scripts/gpu-check.sh run [OUT]      # on the GPU machine, from the repository root: writes
#                                       # OUT (default results/gpu): machine.txt,
#                                       # first-eval.log, agreement.log, k0-sweep.log,
#                                       # k0-equality.txt, compare.log, gpu.csv, gpu.md
#                                       # (8 files: what a device call brings back at most)
#
# Needed on the GPU machine: the NVIDIA driver and libnvrtc (burn compiles its kernels at run
# time), xz, and python3 with torch for the timings (skipped, and said so, without it); the
# repository's results/models and results/sweeps/linf (the CPU sweep compared against) — not
# results/train or datasets/data, which the binaries do not read.
#
# Budget: about 8 minutes. Each step has its own time limit and the script goes on to the next
# when one runs out, so a slow step costs its own result only; every log says how it ended.
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
    mkdir -p "$out"
    local work
    work=$(mktemp -d)
    xz -dc "$bin/jem-bench.xz" >"$work/jem-bench" && chmod +x "$work/jem-bench"
    xz -dc "$bin/gpu-tests.xz" >"$work/gpu-tests" && chmod +x "$work/gpu-tests"
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    # burn's CUDA backend compiles each kernel with NVRTC the first time a process meets it;
    # cubecl.toml (read from this folder) keeps them, and the autotune choices, under target/
    # for the next process. cubecl panics on a configuration it cannot read: then the check
    # goes on without the file, and says so.
    step 120 "$out/first-eval.log" "$work/jem-bench" --device cuda eval --model results/models/baseline --n 100
    if grep -q "doesn't have the right format" "$out/first-eval.log"; then
        mv cubecl.toml "$work/cubecl.toml.unread"
        echo "cubecl.toml could not be read by cubecl: moved aside for this run" | tee -a "$out/first-eval.log"
    fi

    # 1. Agreement, every case printed (the test binary runs from the repository root, where
    #    it finds results/models).
    step 300 "$out/agreement.log" "$work/gpu-tests" --ignored --nocapture --test-threads 1

    # 2. The default sweep's K = 0 cell of the baseline on the GPU (the AutoAttack cascade: 218 s
    #    on 2 CPU cores; all three models would not fit this step's time), against the
    #    committed CPU sweep: the same examples broken at every ε by every stage.
    step 150 "$out/k0-sweep.log" "$work/jem-bench" --device cuda robust --norm linf --steps 0 \
        --models results/models/baseline --out "$work/k0" &&
        python3 - "$work/k0/examples.csv" results/sweeps/linf/examples.csv >"$out/k0-equality.txt" <<'EOF'
import csv, sys
def outcomes(path):
    rows = csv.DictReader(open(path))
    return {(r["model"], r["attack"], r["eps"], r["example"]): (r["clean_correct"], r["adversarial"])
            for r in rows if r["k"] == "0"}
gpu, cpu = outcomes(sys.argv[1]), outcomes(sys.argv[2])
shared = sorted(set(gpu) & set(cpu))
differ = [key for key in shared if gpu[key] != cpu[key]]
print(f"K = 0 cells: {len(gpu)} examples on the GPU, {len(cpu)} in the committed CPU sweep, "
      f"{len(shared)} compared; {len(differ)} differ")
for key in differ:
    print("differs:", key, "gpu", gpu[key], "cpu", cpu[key])
sys.exit(1 if differ or not shared else 0)
EOF
    cat "$out/k0-equality.txt" 2>/dev/null

    # 3. Timings against PyTorch on the same GPU: every row, WRN-10-1 (MNIST) and WRN-28-10
    #    (CIFAR-10 shape), batches 64 and 256.
    if python3 -c 'import torch, safetensors; assert torch.cuda.is_available()' 2>/dev/null; then
        step 240 "$out/compare.log" python3 benches/pytorch/compare.py --device cuda \
            --bin "$work/jem-bench" --sides ours,pytorch --threads 1 --rounds 1 --reps 10 \
            --warmup 2 --max-seconds 2 --models 10-1,28-10:cifar --batch 64,256 --out "$out"
    else
        echo "timings not run: python3 with torch, safetensors and CUDA not found" | tee "$out/compare.log"
    fi
    rm -rf "$work"
}

# Tracked folders the GPU machine does not read (the binaries embed the data sets): with them
# aside, the tree is about 7 MiB and the two binaries about 52 MiB of the 64 MiB that travel.
big=(results/train datasets/data results/samples results/reference results/ood tests/fixtures
    results/sweeps/l2 results/sweeps/autoattack-linf results/sweeps/jem-1to1-linf
    results/sweeps/linf-k1-full-eot4)

stash() {
    mkdir -p .gpu-check/stash
    for d in "${big[@]}"; do
        mkdir -p ".gpu-check/stash/$(dirname "$d")"
        mv "$d" ".gpu-check/stash/$d"
    done
}

unstash() {
    for d in "${big[@]}"; do
        if [ -e ".gpu-check/stash/$d" ]; then
            mv ".gpu-check/stash/$d" "$d"
        else
            git checkout -- "$d"
        fi
    done
}

case "${1:-}" in
build) build ;;
stash) stash ;;
unstash) unstash ;;
run) run "${2:-}" ;;
*)
    echo "usage: scripts/gpu-check.sh build | stash | unstash | run [OUT]" >&2
    exit 2
    ;;
esac
