"""GGUF Q4_0 as kbit K = 4 (kbit_gguf_to_kbit, kbit.gguf.to_kbit): the conversion is exact
(the kbit weight dequantizes to the Q4_0 values bit for bit, its scales are the blocks'
fp16 d), kbit.tile takes a Q4_0 tensor and its matmul computes what the GGUF one does;
other types and bad arguments are refused with nothing written; the GPU writes the
host's bytes and its matmul kernels stay within the accuracy bounds."""
import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import quantize as gguf_quantize

import kbit
from kbit import gguf as kg
from kbit._lib import function
from kbit.reference.kbit import pack_bitplanes
from conftest import requires_gpu
from test_gguf import random_blocks
from test_matmul import (check_accuracy, cuda_x, from_cuda, magnitude, random_x, reference)

Q4_0 = 2
FMT = {"fp32": 0, "fp16": 1, "e4m4": 2}
S_OK, S_INVALID, S_NULL, S_MISALIGNED = 0, 1, 2, 3


def q4_0_tensor(rng, shape, finite=True, real=False):
    """A Q4_0 GGUFTensor of `shape`: random block bytes (fp16 scales over many magnitudes,
    zeros, subnormals and negatives; finite=False: NaN and inf too), or (real=True) the
    gguf package's quantization of normal weights."""
    n_out, k_in = shape
    if real:
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        raw = gguf_quantize(w, GT.Q4_0)
    else:
        raw = random_blocks(rng, "Q4_0", n_out * k_in // 32, finite)
    return kg.GGUFTensor(np.ascontiguousarray(raw).reshape(-1), Q4_0, shape)


def codes_of(raw):
    """The 32 nibbles of each Q4_0 block (element i < 16: low nibble of qs[i], else the
    high nibble of qs[i - 16])."""
    qs = raw.reshape(-1, 18)[:, 2:]
    return np.concatenate([qs & 15, qs >> 4], axis=1)


@pytest.mark.parametrize("absmax", ["fp16", "fp32"])
@pytest.mark.parametrize("finite", [True, False])
def test_q4_0_to_kbit_is_exact(rng, absmax, finite):
    """Codes are the nibbles in bit planes, scales the fp16 d (its bits, or widened), the
    codebook c - 8; kbit.dequantize gives the Q4_0 float32 values bit for bit (NaN where
    ggml has NaN)."""
    t = q4_0_tensor(rng, (7, 96), finite)
    q = kg.to_kbit(t, absmax)
    assert (q.k, q.absmax_format, q.tensor_scale, q.shape) == (4, absmax, 1.0, (7, 96))
    assert np.array_equal(q.codebook, np.arange(-8, 8, dtype=np.float32))
    assert np.array_equal(q.packed, pack_bitplanes(codes_of(t.blocks), 4))
    d = t.blocks.reshape(-1, 18)[:, :2].copy().view(np.float16).reshape(-1)
    if absmax == "fp16":
        assert np.array_equal(np.asarray(q.absmax).view(np.uint16), d.view(np.uint16))
    else:  # widened; a NaN as 0x7FFFFFFF, on the host and the GPU alike
        assert np.array_equal(q.absmax, d.astype(np.float32), equal_nan=True)
        assert np.all(np.asarray(q.absmax).view(np.uint32)[np.isnan(d)] == 0x7FFFFFFF)
    want = kg.dequantize(t, dtype="float32")
    assert np.array_equal(kbit.dequantize(q, dtype="float32"), want, equal_nan=not finite)


@pytest.mark.parametrize("shape", [(5, 64), (33, 4096), (130, 160)])
def test_q4_0_tiles_and_multiplies_as_gguf(rng, shape):
    """kbit.tile of a Q4_0 tensor (the gguf package's quantization of normal weights):
    a TiledTensor that untiles to to_kbit's weight, whose matmul is within the bounds of
    the Q4_0 values, as the GGUF weight's own matmul."""
    t = q4_0_tensor(rng, shape, real=True)
    tiled = kbit.tile(t)
    assert isinstance(tiled, kbit.TiledTensor) and tiled.absmax_format == "fp16"
    back, q = kbit.untile(tiled), kg.to_kbit(t)
    assert np.array_equal(back.packed, q.packed) and np.array_equal(back.absmax, q.absmax)
    w64 = kg.dequantize(t, dtype="float32").astype(np.float64)
    bias = rng.standard_normal(shape[0]).astype(np.float32)
    for m in (1, 3, 20):
        x = random_x(rng, (m, shape[1]), "float32")
        y_ref = reference(x, w64, bias, "float32")
        scale = magnitude(x, w64, "float32")
        for w, what in ((tiled, "tiled"), (t, "gguf")):
            check_accuracy(kbit.matmul(x, w, bias), y_ref, "float32", f"Q4_0 {what} m={m}",
                           scale)


def test_to_kbit_refuses_bad_arguments(rng):
    """kbit_gguf_to_kbit_host: other ggml types, n not a multiple of 32 or negative, E4M4
    scales, NULL and misaligned pointers get a status and nothing written; to_kbit and
    tile refuse what has no kbit form."""
    n = 64
    raw = random_blocks(rng, "Q4_0", n // 32).reshape(-1)
    words = np.full(8, 7, np.uint32)
    scales = np.full(2, 7, np.float32)
    halves = np.full(2, 7, np.float16)
    fn = function("kbit_gguf_to_kbit_host")
    raw_odd = np.zeros(2 * raw.size + 4, np.uint8)
    odd_blocks = raw_odd[1:1 + raw.size]
    odd_blocks[:] = raw
    packed_off = np.zeros(64, np.uint8)
    packed_off_at = packed_off.ctypes.data + (-packed_off.ctypes.data % 4) + 2
    halves_raw = np.zeros(16, np.uint8)
    halves_odd_at = halves_raw.ctypes.data + (-halves_raw.ctypes.data % 2) + 1
    blk, out32, out16 = raw.ctypes.data, words.ctypes.data, scales.ctypes.data
    cases = [((12, blk, n, FMT["fp32"], out32, out16), S_INVALID),
             ((14, blk, n, FMT["fp16"], out32, halves.ctypes.data), S_INVALID),
             ((Q4_0, blk, 48, FMT["fp32"], out32, out16), S_INVALID),
             ((Q4_0, blk, -32, FMT["fp32"], out32, out16), S_INVALID),
             ((Q4_0, blk, n, FMT["e4m4"], out32, out16), S_INVALID),
             ((Q4_0, None, n, FMT["fp32"], out32, out16), S_NULL),
             ((Q4_0, blk, n, FMT["fp32"], None, out16), S_NULL),
             ((Q4_0, blk, n, FMT["fp16"], out32, None), S_NULL),
             ((Q4_0, odd_blocks.ctypes.data, n, FMT["fp32"], out32, out16), S_MISALIGNED),
             ((Q4_0, blk, n, FMT["fp32"], packed_off_at, out16), S_MISALIGNED),
             ((Q4_0, blk, n, FMT["fp16"], out32, halves_odd_at), S_MISALIGNED)]
    for args, status in cases:
        assert fn(*args) == status, args
    assert np.all(words == 7) and np.all(scales == 7) and np.all(halves == 7)
    assert fn(*cases[0][0]) == S_INVALID
    assert b"only Q4_0" in function("kbit_last_error_message")()
    assert fn(*cases[6][0]) == S_NULL
    assert b"kbit_packed" in function("kbit_last_error_message")()
    assert not packed_off.any() and not halves_raw.any()
    assert fn(Q4_0, None, 0, FMT["fp32"], None, None) == S_OK  # n = 0: nothing to do
    assert fn(Q4_0, blk, n, FMT["fp16"], out32, halves.ctypes.data) == S_OK
    d_bits = raw.reshape(-1, 18)[:, :2].copy().view(np.uint16)[:, 0]
    assert np.array_equal(halves.view(np.uint16), d_bits)
    assert np.array_equal(words, pack_bitplanes(codes_of(raw), 4))
    q4_k = kg.GGUFTensor(np.zeros(144, np.uint8), 12, (1, 256))
    with pytest.raises(kbit.KbitError, match="only Q4_0"):
        kg.to_kbit(q4_k)
    with pytest.raises(kbit.KbitError, match="only Q4_0"):
        kbit.tile(q4_k)
    with pytest.raises(kbit.KbitError, match="absmax"):
        kg.to_kbit(q4_0_tensor(rng, (1, 32)), "e4m4")
    with pytest.raises(kbit.KbitError, match="GGUFTensor"):
        kg.to_kbit(np.zeros(18, np.uint8))
    with pytest.raises(kbit.KbitError, match="bytes"):
        kg.to_kbit(kg.GGUFTensor(np.zeros(17, np.uint8), Q4_0, (1, 32)))


@requires_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_q4_0_to_kbit_and_matmul(rng, dtype):
    """On the GPU: to_kbit and tile write the host's bytes; the tiled matmul (the GEMVs and
    the GEMMs) is within the bounds of the Q4_0 values."""
    import torch
    # random blocks (NaN, inf, zero and subnormal scales, -0.0 among them): the same bits
    t = q4_0_tensor(rng, (33, 256), finite=False)
    t_gpu = kg.GGUFTensor(torch.from_numpy(t.blocks).cuda(), Q4_0, t.shape)
    for absmax, bits in (("fp16", np.uint16), ("fp32", np.uint32)):
        q, q_gpu = kg.to_kbit(t, absmax), kg.to_kbit(t_gpu, absmax)
        torch.cuda.synchronize()
        assert np.array_equal(q_gpu.packed.cpu().numpy().view(np.uint32), q.packed)
        got = q_gpu.absmax.cpu().numpy().view(bits)
        assert np.array_equal(got, np.asarray(q.absmax).view(bits))
    for shape in ((272, 1024), (40, 4096)):
        t = q4_0_tensor(rng, shape, real=True)
        t_gpu = kg.GGUFTensor(torch.from_numpy(t.blocks).cuda(), Q4_0, shape)
        tiled, tiled_gpu = kbit.tile(t), kbit.tile(t_gpu)
        torch.cuda.synchronize()
        assert np.array_equal(tiled_gpu.packed.cpu().numpy(), tiled.packed)
        assert np.array_equal(tiled_gpu.absmax.cpu().numpy(), tiled.absmax)
        w64 = kg.dequantize(t, dtype="float32").astype(np.float64)
        for m in (1, 4, 8, 16, 33, 300):
            x = random_x(rng, (m, shape[1]), dtype)
            y = from_cuda(kbit.matmul(cuda_x(x, dtype), tiled_gpu), dtype)
            check_accuracy(y, reference(x, w64, None, dtype), dtype, f"Q4_0 tiled m={m}",
                           magnitude(x, w64, dtype))
