"""Every GPU kernel once, at odd sizes and offsets, for `make sanitize` (compute-sanitizer
memcheck, racecheck, initcheck and synccheck over this file): small enough to run under
each tool in a minute or two, and each case checked against the CPU library so that a
run that goes wrong is a failure here too."""
import numpy as np
import pytest

import kbit
from kbit import gguf as kg

from conftest import requires_gpu

pytestmark = requires_gpu


def _torch():
    import torch
    return torch


def _cpu(a):
    torch = _torch()
    if isinstance(a, torch.Tensor):
        if a.dtype == torch.bfloat16:
            return a.view(torch.int16).cpu().numpy().view(np.uint16)
        return a.cpu().numpy()
    return np.asarray(a)


def _gpu(a):
    return _torch().from_numpy(np.ascontiguousarray(a)).cuda()


def _offset_x(rng, n, dtype):
    """n values at an address one element past an allocation's start (unaligned)."""
    torch = _torch()
    base = torch.randn(n + 1, device="cuda", dtype=getattr(torch, dtype))
    return base[1:]


def _assert_matmul(y, a, host_w, bias=None, what=""):
    """y (GPU) against x times the CPU's dequantized W (+ bias) in float64."""
    ref = _cpu(a).astype(np.float64) @ _cpu(host_w).astype(np.float64).T
    if bias is not None:
        ref = ref + _cpu(bias)
    assert np.allclose(_cpu(y).astype(np.float64), ref, rtol=2e-2,
                       atol=2e-2 * np.abs(ref).max()), what


def _tiled_matmul(n_out, k_in, k, ms):
    """kbit.matmul of fp16 x (each m of ms) and a tiled K-bit weight made on the GPU."""
    torch = _torch()
    w = torch.randn(n_out, k_in, device="cuda", dtype=torch.float16)
    t = kbit.tile(kbit.quantize(w, k=k))
    host_w = kbit.dequantize(kbit.untile(t), dtype="float32")
    for m in ms:
        a = torch.randn(m, k_in, device="cuda", dtype=torch.float16)
        _assert_matmul(kbit.matmul(a, t), a, host_w, what=f"m={m}")


@pytest.mark.parametrize("fmt", ["e4m4", "fp16", "fp32"])
@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_kbit_quantize_dequantize(rng, fmt, k):
    x = _offset_x(rng, 1000 + 7 * k, "float16")
    q = kbit.quantize(x, k=k, absmax=fmt)
    host = kbit.quantize(_cpu(x), k=k, absmax=fmt, tensor_scale=q.tensor_scale)
    assert np.array_equal(_cpu(q.packed), host.packed)
    y = kbit.dequantize(q, dtype="bfloat16")
    assert np.array_equal(_cpu(y), kbit.dequantize(host, dtype="bfloat16"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kbit_types_weighted_and_books(rng, dtype):
    x = _offset_x(rng, 4099, dtype)
    w = _torch().rand(4099, device="cuda")
    q = kbit.quantize(x, k=3, importance=w, codebook="nf0")
    host = kbit.quantize(_cpu(x), k=3, importance=_cpu(w), codebook="nf0", dtype=dtype,
                         tensor_scale=q.tensor_scale)
    assert np.array_equal(_cpu(q.absmax), host.absmax)
    book = kbit.fit_codebook(x, 4, importance=w)
    assert np.array_equal(book, kbit.fit_codebook(_cpu(x), 4, importance=_cpu(w), dtype=dtype))


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bnb4(rng, quant_type):
    x = _offset_x(rng, 3 * 256 + 77, "float16")
    q = kbit.quantize_4bit(x, quant_type=quant_type, blocksize=64, compress_statistics=True)
    host = kbit.quantize_4bit(_cpu(x), quant_type=quant_type, blocksize=64,
                              compress_statistics=True)
    assert np.array_equal(_cpu(q.packed), host.packed)
    assert np.array_equal(_cpu(kbit.dequantize_4bit(q)), kbit.dequantize_4bit(host))
    plain = kbit.quantize_4bit(x, quant_type=quant_type, blocksize=128)
    assert np.array_equal(_cpu(kbit.dequantize_4bit(plain, dtype="float32")),
                          kbit.dequantize_4bit(kbit.quantize_4bit(_cpu(x), quant_type=quant_type,
                                                                  blocksize=128), dtype="float32"))


@pytest.mark.parametrize("qtype", list(kg.GGML_TYPES))
def test_gguf(rng, qtype):
    from test_gguf import _quant_tensor
    raw = _quant_tensor(rng, qtype, (3, 256))
    t = kg.GGUFTensor(_gpu(raw.reshape(-1)), kg.GGML_TYPES[qtype], (3, 256))
    want = kg.dequantize(kg.GGUFTensor(raw.reshape(-1), kg.GGML_TYPES[qtype], (3, 256)),
                         dtype="float32")
    assert np.array_equal(_cpu(kg.dequantize(t, dtype="float32")), want)
    a = _torch().randn(5, 256, device="cuda")
    y = kbit.matmul(a, t)
    ref = _cpu(a).astype(np.float64) @ want.astype(np.float64).T
    assert np.allclose(_cpu(y), ref, rtol=1e-3, atol=1e-3 * np.abs(ref).max())


def _gguf_matmul(rng, qtype, n_out, k_in, m):
    """kbit.matmul of fp16 x and GGUF blocks on the GPU against the CPU's dequantized W."""
    from test_matmul import gguf_blocks  # scales that keep fp16 x and y in range
    raw = gguf_blocks(rng, qtype, n_out, k_in)
    shape, tid = (n_out, k_in), kg.GGML_TYPES[qtype]
    t = kg.GGUFTensor(_gpu(raw.reshape(-1)), tid, shape)
    want = kg.dequantize(kg.GGUFTensor(raw.reshape(-1), tid, shape), dtype="float32")
    a = _torch().randn(m, k_in, device="cuda", dtype=_torch().float16)
    _assert_matmul(kbit.matmul(a, t), a, want)


@pytest.mark.parametrize("m", [3, 13])
@pytest.mark.parametrize("qtype", list(kg.GGML_TYPES))
def test_gguf_streamed(rng, qtype, m):
    """The streamed GGUF GEMV (sm_90, fp16 x, m <= 16): 20 rows (a partial tile), 2048
    elements of k (one stage), one n8 tile of x (m = 3) and two (13)."""
    _gguf_matmul(rng, qtype, 20, 2048, m)


@pytest.mark.parametrize("m", [20, 40])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q5_K"])
def test_gguf_gemm_small_m(rng, qtype, m):
    """The GGUF GEMM at 32 rows of x a CTA (m = 20) and 64 (m = 40):
    2200 rows (the last CTA's 24), 2304 elements of k (nine stages)."""
    _gguf_matmul(rng, qtype, 2200, 2304, m)


@pytest.mark.parametrize("qtype", list(kg.GGML_TYPES))
def test_gguf_gemm(rng, qtype):
    """The GGUF GEMM (sm_90) at 128 rows of x a CTA: 131 rows (two CTAs of 128, the
    second 3 rows), 2048 elements of k (eight stages; Q6_K's blocks at every even offset
    of a box), m = 70 (a partial tile of x), split k through kbit.matmul's workspace."""
    _gguf_matmul(rng, qtype, 131, 2048, 70)


@pytest.mark.parametrize("n_out", [7700, 8900])
def test_gguf_streamed_groups_gemv(rng, n_out):
    """Four-tile stages with one n8 tile of x (n_out x 5120 at m = 8: x too large to hold
    for the whole kernel): 7700 rows, 121 groups, the last of two tiles; 8900 rows, 140
    groups dealt round-robin over the SMs (on 132 SMs the first eight CTAs take a second
    group), the last of one tile."""
    _gguf_matmul(rng, "Q4_K", n_out, 5120, 8)


@pytest.mark.parametrize("qtype, k_in, ms", [("Q4_K", 8448, (1, 4)), ("Q5_K", 8448, (3,)),
                                             ("Q8_0", 8448, (1, 4)), ("Q6_K", 10240, (1, 3))])
def test_gguf_streamed_resident_x_pieces(rng, qtype, k_in, ms):
    """The GGUF stream's resident x, which arrives a piece with each stage of a CTA's first
    group of row tiles and is read again by its later groups: 6400 rows (400 row tiles,
    three or more a CTA on 132 SMs), rows of several stages, the last one short, so that x
    comes in several pieces, the ring wrapping inside the first group."""
    for m in ms:
        _gguf_matmul(rng, qtype, 6400, k_in, m)


def test_gguf_streamed_means(rng):
    """Q4_K's mins against x's sub-block means in the streamed GEMV (six row tiles a CTA
    or more, x resident): each lane keeps its means in the CTA's first tile group and
    reads them back in the later ones; one, three and eight rows of x (lanes past x's
    rows read another's means)."""
    from test_matmul import means_rows
    for m in (1, 3, 8):
        _gguf_matmul(rng, "Q4_K", means_rows(), 2304, m)


@pytest.mark.parametrize("n_out, k_in, m", [(24, 6144, 7), (8500, 256, 2)])
def test_streamed_x_paths(rng, n_out, k_in, m):
    """The streamed GEMVs (tiled kbit, GGUF) with x copied with each stage (7 rows of 6144
    elements exceed what they hold for the whole kernel) and with x held in shared memory
    for the whole kernel (8500 rows: three row tiles or more a CTA)."""
    torch = _torch()
    w = torch.randn(n_out, k_in, device="cuda", dtype=torch.float16)
    t = kbit.tile(kbit.quantize(w, k=4))
    from test_matmul import gguf_blocks
    raw = gguf_blocks(rng, "Q4_K", n_out, k_in)
    shape, q4k = (n_out, k_in), kg.GGML_TYPES["Q4_K"]
    g = kg.GGUFTensor(_gpu(raw.reshape(-1)), q4k, shape)
    a = torch.randn(m, k_in, device="cuda", dtype=torch.float16)
    for wq, host_w in ((t, kbit.dequantize(kbit.untile(t), dtype="float32")),
                       (g, kg.dequantize(kg.GGUFTensor(raw.reshape(-1), q4k, shape),
                                         dtype="float32"))):
        _assert_matmul(kbit.matmul(a, wq), a, host_w)


@pytest.mark.parametrize("k", [2, 3])
def test_streamed_two_units_a_warp(rng, k):
    """The streamed tiled GEMV taking two units a warp a stage (K = 2 and 3 on rows of 128
    groups or more): 16416 elements, 129 groups, a last stage of one unit whose group has
    one chunk."""
    _tiled_matmul(24, 16416, k, (3,))


@pytest.mark.parametrize("n_out", [6400, 4400])
def test_streamed_two_tiles_a_stage(rng, n_out):
    """K = 2: two row tiles a stage (rows of 33 groups, the last of one chunk), with x
    resident (6400 rows: 400 row tiles, three or four a CTA, a CTA's odd last tile alone)
    and with x copied with each stage (4400 rows: two or three a CTA), m = 1 and 3."""
    _tiled_matmul(n_out, 4128, 2, (1, 3))


def test_gemm_even_walk(rng):
    """The persistent GEMMs' even walk (70 tiles of 128 rows on 132 CTAs: each CTA a run of
    about 51 of the tiled GEMM's 96 stages a tile at m = 64, or 25 of the GGUF GEMM's 48 at
    m = 20; a tile in two or three pieces, the first adding the others' partial sums)."""
    _gguf_matmul(rng, "Q4_K", 8960, 12288, 20)
    _tiled_matmul(8960, 12288, 4, (64,))


def test_streamed_two_tiles_k3(rng):
    """K = 3: two row tiles a stage where x, copied with each stage, outweighs W more than
    twice (m = 8; 4400 rows: two or three row tiles a CTA; rows of 33 groups, the last of
    one chunk)."""
    _tiled_matmul(4400, 4128, 3, (8,))


@pytest.mark.parametrize("m", [1, 8])
def test_streamed_quad_tables(rng, m):
    """K = 2's quad table (40x53280: 27 stages a CTA) in 32 copies (m = 1) and in 16 (m = 8:
    x copied with each stage, where 32 would leave less than a ring of two)."""
    _tiled_matmul(40, 53280, 2, (m,))


def _weights(rng):
    torch = _torch()
    w = torch.randn(40, 512, device="cuda", dtype=torch.float16)
    q = kbit.quantize(w, k=4)
    return w, {"kbit": q, "tiled": kbit.tile(q),
               "nf4": kbit.quantize_nf4(w, blocksize=64, compress_statistics=True),
               "fp4": kbit.quantize_fp4(w, blocksize=256)}


@pytest.mark.parametrize("m", [1, 7, 13, 20, 33, 100])
def test_matmul_paths(rng, m):
    """m = 1 and 7: the GEMV with one n8 tile, 13: two tiles; 20 and 33: the tensor-core
    GEMM, on sm_90 the streamed one (32 and 64 rows of x a CTA; FP4 with 2 scales a row
    the wgmma one); 100: the wgmma GEMM with 128 rows of x."""
    torch = _torch()
    w, weights = _weights(rng)
    a = torch.randn(m, 512, device="cuda", dtype=torch.float16)
    bias = torch.randn(40, device="cuda", dtype=torch.float16)
    for name, wq in weights.items():
        y = kbit.matmul(a, wq, bias)
        host_w = {"kbit": lambda: kbit.dequantize(wq, dtype="float32"),
                  "tiled": lambda: kbit.dequantize(kbit.untile(wq), dtype="float32"),
                  "nf4": lambda: kbit.dequantize_4bit(wq, dtype="float32"),
                  "fp4": lambda: kbit.dequantize_4bit(wq, dtype="float32")}[name]()
        _assert_matmul(y, a, host_w, bias, name)


@pytest.mark.parametrize("m", [12, 24, 300])
def test_tiled_gemm_wide(rng, m):
    """The tiled GEMM on sm_90 where only a large weight takes it: m = 12 from 8192 rows
    of W (16 rows of x, two CTAs an SM), m = 24 (32 rows of x: two CTAs an SM, its 66 row
    tiles half the SMs), m = 300 with 66 row tiles of 128 (256 rows of x a CTA, the
    producer's registers given to the consumers)."""
    _tiled_matmul(8448, 256, 4, (m,))


@pytest.mark.parametrize("k", [2, 3, 5])
def test_tiled_gemm_decoders(rng, k):
    """The tiled GEMM's other decoders: K = 2's quad table (m = 20: 32 rows of x a CTA)
    and pair table (m = 40: 64 rows), K = 3 and 5's half segments in 8-byte loads."""
    _tiled_matmul(300, 512, k, (20, 40))


def test_tile_untile(rng):
    _, weights = _weights(rng)
    back = kbit.untile(weights["tiled"])
    assert _torch().equal(back.packed, weights["kbit"].packed)
    assert _torch().equal(back.absmax, weights["kbit"].absmax)
