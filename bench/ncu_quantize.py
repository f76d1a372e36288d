#!/usr/bin/env python3
"""Launches the kbit quantizer once per absmax format, for a profiler to count what each
kernel executes (nothing is timed here; bench/kbit_bench does the timing).

    ncu --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum \\
        -k regex:quantize_kernel python3 bench/ncu_quantize.py [--k 4] [--log2n 24]

Needs PyTorch with CUDA for the device arrays.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1 << args.log2n, dtype=getattr(torch, args.dtype), device="cuda", generator=gen)
    for fmt in ("fp32", "fp16", "e4m4"):  # in this order in the profiler's output
        kbit.quantize(x, k=args.k, absmax=fmt, tensor_scale=1.0)
    torch.cuda.synchronize()
    print(f"quantized 2^{args.log2n} {args.dtype} elements at K={args.k}: fp32, fp16, e4m4 absmax")


if __name__ == "__main__":
    main()
