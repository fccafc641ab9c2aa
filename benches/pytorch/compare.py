"""jem-bench against PyTorch on this CPU, in one run: every operation of `jem-bench bench`
(forward, train step, input gradient, SGLD step) at 1 and 2 threads, each side in its own process
(its peak memory is its own), the sides interleaved round by round so that a noisy machine
slows them alike. A third side is jem-bench with burn's own convolution (`--convolution burn`),
so that the table shows what jem-kernels' convolutions changed. Writes results/perf/cpu.csv and
results/perf/cpu.md.

  cargo build --release && python benches/pytorch/compare.py [--rounds 3] [--reps 20]

Needs torch (and safetensors) in the Python that runs it; jem-bench's build and tests never do.
Reported per side: the lowest of the rounds' medians (ms), GFLOP/s from it, peak RSS (MiB).
"""
import argparse
import csv
import json
import os
import pathlib
import platform
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parents[2]
p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--batch", type=int, default=64)
p.add_argument("--threads", default="1,2")
p.add_argument("--ops", default="forward,train-step,input-gradient,sgld-step")
p.add_argument("--out", default=str(root / "results/perf"))
a = p.parse_args()

ours_bin = root / "target/release/jem-bench"
if not ours_bin.exists():
    sys.exit(f"{ours_bin} not found: run `cargo build --release` first")


def run(cmd, env):
    """Runs cmd; its JSON line and its own peak RSS in MiB (wait4's ru_maxrss, in KiB)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(write, 1)
        os.close(read)
        os.close(write)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.execvpe(cmd[0], cmd, env)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed (status {status})")
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line), usage.ru_maxrss / 1024.0


cpu = next(
    (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
    platform.processor(),
)
rows = []
for op in a.ops.split(","):
    for threads in [int(t) for t in a.threads.split(",")]:
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        common = ["--op", op, "--batch", str(a.batch), "--reps", str(a.reps)]
        ours_cmd = [str(ours_bin), "bench", *common]
        burn_cmd = [*ours_cmd, "--convolution", "burn"]
        torch_cmd = [sys.executable, str(root / "benches/pytorch/ops.py"), *common, "--threads", str(threads)]
        best = {}
        for _ in range(a.rounds):
            for side, cmd in (("ours", ours_cmd), ("pytorch", torch_cmd), ("burn", burn_cmd)):
                t, rss = run(cmd, env)
                b = best.setdefault(side, {"ms": float("inf"), "rss": 0.0, "t": t})
                b["ms"] = min(b["ms"], t["median_ms"])
                b["rss"] = max(b["rss"], rss)
        o, q, r = best["ours"], best["pytorch"], best["burn"]
        gflop = o["t"]["gflop_per_call"]
        row = {
            "row": op,
            "model": o["t"]["model"],
            "batch": a.batch,
            "threads": threads,
            "ours_ms": round(o["ms"], 2),
            "pytorch_ms": round(q["ms"], 2),
            "ratio": round(o["ms"] / q["ms"], 3),
            "burn_conv_ms": round(r["ms"], 2),
            "burn_conv_ratio": round(r["ms"] / q["ms"], 3),
            "ours_gflops": round(gflop / (o["ms"] / 1e3), 2),
            "pytorch_gflops": round(q["t"]["gflop_per_call"] / (q["ms"] / 1e3), 2),
            "ours_peak_rss_mib": round(o["rss"], 1),
            "pytorch_peak_rss_mib": round(q["rss"], 1),
            "ours_backend": o["t"]["backend"],
            "pytorch_backend": q["t"]["backend"],
            "cpu": cpu,
        }
        rows.append(row)
        print(f"{op:15} threads {threads}: ours {row['ours_ms']:8.2f} ms, pytorch {row['pytorch_ms']:8.2f} ms, ratio {row['ratio']:.2f}", flush=True)

out = pathlib.Path(a.out)
out.mkdir(parents=True, exist_ok=True)
with open(out / "cpu.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
with open(out / "cpu.md", "w") as f:
    f.write(f"CPU: {cpu}; {rows[0]['model']}, batch {a.batch}; lowest median of {a.rounds} interleaved rounds × {a.reps} calls; ratio = ours / PyTorch (below 1: faster); burn conv = jem-bench with burn's own convolution (`--convolution burn`), the state before jem-kernels.\n\n")
    f.write("| row | threads | ours ms | PyTorch ms | ratio | burn conv ms | burn conv ratio | ours GFLOP/s | PyTorch GFLOP/s | ours peak MiB | PyTorch peak MiB |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        f.write(f"| {r['row']} | {r['threads']} | {r['ours_ms']} | {r['pytorch_ms']} | {r['ratio']} | {r['burn_conv_ms']} | {r['burn_conv_ratio']} | {r['ours_gflops']} | {r['pytorch_gflops']} | {r['ours_peak_rss_mib']} | {r['pytorch_peak_rss_mib']} |\n")
print(f"wrote {out / 'cpu.csv'} and {out / 'cpu.md'}")
