"""The GGUF file reader behind kbit.gguf.load: a bounds-checked header walk, then
gguf's GGUFReader over a copy-on-write memory map; each tensor's bytes go as stored to
where they are wanted (numpy, or the GPU through PyTorch or CuPy) and are dequantized
there by the block API (kbit.gguf) or handed back as GGUFTensor."""
from __future__ import annotations

import math
import mmap
import os
import struct
from typing import Any

import numpy as np

from . import _arrays
from ._lib import KbitError, status_code
from .gguf import GGML_TYPES, GGUFTensor, dequantize as _dequantize, ggml_name

__all__ = ["load"]

# Plain float types that pass through: ggml type id -> stored dtype.
_PASSTHROUGH = {0: "float32", 1: "float16", 30: "bfloat16"}

# Progress bars only for files at least this large (tensor bytes).
_PROGRESS_MIN_BYTES = 256 << 20


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
        names = [name for name, _, _, _ in infos]
        if "" in names:  # e.g. a tensor count one past the real infos reads padding
            return f"tensor info #{names.index('')} has an empty name"
        if len(set(names)) != len(names):
            return "two tensor infos have the same name"
        ranges = []
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
            if offset % max(alignment, 1):
                return (f"tensor {name!r} starts at offset {offset}, not a multiple of the "
                        f"file's alignment {alignment}")
            if end > start + offset:
                ranges.append((start + offset, end, name))
        ranges.sort()
        for (_, end, first), (begin, _, second) in zip(ranges, ranges[1:]):
            if begin < end:  # the format gives every tensor its own bytes
                return f"tensors {first!r} and {second!r} overlap in the file"
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
    invalid = status_code("KBIT_ERROR_INVALID_DATA")
    detail = _diagnose(path)
    if detail is not None:
        raise KbitError(f"{path}: cannot read GGUF file: {detail}", invalid)
    try:
        # Copy-on-write map: writable numpy views (torch accepts them) without ever
        # writing to or copying the file.
        reader = GGUFReader(path, "c")
    except Exception as e:  # any parse failure of untrusted bytes
        detail = _diagnose(path) or f"{type(e).__name__}: {e}"
        raise KbitError(f"{path}: cannot read GGUF file: {detail}", invalid) from e
    if getattr(reader, "byte_order", "I") != "I":
        raise KbitError(f"{path}: byte-swapped (big-endian) GGUF files are not supported",
                        invalid)
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


def load(path, device="cuda", dtype="float16", progress=None,
         dequantize=True) -> dict[str, Any]:
    """Reads a GGUF file and returns {tensor name: array} in the file's order.

    Quantized tensors (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) are dequantized to `dtype`
    (float16, bfloat16 or float32): with device='cuda' / 'cuda:N' their raw bytes are
    copied to the GPU and dequantized there into PyTorch tensors (CuPy arrays when
    PyTorch is missing); with device='cpu' into numpy arrays (bfloat16 as uint16 bits).
    With dequantize=False they come back as kbit.gguf.GGUFTensor instead, their block
    bytes on that device as stored (dequantize them later with kbit.gguf.dequantize).
    F32, F16 and BF16 tensors pass through in their stored type. Shapes are numpy
    order (GGUF lists dimensions innermost first). The file is memory-mapped; a tqdm
    progress bar shows for large files (progress=True/False forces it on/off).
    Raises KbitError for a corrupt or truncated file and for tensors of other types.
    """
    path = os.fspath(path)
    name = _arrays.float_dtype(dtype)
    reader = _open(path)
    plan = []
    for t in reader.tensors:
        tid = int(t.tensor_type)
        if tid not in GGML_TYPES.values() and tid not in _PASSTHROUGH:
            raise KbitError(f"{path}: tensor {t.name!r} has type {ggml_name(tid)} ({tid}), "
                            f"which kbit cannot dequantize (supported: "
                            f"{', '.join(GGML_TYPES)}; F32, F16, BF16 pass through)",
                            status_code("KBIT_ERROR_INVALID_ARGUMENT"))
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        plan.append((t.name, tid, shape, raw))

    place = _arrays.named_place(device)
    total = sum(p[3].nbytes for p in plan)
    bar = _progress(total, progress, os.path.basename(path))
    result: dict[str, Any] = {}
    try:
        for tname, tid, shape, raw in plan:
            try:
                result[tname] = _load_tensor(place, tid, shape, raw, name, dequantize)
            except KbitError as e:
                raise KbitError(f"{path}: tensor {tname!r}: {e}", e.status) from e
            if bar is not None:
                bar.update(raw.nbytes)
    finally:
        if bar is not None:
            bar.close()
    return result


def _load_tensor(place: _arrays.Place, tid: int, shape, raw: np.ndarray, dtype: str,
                 dequantize: bool):
    # raw is a view of the file's map: what is returned is a copy (on the host) or an
    # upload (to the device), never a view that keeps the file mapped.
    keep = tid in _PASSTHROUGH or not dequantize
    data = place.upload(raw) if place.on_device else raw.copy() if keep else raw
    if tid in _PASSTHROUGH:
        return place.as_type(data, _PASSTHROUGH[tid], shape)
    tensor = GGUFTensor(data, tid, shape)
    if not dequantize:
        return tensor
    return _dequantize(tensor, dtype=dtype, out=place.empty(shape, dtype))
