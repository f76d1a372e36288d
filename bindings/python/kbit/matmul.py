"""Fused dequantize + matmul (SPEC section 6): y = x @ W.T (+ bias) for a quantized W.

    >>> q = kbit.quantize(w, k=4)              # w: (n_out, k_in)
    >>> y = kbit.matmul(x, q, bias)            # x: (..., k_in) -> y: (..., n_out)

W is read as stored (kbit, NF4/FP4 or GGUF blocks); no dequantized copy is made. numpy
x takes the CPU path (the `_host` entries); CUDA x of any framework takes the GPU path
on the framework's current stream, and y is allocated in x's framework. W must live
where x lives. Host bfloat16 is uint16 bits with dtype='bfloat16'.

A GPU call whose shape wants a split-K workspace (kbit_matmul_workspace_bytes) takes it
from a cache of zeroed buffers, one per device and stream (calls on one stream never run
at the same time; every call leaves its workspace zeroed again).
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from . import _arrays, _lib
from . import bnb4 as _bnb4
from . import gguf as _gguf
from . import kbit as _kbit
from ._lib import KbitError, status_code
from .bnb4 import Quantized4bit
from . import tiled as _tiled
from .kbit import QuantizedTensor
from .tiled import TiledTensor

__all__ = ["matmul"]


def _is_gguf(w) -> bool:
    return all(hasattr(w, a) for a in ("blocks", "ggml_type", "shape"))


def _storage(w):
    """The array that tells where w lives."""
    if isinstance(w, (QuantizedTensor, TiledTensor, Quantized4bit)):
        return w.packed
    if _is_gguf(w):
        return w.blocks
    raise KbitError(f"matmul takes a kbit.QuantizedTensor, kbit.TiledTensor, kbit.Quantized4bit "
                    f"or GGUF tensor (blocks, ggml_type, shape), got {type(w).__name__}")


def _weight_shape(w) -> tuple[int, int]:
    shape = tuple(w.shape)
    if len(shape) != 2:
        raise KbitError(f"the weight must be 2-D (n_out, k_in), got shape {shape}")
    return int(shape[0]), int(shape[1])


def _weight(w, wplace: _arrays.Place, place: _arrays.Place, n_out: int, k_in: int):
    """(C entry family, its format arguments, views to keep alive) for W. Its fields are
    viewed where W lives (`wplace`); uploads and the nested scales' expansion go through
    x's place (`place`, the device and stream of the call)."""
    if isinstance(w, QuantizedTensor):
        cb = _kbit._check_args(w.k, w.absmax_format, w.codebook)
        packed = wplace.view(w.packed, "packed",
                             lambda a: _kbit._host_field(a, "uint32", "packed", w))
        am = wplace.view(w.absmax, "absmax", lambda a: _kbit._host_field(
            a, _kbit._ABSMAX_NP[w.absmax_format], "absmax", w))
        _kbit._check_sizes(packed.size, am.size, w)
        cb_here = place.upload_cached(cb) if cb is not None else None
        args = [packed.ptr, am.ptr, _kbit._FORMAT_ID[w.absmax_format],
                ctypes.c_float(w.tensor_scale), place.ptr(cb_here), w.k]
        return "kbit", args, (packed, am, cb_here)
    if isinstance(w, TiledTensor):
        args, keep = _tiled.matmul_args(w, wplace, place)
        return "kbit_tiled", args, keep
    if isinstance(w, Quantized4bit):  # a nested state expanded first (SPEC section 6)
        packed, absmax, keep = _bnb4.float32_state(w, wplace, place)
        return w.quant_type, [packed, absmax, w.blocksize], keep
    tid = _gguf._type_id(w.ggml_type)
    elems, bsize = _gguf.block_info(tid)
    name = _gguf.ggml_name(tid)
    if k_in % elems:
        raise KbitError(f"k_in = {k_in} is not a multiple of the {name} block size {elems}",
                        status_code("KBIT_ERROR_INVALID_ARGUMENT"))
    blocks = wplace.view(w.blocks, "blocks", _gguf._host_blocks)
    need = n_out * (k_in // elems) * bsize
    if blocks.nbytes != need:
        raise KbitError(f"a ({n_out}, {k_in}) {name} tensor takes {need} bytes of blocks, "
                        f"got {blocks.nbytes}")
    return "gguf", [tid, blocks.ptr], blocks


_workspaces: dict = {}  # (framework, device, stream) -> zeroed device buffer
_outgrown: list = []  # buffers replaced by larger ones, kept for the graphs that captured them
_workspace_lock = threading.Lock()


def _workspace(place: _arrays.Place, m: int, k_in: int, n_out: int):
    """(pointer, bytes) of the zeroed workspace for a GPU call; (None, 0) when the shape
    needs none. Buffers grow; an outgrown one is kept alive, since a captured CUDA graph
    may still name it."""
    need = _lib.size("kbit_matmul_workspace_bytes", m, k_in, n_out)
    if need <= 0:
        return None, 0
    key = (place.framework, place.device_id, place.stream)
    with _workspace_lock:
        buf = _workspaces.get(key)
        if buf is None or _arrays.device_view(buf).nbytes < need:
            # allocated and zeroed by the framework, not copied from the host, so that
            # a first call inside a CUDA graph capture works too
            size = need
            if buf is not None:  # doubling: a handful of outgrown buffers at most
                _outgrown.append(buf)
                size = max(need, 2 * _arrays.device_view(buf).nbytes)
            buf = place.empty((size,), "uint8")
            buf.zero_() if hasattr(buf, "zero_") else buf.fill(0)
            _workspaces[key] = buf
    return place.ptr(buf), need


def _call(place: _arrays.Place, name: str, workspace, *args) -> None:
    """Place.call for a matmul entry: the launch versions take (workspace,
    workspace_bytes) before the stream."""
    place.call(name, *args, *(workspace if place.on_device else ()))


def _rows(shape, k_in: int) -> int:
    if len(shape) == 0 or shape[-1] != k_in:
        raise KbitError(f"x must have shape (..., {k_in}) for a weight of k_in = {k_in}, "
                        f"got {tuple(shape)}")
    return int(np.prod(shape[:-1], dtype=np.int64))


def matmul(x, w, bias=None, *, dtype=None, out=None):
    """y = x @ W.T (+ bias) with W = w dequantized, never materialised.

    w: a kbit.QuantizedTensor, kbit.TiledTensor (kbit.tile: the fastest on the GPU for
    fp16/bf16 x; float32 or unaligned x untile it for the call) or
    kbit.Quantized4bit (NF4/FP4, nested states included) of shape (n_out, k_in), or a GGUF tensor (kbit.gguf.GGUFTensor, or any object with
    blocks, ggml_type and shape (n_out, k_in)). x: shape (..., k_in), float32, float16
    or bfloat16; the result has shape (..., n_out) and x's dtype, where x lives. bias:
    None or n_out elements of x's dtype, where x lives. dtype: only for host bfloat16 x,
    passed as uint16 bits with dtype='bfloat16' (bias and the result are then uint16
    bits too). out: an optional preallocated result of x's dtype, where x lives.
    Products are accumulated in float32 and the result rounded once.
    """
    wplace = _arrays.place_of(_storage(w), "packed")
    n_out, k_in = _weight_shape(w)
    want = _arrays.float_dtype(dtype, "x") if dtype is not None else None
    fx = _arrays.float_input(x, "bfloat16" if want == "bfloat16" else None)
    place = fx.place
    place.what = "x"  # names x in the errors of the views below
    if place.on_device != wplace.on_device:
        where = ("the device", "the host") if place.on_device else ("the host", "the device")
        raise KbitError(f"x is on {where[0]} but the weight is on {where[1]}; move one of "
                        "them (kbit makes no implicit copies)")
    if place.device_id != wplace.device_id:
        raise KbitError(f"the weight is on cuda:{wplace.device_id} but x on "
                        f"cuda:{place.device_id}")
    if want is not None and want != fx.dtype:
        raise KbitError(f"x is {fx.dtype} but dtype={want!r} was asked (x, bias and y share "
                        f"one dtype; convert x first)")
    m = _rows(fx.shape, k_in)
    if isinstance(w, TiledTensor) and place.on_device and (fx.dtype == "float32" or fx.ptr % 16):
        # The tiled GPU kernels take fp16/bf16 x on 16-byte boundaries; other x are
        # multiplied by the stored weight (a temporary untiled copy: correct, not fast).
        w = _tiled.untile(w)
    b = None
    if bias is not None:
        b = place.view(bias, "bias")
        b_dtype = fx.dtype if place.on_device else _arrays.host_dtype(fx.dtype)
        if b.dtype != b_dtype:
            raise KbitError(f"bias must have x's dtype ({fx.dtype}), got {b.dtype}")
        if b.size != n_out:
            raise KbitError(f"bias must have n_out = {n_out} elements, got {b.size}")
    out, out_ptr = place.output(out, fx.shape[:-1] + (n_out,), fx.dtype)
    with place.active():
        family, args, _keep = _weight(w, wplace, place, n_out, k_in)  # _keep: behind args
        ws = _workspace(place, m, k_in, n_out) if place.on_device else None
        _call(place, f"kbit_matmul_{family}", ws, fx.ptr, m, k_in, n_out, fx.dtype_id, *args,
              b.ptr if b is not None else None, out_ptr)
    return out
