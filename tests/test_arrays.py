"""The zero-copy array layer (kbit._arrays), exercised without a GPU: objects that
present host memory as CUDA memory through DLPack or __cuda_array_interface__ must be
read as pointer, shape and dtype exactly, and bad layouts must be refused."""
import numpy as np
import pytest

import kbit
from kbit import _arrays


class FakeDLPack:
    """Presents a numpy array's DLPack capsule as if it lived on CUDA device 3."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return (2, 3)  # kDLCUDA, device 3

    def __dlpack__(self, stream=None):
        self.stream = stream
        return self.array.__dlpack__()


class FakeCAI:
    def __init__(self, array, strides=None):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str,
            "data": (array.ctypes.data, False), "version": 3, "strides": strides}


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8", "uint32"])
def test_dlpack_is_read_without_copy(dtype):
    a = np.arange(24, dtype=dtype).reshape(2, 3, 4)
    fake = FakeDLPack(a)
    view = _arrays.device_view(fake)
    assert view.ptr == a.ctypes.data
    assert view.shape == (2, 3, 4) and view.dtype == dtype and view.device_id == 3
    assert view.size == 24 and view.nbytes == a.nbytes
    assert fake.stream == 1  # no framework stream known: the legacy default stream


def test_dlpack_offset_view():
    a = np.arange(100, dtype=np.float32)
    view = _arrays.device_view(FakeDLPack(a[10:]))
    assert view.ptr == a.ctypes.data + 40 and view.shape == (90,)


def test_dlpack_non_contiguous_is_refused():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    with pytest.raises(kbit.KbitError, match="contiguous"):
        _arrays.device_view(FakeDLPack(a))


def test_cuda_array_interface():
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    view = _arrays.device_view(FakeCAI(a))
    assert view.ptr == a.ctypes.data and view.shape == (3, 4) and view.dtype == "float16"
    view = _arrays.device_view(FakeCAI(a, strides=(8, 2)))  # explicit C strides
    assert view.shape == (3, 4)
    with pytest.raises(kbit.KbitError, match="contiguous"):
        _arrays.device_view(FakeCAI(a, strides=(2, 6)))


def test_host_arrays_are_not_device_arrays():
    assert _arrays.device_view(np.zeros(3)) is None
    assert _arrays.device_view([1.0, 2.0]) is None


def test_dtype_names():
    assert _arrays.dtype_name("bf16") == "bfloat16"
    assert _arrays.dtype_name(np.float16) == "float16"
    assert _arrays.dtype_name("fp32") == "float32"
    with pytest.raises(kbit.KbitError):
        _arrays.dtype_name("complex64")


def test_library_load_error_names_every_place(monkeypatch, tmp_path):
    from kbit import _lib
    monkeypatch.setattr(_lib.os.path, "abspath", lambda p: str(tmp_path / "kbit" / "_lib.py"))
    monkeypatch.setenv("KBIT_LIBRARY", str(tmp_path / "nowhere.so"))
    monkeypatch.setattr(_lib.ctypes.util, "find_library", lambda name: None)
    real_cdll = _lib.ctypes.CDLL

    def no_system(name, *a, **k):
        if name == "libkbit.so":
            raise OSError("not on the system path")
        return real_cdll(name, *a, **k)

    monkeypatch.setattr(_lib.ctypes, "CDLL", no_system)
    with pytest.raises(kbit.KbitError) as err:
        _lib._load()
    msg = str(err.value)
    assert str(tmp_path / "kbit" / "libkbit.so") in msg and "nowhere.so" in msg
    assert "system search path" in msg
