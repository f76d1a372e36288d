"""Host (numpy) and device (any framework) arrays as raw pointers for the C calls, and
the one input-and-allocation path every format family (kbit, bnb4, gguf) goes through.

Device arrays are taken without copies through DLPack (PyTorch, CuPy, JAX, ...) or
`__cuda_array_interface__` (CuPy, Numba, PyTorch). New device outputs are allocated
with the input's own framework (PyTorch or CuPy), or CuPy/PyTorch when the input
comes from a framework that cannot hand out writable arrays (JAX); pass `out=` to
control that yourself.

A Place is where a call runs: the host (numpy arrays, the `_host` C functions) or one
CUDA device (the launch functions, on the caller's stream). `place_of(array)` and
`float_input(x)` find it; it allocates outputs on its side, checks a caller's out=,
views the other fields of a quantized tensor and calls the right C symbol.
"""
from __future__ import annotations

import contextlib
import threading
import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._lib import KbitError, call

# dtype names used throughout the package
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
# kbit_dtype values of the float types, and their tags in per-type C symbol names
DTYPE_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
C_TYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_FRAMEWORKS = ("torch", "cupy")  # the frameworks kbit allocates device arrays with
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


def _torch_cpu(x):
    """A PyTorch CPU tensor as numpy without a copy: detached (kbit computes no
    gradients), bfloat16 as its uint16 bits. Anything else is returned unchanged."""
    if type(x).__module__.split(".")[0] != "torch" or not hasattr(x, "detach"):
        return x
    x = x.detach()
    if str(x.dtype) == "torch.bfloat16":
        import torch
        return x.contiguous().view(torch.int16).numpy().view(np.uint16)
    return x.numpy()


def host_array(x, dtype=None) -> np.ndarray:
    """x as a numpy array the C code can read: C-contiguous, aligned and in native byte
    order (a copy only where x is not one already). dtype converts the values. PyTorch
    CPU tensors are read detached, bfloat16 ones as uint16 bits."""
    arr = np.asarray(_torch_cpu(x), dtype=dtype)
    if not arr.dtype.isnative:  # big-endian data: the same values in native order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.require(arr, requirements=["C", "A"])


@dataclass
class DeviceArray:
    """A contiguous array seen as a pointer (keeps its owner alive): a CUDA array of
    device `device_id`, or a host array (device_id None) where a Place views one."""
    ptr: int
    shape: tuple
    dtype: str
    device_id: int | None
    owner: Any

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * (_ITEMSIZE.get(self.dtype) or np.dtype(self.dtype).itemsize)


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


def _framework(obj) -> str:
    """The top-level module of obj's type ('torch', 'cupy', 'jaxlib', 'numpy', ...)."""
    return type(obj).__module__.split(".")[0]


def _device_context(framework: str | None, device_id: int):
    """Makes device_id current for the calls inside (the kernels, the stream and the
    scale helper's allocation must all be on the array's device)."""
    try:
        if framework == "torch":
            import torch
            return torch.cuda.device(device_id)
        if framework == "cupy":
            import cupy
            return cupy.cuda.Device(device_id)
    except ImportError:
        pass
    return contextlib.nullcontext()


def _framework_stream(framework: str | None, device_id: int) -> int:
    """The stream `framework` is working on for device_id (0: the default stream)."""
    try:
        if framework == "torch":
            import torch
            return int(torch.cuda.current_stream(device_id).cuda_stream)
        if framework == "cupy":
            import cupy
            with cupy.cuda.Device(device_id):
                return int(cupy.cuda.get_current_stream().ptr)
    except Exception:
        pass
    return 0


def current_stream(obj) -> int:
    """The stream the caller's framework is working on for obj's device (0: default)."""
    framework = _framework(obj)
    try:
        device_id = int(obj.device.index or 0) if framework == "torch" else int(obj.device.id)
    except Exception:
        device_id = 0
    return _framework_stream(framework, device_id)


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


def _empty_with(framework: str, shape, dtype: str, device_id: int):
    if framework == "torch":
        import torch
        tdt = getattr(torch, dtype, None)
        if tdt is None and dtype == "uint32":  # PyTorch < 2.3: same bytes as int32
            tdt = torch.int32
        if tdt is None:
            raise KbitError(f"this PyTorch has no {dtype} tensors")
        return torch.empty(shape, dtype=tdt, device=f"cuda:{device_id}")
    if framework == "cupy":
        import cupy
        if dtype == "bfloat16":
            raise KbitError("CuPy has no bfloat16 arrays; pass out= or use PyTorch")
        with cupy.cuda.Device(device_id):
            return cupy.empty(shape, dtype=dtype)
    raise KbitError(f"cannot allocate device arrays with {framework}")


def _upload_with(framework: str, host: np.ndarray, device_id: int):
    if framework == "torch":
        import torch
        return torch.from_numpy(np.ascontiguousarray(host)).to(f"cuda:{device_id}")
    if framework == "cupy":
        import cupy
        with cupy.cuda.Device(device_id):
            return cupy.asarray(host)
    raise KbitError(f"cannot allocate device arrays with {framework}")


def to_host(obj) -> np.ndarray | None:
    """A copy of a device array of PyTorch or CuPy on the host (a host array as it is);
    None for other frameworks' device arrays."""
    if device_view(obj) is None:
        return host_array(obj)
    framework = _framework(obj)
    if framework == "torch":
        return obj.detach().cpu().numpy()
    if framework == "cupy":
        return obj.get()
    return None


def host_dtype(dtype: str) -> str:
    """The numpy dtype that holds `dtype` on the host (bfloat16: uint16 bit patterns)."""
    return "uint16" if dtype == "bfloat16" else dtype


def float_dtype(dtype, what: str = "output") -> str:
    """dtype's name, which must be one of the float types the C functions take."""
    name = dtype_name(dtype)
    if name not in DTYPE_ID:
        raise KbitError(f"{what} dtype must be float32, float16 or bfloat16, got {name}")
    return name


_UPLOADS: dict = {}  # Place.upload_cached: (framework, device, dtype, bytes) -> array
_UPLOADS_LOCK = threading.Lock()


class Place:
    """Where a call runs and its outputs live: the host (`device_id` None: numpy arrays,
    the `_host` C functions) or CUDA device `device_id` (the launch functions, on
    `stream`; outputs from `framework`, else PyTorch or CuPy)."""

    def __init__(self, device_id: int | None = None, framework: str | None = None,
                 stream: int = 0, what: str = "the input"):
        self.device_id, self.framework, self.stream = device_id, framework, stream
        self.what = what  # the array that decided the place, for error messages

    @property
    def on_device(self) -> bool:
        return self.device_id is not None

    def __repr__(self) -> str:
        if not self.on_device:
            return "Place(host)"
        return f"Place(cuda:{self.device_id}, {self.framework}, stream={self.stream:#x})"

    # -- calls ----------------------------------------------------------------------
    def call(self, name: str, *args) -> None:
        """Calls `name` (its `_host` twin on the host; on the device with the stream)."""
        if self.on_device:
            call(name, *args, self.stream)
        else:
            call(name + "_host", *args)

    def active(self):
        """A context making this place's device current (nothing on the host)."""
        if not self.on_device:
            return contextlib.nullcontext()
        return _device_context(self.framework, self.device_id)

    # -- arrays ---------------------------------------------------------------------
    def view(self, arr, what: str, host=host_array) -> DeviceArray:
        """arr, which must live in this place, as a pointer view. Host arrays go through
        `host` first (a conversion or check; the view keeps its result alive)."""
        dev = device_view(arr)
        if self.on_device and dev is None:
            raise KbitError(f"{self.what} is on the device but {what} is not")
        if not self.on_device:
            if dev is not None:
                raise KbitError(f"{self.what} is on the host but {what} is on the device")
            arr = host(arr)
            return DeviceArray(arr.ctypes.data, tuple(arr.shape), arr.dtype.name, None, arr)
        if dev.device_id != self.device_id:
            raise KbitError(f"{what} is on cuda:{dev.device_id} but {self.what} on "
                            f"cuda:{self.device_id}")
        return dev

    def ptr(self, arr) -> int | None:
        """The address of an array this place allocated or uploaded (None: NULL)."""
        if arr is None:
            return None
        if not self.on_device:  # never through a conversion: its copy would not live on
            return arr.ctypes.data
        return self.view(arr, "an array").ptr

    def _frameworks(self) -> list:
        first = [self.framework] if self.framework in _FRAMEWORKS else []
        return first + [m for m in _FRAMEWORKS if m not in first]

    def _with_framework(self, make, what: str):
        errors = []
        for framework in self._frameworks():
            try:
                return make(framework)
            except ImportError:
                errors.append(f"{framework} not installed")
            except KbitError as e:
                errors.append(str(e))
        raise KbitError(f"cannot {what} (" + "; ".join(errors) + ")")

    def empty(self, shape, dtype: str):
        """A new array of `shape` here (host bfloat16: uint16 bit patterns)."""
        shape = tuple(shape)
        if not self.on_device:
            return np.empty(shape, dtype=host_dtype(dtype))
        return self._with_framework(
            lambda m: _empty_with(m, shape, dtype, self.device_id),
            "allocate a device output; pass out= arrays")

    def upload(self, host: np.ndarray):
        """A (small) host array here: itself on the host, a device copy on the device."""
        if not self.on_device:
            return host
        return self._with_framework(
            lambda m: _upload_with(m, host, self.device_id),
            "copy to the device: it needs PyTorch or CuPy")

    def upload_cached(self, host: np.ndarray):
        """upload() of a small constant array (a codebook), kept per framework, device and
        contents: repeated calls make no copies, so they can be captured in CUDA graphs
        once a first call has run outside the capture."""
        if not self.on_device:
            return host
        key = (self.framework, self.device_id, host.dtype.str, host.tobytes())
        with _UPLOADS_LOCK:
            arr = _UPLOADS.get(key)
            if arr is None:
                if len(_UPLOADS) >= 256:
                    _UPLOADS.clear()
                arr = _UPLOADS[key] = self.upload(host)
        return arr

    def output(self, out, shape, dtype: str):
        """(array, pointer) of a result of `shape` and `dtype`: `out` checked, or a new
        array here."""
        size = int(np.prod(shape, dtype=np.int64))
        if out is None:
            out = self.empty(shape, dtype)
        if not self.on_device:
            np_dtype = host_dtype(dtype)
            if (not isinstance(out, np.ndarray) or out.dtype != np_dtype or out.size != size
                    or not out.flags.c_contiguous or not out.flags.aligned
                    or not out.flags.writeable):
                raise KbitError(f"out must be a writeable, aligned, contiguous numpy array "
                                f"of {size} {np_dtype}")
            return out, out.ctypes.data
        view = device_view(out)
        if view is None:
            raise KbitError("out must be a device array when the input is on the device")
        if view.dtype != dtype:
            raise KbitError(f"out must have dtype {dtype}, got {view.dtype}")
        if view.size != size:
            raise KbitError(f"out must have {size} elements, got {view.size}")
        return out, view.ptr

    def as_type(self, buf, dtype: str, shape):
        """A uint8 buffer of this place seen as `dtype` values of `shape` (no copy)."""
        if not self.on_device:
            return buf.view(host_dtype(dtype)).reshape(shape)
        if _framework(buf) == "torch":
            import torch
            return buf.view(getattr(torch, dtype)).reshape(shape)
        if dtype == "bfloat16":
            raise KbitError("CuPy has no bfloat16 arrays: install PyTorch")
        return buf.view(dtype).reshape(shape)


def place_of(obj, what: str = "the input") -> Place:
    """Where obj lives: the host for host arrays, else its device with the stream its
    framework is working on. `what` names obj in error messages."""
    return _place(obj, device_view(obj), what)


def _place(obj, dev: DeviceArray | None, what: str = "the input") -> Place:
    if dev is None:
        return Place(what=what)
    return Place(dev.device_id, _framework(obj), current_stream(obj), what)


def named_place(device) -> Place:
    """The place for a device name: 'cpu', or 'cuda' / 'cuda:N' / a torch.device, with
    PyTorch (else CuPy) for the arrays and that framework's current stream."""
    text = str(device)
    if text == "cpu":
        return Place()
    if not text.startswith("cuda"):
        raise KbitError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    index = None if isinstance(device, str) else getattr(device, "index", None)
    if index is None and ":" in text:
        try:
            index = int(text.split(":", 1)[1])
        except ValueError:
            raise KbitError(f"bad device {device!r}") from None
    errors = []
    for framework in _FRAMEWORKS:
        try:
            if framework == "torch":
                import torch
                if not torch.cuda.is_available():
                    raise KbitError("PyTorch sees no CUDA device")
                device_id = torch.cuda.current_device() if index is None else index
            else:
                import cupy
                device_id = cupy.cuda.Device().id if index is None else index
            return Place(device_id, framework, _framework_stream(framework, device_id))
        except ImportError:
            errors.append(f"{framework} not installed")
        except KbitError as e:
            errors.append(str(e))
        except Exception as e:  # the framework's own "no device" errors
            errors.append(f"{framework}: {type(e).__name__}: {e}")
    raise KbitError(f"device={text!r} needs PyTorch or CuPy for device arrays ("
                    + "; ".join(errors) + ")")


@dataclass
class FloatInput:
    """A float tensor to quantize, resolved: where it lives, its address, shape, dtype
    name and element count (`keep` holds the memory alive)."""
    place: Place
    ptr: int
    shape: tuple
    dtype: str
    size: int
    keep: Any

    @property
    def dtype_id(self) -> int:
        return DTYPE_ID[self.dtype]


def float_input(x, dtype=None) -> FloatInput:
    """x (numpy: the CPU path; a CUDA array of any framework: the GPU path, no copy) as
    a float input. Host values are converted to `dtype` where given; host bfloat16 is
    uint16 bits with dtype='bfloat16'. Device arrays are taken in their own dtype."""
    dev = device_view(x)
    place = _place(x, dev)
    if dev is not None:
        if dev.dtype not in DTYPE_ID:
            raise KbitError(f"input dtype must be float32, float16 or bfloat16, got "
                            f"{dev.dtype}")
        return FloatInput(place, dev.ptr, tuple(dev.shape), dev.dtype, dev.size, x)
    arr = host_array(x)
    name = dtype_name(dtype) if dtype is not None else None
    if name is None and str(getattr(x, "dtype", "")) == "torch.bfloat16":
        name = "bfloat16"  # a PyTorch CPU bfloat16 tensor, read as its bits
    if name == "bfloat16":
        if arr.dtype != np.uint16:
            raise KbitError("host bfloat16 input is passed as uint16 bits with "
                            "dtype='bfloat16'")
    else:
        if name is not None:
            arr = arr.astype(name, copy=False)
        name = arr.dtype.name
        if name not in ("float32", "float16"):
            raise KbitError(f"input dtype must be float32, float16 or bfloat16 (uint16 "
                            f"bits with dtype='bfloat16'), got {name}")
    return FloatInput(place, arr.ctypes.data, tuple(arr.shape), name, arr.size, arr)
