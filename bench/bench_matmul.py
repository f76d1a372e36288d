#!/usr/bin/env python3
"""Benchmark of the fused dequantize + matmul, kbit.matmul(x, w), y = x · Wᵀ (SPEC 6).

    python3 bench/bench_matmul.py [--shapes 4096x4096,...] [--m 1,2,4,8 | gemv | gemm | all]
        [--formats default | all | kbit4,nf4,q4_k,...] [--dtype fp16|bf16|fp32]
        [--repeats 50] [--quick] [--json PATH] [--gguf-source random|quantize] [--no-bnb]
    python3 bench/bench_matmul.py --selftest      # the pure-Python parts, no torch/GPU

Needs PyTorch with a CUDA device and the built library (bindings/python on the path is
added here); bitsandbytes is optional (its NF4/FP4 path is timed where importable).

Method (llm.c style: check each case, then time it):
- W is N(0, 0.02²) in x's dtype, made on the GPU and quantized there by kbit (kbit
  formats, NF4, FP4). GGUF weights are random *valid* ggml blocks by default (random
  bytes, fp16 scale fields set to small positive finite values giving weights of
  about the same size): the kernels' speed does not depend on the values, and
  quantizing 28672x8192 with the gguf package's numpy code would take minutes.
  --gguf-source quantize uses gguf.quants.quantize where the package supports the type
  (Q4_0, Q8_0 in gguf 0.x) and random blocks for the others.
- Check: y = kbit.matmul(x, w) against torch's fp32 matmul (TF32 off) of x and the
  format's W as kbit dequantizes it to fp32; the relative Frobenius error is recorded
  and compared with a tolerance per dtype (--tol). A failed check is printed loudly and
  makes the exit status non-zero; the case is still timed (marked FAIL).
- Timing: CUDA events around one call; before each timed call a buffer of twice the L2
  size is written (so L2 holds none of W or x; --flush read reads it instead, which
  leaves L2 holding clean lines rather than dirty ones), then a GPU spin (torch.cuda._sleep) long
  enough for Python to enqueue the timed call behind it, then the start event: neither
  the flush nor the host's launch overhead is timed. 3 warm-up calls, then up to
  --repeats timed calls (fewer if one timing would exceed --budget seconds); median.
  The host time per call (Python + ctypes + launch, not synchronised) is the table's
  host_us; a call that took longer on the host than the flush + spin (or that
  synchronised) is flagged "timing includes host launch time".
- Bytes: the minimum traffic of the fused kernel: W's stored bytes (packed codes +
  scales, or ggml blocks) + x read + y written (codebook and tensor_scale, at most 128
  bytes, are left out). GB/s is those bytes over the median time; "% copy" compares it
  with a device-to-device copy of a 1 GiB buffer timed the same way in the same run
  (read + written bytes over time), the device's practical peak. Small cases cannot
  reach it (launch and tail effects), so read % copy at the large shapes.
- Read floor: torch.sum over a float32 buffer of the case's bytes, timed the same way:
  a read-only stream of those bytes with launch, first bytes and tail included, what a
  kernel that must read them cannot beat by much. "%read" = its time / kbit's time
  (100: kbit takes as long as reading its bytes and nothing else). Where the read floor's
  readers are built (build/bench/libkbit_read_floor.so, or --readers PATH), "%floor" is
  the same for the fastest of five read-only kernels (bench/readers.py floor_configs:
  16-byte loads with cache hints, cp.async.bulk rings; on an H100 5-9 us under torch.sum),
  and "xfloor" = cuBLAS time / that floor: the speedup over cuBLAS of a kernel that only
  reads the case's bytes, the most any kernel reading them that way gets in this run (a
  speedup target above it is out of reach on this machine, however fast the decode).
- Peers, same shape and m, same method: cuBLAS (torch.matmul of x and the dense W in
  x's dtype, fp16 by default), dequantize + cuBLAS (kbit's dequantize into a
  preallocated scratch of x's dtype, then torch.matmul), and bitsandbytes'
  matmul_4bit (NF4/FP4 blocksize 64) where importable. "x cuBLAS" = cuBLAS time /
  kbit time (> 1: kbit is faster).
A format the library does not support yet is recorded as an error and the run goes
on. The compact table comes last; --json writes every number with the device,
versions and settings.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from readers import Readers, floor_configs  # noqa: E402  (bench/readers.py)

# ---- what is measured -------------------------------------------------------------

# Llama-3 8B (4096x4096 attention, 14336x4096 / 4096x14336 MLP) and 70B (28672x8192
# gate+up, 8192x28672 down) layers, as n_out x k_in.
DEFAULT_SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672)]
GEMV_M = [1, 2, 4, 8]
GEMM_M = [16, 32, 64, 256, 1024, 4096]

# ggml block types: (ggml type id, elements per block, bytes per block, byte offsets of
# the fp16 scale fields, typical value of each field giving weights of rms ~0.02).
GGUF_TYPES = {
    "Q4_0": (2, 32, 18, {0: 5e-3}),               # d; w = d * (q - 8)
    "Q8_0": (8, 32, 34, {0: 3e-4}),               # d; w = d * int8
    "Q4_K": (12, 256, 144, {0: 1e-4, 2: 1e-4}),   # d, dmin; w = d*sc*q - dmin*m
    "Q5_K": (13, 256, 176, {0: 5e-5, 2: 5e-5}),
    "Q6_K": (14, 256, 210, {208: 2e-5}),          # d at the end; w = d * int8 sc * (q - 32)
}
_ABSMAX_BYTES = {"e4m4": 1, "fp16": 2, "fp32": 4}


def _formats() -> dict:
    f = {}
    for absmax in ("e4m4", "fp16", "fp32"):
        for k in (2, 3, 4, 5):
            name = f"kbit{k}" if absmax == "e4m4" else f"kbit{k}-{absmax}"
            f[name] = {"family": "kbit", "k": k, "absmax": absmax, "block": 32}
            # the same weight repacked once by kbit.tile (csrc/formats/kbit_tiled.h)
            f[name + "-tiled"] = dict(f[name], tiled=True)
    for qt in ("nf4", "fp4"):
        f[qt] = {"family": "4bit", "quant_type": qt, "blocksize": 64, "block": 64}
        # the same weight tiled (kbit.tile: kbit K=4, a scale a 32-element block, half as
        # the absmax of fp16 / bf16 weights is a half value)
        f[qt + "-tiled"] = dict(f[qt], tiled=True, block=32)
    for name, (tid, elems, nbytes, _) in GGUF_TYPES.items():
        f[name.lower()] = {"family": "gguf", "ggml": name, "type_id": tid, "block": elems,
                           "block_bytes": nbytes}
    # Q4_0 as the kbit K = 4 weight of the same values (kbit.gguf.to_kbit), tiled
    f["q4_0-tiled"] = dict(f["q4_0"], tiled=True)
    return f


FORMATS = _formats()
DEFAULT_FORMATS = ["kbit2-tiled", "kbit3-tiled", "kbit4-tiled", "kbit5-tiled",
                   "kbit2", "kbit3", "kbit4", "kbit5", "nf4", "fp4",
                   "q4_0", "q8_0", "q4_k", "q5_k", "q6_k"]
FORMAT_GROUPS = {
    "default": DEFAULT_FORMATS,
    "all": list(FORMATS),
    "kbit": ["kbit2", "kbit3", "kbit4", "kbit5"],
    "tiled": ["kbit2-tiled", "kbit3-tiled", "kbit4-tiled", "kbit5-tiled"],
    "kbit-all": [n for n in FORMATS if FORMATS[n]["family"] == "kbit"],
    "4bit": ["nf4", "fp4", "nf4-tiled", "fp4-tiled"],
    "gguf": [n for n in FORMATS
             if FORMATS[n]["family"] == "gguf" and not FORMATS[n].get("tiled")],
}
DTYPES = {"fp16": ("float16", 2), "bf16": ("bfloat16", 2), "fp32": ("float32", 4)}
_DTYPE_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32",
                  "float": "fp32"}
# Relative Frobenius error allowed against the fp32 reference: y rounded once to the
# output type (and W possibly rounded to it before the MMA) gives a few units of the
# type's rounding error; fp32 leaves room for a TF32 tensor-core path.
DEFAULT_TOL = {"fp16": 2e-3, "bf16": 1.5e-2, "fp32": 1e-3}

QUICK = {"shapes": [(4096, 4096), (14336, 4096)], "m": [1, 16],
         "formats": ["kbit4", "nf4", "q4_k"], "repeats": 20}


# ---- arguments --------------------------------------------------------------------

def parse_shapes(text: str) -> list:
    shapes = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        parts = item.split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not N_OUTxK_IN (e.g. 4096x14336)")
        n_out, k_in = int(parts[0]), int(parts[1])
        if n_out <= 0 or k_in <= 0:
            raise argparse.ArgumentTypeError(f"shape {item!r} must be positive")
        shapes.append((n_out, k_in))
    if not shapes:
        raise argparse.ArgumentTypeError("no shapes given")
    return shapes


def parse_m(text: str) -> list:
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item in ("gemv", "gemm", "all"):
            out += {"gemv": GEMV_M, "gemm": GEMM_M, "all": GEMV_M + GEMM_M}[item]
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        else:
            raise argparse.ArgumentTypeError(f"m {item!r} is not a positive integer, gemv, gemm or all")
    if not out:
        raise argparse.ArgumentTypeError("no m given")
    return list(dict.fromkeys(out))  # unique, in order


def parse_formats(text: str) -> list:
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item in FORMAT_GROUPS:
            out += FORMAT_GROUPS[item]
        elif item in FORMATS:
            out.append(item)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown format {item!r}; formats: {', '.join(FORMATS)}; groups: "
                f"{', '.join(FORMAT_GROUPS)}")
    if not out:
        raise argparse.ArgumentTypeError("no formats given")
    return list(dict.fromkeys(out))


def parse_dtype(text: str) -> str:
    t = _DTYPE_ALIASES.get(text.lower(), text.lower())
    if t not in DTYPES:
        raise argparse.ArgumentTypeError(f"dtype must be fp16, bf16 or fp32, got {text!r}")
    return t


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=parse_shapes, default=None,
                    help="N_OUTxK_IN list (default: the five Llama-3 8B/70B layer shapes)")
    ap.add_argument("--m", type=parse_m, default=None,
                    help="rows of x: a list, or gemv (1,2,4,8, default), gemm (16..4096), all")
    ap.add_argument("--formats", type=parse_formats, default=None,
                    help="format names or groups (default, all, kbit, kbit-all, 4bit, gguf); "
                         "e.g. kbit4,kbit4-fp16,nf4,q4_k")
    ap.add_argument("--dtype", type=parse_dtype, default="fp16", help="x and y dtype (fp16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (50)")
    ap.add_argument("--budget", type=float, default=0.5,
                    help="seconds at most per measurement; fewer repeats for slow cases (0.5)")
    ap.add_argument("--quick", action="store_true",
                    help="a small subset (2 shapes, m 1 and 16, kbit4/nf4/q4_k, 20 repeats)")
    ap.add_argument("--json", metavar="PATH", help="write every number here")
    ap.add_argument("--gguf-source", choices=("random", "quantize"), default="random",
                    help="GGUF weights: random valid blocks (default, fast) or the gguf "
                         "package's quantize where it supports the type (slow at large shapes)")
    ap.add_argument("--tol", type=float, default=None,
                    help="relative error allowed by the check (default: 2e-3 fp16, 1.5e-2 "
                         "bf16, 1e-3 fp32)")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="how L2 is emptied before each timed call: write a buffer of twice "
                         "its size (default; L2 then holds dirty lines) or read one (clean "
                         "lines, as between the layers of a decode step)")
    ap.add_argument("--no-bnb", action="store_true", help="do not time bitsandbytes")
    ap.add_argument("--readers", metavar="PATH",
                    help="the read floor's readers (default: BUILD/bench/libkbit_read_floor.so "
                         "where built; without them no %%floor column)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--selftest", action="store_true",
                    help="test the pure-Python parts (no torch or GPU needed) and exit")
    return ap


def resolve_args(argv=None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.quick:  # explicit options still win
        args.shapes = args.shapes or QUICK["shapes"]
        args.m = args.m or QUICK["m"]
        args.formats = args.formats or QUICK["formats"]
        args.repeats = args.repeats or QUICK["repeats"]
    args.shapes = args.shapes or list(DEFAULT_SHAPES)
    args.m = args.m or list(GEMV_M)
    args.formats = args.formats or list(DEFAULT_FORMATS)
    args.repeats = args.repeats or 50
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    args.tol = args.tol if args.tol is not None else DEFAULT_TOL[args.dtype]
    return args


# ---- bytes ------------------------------------------------------------------------

def weight_bytes(fmt: str, n_out: int, k_in: int, elem_bytes: int = 2) -> dict:
    """Stored bytes of W (n_out x k_in) in a format: {'packed', 'scales'}. GGUF blocks
    hold their scales inside, so all of a block counts as 'packed'; a tiled 4-bit weight's
    scales are half when W was fp16 / bf16 (elem_bytes 2: its absmax values are half
    values), else float32. Raises ValueError when k_in is not a multiple of the format's
    block (SPEC 6)."""
    spec = FORMATS[fmt]
    if k_in % spec["block"]:
        raise ValueError(f"k_in = {k_in} is not a multiple of {fmt}'s block of {spec['block']}")
    n = n_out * k_in
    if spec["family"] == "kbit":
        blocks = n // 32
        return {"packed": blocks * spec["k"] * 4, "scales": blocks * _ABSMAX_BYTES[spec["absmax"]]}
    if spec["family"] == "4bit":
        if spec.get("tiled"):
            return {"packed": n // 2, "scales": (2 if elem_bytes == 2 else 4) * (n // 32)}
        return {"packed": n // 2, "scales": 4 * (n // spec["blocksize"])}
    if spec.get("tiled"):  # Q4_0 as kbit K = 4: 4 bits a weight, a half scale a block
        return {"packed": n // 2, "scales": 2 * (n // 32)}
    return {"packed": n // spec["block"] * spec["block_bytes"], "scales": 0}


def case_bytes(fmt: str | None, n_out: int, k_in: int, m: int, elem_bytes: int) -> dict:
    """The minimum traffic of y = x · Wᵀ: W as stored (fmt None: dense in x's dtype),
    x read once, y written once."""
    w = (weight_bytes(fmt, n_out, k_in, elem_bytes) if fmt
         else {"packed": n_out * k_in * elem_bytes, "scales": 0})
    b = {"weight": w["packed"], "scales": w["scales"], "x": m * k_in * elem_bytes,
         "y": m * n_out * elem_bytes}
    b["total"] = sum(b.values())
    return b


def bits_per_weight(fmt: str) -> float:
    n_out, k_in = 1, 4096 * 256  # any k_in that every block divides
    w = weight_bytes(fmt, n_out, k_in)
    return (w["packed"] + w["scales"]) * 8 / (n_out * k_in)


# ---- GGUF blocks ------------------------------------------------------------------

def random_gguf_blocks(ggml: str, n_elements: int, seed: int = 0) -> np.ndarray:
    """Random valid ggml blocks of a type for n_elements (a multiple of its block):
    random bytes, every fp16 scale field a positive finite value near the type's
    typical size (log-normal spread), so weights are ~N(0, 0.02²)-sized and y stays far
    from fp16 overflow. Returns uint8[n_blocks * block_bytes]."""
    _, elems, nbytes, fields = GGUF_TYPES[ggml]
    if n_elements % elems:
        raise ValueError(f"{n_elements} elements is not a multiple of {ggml}'s block of {elems}")
    n_blocks = n_elements // elems
    rng = np.random.default_rng(seed)
    raw = np.frombuffer(bytearray(rng.bytes(n_blocks * nbytes)), dtype=np.uint8)
    blocks = raw.reshape(n_blocks, nbytes)
    for off, typical in fields.items():
        vals = (typical * np.exp(0.3 * rng.standard_normal(n_blocks))).astype(np.float16)
        blocks[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


def gguf_blocks(ggml: str, w_host_f32, n_elements: int, source: str, seed: int):
    """(uint8 blocks, how they were made). w_host_f32: a callable giving W as a float32
    (n_out, k_in) numpy array, called only when the gguf package quantizes."""
    if source == "quantize":
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize
            raw = quantize(w_host_f32(), GGMLQuantizationType[ggml])
            return np.ascontiguousarray(raw).reshape(-1).view(np.uint8), "gguf.quants.quantize of W"
        except NotImplementedError:
            pass  # the package cannot quantize this type: random blocks
    return random_gguf_blocks(ggml, n_elements, seed), "random valid blocks"


# ---- output -----------------------------------------------------------------------

def _fmt(v, spec, missing="-"):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return format(v, spec)


TABLE_COLUMNS = [  # header, width, row -> text
    ("shape", 12, lambda r: f"{r['n_out']}x{r['k_in']}"),
    ("format", 10, lambda r: r["format"]),
    ("m", 5, lambda r: str(r["m"])),
    ("us", 9, lambda r: _fmt(_get(r, "kbit", "median_us"), ".1f")),
    ("host_us", 7, lambda r: _fmt(_get(r, "kbit", "host_us"), ".0f")),
    ("GB/s", 6, lambda r: _fmt(_get(r, "kbit", "gbps"), ".0f")),
    ("%copy", 6, lambda r: _fmt(_get(r, "kbit", "pct_copy"), ".1f")),
    ("%read", 6, lambda r: _fmt(r.get("pct_read"), ".1f")),
    ("%floor", 6, lambda r: _fmt(r.get("pct_floor"), ".1f")),
    ("TF/s", 6, lambda r: _fmt(_get(r, "kbit", "tflops"), ".1f")),
    ("xcuBLAS", 8, lambda r: _fmt(r.get("speedup_cublas"), ".2f")),
    ("xfloor", 7, lambda r: _fmt(r.get("floor_speedup_cublas"), ".2f")),
    ("xdeq+cuB", 8, lambda r: _fmt(r.get("speedup_deq_cublas"), ".2f")),
    ("bnb_us", 8, lambda r: _fmt(_get(r, "bnb", "median_us"), ".1f")),
    ("xbnb", 6, lambda r: _fmt(r.get("speedup_bnb"), ".2f")),
    ("rel_err", 8, lambda r: _fmt(_get(r, "check", "rel_err"), ".1e")),
    ("check", 0, lambda r: _status(r)),
]


def _get(r, key, field):
    d = r.get(key)
    return d.get(field) if isinstance(d, dict) else None


def _status(r) -> str:
    if r.get("error"):
        msg = " ".join(str(r["error"]).split())
        return f"ERROR ({r.get('stage', '?')}): {msg[:70]}"
    chk = r.get("check") or {}
    text = "ok" if chk.get("ok") else "FAIL"
    if _get(r, "kbit", "timing_includes_host"):
        text += " (timing includes host launch time)"
    return text


def format_table(rows: list, title: str = "") -> str:
    """The compact table: one row per shape/format/m."""
    def line(cells):
        return " ".join(c.rjust(w) if w else c for c, (_, w, _f) in zip(cells, TABLE_COLUMNS)).rstrip()
    out = [title] if title else []
    out.append(line([h for h, _w, _f in TABLE_COLUMNS]))
    for r in rows:
        out.append(line([f(r) for _h, _w, f in TABLE_COLUMNS]))
    return "\n".join(out)


def format_cublas_table(cublas: dict, dtype: str) -> str:
    lines = [f"cuBLAS {dtype} (torch.matmul, dense W) and the copy it is compared with:",
             f"{'shape':>12} {'m':>5} {'us':>9} {'GB/s':>6} {'%copy':>6} {'TF/s':>6}"]
    for key, c in cublas.items():
        if c.get("error"):
            lines.append(f"{key:>12}: ERROR {c['error'][:80]}")
            continue
        lines.append(f"{c['shape']:>12} {c['m']:>5} {_fmt(c.get('median_us'), '9.1f')} "
                     f"{_fmt(c.get('gbps'), '6.0f')} {_fmt(c.get('pct_copy'), '6.1f')} "
                     f"{_fmt(c.get('tflops'), '6.1f')}")
    return "\n".join(lines)


def _jsonable(o):
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating, float)):
        return float(o) if math.isfinite(o) else None
    return o


def write_json(path: str, doc: dict):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_jsonable(doc), f, indent=1)
    os.replace(tmp, path)


# ---- GPU part ---------------------------------------------------------------------

class Timer:
    """Times a callable with CUDA events, L2 flushed and the launch hidden (see the
    module docstring)."""

    def __init__(self, torch, repeats: int, budget_s: float, flush_mode: str = "write"):
        self.torch = torch
        self.flush_mode = flush_mode
        self.repeats = repeats
        self.budget_s = budget_s
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
        self.flush_bytes = 2 * self.l2_bytes if self.l2_bytes else 256 << 20
        self.flush_buf = torch.zeros(self.flush_bytes, dtype=torch.uint8, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.cycles_per_us = self._calibrate_sleep()
        self._flush_count = 0
        self.flush_us = self._time_flush()

    def _time_flush(self) -> float:
        """The flush's own time (work queued ahead of every timed call, with the spin)."""
        times = []
        for _ in range(5):
            self.start.record()
            self.flush()
            self.stop.record()
            self.stop.synchronize()
            times.append(self.start.elapsed_time(self.stop) * 1e3)
        return statistics.median(times)

    def _calibrate_sleep(self):
        """SM clock cycles per microsecond for torch.cuda._sleep, measured after a
        spin of ~0.1 s so that the clocks have left idle."""
        if self.sleep is None:
            return None
        try:
            cycles = 2_000_000
            self.sleep(200_000_000)
            self.start.record()
            self.sleep(cycles)
            self.stop.record()
            self.stop.synchronize()
            us = self.start.elapsed_time(self.stop) * 1e3
            return cycles / us if us > 0 else None
        except Exception:
            return None

    def flush(self):
        """write: fill the buffer (L2 is left full of dirty lines, which the timed call's
        misses must write back first); read: read it (L2 left holding clean lines, as after
        a layer that read its weights)."""
        self._flush_count += 1
        if self.flush_mode == "read":
            self.flush_buf.max()
        else:
            self.flush_buf.fill_(self._flush_count & 0xFF)

    def spin(self, us: float):
        if self.cycles_per_us and us > 0:
            self.sleep(int(us * self.cycles_per_us))

    def measure(self, fn, repeats: int | None = None) -> dict:
        torch = self.torch
        repeats = repeats or self.repeats
        host = []
        for _ in range(3):  # warm-up; the host cost of a call without synchronising
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        host_us = statistics.median(host)
        # a spin long enough for the host to enqueue start + fn + stop behind it
        # (generous: it costs wall time only, and clocks may still rise)
        spin_us = min(3.0 * host_us + 30.0, 20000.0) if self.cycles_per_us else 0.0
        runs = [self._one(fn, spin_us)]
        per_rep_s = (runs[0][0] + spin_us) * 1e-6 + 2e-4  # + flush and Python per repeat
        reps = min(repeats, max(5, int(self.budget_s / per_rep_s)))
        runs += [self._one(fn, spin_us) for _ in range(reps - 1)]
        times = sorted(t for t, _ in runs)
        host_in_rep = statistics.median(h for _, h in runs)
        res = {"median_us": statistics.median(times), "min_us": times[0],
               "p90_us": times[min(len(times) - 1, int(0.9 * len(times)))],
               "reps": len(times), "host_us": host_us, "spin_us": spin_us}
        # The call took longer on the host than the GPU had queued work (or it
        # synchronised): the GPU waited for the launch, and that wait was timed.
        if host_in_rep > spin_us + self.flush_us:
            res["timing_includes_host"] = True
            res["host_us_in_timed_call"] = host_in_rep
        return res

    def _one(self, fn, spin_us):
        """(device us between the events, host us of the call)."""
        self.flush()
        self.spin(spin_us)
        self.start.record()
        t0 = time.perf_counter()
        fn()
        host = (time.perf_counter() - t0) * 1e6
        self.stop.record()
        self.stop.synchronize()
        return self.start.elapsed_time(self.stop) * 1e3, host


def with_rates(t: dict, nbytes: int, flops: float, copy_gbps: float | None) -> dict:
    us = t["median_us"]
    t["bytes"] = nbytes
    t["gbps"] = nbytes / (us * 1e-6) / 1e9 if us > 0 else None
    t["pct_copy"] = 100.0 * t["gbps"] / copy_gbps if copy_gbps and t["gbps"] else None
    t["tflops"] = flops / (us * 1e-6) / 1e12 if us > 0 else None
    return t


def measure_copy(torch, timer: Timer, repeats: int) -> dict:
    """Device-to-device copy of 1 GiB (less if memory is short), timed like a case:
    bandwidth = (read + written bytes) / median time."""
    size = 1 << 30
    free = torch.cuda.mem_get_info()[0]
    while 2 * size > free // 2 and size > 64 << 20:
        size //= 2
    src = torch.empty(size, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    t = timer.measure(lambda: dst.copy_(src), repeats=max(repeats, 20))
    t["buffer_bytes"] = size
    t["gbps"] = 2 * size / (t["median_us"] * 1e-6) / 1e9
    del src, dst
    return t


def _err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class Bench:
    def __init__(self, args):
        import torch
        import kbit
        self.torch, self.kbit, self.args = torch, kbit, args
        if not torch.cuda.is_available():
            raise SystemExit("bench_matmul: PyTorch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
        torch.backends.cudnn.allow_tf32 = False
        self.dtype_name, self.elem_bytes = DTYPES[args.dtype]
        self.tdtype = getattr(torch, self.dtype_name)
        self.timer = Timer(torch, args.repeats, args.budget, args.flush)
        self.read_buf = None  # the read floor's buffer (grown to the largest case)
        self.readers, self.readers_note = None, None  # bench/readers.py's, where built
        try:
            self.readers = Readers(torch, args.readers)
            self.floor_configs = floor_configs(self.readers.sms)
            self.readers_note = self.readers.path
        except (OSError, AttributeError) as e:  # not built, or not loadable here
            if args.readers:
                raise SystemExit(f"bench_matmul: --readers {args.readers}: {_err_text(e)}")
            self.readers_note = f"not timed: {_err_text(e)[:200]}"
        self.bnb = None
        self.bnb_note = "not requested (--no-bnb)" if args.no_bnb else None
        if not args.no_bnb:
            try:
                import bitsandbytes
                import bitsandbytes.functional
                self.bnb = bitsandbytes
                self.bnb_note = f"bitsandbytes {getattr(bitsandbytes, '__version__', '?')}"
            except Exception as e:  # not installed, or no binary for this CUDA
                self.bnb_note = f"not timed: {_err_text(e)[:200]}"
        self.rows: list = []
        self.cublas: dict = {}
        self.fatal = None

    # -- setup ----------------------------------------------------------------------

    def device_info(self) -> dict:
        torch, kbit = self.torch, self.kbit
        dev = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(dev)
        info = {"device": p.name, "sms": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "l2_bytes": self.timer.l2_bytes, "flush_bytes": self.timer.flush_bytes,
                "flush_us": self.timer.flush_us, "flush_mode": self.timer.flush_mode,
                "sleep_cycles_per_us": self.timer.cycles_per_us,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "torch": torch.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "bitsandbytes": self.bnb_note,
                "readers": self.readers_note}
        try:
            info["kbit_version"] = kbit.version()
        except Exception as e:
            info["kbit_version"] = _err_text(e)
        try:
            import gguf
            info["gguf"] = getattr(gguf, "__version__", "installed")
        except Exception:
            info["gguf"] = None
        return info

    def read_buffer(self, nbytes: int):
        """A float32 view of nbytes (rounded down to 4) of a zeroed device buffer."""
        torch, n = self.torch, max(nbytes // 4, 1)
        if self.read_buf is None or self.read_buf.numel() < n:
            self.read_buf = None
            self.read_buf = torch.zeros(n, dtype=torch.float32, device="cuda")
        return self.read_buf[:n]

    def measure_copy(self) -> dict:
        return measure_copy(self.torch, self.timer, self.args.repeats)

    def event_floor(self) -> dict:
        """Two events with nothing between them, timed the same way: the resolution
        floor under every number (not subtracted)."""
        return self.timer.measure(lambda: None)

    def kbit_quantize(self, w, spec):
        params = inspect.signature(self.kbit.quantize).parameters
        key = "absmax_format" if "absmax_format" in params else "absmax"
        return self.kbit.quantize(w, k=spec["k"], **{key: spec["absmax"]})

    def make_weight(self, fmt, spec, w_dense, n_out, k_in, seed):
        """(container for kbit.matmul, dequantize(dtype, out=None) callable, how W was
        made, the object whose size is W's stored bytes)."""
        kbit, torch = self.kbit, self.torch
        n = n_out * k_in
        if spec["family"] == "kbit":
            q = self.kbit_quantize(w_dense, spec)
            deq = lambda dt, out=None: kbit.dequantize(q, dtype=dt, out=out)  # noqa: E731
            if spec.get("tiled"):
                return kbit.tile(q), deq, \
                    "N(0, 0.02^2) quantized by kbit.quantize on the GPU, then kbit.tile", q
            return q, deq, "N(0, 0.02^2) quantized by kbit.quantize on the GPU", q
        if spec["family"] == "4bit":
            q = kbit.quantize_4bit(w_dense, spec["quant_type"], spec["blocksize"])
            deq = lambda dt, out=None: kbit.dequantize_4bit(q, out=out, dtype=dt)  # noqa: E731
            how = f"N(0, 0.02^2) quantized by kbit.quantize_{spec['quant_type']} on the GPU"
            if spec.get("tiled"):
                t = kbit.tile(q)
                return t, deq, how + ", then kbit.tile", t
            return q, deq, how, q
        raw, source = gguf_blocks(spec["ggml"],
                                  lambda: w_dense.float().cpu().numpy().reshape(n_out, k_in),
                                  n, self.args.gguf_source, seed)
        blocks = torch.from_numpy(raw).to("cuda")
        tid = spec["type_id"]
        w = kbit.gguf.GGUFTensor(blocks=blocks, ggml_type=tid, shape=(n_out, k_in))
        deq = lambda dt, out=None: kbit.gguf.dequantize(blocks, tid, n, dt, out=out)  # noqa: E731
        if spec.get("tiled"):
            t = kbit.tile(w)
            return t, deq, source + ", then kbit.tile (kbit.gguf.to_kbit)", t
        return w, deq, source, blocks

    def stored_bytes(self, obj) -> int | None:
        """What the container actually holds, to cross-check weight_bytes()."""
        nb = getattr(obj, "nbytes", None)
        if isinstance(nb, int):
            return nb
        if hasattr(obj, "numel") and hasattr(obj, "element_size"):
            return int(obj.numel() * obj.element_size())
        return None

    # -- the run --------------------------------------------------------------------

    def check_alive(self) -> bool:
        """After an exception: False (and self.fatal set) when the CUDA context is broken
        (illegal address, ...), which ends the run: later numbers would be meaningless."""
        if self.fatal:
            return False
        try:
            self.torch.cuda.synchronize()
            return True
        except Exception as e:
            self.fatal = _err_text(e)
            print(f"!!! CUDA context broken, stopping: {self.fatal}", file=sys.stderr, flush=True)
            return False

    def run_shape(self, n_out, k_in, copy_gbps):
        torch, args = self.torch, self.args
        gen = torch.Generator(device="cuda").manual_seed(args.seed)
        w_dense = torch.randn(n_out, k_in, device="cuda", generator=gen, dtype=self.tdtype).mul_(0.02)
        xs = {m: torch.randn(m, k_in, device="cuda", generator=gen, dtype=self.tdtype) for m in args.m}
        shape = f"{n_out}x{k_in}"
        for m in args.m:  # cuBLAS on the dense W, once per shape and m
            key = f"{shape} m={m}"
            flops = 2.0 * m * n_out * k_in
            try:
                x = xs[m]
                t = self.timer.measure(lambda: torch.matmul(x, w_dense.t()))
                self.cublas[key] = dict(shape=shape, m=m, **with_rates(
                    t, case_bytes(None, n_out, k_in, m, self.elem_bytes)["total"], flops, copy_gbps))
            except Exception as e:
                self.cublas[key] = {"shape": shape, "m": m, "error": _err_text(e)}
                if not self.check_alive():
                    return
        scratch = torch.empty(n_out, k_in, dtype=self.tdtype, device="cuda")
        for fmt in args.formats:
            self.run_format(fmt, n_out, k_in, w_dense, xs, scratch, copy_gbps)
            if self.fatal:
                return

    def run_format(self, fmt, n_out, k_in, w_dense, xs, scratch, copy_gbps):
        torch, kbit, args = self.torch, self.kbit, self.args
        spec = FORMATS[fmt]
        shape = f"{n_out}x{k_in}"
        base = {"n_out": n_out, "k_in": k_in, "shape": shape, "format": fmt, "dtype": args.dtype,
                "bits_per_weight": bits_per_weight(fmt)}
        rows = [dict(base, m=m) for m in args.m]
        for r in rows:
            try:
                r["bytes"] = case_bytes(fmt, n_out, k_in, r["m"], self.elem_bytes)
            except ValueError as e:
                r.update(error=str(e), stage="shape")
        if any(r.get("error") for r in rows):
            self.rows += rows
            return
        print(f"[{shape} {fmt}] setting up", file=sys.stderr, flush=True)
        w = dequant = w32 = keep = bnb_state = None
        try:
            w, dequant, source, keep = self.make_weight(
                fmt, spec, w_dense, n_out, k_in, args.seed + 1 + list(FORMATS).index(fmt))
            for r in rows:
                r["weight_source"] = source
            stored = self.stored_bytes(keep)
            want = rows[0]["bytes"]["weight"] + rows[0]["bytes"]["scales"]
            if stored is not None and stored != want:
                for r in rows:
                    r["bytes_note"] = f"container holds {stored} bytes, counted {want}"
            w32 = dequant("float32").reshape(n_out, k_in)  # the check's W
        except Exception as e:
            for r in rows:
                r.update(error=_err_text(e), stage="setup")
            print(f"[{shape} {fmt}] setup failed: {_err_text(e)}", file=sys.stderr, flush=True)
            self.rows += rows
            self.check_alive()
            return
        if self.bnb is not None and spec["family"] == "4bit":
            try:
                import bitsandbytes.functional as bnbF
                packed, state = bnbF.quantize_4bit(w_dense, blocksize=spec["blocksize"],
                                                   quant_type=spec["quant_type"])
                bnb_state = (packed, state)
            except Exception as e:
                for r in rows:
                    r["bnb"] = {"error": _err_text(e)}
        for r in rows:
            try:
                self.run_case(r, spec, w, dequant, w32, xs[r["m"]], scratch, bnb_state, copy_gbps)
            except Exception as e:  # the reference itself (e.g. out of memory)
                r.update(error=_err_text(e), stage="reference")
                self.check_alive()
            self.rows.append(r)
            if self.fatal:
                return

    def run_case(self, r, spec, w, dequant, w32, x, scratch, bnb_state, copy_gbps):
        torch, kbit, args = self.torch, self.kbit, self.args
        m, n_out, k_in = r["m"], r["n_out"], r["k_in"]
        flops = 2.0 * m * n_out * k_in
        nbytes = r["bytes"]["total"]
        label = f"[{r['shape']} {r['format']} m={m}]"
        cub = self.cublas.get(f"{r['shape']} m={m}", {})
        r["cublas_us"] = cub.get("median_us")
        y_ref = torch.matmul(x.float(), w32.t())
        ref_norm = float(torch.linalg.norm(y_ref.double()))

        def rel_err(y):
            if tuple(y.shape) != (m, n_out):
                raise RuntimeError(f"y has shape {tuple(y.shape)}, expected {(m, n_out)}")
            if y.dtype != self.tdtype:
                raise RuntimeError(f"y has dtype {y.dtype}, expected {self.tdtype}")
            diff = float(torch.linalg.norm((y.double() - y_ref.double())))
            return diff / ref_norm if ref_norm > 0 else diff

        # 1. check, then time, the fused kernel
        stage = "check"
        try:
            y = kbit.matmul(x, w)
            torch.cuda.synchronize()
            err = rel_err(y)
            ok = math.isfinite(err) and err <= args.tol
            r["check"] = {"rel_err": err, "tol": args.tol, "ok": ok}
            del y
            if not ok:
                msg = (f"!!! CHECK FAILED {label}: relative error {err:.3e} > {args.tol:.1e} "
                       "against the fp32 matmul of x and kbit's dequantized W")
                print(msg, flush=True)
                print(msg, file=sys.stderr, flush=True)
            stage = "time"
            r["kbit"] = with_rates(self.timer.measure(lambda: kbit.matmul(x, w)), nbytes, flops,
                                   copy_gbps)
        except Exception as e:
            r.update(error=_err_text(e), stage=stage)
            r["traceback"] = traceback.format_exc(limit=4)
            if not self.check_alive():
                return

        # 2. dequantize into a preallocated scratch + cuBLAS; 3. bitsandbytes' own NF4/FP4
        # path (its GEMV kernel at m = 1), which quantizes W to the same bytes, so the same
        # reference holds
        flat = scratch.view(-1)

        def deq_mm():
            dequant(self.dtype_name, out=flat)
            return torch.matmul(x, scratch.t())
        peers = [("deq_cublas", deq_mm)]
        if bnb_state is not None:
            packed, state = bnb_state
            peers.append(("bnb", lambda: self.bnb.matmul_4bit(x, packed.t(), quant_state=state)))
        for key, fn in peers:
            try:
                y = fn()
                torch.cuda.synchronize()
                r[key] = {"rel_err": rel_err(y)}
                del y
                r[key].update(with_rates(self.timer.measure(fn), nbytes, flops, copy_gbps))
            except Exception as e:
                r[key] = {"error": _err_text(e)}
                if not self.check_alive():
                    return

        # 4. the read floor: a read-only stream of the same bytes (torch.sum), and the
        # fastest of the read-only kernels where built
        try:
            buf = self.read_buffer(nbytes)
            r["read"] = with_rates(self.timer.measure(lambda: buf.sum()), nbytes, 0.0, copy_gbps)
            if self.readers:
                r["floor"] = self.readers.floor(self.timer, buf.data_ptr(), nbytes,
                                                self.floor_configs,
                                                log=lambda msg: print(msg, file=sys.stderr))
        except Exception as e:
            r["read"] = r.get("read") or {"error": _err_text(e)}
            if self.readers:
                r["floor"] = {"error": _err_text(e)}
            if not self.check_alive():
                return

        floor_us = _get(r, "floor", "median_us")
        r["floor_speedup_cublas"] = r.get("cublas_us") / floor_us \
            if floor_us and r.get("cublas_us") else None
        kt = _get(r, "kbit", "median_us")
        if kt:
            for key, peer in (("speedup_cublas", r.get("cublas_us")),
                              ("speedup_deq_cublas", _get(r, "deq_cublas", "median_us")),
                              ("speedup_bnb", _get(r, "bnb", "median_us"))):
                r[key] = peer / kt if peer else None
            for key, floor in (("pct_read", _get(r, "read", "median_us")),
                               ("pct_floor", _get(r, "floor", "median_us"))):
                r[key] = 100.0 * floor / kt if floor else None
        del y_ref
        print(f"{label} {_status(r)} {_fmt(kt, '.1f')} us, x{_fmt(r.get('speedup_cublas'), '.2f')} "
              f"cuBLAS", file=sys.stderr, flush=True)


def run(args) -> int:
    t_start = time.time()
    bench = Bench(args)
    doc = {"benchmark": "kbit.matmul (bench/bench_matmul.py)", "argv": sys.argv[1:],
           "settings": {"shapes": [f"{a}x{b}" for a, b in args.shapes], "m": args.m,
                        "formats": args.formats, "dtype": args.dtype, "repeats": args.repeats,
                        "budget_s": args.budget, "tol": args.tol, "gguf_source": args.gguf_source,
                        "seed": args.seed, "tf32": False},
           "method": ("median of CUDA-event times of one call, L2 flushed (2x L2 written) and "
                      "a GPU spin before each timed call, neither timed; bytes = W stored + x + y "
                      "(the fused kernel's minimum traffic; deq_cublas and bnb GB/s are effective "
                      "rates on those same bytes, cublas GB/s on the dense W; read = torch.sum over a "
                      "float32 buffer of the same bytes, the read-only floor; floor = the fastest "
                      "of bench/readers.py's floor_configs on them); GGUF weights are "
                      "random valid blocks unless --gguf-source quantize"),
           "rows": bench.rows, "cublas": bench.cublas}
    status = 0
    try:
        doc.update(bench.device_info())
        print(f"device: {doc['device']} ({doc['sms']} SMs, L2 {doc['l2_bytes'] >> 20} MiB), "
              f"torch {doc['torch']}, CUDA {doc['cuda']}, libkbit {doc.get('kbit_version')}, "
              f"bitsandbytes: {doc['bitsandbytes']}; read floor's readers: {doc['readers']}", flush=True)
        doc["copy"] = bench.measure_copy()
        copy_gbps = doc["copy"]["gbps"]
        doc["event_floor"] = bench.event_floor()
        print(f"device-to-device copy of {doc['copy']['buffer_bytes'] >> 20} MiB: "
              f"{copy_gbps:.0f} GB/s (read + written); empty event pair: "
              f"{doc['event_floor']['median_us']:.1f} us", flush=True)
        if any(FORMATS[f]["family"] == "gguf" for f in args.formats):
            print("GGUF weights: " + ("random valid blocks (fp16 scales small and finite); the "
                                      "speed does not depend on the values" if args.gguf_source == "random"
                                      else "gguf.quants.quantize where supported, else random valid blocks"),
                  flush=True)
        doc["shape_errors"] = {}
        for n_out, k_in in args.shapes:
            try:
                bench.run_shape(n_out, k_in, copy_gbps)
            except Exception as e:  # allocating the shape's W, x or scratch
                doc["shape_errors"][f"{n_out}x{k_in}"] = _err_text(e)
                print(f"!!! shape {n_out}x{k_in} failed: {_err_text(e)}", flush=True)
                bench.check_alive()
            bench.torch.cuda.empty_cache()
            if args.json:
                write_json(args.json, doc)
            if bench.fatal:
                break
    except Exception as e:
        if bench.fatal is None:
            bench.fatal = _err_text(e)
        traceback.print_exc()
    finally:
        doc["fatal"] = bench.fatal
        doc["wall_s"] = time.time() - t_start
        if args.json:
            write_json(args.json, doc)

    print()
    print(format_cublas_table(bench.cublas, args.dtype))
    print()
    errors = [r for r in bench.rows if r.get("error")]
    failed = [r for r in bench.rows if not r.get("error") and not (r.get("check") or {}).get("ok")]
    print(format_table(bench.rows, f"kbit.matmul, x {args.dtype}; us = median, GB/s on W stored + "
                                    f"x + y, %copy of {doc.get('copy', {}).get('gbps', 0):.0f} GB/s, "
                                    "xcuBLAS = cuBLAS us / kbit us, xfloor = cuBLAS us / floor us"))
    print(f"\n{len(bench.rows)} case(s), {len(errors)} error(s), {len(failed)} check failure(s), "
          f"{doc['wall_s']:.0f} s" + (f"; JSON: {args.json}" if args.json else ""))
    if failed:
        print("!!! CHECK FAILURES: " + ", ".join(f"{r['shape']} {r['format']} m={r['m']}" for r in failed))
        status = 1
    if doc.get("shape_errors"):
        print("!!! SHAPES THAT FAILED: " + "; ".join(f"{k}: {v}" for k, v in doc["shape_errors"].items()))
        status = 1
    if errors:
        status = 1
    if bench.fatal:
        print(f"!!! RUN STOPPED: {bench.fatal}")
        status = 1
    return status


# ---- self-test (no torch, no GPU) ------------------------------------------------

def selftest() -> int:
    checks = 0

    def expect(cond, what):
        nonlocal checks
        checks += 1
        if not cond:
            raise AssertionError(what)

    # arguments
    a = resolve_args([])
    expect(a.shapes == DEFAULT_SHAPES and a.m == GEMV_M and a.formats == DEFAULT_FORMATS
           and a.dtype == "fp16" and a.repeats == 50 and a.tol == 2e-3, "defaults")
    expect(len(a.shapes) * len(a.formats) * len(a.m) == 300, "default case count")
    a = resolve_args(["--quick"])
    expect(a.shapes == QUICK["shapes"] and a.m == QUICK["m"] and a.repeats == 20, "quick")
    a = resolve_args(["--quick", "--m", "1", "--formats", "q8_0"])
    expect(a.m == [1] and a.formats == ["q8_0"] and a.shapes == QUICK["shapes"], "quick + explicit")
    a = resolve_args(["--shapes", "4096x4096, 8192X28672", "--m", "gemv,16,1", "--dtype", "bfloat16",
                      "--formats", "kbit,kbit4-fp16,Q4_K,gguf", "--json", "/tmp/x.json"])
    expect(a.shapes == [(4096, 4096), (8192, 28672)], "shapes")
    expect(a.m == [1, 2, 4, 8, 16], "m list")
    expect(a.dtype == "bf16" and a.tol == 1.5e-2, "dtype alias and tol")
    expect(a.formats == ["kbit2", "kbit3", "kbit4", "kbit5", "kbit4-fp16", "q4_k",
                         "q4_0", "q8_0", "q5_k", "q6_k"], f"formats {a.formats}")
    expect(resolve_args(["--m", "all"]).m == GEMV_M + GEMM_M, "m all")
    expect(len(resolve_args(["--formats", "all"]).formats) == 24 + 4 + 6, "all formats")
    for bad in (["--shapes", "4096"], ["--shapes", "0x4096"], ["--m", "0"], ["--m", "x"],
                ["--formats", "q3_k"], ["--dtype", "int8"]):
        try:
            import contextlib
            import io
            with contextlib.redirect_stderr(io.StringIO()):
                resolve_args(bad)
            expect(False, f"{bad} accepted")
        except SystemExit:
            expect(True, "")

    # bytes: 4096 x 4096, m = 1, fp16
    n = 4096 * 4096
    b = case_bytes("kbit4", 4096, 4096, 1, 2)
    expect(b == {"weight": n // 32 * 16, "scales": n // 32, "x": 8192, "y": 8192,
                 "total": n // 32 * 17 + 16384}, f"kbit4 bytes {b}")
    expect(case_bytes("kbit3-fp32", 4096, 4096, 1, 2)["scales"] == n // 32 * 4, "fp32 absmax")
    expect(case_bytes("kbit2-fp16", 4096, 4096, 1, 2)["weight"] == n // 32 * 8, "kbit2 packed")
    expect(case_bytes("nf4", 4096, 4096, 1, 2)["weight"] == n // 2, "nf4 packed")
    expect(case_bytes("fp4", 4096, 4096, 1, 2)["scales"] == n // 64 * 4, "fp4 absmax")
    expect(case_bytes("q4_0", 4096, 4096, 1, 2)["weight"] == n // 32 * 18, "q4_0")
    expect(case_bytes("q6_k", 4096, 4096, 1, 2)["weight"] == n // 256 * 210, "q6_k")
    expect(case_bytes(None, 14336, 4096, 8, 2) == {"weight": 14336 * 4096 * 2, "scales": 0,
                                                     "x": 8 * 4096 * 2, "y": 8 * 14336 * 2,
                                                     "total": 14336 * 4096 * 2 + 8 * 18432 * 2},
           "dense bytes")
    expect(case_bytes("q8_0", 28672, 8192, 4096, 4)["x"] == 4096 * 8192 * 4, "fp32 x")
    bpw = {f: bits_per_weight(f) for f in FORMATS}
    for f, want in {"kbit2": 2.25, "kbit3": 3.25, "kbit4": 4.25, "kbit5": 5.25, "kbit4-fp16": 4.5,
                    "kbit4-fp32": 5.0, "nf4": 4.5, "fp4": 4.5, "q4_0": 4.5, "q8_0": 8.5,
                    "q4_0-tiled": 4.5, "q4_k": 4.5, "q5_k": 5.5, "q6_k": 6.5625}.items():
        expect(abs(bpw[f] - want) < 1e-12, f"{f} bits/weight {bpw[f]} != {want}")
    try:
        weight_bytes("q4_k", 16, 4096 + 32)
        expect(False, "k_in not a multiple of 256 accepted")
    except ValueError:
        expect(True, "")

    # GGUF random blocks: sizes, scale fields, values through the gguf package
    try:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize
    except ImportError:
        gguf_dequantize = None
        print("selftest: gguf not installed, random blocks not dequantized")
    for name, (tid, elems, nbytes, fields) in GGUF_TYPES.items():
        n_el = 64 * 1024
        raw = random_gguf_blocks(name, n_el, seed=3)
        expect(raw.dtype == np.uint8 and raw.size == n_el // elems * nbytes, f"{name} size")
        expect(raw.size == case_bytes(name.lower(), 64, 1024, 1, 2)["weight"], f"{name} vs bytes")
        blocks = raw.reshape(-1, nbytes)
        for off, typical in fields.items():
            s = np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16).astype(np.float32)
            expect(np.all(np.isfinite(s)) and np.all(s > 0), f"{name} scale at {off}")
            expect(0.2 * typical < np.median(s) < 5 * typical, f"{name} scale size")
        expect(np.array_equal(raw, random_gguf_blocks(name, n_el, seed=3)), f"{name} deterministic")
        if gguf_dequantize is not None:
            expect(GGMLQuantizationType[name].value == tid, f"{name} type id")
            with np.errstate(all="raise"):
                w = gguf_dequantize(raw, GGMLQuantizationType[name]).astype(np.float64)
            rms = float(np.sqrt(np.mean(w ** 2)))
            expect(w.size == n_el and np.all(np.isfinite(w)), f"{name} dequantized values")
            expect(0.005 < rms < 0.1, f"{name} weight rms {rms}")
            # y = x . w with x ~ N(0,1) and the largest k_in stays far below fp16's 65504
            expect(math.sqrt(28672) * rms * 8 < 65504 / 10, f"{name} fp16 headroom")
    for name in ("Q4_0", "Q8_0"):  # --gguf-source quantize where the package can
        w = (np.random.default_rng(1).standard_normal((4, 256)) * 0.02).astype(np.float32)
        raw, src = gguf_blocks(name, lambda: w, w.size, "quantize", 0)
        expect(raw.size == case_bytes(name.lower(), 4, 256, 1, 2)["weight"], f"{name} quantize")
    raw, src = gguf_blocks("Q6_K", None, 512, "random", 0)
    expect(src == "random valid blocks" and raw.size == 420, "random source")

    # table and JSON, with every kind of row
    ok = {"n_out": 4096, "k_in": 4096, "shape": "4096x4096", "format": "kbit4", "m": 1,
          "check": {"rel_err": 3.1e-4, "ok": True, "tol": 2e-3},
          "kbit": {"median_us": 4.2, "gbps": 2125.3, "pct_copy": 70.1, "tflops": 0.008},
          "speedup_cublas": 3.1, "speedup_deq_cublas": 4.4, "bnb": {"median_us": 9.0},
          "speedup_bnb": 2.14, "cublas_us": 13.0, "read": {"median_us": 3.9}, "pct_read": 92.9,
          "floor": {"median_us": 3.5, "by": "ldg"}, "pct_floor": 83.3,
          "floor_speedup_cublas": 13.0 / 3.5}
    fail = dict(ok, format="q6_k", check={"rel_err": float("nan"), "ok": False}, bnb=None,
                speedup_bnb=None)
    err = {"n_out": 28672, "k_in": 8192, "shape": "28672x8192", "format": "kbit4-fp32", "m": 4096,
           "error": "KbitError: kbit_matmul_kbit: not supported\n yet", "stage": "check",
           "bnb": {"error": "x"}}
    table = format_table([ok, fail, err], "title")
    lines = table.splitlines()
    expect(len(lines) == 5 and lines[0] == "title", "table lines")
    expect(lines[2].endswith(" ok") and "4.2" in lines[2] and "3.10" in lines[2]
           and "2.14" in lines[2] and "3.1e-04" in lines[2] and " 92.9   83.3 " in lines[2]
           and " 3.10    3.71 " in lines[2],
           f"ok row: {lines[2]}")
    expect(lines[3].endswith("FAIL"), f"fail row: {lines[3]}")
    expect("ERROR (check): KbitError: kbit_matmul_kbit: not supported yet" in lines[4],
           f"error row: {lines[4]}")
    slow = dict(ok, kbit=dict(ok["kbit"], timing_includes_host=True))
    expect(_status(slow) == "ok (timing includes host launch time)", "host-bound flag")
    cub = {"4096x4096 m=1": {"shape": "4096x4096", "m": 1, "median_us": 13.0, "gbps": 2581.0,
                             "pct_copy": 85.0, "tflops": 2.6},
           "4096x4096 m=2": {"shape": "4096x4096", "m": 2, "error": "boom"}}
    expect(len(format_cublas_table(cub, "fp16").splitlines()) == 4, "cublas table")
    text = json.dumps(_jsonable({"rows": [ok, fail, err], "x": np.int64(3), "t": (1, 2.5)}))
    expect('"rel_err": null' in text and '"x": 3' in text, "json")
    print(table)
    print(f"selftest: {checks} checks passed")
    return 0


def main(argv=None) -> int:
    args = resolve_args(argv)
    if args.selftest:
        return selftest()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
