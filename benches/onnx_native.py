"""jem-bench's ONNX interpreter against its native Wide-ResNet, in one run: the same rows of
`jem-bench bench` on a checkpoint and on its export to ONNX (imported, or a bare .onnx file),
each measurement its own process, the two sides interleaved round by round so that a noisy
machine slows them alike. The target is the interpreter within 1.15x of the native time. Needs
only Python 3 and a release build (no torch).

  cargo build --release
  python3 benches/onnx_native.py \
      --pair baseline=results/models/baseline,runs/models/baseline-onnx \
      --pair jem=results/models/jem,runs/models/jem-onnx --out results/perf/onnx-cpu

The exports: tests/fixtures/onnx/embedded_baseline.onnx (the baseline, committed) and
`python benches/pytorch/export_jem.py --out FILE.onnx` (the JEM; needs torch), each imported with
`jem-bench import FILE.onnx --data mnist --mean 0.5 --std 0.5 --out NAME`. Pair paths are taken
from the repository's root.

Rows (`--ops`, as compare.py names them): forward and input-gradient on `--batch` images,
pgd-step:k1:full (a PGD gradient through one SGLD step of the defence in `--chains` chains, the
exact gradient through the step) on `--pgd-batch`; at every `--threads` count
(RAYON_NUM_THREADS). Each side times up to `--reps` calls after `--warmup`, cut short after
`--max-seconds` (at least 3 calls), and reports their median; a row keeps each side's lowest
median over the rounds. Writes OUT.csv and OUT.md (one line per pair x row x threads):
  pair, row, native, onnx, input, batch, threads, isa, native_ms, onnx_ms,
  ratio (onnx / native), within_1_15 (ratio <= 1.15), native_reps, onnx_reps,
  native_peak_rss_mib, onnx_peak_rss_mib, backend, cpu
"""
import argparse
import csv
import json
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "pytorch"))
import measured  # noqa: E402  (benches/pytorch/measured.py)

root = pathlib.Path(__file__).resolve().parents[1]
TARGET = 1.15
p = argparse.ArgumentParser()
p.add_argument("--pair", action="append", required=True,
               help="NAME=NATIVE,ONNX: a checkpoint and its export (repeat for more)")
p.add_argument("--ops", default="forward,input-gradient,pgd-step:k1:full")
p.add_argument("--batch", type=int, default=64)
p.add_argument("--pgd-batch", type=int, default=16)
p.add_argument("--chains", type=int, default=5)
p.add_argument("--threads", default="1,2")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--reps", type=int, default=10)
p.add_argument("--warmup", type=int, default=3)
p.add_argument("--max-seconds", type=float, default=4.0)
p.add_argument("--bin", help="the jem-bench to time (default: the release build's)")
p.add_argument("--made-by", help="how the table was made, for its header (default: this command)")
p.add_argument("--out", default=str(root / "results/perf/onnx-cpu"),
               help="OUT.csv and OUT.md are written")
a = p.parse_args()

ours = pathlib.Path(a.bin) if a.bin else root / os.environ.get("CARGO_TARGET_DIR", "target") / "release/jem-bench"
if not ours.exists():
    sys.exit(f"{ours} not found: run `cargo build --release` first")
pairs = []
for entry in a.pair:
    name, _, files = entry.partition("=")
    native, _, onnx = files.partition(",")
    if not (name and native and onnx):
        sys.exit(f"--pair {entry}: expected NAME=NATIVE,ONNX")
    pairs.append((name, native, onnx))


def op_flags(entry):
    """`pgd-step:k1:full` -> (flags, batch)."""
    op, *rest = entry.split(":")
    if op in ("forward", "input-gradient", "sgld-step"):
        if rest:
            sys.exit(f"--ops {entry}: only pgd-step takes :kK[:mode]")
        return ["--op", op], a.batch
    if op != "pgd-step" or not rest or not rest[0].startswith("k") or not rest[0][1:].isdigit():
        sys.exit(f"--ops {entry}: expected forward, input-gradient, sgld-step or pgd-step:kK[:bpda|full]")
    k = int(rest[0][1:])
    flags = ["--op", op, "--k", str(k), "--chains", str(a.chains)]
    if k > 0:
        flags += ["--grad", rest[1] if len(rest) > 1 else "bpda"]
    return flags, a.pgd_batch


def run(cmd, env):
    """Runs cmd from the repository's root; its JSON line and its own peak RSS in MiB."""
    return measured.run(cmd, env, cwd=root)


cpu = next(
    (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
    platform.processor(),
)
rows = []
started = time.monotonic()
out = pathlib.Path(a.out)
out.parent.mkdir(parents=True, exist_ok=True)


made_by = f"by `python3 benches/onnx_native.py {' '.join('--pair ' + p for p in a.pair)}`"


def write_tables():
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(out.with_suffix(".md"), "w") as f:
        f.write(f"CPU: {cpu}; jem-bench's ONNX interpreter against its native Wide-ResNet on the same "
                f"weights: lowest median of {a.rounds} interleaved rounds x up to {a.reps} calls (cut "
                f"after {a.max_seconds:g} s, at least 3); batch {a.batch} (PGD: {a.pgd_batch} images x "
                f"{a.chains} chains); ratio = ONNX / native, target <= {TARGET}. Made "
                f"{a.made_by or made_by}.\n\n")
        head = ["pair", "row", "batch", "threads", "native ms", "ONNX ms", "ratio",
                f"within {TARGET}x", "native peak MiB", "ONNX peak MiB"]
        f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for r in rows:
            cells = [r["pair"], r["row"], r["batch"], r["threads"], r["native_ms"], r["onnx_ms"],
                     r["ratio"], "yes" if r["within_1_15"] else "no", r["native_peak_rss_mib"],
                     r["onnx_peak_rss_mib"]]
            f.write("| " + " | ".join(str(c) for c in cells) + " |\n")


for name, native, onnx in pairs:
    for entry in a.ops.split(","):
        flags, batch = op_flags(entry)
        for threads in [int(t) for t in a.threads.split(",")]:
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
            common = [str(ours), "bench", *flags, "--batch", str(batch), "--reps", str(a.reps),
                      "--warmup", str(a.warmup), "--max-seconds", str(a.max_seconds)]
            best = {}
            for _ in range(a.rounds):
                for side, model in (("native", native), ("onnx", onnx)):
                    t, rss = run([*common, "--model", model], env)
                    b = best.setdefault(side, {"ms": float("inf"), "rss": 0.0, "t": t})
                    if t["median_ms"] < b["ms"]:
                        b["ms"], b["t"] = t["median_ms"], t
                    b["rss"] = max(b["rss"], rss)
            n, o = best["native"], best["onnx"]
            if (n["t"]["row"], n["t"]["input"]) != (o["t"]["row"], o["t"]["input"]):
                sys.exit(f"{name}: the two sides timed {n['t']['row']} on {n['t']['input']} and "
                         f"{o['t']['row']} on {o['t']['input']}")
            ratio = o["ms"] / n["ms"]
            rows.append({
                "pair": name,
                "row": n["t"]["row"],
                "native": f'{native} ({n["t"]["model"]})',
                "onnx": onnx,
                "input": n["t"]["input"],
                "batch": batch,
                "threads": threads,
                "isa": n["t"]["isa"],
                "native_ms": round(n["ms"], 2),
                "onnx_ms": round(o["ms"], 2),
                "ratio": round(ratio, 3),
                "within_1_15": ratio <= TARGET,
                "native_reps": n["t"]["reps"],
                "onnx_reps": o["t"]["reps"],
                "native_peak_rss_mib": round(n["rss"], 1),
                "onnx_peak_rss_mib": round(o["rss"], 1),
                "backend": n["t"]["backend"],
                "cpu": cpu,
            })
            print(f"{name:10} {n['t']['row']:18} threads {threads}: native {n['ms']:9.2f} ms, "
                  f"ONNX {o['ms']:9.2f} ms, ratio {ratio:.2f} "
                  f"[{(time.monotonic() - started) / 60:.0f} min]", flush=True)
            write_tables()

print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.md')} in "
      f"{(time.monotonic() - started) / 60:.0f} min")
