"""The one input-and-allocation path of every family (kbit._arrays.Place), device side,
exercised without a GPU: a stand-in for CuPy presents host memory as CUDA arrays, and
each launch function is run as its `_host` twin (same arguments minus the stream, and
minus the matmul entries' workspace). So the device paths of kbit, bnb4, gguf and
matmul (allocation, out= checks, uploads, the stream, the range-flag check, the file
loader) must give the CPU path's bytes."""
import importlib
import sys
import types

import gguf
import numpy as np
import pytest

import kbit
from kbit import _arrays, _lib
from kbit import gguf as kg
from kbit._signatures import SIGNATURES

from test_gguf import TYPE_ID, add_tensors, write_gguf

STREAM = 0x5EED


class FakeArray:
    """Host memory shown as a CuPy array of device 0 (__cuda_array_interface__)."""
    __module__ = "cupy"

    def __init__(self, host):
        self.host = host
        self.device = types.SimpleNamespace(id=0)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "version": 3,
                "data": (self.host.ctypes.data, False), "strides": None}

    @property
    def shape(self):
        return self.host.shape

    def view(self, dtype):
        return FakeArray(self.host.view(dtype))

    def reshape(self, shape):
        return FakeArray(self.host.reshape(shape))

    def fill(self, value):
        self.host.fill(value)

    def item(self):
        return self.host.item()


class FakeDevice:
    entered = []

    def __init__(self, device_id=0):
        self.id = device_id

    def __enter__(self):
        FakeDevice.entered.append(self.id)

    def __exit__(self, *exc):
        return False


def _fake_cupy():
    cupy = types.ModuleType("cupy")
    cupy.empty = lambda shape, dtype: FakeArray(np.empty(shape, dtype))
    cupy.asarray = lambda host: FakeArray(np.array(host))
    cupy.cuda = types.SimpleNamespace(
        Device=FakeDevice, get_current_stream=lambda: types.SimpleNamespace(ptr=STREAM))
    return cupy


@pytest.fixture
def emulated(monkeypatch):
    """Installs the stand-in CuPy (no PyTorch) and runs launches as their host twins;
    returns the list of (launch function, stream) calls."""
    if kbit.cuda_available():
        pytest.skip("a real GPU is present: host memory must not pose as device memory")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    launches = []
    real_call = _lib.call

    def call(name, *args):
        if name == "kbit_get_range_flag":  # no blocks out of range: the host call says so
            args[0]._obj.value = 0
            return
        host = name + "_host"
        if host not in SIGNATURES:  # a host call (of the CPU path) or no launch function
            return real_call(name, *args)
        n = len(SIGNATURES[host][0])  # the launch adds the stream, the matmul entries
        assert len(args) == len(SIGNATURES[name][0]) in (n + 1, n + 3), name  # workspace too
        assert args[n:-1] in ((), (None, 0)), name  # no workspace, 0 bytes
        launches.append((name, args[-1]))
        real_call(host, *args[:n])

    monkeypatch.setattr(_arrays, "call", call)
    monkeypatch.setattr(importlib.import_module("kbit.kbit"), "call", call)
    return launches


def test_kbit_device_path(rng, emulated):
    x = rng.standard_normal((5, 77)).astype(np.float16)
    book = np.sort(rng.standard_normal(8)).astype(np.float32)
    for absmax, codebook in (("e4m4", None), ("fp16", book), ("fp32", None)):
        want = kbit.quantize(x, k=3, absmax=absmax, codebook=codebook)
        FakeDevice.entered.clear()
        q = kbit.quantize(FakeArray(x.copy()), k=3, absmax=absmax, codebook=codebook)
        assert isinstance(q.packed, FakeArray) and q.on_device and FakeDevice.entered
        assert q.tensor_scale == want.tensor_scale and q.shape == x.shape
        np.testing.assert_array_equal(q.packed.host, want.packed)
        np.testing.assert_array_equal(q.absmax.host, want.absmax)
        for dtype in ("float32", "float16"):
            y = kbit.dequantize(q, dtype=dtype)
            assert isinstance(y, FakeArray) and y.shape == x.shape
            np.testing.assert_array_equal(y.host, kbit.dequantize(want, dtype=dtype))
    assert {name for name, _ in emulated} >= {"kbit_quantize", "kbit_dequantize",
                                             "kbit_compute_tensor_scale"}
    assert {stream for _, stream in emulated} == {STREAM}
    out = FakeArray(np.empty(x.size, np.float32))
    assert kbit.dequantize(q, dtype="float32", out=out) is out
    with pytest.raises(kbit.KbitError, match="out must have dtype float16"):
        kbit.dequantize(q, dtype="float16", out=out)
    with pytest.raises(kbit.KbitError, match="out must be a device array"):
        kbit.dequantize(q, out=np.empty(x.size, np.float16))
    with pytest.raises(kbit.KbitError, match="CuPy has no bfloat16"):
        kbit.dequantize(q, dtype="bfloat16")
    with pytest.raises(kbit.KbitError, match="packed is on the device but absmax is not"):
        kbit.dequantize(kbit.QuantizedTensor(q.packed, want.absmax, 3, x.shape, "float16",
                                             "fp32"))
    with pytest.raises(kbit.KbitError, match="packed is on the host but absmax is on the"):
        kbit.dequantize(kbit.QuantizedTensor(want.packed, q.absmax, 3, x.shape, "float16",
                                             "fp32"))


@pytest.mark.parametrize("nested", [False, True])
def test_bnb4_device_path(rng, emulated, nested):
    x = rng.standard_normal(3001).astype(np.float32)
    for qt in ("nf4", "fp4"):
        want = kbit.quantize_4bit(x, qt, 128, compress_statistics=nested)
        q = kbit.quantize_4bit(FakeArray(x.copy()), qt, 128, compress_statistics=nested)
        for field in ("packed", "absmax", "absmax2", "offset"):
            if getattr(want, field) is not None:
                np.testing.assert_array_equal(getattr(q, field).host, getattr(want, field))
        y = kbit.dequantize_4bit(q, dtype="float16")
        np.testing.assert_array_equal(y.host, kbit.dequantize_4bit(want, dtype="float16"))
        if nested:  # a host offset next to device codes is copied over
            q.offset = float(want.offset[0])
            np.testing.assert_array_equal(kbit.dequantize_4bit(q).host,
                                          kbit.dequantize_4bit(want))
    assert {stream for _, stream in emulated} == {STREAM}


def test_gguf_device_path(rng, tmp_path, emulated):
    path = tmp_path / "model.gguf"
    specs = {"q4_0": ("Q4_0", (3, 64)), "q8_0": ("Q8_0", (5, 32)), "q4_k": ("Q4_K", (2, 512)),
             "q5_k": ("Q5_K", (2, 3, 256)), "q6_k": ("Q6_K", (7, 256)), "f32": ("F32", (7,)),
             "f16": ("F16", (2, 3))}
    w = gguf.GGUFWriter(str(path), "kbit-test")
    add_tensors(w, rng, specs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cpu = kg.load(path, device="cpu", dtype="float16")
    dev = kg.load(path, device="cuda", dtype="float16")
    raw = kg.load(path, device="cuda:0", dequantize=False)
    for name, (t, shape) in specs.items():
        assert isinstance(dev[name], FakeArray) and dev[name].shape == shape
        np.testing.assert_array_equal(dev[name].host, cpu[name])
        if t in TYPE_ID:
            g = raw[name]
            assert isinstance(g, kg.GGUFTensor) and g.on_device and g.shape == shape
            np.testing.assert_array_equal(kg.dequantize(g, dtype="float16").host, cpu[name])
    assert ("kbit_gguf_dequantize", STREAM) in emulated
    write_gguf(path, rng)  # with a BF16 tensor, which CuPy cannot hold
    with pytest.raises(kbit.KbitError, match="bf16.*CuPy has no bfloat16"):
        kg.load(path, device="cuda")


def test_matmul_device_path(rng, emulated):
    from gguf.quants import quantize as gguf_quantize
    n_out, k_in = 7, 256
    w = rng.standard_normal((n_out, k_in)).astype(np.float32)
    x = rng.standard_normal((2, 3, k_in)).astype(np.float16)
    bias = rng.standard_normal(n_out).astype(np.float16)
    book = np.sort(rng.standard_normal(8)).astype(np.float32)
    blocks = np.ascontiguousarray(gguf_quantize(w, gguf.GGMLQuantizationType.Q8_0))
    weights = [  # (host weight, the same weight on the device)
        (kbit.quantize(w, k=3, codebook=book), kbit.quantize(FakeArray(w), k=3, codebook=book)),
        (kbit.quantize_nf4(w, 64, compress_statistics=True),  # expanded scales
         kbit.quantize_nf4(FakeArray(w), 64, compress_statistics=True)),
        (kg.GGUFTensor(blocks.reshape(-1), 8, (n_out, k_in)),
         kg.GGUFTensor(FakeArray(blocks.reshape(-1)), 8, (n_out, k_in)))]
    for host_w, dev_w in weights:
        want = kbit.matmul(x, host_w, bias)
        emulated.clear()
        y = kbit.matmul(FakeArray(x), dev_w, FakeArray(bias))
        assert isinstance(y, FakeArray) and y.shape == (2, 3, n_out)
        np.testing.assert_array_equal(y.host, want)
        assert any(name.startswith("kbit_matmul_") for name, _ in emulated)
        assert {stream for _, stream in emulated} == {STREAM}
        out = FakeArray(np.empty((6, n_out), np.float16))
        assert kbit.matmul(FakeArray(x), dev_w, out=out) is out
        np.testing.assert_array_equal(out.host.reshape(want.shape), kbit.matmul(x, host_w))
    with pytest.raises(kbit.KbitError, match="x is on the host but the weight is on the"):
        kbit.matmul(x, dev_w)
    with pytest.raises(kbit.KbitError, match="x is on the device but the weight is on the"):
        kbit.matmul(FakeArray(x), host_w)
    with pytest.raises(kbit.KbitError, match="x is on the device but bias is not"):
        kbit.matmul(FakeArray(x), dev_w, bias)
    with pytest.raises(kbit.KbitError, match="bias must have x's dtype"):
        kbit.matmul(FakeArray(x), dev_w, FakeArray(bias.astype(np.float32)))


def test_load_names_a_device_place(monkeypatch, tmp_path, rng):
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    place = _arrays.named_place("cuda:0")
    assert place.on_device and place.framework == "cupy" and place.stream == STREAM
    assert not _arrays.named_place("cpu").on_device
    with pytest.raises(kbit.KbitError, match="device must be"):
        _arrays.named_place("tpu")
