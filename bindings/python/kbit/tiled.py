"""Tiled kbit weights: a one-time repack of a kbit weight for the fused matmul.

    >>> q = kbit.quantize(w, k=4)        # w: (n_out, k_in), k_in a multiple of 32
    >>> t = kbit.tile(q)                 # same bits, in the order the GPU matmul reads them
    >>> y = kbit.matmul(x, t)            # the same result as kbit.matmul(x, q), faster
    >>> q2 = kbit.untile(t)              # q's bytes back, exactly

An NF4 / FP4 weight tiles too: kbit.tile(kbit.quantize_nf4(w)) is the kbit K = 4 weight
with the format's 16-entry table as codebook and w's scales (half where they are half
values, else float32) that dequantizes to the same float32 values (from_4bit,
kbit_nf4_to_kbit), tiled; kbit.untile gives that kbit weight. So does a Q4_0 GGUF weight
(kbit.gguf.to_kbit: its nibbles as codes, its fp16 d as scales, the codebook c - 8).

The layout is written out in csrc/formats/kbit_tiled.h (rows in tiles of 16, blocks in
groups of 4, zero padding to whole tiles). The arrays live where q lives; tile and untile
run on q's device and stream (or on the CPU for numpy).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
import numpy as np

from . import _arrays
from . import bnb4 as _bnb4
from . import gguf as _gguf
from . import kbit as _kbit
from ._lib import KbitError, size
from .bnb4 import Quantized4bit
from .kbit import QuantizedTensor

__all__ = ["TiledTensor", "tile", "untile", "from_4bit"]


@dataclass
class TiledTensor(_kbit.KbitFields):
    """A kbit weight of shape (n_out, k_in) in the tiled layout: `packed` and `absmax` are
    uint8 arrays of kbit_tiled_packed_bytes / kbit_tiled_absmax_bytes bytes, numpy or
    device arrays of the source's framework; the other fields are QuantizedTensor's."""

    @property
    def nbytes(self) -> int:
        return sum(_sizes(self.shape, self.k, self.absmax_format))


def _shape(shape) -> tuple[int, int]:
    shape = tuple(int(d) for d in shape)
    if len(shape) != 2 or shape[1] % 32:
        raise KbitError(f"a tiled weight is 2-D (n_out, k_in) with k_in a multiple of 32, "
                        f"got shape {shape}")
    return shape


def _sizes(shape, k: int, absmax: str) -> tuple[int, int]:
    n_out, k_in = _shape(shape)
    return (size("kbit_tiled_packed_bytes", n_out, k_in, k),
            size("kbit_tiled_absmax_bytes", n_out, k_in, _kbit._FORMAT_ID[absmax]))


def _aligned_empty(place: _arrays.Place, nbytes: int):
    """nbytes of uint8 where `place` is, 16-byte aligned (the C functions require it)."""
    if place.on_device:  # framework allocations are at least 256-byte aligned
        return place.empty((nbytes,), "uint8")
    raw = np.empty(nbytes + 16, dtype=np.uint8)
    start = (-raw.ctypes.data) % 16
    return raw[start:start + nbytes]


def _bytes_view(place: _arrays.Place, arr, what: str, nbytes: int):
    view = place.view(arr, what, lambda a: np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    if view.nbytes != nbytes:
        raise KbitError(f"{what} has {view.nbytes} bytes, the tiled layout needs {nbytes}")
    return view


def _checked(t, cls, what: str):
    """(n_out, k_in) of a 2-D kbit tensor t of class cls, its arguments checked."""
    if not isinstance(t, cls):
        raise KbitError(f"{what} takes a kbit.{cls.__name__}, got {type(t).__name__}")
    shape = _shape(t.shape)
    _kbit._check_args(t.k, t.absmax_format, t.codebook)
    return shape


def from_4bit(w: Quantized4bit, absmax: str | None = None) -> QuantizedTensor:
    """The kbit K = 4 weight (the NF4 or FP4 table as codebook, tensor_scale 1) that
    dequantizes exactly as the 4-bit weight w does: its codes and scales as they are
    (kbit_nf4_to_kbit), where w lives. absmax: the scales' format, 'fp16' (4.5 bits a
    weight, as w's own; where every scale is a half value, as the absmax of float16
    weights is, else KbitError) or 'fp32' (5 bits); None: 'fp16' where it is exact, else
    'fp32'. Reading the scales synchronises with w's device (not in a CUDA graph capture;
    pass absmax='fp32' there)."""
    if not isinstance(w, Quantized4bit):
        raise KbitError(f"from_4bit takes a kbit.Quantized4bit, got {type(w).__name__}")
    if absmax not in (None, "fp16", "fp32"):
        raise KbitError(f"absmax must be 'fp16', 'fp32' or None, got {absmax!r}")
    place = _arrays.place_of(w.packed, "packed")
    n = w.n
    with place.active():
        packed, scales, (views, expanded) = _bnb4.float32_state(w, place, place)
        if absmax != "fp32":
            half = _half_values(expanded if expanded is not None else views["absmax"].owner)
            if absmax == "fp16" and not half:
                raise KbitError("absmax='fp16': the 4-bit weight's scales are not all half "
                                "values (use 'fp32' or None)")
            absmax = "fp16" if half else "fp32"
        words, entries = _kbit._sizes(n, 4, absmax)
        packed_out = place.empty((words,), "uint32")
        absmax_out = place.empty((entries,), _kbit._ABSMAX_NP[absmax])
        place.call("kbit_nf4_to_kbit", packed, scales, n, w.blocksize, _kbit._FORMAT_ID[absmax],
                   place.ptr(packed_out), place.ptr(absmax_out))
    return QuantizedTensor(packed_out, absmax_out, 4, tuple(w.shape), w.dtype, absmax, 1.0,
                           _bnb4.table(w.quant_type))


def _half_values(scales) -> bool:
    """Whether every float32 scale is a half value (False where they cannot be read)."""
    host = _arrays.to_host(scales)
    if host is None:
        return False
    host = np.asarray(host, dtype=np.float32).reshape(-1)
    with np.errstate(over="ignore"):
        return bool(np.array_equal(host.astype(np.float16).astype(np.float32), host))


def tile(q) -> TiledTensor:
    """q (a 2-D kbit weight, k_in a multiple of 32; or an NF4 / FP4 one, through
    from_4bit; or a Q4_0 GGUF one, through kbit.gguf.to_kbit) repacked for kbit.matmul."""
    if isinstance(q, Quantized4bit):
        _shape(q.shape)
        q = from_4bit(q)
    elif isinstance(q, _gguf.GGUFTensor):
        _shape(q.shape)
        q = _gguf.to_kbit(q)
    n_out, k_in = _checked(q, QuantizedTensor, "tile")
    place = _arrays.place_of(q.packed, "packed")
    packed = place.view(q.packed, "packed", lambda a: _kbit._host_field(a, "uint32", "packed", q))
    am = place.view(q.absmax, "absmax",
                    lambda a: _kbit._host_field(a, _kbit._ABSMAX_NP[q.absmax_format], "absmax", q))
    _kbit._check_sizes(packed.size, am.size, q)
    pbytes, abytes = _sizes(q.shape, q.k, q.absmax_format)
    tp, ta = _aligned_empty(place, pbytes), _aligned_empty(place, abytes)
    with place.active():
        place.call("kbit_tile", packed.ptr, am.ptr, _kbit._FORMAT_ID[q.absmax_format], q.k,
                   n_out, k_in, place.ptr(tp), place.ptr(ta))
    return TiledTensor(tp, ta, q.k, (n_out, k_in), q.dtype, q.absmax_format, q.tensor_scale,
                       q.codebook)


def untile(t: TiledTensor) -> QuantizedTensor:
    """The stored kbit weight of t, exactly as it was tiled (kbit.quantize's, or
    from_4bit's for a 4-bit weight)."""
    n_out, k_in = _checked(t, TiledTensor, "untile")
    place = _arrays.place_of(t.packed, "packed")
    pbytes, abytes = _sizes(t.shape, t.k, t.absmax_format)
    tp = _bytes_view(place, t.packed, "packed", pbytes)
    ta = _bytes_view(place, t.absmax, "absmax", abytes)
    words, entries = _kbit._sizes(n_out * k_in, t.k, t.absmax_format)
    packed = place.empty((words,), "uint32")
    absmax = place.empty((entries,), _kbit._ABSMAX_NP[t.absmax_format])
    with place.active():
        place.call("kbit_untile", tp.ptr, ta.ptr, _kbit._FORMAT_ID[t.absmax_format], t.k, n_out,
                   k_in, place.ptr(packed), place.ptr(absmax))
    return QuantizedTensor(packed, absmax, t.k, (n_out, k_in), t.dtype, t.absmax_format,
                           t.tensor_scale, t.codebook)


def matmul_args(t: TiledTensor, wplace: _arrays.Place, place: _arrays.Place):
    """(the format arguments of kbit_matmul_kbit_tiled, views to keep alive)."""
    cb = _kbit._check_args(t.k, t.absmax_format, t.codebook)
    pbytes, abytes = _sizes(t.shape, t.k, t.absmax_format)
    tp = _bytes_view(wplace, t.packed, "packed", pbytes)
    ta = _bytes_view(wplace, t.absmax, "absmax", abytes)
    cb_here = place.upload_cached(cb) if cb is not None else None
    args = [tp.ptr, ta.ptr, _kbit._FORMAT_ID[t.absmax_format], ctypes.c_float(t.tensor_scale),
            place.ptr(cb_here), t.k]
    return args, (tp, ta, cb_here)
