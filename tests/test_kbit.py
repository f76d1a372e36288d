"""The kbit format: numpy reference, CPU library against the reference, bad input.
(GPU against CPU lives in test_kbit_gpu.py.)"""
import ctypes
import itertools

import numpy as np
import pytest

import kbit
from kbit import reference as R
from kbit._lib import call, function

KS = (2, 3, 4, 5)
FORMATS = ("fp32", "fp16", "e4m4")
DTYPES = ("float32", "float16", "bfloat16")
SIZES = (1, 31, 32, 33, 1000, (1 << 16) + 7)
STATUS = {"ok": 0, "invalid": 1, "null": 2, "misaligned": 3, "range": 4}
FMT_ID = {"fp32": 0, "fp16": 1, "e4m4": 2}
DT_ID = {"float32": 0, "float16": 1, "bfloat16": 2}


def make_input(rng, n, dtype, kind="normal"):
    """Random data as the library sees it: float32/float16 arrays or bf16 bits."""
    if kind == "normal":
        x = rng.standard_normal(n).astype(np.float32)
    elif kind == "student":
        x = rng.standard_t(3, n).astype(np.float32)
    else:
        x = (rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 2)).astype(np.float32)
    if kind != "normal" and np.abs(x).max() > 25:  # keep within the E4M4 range
        x *= np.float32(25 / np.abs(x).max())
    if dtype == "bfloat16":
        return R.kbit.float32_to_bf16_bits(x)
    return x.astype(dtype)


def host_quantize(x, k, fmt, dtype, codebook=None, ts=1.0, expect=0):
    n = x.size
    nb = (n + 31) // 32
    packed = np.full(max(nb * k, 1), 0xDEADBEEF, dtype=np.uint32)
    absmax = np.full(max(nb, 1), 0x5A, dtype={"fp32": np.float32, "fp16": np.float16,
                                               "e4m4": np.uint8}[fmt])
    if fmt != "e4m4":
        absmax.view(np.uint8)[:] = 0x5A
    cb = None if codebook is None else np.ascontiguousarray(codebook, dtype=np.float32)
    status = function("kbit_quantize_host")(
        x.ctypes.data, n, DT_ID[dtype], k, None if cb is None else cb.ctypes.data,
        FMT_ID[fmt], ctypes.c_float(ts), absmax.ctypes.data, packed.ctypes.data)
    assert status == expect, kbit._lib.lib().kbit_last_error_message()
    return packed[:nb * k], absmax[:nb]


def host_dequantize(packed, absmax, k, n, fmt, dtype, codebook=None, ts=1.0):
    out = np.full(n + 1, 0x7B7B, dtype=np.uint16 if dtype != "float32" else np.uint32)
    out = out.view({"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype])
    cb = None if codebook is None else np.ascontiguousarray(codebook, dtype=np.float32)
    call("kbit_dequantize_host", packed.ctypes.data, absmax.ctypes.data, FMT_ID[fmt],
         ctypes.c_float(ts), None if cb is None else cb.ctypes.data, k, n, DT_ID[dtype],
         out.ctypes.data)
    assert out.view(np.uint16 if dtype != "float32" else np.uint32)[n] in (0x7B7B,), \
        "wrote past the end"
    return out[:n]


def same_values(a, b):
    """Bitwise equality, any NaN equal to any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.uint16 and b.dtype == np.uint16:  # bf16 bits
        fa, fb = R.kbit.bf16_bits_to_float32(a), R.kbit.bf16_bits_to_float32(b)
    else:
        fa, fb = a.astype(np.float32), b.astype(np.float32)
    nan = np.isnan(fa)
    return np.array_equal(nan, np.isnan(fb)) and np.array_equal(
        fa[~nan].view(np.uint32), fb[~nan].view(np.uint32))


# ---------------------------------------------------------------------------------
# Reference self-tests
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", KS)
def test_codebook_shape(k):
    cb = R.create_normal_float_codebook(k)
    assert cb.dtype == np.float32 and cb.size == 1 << k
    assert np.all(np.diff(cb) > 0), "sorted ascending, distinct"
    assert cb[0] == -1 and cb[-1] == 1
    assert np.array_equal(cb, -cb[::-1]), "symmetric"
    assert (cb < 0).sum() == (cb > 0).sum() == 1 << (k - 1), "no explicit zero"


@pytest.mark.parametrize("k", KS)
def test_codebook_is_normal_quantiles(k):
    # Compare with quantiles from a sort of many normal samples (no scipy needed).
    m = 1 << k
    p = (np.arange(m) + 0.5) / m
    samples = np.sort(np.random.default_rng(1).standard_normal(2_000_000))
    q = samples[(p * samples.size).astype(int)]
    q /= np.abs(q).max()
    assert np.abs(q - R.create_normal_float_codebook(k)).max() < 0.01


@pytest.mark.parametrize("k", KS)
def test_library_codebook_matches_reference(k):
    assert np.array_equal(kbit.default_codebook(k), R.create_normal_float_codebook(k))


def test_e4m4_decode_matches_spec():
    codes = np.arange(256)
    e, m = codes >> 4, codes & 15
    expect = np.where(e > 0, 2.0 ** (e - 11) * (1 + m / 16), 2.0 ** -10 * (m / 16))
    assert np.array_equal(R.decode_e4m4(codes), expect.astype(np.float32))
    lib = kbit._lib.lib()
    lib.kbit_e4m4_decode.restype = ctypes.c_float
    lib.kbit_e4m4_decode.argtypes = [ctypes.c_uint8]
    assert [lib.kbit_e4m4_decode(c) for c in range(256)] == list(expect.astype(np.float32))
    assert R.decode_e4m4(0) == 0 and R.decode_e4m4(255) == 31.0
    assert R.decode_e4m4(1) == 2.0 ** -14


def test_e4m4_encode_ceil(rng):
    v = np.abs(rng.standard_normal(10000).astype(np.float32)) * 4
    c = R.encode_e4m4(v)
    dec = R.decode_e4m4(c)
    assert np.all(dec >= v)
    assert np.all(R.decode_e4m4(np.maximum(c.astype(int) - 1, 0)) < v)
    with pytest.raises(R.RangeError):
        R.encode_e4m4(np.float32(31.5))


@pytest.mark.parametrize("k", KS)
def test_pack_unpack_roundtrip(rng, k):
    codes = rng.integers(0, 1 << k, size=(17, 32))
    packed = R.pack_bitplanes(codes, k)
    assert packed.dtype == np.uint32 and packed.size == 17 * k
    assert np.array_equal(R.unpack_bitplanes(packed, k), codes)
    # Bit i of word j is bit j of code i.
    assert packed[0] & 1 == codes[0, 0] & 1
    assert (packed[1] >> 5) & 1 == (codes[0, 5] >> 1) & 1


def test_error_falls_with_k(rng):
    x = rng.standard_normal(1 << 15).astype(np.float32)
    s = []
    for k in KS:
        p, a = R.quantize_kbit(x, k)
        s.append(R.sqnr_db(x, R.dequantize_kbit(p, a, k, x.size)))
    assert all(b > a + 4 for a, b in zip(s, s[1:])), s


@pytest.mark.parametrize("k,fmt", list(itertools.product(KS, FORMATS)))
def test_analytic_error_bound(rng, k, fmt):
    """|x - x_hat| <= (half the largest codebook gap + scale rounding) * block scale.
    With the error-minimising E4M4 search the scale may sit up to 2 codes below the
    absmax, so the clipped elements are covered by the absmax-format term."""
    x = make_input(rng, 4096, "float32", "student")
    x *= 20 / np.abs(x).max()  # within the E4M4 range
    p, a = R.quantize_kbit(x, k, absmax_format=fmt)
    y = R.dequantize_kbit(p, a, k, x.size, absmax_format=fmt)
    cb = R.create_normal_float_codebook(k)
    half_gap = np.diff(cb).max() / 2
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(axis=1)
    d = (R.decode_e4m4(a) if fmt == "e4m4" else a.astype(np.float32)).astype(np.float64)
    # Elements beyond the stored scale (E4M4 may store up to 2 codes below the absmax)
    # clip to the top entry; all others are within half a gap.
    bound = half_gap * d + np.maximum(amax - d, 0) + 1e-6 * amax
    err = np.abs(xb - y.reshape(-1, 32)).max(axis=1)
    assert np.all(err <= bound + 1e-7), (err - bound).max()


@pytest.mark.parametrize("k", KS)
def test_reference_sqnr_matches_quality_table(k):
    # docs/QUALITY.md: N(0,1), 2^20 values, default codebook.
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    table = {2: (7.42, 7.95), 3: (15.01, 15.51), 4: (21.21, 21.87), 5: (26.33, 27.13)}
    for fmt, want in zip(("fp32", "e4m4"), table[k]):
        p, a = R.quantize_kbit(x, k, absmax_format=fmt)
        got = R.sqnr_db(x, R.dequantize_kbit(p, a, k, x.size, absmax_format=fmt))
        assert abs(got - want) < 0.03, (fmt, got, want)


def test_nearest_matches_brute_force(rng):
    cb = rng.standard_normal(16).astype(np.float32)
    table = R.kbit._search_table(cb)
    v = rng.standard_normal(100000).astype(np.float32) * 2
    codes, _ = R.kbit._nearest(v, table)
    # The exact nearest entry (float64 distances are exact for float32 values). The
    # format decides against float32-rounded midpoints, so the two may differ only for
    # v within an ulp of a midpoint.
    exact = np.abs(v.astype(np.float64)[:, None] - cb.astype(np.float64)[None, :]).argmin(axis=1)
    mids = np.sort(cb).astype(np.float64)
    mids = (mids[:-1] + mids[1:]) / 2
    ulp = np.abs(np.spacing(mids.astype(np.float32))).astype(np.float64)
    near_mid = (np.abs(v.astype(np.float64)[:, None] - mids[None, :]) <= ulp[None, :]).any(axis=1)
    assert np.array_equal(codes[~near_mid], exact[~near_mid])
    # Where they differ, the chosen entry is as near as the exact one to within an ulp.
    d_code = np.abs(v.astype(np.float64) - cb[codes].astype(np.float64))
    d_exact = np.abs(v.astype(np.float64) - cb[exact].astype(np.float64))
    assert np.all(d_code <= d_exact + np.abs(np.spacing(v)).astype(np.float64))


# ---------------------------------------------------------------------------------
# CPU library against the reference
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k,fmt,dtype", list(itertools.product(KS, FORMATS, DTYPES)))
def test_host_matches_reference(rng, k, fmt, dtype):
    for n in SIZES:
        x = make_input(rng, n, dtype)
        packed, absmax = host_quantize(x, k, fmt, dtype)
        rp, ra = R.quantize_kbit(x, k, absmax_format=fmt)
        assert np.array_equal(packed, rp), f"packed differs at n={n}"
        assert np.array_equal(absmax.view(np.uint8), ra.view(np.uint8)), f"absmax n={n}"
        out = host_dequantize(packed, absmax, k, n, fmt, dtype)
        ref = R.dequantize_kbit(rp, ra, k, n, absmax_format=fmt, dtype=dtype)
        assert same_values(out, ref), f"dequantize differs at n={n}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_threaded_matches_reference(rng, fmt):
    # Enough blocks (>= 2 x 4096) that the CPU implementation splits them across cores.
    x = make_input(rng, (1 << 19) + 7, "float16")
    packed, absmax = host_quantize(x, 3, fmt, "float16")
    rp, ra = R.quantize_kbit(x, 3, absmax_format=fmt)
    assert np.array_equal(packed, rp) and np.array_equal(absmax.view(np.uint8), ra.view(np.uint8))
    out = host_dequantize(packed, absmax, 3, x.size, fmt, "float16")
    assert same_values(out, R.dequantize_kbit(rp, ra, 3, x.size, absmax_format=fmt,
                                              dtype="float16"))


@pytest.mark.parametrize("kind", ["asymmetric", "positive", "nonuniform", "duplicates", "unsorted"])
@pytest.mark.parametrize("k", KS)
def test_custom_codebooks(rng, kind, k):
    m = 1 << k
    if kind == "asymmetric":
        cb = np.linspace(-0.5, 1.0, m)
    elif kind == "positive":
        cb = np.linspace(0.0, 1.0, m)
    elif kind == "nonuniform":
        cb = np.sort(rng.uniform(-1, 1, m))
    elif kind == "duplicates":
        cb = np.repeat(np.linspace(-1, 1, m // 2), 2)
        cb[0] = cb[3]
    else:
        cb = rng.permutation(R.create_normal_float_codebook(k))
    cb = cb.astype(np.float32)
    for fmt in FORMATS:
        x = make_input(rng, 2000, "float32", "student")
        packed, absmax = host_quantize(x, k, fmt, "float32", codebook=cb)
        rp, ra = R.quantize_kbit(x, k, codebook=cb, absmax_format=fmt)
        assert np.array_equal(packed, rp) and np.array_equal(absmax, ra)
        out = host_dequantize(packed, absmax, k, x.size, fmt, "float32", codebook=cb)
        assert same_values(out, R.dequantize_kbit(rp, ra, k, x.size, codebook=cb,
                                                  absmax_format=fmt))
        if kind == "duplicates":  # among equal entries the lowest index is used
            codes = R.unpack_bitplanes(packed, k).reshape(-1)
            dup_hi = [i for i in range(m) if np.any(cb[:i] == cb[i])]
            assert not np.isin(codes, dup_hi).any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_blocks(fmt):
    x = np.zeros(100, dtype=np.float32)
    x[64:70] = [1, -2, 3, 0.5, 0.25, -0.125]
    packed, absmax = host_quantize(x, 4, fmt, "float32")
    out = host_dequantize(packed, absmax, 4, x.size, fmt, "float32")
    assert np.all(out[:64] == 0) and np.all(out[96:] == 0)
    assert np.all(out[64:70] != 0)
    assert absmax[:2].view(np.uint8).tolist() == [0] * 2 * absmax.itemsize


@pytest.mark.parametrize("fmt", ["fp32", "fp16"])
def test_nonfinite_confined_to_block(rng, fmt):
    x = rng.standard_normal(32 * 6).astype(np.float32)
    x[40] = np.nan
    x[100] = np.inf
    packed, absmax = host_quantize(x, 4, fmt, "float32")
    out = host_dequantize(packed, absmax, 4, x.size, fmt, "float32")
    assert np.all(np.isnan(out[32:64])) and np.all(np.isnan(out[96:128]))
    good = np.r_[0:32, 64:96, 128:192]
    assert np.all(np.isfinite(out[good]))
    clean = x.copy()
    clean[32:64] = 0
    clean[96:128] = 0
    p2, a2 = host_quantize(clean, 4, fmt, "float32")
    assert np.array_equal(R.unpack_bitplanes(packed, 4)[[0, 2, 4, 5]],
                          R.unpack_bitplanes(p2, 4)[[0, 2, 4, 5]])


def test_nonfinite_e4m4_is_range_error(rng):
    x = rng.standard_normal(96).astype(np.float32)
    x[40] = np.nan
    packed, absmax = host_quantize(x, 4, "e4m4", "float32", expect=STATUS["range"])
    ref_p, ref_a = R.quantize_kbit(x, 4, strict=False)
    assert np.array_equal(packed, ref_p) and np.array_equal(absmax, ref_a)
    assert absmax[1] == 255
    out = host_dequantize(packed, absmax, 4, 96, "e4m4", "float32")
    assert np.array_equal(out[:32], R.dequantize_kbit(ref_p, ref_a, 4, 96)[:32])


@pytest.mark.parametrize("fmt,limit", [("e4m4", 31.0), ("fp16", 65504.0)])
def test_range_error_and_tensor_scale(rng, fmt, limit):
    x = rng.standard_normal(1000).astype(np.float32)
    x[500] = limit * 3
    host_quantize(x, 4, fmt, "float32", expect=STATUS["range"])
    ts = ctypes.c_float()
    call("kbit_compute_tensor_scale_host", x.ctypes.data, x.size, 0, FMT_ID[fmt], ctypes.byref(ts))
    assert ts.value > 1 and np.abs(x).max() / np.float32(ts.value) <= limit
    packed, absmax = host_quantize(x, 4, fmt, "float32", ts=ts.value)
    rp, ra = R.quantize_kbit(x, 4, absmax_format=fmt, tensor_scale=ts.value)
    assert np.array_equal(packed, rp) and np.array_equal(absmax, ra)
    out = host_dequantize(packed, absmax, 4, x.size, fmt, "float32", ts=ts.value)
    rest = np.r_[0:480, 512:1000]  # every block but the outlier's
    assert R.sqnr_db(x[rest], out[rest]) > 19
    assert abs(out[500] - x[500]) < 0.05 * x[500]  # the scale search may clip a little
    # Python picks the scale itself: never a range error.
    q = kbit.quantize(x, k=4, absmax=fmt)
    assert q.tensor_scale == ts.value
    assert np.array_equal(kbit.dequantize(q), out)


def test_fp32_absmax_over_float_range_is_range_error(rng):
    # A caller's tensor_scale < 1 can take absmax / tensor_scale past the float range:
    # the block is stored at FLT_MAX and reported, never stored as inf.
    x = rng.standard_normal(96).astype(np.float32)
    x[40] = 3e38
    packed, absmax = host_quantize(x, 4, "fp32", "float32", ts=0.5, expect=STATUS["range"])
    rp, ra = R.quantize_kbit(x, 4, absmax_format="fp32", tensor_scale=0.5, strict=False)
    assert np.array_equal(packed, rp) and np.array_equal(absmax, ra)
    assert absmax[1] == np.finfo(np.float32).max and np.all(np.isfinite(absmax))
    with pytest.raises(R.RangeError):
        R.quantize_kbit(x, 4, absmax_format="fp32", tensor_scale=0.5)
    out = host_dequantize(packed, absmax, 4, x.size, "fp32", "float32", ts=0.5)
    assert np.all(np.isfinite(out)) and out[40] > 1e38
    assert same_values(out, R.dequantize_kbit(rp, ra, 4, x.size, absmax_format="fp32",
                                              tensor_scale=0.5))


def midpoint_blocks(cb, n_blocks):
    """Blocks whose absmax is 1 (so x / scale = x exactly with fp32 absmax) holding every
    entry of cb and every exact float32 midpoint between neighbouring distinct entries."""
    s = np.unique(cb.astype(np.float32))
    mids = ((s[:-1] + s[1:]) * np.float32(0.5)).astype(np.float32)
    pool = np.concatenate([s, mids, -mids]).astype(np.float32)
    pool = pool[np.abs(pool) <= 1]
    x = np.resize(pool, n_blocks * 32).reshape(n_blocks, 32)
    x[:, 0] = 1.0
    return x.reshape(-1).astype(np.float32)


def tie_and_dense_codebooks(rng, k):
    """Codebooks that reach the search's edge cases: entries in an order where exact
    midpoints go up or down, and entries closer together than the search's bins."""
    m = 1 << k
    # Ties go up where the larger of two neighbouring entries has the lower index, so the
    # order must be neither ascending nor descending (at K = 2, 1 draw in 12 is).
    while True:
        perm = rng.permutation(np.linspace(-1, 1, m)).astype(np.float32)
        rising = np.diff(perm) > 0
        if rising.any() and not rising.all():
            break
    dense = np.linspace(-1, 1, m).astype(np.float32)
    d = min(4, m // 2)
    dense[m // 2: m // 2 + d] = np.float32(0.25) + np.float32(1 / 1024) * np.arange(d)
    return [perm, perm[::-1].copy(), rng.permutation(dense)]


@pytest.mark.parametrize("k", KS)
def test_exact_midpoints_and_dense_codebooks(rng, k):
    for n_book, cb in enumerate(tie_and_dense_codebooks(rng, k)):
        x = midpoint_blocks(cb, 20)
        for fmt in FORMATS:
            packed, absmax = host_quantize(x, k, fmt, "float32", codebook=cb)
            rp, ra = R.quantize_kbit(x, k, codebook=cb, absmax_format=fmt)
            assert np.array_equal(packed, rp) and np.array_equal(absmax, ra)
        if n_book == 2:
            continue  # the dense book: its point is the bins, not the ties
        # With fp32 absmax every block's scale is 1, so x itself is searched: the
        # elements on a midpoint take the lower original index of its two entries, and
        # the data holds ties going both up and down.
        packed, _ = host_quantize(x, k, "fp32", "float32", codebook=cb)
        codes = R.unpack_bitplanes(packed, k).reshape(-1)[:x.size]
        s, idx, mids, tie, _ = R.kbit._search_table(cb)
        j = np.searchsorted(mids, x)
        on_mid = (j < mids.size) & (x == mids[np.minimum(j, mids.size - 1)])
        jm = j[on_mid]
        assert np.array_equal(codes[on_mid], tie[jm])
        goes_up = tie[jm] == idx[jm + 1]
        assert goes_up.any() and (~goes_up).any()


@pytest.mark.parametrize("scale", [1e-30, 1e-12, 1e-6, 1e-3, 0.05, 1.0, 3.0])
def test_tensor_scale_brings_small_tensors_into_normal_range(rng, scale):
    x = (rng.standard_normal(4096) * scale).astype(np.float32)
    amax = float(np.abs(x).max())
    ts = ctypes.c_float()
    for fmt, limit in ((2, 31.0), (1, 65504.0)):
        call("kbit_compute_tensor_scale_host", x.ctypes.data, x.size, 0, fmt, ctypes.byref(ts))
        if fmt == 1 and amax >= 2 ** -4:  # fp16 scales of such tensors are normal as they are
            assert ts.value == 1.0
            continue
        mantissa, _ = np.frexp(np.float32(ts.value))
        assert mantissa == 0.5, "a power of two: decode * tensor_scale stays exact"
        assert limit / 2 <= amax / ts.value < limit
    # So accuracy does not depend on the tensor's magnitude (fp16 scales at 1e-12 had
    # all been subnormal: -68 dB).
    for absmax, floor in (("e4m4", 21.5), ("fp16", 20.8)):
        y = kbit.dequantize(kbit.quantize(x, k=4, absmax=absmax))
        assert R.sqnr_db(x, y) > floor, absmax
    # fp32 scales need none.
    call("kbit_compute_tensor_scale_host", x.ctypes.data, x.size, 0, 0, ctypes.byref(ts))
    assert ts.value == 1.0


def test_tensor_scale_of_a_tensor_of_subnormals():
    # The power of two stops at 2^-126 (a normal float), where max|x| / limit would
    # need a smaller one; the call stays valid.
    x = np.full(64, 1e-45, np.float32)
    ts = ctypes.c_float()
    for fmt in (1, 2):
        call("kbit_compute_tensor_scale_host", x.ctypes.data, x.size, 0, fmt, ctypes.byref(ts))
        assert ts.value == 2.0 ** -126
        kbit.quantize(x, k=4, absmax=("fp16", "e4m4")[fmt - 1])  # no error


def test_host_rejects_nonfinite_codebook():
    x = np.ones(32, dtype=np.float32)
    cb = R.create_normal_float_codebook(3)
    cb[4] = np.nan
    packed, absmax = poisoned_quant_outputs()
    status = function("kbit_quantize_host")(x.ctypes.data, 32, 0, 3, cb.ctypes.data, 2,
                                            ctypes.c_float(1), absmax.ctypes.data,
                                            packed.ctypes.data)
    assert status == STATUS["invalid"] and b"codebook[4]" in kbit._lib.lib().kbit_last_error_message()
    assert np.all(packed == 0xAAAAAAAA)


def test_python_nan_with_e4m4_is_refused_and_fp16_keeps_it():
    x = np.linspace(-1, 1, 96).astype(np.float32)
    x[40] = np.nan
    with pytest.raises(kbit.KbitError, match="NaN or Inf"):
        kbit.quantize(x)
    y = kbit.dequantize(kbit.quantize(x, absmax="fp16"))
    assert np.all(np.isnan(y[32:64])) and np.all(np.isfinite(y[:32])) and np.all(np.isfinite(y[64:]))


def test_python_zero_dim_roundtrip():
    q = kbit.quantize(np.float32(0.75), k=5, absmax="fp32")
    assert q.shape == () and q.n == 1
    y = kbit.dequantize(q)
    assert y.shape == () and abs(float(y) - 0.75) < 1e-6


@pytest.mark.parametrize("kind", ["normal", "student", "lognormal"])
def test_python_api_roundtrip(rng, kind):
    x = make_input(rng, 3 * 1000 + 5, "float32", kind).reshape(5, -1)
    for k in KS:
        q = kbit.quantize(x, k=k)
        assert q.shape == x.shape and q.packed.dtype == np.uint32
        assert q.bits_per_element == pytest.approx(k + 0.25, rel=0.01)
        y = kbit.dequantize(q)
        assert y.shape == x.shape and y.dtype == np.float32
        rp, ra = R.quantize_kbit(x, k, tensor_scale=q.tensor_scale)
        assert np.array_equal(q.packed, rp) and np.array_equal(q.absmax, ra)
        y16 = kbit.dequantize(q, dtype="float16")
        assert y16.dtype == np.float16 and np.array_equal(y16, y.astype(np.float16))


def test_python_bfloat16_host(rng):
    bits = make_input(rng, 500, "bfloat16")
    q = kbit.quantize(bits, k=3, dtype="bfloat16")
    assert q.dtype == "bfloat16"
    out = kbit.dequantize(q)
    assert out.dtype == np.uint16
    # The reference at the tensor scale kbit picked (a block at the top E4M4 code has
    # no larger candidate, so tensor_scale 1 can choose differently: 1 draw in ~400).
    rp, ra = R.quantize_kbit(bits, 3, tensor_scale=q.tensor_scale)
    assert np.array_equal(q.packed, rp) and np.array_equal(q.absmax, ra)
    assert same_values(out, R.dequantize_kbit(rp, ra, 3, 500, dtype="bfloat16",
                                              tensor_scale=q.tensor_scale))


def test_python_errors():
    x = np.ones(64, dtype=np.float32)
    with pytest.raises(kbit.KbitError, match="k must be"):
        kbit.quantize(x, k=6)
    with pytest.raises(kbit.KbitError, match="absmax"):
        kbit.quantize(x, absmax="fp8")
    with pytest.raises(kbit.KbitError, match="codebook"):
        kbit.quantize(x, k=3, codebook=np.zeros(4))
    with pytest.raises(kbit.KbitError, match="dtype"):
        kbit.quantize(np.ones(4, dtype=np.int32))
    q = kbit.quantize(x)
    with pytest.raises(kbit.KbitError, match="dtype"):
        kbit.dequantize(q, dtype="int8")
    bad = kbit.QuantizedTensor(q.packed[:-1], q.absmax, q.k, q.shape, q.dtype)
    with pytest.raises(kbit.KbitError, match="packed"):
        kbit.dequantize(bad)
    with pytest.raises(kbit.KbitError, match="RANGE"):
        kbit.quantize(np.full(32, 100.0, dtype=np.float32), tensor_scale=1.0)
    with pytest.raises(kbit.KbitError, match="tensor_scale"):
        kbit.quantize(x, tensor_scale=0.0)


# ---------------------------------------------------------------------------------
# Bad input on every public function: a status, a message, nothing written
# ---------------------------------------------------------------------------------

def poisoned_quant_outputs():
    """packed words and absmax bytes filled with a known pattern."""
    return np.full(8, 0xAAAAAAAA, dtype=np.uint32), np.full(16, 0x77, dtype=np.uint8)


QUANT_NAMES = [f"cquantize_kbit_{t}_k{k}{s}" for t in ("fp16", "bf16", "fp32") for k in KS
               for s in ("_host",)]
DEQUANT_NAMES = [n.replace("cquantize", "cdequantize") for n in QUANT_NAMES]


@pytest.mark.parametrize("name", QUANT_NAMES)
def test_quantize_bad_input(name):
    buf = np.zeros(256, dtype=np.uint8)
    x = buf.ctypes.data + 16
    packed, absmax = poisoned_quant_outputs()
    fn = function(name)
    f = ctypes.c_float
    P, A = packed.ctypes.data, absmax.ctypes.data
    cases = [
        ((None, 32, None, 2, f(1), A, P), "null"),
        ((x, 32, None, 2, f(1), None, P), "null"),
        ((x, 32, None, 2, f(1), A, None), "null"),
        ((x, -1, None, 2, f(1), A, P), "invalid"),
        ((x, 32, None, 3, f(1), A, P), "invalid"),
        ((x, 32, None, -1, f(1), A, P), "invalid"),
        ((x, 32, None, 2, f(0), A, P), "invalid"),
        ((x, 32, None, 2, f(float("nan")), A, P), "invalid"),
        ((x + 1, 32, None, 2, f(1), A, P), "misaligned"),
        ((x, 32, None, 2, f(1), A, P + 2), "misaligned"),
        ((x, 32, None, 0, f(1), A + 1, P), "misaligned"),
        ((x, 32, None, 1, f(1), A + 1, P), "misaligned"),
        ((x, 32, buf.ctypes.data + 2, 2, f(1), A, P), "misaligned"),
    ]
    for args, want in cases:
        status = fn(*args)
        assert status == STATUS[want], (args, want, status)
        assert kbit._lib.lib().kbit_last_error_message()
        assert np.all(packed == 0xAAAAAAAA) and np.all(absmax == 0x77)
    assert fn(None, 0, None, 2, f(1), None, None) == 0  # n = 0: a valid no-op


@pytest.mark.parametrize("name", DEQUANT_NAMES)
def test_dequantize_bad_input(name):
    packed = np.zeros(8, dtype=np.uint32)
    absmax = np.zeros(16, dtype=np.uint8)
    out = np.full(64, 0x55, dtype=np.uint8)
    fn = function(name)
    f = ctypes.c_float
    P, A, O = packed.ctypes.data, absmax.ctypes.data, out.ctypes.data + 16
    cases = [
        ((None, A, 2, f(1), None, 32, O), "null"),
        ((P, None, 2, f(1), None, 32, O), "null"),
        ((P, A, 2, f(1), None, 32, None), "null"),
        ((P, A, 2, f(1), None, -5, O), "invalid"),
        ((P, A, 7, f(1), None, 32, O), "invalid"),
        ((P, A, 2, f(-1), None, 32, O), "invalid"),
        ((P + 1, A, 2, f(1), None, 32, O), "misaligned"),
        ((P, A + 1, 0, f(1), None, 32, O), "misaligned"),
        ((P, A, 2, f(1), None, 32, O + 1), "misaligned"),
    ]
    for args, want in cases:
        assert fn(*args) == STATUS[want], (args, want)
        assert np.all(out == 0x55)
    assert fn(None, None, 2, f(1), None, 0, None) == 0


def test_generic_entries_bad_dtype_and_k():
    x = np.zeros(32, dtype=np.float32)
    packed = np.zeros(5, dtype=np.uint32)
    absmax = np.zeros(1, dtype=np.uint8)
    q = function("kbit_quantize_host")
    dq = function("kbit_dequantize_host")
    f = ctypes.c_float
    for dtype, k in [(3, 4), (-1, 4), (0, 1), (0, 6)]:
        assert q(x.ctypes.data, 32, dtype, k, None, 2, f(1), absmax.ctypes.data,
                 packed.ctypes.data) == STATUS["invalid"]
        assert dq(packed.ctypes.data, absmax.ctypes.data, 2, f(1), None, k, 32, dtype,
                  x.ctypes.data) == STATUS["invalid"]
    lib = kbit._lib.lib()
    lib.kbit_packed_words.restype = ctypes.c_int64
    lib.kbit_packed_words.argtypes = [ctypes.c_int64, ctypes.c_int]
    lib.kbit_absmax_bytes.restype = ctypes.c_int64
    lib.kbit_absmax_bytes.argtypes = [ctypes.c_int64, ctypes.c_int]
    assert lib.kbit_packed_words(65, 3) == 9 and lib.kbit_packed_words(1 << 40, 5) == (1 << 35) * 5
    assert lib.kbit_packed_words(-1, 3) == -1 and lib.kbit_packed_words(1, 1) == -1
    assert lib.kbit_absmax_bytes(65, 0) == 12 and lib.kbit_absmax_bytes(65, 2) == 3
    assert lib.kbit_absmax_bytes(1, 3) == -1
    assert function("kbit_default_codebook_host")(7, x.ctypes.data) == STATUS["invalid"]
    assert function("kbit_default_codebook_host")(3, None) == STATUS["null"]
    ts = ctypes.c_float()
    assert function("kbit_compute_tensor_scale_host")(x.ctypes.data, 32, 9, 2,
                                                      ctypes.byref(ts)) == STATUS["invalid"]
    assert function("kbit_compute_tensor_scale_host")(None, 32, 0, 2,
                                                      ctypes.byref(ts)) == STATUS["null"]


# The pinned status values of include/kbit.h (SPEC section 4): never renumbered.
PINNED_STATUS = ["KBIT_SUCCESS", "KBIT_ERROR_INVALID_ARGUMENT", "KBIT_ERROR_NULL_POINTER",
                 "KBIT_ERROR_MISALIGNED", "KBIT_ERROR_RANGE", "KBIT_ERROR_NOT_SUPPORTED",
                 "KBIT_ERROR_NO_DEVICE", "KBIT_ERROR_CUDA", "KBIT_ERROR_INVALID_DATA",
                 "KBIT_ERROR_INTERNAL"]


def test_status_strings_and_version():
    lib = kbit._lib.lib()
    for code, name in enumerate(PINNED_STATUS):
        assert lib.kbit_status_string(code).decode() == name
        assert kbit._lib.status_name(code) == name and kbit._lib.status_code(name) == code
    assert kbit._lib.status_name(len(PINNED_STATUS)) == f"status {len(PINNED_STATUS)}"
    assert kbit.version() == (0, 1, 0)


def test_errors_are_named_by_the_library():
    """KbitError reads 'function: KBIT_ERROR_...: message', the name from
    kbit_status_string (Python keeps no copy of the enum)."""
    with pytest.raises(kbit.KbitError) as e:
        call("kbit_default_codebook_host", 7, np.empty(256, np.float32).ctypes.data)
    assert e.value.status == 1
    assert str(e.value).startswith("kbit_default_codebook_host: KBIT_ERROR_INVALID_ARGUMENT: ")
    assert not hasattr(kbit._lib, "STATUS")


def test_every_kbit_symbol_is_exported():
    """The SPEC section 4 names, exactly: 24 GPU and 24 host per-type entries and the rest."""
    lib = kbit._lib.lib()
    names = [f"c{op}_kbit_{t}_k{k}{s}" for op in ("quantize", "dequantize")
             for t in ("fp16", "bf16", "fp32") for k in KS for s in ("", "_host")]
    names += ["kbit_quantize", "kbit_dequantize", "kbit_quantize_host", "kbit_dequantize_host",
              "kbit_packed_words", "kbit_absmax_bytes", "kbit_status_string", "kbit_version",
              "kbit_last_error_message", "kbit_compute_tensor_scale",
              "kbit_compute_tensor_scale_host", "kbit_get_range_flag", "kbit_e4m4_decode",
              "kbit_default_codebook_host", "kbit_cuda_available"]
    assert len(names) == 48 + 15
    missing = [n for n in names if not hasattr(lib, n)]
    assert not missing, missing
