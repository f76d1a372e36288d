"""The kbit format from Python: quantize / dequantize numpy arrays (on the CPU) and
CUDA arrays of any framework (on the GPU, on the framework's current stream)."""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from ._quantized import QuantizedBase
from ._lib import KbitError, call, register

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_DTYPE_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
_FORMAT_ID = {"fp32": 0, "fp16": 1, "e4m4": 2}
_ABSMAX_NP = {"fp32": "float32", "fp16": "float16", "e4m4": "uint8"}
# Held by a checked GPU quantize from clearing the device's range flag (one per device,
# shared by every thread and stream) to reading it.
_RANGE_FLAG_LOCK = threading.Lock()

# One signature table, built from the same lists as the C instances.
for _suffix in ("", "_host"):
    _stream = [_P] if not _suffix else []
    register("kbit_quantize" + _suffix,
             [_P, _I64, ctypes.c_int, ctypes.c_int, _P, ctypes.c_int, ctypes.c_float, _P, _P] + _stream)
    register("kbit_dequantize" + _suffix,
             [_P, _P, ctypes.c_int, ctypes.c_float, _P, ctypes.c_int, _I64, ctypes.c_int, _P] + _stream)
    for _t in ("fp16", "bf16", "fp32"):
        for _k in (2, 3, 4, 5):
            register(f"cquantize_kbit_{_t}_k{_k}{_suffix}",
                     [_P, _I64, _P, ctypes.c_int, ctypes.c_float, _P, _P] + _stream)
            register(f"cdequantize_kbit_{_t}_k{_k}{_suffix}",
                     [_P, _P, ctypes.c_int, ctypes.c_float, _P, _I64, _P] + _stream)
register("kbit_compute_tensor_scale_host", [_P, _I64, ctypes.c_int, ctypes.c_int, _P])
register("kbit_compute_tensor_scale", [_P, _I64, ctypes.c_int, ctypes.c_int, _P, _P])
register("kbit_get_range_flag", [ctypes.POINTER(ctypes.c_int), ctypes.c_int])
register("kbit_default_codebook_host", [ctypes.c_int, _P])


@dataclass
class QuantizedTensor(QuantizedBase):
    """A kbit-quantized tensor: packed bit planes, block scales and how to read them.

    packed / absmax live where the input lived (numpy arrays, or device arrays of the
    input's framework). codebook is None for the built-in normal-float codebook."""
    packed: Any
    absmax: Any
    k: int
    shape: tuple
    dtype: str
    absmax_format: str = "e4m4"
    tensor_scale: float = 1.0
    codebook: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes plus scales."""
        n_blocks = (self.n + 31) // 32
        return n_blocks * self.k * 4 + n_blocks * {"fp32": 4, "fp16": 2, "e4m4": 1}[self.absmax_format]



def default_codebook(k: int) -> np.ndarray:
    """The library's built-in normal-float codebook for k (float32, 2^k entries)."""
    _check_k(k)
    cb = np.empty(1 << k, dtype=np.float32)
    call("kbit_default_codebook_host", k, cb.ctypes.data)
    return cb


def _check_k(k):
    if not _arrays.is_integer(k) or k not in (2, 3, 4, 5):
        raise KbitError(f"k must be 2..5, got {k!r}")


def _check_args(k: int, absmax: str, codebook):
    _check_k(k)
    if not isinstance(absmax, str) or absmax not in _FORMAT_ID:
        raise KbitError(f"absmax must be one of {sorted(_FORMAT_ID)}, got {absmax!r}")
    if codebook is None:
        return None
    cb = _arrays.host_array(np.asarray(codebook, dtype=np.float32).reshape(-1))
    if cb.size != 1 << k:
        raise KbitError(f"codebook for k={k} needs {1 << k} entries, got {cb.size}")
    if not np.all(np.isfinite(cb)):
        raise KbitError("codebook entries must be finite")
    return cb


def _host_input(x, dtype):
    arr = _arrays.host_array(x)
    if dtype is not None:
        name = _arrays.dtype_name(dtype)
        if name == "bfloat16":
            if arr.dtype != np.uint16:
                raise KbitError("host bfloat16 input is passed as uint16 bits with dtype='bfloat16'")
            return arr, name
        arr = arr.astype(name, copy=False)
    name = arr.dtype.name
    if name not in ("float32", "float16"):
        raise KbitError(f"input dtype must be float32, float16 or bfloat16 (uint16 bits with "
                        f"dtype='bfloat16'), got {name}")
    return arr, name


def quantize(x, k: int = 4, absmax: str = "e4m4", codebook=None,
             tensor_scale: float | None = None, dtype=None) -> QuantizedTensor:
    """Quantizes x to k bits per element in blocks of 32 (SPEC section 1).

    x: a numpy array (CPU path) or a CUDA array of any framework (GPU path, no copy,
    on the framework's current stream). absmax: 'e4m4' (1 byte per block), 'fp16' or
    'fp32'. codebook: 2^k floats, None for the built-in normal-float codebook.
    tensor_scale: None picks one so that every block fits the absmax format.
    dtype: only for host bfloat16, passed as uint16 bits with dtype='bfloat16'.
    """
    cb = _check_args(k, absmax, codebook)
    fmt = _FORMAT_ID[absmax]
    dev = _arrays.device_view(x)
    if dev is None:
        arr, name = _host_input(x, dtype)
        n = arr.size
        ts = ctypes.c_float(1.0)
        if tensor_scale is not None:
            ts.value = float(tensor_scale)
        elif absmax != "fp32":  # fp32 scales hold any finite absmax
            call("kbit_compute_tensor_scale_host", arr.ctypes.data, n, _DTYPE_ID[name], fmt,
                 ctypes.byref(ts))
        n_blocks = (n + 31) // 32
        packed = np.empty(n_blocks * k, dtype=np.uint32)
        am = np.empty(n_blocks, dtype=_ABSMAX_NP[absmax])
        call("kbit_quantize_host", arr.ctypes.data, n, _DTYPE_ID[name], k,
             cb.ctypes.data if cb is not None else None, fmt, ts, am.ctypes.data,
             packed.ctypes.data)
        return QuantizedTensor(packed, am, k, tuple(arr.shape), name, absmax, ts.value, cb)

    if dev.dtype not in _DTYPE_ID:
        raise KbitError(f"input dtype must be float32, float16 or bfloat16, got {dev.dtype}")
    with _arrays.device_context(dev):
        return _quantize_device(x, dev, k, absmax, fmt, cb, tensor_scale)


def _quantize_device(x, dev, k, absmax, fmt, cb, tensor_scale) -> QuantizedTensor:
    stream = _arrays.current_stream(x)
    n = dev.size
    ts = ctypes.c_float(1.0)
    if tensor_scale is not None:
        ts.value = float(tensor_scale)
    elif absmax != "fp32":  # fp32 scales hold any finite absmax
        call("kbit_compute_tensor_scale", dev.ptr, n, _DTYPE_ID[dev.dtype], fmt,
             ctypes.byref(ts), stream)
    n_blocks = (n + 31) // 32
    packed = _arrays.empty_device(dev, (n_blocks * k,), "uint32")
    am = _arrays.empty_device(dev, (n_blocks,), _ABSMAX_NP[absmax])
    cb_dev = _arrays.to_device(cb, dev) if cb is not None else None
    args = (dev.ptr, n, _DTYPE_ID[dev.dtype], k,
            _arrays.device_view(cb_dev).ptr if cb_dev is not None else None, fmt, ts,
            _arrays.device_view(am).ptr, _arrays.device_view(packed).ptr, stream)
    # The device flag reports blocks that do not fit: over the range (only possible
    # with a caller's tensor_scale) or NaN/Inf with E4M4 (which has no NaN). Other
    # calls cannot raise it and need no check.
    if absmax == "e4m4" or tensor_scale is not None:
        # One flag per device for every thread and stream: the lock keeps another
        # thread's clear or read from landing between this call's clear and read.
        with _RANGE_FLAG_LOCK:
            call("kbit_get_range_flag", ctypes.byref(ctypes.c_int()), 1)
            call("kbit_quantize", *args)
            raised = ctypes.c_int()
            call("kbit_get_range_flag", ctypes.byref(raised), 1)
        if raised.value:
            raise KbitError(f"a block does not fit the {absmax} absmax format at "
                            f"tensor_scale={ts.value}: it holds NaN/Inf (E4M4 cannot "
                            "represent them: use absmax='fp16' or 'fp32') or exceeds the "
                            "range (pass tensor_scale=None to let kbit choose it)", 4)
    else:
        call("kbit_quantize", *args)
    return QuantizedTensor(packed, am, k, tuple(dev.shape), dev.dtype, absmax, ts.value, cb)



def dequantize(q: QuantizedTensor, dtype=None, out=None):
    """Dequantizes q to `dtype` (default: the quantized input's dtype), where q lives.

    Host results for bfloat16 are uint16 bit patterns. out: an optional preallocated
    output (numpy or device array) of q.n elements.
    """
    name = _arrays.dtype_name(dtype) if dtype is not None else q.dtype
    if name not in _DTYPE_ID:
        raise KbitError(f"output dtype must be float32, float16 or bfloat16, got {name}")
    cb = _check_args(q.k, q.absmax_format, q.codebook)
    fmt = _FORMAT_ID[q.absmax_format]
    dev = _arrays.device_view(q.packed)
    n = q.n
    if dev is None:
        packed = _host_field(q.packed, "uint32", "packed", q)
        am = _host_field(q.absmax, _ABSMAX_NP[q.absmax_format], "absmax", q)
        _check_sizes(packed.size, am.size, q)
        out = _arrays.host_output(out, q.shape, name)
        call("kbit_dequantize_host", packed.ctypes.data, am.ctypes.data, fmt,
             ctypes.c_float(q.tensor_scale), cb.ctypes.data if cb is not None else None, q.k,
             n, _DTYPE_ID[name], out.ctypes.data)
        return out

    am = _arrays.device_view(q.absmax)
    if am is None:
        raise KbitError("packed is on the device but absmax is not")
    _check_sizes(dev.size, am.size, q)
    out, out_view = _arrays.device_output(out, dev, q.shape, name)
    with _arrays.device_context(dev):
        cb_dev = _arrays.to_device(cb, dev) if cb is not None else None
        call("kbit_dequantize", dev.ptr, am.ptr, fmt, ctypes.c_float(q.tensor_scale),
             _arrays.device_view(cb_dev).ptr if cb_dev is not None else None, q.k, n,
             _DTYPE_ID[name], out_view.ptr, _arrays.current_stream(q.packed))
    return out


def _host_field(a, dtype: str, what: str, q: QuantizedTensor) -> np.ndarray:
    """A host field of q as `dtype` values. Integer codes and float scales are never
    converted into each other: that would read E4M4 codes as fp16 scales, or truncate
    scales into codes, when the field and q.absmax_format disagree."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "iuf" or (arr.dtype.kind == "f") != (np.dtype(dtype).kind == "f"):
        raise KbitError(f"{what} must hold {dtype} values for absmax_format="
                        f"{q.absmax_format!r}, got {arr.dtype}")
    return _arrays.host_array(arr, dtype)


def _check_sizes(packed_size: int, absmax_size: int, q: QuantizedTensor):
    n_blocks = (q.n + 31) // 32
    if packed_size != n_blocks * q.k:
        raise KbitError(f"packed has {packed_size} words, expected {n_blocks * q.k}")
    if absmax_size != n_blocks:
        raise KbitError(f"absmax has {absmax_size} entries, expected {n_blocks}")
