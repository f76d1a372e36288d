#!/usr/bin/env python3
"""Accuracy table: SQNR of every kbit configuration (and NF4/FP4 when the library has
them) on 2^20 values from N(0, 1) and from Student-t with 3 degrees of freedom,
computed with the library's CPU path (the GPU gives the same bytes).

Usage: python3 bench/quality.py [--elements N] [--json FILE]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402
from kbit.reference import sqnr_db  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--json")
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


if __name__ == "__main__":
    main()
