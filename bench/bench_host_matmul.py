#!/usr/bin/env python3
"""Benchmark of the CPU matmul (the `_host` twins behind kbit.matmul on numpy arrays).

    python3 bench/bench_host_matmul.py [--shape 4096x4096] [--k 2,4,5] [--m 1,8,32]
        [--dtype fp16,fp32] [--repeats 7] [--json PATH]

Needs only numpy and the built library (bindings/python on the path is added here; set
KBIT_LIBRARY / KBIT_LIBRARY_FIRST=1 to time another build). W is N(0, 1) quantized by
kbit (E4M4 scales, built-in codebook); x is N(0, 1) in the dtype. Each case: one warm-up
call, then --repeats timed calls with time.perf_counter around kbit.matmul (the Python
call included: a few µs); the median is reported with the threads the library uses
(the machine's cores, at most 32). Also timed: numpy's float32 matmul of x and the
dequantized W (what a CPU user would otherwise do after dequantizing once).
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
import kbit  # noqa: E402

DTYPES = {"fp16": np.float16, "fp32": np.float32}


def ints(s):
    return [int(v) for v in s.split(",")]


def median_ms(f, repeats):
    f()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="4096x4096", help="n_out x k_in (4096x4096)")
    ap.add_argument("--k", type=ints, default=[2, 4, 5], help="kbit K values (2,4,5)")
    ap.add_argument("--m", type=ints, default=[1, 8, 32], help="rows of x (1,8,32)")
    ap.add_argument("--dtype", default="fp16,fp32", help="x dtypes (fp16,fp32)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="write every number here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_out, k_in = (int(v) for v in args.shape.split("x"))
    dtypes = args.dtype.split(",")
    rng = np.random.default_rng(args.seed)
    w = rng.standard_normal((n_out, k_in), dtype=np.float32)

    rows = []
    threads = min(os.cpu_count() or 1, 32)  # the library's threads (host/parallel.h)
    print(f"CPU matmul, {n_out}x{k_in}, {threads} threads, median of {args.repeats}")
    print(f"{'K':>2} {'x':>5} {'m':>4} {'kbit ms':>9} {'GB/s of W':>10} {'numpy fp32 ms':>14}")
    for k in args.k:
        q = kbit.quantize(w, k=k)
        w_bytes = np.asarray(q.packed).nbytes + np.asarray(q.absmax).nbytes
        w32 = np.asarray(kbit.dequantize(q, dtype=np.float32)).reshape(n_out, k_in)
        for name in dtypes:
            for m in args.m:
                x = rng.standard_normal((m, k_in), dtype=np.float32).astype(DTYPES[name])
                ms = median_ms(lambda: kbit.matmul(x, q), args.repeats)
                x32 = x.astype(np.float32)
                ref = median_ms(lambda: x32 @ w32.T, args.repeats)
                gbps = w_bytes / (ms * 1e-3) / 1e9
                rows.append({"k": k, "dtype": name, "m": m, "n_out": n_out, "k_in": k_in,
                             "kbit_ms": ms, "w_bytes": w_bytes, "gbps": gbps,
                             "numpy_fp32_ms": ref})
                print(f"{k:2} {name:>5} {m:4} {ms:9.2f} {gbps:10.2f} {ref:14.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "host_matmul", "argv": sys.argv[1:], "threads": threads,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
