"""Fused dequantize + matmul (SPEC section 6), every format, CPU and GPU.

Accuracy rule (the issue's): the relative Frobenius error of y against a float64
reference -- x as given, W dequantized by kbit.reference's numpy dequantizer of the
format, y_ref = x64 @ W64.T + bias -- is at most 3e-3 for fp16 x, 1e-2 for bf16 and 2e-5
for fp32, at k_in up to 28672. Outputs are poisoned with NaN before every call, so a
finite result shows every element was written. Bad arguments through ctypes return the
right status, leave a message and leave y untouched.
"""
import ctypes
import dataclasses
import types

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize as gguf_quantize

import kbit
from kbit import reference as R
from kbit._lib import KbitError, function, lib
from kbit.reference.kbit import bf16_bits_to_float32, float32_to_bf16_bits

from conftest import requires_gpu

DTYPES = ("float32", "float16", "bfloat16")
DT_ID = {"float32": 0, "float16": 1, "bfloat16": 2}
NP_DT = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 1e-2}
KS = (2, 3, 4, 5)
FORMATS = ("fp32", "fp16", "e4m4")
FMT_ID = {"fp32": 0, "fp16": 1, "e4m4": 2}
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
GGUF_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
GGML_ID = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
# (m, n_out): n_out never a multiple of a tile; m = 0..8 and a few larger
SHAPES = ((1, 1), (0, 7), (2, 33), (3, 131), (4, 7), (5, 1), (6, 33), (7, 7), (8, 131),
          (16, 33), (33, 7), (64, 1))
S_OK, S_INVALID, S_NULL, S_MISALIGNED = 0, 1, 2, 3
BIG_K_IN = 28672


# ---- data and reference ----------------------------------------------------------------

def as_dtype(x32, dtype):
    """float32 values as the library's element type (bfloat16: uint16 bits)."""
    if dtype == "bfloat16":
        return float32_to_bf16_bits(x32)
    return x32.astype(NP_DT[dtype])


def as_f64(a, dtype):
    a = np.asarray(a)
    if dtype == "bfloat16":
        return bf16_bits_to_float32(a).astype(np.float64)
    return a.astype(np.float64)


def random_x(rng, shape, dtype):
    return as_dtype(rng.standard_normal(shape).astype(np.float32), dtype)


def magnitude(x, w64, dtype):
    """||x| |W|^T|_F / sqrt(k_in): the size of y's terms before any cancellation."""
    x64 = np.abs(as_f64(x, dtype)).reshape(-1, w64.shape[1])
    return float(np.linalg.norm(x64 @ np.abs(w64).T) / np.sqrt(max(w64.shape[1], 1)))


def reference(x, w64, bias, dtype):
    """y_ref = x64 @ W64.T + bias in float64, x and bias as given."""
    x64 = as_f64(x, dtype)
    y = x64.reshape(-1, w64.shape[1]) @ w64.T
    if bias is not None:
        y = y + as_f64(bias, dtype)
    return y.reshape(x.shape[:-1] + (w64.shape[0],))


def poisoned(shape, dtype):
    """A NaN-filled output (bfloat16: NaN bits)."""
    if dtype == "bfloat16":
        return np.full(shape, 0x7FC0, np.uint16)
    return np.full(shape, np.nan, NP_DT[dtype])


def check_accuracy(y, y_ref, dtype, what="", scale=None):
    """Relative Frobenius error of y against y_ref. scale: the Frobenius norm that the
    terms of y would have without cancellation (||x| |W|^T| / sqrt(k_in)); with only a few
    outputs, y_ref can cancel far below it by chance (one output of 6144 random terms
    once came out 4x below), and then float32 rounding that is right for the sum looks
    large next to the result. The error is taken relative to the larger of the two."""
    got = as_f64(y, dtype)
    assert got.shape == y_ref.shape
    assert np.all(np.isfinite(got)), f"{what}: an element of y was not written (or is not finite)"
    ref_norm = max(np.linalg.norm(y_ref), scale or 0.0)
    if y_ref.size == 0 or ref_norm == 0:
        assert np.array_equal(got, y_ref)
        return
    err = np.linalg.norm(got - y_ref) / ref_norm
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]} ({dtype})"


# ---- weights of every format: (container, W in float64 by the numpy reference) ----------

def kbit_weight(rng, n_out, k_in, k, fmt, codebook=None, tensor_scale=None):
    w = rng.standard_normal((n_out, k_in)).astype(np.float32)
    if tensor_scale == "custom":  # not a power of two, and never 1
        limit = {"fp32": 1.0, "fp16": 1.0, "e4m4": 17.3}[fmt]
        tensor_scale = float(np.float32(np.abs(w).max() / limit * 1.37))
    q = kbit.quantize(w, k=k, absmax=fmt, codebook=codebook, tensor_scale=tensor_scale)
    w64 = R.dequantize_kbit(q.packed, q.absmax, k, w.size, codebook, fmt, q.tensor_scale)
    return q, w64.astype(np.float64).reshape(n_out, k_in)


def bnb4_weight(rng, n_out, k_in, quant_type, blocksize, nested=False):
    w = rng.standard_normal((n_out, k_in)).astype(np.float32)
    q = kbit.quantize_4bit(w, quant_type, blocksize, compress_statistics=nested)
    n = w.size
    if nested:
        w32 = R.nf4.dequantize_4bit_dq(q.packed, q.absmax, q.absmax2, q.offset[0], n,
                                       quant_type, blocksize)
    else:
        w32 = R.nf4.dequantize_4bit(q.packed, q.absmax, n, quant_type, blocksize)
    return q, w32.astype(np.float64).reshape(n_out, k_in)


# byte offsets of the fp16 scale fields of the k-quants, and a scale that keeps |W| ~ 1
K_QUANT_SCALES = {"Q4_K": ([0, 2], 2e-3), "Q5_K": ([0, 2], 1e-3), "Q6_K": ([208], 1e-3)}


def gguf_blocks(rng, qtype, n_out, k_in):
    """Blocks of a (n_out, k_in) tensor: the gguf package's quantizer where it has one,
    else random valid blocks with moderate finite scales."""
    elems, nbytes = R.GGML_BLOCK_INFO[qtype]
    if qtype in ("Q4_0", "Q8_0"):
        w = rng.standard_normal((n_out, k_in)).astype(np.float32)
        return np.ascontiguousarray(gguf_quantize(w, GT[qtype])).reshape(-1)
    n_blocks = n_out * k_in // elems
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    offsets, scale = K_QUANT_SCALES[qtype]
    for off in offsets:
        vals = (rng.uniform(0.5, 1.5, n_blocks) * scale).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def gguf_weight(rng, n_out, k_in, qtype):
    raw = gguf_blocks(rng, qtype, n_out, k_in)
    w = types.SimpleNamespace(blocks=raw, ggml_type=GGML_ID[qtype], shape=(n_out, k_in))
    return w, R.dequantize_gguf(raw, qtype).astype(np.float64).reshape(n_out, k_in)


def block_of(qtype):
    return R.GGML_BLOCK_INFO[qtype][0]


def run_host(rng, w, w64, m, dtype, with_bias, what):
    n_out, k_in = w64.shape
    x = random_x(rng, (m, k_in), dtype)
    bias = random_x(rng, (n_out,), dtype) if with_bias else None
    out = poisoned((m, n_out), dtype)
    y = kbit.matmul(x, w, bias, dtype=dtype if dtype == "bfloat16" else None, out=out)
    assert y is out
    check_accuracy(y, reference(x, w64, bias, dtype), dtype, what, magnitude(x, w64, dtype))
    return x, bias, y


# ---- the CPU implementation against the reference ---------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", KS)
def test_kbit_host(rng, k, fmt, dtype):
    for i, (m, n_out) in enumerate(SHAPES):
        k_in = 32 * int(rng.integers(1, 12))
        codebook = None
        if i % 3 == 1:  # a random sorted codebook, carried by the container
            codebook = np.sort(rng.uniform(-1, 1, 1 << k)).astype(np.float32)
        ts = "custom" if i % 4 == 2 else None
        w, w64 = kbit_weight(rng, n_out, k_in, k, fmt, codebook, ts)
        if ts == "custom":
            assert w.tensor_scale != 1.0
        run_host(rng, w, w64, m, dtype, i % 2 == 0,
                 f"k={k} {fmt} m={m} n_out={n_out} k_in={k_in} cb={codebook is not None} ts={ts}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocksize", BLOCKSIZES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_host(rng, quant_type, blocksize, dtype):
    for i, (m, n_out) in enumerate(SHAPES[:6]):
        k_in = blocksize * int(rng.integers(1, 4))
        nested = i % 3 == 2
        w, w64 = bnb4_weight(rng, n_out, k_in, quant_type, blocksize, nested)
        run_host(rng, w, w64, m, dtype, i % 2 == 0,
                 f"{quant_type} bs={blocksize} m={m} n_out={n_out} k_in={k_in} nested={nested}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_nested_host(rng, quant_type, dtype):
    # double-quantized states with more than one 256-block of scales
    w, w64 = bnb4_weight(rng, 131, 1024, quant_type, 64, nested=True)
    assert w.nested and w.absmax2.size > 1
    run_host(rng, w, w64, 5, dtype, True, f"{quant_type} nested")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qtype", GGUF_TYPES)
def test_gguf_host(rng, qtype, dtype):
    for i, (m, n_out) in enumerate(SHAPES):
        k_in = block_of(qtype) * int(rng.integers(1, 4 if block_of(qtype) == 256 else 12))
        w, w64 = gguf_weight(rng, n_out, k_in, qtype)
        run_host(rng, w, w64, m, dtype, i % 2 == 1, f"{qtype} m={m} n_out={n_out} k_in={k_in}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["kbit", "nf4", "Q4_K"])
def test_large_k_in_host(rng, family, dtype):
    m, n_out, k_in = 3, 7, BIG_K_IN
    if family == "kbit":
        w, w64 = kbit_weight(rng, n_out, k_in, 4, "e4m4")
    elif family == "nf4":
        w, w64 = bnb4_weight(rng, n_out, k_in, "nf4", 64)
    else:
        w, w64 = gguf_weight(rng, n_out, k_in, family)
    run_host(rng, w, w64, m, dtype, True, f"{family} k_in={k_in}")


def test_rows_are_independent_and_deterministic(rng):
    # any fixed order: a row of y does not depend on m, on the other rows or on the
    # split over threads, and a second call gives the same bits
    n_out, k_in = 131, 4096
    w, _ = kbit_weight(rng, n_out, k_in, 3, "fp16")
    x = random_x(rng, (64, k_in), "float32")
    y = kbit.matmul(x, w)
    assert np.array_equal(y.view(np.uint32), kbit.matmul(x, w).view(np.uint32))
    for i in (0, 17, 63):
        assert np.array_equal(kbit.matmul(x[i], w).view(np.uint32), y[i].view(np.uint32))


def test_host_x_in_slices(rng):
    # an x past the host's one-time float32 conversion (2^22 floats) goes in slices of
    # rows (128 here), each decoding W again: every row still as alone, bias included
    n_out, k_in, m = 9, 32768, 300
    w, w64 = kbit_weight(rng, n_out, k_in, 4, "e4m4")
    x = random_x(rng, (m, k_in), "float16")
    bias = random_x(rng, (n_out,), "float16")
    y = kbit.matmul(x, w, bias)
    check_accuracy(y, reference(x, w64, bias, "float16"), "float16", "slices",
                   magnitude(x, w64, "float16"))
    for i in (0, 127, 128, 255, 256, 299):
        assert np.array_equal(kbit.matmul(x[i], w, bias).view(np.uint16), y[i].view(np.uint16)), i
    # a row past 2^22 floats: slices of one row (fp16 x: fp32's 2e-5 bound is for k_in up
    # to 28672, and float32 sums of 2^22 products come close to it)
    n_out, k_in, m = 2, (1 << 22) + 32, 2
    w, w64 = kbit_weight(rng, n_out, k_in, 3, "fp16")
    x = random_x(rng, (m, k_in), "float16")
    y = kbit.matmul(x, w)
    check_accuracy(y, reference(x, w64, None, "float16"), "float16", "one-row slices",
                   magnitude(x, w64, "float16"))
    assert np.array_equal(kbit.matmul(x[1], w).view(np.uint16), y[1].view(np.uint16))


def test_shapes_and_leading_dims(rng):
    w, w64 = kbit_weight(rng, 7, 64, 4, "e4m4")
    x = random_x(rng, (2, 3, 64), "float16")
    y = kbit.matmul(x, w)
    assert y.shape == (2, 3, 7) and y.dtype == np.float16
    check_accuracy(y, reference(x, w64, None, "float16"), "float16")
    y1 = kbit.matmul(x[0, 0], w)
    assert y1.shape == (7,) and np.array_equal(y1, y[0, 0])
    y0 = kbit.matmul(np.zeros((0, 64), np.float32), w)
    assert y0.shape == (0, 7)
    # k_in = 0 is a valid empty weight: y = bias
    w_empty, _ = kbit_weight(rng, 5, 0, 4, "e4m4")
    bias = random_x(rng, (5,), "float32")
    assert np.array_equal(kbit.matmul(np.zeros((3, 0), np.float32), w_empty, bias),
                          np.broadcast_to(bias, (3, 5)))


def test_python_errors(rng):
    w, _ = kbit_weight(rng, 7, 64, 4, "e4m4")
    x = random_x(rng, (3, 64), "float16")
    with pytest.raises(KbitError, match="shape"):
        kbit.matmul(random_x(rng, (3, 32), "float16"), w)
    with pytest.raises(KbitError, match="dtype"):
        kbit.matmul(x, w, random_x(rng, (7,), "float32"))  # bias of another dtype
    with pytest.raises(KbitError, match="bias"):
        kbit.matmul(x, w, random_x(rng, (8,), "float16"))
    with pytest.raises(KbitError, match="bfloat16"):
        kbit.matmul(x.view(np.uint16), w)  # uint16 without dtype='bfloat16'
    with pytest.raises(KbitError):
        kbit.matmul(x.astype(np.float64), w)
    with pytest.raises(KbitError):
        kbit.matmul(x, w, dtype="float32")  # x is float16
    with pytest.raises(KbitError, match="2-D"):
        kbit.matmul(x, dataclasses.replace(w, shape=(7 * 64,)))
    with pytest.raises(KbitError):
        kbit.matmul(x, np.zeros((7, 64), np.float32))  # not a quantized container
    g, _ = gguf_weight(rng, 7, 64, "Q4_0")
    with pytest.raises(KbitError, match="multiple"):
        kbit.matmul(random_x(rng, (3, 48), "float32"),
                    types.SimpleNamespace(blocks=g.blocks, ggml_type=2, shape=(7, 48)))
    with pytest.raises(KbitError, match="bytes"):
        kbit.matmul(random_x(rng, (3, 64), "float32"),
                    types.SimpleNamespace(blocks=g.blocks[:-1], ggml_type=2, shape=(7, 64)))
    with pytest.raises(KbitError):
        kbit.matmul(x, dataclasses.replace(w, absmax=w.absmax[:-1]))


# ---- bad arguments through ctypes ---------------------------------------------------------

GUARD = 32  # poisoned bytes around y
POISON = 0xA7


class HostCall:
    """A valid call of one family's _host entry, whose arguments a test changes one at a
    time; y sits between poisoned guards so that any write shows."""

    def __init__(self, rng, family, dtype="float16", m=3, n_out=5, absmax_format="fp16"):
        self.family, self.dtype = family, dtype
        self.block = {"kbit": 32, "nf4": 64, "fp4": 64}.get(family) or block_of(family)
        k_in = 2 * self.block
        elem = np.dtype(NP_DT[dtype]).itemsize
        self.x = random_x(rng, (m, k_in), dtype)
        self.bias = random_x(rng, (n_out,), dtype)
        self.ybuf = np.full(m * n_out * elem + 2 * GUARD, POISON, np.uint8)
        base = (-self.ybuf.ctypes.data) % 16
        self.ybuf = self.ybuf[base:base + m * n_out * elem + 2 * GUARD]
        y = self.ybuf.ctypes.data + GUARD
        if family == "kbit":
            self.w, _ = kbit_weight(rng, n_out, k_in, 4, absmax_format)
            self.codebook = R.create_normal_float_codebook(4)
            fmt = [("packed", self.w.packed.ctypes.data), ("absmax", self.w.absmax.ctypes.data),
                   ("absmax_format", FMT_ID[absmax_format]),
                   ("tensor_scale", ctypes.c_float(self.w.tensor_scale)),
                   ("codebook", self.codebook.ctypes.data), ("k", 4)]
        elif family in ("nf4", "fp4"):
            self.w, _ = bnb4_weight(rng, n_out, k_in, family, 64)
            fmt = [("packed", self.w.packed.ctypes.data), ("absmax", self.w.absmax.ctypes.data),
                   ("blocksize", 64)]
        else:
            self.w, _ = gguf_weight(rng, n_out, k_in, family)
            fmt = [("ggml_type", GGML_ID[family]), ("blocks", self.w.blocks.ctypes.data)]
        self.args = dict([("x", self.x.ctypes.data), ("m", m), ("k_in", k_in), ("n_out", n_out),
                          ("dtype", DT_ID[dtype])] + fmt + [("bias", self.bias.ctypes.data),
                                                            ("y", y)])
        self.name = f"kbit_matmul_{'gguf' if family in GGUF_TYPES else family}_host"

    def __call__(self, **changes):
        args = dict(self.args, **changes)
        return function(self.name)(*args.values())

    def untouched(self):
        return np.all(self.ybuf == POISON)


def bad_cases(call):
    """(changes, expected status) for every kind of bad argument of call's family."""
    a, blk = call.args, call.block
    cases = [
        (dict(k_in=a["k_in"] + blk // 2), S_INVALID),
        (dict(k_in=a["k_in"] - 1), S_INVALID),
        (dict(m=-1), S_INVALID), (dict(n_out=-1), S_INVALID), (dict(k_in=-blk), S_INVALID),
        (dict(dtype=3), S_INVALID), (dict(dtype=-1), S_INVALID),
        (dict(m=2 ** 62), S_INVALID),                       # x's bytes overflow
        (dict(n_out=2 ** 62), S_INVALID),                   # y's and W's bytes overflow
        (dict(m=1, n_out=2 ** 62 // blk), S_INVALID),       # W's elements overflow
        (dict(x=None), S_NULL), (dict(y=None), S_NULL),
        (dict(x=a["x"] + 1), S_MISALIGNED), (dict(y=a["y"] + 1), S_MISALIGNED),
        (dict(bias=a["bias"] + 1), S_MISALIGNED),
    ]
    if call.family == "kbit":
        cases += [(dict(packed=None), S_NULL), (dict(absmax=None), S_NULL),
                  (dict(packed=a["packed"] + 2), S_MISALIGNED),
                  (dict(absmax=a["absmax"] + 1), S_MISALIGNED),  # fp16 scales
                  (dict(codebook=a["codebook"] + 2), S_MISALIGNED),
                  (dict(k=1), S_INVALID), (dict(k=6), S_INVALID), (dict(k=-2 ** 31), S_INVALID),
                  (dict(absmax_format=3), S_INVALID), (dict(absmax_format=-1), S_INVALID)]
        cases += [(dict(tensor_scale=ctypes.c_float(v)), S_INVALID)
                  for v in (0.0, -1.0, float("nan"), float("inf"))]
    elif call.family in ("nf4", "fp4"):
        cases += [(dict(packed=None), S_NULL), (dict(absmax=None), S_NULL),
                  (dict(absmax=a["absmax"] + 2), S_MISALIGNED)]
        cases += [(dict(blocksize=b), S_INVALID) for b in (0, 16, 48, 96, 8192, -64)]
    else:
        cases += [(dict(blocks=None), S_NULL), (dict(blocks=a["blocks"] + 1), S_MISALIGNED)]
        cases += [(dict(ggml_type=t), S_INVALID) for t in (0, 1, 3, 10, 15, 99, -1)]
    return cases


@pytest.mark.parametrize("family", ["kbit", "nf4", "fp4"] + list(GGUF_TYPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_host_bad_arguments(rng, family, dtype):
    call = HostCall(rng, family, dtype)
    for changes, want in bad_cases(call):
        status = call(**changes)
        assert status == want, f"{changes}: status {status}, expected {want}"
        assert lib().kbit_last_error_message(), f"{changes}: no error message"
        assert call.untouched(), f"{changes}: y was written by a rejected call"
    # the valid call writes exactly y, and clears the message
    assert call() == S_OK
    assert lib().kbit_last_error_message() == b""
    assert np.all(call.ybuf[:GUARD] == POISON) and np.all(call.ybuf[-GUARD:] == POISON)
    assert not np.all(call.ybuf[GUARD:-GUARD] == POISON)


@pytest.mark.parametrize("family", ["kbit", "nf4", "Q6_K"])
def test_host_empty_calls(rng, family):
    call = HostCall(rng, family)
    # m = 0 or n_out = 0: nothing written; pointers to empty arrays may be NULL
    assert call(m=0) == S_OK and call.untouched()
    assert call(m=0, x=None, y=None, bias=None) == S_OK and call.untouched()
    assert call(n_out=0) == S_OK and call.untouched()
    w_args = {k: None for k in ("packed", "absmax", "codebook", "blocks") if k in call.args}
    assert call(n_out=0, x=None, y=None, bias=None, **w_args) == S_OK and call.untouched()
    # ...but W's pointers are checked whenever W has elements
    if w_args:
        assert call(m=0, x=None, y=None, **w_args) == S_NULL and call.untouched()
    # bias NULL is always valid
    assert call(bias=None) == S_OK


# ---- the GPU implementation -----------------------------------------------------------------

def cuda(a):
    """A numpy array as a CUDA tensor holding the same bytes."""
    import torch
    a = np.ascontiguousarray(a)
    same_size = {np.dtype(np.uint32): np.int32, np.dtype(np.uint16): np.int16}
    return torch.from_numpy(a.view(same_size.get(a.dtype, a.dtype))).cuda()


def cuda_x(x, dtype):
    import torch
    t = cuda(x)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def from_cuda(t, dtype):
    """A CUDA result as numpy (bfloat16: uint16 bits)."""
    import torch
    t = t.detach().cpu()
    if dtype == "bfloat16":
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def poisoned_cuda(shape, dtype):
    import torch
    return torch.full(shape, float("nan"), dtype=getattr(torch, dtype), device="cuda")


def to_device(w):
    """The same weight with its arrays on the GPU (small host state stays as it is)."""
    if isinstance(w, kbit.QuantizedTensor):
        return dataclasses.replace(w, packed=cuda(w.packed), absmax=cuda(w.absmax))
    if isinstance(w, kbit.Quantized4bit):
        q = dataclasses.replace(w, packed=cuda(w.packed), absmax=cuda(w.absmax))
        if w.nested:
            q.absmax2, q.offset = cuda(w.absmax2), cuda(w.offset)
        return q
    return types.SimpleNamespace(blocks=cuda(w.blocks), ggml_type=w.ggml_type, shape=w.shape)


def offset_blocks(w):
    """A GGUF weight's blocks on the GPU 2 bytes past a 16-byte boundary (the direct
    kernels' case: the streamed ones need 16)."""
    padded = cuda(np.concatenate([np.zeros(2, np.uint8), w.blocks]))[2:]
    assert padded.data_ptr() % 16 == 2
    return types.SimpleNamespace(blocks=padded, ggml_type=w.ggml_type, shape=w.shape)


def gpu_case(rng, family, n_out, k_in, **kw):
    if family == "kbit":
        return kbit_weight(rng, n_out, k_in, kw.get("k", 4), kw.get("fmt", "e4m4"),
                           kw.get("codebook"), kw.get("tensor_scale"))
    if family in ("nf4", "fp4"):
        return bnb4_weight(rng, n_out, k_in, family, kw.get("blocksize", 64),
                           kw.get("nested", False))
    return gguf_weight(rng, n_out, k_in, family)


def check_gpu(rng, w, w64, m, dtype, with_bias, what, x=None):
    """kbit.matmul on CUDA tensors: within the bound of the reference, close to the host
    (x: m rows of random_x unless given)."""
    import torch
    n_out, k_in = w64.shape
    x = random_x(rng, (m, k_in), dtype) if x is None else x
    bias = random_x(rng, (n_out,), dtype) if with_bias else None
    out = poisoned_cuda((m, n_out), dtype)
    y_t = kbit.matmul(cuda_x(x, dtype), to_device(w),
                      cuda_x(bias, dtype) if bias is not None else None, out=out)
    assert y_t is out and y_t.is_cuda
    torch.cuda.synchronize()
    y = from_cuda(y_t, dtype)
    y_ref = reference(x, w64, bias, dtype)
    scale = magnitude(x, w64, dtype)
    check_accuracy(y, y_ref, dtype, "GPU " + what, scale)
    y_host = kbit.matmul(x, w, bias, dtype=dtype if dtype == "bfloat16" else None)
    if y_ref.size:  # the same normalisation as check_accuracy (a single output may cancel)
        diff = np.linalg.norm(as_f64(y, dtype) - as_f64(y_host, dtype))
        assert diff <= TOL[dtype] * max(np.linalg.norm(y_ref), scale, 1e-30), f"GPU vs host: {what}"


GPU_FAMILIES = ["kbit", "nf4", "fp4"] + list(GGUF_TYPES)


def varied_case(rng, family, i, k_in, blocksizes):
    """Case i of a family's sweep: (format arguments, k_in fitted to them). kbit cycles
    through K, absmax formats, custom codebooks and tensor scales; NF4/FP4 through
    `blocksizes` and nested states."""
    if family == "kbit":
        k = KS[i % 4]
        return dict(k=k, fmt=FORMATS[i % 3], tensor_scale="custom" if i % 4 == 3 else None,
                    codebook=np.sort(rng.uniform(-1, 1, 1 << k)).astype(np.float32)
                    if i % 3 == 1 else None), k_in
    if family in ("nf4", "fp4"):
        bs = blocksizes[i % len(blocksizes)]
        return dict(blocksize=bs, nested=i % 3 == 2), max(k_in, bs) // bs * bs
    return {}, k_in


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_gpu_matches_reference_and_host(rng, family, dtype):
    block = {"kbit": 32, "nf4": 64, "fp4": 64}.get(family) or block_of(family)
    for i, (m, n_out) in enumerate(SHAPES):
        k_in = block * int(rng.integers(1, 5))
        kw, k_in = varied_case(rng, family, i, k_in, BLOCKSIZES)
        if family in ("nf4", "fp4"):
            k_in = kw["blocksize"] * int(rng.integers(1, 3))
        w, w64 = gpu_case(rng, family, n_out, k_in, **kw)
        check_gpu(rng, w, w64, m, dtype, i % 2 == 0, f"{family} {kw} m={m} n_out={n_out}")


# The tensor-core GEMM (m >= 9): CTA shapes of 16, 32 and 128 rows of x, partial
# tiles in m and n_out, an odd number of 32-element chunks (a half stage at the end), and
# shapes with few tiles, which split k through kbit.matmul's cached workspace.
GEMM_CASES = ((9, 131, 3), (17, 7, 5), (33, 260, 2), (64, 1, 7), (100, 131, 3),
              (257, 33, 1), (40, 131, 128), (130, 300, 64))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_gpu_gemm(rng, family, dtype):
    block = {"kbit": 32, "nf4": 64, "fp4": 64}.get(family) or block_of(family)
    for i, (m, n_out, blocks) in enumerate(GEMM_CASES):
        kw, k_in = varied_case(rng, family, i, block * max(1, blocks * 32 // block),
                               BLOCKSIZES[:4])
        w, w64 = gpu_case(rng, family, n_out, k_in, **kw)
        check_gpu(rng, w, w64, m, dtype, i % 2 == 0, f"{family} {kw} m={m} n_out={n_out} "
                  f"k_in={k_in} workspace={workspace_bytes(m, k_in, n_out)}")


@requires_gpu
@pytest.mark.parametrize("family", ["kbit", "nf4"])
def test_gpu_gemm_wide_shapes(rng, family):
    """The stored layouts through the GEMM's widest CTA on sm_90: 8500 rows of W (67 row
    tiles), m = 300 (two tiles of 256 rows of x, the second partial), k_in = 1056 (33
    chunks, an odd count: the last stage half empty); against the reference and the host."""
    w, w64 = gpu_case(rng, family, 8500, 1056, k=4, fmt="e4m4", blocksize=32)
    for dtype in ("float16", "bfloat16"):
        check_gpu(rng, w, w64, 300, dtype, True, f"{family} {dtype} wide")


@requires_gpu
@pytest.mark.parametrize("qtype", GGUF_TYPES)
def test_gpu_gguf_streamed_gemv(rng, qtype):
    """GGUF at m = 1..16 on sm_90 through the streamed GEMV (one n8 tile of x to m = 8,
    two from 9; from m = 17, and 16 on weights of 2^25 or more, the GGUF GEMM:
    test_gpu_gguf_gemm), which reads the file's blocks in stages of 2048 elements of k of
    one row tile, or 512 of four (not Q6_K) where x comes with the stages, four-tile groups
    fill 90% of the SMs and read fewer bytes (on 132 SMs: 8500 rows at m = 16 and 7700
    rows of 5120 at m = 8, 133 and 121 groups, the last of four and two tiles, the last
    tile of 4 rows), when they lie on 16 bytes and k_in % 256 == 0 (Q6_K: % 2048): a
    partial last stage (2560), more row tiles than SMs (2200 rows: CTAs with two tiles at
    m = 8..16), n_out off the 16-row tile, x held in shared memory for the whole kernel
    (8500 rows: three row tiles or more a CTA) or copied with each stage; the direct
    kernels where the stream cannot read (blocks 2 bytes off 16, k_in off 256 / 2048);
    against the reference and the host."""
    import torch
    big = 2048 if qtype == "Q6_K" else 2560
    cases = ((131, big, (1, 3, 12)), (2200, 2048, (8, 16)), (40, 4096, (2, 5, 7, 9)),
             (8500, 2048, (1, 4, 16)), (7700, 5120 if qtype != "Q6_K" else 6144, (8,)),
             (33, 1024 if qtype == "Q6_K" else 288 if qtype in ("Q4_0", "Q8_0") else 256,
              (4, 10)))
    for i, (n_out, k_in, ms) in enumerate(cases):
        w, w64 = gpu_case(rng, qtype, n_out, k_in)
        for m in ms:
            dtype = ("float16", "bfloat16")[(i + m) % 2]
            check_gpu(rng, w, w64, m, dtype, m % 2 == 1, f"{qtype} {n_out}x{k_in} m={m}")
    # the same bytes 2 bytes past a 16-byte boundary: the direct kernel
    w, w64 = gpu_case(rng, qtype, 20, 2048)
    x = torch.from_numpy(random_x(rng, (3, 2048), "float16")).cuda()
    y = kbit.matmul(x, offset_blocks(w))
    y_ref = reference(x.cpu().numpy(), w64, None, "float16")
    check_accuracy(y.cpu().numpy(), y_ref, "float16", f"{qtype} offset blocks",
                   magnitude(x.cpu().numpy(), w64, "float16"))


def q6k_one_hot_case(rng, m):
    """Q6_K weights whose every (q, sc) pair, q = 0..63 and sc = -128..127, meets a one-hot
    row of x: 16384 rows of 2048 x ceil(m / 8) elements, x row i one-hot in block i, at an
    element of half i % 8 // 4, quadrant i % 4 (a random l), where row n holds
    q = (n + 7 i) % 64, sc = (n // 64 + 37 i) % 256 - 128 and d = 2^-(i % 4); the other
    bytes random. Returns (the weight, x in float32, y exactly: d (q - 32) sc)."""
    n_out, k_in = 64 * 256, 2048 * -(-m // 8)
    n = np.arange(n_out)
    raw = rng.integers(0, 256, size=(n_out, k_in // 256, 210), dtype=np.uint8)
    raw[:, :, 208:210] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)  # d finite everywhere
    x = np.zeros((m, k_in), np.float32)
    y = np.empty((m, n_out))
    for i in range(m):
        half, quad, l = i % 8 // 4, i % 4, int(rng.integers(0, 32))
        q, sc, d = (n + 7 * i) % 64, (n // 64 + 37 * i) % 256 - 128, 2.0**-(i % 4)
        blk = raw[:, i]
        ql = 64 * half + 32 * (quad & 1) + l  # low nibble for quadrants 0, 1
        shift = 4 * (quad >> 1)
        blk[:, ql] = (blk[:, ql] & (0xF0 >> shift)) | ((q & 15) << shift)
        qh = 128 + 32 * half + l
        blk[:, qh] = (blk[:, qh] & (0xFF ^ 3 << 2 * quad)) | ((q >> 4) << 2 * quad)
        blk[:, 192 + 8 * half + 2 * quad + l // 16] = sc.astype(np.int8).view(np.uint8)
        blk[:, 208:210] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        x[i, 256 * i + 128 * half + 32 * quad + l] = 1.0
        y[i] = d * (q - 32) * sc
    w = types.SimpleNamespace(blocks=raw.reshape(-1), ggml_type=GGML_ID["Q6_K"],
                              shape=(n_out, k_in))
    # the layout as the reference reads it, on the first rows
    w64 = R.dequantize_gguf(raw[:64].reshape(-1), "Q6_K").reshape(64, k_in)
    assert np.array_equal(x @ w64.T, y[:, :64])
    return w, x, y


def rounded(y, dtype):
    """Exact values (float64, 12 significant bits or fewer) rounded once to dtype."""
    return as_f64(as_dtype(y.astype(np.float32), dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_q6k_one_hot_rounded_once_host(rng, dtype):
    """Q6_K's products (q - 32) sc take up to 12 significant bits, one more than fp16's:
    for one-hot x the host's y is every d (q - 32) sc rounded once to x's type (exact
    for float32). A weight rounded to fp16 before the scale, or on the way, would not be."""
    w, x, y = q6k_one_hot_case(rng, 8)
    if dtype != "float32":  # the case needs the rounding (fp16: 628 of the 16384 pairs)
        assert np.count_nonzero(rounded(y, dtype) != y) > 100
    got = kbit.matmul(as_dtype(x, dtype), w, dtype=dtype if dtype == "bfloat16" else None)
    assert np.array_equal(as_f64(got, dtype), rounded(y, dtype))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_q6k_one_hot_rounded_once(rng, dtype):
    """As test_q6k_one_hot_rounded_once_host on the GPU: fp16's fused pairs in the streamed
    GEMV (one fma from codes 4q and sc / 4), bf16's (q - 32) sc, the GEMM (m = 16 and 24 on
    this weight of 2^26 elements) and the direct kernel (blocks 2 bytes off 16) must each
    give every product rounded once ((base + 4q) sc / 4 rounded to fp16 before
    (base / 4 + 32) sc is taken off would change 11034 of the 16384; bf16 or fp32 x
    through fp16, 80 or 628). Odd blocks lie 2 bytes off 4 (the stream's unaligned reads)."""
    w, x, y = q6k_one_hot_case(rng, 24)
    wd = to_device(w)
    offset = offset_blocks(w)
    for m, weight, what in ((1, wd, "m=1"), (8, wd, "m=8"), (16, wd, "m=16"), (24, wd, "m=24"),
                            (3, offset, "offset blocks m=3")):
        got = from_cuda(kbit.matmul(cuda_x(as_dtype(x[:m], dtype), dtype), weight), dtype)
        want = rounded(y[:m], dtype)
        bad = np.flatnonzero(as_f64(got, dtype) != want)
        assert bad.size == 0, (f"{dtype} {what}: {bad.size} outputs not rounded once, e.g. "
                               f"{as_f64(got, dtype).flat[bad[0]]} for {y[:m].flat[bad[0]]}")


def means_rows():
    """Rows of W that give every SM six row tiles, where the streamed GEMV takes Q4_K's
    mins against x's sub-block means (gguf_stream::kMeansMinTiles), the last tile
    partial."""
    import torch
    return 16 * 6 * torch.cuda.get_device_properties(0).multi_processor_count + 40


def streamed_means(qtype, n_out, k_in, m):
    """Whether sm_90's streamed GGUF GEMV takes the mins against x's means: Q4_K, x held
    for the whole kernel (resident_x_stride: three row tiles a CTA, x's rows within 72
    KB) and six row tiles a CTA (a CTA an SM)."""
    import torch
    tiles = -(-n_out // 16)
    ctas = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    x_bytes = m * (-(-2 * k_in // 128) * 128 + 32)
    return qtype == "Q4_K" and m <= 8 and x_bytes <= 72 * 1024 and tiles >= 6 * ctas


def hopper_kernels():
    """Whether the kernels launched are sm_90's: an sm_90 GPU, not a library built to
    report an older one (make emulated-check)."""
    import os
    import torch
    return torch.cuda.get_device_capability() == (9, 0) and not os.environ.get("KBIT_TEST_EMULATED")


@requires_gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_gguf_streamed_means(rng, qtype, dtype):
    """The k-quants' mins in the streamed GEMV. x's sub-blocks each get their own offset
    (uniform in [-4, 4], plus N(0, 1)), so that the mins' part of y is large and a mean
    read for the wrong sub-block, row or unit would show. Q4_K on means_rows() x 2304 (18
    units a row: two stages a tile group, the last short; x held for the whole kernel,
    m = 1..8) against x's sub-block means, which each lane computes in its CTA's first
    tile group, as x arrives, and reads back in the later ones; there also x 2^-22 of that
    (fp16 subnormals, where a mean's low part kept unscaled in fp16 was lost: 7e-3
    relative error of y by a numpy model, against 3e-4 from y's own rounding); 8500 x 8448
    (m <= 4 held; the means only on 88 SMs or fewer), 2200 rows (x with the stages) and
    Q5_K by an mma a sub-block; on sm_90 the launched kernel checked. Against the
    reference and the host."""
    from test_tiled import launched
    for n_out, k_in, ms in ((means_rows(), 2304, range(1, 9)), (8500, 8448, range(1, 5)),
                            (2200, 2048, (1, 4))):
        w, w64 = gpu_case(rng, qtype, n_out, k_in)
        tiny = (1, 6) if n_out == means_rows() else ()
        for m, scale in [(m, 1.0) for m in ms] + [(m, 2.0**-22) for m in tiny]:
            offsets = np.repeat(rng.uniform(-4, 4, (m, k_in // 32)), 32, axis=1)
            x = as_dtype(((offsets + rng.standard_normal((m, k_in))) * scale).astype(np.float32),
                         dtype)
            check_gpu(rng, w, w64, m, dtype, m == 3,
                      f"{qtype} {dtype} {n_out}x{k_in} m={m} x scale {scale}", x=x)
        if hopper_kernels():  # the launched kernel's (NT, kR, kMeans), at the last m
            x_t, w_d = cuda_x(x, dtype), to_device(w)
            means = "true" if streamed_means(qtype, n_out, k_in, m) else "false"
            assert launched(lambda: kbit.matmul(x_t, w_d),
                            r"gemv_gguf_kernel<.*, (\d+), (\d+), (true|false)>") == [("1", "1", means)]


@requires_gpu
@pytest.mark.parametrize("qtype", GGUF_TYPES)
def test_gpu_gguf_gemm(rng, qtype):
    """GGUF from m = 17 on sm_90 through the GGUF GEMM, which reads the file's blocks in
    stages of 256 elements of k of 128 rows (Q6_K's 210-byte blocks at every even offset
    from a 16-byte boundary) when they lie on 16 bytes and k_in % 256 == 0 (Q6_K: % 2048):
    128 and 256 rows of x a CTA, partial tiles of rows of W and of x, few tiles (k split
    through kbit.matmul's workspace, splits of uneven stage counts), more tiles than SMs,
    fp16 and bf16 x, bias; from m = 17 (16 on weights of 2^25: 1024 x 32768) with 16, 32
    and 64 rows of x a CTA, n_out off the 16-row tile; the blocks 2 bytes
    off 16 (the direct kernel); and through the C entry with the workspace NULL and given
    (left zeroed); against the reference and the host."""
    import torch
    k_small = 2048 if qtype == "Q6_K" else 768
    cases = ((131, 2048, (65, 100, 257)), (300, 4096, (129,)), (40, k_small, (70, 300)),
             (8500, 2048 if qtype == "Q6_K" else 512, (300,)),
             (2200, 2048 if qtype == "Q6_K" else 2304, (17, 20, 32, 33, 50)),
             (1024, 32768, (15, 16)), (33, 2048, (24, 64)))
    for i, (n_out, k_in, ms) in enumerate(cases):
        w, w64 = gpu_case(rng, qtype, n_out, k_in)
        for m in ms:
            # both types at 16 and 256 rows of x a CTA, else one
            for dtype in DTYPES if m in (16, 257, 300) else [("float16", "bfloat16")[(i + m) % 2]]:
                check_gpu(rng, w, w64, m, dtype, m % 2 == 0, f"{qtype} {dtype} {n_out}x{k_in} m={m}")
    # the C entry, workspace NULL and given; a split shape (6 tiles of 128 x 128)
    m, n_out, k_in, dtype = 129, 300, 4096, "float16"
    w, w64 = gpu_case(rng, qtype, n_out, k_in)
    wd = to_device(w)
    x = random_x(rng, (m, k_in), dtype)
    x_t = cuda_x(x, dtype)
    nbytes = workspace_bytes(m, k_in, n_out)
    assert nbytes > 0
    ws = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    for use_ws in (False, True):
        y_t = poisoned_cuda((m, n_out), dtype)
        ws_args = [ws.data_ptr(), nbytes] if use_ws else [None, 0]
        assert function("kbit_matmul_gguf")(x_t.data_ptr(), m, k_in, n_out, DT_ID[dtype],
                                            GGML_ID[qtype], wd.blocks.data_ptr(), None,
                                            y_t.data_ptr(), *ws_args, stream) == S_OK, \
            lib().kbit_last_error_message()
        torch.cuda.synchronize()
        check_accuracy(from_cuda(y_t, dtype), reference(x, w64, None, dtype), dtype,
                       f"{qtype} workspace={use_ws}", magnitude(x, w64, dtype))
        assert int(torch.count_nonzero(ws)) == 0, "the workspace was not left zeroed"
    # the same bytes 2 bytes past a 16-byte boundary: the direct kernel
    y = kbit.matmul(x_t[:70], offset_blocks(w))
    check_accuracy(from_cuda(y, dtype), reference(x[:70], w64, None, dtype), dtype,
                   f"{qtype} offset blocks", magnitude(x[:70], w64, dtype))


@requires_gpu
@pytest.mark.parametrize("family", ["kbit", "kbit-tiled", "nf4"] + list(GGUF_TYPES))
def test_gpu_empty_k(rng, family):
    """k_in = 0, an empty weight, on the GPU at the GEMV's, the streamed and the GEMM's m:
    y = bias (zeros without), whatever kernel the m would take."""
    import torch
    n_out = 5
    if family.startswith("kbit"):
        w, _ = kbit_weight(rng, n_out, 0, 4, "e4m4")
        w = to_device(w)
        if family == "kbit-tiled":
            w = kbit.tile(w)
    elif family == "nf4":
        w = to_device(bnb4_weight(rng, n_out, 0, "nf4", 64)[0])
    else:
        w = types.SimpleNamespace(blocks=cuda(np.zeros(0, np.uint8)), ggml_type=GGML_ID[family],
                                  shape=(n_out, 0))
    for m in (3, 16, 20, 100):
        for dtype in DTYPES:
            bias = cuda_x(random_x(rng, (n_out,), dtype), dtype)
            x = cuda_x(random_x(rng, (m, 0), dtype), dtype)
            for b in (bias, None):  # into NaNs: an output left unwritten fails
                y = kbit.matmul(x, w, b, out=poisoned_cuda((m, n_out), dtype))
                torch.cuda.synchronize()
                want = bias.expand(m, n_out) if b is not None else torch.zeros_like(y)
                assert torch.equal(y, want), f"{family} {dtype} m={m} bias={b is not None}"


@requires_gpu
@pytest.mark.parametrize("k", KS)
def test_gpu_kbit_stored_streamed_gemm(rng, k):
    """Stored kbit at m = 8..64, which on sm_90 the streamed wgmma GEMM reads as
    kbit_quantize stores it (m = 8 from 8192 rows at K >= 4, 9..16 also from 2^25 weights;
    a row's chunk bytes and scales on 16 bytes; m = 7 the staged GEMV): every absmax
    format, a custom codebook and
    tensor_scale, rows off the CTA's 128, few tiles (split k), and rows whose scales are
    not on 16 bytes (5 chunks: the wgmma GEMM instead); against the reference and the
    host."""
    cases = ((8200, 512, "e4m4", False, (7, 8, 9, 16)), (4096, 8192, "fp16", False, (8, 12)),
             (300, 2048, "fp16", True, (17, 40)),
             (131, 1024, "fp32", False, (24, 64)), (77, 4096, "e4m4", True, (33,)),
             (131, 160, "e4m4", False, (20,)))
    for i, (n_out, k_in, fmt, custom, ms) in enumerate(cases):
        cb = np.sort(rng.uniform(-1, 1, 1 << k)).astype(np.float32) if custom else None
        w, w64 = gpu_case(rng, "kbit", n_out, k_in, k=k, fmt=fmt, codebook=cb,
                          tensor_scale="custom" if custom else None)
        for m in ms:
            dtype = "bfloat16" if fmt == "fp32" else ("float16", "bfloat16")[(i + m) % 2]
            check_gpu(rng, w, w64, m, dtype, m % 2 == 1,
                      f"kbit K={k} {fmt} {n_out}x{k_in} cb={custom} m={m}")


@requires_gpu
@pytest.mark.parametrize("family", ["nf4", "fp4"])
def test_gpu_bnb4_streamed_gemm(rng, family):
    """NF4 / FP4 at m = 8..64, which on sm_90 the streamed wgmma GEMM reads as
    bitsandbytes stores them (m = 8 from 8192 rows, 9..16 also from 2^25 weights; m = 5 and
    6 the staged GEMV): blocksizes 32 to 512 (one to four scales a 128-element stage, or
    one for several stages), nested
    statistics, rows off the CTA's 128, few tiles (split k), and scale rows that are not a
    multiple of 4 (192 / 64: the wgmma GEMM instead); against the reference and the
    host."""
    cases = ((8200, 256, 64, False, (5, 8, 9, 16)), (4096, 8192, 64, True, (6, 12)),
             (300, 4096, 128, True, (17, 40)),
             (131, 1152, 32, False, (24, 64)), (77, 2048, 512, False, (33,)),
             (131, 192, 64, False, (20,)))
    for i, (n_out, k_in, bs, nested, ms) in enumerate(cases):
        w, w64 = gpu_case(rng, family, n_out, k_in, blocksize=bs, nested=nested)
        for m in ms:
            dtype = ("float16", "bfloat16")[(i + m) % 2]
            check_gpu(rng, w, w64, m, dtype, m % 2 == 1,
                      f"{family} {n_out}x{k_in} bs={bs} nested={nested} m={m}")


@requires_gpu
@pytest.mark.parametrize("tiled", [False, True])
def test_gpu_gemm_fp32_scales_beyond_fp16(rng, tiled):
    """kbit weights whose fp32 block scales lie beyond fp16's range, with fp16 x, in the
    GEMM (m = 40): those scales stay float32 (the wgmma GEMM, which rounds scale times
    codebook value to x's type, is not taken), so y is finite and within the bound."""
    n_out, k_in, m = 131, 256, 40
    w = (rng.standard_normal((n_out, k_in)) * 1e5).astype(np.float32)
    q = kbit.quantize(w, k=4, absmax="fp32")
    w64 = R.dequantize_kbit(q.packed, q.absmax, 4, w.size, None, "fp32",
                            q.tensor_scale).astype(np.float64).reshape(n_out, k_in)
    assert np.abs(w64).max() > 65504
    wq = to_device(q)
    if tiled:
        wq = kbit.tile(wq)
    x = (rng.standard_normal((m, k_in)) * 1e-3).astype(np.float16)
    y = from_cuda(kbit.matmul(cuda_x(x, "float16"), wq), "float16")
    check_accuracy(y, reference(x, w64, None, "float16"), "float16",
                   f"fp32 scales beyond fp16, tiled={tiled}", magnitude(x, w64, "float16"))


def test_workspace_bytes():
    """The split-K workspace: none below the GEMMs' m (9; 8 for the streamed GEMM of
    stored weights of 8192 rows) or with tiles that fill the CTAs evenly, some for few
    tiles and long rows (the tiled GEMM's too) and for the even walk; -1 for negative
    sizes."""
    assert workspace_bytes(8, 4096, 4096) == 0
    # the persistent GEMMs' even walk to m = 64 where split k leaves CTAs uneven: 224
    # tiles of 28672 rows on 264 CTAs (a slot of partial sums a CTA); 264 tiles need none
    assert workspace_bytes(16, 28672, 28672) >= 264 * 16 * 128 * 4
    assert workspace_bytes(16, 4096, 33792) == 0
    assert workspace_bytes(16, 4096, 4096) > 0
    assert workspace_bytes(40, 4096, 131) > 0
    assert workspace_bytes(16, 64, 4096) == 0  # too few stages to split
    # m = 8 on the streamed GEMM from 8192 rows of stored weights (64 tiles: split k), not
    # at m = 7 (the staged GEMV)
    assert workspace_bytes(8, 8192, 8192) > 0
    assert workspace_bytes(7, 8192, 8192) == 0
    # the tiled GEMM takes 256 rows of x a CTA from m = 129 and splits k where the tiles
    # leave SMs idle: 64 tiles of 8192 rows at m = 256, two splits of 256 x 128 floats each
    assert workspace_bytes(256, 28672, 8192) >= 64 * 2 * 256 * 128 * 4
    # and where whole waves of its tiles leave a last one at most half full, the last
    # one's tiles split: 14336 rows at m = 1024 are 448 tiles, 52 past three waves
    assert workspace_bytes(1024, 4096, 14336) >= 52 * 2 * 256 * 128 * 4
    assert workspace_bytes(1024, 4096, 8192) == 0  # 256 tiles: 124 past one wave
    assert workspace_bytes(-1, 1, 1) == -1


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", ["kbit", "nf4", "Q4_K", "Q8_0"])
def test_gpu_large_k_in(rng, family, dtype):
    for m, n_out in ((1, 131), (8, 33), (64, 7), (200, 65)):
        w, w64 = gpu_case(rng, family, n_out, BIG_K_IN)
        check_gpu(rng, w, w64, m, dtype, True, f"{family} k_in={BIG_K_IN} m={m}")


def _gpu_kbit_args(w, x_t, bias_t, y_t, m, dtype):
    """The C arguments of kbit_matmul_kbit up to y, for a device kbit weight."""
    n_out, k_in = w.shape
    return [x_t.data_ptr(), m, k_in, n_out, DT_ID[dtype], w.packed.data_ptr(),
            w.absmax.data_ptr(), FMT_ID[w.absmax_format], ctypes.c_float(w.tensor_scale),
            None, w.k, bias_t.data_ptr() if bias_t is not None else None, y_t.data_ptr()]


def workspace_bytes(m, k_in, n_out):
    return int(function("kbit_matmul_workspace_bytes")(m, k_in, n_out))


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_workspace(rng, dtype):
    import torch
    for m, n_out, k_in in ((1, 131, 4096), (8, 7, 1024), (64, 33, 2048), (3, 1, BIG_K_IN)):
        w, w64 = kbit_weight(rng, n_out, k_in, 4, "e4m4")
        wd = to_device(w)
        x = random_x(rng, (m, k_in), dtype)
        bias = random_x(rng, (n_out,), dtype)
        x_t, b_t = cuda_x(x, dtype), cuda_x(bias, dtype)
        y_ref = reference(x, w64, bias, dtype)
        nbytes = workspace_bytes(m, k_in, n_out)
        assert nbytes >= 0
        ws = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        for use_ws in (False, True, True):  # twice: the workspace must come back zeroed
            y_t = poisoned_cuda((m, n_out), dtype)
            args = _gpu_kbit_args(wd, x_t, b_t, y_t, m, dtype)
            ws_args = [ws.data_ptr(), nbytes] if use_ws and nbytes else [None, 0]
            assert function("kbit_matmul_kbit")(*args, *ws_args, stream) == S_OK, \
                lib().kbit_last_error_message()
            torch.cuda.synchronize()
            check_accuracy(from_cuda(y_t, dtype), y_ref, dtype, f"workspace={use_ws} m={m}",
                           magnitude(x, w64, dtype))
            assert int(torch.count_nonzero(ws)) == 0, "the workspace was not left zeroed"


@requires_gpu
@pytest.mark.parametrize("m", [4, 40])  # the GEMV; the GEMM with a split-K workspace
def test_gpu_graph_capture(rng, m):
    import torch
    dtype, n_out, k_in = "float16", 131, 2048
    w, w64 = kbit_weight(rng, n_out, k_in, 3, "e4m4")
    wd = to_device(w)
    x = random_x(rng, (m, k_in), dtype)
    x_t = cuda_x(x, dtype)
    y_t = poisoned_cuda((m, n_out), dtype)
    nbytes = workspace_bytes(m, k_in, n_out)
    ws = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    fn = function("kbit_matmul_kbit")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        assert fn(*_gpu_kbit_args(wd, x_t, None, y_t, m, dtype), ws.data_ptr(), nbytes,
                  side.cuda_stream) == S_OK
    torch.cuda.synchronize()
    y_t.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        status = fn(*_gpu_kbit_args(wd, x_t, None, y_t, m, dtype), ws.data_ptr(), nbytes,
                    torch.cuda.current_stream().cuda_stream)
    assert status == S_OK, lib().kbit_last_error_message()
    torch.cuda.synchronize()
    assert torch.isnan(y_t).all(), "the captured call ran during capture"
    for _ in range(2):  # new x between replays
        x = random_x(rng, (m, k_in), dtype)
        x_t.copy_(cuda_x(x, dtype))
        y_t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_accuracy(from_cuda(y_t, dtype), reference(x, w64, None, dtype), dtype, "graph",
                       magnitude(x, w64, dtype))
        assert int(torch.count_nonzero(ws)) == 0


@requires_gpu
def test_gpu_two_streams(rng):
    import torch
    dtype = "bfloat16"
    cases = []
    for family, n_out, k_in in (("kbit", 131, 4096), ("Q6_K", 33, 8192)):
        w, w64 = gpu_case(rng, family, n_out, k_in)
        x = random_x(rng, (16, k_in), dtype)
        cases.append((to_device(w), w64, x, cuda_x(x, dtype), torch.cuda.Stream()))
    torch.cuda.synchronize()  # the uploads (on the default stream) are done
    outs = []
    for _ in range(3):
        pending = []
        for wd, _, _, x_t, stream in cases:
            with torch.cuda.stream(stream):
                pending.append(kbit.matmul(x_t, wd))  # on each stream's own queue
        torch.cuda.synchronize()
        outs.append([from_cuda(y, dtype) for y in pending])
    for j, (_, w64, x, _, _) in enumerate(cases):
        for run in outs:
            check_accuracy(run[j], reference(x, w64, None, dtype), dtype, f"stream {j}",
                           magnitude(x, w64, dtype))
        assert all(np.array_equal(run[j], outs[0][j]) for run in outs), "not deterministic"


@requires_gpu
def test_gpu_bad_arguments_and_empty_calls(rng):
    import torch
    dtype, m, n_out, k_in = "float16", 3, 5, 64
    w, _ = kbit_weight(rng, n_out, k_in, 4, "fp16")
    wd = to_device(w)
    x_t = cuda_x(random_x(rng, (m, k_in), dtype), dtype)
    ybuf = torch.full((m * n_out + 16,), float("nan"), dtype=torch.float16, device="cuda")
    y_t = ybuf[8:8 + m * n_out]
    fn = function("kbit_matmul_kbit")
    stream = torch.cuda.current_stream().cuda_stream
    base = _gpu_kbit_args(wd, x_t, None, y_t, m, dtype)
    names = ["x", "m", "k_in", "n_out", "dtype", "packed", "absmax", "absmax_format",
             "tensor_scale", "codebook", "k", "bias", "y"]

    def run(**changes):
        args = dict(zip(names, base), **changes)
        return fn(*args.values(), None, 0, stream)

    for changes, want in [(dict(k_in=48), S_INVALID), (dict(dtype=3), S_INVALID),
                          (dict(k=6), S_INVALID), (dict(absmax_format=7), S_INVALID),
                          (dict(tensor_scale=ctypes.c_float(0.0)), S_INVALID),
                          (dict(m=-1), S_INVALID), (dict(x=None), S_NULL),
                          (dict(y=None), S_NULL), (dict(packed=None), S_NULL),
                          (dict(x=base[0] + 1), S_MISALIGNED), (dict(y=base[12] + 1), S_MISALIGNED),
                          (dict(packed=base[5] + 2), S_MISALIGNED)]:
        assert run(**changes) == want, changes
        assert lib().kbit_last_error_message()
    assert run(m=0, x=None, y=None) == S_OK
    assert run(n_out=0) == S_OK
    torch.cuda.synchronize()
    assert torch.isnan(ybuf).all(), "a rejected or empty call wrote y"
    # the other families' entries check their own arguments too
    nf4_w, _ = bnb4_weight(rng, n_out, k_in, "nf4", 64)
    nd = to_device(nf4_w)
    assert function("kbit_matmul_nf4")(x_t.data_ptr(), m, k_in, n_out, 1, nd.packed.data_ptr(),
                                       nd.absmax.data_ptr(), 48, None, y_t.data_ptr(), None, 0,
                                       stream) == S_INVALID
    g, _ = gguf_weight(rng, n_out, 256, "Q4_K")
    gd = to_device(g)
    x256 = cuda_x(random_x(rng, (m, 256), dtype), dtype)
    assert function("kbit_matmul_gguf")(x256.data_ptr(), m, 256, n_out, 1, 99,
                                        gd.blocks.data_ptr(), None, y_t.data_ptr(), None, 0,
                                        stream) == S_INVALID
    torch.cuda.synchronize()
    assert torch.isnan(ybuf).all()


@requires_gpu
def test_gpu_weight_and_x_must_share_a_side(rng):
    w, _ = kbit_weight(rng, 7, 64, 4, "e4m4")
    x = random_x(rng, (2, 64), "float32")
    with pytest.raises(KbitError, match="device"):
        kbit.matmul(cuda(x), w)  # host weight, device x
    with pytest.raises(KbitError, match="device"):
        kbit.matmul(x, to_device(w))  # device weight, host x
    with pytest.raises(KbitError, match="bias"):
        kbit.matmul(cuda(x), to_device(w), random_x(rng, (7,), "float32"))


def test_host_out_of_memory_keeps_its_message(rng):
    """An allocation failure is KBIT_ERROR_INTERNAL with a message (the message buffer
    must not need memory). Run in a forked child whose address space is capped just above
    what it already uses, so the host matmul's scratch cannot be allocated."""
    import multiprocessing
    import resource

    def child(conn):
        k_in, n_out = 1 << 22, 16
        w, _ = kbit_weight(np.random.default_rng(0), n_out, k_in, 4, "e4m4")
        x = np.ones((1, k_in), np.float32)
        y = np.zeros((1, n_out), np.float32)
        fn = function("kbit_matmul_kbit_host")
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), resource.RLIM_INFINITY))
        status = fn(x.ctypes.data, 1, k_in, n_out, 0, w.packed.ctypes.data, w.absmax.ctypes.data,
                    2, ctypes.c_float(w.tensor_scale), None, 4, None, y.ctypes.data)
        conn.send((status, lib().kbit_last_error_message().decode()))

    ctx = multiprocessing.get_context("fork")
    parent, end = ctx.Pipe()
    p = ctx.Process(target=child, args=(end,))
    p.start()
    end.close()  # the child's end: a child that dies without sending is EOF, not a hang
    if not parent.poll(60):
        p.kill()
        pytest.fail(f"the child sent nothing within 60 s (exit code {p.exitcode})")
    try:
        status, message = parent.recv()
    except EOFError:
        pytest.fail(f"the child died before sending (exit code {p.exitcode})")
    p.join(60)
    assert status == 9, (status, message)  # KBIT_ERROR_INTERNAL
    assert "memory" in message


@requires_gpu
def test_gpu_graph_keeps_outgrown_workspaces(rng, monkeypatch):
    """A CUDA graph whose captured calls grow kbit.matmul's workspace (m = 16 asks for the
    GEMM's split-K workspace, larger on a longer row): the outgrown buffer, which the first
    captured call names, stays alive, and replays compute both products."""
    import sys
    import torch
    mod = sys.modules["kbit.matmul"]
    monkeypatch.setattr(mod, "_workspaces", {})
    monkeypatch.setattr(mod, "_outgrown", [])
    dtype, cases = "float16", []
    for n_out, k_in, m in ((131, 4096, 16), (131, 28672, 16)):
        w, w64 = gguf_weight(rng, n_out, k_in, "Q4_0")
        cases.append((to_device(w), w64, cuda_x(random_x(rng, (m, k_in), dtype), dtype)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for wd, _, x_t in cases:
            kbit.matmul(x_t, wd)
    torch.cuda.current_stream().wait_stream(side)
    monkeypatch.setattr(mod, "_workspaces", {})  # the capture allocates them again
    monkeypatch.setattr(mod, "_outgrown", [])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [kbit.matmul(x_t, wd) for wd, _, x_t in cases]
    assert len(mod._outgrown) == 1
    for _ in range(2):
        xs = [random_x(rng, tuple(x_t.shape), dtype) for _, _, x_t in cases]
        for (_, _, x_t), x in zip(cases, xs):
            x_t.copy_(cuda_x(x, dtype))
        graph.replay()
        torch.cuda.synchronize()
        for y_t, (_, w64, _), x in zip(ys, cases, xs):
            check_accuracy(from_cuda(y_t, dtype), reference(x, w64, None, dtype), dtype,
                           "graph with a grown workspace", magnitude(x, w64, dtype))


@requires_gpu
@pytest.mark.parametrize("family, m", [("kbit", 1), ("kbit", 40), ("Q4_K", 3), ("Q6_K", 12)])
def test_gpu_python_matmul_in_a_cuda_graph(rng, family, m):
    """kbit.matmul itself captured in a CUDA graph (the demo does this): its workspace and a
    custom codebook's device copy are made without host copies during the capture, and
    replays follow new x; GGUF through the streamed GEMV on sm_90 (its tensor map is
    encoded on the host and travels as a kernel argument)."""
    import torch
    dtype, n_out, k_in = "float16", 131, 2048
    if family == "kbit":
        cb = np.sort(rng.uniform(-1, 1, 16)).astype(np.float32)
        w, w64 = kbit_weight(rng, n_out, k_in, 4, "e4m4", codebook=cb)
    else:
        w, w64 = gguf_weight(rng, n_out, k_in, family)
    wd = to_device(w)
    x_t = cuda_x(random_x(rng, (m, k_in), dtype), dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kbit.matmul(x_t, wd)  # warm-up outside the capture (as torch's own rule asks)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_t = kbit.matmul(x_t, wd)
    for _ in range(2):
        x = random_x(rng, (m, k_in), dtype)
        x_t.copy_(cuda_x(x, dtype))
        graph.replay()
        torch.cuda.synchronize()
        check_accuracy(from_cuda(y_t, dtype), reference(x, w64, None, dtype), dtype,
                       f"graph m={m}", magnitude(x, w64, dtype))
