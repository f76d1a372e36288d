#!/usr/bin/env python3
"""Accuracy table: SQNR of every kbit configuration (and NF4/FP4 when the library has
them) on 2^20 values from N(0, 1) and from Student-t with 3 degrees of freedom,
computed with the library's CPU path (the GPU gives the same bytes).

Usage: python3 bench/quality.py [--elements N] [--json FILE] [--candidates]

--candidates adds what a shorter E4M4 scale search would cost in accuracy (the numpy
reference with fewer candidate codes): the data for trading the search's work, about
4 times a single-scale quantizer on the GPU, against SQNR.

--predictor adds what choosing the E4M4 candidate from block statistics, with no
search, would cost: a table indexed by the block's second-largest |x| and RMS over
its absmax (and the absmax code's mantissa) picks the candidate that had the least
total error on training data; it is then scored on fresh data (float64 arithmetic).
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


def predictor_table(bins=16):
    """SQNR of E4M4 with the scale rounded up, searched (4 candidates) and predicted from
    block statistics, at K = 2..5 on fresh Gaussian and Student-t data."""
    codes = ref_kbit.decode_e4m4(np.arange(256)).astype(np.float64)
    offsets = np.array(ref_kbit.E4M4_CANDIDATES)

    def blocks(rng):  # 2^18 values per distribution, max |x| 20 (tensor_scale 1)
        for name, x in (("N(0,1)", rng.standard_normal(1 << 18)),
                        ("Student-t3", rng.standard_t(3, 1 << 18)),
                        ("Student-t5", rng.standard_t(5, 1 << 18))):
            yield name, (x * 20 / np.abs(x).max()).reshape(-1, 32)

    def features(xb):  # table cell of each block, and each candidate's error
        ax = np.sort(np.abs(xb), 1)
        a = ax[:, -1]
        c0 = np.searchsorted(codes, a)  # the smallest code >= absmax
        second = np.minimum((ax[:, -2] / a * bins).astype(int), bins - 1)
        rms = np.minimum((np.sqrt((xb ** 2).mean(1)) / a * 2 * bins).astype(int), bins - 1)
        return (second, rms, c0 & 15), c0

    def errors(xb, c0, cb):
        err = []
        for off in offsets:
            d = codes[np.clip(c0 + off, 1, 255)][:, None]
            u = xb / d
            near = cb[np.abs(u[..., None] - cb).argmin(-1)]
            err.append(((xb - d * near) ** 2).sum(1))
        return np.stack(err)

    print("\n| data | K | absmax rounded up | 4-candidate search | predicted from block statistics |")
    print("|---|---|---|---|---|")
    for k in (2, 3, 4, 5):
        cb = ref_kbit.create_normal_float_codebook(k).astype(np.float64)
        total = np.zeros((bins, bins, 16, offsets.size))
        for _, xb in blocks(np.random.default_rng(1)):  # training
            cell, c0 = features(xb)
            np.add.at(total, cell, errors(xb, c0, cb).T)
        choice = total.argmin(-1)
        for name, xb in blocks(np.random.default_rng(7)):  # fresh data
            cell, c0 = features(xb)
            err = errors(xb, c0, cb)
            picked = err[choice[cell], np.arange(err.shape[1])]
            db = [10 * np.log10((xb ** 2).sum() / e.sum()) for e in (err[0], err.min(0), picked)]
            print(f"| {name} | {k} | " + " | ".join(f"{v:.2f}" for v in db) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--json")
    ap.add_argument("--candidates", action="store_true")
    ap.add_argument("--predictor", action="store_true")
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
    if args.predictor:
        predictor_table()


if __name__ == "__main__":
    main()
