"""Pure numpy ground truth for NF4 / FP4, bitsandbytes' 4-bit formats (SPEC section 2).

The bytes are those of bitsandbytes' CUDA quantize_4bit / dequantize_4bit, with every
float32 operation done in float32 as there:

  1. The tensor is taken flat and cut into blocks of `blocksize` elements (a power of
     two in 32..4096); a partial last block is padded with zeros.
  2. absmax = max |x| over the block, NaN ignored, starting from -FLT_MAX, subnormals
     counting as 0; the zero padding of a partial block counts (so an all-NaN block
     stores -FLT_MAX when it is full and 0 when it is partial).
  3. v = x * rcp(absmax), where rcp is bitsandbytes' fast-math reciprocal (see
     bnb_rcp) and the product flushes subnormals (bnb_mul); the code is how many of
     the format's decision thresholds v exceeds (NF4: 15 ascending thresholds; FP4:
     sign bit 8 for v < 0, and the rank of |v| among 7 thresholds mapped to the
     magnitude bits). NaN -> 0.
  4. Byte i = code(2i) << 4 | code(2i + 1); for odd n the padding element (0.0)
     fills the last low nibble.
  5. Dequantization: out = bnb_mul(table[code], absmax), cast with round-to-nearest-
     even; NaN becomes the GPU's canonical NaN (0x7FFFFFFF, or 0x7FFF for fp16/bf16).

Double quantization (compress_statistics) stores absmax as 8-bit codes of
(absmax - offset) with the signed dynamic map in blocks of 256 (absmax2 per block),
encoded by bitsandbytes' binary search; the scale is rebuilt as
float32(bnb_mul(code[q], absmax2) + offset).
"""
from __future__ import annotations

import numpy as np

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_BLOCKSIZE = 64
DQ_BLOCKSIZE = 256
QUANT_TYPES = ("nf4", "fp4")

# bitsandbytes' float32 tables: NF4 (QLoRA paper), and FP4 in code order (bit 3 is the
# sign; the magnitudes are 0, 1/192, 8/12, 1, 4/12, 6/12, 2/12, 3/12 as written there).
NF4_TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
_FP4_MAGNITUDES = np.array([0.0, 0.005208333333, 0.66666667, 1.0,
                            0.33333333, 0.5, 0.16666667, 0.25], dtype=np.float32)
FP4_TABLE = np.concatenate([_FP4_MAGNITUDES, -_FP4_MAGNITUDES]).astype(np.float32)


def float32_literal(text: str) -> np.float32:
    """The float32 a C/CUDA compiler makes of the literal `<text>f`: the decimal rounded
    once, to nearest (ties to even). np.float32(float(text)) rounds twice, through a
    double, and lands an ulp away when that double is a float32 midpoint, as it is for
    four of bitsandbytes' NF4 thresholds."""
    from fractions import Fraction
    exact = Fraction(text)
    near = np.float32(float(text))
    cands = (np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf)))
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - exact),
                                      int(np.array(c).view(np.uint32)) & 1))


def _literals(*texts) -> np.ndarray:
    return np.array([float32_literal(t) for t in texts], dtype=np.float32)


# Decision thresholds of bitsandbytes' encoders, ascending, as written in its CUDA source
# (float literals, which nvcc rounds once).
NF4_THRESHOLDS = _literals(
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906",
    "-0.33967943489551544", "-0.23460740596055984", "-0.13791173323988914",
    "-0.045525018125772476", "0.03979014977812767", "0.1202552504837513",
    "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011")
FP4_THRESHOLDS = _literals("0.00260417", "0.0859375", "0.20833333", "0.29166667",
                           "0.4166667", "0.583333", "0.8333333")
# FP4 magnitude rank (0 = smallest) -> the three magnitude bits of its code.
FP4_RANK_TO_CODE = np.array([0, 1, 6, 7, 4, 5, 2, 3], dtype=np.uint8)

_FLT_MAX = np.finfo(np.float32).max
_FLT_MIN = np.finfo(np.float32).tiny

# Mantissas m (10 bits) where the hardware's rcp.approx.ftz.f32(1.m), measured on an
# H100, is one ulp above (PLUS) or below (MINUS) the correctly rounded 1 / 1.m.
_RCP_PLUS = np.array([
    0x00160800, 0x00010000, 0x08000000, 0x00020306, 0x02180400, 0x00000000, 0x00021800,
    0x10000006, 0x00000010, 0x00030500, 0x04000000, 0x00080000, 0x03081804, 0x00800202,
    0x00080462, 0x0A040102, 0x80090380, 0x00180008, 0x00000000, 0x00080000, 0x08000D80,
    0x30008018, 0x01100000, 0x00000000, 0x002E0000, 0x008020A0, 0x00000000, 0x20005500,
    0x09000000, 0x00010001, 0x18000100, 0x00000020], dtype=np.uint64)
_RCP_MINUS = np.array([
    0x00004040, 0x40004001, 0x01C02040, 0xC0000000, 0x00000080, 0x00090001, 0x28400000,
    0x00000000, 0x80040000, 0x00000000, 0x20000020, 0x00000000, 0x80020000, 0x28000000,
    0x06000000, 0x00000000, 0x00000000, 0x00004000, 0x00000000, 0x00000040, 0x00000000,
    0x00000000, 0x00000000, 0x00008000, 0x00008000, 0x00000000, 0x00000000, 0x00000000,
    0x00000000, 0x34400000, 0x00000020, 0x01040000], dtype=np.uint64)
_M10 = np.arange(1024)
_BIT = (_M10 & 31).astype(np.uint64)
RCP_DELTA_10BIT = (((_RCP_PLUS[_M10 >> 5] >> _BIT) & 1).astype(np.int64)
                   - ((_RCP_MINUS[_M10 >> 5] >> _BIT) & 1).astype(np.int64))


def flush(x) -> np.ndarray:
    """Subnormals -> zero of the same sign (the GPU's .ftz), float32."""
    x = np.array(x, dtype=np.float32, copy=True)
    sub = (np.abs(x) < _FLT_MIN) & (x != 0)
    x[sub] = np.copysign(np.float32(0), x[sub])
    return x


def bnb_mul(a, b) -> np.ndarray:
    """bitsandbytes' float32 product (built with --use_fast_math): mul.rn.ftz.f32."""
    with np.errstate(invalid="ignore", over="ignore"):
        return flush((flush(a) * flush(b)).astype(np.float32))


def bnb_rcp(a) -> np.ndarray:
    """bitsandbytes' 1.0f / a: rcp.approx.ftz.f32. Exactly the hardware's (H100) for
    every a whose mantissa fits in 10 bits (all fp16 / bf16 block maxima): the correctly
    rounded reciprocal moved by RCP_DELTA_10BIT ulps; the correctly rounded reciprocal
    for other a (the hardware's can differ there by one ulp)."""
    f = flush(np.asarray(a, dtype=np.float32))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        r = (np.float32(1) / f).astype(np.float32)
    fb, rb = f.view(np.uint32), r.view(np.uint32)
    e = rb & np.uint32(0x7F800000)
    adj = ((fb & np.uint32(0x1FFF)) == 0) & (e != 0) & (e != np.uint32(0x7F800000))
    delta = RCP_DELTA_10BIT[(fb >> np.uint32(13)) & np.uint32(1023)]
    out = np.where(adj, (rb.astype(np.int64) + delta).astype(np.uint32), rb).view(np.float32)
    return flush(out)


def table(quant_type: str) -> np.ndarray:
    """The 16 float32 dequantization values of 'nf4' or 'fp4', indexed by code."""
    _check_type(quant_type)
    return NF4_TABLE if quant_type == "nf4" else FP4_TABLE


def _check_type(quant_type):
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {quant_type!r}")


def _check_blocksize(blocksize):
    if blocksize not in BLOCKSIZES:
        raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {blocksize}")


def as_float32(x) -> np.ndarray:
    """Flat float32 copy of x: float32, float16, or uint16 holding bfloat16 bits."""
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32).reshape(-1)
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"unsupported dtype {x.dtype}")
    return x.astype(np.float32).reshape(-1)


def encode(v, quant_type: str) -> np.ndarray:
    """4-bit codes of normalised values v (float32), as bitsandbytes' encoders give."""
    _check_type(quant_type)
    v = np.asarray(v, dtype=np.float32)
    shape, v = v.shape, v.reshape(-1)
    nan = np.isnan(v)
    if quant_type == "nf4":
        # number of thresholds strictly below v
        codes = np.searchsorted(NF4_THRESHOLDS, v, side="left").astype(np.uint8)
    else:
        rank = np.searchsorted(FP4_THRESHOLDS, np.abs(v), side="left")
        codes = FP4_RANK_TO_CODE[np.minimum(rank, 7)] | np.where(v < 0, 8, 0).astype(np.uint8)
    codes[nan] = 0
    return codes.astype(np.uint8).reshape(shape)


def _blocks(flat: np.ndarray, blocksize: int):
    n = flat.size
    nb = -(-n // blocksize)
    xb = np.zeros(nb * blocksize, dtype=np.float32)
    xb[:n] = flat
    return xb.reshape(nb, blocksize), nb


def block_absmax(xb: np.ndarray, n: int) -> np.ndarray:
    """absmax per block as bitsandbytes computes it (see the module docstring)."""
    blocksize = xb.shape[1]
    a = flush(np.abs(xb))
    a = np.where(np.isnan(a), np.float32(-_FLT_MAX), a)
    m = a.max(axis=1).astype(np.float32)
    if n % blocksize:  # the padded zeros of the last block count
        m[-1] = max(m[-1], np.float32(0))
    return m


def quantize_4bit(x, quant_type: str = "nf4", blocksize: int = DEFAULT_BLOCKSIZE):
    """Returns (packed uint8[(n+1)//2], absmax float32[ceil(n/blocksize)])."""
    _check_type(quant_type)
    _check_blocksize(blocksize)
    flat = as_float32(x)
    n = flat.size
    xb, nb = _blocks(flat, blocksize)
    absmax = block_absmax(xb, n)
    v = bnb_mul(xb, bnb_rcp(absmax)[:, None])
    codes = encode(v, quant_type).reshape(-1)
    n_even = n + (n & 1)
    codes = codes[:n_even]  # the padding element of an odd n is encoded too
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    return packed, absmax


def unpack_codes(packed, n: int) -> np.ndarray:
    """The n 4-bit codes of packed bytes (high nibble first)."""
    p = np.asarray(packed, dtype=np.uint8).reshape(-1)
    codes = np.empty(p.size * 2, dtype=np.uint8)
    codes[0::2] = p >> 4
    codes[1::2] = p & 15
    return codes[:n]


def cast_output(out: np.ndarray, dtype) -> np.ndarray:
    """float32 -> dtype (np.float32, np.float16, or 'bfloat16' giving uint16 bits),
    round-to-nearest-even, NaN as the GPU writes it."""
    out = np.asarray(out, dtype=np.float32)
    nan = np.isnan(out)
    if dtype in ("bfloat16", "bf16"):
        b = out.view(np.uint32).astype(np.uint64)
        bits = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
        bits[nan] = 0x7FFF
        return bits
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        with np.errstate(over="ignore", invalid="ignore"):
            h = out.astype(np.float16)
        h.view(np.uint16)[nan] = 0x7FFF
        return h
    if dtype == np.float32:
        r = out.copy()
        r.view(np.uint32)[nan] = 0x7FFFFFFF
        return r
    raise ValueError(f"unsupported output dtype {dtype}")


def dequantize_4bit(packed, absmax, n: int, quant_type: str = "nf4",
                    blocksize: int = DEFAULT_BLOCKSIZE, dtype=np.float32) -> np.ndarray:
    """out[i] = float32(table[code_i] * absmax[i // blocksize]), cast to dtype."""
    _check_blocksize(blocksize)
    tab = table(quant_type)
    codes = unpack_codes(packed, n)
    scale = np.asarray(absmax, dtype=np.float32).reshape(-1)[np.arange(n) // blocksize]
    return cast_output(bnb_mul(tab[codes], scale), dtype)


def quantize_nf4(x, blocksize: int = DEFAULT_BLOCKSIZE):
    return quantize_4bit(x, "nf4", blocksize)


def quantize_fp4(x, blocksize: int = DEFAULT_BLOCKSIZE):
    return quantize_4bit(x, "fp4", blocksize)


def dequantize_nf4(packed, absmax, n, blocksize=DEFAULT_BLOCKSIZE, dtype=np.float32):
    return dequantize_4bit(packed, absmax, n, "nf4", blocksize, dtype)


def dequantize_fp4(packed, absmax, n, blocksize=DEFAULT_BLOCKSIZE, dtype=np.float32):
    return dequantize_4bit(packed, absmax, n, "fp4", blocksize, dtype)


# ----------------------------------------------------------------------------------
# Double quantization of the absmax values
# ----------------------------------------------------------------------------------

def _linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """torch.linspace in float32 as its vectorised CPU build computes it: a float32
    step, the first half fma(step, k, start), the second half fma(-step, steps-1-k, end),
    each rounded once (the float64 expressions below are exact)."""
    s, e = np.float32(start), np.float32(end)
    step = np.float64(np.float32((e - s) / np.float32(steps - 1)))
    k = np.arange(steps)
    half = steps // 2
    up = (np.float64(s) + step * k).astype(np.float32)
    down = (np.float64(e) - step * (steps - 1 - k)).astype(np.float32)
    return np.where(k < half, up, down).astype(np.float32)


def create_dynamic_map() -> np.ndarray:
    """bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8)
    in float32: for i in 0..6 the midpoints of linspace(0.1, 1, 2^i + 1) times
    float32(10^(i-6)), with both signs, plus 0 and 1, sorted (256 values)."""
    data = []
    for i in range(7):
        b = _linspace_f32(0.1, 1.0, 2 ** i + 1)
        means = ((b[:-1] + b[1:]).astype(np.float32) / np.float32(2)).astype(np.float32)
        scaled = (np.float32(10.0 ** (i - 6)) * means).astype(np.float32)
        data += scaled.tolist() + (-scaled).tolist()
    data += [0.0, 1.0]
    assert len(data) == 256
    return np.sort(np.array(data, dtype=np.float32))


def encode_dynamic(v, code) -> np.ndarray:
    """8-bit codes of v (float32) against a sorted 256-entry map, by bitsandbytes'
    search: 7 halving steps from entry 127 keeping the bracketing entries, then the
    neighbour when v lies strictly beyond the float32 midpoint."""
    v = np.asarray(v, dtype=np.float32).reshape(-1)
    code = np.asarray(code, dtype=np.float32).reshape(-1)
    pivot = np.full(v.shape, 127, dtype=np.int64)
    hi_idx = np.full(v.shape, 255, dtype=np.int64)
    lo_idx = np.zeros(v.shape, dtype=np.int64)
    hi = np.full(v.shape, code[255], dtype=np.float32)
    lo = np.full(v.shape, code[0], dtype=np.float32)
    val = code[pivot]
    step = 64
    while step > 0:
        gt = v > val
        lo_idx = np.where(gt, pivot, lo_idx)
        lo = np.where(gt, val, lo)
        hi_idx = np.where(gt, hi_idx, pivot)
        hi = np.where(gt, hi, val)
        pivot = np.where(gt, pivot + step, pivot - step)
        val = code[pivot]
        step //= 2
    half = np.float32(0.5)
    up_mid = ((hi + val).astype(np.float32) * half).astype(np.float32)
    down_mid = ((lo + val).astype(np.float32) * half).astype(np.float32)
    gt = v > val
    res = np.where(gt, np.where(v > up_mid, hi_idx, pivot),
                   np.where(v < down_mid, lo_idx, pivot))
    return res.astype(np.uint8)


def absmax_mean(absmax) -> np.float32:
    """float32(sum / count) with the sum in float64 in kbit's fixed order: 1024 partial
    sums (partial t adds elements t, t + 1024, ... in turn), then a pairwise tree."""
    a = np.asarray(absmax, dtype=np.float32).reshape(-1).astype(np.float64)
    count = a.size
    if count == 0:
        raise ValueError("absmax_mean of an empty array")
    rows = -(-count // 1024)
    padded = np.zeros(rows * 1024, dtype=np.float64)
    padded[:count] = a
    part = np.zeros(1024, dtype=np.float64)
    for row in padded.reshape(rows, 1024):
        part = part + row
    w = 512
    while w:
        part[:w] = part[:w] + part[w:2 * w]
        w //= 2
    with np.errstate(over="ignore", invalid="ignore"):
        m = np.float32(part[0] / count)
    return np.float32(np.nan) if np.isnan(m) else m


def quantize_absmax(absmax, offset, code=None):
    """Second-level quantization: returns (qabsmax uint8[count], absmax2 float32[blocks])
    of v = absmax - offset in blocks of 256 (code: the dynamic map by default)."""
    code = create_dynamic_map() if code is None else np.asarray(code, dtype=np.float32)
    a = np.asarray(absmax, dtype=np.float32).reshape(-1)
    count = a.size
    v = (a - np.float32(offset)).astype(np.float32)
    vb, nb = _blocks(v, DQ_BLOCKSIZE)
    absmax2 = block_absmax(vb, count)
    scaled = bnb_mul(vb, bnb_rcp(absmax2)[:, None]).reshape(-1)[:count]
    return encode_dynamic(scaled, code), absmax2


def dequantize_absmax(qabsmax, absmax2, offset, code=None) -> np.ndarray:
    """absmax[i] = float32(bnb_mul(code[q[i]], absmax2[i // 256]) + offset)."""
    code = create_dynamic_map() if code is None else np.asarray(code, dtype=np.float32)
    q = np.asarray(qabsmax, dtype=np.uint8).reshape(-1)
    a2 = np.asarray(absmax2, dtype=np.float32).reshape(-1)[np.arange(q.size) // DQ_BLOCKSIZE]
    with np.errstate(invalid="ignore", over="ignore"):
        return (bnb_mul(code[q], a2) + np.float32(offset)).astype(np.float32)


def dequantize_4bit_dq(packed, qabsmax, absmax2, offset, n: int, quant_type: str = "nf4",
                       blocksize: int = DEFAULT_BLOCKSIZE, dtype=np.float32, code=None):
    """dequantize_4bit with the scales rebuilt by dequantize_absmax."""
    absmax = dequantize_absmax(qabsmax, absmax2, offset, code)
    return dequantize_4bit(packed, absmax, n, quant_type, blocksize, dtype)
