#!/usr/bin/env bash
# The ONNX rows of results/perf, in one go, on an otherwise idle machine (check `uptime` first):
#   1. results/perf/onnx-cpu.{csv,md}: jem-bench's ONNX interpreter against its native network on
#      the same weights (the embedded baseline and JEM, exported by PyTorch and imported back):
#      forward, input-gradient and pgd-step k1 full, at 1 and 2 threads (benches/onnx_native.py);
#   2. the CIFAR PreAct-ResNet-18 rows of results/perf/cpu.{csv,md}: the full network (width 64)
#      exported by ops.py and timed through the interpreter beside PyTorch (compare.py, merged
#      into the table with merge.py, its first paragraph kept and a sentence added).
# Needs a Python with torch and safetensors (PYTHON, default python3); about 20 min on two cores.
#
#   PYTHON=/path/to/venv/bin/python bash benches/onnx_rows.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
bin="${CARGO_TARGET_DIR:-target}/release/jem-bench"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cargo build --release
"$python" benches/pytorch/export_jem.py --out "$work/jem-export.onnx"
"$bin" import tests/fixtures/onnx/embedded_baseline.onnx --data mnist --mean 0.5 --std 0.5 \
    --out "$work/baseline"
"$bin" import "$work/jem-export.onnx" --data mnist --mean 0.5 --std 0.5 --out "$work/jem"

python3 benches/onnx_native.py \
    --pair "baseline=results/models/baseline,$work/baseline" \
    --pair "jem=results/models/jem,$work/jem" \
    --rounds 3 --reps 10 --max-seconds 4 --out results/perf/onnx-cpu \
    --made-by "on $(date +%F), nothing else running, by \`PYTHON=… bash benches/onnx_rows.sh\` \
(\`python3 benches/onnx_native.py --pair baseline=results/models/baseline,BASELINE.onnx --pair \
jem=results/models/jem,JEM.onnx --rounds 3 --reps 10 --max-seconds 4\`, the graphs exported by \
PyTorch and imported into a temporary folder)"

"$python" benches/pytorch/compare.py --models preact18:cifar \
    --ops forward,input-gradient,pgd-step:k0,pgd-step:k1:full --sides ours,pytorch \
    --rounds 2 --reps 10 --max-seconds 4 --out "$work/preact"
# The table's first paragraph, without the sentence an earlier run of this script added.
first="$(head -n 1 results/perf/cpu.md | sed 's/ The PreAct-ResNet-18 rows .*//')"
note="$first The PreAct-ResNet-18 rows (3×32×32, full width: 64 \
channels in the first stage; $(date +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | \
sed 's/^ *//'), nothing else running) time a network jem-bench imported, not one of its own: ops.py \
exports its seeded PreAct-ResNet-18 to ONNX and jem-bench runs it through its ONNX interpreter \
(\`bench --model\`), beside PyTorch on the same network; made by \`PYTHON=… bash benches/onnx_rows.sh\` \
(\`compare.py --models preact18:cifar --ops forward,input-gradient,pgd-step:k0,pgd-step:k1:full \
--sides ours,pytorch --rounds 2 --reps 10 --max-seconds 4\`, then \`merge.py\`). Their FLOPs are \
PyTorch's count for both sides."
"$python" benches/pytorch/merge.py results/perf/cpu.csv "$work/preact/cpu.csv" \
    --out results/perf/cpu --note "$note"
echo "wrote results/perf/onnx-cpu.{csv,md} and the PreAct-ResNet-18 rows of results/perf/cpu.{csv,md}"
