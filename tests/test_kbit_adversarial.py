"""The kbit format (SPEC section 1) under adversarial input: the CPU library and the numpy
reference against an independent float64 reading of the SPEC, written here from the SPEC
text alone (codebook from statistics.NormalDist, E4M4 from its formula, codes unpacked
bit by bit, nearest entries by brute force). Special values at every position of a
block, partial blocks, degenerate and hostile codebooks, tensor scales of every size,
output rounding, and the round-trip error bound of every finite block."""
import ctypes
import itertools
from statistics import NormalDist

import numpy as np
import pytest

import kbit
from kbit import reference as R
from kbit._lib import call, function

KS = (2, 3, 4, 5)
FORMATS = ("fp32", "fp16", "e4m4")
DTYPES = ("float32", "float16", "bfloat16")
FMT_ID = {"fp32": 0, "fp16": 1, "e4m4": 2}
DT_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
ABSMAX_NP = {"fp32": np.float32, "fp16": np.float16, "e4m4": np.uint8}
OUT_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
LIMIT = {"fp32": float(np.finfo(np.float32).max), "fp16": 65504.0, "e4m4": 31.0}
FLT_MAX = np.finfo(np.float32).max
RANGE = 4
SPECIALS = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 1e-40,
                     1.1754942e-38, 2.0 ** -126, 2.0 ** -24, 2.0 ** -14, 0.5, 1.0, -1.0, 31.0,
                     65504.0, 1e30, FLT_MAX, -FLT_MAX], dtype=np.float32)


# ---------------------------------------------------------------------------------
# The SPEC, independently (float64, from the text of section 1)
# ---------------------------------------------------------------------------------

def spec_codebook(k):
    """Quantiles of N(0,1) at (i + 0.5) / 2^K divided by the largest |value|, ascending."""
    m = 1 << k
    q = [NormalDist().inv_cdf((i + 0.5) / m) for i in range(m)]
    top = max(abs(v) for v in q)
    return np.array(sorted(v / top for v in q), dtype=np.float32)


def spec_e4m4(codes):
    """e > 0: 2^(e-11) * (1 + m/16); e = 0: 2^-10 * (m/16), in float64."""
    out = []
    for c in np.asarray(codes, dtype=np.int64).reshape(-1):
        e, m = int(c) >> 4, int(c) & 15
        out.append(2.0 ** (e - 11) * (1 + m / 16) if e else 2.0 ** -10 * (m / 16))
    return np.array(out, dtype=np.float64)


def spec_codes(packed, k, n):
    """(n_blocks, 32) codes: bit i of word b*K + j is bit j of element i's code."""
    nb = (n + 31) // 32
    words = [int(w) for w in np.asarray(packed, dtype=np.uint32)]
    codes = np.zeros((nb, 32), dtype=np.int64)
    for b in range(nb):
        for i in range(32):
            codes[b, i] = sum(((words[b * k + j] >> i) & 1) << j for j in range(k))
    return codes


def spec_scale(absmax, fmt, ts):
    """d_b = decode(absmax[b]) * tensor_scale, the float32 product, as float64."""
    dec = spec_e4m4(absmax) if fmt == "e4m4" else np.asarray(absmax).astype(np.float64)
    with np.errstate(all="ignore"):
        return (dec * np.float64(np.float32(ts))).astype(np.float32).astype(np.float64)


def spec_dequantize(codes, d, cb, n):
    """out = float(codebook[c]) * d in float32: the exact product, rounded once, with d
    held at FLT_MAX (a scale past it would make a finite block infinite)."""
    d = np.where(np.isinf(d), FLT_MAX, d)
    with np.errstate(all="ignore"):
        out = (cb.astype(np.float64)[codes] * d[:, None]).astype(np.float32)
    return out.reshape(-1)[:n]


def bf16_round(f32):
    """float32 -> bfloat16 bits, round to nearest even, NaN -> some NaN (integer method)."""
    b = np.asarray(f32, dtype=np.float32).view(np.uint32).astype(np.int64)
    top, rest = b >> 16, b & 0xFFFF
    up = (rest > 0x8000) | ((rest == 0x8000) & (top & 1 == 1))
    out = (top + up).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(0x7FC0), out)


def as_f64(x, dtype):
    if dtype == "bfloat16":
        return (np.asarray(x).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(x).astype(np.float64).reshape(-1)


def to_dtype(x32, dtype):
    with np.errstate(over="ignore"):
        if dtype == "bfloat16":
            return R.kbit.float32_to_bf16_bits(x32)
        return x32.astype(dtype)


def same_float_bits(a, b):
    """Bitwise equal float32 arrays, any NaN equal to any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32),
                                                               b[~nan].view(np.uint32))


# ---------------------------------------------------------------------------------
# Library calls with poisoned outputs
# ---------------------------------------------------------------------------------

def lib_quantize(x, k, fmt, dtype, cb=None, ts=1.0):
    n = x.size
    nb = (n + 31) // 32
    packed = np.full(max(nb * k, 1), 0xDEADBEEF, dtype=np.uint32)
    absmax = np.zeros(max(nb, 1), dtype=ABSMAX_NP[fmt])
    absmax.view(np.uint8)[:] = 0x5A
    cbp = None if cb is None else np.ascontiguousarray(cb, dtype=np.float32)
    status = function("kbit_quantize_host")(
        x.ctypes.data, n, DT_ID[dtype], k, None if cbp is None else cbp.ctypes.data,
        FMT_ID[fmt], ctypes.c_float(ts), absmax.ctypes.data, packed.ctypes.data)
    return status, packed[:nb * k], absmax[:nb]


def lib_dequantize(packed, absmax, k, n, fmt, dtype, cb=None, ts=1.0):
    out = np.zeros(n + 1, dtype=OUT_NP[dtype])
    out.view(np.uint8)[:] = 0x7B
    cbp = None if cb is None else np.ascontiguousarray(cb, dtype=np.float32)
    call("kbit_dequantize_host", packed.ctypes.data, absmax.ctypes.data, FMT_ID[fmt],
         ctypes.c_float(ts), None if cbp is None else cbp.ctypes.data, k, n, DT_ID[dtype],
         out.ctypes.data)
    assert np.all(out[n:].view(np.uint8) == 0x7B), "wrote past n"
    return out[:n]


def as_float32(out, dtype):
    if dtype == "bfloat16":
        return R.kbit.bf16_bits_to_float32(out)
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------
# The checks every case goes through
# ---------------------------------------------------------------------------------

def check_nearest(x64, codes, d, cb, valid, blocks):
    """Every valid element of `blocks` has the entry nearest to x / d (to within float32
    rounding of x / d and of the midpoints), and among equal entries the lowest index."""
    cb64 = cb.astype(np.float64)
    first = np.array([np.flatnonzero(cb == cb[c])[0] for c in range(cb.size)])
    for b in np.flatnonzero(blocks):
        v = x64[b, :valid[b]] / d[b] if d[b] > 0 else np.zeros(valid[b])
        c = codes[b, :valid[b]]
        dist = np.abs(v[:, None] - cb64[None, :])
        # float32 rounding of x / d and of the midpoints (an ulp of a subnormal entry too)
        tol = 2.0 ** -20 * np.maximum(np.abs(v), np.abs(cb64).max()) + 2.0 ** -148
        far = dist[np.arange(v.size), c] > dist.min(axis=1) + tol
        assert not far.any(), (b, np.flatnonzero(far), v[far], c[far], d[b])
        assert np.array_equal(first[c], c), (b, "a duplicate entry other than the lowest index")


def check_case(x, k, fmt, dtype, cb=None, ts=1.0):
    """Library against reference byte for byte, and both against the SPEC as read here.
    Returns (packed, absmax, codes, d, x as float64 blocks)."""
    n = x.size
    nb = (n + 31) // 32
    cbv = spec_codebook(k) if cb is None else np.asarray(cb, dtype=np.float32)
    status, packed, absmax = lib_quantize(x, k, fmt, dtype, cb, ts)
    assert status in (0, RANGE), kbit._lib.lib().kbit_last_error_message()
    rp, ra = R.quantize_kbit(x, k, codebook=cb, absmax_format=fmt, tensor_scale=ts,
                             strict=False)
    assert np.array_equal(packed, rp), "packed: library != reference"
    assert np.array_equal(absmax.view(np.uint8), ra.view(np.uint8)), "absmax: library != reference"

    codes = spec_codes(packed, k, n)
    valid = np.minimum(32, n - 32 * np.arange(nb))
    assert all(np.all(codes[b, valid[b]:] == 0) for b in range(nb)), "codes past n are not 0"
    x64 = np.zeros(nb * 32)
    x64[:n] = as_f64(x, dtype)
    x64 = x64.reshape(nb, 32)
    live = np.arange(32)[None, :] < valid[:, None]
    finite = np.all(np.isfinite(x64) | ~live, axis=1)
    with np.errstate(all="ignore"):
        amax = np.where(live, np.abs(x64), 0).max(axis=1)
        a_s = (amax.astype(np.float32) / np.float32(ts)).astype(np.float64)
    over = finite & (a_s > LIMIT[fmt])
    over |= ~finite if fmt == "e4m4" else False
    assert (status == RANGE) == bool(over.any()), (status, np.flatnonzero(over))

    d = spec_scale(absmax, fmt, ts)
    dec = spec_e4m4(absmax) if fmt == "e4m4" else absmax.astype(np.float64)
    if fmt != "e4m4":  # non-finite blocks store NaN
        assert np.all(np.isnan(dec[~finite]))
    ok = finite & ~over
    if fmt == "fp32":
        assert np.array_equal(dec[ok], a_s[ok])
    elif fmt == "fp16":  # the smallest half >= a_s
        half = a_s[ok].astype(np.float16)
        with np.errstate(over="ignore"):
            h = np.where(half < a_s[ok], np.nextafter(half, np.float16(np.inf)), half)
        h = h.astype(np.float64)
        assert np.array_equal(dec[ok], h)
    else:  # 0 for a zero block, else one of the candidates around the smallest code >= a_s
        table = spec_e4m4(np.arange(256))
        c0 = np.searchsorted(table, a_s[ok], side="left")
        c = absmax[ok].astype(np.int64)
        assert np.all(np.where(c0 == 0, c == 0, (c >= np.maximum(c0 - 2, 1)) & (c <= c0 + 1)))
    # Scales below 2^-126 have their own test below.
    check_nearest(x64, codes, d, cbv, valid, ok & (d >= 2.0 ** -126) & np.isfinite(d))

    expect = spec_dequantize(codes, d, cbv, n)
    for odt in DTYPES:
        out = lib_dequantize(packed, absmax, k, n, fmt, odt, cb, ts)
        ref = R.dequantize_kbit(packed, absmax, k, n, codebook=cb, absmax_format=fmt,
                                tensor_scale=ts, dtype=odt)
        if odt == "float32":
            want = expect
        elif odt == "float16":
            with np.errstate(over="ignore"):
                want = expect.astype(np.float16).astype(np.float32)
        else:
            want = R.kbit.bf16_bits_to_float32(bf16_round(expect))
        assert same_float_bits(as_float32(out, odt), want), f"dequantize to {odt}"
        assert same_float_bits(as_float32(ref, odt), want), f"reference dequantize to {odt}"
    out = expect.reshape(-1)
    blocks_out = np.zeros(nb * 32, np.float32)
    blocks_out[:n] = out
    blocks_out = blocks_out.reshape(nb, 32)
    zero = finite & (amax == 0)
    assert np.all(blocks_out[zero] == 0), "zero blocks dequantize to zeros"
    if fmt != "e4m4":
        assert np.all(np.isnan(blocks_out[~finite][live[~finite]])), "non-finite block -> NaN"
    # Entries within [-1, 1] keep finite blocks finite. (A scale that overflows at the
    # chosen tensor_scale has its own test below.)
    if np.abs(cbv).max() <= 1:
        assert np.all(np.isfinite(blocks_out[finite & ~over & np.isfinite(d)])), "finite block"
    return packed, absmax, codes, d, x64


# ---------------------------------------------------------------------------------
# Codebook and E4M4 against the SPEC's formulas
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", KS)
def test_default_codebook_is_the_spec_quantiles_bit_for_bit(k):
    want = spec_codebook(k)
    assert np.array_equal(kbit.default_codebook(k), want)
    assert np.array_equal(R.create_normal_float_codebook(k), want)


def test_every_e4m4_code_decodes_as_the_formula_through_dequantize():
    # Codebook entry 0 is 1.0 and every code is 0: out = decode(code) * tensor_scale.
    codes = np.arange(256, dtype=np.uint8)
    n = 256 * 32
    packed = np.zeros(256 * 2, dtype=np.uint32)
    cb = np.array([1.0, 0.5, -0.5, -1.0], np.float32)
    for ts in (1.0, 2.0 ** -20, 3.0, 1e30):
        out = lib_dequantize(packed, codes, 2, n, "e4m4", "float32", cb, ts)
        want = spec_scale(codes, "e4m4", ts).astype(np.float32)
        assert np.array_equal(out[::32], want)
        assert np.array_equal(R.dequantize_kbit(packed, codes, 2, n, cb, "e4m4", ts)[::32], want)
    assert spec_e4m4([0, 1, 16, 255]).tolist() == [0.0, 2.0 ** -14, 2.0 ** -10, 31.0]


# ---------------------------------------------------------------------------------
# Special values, partial blocks, degenerate blocks
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,dtype", list(itertools.product(FORMATS, DTYPES)))
def test_special_value_at_every_position(rng, fmt, dtype):
    # One block per (special value, position), the rest of each block normal data.
    blocks = rng.standard_normal((SPECIALS.size, 32, 32)).astype(np.float32)
    for s, v in enumerate(SPECIALS):
        blocks[s, np.arange(32), np.arange(32)] = v
    x = to_dtype(blocks.reshape(-1), dtype)
    for k in KS:
        check_case(x, k, fmt, dtype, ts=1.0)
        if fmt != "fp32":  # and at the tensor scale kbit picks (it ignores non-finite values)
            ts = ctypes.c_float()
            call("kbit_compute_tensor_scale_host", x.ctypes.data, x.size, DT_ID[dtype],
                 FMT_ID[fmt], ctypes.byref(ts))
            check_case(x, k, fmt, dtype, ts=ts.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_partial_last_blocks(rng, fmt):
    for n in list(range(1, 34)) + [63, 65]:
        for k in KS:
            x = rng.standard_normal(n).astype(np.float32)
            x[rng.integers(n)] = rng.choice(SPECIALS[:8])
            dtype = DTYPES[n % 3]
            check_case(to_dtype(x, dtype), k, fmt, dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_equal_and_single_value_blocks(rng, fmt):
    blocks = [np.zeros(32), -np.zeros(32), np.full(32, 0.3), np.full(32, -7.0),
              np.full(32, 2.0 ** -14), np.full(32, 31.0), np.full(32, 1e-30)]
    for i in (0, 13, 31):
        one = np.zeros(32)
        one[i] = -3.5
        blocks.append(one)
    x = np.concatenate(blocks).astype(np.float32)
    for k in KS:
        _, absmax, _, _, _ = check_case(x, k, fmt, "float32")
        assert absmax[:2].view(np.uint8).tolist() == [0] * 2 * absmax.itemsize


# ---------------------------------------------------------------------------------
# Codebooks
# ---------------------------------------------------------------------------------

def hostile_codebooks(rng, k):
    m = 1 << k
    books = {
        "unsorted": rng.permutation(spec_codebook(k)),
        "duplicates": rng.choice(np.linspace(-1, 1, max(2, m // 3)), m),
        "all equal": np.full(m, 0.37),
        "all zero": np.zeros(m),
        "asymmetric": np.sort(rng.uniform(-0.2, 1.0, m)),
        "outside [-1, 1]": rng.standard_normal(m) * 3,
        "huge": rng.standard_normal(m) * 1e30,
        "small": rng.standard_normal(m) * 1e-30,
        "subnormal": rng.standard_normal(m) * 1e-42,
        "ulp apart": 0.25 + np.arange(m) * np.spacing(np.float32(0.25)) * 3,
    }
    books["ulp apart"][: m // 2] = np.linspace(-1, 1, m // 2)
    return {name: rng.permutation(np.asarray(b, dtype=np.float32)) for name, b in books.items()}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", KS)
def test_hostile_codebooks(rng, k, fmt):
    for name, cb in hostile_codebooks(rng, k).items():
        x = (rng.standard_t(3, 32 * 8) * 2).astype(np.float32)
        x[5] = 0.0
        x[40] = -0.0
        x[64:96] = 0  # a zero block
        x[96:128] = cb[rng.integers(cb.size)]  # values on an entry (times the scale)
        check_case(x, k, fmt, "float32", cb=cb)


@pytest.mark.parametrize("k", KS)
def test_entries_and_exact_midpoints_with_unit_scale(rng, k):
    # fp32 absmax and a block maximum of 1 give d = 1, so x itself is searched: an
    # element on an entry takes that entry, an element on an exact midpoint (exactly
    # representable) the lower index of its two entries.
    for _ in range(20):
        cb = rng.permutation(np.linspace(-1, 1, 1 << k) + rng.uniform(-0.02, 0.02, 1 << k))
        cb = np.clip(cb, -1, 1).astype(np.float32)
        s = np.unique(cb).astype(np.float64)
        mids = (s[:-1] + s[1:]) / 2
        exact = mids[mids.astype(np.float32).astype(np.float64) == mids]
        pool = np.concatenate([s, exact]).astype(np.float32)
        x = np.resize(pool, 32 * ((pool.size + 31) // 32 + 1)).reshape(-1, 32)
        x[:, 0] = 1.0
        x = x.reshape(-1)
        _, _, codes, _, _ = check_case(x, k, "fp32", "float32", cb=cb)
        c = codes.reshape(-1)[:x.size]
        dist = np.abs(x.astype(np.float64)[:, None] - cb.astype(np.float64)[None, :])
        best = dist.min(axis=1, keepdims=True)
        lowest = np.argmax(dist == best, axis=1)  # first index at the least distance
        assert np.array_equal(c, lowest)


def test_reference_scores_a_tie_with_the_entry_it_takes(rng):
    # A tie that goes up (the larger of two neighbouring entries has the lower index)
    # must be scored with the upper entry's value; the reference had scored it with the
    # lower one, so its E4M4 search could pick another scale than the library.
    for _ in range(50):
        cb = rng.standard_normal(16).astype(np.float32)
        table = R.kbit._search_table(cb)
        s, _, mids, _, _ = table
        v = np.concatenate([s, mids, rng.standard_normal(64).astype(np.float32)])
        codes, values = R.kbit._nearest(v, table)
        assert np.array_equal(cb[codes], values)


def test_value_on_an_entry_takes_it_in_the_reference():
    # Entries one ulp apart: the float32 midpoint rounds onto one of them. The reference
    # keeps every threshold within [s[j], s[j+1]), so a value equal to an entry gets it.
    for x, cb, want in on_entry_cases():
        rp, ra = R.quantize_kbit(x, cb.size.bit_length() - 1, codebook=cb,
                                 absmax_format="fp32" if x.size > 2 else "e4m4")
        got = R.unpack_bitplanes(rp, cb.size.bit_length() - 1).reshape(-1)[:x.size]
        assert got.tolist() == want, (got, want)


def on_entry_cases():
    """(x, codebook, the codes of SPEC's nearest entries) where a float32 midpoint lands
    on an entry."""
    half = np.float32(0.5)
    up = np.nextafter(half, np.float32(1))
    cases = []
    # 0.5 and its successor: (0.5 + up) / 2 rounds to 0.5 (even), the upper entry has
    # the lower index, so the tie goes up and would take 0.5 away from itself.
    cb = np.array([up, half, -1, 1], np.float32)
    x = np.zeros(32, np.float32)
    x[:3] = [1, half, up]
    cases.append((x, cb, [3, 1, 0] + [1] * 29))
    # The same in the E4M4 search: scale 1 has zero error (0.5 and 1 are entries), so it
    # must win over scale 0.96875 (whose two values are entries too, also zero error).
    r = np.float32(1) / np.float32(R.decode_e4m4(175))
    cb = np.array([up, half, 1, r, half * r, -1, -0.75, -0.25], np.float32)
    cases.append((np.array([1, half], np.float32), cb, [2, 1]))
    return cases


def test_value_on_an_entry_takes_it_in_the_library():
    for x, cb, want in on_entry_cases():
        k = cb.size.bit_length() - 1
        status, packed, absmax = lib_quantize(x, k, "fp32" if x.size > 2 else "e4m4",
                                              "float32", cb)
        assert status == 0
        got = spec_codes(packed, k, x.size).reshape(-1)[:x.size]
        assert got.tolist() == want, (got, want)


# ---------------------------------------------------------------------------------
# Tensor scales and range errors
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_tensor_scales_of_every_size(rng, fmt):
    x = (rng.standard_normal(32 * 12) * np.repeat(10.0 ** rng.uniform(-3, 3, 12), 32))
    x = x.astype(np.float32)
    for ts in (1.0, 2.0 ** -20, 2.0 ** 20, 0.25, 3.0, 0.1, 7.3, 1e-30, 1e30, 1e-38, 2.0 ** -140):
        for k in (2, 5):
            check_case(x, k, fmt, "float32", ts=ts)


@pytest.mark.parametrize("fmt", ["fp16", "e4m4"])
def test_range_error_writes_every_block(rng, fmt):
    x = rng.standard_normal(32 * 5).astype(np.float32)
    x[70] = LIMIT[fmt] * 1.5  # block 2 over the format at tensor_scale 1
    for k in KS:
        status, packed, absmax = lib_quantize(x, k, fmt, "float32")
        assert status == RANGE
        check_case(x, k, fmt, "float32")  # all blocks written, as the reference writes them
        # The other blocks are those of a tensor without the outlier.
        clean = x.copy()
        clean[64:96] = 0
        _, p2, a2 = lib_quantize(clean, k, fmt, "float32")
        keep = np.r_[0:2, 3:5]
        assert np.array_equal(packed.reshape(-1, k)[keep], p2.reshape(-1, k)[keep])
        assert np.array_equal(absmax[keep], a2[keep])
        with pytest.raises(R.RangeError):
            R.quantize_kbit(x, k, absmax_format=fmt)


def test_dequantize_rounds_any_float_to_fp16_and_bf16(rng):
    # Codebook entry 0 is 1.0 and every code is 0, so with fp32 scales the output is the
    # scale itself: every float32 pattern goes through the output conversions.
    bits = np.concatenate([rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x38800000,
                                     0x387FF000, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000,
                                     0x7F800000, 0x7FC00001, 0, 1], dtype=np.uint32)])
    bits = np.concatenate([bits, bits | 0x80000000])
    scales = bits.view(np.float32)
    n = scales.size * 32
    packed = np.zeros(scales.size * 2, dtype=np.uint32)
    cb = np.array([1, 0, 0, 0], np.float32)
    f16 = lib_dequantize(packed, scales, 2, n, "fp32", "float16", cb)[::32]
    with np.errstate(over="ignore"):
        assert same_float_bits(f16.astype(np.float32), scales.astype(np.float16).astype(np.float32))
    bf16 = lib_dequantize(packed, scales, 2, n, "fp32", "bfloat16", cb)[::32]
    assert same_float_bits(R.kbit.bf16_bits_to_float32(bf16),
                           R.kbit.bf16_bits_to_float32(bf16_round(scales)))
    f32 = lib_dequantize(packed, scales, 2, n, "fp32", "float32", cb)[::32]
    assert same_float_bits(f32, scales)


# ---------------------------------------------------------------------------------
# Round trip through the Python API: the error bound of the codebook spacing
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", KS)
def test_roundtrip_error_within_codebook_spacing(rng, k, fmt):
    cb = spec_codebook(k).astype(np.float64)
    half_gap = np.diff(cb).max() / 2
    for mag in (1e-30, 1e-6, 1.0, 1e6, 1e30):
        x = (rng.standard_t(3, 32 * 64) * mag).astype(np.float32)
        q = kbit.quantize(x, k=k, absmax=fmt)
        y = kbit.dequantize(q).astype(np.float64).reshape(-1, 32)
        d = spec_scale(q.absmax, fmt, q.tensor_scale)
        xb = x.astype(np.float64).reshape(-1, 32)
        # In range: half the largest gap times the scale; past the scale (the E4M4 search
        # may store a scale under the absmax) the excess; plus float32 rounding.
        bound = (half_gap * d + np.maximum(np.abs(xb).max(axis=1) - d, 0))[:, None]
        bound = bound + 2.0 ** -22 * np.abs(xb)
        assert np.all(np.abs(xb - y) <= bound), mag


# ---------------------------------------------------------------------------------
# Known library problems (C++: csrc/formats/kbit.h, shared with the GPU kernels)
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_blocks_with_subnormal_scales_get_the_nearest_codes(fmt):
    # bf16 and fp32 tensors can hold such values; kbit picks tensor_scale 1 for fp32
    # and stops its power of two at 2^-126 for the others.
    x = (np.linspace(-1, 1, 64) * 1e-39).astype(np.float32)
    q = kbit.quantize(x, k=4, absmax=fmt)
    y = kbit.dequantize(q).astype(np.float64)
    d = np.repeat(spec_scale(q.absmax, fmt, q.tensor_scale), 32)
    half_gap = np.diff(spec_codebook(4).astype(np.float64)).max() / 2
    assert np.all(np.abs(x - y) <= half_gap * d + 2.0 ** -20 * np.abs(x)), \
        np.abs(x - y).max() / np.abs(x).max()


def test_reference_blocks_with_subnormal_scales_get_the_nearest_codes():
    x = (np.linspace(-1, 1, 32) * 1e-39).astype(np.float32)
    packed, absmax = R.quantize_kbit(x, 4, absmax_format="fp32")
    y = R.dequantize_kbit(packed, absmax, 4, 32, absmax_format="fp32").astype(np.float64)
    half_gap = np.diff(spec_codebook(4).astype(np.float64)).max() / 2
    assert np.all(np.abs(x - y) <= half_gap * float(absmax[0]) + 2.0 ** -20 * np.abs(x))


@pytest.mark.parametrize("fmt", ["fp16", "e4m4"])
def test_tensor_of_flt_max_dequantizes_to_finite_values(fmt):
    # np.nan_to_num turns inf into FLT_MAX, so such tensors are not exotic.
    x = np.zeros(96, np.float32)
    x[:32] = FLT_MAX  # all at the top: E4M4 keeps code 255
    x[32] = -FLT_MAX
    x[64:] = np.linspace(-1, 1, 32)
    for k in KS:
        y = kbit.dequantize(kbit.quantize(x, k=k, absmax=fmt))
        assert np.all(np.isfinite(y)), (k, np.flatnonzero(~np.isfinite(y)))
