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

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from ._quantized import QuantizedBase
from ._lib import KbitError, call, register

__all__ = ["Quantized4bit", "quantize_4bit", "dequantize_4bit", "quantize_nf4",
           "dequantize_nf4", "quantize_fp4", "dequantize_fp4", "dynamic_map"]

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DQ_BLOCKSIZE = 256
_TYPE_TAG = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int

# Signatures, from the same (format, type) lists as the C instances.
for _sfx in ("", "_host"):
    _s = [] if _sfx else [_P]
    for _fmt in ("nf4", "fp4"):
        for _t in _TYPE_TAG.values():
            register(f"cquantize_{_fmt}_{_t}{_sfx}", [_P, _I64, _INT, _P, _P] + _s)
            register(f"cdequantize_{_fmt}_{_t}{_sfx}", [_P, _P, _I64, _INT, _P] + _s)
            register(f"cdequantize_{_fmt}_dq_{_t}{_sfx}", [_P] * 5 + [_I64, _INT, _P] + _s)
    register("kbit_nf4_absmax_mean" + _sfx, [_P, _I64, _P] + _s)
    register("kbit_nf4_quantize_absmax" + _sfx, [_P, _I64, _P, _P, _P, _P] + _s)
    register("kbit_nf4_dequantize_absmax" + _sfx, [_P, _P, _P, _P, _I64, _P] + _s)
register("kbit_nf4_dynamic_map_host", [_P])
register("kbit_nf4_packed_bytes", [_I64], _I64)
register("kbit_nf4_absmax_count", [_I64, _INT], _I64)
register("kbit_nf4_absmax2_count", [_I64], _I64)


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
        blocks = -(-self.n // self.blocksize)
        if not self.nested:
            return (self.n + 1) // 2 + 4 * blocks
        return (self.n + 1) // 2 + blocks + 4 * -(-blocks // DQ_BLOCKSIZE) + 4


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


def _check_args(quant_type: str, blocksize: int):
    if quant_type not in ("nf4", "fp4"):
        raise KbitError(f"quant_type must be 'nf4' or 'fp4', got {quant_type!r}")
    if not _arrays.is_integer(blocksize) or blocksize not in BLOCKSIZES:
        raise KbitError(f"blocksize must be one of {BLOCKSIZES}, got {blocksize!r}")


def _host_input(x, dtype):
    arr = _arrays.host_array(x)
    if dtype is not None and _arrays.dtype_name(dtype) == "bfloat16":
        if arr.dtype != np.uint16:
            raise KbitError("host bfloat16 input is passed as uint16 bits with dtype='bfloat16'")
        return arr, "bfloat16"
    if dtype is not None:
        arr = arr.astype(_arrays.dtype_name(dtype), copy=False)
    if arr.dtype.name not in ("float32", "float16"):
        raise KbitError(f"input dtype must be float32, float16 or bfloat16 (uint16 bits with "
                        f"dtype='bfloat16'), got {arr.dtype.name}")
    return arr, arr.dtype.name


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
    dev = _arrays.device_view(x)
    if dev is None:
        arr, name = _host_input(x, dtype)
        n = arr.size
        blocks = -(-n // blocksize)
        packed = np.empty((n + 1) // 2, dtype=np.uint8)
        absmax = np.empty(blocks, dtype=np.float32)
        call(f"cquantize_{quant_type}_{_TYPE_TAG[name]}_host", arr.ctypes.data, n, blocksize,
             absmax.ctypes.data, packed.ctypes.data)
        q = Quantized4bit(packed, absmax, tuple(arr.shape), name, blocksize, quant_type)
        if compress_statistics and blocks:
            offset = np.empty(1, dtype=np.float32)
            call("kbit_nf4_absmax_mean_host", absmax.ctypes.data, blocks, offset.ctypes.data)
            qabsmax = np.empty(blocks, dtype=np.uint8)
            absmax2 = np.empty(-(-blocks // DQ_BLOCKSIZE), dtype=np.float32)
            call("kbit_nf4_quantize_absmax_host", absmax.ctypes.data, blocks, None,
                 offset.ctypes.data, qabsmax.ctypes.data, absmax2.ctypes.data)
            q.absmax, q.absmax2, q.offset = qabsmax, absmax2, offset
        return q

    if dev.dtype not in _TYPE_TAG:
        raise KbitError(f"input dtype must be float32, float16 or bfloat16, got {dev.dtype}")
    stream = _arrays.current_stream(x)
    n = dev.size
    blocks = -(-n // blocksize)
    packed = _arrays.empty_device(dev, ((n + 1) // 2,), "uint8")
    absmax = _arrays.empty_device(dev, (blocks,), "float32")
    am = _arrays.device_view(absmax)
    call(f"cquantize_{quant_type}_{_TYPE_TAG[dev.dtype]}", dev.ptr, n, blocksize, am.ptr,
         _arrays.device_view(packed).ptr, stream)
    q = Quantized4bit(packed, absmax, tuple(dev.shape), dev.dtype, blocksize, quant_type)
    if compress_statistics and blocks:
        offset = _arrays.empty_device(dev, (1,), "float32")
        qabsmax = _arrays.empty_device(dev, (blocks,), "uint8")
        absmax2 = _arrays.empty_device(dev, (-(-blocks // DQ_BLOCKSIZE),), "float32")
        off = _arrays.device_view(offset).ptr
        call("kbit_nf4_absmax_mean", am.ptr, blocks, off, stream)
        call("kbit_nf4_quantize_absmax", am.ptr, blocks, None, off,
             _arrays.device_view(qabsmax).ptr, _arrays.device_view(absmax2).ptr, stream)
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


def _nbytes_of(arr) -> int:
    dev = _arrays.device_view(arr)
    return dev.nbytes if dev is not None else np.asarray(arr).nbytes


def _check_state(q: Quantized4bit, sizes: dict):
    n, blocks = q.n, -(-q.n // q.blocksize)
    want = {"packed": (n + 1) // 2, "absmax": blocks * (1 if q.nested else 4)}
    if q.nested:
        want.update(absmax2=4 * -(-blocks // DQ_BLOCKSIZE), offset=4)
        if q.code is not None:
            want["code"] = 4 * 256
    for name, size in want.items():
        # packed may carry a storage type's padding; the scales count blocks, so any
        # other size means the state does not match the shape or blocksize
        if sizes[name] < size or (name != "packed" and sizes[name] != size):
            raise KbitError(f"{name} has {sizes[name]} bytes, needs {size} for "
                            f"shape {q.shape} and blocksize {q.blocksize}")


def _host_bytes(a, dtype):
    # float32 values are read in native order from an aligned copy where needed (a
    # big-endian array is converted, not viewed); bytes are taken as they are stored
    arr = _arrays.host_array(a) if dtype != "uint8" else np.ascontiguousarray(a)
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
    _check_args(q.quant_type, q.blocksize)
    name = _arrays.dtype_name(dtype) if dtype is not None else q.dtype
    if name not in _TYPE_TAG:
        raise KbitError(f"output dtype must be float32, float16 or bfloat16, got {name}")
    if q.nested and q.offset is None:
        raise KbitError("a nested state (absmax2 set) needs its offset")
    tag, n = _TYPE_TAG[name], q.n
    dev = _arrays.device_view(q.packed)
    if dev is None:
        arrays = {"packed": _host_bytes(q.packed, "uint8"),
                  "absmax": _host_bytes(q.absmax, "uint8" if q.nested else "float32")}
        if q.nested:
            arrays["absmax2"] = _host_bytes(q.absmax2, "float32")
            arrays["offset"] = _arrays.host_array(q.offset, np.float32).reshape(-1)
            if q.code is not None:
                arrays["code"] = _host_bytes(q.code, "float32")
        _check_state(q, {k: v.nbytes for k, v in arrays.items()})
        out = _arrays.host_output(out, q.shape, name)
        if q.nested:
            code = arrays.get("code")
            call(f"cdequantize_{q.quant_type}_dq_{tag}_host", arrays["packed"].ctypes.data,
                 arrays["absmax"].ctypes.data, arrays["absmax2"].ctypes.data,
                 code.ctypes.data if code is not None else None,
                 arrays["offset"].ctypes.data, n, q.blocksize, out.ctypes.data)
        else:
            call(f"cdequantize_{q.quant_type}_{tag}_host", arrays["packed"].ctypes.data,
                 arrays["absmax"].ctypes.data, n, q.blocksize, out.ctypes.data)
        return out

    views = {"packed": dev}
    parts = {"absmax": q.absmax}
    if q.nested:
        parts.update(absmax2=q.absmax2, offset=q.offset)
        if q.code is not None:
            parts["code"] = q.code
    for key, arr in parts.items():
        v = _arrays.device_view(arr)
        if v is None:  # small host-side state (e.g. a float offset): copy it over
            if key in ("absmax", "absmax2") and not isinstance(arr, np.ndarray):
                raise KbitError(f"packed is on the device but {key} is not")
            dtype_k = "uint8" if key == "absmax" and q.nested else "float32"
            arr = _arrays.to_device(np.asarray(arr, dtype=dtype_k).reshape(-1), dev)
            parts[key] = arr
            v = _arrays.device_view(arr)
        views[key] = v
    _check_state(q, {k: v.nbytes for k, v in views.items()})
    out, ov = _arrays.device_output(out, dev, q.shape, name)
    stream = _arrays.current_stream(q.packed)
    if q.nested:
        code = views.get("code")
        call(f"cdequantize_{q.quant_type}_dq_{tag}", dev.ptr, views["absmax"].ptr,
             views["absmax2"].ptr, code.ptr if code is not None else None,
             views["offset"].ptr, n, q.blocksize, ov.ptr, stream)
    else:
        call(f"cdequantize_{q.quant_type}_{tag}", dev.ptr, views["absmax"].ptr, n,
             q.blocksize, ov.ptr, stream)
    return out


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
