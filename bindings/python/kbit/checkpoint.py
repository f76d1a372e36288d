"""Quantized checkpoints in safetensors files: kbit.save and kbit.load.

    >>> kbit.save({"w": kbit.quantize(w, k=4), "b": bias}, "model.kbit.safetensors")
    >>> tensors = kbit.load("model.kbit.safetensors", device="cuda")

Every array is an ordinary safetensors tensor, so any safetensors reader opens the file.
A quantized tensor `name` is stored as `name.packed`, `name.absmax` and, where it has
them, `name.codebook`, `name.absmax2`, `name.offset`, `name.code` (GGUF blocks:
`name.blocks`); the file's metadata key "kbit" holds a JSON record per quantized tensor
with what reads it back:

    {"format_version": 1, "tensors": {"w": {"format": "kbit", "shape": [4096, 4096],
     "dtype": "float16", "k": 4, "absmax_format": "e4m4", "tensor_scale": 1.0}}}

format is "kbit" (QuantizedTensor), "kbit_tiled" (TiledTensor), "bnb4" (Quantized4bit,
with blocksize and quant_type) or "gguf" (GGUFTensor, with ggml_type). Other tensors are
stored as they are (bfloat16 as BF16). Other metadata keys are the caller's own.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from . import _arrays
from ._lib import KbitError, status_code
from .bnb4 import Quantized4bit
from .gguf import GGUFTensor, block_info
from .kbit import QuantizedTensor, _sizes as _kbit_sizes
from .tiled import TiledTensor, _sizes as _tiled_sizes

__all__ = ["save", "load", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_KEY = "kbit"
# safetensors dtype names <-> numpy ("BF16" is kept as uint16 bits on the host).
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "uint16",
              "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64",
              "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
_NP_TO_ST = {v: k for k, v in _ST_DTYPES.items() if k != "BF16"}
# Container class -> (format name, array fields, scalar fields).
_FORMATS = {
    "kbit": (QuantizedTensor, ("packed", "absmax", "codebook"),
             ("k", "absmax_format", "tensor_scale")),
    "kbit_tiled": (TiledTensor, ("packed", "absmax", "codebook"),
                   ("k", "absmax_format", "tensor_scale")),
    "bnb4": (Quantized4bit, ("packed", "absmax", "absmax2", "offset", "code"),
             ("blocksize", "quant_type")),
    "gguf": (GGUFTensor, ("blocks",), ("ggml_type",)),
}


def _invalid(path, message: str) -> KbitError:
    return KbitError(f"{path}: {message}", status_code("KBIT_ERROR_INVALID_DATA"))


def format_of(value) -> str | None:
    """The container format of value ('kbit', 'kbit_tiled', 'bnb4', 'gguf'), or None for
    anything else (a plain array)."""
    for name, (cls, _, _) in _FORMATS.items():
        if type(value) is cls:
            return name
    return None


def dequantize_any(q, dtype: str):
    """Any container dequantized where it lives (a tiled weight through its stored form)."""
    from . import bnb4, gguf, kbit, tiled
    fmt = format_of(q)
    if fmt == "kbit_tiled":
        q, fmt = tiled.untile(q), "kbit"
    if fmt == "kbit":
        return kbit.dequantize(q, dtype=dtype)
    if fmt == "bnb4":
        return bnb4.dequantize_4bit(q, dtype=dtype)
    if fmt == "gguf":
        return gguf.dequantize(q, dtype=dtype)
    raise KbitError(f"not a kbit container: {type(q).__name__}")


def _to_host(arr, what: str) -> tuple[np.ndarray, str]:
    """(host numpy copy or view, safetensors dtype) of a numpy / torch / CuPy array."""
    framework = type(arr).__module__.split(".")[0]
    if framework == "torch":
        t = arr.detach()
        if str(t.dtype) == "torch.bfloat16":
            return t.view(dtype=_torch_int16()).cpu().numpy().view(np.uint16), "BF16"
        arr = t.cpu().numpy()
    elif framework == "cupy":
        arr = arr.get()
    elif _arrays.device_view(arr) is not None:
        raise KbitError(f"{what}: cannot copy a {type(arr).__name__} to the host; pass "
                        "numpy, PyTorch or CuPy arrays")
    arr = np.ascontiguousarray(np.asarray(arr))
    if arr.dtype.name not in _NP_TO_ST:
        raise KbitError(f"{what}: dtype {arr.dtype} cannot be stored in safetensors")
    return arr, _NP_TO_ST[arr.dtype.name]


def _torch_int16():
    import torch
    return torch.int16


def save(tensors: Mapping[str, Any], path, metadata: Mapping[str, str] | None = None,
         progress=None) -> None:
    """Writes {name: tensor} to a safetensors file at `path` (see the module doc).

    Values: kbit.QuantizedTensor, kbit.TiledTensor, kbit.Quantized4bit,
    kbit.gguf.GGUFTensor, or plain arrays (numpy, PyTorch or CuPy, on any device; copied
    to the host). metadata: extra str -> str entries (the key "kbit" is kbit's own).
    progress: a tqdm bar over the tensors (None: only for more than 16 tensors)."""
    if not isinstance(tensors, Mapping):
        raise KbitError(f"tensors must be a mapping of names to tensors, got "
                        f"{type(tensors).__name__}")
    extra = dict(metadata or {})
    if _KEY in extra:
        raise KbitError(f"metadata key {_KEY!r} is kbit's own")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        raise KbitError("metadata keys and values must be strings")
    entries: dict[str, np.ndarray] = {}
    bf16: set[str] = set()  # entries holding bfloat16 bits
    records: dict[str, dict] = {}

    def put(name: str, arr, what: str):
        if name in entries:
            raise KbitError(f"two tensors would be stored as {name!r}: rename one")
        entries[name], st_dtype = _to_host(arr, what)
        if st_dtype == "BF16":
            bf16.add(name)

    for name, value in _progress(tensors.items(), len(tensors), progress, "save"):
        if not isinstance(name, str) or not name:
            raise KbitError(f"tensor names must be non-empty strings, got {name!r}")
        fmt = format_of(value)
        if fmt is None:
            put(name, value, name)
            continue
        _, arrays, scalars = _FORMATS[fmt]
        shape = [int(d) for d in value.shape]
        value.n  # checks the shape
        record = {"format": fmt, "shape": shape}
        if fmt != "gguf":
            record["dtype"] = value.dtype
        for field in scalars:
            v = getattr(value, field)
            record[field] = v if isinstance(v, str) else float(v) if field == "tensor_scale" else int(v)
        for field in arrays:
            arr = getattr(value, field)
            if arr is not None:
                put(f"{name}.{field}", arr, f"{name}.{field}")
        records[name] = record
    extra[_KEY] = json.dumps({"format_version": FORMAT_VERSION, "tensors": records,
                              "order": list(tensors)})
    try:
        _write(entries, bf16, os.fspath(path), extra)
    except OSError:
        raise
    except Exception as e:  # safetensors' own error types
        raise KbitError(f"{path}: cannot write: {type(e).__name__}: {e}") from e


def _write(entries: dict, bf16: set, path: str, metadata: dict) -> None:
    """safetensors' numpy writer; its PyTorch one where a tensor is bfloat16 (which
    numpy cannot type; such tensors only come from PyTorch, so it is there)."""
    if not bf16:
        from safetensors.numpy import save_file
        save_file(entries, path, metadata=metadata)
        return
    import torch
    from safetensors.torch import save_file
    tensors = {}
    for name, arr in entries.items():
        t = torch.from_numpy(arr)
        tensors[name] = t.view(torch.bfloat16) if name in bf16 else t
    save_file(tensors, path, metadata=metadata)


def _progress(items, total: int, enabled, desc: str):
    if enabled is False or (enabled is None and total <= 16):
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=desc, unit="tensor", leave=False)


def _read_raw(path, f, name: str) -> np.ndarray:
    """Tensor `name` of an open safetensors file as numpy (BF16: uint16 bits)."""
    st_dtype = f.get_slice(name).get_dtype()
    if st_dtype not in _ST_DTYPES:
        raise _invalid(path, f"tensor {name!r} has dtype {st_dtype}, which kbit cannot read")
    if st_dtype != "BF16":
        return f.get_tensor(name)
    # numpy has no bfloat16: read the bytes of the same tensor as int16 through torch
    # when it is there, else from the file's header offsets
    try:
        import torch  # noqa: F401
        from safetensors import safe_open
        with safe_open(os.fspath(path), framework="pt") as g:
            return g.get_tensor(name).view(dtype=_torch_int16()).numpy().view(np.uint16)
    except ImportError:
        return _read_bf16_bits(path, name)


def _read_bf16_bits(path, name: str) -> np.ndarray:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    info = header[name]
    begin, end = info["data_offsets"]
    return np.fromfile(path, np.uint16, (end - begin) // 2, offset=8 + n + begin).reshape(
        info["shape"])


def load(path, device="cpu", progress=None) -> dict[str, Any]:
    """Reads a file written by kbit.save (or any safetensors file): {name: tensor} in the
    file's order, quantized tensors as their containers with arrays on `device` ('cpu':
    numpy; 'cuda' / 'cuda:N': PyTorch, else CuPy), plain tensors as arrays there (host
    bfloat16 as uint16 bits). Raises KbitError for a file that is not safetensors or whose
    kbit records do not match its tensors."""
    path = os.fspath(path)
    place = _arrays.named_place(device)
    with open_file(path) as f:
        meta = f.metadata() or {}
        records, saved_order = _records(path, meta)
        names = list(f.keys())
        owned = {}
        for name, rec in records.items():
            for field in _FORMATS[rec["format"]][1]:
                if f"{name}.{field}" in names:
                    owned[f"{name}.{field}"] = name
        result: dict[str, Any] = {}
        order = []  # quantized tensors take the place of their first field
        for key in names:
            owner = owned.get(key, key)
            if owner not in order:
                order.append(owner)
        missing = [n for n in records if n not in order]
        if missing:
            raise _invalid(path, f"quantized tensor {missing[0]!r} has none of its arrays")
        if saved_order is not None and sorted(saved_order) == sorted(order):
            order = saved_order  # safetensors sorts its entries; kbit.save's order
        for name in _progress(order, len(order), progress, os.path.basename(path)):
            if name in records:
                result[name] = _container(path, f, name, records[name], place)
            else:
                raw = _read_raw(path, f, name)
                bf16 = f.get_slice(name).get_dtype() == "BF16"
                result[name] = _place_plain(place, raw, bf16)
    return result


def open_file(path):
    """safetensors' reader of `path` (numpy framework), or FileNotFoundError / a KbitError
    saying the file is not safetensors."""
    from safetensors import SafetensorError, safe_open
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    try:
        return safe_open(os.fspath(path), framework="numpy")
    except (SafetensorError, OSError, ValueError) as e:
        raise _invalid(path, f"not a safetensors file: {e}") from e


def _records(path, meta: dict) -> tuple[dict, list | None]:
    """The kbit records of a file's metadata and the order kbit.save was given."""
    if _KEY not in meta:
        return {}, None
    try:
        doc = json.loads(meta[_KEY])
        version, records = doc["format_version"], doc["tensors"]
    except (ValueError, KeyError, TypeError) as e:
        raise _invalid(path, f"metadata {_KEY!r} is not a kbit record: {e}") from None
    if version != FORMAT_VERSION:
        raise _invalid(path, f"kbit checkpoint format version {version!r} is not "
                             f"supported (this kbit reads {FORMAT_VERSION})")
    if not isinstance(records, dict):
        raise _invalid(path, f"metadata {_KEY!r}: 'tensors' must be an object")
    for name, rec in records.items():
        if not isinstance(rec, dict) or rec.get("format") not in _FORMATS:
            raise _invalid(path, f"tensor {name!r}: unknown kbit format "
                                 f"{rec.get('format') if isinstance(rec, dict) else rec!r}")
    order = doc.get("order")
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        order = None
    return records, order


def _place_plain(place, raw: np.ndarray, bf16: bool):
    if not place.on_device:
        return np.array(raw)  # owns its memory (not a view of the file)
    buf = place.upload(np.ascontiguousarray(raw).reshape(-1).view(np.uint8))
    return place.as_type(buf, "bfloat16" if bf16 else raw.dtype.name, raw.shape)


def _container(path, f, name: str, rec: dict, place):
    cls, arrays, scalars = _FORMATS[rec["format"]]
    try:
        shape = tuple(rec["shape"])
        kwargs = {field: rec[field] for field in scalars}
        if rec["format"] != "gguf":
            kwargs["dtype"] = rec["dtype"]
    except KeyError as e:
        raise _invalid(path, f"tensor {name!r}: the kbit record has no {e}") from None
    if not all(_arrays.is_integer(d) and d >= 0 for d in shape):
        raise _invalid(path, f"tensor {name!r}: bad shape {rec['shape']!r}")
    fields = {}
    for field in arrays:
        key = f"{name}.{field}"
        fields[field] = _read_raw(path, f, key) if key in f.keys() else None
    value = cls(**fields, shape=shape, **kwargs)
    try:
        _check(value, rec["format"])
    except KbitError as e:
        raise _invalid(path, f"tensor {name!r}: {e}") from None
    # codebooks and nested-state tables stay numpy (the calls upload them); the bulk
    # arrays go to the device
    for field in arrays:
        arr = fields[field]
        if arr is not None and place.on_device and field not in ("codebook", "code"):
            setattr(value, field, place.upload(np.ascontiguousarray(arr)))
        elif arr is not None:
            setattr(value, field, np.array(arr))
    return value


def _check(value, fmt: str) -> None:
    """The stored arrays have the sizes the record's shape and parameters need."""
    n = value.n

    def need(field, count, dtype=None):
        arr = getattr(value, field)
        if arr is None:
            raise KbitError(f"{field} is missing")
        if dtype is not None and arr.dtype != np.dtype(dtype):
            raise KbitError(f"{field} must be {dtype}, got {arr.dtype}")
        if arr.size != count:
            raise KbitError(f"{field} has {arr.size} elements, expected {count}")

    if fmt in ("kbit", "kbit_tiled"):
        if value.absmax_format not in ("fp32", "fp16", "e4m4") or not 2 <= value.k <= 5:
            raise KbitError(f"bad k={value.k} or absmax_format={value.absmax_format!r}")
        if fmt == "kbit":
            words, entries = _kbit_sizes(n, value.k, value.absmax_format)
            need("packed", words, "uint32")
            need("absmax", entries, {"e4m4": "uint8", "fp16": "float16",
                                     "fp32": "float32"}[value.absmax_format])
        else:
            packed, absmax = _tiled_sizes(value.shape, value.k, value.absmax_format)
            need("packed", packed, "uint8")
            need("absmax", absmax, "uint8")
        if value.codebook is not None:
            need("codebook", 1 << value.k, "float32")
    elif fmt == "bnb4":
        blocks = -(-n // value.blocksize) if value.blocksize > 0 else -1
        need("packed", (n + 1) // 2)
        need("absmax", blocks)
    elif fmt == "gguf":
        elems, nbytes = block_info(value.ggml_type)
        if n % elems:
            raise KbitError(f"{n} elements are not whole {elems}-element blocks")
        need("blocks", n // elems * nbytes, "uint8")
