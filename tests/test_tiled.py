"""Tiled kbit weights (kbit.tile / kbit.untile, kbit_matmul_kbit_tiled): the repack is
lossless, the tiled matmul computes what the stored one does, bad arguments are refused
with nothing written, and the GPU agrees with the CPU."""
import ctypes

import numpy as np
import pytest

import kbit
from kbit import reference as R
from kbit._lib import function
from conftest import GPU_SKIP_REASON, requires_gpu
from test_matmul import (DT_ID, TOL, as_dtype, as_f64, check_accuracy, cuda_x, from_cuda,
                         hopper_kernels, kbit_weight, magnitude, poisoned_cuda, random_x,
                         reference, workspace_bytes)

FORMATS = {"fp32": 0, "fp16": 1, "e4m4": 2}
SHAPES = ((1, 32), (7, 96), (17, 160), (33, 4096), (131, 128))
S_OK, S_INVALID, S_NULL, S_MISALIGNED = 0, 1, 2, 3
S_RANGE = int(kbit._lib.status_code("KBIT_ERROR_RANGE"))


def aligned_bytes(nbytes, fill=0xA5, offset=0):
    """nbytes of uint8 at a 16-byte boundary (+ offset), filled with `fill`."""
    raw = np.full(nbytes + 32, fill, dtype=np.uint8)
    start = (-raw.ctypes.data) % 16 + offset
    return raw[start:start + nbytes]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_round_trip_and_sizes(rng, k, fmt):
    for n_out, k_in in SHAPES:
        q, _ = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(q)
        tiles, groups = -(-n_out // 16), -(-(k_in // 32) // 4)
        sb = {"fp32": 4, "fp16": 2, "e4m4": 1}[fmt]
        assert t.packed.nbytes == tiles * 16 * groups * 4 * 4 * k
        assert t.absmax.nbytes == tiles * 16 * groups * 4 * sb
        assert t.nbytes == t.packed.nbytes + t.absmax.nbytes
        # every stored bit lands somewhere: same number of set bits, the rest is padding
        assert (np.unpackbits(t.packed).sum() ==
                np.unpackbits(np.asarray(q.packed).view(np.uint8)).sum())
        back = kbit.untile(t)
        assert np.array_equal(back.packed, q.packed), (k, fmt, n_out, k_in)
        assert np.array_equal(np.asarray(back.absmax).view(np.uint8),
                              np.asarray(q.absmax).view(np.uint8))


def test_zero_weight_tiles_to_zeros():
    q = kbit.quantize(np.zeros((20, 96), np.float32), k=3, codebook=np.linspace(
        -1, 1, 8).astype(np.float32) + np.float32(0.01))
    t = kbit.tile(q)
    assert not np.any(t.absmax)  # zero blocks have zero scales; padding too


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_host_tiled_matmul_equals_stored(rng, k, dtype):
    for i, (n_out, k_in) in enumerate(SHAPES):
        fmt = list(FORMATS)[i % 3]
        cb = np.sort(rng.uniform(-1, 1, 1 << k)).astype(np.float32) if i % 2 else None
        q, _ = kbit_weight(rng, n_out, k_in, k, fmt, codebook=cb,
                           tensor_scale="custom" if i == 2 else None)
        t = kbit.tile(q)
        for m in (0, 1, 3, 9):
            x = random_x(rng, (m, k_in), dtype)
            bias = random_x(rng, (n_out,), dtype) if m % 2 else None
            kw = dict(dtype=dtype) if dtype == "bfloat16" else {}
            y_stored = kbit.matmul(x, q, bias, **kw)
            y_tiled = kbit.matmul(x, t, bias, **kw)
            assert np.array_equal(y_stored, y_tiled), (k, dtype, n_out, k_in, m)


def test_bad_arguments_write_nothing(rng):
    n_out, k_in, k, fmt = 17, 96, 4, "e4m4"
    q, _ = kbit_weight(rng, n_out, k_in, k, fmt)
    pb = function("kbit_tiled_packed_bytes")(n_out, k_in, k)
    ab = function("kbit_tiled_absmax_bytes")(n_out, k_in, FORMATS[fmt])
    tile = function("kbit_tile_host")
    cases = [  # (format, k, n_out, k_in, tiled packed offset, tiled absmax offset, status)
        (FORMATS[fmt], 1, n_out, k_in, 0, 0, S_INVALID),
        (7, k, n_out, k_in, 0, 0, S_INVALID),
        (FORMATS[fmt], k, n_out, 40, 0, 0, S_INVALID),
        (FORMATS[fmt], k, -1, k_in, 0, 0, S_INVALID),
        (FORMATS[fmt], k, n_out, k_in, None, 0, S_NULL),
        (FORMATS[fmt], k, n_out, k_in, 4, 0, S_MISALIGNED),
        (FORMATS[fmt], k, n_out, k_in, 0, 1, S_MISALIGNED)]
    for f, kk, rows, cols, p_off, a_off, status in cases:
        tp = aligned_bytes(pb, offset=p_off) if p_off is not None else None
        ta = aligned_bytes(ab, offset=a_off)
        assert tile(q.packed.ctypes.data, q.absmax.ctypes.data, f, kk, rows, cols,
                    tp.ctypes.data if tp is not None else None, ta.ctypes.data) == status
        assert (tp is None or np.all(tp == 0xA5)) and np.all(ta == 0xA5), "written on failure"
    assert function("kbit_tiled_packed_bytes")(n_out, 40, k) == -1
    assert function("kbit_tiled_packed_bytes")(n_out, k_in, 6) == -1
    assert function("kbit_tiled_absmax_bytes")(-1, k_in, 2) == -1
    assert function("kbit_tiled_absmax_bytes")(n_out, k_in, 3) == -1
    # the tiled matmul's own checks: misaligned tiled arrays
    t = kbit.tile(q)
    x = random_x(rng, (2, k_in), "float32")
    y = np.full((2, n_out), np.nan, np.float32)
    shifted = aligned_bytes(pb + 1, offset=1)
    assert function("kbit_matmul_kbit_tiled_host")(
        x.ctypes.data, 2, k_in, n_out, 0, shifted.ctypes.data, t.absmax.ctypes.data,
        FORMATS[fmt], ctypes.c_float(1.0), None, k, None, y.ctypes.data) == S_MISALIGNED
    assert np.all(np.isnan(y))
    with pytest.raises(kbit.KbitError):
        kbit.tile(kbit.quantize(np.ones((4, 40), np.float32), k=4))  # k_in not a multiple of 32


# (quant type, blocksize, nested, shape, weights' dtype): 32- to 256-element 4-bit blocks
# (one to eight 32-element kbit blocks each), nested scales, rows that end inside a 4-bit
# block; float16 weights (absmax values are half values) and float32 ones
FOUR_BIT = (("nf4", 64, False, (33, 96), "float16"), ("fp4", 32, False, (7, 64), "float32"),
            ("nf4", 256, True, (5, 160), "float32"), ("fp4", 128, True, (17, 224), "float16"))


@pytest.mark.parametrize("quant_type, blocksize, nested, shape, wtype", FOUR_BIT)
def test_4bit_tiles_to_the_same_values(rng, quant_type, blocksize, nested, shape, wtype):
    """kbit.tile of an NF4 / FP4 weight (kbit.tiled.from_4bit: the kbit K = 4 weight with
    the format's table as codebook and half scales where the absmax values are half
    values, as for float16 weights, else float32 ones) dequantizes to the 4-bit weight's
    float32 values exactly, untiles to those codes and scales, and its matmul is within
    the bounds of those values (as the 4-bit one, where its rows hold whole blocks)."""
    w = (rng.standard_normal(shape) * 0.05).astype(wtype)
    q4 = kbit.quantize_4bit(w, quant_type, blocksize, compress_statistics=nested)
    want = kbit.dequantize_4bit(q4, dtype="float32")
    half = wtype == "float16" and not nested  # nested scales come back as any float32
    q = kbit.tiled.from_4bit(q4)
    assert (q.k, q.absmax_format, q.tensor_scale) == (4, "fp16" if half else "fp32", 1.0)
    assert np.array_equal(kbit.dequantize(q, dtype="float32"), want)
    wide = kbit.tiled.from_4bit(q4, absmax="fp32")
    assert np.array_equal(kbit.dequantize(wide, dtype="float32"), want)
    t = kbit.tile(q4)
    assert isinstance(t, kbit.TiledTensor)
    back = kbit.untile(t)
    assert np.array_equal(back.packed, q.packed) and np.array_equal(back.absmax, q.absmax)
    assert np.array_equal(kbit.dequantize(back, dtype="float32"), want)
    x = random_x(rng, (3, shape[1]), "float32")
    y_ref = reference(x, want.astype(np.float64), None, "float32")
    for wq in (t, q4) if shape[1] % blocksize == 0 else (t,):  # (4-bit rows: whole blocks)
        check_accuracy(kbit.matmul(x, wq), y_ref, "float32", f"{quant_type} tiled={wq is t}",
                       magnitude(x, want.astype(np.float64), "float32"))


def test_4bit_to_kbit_codes_and_bad_arguments(rng):
    """kbit_nf4_to_kbit_host: a block's bit planes hold its codes (the first element of a
    byte in the high nibble; odd n), codes past n are zero, each 32-element block takes its
    4-bit block's absmax (as float32 or half); bad arguments and scales beyond half's range
    get a status and nothing written; from_4bit refuses half scales that are not exact."""
    n, bs = 71, 64  # two 4-bit blocks, three kbit blocks (the last of 7 elements)
    codes = rng.integers(0, 16, n).astype(np.uint8)
    even = np.concatenate([codes, np.zeros(1, np.uint8)])  # the odd element's pair: code 0
    packed = ((even[0::2] << 4) | even[1::2]).astype(np.uint8)
    absmax = np.array([0.5, 2.0], np.float32)
    words = np.zeros(12, np.uint32)
    scales = np.zeros(3, np.float32)
    fn = function("kbit_nf4_to_kbit_host")
    assert fn(packed.ctypes.data, absmax.ctypes.data, n, bs, FORMATS["fp32"], words.ctypes.data,
              scales.ctypes.data) == S_OK
    padded = np.concatenate([codes, np.zeros(25, np.uint8)]).reshape(3, 32)
    for b in range(3):
        for j in range(4):
            bits = (padded[b] >> j) & 1
            assert words[4 * b + j] == int(sum(int(v) << i for i, v in enumerate(bits)))
    assert list(scales) == [0.5, 0.5, 2.0]
    halves = np.zeros(3, np.float16)
    assert fn(packed.ctypes.data, absmax.ctypes.data, n, bs, FORMATS["fp16"], words.ctypes.data,
              halves.ctypes.data) == S_OK
    assert list(halves) == [0.5, 0.5, 2.0]
    words[:] = 7
    scales[:] = 7
    halves[:] = 7
    off = aligned_bytes(4 * 12 + 4, offset=2)
    odd = aligned_bytes(8, offset=1)
    big = np.array([0.5, 70000.0], np.float32)  # beyond half's range: refused, not inf
    assert fn(packed.ctypes.data, big.ctypes.data, n, bs, FORMATS["fp16"], words.ctypes.data,
              halves.ctypes.data) == S_RANGE
    for args, status in (((n, 48, FORMATS["fp32"], words.ctypes.data, scales), S_INVALID),
                         ((-1, bs, FORMATS["fp32"], words.ctypes.data, scales), S_INVALID),
                         ((n, bs, FORMATS["e4m4"], words.ctypes.data, scales), S_INVALID),
                         ((n, bs, FORMATS["fp32"], None, scales), S_NULL),
                         ((n, bs, FORMATS["fp32"], off.ctypes.data, scales), S_MISALIGNED),
                         ((n, bs, FORMATS["fp16"], words.ctypes.data, odd), S_MISALIGNED)):
        m, b, fmt, out, sc = args
        assert fn(packed.ctypes.data, absmax.ctypes.data, m, b, fmt, out, sc.ctypes.data) == status
    assert np.all(words == 7) and np.all(scales == 7) and np.all(halves == 7)
    q4 = kbit.quantize_4bit(np.full((2, 64), 1e5, np.float32), "nf4", 64)
    with pytest.raises(kbit.KbitError, match="half values"):
        kbit.tiled.from_4bit(q4, absmax="fp16")
    assert kbit.tiled.from_4bit(q4).absmax_format == "fp32"
    with pytest.raises(kbit.KbitError):
        kbit.tile(kbit.quantize_4bit(np.ones((4, 48), np.float32), "nf4", 32))  # 48 % 32


@requires_gpu
def test_gpu_4bit_to_kbit_half_range(rng):
    """kbit_nf4_to_kbit on the GPU with half scales: a scale beyond half's range is written
    as inf and raises the device's range flag (kbit_get_range_flag), as the GPU quantizers
    do; one in range raises nothing; the codes and the in-range scales match the host."""
    import torch
    n, bs = 128, 64
    packed = rng.integers(0, 256, n // 2).astype(np.uint8)
    flag = ctypes.c_int()
    for absmax, raised in ((np.array([0.5, 2.0], np.float32), 0),
                           (np.array([0.5, 7e4], np.float32), 1)):
        function("kbit_get_range_flag")(ctypes.byref(flag), 1)
        words = torch.zeros(16, dtype=torch.int32, device="cuda")
        scales = torch.zeros(4, dtype=torch.float16, device="cuda")
        p_t, a_t = torch.from_numpy(packed).cuda(), torch.from_numpy(absmax).cuda()
        assert function("kbit_nf4_to_kbit")(
            p_t.data_ptr(), a_t.data_ptr(), n, bs, FORMATS["fp16"], words.data_ptr(),
            scales.data_ptr(), torch.cuda.current_stream().cuda_stream) == S_OK
        torch.cuda.synchronize()
        assert function("kbit_get_range_flag")(ctypes.byref(flag), 1) == S_OK
        assert flag.value == raised
        want_words = np.zeros(16, np.uint32)
        want_scales = np.zeros(4, np.float16)
        fits = absmax.copy()
        fits[fits > 65504] = 1.0  # the host refuses the big one: compare the rest
        assert function("kbit_nf4_to_kbit_host")(
            packed.ctypes.data, fits.ctypes.data, n, bs, FORMATS["fp16"],
            want_words.ctypes.data, want_scales.ctypes.data) == S_OK
        got = scales.cpu().numpy()
        assert np.array_equal(words.cpu().numpy().view(np.uint32), want_words)
        assert np.array_equal(got[:2], want_scales[:2])
        assert np.all(np.isinf(got[2:])) if raised else np.array_equal(got, want_scales)


def on_cuda(q):
    """A host QuantizedTensor's arrays copied to the GPU (torch)."""
    import torch
    return kbit.QuantizedTensor(torch.from_numpy(q.packed.view(np.int32)).cuda(),
                                torch.from_numpy(np.asarray(q.absmax)).cuda(), q.k, q.shape,
                                q.dtype, q.absmax_format, q.tensor_scale, q.codebook)


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_gpu_tile_and_matmul(rng, k, dtype):
    import torch
    for i, (n_out, k_in) in enumerate(SHAPES):
        fmt = list(FORMATS)[i % 3]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t_host = kbit.tile(q)
        t = kbit.tile(on_cuda(q))
        torch.cuda.synchronize()
        assert np.array_equal(t.packed.cpu().numpy(), t_host.packed)
        assert np.array_equal(t.absmax.cpu().numpy(), t_host.absmax)
        back = kbit.untile(t)
        assert np.array_equal(back.packed.cpu().numpy().view(np.uint32), q.packed)
        for m in (1, 2, 4, 8, 11, 16, 27, 33, 100, 257):  # GEMV to m = 16, then the GEMM
            x = random_x(rng, (m, k_in), dtype)
            y = from_cuda(kbit.matmul(cuda_x(x, dtype), t), dtype)
            scale = magnitude(x, w64, dtype)
            check_accuracy(y, reference(x, w64, None, dtype), dtype, f"tiled K={k} m={m}", scale)
            y_host = kbit.matmul(x, t_host, dtype=dtype if dtype == "bfloat16" else None)
            diff = np.linalg.norm(as_f64(y, dtype) - as_f64(y_host, dtype))
            ref = max(np.linalg.norm(reference(x, w64, None, dtype)), scale, 1e-30)
            assert diff <= TOL[dtype] * ref


@requires_gpu
@pytest.mark.parametrize("quant_type, blocksize, nested, shape, wtype", FOUR_BIT)
def test_gpu_4bit_tiles_as_the_host(rng, quant_type, blocksize, nested, shape, wtype):
    """kbit.tile of an NF4 / FP4 weight on the GPU: the same bytes as on the host, and its
    matmul (the GEMV and the GEMM) within the bounds of the 4-bit weight's values."""
    import torch
    w = (rng.standard_normal(shape) * 0.05).astype(wtype)
    q4 = kbit.quantize_4bit(w, quant_type, blocksize, compress_statistics=nested)
    t_host = kbit.tile(q4)
    q4_gpu = kbit.quantize_4bit(torch.from_numpy(w).cuda(), quant_type, blocksize,
                                compress_statistics=nested)
    t = kbit.tile(q4_gpu)
    torch.cuda.synchronize()
    assert np.array_equal(t.packed.cpu().numpy(), t_host.packed)
    assert np.array_equal(t.absmax.cpu().numpy(), t_host.absmax)
    want = kbit.dequantize_4bit(q4, dtype="float32").astype(np.float64)
    for m in (1, 5, 16, 40):
        x = random_x(rng, (m, shape[1]), "float16")
        y = from_cuda(kbit.matmul(cuda_x(x, "float16"), t), "float16")
        check_accuracy(y, reference(x, want, None, "float16"), "float16",
                       f"{quant_type} tiled m={m}", magnitude(x, want, "float16"))


@requires_gpu
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_gpu_streamed_gemv_shapes(rng, k):
    """The streamed GEMV's walk: more row tiles than CTAs (runs of several tiles a CTA),
    rows of one, two and several ring stages with a short last one, a last group of one
    chunk, n_out off the tile, every absmax format, bias, m = 1..16, x copied with each
    stage or (8500 rows: three row tiles or more a CTA) held for the whole kernel, K = 2's
    pair table and (40x53280: 27 stages a CTA, kQuadMinStages) its quad table; K = 2 and
    3 with two units a warp a stage on rows of 128 groups or more (40x53280; 700x16416: 129
    groups, a last stage of one unit whose group has one chunk); against the float64
    reference; and x resident beyond 72 KB (17024x4672, m = 8)."""
    for i, (n_out, k_in) in enumerate(((2500, 1312), (4100, 160), (2113, 4128), (5, 9216),
                                       (8500, 416), (40, 53280), (700, 16416))):
        fmt = list(FORMATS)[(i + k) % 3]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(on_cuda(q))
        for m in (1, 3, 8, 9, 16):
            dtype = "float16" if m % 2 else "bfloat16"
            x = random_x(rng, (m, k_in), dtype)
            bias = random_x(rng, (n_out,), dtype)
            y = from_cuda(kbit.matmul(cuda_x(x, dtype), t, cuda_x(bias, dtype)), dtype)
            scale = magnitude(x, w64, dtype)
            check_accuracy(y, reference(x, w64, bias, dtype), dtype,
                           f"streamed K={k} {n_out}x{k_in} m={m}", scale)
    # x held for the whole kernel beyond 72 KB (kResidentXTiled): 17024 rows (eight row
    # tiles a CTA on 132 SMs), 8 rows of 9.1 KB; made on the GPU, against x times the
    # dequantized W in float32
    import torch
    gen = torch.Generator(device="cuda").manual_seed(11 + k)
    w = torch.randn(17024, 4672, device="cuda", generator=gen)
    q = kbit.quantize(w, k=k)
    del w
    w32 = kbit.dequantize(q, dtype="float32")
    x = torch.randn(8, 4672, device="cuda", generator=gen).half()
    y = kbit.matmul(x, kbit.tile(q)).float()
    ref = x.float() @ w32.T
    err = float(torch.linalg.norm(y - ref) / torch.linalg.norm(ref))
    assert err <= TOL["float16"], f"K={k} 17024x4672 m=8, x resident: relative error {err:.3g}"


def _h100_reason():
    if GPU_SKIP_REASON is not None:
        return GPU_SKIP_REASON
    import torch
    if not hopper_kernels() or torch.cuda.get_device_properties(0).multi_processor_count != 132:
        return "sm_90's kernels and plans for 132 SMs (an H100, not a library emulating an older GPU)"
    return None


# Tests of sm_90's kernels and plans as an H100 runs them.
requires_h100_kernels = pytest.mark.skipif(_h100_reason() is not None, reason=_h100_reason() or "")


def launched(run, pattern):
    """The match groups of the regular expression `pattern` in the names of the CUDA
    kernels that run() launches, as torch.profiler records them."""
    import re
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    pattern = re.compile(pattern)
    return [m.groups() for m in (pattern.search(e.name) for e in prof.events()) if m]


def streamed_gemv_kernels(run):
    """(K, quad-table copies, units a warp, row tiles a stage, K = 2's halves decode) of each
    streamed tiled GEMV kernel that run() launches."""
    return [tuple(int(v) for v in g[:4]) + (g[4] == "true",) for g in launched(
        run, r"gemv_tiled_kernel<[^,<>]+, (\d+), [^,<>]+, (\d+), (\d+), (\d+), (true|false)>")]


def halves_expected(kernel, absmax, m):
    """Whether the launcher takes K = 2's halves decode for a streamed kernel (K, quad-table
    copies, units a warp, row tiles a stage) at m rows of x (gemv.cu's halves_decode): the
    quad table at m <= 4 with two units a warp, or two row tiles and E4M4 scales."""
    k, quads, per_warp, tiles = kernel
    return (k == 2 and quads > 0 and m <= 4 and
            (per_warp == 2 or (tiles == 2 and absmax == "e4m4")))


def gemm90_kernels(run):
    """(kernel, N, CTAs an SM, even walk) of each tiled or GGUF GEMM kernel of sm_90 that
    run() launches ("tiled" or "gguf"; the GGUF GEMM's one CTA an SM has no parameter:
    0)."""
    return [(kind, int(n), int(ctas or 0), even == "true") for kind, n, ctas, even in launched(
        run, r"(tiled|gguf)_gemm90_kernel<.*?, (\d+)(?:, (\d+))?, (true|false)>")]


def k2_on_gpu(gen, n_out, k_in, absmax="e4m4"):
    """A random K = 2 weight made on the GPU: its tiled form and W dequantized to float32."""
    import torch
    w = torch.randn(n_out, k_in, device="cuda", generator=gen)
    q = kbit.quantize(w, k=2, absmax=absmax)
    del w
    return kbit.tile(q), kbit.dequantize(q, dtype="float32")


def check_on_gpu(t, w32, x, bias, what):
    """kbit.matmul(x, t, bias) against x times w32 in float32 (plus the bias), within x's
    dtype's tolerance."""
    import torch
    y = kbit.matmul(x, t, bias).float()
    ref = x.float() @ w32.T + (0 if bias is None else bias.float())
    err = float(torch.linalg.norm(y - ref) / torch.linalg.norm(ref))
    tol = TOL["float16" if x.dtype == torch.float16 else "bfloat16"]
    assert err <= tol, f"{what}: relative error {err:.3g}"


@requires_gpu
def test_gpu_streamed_k2_kernels():
    """K = 2's streamed kernels: the quad table beside x held for the whole kernel:
    6656x16384 (416 row tiles, three or more a CTA on up to 138 SMs; 32 stages of 16 units a
    CTA), m = 1 and 2 (32 and 64 KB of x), the table in 32 copies, two row tiles a stage (a
    CTA's odd last tile alone); 17024x8192 at m = 8 (1064 row tiles, eight a CTA on 132 SMs;
    128 KB of x, beside which 32 copies would leave no ring of three: 16 copies, and one row
    tile a stage: two would leave a ring of two); 6400x4128 at m = 1 with a bias (400 row
    tiles, three or four a CTA; rows of 33 groups, the last of one chunk: the pair table, two
    row tiles a stage); 4400x4128 at m = 3 with a bias (two or three row tiles a CTA: x
    copied with each stage, two row tiles a stage); made on the GPU, against x times the
    dequantized W in float32 (plus the bias). On sm_90 (with up to 132 SMs: the streamed
    kernel's table and units depend on the CTAs) the launched kernel is checked too."""
    import torch
    sm90 = hopper_kernels() and torch.cuda.get_device_properties(0).multi_processor_count <= 132
    gen = torch.Generator(device="cuda").manual_seed(5)
    # (n_out, k_in, m's, the kernel: K, quad-table copies, units a warp, row tiles a stage)
    for n_out, k_in, ms, kernel in ((6656, 16384, (1, 2), (2, 32, 1, 2)),
                                    (17024, 8192, (8,), (2, 16, 1, 1)),
                                    (6400, 4128, (1,), (2, 0, 1, 2)),
                                    (4400, 4128, (3,), (2, 0, 1, 2))):
        t, w32 = k2_on_gpu(gen, n_out, k_in)
        bias = torch.randn(n_out, device="cuda", generator=gen).half() if k_in % 128 else None
        for m in ms:
            x = torch.randn(m, k_in, device="cuda", generator=gen).half()
            check_on_gpu(t, w32, x, bias, f"{n_out}x{k_in} m={m}")
            if sm90:
                want = kernel + (halves_expected(kernel, "e4m4", m),)
                ran = streamed_gemv_kernels(lambda: kbit.matmul(x, t, bias))
                assert ran == [want], f"{n_out}x{k_in} m={m}: ran {ran}, want {want}"


@requires_gpu
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_streamed_k2_quads_small_m(fmt):
    """K = 2's quad-table kernels at m = 1..4 with every absmax format, fp16 and bf16 x:
    4400x16384 (275 row tiles, two or three a CTA on 132 SMs, a CTA's odd last tile alone;
    8 stages a tile, 24 a CTA: the quad table, two row tiles a stage; x copied with each
    stage) and 1024x57344 (64 row tiles, one a CTA; 448 groups a row: two units a warp, one
    row tile a stage; 28 stages of 16 units a tile: the quad table), with a bias, against x
    times the dequantized W in float32 (plus the bias). On sm_90 with up to 132 SMs the
    kernel launched is checked to be that K = 2 quad-table one, with the halves decode
    where halves_expected says (two units a warp; two row tiles with E4M4 scales). Also m =
    5 and 8, where the same kernels run (the quad table in 16 copies: rings of two or three
    beside x's stage copies) and the halves decode, which sums only m <= 4 rows, must not."""
    import torch
    sm90 = hopper_kernels() and torch.cuda.get_device_properties(0).multi_processor_count <= 132
    gen = torch.Generator(device="cuda").manual_seed(23 + FORMATS[fmt])
    # (n_out, k_in, (units a warp, row tiles a stage))
    for n_out, k_in, kernel in ((4400, 16384, (1, 2)), (1024, 57344, (2, 1))):
        t, w32 = k2_on_gpu(gen, n_out, k_in, fmt)
        for m in (1, 2, 3, 4, 5, 8):
            dtype = torch.float16 if m % 2 else torch.bfloat16
            x = torch.randn(m, k_in, device="cuda", generator=gen).to(dtype)
            bias = torch.randn(n_out, device="cuda", generator=gen).to(dtype)
            what = f"{fmt} {n_out}x{k_in} m={m}"
            check_on_gpu(t, w32, x, bias, what)
            if sm90:
                ran = streamed_gemv_kernels(lambda: kbit.matmul(x, t, bias))
                assert (len(ran) == 1 and ran[0][:2] in ((2, 16), (2, 32)) and
                        ran[0][2:4] == kernel), f"{what}: ran {ran}"
                assert ran[0][4] == halves_expected(ran[0][:4], fmt, m), f"{what}: ran {ran}"


@requires_gpu
@pytest.mark.parametrize("k", [3, 4])
def test_gpu_streamed_resident_x_pieces(k):
    """The streamed tiled GEMV's resident x, which arrives a piece with each stage of a CTA's
    first row tile and is read again by its later tiles: 6400x16416 (400 row tiles dealt
    round-robin, three or four a CTA on up to 133 SMs; rows of 129 groups, the last of one
    chunk: K = 3 takes two units a warp, a last stage of one unit), m = 1 and 2 (33 and 66
    KB of x, within what it holds), m = 5 (x copied with each stage); a bias; made on the
    GPU, against x times the dequantized W in float32. On sm_90 (up to 132 SMs) the
    kernel launched with x resident is checked too."""
    import torch
    sm90 = hopper_kernels() and torch.cuda.get_device_properties(0).multi_processor_count <= 132
    gen = torch.Generator(device="cuda").manual_seed(17 + k)
    n_out, k_in = 6400, 16416
    w = torch.randn(n_out, k_in, device="cuda", generator=gen)
    q = kbit.quantize(w, k=k)
    del w
    w32 = kbit.dequantize(q, dtype="float32")
    t = kbit.tile(q)
    bias = torch.randn(n_out, device="cuda", generator=gen).half()
    for m in (1, 2, 5):
        x = torch.randn(m, k_in, device="cuda", generator=gen).half()
        y = kbit.matmul(x, t, bias).float()
        ref = x.float() @ w32.T + bias.float()
        err = float(torch.linalg.norm(y - ref) / torch.linalg.norm(ref))
        assert err <= TOL["float16"], f"K={k} {n_out}x{k_in} m={m}: relative error {err:.3g}"
        if sm90 and m <= 2:
            # (K, quad-table copies, units a warp, row tiles a stage, halves decode)
            want = (k, 0, 2 if k == 3 else 1, 1, False)
            ran = streamed_gemv_kernels(lambda: kbit.matmul(x, t, bias))
            assert ran == [want], f"K={k} m={m}: ran {ran}, want {want}"


@requires_gpu
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_gpu_streamed_two_tiles_formats(rng, fmt, k):
    """Two row tiles a stage with every absmax format, fp16 and bf16 x: 4243x2208 (266 row
    tiles, two or three a CTA on 132 SMs, the last one partial, a CTA's odd last tile
    alone; rows of 18 groups, the last of one chunk; x copied with each stage), with a
    bias, against the float64 reference: K = 2 at m = 1, 2 and 5; K = 3 at m = 7 and 8,
    where a stage's x outweighs its W more than twice, and at m = 4, where it does not
    (one row tile a stage). On sm_90 with 132 SMs the launched kernel is checked too."""
    import torch
    sm90 = hopper_kernels() and torch.cuda.get_device_properties(0).multi_processor_count == 132
    n_out, k_in = 4243, 2208
    q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
    t = kbit.tile(on_cuda(q))
    for m in (1, 2, 5) if k == 2 else (4, 7, 8):
        dtype = "float16" if m % 2 else "bfloat16"
        x = random_x(rng, (m, k_in), dtype)
        bias = random_x(rng, (n_out,), dtype)
        xc, bc = cuda_x(x, dtype), cuda_x(bias, dtype)
        y = from_cuda(kbit.matmul(xc, t, bc), dtype)
        check_accuracy(y, reference(x, w64, bias, dtype), dtype,
                       f"two tiles K={k} {fmt} m={m}", magnitude(x, w64, dtype))
        if sm90:
            # (K, quad-table copies, units a warp, row tiles a stage, halves decode)
            want = (k, 0, 1, 1 if k == 3 and m == 4 else 2, False)
            ran = streamed_gemv_kernels(lambda: kbit.matmul(xc, t, bc))
            assert ran == [want], f"K={k} {fmt} m={m}: ran {ran}, want {want}"


@requires_gpu
@pytest.mark.parametrize("k", [2, 4])
def test_gpu_e4m4_subnormal_scales(k):
    """E4M4 scales below 2^-10 (e = 0, E4M4's subnormals), which the kernels decode by bit
    placement (the code byte as a float32 or fp16 subnormal, rescaled): a row tile of W
    2e-6 the size of the others, so that all of its block scales are subnormal, through
    the tiled GEMV (m = 1), the tiled GEMM (m = 24) and the stored paths; those rows
    checked on their own, where a scale decoded as zero (a flush to zero) gives y = 0."""
    rng = np.random.default_rng(3 + k)
    w = rng.standard_normal((48, 4096)).astype(np.float32)
    w[16:32] *= 2e-6
    q = kbit.quantize(w, k=k, absmax="e4m4")
    codes = np.asarray(q.absmax).reshape(48, -1)
    assert np.all(codes[16:32] >> 4 == 0) and np.any(codes[16:32] > 0), "no subnormal scales"
    w64 = R.dequantize_kbit(q.packed, q.absmax, k, w.size, None, "e4m4", q.tensor_scale)
    w64 = w64.astype(np.float64).reshape(w.shape)
    qg = on_cuda(q)
    for weight, name in ((kbit.tile(qg), "tiled"), (qg, "stored")):
        for m, dtype in ((1, "float16"), (24, "bfloat16"), (24, "float16")):
            x = random_x(rng, (m, 4096), dtype)
            y = from_cuda(kbit.matmul(cuda_x(x, dtype), weight), dtype)
            ref = reference(x, w64, None, dtype)
            for rows in (slice(0, 16), slice(16, 32)):
                check_accuracy(y[:, rows], ref[:, rows], dtype,
                               f"K={k} {name} m={m} {dtype} rows {rows.start}..",
                               magnitude(x, w64[rows], dtype))


@requires_gpu
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_gpu_e4m4_large_tensor_scale(k):
    """E4M4 weights whose tensor_scale (times the codebook's largest |entry|) is 2^11 or
    more, where the tiled GEMVs cannot fold 2^116 into one scale factor without overflow
    and move a power of two of it to the output (ChunkScales): a power of two and a
    tensor_scale that is none, through the streamed GEMV (m = 1..8), m = 9..16 and the
    GEMM, tiled and stored, against the float64 reference. A factor lost on the way is off
    by 2^3 or more."""
    rng = np.random.default_rng(40 + k)
    for tensor_scale in (2.0**13, 3.1e5):
        w = (rng.standard_normal((40, 1024)) * tensor_scale * 0.3).astype(np.float32)
        q = kbit.quantize(w, k=k, absmax="e4m4", tensor_scale=tensor_scale)
        assert q.tensor_scale == np.float32(tensor_scale)
        w64 = R.dequantize_kbit(q.packed, q.absmax, k, w.size, None, "e4m4", q.tensor_scale)
        w64 = w64.astype(np.float64).reshape(w.shape)
        qg = on_cuda(q)
        for weight, name in ((kbit.tile(qg), "tiled"), (qg, "stored")):
            for m in (1, 5, 8, 12, 16, 24):
                dtype = "float16" if m % 2 == 0 else "bfloat16"
                x = as_dtype((rng.standard_normal((m, 1024)) / 1024).astype(np.float32), dtype)
                y = from_cuda(kbit.matmul(cuda_x(x, dtype), weight), dtype)
                check_accuracy(y, reference(x, w64, None, dtype), dtype,
                               f"K={k} {name} tensor_scale={tensor_scale} m={m}",
                               magnitude(x, w64, dtype))


@requires_gpu
def test_gpu_e4m4_tensor_scale_product_underflows():
    """tensor_scale 2^-149 (finite and positive, so accepted) with a codebook whose largest
    |entry| is 0.5: the kernels' factor tensor_scale times the book rounds to 0, and y must
    be the bias, finite (a scale factor taken from the exponent of 0 once gave 0 times inf,
    NaN), through the streamed GEMV (m = 1), m = 12 and the GEMM (m = 24)."""
    import torch
    rng = np.random.default_rng(9)
    k = 4
    cb = (kbit.codebook("normal", k) * 0.5).astype(np.float32)
    w = rng.standard_normal((48, 512)).astype(np.float32)
    q = kbit.quantize(w, k=k, absmax="e4m4", codebook=cb)
    tiny = 2.0 ** -149
    qt = kbit.QuantizedTensor(q.packed, q.absmax, k, q.shape, q.dtype, "e4m4", tiny, cb)
    w64 = R.dequantize_kbit(q.packed, q.absmax, k, w.size, cb, "e4m4", tiny)
    w64 = w64.astype(np.float64).reshape(w.shape)
    t = kbit.tile(on_cuda(qt))
    torch.cuda.synchronize()
    for m in (1, 12, 24):
        x = random_x(rng, (m, 512), "float16")
        bias = random_x(rng, (48,), "float16")
        y = from_cuda(kbit.matmul(cuda_x(x, "float16"), t, cuda_x(bias, "float16")), "float16")
        check_accuracy(y, reference(x, w64, bias, "float16"), "float16", f"m={m}")


def tiled_entry(t, k, fmt, x_t, b_t, y_t, dtype, ws=None, nbytes=0):
    """kbit_matmul_kbit_tiled of the GPU tensors x_t (m x k_in), bias b_t and y_t with
    tiled weight t on the current stream, ws (nbytes) its workspace or None; the status."""
    import torch
    (m, k_in), n_out = x_t.shape, y_t.shape[1]
    return function("kbit_matmul_kbit_tiled")(
        x_t.data_ptr(), m, k_in, n_out, DT_ID[dtype], t.packed.data_ptr(), t.absmax.data_ptr(),
        FORMATS[fmt], ctypes.c_float(t.tensor_scale), None, k, b_t.data_ptr(), y_t.data_ptr(),
        None if ws is None else ws.data_ptr(), nbytes if ws is not None else 0,
        torch.cuda.current_stream().cuda_stream)


def check_tiled_entry(t, k, fmt, x, bias, w64, dtype, what):
    """kbit_matmul_kbit_tiled of host x and bias (copied to the GPU) with tiled weight t,
    through the C entry without a workspace (one split) and with
    kbit_matmul_workspace_bytes of it, against the float64 reference; the workspace left
    zeroed. Returns the workspace's size."""
    import torch
    (m, k_in), n_out = x.shape, w64.shape[0]
    x_t, b_t = cuda_x(x, dtype), cuda_x(bias, dtype)
    y_ref = reference(x, w64, bias, dtype)
    nbytes = workspace_bytes(m, k_in, n_out)
    ws = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    for use_ws in (False, True):
        y_t = poisoned_cuda((m, n_out), dtype)
        with_ws = (ws, nbytes) if use_ws else ()
        assert tiled_entry(t, k, fmt, x_t, b_t, y_t, dtype, *with_ws) == S_OK
        torch.cuda.synchronize()
        check_accuracy(from_cuda(y_t, dtype), y_ref, dtype, f"{what} ws={use_ws}",
                       magnitude(x, w64, dtype))
        assert int(torch.count_nonzero(ws)) == 0, "the workspace was not left zeroed"
    return nbytes


@requires_gpu
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_gpu_streamed_gemm_shapes(rng, k):
    """m = 9..64 (on sm_90 the streamed wgmma GEMM: 16, 32 or 64 rows of x, partial in m;
    m <= 16 from 8192 rows of W): n_out off the CTA's 128 rows and below one row tile
    (warps without a tile), a last chunk group of one chunk, few tiles and long rows
    (split k), every absmax format, fp16 and bf16 x, bias; at m = 17..32 one CTA an SM
    on the small weights and two on 8500 rows (67 row tiles); through the C entry with the
    workspace and without it (one split), the workspace left zeroed; against the float64
    reference."""
    for i, (n_out, k_in) in enumerate(((2113, 1312), (131, 9216), (5, 4128), (300, 160),
                                       (8500, 288))):
        fmt = list(FORMATS)[(i + k) % 3]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(on_cuda(q))
        for j, m in enumerate((9, 16, 17, 32, 40, 64)):
            dtype = ("float16", "bfloat16")[(i + j) % 2]
            x = random_x(rng, (m, k_in), dtype)
            check_tiled_entry(t, k, fmt, x, random_x(rng, (n_out,), dtype), w64, dtype,
                              f"streamed GEMM K={k} {fmt} {n_out}x{k_in} m={m}")
    cb = np.sort(rng.uniform(-1, 1, 1 << k)).astype(np.float32)  # and through kbit.matmul
    q, w64 = kbit_weight(rng, 300, 2048, k, "e4m4", codebook=cb, tensor_scale="custom")
    t = kbit.tile(on_cuda(q))
    for m in (12, 48):
        x = random_x(rng, (m, 2048), "bfloat16")
        y = from_cuda(kbit.matmul(cuda_x(x, "bfloat16"), t), "bfloat16")
        check_accuracy(y, reference(x, w64, None, "bfloat16"), "bfloat16",
                       f"streamed GEMM K={k} custom codebook m={m}", magnitude(x, w64, "bfloat16"))


@requires_gpu
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_gpu_tiled_gemm_items_and_long_rows(rng, k):
    """The tiled GEMM on sm_90 where a CTA walks several work items (4100 rows of W and
    1100 of x: 33 x 5 tiles of 128 x 256, more than the SMs, the last of each partial) and
    where k is long and split (k_in = 28672, m = 200 on 300 rows), fp16 and bf16 x, every
    absmax format; against the float64 reference (elsewhere: the mma.sync GEMM)."""
    for i, (n_out, k_in, m) in enumerate(((4100, 4096, 1100), (300, 28672, 200))):
        fmt = list(FORMATS)[(i + k) % 3]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(on_cuda(q))
        for dtype in ("float16", "bfloat16"):
            x = random_x(rng, (m, k_in), dtype)
            y = from_cuda(kbit.matmul(cuda_x(x, dtype), t), dtype)
            check_accuracy(y, reference(x, w64, None, dtype), dtype,
                           f"tiled GEMM K={k} {fmt} {n_out}x{k_in} m={m}", magnitude(x, w64, dtype))


@requires_gpu
@pytest.mark.parametrize("k,fmt", [(4, "e4m4"), (2, "fp16")])
def test_gpu_tiled_gemm_two_ctas_large_weight(k, fmt):
    """m = 33..64 on a weight of 2^27 elements (8192 x 16384), where the tiled GEMM on
    sm_90 runs two CTAs an SM at N = 64 (smaller weights: one), split k, fp16 and bf16 x,
    with bias, and m = 9, the tiled GEMM's smallest there (N = 16); everything
    made on the GPU, against x times the dequantized W in float32 (kbit.dequantize: exact
    per format)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(7)
    w = torch.randn(8192, 16384, device="cuda", generator=g)
    q = kbit.quantize(w, k=k, absmax=fmt)
    del w
    w32 = kbit.dequantize(q, dtype="float32")
    t = kbit.tile(q)
    for m, dtype in ((64, torch.float16), (40, torch.bfloat16), (9, torch.float16)):
        x = torch.randn(m, 16384, device="cuda", generator=g).to(dtype)
        bias = torch.randn(8192, device="cuda", generator=g).to(dtype)
        y = kbit.matmul(x, t, bias).float()
        ref = x.float() @ w32.T + bias.float()
        err = float(torch.linalg.norm(y - ref) / torch.linalg.norm(ref))
        tol = TOL["float16" if dtype == torch.float16 else "bfloat16"]
        assert err <= tol, f"K={k} {fmt} m={m} {dtype}: relative error {err:.3g} > {tol}"


@requires_gpu
@requires_h100_kernels
def test_gpu_gemm_even_walk(rng):
    """The persistent GEMMs' even walk to m = 64, where split k would leave the CTAs uneven
    (formats/matmul.h, tiled90_plan): each CTA takes an equal run of the tiles' k stages,
    a tile in pieces at the runs' ends, its first piece adding the others' partial sums.
    17920 x 12288 (140 tiles of 128 rows): the tiled GEMM on 264 CTAs (K = 4 at m = 16,
    K = 2 at m = 40, K = 3 at m = 64: runs of 51 of its 96 stages a tile, each tile in two
    or three pieces) and the GGUF GEMM (Q4_K at m = 20) on 132 (runs of 51 of 48 stages a
    tile: some tiles whole); fp16 x, a bias; made on the GPU, against x times the
    dequantized W in float32; a second call gives the same bits (the pieces added in
    order)."""
    import torch
    from kbit import gguf as kg
    from test_matmul import gguf_blocks
    g = torch.Generator(device="cuda").manual_seed(29)
    q4k = kg.GGML_TYPES["Q4_K"]

    def check(wq, w32, m, dtype, what):
        n_out, k_in = w32.shape
        assert workspace_bytes(m, k_in, n_out) >= 132 * 16 * 128 * 4, f"{what}: no even walk"
        x = torch.randn(m, k_in, device="cuda", generator=g).to(dtype)
        b = torch.randn(n_out, device="cuda", generator=g).to(dtype)
        out = []
        kernels = gemm90_kernels(lambda: out.append(kbit.matmul(x, wq, b)))
        assert kernels and all(even for *_, even in kernels), \
            f"{what} m={m}: not the even walk: {kernels}"
        y = out[0]
        ref = x.float() @ w32.T + b.float()
        err = float(torch.linalg.norm(y.float() - ref) / torch.linalg.norm(ref))
        tol = TOL["float16" if dtype == torch.float16 else "bfloat16"]
        assert err <= tol, f"{what} m={m} {dtype}: relative error {err:.3g} > {tol}"
        again = kbit.matmul(x, wq, b)
        assert torch.equal(again.view(torch.int16), y.view(torch.int16)), \
            f"{what} m={m}: the pieces' sums differ between calls"

    for (n_out, k_in), cases, gguf_m in (((17920, 12288), ((4, 16), (2, 40), (3, 64)), 20),):
        for i, (k, m) in enumerate(cases):
            w = torch.randn(n_out, k_in, device="cuda", generator=g)
            q = kbit.quantize(w, k=k)
            del w
            check(kbit.tile(q), kbit.dequantize(q, dtype="float32"), m, torch.float16,
                  f"tiled K={k} {n_out}x{k_in}")
        raw = gguf_blocks(rng, "Q4_K", n_out, k_in)
        w32 = torch.from_numpy(kg.dequantize(kg.GGUFTensor(raw.reshape(-1), q4k, (n_out, k_in)),
                                             dtype="float32")).cuda()
        wq = kg.GGUFTensor(torch.from_numpy(raw.reshape(-1)).cuda(), q4k, (n_out, k_in))
        check(wq, w32, gguf_m, torch.float16, f"Q4_K {n_out}x{k_in}")


@requires_gpu
@requires_h100_kernels
def test_gpu_gemm_even_walk_entry():
    """The even walk through the C entry (kbit_matmul_kbit_tiled) with a workspace and
    without one (then the plain plan, a tile a CTA): 8500 x 12288 (67 tiles of 128 rows,
    the last of 52; one CTA an SM at m = 33..64 on this weight: 132 runs of about 49 of a
    tile's 96 stages of 128 k), m = 40 fp16 and 64 bf16, a bias; both against x times the
    dequantized W in float32 on the GPU, and the workspace left zeroed (its slots and
    counters)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(31)
    n_out, k_in, k, fmt = 8500, 12288, 4, "fp16"
    w = torch.randn(n_out, k_in, device="cuda", generator=g)
    q = kbit.quantize(w, k=k, absmax=fmt)
    del w
    t, w32 = kbit.tile(q), kbit.dequantize(q, dtype="float32")
    for m, dtype in ((40, torch.float16), (64, torch.bfloat16)):
        nbytes = workspace_bytes(m, k_in, n_out)
        assert nbytes >= 132 * 64 * 128 * 4, f"m={m}: no even walk planned"
        ws = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
        x = torch.randn(m, k_in, device="cuda", generator=g).to(dtype)
        b = torch.randn(n_out, device="cuda", generator=g).to(dtype)
        ref = x.float() @ w32.T + b.float()
        name = "float16" if dtype == torch.float16 else "bfloat16"
        for use_ws in (False, True):
            y = torch.full((m, n_out), float("nan"), dtype=dtype, device="cuda")
            status = []
            kernels = gemm90_kernels(lambda: status.append(
                tiled_entry(t, k, fmt, x, b, y, name, *((ws, nbytes) if use_ws else ()))))
            assert status == [S_OK]
            assert kernels == [("tiled", 64, 1, use_ws)], \
                f"m={m} ws={use_ws}: {kernels}, not the {'even' if use_ws else 'plain'} walk"
            err = float(torch.linalg.norm(y.float() - ref) / torch.linalg.norm(ref))
            assert err <= TOL[name], f"m={m} ws={use_ws}: relative error {err:.3g}"
            assert int(torch.count_nonzero(ws)) == 0, f"m={m}: the workspace was not left zeroed"


@requires_gpu
@requires_h100_kernels
def test_gpu_tiled_gemm_ctas():
    """CTAs an SM of the tiled GEMM (tiled_ctas): two at N = 16; at N = 32 two where the
    row tiles are half the SMs or more (8500 rows: 67) and one below (2113 rows: 17); at
    N = 64 one below 2^27 weights. K = 4, E4M4 scales, fp16 x, made on the GPU, against x
    times the dequantized W in float32."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(37)
    for n_out, k_in, cases in ((8500, 288, ((16, 16, 2), (24, 32, 2))),
                               (2113, 1312, ((32, 32, 1), (64, 64, 1)))):
        q = kbit.quantize(torch.randn(n_out, k_in, device="cuda", generator=g), k=4)
        t, w32 = kbit.tile(q), kbit.dequantize(q, dtype="float32")
        for m, n, ctas in cases:
            x = torch.randn(m, k_in, device="cuda", generator=g).half()
            out = []
            kernels = gemm90_kernels(lambda: out.append(kbit.matmul(x, t)))
            assert kernels == [("tiled", n, ctas, False)], f"{n_out}x{k_in} m={m}: {kernels}"
            ref = x.float() @ w32.T
            err = float(torch.linalg.norm(out[0].float() - ref) / torch.linalg.norm(ref))
            assert err <= TOL["float16"], f"{n_out}x{k_in} m={m}: relative error {err:.3g}"

@requires_gpu
@pytest.mark.parametrize("k", [2, 5])
def test_gpu_split_sums_same_bits(rng, k):
    """Split k: every split but the last writes its partial sums, and the last adds them to
    its own in split order once the others are in (gemm::sum_splits), so y has the same
    bits whichever CTAs finish first. On sm_90 (plans of formats/matmul.h): 256 x 8192, m =
    32 (two tiles split 16 ways); 640 x 4096, m = 256 (10 tiles of 128 x 128, 8 ways); 8448
    x 1024, m = 128 (66 tiles, 2 ways). Three calls through the workspace give the same
    bits, the first also without it (accuracy against the float64 reference, the workspace
    left zeroed: check_tiled_entry)."""
    import torch
    for i, (n_out, k_in, m) in enumerate(((256, 8192, 32), (640, 4096, 256), (8448, 1024, 128))):
        fmt = list(FORMATS)[(i + k) % 3]
        dtype = ("float16", "bfloat16")[i % 2]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(on_cuda(q))
        x = random_x(rng, (m, k_in), dtype)
        assert check_tiled_entry(t, k, fmt, x, random_x(rng, (n_out,), dtype), w64, dtype,
                                 f"K={k} {n_out}x{k_in} m={m}") > 0
        x_t = cuda_x(x, dtype)
        runs = [kbit.matmul(x_t, t) for _ in range(3)]
        torch.cuda.synchronize()
        for y in runs[1:]:
            assert torch.equal(y.view(torch.int16), runs[0].view(torch.int16)), (
                f"K={k} {n_out}x{k_in} m={m}: split sums differ between calls")


@requires_gpu
@pytest.mark.parametrize("k", [3, 4])
def test_gpu_tiled_gemm_tail_split(rng, k):
    """The tiled GEMM's plan on sm_90 where whole waves of tiles leave a last one at most
    half full: those last tiles split k, the others do not (4480 x 2048, m = 1000: 35 x 4
    tiles of 128 x 256, 8 past one wave, split four ways; 4100 x 1024, m = 1030: 33 x 5, 33
    past, split in two, W and x partial in their last tiles); y through the 16-byte
    epilogue (n_out % 8 == 0) and the per-element one, with bias; through the C entry with
    the workspace and without it (no split), the workspace left zeroed; against the
    float64 reference."""
    for i, (n_out, k_in, m, dtype) in enumerate(((4480, 2048, 1000, "float16"),
                                                 (4100, 1024, 1030, "bfloat16"))):
        fmt = list(FORMATS)[(i + k) % 3]
        q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
        t = kbit.tile(on_cuda(q))
        x = random_x(rng, (m, k_in), dtype)
        nbytes = check_tiled_entry(t, k, fmt, x, random_x(rng, (n_out,), dtype), w64, dtype,
                                   f"tiled GEMM tail split K={k} {fmt} {n_out}x{k_in} m={m}")
        assert nbytes > 0, "the last wave's tiles split k"


@requires_gpu
@pytest.mark.parametrize("k,fmt", [(2, "fp32"), (4, "e4m4"), (5, "fp16")])
def test_gpu_gemm_wide_shapes(rng, k, fmt):
    """Enough output tiles for the GEMM's widest CTA on sm_90 (8500 rows of W are 67 row
    tiles; m = 300 is two tiles of 256 rows of x, the second partial), a long run of k
    stages with an odd chunk count (k_in = 1056: 33 chunks, the last stage half empty);
    K = 5 takes 128 rows of x (its pair table leaves no room for 256), fp32 scales with
    fp16 x the mma.sync GEMM. Against the float64 reference, with bias."""
    n_out, k_in, m = 8500, 1056, 300
    q, w64 = kbit_weight(rng, n_out, k_in, k, fmt)
    t = kbit.tile(on_cuda(q))
    for dtype in ("float16", "bfloat16"):
        x = random_x(rng, (m, k_in), dtype)
        bias = random_x(rng, (n_out,), dtype)
        y = from_cuda(kbit.matmul(cuda_x(x, dtype), t, cuda_x(bias, dtype)), dtype)
        check_accuracy(y, reference(x, w64, bias, dtype), dtype,
                       f"tiled K={k} {fmt} {dtype} m={m}", magnitude(x, w64, dtype))
