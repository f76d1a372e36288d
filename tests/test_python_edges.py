"""The Python API's CPU paths at their edges: empty, one-element and odd-sized tensors,
any shape and memory layout (strided, reversed, misaligned, big-endian), read-only or
misplaced outputs, tampered quantized containers and non-integer arguments. Every bad
input raises KbitError and writes nothing; every good one gives the reference's bytes."""
import dataclasses
import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import kbit
from kbit import _lib, bnb4
from kbit import gguf as kg
from kbit import reference as R
from kbit.reference import gguf as rg
from kbit.reference import nf4 as ref4

KS = (2, 3, 4, 5)
FORMATS = ("fp32", "fp16", "e4m4")
DTYPES = ("float32", "float16", "bfloat16")
QTYPES = ("nf4", "fp4")
EDGE_SIZES = (0, 1, 2, 31, 33, 65)


def make_input(rng, shape, dtype):
    """float32/float16 values or bfloat16 bits (uint16) of the given shape."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        return R.kbit.float32_to_bf16_bits(x).reshape(shape)
    return x.astype(dtype)


def dtype_arg(dtype):
    """The dtype= argument a host call needs (only bfloat16 bits need one)."""
    return "bfloat16" if dtype == "bfloat16" else None


def misaligned(a):
    """A copy of a at an address one byte off its natural alignment."""
    a = np.ascontiguousarray(a)
    buf = np.zeros(a.nbytes + 1, dtype=np.uint8)
    view = buf[1:].view(a.dtype).reshape(a.shape)
    view[...] = a
    assert not view.flags.aligned or a.itemsize == 1
    return view


def readonly(size, dtype):
    """A read-only numpy array over an immutable bytes object (poisoned)."""
    arr = np.frombuffer(b"\x5a" * (size * np.dtype(dtype).itemsize), dtype=dtype)
    assert not arr.flags.writeable
    return arr


def q8_0_blocks(rng, n_blocks):
    """Random Q8_0 blocks (34 bytes: an fp16 scale, 32 int8 values) with finite scales."""
    raw = rng.integers(0, 256, size=(n_blocks, 34), dtype=np.uint8)
    raw[:, :2] = np.array([0.5], np.float16).view(np.uint8)
    return raw


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and np.array_equal(a.reshape(-1).view(np.uint8),
                                                 b.reshape(-1).view(np.uint8))


# ---------------------------------------------------------------------------------
# Good edge inputs: the reference's bytes, the shape restored
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k,fmt,dtype", list(itertools.product(KS, FORMATS, DTYPES)))
def test_kbit_edge_sizes_match_reference(rng, k, fmt, dtype):
    for n in EDGE_SIZES:
        x = make_input(rng, n, dtype)
        q = kbit.quantize(x, k=k, absmax=fmt, dtype=dtype_arg(dtype))
        rp, ra = R.quantize_kbit(x, k, absmax_format=fmt, tensor_scale=q.tensor_scale)
        assert np.array_equal(q.packed, rp) and same_bits(q.absmax, ra), n
        y = kbit.dequantize(q)
        want = R.dequantize_kbit(rp, ra, k, n, absmax_format=fmt, dtype=dtype,
                                 tensor_scale=q.tensor_scale)
        assert y.shape == (n,) and same_bits(y, want), n


@pytest.mark.parametrize("qt", QTYPES)
def test_nf4_edge_sizes_match_reference(rng, qt):
    for n, dtype in itertools.product(EDGE_SIZES, DTYPES):
        x = make_input(rng, n, dtype)
        q = kbit.quantize_4bit(x, qt, 32, dtype=dtype_arg(dtype))
        rp, ra = ref4.quantize_4bit(x, qt, 32)
        assert np.array_equal(q.packed, rp) and same_bits(q.absmax, ra), (n, dtype)
        y = kbit.dequantize_4bit(q)
        assert same_bits(y, ref4.dequantize_4bit(rp, ra, n, qt, 32, dtype)), (n, dtype)


@pytest.mark.parametrize("shape", [(), (1,), (3, 0), (5, 7), (2, 3, 11), (1, 1, 33, 1)])
def test_shape_is_restored(rng, shape):
    x = make_input(rng, shape, "float32")
    assert kbit.dequantize(kbit.quantize(x, k=3)).shape == shape
    assert kbit.dequantize_4bit(kbit.quantize_nf4(x)).shape == shape
    assert kbit.dequantize_4bit(kbit.quantize_fp4(x, compress_statistics=True)).shape == shape


@pytest.mark.parametrize("layout", ["transposed", "reversed", "strided", "misaligned"])
def test_input_layouts_give_the_bytes_of_a_contiguous_copy(rng, layout):
    base = make_input(rng, (6, 35), "float32")
    x = {"transposed": base.T, "reversed": base[::-1, ::-1], "strided": base[:, ::3],
         "misaligned": misaligned(base)}[layout]
    c = np.ascontiguousarray(x)
    for absmax in FORMATS:
        q, qc = kbit.quantize(x, k=4, absmax=absmax), kbit.quantize(c, k=4, absmax=absmax)
        assert np.array_equal(q.packed, qc.packed) and same_bits(q.absmax, qc.absmax)
        assert q.shape == x.shape and same_bits(kbit.dequantize(q), kbit.dequantize(qc))
    q, qc = kbit.quantize_nf4(x, 64), kbit.quantize_nf4(c, 64)
    assert np.array_equal(q.packed, qc.packed) and same_bits(q.absmax, qc.absmax)
    assert q.shape == x.shape


@pytest.mark.parametrize("dtype", DTYPES)
def test_big_endian_input_gives_the_native_bytes(rng, dtype):
    x = make_input(rng, 200, dtype)
    big = x.astype(x.dtype.newbyteorder(">"))
    assert np.array_equal(big, x) and not big.dtype.isnative
    q = kbit.quantize(big, k=3, dtype=dtype_arg(dtype))
    qn = kbit.quantize(x, k=3, dtype=dtype_arg(dtype))
    assert q.dtype == dtype and q.tensor_scale == qn.tensor_scale
    assert np.array_equal(q.packed, qn.packed) and np.array_equal(q.absmax, qn.absmax)
    q4, q4n = (kbit.quantize_fp4(a, 64, dtype=dtype_arg(dtype)) for a in (big, x))
    assert np.array_equal(q4.packed, q4n.packed) and np.array_equal(q4.absmax, q4n.absmax)


def test_misaligned_quantized_fields_and_codebook(rng):
    x = make_input(rng, 300, "float32")
    cb = np.sort(rng.uniform(-1, 1, 8)).astype(np.float32)
    q = kbit.quantize(x, k=3, absmax="fp32", codebook=cb)
    assert np.array_equal(kbit.quantize(x, k=3, absmax="fp32", codebook=misaligned(cb)).packed,
                          q.packed)
    moved = dataclasses.replace(q, packed=misaligned(q.packed), absmax=misaligned(q.absmax))
    assert same_bits(kbit.dequantize(moved), kbit.dequantize(q))
    q4 = kbit.quantize_nf4(x, compress_statistics=True)
    moved4 = dataclasses.replace(q4, absmax2=misaligned(q4.absmax2),
                                 offset=misaligned(q4.offset))
    assert same_bits(kbit.dequantize_4bit(moved4), kbit.dequantize_4bit(q4))
    q4 = kbit.quantize_nf4(x)
    moved4 = dataclasses.replace(q4, absmax=misaligned(q4.absmax))
    assert same_bits(kbit.dequantize_4bit(moved4), kbit.dequantize_4bit(q4))


def test_big_endian_quantized_fields(rng):
    """Fields read back from a big-endian file hold the same values."""
    x = make_input(rng, 300, "float32")
    for fmt in FORMATS:
        q = kbit.quantize(x, k=5, absmax=fmt)
        big = dataclasses.replace(q, packed=q.packed.astype(">u4"),
                                  absmax=q.absmax.astype(q.absmax.dtype.newbyteorder(">")))
        assert same_bits(kbit.dequantize(big), kbit.dequantize(q)), fmt
    q4 = kbit.quantize_nf4(x, compress_statistics=True)
    big4 = dataclasses.replace(q4, absmax2=q4.absmax2.astype(">f4"),
                               offset=q4.offset.astype(">f4"),
                               code=bnb4.dynamic_map().astype(">f4"))
    assert same_bits(kbit.dequantize_4bit(big4), kbit.dequantize_4bit(q4))
    q4 = kbit.quantize_nf4(x)
    big4 = dataclasses.replace(q4, absmax=q4.absmax.astype(">f4"))
    assert same_bits(kbit.dequantize_4bit(big4), kbit.dequantize_4bit(q4))


def test_torch_int32_storage_of_packed_words(rng):
    """PyTorch before 2.3 holds uint32 words as int32: the same bits are accepted."""
    x = make_input(rng, 100, "float16")
    q = kbit.quantize(x, k=4)
    as_int32 = dataclasses.replace(q, packed=q.packed.view(np.int32))
    assert same_bits(kbit.dequantize(as_int32), kbit.dequantize(q))


# ---------------------------------------------------------------------------------
# Outputs: checked before anything is written
# ---------------------------------------------------------------------------------

def test_readonly_out_is_refused_and_untouched(rng):
    x = make_input(rng, 100, "float32")
    cases = [
        (lambda out: kbit.dequantize(kbit.quantize(x), out=out), 100),
        (lambda out: kbit.dequantize_4bit(kbit.quantize_nf4(x), out=out), 100),
    ]
    raw = q8_0_blocks(rng, 2)
    cases.append((lambda out: kg.dequantize(raw, "Q8_0", 64, out=out), 64))
    for run, n in cases:
        out = readonly(n, np.float32)
        with pytest.raises(kbit.KbitError, match="writeable"):
            run(out)
        assert np.all(out.view(np.uint8) == 0x5A)


@pytest.mark.parametrize("bad", ["size", "dtype", "strided", "reversed", "big-endian",
                                 "misaligned", "list"])
def test_bad_out_is_refused(rng, bad):
    x = make_input(rng, (4, 25), "float32")
    q = kbit.quantize(x)
    out = {"size": np.empty(99, np.float32), "dtype": np.empty(100, np.float16),
           "strided": np.empty(200, np.float32)[::2], "reversed": np.empty(100, np.float32)[::-1],
           "big-endian": np.empty(100, ">f4"), "misaligned": misaligned(np.zeros(100, np.float32)),
           "list": [0.0] * 100}[bad]
    with pytest.raises(kbit.KbitError, match="out"):
        kbit.dequantize(q, out=out)
    with pytest.raises(kbit.KbitError, match="out"):
        kbit.dequantize_4bit(kbit.quantize_nf4(x), out=out)


def test_out_of_any_shape_with_the_right_size(rng):
    x = make_input(rng, (4, 25), "float32")
    q = kbit.quantize(x)
    out = np.full((10, 10), np.nan, np.float32)
    assert kbit.dequantize(q, out=out) is out
    assert np.array_equal(out.reshape(x.shape), kbit.dequantize(q))


# ---------------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [4.0, 3.5, "4", None, True, 1, 6])
def test_bad_k_is_a_kbit_error(k):
    x = np.ones(64, dtype=np.float32)
    with pytest.raises(kbit.KbitError, match="k must be"):
        kbit.quantize(x, k=k)
    q = kbit.quantize(x, k=4)
    with pytest.raises(kbit.KbitError, match="k must be"):
        kbit.dequantize(dataclasses.replace(q, k=k))


def test_numpy_integer_k_and_blocksize_are_accepted(rng):
    x = make_input(rng, 100, "float32")
    assert np.array_equal(kbit.quantize(x, k=np.int64(3)).packed, kbit.quantize(x, k=3).packed)
    assert np.array_equal(kbit.quantize_nf4(x, np.int32(128)).absmax,
                          kbit.quantize_nf4(x, 128).absmax)


@pytest.mark.parametrize("blocksize", [64.0, 48, 0, -64, 8192, "64", None])
def test_bad_blocksize_is_a_kbit_error(blocksize):
    x = np.ones(100, dtype=np.float32)
    with pytest.raises(kbit.KbitError, match="blocksize"):
        kbit.quantize_nf4(x, blocksize)
    q = kbit.quantize_nf4(x)
    with pytest.raises(kbit.KbitError, match="blocksize"):
        kbit.dequantize_4bit(dataclasses.replace(q, blocksize=blocksize))


@pytest.mark.parametrize("absmax", ["E4M4", "fp8", None, 2, ["e4m4"]])
def test_bad_absmax_format_is_a_kbit_error(absmax):
    x = np.ones(64, dtype=np.float32)
    with pytest.raises(kbit.KbitError, match="absmax"):
        kbit.quantize(x, absmax=absmax)
    with pytest.raises(kbit.KbitError, match="absmax"):
        kbit.dequantize(dataclasses.replace(kbit.quantize(x), absmax_format=absmax))


@pytest.mark.parametrize("ts", [0.0, -0.0, -1.0, float("nan"), float("inf"), -float("inf"),
                                1e39])
@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_tensor_scale_is_a_kbit_error(ts, fmt):
    x = np.ones(64, dtype=np.float32)
    with pytest.raises(kbit.KbitError, match="tensor_scale"):
        kbit.quantize(x, absmax=fmt, tensor_scale=ts)
    q = kbit.quantize(x, absmax=fmt)
    with pytest.raises(kbit.KbitError, match="tensor_scale"):
        kbit.dequantize(dataclasses.replace(q, tensor_scale=ts))


@pytest.mark.parametrize("codebook,match", [
    (np.zeros(7, np.float32), "entries"), (np.zeros(9, np.float32), "entries"),
    (np.r_[np.zeros(7), np.nan], "finite"), (np.r_[np.zeros(7), np.inf], "finite"),
    (np.full(8, 1e300), "finite"), (np.float32(0.5), "entries")])
def test_bad_codebook_is_a_kbit_error(codebook, match):
    x = np.ones(64, dtype=np.float32)
    with np.errstate(over="ignore"):
        with pytest.raises(kbit.KbitError, match=match):
            kbit.quantize(x, k=3, codebook=codebook)
        q = kbit.quantize(x, k=3)
        with pytest.raises(kbit.KbitError, match=match):
            kbit.dequantize(dataclasses.replace(q, codebook=codebook))


def test_two_dimensional_codebook_is_taken_flat(rng):
    x = make_input(rng, 100, "float32")
    cb = np.sort(rng.uniform(-1, 1, 16)).astype(np.float32)
    assert np.array_equal(kbit.quantize(x, k=4, codebook=cb.reshape(4, 4)).packed,
                          kbit.quantize(x, k=4, codebook=cb).packed)


@pytest.mark.parametrize("dtype", [object(), None, "bogus", int, "int8", np.float64])
def test_bad_dtype_argument_is_a_kbit_error(dtype):
    x = np.ones(64, dtype=np.float32)
    q = kbit.quantize(x)
    if dtype is not None:  # None means "the input's dtype" here
        with pytest.raises(kbit.KbitError, match="dtype"):
            kbit.quantize(x, dtype=dtype)
        with pytest.raises(kbit.KbitError, match="dtype"):
            kbit.dequantize(q, dtype=dtype)
    with pytest.raises(kbit.KbitError, match="dtype"):
        kg.dequantize(np.zeros(34, np.uint8), "Q8_0", 32, dtype)


@pytest.mark.parametrize("x", [np.ones(8, np.float64), np.ones(8, np.int32),
                               np.ones(8, bool), np.ones(8, np.complex64),
                               np.array([1.0] * 8, dtype=object), [1.0, 2.0], 1.5,
                               np.ones(8, np.uint16)])
def test_unsupported_input_dtype_is_a_kbit_error(x):
    with pytest.raises(kbit.KbitError, match="dtype"):
        kbit.quantize(x)
    with pytest.raises(kbit.KbitError, match="dtype"):
        kbit.quantize_nf4(x)


def test_bfloat16_needs_uint16_bits():
    with pytest.raises(kbit.KbitError, match="uint16"):
        kbit.quantize(np.ones(8, np.float32), dtype="bfloat16")
    with pytest.raises(kbit.KbitError, match="uint16"):
        kbit.quantize_nf4(np.ones(8, np.float32), dtype="bfloat16")


# ---------------------------------------------------------------------------------
# Tampered containers: refused, never read as something else
# ---------------------------------------------------------------------------------

def test_kbit_fields_of_the_wrong_kind_are_refused(rng):
    x = make_input(rng, 100, "float32")
    q = kbit.quantize(x, k=3)  # E4M4: uint8 codes
    # the codes would be read as fp16 / fp32 scale values
    for fmt in ("fp16", "fp32"):
        with pytest.raises(kbit.KbitError, match="absmax"):
            kbit.dequantize(dataclasses.replace(q, absmax_format=fmt))
    # scale values would be truncated into E4M4 codes
    q32 = kbit.quantize(x, k=3, absmax="fp32")
    with pytest.raises(kbit.KbitError, match="absmax"):
        kbit.dequantize(dataclasses.replace(q32, absmax_format="e4m4"))
    with pytest.raises(kbit.KbitError, match="packed"):
        kbit.dequantize(dataclasses.replace(q, packed=q.packed.astype(np.float64)))
    for bad in (None, "abc"):
        with pytest.raises(kbit.KbitError):
            kbit.dequantize(dataclasses.replace(q, packed=bad))
        with pytest.raises(kbit.KbitError):
            kbit.dequantize(dataclasses.replace(q, absmax=bad))


@pytest.mark.parametrize("change", ["packed short", "packed long", "absmax short",
                                    "absmax long", "k", "shape"])
def test_kbit_fields_of_the_wrong_size_are_refused(rng, change):
    x = make_input(rng, (10, 10), "float32")
    q = kbit.quantize(x, k=3)
    bad = {"packed short": dict(packed=q.packed[:-1]),
           "packed long": dict(packed=np.r_[q.packed, np.uint32(0)]),
           "absmax short": dict(absmax=q.absmax[:-1]),
           "absmax long": dict(absmax=np.r_[q.absmax, np.uint8(0)]),
           "k": dict(k=4), "shape": dict(shape=(10, 9))}[change]
    with pytest.raises(kbit.KbitError, match="packed|absmax"):
        kbit.dequantize(dataclasses.replace(q, **bad))


@pytest.mark.parametrize("change", ["blocksize", "shape", "absmax long", "absmax short",
                                    "packed short"])
def test_nf4_state_of_the_wrong_size_is_refused(rng, change):
    x = make_input(rng, 1000, "float32")
    q = kbit.quantize_nf4(x, 64)
    bad = {"blocksize": dict(blocksize=128), "shape": dict(shape=(2000,)),
           "absmax long": dict(absmax=np.r_[q.absmax, np.float32(1)]),
           "absmax short": dict(absmax=q.absmax[:-1]),
           "packed short": dict(packed=q.packed[:-1])}[change]
    with pytest.raises(kbit.KbitError, match="bytes"):
        kbit.dequantize_4bit(dataclasses.replace(q, **bad))


def test_nf4_nested_state_must_be_complete(rng):
    x = make_input(rng, 1000, "float32")
    plain = kbit.quantize_nf4(x, 64)
    q = kbit.quantize_nf4(x, 64, compress_statistics=True)
    cases = {"absmax": dict(absmax=plain.absmax),  # the float scales, not the codes
             "absmax2": dict(absmax2=np.r_[q.absmax2, np.float32(1)]),
             "offset": dict(offset=None),
             "code": dict(code=np.r_[bnb4.dynamic_map(), np.float32(0)])}
    for name, change in cases.items():
        with pytest.raises(kbit.KbitError, match=name):
            kbit.dequantize_4bit(dataclasses.replace(q, **change))
    # a 0-d offset (bitsandbytes' own) and a Python float work
    for off in (np.float32(q.offset[0]), float(q.offset[0])):
        assert same_bits(kbit.dequantize_4bit(dataclasses.replace(q, offset=off)),
                         kbit.dequantize_4bit(q))


def test_from_bnb_nested_state_without_state2():
    q = kbit.quantize_nf4(np.ones(100, np.float32), compress_statistics=True)
    state = SimpleNamespace(absmax=q.absmax, shape=(100,), dtype="float32", blocksize=64,
                            quant_type="nf4", nested=True, offset=q.offset, state2=None)
    with pytest.raises(kbit.KbitError, match="state2"):
        bnb4.Quantized4bit.from_bnb(q.packed, state)


# ---------------------------------------------------------------------------------
# GGUF arguments
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [32.5, 31.9, "32", None, 2 ** 70])
def test_gguf_non_integer_n_is_refused(n):
    raw = np.zeros(34, np.uint8)  # one Q8_0 block
    with pytest.raises(kbit.KbitError):
        kg.dequantize(raw, "Q8_0", n)


@pytest.mark.parametrize("ggml_type", [8.5, 8.0, 2 ** 32 + 8, -1, None, "F32"])
def test_gguf_bad_type_is_refused(ggml_type):
    raw = np.zeros(34, np.uint8)
    with pytest.raises(kbit.KbitError, match="type"):
        kg.dequantize(raw, ggml_type, 32)
    with pytest.raises(kbit.KbitError, match="type"):
        kg.block_info(ggml_type)


def test_gguf_integer_like_arguments(rng):
    from gguf import GGMLQuantizationType as GT
    raw = q8_0_blocks(rng, 3)
    want = kg.dequantize(raw, "Q8_0", 96)
    assert same_bits(want, rg.dequantize_gguf(raw, "Q8_0"))
    for t, n in [(GT.Q8_0, 96), (np.int32(8), np.int64(96)), (8, 96)]:
        assert same_bits(kg.dequantize(raw, t, n), want)
    assert kg.dequantize(np.zeros(0, np.uint8), "Q8_0", 0).shape == (0,)


def test_sizes_come_from_the_library(rng, monkeypatch):
    """Allocations, checks and nbytes use the library's size helpers (kbit.reference
    alone keeps its own formulas): a helper that answers one more is obeyed."""
    called = []
    real = _lib.function

    def spy(name):
        called.append(name)
        if name in ("kbit_packed_words", "kbit_nf4_packed_bytes"):
            return lambda *args: real(name)(*args) + 1
        return real(name)

    x = rng.standard_normal(1000).astype(np.float32)
    want_k, want_4 = kbit.quantize(x, k=3, absmax="fp16"), kbit.quantize_nf4(x, 128, True)
    nbytes_k, nbytes_4 = want_k.nbytes, want_4.nbytes
    y_k, y_4 = kbit.dequantize(want_k), kbit.dequantize_nf4(want_4)
    monkeypatch.setattr(_lib, "function", spy)
    q = kbit.quantize(x, k=3, absmax="fp16")
    assert q.packed.size == want_k.packed.size + 1 and q.nbytes == nbytes_k + 4
    np.testing.assert_array_equal(q.packed[:-1], want_k.packed)
    np.testing.assert_array_equal(kbit.dequantize(q), y_k)
    assert {"kbit_packed_words", "kbit_absmax_bytes"} <= set(called)
    called.clear()
    q4 = kbit.quantize_nf4(x, 128, compress_statistics=True)
    assert q4.packed.size == want_4.packed.size + 1 and q4.nbytes == nbytes_4 + 1
    np.testing.assert_array_equal(kbit.dequantize_nf4(q4), y_4)
    assert {"kbit_nf4_packed_bytes", "kbit_nf4_absmax_count",
            "kbit_nf4_absmax2_count"} <= set(called)
    called.clear()
    raw = np.zeros(2 * 34, np.uint8)  # two Q8_0 blocks
    kg.dequantize(raw, "Q8_0", 64)
    assert kg.GGUFTensor(raw, 8, (2, 32)).nbytes == 68
    assert "kbit_gguf_block_info" in called


@pytest.mark.parametrize("shape", [(2**62 + 1, 4), (-1, -4), (2**64 + 4,), (2.0, 32), None,
                                   (2, "a")])
def test_tampered_shapes_are_kbit_errors(shape):
    """A container whose shape is not non-negative integers, or whose product passes 2^62,
    is refused with KbitError (np.prod had wrapped around and dequantized 4 elements)."""
    q = kbit.quantize(np.ones((2, 32), np.float32), k=4)
    b = kbit.quantize_nf4(np.ones((2, 64), np.float32))
    for container, call in ((q, kbit.dequantize), (b, kbit.dequantize_nf4)):
        container.shape = shape
        with pytest.raises(kbit.KbitError):
            call(container)


@pytest.mark.parametrize("field", ["packed", "absmax"])
def test_missing_fields_are_kbit_errors(field):
    q = kbit.quantize(np.ones((2, 32), np.float32), k=4)
    b = kbit.quantize_nf4(np.ones((2, 64), np.float32))
    for container, call in ((q, kbit.dequantize), (b, kbit.dequantize_nf4)):
        setattr(container, field, None)
        with pytest.raises(kbit.KbitError):
            call(container)
