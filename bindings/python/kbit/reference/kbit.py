"""Pure numpy ground truth for the kbit format (SPEC section 1).

Everything here is written for clarity, vectorised over blocks, in float32 where the
library computes in float32, so the library's bytes can be checked against it exactly.

The quantizer (the format leaves it free; this is the one kbit ships):
  1. a = max |x| over the block; a_s = a / tensor_scale.
  2. The stored scale: fp32 stores a_s; fp16 stores a_s rounded up to a half;
     E4M4 tries the candidate codes c0-2, c0-1, c0, c0+1 around c0 = the smallest
     code whose value is >= a_s, and keeps the one with the least squared error.
  3. Each element gets the code of the codebook entry nearest to x / d, where
     d = decode(stored) * tensor_scale. Nearest is decided against the midpoints of
     the sorted distinct entries (computed in float32); on an exact midpoint the lower
     original index wins; among duplicates the lowest index wins; a v equal to an
     entry takes that entry, even where a rounded midpoint falls on it.
  4. Non-finite blocks: fp32/fp16 store NaN (the block dequantizes to NaN), E4M4 has
     no NaN, stores 255 and reports a range error. Blocks over the format's maximum
     are stored at the maximum and reported as range errors.
"""
from __future__ import annotations

import math

import numpy as np

BLOCK = 32
E4M4_MAX = 31.0
FP16_MAX = 65504.0
FP32_MAX = float(np.finfo(np.float32).max)
ABSMAX_FORMATS = {"fp32": 0, "fp16": 1, "e4m4": 2}
# Candidate offsets from c0 tried by the E4M4 scale search, in order of preference
# (the first with the least error wins).
E4M4_CANDIDATES = (0, -1, -2, 1)
# A candidate's error: sum (v - value)^2 in float32, each run of 8 elements summed in
# element order, the 4 runs as (r0 + r1) + (r2 + r3), weighted by decode(c)^2.
RUN = 8
FLT_MAX = np.float32(3.4028234663852886e38)
TINY_BLOCK, TINY_SHIFT, TINY_MAX_TS = 2.0 ** -64, 2.0 ** 64, 2.0 ** 60  # formats/kbit.h


class RangeError(ValueError):
    """A block's absmax / tensor_scale does not fit the absmax format."""


# ----------------------------------------------------------------------------------
# Codebook
# ----------------------------------------------------------------------------------

def _norm_ppf(p: float) -> float:
    """Inverse of the standard normal CDF (Acklam's rational start, Newton-polished)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    elif p > 1 - 0.02425:
        q = math.sqrt(-2 * math.log(1 - p))
        x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    else:
        q = p - 0.5
        r = q * q
        x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
            (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    for _ in range(3):  # Newton on Phi(x) - p, Phi from erfc (accurate in both tails)
        err = 0.5 * math.erfc(-x / math.sqrt(2)) - p
        x -= err * math.sqrt(2 * math.pi) * math.exp(0.5 * x * x)
    return x


def create_normal_float_codebook(k: int) -> np.ndarray:
    """The default symmetric normal-float codebook: 2^k quantiles of N(0,1) at
    (i + 0.5) / 2^k, divided by the largest magnitude, ascending, float32."""
    if k not in (2, 3, 4, 5):
        raise ValueError(f"k must be 2..5, got {k}")
    m = 1 << k
    q = np.array([_norm_ppf((i + 0.5) / m) for i in range(m)], dtype=np.float64)
    q = (q - q[::-1]) / 2  # exact antisymmetry
    return (q / np.abs(q).max()).astype(np.float32)


def create_nf0_codebook(k: int) -> np.ndarray:
    """The normal-float book with an exact zero (NF4's construction for any k): 2^(k-1)
    positive quantiles of N(0,1) at p = linspace(offset, 0.5, 2^(k-1) + 1)[:-1], 2^(k-1) - 1
    negative ones at linspace(offset, 0.5, 2^(k-1))[:-1] mirrored, and 0; offset halfway
    between 1 - 1/(2 (2^k - 1)) and 1 - 1/(2^(k+1)); divided by the largest magnitude,
    ascending, float32. At k = 4 it is NF4's table."""
    if k not in (2, 3, 4, 5):
        raise ValueError(f"k must be 2..5, got {k}")
    m = 1 << k
    offset = 0.5 * ((1 - 1 / (2 * (m - 1))) + (1 - 1 / (2 * m)))
    half = m // 2
    pos = [_norm_ppf(p) for p in np.linspace(offset, 0.5, half + 1)[:-1]]
    neg = [-_norm_ppf(p) for p in np.linspace(offset, 0.5, half)[:-1]]
    q = np.sort(np.array(pos + [0.0] + neg, dtype=np.float64))
    return (q / np.abs(q).max()).astype(np.float32)


def create_uniform_codebook(k: int) -> np.ndarray:
    """2^k evenly spaced entries from -1 to 1, float32 (no zero: the grid of a uniform
    quantizer that spends every code)."""
    if k not in (2, 3, 4, 5):
        raise ValueError(f"k must be 2..5, got {k}")
    return np.linspace(-1.0, 1.0, 1 << k).astype(np.float32)


# ----------------------------------------------------------------------------------
# E4M4 and fp16 scales
# ----------------------------------------------------------------------------------

def decode_e4m4(code) -> np.ndarray:
    c = np.asarray(code, dtype=np.uint8).astype(np.int64)
    e, m = c >> 4, c & 15
    normal = np.ldexp(1.0 + m / 16.0, (e - 11).astype(np.int64))
    sub = np.ldexp(m / 16.0, -10)
    return np.where(e > 0, normal, sub).astype(np.float32)


_E4M4_TABLE = decode_e4m4(np.arange(256))


def encode_e4m4(value, mode: str = "ceil") -> np.ndarray:
    """Encodes non-negative values: 'ceil' = smallest code >= value (what the
    quantizer uses), 'nearest' = nearest code (ties to even code). Values above 31
    raise RangeError."""
    v = np.asarray(value, dtype=np.float32)
    if np.any(~np.isfinite(v)) or np.any(v < 0):
        raise ValueError("E4M4 encodes finite non-negative values")
    if np.any(v > E4M4_MAX):
        raise RangeError("value exceeds the E4M4 maximum 31.0")
    idx = np.searchsorted(_E4M4_TABLE, v, side="left")  # first code with value >= v
    if mode == "ceil":
        return idx.astype(np.uint8)
    lo = np.maximum(idx - 1, 0)
    dlo, dhi = v - _E4M4_TABLE[lo], _E4M4_TABLE[idx] - v
    pick = np.where((dlo < dhi) | ((dlo == dhi) & (lo % 2 == 0)), lo, idx)
    return pick.astype(np.uint8)


def fp16_ceil(value) -> np.ndarray:
    """Smallest fp16 >= value (float32 in, float16 out)."""
    v = np.asarray(value, dtype=np.float32)
    h = v.astype(np.float16)
    low = h.astype(np.float32) < v
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


# ----------------------------------------------------------------------------------
# Bit planes
# ----------------------------------------------------------------------------------

def pack_bitplanes(codes: np.ndarray, k: int) -> np.ndarray:
    """codes: (n_blocks, 32) ints < 2^k -> (n_blocks * k,) uint32; word j of a block
    holds bit j of every code, element i at bit i."""
    codes = np.asarray(codes, dtype=np.uint32).reshape(-1, BLOCK)
    shifts = np.arange(BLOCK, dtype=np.uint32)
    planes = [(((codes >> j) & 1) << shifts).sum(axis=1, dtype=np.uint64)
              for j in range(k)]
    return np.stack(planes, axis=1).astype(np.uint32).reshape(-1)


def unpack_bitplanes(packed: np.ndarray, k: int) -> np.ndarray:
    """Inverse of pack_bitplanes: (n_blocks * k,) uint32 -> (n_blocks, 32) uint8."""
    words = np.asarray(packed, dtype=np.uint32).reshape(-1, k)
    shifts = np.arange(BLOCK, dtype=np.uint32)
    codes = np.zeros((words.shape[0], BLOCK), dtype=np.uint32)
    for j in range(k):
        codes |= ((words[:, j:j + 1] >> shifts) & 1) << j
    return codes.astype(np.uint8)


# ----------------------------------------------------------------------------------
# Quantize / dequantize
# ----------------------------------------------------------------------------------

def _search_table(codebook: np.ndarray):
    """Sorted distinct entries s, their lowest original index, midpoints, the code an
    exact midpoint goes to, and the search thresholds.

    Between neighbouring entries s[j] < s[j+1] the threshold is their float32
    midpoint, or the float just below it when an exact midpoint goes up (the upper
    entry has the lower index), kept within [s[j], s[j+1]): a midpoint rounded onto an
    entry (entries an ulp or two apart) must not take a v equal to that entry away
    from it. v above thr[j] takes the upper entry."""
    cb = np.asarray(codebook, dtype=np.float32)
    order = np.lexsort((np.arange(cb.size), cb))  # by value, then by index
    s, idx = cb[order], order
    first = np.concatenate([[True], s[1:] != s[:-1]])
    s, idx = s[first], idx[first]
    t = (s[:-1] + s[1:]) * np.float32(0.5)
    t = t.astype(np.float32)
    tie = np.minimum(idx[:-1], idx[1:])
    below = np.float32(-np.inf)
    thr = np.where(tie == idx[1:], np.nextafter(t, below), t)
    thr = np.clip(thr, s[:-1], np.nextafter(s[1:], below)).astype(np.float32)
    return s, idx, t, tie, thr


def _nearest(v: np.ndarray, table) -> tuple[np.ndarray, np.ndarray]:
    """Codes and codebook values of the entries nearest to v (any shape), searched
    against the table's thresholds (see _search_table)."""
    s, idx, _, _, thr = table
    p = np.searchsorted(thr, v, side="left")  # number of thresholds < v
    return idx[p].astype(np.uint8), s[p]


def _as_float32(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x.reshape(-1)
    if x.dtype == np.float16:
        return x.astype(np.float32).reshape(-1)
    if x.dtype == np.uint16:  # raw bfloat16 bits
        return (x.astype(np.uint32) << 16).view(np.float32).reshape(-1)
    raise TypeError(f"unsupported dtype {x.dtype}")


def _inverse(d):
    """1/d per block in float32 capped at FLT_MAX; 0 where d is not > 0 (zero blocks)."""
    d = np.asarray(d, dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        r = np.float32(1) / np.where(d > 0, d, 1)
    return np.where(d > 0, np.minimum(r, FLT_MAX), 0).astype(np.float32)


def _e4m4_inverse(dec, tensor_scale):
    """The E4M4 candidates' 1/(decode(c) * ts), defined as rcp(decode(c)) * rcp(ts)
    (tensor_scale: a number or one per block)."""
    with np.errstate(over="ignore"):
        r = _inverse(dec) * _inverse(np.asarray(tensor_scale, dtype=np.float32))
    return np.minimum(r.astype(np.float32), FLT_MAX)


def _scaled(xb, inv):
    """v = x * (1/d) in float32 (inv is capped, so finite x never gives NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = (xb * inv[:, None]).astype(np.float32)
    v[np.isnan(v)] = 0
    return v


def _candidate_error(xv, val, valid, w=None):
    """Per block: float32 sum of squared residuals in the library's order, each weighted
    by w (importance; float32 products w * r^2) when given."""
    r = np.where(valid, (xv - val).astype(np.float32), np.float32(0))
    r = r.reshape(-1, BLOCK // RUN, RUN)
    w = None if w is None else w.reshape(r.shape)
    acc = np.zeros(r.shape[:2], dtype=np.float32)
    for e in range(RUN):
        sq = (r[:, :, e] * r[:, :, e]).astype(np.float32)
        if w is not None:
            sq = (w[:, :, e] * sq).astype(np.float32)
        acc = (acc + sq).astype(np.float32)
    return ((acc[:, 0] + acc[:, 1]).astype(np.float32) +
            (acc[:, 2] + acc[:, 3]).astype(np.float32)).astype(np.float32)


def quantize_kbit(x, k: int, codebook=None, absmax_format: str = "e4m4",
                  tensor_scale: float = 1.0, strict: bool = True, importance=None):
    """Quantizes x (float32, float16, or uint16 bfloat16 bits; any shape, taken flat).
    importance: optional per-element float32 weights of the E4M4 search's error
    (kbit_quantize_ex).

    Returns (packed uint32[n_blocks*k], absmax array: float32 / float16 / uint8).
    Raises RangeError when a block does not fit the format and strict is True;
    with strict=False it returns the clipped result, as the library writes it.
    """
    cb = create_normal_float_codebook(k) if codebook is None else \
        np.asarray(codebook, dtype=np.float32).reshape(-1)
    if cb.size != (1 << k):
        raise ValueError(f"codebook must have {1 << k} entries")
    flat = _as_float32(x)
    n = flat.size
    nb = (n + BLOCK - 1) // BLOCK
    xb = np.zeros(nb * BLOCK, dtype=np.float32)
    xb[:n] = flat
    xb = xb.reshape(nb, BLOCK)
    valid = (np.arange(nb * BLOCK) < n).reshape(nb, BLOCK)
    wb = None
    if importance is not None:
        wb = np.zeros(nb * BLOCK, dtype=np.float32)
        wb[:n] = np.asarray(importance, dtype=np.float32).reshape(-1)
        wb = wb.reshape(nb, BLOCK)
    ts = np.float32(tensor_scale)
    table = _search_table(cb)

    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a = np.abs(xb).max(axis=1)  # NaN propagates
        finite = np.isfinite(a)
        a_s = (a / ts).astype(np.float32)
        over = np.zeros(nb, dtype=bool)
        # Tiny blocks (largest |x| < 2^-64): x and the scale's inverse taken * 2^64
        # (exact), because 1/d of a scale below about 2^-128 is past FLT_MAX.
        tiny = finite & (a > 0) & (a < TINY_BLOCK) & (ts < TINY_MAX_TS)
        xb = np.where(tiny[:, None], xb * np.float32(TINY_SHIFT), xb).astype(np.float32)
        ts_b = np.where(tiny, ts * np.float32(TINY_SHIFT), ts).astype(np.float32)

        if absmax_format == "fp32":
            # A finite block over the float range (tensor_scale < 1) is clipped.
            over = finite & np.isinf(a_s)
            stored = np.where(finite, np.where(over, FP32_MAX, a_s), np.float32(np.nan))
            stored = stored.astype(np.float32)
            dec = stored
        elif absmax_format == "fp16":
            over = finite & (a_s > FP16_MAX)
            h = fp16_ceil(np.where(finite, np.minimum(a_s, FP16_MAX), 0))
            stored = np.where(finite, h, np.float16(np.nan)).astype(np.float16)
            dec = stored.astype(np.float32)
        elif absmax_format == "e4m4":
            over = ~finite | (a_s > E4M4_MAX)
            c0 = encode_e4m4(np.where(over, 0, a_s)).astype(np.int64)
            c0[over] = 255
            best = c0.copy()
            best_score = np.full(nb, np.inf, dtype=np.float32)
            search = ~over & (c0 > 0)
            for off in E4M4_CANDIDATES:
                c = c0 + off
                ok = search & (c >= 1) & (c <= 255)
                cc = np.clip(c, 1, 255)
                dec_c = _E4M4_TABLE[cc]
                xv = _scaled(xb, _e4m4_inverse(dec_c, ts_b))
                _, val = _nearest(xv, table)
                score = (_candidate_error(xv, val, valid, wb) * (dec_c * dec_c)).astype(np.float32)
                better = ok & (score < best_score)
                best = np.where(better, cc, best)
                best_score = np.where(better, score, best_score)
            stored = best.astype(np.uint8)
            dec = _E4M4_TABLE[stored]
        else:
            raise ValueError(f"unknown absmax format {absmax_format!r}")

        if strict and over.any():
            raise RangeError(f"{int(over.sum())} block(s) exceed the {absmax_format} "
                             f"range at tensor_scale={float(ts)}")
        d = (dec.astype(np.float32) * ts_b).astype(np.float32)
        inv = _inverse(d)
        if absmax_format == "e4m4":  # searched blocks use the candidates' reciprocal
            searched = finite & ~over & (dec > 0)
            inv = np.where(searched, _e4m4_inverse(dec, ts_b), inv)
        inv = np.where(finite, inv, np.float32(0)).astype(np.float32)
        xv = _scaled(xb, inv)  # zero blocks: v = 0
        codes, _ = _nearest(xv, table)
        codes[~finite] = 0
        codes[~valid] = 0
    return pack_bitplanes(codes, k), stored


def dequantize_kbit(packed, absmax, k: int, n: int, codebook=None,
                    absmax_format: str = "e4m4", tensor_scale: float = 1.0,
                    dtype=np.float32) -> np.ndarray:
    """out[i] = float32(codebook[c_i]) * (decode(absmax[b]) * tensor_scale), the product
    in brackets held at +-FLT_MAX when a finite decode's rounds past it, then cast to dtype with round-to-nearest-even (np.float32, np.float16, or 'bfloat16' for
    uint16 bfloat16 bits)."""
    cb = create_normal_float_codebook(k) if codebook is None else \
        np.asarray(codebook, dtype=np.float32).reshape(-1)
    nb = (n + BLOCK - 1) // BLOCK
    codes = unpack_bitplanes(np.asarray(packed)[:nb * k], k)
    am = np.asarray(absmax)[:nb]
    if absmax_format == "e4m4":
        dec = _E4M4_TABLE[am.astype(np.uint8)]
    else:
        dec = am.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        d = (dec * np.float32(tensor_scale)).astype(np.float32)
        held = np.isinf(d) & np.isfinite(dec)  # a finite decode's product past FLT_MAX
        d = np.where(held, np.copysign(np.float32(FLT_MAX), d), d).astype(np.float32)
        out = (cb[codes] * d[:, None]).astype(np.float32).reshape(-1)[:n]
    return cast_from_float32(out, dtype)


def float32_to_bf16_bits(x) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even, NaN kept NaN."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_bits_to_float32(b) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def cast_from_float32(out: np.ndarray, dtype) -> np.ndarray:
    if dtype in ("bfloat16", "bf16"):
        return float32_to_bf16_bits(out)
    with np.errstate(over="ignore"):
        return out.astype(dtype)


def sqnr_db(x, x_hat) -> float:
    x = np.asarray(x, dtype=np.float64)
    e = x - np.asarray(x_hat, dtype=np.float64)
    return float(10 * np.log10((x * x).sum() / (e * e).sum()))
