#!/usr/bin/env python3
"""Diagnostics for the fused matmul on a GPU (nothing here is a test or a benchmark):

  python3 bench/matmul_probe.py sweep       # every kbit K / absmax format / NF4 on small
                                            # odd shapes, one line per failing call
  ncu --set full -k regex:gemv -c 2 python3 bench/matmul_probe.py one --k 4 \\
      --shape 8192x28672 --m 1              # one launch per format, for a profiler

Needs PyTorch with CUDA.
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402


def sweep():
    gen = np.random.default_rng(0)
    bad = 0
    for k in (2, 3, 4, 5):
        for fmt in ("fp32", "fp16", "e4m4"):
            for m, n_out, k_in in ((1, 1, 32), (2, 33, 64), (3, 131, 128), (8, 7, 96),
                                   (16, 33, 96), (64, 1, 96), (1, 4096, 4096)):
                w = gen.standard_normal((n_out, k_in)).astype(np.float32)
                q = kbit.quantize(torch.from_numpy(w).cuda(), k=k, absmax=fmt)
                x = torch.randn(m, k_in, dtype=torch.float16, device="cuda")
                try:
                    y = kbit.matmul(x, q)
                    torch.cuda.synchronize()
                    ref = x.float() @ kbit.dequantize(q, dtype="float32").reshape(n_out, k_in).T
                    err = float((y.float() - ref).norm() / ref.norm())
                    if not err < 3e-3:
                        bad += 1
                        print(f"K={k} {fmt} m={m} n_out={n_out} k_in={k_in}: rel err {err:.3g}")
                except kbit.KbitError as e:
                    bad += 1
                    print(f"K={k} {fmt} m={m} n_out={n_out} k_in={k_in}: {e}")
    print(f"sweep: {bad} bad call(s)")


def one(args):
    n_out, k_in = map(int, args.shape.split("x"))
    w = torch.randn(n_out, k_in, dtype=torch.float16, device="cuda")
    x = torch.randn(args.m, k_in, dtype=torch.float16, device="cuda")
    for name in args.formats.split(","):  # nf4, kK (stored kbit) or kKt (tiled kbit)
        if name == "nf4":
            q = kbit.quantize_nf4(w)
        else:
            q = kbit.quantize(w, k=int(name[1]))
            if name.endswith("t"):
                q = kbit.tile(q)
        kbit.matmul(x, q)
    torch.cuda.synchronize()
    print(f"one launch each of {args.formats} at {args.shape}, m={args.m}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("sweep", "one"))
    ap.add_argument("--shape", default="8192x28672")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--formats", default="k4", help="comma list of nf4, kK, kKt (tiled)")
    args = ap.parse_args()
    sweep() if args.what == "sweep" else one(args)


if __name__ == "__main__":
    main()
