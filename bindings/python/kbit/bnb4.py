"""NF4 / FP4 from Python: bitsandbytes-compatible 4-bit quantization (SPEC section 2).

quantize_nf4 / quantize_fp4 (or quantize_4bit) give a Quantized4bit whose arrays hold
exactly the bytes of bitsandbytes' quantize_4bit (packed uint8, float32 absmax; with
compress_statistics=True the uint8 qabsmax, float32 absmax2 and offset of its nested
state). Quantized4bit.from_bnb() takes a bitsandbytes (packed, QuantState) pair as it
is, so a model moves between the two without conversion.

numpy arrays take the CPU path; CUDA arrays of any framework take the GPU path with no
copy, on the framework's current stream. Host bfloat16 is uint16 bits with
dtype='bfloat16'.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from ._quantized import QuantizedBase
from ._lib import KbitError, call, size

__all__ = ["Quantized4bit", "quantize_4bit", "dequantize_4bit", "quantize_nf4",
           "dequantize_nf4", "quantize_fp4", "dequantize_fp4", "dynamic_map", "table"]

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DQ_BLOCKSIZE = 256


def _sizes(n: int, blocksize: int) -> tuple[int, int, int]:
    """(packed bytes, absmax entries, absmax2 entries) of n elements, from the
    library's size helpers."""
    blocks = size("kbit_nf4_absmax_count", n, blocksize)
    return size("kbit_nf4_packed_bytes", n), blocks, size("kbit_nf4_absmax2_count", blocks)


@dataclass
class Quantized4bit(QuantizedBase):
    """A tensor in bitsandbytes' 4-bit layout; field names follow its QuantState.

    packed: uint8[(n+1)//2]. absmax: float32[ceil(n/blocksize)], or uint8 codes of the
    same length when nested (compress_statistics), with absmax2 (float32 per 256
    blocks), offset (float32[1]) and code (the 256-entry dynamic map; None means the
    built-in one, which is bitsandbytes' default). Arrays live where the input lived.
    """
    packed: Any
    absmax: Any
    shape: tuple
    dtype: str
    blocksize: int = 64
    quant_type: str = "nf4"
    absmax2: Any = None
    offset: Any = None
    code: Any = None

    @property
    def nested(self) -> bool:
        return self.absmax2 is not None

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes plus scales."""
        packed, blocks, blocks2 = _sizes(self.n, self.blocksize)
        if not self.nested:
            return packed + 4 * blocks
        return packed + blocks + 4 * blocks2 + 4

    @classmethod
    def from_bnb(cls, packed, quant_state) -> "Quantized4bit":
        """Wraps bitsandbytes' (packed, QuantState) pair without copying: any object
        with QuantState's attributes (absmax, shape, dtype, blocksize, quant_type, and
        when nested: offset and state2 with absmax, code, blocksize) works."""
        qs = quant_state
        nested = bool(getattr(qs, "nested", False)) or getattr(qs, "state2", None) is not None
        q = cls(packed, qs.absmax, tuple(int(d) for d in qs.shape), _arrays.dtype_name(qs.dtype),
                int(qs.blocksize), str(qs.quant_type))
        if nested:
            s2 = getattr(qs, "state2", None)
            if s2 is None:
                raise KbitError("a nested quant_state needs state2 (absmax, code, blocksize)")
            if int(getattr(s2, "blocksize", DQ_BLOCKSIZE)) != DQ_BLOCKSIZE:
                raise KbitError(f"nested absmax blocksize must be {DQ_BLOCKSIZE}, "
                                f"got {s2.blocksize}")
            q.absmax2, q.code, q.offset = s2.absmax, s2.code, qs.offset
        return q


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed dynamic map (256 float32 values), the nested-state code."""
    code = np.empty(256, dtype=np.float32)
    call("kbit_nf4_dynamic_map_host", code.ctypes.data)
    return code


def table(quant_type: str) -> np.ndarray:
    """The 16 float32 values of the 'nf4' or 'fp4' codes, indexed by code, as the library
    dequantizes them."""
    _check_args(quant_type, 64)
    codes = np.arange(16, dtype=np.uint8)
    packed = (codes[0::2] << 4) | codes[1::2]
    values = np.empty(16, dtype=np.float32)
    call(f"cdequantize_{quant_type}_fp32_host", packed.ctypes.data,
         np.ones(1, np.float32).ctypes.data, 16, 32, values.ctypes.data)
    return values


def _check_args(quant_type: str, blocksize: int):
    if quant_type not in ("nf4", "fp4"):
        raise KbitError(f"quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    if not _arrays.is_integer(blocksize) or blocksize not in BLOCKSIZES:
        raise KbitError(f"blocksize must be one of {BLOCKSIZES}, got {blocksize!r}")


def quantize_4bit(x, quant_type: str = "nf4", blocksize: int = 64,
                  compress_statistics: bool = False, dtype=None) -> Quantized4bit:
    """Quantizes x as bitsandbytes' quantize_4bit does, to the same bytes.

    x: a numpy array (CPU) or a CUDA array of any framework (GPU, no copy).
    compress_statistics: also quantize the absmax values (bitsandbytes' nested
    state). The offset is kbit's mean of absmax (float64 sum, fixed order), which can
    differ from bitsandbytes' torch mean in the last bit; pass both to
    kbit_nf4_quantize_absmax yourself to reuse another offset.
    dtype: only for host bfloat16, passed as uint16 bits with dtype='bfloat16'.
    """
    _check_args(quant_type, blocksize)
    x = _arrays.float_input(x, dtype)
    place = x.place
    packed_bytes, blocks, blocks2 = _sizes(x.size, blocksize)
    with place.active():
        packed = place.empty((packed_bytes,), "uint8")
        absmax = place.empty((blocks,), "float32")
        am = place.ptr(absmax)
        place.call(f"cquantize_{quant_type}_{_arrays.C_TYPE[x.dtype]}", x.ptr, x.size,
                   blocksize, am, place.ptr(packed))
        q = Quantized4bit(packed, absmax, x.shape, x.dtype, blocksize, quant_type)
        if compress_statistics and blocks:
            offset = place.empty((1,), "float32")
            qabsmax = place.empty((blocks,), "uint8")
            absmax2 = place.empty((blocks2,), "float32")
            place.call("kbit_nf4_absmax_mean", am, blocks, place.ptr(offset))
            place.call("kbit_nf4_quantize_absmax", am, blocks, None, place.ptr(offset),
                       place.ptr(qabsmax), place.ptr(absmax2))
            q.absmax, q.absmax2, q.offset = qabsmax, absmax2, offset
    return q


def quantize_nf4(x, blocksize: int = 64, compress_statistics: bool = False,
                 dtype=None) -> Quantized4bit:
    """quantize_4bit(x, 'nf4', ...)."""
    return quantize_4bit(x, "nf4", blocksize, compress_statistics, dtype)


def quantize_fp4(x, blocksize: int = 64, compress_statistics: bool = False,
                 dtype=None) -> Quantized4bit:
    """quantize_4bit(x, 'fp4', ...)."""
    return quantize_4bit(x, "fp4", blocksize, compress_statistics, dtype)


def _check_state(q: Quantized4bit, sizes: dict):
    packed, blocks, blocks2 = _sizes(q.n, q.blocksize)
    want = {"packed": packed, "absmax": blocks * (1 if q.nested else 4)}
    if q.nested:
        want.update(absmax2=4 * blocks2, offset=4)
        if q.code is not None:
            want["code"] = 4 * 256
    for name, need in want.items():
        # packed may carry a storage type's padding; the scales count blocks, so any
        # other size means the state does not match the shape or blocksize
        if sizes[name] < need or (name != "packed" and sizes[name] != need):
            raise KbitError(f"{name} has {sizes[name]} bytes, needs {need} for "
                            f"shape {q.shape} and blocksize {q.blocksize}")


def _host_bytes(a, dtype):
    # float32 values are read in native order from an aligned copy where needed (a
    # big-endian array is converted, not viewed); bytes are taken as they are stored
    arr = _arrays.host_array(a) if dtype != "uint8" else np.ascontiguousarray(a)
    if arr.dtype.kind not in "iuf":  # None, objects, strings: not a field of a state
        raise KbitError(f"expected a {dtype} array, got {arr.dtype}")
    if arr.dtype != np.dtype(dtype):
        if arr.dtype.itemsize == np.dtype(dtype).itemsize or dtype == "uint8":
            arr = arr.view(dtype)  # same bytes (e.g. bitsandbytes' quant_storage)
        else:
            raise KbitError(f"expected a {dtype} array, got {arr.dtype}")
    return arr.reshape(-1)


def dequantize_4bit(q: Quantized4bit, out=None, dtype=None):
    """Dequantizes q to `dtype` (default: the quantized input's), where q lives.

    Host results for bfloat16 are uint16 bit patterns. out: an optional preallocated
    output (numpy or device array) of q.n elements."""
    name = _arrays.float_dtype(dtype) if dtype is not None else q.dtype
    place = _arrays.place_of(q.packed, "packed")
    views = _views(q, place)
    out, out_ptr = place.output(out, q.shape, name)
    tag = _arrays.C_TYPE[name]
    with place.active():
        if q.nested:
            code = views.get("code")
            place.call(f"cdequantize_{q.quant_type}_dq_{tag}", views["packed"].ptr,
                       views["absmax"].ptr, views["absmax2"].ptr,
                       code.ptr if code is not None else None, views["offset"].ptr, q.n,
                       q.blocksize, out_ptr)
        else:
            place.call(f"cdequantize_{q.quant_type}_{tag}", views["packed"].ptr,
                       views["absmax"].ptr, q.n, q.blocksize, out_ptr)
    return out


def _field(place: _arrays.Place, key: str, arr, nested: bool) -> _arrays.DeviceArray:
    """A field of a 4-bit state as a pointer view where packed lives. On the device, a
    small host-side part (a float offset, the code, numpy scales) is copied over."""
    dtype = "uint8" if key == "packed" or (key == "absmax" and nested) else "float32"
    if key == "offset" and not place.on_device:
        return place.view(arr, key, lambda a: _arrays.host_array(a, np.float32).reshape(-1))
    if place.on_device and key != "packed" and _arrays.device_view(arr) is None:
        if key in ("absmax", "absmax2") and not isinstance(arr, np.ndarray):
            raise KbitError(f"packed is on the device but {key} is not")
        arr = place.upload(np.asarray(arr, dtype=dtype).reshape(-1))
    return place.view(arr, key, lambda a: _host_bytes(a, dtype))


def _views(w: Quantized4bit, place: _arrays.Place) -> dict:
    """The pointer views of a 4-bit weight's arrays where `place` is (packed, absmax and,
    nested, absmax2, offset and code), its arguments and sizes checked."""
    _check_args(w.quant_type, w.blocksize)
    if w.nested and w.offset is None:
        raise KbitError("a nested state (absmax2 set) needs its offset")
    parts = {"packed": w.packed, "absmax": w.absmax}
    if w.nested:
        parts.update(absmax2=w.absmax2, offset=w.offset)
        if w.code is not None:
            parts["code"] = w.code
    views = {key: _field(place, key, arr, w.nested) for key, arr in parts.items()}
    _check_state(w, {key: v.nbytes for key, v in views.items()})
    return views


def float32_state(w: Quantized4bit, wplace: _arrays.Place, place: _arrays.Place):
    """(packed pointer, float32 absmax pointer, objects to keep alive) of a 4-bit weight
    where it lives (`wplace`), a nested state expanded to float32 scales first on `place`
    (kbit_nf4_dequantize_absmax), as the matmul and kbit.tile take it."""
    views = _views(w, wplace)
    absmax = views["absmax"].ptr
    expanded = None
    if w.nested:
        count = views["absmax"].size
        expanded = place.empty((count,), "float32")
        code = views.get("code")
        place.call("kbit_nf4_dequantize_absmax", absmax, views["absmax2"].ptr,
                   code.ptr if code is not None else None, views["offset"].ptr, count,
                   place.ptr(expanded))
        absmax = place.ptr(expanded)
    return views["packed"].ptr, absmax, (views, expanded)


def dequantize_nf4(q: Quantized4bit, out=None, dtype=None):
    """dequantize_4bit for an NF4 tensor (raises for FP4)."""
    if q.quant_type != "nf4":
        raise KbitError(f"dequantize_nf4 got a {q.quant_type} tensor")
    return dequantize_4bit(q, out, dtype)


def dequantize_fp4(q: Quantized4bit, out=None, dtype=None):
    """dequantize_4bit for an FP4 tensor (raises for NF4)."""
    if q.quant_type != "fp4":
        raise KbitError(f"dequantize_fp4 got a {q.quant_type} tensor")
    return dequantize_4bit(q, out, dtype)
