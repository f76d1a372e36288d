#!/usr/bin/env python3
"""Time of fitting a codebook to a tensor on the GPU and quantizing with it (issue 13's
target: a 8192x28672 fp16 tensor in under 5 ms), against a device-to-device copy of the
tensor, measured with CUDA events in the same run. Needs PyTorch with CUDA.

    python3 bench/bench_fit.py [--shape 8192x28672] [--k 4] [--json PATH]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import kbit  # noqa: E402
from kbit._lib import function  # noqa: E402


def event_us(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192x28672")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    rows, cols = map(int, args.shape.split("x"))
    x = torch.randn(rows, cols, dtype=torch.float16, device="cuda") * 0.02
    n = x.numel()
    nbytes = int(function("kbit_fit_codebook_workspace_bytes")())
    ws = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    book = torch.empty(1 << args.k, device="cuda")
    fit = function("kbit_fit_codebook")
    stream = torch.cuda.current_stream().cuda_stream
    fp16 = 1  # KBIT_DTYPE_FP16

    def do_fit():
        assert fit(x.data_ptr(), None, n, fp16, args.k, book.data_ptr(), ws.data_ptr(), nbytes,
                   stream) == 0

    host_book = kbit.fit_codebook(x, args.k)
    copy = torch.empty_like(x)
    t_copy = event_us(lambda: copy.copy_(x))
    t_fit = event_us(do_fit)
    t_quant = event_us(lambda: kbit.quantize(x, k=args.k, codebook=host_book))
    total = t_fit + t_quant
    print(f"{args.shape} fp16, k={args.k}: fit {t_fit:.1f} us, quantize with the book "
          f"{t_quant:.1f} us, total {total:.1f} us (target < 5000 us); copy of the tensor "
          f"{t_copy:.1f} us; fit = {t_fit / t_copy:.2f} copies")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "k": args.k, "fit_us": t_fit, "quantize_us": t_quant,
                       "copy_us": t_copy, "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
