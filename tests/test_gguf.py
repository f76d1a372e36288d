"""GGUF (ggml) blocks: the numpy reference against the gguf package, the library (CPU
and GPU) against the reference, argument checks, and whole GGUF files."""
import ctypes
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as _gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import kbit
from kbit import gguf as kg
from kbit._lib import KbitError, lib
from kbit.reference import gguf as rg
from kbit.reference.kbit import float32_to_bf16_bits

from conftest import requires_gpu

TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
TYPE_ID = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
SYMBOL = {"Q4_0": "q4_0", "Q8_0": "q8_0", "Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K"}
DTYPES = ["float32", "float16", "bfloat16"]
CNAME = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
DTYPE_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
NP_OUT = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# byte offsets of each format's fp16 fields
HALF_FIELDS = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
POISON = 0xA5

S_OK, S_INVALID, S_NULL, S_MISALIGNED, S_NOT_SUPPORTED = 0, 1, 2, 3, 5


def gguf_dequantize(raw, qtype):
    with np.errstate(invalid="ignore", over="ignore"):  # NaN / inf scales
        return _gguf_dequantize(raw, qtype)


def random_blocks(rng, qtype, n_blocks, finite=True):
    """Random block bytes; with finite=True every fp16 scale is a finite value spread
    over many magnitudes (zeros and subnormals included), else anything (NaN, inf)."""
    _, nbytes = rg.GGML_BLOCK_INFO[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    if finite:
        for off in HALF_FIELDS[qtype]:
            mag = 10.0 ** rng.uniform(-8, 3, size=n_blocks)
            vals = (rng.standard_normal(n_blocks) * mag).astype(np.float16)
            vals[rng.random(n_blocks) < 0.05] = 0
            raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


def expected(ref32, dtype):
    """The reference float32 values rounded to the output type (nearest even)."""
    if dtype == "float32":
        return ref32
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return ref32.astype(np.float16)
    return float32_to_bf16_bits(ref32)


def assert_same(got, want, dtype):
    """Equal bit for bit, except that any NaN matches any NaN."""
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    assert got.shape == want.shape
    if dtype == "bfloat16":
        gnan = (got & 0x7FFF) > 0x7F80
        wnan = (want & 0x7FFF) > 0x7F80
        gbits, wbits = got, want
    else:
        gnan, wnan = np.isnan(got), np.isnan(want)
        ut = np.uint32 if dtype == "float32" else np.uint16
        gbits, wbits = got.view(ut), want.view(ut)
    np.testing.assert_array_equal(gnan, wnan)
    mism = np.flatnonzero((gbits != wbits) & ~wnan)
    assert mism.size == 0, (f"{mism.size} mismatches, first at {mism[0]}: "
                            f"got {got[mism[0]]!r} want {want[mism[0]]!r}")


def ptr(a):
    return a.ctypes.data if isinstance(a, np.ndarray) else a


def c_fn(name, argtypes):
    fn = getattr(lib(), name)
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


VP, I64 = ctypes.c_void_p, ctypes.c_int64


def host_fn(qtype, dtype):
    return c_fn(f"cdequantize_{SYMBOL[qtype]}_{CNAME[dtype]}_host", [VP, I64, VP])


def gpu_fn(qtype, dtype):
    return c_fn(f"cdequantize_{SYMBOL[qtype]}_{CNAME[dtype]}", [VP, I64, VP, VP])


GENERIC_HOST = ("kbit_gguf_dequantize_host", [ctypes.c_int, VP, I64, ctypes.c_int, VP])
GENERIC_GPU = ("kbit_gguf_dequantize", [ctypes.c_int, VP, I64, ctypes.c_int, VP, VP])


def built_with_cuda():
    # n = 0 is a no-op in a CUDA build, NOT_SUPPORTED in a CPU-only one
    return gpu_fn("Q4_0", "float16")(None, 0, None, None) == S_OK


# ---- the reference against the gguf package --------------------------------------

@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("finite", [True, False])
def test_reference_matches_gguf_package(rng, qtype, finite):
    raw = random_blocks(rng, qtype, int(rng.integers(1, 300)), finite)
    want = gguf_dequantize(raw, GT[qtype]).reshape(-1)
    got = rg.dequantize_gguf(raw, qtype)
    assert got.dtype == np.float32
    assert_same(got, want, "float32")


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_reference_matches_gguf_quantize(rng, qtype):
    x = (rng.standard_normal((13, 96)) * rng.uniform(0.01, 10)).astype(np.float32)
    q = gguf_quantize(x, GT[qtype])
    got = rg.dequantize_gguf(q, qtype)
    assert_same(got, gguf_dequantize(q, GT[qtype]).reshape(-1), "float32")
    # and it is a real quantization of x
    tol = np.abs(x).max(axis=1, keepdims=True) / (7 if qtype == "Q4_0" else 100)
    assert np.all(np.abs(got.reshape(x.shape) - x) <= tol)


def test_reference_rejects_partial_blocks():
    with pytest.raises(ValueError):
        rg.dequantize_gguf(np.zeros(17, np.uint8), "Q4_0")
    with pytest.raises(ValueError):
        rg.dequantize_gguf(np.zeros(18, np.uint8), "Q2_K")


# ---- the CPU implementation ------------------------------------------------------

@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_blocks", [1, 3, 37, 2 ** 10 + 7])
def test_host_matches_reference(rng, qtype, dtype, n_blocks):
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    finite = bool(rng.integers(0, 2))
    raw = random_blocks(rng, qtype, n_blocks, finite)
    want = expected(rg.dequantize_gguf(raw, qtype), dtype)
    n = n_blocks * elems
    # the per-type symbol, the generic entry and the Python wrapper
    out = np.full(n + 16, 0, NP_OUT[dtype])
    out.view(np.uint8)[:] = POISON
    assert host_fn(qtype, dtype)(raw.ctypes.data, n, out.ctypes.data) == S_OK
    assert_same(out[:n], want, dtype)
    assert np.all(out[n:].view(np.uint8) == POISON), "wrote past n"
    out2 = np.full(n, 0, NP_OUT[dtype])
    out2.view(np.uint8)[:] = POISON
    assert c_fn(*GENERIC_HOST)(TYPE_ID[qtype], raw.ctypes.data, n, DTYPE_ID[dtype],
                               out2.ctypes.data) == S_OK
    assert np.array_equal(out2.view(np.uint8), out[:n].view(np.uint8))
    got = kg.dequantize(raw, qtype, n, dtype)
    assert got.dtype == NP_OUT[dtype] and got.shape == (n,)
    assert np.array_equal(got.view(np.uint8), out[:n].view(np.uint8))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_matches_gguf_quantize(rng, qtype, dtype):
    rows, cols = int(rng.integers(1, 40)), 32 * int(rng.integers(1, 9))
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    q = gguf_quantize(x, GT[qtype])
    want = expected(gguf_dequantize(q, GT[qtype]).reshape(-1), dtype)
    assert_same(kg.dequantize(q, qtype, x.size, dtype), want, dtype)


def test_host_large_is_threaded_and_exact(rng):
    # large enough to be split over threads; block boundaries between threads must match
    n_blocks = (1 << 23) // 256 + 13
    raw = random_blocks(rng, "Q6_K", n_blocks)
    got = kg.dequantize(raw, "Q6_K", n_blocks * 256, "float32")
    assert_same(got, rg.dequantize_gguf(raw, "Q6_K"), "float32")


def test_host_unaligned_blocks(rng):
    # blocks need only 2-byte alignment (GGUF blocks of 18/34/210 bytes)
    raw = random_blocks(rng, "Q6_K", 9)
    buf = np.zeros(raw.size + 16, np.uint8)
    base = (-buf.ctypes.data) % 16 + 2
    buf[base:base + raw.size] = raw.reshape(-1)
    view = buf[base:base + raw.size]
    assert view.ctypes.data % 4 == 2
    assert_same(kg.dequantize(view, "Q6_K", 9 * 256, "float16"),
                expected(rg.dequantize_gguf(raw, "Q6_K"), "float16"), "float16")


# ---- block info and argument checks ------------------------------------------------

def test_package_exports():
    import kbit.reference
    assert kbit.gguf is kg
    assert kbit.reference.dequantize_gguf is rg.dequantize_gguf
    assert set(kg.GGML_TYPES) == set(rg.GGML_BLOCK_INFO) == set(TYPES)


def test_block_info():
    fn = c_fn("kbit_gguf_block_info", [ctypes.c_int, ctypes.POINTER(I64), ctypes.POINTER(I64)])
    for qtype, tid in TYPE_ID.items():
        e, b = I64(-1), I64(-1)
        assert fn(tid, ctypes.byref(e), ctypes.byref(b)) == S_OK
        assert (e.value, b.value) == rg.GGML_BLOCK_INFO[qtype]
        assert (e.value, b.value) == gguf.GGML_QUANT_SIZES[GT[qtype]]
        assert kg.block_info(qtype) == (e.value, b.value) == kg.block_info(GT[qtype])
        assert fn(tid, None, None) == S_OK
    for bad in (-1, 0, 1, 3, 6, 7, 9, 10, 11, 15, 16, 30, 99, 1 << 30):
        e, b = I64(-7), I64(-7)
        assert fn(bad, ctypes.byref(e), ctypes.byref(b)) == S_INVALID
        assert (e.value, b.value) == (-7, -7)
        assert lib().kbit_last_error_message()
    with pytest.raises(KbitError):
        kg.block_info("Q2_K")
    with pytest.raises(KbitError):
        kg.block_info(GT.Q2_K)


def _bad_calls(qtype, dtype, raw, out, gpu):
    """(description, call, expected status) for every way to get the arguments wrong."""
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    n = raw.shape[0] * elems
    size = np.dtype(NP_OUT[dtype]).itemsize
    b, o = raw.ctypes.data, out.ctypes.data
    fn = gpu_fn(qtype, dtype) if gpu else host_fn(qtype, dtype)
    gen = c_fn(*(GENERIC_GPU if gpu else GENERIC_HOST))
    tid, did = TYPE_ID[qtype], DTYPE_ID[dtype]
    tail = (None,) if gpu else ()
    cases = [
        ("null blocks", lambda: fn(None, n, o, *tail), S_NULL),
        ("null output", lambda: fn(b, n, None, *tail), S_NULL),
        ("n < 0", lambda: fn(b, -elems, o, *tail), S_INVALID),
        ("n partial block", lambda: fn(b, n - 1, o, *tail), S_INVALID),
        ("n half block", lambda: fn(b, elems // 2, o, *tail), S_INVALID),
        ("odd blocks", lambda: fn(b + 1, n - elems, o, *tail), S_MISALIGNED),
        ("generic bad type", lambda: gen(3, b, n, did, o, *tail), S_INVALID),
        ("generic unknown type", lambda: gen(1234, b, n, did, o, *tail), S_INVALID),
        ("generic bad dtype", lambda: gen(tid, b, n, 3, o, *tail), S_INVALID),
        ("generic negative dtype", lambda: gen(tid, b, n, -1, o, *tail), S_INVALID),
        ("generic null", lambda: gen(tid, None, n, did, o, *tail), S_NULL),
        ("generic n < 0", lambda: gen(tid, b, -1, did, o, *tail), S_INVALID),
        ("generic odd blocks", lambda: gen(tid, b + 1, n - elems, did, o, *tail), S_MISALIGNED),
    ]
    cases.append(("misaligned output", lambda: fn(b, n - elems, o + 1, *tail), S_MISALIGNED))
    if size == 4:
        cases.append(("output off by 2", lambda: fn(b, n - elems, o + 2, *tail), S_MISALIGNED))
    return cases


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gpu", [False, True], ids=["host", "gpu-entry"])
def test_bad_arguments_write_nothing(rng, qtype, dtype, gpu):
    if gpu and not built_with_cuda():
        pytest.skip("libkbit built without CUDA (GPU entries return NOT_SUPPORTED)")
    # Checks come before any device work, so the GPU entries can be checked with host
    # pointers (never dereferenced) even on a machine without a GPU.
    raw = random_blocks(rng, qtype, 3)
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    out = np.zeros(3 * elems + 8, NP_OUT[dtype])
    out.view(np.uint8)[:] = POISON
    before = raw.copy()
    for what, call, status in _bad_calls(qtype, dtype, raw, out, gpu):
        got = call()
        assert got == status, f"{what}: status {got}, expected {status}"
        assert lib().kbit_last_error_message(), what
        assert np.all(out.view(np.uint8) == POISON), f"{what}: wrote output"
    assert np.array_equal(raw, before)
    # n = 0 is a no-op, null pointers allowed
    fn = gpu_fn(qtype, dtype) if gpu else host_fn(qtype, dtype)
    assert fn(None, 0, None, *((None,) if gpu else ())) == S_OK


def test_gpu_entries_without_cuda_build():
    if built_with_cuda():
        pytest.skip("libkbit built with CUDA")
    for qtype in TYPES:
        for dtype in DTYPES:
            assert gpu_fn(qtype, dtype)(None, 0, None, None) == S_NOT_SUPPORTED
            assert b"without CUDA" in lib().kbit_last_error_message()
    assert c_fn(*GENERIC_GPU)(2, None, 0, 1, None, None) == S_NOT_SUPPORTED


def test_python_dequantize_errors(rng):
    raw = random_blocks(rng, "Q4_K", 2)
    with pytest.raises(KbitError, match="bytes"):
        kg.dequantize(raw, "Q4_K", 256, "float16")           # too many bytes
    with pytest.raises(KbitError, match="multiple"):
        kg.dequantize(raw, "Q4_K", 300, "float16")
    with pytest.raises(KbitError, match="multiple"):
        kg.dequantize(raw, "Q4_K", -256, "float16")
    with pytest.raises(KbitError):
        kg.dequantize(raw, "Q4_K", 512, "int8")
    with pytest.raises(KbitError, match="unsupported"):
        kg.dequantize(raw, "IQ2_XXS", 512, "float16")
    with pytest.raises(KbitError):
        kg.dequantize(raw, 99, 512, "float16")
    with pytest.raises(KbitError, match="out"):
        kg.dequantize(raw, "Q4_K", 512, "float16", out=np.empty(512, np.float32))
    out = np.empty(512, np.float16)
    assert kg.dequantize(raw, "q4_k", 512, np.float16, out=out) is out
    assert_same(out, expected(rg.dequantize_gguf(raw, "Q4_K"), "float16"), "float16")


# ---- GGUF files ----------------------------------------------------------------------

def _quant_tensor(rng, qtype, shape):
    """(raw uint8 bytes with numpy-order byte shape, float32 values) for a tensor."""
    elems, nbytes = rg.GGML_BLOCK_INFO[qtype]
    if qtype in ("Q4_0", "Q8_0"):
        x = rng.standard_normal(shape).astype(np.float32)
        raw = gguf_quantize(x, GT[qtype])
    else:
        n_blocks = int(np.prod(shape)) // elems
        raw = random_blocks(rng, qtype, n_blocks).reshape(*shape[:-1], shape[-1] // elems * nbytes)
    return raw


def add_tensors(w, rng, specs, quant_bytes=_quant_tensor):
    """Adds {name: (ggml type name, numpy shape)} tensors of random values to GGUFWriter
    w; quantized ones take their bytes from quant_bytes(rng, type, shape)."""
    for name, (t, shape) in specs.items():
        if t == "F32":
            w.add_tensor(name, np.asarray(rng.standard_normal(shape), np.float32))
        elif t == "F16":
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float16))
        elif t == "BF16":
            bits = float32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32))
            w.add_tensor(name, bits.reshape(shape), raw_dtype=GT.BF16)
        else:
            w.add_tensor(name, quant_bytes(rng, t, shape), raw_dtype=GT[t])


def write_gguf(path, rng, extra=()):
    """A small model file with every supported type, odd shapes and pass-through floats.
    Returns {name: (ggml type name, numpy shape)}."""
    specs = {
        "blk.0.attn_q.weight": ("Q4_0", (3, 64)),
        "blk.0.attn_k.weight": ("Q8_0", (5, 32)),
        "blk.0.ffn_up.weight": ("Q4_K", (2, 512)),
        "blk.0.ffn_down.weight": ("Q5_K", (2, 3, 256)),
        "blk.0.attn_v.weight": ("Q6_K", (7, 256)),
        "tok.vec": ("Q8_0", (32,)),
        "blk.1.q6": ("Q6_K", (1, 1, 1, 256)),
        "norm.weight": ("F32", (7,)),
        "blk.0.f16": ("F16", (2, 3)),
        "blk.0.bf16": ("BF16", (3, 5)),
    }
    w = gguf.GGUFWriter(str(path), "kbit-test")
    w.add_uint32("kbit.test.value", 7)
    w.add_string("kbit.test.name", "gguf loader test")
    w.add_array("kbit.test.list", [1, 2, 3])
    add_tensors(w, rng, specs)
    for name, raw, t in extra:
        specs[name] = (t.name, None)
        w.add_tensor(name, raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return specs


def file_expected(path, dtype):
    """What load() must return, from the gguf package alone."""
    want = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        if t.tensor_type == GT.BF16:
            want[t.name] = (np.asarray(t.data).view(np.uint16).reshape(shape), "bfloat16")
        elif t.tensor_type in (GT.F32, GT.F16):
            want[t.name] = (np.asarray(t.data).reshape(shape), np.asarray(t.data).dtype.name)
        else:
            vals = gguf_dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
            want[t.name] = (expected(vals.reshape(-1), dtype).reshape(shape), dtype)
    return want


@pytest.mark.parametrize("dtype", DTYPES)
def test_load_file_cpu(rng, tmp_path, dtype):
    path = tmp_path / "model.gguf"
    specs = write_gguf(path, rng)
    got = kg.load(path, device="cpu", dtype=dtype)
    want = file_expected(path, dtype)
    assert list(got) == list(want) == list(specs)
    for name, (t, shape) in specs.items():
        w, wdtype = want[name]
        assert got[name].shape == shape == w.shape, name
        assert got[name].dtype == w.dtype, name
        assert_same(got[name], w, wdtype)


def test_load_progress_and_options(rng, tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, rng)
    a = kg.load(str(path), device="cpu", dtype="float32", progress=True)
    b = kg.load(path, device="cpu", dtype="float32", progress=False)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(KbitError, match="dtype"):
        kg.load(path, device="cpu", dtype="int8")
    with pytest.raises(KbitError, match="device"):
        kg.load(path, device="tpu")


def test_load_cuda_needs_a_framework(rng, tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    write_gguf(path, rng)
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(KbitError, match="PyTorch or CuPy"):
        kg.load(path, device="cuda")


def _tensor_type_offset(data: bytes, name: str) -> int:
    """Byte offset of the ggml type field in `name`'s tensor info."""
    key = len(name).to_bytes(8, "little") + name.encode()
    pos = data.index(key) + len(key)
    n_dims = int.from_bytes(data[pos:pos + 4], "little")
    return pos + 4 + 8 * n_dims


def test_load_unknown_type(rng, tmp_path):
    path = tmp_path / "bad.gguf"
    write_gguf(path, rng)
    data = bytearray(path.read_bytes())
    off = _tensor_type_offset(bytes(data), "blk.0.ffn_up.weight")
    assert int.from_bytes(data[off:off + 4], "little") == TYPE_ID["Q4_K"]
    data[off:off + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(KbitError, match=r"blk\.0\.ffn_up\.weight.*99") as e:
        kg.load(path, device="cpu")
    assert e.value.status == 8


def test_load_unsupported_type(rng, tmp_path):
    path = tmp_path / "q2k.gguf"
    raw = rng.integers(0, 256, size=(2, 84), dtype=np.uint8)  # Q2_K: 84 bytes per block
    write_gguf(path, rng, extra=[("blk.9.q2k", raw, GT.Q2_K)])
    with pytest.raises(KbitError, match=r"blk\.9\.q2k.*Q2_K"):
        kg.load(path, device="cpu")


def test_load_truncated_and_corrupt(rng, tmp_path):
    path = tmp_path / "good.gguf"
    specs = write_gguf(path, rng)
    data = path.read_bytes()
    last = list(specs)[-1]
    bad = tmp_path / "bad.gguf"
    # cut inside the tensor data, inside the tensor infos, inside the metadata
    header_end = data.index(last.encode()) + len(last)
    for cut, pattern in [(len(data) - 5, "truncated"), (header_end - 3, "truncated|corrupt"),
                         (40, "truncated|corrupt"), (10, "truncated|corrupt"),
                         (0, "truncated|corrupt|magic")]:
        bad.write_bytes(data[:cut])
        with pytest.raises(KbitError, match=pattern) as e:
            kg.load(bad, device="cpu")
        assert e.value.status == 8, cut
    # the truncated tensor is named
    bad.write_bytes(data[:len(data) - 5])
    with pytest.raises(KbitError, match=last.replace(".", r"\.")):
        kg.load(bad, device="cpu")
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(KbitError, match="magic"):
        kg.load(bad, device="cpu")
    bad.write_bytes(data[:4] + (1).to_bytes(4, "little") + data[8:])
    with pytest.raises(KbitError, match="version"):
        kg.load(bad, device="cpu")
    with pytest.raises(FileNotFoundError):
        kg.load(tmp_path / "missing.gguf", device="cpu")


def test_load_reads_no_float32_copy(rng, tmp_path, monkeypatch):
    # the loader must hand raw blocks to the library, never dequantize in numpy
    path = tmp_path / "m.gguf"
    write_gguf(path, rng)

    def forbidden(*a, **k):
        raise AssertionError("gguf.quants.dequantize called by the loader")

    monkeypatch.setattr(gguf.quants, "dequantize", forbidden)
    monkeypatch.setattr(rg, "dequantize_gguf", forbidden)
    kg.load(path, device="cpu", dtype="float16")


def test_load_without_dequantize_cpu(rng, tmp_path):
    """dequantize=False: quantized tensors come back as GGUFTensor holding the file's
    block bytes (a copy, not a view of the map); floats pass through as before."""
    path = tmp_path / "model.gguf"
    specs = write_gguf(path, rng)
    got = kg.load(path, device="cpu", dequantize=False)
    ref = kg.load(path, device="cpu", dtype="float32")
    stored = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert list(got) == list(specs)
    for name, (t, shape) in specs.items():
        g = got[name]
        if t in ("F32", "F16", "BF16"):
            assert isinstance(g, np.ndarray) and g.shape == shape
            assert_same(g, ref[name], {"F32": "float32", "F16": "float16"}.get(t, "bfloat16"))
            continue
        assert isinstance(g, kg.GGUFTensor) and isinstance(g, kbit.GGUFTensor)
        assert g.ggml_type == TYPE_ID[t] and g.type_name == t and g.shape == shape
        raw = np.asarray(stored[name].data).reshape(-1).view(np.uint8)
        assert g.blocks.dtype == np.uint8 and g.blocks.flags.owndata
        np.testing.assert_array_equal(g.blocks, raw)
        elems, nbytes = kg.block_info(t)
        assert g.nbytes == raw.nbytes == g.n // elems * nbytes and not g.on_device
        assert g.bits_per_element == nbytes * 8 / elems
        for dtype in DTYPES:
            y = kg.dequantize(g, dtype=dtype)
            assert y.shape == shape
            assert_same(y, kg.load(path, device="cpu", dtype=dtype)[name], dtype)
        assert_same(kg.dequantize(g, t, g.n), ref[name], "float32")  # the same type and n again
        out = np.empty(shape, np.float16)
        assert kg.dequantize(g, dtype="float16", out=out) is out


def test_gguf_tensor_checks():
    raw = np.zeros(3 * 34, np.uint8)  # three Q8_0 blocks
    t = kbit.GGUFTensor(raw, kg.GGML_TYPES["Q8_0"], (3, 32))
    assert kg.dequantize(t).shape == (3, 32)
    assert kg.dequantize(t, "Q8_0", 96, "float16").dtype == np.float16
    with pytest.raises(KbitError, match="disagree"):
        kg.dequantize(t, "Q4_0")
    with pytest.raises(KbitError, match="disagree"):
        kg.dequantize(t, n=64)
    with pytest.raises(KbitError, match="ggml_type and n"):
        kg.dequantize(raw)
    with pytest.raises(KbitError, match="bytes"):
        kg.dequantize(kbit.GGUFTensor(raw[:-1], 8, (3, 32)))
    with pytest.raises(KbitError, match="block size"):
        kg.dequantize(kbit.GGUFTensor(raw, 8, (3, 33)))
    with pytest.raises(KbitError, match="out"):
        kg.dequantize(t, out=np.empty(95, np.float32))


# ---- GPU -----------------------------------------------------------------------------

def _torch():
    import torch
    return torch


@requires_gpu
@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_host(rng, qtype, dtype):
    torch = _torch()
    elems, nbytes = rg.GGML_BLOCK_INFO[qtype]
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    fn = gpu_fn(qtype, dtype)
    for n_blocks in (1, 7, 33, 2 ** 12 + 7, 100003):
        raw = random_blocks(rng, qtype, n_blocks, finite=bool(rng.integers(0, 2)))
        n = n_blocks * elems
        host = kg.dequantize(raw, qtype, n, dtype)
        # block pointer 16-, 8-, 4- or 2-byte aligned; output aligned or not
        for b_off, o_off in ((0, 0), (2, 0), (4, 0), (8, 0), (0, 1), (6, 3)):
            dbuf = torch.zeros(raw.size + 16, dtype=torch.uint8, device="cuda")
            dbuf[b_off:b_off + raw.size] = torch.from_numpy(raw.reshape(-1)).cuda()
            out = torch.empty(n + 8, dtype=tdt, device="cuda")
            out.view(torch.uint8).fill_(POISON)
            st = fn(dbuf.data_ptr() + b_off, n, out.data_ptr() + o_off * out.element_size(),
                    None)
            assert st == S_OK, lib().kbit_last_error_message()
            torch.cuda.synchronize()
            res = out.view(torch.uint8).cpu().numpy()
            esz = out.element_size()
            assert np.all(res[:o_off * esz] == POISON) and np.all(res[(o_off + n) * esz:] == POISON)
            got = res[o_off * esz:(o_off + n) * esz]
            # bit for bit, NaNs included (both sides give canonical NaNs)
            mism = np.flatnonzero(got.view(NP_OUT[dtype]).view(f"u{esz}") !=
                                  host.view(f"u{esz}"))
            assert mism.size == 0, (f"{mism.size} mismatches, first at {mism[0]}: got "
                                    f"{got.view(NP_OUT[dtype])[mism[0]]!r} want {host[mism[0]]!r}")


@requires_gpu
@pytest.mark.parametrize("qtype", TYPES)
def test_gpu_python_wrapper_and_stream(rng, qtype):
    torch = _torch()
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    raw = random_blocks(rng, qtype, 513)
    n = 513 * elems
    host = kg.dequantize(raw, qtype, n, "bfloat16")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        dev = torch.from_numpy(raw).to("cuda", non_blocking=False)
        got = kg.dequantize(dev, qtype, n, "bfloat16")
        out = torch.empty(n, dtype=torch.float16, device="cuda")
        assert kg.dequantize(dev, qtype, n, "float16", out=out) is out
    s.synchronize()
    assert got.dtype == torch.bfloat16 and got.shape == (n,)
    assert_same(got.view(torch.int16).cpu().numpy().view(np.uint16), host, "bfloat16")
    assert_same(out.cpu().numpy(), kg.dequantize(raw, qtype, n, "float16"), "float16")
    with pytest.raises(KbitError, match="dtype|elements"):
        kg.dequantize(dev, qtype, n, "float16", out=torch.empty(n, device="cuda"))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_file_gpu(rng, tmp_path, dtype):
    torch = _torch()
    path = tmp_path / "model.gguf"
    specs = write_gguf(path, rng)
    got = kg.load(path, device="cuda", dtype=dtype)
    cpu = kg.load(path, device="cpu", dtype=dtype)
    want = file_expected(path, dtype)
    assert list(got) == list(specs)
    for name, (t, shape) in specs.items():
        g = got[name]
        assert g.is_cuda and tuple(g.shape) == shape, name
        w, wdtype = want[name]
        if g.dtype == torch.bfloat16:
            gn = g.view(torch.int16).cpu().numpy().view(np.uint16)
        else:
            gn = g.cpu().numpy()
        assert_same(gn, w, wdtype)
        assert_same(gn, cpu[name], wdtype)


@requires_gpu
def test_gpu_beyond_2g_elements(rng):
    # > 2^31 elements: 64-bit indexing all the way (1.2 GB of blocks, 4.3 GB of fp16)
    torch = _torch()
    free, _ = torch.cuda.mem_get_info()
    n = (1 << 31) + 32 * 1001
    n_blocks = n // 32
    if free < n * 2 + n_blocks * 18 + (1 << 30):
        pytest.skip("not enough GPU memory for a > 2^31 element test")
    tail = random_blocks(rng, "Q4_0", 4096)
    head = random_blocks(rng, "Q4_0", 64)
    blocks = torch.zeros(n_blocks * 18, dtype=torch.uint8, device="cuda")
    blocks[:head.size] = torch.from_numpy(head.reshape(-1)).cuda()
    blocks[-tail.size:] = torch.from_numpy(tail.reshape(-1)).cuda()
    out = torch.empty(n, dtype=torch.float16, device="cuda")
    out[-1] = 12345.0
    kg.dequantize(blocks, "Q4_0", n, "float16", out=out)
    torch.cuda.synchronize()
    assert_same(out[-4096 * 32:].cpu().numpy(), kg.dequantize(tail, "Q4_0", 4096 * 32, "float16"),
                "float16")
    assert_same(out[:64 * 32].cpu().numpy(), kg.dequantize(head, "Q4_0", 64 * 32, "float16"),
                "float16")
    del out, blocks
    torch.cuda.empty_cache()


@requires_gpu
def test_load_without_dequantize_gpu(rng, tmp_path):
    torch = _torch()
    path = tmp_path / "model.gguf"
    specs = write_gguf(path, rng)
    got = kg.load(path, device="cuda", dequantize=False)
    cpu = kg.load(path, device="cpu", dequantize=False)
    for name, (t, shape) in specs.items():
        if t in ("F32", "F16", "BF16"):
            assert got[name].is_cuda
            continue
        g = got[name]
        assert isinstance(g, kg.GGUFTensor) and g.on_device and g.blocks.is_cuda
        assert g.blocks.dtype == torch.uint8 and g.ggml_type == cpu[name].ggml_type
        assert g.shape == shape and g.nbytes == cpu[name].nbytes
        np.testing.assert_array_equal(g.blocks.cpu().numpy(), cpu[name].blocks)
        y = kg.dequantize(g, dtype="float16")
        assert y.is_cuda and tuple(y.shape) == shape
        assert_same(y.cpu().numpy(), kg.dequantize(cpu[name], dtype="float16"), "float16")
