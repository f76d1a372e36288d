"""Every C function's ctypes signature in one table: SIGNATURES[name] = (argtypes,
restype), built from the same lists as the C instances (include/kbit.h, SPEC sections
4 and 6). _lib.function() applies it on first use, so a symbol the loaded library lacks
(an older build) only fails when it is called.
"""
from __future__ import annotations

import ctypes

__all__ = ["SIGNATURES", "C_TYPES", "KS", "BNB4_FORMATS", "GGUF_TYPES"]

# The lists the C side instantiates its per-type symbols from.
C_TYPES = ("fp16", "bf16", "fp32")        # element types, T in the names
KS = (2, 3, 4, 5)                         # kbit bit widths
BNB4_FORMATS = ("nf4", "fp4")             # bitsandbytes' 4-bit formats
GGUF_TYPES = ("q4_0", "q8_0", "q4_K", "q5_K", "q6_K")  # ggml block types

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int                       # also the enums: kbit_dtype, kbit_absmax_format
_F32 = ctypes.c_float
_STATUS = ctypes.c_int                    # kbit_status
_STREAM = (_P,)                           # kbit_stream_t
_WORKSPACE = (_P, ctypes.c_size_t, _P)    # workspace, workspace_bytes, stream

SIGNATURES: dict[str, tuple[tuple, type]] = {}


def _add(name: str, argtypes, restype=_STATUS) -> None:
    SIGNATURES[name] = (tuple(argtypes), restype)


def _launch(name: str, argtypes, tail=_STREAM) -> None:
    """A launch function (argtypes + tail) and its `_host` twin (argtypes alone)."""
    _add(name, tuple(argtypes) + tail)
    _add(name + "_host", argtypes)


# Library information and errors
_add("kbit_version", (), _INT)
_add("kbit_status_string", (_STATUS,), ctypes.c_char_p)
_add("kbit_last_error_message", (), ctypes.c_char_p)
_add("kbit_cuda_available", (), _INT)

# kbit format: sizes, scales, codebook
_add("kbit_packed_words", (_I64, _INT), _I64)
_add("kbit_absmax_bytes", (_I64, _INT), _I64)
_add("kbit_e4m4_decode", (ctypes.c_uint8,), _F32)
_launch("kbit_compute_tensor_scale", (_P, _I64, _INT, _INT, _P))
_add("kbit_get_range_flag", (ctypes.POINTER(ctypes.c_int), _INT))
_add("kbit_default_codebook_host", (_INT, _P))
_add("kbit_codebook_host", (_INT, _INT, _P))
_launch("kbit_fit_codebook", (_P, _P, _I64, _INT, _INT, _P), tail=_WORKSPACE)
_add("kbit_fit_codebook_workspace_bytes", (), _I64)

# kbit quantize / dequantize: per (type, K) and generic
for _t in C_TYPES:
    for _k in KS:
        _launch(f"cquantize_kbit_{_t}_k{_k}", (_P, _I64, _P, _INT, _F32, _P, _P))
        _launch(f"cdequantize_kbit_{_t}_k{_k}", (_P, _P, _INT, _F32, _P, _I64, _P))
_launch("kbit_quantize", (_P, _I64, _INT, _INT, _P, _INT, _F32, _P, _P))
_launch("kbit_quantize_ex", (_P, _P, _I64, _INT, _INT, _P, _INT, _F32, _P, _P, _P))
_launch("kbit_dequantize", (_P, _P, _INT, _F32, _P, _INT, _I64, _INT, _P))

# NF4 / FP4 (bitsandbytes)
_add("kbit_nf4_packed_bytes", (_I64,), _I64)
_add("kbit_nf4_absmax_count", (_I64, _INT), _I64)
_add("kbit_nf4_absmax2_count", (_I64,), _I64)
_add("kbit_nf4_dynamic_map_host", (_P,))
for _f in BNB4_FORMATS:
    for _t in C_TYPES:
        _launch(f"cquantize_{_f}_{_t}", (_P, _I64, _INT, _P, _P))
        _launch(f"cdequantize_{_f}_{_t}", (_P, _P, _I64, _INT, _P))
        _launch(f"cdequantize_{_f}_dq_{_t}", (_P, _P, _P, _P, _P, _I64, _INT, _P))
_launch("kbit_nf4_absmax_mean", (_P, _I64, _P))
_launch("kbit_nf4_quantize_absmax", (_P, _I64, _P, _P, _P, _P))
_launch("kbit_nf4_dequantize_absmax", (_P, _P, _P, _P, _I64, _P))
_launch("kbit_nf4_to_kbit", (_P, _P, _I64, _INT, _INT, _P, _P))

# GGUF blocks
_add("kbit_gguf_block_info", (_INT, ctypes.POINTER(_I64), ctypes.POINTER(_I64)))
for _q in GGUF_TYPES:
    for _t in C_TYPES:
        _launch(f"cdequantize_{_q}_{_t}", (_P, _I64, _P))
_launch("kbit_gguf_dequantize", (_INT, _P, _I64, _INT, _P))
_launch("kbit_gguf_to_kbit", (_INT, _P, _I64, _INT, _P, _P))

# Fused dequantize + matmul (SPEC section 6): x, m, k_in, n_out, dtype, the weight's
# fields, bias, y; the launch versions add workspace, workspace_bytes and stream.
_MATMUL_HEAD = (_P, _I64, _I64, _I64, _INT)
_MATMUL_WEIGHT = {
    "kbit": (_P, _P, _INT, _F32, _P, _INT),   # packed, absmax, format, tensor_scale,
                                              # codebook, k
    "nf4": (_P, _P, _INT),                    # packed, absmax (float32), blocksize
    "fp4": (_P, _P, _INT),
    "gguf": (_INT, _P),                       # ggml_type, blocks
    "kbit_tiled": (_P, _P, _INT, _F32, _P, _INT),  # tiled packed, tiled absmax, format,
                                                   # tensor_scale, codebook, k
}
for _fmt, _weight in _MATMUL_WEIGHT.items():
    _launch(f"kbit_matmul_{_fmt}", _MATMUL_HEAD + _weight + (_P, _P), tail=_WORKSPACE)
_add("kbit_matmul_workspace_bytes", (_I64, _I64, _I64), _I64)

# Tiled kbit weights (the matmul's one-time repack): sizes, tile, untile.
_add("kbit_tiled_packed_bytes", (_I64, _I64, _INT), _I64)
_add("kbit_tiled_absmax_bytes", (_I64, _I64, _INT), _I64)
_launch("kbit_tile", (_P, _P, _INT, _INT, _I64, _I64, _P, _P))
_launch("kbit_untile", (_P, _P, _INT, _INT, _I64, _I64, _P, _P))

del _t, _k, _f, _q, _fmt, _weight
