#!/usr/bin/env python3
"""Accuracy of kbit's codebooks on real and synthetic weights (issue 13), CPU path.

    python3 bench/quality_codebooks.py [--safetensors FILE ...] [--json PATH]

For every weight tensor (>= 2-D float tensors of each safetensors file; e.g. silero-vad's
silero_vad_16k.safetensors from its PyPI wheel) and for N(0,1), Student-t(3) and Laplace
data: SQNR in dB of kbit K = 2..5 with the default book, NF0, the fitted book and
codebook='auto', next to NF4 with blocksize 64. Prints a table and the medians.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402
from kbit import reference as R  # noqa: E402

BOOKS = ("normal", "nf0", "fit", "auto")


def tensors(paths):
    out = {}
    if paths:
        from safetensors.numpy import load_file
        for path in paths:
            for name, t in load_file(path).items():
                if t.ndim >= 2 and t.dtype in (np.float32, np.float16) and t.size >= 1024:
                    out[f"{os.path.basename(path)}:{name}"] = t.astype(np.float32).reshape(-1)
    rng = np.random.default_rng(0)
    n = 1 << 18
    out["synthetic:normal"] = rng.standard_normal(n).astype(np.float32)
    out["synthetic:student_t3"] = rng.standard_t(3, n).astype(np.float32)
    out["synthetic:laplace"] = rng.laplace(size=n).astype(np.float32)
    return out


def kurtosis(x):
    x = x.astype(np.float64) - x.mean()
    return float((x ** 4).mean() / (x ** 2).mean() ** 2 - 3.0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--safetensors", nargs="*", default=[])
    ap.add_argument("--k", type=int, nargs="*", default=[2, 3, 4, 5])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows = []
    for name, x in tensors(args.safetensors).items():
        if x.size % 32:
            x = x[: x.size // 32 * 32]
        row = {"tensor": name, "n": int(x.size), "kurtosis": kurtosis(x)}
        row["nf4_bs64"] = R.sqnr_db(x, kbit.dequantize_4bit(kbit.quantize_nf4(x, blocksize=64)))
        for k in args.k:
            for book in BOOKS:
                row[f"k{k}_{book}"] = R.sqnr_db(x, kbit.dequantize(kbit.quantize(x, k=k, codebook=book)))
        rows.append(row)
    cols = ["nf4_bs64"] + [f"k{k}_{b}" for k in args.k for b in BOOKS]
    print(f"{'tensor':48s} {'kurt':>8s} " + " ".join(f"{c:>11s}" for c in cols))
    for r in rows:
        print(f"{r['tensor'][:48]:48s} {r['kurtosis']:8.1f} " + " ".join(f"{r[c]:11.2f}" for c in cols))
    med = {c: float(np.median([r[c] for r in rows])) for c in cols}
    print(f"{'median':48s} {'':>8s} " + " ".join(f"{med[c]:11.2f}" for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
