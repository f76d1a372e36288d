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
          "\nwall-clock per call including Python overhead; see bench/ for kernel timings.\n")
    matmul_demo(torch, rng)


def graph_time(fn, torch, reps=50):
    """GPU microseconds per call of fn, replayed from a CUDA graph (no Python overhead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return out, start.elapsed_time(end) / reps * 1e3


def matmul_demo(torch, rng):
    """A linear layer y = x W^T with W quantized to 4 bits and tiled, against fp16."""
    n_out, k_in = (8192, 28672) if torch is not None else (1024, 4096)
    w = (rng.standard_normal((n_out, k_in)) * 0.02).astype(np.float16)
    print(f"fused matmul, W {n_out}x{k_in} (a Llama-3-70B down projection on the GPU), "
          f"kbit K=4 tiled vs fp16")
    print(f"{'m':>4} {'fp16 us':>9} {'kbit us':>9} {'speedup':>8} {'rel err':>8}  "
          "(err: against x times W dequantized)")
    if torch is None:  # the CPU path: correctness, and numpy's time for scale
        q = kbit.quantize(w, k=4)
        w_deq = kbit.dequantize(q).reshape(n_out, k_in)
        for m in (1, 16):
            x = rng.standard_normal((m, k_in)).astype(np.float16)
            _, t_ref = timed(lambda: x.astype(np.float32) @ w.astype(np.float32).T, None, 1)
            y, t_k = timed(lambda: kbit.matmul(x, q), None, 1)
            exact = x.astype(np.float64) @ w_deq.astype(np.float64).T
            err = np.linalg.norm(y.astype(np.float64) - exact) / np.linalg.norm(exact)
            print(f"{m:>4} {t_ref * 1e6:9.0f} {t_k * 1e6:9.0f} {t_ref / t_k:7.2f}x {err:8.1e}")
        return
    wt = torch.from_numpy(w).cuda()
    t = kbit.tile(kbit.quantize(wt, k=4))
    w_deq = kbit.dequantize(kbit.untile(t), dtype="float16").reshape(n_out, k_in)
    for m in (1, 8, 16):
        x = torch.randn(m, k_in, dtype=torch.float16, device="cuda")
        ref, t_ref = graph_time(lambda: x @ wt.T, torch)
        y, t_k = graph_time(lambda: kbit.matmul(x, t), torch)
        exact = x.float() @ w_deq.float().T  # what the quantized layer should give
        err = float((y.float() - exact).norm() / exact.norm())
        print(f"{m:>4} {t_ref:9.1f} {t_k:9.1f} {t_ref / t_k:7.2f}x {err:8.1e}")
    print("(CUDA graph replays, L2 not flushed; bench/bench_matmul.py measures with L2 flushed)")


if __name__ == "__main__":
    main()
