#!/usr/bin/env python3
"""kbit demo: quantize realistic data at every K and absmax format and print
bits per element, compression, accuracy (SQNR) and throughput.

Runs on the GPU when libkbit has CUDA, a device is present and PyTorch is installed;
otherwise on the CPU. Usage: python3 examples/demo.py [--elements N] [--cpu]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402
from kbit.reference import sqnr_db  # noqa: E402


def llm_like_weights(rng, rows, cols):
    """A weight matrix as LLM layers have them: normal entries, per-row scales spread
    over a decade, and a few outlier input channels several times larger."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= np.exp(rng.normal(0, 0.5, (rows, 1))).astype(np.float32) * 0.02
    outliers = rng.choice(cols, max(1, cols // 200), replace=False)
    w[:, outliers] *= 8
    return w


def datasets(rng, n):
    side = int(np.sqrt(n))
    return {
        "llm-weights": llm_like_weights(rng, side, n // side),
        "gaussian": rng.standard_normal(n).astype(np.float32),
        "student-t3": rng.standard_t(3, n).astype(np.float32),
    }


def choose_device(force_cpu):
    if force_cpu:
        return None, "CPU (forced with --cpu)"
    if not kbit.cuda_available():
        return None, "CPU (libkbit has no usable CUDA device)"
    try:
        import torch
    except ImportError:
        return None, "CPU (PyTorch not installed: it provides the device arrays)"
    if not torch.cuda.is_available():
        return None, "CPU (PyTorch sees no CUDA device)"
    return torch, f"GPU: {torch.cuda.get_device_name()}"


def timed(fn, torch, reps):
    fn()  # warm-up
    if torch is not None:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    if torch is not None:
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--cpu", action="store_true", help="use the CPU even with a GPU")
    args = ap.parse_args()
    torch, where = choose_device(args.cpu)
    n = args.elements if torch is not None else min(args.elements, 1 << 20)
    print(f"kbit {'.'.join(map(str, kbit.version()))} demo on {where}, {n} elements per tensor\n")
    rng = np.random.default_rng(0)
    reps = 20 if torch is not None else 1
    print(f"{'data':<12} {'K':>2} {'absmax':<6} {'bits/el':>7} {'vs fp16':>7} {'SQNR dB':>8} "
          f"{'quant GB/s':>10} {'dequant GB/s':>12}")
    for name, x in datasets(rng, n).items():
        xin = torch.from_numpy(x).cuda().half() if torch is not None else x.astype(np.float16)
        ref = x.astype(np.float16).astype(np.float32)
        for k in (2, 3, 4, 5):
            for fmt in ("e4m4", "fp16", "fp32"):
                q, tq = timed(lambda: kbit.quantize(xin, k=k, absmax=fmt), torch, reps)
                y, td = timed(lambda: kbit.dequantize(q), torch, reps)
                y = y.float().cpu().numpy() if torch is not None else y.astype(np.float32)
                in_bytes = x.size * 2
                print(f"{name:<12} {k:>2} {fmt:<6} {q.bits_per_element:7.2f} "
                      f"{16 / q.bits_per_element:6.2f}x {sqnr_db(ref, y):8.2f} "
                      f"{(in_bytes + q.nbytes) / tq / 1e9:10.1f} {(in_bytes + q.nbytes) / td / 1e9:12.1f}")
        print()
    print("GB/s counts the bytes each operation must move (fp16 tensor + packed codes + scales),"
          "\nwall-clock per call including Python overhead; see bench/ for kernel timings.")


if __name__ == "__main__":
    main()
