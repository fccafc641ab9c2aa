#!/usr/bin/env bash
# One CIFAR-shaped evaluation end to end on a GPU: a WRN-28-10 on 3×32×32 images under the
# adaptive default at K = 0, 1 and 10, its printed estimate against the time it took, its peak
# GPU memory, and PyTorch's double-backprop gradient on the same batch beside jem-bench's.
#
#   scripts/gpu-cifar.sh [OUT]          # OUT defaults to results/gpu/cifar
#
# 1. Data: scripts/cifar_like.py writes CIFAR-10's binary format (5 000 training and 1 000 test
#    images, a learnable pattern per class; the real set is not needed) to runs/cifar-like/.
# 2. Model: a WRN-DEPTH-WIDTH (JEM's layout) trained briefly on it (`train --kind baseline`,
#    3 epochs), kept in runs/cifar-like/ and reused by the next call.
# 3. One sweep per K (its own process, so that the GPU memory sampled is that cell's): `robust
#    --norm linf` with the adaptive default on the first CIFAR_N test images at ε 0, 4/255 and
#    8/255, into OUT/sweep-kK/, its output in OUT/kK.log, GPU memory sampled every 200 ms
#    (nvidia-smi) into OUT/memory-kK.csv. Each sweep has CIFAR_SECONDS; one stopped at its limit
#    keeps its finished batches (--batch-size 5) and resumes on the next call.
# 4. PyTorch on the same device (benches/pytorch/compare.py, when the Python has torch): the
#    attack's gradient through K SGLD steps (pgd-step rows, exact double backprop) on the
#    attacked batch (CIFAR_N images × 5 chains), jem-bench's beside it, into OUT/pytorch/.
# 5. OUT/cifar.md: per K, the estimate printed, the time taken, peak GPU memory, the accuracies.
#
# Environment: JEM_BENCH (the binary; default target/release/jem-bench, which must be a
# `--features cuda` build for the GPU), CIFAR_DEVICE (cuda; `cpu` rehearses the script),
# CIFAR_DEPTH and CIFAR_WIDTH (28, 10), CIFAR_N (20), CIFAR_KS (0 1 10), CIFAR_SECONDS (150 per
# sweep), CIFAR_FLAGS (more `robust` flags, e.g. smaller budgets), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-results/gpu/cifar}
bin=${JEM_BENCH:-target/release/jem-bench}
device=${CIFAR_DEVICE:-cuda}
depth=${CIFAR_DEPTH:-28}
width=${CIFAR_WIDTH:-10}
n=${CIFAR_N:-20}
ks=${CIFAR_KS:-0 1 10}
seconds=${CIFAR_SECONDS:-150}
python=${PYTHON:-python3}
data=runs/cifar-like
model=$data/wrn-$depth-$width

[ -x "$bin" ] || {
    echo "$bin: no jem-bench binary (cargo build --release --features cuda, or set JEM_BENCH)" >&2
    exit 1
}
mkdir -p "$out"

# GPU memory in use, sampled every 200 ms into $1 until the returned sampler is killed; nothing
# on a machine without nvidia-smi.
sample_memory() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 200 >"$1" &
        echo $!
    else
        : >"$1"
        echo ""
    fi
}

[ -f "$data/test_batch.bin" ] || "$python" scripts/cifar_like.py "$data" || exit 1
if [ ! -f "$model/model.safetensors" ]; then
    "$bin" --device "$device" train --kind baseline --data "cifar10:$data" --depth "$depth" \
        --width "$width" --epochs 3 --warmup-iters 10 --batch-size 64 --val-size 500 \
        --out "$model" >"$out/train.log" 2>&1 || {
        tail -5 "$out/train.log"
        exit 1
    }
fi
tail -2 "$out/train.log" 2>/dev/null

for k in $ks; do
    log=$out/k$k.log
    sampler=$(sample_memory "$out/memory-k$k.csv")
    started=$SECONDS
    # shellcheck disable=SC2086 # CIFAR_FLAGS is a list of flags
    timeout --kill-after=10 "$seconds" "$bin" --device "$device" robust --norm linf \
        --models "$model/model" --data "cifar10:$data" --steps "$k" --n-examples "$n" \
        --batch-size 5 --eps 0,0.0157,0.0314 --jobs 1 --out "$out/sweep-k$k" \
        ${CIFAR_FLAGS:-} >"$log" 2>&1
    rc=$?
    [ -n "$sampler" ] && kill "$sampler"
    how="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && how="stopped at its limit of $seconds s (resumes on the next call)"
    echo "[k$k] $how after $((SECONDS - started)) s" | tee -a "$log"
done

if "$python" -c "import torch, safetensors" 2>/dev/null; then
    ops=$(for k in $ks; do if [ "$k" = 0 ]; then printf 'pgd-step:k0,'; else printf 'pgd-step:k%s:full,' "$k"; fi; done)
    sides=ours,pytorch
    timeout --kill-after=10 "$seconds" "$python" benches/pytorch/compare.py --device "$device" \
        --bin "$bin" --threads 1 --sides "$sides" --models "$depth-$width:cifar" \
        --ops "${ops%,}" --pgd-batch "$n" --chains 5 --rounds 1 --reps 5 --warmup 1 \
        --max-seconds 5 --resume --out "$out/pytorch" >"$out/pytorch.log" 2>&1
    echo "[pytorch] exit $? (benches/pytorch/compare.py, $out/pytorch.log)"
else
    echo "[pytorch] not run: $python has no torch" | tee "$out/pytorch.log"
fi

"$python" - "$out" "$ks" "$device" "$depth-$width" "$n" <<'EOF'
import csv, glob, gzip, json, os, re, sys

out, ks, device, model, n = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5]
rows = [f"# WRN-{model} on CIFAR-shaped data, the adaptive default, {n} images, on {device}", "",
        "| K | estimate printed | bound printed | time taken | cells done | peak GPU memory (MiB) | clean | robust ε=4/255 | robust ε=8/255 |",
        "|---|---|---|---|---|---|---|---|---|"]
for k in ks:
    text = open(os.path.join(out, f"k{k}.log"), errors="replace").read().replace("\r", "\n")
    est = re.search(r"cells to run, about (.+?) here .*?at most (.+?) \(", text)
    took = re.findall(r"\[k\d+\] (.*)", text)
    cells = glob.glob(os.path.join(out, f"sweep-k{k}", "cells", "*.json.gz"))
    seconds = sum(json.load(gzip.open(c))["seconds"] for c in cells)
    mem = [int(l.split(",")[1]) for l in open(os.path.join(out, f"memory-k{k}.csv")) if "," in l]
    acc = {}
    path = os.path.join(out, f"sweep-k{k}", "robust.csv")
    if os.path.exists(path):
        for r in csv.DictReader(open(path)):
            if r["attack"] == "worst-case":
                acc["clean"] = float(r["clean_accuracy"])
                acc[r["eps"]] = float(r["robust_accuracy"])
    pct = lambda key: f"{100 * acc[key]:.0f} %" if key in acc else "—"
    rows.append(f"| {k} | {est.group(1) if est else '—'} | {est.group(2) if est else '—'} | "
                f"{took[-1] if took else '—'}; cells {seconds:.0f} s | {len(cells)} of 1 | "
                f"{max(mem) if mem else '—'} | {pct('clean')} | {pct('0.0157')} | {pct('0.0314')} |")
gpu = os.path.join(out, "pytorch", "gpu.md" if device.startswith("cuda") else "cpu.md")
rows += ["", "PyTorch against jem-bench on the attacked batch:", ""]
rows += open(gpu).read().splitlines() if os.path.exists(gpu) else ["(not measured)"]
open(os.path.join(out, "cifar.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
