"""The kbit format from Python: quantize / dequantize numpy arrays (on the CPU) and
CUDA arrays of any framework (on the GPU, on the framework's current stream)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from ._quantized import QuantizedBase
from ._lib import KbitError, call, function, size, status_code

_FORMAT_ID = {"fp32": 0, "fp16": 1, "e4m4": 2}
_ABSMAX_NP = {"fp32": "float32", "fp16": "float16", "e4m4": "uint8"}


def _sizes(n: int, k: int, absmax: str) -> tuple[int, int]:
    """(packed words, absmax entries) of n elements, from the library's size helpers."""
    words = size("kbit_packed_words", n, k)
    entry_bytes = np.dtype(_ABSMAX_NP[absmax]).itemsize
    return words, size("kbit_absmax_bytes", n, _FORMAT_ID[absmax]) // entry_bytes


@dataclass
class KbitFields(QuantizedBase):
    """The fields of a kbit tensor in either layout (stored: QuantizedTensor; tiled for
    the matmul: kbit.TiledTensor). packed / absmax live where the input lived (numpy
    arrays, or device arrays of the input's framework). codebook is None for the
    built-in normal-float codebook."""
    packed: Any
    absmax: Any
    k: int
    shape: tuple
    dtype: str
    absmax_format: str = "e4m4"
    tensor_scale: float = 1.0
    codebook: np.ndarray | None = None

    @property
    def total_nbytes(self) -> int:
        """nbytes plus the custom codebook's 2^k float32 values (the built-in one is not
        stored)."""
        return self.nbytes + (0 if self.codebook is None else 4 << self.k)


@dataclass
class QuantizedTensor(KbitFields):
    """A kbit-quantized tensor: packed bit planes, block scales and how to read them."""

    @property
    def nbytes(self) -> int:
        """Bytes of packed codes plus scales."""
        return (size("kbit_packed_words", self.n, self.k) * 4
                + size("kbit_absmax_bytes", self.n, _FORMAT_ID[self.absmax_format]))


def default_codebook(k: int) -> np.ndarray:
    """The library's built-in normal-float codebook for k (float32, 2^k entries)."""
    _check_k(k)
    cb = np.empty(1 << k, dtype=np.float32)
    call("kbit_default_codebook_host", k, cb.ctypes.data)
    return cb


CODEBOOKS = {"normal": 0, "nf0": 1, "uniform": 2}  # kbit_codebook_kind


def codebook(name: str, k: int) -> np.ndarray:
    """Built-in codebook `name` for k (float32, 2^k ascending entries in [-1, 1]):
    'normal' (the default, SPEC 1.1), 'nf0' (normal-float with an exact zero; NF4's table
    at k = 4, better on outlier-heavy tensors whose blocks hold many near-zero values) or
    'uniform' (evenly spaced)."""
    if not isinstance(name, str) or name not in CODEBOOKS:
        raise KbitError(f"unknown codebook {name!r}; built-in ones are {sorted(CODEBOOKS)}")
    _check_k(k)
    cb = np.empty(1 << k, dtype=np.float32)
    call("kbit_codebook_host", CODEBOOKS[name], k, cb.ctypes.data)
    return cb


_named_book = codebook  # for functions whose `codebook` argument shadows the name


def _check_k(k):
    if not _arrays.is_integer(k) or k not in (2, 3, 4, 5):
        raise KbitError(f"k must be 2..5, got {k!r}")


def _check_args(k: int, absmax: str, codebook):
    _check_k(k)
    if not isinstance(absmax, str) or absmax not in _FORMAT_ID:
        raise KbitError(f"absmax must be one of {sorted(_FORMAT_ID)}, got {absmax!r}")
    if codebook is None or (isinstance(codebook, str) and codebook == "normal"):
        return None
    if isinstance(codebook, str):
        return _named_book(codebook, k)
    cb = _arrays.host_array(np.asarray(codebook, dtype=np.float32).reshape(-1))
    if cb.size != 1 << k:
        raise KbitError(f"codebook for k={k} needs {1 << k} entries, got {cb.size}")
    if not np.all(np.isfinite(cb)):
        raise KbitError("codebook entries must be finite")
    return cb


def fit_codebook(x, k: int, absmax_format: str = "e4m4", dtype=None,
                 importance=None) -> np.ndarray:
    """2^k float32 entries fitted to x (SPEC section 7): Lloyd-Max on the histogram of x's
    values over their block's largest |value|, ends kept at -1 and +1, deterministic (see
    kbit_fit_codebook_host). x: any shape, fp32/fp16 or bfloat16 (host uint16 bits with
    dtype='bfloat16'), on the host or a GPU (kbit_fit_codebook: the same book for the same
    bytes). absmax_format: the format the book is meant for (checked; every format starts
    from the same absmax rule). importance: None, or one float32 weight >= 0 an element of
    x, where x lives (e.g. mean squared activations), weighting each value's squared
    error. The book comes back as a host array."""
    _check_k(k)
    if not isinstance(absmax_format, str) or absmax_format not in _FORMAT_ID:
        raise KbitError(f"absmax_format must be one of {sorted(_FORMAT_ID)}, "
                        f"got {absmax_format!r}")
    xin = _arrays.float_input(x, dtype)
    place = xin.place
    w = None
    if importance is not None:
        w = place.view(importance, "importance",
                       lambda a: _arrays.host_array(np.asarray(a, dtype=np.float32).reshape(-1)))
        if w.dtype != "float32" or w.size != xin.size:
            raise KbitError(f"importance must be {xin.size} float32 values (one an element of "
                            f"x), got {w.size} of {w.dtype}")
    w_ptr = w.ptr if w is not None else None
    if not place.on_device:
        book = np.empty(1 << k, dtype=np.float32)
        call("kbit_fit_codebook_host", xin.ptr, w_ptr, xin.size, xin.dtype_id, k,
             book.ctypes.data)
        return book
    with place.active():
        nbytes = int(function("kbit_fit_codebook_workspace_bytes")())
        ws = place.empty((nbytes,), "uint8")
        ws.zero_() if hasattr(ws, "zero_") else ws.fill(0)
        out = place.empty((1 << k,), "float32")
        place.call("kbit_fit_codebook", xin.ptr, w_ptr, xin.size, xin.dtype_id, k,
                   place.ptr(out), place.ptr(ws), nbytes)
        book = np.array(_arrays.to_host(out), dtype=np.float32)
    if not np.all(np.isfinite(book)):  # the kernels' way to say what the host twin raises
        raise KbitError("cannot fit a codebook: the input has NaN or Inf, or is all zeros, "
                        "or an importance weight is negative or not finite (or all are 0)",
                        status_code("KBIT_ERROR_INVALID_ARGUMENT"))
    return book


def _host_f64(a, dtype=None) -> np.ndarray:
    """a (host, or a GPU array of torch / CuPy) as float64 on the host; host bfloat16 as
    uint16 bits with dtype='bfloat16'."""
    if hasattr(a, "cpu"):  # torch
        a = a.detach().cpu().float().numpy()
    elif hasattr(a, "get"):  # CuPy
        a = a.get()
    a = np.asarray(a)
    if dtype == "bfloat16":
        return (a.astype(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _error_of(x, q: QuantizedTensor, dtype, weights=None) -> float:
    """Squared error of q against x, weighted by `weights` (host float64) when given
    (float64 sums on the host)."""
    ref = _host_f64(x, dtype).reshape(-1)
    got = _host_f64(dequantize(q, dtype="float32")).reshape(-1)
    err = (ref - got) ** 2
    return float((err * weights).sum() if weights is not None else err.sum())


def _quantize_best(x, k, absmax, tensor_scale, dtype, importance=None) -> QuantizedTensor:
    """codebook='auto': the book among the built-in ones and the fitted one whose
    quantized tensor has the least (importance-weighted) squared error (ties: the first
    of normal, nf0, fit)."""
    weights = _host_f64(importance).reshape(-1) if importance is not None else None
    best = None
    for book in ("normal", "nf0", fit_codebook(x, k, absmax, dtype, importance=importance)):
        q = quantize(x, k, absmax, book, tensor_scale, dtype, importance)
        err = _error_of(x, q, dtype, weights)
        if best is None or err < best[0]:
            best = (err, q)
    return best[1]


def quantize(x, k: int = 4, absmax: str = "e4m4", codebook=None,
             tensor_scale: float | None = None, dtype=None,
             importance=None, range_status=None) -> QuantizedTensor:
    """Quantizes x to k bits per element in blocks of 32 (SPEC section 1).

    x: a numpy array (CPU path) or a CUDA array of any framework (GPU path, no copy,
    on the framework's current stream). absmax: 'e4m4' (1 byte per block), 'fp16' or
    'fp32'. codebook: 2^k floats, None (or 'normal') for the built-in normal-float
    codebook, a built-in one by name ('nf0', 'uniform': see kbit.codebook), 'fit' (a book
    fitted to x by kbit.fit_codebook) or 'auto' (whichever of 'normal', 'nf0' and 'fit'
    gives x the least squared error); the book used is the container's codebook.
    tensor_scale: None picks one so that every block fits the absmax format.
    dtype: only for host bfloat16, passed as uint16 bits with dtype='bfloat16'.
    importance: optional per-element weights >= 0 (x's size, where x lives; e.g. mean
    squared activations of each input channel, broadcast over the rows): the E4M4 scale
    search, the 'fit' codebook and the 'auto' choice then minimise the weighted squared
    error (kbit_quantize_ex). Unused by fp16/fp32 scales except for 'fit'/'auto'.
    range_status: GPU only, a one-element uint32 device array the caller zeroed. kbit
    then sets it (non-zero) for a block that does not fit instead of checking itself, so
    the call makes no synchronisation (with a given tensor_scale it makes none at all,
    and can be captured in a CUDA graph); the caller reads it when it wants. Without it
    a GPU call that can fail that way reads its own status word once and raises.
    """
    if isinstance(codebook, str) and codebook in ("fit", "auto"):
        _check_k(k)
        if codebook == "auto":
            return _quantize_best(x, k, absmax, tensor_scale, dtype, importance)
        codebook = fit_codebook(x, k, absmax, dtype, importance=importance)
    cb = _check_args(k, absmax, codebook)
    fmt = _FORMAT_ID[absmax]
    x = _arrays.float_input(x, dtype)
    place = x.place
    with place.active():
        w = _importance(place, importance, x.size) if importance is not None else None
        ts = ctypes.c_float(1.0)
        if tensor_scale is not None:
            ts.value = float(tensor_scale)
        elif absmax != "fp32":  # fp32 scales hold any finite absmax
            place.call("kbit_compute_tensor_scale", x.ptr, x.size, x.dtype_id, fmt,
                       ctypes.byref(ts))
        words, entries = _sizes(x.size, k, absmax)
        packed = place.empty((words,), "uint32")
        am = place.empty((entries,), _ABSMAX_NP[absmax])
        cb_here = place.upload(cb) if cb is not None else None
        # The host quantizer returns KBIT_ERROR_RANGE itself. On the GPU a block that does
        # not fit (over the range, only possible with a caller's tensor_scale, or NaN/Inf
        # with E4M4, which has no NaN) sets this call's own status word, read once after
        # the stream's work; other calls cannot fail that way and are not checked.
        check = place.on_device and (absmax == "e4m4" or tensor_scale is not None)
        status = None
        if range_status is not None:
            status = _status_word(place, range_status)
            check = False  # the caller's to read
        elif check:
            status = _zeroed_word(place)
        if w is not None or status is not None:
            place.call("kbit_quantize_ex", x.ptr, place.ptr(w), x.size, x.dtype_id, k,
                       place.ptr(cb_here), fmt, ts, place.ptr(am), place.ptr(packed),
                       place.ptr(status))
        else:
            place.call("kbit_quantize", x.ptr, x.size, x.dtype_id, k, place.ptr(cb_here), fmt,
                       ts, place.ptr(am), place.ptr(packed))
        if check and _read_word(status):
            raise KbitError(f"a block does not fit the {absmax} absmax format at "
                            f"tensor_scale={ts.value}: it holds NaN/Inf (E4M4 cannot "
                            "represent them: use absmax='fp16' or 'fp32') or exceeds the "
                            "range (pass tensor_scale=None to let kbit choose it)",
                            status_code("KBIT_ERROR_RANGE"))
    return QuantizedTensor(packed, am, k, x.shape, x.dtype, absmax, ts.value, cb)


def _importance(place: _arrays.Place, importance, n: int):
    """The importance weights as n float32 values where the call runs, checked: finite
    and >= 0 (on the GPU too, where the kernel does not check them)."""
    dev = _arrays.device_view(importance)
    if place.on_device != (dev is not None):
        raise KbitError("importance must live where x lives")
    if dev is None:
        w = _arrays.host_array(importance, np.float32).reshape(-1)
        bad = ~np.isfinite(w) | (w < 0)
        ok = not bad.any()
    else:
        if dev.dtype != "float32":
            raise KbitError(f"importance must be float32 on the device, got {dev.dtype}")
        if dev.device_id != place.device_id:
            raise KbitError(f"importance is on cuda:{dev.device_id} but x on "
                            f"cuda:{place.device_id}")
        w = importance.reshape(-1)
        ok = bool(((w >= 0) & (w < float("inf"))).all())  # NaN fails both
    size = dev.size if dev is not None else w.size
    if size != n:
        raise KbitError(f"importance must have x's {n} elements, got {size}")
    if not ok:
        raise KbitError("importance weights must be finite and >= 0")
    return w


def _status_word(place: _arrays.Place, word):
    dev = _arrays.device_view(word)
    if not place.on_device or dev is None:
        raise KbitError("range_status is for GPU calls: a one-element uint32 device array "
                        "where x lives")
    if dev.size != 1 or dev.dtype not in ("uint32", "int32") or dev.device_id != place.device_id:
        raise KbitError(f"range_status must be one uint32 (or int32) on x's device, got "
                        f"{dev.size} x {dev.dtype} on cuda:{dev.device_id}")
    return word


def _zeroed_word(place: _arrays.Place):
    buf = place.empty((1,), "uint32")
    buf.zero_() if hasattr(buf, "zero_") else buf.fill(0)
    return buf


def _read_word(buf) -> int:
    """The value of a one-element device array (waits for its stream's work)."""
    return int(buf.item())


def dequantize(q: QuantizedTensor, dtype=None, out=None):
    """Dequantizes q to `dtype` (default: the quantized input's dtype), where q lives.

    Host results for bfloat16 are uint16 bit patterns. out: an optional preallocated
    output (numpy or device array) of q.n elements.
    """
    name = _arrays.float_dtype(dtype) if dtype is not None else q.dtype
    cb = _check_args(q.k, q.absmax_format, q.codebook)
    fmt = _FORMAT_ID[q.absmax_format]
    place = _arrays.place_of(q.packed, "packed")
    packed = place.view(q.packed, "packed", lambda a: _host_field(a, "uint32", "packed", q))
    am = place.view(q.absmax, "absmax",
                    lambda a: _host_field(a, _ABSMAX_NP[q.absmax_format], "absmax", q))
    _check_sizes(packed.size, am.size, q)
    out, out_ptr = place.output(out, q.shape, name)
    with place.active():
        cb_here = place.upload(cb) if cb is not None else None
        place.call("kbit_dequantize", packed.ptr, am.ptr, fmt, ctypes.c_float(q.tensor_scale),
                   place.ptr(cb_here), q.k, q.n, _arrays.DTYPE_ID[name], out_ptr)
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
    words, entries = _sizes(q.n, q.k, q.absmax_format)
    if packed_size != words:
        raise KbitError(f"packed has {packed_size} words, expected {words}")
    if absmax_size != entries:
        raise KbitError(f"absmax has {absmax_size} entries, expected {entries}")
