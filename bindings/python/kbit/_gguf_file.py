"""The GGUF file reader behind kbit.gguf.load and kbit.gguf.read_header: a
bounds-checked walk of the header over a copy-on-write memory map (numpy views, no
per-element work on tensors or numeric arrays); each tensor's bytes go as stored to
where they are wanted (numpy, or the GPU through PyTorch or CuPy) and are dequantized
there by the block API (kbit.gguf) or handed back as GGUFTensor."""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _arrays
from ._lib import KbitError, status_code
from .gguf import GGML_TYPES, GGUFTensor, dequantize as _dequantize, ggml_name

__all__ = ["Header", "TensorInfo", "load", "read_header"]

# Plain float types that pass through: ggml type id -> stored dtype.
_PASSTHROUGH = {0: "float32", 1: "float16", 30: "bfloat16"}

# Progress bars only for files at least this large (tensor bytes).
_PROGRESS_MIN_BYTES = 256 << 20


# Metadata value types: id -> (struct code, bytes) for the fixed-size ones.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
            5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
            12: ("<d", 8)}
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 64
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


@dataclass
class TensorInfo:
    """One tensor of a GGUF file: numpy-order shape, ggml type id, where its bytes are."""
    name: str
    shape: tuple
    type_id: int
    offset: int  # from the start of the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_name(self.type_id)


@dataclass
class Header:
    """What read_header found: format version, metadata {key: value} (numeric arrays as
    numpy arrays viewing the map, string arrays as lists), the data alignment, tensors
    in file order, and the file's copy-on-write map (numpy views of it are writable
    without writing to or copying the file)."""
    version: int
    metadata: dict
    alignment: int
    tensors: list
    data: Any
    size: int

    def tensor_bytes(self, t: TensorInfo) -> np.ndarray:
        return np.frombuffer(self.data, np.uint8, t.nbytes, t.offset)


class _Corrupt(Exception):
    pass


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every failure names what was
    being read and where."""

    def __init__(self, data, size: int):
        self.data, self.size, self.pos = data, size, 0

    def take(self, nbytes: int, what: str) -> int:
        """Advances past nbytes and returns where they start."""
        if nbytes < 0 or self.pos + nbytes > self.size:
            raise _Corrupt(f"the file is truncated: it ends at byte {self.size} inside "
                           f"{what} (offset {self.pos})")
        at = self.pos
        self.pos += nbytes
        return at

    def scalar(self, vtype: int, what: str):
        code, nbytes = _SCALARS[vtype]
        return struct.unpack_from(code, self.data, self.take(nbytes, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> str:
        n = self.u64(what)
        at = self.take(n, what)
        return bytes(self.data[at:at + n]).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype != _ARRAY:
            raise _Corrupt(f"{what} has unknown value type {vtype}")
        if depth >= _MAX_NESTING:
            raise _Corrupt(f"{what}: metadata arrays nested too deeply")
        itype, count = self.u32(what), self.u64(what)
        if itype in _ARRAY_DTYPES:  # one view of the whole array, no per-element work
            dt = np.dtype(_ARRAY_DTYPES[itype])
            at = self.take(count * dt.itemsize, what)
            return np.frombuffer(self.data, dt, count, at)
        if itype == _STRING:
            return self._strings(count, what)
        if itype not in (_ARRAY,):
            raise _Corrupt(f"{what} has unknown array element type {itype}")
        if count > self.size - self.pos:  # each element takes at least one byte
            self.take(count, what)
        return [self.value(itype, what, depth + 1) for _ in range(count)]

    def _strings(self, count: int, what: str) -> list:
        if count * 8 > self.size - self.pos:  # each string takes at least its length
            self.take(count * 8, what)
        data, pos, size, out = self.data, self.pos, self.size, []
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.take(8, what)
            n = unpack(data, pos)[0]
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.take(n, what)
            out.append(bytes(data[pos:pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


def _sizes_of(type_id: int, dims: list, name: str) -> int:
    """Bytes of a tensor of ggml type type_id and GGUF-order dims."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except ImportError:
        raise KbitError("reading GGUF files needs the 'gguf' package (pip install gguf)") from None
    except (ValueError, KeyError):
        raise _Corrupt(f"tensor {name!r} has unknown ggml type id {type_id}") from None
    if dims and dims[0] % block:
        raise _Corrupt(f"tensor {name!r} ({ggml_name(type_id)}) has a row of {dims[0]} "
                       f"elements, not a multiple of its block size {block}")
    return math.prod(dims) // block * nbytes  # exact: dims of a corrupt file may be huge


def _parse(data, size: int) -> Header:
    cur = _Cursor(data, size)
    at = cur.take(4, "the magic")
    if bytes(data[at:at + 4]) != b"GGUF":
        raise _Corrupt("not a GGUF file (bad magic)")
    version = cur.u32("the version")
    if int.from_bytes(struct.pack("<I", version), "big") in (2, 3):
        raise _Corrupt("byte-swapped (big-endian) GGUF files are not supported")
    if version not in (2, 3):
        raise _Corrupt(f"unsupported GGUF version {version} (kbit reads versions 2 and 3)")
    n_tensors, n_kv = cur.u64("the tensor count"), cur.u64("the metadata count")
    metadata = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        metadata[key] = cur.value(cur.u32(f"metadata {key!r}"), f"metadata {key!r}")
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
        raise _Corrupt(f"general.alignment must be a positive integer, got {alignment!r}")
    infos = []
    if n_tensors * 24 > size:  # each info takes at least 24 bytes
        cur.take(n_tensors * 24, "the tensor infos")
    for i in range(n_tensors):
        name = cur.string(f"tensor info #{i}")
        what = f"tensor info {name!r}"
        n_dims = cur.u32(what)
        if n_dims > _MAX_DIMS:
            raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions (GGUF allows at most "
                           f"{_MAX_DIMS})")
        dims = [cur.u64(what) for _ in range(n_dims)]
        if math.prod(d for d in dims if d) >= 1 << 62:  # a zero dim does not excuse the rest
            raise _Corrupt(f"tensor {name!r} has dimensions {dims}: more than 2^62 elements")
        infos.append((name, dims, cur.u32(what), cur.u64(what)))
    start = cur.pos + (-cur.pos) % alignment
    names = [info[0] for info in infos]
    if "" in names:  # e.g. a tensor count one past the real infos reads padding
        raise _Corrupt(f"tensor info #{names.index('')} has an empty name")
    if len(set(names)) != len(names):
        raise _Corrupt("two tensor infos have the same name")
    tensors = []
    for name, dims, tid, offset in infos:
        nbytes = _sizes_of(tid, dims, name)
        end = start + offset + nbytes
        if end > size:
            raise _Corrupt(f"tensor {name!r} needs bytes up to {end} but the file has "
                           f"{size}: the file is truncated")
        if offset % alignment:
            raise _Corrupt(f"tensor {name!r} starts at offset {offset}, not a multiple of "
                           f"the file's alignment {alignment}")
        tensors.append(TensorInfo(name, tuple(int(d) for d in reversed(dims)), tid,
                                  start + offset, nbytes))
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:  # the format gives every tensor its own bytes
            raise _Corrupt(f"tensors {first!r} and {second!r} overlap in the file")
    return Header(version, metadata, alignment, tensors, data, size)


def read_header(path) -> Header:
    """Reads a GGUF file's header (metadata and tensor infos) from a memory map with a
    bound check on every read: milliseconds, whatever the file size. Raises
    FileNotFoundError for a missing file and KbitError (KBIT_ERROR_INVALID_DATA) naming
    what is wrong, and the tensor where there is one, for a corrupt or truncated one."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    invalid = status_code("KBIT_ERROR_INVALID_DATA")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    except (OSError, ValueError) as e:
        raise KbitError(f"{path}: cannot map the file: {e}", invalid) from e
    try:
        return _parse(data, size)
    except _Corrupt as e:
        raise KbitError(f"{path}: cannot read GGUF file: {e}", invalid) from None
    except RecursionError:
        raise KbitError(f"{path}: cannot read GGUF file: metadata arrays nested too deeply",
                        invalid) from None


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
    header = read_header(path)
    plan = []
    for t in header.tensors:
        if t.type_id not in GGML_TYPES.values() and t.type_id not in _PASSTHROUGH:
            raise KbitError(f"{path}: tensor {t.name!r} has type {t.type_name} ({t.type_id}), "
                            f"which kbit cannot dequantize (supported: "
                            f"{', '.join(GGML_TYPES)}; F32, F16, BF16 pass through)",
                            status_code("KBIT_ERROR_INVALID_ARGUMENT"))
        plan.append((t.name, t.type_id, t.shape, header.tensor_bytes(t)))

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
