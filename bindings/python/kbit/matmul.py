"""Fused dequantize + matmul (SPEC section 6): y = x @ W.T (+ bias) for a quantized W.

    >>> q = kbit.quantize(w, k=4)              # w: (n_out, k_in)
    >>> y = kbit.matmul(x, q, bias)            # x: (..., k_in) -> y: (..., n_out)

W is read as stored (kbit, NF4/FP4 or GGUF blocks); no dequantized copy is made. numpy
x takes the CPU path (the `_host` entries); CUDA x of any framework takes the GPU path
on the framework's current stream, and y is allocated in x's framework. W must live
where x lives. Host bfloat16 is uint16 bits with dtype='bfloat16'.

A GPU call passes no workspace (always valid); callers who want the fastest path
call the C entry with kbit_matmul_workspace_bytes() of zeroed device memory.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import _arrays
from . import core as _kbit_format
from . import gguf as _gguf
from . import nf4 as _bnb4
from ._lib import KbitError, call, register
from .core import QuantizedTensor
from .nf4 import Quantized4bit

__all__ = ["matmul"]

_P, _I64, _INT, _F32, _SIZE = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float,
                               ctypes.c_size_t)
_DTYPE_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
_INVALID = 1

# Signatures: the shape arguments (x, m, k_in, n_out, dtype), the format's arguments,
# then (bias, y), and for the GPU entries (workspace, workspace_bytes, stream).
_SHAPE = [_P, _I64, _I64, _I64, _INT]
_GPU = [_P, _SIZE, _P]
_FORMAT_ARGS = {"kbit": [_P, _P, _INT, _F32, _P, _INT],  # packed, absmax, format, ts, codebook, k
                "nf4": [_P, _P, _INT],                    # packed, absmax, blocksize
                "fp4": [_P, _P, _INT],
                "gguf": [_INT, _P]}                       # ggml_type, blocks
for _family, _args in _FORMAT_ARGS.items():
    register(f"kbit_matmul_{_family}", _SHAPE + _args + [_P, _P] + _GPU)
    register(f"kbit_matmul_{_family}_host", _SHAPE + _args + [_P, _P])
register("kbit_matmul_workspace_bytes", [_I64, _I64, _I64], _I64)


# ---- the weight ---------------------------------------------------------------------

def _is_gguf(w) -> bool:
    return all(hasattr(w, a) for a in ("blocks", "ggml_type", "shape"))


def _weight_shape(w) -> tuple[int, int]:
    shape = tuple(w.shape)
    if len(shape) != 2:
        raise KbitError(f"the weight must be 2-D (n_out, k_in), got shape {shape}")
    return int(shape[0]), int(shape[1])


def _storage(w):
    """The array that tells where w lives."""
    if isinstance(w, (QuantizedTensor, Quantized4bit)):
        return w.packed
    if _is_gguf(w):
        return w.blocks
    raise KbitError(f"matmul takes a kbit.QuantizedTensor, kbit.Quantized4bit or GGUF tensor "
                    f"(blocks, ggml_type, shape), got {type(w).__name__}")


def _host_weight(w, n_out: int, k_in: int):
    """(C entry family, its format arguments, arrays to keep alive) for a host W."""
    if isinstance(w, QuantizedTensor):
        cb = _kbit_format._check_args(w.k, w.absmax_format, w.codebook)
        packed = _kbit_format._host_field(w.packed, "uint32", "packed", w)
        am = _kbit_format._host_field(w.absmax, _kbit_format._ABSMAX_NP[w.absmax_format],
                                      "absmax", w)
        _kbit_format._check_sizes(packed.size, am.size, w)
        args = [packed.ctypes.data, am.ctypes.data, _kbit_format._FORMAT_ID[w.absmax_format],
                ctypes.c_float(w.tensor_scale), cb.ctypes.data if cb is not None else None, w.k]
        return "kbit", args, (packed, am, cb)
    if isinstance(w, Quantized4bit):
        _bnb4._check_args(w.quant_type, w.blocksize)
        if w.nested and w.offset is None:
            raise KbitError("a nested state (absmax2 set) needs its offset")
        arrays = {"packed": _bnb4._host_bytes(w.packed, "uint8"),
                  "absmax": _bnb4._host_bytes(w.absmax, "uint8" if w.nested else "float32")}
        if w.nested:
            arrays["absmax2"] = _bnb4._host_bytes(w.absmax2, "float32")
            arrays["offset"] = _arrays.host_array(w.offset, np.float32).reshape(-1)
            if w.code is not None:
                arrays["code"] = _bnb4._host_bytes(w.code, "float32")
        _bnb4._check_state(w, {k: v.nbytes for k, v in arrays.items()})
        absmax = arrays["absmax"]
        if w.nested:  # expanded to float32 scales, as SPEC section 6 asks
            count = absmax.size
            absmax = np.empty(count, dtype=np.float32)
            code = arrays.get("code")
            call("kbit_nf4_dequantize_absmax_host", arrays["absmax"].ctypes.data,
                 arrays["absmax2"].ctypes.data, code.ctypes.data if code is not None else None,
                 arrays["offset"].ctypes.data, count, absmax.ctypes.data)
        args = [arrays["packed"].ctypes.data, absmax.ctypes.data, w.blocksize]
        return w.quant_type, args, (arrays, absmax)
    tid, raw = _gguf_blocks(w, n_out, k_in, on_device=False)
    return "gguf", [tid, raw.ctypes.data], raw


def _gguf_blocks(w, n_out: int, k_in: int, on_device: bool):
    """The ggml type id and the checked blocks (host: uint8 numpy, 2-byte aligned)."""
    tid = _gguf._type_id(w.ggml_type)
    elems, bsize = _gguf.block_info(tid)
    if k_in % elems:
        raise KbitError(f"k_in = {k_in} is not a multiple of the {_gguf._ggml_name(tid)} "
                        f"block size {elems}", _INVALID)
    need = n_out * (k_in // elems) * bsize
    if on_device:
        raw = _arrays.device_view(w.blocks)
    else:
        blocks = w.blocks
        if isinstance(blocks, (bytes, bytearray, memoryview)):
            blocks = np.frombuffer(blocks, dtype=np.uint8)
        raw = np.asarray(blocks)
        if not raw.flags.c_contiguous:
            raise KbitError("blocks must be a contiguous array of raw block bytes")
        raw = raw.reshape(-1).view(np.uint8)
        if raw.ctypes.data % 2:  # the C entries need 2-byte aligned blocks
            raw = raw.copy()
    if raw.nbytes != need:
        raise KbitError(f"a ({n_out}, {k_in}) {_gguf._ggml_name(tid)} tensor takes {need} "
                        f"bytes of blocks, got {raw.nbytes}")
    return tid, raw


def _device_weight(w, dev_x, n_out: int, k_in: int, stream: int):
    """(C entry family, its format arguments, arrays to keep alive) for a device W."""
    if isinstance(w, QuantizedTensor):
        cb = _kbit_format._check_args(w.k, w.absmax_format, w.codebook)
        packed, am = _arrays.device_view(w.packed), _arrays.device_view(w.absmax)
        if am is None:
            raise KbitError("packed is on the device but absmax is not")
        _kbit_format._check_sizes(packed.size, am.size, w)
        cb_dev = _arrays.to_device(cb, dev_x) if cb is not None else None
        args = [packed.ptr, am.ptr, _kbit_format._FORMAT_ID[w.absmax_format],
                ctypes.c_float(w.tensor_scale),
                _arrays.device_view(cb_dev).ptr if cb_dev is not None else None, w.k]
        return "kbit", args, (packed, am, cb_dev)
    if isinstance(w, Quantized4bit):
        _bnb4._check_args(w.quant_type, w.blocksize)
        if w.nested and w.offset is None:
            raise KbitError("a nested state (absmax2 set) needs its offset")
        views, keep = {"packed": _arrays.device_view(w.packed)}, []
        parts = {"absmax": w.absmax}
        if w.nested:
            parts.update(absmax2=w.absmax2, offset=w.offset)
            if w.code is not None:
                parts["code"] = w.code
        for key, arr in parts.items():
            v = _arrays.device_view(arr)
            if v is None:  # only the small state may come from the host (e.g. offset)
                if key in ("absmax", "absmax2") or not isinstance(arr, (np.ndarray, np.generic, float)):
                    raise KbitError(f"packed is on the device but {key} is not")
                arr = _arrays.to_device(np.asarray(arr, dtype=np.float32).reshape(-1), dev_x)
                keep.append(arr)
                v = _arrays.device_view(arr)
            views[key] = v
        _bnb4._check_state(w, {k: v.nbytes for k, v in views.items()})
        absmax = views["absmax"]
        if w.nested:  # expanded to float32 scales on the stream, as SPEC section 6 asks
            count = absmax.size
            expanded = _arrays.empty_device(dev_x, (count,), "float32")
            keep.append(expanded)
            code = views.get("code")
            call("kbit_nf4_dequantize_absmax", absmax.ptr, views["absmax2"].ptr,
                 code.ptr if code is not None else None, views["offset"].ptr, count,
                 _arrays.device_view(expanded).ptr, stream)
            absmax = _arrays.device_view(expanded)
        args = [views["packed"].ptr, absmax.ptr, w.blocksize]
        return w.quant_type, args, (views, keep)
    tid, raw = _gguf_blocks(w, n_out, k_in, on_device=True)
    return "gguf", [tid, raw.ptr], raw


# ---- x, bias and y ---------------------------------------------------------------------

def _host_x(x, dtype):
    """x as a C-ready numpy array and its dtype name (bfloat16: uint16 bits)."""
    arr = _arrays.host_array(x)
    want = _arrays.dtype_name(dtype) if dtype is not None else None
    if want == "bfloat16" or (want is None and arr.dtype == np.uint16):
        if arr.dtype != np.uint16:
            raise KbitError("host bfloat16 x is passed as uint16 bits with dtype='bfloat16'")
        if want is None:
            raise KbitError("uint16 x is read as bfloat16 bits only with dtype='bfloat16'")
        return arr, "bfloat16"
    name = arr.dtype.name
    if name not in ("float32", "float16"):
        raise KbitError(f"x must be float32, float16 or bfloat16 (uint16 bits with "
                        f"dtype='bfloat16'), got {name}")
    if want is not None and want != name:
        raise KbitError(f"x is {name} but dtype={want!r} was asked (x, bias and y share "
                        f"one dtype; convert x first)")
    return arr, name


def _rows(shape, k_in: int) -> int:
    if len(shape) == 0 or shape[-1] != k_in:
        raise KbitError(f"x must have shape (..., {k_in}) for a weight of k_in = {k_in}, "
                        f"got {tuple(shape)}")
    return int(np.prod(shape[:-1], dtype=np.int64))


def _check_bias(size: int, n_out: int):
    if size != n_out:
        raise KbitError(f"bias must have n_out = {n_out} elements, got {size}")


def matmul(x, w, bias=None, *, dtype=None, out=None):
    """y = x @ W.T (+ bias) with W = w dequantized, never materialised.

    w: a kbit.QuantizedTensor or kbit.Quantized4bit (NF4/FP4, nested states included) of
    shape (n_out, k_in), or a GGUF tensor (any object with blocks, ggml_type and shape
    (n_out, k_in)). x: shape (..., k_in), float32, float16 or bfloat16; the result has
    shape (..., n_out) and x's dtype, where x lives. bias: None or n_out elements of x's
    dtype, where x lives. dtype: only for host bfloat16 x, passed as uint16 bits with
    dtype='bfloat16' (bias and the result are then uint16 bits too). out: an optional
    preallocated result of x's dtype, where x lives. Products are accumulated in float32
    and the result rounded once.
    """
    storage = _storage(w)
    n_out, k_in = _weight_shape(w)
    dev = _arrays.device_view(x)
    w_on_device = _arrays.device_view(storage) is not None
    if (dev is not None) != w_on_device:
        where = ("the device", "the host") if dev is not None else ("the host", "the device")
        raise KbitError(f"x is on {where[0]} but the weight is on {where[1]}; move one of "
                        "them (kbit makes no implicit copies)")

    if dev is None:
        arr, name = _host_x(x, dtype)
        m = _rows(arr.shape, k_in)
        b = None
        if bias is not None:
            if _arrays.device_view(bias) is not None:
                raise KbitError("x is on the host but bias is on the device")
            b = _arrays.host_array(bias)
            if b.dtype != arr.dtype:
                raise KbitError(f"bias must have x's dtype ({name}), got {b.dtype}")
            _check_bias(b.size, n_out)
        out = _arrays.host_output(out, arr.shape[:-1] + (n_out,), name)
        family, args, _keep = _host_weight(w, n_out, k_in)  # _keep: arrays behind args
        call(f"kbit_matmul_{family}_host", arr.ctypes.data, m, k_in, n_out, _DTYPE_ID[name],
             *args, b.ctypes.data if b is not None else None, out.ctypes.data)
        return out

    if dev.dtype not in _DTYPE_ID:
        raise KbitError(f"x must be float32, float16 or bfloat16, got {dev.dtype}")
    if dtype is not None and _arrays.dtype_name(dtype) != dev.dtype:
        raise KbitError(f"x is {dev.dtype} but dtype={dtype!r} was asked")
    m = _rows(dev.shape, k_in)
    bias_ptr = None
    if bias is not None:
        bv = _arrays.device_view(bias)
        if bv is None:
            raise KbitError("x is on the device but bias is not")
        if bv.dtype != dev.dtype:
            raise KbitError(f"bias must have x's dtype ({dev.dtype}), got {bv.dtype}")
        _check_bias(bv.size, n_out)
        bias_ptr = bv.ptr
    out, out_view = _arrays.device_output(out, dev, tuple(dev.shape[:-1]) + (n_out,), dev.dtype)
    with _arrays.device_context(dev):
        stream = _arrays.current_stream(x)
        family, args, _keep = _device_weight(w, dev, n_out, k_in, stream)
        call(f"kbit_matmul_{family}", dev.ptr, m, k_in, n_out, _DTYPE_ID[dev.dtype], *args,
             bias_ptr, out_view.ptr, None, 0, stream)
    return out
