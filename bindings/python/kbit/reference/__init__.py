"""Pure numpy ground truth for every kbit format (no library needed)."""
from .kbit import (RangeError, create_normal_float_codebook, decode_e4m4,
                   dequantize_kbit, encode_e4m4, pack_bitplanes, quantize_kbit,
                   sqnr_db, unpack_bitplanes)
__all__ = ["RangeError", "create_normal_float_codebook", "decode_e4m4", "dequantize_kbit",
           "encode_e4m4", "pack_bitplanes", "quantize_kbit", "sqnr_db", "unpack_bitplanes"]
# @@FAMILY-REFERENCES@@ (one line per format family)
