#!/usr/bin/env python3
"""Accuracy table: SQNR of every kbit configuration (and NF4/FP4 when the library has
them) on 2^20 values from N(0, 1) and from Student-t with 3 degrees of freedom,
computed with the library's CPU path (the GPU gives the same bytes).

Usage: python3 bench/quality.py [--elements N] [--json FILE] [--candidates]

--candidates adds what a shorter E4M4 scale search would cost in accuracy (the numpy
reference with fewer candidate codes): the data for trading the search's work, about
4 times a single-scale quantizer on the GPU, against SQNR.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402
import kbit.reference.kbit as ref_kbit  # noqa: E402
from kbit.reference import sqnr_db  # noqa: E402

# Candidate sets for --candidates: offsets from c0, the smallest code >= absmax.
CANDIDATE_SETS = {"4 (0, -1, -2, +1): shipped": (0, -1, -2, 1), "3 (0, -1, -2)": (0, -1, -2),
                  "2 (0, -1)": (0, -1), "1 (0): no search": (0,)}


def candidate_table(data):
    """SQNR of K = 2..5 with E4M4 for each candidate set, on data scaled into E4M4's
    range at tensor_scale 1 (the shipped set is restored afterwards)."""
    shipped = ref_kbit.E4M4_CANDIDATES
    print("\n| data | K | " + " | ".join(CANDIDATE_SETS) + " |")
    print("|---|---|" + "---|" * len(CANDIDATE_SETS))
    try:
        for name, x in data.items():
            x = x * np.float32(30 / np.abs(x).max())
            for k in (2, 3, 4, 5):
                cells = []
                for offsets in CANDIDATE_SETS.values():
                    ref_kbit.E4M4_CANDIDATES = offsets
                    p, a = ref_kbit.quantize_kbit(x, k, absmax_format="e4m4")
                    y = ref_kbit.dequantize_kbit(p, a, k, x.size, absmax_format="e4m4")
                    cells.append(f"{sqnr_db(x, y):.2f}")
                print(f"| {name} | {k} | " + " | ".join(cells) + " |")
    finally:
        ref_kbit.E4M4_CANDIDATES = shipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--json")
    ap.add_argument("--candidates", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    data = {"N(0,1)": rng.standard_normal(args.elements).astype(np.float32),
            "Student-t3": rng.standard_t(3, args.elements).astype(np.float32)}
    rows = []
    for name, x in data.items():
        for k in (2, 3, 4, 5):
            for fmt in ("fp32", "fp16", "e4m4"):
                q = kbit.quantize(x, k=k, absmax=fmt)
                rows.append({"data": name, "method": f"kbit K={k} absmax={fmt}",
                             "bits": q.bits_per_element, "sqnr_db": sqnr_db(x, kbit.dequantize(q))})
        for quant in ("nf4", "fp4"):
            fn = getattr(kbit, f"quantize_{quant}", None)
            if fn is None:
                continue
            q = fn(x, blocksize=64)
            y = getattr(kbit, f"dequantize_{quant}")(q)
            bits = (q.packed.nbytes + q.absmax.nbytes) * 8 / x.size
            rows.append({"data": name, "method": f"{quant.upper()} blocksize 64 (bitsandbytes layout)",
                         "bits": bits, "sqnr_db": sqnr_db(x, np.asarray(y, dtype=np.float32))})
    print("| data | method | bits/elem | SQNR dB |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['data']} | {r['method']} | {r['bits']:.2f} | {r['sqnr_db']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.candidates:
        candidate_table(data)


if __name__ == "__main__":
    main()
