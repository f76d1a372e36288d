"""Hardening on the GPU (issue 15): 8 host threads x 4 streams quantizing, dequantizing
and multiplying at once (results equal to serial), CUDA graph capture and replay of
every launch family, and tensors of more than 2^31 and 2^32 elements (the tail block and
a chunked reference)."""
import threading

import numpy as np
import pytest

import kbit
from kbit import gguf as kg

from conftest import requires_gpu
from test_kbit_gpu import run_in_threads

pytestmark = requires_gpu


def _torch():
    import torch
    return torch


def _same(a, b):
    torch = _torch()
    if isinstance(a, torch.Tensor):
        a = a.cpu()
    if isinstance(b, torch.Tensor):
        b = b.cpu()
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b))


def _gguf_q8(rng, rows, cols):
    """Q8_0 blocks with finite fp16 scales (rows x cols elements)."""
    nb = rows * cols // 32
    blocks = np.frombuffer(rng.bytes(nb * 34), np.uint8).copy().reshape(nb, 34)
    blocks[:, 0:2] = np.frombuffer(np.full(nb, 0.01, np.float16).tobytes(), np.uint8).reshape(nb, 2)
    return blocks.reshape(-1)


def _work_items(rng, i):
    """Thread i's inputs: x to quantize, a matmul input and weights of three formats."""
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2 ** 31)) + i)
    x = torch.randn(200_003 + 977 * i, device="cuda", generator=g, dtype=torch.float16)
    w = torch.randn(96 + 16 * i, 512, device="cuda", generator=g, dtype=torch.float16)
    a = torch.randn(1 + i, 512, device="cuda", generator=g, dtype=torch.float16)
    return x, w, a


def _round(x, w, a, gguf_blocks):
    """One round of every operation; returns what it produced."""
    q = kbit.quantize(x, k=3)                       # checked E4M4 path (per-call status)
    q2 = kbit.quantize(x, k=5, absmax="fp16", tensor_scale=1.0)
    y = kbit.dequantize(q)
    wq = kbit.tile(kbit.quantize(w, k=4))
    w4 = kbit.quantize_nf4(w, blocksize=64, compress_statistics=True)
    wg = kg.GGUFTensor(gguf_blocks, kg.GGML_TYPES["Q8_0"], (w.shape[0], 512))
    return (q.packed, q.absmax, q2.packed, y, kbit.matmul(a, wq), kbit.matmul(a, w4),
            kbit.matmul(a, wg), kbit.dequantize_4bit(w4))


def test_eight_threads_four_streams_equal_serial(rng):
    torch = _torch()
    threads, streams, rounds = 8, 4, 6
    items = [_work_items(rng, i) for i in range(threads)]
    blocks = [torch.from_numpy(_gguf_q8(rng, w.shape[0], 512)).cuda() for _, w, _ in items]
    serial = [_round(*items[i], blocks[i]) for i in range(threads)]
    torch.cuda.synchronize()
    pool = [torch.cuda.Stream() for _ in range(streams)]
    results = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def work(i):
        start.wait()
        with torch.cuda.stream(pool[i % streams]):
            for _ in range(rounds):
                results[i].append(_round(*items[i], blocks[i]))
            torch.cuda.current_stream().synchronize()

    run_in_threads(work, threads)
    for i in range(threads):
        assert len(results[i]) == rounds
        for got in results[i]:
            for j, (a, b) in enumerate(zip(got, serial[i])):
                assert _same(a, b), (i, j)


def test_range_errors_with_eight_threads(rng):
    """Half the threads quantize tensors holding NaN with E4M4 (an error each call), half
    finite data (never one), on shared streams: each call gets its own outcome."""
    torch = _torch()
    good = torch.randn(100_003, device="cuda")
    bad = good.clone()
    bad[77_777] = float("nan")
    pool = [torch.cuda.Stream() for _ in range(4)]
    outcome = [[] for _ in range(8)]

    def work(i):
        with torch.cuda.stream(pool[i % 4]):
            for _ in range(10):
                try:
                    kbit.quantize(bad if i % 2 else good, k=4)
                    outcome[i].append(False)
                except kbit.KbitError:
                    outcome[i].append(True)

    run_in_threads(work, 8)
    assert outcome == [[bool(i % 2)] * 10 for i in range(8)]


# -- CUDA graphs --------------------------------------------------------------------------
def _capture_cases(rng):
    """(name, make inputs, run(inputs) -> output tensor): every launch family, through the
    Python API with preallocated outputs where it takes them (no synchronisation inside)."""
    torch = _torch()
    x = torch.randn(70_001, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(80, 1024, device="cuda", dtype=torch.float16)
    a = torch.randn(5, 1024, device="cuda", dtype=torch.float16)
    big_a = torch.randn(64, 1024, device="cuda", dtype=torch.float16)  # the GEMM path
    q = kbit.quantize(x, k=4)
    wq = kbit.quantize(w, k=3, codebook="nf0")
    wt = kbit.tile(wq)
    w4 = kbit.quantize_nf4(w, blocksize=128, compress_statistics=True)
    wf = kbit.quantize_fp4(w, blocksize=64)
    wg = kg.GGUFTensor(torch.from_numpy(_gguf_q8(rng, 80, 1024)).cuda(), kg.GGML_TYPES["Q8_0"],
                       (80, 1024))
    ts = q.tensor_scale
    status = torch.zeros(1, dtype=torch.int32, device="cuda")  # the caller's: no sync
    return [
        ("quantize e4m4", lambda: kbit.quantize(x, k=3, tensor_scale=ts, range_status=status).packed),
        ("quantize fp16 scales", lambda: kbit.quantize(x, k=2, absmax="fp16", tensor_scale=ts,
                                                       range_status=status).packed),
        ("quantize fp32 scales", lambda: kbit.quantize(x, k=5, absmax="fp32", tensor_scale=1.0,
                                                       range_status=status).absmax),
        ("dequantize", lambda: kbit.dequantize(q, dtype="float32")),
        ("nf4 quantize nested", lambda: kbit.quantize_nf4(x, blocksize=64, compress_statistics=True).absmax),
        ("nf4 dequantize nested", lambda: kbit.dequantize_4bit(w4)),
        ("fp4 dequantize", lambda: kbit.dequantize_4bit(wf)),
        ("gguf dequantize", lambda: kg.dequantize(wg, dtype="float16")),
        ("tile", lambda: kbit.tile(wq).packed),
        ("untile", lambda: kbit.untile(wt).packed),
        ("matmul kbit gemv", lambda: kbit.matmul(a, wq)),
        ("matmul tiled gemv", lambda: kbit.matmul(a, wt)),
        ("matmul tiled gemm", lambda: kbit.matmul(big_a, wt)),
        ("matmul nf4 nested", lambda: kbit.matmul(a, w4)),
        ("matmul fp4 gemm", lambda: kbit.matmul(big_a, wf)),
        ("matmul gguf", lambda: kbit.matmul(big_a, wg)),
    ]


def test_graph_capture_and_replay_of_every_family(rng):
    torch = _torch()
    cases = _capture_cases(rng)
    for name, run in cases:
        eager = run().clone()
        run()  # warm: codebook uploads and workspaces exist before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=s):
            out = run()
        for _ in range(2):
            out.fill_(0) if out.dtype.is_floating_point else out.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert _same(out, eager), name


# -- tensors past 2^31 and 2^32 elements ----------------------------------------------------
def _free_bytes():
    torch = _torch()
    torch.cuda.empty_cache()  # what earlier tests left in PyTorch's cache is free too
    free, _ = torch.cuda.mem_get_info()
    return free


@pytest.mark.parametrize("n", [2 ** 31 + 33, 2 ** 32 + 33])
def test_huge_quantize_dequantize(n):
    """The whole tensor against the same calls on chunks (block-aligned, same
    tensor_scale): equal bytes, the tail block included."""
    torch = _torch()
    need = n * 2 * 2 + n // 2 + (64 << 20)
    if _free_bytes() < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.empty(n, dtype=torch.float16, device="cuda")
    chunk = 1 << 30
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        x[lo:hi] = torch.randn(hi - lo, generator=g, device="cuda", dtype=torch.float16)
    x[-1] = 7.0  # the tail block's values are checked below
    q = kbit.quantize(x, k=3)
    for lo in (0, n - n % chunk - chunk, n - n % chunk):
        hi = min(n, lo + chunk)
        part = kbit.quantize(x[lo:hi], k=3, tensor_scale=q.tensor_scale)
        b0, b1 = lo // 32, (hi + 31) // 32
        assert torch.equal(q.packed[b0 * 3:b1 * 3], part.packed), lo
        assert torch.equal(q.absmax[b0:b1], part.absmax), lo
    y = kbit.dequantize(q)
    del x
    tail = n - n % chunk
    part = kbit.QuantizedTensor(q.packed[tail // 32 * 3:], q.absmax[tail // 32:], 3,
                                (n - tail,), "float16", "e4m4", q.tensor_scale)
    assert torch.equal(y[tail:], kbit.dequantize(part))
    assert abs(float(y[-1]) - 7.0) <= 7.0 * 0.2  # the last element, from the tail block


def test_huge_matmul():
    """A weight of more than 2^31 elements (524289 x 4096): the GEMV equals the same
    rows multiplied as two slices of the stored weight."""
    torch = _torch()
    n_out, k_in = 2 ** 19 + 1, 4096
    n = n_out * k_in
    if _free_bytes() < n * 2 + n // 2 + (256 << 20):
        pytest.skip("needs about 6 GiB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(n_out, k_in, generator=g, device="cuda", dtype=torch.float16)
    q = kbit.quantize(w, k=4)
    del w
    a = torch.randn(1, k_in, generator=g, device="cuda", dtype=torch.float16)
    y = kbit.matmul(a, q)
    cut = 2 ** 18  # rows; row r's blocks start at r * k_in / 32
    parts = []
    for r0, r1 in ((0, cut), (cut, n_out)):
        b0, b1 = r0 * k_in // 32, r1 * k_in // 32
        part = kbit.QuantizedTensor(q.packed[b0 * 4:b1 * 4], q.absmax[b0:b1], 4, (r1 - r0, k_in),
                                    "float16", "e4m4", q.tensor_scale)
        parts.append(kbit.matmul(a, part))
    want = torch.cat(parts, dim=1)
    err = (y.float() - want.float()).norm() / want.float().norm()
    assert err < 1e-3, float(err)
    assert torch.isfinite(y).all()
