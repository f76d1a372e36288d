#!/usr/bin/env python3
"""Side-by-side table of bench_matmul.py runs (the A/B tables of bench/RESULTS.md).

    python3 bench/compare_matmul.py A.json[.gz] B.json[.gz] [...]

One line per (shape, format, m) found in any run: the read floor of the first run that
timed the case (torch.sum over the same bytes, `-` if none), then each run's median µs and
its speedup over cuBLAS fp16 in that run (`-` where a run lacks the case or it failed).
Columns are named by the files, in the order given, so that libraries alternated in one
device run read left to right as they ran.
"""
import argparse
import os

from results_table import read_run  # (bench/ is this script's folder)


def load(path):
    """{(shape, format, m): (kbit µs, speedup over cuBLAS fp16, read µs)} of one run."""
    rows = read_run(path)["rows"]
    out = {}
    for r in rows:
        shape = r.get("shape") or f"{r['n_out']}x{r['k_in']}"
        us = (r.get("kbit") or {}).get("median_us")
        read = (r.get("read") or {}).get("median_us")
        out[(shape, r["format"], r["m"])] = (us, r.get("speedup_cublas"), read)
    return out


def name(path):
    base = os.path.basename(path)
    for ext in (".gz", ".json"):
        base = base[: -len(ext)] if base.endswith(ext) else base
    return base


def table(paths):
    """The table's lines for these runs."""
    runs = [load(p) for p in paths]
    keys = sorted(set().union(*runs), key=lambda k: (k[0], k[1], k[2]))
    lines = ["shape format m | read | " + " | ".join(name(p) for p in paths)]
    for k in keys:
        read = next((run[k][2] for run in runs if k in run and run[k][2]), None)
        cells = []
        for run in runs:
            us, speedup, _ = run.get(k, (None, None, None))
            cells.append(f"{us:.1f} ({speedup:.2f}x)" if us and speedup else "-")
        lines.append(f"{k[0]} {k[1]} {k[2]} | " + (f"{read:.1f}" if read else "-") + " | "
                     + " | ".join(cells))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench_matmul.py --json files (.json or .json.gz)")
    args = ap.parse_args()
    print("\n".join(table(args.runs)))


if __name__ == "__main__":
    main()
