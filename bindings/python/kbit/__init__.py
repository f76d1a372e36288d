"""kbit: k-bit blockwise quantization of LLM weights (GPU and CPU), over ctypes.

Host arrays are numpy arrays; device arrays of any framework are taken through DLPack
or __cuda_array_interface__ without copies. kbit.reference is the pure numpy ground
truth for every format.
"""
from ._lib import KbitError, cuda_available, version
from .kbit import (QuantizedTensor, codebook, default_codebook, dequantize, fit_codebook,
                   quantize)
from .bnb4 import (Quantized4bit, dequantize_4bit, dequantize_fp4, dequantize_nf4,
                   quantize_4bit, quantize_fp4, quantize_nf4)
from . import gguf  # kbit.gguf.load, kbit.gguf.dequantize
from .gguf import GGUFTensor
from .matmul import matmul
from .tiled import TiledTensor, tile, untile
from .checkpoint import load, save

__all__ = ["GGUFTensor", "KbitError", "Quantized4bit", "QuantizedTensor", "cuda_available",
           "codebook", "default_codebook", "fit_codebook", "dequantize", "dequantize_4bit", "dequantize_fp4",
           "dequantize_nf4", "gguf", "load", "matmul", "quantize", "quantize_4bit", "quantize_fp4",
           "quantize_nf4", "save", "tile", "TiledTensor", "untile", "version"]


def __getattr__(name):
    # The version is the loaded library's (include/kbit.h is its one source).
    if name == "__version__":
        return "%d.%d.%d" % version()
    raise AttributeError(f"module 'kbit' has no attribute {name!r}")
