"""The read-only kernels of bench/read_floor.cu, from Python: their configurations, the
library's loading, and each configuration's time on a buffer's first bytes, timed by a
caller's bench_matmul.Timer. Used by bench/read_floor.py (every configuration, every
target) and bench/bench_matmul.py (the `floor` column: floor_configs() beside each case).
"""
from __future__ import annotations

import ctypes
import os

HINTS = {0: "plain", 1: "nc.no_alloc", 2: "nc.L2::256B", 3: "nc.256B.evict_first"}
WALKS = {0: "even", 1: "round-robin", 2: "counter"}


def ldg(hint: int, unroll: int, ctas: int, threads: int) -> dict:
    return {"kind": "ldg", "hint": hint, "unroll": unroll, "ctas": ctas, "threads": threads}


def bulk(walk: int, stage: int, ring: int, ctas: int, evict_first: int = 1) -> dict:
    return {"kind": "bulk", "walk": walk, "stage": stage, "ring": ring, "ctas": ctas,
            "evict_first": evict_first}


def reader_configs(sms: int, quick: bool = False) -> list[dict]:
    """Every configuration read_floor.py tries on a case."""
    ldg_shapes = [(4, sms * 4, 256), (8, sms * 4, 256), (8, sms * 2, 512), (4, sms * 8, 256)]
    bulk_shapes = [(16 << 10, 8, sms), (32 << 10, 6, sms), (16 << 10, 6, 2 * sms)]
    if quick:
        ldg_shapes, bulk_shapes = ldg_shapes[:2], bulk_shapes[:1]
    out = [ldg(hint, *s) for hint in HINTS for s in ldg_shapes]
    out += [bulk(walk, *s) for walk in WALKS for s in bulk_shapes]
    out.append(bulk(2, 16 << 10, 8, sms, evict_first=0))
    return out


def floor_configs(sms: int) -> list[dict]:
    """The readers that were the fastest on some case of read_floor.py's run on an H100
    (bench/RESULTS.md, session 35; on its largest weight the 26 were within 3.7%):
    bench_matmul's `floor` is the fastest of these five."""
    return [bulk(1, 16 << 10, 8, sms),             # most weights of 66-250 MB
            ldg(2, 8, sms * 2, 512),               # K = 4, Q5_K, Q6_K
            ldg(3, 4, sms * 4, 256),               # K = 3
            ldg(1, 4, sms * 4, 256),               # 9 MB (4096x4096)
            bulk(2, 16 << 10, 8, sms, evict_first=0)]  # fp16's 470 MB


def config_name(c: dict) -> str:
    if c["kind"] == "ldg":
        return f"ldg {HINTS[c['hint']]} u{c['unroll']} {c['ctas']}x{c['threads']}"
    ef = "" if c["evict_first"] else " normal"
    return f"bulk {WALKS[c['walk']]} {c['stage'] >> 10}K x{c['ring']} {c['ctas']} CTAs{ef}"


class ReaderError(RuntimeError):
    """A reader's launch refused (its configuration does not fit this GPU)."""


# cudaError_t values that refuse a configuration (invalid value or configuration, out of
# resources, not supported: no sm_90 bulk copies); any other is a fault, not a refusal
REFUSALS = {1: "invalid value", 9: "invalid configuration", 701: "out of resources",
            801: "not supported"}


def _ok(rc: int):
    if rc in REFUSALS:
        raise ReaderError(f"reader launch refused: cudaError {rc} ({REFUSALS[rc]})")
    if rc != 0:
        raise RuntimeError(f"reader launch failed: cudaError {rc}")


def load_library(path: str | None = None):
    """(the readers' ctypes library, its path): `path`, else $BUILD/bench, build/bench or
    build90/bench's libkbit_read_floor.so. FileNotFoundError names the places tried."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [path] if path else [
        os.path.join(here, "..", d, "bench", "libkbit_read_floor.so")
        for d in (os.environ.get("BUILD", "build"), "build", "build90")]
    for p in candidates:
        if p and os.path.exists(p):
            lib = ctypes.CDLL(os.path.abspath(p))
            lib.rf_ldg.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int] * 4 + \
                [ctypes.c_void_p, ctypes.c_void_p]
            lib.rf_bulk.argtypes = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_int] * 5 + \
                [ctypes.c_void_p, ctypes.c_void_p]
            lib.rf_ldg.restype = lib.rf_bulk.restype = ctypes.c_int
            return lib, os.path.abspath(p)
    raise FileNotFoundError(f"no reader library (tried {candidates}); build with CUDA")


class Readers:
    """The readers on the current device and stream: their sink and the counter walk's
    counters (left zeroed by every walk: floor() checks that they are)."""

    def __init__(self, torch, path: str | None = None):
        self.torch = torch
        self.lib, self.path = load_library(path)
        self.sms = torch.cuda.get_device_properties(
            torch.cuda.current_device()).multi_processor_count
        self.sink = torch.zeros(8 * self.sms * 8, dtype=torch.int32, device="cuda")
        self.counters = torch.zeros(2, dtype=torch.int32, device="cuda")

    def call(self, c: dict, ptr: int, nbytes: int):
        """A callable that reads nbytes (a multiple of 16) at device address ptr (on 16
        bytes) with configuration c; ReaderError where the launch is refused."""
        p, torch = ctypes.c_void_p(ptr), self.torch

        def stream():
            return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if c["kind"] == "ldg":
            sink = ctypes.c_void_p(self.sink.data_ptr())
            return lambda: _ok(self.lib.rf_ldg(p, nbytes, c["ctas"], c["threads"], c["unroll"],
                                               c["hint"], sink, stream()))
        counters = ctypes.c_void_p(self.counters.data_ptr())
        return lambda: _ok(self.lib.rf_bulk(p, nbytes, c["ctas"], c["stage"], c["ring"],
                                            c["walk"], c["evict_first"], counters, stream()))

    def floor(self, timer, ptr: int, nbytes: int, configs: list[dict], log=None) -> dict:
        """Each configuration reading the first nbytes (rounded down to 16) at ptr, timed
        by timer.measure: {"readers": name -> median us (None where refused), "by", and
        "median_us" of the fastest}; {"readers", "error"} where the counter walk left its
        counters set (they are zeroed again: a walk that starts from set counters reads
        nothing and would time as the floor)."""
        nbytes -= nbytes % 16
        times = {}
        for c in configs:
            name = config_name(c)
            try:
                times[name] = timer.measure(self.call(c, ptr, nbytes))["median_us"]
            except ReaderError as e:  # refused; a CUDA fault (sticky) propagates
                times[name] = None
                if log:
                    log(f"{name}: {e}")
        self.torch.cuda.synchronize()
        if int(self.counters.sum()) != 0:
            self.counters.zero_()
            return {"readers": times, "error": "the counter walk left its counters set"}
        timed = {k: v for k, v in times.items() if v}
        best = min(timed, key=timed.get) if timed else None
        return {"readers": times, "by": best, "median_us": timed.get(best)}
