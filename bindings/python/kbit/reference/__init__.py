"""Pure numpy ground truth for every kbit format (no library needed)."""
from .kbit import (RangeError, create_normal_float_codebook, decode_e4m4,
                   dequantize_kbit, encode_e4m4, pack_bitplanes, quantize_kbit,
                   sqnr_db, unpack_bitplanes)
__all__ = ["RangeError", "create_normal_float_codebook", "decode_e4m4", "dequantize_kbit",
           "encode_e4m4", "pack_bitplanes", "quantize_kbit", "sqnr_db", "unpack_bitplanes"]
# @@FAMILY-REFERENCES@@ (one line per format family)
from . import nf4  # noqa: F401  (kbit.reference.nf4.quantize_4bit, dequantize_4bit, ...)
from .gguf import GGML_BLOCK_INFO, GGML_TYPES, dequantize_gguf  # noqa: F401
