"""Pure numpy dequantization of the GGUF (ggml) block formats kbit supports.

Written from the format description (SPEC section 3) and checked against the `gguf`
package in the tests. Every function takes the raw bytes of whole blocks (uint8, any
shape, taken flat) and returns float32 values in ggml's element order, computed the way
ggml does: float32 products, each rounded before the min is subtracted.

Layouts (little-endian, fp16 fields as IEEE half):
  Q4_0 (32 elements, 18 bytes):  d fp16 | qs[16]; x[i] = d * (nibble - 8), elements
                                  0..15 in the low nibbles of qs, 16..31 in the high.
  Q8_0 (32 elements, 34 bytes):  d fp16 | qs int8[32]; x[i] = d * qs[i].
  Q4_K (256 elements, 144 bytes): d fp16 | dmin fp16 | scales[12] | qs[128]; 8
                                  sub-blocks of 32, each with a 6-bit scale sc and min m;
                                  x = (d*sc) * q - (dmin*m).
  Q5_K (256 elements, 176 bytes): d | dmin | scales[12] | qh[32] | qs[128]; as Q4_K with
                                  a 5th bit: bit s of qh[l] for element l of sub-block s.
  Q6_K (256 elements, 210 bytes): ql[128] | qh[64] | scales int8[16] | d fp16; 16
                                  sub-blocks of 16; x = (d*scale) * (q - 32).
"""
from __future__ import annotations

import numpy as np

__all__ = ["GGML_TYPES", "GGML_BLOCK_INFO", "dequantize_gguf", "dequantize_q4_0",
           "dequantize_q8_0", "dequantize_q4_K", "dequantize_q5_K", "dequantize_q6_K",
           "unpack_scale_min_k4"]

QK_K = 256

# ggml type id -> name, and name -> (elements per block, bytes per block)
GGML_TYPES = {2: "Q4_0", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
GGML_BLOCK_INFO = {"Q4_0": (32, 18), "Q8_0": (32, 34), "Q4_K": (QK_K, 144),
                   "Q5_K": (QK_K, 176), "Q6_K": (QK_K, 210)}


def _blocks(raw, name: str) -> np.ndarray:
    elems, nbytes = GGML_BLOCK_INFO[name]
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size % nbytes:
        raise ValueError(f"{name}: {raw.size} bytes is not a whole number of "
                         f"{nbytes}-byte blocks")
    return raw.reshape(-1, nbytes)


def _half(b: np.ndarray) -> np.ndarray:
    """Two-byte little-endian columns -> float32 (exact)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def dequantize_q4_0(raw) -> np.ndarray:
    b = _blocks(raw, "Q4_0")
    d = _half(b[:, 0:2])                                     # (nb, 1)
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32) - 8
    return (d * q.astype(np.float32)).reshape(-1)


def dequantize_q8_0(raw) -> np.ndarray:
    b = _blocks(raw, "Q8_0")
    d = _half(b[:, 0:2])
    q = b[:, 2:34].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def unpack_scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes per block -> (scale, min), each (nb, 8) integers in 0..63.

    Sub-blocks 0..3 use the low 6 bits of bytes s (scale) and s+4 (min); sub-blocks
    4..7 take their low 4 bits from byte s+4 (scale: low nibble, min: high nibble) and
    their top 2 bits from the top bits of bytes s-4 (scale) and s (min)."""
    s = scales.astype(np.int32)
    lo_sc, lo_m, mix = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 63, (mix & 15) | ((lo_sc >> 6) << 4)], axis=1)
    mn = np.concatenate([lo_m & 63, (mix >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, mn


def _k_scales(b: np.ndarray):
    d = _half(b[:, 0:2])
    dmin = _half(b[:, 2:4])
    sc, mn = unpack_scale_min_k4(b[:, 4:16])
    d1 = (d * sc.astype(np.float32))[:, :, None]             # (nb, 8, 1)
    m1 = (dmin * mn.astype(np.float32))[:, :, None]
    return d1, m1


def _nibbles_k(qs: np.ndarray) -> np.ndarray:
    """qs (nb, 128) -> 4-bit values (nb, 8, 32): chunk c holds sub-blocks 2c (low
    nibbles) and 2c+1 (high nibbles)."""
    chunks = qs.reshape(-1, 4, 1, 32)
    return ((chunks >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15).reshape(-1, 8, 32)


def dequantize_q4_K(raw) -> np.ndarray:
    b = _blocks(raw, "Q4_K")
    d1, m1 = _k_scales(b)
    q = _nibbles_k(b[:, 16:144]).astype(np.float32)
    return (d1 * q - m1).reshape(-1)


def dequantize_q5_K(raw) -> np.ndarray:
    b = _blocks(raw, "Q5_K")
    d1, m1 = _k_scales(b)
    qh = b[:, 16:48]                                         # (nb, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (_nibbles_k(b[:, 48:176]) | (high << 4)).astype(np.float32)
    return (d1 * q - m1).reshape(-1)


def dequantize_q6_K(raw) -> np.ndarray:
    b = _blocks(raw, "Q6_K")
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 2, 32)                   # (half, ql chunk, l)
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)                 # (half, -, l)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)  # (nb, 16)
    d = _half(b[:, 208:210])
    # quadrant r of a half: ql chunk r&1, nibble r>>1; high bits 2r of qh
    low = np.stack([ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4],
                   axis=2)                                   # (nb, 2, 4, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.int32) - 32            # (nb, 2, 4, 32)
    ds = (d * scales).reshape(nb, 16, 1)                     # per 16 elements
    return (ds * q.reshape(nb, 16, 16).astype(np.float32)).reshape(-1)


_DEQUANT = {"Q4_0": dequantize_q4_0, "Q8_0": dequantize_q8_0, "Q4_K": dequantize_q4_K,
            "Q5_K": dequantize_q5_K, "Q6_K": dequantize_q6_K}


def dequantize_gguf(raw, ggml_type) -> np.ndarray:
    """Dequantizes whole blocks of `ggml_type` (a name such as 'Q4_K' or ggml's numeric
    id) to a flat float32 array."""
    if isinstance(ggml_type, (int, np.integer)):  # numpy ids too (GGUFReader fields)
        name = GGML_TYPES.get(int(ggml_type), ggml_type)
    else:
        name = str(ggml_type)
    if name not in _DEQUANT:
        raise ValueError(f"unsupported GGUF block type {ggml_type!r}")
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf scales stay NaN/inf
        return _DEQUANT[name](raw)
