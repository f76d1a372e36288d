"""GGUF (llama.cpp) tensors: dequantize ggml blocks on the GPU or the CPU, load files.

The quantized bytes go to the GPU exactly as they are stored and are dequantized
there (SPEC section 3); a file is memory-mapped and never goes through a float32
copy on the CPU. Supported block types: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; F32, F16 and
BF16 tensors pass through unchanged.

    >>> tensors = kbit.gguf.load("model.gguf", device="cuda", dtype="float16")
    >>> w = kbit.gguf.dequantize(raw_bytes, "Q4_K", n, "bfloat16")

Host results for bfloat16 are uint16 bit patterns (numpy has no bfloat16).
"""
from __future__ import annotations

import ctypes
import math
import mmap
import operator
import os
import struct
from typing import Any

import numpy as np

from . import _arrays
from ._lib import KbitError, call, register

__all__ = ["GGML_TYPES", "block_info", "dequantize", "load"]

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_DTYPE_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
_INVALID_DATA = 8

# ggml type ids kbit dequantizes, and the plain float types that pass through.
GGML_TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
_TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}
_PASSTHROUGH = {0: ("F32", "float32", 4), 1: ("F16", "float16", 2), 30: ("BF16", "bfloat16", 2)}

# Progress bars only for files at least this large (tensor bytes).
_PROGRESS_MIN_BYTES = 256 << 20

register("kbit_gguf_block_info", [ctypes.c_int, ctypes.POINTER(_I64), ctypes.POINTER(_I64)])
register("kbit_gguf_dequantize", [ctypes.c_int, _P, _I64, ctypes.c_int, _P, _P])
register("kbit_gguf_dequantize_host", [ctypes.c_int, _P, _I64, ctypes.c_int, _P])
for _q in ("q4_0", "q8_0", "q4_K", "q5_K", "q6_K"):
    for _t in ("fp16", "bf16", "fp32"):
        register(f"cdequantize_{_q}_{_t}", [_P, _I64, _P, _P])
        register(f"cdequantize_{_q}_{_t}_host", [_P, _I64, _P])


def _ggml_name(type_id: int) -> str:
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
    elems, nbytes = _I64(), _I64()
    call("kbit_gguf_block_info", _type_id(ggml_type), ctypes.byref(elems), ctypes.byref(nbytes))
    return elems.value, nbytes.value


def _out_dtype(dtype) -> str:
    name = _arrays.dtype_name(dtype)
    if name not in _DTYPE_ID:
        raise KbitError(f"output dtype must be float32, float16 or bfloat16, got {name}")
    return name


def dequantize(blocks, ggml_type, n: int, dtype="float32", out=None):
    """Dequantizes n elements stored as ggml blocks of `ggml_type`.

    blocks: the raw block bytes (n / block_elems * block_bytes bytes), a numpy array
    (CPU path) or a CUDA array of any framework (GPU path, no copy, on the framework's
    current stream). n must be a multiple of the block size (32 or 256). Returns a flat
    array of n elements of `dtype` where the blocks live (host bfloat16: uint16 bits),
    or fills `out` (same place, n elements) and returns it.
    """
    tid = _type_id(ggml_type)
    elems, bsize = block_info(tid)
    try:
        n = operator.index(n)  # 512.7 elements must not become 512
    except TypeError:
        raise KbitError(f"n must be an integer element count, got {n!r}", 1) from None
    if n < 0 or n % elems:
        raise KbitError(f"n = {n} is not a non-negative multiple of the "
                        f"{_ggml_name(tid)} block size {elems}", 1)
    need = n // elems * bsize
    name = _out_dtype(dtype)
    dev = _arrays.device_view(blocks)
    if dev is None:
        raw = np.asarray(blocks)
        if not raw.flags.c_contiguous:
            raise KbitError("blocks must be a contiguous array of raw block bytes")
        raw = raw.reshape(-1).view(np.uint8)
        if raw.ctypes.data % 2:  # GGUF data may sit at an odd offset (alignment 1):
            raw = raw.copy()     # the C functions need 2-byte aligned blocks
        if raw.nbytes != need:
            raise KbitError(f"{n} {_ggml_name(tid)} elements take {need} bytes of blocks, "
                            f"got {raw.nbytes}")
        out = _arrays.host_output(out, (n,), name)
        call("kbit_gguf_dequantize_host", tid, raw.ctypes.data, n, _DTYPE_ID[name],
             out.ctypes.data)
        return out

    if dev.nbytes != need:
        raise KbitError(f"{n} {_ggml_name(tid)} elements take {need} bytes of blocks, "
                        f"got {dev.nbytes}")
    out, out_view = _arrays.device_output(out, dev, (n,), name)
    call("kbit_gguf_dequantize", tid, dev.ptr, n, _DTYPE_ID[name], out_view.ptr,
         _arrays.current_stream(blocks))
    return out


# ---- files ------------------------------------------------------------------------

class _Torch:
    """Device buffers through PyTorch."""

    def __init__(self, device_id: int):
        import torch
        self.torch = torch
        self.device = torch.device("cuda", device_id)
        self.dtypes = {"float32": torch.float32, "float16": torch.float16,
                       "bfloat16": torch.bfloat16, "uint8": torch.uint8}

    def upload(self, raw: np.ndarray):
        buf = self.torch.empty(raw.nbytes, dtype=self.torch.uint8, device=self.device)
        buf.copy_(self.torch.from_numpy(raw))
        return buf

    def empty(self, shape, dtype: str):
        return self.torch.empty(shape, dtype=self.dtypes[dtype], device=self.device)

    def as_type(self, buf, dtype: str, shape):
        return buf.view(self.dtypes[dtype]).reshape(shape)

    def stream(self) -> int:
        return int(self.torch.cuda.current_stream(self.device).cuda_stream)


class _CuPy:
    """Device buffers through CuPy (no bfloat16)."""

    def __init__(self, device_id: int):
        import cupy
        self.cupy = cupy
        self.device_id = device_id

    def _check(self, dtype: str):
        if dtype == "bfloat16":
            raise KbitError("CuPy has no bfloat16 arrays: install PyTorch or ask for "
                            "float16/float32")

    def upload(self, raw: np.ndarray):
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.asarray(raw)

    def empty(self, shape, dtype: str):
        self._check(dtype)
        with self.cupy.cuda.Device(self.device_id):
            return self.cupy.empty(shape, dtype=dtype)

    def as_type(self, buf, dtype: str, shape):
        self._check(dtype)
        return buf.view(dtype).reshape(shape)

    def stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)


def _backend(device):
    """A device-buffer backend for `device` ('cuda', 'cuda:N' or a torch.device)."""
    text = str(device)
    if not text.startswith("cuda"):
        raise KbitError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    index = None if isinstance(device, str) else getattr(device, "index", None)
    if index is None and ":" in text:
        try:
            index = int(text.split(":", 1)[1])
        except ValueError:
            raise KbitError(f"bad device {device!r}") from None
    errors = []
    for name in ("torch", "cupy"):
        try:
            if name == "torch":
                import torch
                if not torch.cuda.is_available():
                    raise KbitError("PyTorch sees no CUDA device")
                return _Torch(torch.cuda.current_device() if index is None else index)
            import cupy
            return _CuPy(cupy.cuda.Device().id if index is None else index)
        except ImportError:
            errors.append(f"{name} not installed")
        except KbitError as e:
            errors.append(str(e))
        except Exception as e:  # the framework's own "no device" errors
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise KbitError("device='cuda' needs PyTorch or CuPy for device arrays ("
                    + "; ".join(errors) + ")")


def _diagnose(path: str) -> str | None:
    """Walks a GGUF header with bounds checks (before GGUFReader, which does none) and
    says what is wrong, naming the tensor where there is one. None when nothing is."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except (OSError, ValueError) as e:
        return f"cannot map the file: {e}"
    pos = 0

    def take(nbytes: int, what: str) -> bytes:
        nonlocal pos
        if nbytes < 0 or pos + nbytes > size:
            raise _Truncated(f"file ends at byte {size} inside {what} (offset {pos})")
        b = data[pos:pos + nbytes]
        pos += nbytes
        return b

    def u32(what):
        return struct.unpack("<I", take(4, what))[0]

    def u64(what):
        return struct.unpack("<Q", take(8, what))[0]

    def string(what):
        return take(u64(what), what).decode("utf-8", errors="replace")

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(vtype: int, what: str):
        if vtype in scalar:
            take(scalar[vtype], what)
        elif vtype == 8:
            take(u64(what), what)
        elif vtype == 9:
            itype, count = u32(what), u64(what)
            if itype in scalar:
                take(scalar[itype] * count, what)
            else:
                for _ in range(count):
                    skip_value(itype, what)
        else:
            raise _Truncated(f"{what} has unknown value type {vtype}")

    try:
        if take(4, "the magic") != b"GGUF":
            return "not a GGUF file (bad magic)"
        version = u32("the version")
        if int.from_bytes(struct.pack("<I", version), "big") in (2, 3):
            return "byte-swapped (big-endian) GGUF files are not supported"
        if version not in (2, 3):
            return f"unsupported GGUF version {version} (kbit reads versions 2 and 3)"
        n_tensors, n_kv = u64("the tensor count"), u64("the metadata count")
        alignment = 32
        for i in range(n_kv):
            key = string(f"metadata key #{i}")
            vtype = u32(f"metadata {key!r}")
            if key == "general.alignment" and vtype == 4:
                alignment = u32(f"metadata {key!r}")
            else:
                skip_value(vtype, f"metadata {key!r}")
        infos = []
        for i in range(n_tensors):
            name = string(f"tensor info #{i}")
            n_dims = u32(f"tensor info {name!r}")
            dims = [u64(f"tensor info {name!r}") for _ in range(n_dims)]
            infos.append((name, dims, u32(f"tensor info {name!r}"), u64(f"tensor info {name!r}")))
        start = pos + (-pos) % max(alignment, 1)
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        for name, dims, tid, offset in infos:
            try:
                qt = GGMLQuantizationType(tid)
            except ValueError:
                return f"tensor {name!r} has unknown ggml type id {tid}"
            block, tsize = GGML_QUANT_SIZES[qt]
            n = math.prod(dims)  # exact: dims from a corrupt file may be huge
            if dims and dims[0] % block:
                return (f"tensor {name!r} ({qt.name}) has a row of {dims[0]} elements, not a "
                        f"multiple of its block size {block}")
            end = start + offset + n // block * tsize
            if end > size:
                return (f"tensor {name!r} needs bytes up to {end} but the file has {size}: "
                        "the file is truncated")
    except _Truncated as e:
        return f"corrupt or truncated header: {e}"
    except RecursionError:
        return "corrupt header: metadata arrays nested too deeply"
    return None


class _Truncated(Exception):
    pass


def _open(path: str):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise KbitError("reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    # Walk the header with bounds checks first: GGUFReader reads past the end of a
    # corrupt file without noticing and can then loop for hours or exhaust memory.
    detail = _diagnose(path)
    if detail is not None:
        raise KbitError(f"{path}: cannot read GGUF file: {detail}", _INVALID_DATA)
    try:
        # Copy-on-write map: writable numpy views (torch accepts them) without ever
        # writing to or copying the file.
        reader = GGUFReader(path, "c")
    except Exception as e:  # any parse failure of untrusted bytes
        detail = _diagnose(path) or f"{type(e).__name__}: {e}"
        raise KbitError(f"{path}: cannot read GGUF file: {detail}", _INVALID_DATA) from e
    if getattr(reader, "byte_order", "I") != "I":
        raise KbitError(f"{path}: byte-swapped (big-endian) GGUF files are not supported",
                        _INVALID_DATA)
    return reader


def _progress(total: int, enabled, desc: str):
    if enabled is False or (enabled is None and total < _PROGRESS_MIN_BYTES):
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                leave=False)


def load(path, device="cuda", dtype="float16", progress=None) -> dict[str, Any]:
    """Reads a GGUF file and returns {tensor name: array} in the file's order.

    Quantized tensors (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) are dequantized to `dtype`
    (float16, bfloat16 or float32): with device='cuda' / 'cuda:N' their raw bytes are
    copied to the GPU and dequantized there into PyTorch tensors (CuPy arrays when
    PyTorch is missing); with device='cpu' into numpy arrays (bfloat16 as uint16 bits).
    F32, F16 and BF16 tensors pass through in their stored type. Shapes are numpy
    order (GGUF lists dimensions innermost first). The file is memory-mapped; a tqdm
    progress bar shows for large files (progress=True/False forces it on/off).
    Raises KbitError for a corrupt or truncated file and for tensors of other types.
    """
    path = os.fspath(path)
    name = _out_dtype(dtype)
    reader = _open(path)
    plan = []
    for t in reader.tensors:
        tid = int(t.tensor_type)
        if tid not in _TYPE_NAMES and tid not in _PASSTHROUGH:
            raise KbitError(f"{path}: tensor {t.name!r} has type {_ggml_name(tid)} ({tid}), "
                            f"which kbit cannot dequantize (supported: "
                            f"{', '.join(GGML_TYPES)}; F32, F16, BF16 pass through)", 1)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        plan.append((t.name, tid, shape, int(t.n_elements), raw))

    on_cpu = str(device) == "cpu"
    backend = None if on_cpu else _backend(device)
    total = sum(p[4].nbytes for p in plan)
    bar = _progress(total, progress, os.path.basename(path))
    result: dict[str, Any] = {}
    try:
        for tname, tid, shape, n, raw in plan:
            try:
                result[tname] = _load_tensor(backend, tid, shape, n, raw, name)
            except KbitError as e:
                raise KbitError(f"{path}: tensor {tname!r}: {e}", e.status) from e
            if bar is not None:
                bar.update(raw.nbytes)
    finally:
        if bar is not None:
            bar.close()
    return result


def _load_tensor(backend, tid: int, shape, n: int, raw: np.ndarray, dtype: str):
    if tid in _PASSTHROUGH:
        _, stored, _ = _PASSTHROUGH[tid]
        if backend is None:
            return raw.view("uint16" if stored == "bfloat16" else stored).reshape(shape).copy()
        return backend.as_type(backend.upload(raw), stored, shape)
    if backend is None:
        return dequantize(raw, tid, n, dtype).reshape(shape)
    buf = backend.upload(raw)
    out = backend.empty(shape, dtype)
    call("kbit_gguf_dequantize", tid, _arrays.device_view(buf).ptr, n, _DTYPE_ID[dtype],
         _arrays.device_view(out).ptr, backend.stream())
    return out
