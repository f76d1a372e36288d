"""GGUF (llama.cpp) tensors: dequantize ggml blocks on the GPU or the CPU, load files.

The quantized bytes go to the GPU exactly as they are stored and are dequantized
there (SPEC section 3); a file is memory-mapped and never goes through a float32
copy on the CPU. Supported block types: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; F32, F16 and
BF16 tensors pass through unchanged.

    >>> tensors = kbit.gguf.load("model.gguf", device="cuda", dtype="float16")
    >>> w = kbit.gguf.dequantize(raw_bytes, "Q4_K", n, "bfloat16")
    >>> raw = kbit.gguf.load("model.gguf", device="cuda", dequantize=False)
    >>> w = kbit.gguf.dequantize(raw["blk.0.ffn_up.weight"], dtype="float16")

Host results for bfloat16 are uint16 bit patterns (numpy has no bfloat16). This module
is the block API; the file reader behind load() is kbit._gguf_file.
"""
from __future__ import annotations

import ctypes
import operator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from . import _arrays
from . import kbit as _kbit
from ._lib import KbitError, call, status_code
from ._quantized import QuantizedBase

__all__ = ["GGML_TYPES", "GGUFTensor", "Q4_0_CODEBOOK", "block_info", "dequantize", "load",
           "read_header", "to_kbit"]

# ggml type ids kbit dequantizes.
GGML_TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
_TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}


def ggml_name(type_id: int) -> str:
    """ggml's name for a type id, from the gguf package when it knows it."""
    try:
        from gguf import GGMLQuantizationType
        return GGMLQuantizationType(type_id).name
    except Exception:
        return _TYPE_NAMES.get(type_id, f"type {type_id}")


def _type_id(ggml_type) -> int:
    """A ggml type given as an id, a gguf.GGMLQuantizationType or a name ('Q4_K')."""
    if isinstance(ggml_type, str):
        for name, tid in GGML_TYPES.items():
            if name.upper() == ggml_type.upper():
                return tid
        raise KbitError(f"unsupported GGUF block type {ggml_type!r} "
                        f"(supported: {', '.join(GGML_TYPES)})")
    try:
        tid = operator.index(ggml_type)  # an int or IntEnum; 12.5 is no type id
    except TypeError:
        raise KbitError(f"not a ggml type: {ggml_type!r}") from None
    if not 0 <= tid < 2 ** 31:  # what the C int holds, so its message names this id
        raise KbitError(f"not a ggml type: {ggml_type!r}")
    return tid


def block_info(ggml_type) -> tuple[int, int]:
    """(elements, bytes) per block of a supported ggml type."""
    elems, nbytes = ctypes.c_int64(), ctypes.c_int64()
    call("kbit_gguf_block_info", _type_id(ggml_type), ctypes.byref(elems), ctypes.byref(nbytes))
    return elems.value, nbytes.value


@dataclass
class GGUFTensor(QuantizedBase):
    """A tensor of ggml blocks as a GGUF file stores them.

    blocks: the raw block bytes (a uint8 numpy array, or a device array of the input's
    framework); ggml_type: the ggml type id (GGML_TYPES); shape: numpy order, last
    dimension innermost (GGUF lists dimensions innermost first)."""
    blocks: Any
    ggml_type: int
    shape: tuple

    _DATA: ClassVar[str] = "blocks"

    @property
    def type_name(self) -> str:
        return ggml_name(self.ggml_type)

    @property
    def nbytes(self) -> int:
        """Bytes of blocks."""
        elems, nbytes = block_info(self.ggml_type)
        return self.n // elems * nbytes


def _host_blocks(blocks) -> np.ndarray:
    raw = np.asarray(blocks)
    if not raw.flags.c_contiguous:
        raise KbitError("blocks must be a contiguous array of raw block bytes")
    raw = raw.reshape(-1).view(np.uint8)
    if raw.ctypes.data % 2:  # GGUF data may sit at an odd offset (alignment 1):
        raw = raw.copy()     # the C functions need 2-byte aligned blocks
    return raw


def _blocks_view(blocks, tid: int, n: int):
    """(place, view) of the raw blocks of n elements of type tid, refused (KbitError) where
    they are not n / block_elems * block_bytes bytes."""
    elems, bsize = block_info(tid)
    need = n // elems * bsize
    place = _arrays.place_of(blocks, "blocks")
    view = place.view(blocks, "blocks", _host_blocks)
    if view.nbytes != need:
        raise KbitError(f"{n} {ggml_name(tid)} elements take {need} bytes of blocks, "
                        f"got {view.nbytes}", status_code("KBIT_ERROR_INVALID_ARGUMENT"))
    return place, view


def dequantize(blocks, ggml_type=None, n: int | None = None, dtype="float32", out=None):
    """Dequantizes n elements stored as ggml blocks of `ggml_type`.

    blocks: the raw block bytes (n / block_elems * block_bytes bytes), a numpy array
    (CPU path) or a CUDA array of any framework (GPU path, no copy, on the framework's
    current stream); or a GGUFTensor, whose type and element count are then used
    (ggml_type and n may be left out) and whose shape the result takes. n must be a
    multiple of the block size (32 or 256). Returns an array of n elements of `dtype`
    (flat for raw blocks) where the blocks live (host bfloat16: uint16 bits), or fills
    `out` (same place, n elements) and returns it.
    """
    shape = None
    if isinstance(blocks, GGUFTensor):
        t = blocks
        if ((ggml_type is not None and _type_id(ggml_type) != t.ggml_type)
                or (n is not None and n != t.n)):
            raise KbitError(f"ggml_type={ggml_type!r}, n={n!r} disagree with the GGUFTensor "
                            f"({t.type_name}, {t.n} elements)",
                            status_code("KBIT_ERROR_INVALID_ARGUMENT"))
        blocks, ggml_type, n, shape = t.blocks, t.ggml_type, t.n, t.shape
    elif ggml_type is None or n is None:
        raise KbitError("dequantize needs ggml_type and n for raw blocks")
    tid = _type_id(ggml_type)
    elems, bsize = block_info(tid)
    try:
        n = operator.index(n)  # 512.7 elements must not become 512
    except TypeError:
        raise KbitError(f"n must be an integer element count, got {n!r}",
                        status_code("KBIT_ERROR_INVALID_ARGUMENT")) from None
    if n < 0 or n % elems:
        raise KbitError(f"n = {n} is not a non-negative multiple of the "
                        f"{ggml_name(tid)} block size {elems}",
                        status_code("KBIT_ERROR_INVALID_ARGUMENT"))
    name = _arrays.float_dtype(dtype)
    place, view = _blocks_view(blocks, tid, n)
    out, out_ptr = place.output(out, shape or (n,), name)
    with place.active():
        place.call("kbit_gguf_dequantize", tid, view.ptr, n, _arrays.DTYPE_ID[name], out_ptr)
    return out


# The kbit codebook of a Q4_0 weight as kbit K = 4 (to_kbit): entry c is c - 8.
Q4_0_CODEBOOK = np.arange(-8, 8, dtype=np.float32)


def to_kbit(t: GGUFTensor, absmax: str = "fp16"):
    """A Q4_0 GGUFTensor as the kbit K = 4 weight (kbit.QuantizedTensor) that dequantizes
    to exactly the same float32 values, where t lives (kbit_gguf_to_kbit): the codes are
    the nibbles, the block scales the blocks' fp16 d ('fp16', 4.5 bits a weight as Q4_0's
    own; or widened, 'fp32'), the codebook Q4_0_CODEBOOK. kbit.tile(t) tiles that weight
    for kbit.matmul. Other types have per-block mins no kbit weight holds: KbitError."""
    bad = status_code("KBIT_ERROR_INVALID_ARGUMENT")
    if not isinstance(t, GGUFTensor):
        raise KbitError(f"to_kbit takes a kbit.gguf.GGUFTensor, got {type(t).__name__}", bad)
    if absmax not in ("fp16", "fp32"):
        raise KbitError(f"absmax must be 'fp16' or 'fp32', got {absmax!r}", bad)
    if t.ggml_type != GGML_TYPES["Q4_0"]:
        raise KbitError(f"only Q4_0 converts to kbit exactly, got {t.type_name}", bad)
    n = t.n
    place, view = _blocks_view(t.blocks, t.ggml_type, n)
    words, entries = _kbit._sizes(n, 4, absmax)
    with place.active():
        packed = place.empty((words,), "uint32")
        scales = place.empty((entries,), _kbit._ABSMAX_NP[absmax])
        place.call("kbit_gguf_to_kbit", t.ggml_type, view.ptr, n, _kbit._FORMAT_ID[absmax],
                   place.ptr(packed), place.ptr(scales))
    return _kbit.QuantizedTensor(packed, scales, 4, tuple(t.shape), "float32", absmax, 1.0,
                                 Q4_0_CODEBOOK.copy())


# The file reader is its own module; it builds on the block API above.
from ._gguf_file import load, read_header  # noqa: E402
