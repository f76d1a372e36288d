#!/usr/bin/env python3
"""Markdown tables from kbit_bench JSON (bench/RESULTS.md is written from these).

    python3 bench/results_table.py RUN.json[.gz] [--n 28] [--before OLD.json[.gz]]

Prints the kbit table (quantize and dequantize per type, K and absmax format), the
NF4/FP4 and GGUF table, at n = 2^N elements; with --before, a column of the older run's
% of copy next to each of the new one's.
"""
import argparse
import gzip
import json


def read_run(path):
    """A benchmark run's JSON, as written or gzipped (bench/results keeps them as .json.gz)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return json.load(f)


def load(path):
    data = read_run(path)
    rows = {(r["family"], r["op"], r["config"], r["n"]): r for r in data["rows"]}
    return data["device"], rows


def pct(rows, key):
    r = rows.get(key)
    return f"{r['pct_copy']:.1f}%" if r else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--n", type=int, default=28, help="log2 of the size")
    ap.add_argument("--before", help="an older run to compare with")
    args = ap.parse_args()
    device, rows = load(args.run)
    before = load(args.before)[1] if args.before else None
    n = 1 << args.n
    print(f"Device: {device}; n = 2^{args.n}.\n")

    head = "| type | K | absmax | quantize µs | quantize % of copy |"
    head += " before |" if before else ""
    head += " dequantize µs | dequantize % of copy |" + (" before |" if before else "")
    head += " copy GB/s |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for t in ("fp16", "bf16", "fp32"):
        for k in range(2, 6):
            for f in ("e4m4", "fp16", "fp32"):
                cfg = f"kbit K={k} {t} absmax={f}"
                q, d = ("kbit", "quantize", cfg, n), ("kbit", "dequantize", cfg, n)
                if q not in rows:
                    continue
                cells = [t, str(k), f, f"{rows[q]['time_us']:.1f}", pct(rows, q)]
                if before:
                    cells.append(pct(before, q))
                cells += [f"{rows[d]['time_us']:.1f}", pct(rows, d)]
                if before:
                    cells.append(pct(before, d))
                cells.append(f"{rows[d]['copy_gbps']:.0f}")
                print("| " + " | ".join(cells) + " |")

    print()
    head = "| family | op | config | µs | % of copy |" + (" before |" if before else "")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for key, r in rows.items():
        if key[0] == "kbit" or key[3] != n:
            continue
        # Runs before 2026-11-22 run 5 left the NF4/FP4 dequantize family empty.
        family = key[0] or key[2].split()[0].lower()
        cells = [family, key[1], key[2], f"{r['time_us']:.1f}", pct(rows, key)]
        if before:
            cells.append(pct(before, key))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
