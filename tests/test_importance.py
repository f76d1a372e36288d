"""Importance-weighted quantization (issue 13) and the per-call range status (issue 15),
both through kbit_quantize_ex: the E4M4 scale search minimises sum w (x - q)^2, equal to
the numpy reference on the CPU and the GPU; all-ones weights give kbit_quantize's bytes;
range_status reports a block that does not fit without the device-wide flag."""
import ctypes

import numpy as np
import pytest

import kbit
from kbit.reference import kbit as R
from kbit._lib import KbitError, call

from conftest import requires_gpu

DTYPES = ["float32", "float16", "bfloat16"]


def _data(rng, n, dtype):
    x = (rng.standard_t(4, n) * rng.choice([0.01, 1.0, 50.0], n)).astype(np.float32)
    if dtype == "bfloat16":
        return R.float32_to_bf16_bits(x), "bfloat16"
    return x.astype(dtype), None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 31, 33, 4096 + 7])
def test_weighted_search_matches_reference(rng, dtype, k, n):
    x, dt = _data(rng, n, dtype)
    w = (rng.random(n) ** 4 * 100).astype(np.float32)  # skewed, with near-zero weights
    w[rng.random(n) < 0.1] = 0.0
    q = kbit.quantize(x, k=k, dtype=dt, importance=w)
    packed, absmax = R.quantize_kbit(x, k, tensor_scale=q.tensor_scale, importance=w)
    assert np.array_equal(q.packed, packed) and np.array_equal(q.absmax, absmax)


@pytest.mark.parametrize("absmax", ["e4m4", "fp16", "fp32"])
def test_unit_weights_give_the_unweighted_bytes(rng, absmax):
    x = rng.standard_normal(10_000).astype(np.float32)
    a = kbit.quantize(x, k=3, absmax=absmax)
    b = kbit.quantize(x, k=3, absmax=absmax, importance=np.ones_like(x))
    assert np.array_equal(a.packed, b.packed) and np.array_equal(a.absmax, b.absmax)


def test_weights_lower_the_weighted_error():
    """Weights on half the channels: the weighted error drops against the unweighted
    quantization, the unweighted one does not drop (it is what the unweighted search
    minimised). Both searches choose among the same four scales per block, so each is
    at least as good as the other on its own measure (seeded data)."""
    rng = np.random.default_rng(13)
    rows, cols = 256, 512
    x = rng.standard_t(3, (rows, cols)).astype(np.float32)
    w = np.broadcast_to(np.where(np.arange(cols) % 2 == 0, 100.0, 0.01), (rows, cols))
    w = np.ascontiguousarray(w, dtype=np.float32)
    plain = kbit.quantize(x, k=3)
    weighted = kbit.quantize(x, k=3, importance=w)

    def err(q, weights):
        return float((weights * (kbit.dequantize(q).astype(np.float64) - x) ** 2).sum())

    assert err(weighted, w) < err(plain, w)
    assert err(plain, np.ones_like(w)) <= err(weighted, np.ones_like(w))
    # and the importance reaches the fitted book and the automatic choice
    fit = kbit.quantize(x, k=3, codebook="fit", importance=w)
    assert np.array_equal(fit.codebook, kbit.fit_codebook(x, 3, importance=w))
    auto = kbit.quantize(x, k=3, codebook="auto", importance=w)
    assert err(auto, w) <= min(err(kbit.quantize(x, k=3, codebook=b, importance=w), w)
                               for b in ("normal", "nf0")) + 1e-9


def test_bad_importance(rng):
    x = rng.standard_normal(64).astype(np.float32)
    for bad, pattern in [(np.full(64, -1.0), "finite and >= 0"),
                         (np.full(64, np.nan), "finite and >= 0"),
                         (np.full(64, np.inf), "finite and >= 0"),
                         (np.ones(63), "64 elements")]:
        with pytest.raises(KbitError, match=pattern):
            kbit.quantize(x, k=4, importance=bad)
    # the C host entry checks them too, and leaves the outputs alone
    packed = np.full(8, 0xA5A5A5A5, np.uint32)
    absmax = np.full(2, 0xA5, np.uint8)
    w = np.ones(64, np.float32)
    w[40] = -0.5
    with pytest.raises(KbitError, match=r"importance\[40\]"):
        call("kbit_quantize_ex_host", x.ctypes.data, w.ctypes.data, 64, 0, 4, None, 2,
             ctypes.c_float(1.0), absmax.ctypes.data, packed.ctypes.data, None)
    assert (packed == 0xA5A5A5A5).all() and (absmax == 0xA5).all()


def test_host_range_status(rng):
    x = np.full(64, 1000.0, np.float32)
    packed = np.zeros(4 * 2, np.uint32)
    absmax = np.zeros(2, np.uint8)
    status = np.zeros(1, np.uint32)
    with pytest.raises(KbitError, match="exceed"):
        call("kbit_quantize_ex_host", x.ctypes.data, None, 64, 0, 4, None, 2,
             ctypes.c_float(1.0), absmax.ctypes.data, packed.ctypes.data, status.ctypes.data)
    assert status[0] == 1
    status[0] = 0
    call("kbit_quantize_ex_host", x.ctypes.data, None, 64, 0, 4, None, 2,
         ctypes.c_float(100.0), absmax.ctypes.data, packed.ctypes.data, status.ctypes.data)
    assert status[0] == 0


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [2, 4, 5])
def test_weighted_gpu_equals_host(rng, dtype, k):
    import torch
    n = 3 * 4096 + 45
    x, dt = _data(rng, n, dtype)
    w = (rng.random(n) ** 3 * 10).astype(np.float32)
    host = kbit.quantize(x, k=k, dtype=dt, importance=w)
    xd = torch.from_numpy(x.view(np.int16) if dt else x).cuda()
    if dt:
        xd = xd.view(torch.bfloat16)
    gpu = kbit.quantize(xd, k=k, importance=torch.from_numpy(w).cuda())
    assert np.array_equal(gpu.packed.cpu().numpy(), host.packed)
    assert np.array_equal(gpu.absmax.cpu().numpy(), host.absmax)
    # an unaligned importance pointer (offset by one element) still gives the same bytes
    wd = torch.from_numpy(np.concatenate([[0], w]).astype(np.float32)).cuda()[1:]
    again = kbit.quantize(xd, k=k, importance=wd)
    assert torch.equal(again.packed, gpu.packed)


@requires_gpu
def test_gpu_range_status_is_per_call(rng):
    """Two streams, one quantizing an over-range tensor with a fixed tensor_scale: only its
    call fails; the device-wide flag is untouched by either."""
    import torch
    raised = ctypes.c_int()
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    good = torch.randn(1 << 16, device="cuda")
    bad = torch.full((1 << 16,), 1e6, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(s1):
        q = kbit.quantize(good, k=4, tensor_scale=1.0)
    with torch.cuda.stream(s2):
        with pytest.raises(KbitError, match="does not fit"):
            kbit.quantize(bad, k=4, tensor_scale=1.0)
    torch.cuda.synchronize()
    assert q.packed.is_cuda
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    assert raised.value == 0
    nan = torch.tensor([1.0, float("nan")] * 32, device="cuda")
    with pytest.raises(KbitError, match="NaN"):
        kbit.quantize(nan, k=4)
    # the C entry without range_status still raises the device's flag
    packed = torch.empty(4 * 2048, dtype=torch.int32, device="cuda")
    absmax = torch.empty(2048, dtype=torch.uint8, device="cuda")
    call("kbit_quantize_ex", bad.data_ptr(), None, bad.numel(), 0, 4, None, 2,
         ctypes.c_float(1.0), absmax.data_ptr(), packed.data_ptr(), None,
         torch.cuda.current_stream().cuda_stream)
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    assert raised.value == 1


def test_range_status_argument_is_for_gpu_calls(rng):
    x = rng.standard_normal(64).astype(np.float32)
    with pytest.raises(KbitError, match="GPU calls"):
        kbit.quantize(x, k=4, range_status=np.zeros(1, np.uint32))


@requires_gpu
def test_caller_range_status_word(rng):
    """The caller's word: set for an over-range block, left zero otherwise; kbit does not
    raise (the caller reads it), and the device-wide flag stays clear."""
    import torch
    raised = ctypes.c_int()
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    word = torch.zeros(1, dtype=torch.int32, device="cuda")
    ok = torch.randn(4096, device="cuda")
    kbit.quantize(ok, k=4, tensor_scale=1.0, range_status=word)
    assert int(word.item()) == 0
    kbit.quantize(ok * 1e4, k=4, tensor_scale=1.0, range_status=word)
    assert int(word.item()) != 0
    call("kbit_get_range_flag", ctypes.byref(raised), 1)
    assert raised.value == 0
    with pytest.raises(KbitError, match="one uint32"):
        kbit.quantize(ok, k=4, range_status=torch.zeros(2, dtype=torch.int32, device="cuda"))
