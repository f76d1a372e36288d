"""NF4 / FP4 (bitsandbytes-compatible 4-bit): published tables, hand-checked bytes, the
numpy reference against the library's CPU path, the GPU against the CPU bit for bit,
double quantization, bad input on every entry point, the Python API, and (when
bitsandbytes is installed next to a GPU) the bytes of bitsandbytes itself."""
from types import SimpleNamespace

import numpy as np
import pytest

import kbit
from kbit import _lib, bnb4
from kbit.reference import nf4 as ref
from conftest import GPU_SKIP_REASON, requires_gpu

TAGS = ("fp16", "bf16", "fp32")
QTYPES = ("nf4", "fp4")
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
SIZES = (1, 2, 31, 33, 64, 65, 127, 1000, 4097, 2 ** 13 + 7)
NP_DTYPE = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32}
OUT_DTYPE = {"fp16": np.float16, "bf16": "bfloat16", "fp32": np.float32}
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}
S_OK, S_INVALID, S_NULL, S_MISALIGNED, S_NOT_SUPPORTED = 0, 1, 2, 3, 5
POISON = 0xAB
GUARD = 64  # poisoned bytes past every output, which must stay untouched


def fn(name):
    return _lib.function(name)


def to_input(x32, tag):
    """float32 values -> the C input array of type tag (bf16: uint16 bits)."""
    if tag == "bf16":
        return ref.cast_output(x32, "bfloat16")
    return np.ascontiguousarray(x32.astype(NP_DTYPE[tag]))


def random_input(rng, n, tag, specials=False):
    scale = rng.choice([1e-3, 1.0, 30.0])
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if n > 4:
        idx = rng.choice(n, size=max(1, n // 16), replace=False)
        x[idx] = 0.0  # exact zeros and values on block maxima are common in weights
        x[rng.integers(n)] = -0.0
    if specials and n > 8:
        x[rng.integers(n)] = np.nan
        x[rng.integers(n)] = np.inf
        x[rng.integers(n)] = -np.inf
    return to_input(x, tag)


def poisoned(size, dtype):
    a = np.empty(size * np.dtype(dtype).itemsize + GUARD, dtype=np.uint8)
    a[:] = POISON
    return a


def host_quantize(qt, tag, x, bs):
    n = x.size
    nb, npk = -(-n // bs), (n + 1) // 2
    packed, absmax = poisoned(npk, np.uint8), poisoned(nb, np.float32)
    rc = fn(f"cquantize_{qt}_{tag}_host")(x.ctypes.data, n, bs, absmax.ctypes.data,
                                          packed.ctypes.data)
    assert rc == S_OK, _lib.lib().kbit_last_error_message()
    assert np.all(packed[npk:] == POISON) and np.all(absmax[4 * nb:] == POISON)
    return packed[:npk].copy(), absmax[:4 * nb].view(np.float32).copy()


def host_dequantize(qt, tag, packed, absmax, n, bs):
    out = poisoned(n, NP_DTYPE[tag])
    rc = fn(f"cdequantize_{qt}_{tag}_host")(packed.ctypes.data, absmax.ctypes.data, n, bs,
                                            out.ctypes.data)
    assert rc == S_OK, _lib.lib().kbit_last_error_message()
    nbytes = n * ITEMSIZE[tag]
    assert np.all(out[nbytes:] == POISON)
    return out[:nbytes].view(NP_DTYPE[tag]).copy()


def bits(a):
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


# ----------------------------------------------------------------------------------
# Tables and hand-checked bytes
# ----------------------------------------------------------------------------------

def test_tables_are_the_published_ones():
    # QLoRA / SPEC section 2 values to 7 decimals
    spec = [-1, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0,
            0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1]
    np.testing.assert_allclose(ref.NF4_TABLE, spec, atol=6e-8)
    # FP4: magnitudes 0, 0.0625/12, 8/12, 12/12, 4/12, 6/12, 2/12, 3/12; bit 3 is the sign
    mags = np.array([0, 0.0625, 8, 12, 4, 6, 2, 3]) / 12
    np.testing.assert_allclose(ref.FP4_TABLE[:8], mags, atol=1e-8)
    np.testing.assert_array_equal(ref.FP4_TABLE[8:], -ref.FP4_TABLE[:8])
    # the thresholds are the midpoints of neighbouring sorted values
    np.testing.assert_allclose(ref.NF4_THRESHOLDS, (ref.NF4_TABLE[1:] + ref.NF4_TABLE[:-1]) / 2,
                               atol=1e-7)
    mags_sorted = np.sort(ref.FP4_TABLE[:8])
    np.testing.assert_allclose(ref.FP4_THRESHOLDS, (mags_sorted[1:] + mags_sorted[:-1]) / 2,
                               atol=1e-6)
    for c in range(8):  # rank -> code agrees with the table
        assert ref.FP4_TABLE[ref.FP4_RANK_TO_CODE[c]] == mags_sorted[c]


@pytest.mark.parametrize("impl", ["reference", "host"])
def test_fixed_vectors_nf4(impl):
    # absmax 2.0; each value is 2 * a table entry, so its code is that entry's index.
    codes = [15, 0, 7, 8, 1, 14, 3, 12, 2, 13, 4, 11, 5, 10, 6, 9] * 2
    x = (2 * ref.NF4_TABLE[codes]).astype(np.float32)
    expected = bytes([0xF0, 0x78, 0x1E, 0x3C, 0x2D, 0x4B, 0x5A, 0x69] * 2)
    # an exact decision threshold stays below it (strict >); the next float goes up
    t = np.float32(0.03979014977812767)
    x[30] = 2 * t                                  # code 7
    x[31] = 2 * np.nextafter(t, np.float32(1))     # code 8
    expected = expected[:15] + bytes([0x78])
    q = ref.quantize_4bit(x, "nf4", 32) if impl == "reference" else host_quantize("nf4", "fp32", x, 32)
    assert bytes(q[0]) == expected
    assert q[1].tolist() == [2.0]
    # odd n: [2, -2, 1] -> codes 15, 0, 12 (0.5 < 0.50166) and 7 for the 0.0 padding
    x3 = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    q3 = ref.quantize_4bit(x3, "nf4", 64) if impl == "reference" else host_quantize("nf4", "fp32", x3, 64)
    assert bytes(q3[0]) == bytes([0xF0, 0xC7]) and q3[1].tolist() == [2.0]
    out = (ref.dequantize_4bit(q3[0], q3[1], 3, "nf4", 64) if impl == "reference"
           else host_dequantize("nf4", "fp32", q3[0], q3[1], 3, 64))
    assert out.tolist() == [2.0, -2.0, np.float32(2 * np.float32(0.44070982933044434))]


def test_thresholds_are_the_compiled_literals():
    # bitsandbytes writes its thresholds as float literals, which nvcc rounds once from
    # the decimal (read from its PTX): for these four, rounding through a double would
    # land an ulp away.
    got = {t: int(ref.NF4_THRESHOLDS[i:i + 1].view(np.uint32)[0])
           for i, t in ((0, "-0.8480964004993439"), (8, "0.1202552504837513"),
                        (12, "0.5016634166240692"), (14, "0.8614784181118011"))}
    assert got == {"-0.8480964004993439": 0xBF591CD9, "0.1202552504837513": 0x3DF64863,
                   "0.5016634166240692": 0x3F006D03, "0.8614784181118011": 0x3F5C89D9}
    for t in got:
        assert ref.float32_literal(t) != np.float32(float(t))


@pytest.mark.parametrize("impl", ["reference", "host"])
@pytest.mark.parametrize("qt", QTYPES)
def test_every_threshold_exactly(impl, qt):
    # absmax 1 (its reciprocal is exact), so v = x: each threshold itself stays below it
    # (strict >) and the next float goes up, for every threshold of the format.
    thr = ref.NF4_THRESHOLDS if qt == "nf4" else ref.FP4_THRESHOLDS
    up = np.nextafter(thr, np.float32(np.inf))
    x = np.concatenate([[1.0], np.stack([thr, up], axis=1).reshape(-1)]).astype(np.float32)
    rank = np.concatenate([[thr.size], np.stack([np.arange(thr.size), np.arange(1, thr.size + 1)],
                                                axis=1).reshape(-1)])
    codes = rank if qt == "nf4" else ref.FP4_RANK_TO_CODE[rank]
    x = np.concatenate([x, np.zeros(32 - x.size, np.float32)])  # 0.0: NF4 code 7, FP4 code 0
    codes = np.concatenate([codes, np.full(32 - codes.size, 7 if qt == "nf4" else 0)])
    packed, absmax = (ref.quantize_4bit(x, qt, 32) if impl == "reference"
                      else host_quantize(qt, "fp32", x, 32))
    assert absmax.tolist() == [1.0]
    assert np.array_equal(packed, (codes[0::2] << 4 | codes[1::2]).astype(np.uint8))


@pytest.mark.parametrize("impl", ["reference", "host"])
def test_fixed_vectors_fp4(impl):
    x = np.array([1.0, -1.0, 0.5, 0.25, 0.66666667, 0.0, -0.0, 0.16666667, 0.005208333,
                  0.33333333], dtype=np.float32)
    # codes 3, 11, 5, 7, 2, 0, 0, 6, 1, 4 (sign bit 8; -0.0 is positive)
    expected = bytes([0x3B, 0x57, 0x20, 0x06, 0x14])
    q = ref.quantize_4bit(x, "fp4", 32) if impl == "reference" else host_quantize("fp4", "fp32", x, 32)
    assert bytes(q[0]) == expected and q[1].tolist() == [1.0]
    out = (ref.dequantize_4bit(q[0], q[1], 10, "fp4", 32) if impl == "reference"
           else host_dequantize("fp4", "fp32", q[0], q[1], 10, 32))
    np.testing.assert_array_equal(out, np.float32([1, -1, 0.5, 0.25, 0.66666667, 0, 0,
                                                   0.16666667, 0.005208333333, 0.33333333]))
    assert np.signbit(out[5]) == False  # noqa: E712  code 0 is +0.0
    # odd n with fp16 input: [4, -1, 3] -> absmax 4, codes 3, 0b1111 (-0.25), 2 (0.75 -> 2/3)
    # and 0 for the padding
    x16 = np.array([4.0, -1.0, 3.0], dtype=np.float16)
    q16 = ref.quantize_4bit(x16, "fp4", 64) if impl == "reference" else host_quantize("fp4", "fp16", x16, 64)
    assert bytes(q16[0]) == bytes([0x3F, 0x20]) and q16[1].tolist() == [4.0]
    # bitsandbytes' own byte for [7.40625, 2.1601562] (fp16): its fast-math reciprocal of
    # 7.40625 is one ulp above 1/7.40625 rounded, which lifts 2.1601562 / 7.40625 over the
    # 0.29166667 threshold: code 4 (a correctly rounded reciprocal gives code 7: 0x37)
    xb = np.array([7.40625, 2.1601562], dtype=np.float16)
    qb = ref.quantize_4bit(xb, "fp4", 64) if impl == "reference" else host_quantize("fp4", "fp16", xb, 64)
    assert bytes(qb[0]) == bytes([0x34])


@pytest.mark.parametrize("impl", ["reference", "host"])
def test_flush_to_zero(impl):
    """bitsandbytes' kernels flush subnormals (--use_fast_math); so does kbit."""
    quant = (lambda x, qt: ref.quantize_4bit(x, qt, 32)) if impl == "reference" else \
        (lambda x, qt: host_quantize(qt, "fp32", x, 32))
    deq = (lambda p, a, n: ref.dequantize_4bit(p, a, n, "nf4", 32)) if impl == "reference" else \
        (lambda p, a, n: host_dequantize("nf4", "fp32", p, a, n, 32))
    tiny = np.array([1e-39, -1e-39, 0, -2e-39], np.float32)   # all subnormal: absmax 0
    for qt in QTYPES:
        p, a = quant(tiny, qt)
        assert bytes(p) == bytes([0, 0]) and a.tolist() == [0.0]
    # a subnormal product is -0: FP4 keeps the sign bit clear
    p, a = quant(np.array([1.0, -1e-39, 1e-39, 3e-38], np.float32), "fp4")
    assert bytes(p) == bytes([0x30, 0x00]) and a.tolist() == [1.0]
    out = deq(np.array([0xF8], np.uint8), np.array([2e-38], np.float32), 2)
    assert out.tolist() == [np.float32(2e-38), 0.0]   # 0.0796 * 2e-38 is subnormal: 0
    out = deq(np.array([0xF0], np.uint8), np.array([1e-39], np.float32), 2)
    assert out.tolist() == [0.0, 0.0] and np.signbit(out[1])


def test_reciprocal_table_in_effect():
    """Every fp16 block maximum mantissa, with values next to each FP4 threshold: the
    library matches the reference, and the reference's reciprocal table changes codes
    compared with a correctly rounded reciprocal."""
    a = (1 + np.arange(1024) / 1024).astype(np.float16)
    cols = [a]
    for t in ref.FP4_THRESHOLDS:
        near = (a.astype(np.float32) * t).astype(np.float16)
        cols += [near, np.nextafter(near, np.float16(0)), np.nextafter(near, np.float16(2))]
    x = np.stack(cols + [np.zeros(1024, np.float16)] * (32 - len(cols)), axis=1).reshape(-1)
    hp, ha = host_quantize("fp4", "fp16", x, 32)
    rp, ra = ref.quantize_4bit(x, "fp4", 32)
    assert np.array_equal(hp, rp) and np.array_equal(ha, ra)
    xb = x.astype(np.float32).reshape(1024, 32)
    rn = (xb * (np.float32(1) / ha)[:, None]).astype(np.float32)
    rn_codes = ref.encode(rn, "fp4").reshape(-1)
    assert np.sum(ref.unpack_codes(hp, x.size) != rn_codes) > 10


@pytest.mark.parametrize("impl", ["reference", "host"])
@pytest.mark.parametrize("qt", QTYPES)
def test_special_blocks(impl, qt):
    bs = 32
    zero = np.zeros(32, np.float32)                      # absmax 0: 0 * inf = NaN -> code 0
    nanfull = np.full(32, np.nan, np.float32)            # NaN ignored: absmax -FLT_MAX
    infb = np.zeros(32, np.float32)
    infb[3], infb[4] = np.inf, 1.0                       # absmax inf: inf * 0 = NaN -> 0
    nanpart = np.full(5, np.nan, np.float32)             # partial: the padding counts: 0
    x = np.concatenate([zero, nanfull, infb, nanpart])
    q = ref.quantize_4bit(x, qt, bs) if impl == "reference" else host_quantize(qt, "fp32", x, bs)
    fmax = np.finfo(np.float32).max
    assert q[1].tolist() == [0.0, -fmax, np.inf, 0.0]
    codes = ref.unpack_codes(q[0], x.size)
    zero_code = 7 if qt == "nf4" else 0
    assert np.all(codes[:64] == 0) and np.all(codes[96:] == 0)
    assert codes[64 + 3] == 0 and np.all(np.delete(codes[64:96], 3) == zero_code)


# ----------------------------------------------------------------------------------
# Library CPU path against the reference
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
@pytest.mark.parametrize("bs", BLOCKSIZES)
def test_host_quantize_matches_reference(rng, qt, tag, bs):
    for n in SIZES:
        x = random_input(rng, n, tag, specials=(n % 2 == 1))
        packed, absmax = host_quantize(qt, tag, x, bs)
        rp, ra = ref.quantize_4bit(x, qt, bs)
        assert np.array_equal(packed, rp), (n, bs)
        assert np.array_equal(absmax.view(np.uint32), ra.view(np.uint32)), (n, bs)


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
def test_host_dequantize_matches_reference(rng, qt, tag):
    for bs in (32, 64, 4096):
        for n in SIZES:
            nb = -(-n // bs)
            packed = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
            absmax = (rng.standard_normal(nb) * 10).astype(np.float32)
            absmax[rng.integers(nb)] = rng.choice([np.nan, np.inf, -np.inf, 1e-41, 0.0, 7e4])
            out = host_dequantize(qt, tag, packed, absmax, n, bs)
            expected = ref.dequantize_4bit(packed, absmax, n, qt, bs, OUT_DTYPE[tag])
            assert np.array_equal(bits(out), bits(expected)), (n, bs)


@pytest.mark.parametrize("qt", QTYPES)
def test_roundtrip_error_bound(rng, qt):
    x = (rng.standard_normal(100_003) * 5).astype(np.float32)
    for bs in (32, 64, 256, 4096):
        packed, absmax = host_quantize(qt, "fp32", x, bs)
        y = host_dequantize(qt, "fp32", packed, absmax, x.size, bs)
        table = np.sort(ref.table(qt))
        half_gap = np.max(np.diff(table)) / 2
        scale = np.repeat(absmax, bs)[:x.size]
        assert np.all(np.abs(x - y) <= scale * half_gap * (1 + 1e-5) + 1e-30)
        # and the codes are the nearest entries (up to the float32 rounding of v)
        v = x / scale
        codes = ref.unpack_codes(packed, x.size)
        err = np.abs(ref.table(qt)[codes] - v)
        best = np.min(np.abs(ref.table(qt)[None, :] - v[:, None]), axis=1)
        assert np.all(err <= best + 1e-6)


# ----------------------------------------------------------------------------------
# Double quantization
# ----------------------------------------------------------------------------------

def test_dynamic_map():
    m = bnb4.dynamic_map()
    r = ref.create_dynamic_map()
    assert np.array_equal(m.view(np.uint32), r.view(np.uint32))
    assert m.size == 256 and np.all(np.diff(m) > 0)
    assert m[-1] == 1.0 and 0.0 in m
    # hand-checked entries: the i = 0 pair is +-1e-6 * (0.1 + 1) / 2, the largest
    # negative one is -(1 - 0.9 / 128) from i = 6 (64 midpoints of linspace(0.1, 1, 65))
    assert np.min(np.abs(m - 5.5e-7)) < 1e-13 and np.min(np.abs(m + 5.5e-7)) < 1e-13
    assert abs(m[0] + (1 - 0.9 / 128)) < 1e-7 and m[254] == -m[0]
    assert np.array_equal(m[:127], -m[128:255][::-1]) and m[127] == 0
    # entries of bitsandbytes' own map (create_dynamic_map() under torch 2.11), whose
    # linspace rounds each value once (fused multiply-add): 18, 41, 162 and 220 differ
    # when the product and the sum are rounded separately
    bnb_bits = {0: 0xBF7E3333, 1: 0xBF7A999A, 18: 0xBF3D6666, 41: 0xBED53333, 63: 0xBDDB3334,
                100: 0xBBF4BC6A, 126: 0xB513A3B7, 128: 0x3513A3B7, 129: 0x365A1A94,
                162: 0x3CA28F5D, 200: 0x3E6F3333, 220: 0x3F03CCCC, 254: 0x3F7E3333, 255: 0x3F800000}
    assert {i: int(m.view(np.uint32)[i]) for i in bnb_bits} == bnb_bits


def test_absmax_mean_host(rng):
    for count in (1, 5, 1023, 1024, 1025, 70_001):
        a = np.abs(rng.standard_normal(count) * 3).astype(np.float32)
        out = np.full(2, np.nan, np.float32)
        assert fn("kbit_nf4_absmax_mean_host")(a.ctypes.data, count, out.ctypes.data) == S_OK
        assert out[0] == ref.absmax_mean(a) and np.isnan(out[1])
        assert abs(float(out[0]) - float(np.mean(a.astype(np.float64)))) <= 1e-6 * out[0]


def host_quantize_absmax(a, offset, code=None):
    count = a.size
    nb2 = -(-count // 256)
    q, a2 = poisoned(count, np.uint8), poisoned(nb2, np.float32)
    off = np.array([offset], np.float32)
    rc = fn("kbit_nf4_quantize_absmax_host")(a.ctypes.data, count,
                                              code.ctypes.data if code is not None else None,
                                              off.ctypes.data, q.ctypes.data, a2.ctypes.data)
    assert rc == S_OK
    assert np.all(q[count:] == POISON) and np.all(a2[4 * nb2:] == POISON)
    return q[:count].copy(), a2[:4 * nb2].view(np.float32).copy()


def test_quantize_absmax_host_matches_reference(rng):
    custom = np.sort(rng.uniform(-1, 1, 256)).astype(np.float32)
    custom[0], custom[-1] = -1, 1
    for count in (1, 7, 255, 256, 257, 5000):
        a = np.abs(rng.standard_normal(count) * rng.choice([1e-3, 1, 50])).astype(np.float32)
        a[rng.integers(count)] = 0.0
        off = ref.absmax_mean(a)
        for code in (None, custom):
            q, a2 = host_quantize_absmax(a, off, code)
            rq, ra2 = ref.quantize_absmax(a, off, code)
            assert np.array_equal(q, rq) and np.array_equal(a2.view(np.uint32), ra2.view(np.uint32))
            # decoding
            out = poisoned(count, np.float32)
            offa = np.array([off], np.float32)
            rc = fn("kbit_nf4_dequantize_absmax_host")(
                q.ctypes.data, a2.ctypes.data, code.ctypes.data if code is not None else None,
                offa.ctypes.data, count, out.ctypes.data)
            assert rc == S_OK and np.all(out[4 * count:] == POISON)
            got = out[:4 * count].view(np.float32)
            assert np.array_equal(got.view(np.uint32),
                                  ref.dequantize_absmax(q, a2, off, code).view(np.uint32))
            if code is None:  # 8-bit dynamic codes keep absmax within ~1% of its range
                assert np.max(np.abs(got - a)) <= 0.02 * np.max(np.abs(a - off)) + 1e-7


def host_nested_roundtrip(qt, tag, x, bs):
    """Host quantize, double-quantize the absmax (mean offset), host dequantize.
    Returns (packed, qabsmax, absmax2, offset array, output bytes)."""
    n = x.size
    packed, absmax = host_quantize(qt, tag, x, bs)
    offa = np.array([ref.absmax_mean(absmax)], np.float32)
    q, a2 = host_quantize_absmax(absmax, offa[0])
    out = poisoned(n, NP_DTYPE[tag])
    rc = fn(f"cdequantize_{qt}_dq_{tag}_host")(packed.ctypes.data, q.ctypes.data,
                                               a2.ctypes.data, None, offa.ctypes.data,
                                               n, bs, out.ctypes.data)
    assert rc == S_OK and np.all(out[n * ITEMSIZE[tag]:] == POISON)
    return packed, q, a2, offa, out[:n * ITEMSIZE[tag]]


@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
def test_host_dequantize_dq_matches_reference(rng, qt, tag):
    for bs in (32, 64, 1024):
        for n in (1, 33, 4097, 40_000):
            x = random_input(rng, n, tag)
            packed, q, a2, offa, out = host_nested_roundtrip(qt, tag, x, bs)
            expected = ref.dequantize_4bit_dq(packed, q, a2, offa[0], n, qt, bs, OUT_DTYPE[tag])
            assert np.array_equal(out, bits(expected)), (bs, n)


# ----------------------------------------------------------------------------------
# Bad input: a status, nothing written
# ----------------------------------------------------------------------------------

def _cuda_build():
    # n = 0 is a no-op on a CUDA build and NOT_SUPPORTED on a CPU-only one.
    return fn("cquantize_nf4_fp32")(None, 0, 64, None, None, None) == S_OK


def _expect(gpu):
    if gpu and not _cuda_build():
        return lambda status: S_NOT_SUPPORTED
    return lambda status: status


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
def test_bad_input(qt, tag, gpu):
    expect = _expect(gpu)
    sfx = "" if gpu else "_host"
    extra = (None,) if gpu else ()
    n, bs = 100, 64
    # host buffers: on a CUDA build every check below fails before any device access
    x = np.zeros(n + 8, NP_DTYPE[tag])
    packed, absmax = poisoned(64, np.uint8), poisoned(8, np.float32)
    out = poisoned(n + 8, NP_DTYPE[tag])
    q, a2, off = poisoned(8, np.uint8), poisoned(1, np.float32), np.zeros(2, np.float32)
    xp, pp, ap, op = x.ctypes.data, packed.ctypes.data, absmax.ctypes.data, out.ctypes.data
    quant = fn(f"cquantize_{qt}_{tag}{sfx}")
    deq = fn(f"cdequantize_{qt}_{tag}{sfx}")
    deqdq = fn(f"cdequantize_{qt}_dq_{tag}{sfx}")
    dq = (q.ctypes.data, a2.ctypes.data, None, off.ctypes.data)
    cases = [
        (quant, (xp, -1, bs, ap, pp), S_INVALID),
        (quant, (xp, n, 48, ap, pp), S_INVALID),
        (quant, (xp, n, 16, ap, pp), S_INVALID),
        (quant, (xp, n, 8192, ap, pp), S_INVALID),
        (quant, (xp, n, 0, ap, pp), S_INVALID),
        (quant, (None, n, bs, ap, pp), S_NULL),
        (quant, (xp, n, bs, None, pp), S_NULL),
        (quant, (xp, n, bs, ap, None), S_NULL),
        (quant, (xp + 1, n, bs, ap, pp), S_MISALIGNED),
        (quant, (xp, n, bs, ap + 2, pp), S_MISALIGNED),
        (deq, (pp, ap, -5, bs, op), S_INVALID),
        (deq, (pp, ap, n, 100, op), S_INVALID),
        (deq, (None, ap, n, bs, op), S_NULL),
        (deq, (pp, None, n, bs, op), S_NULL),
        (deq, (pp, ap, n, bs, None), S_NULL),
        (deq, (pp, ap + 1, n, bs, op), S_MISALIGNED),
        (deq, (pp, ap, n, bs, op + 1), S_MISALIGNED),
        (deqdq, (pp, *dq, -1, bs, op), S_INVALID),
        (deqdq, (pp, *dq, n, 31, op), S_INVALID),
        (deqdq, (pp, None, *dq[1:], n, bs, op), S_NULL),
        (deqdq, (pp, dq[0], None, *dq[2:], n, bs, op), S_NULL),
        (deqdq, (pp, *dq[:3], None, n, bs, op), S_NULL),
        (deqdq, (pp, *dq, n, bs, None), S_NULL),
        (deqdq, (pp, dq[0], dq[1] + 2, *dq[2:], n, bs, op), S_MISALIGNED),
        (deqdq, (pp, *dq[:2], op + 2, dq[3], n, bs, op), S_MISALIGNED),
        (deqdq, (pp, *dq[:3], off.ctypes.data + 1, n, bs, op), S_MISALIGNED),
        (deqdq, (pp, *dq, n, bs, op + 1), S_MISALIGNED),
    ]
    if tag == "fp32":
        cases.append((quant, (xp + 2, n, bs, ap, pp), S_MISALIGNED))
        cases.append((deq, (pp, ap, n, bs, op + 2), S_MISALIGNED))
    for f, args, status in cases:
        assert f(*args, *extra) == expect(status), (f.__name__, args, status)
        if expect(status) != S_NOT_SUPPORTED:
            assert _lib.lib().kbit_last_error_message()
    assert np.all(packed == POISON) and np.all(absmax == POISON) and np.all(out == POISON)
    # n = 0 is a valid no-op, even with null pointers
    assert quant(None, 0, bs, None, None, *extra) == expect(S_OK)
    assert deq(None, None, 0, bs, None, *extra) == expect(S_OK)
    assert deqdq(None, None, None, None, None, 0, bs, None, *extra) == expect(S_OK)
    assert quant(None, 0, 3, None, None, *extra) == expect(S_INVALID)  # blocksize still checked


@pytest.mark.parametrize("gpu", [False, True])
def test_bad_input_absmax_helpers(gpu):
    expect = _expect(gpu)
    sfx = "" if gpu else "_host"
    extra = (None,) if gpu else ()
    a = np.ones(300, np.float32)
    q, a2, res = poisoned(300, np.uint8), poisoned(2, np.float32), poisoned(300, np.float32)
    off = np.zeros(2, np.float32)
    ap, qp, a2p, rp, op = a.ctypes.data, q.ctypes.data, a2.ctypes.data, res.ctypes.data, off.ctypes.data
    mean = fn("kbit_nf4_absmax_mean" + sfx)
    qa = fn("kbit_nf4_quantize_absmax" + sfx)
    da = fn("kbit_nf4_dequantize_absmax" + sfx)
    cases = [
        (mean, (ap, -1, rp), S_INVALID), (mean, (None, 5, rp), S_NULL),
        (mean, (ap, 5, None), S_NULL), (mean, (ap + 1, 5, rp), S_MISALIGNED),
        (mean, (ap, 5, rp + 2), S_MISALIGNED),
        (qa, (ap, -1, None, op, qp, a2p), S_INVALID), (qa, (None, 5, None, op, qp, a2p), S_NULL),
        (qa, (ap, 5, None, None, qp, a2p), S_NULL), (qa, (ap, 5, None, op, None, a2p), S_NULL),
        (qa, (ap, 5, None, op, qp, None), S_NULL), (qa, (ap, 5, ap + 1, op, qp, a2p), S_MISALIGNED),
        (qa, (ap, 5, None, op, qp, a2p + 1), S_MISALIGNED),
        (da, (qp, a2p, None, op, -2, rp), S_INVALID), (da, (None, a2p, None, op, 5, rp), S_NULL),
        (da, (qp, None, None, op, 5, rp), S_NULL), (da, (qp, a2p, None, None, 5, rp), S_NULL),
        (da, (qp, a2p, None, op, 5, None), S_NULL), (da, (qp, a2p, None, op + 3, 5, rp), S_MISALIGNED),
        (da, (qp, a2p, None, op, 5, rp + 1), S_MISALIGNED),
    ]
    for f, args, status in cases:
        assert f(*args, *extra) == expect(status), (f.__name__, args, status)
    assert np.all(q == POISON) and np.all(a2 == POISON) and np.all(res == POISON)
    assert mean(None, 0, None, *extra) == expect(S_OK)
    assert qa(None, 0, None, None, None, None, *extra) == expect(S_OK)
    assert da(None, None, None, None, 0, None, *extra) == expect(S_OK)
    if not gpu:
        assert fn("kbit_nf4_dynamic_map_host")(None) == S_NULL
        assert fn("kbit_nf4_dynamic_map_host")(a.ctypes.data + 2) == S_MISALIGNED


def test_size_helpers():
    assert [fn("kbit_nf4_packed_bytes")(n) for n in (0, 1, 2, 3, -1)] == [0, 1, 1, 2, -1]
    assert fn("kbit_nf4_packed_bytes")(2 ** 40 + 1) == 2 ** 39 + 1
    f = fn("kbit_nf4_absmax_count")
    assert [f(100, 64), f(64, 64), f(0, 64), f(1, 4096), f(-1, 64), f(100, 96), f(100, 8192)] \
        == [2, 1, 0, 1, -1, -1, -1]
    g = fn("kbit_nf4_absmax2_count")
    assert [g(0), g(1), g(256), g(257), g(-3)] == [0, 1, 1, 2, -1]


# ----------------------------------------------------------------------------------
# Python API
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("qt", QTYPES)
def test_python_api_host(rng, qt):
    x = (rng.standard_normal((37, 29)) * 2).astype(np.float16)
    q = kbit.quantize_4bit(x, qt, blocksize=128)
    rp, ra = ref.quantize_4bit(x, qt, 128)
    assert q.shape == (37, 29) and q.dtype == "float16" and not q.nested and not q.on_device
    assert np.array_equal(q.packed, rp) and np.array_equal(q.absmax, ra)
    y = kbit.dequantize_4bit(q)
    assert y.shape == x.shape and y.dtype == np.float16
    assert np.array_equal(bits(y), bits(ref.dequantize_4bit(rp, ra, x.size, qt, 128, np.float16)))
    y32 = kbit.dequantize_4bit(q, dtype="float32")
    assert y32.dtype == np.float32
    # nested (compress_statistics)
    qn = (kbit.quantize_nf4 if qt == "nf4" else kbit.quantize_fp4)(x, 64, compress_statistics=True)
    assert qn.nested and qn.absmax.dtype == np.uint8 and qn.absmax2.size == 1
    pk, am = ref.quantize_4bit(x, qt, 64)
    off = ref.absmax_mean(am)
    rq, ra2 = ref.quantize_absmax(am, off)
    assert qn.offset[0] == off and np.array_equal(qn.absmax, rq) and np.array_equal(qn.absmax2, ra2)
    yn = (kbit.dequantize_nf4 if qt == "nf4" else kbit.dequantize_fp4)(qn)
    assert np.array_equal(bits(yn), bits(ref.dequantize_4bit_dq(pk, rq, ra2, off, x.size, qt, 64,
                                                                 np.float16)))
    assert qn.bits_per_element < q.bits_per_element
    # bfloat16 on the host: uint16 bits
    xb = ref.cast_output(x.astype(np.float32), "bfloat16")
    qb = kbit.quantize_4bit(xb, qt, 64, dtype="bfloat16")
    assert qb.dtype == "bfloat16" and np.array_equal(qb.packed, ref.quantize_4bit(xb, qt, 64)[0])
    assert kbit.dequantize_4bit(qb).dtype == np.uint16


def test_python_api_errors(rng):
    x = rng.standard_normal(100).astype(np.float32)
    with pytest.raises(kbit.KbitError):
        kbit.quantize_nf4(x, blocksize=48)
    with pytest.raises(kbit.KbitError):
        kbit.quantize_4bit(x, "int4")
    with pytest.raises(kbit.KbitError):
        kbit.quantize_nf4(x.astype(np.float64).astype(np.int32))
    q = kbit.quantize_nf4(x)
    with pytest.raises(kbit.KbitError):
        kbit.dequantize_fp4(q)
    short = bnb4.Quantized4bit(q.packed[:10], q.absmax, q.shape, q.dtype, 64, "nf4")
    with pytest.raises(kbit.KbitError, match="packed"):
        kbit.dequantize_4bit(short)
    with pytest.raises(kbit.KbitError):
        kbit.dequantize_4bit(q, out=np.empty(99, np.float32))


def test_from_bnb_state(rng):
    """A bitsandbytes-like QuantState (duck-typed) loads as it is, nested or not."""
    x = (rng.standard_normal(3000) * 0.05).astype(np.float32)
    pk, am = ref.quantize_4bit(x, "nf4", 64)
    plain = SimpleNamespace(absmax=am, shape=(3000,), dtype="float32", blocksize=64,
                            quant_type="nf4", nested=False, offset=None, state2=None)
    q = bnb4.Quantized4bit.from_bnb(pk.reshape(-1, 1), plain)
    assert np.array_equal(kbit.dequantize_4bit(q), ref.dequantize_4bit(pk, am, 3000, "nf4", 64))
    off = np.float32(am.mean())  # bitsandbytes' own offset, whatever its rounding
    rq, ra2 = ref.quantize_absmax(am, off)
    code = ref.create_dynamic_map()
    nested = SimpleNamespace(absmax=rq, shape=(3000,), dtype=np.float32, blocksize=64,
                             quant_type="nf4", nested=True, offset=np.array(off),
                             state2=SimpleNamespace(absmax=ra2, code=code, blocksize=256))
    qn = bnb4.Quantized4bit.from_bnb(pk, nested)
    assert qn.nested
    assert np.array_equal(kbit.dequantize_4bit(qn),
                          ref.dequantize_4bit_dq(pk, rq, ra2, off, 3000, "nf4", 64))


# ----------------------------------------------------------------------------------
# GPU: the same bytes as the CPU
# ----------------------------------------------------------------------------------

def _torch():
    import torch
    return torch


def _dev_bytes(t):
    return t.cpu().contiguous().view(_torch().uint8).numpy().reshape(-1)


def _gpu_input(x_np, tag, misalign=False):
    """A device copy of the C input array (bf16 as torch.bfloat16), optionally at an
    address that is not 16-byte aligned (a one-element offset into a larger tensor)."""
    torch = _torch()
    raw = torch.from_numpy(np.ascontiguousarray(x_np).view(np.uint8).copy())
    if tag == "bf16":
        t = raw.view(torch.bfloat16)
    else:
        t = raw.view(torch.float16 if tag == "fp16" else torch.float32)
    if misalign:
        big = torch.empty(t.numel() + 1, dtype=t.dtype)
        big[1:] = t
        return big.cuda()[1:]
    return t.cuda()


def _gpu_out(nbytes, misalign=0):
    torch = _torch()
    buf = torch.full((nbytes + misalign + GUARD,), POISON, dtype=torch.uint8, device="cuda")
    return buf, buf[misalign:].data_ptr()


def _check_guard(buf, used, misalign=0):
    b = _dev_bytes(buf)
    assert np.all(b[:misalign] == POISON) and np.all(b[misalign + used:] == POISON)
    return b[misalign:misalign + used]


def gpu_quantize(qt, tag, x_np, bs, misalign_in=False, misalign_out=0):
    torch = _torch()
    n = x_np.size
    nb, npk = -(-n // bs), (n + 1) // 2
    xin = _gpu_input(x_np, tag, misalign_in)
    pbuf, pptr = _gpu_out(npk, misalign_out)
    abuf, aptr = _gpu_out(4 * nb)
    rc = fn(f"cquantize_{qt}_{tag}")(xin.data_ptr(), n, bs, aptr, pptr, None)
    assert rc == S_OK, _lib.lib().kbit_last_error_message()
    torch.cuda.synchronize()
    return (_check_guard(pbuf, npk, misalign_out).copy(),
            _check_guard(abuf, 4 * nb).view(np.float32).copy())


def gpu_dequantize(qt, tag, packed, absmax, n, bs, misalign_in=0, misalign_out=0):
    torch = _torch()
    pk = torch.zeros(packed.size + misalign_in, dtype=torch.uint8)
    pk[misalign_in:] = torch.from_numpy(packed)
    pk = pk.cuda()
    am = torch.from_numpy(absmax).cuda()
    obuf, optr = _gpu_out(n * ITEMSIZE[tag], misalign_out)
    rc = fn(f"cdequantize_{qt}_{tag}")(pk.data_ptr() + misalign_in, am.data_ptr(), n, bs, optr, None)
    assert rc == S_OK, _lib.lib().kbit_last_error_message()
    torch.cuda.synchronize()
    return _check_guard(obuf, n * ITEMSIZE[tag], misalign_out).copy()


@requires_gpu
@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
def test_gpu_quantize_matches_host(rng, qt, tag):
    for bs in BLOCKSIZES:
        for n in SIZES + (3 * 4096 + 15, 100_003):
            x = random_input(rng, n, tag, specials=(n % 3 == 0))
            hp, ha = host_quantize(qt, tag, x, bs)
            for mi, mo in ((False, 0), (True, 1), (False, 3)):
                gp, ga = gpu_quantize(qt, tag, x, bs, mi, mo)
                assert np.array_equal(gp, hp), (bs, n, mi, mo)
                assert np.array_equal(ga.view(np.uint32), ha.view(np.uint32)), (bs, n, mi, mo)


@requires_gpu
@pytest.mark.parametrize("tag", TAGS)
def test_gpu_quantize_special_blocks(tag):
    # Zero, all-NaN, inf, partial-NaN and subnormal-only blocks (subnormal in the input
    # type: fp16 ones are normal floats, bf16 ones are float subnormals), in every input
    # type: the 16-bit kernels take the block maximum on packed 16-bit pairs.
    sub = {"fp32": 1e-42, "fp16": 3e-6, "bf16": 1e-39}[tag]
    x = np.concatenate([np.zeros(64, np.float32), np.full(4096, np.nan, np.float32),
                        np.full(100, np.inf, np.float32), np.full(4096, sub, np.float32),
                        np.full(77, np.nan, np.float32)])
    x[4200] = 1e-42
    x[4300:8300:7] *= -0.5  # mixed-sign subnormals
    x[8300] = -np.inf
    xin = to_input(x, tag)
    for qt in QTYPES:
        for bs in (32, 64, 4096):
            hp, ha = host_quantize(qt, tag, xin, bs)
            gp, ga = gpu_quantize(qt, tag, xin, bs)
            assert np.array_equal(gp, hp) and np.array_equal(ga.view(np.uint32), ha.view(np.uint32))


@requires_gpu
@pytest.mark.parametrize("tag", TAGS)
@pytest.mark.parametrize("qt", QTYPES)
def test_gpu_dequantize_matches_host(rng, qt, tag):
    for bs in (32, 64, 256, 4096):
        for n in SIZES + (100_003,):
            nb = -(-n // bs)
            packed = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
            absmax = (rng.standard_normal(nb) * 10).astype(np.float32)
            absmax[rng.integers(nb)] = rng.choice([np.nan, np.inf, -np.inf, 1e-41, 0.0, 7e4])
            expected = bits(host_dequantize(qt, tag, packed, absmax, n, bs))
            for mi, mo in ((0, 0), (1, 0), (0, ITEMSIZE[tag]), (3, 2 * ITEMSIZE[tag])):
                got = gpu_dequantize(qt, tag, packed, absmax, n, bs, mi, mo)
                assert np.array_equal(got, expected), (bs, n, mi, mo)


@requires_gpu
def test_gpu_double_quantization_matches_host(rng):
    torch = _torch()
    for count in (1, 255, 257, 70_001):
        a = np.abs(rng.standard_normal(count) * 3).astype(np.float32)
        ad = torch.from_numpy(a).cuda()
        mean = torch.full((2,), float("nan"), device="cuda")
        assert fn("kbit_nf4_absmax_mean")(ad.data_ptr(), count, mean.data_ptr(), None) == S_OK
        m = mean.cpu().numpy()
        assert m[0] == ref.absmax_mean(a) and np.isnan(m[1])
        hq, ha2 = host_quantize_absmax(a, m[0])
        q = torch.full((count,), POISON, dtype=torch.uint8, device="cuda")
        a2 = torch.full((-(-count // 256),), float("nan"), device="cuda")
        assert fn("kbit_nf4_quantize_absmax")(ad.data_ptr(), count, None, mean.data_ptr(),
                                              q.data_ptr(), a2.data_ptr(), None) == S_OK
        assert np.array_equal(q.cpu().numpy(), hq)
        assert np.array_equal(a2.cpu().numpy().view(np.uint32), ha2.view(np.uint32))
        back = torch.full((count,), float("nan"), device="cuda")
        code = torch.from_numpy(bnb4.dynamic_map()).cuda()
        assert fn("kbit_nf4_dequantize_absmax")(q.data_ptr(), a2.data_ptr(), code.data_ptr(),
                                                mean.data_ptr(), count, back.data_ptr(), None) == S_OK
        assert np.array_equal(back.cpu().numpy().view(np.uint32),
                              ref.dequantize_absmax(hq, ha2, m[0]).view(np.uint32))
    for qt in QTYPES:
        for tag in TAGS:
            n, bs = 70_001, 64
            x = random_input(rng, n, tag)
            pk, hq, ha2, offa, hout = host_nested_roundtrip(qt, tag, x, bs)
            tensors = [torch.from_numpy(v).cuda() for v in (pk, hq, ha2, offa)]
            obuf, optr = _gpu_out(n * ITEMSIZE[tag])
            assert fn(f"cdequantize_{qt}_dq_{tag}")(*(t.data_ptr() for t in tensors[:3]), None,
                                                    tensors[3].data_ptr(), n, bs, optr, None) == S_OK
            assert np.array_equal(_check_guard(obuf, n * ITEMSIZE[tag]), hout)


@requires_gpu
@pytest.mark.parametrize("qt", QTYPES)
def test_gpu_python_api(rng, qt):
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))  # replayable
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        x = torch.randn(333, 77, dtype=dt, device="cuda", generator=gen)
        q = kbit.quantize_4bit(x, qt, 64, compress_statistics=True)
        assert q.on_device and q.packed.is_cuda and q.nested
        host_in = x.cpu().view(torch.int16).numpy().view(np.uint16) if dt == torch.bfloat16 \
            else x.cpu().numpy()
        qh = kbit.quantize_4bit(host_in, qt, 64, compress_statistics=True,
                                dtype="bfloat16" if dt == torch.bfloat16 else None)
        for f in ("packed", "absmax", "absmax2", "offset"):
            assert np.array_equal(bits(getattr(q, f).cpu().numpy()), bits(getattr(qh, f))), f
        y = kbit.dequantize_4bit(q)
        assert y.is_cuda and y.dtype == dt and tuple(y.shape) == (333, 77)
        yh = kbit.dequantize_4bit(qh)
        assert np.array_equal(bits(y.cpu().view(torch.uint8).numpy()), bits(yh))


@requires_gpu
@pytest.mark.parametrize("tag", ("fp16", "fp32"))
def test_gpu_quantize_large_matches_host(rng, tag):
    # Large enough that the quantizer launches several waves of CTAs, each looping over
    # several tiles (on an H100, 3 waves for fp16 and 6 for fp32), with a partial tile
    # at the end: every byte must still be the host's.
    n = 2 ** 25 + 3 * 4096 + 7
    for qt, bs in (("nf4", 64), ("fp4", 4096)):
        x = random_input(rng, n, tag)
        hp, ha = host_quantize(qt, tag, x, bs)
        gp, ga = gpu_quantize(qt, tag, x, bs)
        assert np.array_equal(gp, hp), (qt, bs)
        assert np.array_equal(ga.view(np.uint32), ha.view(np.uint32)), (qt, bs)


@requires_gpu
def test_gpu_more_than_2_31_elements(rng):
    torch = _torch()
    free, _ = torch.cuda.mem_get_info()
    n = 2 ** 31 + 77
    if free < 14 * 2 ** 30:
        pytest.skip("needs 14 GiB of free GPU memory")
    gen = torch.Generator(device="cuda").manual_seed(int(rng.integers(1 << 62)))  # replayable
    x = torch.randn(n, dtype=torch.float16, device="cuda", generator=gen)
    packed = torch.empty((n + 1) // 2, dtype=torch.uint8, device="cuda")
    absmax = torch.empty(-(-n // 64), dtype=torch.float32, device="cuda")
    assert fn("cquantize_nf4_fp16")(x.data_ptr(), n, 64, absmax.data_ptr(), packed.data_ptr(),
                                    None) == S_OK
    tail = 64 * 1000 + 77  # the last blocks, past 2^31 (whole blocks from a block boundary)
    xt = x[n - tail:].cpu().numpy()
    hp, ha = host_quantize("nf4", "fp16", xt, 64)
    assert np.array_equal(packed[-(tail + 1) // 2:].cpu().numpy(), hp)
    assert np.array_equal(absmax[-len(ha):].cpu().numpy(), ha)
    del x
    out = torch.empty(n, dtype=torch.float16, device="cuda")
    assert fn("cdequantize_nf4_fp16")(packed.data_ptr(), absmax.data_ptr(), n, 64,
                                      out.data_ptr(), None) == S_OK
    hout = host_dequantize("nf4", "fp16", hp, ha, tail, 64)
    assert np.array_equal(out[n - tail:].cpu().numpy().view(np.uint16), hout.view(np.uint16))


# ----------------------------------------------------------------------------------
# bitsandbytes itself (only where it is installed with a GPU)
# ----------------------------------------------------------------------------------

def dq_codes_within_an_ulp(absmax, offset, absmax2, got):
    """Whether the 8-bit codes got (second-level, of absmax - offset) are, in each block
    of 256, what one reciprocal of its absmax2 gives: the reference's or a float32
    neighbour of it (the hardware's rcp.approx of a general float may be an ulp away)."""
    code = ref.create_dynamic_map()
    v = (np.asarray(absmax, np.float32) - np.float32(offset)).astype(np.float32)
    blk = np.arange(v.size) // 256
    r = ref.bnb_rcp(np.asarray(absmax2, np.float32))
    ok = np.zeros(r.size, dtype=bool)
    for rr in (r, np.nextafter(r, np.float32(0)), np.nextafter(r, np.float32(np.inf))):
        wrong = ref.encode_dynamic(ref.bnb_mul(v, rr[blk]), code) != np.asarray(got)
        ok |= np.bincount(blk, weights=wrong, minlength=r.size) == 0
    return bool(ok.all())


def _bnb():
    if GPU_SKIP_REASON is not None:
        pytest.skip(GPU_SKIP_REASON)
    try:
        import bitsandbytes.functional as F
    except Exception as e:  # not installed, or no usable binary
        pytest.skip(f"bitsandbytes not usable: {e}")
    return F


@pytest.mark.parametrize("qt", QTYPES)
def test_bitsandbytes_bytes(qt):
    """The bytes of bitsandbytes' quantize_4bit: exactly for fp16/bf16 input; for fp32
    input kbit's reciprocal of a general absmax is the correctly rounded one, so a code
    may differ where x / absmax lies within an ulp of a threshold (rare)."""
    F = _bnb()
    torch = _torch()
    torch.manual_seed(int(np.random.default_rng().integers(2 ** 31)))
    fp32_diff = fp32_total = 0
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        for bs in BLOCKSIZES:
            for shape in ((1,), (33,), (4097,), (257, 1000), (3, 4096 + 7)):
                x = torch.randn(shape, dtype=dt, device="cuda") * 3
                x.view(-1)[::97] = 0
                pk, st = F.quantize_4bit(x, blocksize=bs, quant_type=qt)
                q = kbit.quantize_4bit(x, qt, bs)
                assert torch.equal(q.absmax.view(torch.int32), st.absmax.view(torch.int32))
                diff = int((q.packed != pk.view(-1)).sum())
                if dt == torch.float32:
                    fp32_diff, fp32_total = fp32_diff + diff, fp32_total + pk.numel()
                else:
                    assert diff == 0, (dt, bs, shape, diff)
                ours = kbit.dequantize_4bit(bnb4.Quantized4bit.from_bnb(pk, st))
                theirs = F.dequantize_4bit(pk, st)
                assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)), (dt, bs, shape)
    assert fp32_diff <= 1e-5 * fp32_total, (fp32_diff, fp32_total)
    assert np.array_equal(F.create_dynamic_map().numpy().view(np.uint32),
                          bnb4.dynamic_map().view(np.uint32))


@pytest.mark.parametrize("qt", QTYPES)
def test_bitsandbytes_nested(qt):
    F = _bnb()
    torch = _torch()
    for dt in (torch.float16, torch.bfloat16):
        for bs in (32, 64, 256):
            x = torch.randn(1000, 777, dtype=dt, device="cuda")
            pk, st = F.quantize_4bit(x, blocksize=bs, quant_type=qt, compress_statistics=True)
            # loading: their nested state as it is
            ours = kbit.dequantize_4bit(bnb4.Quantized4bit.from_bnb(pk, st))
            assert torch.equal(ours.view(torch.uint8), F.dequantize_4bit(pk, st).view(torch.uint8))
            # writing: the same second-level bytes from the same offset
            _, plain = F.quantize_4bit(x, blocksize=bs, quant_type=qt)
            count = plain.absmax.numel()
            off = st.offset.reshape(1).float().contiguous()
            qa = torch.empty(count, dtype=torch.uint8, device="cuda")
            a2 = torch.empty(-(-count // 256), dtype=torch.float32, device="cuda")
            assert fn("kbit_nf4_quantize_absmax")(plain.absmax.data_ptr(), count, None,
                                                  off.data_ptr(), qa.data_ptr(), a2.data_ptr(),
                                                  None) == S_OK
            assert torch.equal(a2, st.state2.absmax)
            # absmax2 is a general float: the hardware's reciprocal of it may be an ulp
            # off ours, which moves codes next to a decision point, several at once where
            # block maxima repeat (a limit on the count of differing codes can be exceeded
            # by chance). kbit's codes are the reference's; bitsandbytes' are those of
            # one reciprocal within an ulp, block by block.
            a_np, off_np = plain.absmax.cpu().numpy(), off.cpu().numpy()[0]
            assert np.array_equal(qa.cpu().numpy(), ref.quantize_absmax(a_np, off_np)[0])
            assert dq_codes_within_an_ulp(a_np, off_np, a2.cpu().numpy(), st.absmax.cpu().numpy())
