"""jem-bench against PyTorch on this CPU (or on a GPU, `--device cuda`), in one run: every row
of `jem-bench bench` on every model at every thread count, each side in its own process (its
peak memory is its own), the sides interleaved round by round so that a noisy machine slows them
alike. A third side is jem-bench with burn's own convolutions and LeakyReLU (`--kernels burn`),
so that the table shows what jem-kernels changed. Writes results/perf/cpu.csv and
results/perf/cpu.md.

  cargo build --release && python benches/pytorch/compare.py [--rounds 3] [--reps 20]

On a GPU both sides compute on the first CUDA device, in true f32 (ops.py turns PyTorch's TF32
off, as jem-bench never uses it), and the tables go to results/perf/gpu.csv and gpu.md;
jem-bench must then be a `--features cuda` build (`--bin PATH` names it if it is not in
target/release), the `burn` side (a CPU kernel switch) is not run, and peak RSS is host memory
only:

  python benches/pytorch/compare.py --device cuda --threads 1 --sides ours,pytorch

`--resume` keeps the rows of the table already in `--out` and measures only the missing ones, so
that short sessions on a lent GPU complete one table between them.

Needs torch (and safetensors) in the Python that runs it; jem-bench's build and tests never do.

Rows (`--ops`, comma-separated): forward, train-step, input-gradient, sgld-step, jem-iteration
(each on every `--batch`, a comma-separated list of images per call), and pgd-step:kK[:bpda|full]
(a PGD gradient through K SGLD steps of the defence in `--chains` chains, on `--pgd-batch`
images; K = 0 takes no mode). Models (`--models`): DEPTH-WIDTH[:INPUT], e.g. 10-1,28-10:cifar,
where INPUT is mnist (1×28×28, the default) or cifar (3×32×32); or preact18[-W]:cifar, a CIFAR
PreAct-ResNet-18 with W channels in its first stage (64, the full network, by default), which
ops.py builds, times and exports to ONNX (into a temporary folder) and jem-bench times through its
ONNX interpreter (`bench --model FILE.onnx`): PyTorch against jem-bench on a network it imported,
not one of its own (no train-step or jem-iteration rows; the FLOPs are PyTorch's count, the
interpreter counts none; the burn side is not run). Each side times up to `--reps` calls after
`--warmup` (each cut short once `--max-seconds` have passed in it, keeping at least 1 warm-up
and 3 timed calls, so that the slow rows take a bounded time) and reports their median; a row keeps
each side's lowest median over the rounds.

Output, one line per model × row × thread count, in results/perf/cpu.csv:
  row               the table's name: the op, with K and mode for PGD (`pgd-step k10 full`)
  op, k, grad, chains   the operation and, for pgd-step, the defence (grad/chains empty at K = 0)
  model             WRN-DEPTH-WIDTH
  input             CHANNELS×SIZE×SIZE of the images
  batch             images per call (chains per call for jem-iteration)
  threads           RAYON_NUM_THREADS for jem-bench, torch.set_num_threads for PyTorch
  isa               the forced path (`--isa`: native, avx512, avx2, portable; on a GPU native,
                    tiled, tiled-wide, auto, direct or im2col, jem-bench's forward convolution)
  ours_isa, pytorch_isa   what each side reports it ran: jem-kernels' direct convolution
                    (avx512, avx2, portable) + gemm's products (gemm-avx512, gemm-avx2), and
                    ATen's CPU capability
  ours_ms, pytorch_ms, burn_ms   lowest median over the rounds (burn: empty if not run)
  ratio, burn_ratio                   ours / PyTorch and burn ops / PyTorch (below 1: faster)
  ours_gflop_per_call, pytorch_gflop_per_call   each side's FLOP count of the call, in units of
                    the forward pass F (src/bench.rs derives them; they differ only for
                    pgd-step full, where the two sides form the Hessian-vector products
                    differently)
  ours_gflops, pytorch_gflops         GFLOP/s: each side's own count over its own time
  ours_peak_rss_mib, pytorch_peak_rss_mib   largest peak RSS over the rounds (wait4)
  ours_reps, pytorch_reps             timed calls in that side's best round
  ours_backend, pytorch_backend, cpu
results/perf/cpu.md has the same rows as tables, one per model.
"""
import argparse
import csv
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from measured import run

root = pathlib.Path(__file__).resolve().parents[2]
ALL_OPS = ("forward,train-step,input-gradient,sgld-step,jem-iteration,"
           "pgd-step:k0,pgd-step:k1:bpda,pgd-step:k1:full,pgd-step:k10:bpda,pgd-step:k10:full")
p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--max-seconds", type=float, default=10.0,
               help="per process: stop timing after this many seconds (0: no limit)")
p.add_argument("--batch", default="64", help="images per call; a comma-separated list")
p.add_argument("--pgd-batch", type=int, default=16)
p.add_argument("--chains", type=int, default=5)
p.add_argument("--threads", default="1,2")
p.add_argument("--models", default="10-1,16-2")
p.add_argument("--ops", default=ALL_OPS)
p.add_argument("--sides", default="ours,pytorch,burn",
               help="which of ours, pytorch, burn to run (ours and pytorch are needed)")
p.add_argument("--out", default=str(root / "results/perf"))
p.add_argument("--device", default="cpu", help="cpu, or cuda: both sides on the first GPU")
p.add_argument("--bin", help="the jem-bench to time (default: the release build's)")
p.add_argument("--resume", action="store_true",
               help="keep the rows of an existing table in --out and measure only the missing ones "
                    "(each row is still both sides measured side by side in this run's machine; "
                    "the device column says which)")
p.add_argument("--isa", default="native",
               help="kernel paths, comma-separated: native (what this CPU runs), avx512, avx2, "
                    "portable; each forces jem-bench's path (JEM_BENCH_ISA) and holds PyTorch to the "
                    "same instruction set (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, "
                    "MKL_ENABLE_INSTRUCTIONS); on a GPU native (jem-bench's default forward convolution, "
                    "tiled), tiled, tiled-wide, auto, direct or im2col (JEM_BENCH_GPU_CONV)")
a = p.parse_args()

# Where cargo put the release build (CARGO_TARGET_DIR, as cargo reads it, else target/).
ours_bin = pathlib.Path(a.bin) if a.bin else root / os.environ.get("CARGO_TARGET_DIR", "target") / "release/jem-bench"
if not ours_bin.exists():
    sys.exit(f"{ours_bin} not found: run `cargo build --release` first")
sides = a.sides.split(",")
if not {"ours", "pytorch"} <= set(sides) or not set(sides) <= {"ours", "pytorch", "burn"}:
    sys.exit("--sides: expected ours,pytorch and optionally burn")
if a.device not in ("cpu", "cuda"):
    sys.exit(f"--device {a.device}: expected cpu or cuda")
on_gpu = a.device == "cuda"
if on_gpu and "burn" in sides:
    sys.exit("--device cuda: the burn side switches CPU kernels only; pass --sides ours,pytorch")
table = "gpu" if on_gpu else "cpu"
# What each forced path sets for each side. jem-bench's matrix products (the gemm crate) cannot
# be capped at run time: for the avx2 and portable rows to be what an AVX2-only CPU computes,
# time a build without AVX-512 products (`cargo build --release --no-default-features`, passed
# with --bin; the `ours_isa` column says `…+gemm-avx2`). `portable` is jem-bench without its
# direct kernel, the path of CPUs it has no kernel for, held beside PyTorch at AVX2.
ISA_ENV = {
    "native": ({}, {}),
    "avx512": ({"JEM_BENCH_ISA": "avx512"},
               {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                "MKL_ENABLE_INSTRUCTIONS": "AVX512"}),
    "avx2": ({"JEM_BENCH_ISA": "avx2"},
             {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    "portable": ({"JEM_BENCH_ISA": "portable"},
                 {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                  "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
}
# On a GPU the path is jem-bench's forward convolution (JEM_BENCH_GPU_CONV): native (its default,
# tiled), tiled (jem-kernels' own tiled implicit product), tiled-wide (the same on 128-pixel
# tiles), auto (burn's kernels chosen per layer),
# direct (burn's direct kernel) or im2col (the unfolded input times the weight); PyTorch runs
# cuDNN in each.
if on_gpu:
    ISA_ENV = {"native": ({}, {}),
               "auto": ({"JEM_BENCH_GPU_CONV": "auto"}, {}),
               "direct": ({"JEM_BENCH_GPU_CONV": "direct"}, {}),
               "im2col": ({"JEM_BENCH_GPU_CONV": "im2col"}, {}),
               "tiled": ({"JEM_BENCH_GPU_CONV": "tiled"}, {}),
               "tiled-wide": ({"JEM_BENCH_GPU_CONV": "tiled-wide"}, {})}
isas = a.isa.split(",")
if not set(isas) <= set(ISA_ENV):
    sys.exit(f"--isa {a.isa}: expected, comma-separated, native, avx512, avx2 or portable on a CPU; "
             "native, tiled, tiled-wide, auto, direct or im2col on a GPU")


def parse_op(entry):
    """`pgd-step:k10:full` -> (op, k, grad, batch, flags common to both sides)."""
    op, *rest = entry.split(":")
    if op != "pgd-step":
        if rest:
            sys.exit(f"--ops {entry}: only pgd-step takes :kK[:mode]")
        return op, None, None, None, ["--op", op]
    if not rest or not rest[0].startswith("k") or not rest[0][1:].isdigit():
        sys.exit(f"--ops {entry}: expected pgd-step:kK[:bpda|full]")
    k = int(rest[0][1:])
    grad = rest[1] if len(rest) > 1 else ("bpda" if k > 0 else None)
    if (k == 0) != (grad is None) or grad not in (None, "bpda", "full"):
        sys.exit(f"--ops {entry}: K = 0 takes no mode, K > 0 takes bpda or full")
    flags = ["--op", op, "--k", str(k), "--chains", str(a.chains)]
    if grad:
        flags += ["--grad", grad]
    return op, k, grad, a.pgd_batch, flags




cpu = next(
    (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
    platform.processor(),
)
ops = [parse_op(e) for e in a.ops.split(",")]
INPUTS = {"mnist": (1, 28), "cifar": (3, 32)}


def parse_model(entry):
    """`28-10:cifar` -> (28, 10, "cifar"); `preact18-32:cifar` -> ("preact18", 32, "cifar")."""
    arch, _, shape = entry.partition(":")
    shape = shape or "mnist"
    if shape not in INPUTS:
        sys.exit(f"--models {entry}: expected DEPTH-WIDTH[:mnist|cifar] or preact18[-W]:cifar")
    if arch.startswith("preact18"):
        if shape != "cifar":
            sys.exit(f"--models {entry}: the PreAct-ResNet-18 is CIFAR-shaped (preact18[-W]:cifar)")
        width = arch.partition("-")[2]
        return "preact18", int(width) if width else 64, shape
    depth, width = (int(v) for v in arch.split("-"))
    return depth, width, shape


def model_flags(depth, width):
    """ops.py's flags naming the network."""
    if depth == "preact18":
        return ["--arch", "preact-resnet18", "--preact-width", str(width)]
    return ["--depth", str(depth), "--width", str(width)]


def model_name(depth, width):
    """The table's name of a network (what ops.py reports)."""
    if depth == "preact18":
        return f"PreAct-ResNet-18 (width {width})"
    return f"WRN-{depth}-{width}"


# The PreAct-ResNets, as ops.py exports them, for jem-bench's side.
onnx_dir = pathlib.Path(tempfile.mkdtemp(prefix="jem-bench-compare-"))


def exported(depth, width):
    path = onnx_dir / f"preact-resnet18-w{width}.onnx"
    if not path.exists():
        channels, size = INPUTS["cifar"]
        cmd = [sys.executable, str(root / "benches/pytorch/ops.py"), "--op", "forward",
               *model_flags(depth, width), "--channels", str(channels), "--size", str(size),
               "--export", str(path)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


models = [parse_model(m) for m in a.models.split(",")]
batches = [int(b) for b in a.batch.split(",")]
out = pathlib.Path(a.out)
out.mkdir(parents=True, exist_ok=True)
burn = "burn" in sides


def write_tables():
    """Both tables, rewritten after every row: a run stopped at a time limit keeps its rows."""
    with open(out / f"{table}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out / f"{table}.md", "w") as f:
        limit = (f" (fewer once {a.max_seconds:g} s of timed calls had passed, at least {min(3, a.reps)})"
                 if a.max_seconds > 0 else "")
        if on_gpu:
            gpus = ", ".join(dict.fromkeys(r["device"] for r in rows))
            f.write(f"GPU: {gpus} (host CPU of this run: {cpu}); ")
        else:
            f.write(f"CPU: {cpu}; ")
        f.write(f"lowest median of {a.rounds} interleaved rounds × up to {a.reps} calls"
                f"{limit}; batch {a.batch} "
                f"(PGD rows: {a.pgd_batch} images × {a.chains} chains); ratio = ours / PyTorch (below 1: faster)")
        if burn:
            f.write("; burn ops = jem-bench with burn's own convolutions and LeakyReLU (`--kernels burn`), the state before jem-kernels")
        f.write(". GFLOP/s: each side's FLOP count (docs/performance.md) over its time; for `pgd-step … full` "
                "both sides count 2F per Hessian-vector product (jem-bench: forward and back through the network "
                "linearised at the step; PyTorch: double backward).\n")
        for model, shape in dict.fromkeys((r["model"], r["input"]) for r in rows):
            f.write(f"\n## {model} on {shape} images\n\n")
            head = ["row", "isa (ours / PyTorch)", "batch", "threads", "ours ms", "PyTorch ms", "ratio"]
            if burn:
                head += ["burn ops ms", "burn ops ratio"]
            head += ["ours GFLOP/s", "PyTorch GFLOP/s", "ours peak MiB", "PyTorch peak MiB"]
            f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
            for r in rows:
                if (r["model"], r["input"]) != (model, shape):
                    continue
                cells = [r["row"], f'{r["ours_isa"]} / {r["pytorch_isa"]}', r["batch"], r["threads"],
                         r["ours_ms"], r["pytorch_ms"], r["ratio"]]
                if burn:
                    cells += [r["burn_ms"], r["burn_ratio"]]
                cells += [r["ours_gflops"], r["pytorch_gflops"], r["ours_peak_rss_mib"], r["pytorch_peak_rss_mib"]]
                f.write("| " + " | ".join(str(c) for c in cells) + " |\n")


started = time.monotonic()
rows = []
# A row is one op of one model at one batch, thread count and path.
def key(op, k, grad, model, input_, batch, threads, isa):
    return tuple(str(v) for v in (op, "" if k is None else k, grad or "", model, input_, batch, threads, isa))


done = set()
if a.resume and (out / f"{table}.csv").exists():
    rows = list(csv.DictReader(open(out / f"{table}.csv")))
    done = {key(r["op"], r["k"], r["grad"], r["model"], r["input"], r["batch"], r["threads"], r["isa"])
            for r in rows}
    print(f"--resume: {len(rows)} rows kept from {out / (table + '.csv')}")
runs = [(depth, width, shape, op, k, grad, batch, op_flags, threads, isa)
        for isa in isas
        for depth, width, shape in models
        for op, k, grad, pgd_batch, op_flags in ops
        for batch in ([pgd_batch] if pgd_batch else batches)
        for threads in [int(t) for t in a.threads.split(",")]]
for depth, width, shape, op, k, grad, batch, op_flags, threads, isa in runs:
    channels, size = INPUTS[shape]
    if key(op, k, grad, model_name(depth, width), f"{channels}×{size}×{size}", batch, threads, isa) in done:
        continue
    graph = depth == "preact18"
    if graph and op in ("train-step", "jem-iteration"):
        continue
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    ours_env, pytorch_env = ISA_ENV[isa]
    envs = {"ours": {**env, **ours_env}, "burn": {**env, **ours_env}, "pytorch": {**env, **pytorch_env}}
    common = [*op_flags, "--batch", str(batch), "--channels", str(channels), "--size", str(size),
              "--reps", str(a.reps), "--warmup", str(a.warmup)]
    if a.max_seconds > 0:
        common += ["--max-seconds", str(a.max_seconds)]
    ours_model = ["--model", str(exported(depth, width))] if graph else model_flags(depth, width)
    cmds = {
        "ours": [str(ours_bin), "--device", a.device, "bench", *common, *ours_model],
        "burn": [str(ours_bin), "bench", *common, *ours_model, "--kernels", "burn"],
        "pytorch": [sys.executable, str(root / "benches/pytorch/ops.py"), *common,
                    *model_flags(depth, width), "--threads", str(threads), "--device", a.device],
    }
    best = {}
    for _ in range(a.rounds):
        for side in sides:
            if graph and side == "burn":
                continue
            t, rss = run(cmds[side], envs[side])
            b = best.setdefault(side, {"ms": float("inf"), "rss": 0.0, "t": t})
            if t["median_ms"] < b["ms"]:
                b["ms"], b["t"] = t["median_ms"], t
            b["rss"] = max(b["rss"], rss)
    o, q, r = best["ours"], best["pytorch"], best.get("burn")
    # Both sides must have timed the same row of the same network on the same batch (jem-bench
    # names an ONNX graph by its file; ops.py exported it).
    for field in ("row", "batch") if graph else ("row", "model", "batch"):
        if o["t"][field] != q["t"][field]:
            sys.exit(f"{field}: jem-bench says {o['t'][field]}, ops.py {q['t'][field]}")
    if o["t"]["gflop_per_call"] is None:
        # The interpreter counts no FLOPs: the graph is PyTorch's network, so is its count.
        o["t"]["gflop_per_call"] = q["t"]["gflop_per_call"]
    row = {
        "row": o["t"]["row"],
        "op": op,
        "k": "" if k is None else k,
        "grad": grad or "",
        "chains": a.chains if k else "",
        "model": q["t"]["model"] if graph else o["t"]["model"],
        "input": f"{channels}×{size}×{size}",
        "batch": batch,
        "threads": threads,
        "isa": isa,
        "ours_isa": o["t"].get("isa", ""),
        "pytorch_isa": q["t"].get("isa", ""),
        "ours_ms": round(o["ms"], 2),
        "pytorch_ms": round(q["ms"], 2),
        "ratio": round(o["ms"] / q["ms"], 3),
        "burn_ms": round(r["ms"], 2) if r else "",
        "burn_ratio": round(r["ms"] / q["ms"], 3) if r else "",
        "ours_gflop_per_call": o["t"]["gflop_per_call"],
        "pytorch_gflop_per_call": q["t"]["gflop_per_call"],
        "ours_gflops": round(o["t"]["gflop_per_call"] / (o["ms"] / 1e3), 2),
        "pytorch_gflops": round(q["t"]["gflop_per_call"] / (q["ms"] / 1e3), 2),
        "ours_peak_rss_mib": round(o["rss"], 1),
        "pytorch_peak_rss_mib": round(q["rss"], 1),
        "ours_reps": o["t"]["reps"],
        "pytorch_reps": q["t"]["reps"],
        "ours_backend": o["t"]["backend"],
        "pytorch_backend": q["t"]["backend"],
        "cpu": cpu,
        "device": q["t"].get("device", "cpu"),
    }
    rows.append(row)
    print(f"{row['model']:9} {row['row']:18} {isa:8} threads {threads}: ours {row['ours_ms']:9.2f} ms, "
          f"pytorch {row['pytorch_ms']:9.2f} ms, ratio {row['ratio']:.2f} "
          f"[{(time.monotonic() - started) / 60:.0f} min]", flush=True)
    write_tables()

print(f"wrote {out / (table + '.csv')} and {out / (table + '.md')} in {(time.monotonic() - started) / 60:.0f} min")
