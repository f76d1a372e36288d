"""Host (numpy) and device (any framework) arrays as raw pointers for the C calls.

Device arrays are taken without copies through DLPack (PyTorch, CuPy, JAX, ...) or
`__cuda_array_interface__` (CuPy, Numba, PyTorch). New device outputs are allocated
with the input's own framework (PyTorch or CuPy), or CuPy/PyTorch when the input
comes from a framework that cannot hand out writable arrays (JAX); pass `out=` to
control that yourself.
"""
from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._lib import KbitError

# dtype names used throughout the package
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_DL_CUDA, _DL_CUDA_MANAGED = 2, 13
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4
_DL_NAMES = {(_DL_FLOAT, 32): "float32", (_DL_FLOAT, 16): "float16",
             (_DL_BFLOAT, 16): "bfloat16", (_DL_UINT, 8): "uint8",
             (_DL_UINT, 16): "uint16", (_DL_UINT, 32): "uint32",
             (_DL_INT, 8): "int8", (_DL_INT, 32): "int32", (_DL_FLOAT, 64): "float64"}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "uint16": 2,
             "uint32": 4, "int8": 1, "int32": 4, "float64": 8}


def dtype_name(dtype: Any) -> str:
    """Normalises numpy / torch / string dtypes to a name such as 'float16'."""
    if isinstance(dtype, str):
        name = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                "half": "float16", "float": "float32"}.get(dtype, dtype)
    else:
        name = str(dtype).replace("torch.", "")
        if name not in _ITEMSIZE and dtype is not None:  # np.dtype(None) is float64
            try:
                name = np.dtype(dtype).name
            except TypeError:
                pass
    if name not in _ITEMSIZE:
        raise KbitError(f"unsupported dtype {dtype!r}")
    return name


def is_integer(v) -> bool:
    """Whether v is a true integer (Python or numpy): 4.0 == 4 and True == 1, but neither
    is a bit width or a block size."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def host_array(x, dtype=None) -> np.ndarray:
    """x as a numpy array the C code can read: C-contiguous, aligned and in native byte
    order (a copy only where x is not one already). dtype converts the values."""
    arr = np.asarray(x, dtype=dtype)
    if not arr.dtype.isnative:  # big-endian data: the same values in native order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.require(arr, requirements=["C", "A"])


@dataclass
class DeviceArray:
    """A contiguous device array seen as a pointer (keeps its owner alive)."""
    ptr: int
    shape: tuple
    dtype: str
    device_id: int
    owner: Any

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * _ITEMSIZE[self.dtype]


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _check_contiguous(shape, strides_elems, what):
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides_elems)):
        if dim != 1 and stride != expected:
            raise KbitError(f"{what} must be C-contiguous")
        expected *= dim


def _from_dlpack(obj, stream: int) -> DeviceArray | None:
    dev_type, dev_id = obj.__dlpack_device__()
    if int(dev_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        return None
    try:
        capsule = obj.__dlpack__(stream=stream if stream else 1)
    except TypeError:
        capsule = obj.__dlpack__()
    ptr = _capsule_get(capsule, b"dltensor")
    managed = _DLManagedTensor.from_address(ptr)
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    key = (t.dtype.code, t.dtype.bits)
    if key not in _DL_NAMES or t.dtype.lanes != 1:
        raise KbitError(f"unsupported DLPack dtype code={key[0]} bits={key[1]}")
    if t.strides:
        _check_contiguous(shape, [t.strides[i] for i in range(t.ndim)], "device array")
    arr = DeviceArray(int(t.data or 0) + int(t.byte_offset), shape, _DL_NAMES[key],
                      int(dev_id), obj)
    # We consumed the capsule: release the producer's reference now (we keep `obj`).
    _capsule_set_name(capsule, b"used_dltensor")
    if managed.deleter:
        managed.deleter(ctypes.pointer(managed))
    return arr


def _from_cai(obj) -> DeviceArray:
    cai = obj.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dt = np.dtype(cai["typestr"])
    if cai.get("strides") is not None:
        _check_contiguous(shape, [s // dt.itemsize for s in cai["strides"]],
                          "device array")
    ptr = int(cai["data"][0] or 0)
    dev_id = 0
    try:
        dev_id = int(obj.device.id)  # CuPy / Numba
    except Exception:
        try:
            dev_id = int(obj.device.index or 0)  # PyTorch
        except Exception:
            pass
    return DeviceArray(ptr, shape, dt.name, dev_id, obj)


def device_context(arr: DeviceArray):
    """Makes arr's device current for the calls inside (the kernels, the stream and the
    scale helper's allocation must all be on the array's device)."""
    mod = type(arr.owner).__module__.split(".")[0]
    try:
        if mod == "torch":
            import torch
            return torch.cuda.device(arr.device_id)
        if mod == "cupy":
            import cupy
            return cupy.cuda.Device(arr.device_id)
    except ImportError:
        pass
    return contextlib.nullcontext()


def current_stream(obj) -> int:
    """The stream the caller's framework is working on for obj's device (0: default)."""
    mod = type(obj).__module__.split(".")[0]
    try:
        if mod == "torch":
            import torch
            return int(torch.cuda.current_stream(obj.device).cuda_stream)
        if mod == "cupy":
            import cupy
            return int(cupy.cuda.get_current_stream().ptr)
    except Exception:
        pass
    return 0


def device_view(obj) -> DeviceArray | None:
    """A DeviceArray for a CUDA array of any framework, None for host arrays."""
    if isinstance(obj, (np.ndarray, np.generic, list, tuple)):
        return None
    mod = type(obj).__module__.split(".")[0]
    if mod == "torch" and hasattr(obj, "is_cuda"):
        if not obj.is_cuda:
            return None
        if not obj.is_contiguous():
            raise KbitError("device array must be C-contiguous")
        return DeviceArray(int(obj.data_ptr()), tuple(obj.shape),
                           dtype_name(obj.dtype), int(obj.device.index or 0), obj)
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, current_stream(obj))
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj)
    return None


def _empty_with(mod: str, shape, dtype: str, device_id: int):
    if mod == "torch":
        import torch
        tdt = getattr(torch, dtype, None)
        if tdt is None and dtype == "uint32":  # PyTorch < 2.3: same bytes as int32
            tdt = torch.int32
        if tdt is None:
            raise KbitError(f"this PyTorch has no {dtype} tensors")
        return torch.empty(shape, dtype=tdt, device=f"cuda:{device_id}")
    if mod == "cupy":
        import cupy
        if dtype == "bfloat16":
            raise KbitError("CuPy has no bfloat16 arrays; pass out= or use PyTorch")
        with cupy.cuda.Device(device_id):
            return cupy.empty(shape, dtype=dtype)
    raise KbitError(f"cannot allocate device arrays with {mod}")


def empty_device(like: DeviceArray, shape, dtype: str):
    """A new device array on like's device, from like's framework when it can."""
    mod = type(like.owner).__module__.split(".")[0]
    order = [mod] if mod in ("torch", "cupy") else []
    order += [m for m in ("torch", "cupy") if m not in order]
    errors = []
    for m in order:
        try:
            return _empty_with(m, tuple(shape), dtype, like.device_id)
        except ImportError:
            errors.append(f"{m} not installed")
        except KbitError as e:
            errors.append(str(e))
    raise KbitError("cannot allocate a device output (" + "; ".join(errors) +
                    "): pass out= arrays")


def check_device_output(arr: DeviceArray, size: int, dtype: str, what: str):
    if arr.dtype != dtype:
        raise KbitError(f"{what} must have dtype {dtype}, got {arr.dtype}")
    if arr.size != size:
        raise KbitError(f"{what} must have {size} elements, got {arr.size}")


def host_output(out, shape, dtype: str) -> np.ndarray:
    """The numpy output of a dequantize: `out` checked, or a new array of `shape`.
    bfloat16 results are uint16 bit patterns."""
    np_dtype = "uint16" if dtype == "bfloat16" else dtype
    size = int(np.prod(shape, dtype=np.int64))
    if out is None:
        return np.empty(shape, dtype=np_dtype)
    if (not isinstance(out, np.ndarray) or out.dtype != np_dtype or out.size != size
            or not out.flags.c_contiguous or not out.flags.aligned
            or not out.flags.writeable):
        raise KbitError(f"out must be a writeable, aligned, contiguous numpy array of "
                        f"{size} {np_dtype}")
    return out


def device_output(out, like: DeviceArray, shape, dtype: str):
    """The device output of a dequantize and its view: `out` checked, or a new array of
    `shape` on like's device."""
    if out is None:
        out = empty_device(like, shape, dtype)
    view = device_view(out)
    if view is None:
        raise KbitError("out must be a device array when the input is on the device")
    check_device_output(view, int(np.prod(shape, dtype=np.int64)), dtype, "out")
    return out, view


def to_device(host: np.ndarray, like: DeviceArray):
    """Copies a small host array to like's device with an available framework."""
    mod = type(like.owner).__module__.split(".")[0]
    order = [mod] if mod in ("torch", "cupy") else []
    order += [m for m in ("torch", "cupy") if m not in order]
    for m in order:
        try:
            if m == "torch":
                import torch
                return torch.from_numpy(np.ascontiguousarray(host)).to(f"cuda:{like.device_id}")
            import cupy
            with cupy.cuda.Device(like.device_id):
                return cupy.asarray(host)
        except ImportError:
            continue
    raise KbitError("copying to the device needs PyTorch or CuPy")
