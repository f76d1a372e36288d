"""GGUF blocks and files under adversarial inputs: fp16 scale fields that are zero,
subnormal, huge, infinite or NaN, every 6-bit scale/min packing corner, signed Q6_K
scale extremes, rounding ties of the fp16/bf16 outputs, and GGUF files with every
alignment, odd shapes and unsupported types, and corrupt headers. The `gguf` package is
the ground truth."""
import signal
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as _gguf_dequantize

from kbit import gguf as kg
from kbit._lib import KbitError
from kbit.reference import gguf as rg
from kbit.reference.kbit import float32_to_bf16_bits
from test_gguf import add_tensors

TYPES = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
DTYPES = ["float32", "float16", "bfloat16"]
NP_OUT = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
# byte offsets of each format's fp16 fields (d, and dmin for Q4_K/Q5_K)
HALF_FIELDS = {"Q4_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
# +-0, +-smallest and +-largest subnormal, smallest normal, +-65504, +-inf, quiet and
# signalling NaNs of both signs, and ordinary values
SPECIAL_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF,
                           0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0xFC01, 0xFFFF,
                           0x7D55, 0x3C00, 0xBC00, 0x3C01, 0x5BFF, 0x7000, 0x0200, 0x1400],
                          np.uint16)
# the NaN every kbit output type gets (csrc/core/numeric.h): the GPU's canonical NaN
CANONICAL_NAN = {"float32": 0x7FFFFFFF, "float16": 0x7FFF, "bfloat16": 0x7FFF}


def gguf_dequantize(raw, qtype):
    with np.errstate(invalid="ignore", over="ignore"):
        return _gguf_dequantize(np.asarray(raw), GT[qtype]).reshape(-1).astype(np.float32)


def rounded(ref32, dtype):
    """float32 values rounded to the output type, nearest even."""
    if dtype == "float32":
        return ref32
    if dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):
            return ref32.astype(np.float16)
    return float32_to_bf16_bits(ref32)


def nan_mask(a, dtype):
    if dtype == "bfloat16":
        return (a & 0x7FFF) > 0x7F80
    return np.isnan(a)


def bits(a, dtype):
    return a if dtype == "bfloat16" else a.view(np.uint32 if dtype == "float32" else np.uint16)


def assert_matches_gguf(got, want32, dtype):
    """got (kbit output of `dtype`) equals the gguf package's float32 values rounded to
    dtype, bit for bit; NaN in the same places, and kbit's NaNs are canonical."""
    got = np.asarray(got).reshape(-1)
    want = rounded(want32.reshape(-1), dtype)
    assert got.dtype == NP_OUT[dtype] and got.shape == want.shape
    gnan, wnan = nan_mask(got, dtype), nan_mask(want, dtype)
    np.testing.assert_array_equal(gnan, wnan, err_msg="NaN positions differ")
    gb, wb = bits(got, dtype), bits(want, dtype)
    mism = np.flatnonzero((gb != wb) & ~wnan)
    assert mism.size == 0, (f"{mism.size} mismatches, first at {mism[0]}: got "
                            f"{got[mism[0]]!r} want {want[mism[0]]!r} "
                            f"(from float32 {want32.reshape(-1)[mism[0]]!r})")
    assert np.all(gb[gnan] == CANONICAL_NAN[dtype]), "non-canonical NaN bits"


def check_all(raw, qtype):
    """The numpy reference and the CPU library, every output type, against gguf."""
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    want = gguf_dequantize(raw, qtype)
    ref = rg.dequantize_gguf(raw, qtype)
    np.testing.assert_array_equal(np.isnan(ref), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(ref.view(np.uint32)[ok], want.view(np.uint32)[ok])
    n = raw.size // rg.GGML_BLOCK_INFO[qtype][1] * elems
    for dtype in DTYPES:
        assert_matches_gguf(kg.dequantize(raw, qtype, n, dtype), want, dtype)


def blocks_with_halves(rng, qtype, n_blocks, halves):
    """Random blocks whose fp16 fields are drawn from `halves` (uint16 bit patterns)."""
    _, nbytes = rg.GGML_BLOCK_INFO[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        h = rng.choice(halves, n_blocks).astype(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


# ---- block values ------------------------------------------------------------------

@pytest.mark.parametrize("qtype", TYPES)
def test_special_fp16_scales(rng, qtype):
    # every fp16 field +-0, subnormal, +-65504, +-inf or NaN, every combination of d and
    # dmin among them, then arbitrary bit patterns
    raw = blocks_with_halves(rng, qtype, 2000, SPECIAL_HALVES)
    check_all(raw, qtype)
    raw = blocks_with_halves(rng, qtype, 500, np.arange(1 << 16))
    check_all(raw, qtype)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_every_fp16_scale_and_code(qtype):
    # exhaustive: all 65536 scales times all codes, so every product the format can
    # hold goes through the fp16 and bf16 output rounding (ties included)
    elems, nbytes = rg.GGML_BLOCK_INFO[qtype]
    per = 16 if qtype == "Q4_0" else 8     # blocks per scale to cover every code byte
    raw = np.zeros((1 << 16, per, nbytes), np.uint8)
    raw[:, :, 0:2] = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16) \
        .view(np.uint8).reshape(-1, 1, 2)
    raw[:, :, 2:] = np.arange(256, dtype=np.uint8).reshape(1, per, nbytes - 2)
    check_all(raw.reshape(-1, nbytes), qtype)


def _pack_scale_min_k4(sc, mn):
    """(nb, 8) 6-bit scales and mins -> ggml's 12 packed bytes (as ggml's quantizer)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    for j in range(8):
        ls, lm = sc[:, j].astype(np.uint8), mn[:, j].astype(np.uint8)
        if j < 4:
            out[:, j] |= ls
            out[:, j + 4] |= lm
        else:
            out[:, j + 4] = (ls & 15) | ((lm & 15) << 4)
            out[:, j - 4] |= (ls >> 4) << 6
            out[:, j] |= (lm >> 4) << 6
    return out


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_k_scale_min_packing_corners(rng, qtype):
    _, nbytes = rg.GGML_BLOCK_INFO[qtype]
    corners = np.array([0, 63, 1, 62, 15, 16, 31, 32, 47, 48])
    nb = 1200
    sc = rng.choice(corners, size=(nb, 8))
    mn = rng.choice(corners, size=(nb, 8))
    sc[:16], mn[:16] = 63, 63
    sc[16:32], mn[16:32] = 0, 0
    sc[32:40], mn[32:40] = 63 * np.eye(8, dtype=int), 0          # one 63 per sub-block
    sc[40:48], mn[40:48] = 0, 63 * np.eye(8, dtype=int)
    sc[48:56], mn[48:56] = 63 - 63 * np.eye(8, dtype=int), 63 * np.eye(8, dtype=int)
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    raw[:, 4:16] = _pack_scale_min_k4(sc, mn)
    sc_got, mn_got = rg.unpack_scale_min_k4(raw[:, 4:16])
    np.testing.assert_array_equal(sc_got, sc)
    np.testing.assert_array_equal(mn_got, mn)
    # with d = 1, dmin = 0 and every code 1 an element is its sub-block's scale; with
    # d = 0, dmin = 1 it is minus the min
    one = np.array([0x3C00], np.uint16).view(np.uint8)
    unit = raw.copy()
    unit[:, nbytes - 128:] = 0x11
    if qtype == "Q5_K":
        unit[:, 16:48] = 0
    for d_off, want in ((0, sc), (2, -mn)):
        unit[:, 0:4] = 0
        unit[:, d_off:d_off + 2] = one
        got = kg.dequantize(unit, qtype, nb * 256, "float32").reshape(nb, 8, 32)
        np.testing.assert_array_equal(got, np.broadcast_to(want[:, :, None], got.shape))
    # and against gguf with scales of every kind
    for off in HALF_FIELDS[qtype]:
        h = np.where(rng.random(nb) < 0.5, rng.choice(SPECIAL_HALVES, nb),
                     rng.integers(0, 1 << 16, nb)).astype(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    check_all(raw, qtype)


def test_q6_k_signed_scale_extremes(rng):
    nb = 1500
    raw = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
    extremes = np.array([-128, 127, -127, -1, 0, 1], np.int8)
    raw[:, 192:208] = rng.choice(extremes, size=(nb, 16)).view(np.uint8)
    raw[:8, 192:208] = 0x80
    raw[8:16, 192:208] = 0x7F
    h = np.where(rng.random(nb) < 0.5, rng.choice(SPECIAL_HALVES, nb),
                 rng.integers(0, 1 << 16, nb)).astype(np.uint16)
    raw[:, 208:210] = h.view(np.uint8).reshape(nb, 2)
    check_all(raw, "Q6_K")
    # d = 1, scale -128: code 0 is (0 - 32) * -128, code 63 is 31 * -128
    blk = np.zeros((1, 210), np.uint8)
    blk[0, 192:208] = 0x80
    blk[0, 208:210] = np.array([0x3C00], np.uint16).view(np.uint8)
    assert np.all(kg.dequantize(blk, "Q6_K", 256, "float32") == 4096.0)
    blk[0, :192] = 0xFF
    assert np.all(kg.dequantize(blk, "Q6_K", 256, "float32") == -3968.0)


@pytest.mark.parametrize("qtype", TYPES)
def test_rounding_ties(rng, qtype):
    # scales of few significant bits make many float32 results fall exactly half way
    # between two fp16 or bf16 values: both must round to even, as numpy does
    nice = np.array([2.0 ** k for k in range(-24, 16)] + [3 * 2.0 ** k for k in range(-24, 14)]
                    + [1.5, 0.75, 1 + 2 ** -10, 1 + 2 ** -9, 1 + 2 ** -8, 1 + 3 * 2 ** -8,
                       65504.0], np.float64)
    halves = np.concatenate([nice, -nice]).astype(np.float16).view(np.uint16)
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    raw = blocks_with_halves(rng, qtype, 40000 if elems == 32 else 5000, halves)
    want = gguf_dequantize(raw, qtype)
    fin = want[np.isfinite(want) & (np.abs(want) >= 2.0 ** -14)].view(np.uint32)
    assert np.count_nonzero((fin & 0x1FFF) == 0x1000) > 100   # fp16 ties (normal range)
    assert np.count_nonzero((fin & 0xFFFF) == 0x8000) > 100   # bf16 ties
    check_all(raw, qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_many_blocks_across_threads(rng, qtype):
    # several host threads' worth of blocks (2^21 elements each) plus an odd remainder
    elems, _ = rg.GGML_BLOCK_INFO[qtype]
    n_blocks = 3 * ((1 << 21) // elems) + 13
    check_all(blocks_with_halves(rng, qtype, n_blocks, np.arange(1 << 16)), qtype)


def test_host_blocks_at_odd_address(rng):
    # raw GGUF bytes need not be 2-byte aligned in a numpy buffer; the wrapper copies
    raw = blocks_with_halves(rng, "Q6_K", 5, SPECIAL_HALVES).reshape(-1)
    buf = np.zeros(raw.size + 2, np.uint8)
    start = 1 if buf.ctypes.data % 2 == 0 else 0
    view = buf[start:start + raw.size]
    view[:] = raw
    assert view.ctypes.data % 2 == 1
    for dtype in DTYPES:
        assert_matches_gguf(kg.dequantize(view, "Q6_K", 5 * 256, dtype),
                            gguf_dequantize(raw, "Q6_K"), dtype)


def test_reference_takes_numpy_type_ids(rng):
    # GGUFReader fields hold ggml type ids as numpy integers
    raw = blocks_with_halves(rng, "Q4_K", 3, SPECIAL_HALVES)
    want = rg.dequantize_gguf(raw, "Q4_K")
    for tid in (12, GT.Q4_K, np.uint32(12), np.int64(12)):
        np.testing.assert_array_equal(rg.dequantize_gguf(raw, tid).view(np.uint32),
                                      want.view(np.uint32))
    with pytest.raises(ValueError):
        rg.dequantize_gguf(raw, np.uint32(10))


# ---- files -------------------------------------------------------------------------

def _quant_bytes(rng, qtype, shape):
    """Random blocks of a tensor of numpy `shape`, as GGUFWriter takes them."""
    elems, nbytes = rg.GGML_BLOCK_INFO[qtype]
    n_blocks = int(np.prod(shape)) // elems
    raw = blocks_with_halves(rng, qtype, n_blocks, SPECIAL_HALVES)
    return raw.reshape(*shape[:-1], shape[-1] // elems * nbytes)


FILE_TENSORS = {  # name: (type, numpy shape); odd shapes, several of each type
    "t.q4_0": ("Q4_0", (3, 5, 96)), "t.q8_0": ("Q8_0", (1, 32)),
    "t.q4_k": ("Q4_K", (7, 768)), "t.q5_k": ("Q5_K", (256,)),
    "t.q6_k": ("Q6_K", (2, 1, 3, 512)), "t.f32": ("F32", (3, 7, 1)),
    "t.f16": ("F16", (5,)), "t.bf16": ("BF16", (1, 9)), "t.scalar": ("F32", ()),
    "t.empty": ("Q8_0", (0, 64)), "t.q4_0b": ("Q4_0", (32,)), "t.f32b": ("F32", (1,)),
    "t.q6_kb": ("Q6_K", (1, 256)),
}


def _write(path, rng, tensors, alignment=None, extra=(), note="xxx"):
    w = gguf.GGUFWriter(str(path), "kbit-adversarial")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_string("kbit.note", note)      # its length moves the start of the tensor data
    add_tensors(w, rng, tensors, _quant_bytes)
    for name, arr, qt in extra:
        w.add_tensor(name, arr, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _check_header_against_reader(path):
    """kbit's own header reader against GGUFReader: every metadata key and value, the
    alignment, and each tensor's name, type, shape, offset and bytes."""
    reader = gguf.GGUFReader(str(path))
    head = kg.read_header(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(head.metadata) == list(fields)
    for key, field in fields.items():
        want, got = field.contents(), head.metadata[key]
        if isinstance(got, np.ndarray):
            assert got.dtype == np.asarray(field.parts[field.data[0]]).dtype, key
            got = got.tolist()
        elif isinstance(got, list) and got and isinstance(got[0], np.ndarray):
            got = [v for a in got for v in a.tolist()]  # gguf flattens nested arrays
        assert got == want or (got != got and want != want), key
    assert head.alignment == reader.alignment
    assert [t.name for t in head.tensors] == [t.name for t in reader.tensors]
    for mine, theirs in zip(head.tensors, reader.tensors):
        assert mine.type_id == int(theirs.tensor_type), mine.name
        assert mine.shape == tuple(int(d) for d in reversed(theirs.shape.tolist()))
        assert mine.offset == theirs.data_offset and mine.nbytes == theirs.n_bytes
        assert head.tensor_bytes(mine).tobytes() == np.asarray(theirs.data).tobytes()


def _check_against_reader(path, got, dtype):
    """load()'s result against GGUFReader: names in file order, numpy-order shapes,
    pass-through bytes unchanged, quantized values as gguf dequantizes them."""
    _check_header_against_reader(path)
    reader = gguf.GGUFReader(str(path))
    assert list(got) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        g = got[t.name]
        assert g.shape == shape, t.name
        data = np.asarray(t.data)
        if t.tensor_type in (GT.F32, GT.F16):
            assert g.dtype == data.dtype
            assert g.tobytes() == data.tobytes(), t.name
        elif t.tensor_type == GT.BF16:
            assert g.dtype == np.uint16 and g.tobytes() == data.tobytes(), t.name
        elif g.size:
            assert_matches_gguf(g, gguf_dequantize(data, t.tensor_type.name), dtype)


@pytest.mark.parametrize("alignment", [None, 1, 2, 4, 8, 16, 32, 64, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_alignments(rng, tmp_path, alignment, dtype):
    # general.alignment may be any power of two (ggml and gguf-py accept 1): tensors
    # then start at odd offsets of the mapped file
    path = tmp_path / "a.gguf"
    for note in ("x", "xx"):  # with alignment 1 one of them puts the data at odd offsets
        _write(path, rng, FILE_TENSORS, alignment, note=note)
        if any(t.data_offset % 2 for t in gguf.GGUFReader(str(path)).tensors):
            break
    else:
        assert alignment != 1
    _check_against_reader(path, kg.load(path, device="cpu", dtype=dtype), dtype)


def test_header_every_value_type(rng, tmp_path):
    """Metadata of every GGUF value type (scalars, strings, arrays of numbers, of strings
    and nested arrays) and tensors of types kbit does not dequantize: read_header equals
    GGUFReader on all of it."""
    path = tmp_path / "h.gguf"
    w = gguf.GGUFWriter(str(path), "kbit-header")
    w.add_uint8("v.u8", 200)
    w.add_int8("v.i8", -100)
    w.add_uint16("v.u16", 60000)
    w.add_int16("v.i16", -30000)
    w.add_uint32("v.u32", 4_000_000_000)
    w.add_int32("v.i32", -2_000_000_000)
    w.add_float32("v.f32", 1.5)
    w.add_bool("v.bool", True)
    w.add_uint64("v.u64", 2 ** 63 + 5)
    w.add_int64("v.i64", -2 ** 62)
    w.add_float64("v.f64", float("nan"))
    w.add_string("v.str", "\u00e9t\u00e9 \U0001f600")
    w.add_string("v.empty", "")
    w.add_array("v.ints", list(range(1000)))
    w.add_array("v.floats", [0.5, -2.0])
    w.add_array("v.strs", ["a", "", "bcd" * 50])
    w.add_array("v.nested", [[1, 2], [3]])
    w.add_array("v.none", [])
    for qt in (GT.Q2_K, GT.IQ4_NL, GT.Q4_0):
        elems, nbytes = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (3, 2 * nbytes), dtype=np.uint8)
        w.add_tensor(f"t.{qt.name}", raw, raw_dtype=qt)
    w.add_tensor("t.i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.add_tensor("t.empty", np.zeros((0, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _check_header_against_reader(path)
    head = kg.read_header(path)
    assert head.metadata["v.strs"] == ["a", "", "bcd" * 50]
    assert head.tensors[0].type_name == "Q2_K"


def test_header_reads_vocab_file_quickly(tmp_path):
    """A vocab-only file (128k tokens, scores and types, ~3 MB) is read in well under a
    second: the tokens are the one per-element walk (strings have their own lengths)."""
    import time
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list([f"tok{i}" for i in range(128_000)])
    w.add_token_scores([float(-i) for i in range(128_000)])
    w.add_token_types([1] * 128_000)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    t0 = time.perf_counter()
    head = kg.read_header(path)
    took = time.perf_counter() - t0
    assert len(head.metadata["tokenizer.ggml.tokens"]) == 128_000
    assert head.metadata["tokenizer.ggml.scores"][5] == -5.0
    # numeric arrays are views of the map, not per-element Python objects
    assert isinstance(head.metadata["tokenizer.ggml.scores"], np.ndarray)
    assert isinstance(head.metadata["tokenizer.ggml.token_type"], np.ndarray)
    assert kg.load(path, device="cpu") == {}
    assert took < 5, f"read_header took {took:.2f} s"  # generous: loaded CI machines


UNSUPPORTED = [GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_1, GT.Q2_K, GT.Q3_K, GT.Q8_K, GT.IQ2_XXS,
               GT.IQ4_NL, GT.IQ4_XS, GT.TQ1_0, GT.TQ2_0]


@pytest.mark.parametrize("qt", UNSUPPORTED, ids=lambda q: q.name)
def test_load_unsupported_block_types(rng, tmp_path, qt):
    elems, nbytes = gguf.GGML_QUANT_SIZES[qt]
    path = tmp_path / "u.gguf"
    raw = rng.integers(0, 256, size=(3, 2 * nbytes), dtype=np.uint8)
    _write(path, rng, {"ok.q8": ("Q8_0", (2, 32))}, extra=[("blk.7.odd", raw, qt)])
    with pytest.raises(KbitError, match=rf"'blk\.7\.odd'.*\b{qt.name} \({int(qt)}\)") as e:
        kg.load(path, device="cpu")
    assert e.value.status == 1
    assert "Q4_0, Q8_0, Q4_K, Q5_K, Q6_K" in str(e.value)


@pytest.mark.parametrize("name,arr", [("F64", np.zeros((2, 3))), ("I8", np.zeros(5, np.int8)),
                                      ("I16", np.zeros(5, np.int16)),
                                      ("I32", np.zeros(5, np.int32)),
                                      ("I64", np.zeros(5, np.int64))])
def test_load_unsupported_plain_types(tmp_path, name, arr):
    path = tmp_path / "p.gguf"
    w = gguf.GGUFWriter(str(path), "kbit-adversarial")
    w.add_tensor("x", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KbitError, match=rf"'x' has type {name} \("):
        kg.load(path, device="cpu")


class _TooSlow(BaseException):  # not an Exception: load() must not swallow it
    pass


def _load_within(path, seconds):
    """kg.load(path) on the CPU, failing the test (instead of hanging) when it runs for
    more than `seconds`."""
    if not hasattr(signal, "SIGALRM"):
        pytest.skip("needs SIGALRM")

    def expire(*_):
        raise _TooSlow()

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        return kg.load(path, device="cpu")
    except _TooSlow:
        pytest.fail(f"kbit.gguf.load ran for more than {seconds} s on a {path.stat().st_size}"
                    "-byte corrupt file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _header(n_tensors, n_kv):
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def test_load_huge_array_count_fails_fast(tmp_path):
    # an int32 metadata array claiming 2^40 elements in a 61-byte file: GGUFReader
    # reads past the end without noticing and loops (and allocates) per element
    path = tmp_path / "huge.gguf"
    path.write_bytes(_header(0, 1) + struct.pack("<Q", 1) + b"k"
                     + struct.pack("<IIQ", 9, 5, 1 << 40) + struct.pack("<3i", 1, 2, 3))
    with pytest.raises(KbitError, match=r"truncated.*'k'") as e:
        _load_within(path, 10)
    assert e.value.status == 8


def test_load_fuzzed_headers_fail_fast(rng, tmp_path):
    # corrupt bytes anywhere in the header (counts, lengths, types), some files cut:
    # load() returns or raises KbitError, quickly
    good = tmp_path / "good.gguf"
    w = gguf.GGUFWriter(str(good), "kbit-adversarial")
    w.add_array("kbit.ints", [1, 2, 3])
    w.add_array("kbit.strings", ["a", "bc"])
    w.add_tensor("t.q4_0", _quant_bytes(rng, "Q4_0", (2, 64)), raw_dtype=GT.Q4_0)
    w.add_tensor("t.f32", np.ones((3, 2), np.float32))
    w.add_tensor("t.q4_k", _quant_bytes(rng, "Q4_K", (1, 256)), raw_dtype=GT.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    base = bytearray(good.read_bytes())
    header_end = base.index(b"t.q4_k") + 40
    path = tmp_path / "fuzz.gguf"
    for _ in range(1000):
        data = bytearray(base)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(0, header_end))] = int(rng.choice([0, 0x7F, 0x80, 0xFF,
                                                                     rng.integers(0, 256)]))
        if rng.random() < 0.2:
            data = data[:int(rng.integers(0, len(data)))]
        path.write_bytes(bytes(data))
        try:
            _load_within(path, 10)
        except KbitError:
            pass


def test_load_deeply_nested_arrays(tmp_path):
    path = tmp_path / "nested.gguf"
    path.write_bytes(_header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
                     + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0))
    with pytest.raises(KbitError, match="nested"):
        _load_within(path, 10)


def test_load_big_endian_file(tmp_path):
    path = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(path), "x", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("x", np.arange(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(KbitError, match="big-endian") as e:
        kg.load(path, device="cpu")
    assert e.value.status == 8


def _raw_file(path, infos, n_tensors=None, data=b""):
    """A GGUF v3 file with no metadata: infos are (name, dims, type id, offset); the data
    section starts at the next multiple of 32 and holds `data`."""
    body = b""
    for name, dims, tid, offset in infos:
        raw = name.encode()
        body += struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(dims))
        body += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", tid, offset)
    head = _header(len(infos) if n_tensors is None else n_tensors, 0) + body
    path.write_bytes(head + b"\0" * ((-len(head)) % 32) + data)
    return path


F32 = 0  # ggml type id


def test_load_valid_raw_file(tmp_path):
    # the writer above makes a file that loads (so the cases below fail for their reason)
    data = np.arange(16, dtype=np.float32).tobytes()
    path = _raw_file(tmp_path / "ok.gguf", [("a", [8], F32, 0), ("b", [8], F32, 32)], data=data)
    got = kg.load(path, device="cpu")
    assert np.array_equal(got["a"], np.arange(8, dtype=np.float32))
    assert np.array_equal(got["b"], np.arange(8, 16, dtype=np.float32))


@pytest.mark.parametrize("case", ["overlap", "many-overlap", "misaligned", "phantom",
                                  "duplicate", "five-dims", "huge-zero-dims"])
def test_load_rejects_inconsistent_tensor_infos(tmp_path, case):
    """Overlapping tensors (1,000 infos on the same bytes had made load allocate 3.7 GiB),
    offsets off the file's alignment, a tensor count one past the real infos (a phantom
    tensor named '' read from the padding) and repeated names are corrupt files."""
    data = np.zeros(64, dtype=np.float32).tobytes()
    infos = {"overlap": [("a", [16], F32, 0), ("b", [16], F32, 32)],
             "many-overlap": [(f"t{i}", [64], F32, 0) for i in range(1000)],
             "misaligned": [("a", [8], F32, 2)],
             "phantom": [("a", [8], F32, 0)],
             "duplicate": [("a", [8], F32, 0), ("a", [8], F32, 32)],
             # found by fuzz/fuzz_readers.py: numpy's ValueError, not KbitError
             "five-dims": [("a", [8, 1, 1, 1, 1], F32, 0)],
             "huge-zero-dims": [("a", [0, 2 ** 40, 2 ** 40], F32, 0)]}[case]
    path = _raw_file(tmp_path / f"{case}.gguf", infos,
                     n_tensors=len(infos) + (case == "phantom"), data=data)
    with pytest.raises(KbitError) as e:
        kg.load(path, device="cpu")
    assert e.value.status == 8  # KBIT_ERROR_INVALID_DATA
