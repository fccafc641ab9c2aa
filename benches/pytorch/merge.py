"""Merges tables written by compare.py into one: rows of later tables replace the rows of
earlier ones with the same row, model, input, batch, threads and forced path (`isa`); tables
from before the `isa` columns count as the native path. Writes CSV and Markdown.

  python benches/pytorch/merge.py results/perf/cpu.csv NEW.csv [MORE.csv …] \
      --out results/perf/cpu --note "what the tables are"
"""
import argparse
import csv

p = argparse.ArgumentParser()
p.add_argument("tables", nargs="+")
p.add_argument("--out", required=True, help="OUT.csv and OUT.md are written")
p.add_argument("--note", default="", help="the Markdown's first paragraph")
a = p.parse_args()

merged, order = {}, []
columns = []
for path in a.tables:
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            row.setdefault("isa", "native")
            for c in row:
                if c not in columns:
                    columns.append(c)
            key = tuple(row.get(c, "") for c in ("row", "model", "input", "batch", "threads", "isa"))
            if key not in merged:
                order.append(key)
            merged[key] = row
rows = [merged[k] for k in order]
with open(a.out + ".csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns, restval="")
    w.writeheader()
    w.writerows(rows)
with open(a.out + ".md", "w") as f:
    f.write(a.note.strip() + "\n")
    for model, shape in dict.fromkeys((r["model"], r["input"]) for r in rows):
        f.write(f"\n## {model} on {shape} images\n\n")
        head = ["row", "path", "ours / PyTorch ISA", "batch", "threads", "ours ms", "PyTorch ms",
                "ratio", "ours GFLOP/s", "PyTorch GFLOP/s", "ours peak MiB", "PyTorch peak MiB"]
        f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for r in rows:
            if (r["model"], r["input"]) != (model, shape):
                continue
            isas = f'{r.get("ours_isa") or "?"} / {r.get("pytorch_isa") or "?"}'
            cells = [r["row"], r["isa"], isas, r["batch"], r["threads"], r["ours_ms"], r["pytorch_ms"],
                     r["ratio"], r["ours_gflops"], r["pytorch_gflops"], r["ours_peak_rss_mib"],
                     r["pytorch_peak_rss_mib"]]
            f.write("| " + " | ".join(str(c) for c in cells) + " |\n")
