"""Pure numpy ground truth for every kbit format (no library needed):
kbit (this namespace), kbit.reference.nf4 (NF4/FP4) and kbit.reference.gguf."""
from . import nf4
from .gguf import GGML_BLOCK_INFO, GGML_TYPES, dequantize_gguf
from .kbit import (RangeError, create_nf0_codebook, create_normal_float_codebook,
                   create_uniform_codebook, decode_e4m4,
                   dequantize_kbit, encode_e4m4, pack_bitplanes, quantize_kbit,
                   sqnr_db, unpack_bitplanes)

__all__ = ["GGML_BLOCK_INFO", "GGML_TYPES", "RangeError", "create_nf0_codebook",
           "create_normal_float_codebook", "create_uniform_codebook",
           "decode_e4m4", "dequantize_gguf", "dequantize_kbit", "encode_e4m4", "nf4",
           "pack_bitplanes", "quantize_kbit", "sqnr_db", "unpack_bitplanes"]
