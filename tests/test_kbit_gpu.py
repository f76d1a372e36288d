"""kbit on the GPU: the same bytes as the CPU library for every K, type, absmax format
and size, graph capture, concurrent streams and threads, framework interop."""
import ctypes
import itertools
import threading

import numpy as np
import pytest

import kbit
from kbit._lib import function
from conftest import requires_gpu
from test_kbit import DT_ID, FMT_ID, FORMATS, KS, STATUS, host_dequantize, host_quantize, \
    make_input, midpoint_blocks, same_values, tie_and_dense_codebooks

pytestmark = requires_gpu

TORCH_DT = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
ABSMAX_BYTES = {"fp32": 4, "fp16": 2, "e4m4": 1}
SIZES = (1, 31, 32, 33, 1000, 256 * 9, (1 << 20) + 7)


def to_gpu(x, dtype):
    import torch
    if dtype == "bfloat16":
        return torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(x).cuda()


def poisoned(nbytes, offset=0):
    import torch
    return torch.full((nbytes + offset + 16,), 0xAB, dtype=torch.uint8, device="cuda")


def gpu_quantize(xg, n, k, fmt, dtype, cb=None, ts=1.0, stream=0, buffers=None):
    nb = (n + 31) // 32
    packed, absmax = buffers or (poisoned(nb * k * 4), poisoned(nb * ABSMAX_BYTES[fmt]))
    name = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[dtype]
    fn = function(f"cquantize_kbit_{name}_k{k}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                   ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    status = fn(xg.data_ptr(), n, cb.data_ptr() if cb is not None else None, FMT_ID[fmt],
                ts, absmax.data_ptr(), packed.data_ptr(), stream)
    assert status == 0, kbit._lib.lib().kbit_last_error_message()
    return packed, absmax


def gpu_dequantize(packed, absmax, n, k, fmt, dtype, cb=None, ts=1.0, offset=0, stream=0):
    import torch
    esize = 4 if dtype == "float32" else 2
    out = poisoned(n * esize, offset * esize)
    status = function("kbit_dequantize")(
        packed.data_ptr(), absmax.data_ptr(), FMT_ID[fmt], ctypes.c_float(ts),
        cb.data_ptr() if cb is not None else None, k, n, DT_ID[dtype],
        out.data_ptr() + offset * esize, ctypes.c_void_p(stream))
    assert status == 0, kbit._lib.lib().kbit_last_error_message()
    torch.cuda.synchronize()
    raw = out.cpu().numpy()
    tail = raw[(n + offset) * esize:]
    assert np.all(tail == 0xAB), "wrote past the end"
    assert np.all(raw[:offset * esize] == 0xAB), "wrote before the start"
    body = raw[offset * esize:(n + offset) * esize]
    return body.view({"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype])


def check_against_host(x, k, fmt, dtype, cb=None, ts=1.0):
    import torch
    n = x.size
    nb = (n + 31) // 32
    cbg = torch.from_numpy(cb).cuda() if cb is not None else None
    packed, absmax = gpu_quantize(to_gpu(x, dtype), n, k, fmt, dtype, cbg, ts)
    torch.cuda.synchronize()
    hp, ha = host_quantize(x, k, fmt, dtype, codebook=cb, ts=ts)
    gp = packed.cpu().numpy()
    ga = absmax.cpu().numpy()
    assert np.all(gp[nb * k * 4:] == 0xAB) and np.all(ga[nb * ABSMAX_BYTES[fmt]:] == 0xAB)
    assert np.array_equal(gp[:nb * k * 4].view(np.uint32), hp), f"packed differs n={n}"
    assert np.array_equal(ga[:nb * ABSMAX_BYTES[fmt]], ha.view(np.uint8)), f"absmax n={n}"
    want = host_dequantize(hp, ha, k, n, fmt, dtype, codebook=cb, ts=ts)
    for offset in (0, 1):  # 1: output not 16-byte aligned, the scalar path
        got = gpu_dequantize(packed, absmax, n, k, fmt, dtype, cbg, ts, offset)
        assert same_values(got, want), f"dequantize differs n={n} offset={offset}"
    # packed only 4-byte aligned: the word loads cannot be vectors
    shifted = poisoned(nb * k * 4, 4)
    shifted[4:4 + nb * k * 4] = packed[:nb * k * 4]
    got = gpu_dequantize(shifted[4:], absmax, n, k, fmt, dtype, cbg, ts)
    assert same_values(got, want), f"dequantize from misaligned packed differs n={n}"


@pytest.mark.parametrize("k,fmt,dtype", list(itertools.product(KS, FORMATS, TORCH_DT)))
def test_gpu_matches_host(rng, k, fmt, dtype):
    for n in SIZES:
        check_against_host(make_input(rng, n, dtype), k, fmt, dtype)


@pytest.mark.parametrize("k", KS)
def test_gpu_custom_codebooks(rng, k):
    m = 1 << k
    books = [np.linspace(-0.5, 1.0, m), np.linspace(0, 1, m), np.sort(rng.uniform(-1, 1, m)),
             np.repeat(np.linspace(-1, 1, m // 2), 2), rng.permutation(np.linspace(-1, 1, m))]
    for cb in books:
        for fmt in FORMATS:
            check_against_host(make_input(rng, 5000, "float32", "student"), k, fmt, "float32",
                               cb=cb.astype(np.float32))


@pytest.mark.parametrize("k", KS)
def test_gpu_exact_midpoints_and_dense_codebooks(rng, k):
    # Ties in both directions and entries closer than a search bin, for every format
    # and type: the GPU's search tables differ from the host's, the bytes must not.
    for cb in tie_and_dense_codebooks(rng, k):
        x = midpoint_blocks(cb, 40)
        for fmt in FORMATS:
            check_against_host(x, k, fmt, "float32", cb=cb)
            check_against_host(x.astype(np.float16), k, fmt, "float16", cb=cb)


def test_gpu_fp32_absmax_over_float_range_raises_flag(rng):
    x = rng.standard_normal(4096).astype(np.float32)
    x[1000] = 3e38
    raised = ctypes.c_int()
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 1) == 0
    packed, absmax = gpu_quantize(to_gpu(x, "float32"), x.size, 4, "fp32", "float32", ts=0.5)
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 1) == 0 and raised.value == 1
    hp, ha = host_quantize(x, 4, "fp32", "float32", ts=0.5, expect=STATUS["range"])
    assert np.array_equal(packed.cpu().numpy()[:hp.nbytes].view(np.uint32), hp)
    assert np.array_equal(absmax.cpu().numpy()[:ha.nbytes].view(np.float32), ha)


def test_gpu_heavy_tails_and_tensor_scale(rng):
    x = make_input(rng, 100_000, "float32", "lognormal") * np.float32(50)
    ts = ctypes.c_float()
    function("kbit_compute_tensor_scale_host")(x.ctypes.data, x.size, 0, 2, ctypes.byref(ts))
    for k in KS:
        check_against_host(x, k, "e4m4", "float32", ts=ts.value)
    # The GPU scale helper agrees with the host one.
    xg = to_gpu(x, "float32")
    tg = ctypes.c_float()
    assert function("kbit_compute_tensor_scale")(xg.data_ptr(), x.size, 0, 2, ctypes.byref(tg),
                                                 None) == 0
    assert tg.value == ts.value


def test_gpu_nonfinite_and_zero_blocks(rng):
    x = rng.standard_normal(32 * 40).astype(np.float32)
    x[32:64] = 0
    x[100] = np.nan
    x[200] = -np.inf
    for fmt in ("fp32", "fp16"):
        for k in KS:
            check_against_host(x, k, fmt, "float32")


def test_gpu_range_flag(rng):
    import torch
    x = rng.standard_normal(4096).astype(np.float32)
    raised = ctypes.c_int()
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 1) == 0
    gpu_quantize(to_gpu(x, "float32"), x.size, 4, "e4m4", "float32")
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 1) == 0 and raised.value == 0
    x[1000] = 40.0  # > 31: does not fit E4M4 at tensor_scale 1
    packed, absmax = gpu_quantize(to_gpu(x, "float32"), x.size, 4, "e4m4", "float32")
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 1) == 0 and raised.value == 1
    assert function("kbit_get_range_flag")(ctypes.byref(raised), 0) == 0 and raised.value == 0
    hp, ha = host_quantize(x, 4, "e4m4", "float32", expect=STATUS["range"])
    assert np.array_equal(absmax.cpu().numpy()[:ha.size], ha)  # same clipped bytes
    with pytest.raises(kbit.KbitError, match="range"):
        kbit.quantize(torch.from_numpy(x).cuda(), tensor_scale=1.0)
    q = kbit.quantize(torch.from_numpy(x).cuda())  # picks tensor_scale itself
    assert q.tensor_scale > 1
    x[5] = np.nan  # E4M4 has no NaN: refused, as on the CPU
    with pytest.raises(kbit.KbitError, match="NaN"):
        kbit.quantize(torch.from_numpy(x).cuda())
    with pytest.raises(kbit.KbitError, match="NaN"):
        kbit.quantize(x)
    y = kbit.dequantize(kbit.quantize(torch.from_numpy(x).cuda(), absmax="fp16"))
    assert torch.isnan(y[:32]).all() and torch.isfinite(y[32:]).all()


def test_gpu_large_tensor_over_2_pow_31(rng):
    """n > 2^31 elements: 64-bit indexing in both kernels (checked on sampled blocks)."""
    import torch
    n = (1 << 31) + 77
    free, _ = torch.cuda.mem_get_info()
    need = n * 2 * 2 + n // 32 * 5 * 4
    if free < need * 1.2:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    k, fmt = 4, "e4m4"
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 30)))
    xg = torch.randn(n, dtype=torch.float16, device="cuda", generator=gen)
    nb = (n + 31) // 32
    packed = torch.empty(nb * k, dtype=torch.int32, device="cuda")
    absmax = torch.empty(nb, dtype=torch.uint8, device="cuda")
    gpu_quantize(xg, n, k, fmt, "float16", buffers=(packed, absmax))
    out = torch.empty(n, dtype=torch.float16, device="cuda")
    assert function("kbit_dequantize")(packed.data_ptr(), absmax.data_ptr(), 2, ctypes.c_float(1),
                                       None, k, n, 1, out.data_ptr(), None) == 0
    torch.cuda.synchronize()
    # Block starts: the first, around element 2^31 (block 2^26), the last, random.
    starts = [0, (1 << 26) - 2, (1 << 25) + 1, nb - 4] + \
        [int(b) for b in rng.integers(0, nb - 4, 4)]
    for b in starts:
        lo, hi = b * 32, min((b + 4) * 32, n)
        xs = xg[lo:hi].cpu().numpy()
        hp, ha = host_quantize(xs, k, fmt, "float16")
        assert np.array_equal(packed[b * k:(b + 4) * k].cpu().numpy().view(np.uint32)[:hp.size], hp)
        assert np.array_equal(absmax[b:b + 4].cpu().numpy()[:ha.size], ha)
        want = host_dequantize(hp, ha, k, hi - lo, fmt, "float16")
        assert same_values(out[lo:hi].cpu().numpy(), want)
    del xg, out


def test_gpu_graph_capture(rng):
    import torch
    n, k, fmt = 100_003, 3, "e4m4"
    x = torch.empty(n, dtype=torch.float16, device="cuda")
    nb = (n + 31) // 32
    packed = torch.empty(nb * k, dtype=torch.int32, device="cuda")
    absmax = torch.empty(nb, dtype=torch.uint8, device="cuda")
    out = torch.empty(n, dtype=torch.float16, device="cuda")
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        st = torch.cuda.current_stream().cuda_stream
        gpu_quantize(x, n, k, fmt, "float16", stream=st, buffers=(packed, absmax))
        assert function("kbit_dequantize")(packed.data_ptr(), absmax.data_ptr(), 2,
                                           ctypes.c_float(1), None, k, n, 1, out.data_ptr(),
                                           ctypes.c_void_p(st)) == 0
    for _ in range(2):  # replay on fresh data each time
        xh = make_input(rng, n, "float16")
        x.copy_(torch.from_numpy(xh))
        graph.replay()
        torch.cuda.synchronize()
        hp, ha = host_quantize(xh, k, fmt, "float16")
        assert np.array_equal(packed.cpu().numpy().view(np.uint32), hp)
        assert same_values(out.cpu().numpy(), host_dequantize(hp, ha, k, n, fmt, "float16"))


def run_in_threads(work, count=2):
    """Runs work(i) for i = 0..count-1 in as many threads at once; fails on their errors."""
    errors = []

    def guarded(i):
        try:
            work(i)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_gpu_two_streams_two_threads(rng):
    import torch
    inputs = [make_input(rng, 300_001 + i, "bfloat16") for i in range(2)]
    results = [None, None]

    def work(i):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            xg = to_gpu(inputs[i], "bfloat16")
            for _ in range(5):
                q = kbit.quantize(xg, k=2 + i, absmax="fp16")
                y = kbit.dequantize(q)
            s.synchronize()
            results[i] = (q.packed.cpu().numpy(), q.absmax.cpu().numpy(),
                          y.view(torch.int16).cpu().numpy().view(np.uint16))

    run_in_threads(work)
    for i in range(2):
        k = 2 + i
        hp, ha = host_quantize(inputs[i], k, "fp16", "bfloat16")
        gp, ga, gy = results[i]
        assert np.array_equal(gp.view(np.uint32), hp) and np.array_equal(ga, ha)
        assert same_values(gy, host_dequantize(hp, ha, k, inputs[i].size, "fp16", "bfloat16"))


def test_gpu_range_errors_stay_with_their_thread(rng):
    # The device's range flag is shared by every thread and stream. One thread quantizes
    # a tensor holding a NaN with E4M4 (an error every time), the other finite data
    # (never an error), on their own streams: each must get its own outcome every call.
    import torch
    good = to_gpu(make_input(rng, 200_003, "float16"), "float16")
    bad_np = make_input(rng, 200_003, "float16")
    bad_np[int(rng.integers(bad_np.size))] = np.nan
    bad = to_gpu(bad_np, "float16")
    raised = ([], [])

    def work(i):
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(20):
                try:
                    kbit.quantize(bad if i else good, k=4)
                    raised[i].append(False)
                except kbit.KbitError:
                    raised[i].append(True)

    run_in_threads(work)
    assert raised == ([False] * 20, [True] * 20)


def test_gpu_caller_scale_overflow_raises_like_host():
    # With a caller's tensor_scale an fp32-absmax block can overflow: the block is
    # stored at FLT_MAX and both paths report it.
    import torch
    x = np.zeros(96, np.float32)
    x[40] = 3e38
    for arr in (x, torch.from_numpy(x).cuda()):
        with pytest.raises(kbit.KbitError, match="does not fit|exceed"):
            kbit.quantize(arr, k=4, absmax="fp32", tensor_scale=0.5)
        q = kbit.quantize(arr, k=4, absmax="fp32", tensor_scale=2.0)  # fits: no error
        absmax = q.absmax.cpu().numpy() if hasattr(q.absmax, "cpu") else q.absmax
        assert absmax[1] == x[40] / np.float32(2)


def test_gpu_python_api_torch(rng):
    import torch
    x = make_input(rng, 4 * 1001, "float32").reshape(4, 1001)
    for dtype in ("float32", "float16", "bfloat16"):
        xt = torch.from_numpy(x).cuda().to(getattr(torch, dtype))
        q = kbit.quantize(xt, k=4)
        assert isinstance(q.packed, torch.Tensor) and q.packed.is_cuda
        y = kbit.dequantize(q)
        assert y.shape == xt.shape and y.dtype == xt.dtype and y.is_cuda
        hq = kbit.quantize(xt.float().cpu().numpy() if dtype != "bfloat16" else
                           xt.cpu().view(torch.int16).numpy().view(np.uint16),
                           k=4, dtype=dtype)
        assert np.array_equal(q.packed.cpu().numpy().view(np.uint32), hq.packed)
    with pytest.raises(kbit.KbitError, match="dtype"):
        kbit.quantize(torch.ones(64, dtype=torch.int32, device="cuda"))
    with pytest.raises(kbit.KbitError, match="contiguous"):
        kbit.quantize(torch.ones(64, 2, device="cuda").t())


def test_gpu_python_api_cupy(rng):
    cupy = pytest.importorskip("cupy")
    x = make_input(rng, 5000, "float16")
    xc = cupy.asarray(x)
    q = kbit.quantize(xc, k=5, absmax="fp32")
    assert isinstance(q.packed, cupy.ndarray)
    y = kbit.dequantize(q, dtype="float32")
    hq = kbit.quantize(x, k=5, absmax="fp32")
    assert np.array_equal(cupy.asnumpy(q.packed), hq.packed)
    assert np.array_equal(cupy.asnumpy(y), kbit.dequantize(hq, dtype="float32"))


def test_gpu_python_api_jax(rng):
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax sees no GPU")
    x = make_input(rng, 3000, "float32")
    xj = jax.device_put(x, jax.devices("gpu")[0])
    q = kbit.quantize(xj, k=3)  # read through DLPack; outputs from torch/cupy
    hq = kbit.quantize(x, k=3)
    assert np.array_equal(np.asarray(q.packed.cpu() if hasattr(q.packed, "cpu") else
                                     q.packed.get()).view(np.uint32), hq.packed)


def test_gpu_bad_input_writes_nothing():
    import torch
    x = torch.zeros(64, dtype=torch.float16, device="cuda")
    packed = poisoned(64)
    absmax = poisoned(8)
    fn = function("kbit_quantize")
    f = ctypes.c_float
    cases = [((x.data_ptr() + 1, 64, 1, 4, None, 2, f(1), absmax.data_ptr(), packed.data_ptr(), None), "misaligned"),
             ((x.data_ptr(), 64, 1, 4, None, 2, f(1), absmax.data_ptr(), packed.data_ptr() + 2, None), "misaligned"),
             ((None, 64, 1, 4, None, 2, f(1), absmax.data_ptr(), packed.data_ptr(), None), "null"),
             ((x.data_ptr(), 64, 1, 9, None, 2, f(1), absmax.data_ptr(), packed.data_ptr(), None), "invalid"),
             ((x.data_ptr(), -3, 1, 4, None, 2, f(1), absmax.data_ptr(), packed.data_ptr(), None), "invalid")]
    for args, want in cases:
        assert fn(*args) == STATUS[want]
    torch.cuda.synchronize()
    assert torch.all(packed == 0xAB) and torch.all(absmax == 0xAB)
