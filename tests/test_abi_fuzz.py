"""ABI fuzzing of the plain C API through ctypes: every `_host` entry point and the
non-launch helpers get random mixes of valid and invalid arguments (null and misaligned
pointers, n = 0, negative, or so large that its byte size overflows, bad enums, bad
blocksizes, non-finite or non-positive tensor_scale, non-finite codebooks).

Every buffer sits between poisoned guard bytes. For each call:
 - the status must be success (or KBIT_ERROR_RANGE where documented) when every
   argument is valid, and otherwise one of the statuses the bad arguments explain;
 - a rejected call writes nothing at all (outputs and guards keep the poison) and
   leaves a message for kbit_last_error_message();
 - an accepted call writes nothing outside its outputs and never touches its inputs.
Each function is fuzzed in a forked child, so a crash fails the test with the last call.
"""
import ctypes
import multiprocessing
import threading

import numpy as np
import pytest

import kbit
from kbit import reference as R
from kbit._lib import lib as _kbit_lib

# An own handle on the same library: its own ctypes signatures, independent of the
# binding's table.
L = ctypes.CDLL(_kbit_lib()._name)
P, I64, INT, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
L.kbit_last_error_message.restype = ctypes.c_char_p
L.kbit_last_error_message.argtypes = []
L.kbit_status_string.restype = ctypes.c_char_p
L.kbit_status_string.argtypes = [INT]

OK, INVALID, NULL, MISALIGNED, RANGE, NOT_SUPPORTED, NO_DEVICE = 0, 1, 2, 3, 4, 5, 6
INT64_MAX = 2 ** 63 - 1
POISON = 0xC3
GUARD = 64  # poisoned bytes before and after every buffer (a multiple of 16)
CASES = 60  # random calls per function

TYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
DTYPE_OF = {0: "fp32", 1: "fp16", 2: "bf16"}
KS = (2, 3, 4, 5)
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
BAD_BLOCKSIZES = (0, 1, 16, 31, 33, 48, 96, 8192, -64, -32, 2 ** 31 - 1, -2 ** 31)
BAD_ENUMS = (-1, 3, 7, 255, 2 ** 31 - 1, -2 ** 31)
BAD_KS = (-1, 0, 1, 6, 8, 32, -2 ** 31)
GGML = {2: (32, 18), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
GGML_NAME = {2: "q4_0", 8: "q8_0", 12: "q4_K", 13: "q5_K", 14: "q6_K"}
BAD_GGML = (-1, 0, 1, 3, 6, 7, 9, 15, 16, 99, 2 ** 31 - 1, -2 ** 31)
GOOD_TS = (1.0, 0.5, 2.0, 1e-3, 1e30, 1.4e-45, 1e-40, 3.4028234663852886e38)
BAD_TS = (0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf"), -1.4e-45)


def sig(name, argtypes, restype=INT):
    f = getattr(L, name)
    f.argtypes, f.restype = argtypes, restype
    return f


def message():
    return L.kbit_last_error_message()


def ceil_div(a, b):
    return -(-a // b)


def overflowing_counts(elem):
    """Counts whose byte size (count * elem) does not fit in int64."""
    first = INT64_MAX // elem + 1
    return sorted({first, first + 1, 2 ** 62, 2 ** 62 + 7, 3 * 2 ** 61, INT64_MAX - 31,
                   INT64_MAX - 4095, INT64_MAX - 1, INT64_MAX})


# ---------------------------------------------------------------------------------
# Argument model: each function is a list of argument specs
# ---------------------------------------------------------------------------------

class N:
    """The element count; elem(params) is the size of its largest per-element array."""
    def __init__(self, elem, good=(0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 257, 1000, 4097)):
        self.elem, self.good = elem, good


class Enum:
    def __init__(self, name, good, bad):
        self.name, self.good, self.bad = name, good, bad


class TensorScale:
    name = "tensor_scale"


class Ptr:
    """A pointer argument. kind: 'in' or 'out'; need: 'n' (required when n > 0),
    'always' or 'optional' (NULL allowed); size(params) in bytes; fill(rng, params,
    nbytes) -> bytes (inputs)."""
    def __init__(self, name, kind, align, size, need="n", fill=None):
        self.name, self.kind, self.align, self.size = name, kind, align, size
        self.need, self.fill = need, fill


def normal_values(dtype_key):
    def fill(rng, p, nbytes):
        x = rng.standard_normal(nbytes // 2 + 1).astype(np.float32) * 3
        if p[dtype_key] == "fp32":
            return x.tobytes()[:nbytes]
        if p[dtype_key] == "fp16":
            return x.astype(np.float16).tobytes()[:nbytes]
        return R.kbit.float32_to_bf16_bits(x).tobytes()[:nbytes]
    return fill


def random_bytes(rng, p, nbytes):
    return rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def random_floats(rng, p, nbytes):
    return (rng.standard_normal(nbytes // 4 + 1).astype(np.float32)).tobytes()[:nbytes]


def codebook_fill(rng, p, nbytes):
    """The default codebook for k, sometimes with a non-finite entry (p['cb_bad'])."""
    k = p.get("k") if p.get("k") in KS else 5
    cb = np.resize(R.create_normal_float_codebook(k), nbytes // 4).astype(np.float32)
    if p["cb_bad"] is not None and cb.size:
        cb[rng.integers(cb.size)] = p["cb_bad"]
    return cb.tobytes()


class Func:
    def __init__(self, name, specs, ok=(OK,), quantize_codebook=False, extra=None):
        self.name, self.specs, self.ok = name, specs, set(ok)
        self.quantize_codebook = quantize_codebook
        self.extra = extra  # extra(params) -> True if the arguments are invalid


def elem_of(key):
    return lambda p: TYPES.get(p[key], 4)


def blocks32(p):
    return ceil_div(p["n_alloc"], 32)


def absmax_size(p):
    return {0: 4, 1: 2, 2: 1}.get(p["fmt"], 4)


def nf4_blocks(p):
    bs = p["bs"] if p["bs"] in BLOCKSIZES else 32
    return ceil_div(p["n_alloc"], bs)


def kbit_specs(op, generic):
    """Arguments of the kbit quantize/dequantize entries, per-type or generic."""
    fmt = Enum("fmt", (0, 1, 2), BAD_ENUMS)
    k_size = lambda p: blocks32(p) * (p["k"] if p["k"] in KS else 5) * 4
    data = Ptr("input" if op == "q" else "output", "in" if op == "q" else "out",
               None, lambda p: p["n_alloc"] * TYPES.get(p["t"], 4), fill=normal_values("t"))
    absmax = Ptr("absmax", "out" if op == "q" else "in", "fmt",
                 lambda p: blocks32(p) * absmax_size(p), fill=random_bytes)
    packed = Ptr("packed", "out" if op == "q" else "in", 4, k_size, fill=random_bytes)
    cb = Ptr("codebook", "in", 4, lambda p: 4 << (p["k"] if p["k"] in KS else 5),
             need="optional", fill=codebook_fill)
    n = N(elem_of("t"))
    dtype = Enum("dtype", (0, 1, 2), BAD_ENUMS)
    k = Enum("k", KS, BAD_KS)
    if op == "q":
        if generic:
            return [data, n, dtype, k, cb, fmt, TensorScale(), absmax, packed]
        return [data, n, cb, fmt, TensorScale(), absmax, packed]
    if generic:
        return [packed, absmax, fmt, TensorScale(), cb, k, n, dtype, data]
    return [packed, absmax, fmt, TensorScale(), cb, n, data]


def nf4_specs(op, dq=False):
    n = N(elem_of("t"))
    bs = Enum("bs", BLOCKSIZES, BAD_BLOCKSIZES)
    data = Ptr("input" if op == "q" else "output", "in" if op == "q" else "out", None,
               lambda p: p["n_alloc"] * TYPES[p["t"]], fill=normal_values("t"))
    packed = Ptr("packed", "out" if op == "q" else "in", 1,
                 lambda p: (p["n_alloc"] + 1) // 2, fill=random_bytes)
    absmax = Ptr("absmax", "out" if op == "q" else "in", 4, lambda p: nf4_blocks(p) * 4,
                 fill=random_floats)
    if op == "q":
        return [data, n, bs, absmax, packed]
    if not dq:
        return [packed, absmax, n, bs, data]
    qabsmax = Ptr("qabsmax", "in", 1, nf4_blocks, fill=random_bytes)
    absmax2 = Ptr("absmax2", "in", 4, lambda p: ceil_div(nf4_blocks(p), 256) * 4,
                  fill=random_floats)
    code = Ptr("code", "in", 4, lambda p: 1024, need="optional", fill=random_floats)
    offset = Ptr("offset", "in", 4, lambda p: 4, fill=random_floats)
    return [packed, qabsmax, absmax2, code, offset, n, bs, data]


def dq_state(kind_q, kind_a2):
    return (Ptr("qabsmax", kind_q, 1, lambda p: p["n_alloc"], fill=random_bytes),
            Ptr("absmax2", kind_a2, 4, lambda p: ceil_div(p["n_alloc"], 256) * 4,
                fill=random_floats),
            Ptr("code", "in", 4, lambda p: 1024, need="optional", fill=random_floats),
            Ptr("offset", "in", 4, lambda p: 4, fill=random_floats))


def gguf_specs(generic):
    def block_bytes(p):
        e, b = GGML.get(p["ggml"], (32, 34))
        return ceil_div(p["n_alloc"], e) * b
    blocks = Ptr("blocks", "in", 2, block_bytes, fill=random_bytes)
    out = Ptr("output", "out", None, lambda p: p["n_alloc"] * TYPES.get(p["t"], 4))
    n = N(elem_of("t"), good=(0, 32, 64, 96, 256, 512, 768, 1, 31, 33, 255, 257, 100))
    if generic:
        return [Enum("ggml", tuple(GGML), BAD_GGML), blocks, n, Enum("dtype", (0, 1, 2), BAD_ENUMS),
                out]
    return [blocks, n, out]


def gguf_extra(p):
    e, _ = GGML.get(p["ggml"], (1, 0))
    return p["n"] % e != 0


FUNCS = {}


def add(f, fixed=None):
    f.fixed = fixed or {}
    FUNCS[f.name] = f


for t in TYPES:
    for k in KS:
        add(Func(f"cquantize_kbit_{t}_k{k}_host", kbit_specs("q", False), ok=(OK, RANGE),
                 quantize_codebook=True), {"t": t, "k": k})
        add(Func(f"cdequantize_kbit_{t}_k{k}_host", kbit_specs("d", False)), {"t": t, "k": k})
add(Func("kbit_quantize_host", kbit_specs("q", True), ok=(OK, RANGE), quantize_codebook=True))
add(Func("kbit_dequantize_host", kbit_specs("d", True)))
add(Func("kbit_compute_tensor_scale_host",
         [Ptr("input", "in", None, lambda p: p["n_alloc"] * TYPES.get(p["t"], 4),
              fill=normal_values("t")),
          N(elem_of("t")), Enum("dtype", (0, 1, 2), BAD_ENUMS), Enum("fmt", (0, 1, 2), BAD_ENUMS),
          Ptr("tensor_scale", "out", 4, lambda p: 4, need="always")]))
add(Func("kbit_default_codebook_host",
         [Enum("k", KS, BAD_KS),
          Ptr("codebook", "out", 4, lambda p: 4 << (p["k"] if p["k"] in KS else 5),
              need="always")]))
for f in ("nf4", "fp4"):
    for t in TYPES:
        add(Func(f"cquantize_{f}_{t}_host", nf4_specs("q")), {"t": t})
        add(Func(f"cdequantize_{f}_{t}_host", nf4_specs("d")), {"t": t})
        add(Func(f"cdequantize_{f}_dq_{t}_host", nf4_specs("d", dq=True)), {"t": t})
_q, _a2, _code, _off = dq_state("out", "out")
add(Func("kbit_nf4_quantize_absmax_host",
         [Ptr("absmax", "in", 4, lambda p: p["n_alloc"] * 4, fill=random_floats),
          N(lambda p: 4), _code, _off, _q, _a2]))
_q, _a2, _code, _off = dq_state("in", "in")
add(Func("kbit_nf4_dequantize_absmax_host",
         [_q, _a2, _code, _off, N(lambda p: 4),
          Ptr("absmax", "out", 4, lambda p: p["n_alloc"] * 4)]))
add(Func("kbit_nf4_absmax_mean_host",
         [Ptr("absmax", "in", 4, lambda p: p["n_alloc"] * 4, fill=random_floats),
          N(lambda p: 4), Ptr("mean", "out", 4, lambda p: 4)]))
add(Func("kbit_nf4_dynamic_map_host", [Ptr("code", "out", 4, lambda p: 1024, need="always")]))
add(Func("kbit_nf4_to_kbit_host",
         [Ptr("packed", "in", 1, lambda p: (p["n_alloc"] + 1) // 2, fill=random_bytes),
          Ptr("absmax", "in", 4, lambda p: nf4_blocks(p) * 4, fill=random_floats),
          N(lambda p: 2), Enum("bs", BLOCKSIZES, BAD_BLOCKSIZES),
          Enum("fmt", (0, 1), (2,) + BAD_ENUMS),
          Ptr("kbit_packed", "out", 4, lambda p: blocks32(p) * 16),
          Ptr("kbit_absmax", "out", 2, lambda p: blocks32(p) * 4)], ok=(OK, RANGE)))
for gid, q in GGML_NAME.items():
    for t in TYPES:
        add(Func(f"cdequantize_{q}_{t}_host", gguf_specs(False), extra=gguf_extra),
            {"t": t, "ggml": gid})
add(Func("kbit_gguf_dequantize_host", gguf_specs(True), extra=gguf_extra))
add(Func("kbit_gguf_to_kbit_host",
         [Enum("ggml", (2,), BAD_GGML + (8, 12, 13, 14)),
          Ptr("blocks", "in", 2, lambda p: blocks32(p) * 18, fill=random_bytes),
          N(lambda p: 4, good=(0, 32, 64, 96, 256, 1024, 1, 31, 33, 100)),
          Enum("fmt", (0, 1), (2,) + BAD_ENUMS),
          Ptr("kbit_packed", "out", 4, lambda p: blocks32(p) * 16),
          Ptr("kbit_absmax", "out", "fmt", lambda p: blocks32(p) * absmax_size(p))],
         extra=lambda p: p["n"] % 32 != 0))
add(Func("kbit_gguf_block_info",
         [Enum("ggml", tuple(GGML), BAD_GGML),
          Ptr("block_elems", "out", 1, lambda p: 8, need="optional"),
          Ptr("block_bytes", "out", 1, lambda p: 8, need="optional")]))


# ---------------------------------------------------------------------------------
# One random call: build, run, check
# ---------------------------------------------------------------------------------

class Buf:
    """nbytes at ptr, GUARD poisoned bytes around (plus slack for the offset)."""
    def __init__(self, nbytes, off, data=None):
        self.nbytes, self.off = nbytes, off
        self.raw = np.full(GUARD + off + nbytes + GUARD, POISON, np.uint8)
        if data:
            self.raw[GUARD + off:GUARD + off + nbytes] = np.frombuffer(data, np.uint8)[:nbytes]
        self.before = self.raw.copy()

    @property
    def ptr(self):
        return self.raw.ctypes.data + GUARD + self.off

    def outside_intact(self):
        lo, hi = GUARD + self.off, GUARD + self.off + self.nbytes
        return (np.array_equal(self.raw[:lo], self.before[:lo])
                and np.array_equal(self.raw[hi:], self.before[hi:]))

    def intact(self):
        return np.array_equal(self.raw, self.before)


def ctype_of(spec):
    if isinstance(spec, N):
        return I64
    if isinstance(spec, Enum):
        return INT
    if isinstance(spec, TensorScale):
        return F32
    return P


def build_case(func, rng, force_n=None, valid_only=False):
    """(args, allowed statuses, buffers, description) of one random call; force_n fixes
    n, valid_only keeps every other argument valid."""
    bad_rate = 0.0 if valid_only else 0.2
    p = dict(func.fixed)
    must, may = set(), set()
    # Scalars first: sizes depend on them.
    for s in func.specs:
        if isinstance(s, Enum) and s.name not in p:
            p[s.name] = int(rng.choice(s.bad if rng.random() < bad_rate else s.good))
            if p[s.name] not in s.good:
                must.add(INVALID)
        elif isinstance(s, TensorScale):
            p["ts"] = float(rng.choice(BAD_TS if rng.random() < bad_rate else GOOD_TS))
            if p["ts"] not in GOOD_TS:
                must.add(INVALID)
    if "dtype" in p:
        p["t"] = DTYPE_OF.get(p["dtype"], "bad")
    p.setdefault("t", "fp32")
    p.setdefault("ggml", None)
    nspec = next((s for s in func.specs if isinstance(s, N)), None)
    n = None
    if nspec is not None:
        elem = nspec.elem(p)
        r = rng.random() if force_n is None else 2.0
        if force_n is not None:
            n = force_n
        elif r < 0.8:
            n = int(rng.choice(nspec.good))
        elif r < 0.9:
            n = int(rng.choice((-1, -2, -32, -256, -2 ** 31, -2 ** 63)))
        else:
            n = int(rng.choice(overflowing_counts(elem)))
        if n < 0 or n * elem > INT64_MAX:
            must.add(INVALID)
    p["n"] = n if n is not None else 1
    p["n_alloc"] = p["n"] if 0 <= p["n"] <= 1 << 13 else 0
    if func.extra and func.extra(p):
        must.add(INVALID)
    scalars_ok = INVALID not in must  # else a pointer problem may or may not be seen
    active = n is None or p["n"] > 0  # pointers matter (n > 0, or no n at all)
    p["cb_bad"] = None
    if func.quantize_codebook and rng.random() < 0.75 * bad_rate:
        p["cb_bad"] = float(rng.choice((np.nan, np.inf, -np.inf)))
    args, bufs = [], []
    for s in func.specs:
        if isinstance(s, N):
            args.append(p["n"])
        elif isinstance(s, Enum):
            args.append(p[s.name])
        elif isinstance(s, TensorScale):
            args.append(F32(p["ts"]))
        else:
            align = (TYPES.get(p["t"], 4) if s.align is None
                     else absmax_size(p) if s.align == "fmt" else s.align)
            nbytes = s.size(p)
            r = rng.random() if not valid_only else 1.0
            required = s.need == "always" or (s.need == "n" and active)
            if r < 0.1 and s.need != "optional":
                args.append(None)
                if s.need == "always" or (required and scalars_ok):
                    must.add(NULL)
                else:
                    may.add(NULL)
                continue
            if r < 0.1:  # optional: NULL is the default
                args.append(None)
                continue
            off = 0
            if r < 0.2 and align > 1:
                off = int(rng.integers(1, align))
                if s.need == "always" or ((required or s.need == "optional") and active and scalars_ok):
                    must.add(MISALIGNED)
                else:
                    may.add(MISALIGNED)
            elif align == 1:
                off = int(rng.integers(0, 4))
            data = s.fill(rng, p, nbytes) if s.fill else None
            b = Buf(nbytes, off, data)
            b.kind, b.name = s.kind, s.name
            bufs.append(b)
            args.append(b.ptr)
            if s.name == "codebook" and func.quantize_codebook and p["cb_bad"] is not None:
                if active and scalars_ok:
                    must.add(INVALID)
                else:
                    may.add(INVALID)
    if must:
        allowed = must | may
    else:
        allowed = func.ok | may
    desc = f"{func.name}({', '.join(_show(a) for a in args)}) params={p}"
    return args, allowed, bufs, desc


def _show(a):
    if isinstance(a, F32):
        return f"float({a.value!r})"
    return repr(a)


def check_call(fn, func, case, send):
    args, allowed, bufs, desc = case
    send(("case", desc))
    status = fn(*args)
    msg = message()
    where = f"{desc} -> status {status} ({L.kbit_status_string(status)}), message {msg!r}"
    assert status in allowed, f"status not in {sorted(allowed)}: {where}"
    for b in bufs:
        if b.kind == "in":
            assert b.intact(), f"input {b.name} modified: {where}"
    if status in func.ok:
        for b in bufs:
            assert b.outside_intact(), f"wrote outside {b.name}: {where}"
        if status == OK:
            assert msg == b"", f"stale message after success: {where}"
        else:
            assert msg, f"no message: {where}"
    else:
        for b in bufs:
            assert b.intact(), f"rejected call wrote to {b.name}: {where}"
        assert msg, f"no message after failure: {where}"
        if status == NULL:
            assert b"NULL" in msg, where
        if status == MISALIGNED:
            assert b"align" in msg, where


def fuzz_function(name, seed, cases, send):
    func = FUNCS[name]
    fn = sig(name, [ctype_of(s) for s in func.specs])
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        check_call(fn, func, build_case(func, rng), send)


def huge_counts(name, send):
    """Every count whose byte size overflows int64, with every other argument valid,
    is rejected as INVALID_ARGUMENT with nothing written."""
    func = FUNCS[name]
    fn = sig(name, [ctype_of(s) for s in func.specs])
    rng = np.random.default_rng(0)
    for n in overflowing_counts(2):
        for _ in range(3):
            case = build_case(func, rng, force_n=n, valid_only=True)
            assert case[1] == {INVALID}, case[3]
            check_call(fn, func, case, send)
    for n in overflowing_counts(4):  # valid for 2-byte arrays: only the 4-byte ones
        case = build_case(func, rng, force_n=n, valid_only=True)
        if case[1] == {INVALID}:
            check_call(fn, func, case, send)


def run_in_child(target, *args, timeout=120):
    """Runs target(*args, send) in a forked child; a crash fails with the last case."""
    ctx = multiprocessing.get_context("fork")
    recv, send_end = ctx.Pipe(duplex=False)

    def body():
        try:
            target(*args, send_end.send)
            send_end.send(("done", None))
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            send_end.send(("done", f"{type(e).__name__}: {e}"))
        finally:
            send_end.close()

    proc = ctx.Process(target=body)
    proc.start()
    send_end.close()
    last, result = None, "no result"
    try:
        while recv.poll(timeout):
            tag, value = recv.recv()
            if tag == "case":
                last = value
            else:
                result = value
                break
    except EOFError:
        pass
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"hung; last call: {last}")
    if proc.exitcode != 0 and result == "no result":
        pytest.fail(f"crashed (exit code {proc.exitcode}); last call: {last}")
    assert result is None, result


# ---------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FUNCS))
def test_fuzz(name):
    seed = int(np.random.SeedSequence().entropy % 2 ** 32)
    print(f"seed={seed}")
    run_in_child(fuzz_function, name, seed, CASES)


SIZED = sorted(name for name, f in FUNCS.items() if any(isinstance(s, N) for s in f.specs))


@pytest.mark.parametrize("name", SIZED)
def test_counts_whose_byte_size_overflows_are_rejected(name):
    run_in_child(huge_counts, name)


def test_size_helpers_exact_for_every_count():
    """The size helpers are ceil divisions for every n >= 0, INT64_MAX included."""
    pw = sig("kbit_packed_words", [I64, INT], I64)
    ab = sig("kbit_absmax_bytes", [I64, INT], I64)
    pb = sig("kbit_nf4_packed_bytes", [I64], I64)
    ac = sig("kbit_nf4_absmax_count", [I64, INT], I64)
    a2 = sig("kbit_nf4_absmax2_count", [I64], I64)
    for n in (0, 1, 31, 32, 33, 2 ** 31, 2 ** 62, 2 ** 62 + 1, INT64_MAX - 4096,
              INT64_MAX - 4095, INT64_MAX - 255, INT64_MAX - 31, INT64_MAX - 1, INT64_MAX):
        for k in KS:
            assert pw(n, k) == ceil_div(n, 32) * k, (n, k)
        for fmt, size in ((0, 4), (1, 2), (2, 1)):
            assert ab(n, fmt) == ceil_div(n, 32) * size, (n, fmt)
        assert pb(n) == ceil_div(n, 2), n
        for bs in BLOCKSIZES:
            assert ac(n, bs) == ceil_div(n, bs), (n, bs)
        assert a2(n) == ceil_div(n, 256), n
    for n in (-1, -2 ** 63):
        assert pw(n, 3) == ab(n, 2) == pb(n) == ac(n, 64) == a2(n) == -1
    for k in BAD_KS:
        assert pw(64, k) == -1
    for fmt in BAD_ENUMS:
        assert ab(64, fmt) == -1
    for bs in BAD_BLOCKSIZES:
        assert ac(64, bs) == -1


def test_status_strings_and_decode_total():
    for s in list(range(-3, 20)) + [2 ** 31 - 1, -2 ** 31]:
        name = L.kbit_status_string(s)
        assert name == (b"unknown status" if not 0 <= s <= 9 else name) and name
    dec = sig("kbit_e4m4_decode", [ctypes.c_uint8], F32)
    vals = [dec(c) for c in range(256)]
    assert vals == sorted(vals) and vals[0] == 0.0 and vals[255] == 31.0


def test_last_error_message_is_per_thread():
    q = sig("kbit_quantize_host", [P, I64, INT, INT, P, INT, F32, P, P])
    dm = sig("kbit_nf4_dynamic_map_host", [P])
    out = np.zeros(256, np.float32)
    assert q(None, -1, 0, 4, None, 2, F32(1), None, None) == INVALID
    main_msg = message()
    assert b"n must be" in main_msg
    seen = {}

    def worker():
        seen["fresh"] = message()
        seen["status"] = dm(None)
        seen["own"] = message()
        seen["ok"] = dm(out.ctypes.data)
        seen["after_ok"] = message()

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen["fresh"] == b"", "a new thread sees another thread's message"
    assert seen["status"] == NULL and b"code is NULL" in seen["own"]
    assert seen["ok"] == OK and seen["after_ok"] == b""
    assert message() == main_msg, "another thread's calls changed this thread's message"
    # a successful call clears this thread's message
    assert dm(out.ctypes.data) == OK and message() == b""


def test_gpu_entries_validate_before_touching_the_device():
    """Without a usable device, a GPU entry with bad arguments returns the argument
    status and with good ones a device status (NO_DEVICE on a CUDA build,
    NOT_SUPPORTED on a CPU-only one), writing nothing either way."""
    if kbit.cuda_available():
        pytest.skip("a CUDA device is present: these host pointers would be used")
    cuda_build = sig("cquantize_nf4_fp32", [P, I64, INT, P, P, P])(None, 0, 64, None, None, None) == OK
    device = NO_DEVICE if cuda_build else NOT_SUPPORTED
    x = Buf(4096, 0, bytes(4096))
    o = Buf(4096, 0)
    X, O = x.ptr, o.ptr
    f = F32
    calls = [
        ("cquantize_kbit_fp16_k3", [P, I64, P, INT, F32, P, P, P],
         (X, 64, None, 2, f(1), O, O + 64, None), (X, 64, None, 9, f(1), O, O + 64, None)),
        ("cdequantize_kbit_bf16_k5", [P, P, INT, F32, P, I64, P, P],
         (X, X, 1, f(1), None, 64, O, None), (X, X, 1, f(0), None, 64, O, None)),
        ("kbit_quantize", [P, I64, INT, INT, P, INT, F32, P, P, P],
         (X, 64, 0, 4, None, 2, f(1), O, O + 64, None), (X, 64, 0, 6, None, 2, f(1), O, O + 64, None)),
        ("kbit_dequantize", [P, P, INT, F32, P, INT, I64, INT, P, P],
         (X, X, 2, f(1), None, 4, 64, 1, O, None), (X, X, 2, f(1), None, 4, 64, 1, O + 1, None)),
        ("kbit_compute_tensor_scale", [P, I64, INT, INT, P, P],
         (X, 64, 0, 2, O, None), (X, 64, 0, 2, None, None)),
        ("kbit_get_range_flag", [P, INT], (O, 1), (None, 1)),
        ("cquantize_fp4_bf16", [P, I64, INT, P, P, P],
         (X, 64, 64, O, O + 64, None), (X, 64, 33, O, O + 64, None)),
        ("cdequantize_nf4_fp16", [P, P, I64, INT, P, P],
         (X, X, 64, 64, O, None), (X, X, -64, 64, O, None)),
        ("cdequantize_fp4_dq_fp32", [P, P, P, P, P, I64, INT, P, P],
         (X, X, X, None, X, 64, 64, O, None), (X, X, X, None, None, 64, 64, O, None)),
        ("kbit_nf4_absmax_mean", [P, I64, P, P], (X, 64, O, None), (X, 64, O + 2, None)),
        ("kbit_nf4_quantize_absmax", [P, I64, P, P, P, P, P],
         (X, 64, None, X, O, O + 256, None), (X, 64, None, X, O, None, None)),
        ("kbit_nf4_dequantize_absmax", [P, P, P, P, I64, P, P],
         (X, X, None, X, 64, O, None), (X, X, None, X, -1, O, None)),
        ("kbit_nf4_to_kbit", [P, P, I64, INT, INT, P, P, P],
         (X, X, 64, 64, 0, O, O + 64, None), (X, X, 64, 48, 0, O, O + 64, None)),
        ("cdequantize_q5_K_fp16", [P, I64, P, P], (X, 256, O, None), (X, 255, O, None)),
        ("kbit_gguf_dequantize", [INT, P, I64, INT, P, P],
         (8, X, 64, 2, O, None), (9, X, 64, 2, O, None)),
        ("kbit_gguf_to_kbit", [INT, P, I64, INT, P, P, P],
         (2, X, 64, 1, O, O + 64, None), (12, X, 64, 1, O, O + 64, None)),
    ]
    # counts whose byte size overflows are refused before any device work too
    huge = 2 ** 62
    calls += [
        ("cquantize_kbit_fp32_k2", [P, I64, P, INT, F32, P, P, P],
         (X, 64, None, 0, f(1), O, O + 64, None), (X, huge, None, 0, f(1), O, O + 64, None)),
        ("kbit_dequantize", [P, P, INT, F32, P, INT, I64, INT, P, P],
         (X, X, 2, f(1), None, 4, 64, 1, O, None), (X, X, 2, f(1), None, 4, huge, 1, O, None)),
        ("kbit_compute_tensor_scale", [P, I64, INT, INT, P, P],
         (X, 64, 1, 2, O, None), (X, huge, 1, 2, O, None)),
        ("cquantize_nf4_fp16", [P, I64, INT, P, P, P],
         (X, 64, 64, O, O + 64, None), (X, huge, 64, O, O + 64, None)),
        ("cdequantize_nf4_dq_bf16", [P, P, P, P, P, I64, INT, P, P],
         (X, X, X, None, X, 64, 64, O, None), (X, X, X, None, X, huge, 64, O, None)),
        ("kbit_nf4_absmax_mean", [P, I64, P, P], (X, 64, O, None), (X, 2 ** 61, O, None)),
        ("kbit_nf4_quantize_absmax", [P, I64, P, P, P, P, P],
         (X, 64, None, X, O, O + 256, None), (X, 2 ** 61, None, X, O, O + 256, None)),
        ("kbit_nf4_dequantize_absmax", [P, P, P, P, I64, P, P],
         (X, X, None, X, 64, O, None), (X, X, None, X, 2 ** 61, O, None)),
        ("cdequantize_q4_0_fp32", [P, I64, P, P], (X, 64, O, None), (X, 2 ** 61, O, None)),
        ("kbit_gguf_dequantize", [INT, P, I64, INT, P, P],
         (14, X, 256, 1, O, None), (14, X, huge, 1, O, None)),
    ]
    for name, types, good, bad in calls:
        fn = sig(name, types)
        status = fn(*bad)
        if cuda_build:
            assert status in (INVALID, NULL, MISALIGNED), (name, status, message())
        assert message(), name
        status = fn(*good)
        assert status == device, (name, status, message())
        assert message(), name
        assert o.intact() and x.intact(), name
