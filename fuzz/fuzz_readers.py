#!/usr/bin/env python3
"""Bounded, seeded mutation fuzzer of kbit's Python file readers.

Valid files are written first (GGUF: the gguf package's GGUFWriter; every metadata value
type, nested arrays, a custom alignment, tensors of every type kbit dequantizes plus the
pass-through float types), then mutated: bit flips, interesting bytes, 4- and 8-byte
fields overwritten with interesting integers (0, 1, -1, 2^31, 2^32 - 1, 2^63, the file's
size, ...), truncation, junk appended, chunks deleted, duplicated or spliced from
another seed; most mutations land in the header, where the structure is.

Each mutated file must either load or raise kbit.KbitError. Anything else is a failure:
another exception, a case running longer than --case-timeout seconds (a watchdog thread
dumps the stack and ends the process, even inside C code), or memory use growing past
--max-mb (the address space is capped, so a huge allocation fails as MemoryError; not
under a sanitizer runtime, whose shadow memory needs the address space). The failing
input is kept under --out; replay it with --replay FILE.

Deterministic: the cases are a function of --seed alone; --seconds only bounds how many
of them run (--iterations bounds the count).

    python3 fuzz/fuzz_readers.py --seconds 20            # what `make fuzz` runs
    python3 fuzz/fuzz_readers.py --iterations 5000 --seed 7
"""
from __future__ import annotations

import argparse
import faulthandler
import math
import os
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

import kbit  # noqa: E402
from kbit import KbitError  # noqa: E402


# ---------------------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------------------

# ggml type: (elements, bytes) per block; kbit's supported quantized types.
QUANT = {"Q4_0": (32, 18), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176),
         "Q6_K": (256, 210)}


def _blocks(rng: np.random.Generator, qtype: str, shape) -> np.ndarray:
    """Random blocks of a quantized tensor of numpy `shape` as GGUFWriter takes them
    (uint8, the last dimension in bytes), with small fp16 scales so values are sane."""
    elems, nbytes = QUANT[qtype]
    n_blocks = int(np.prod(shape)) // elems
    raw = rng.integers(0, 256, (n_blocks, nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-3, 0.05, (n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == "Q6_K":
        raw[:, -2:] = scales[:, :2]  # d is last
    else:
        raw[:, :2] = scales[:, :2]   # d (and Q4_K / Q5_K dmin next to it)
        if qtype in ("Q4_K", "Q5_K"):
            raw[:, 2:4] = scales[:, 2:4]
    return raw.reshape(*shape[:-1], shape[-1] // elems * nbytes)


def gguf_seeds(tmp: str, rng: np.random.Generator) -> list[bytes]:
    import gguf
    GT = gguf.GGMLQuantizationType

    def write(name, fill):
        path = os.path.join(tmp, name)
        w = gguf.GGUFWriter(path, "kbit-fuzz")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as f:
            return f.read()

    def everything(w):
        w.add_uint8("v.u8", 200), w.add_int8("v.i8", -5), w.add_uint16("v.u16", 60000)
        w.add_int16("v.i16", -300), w.add_uint32("v.u32", 1 << 31), w.add_int32("v.i32", -7)
        w.add_float32("v.f32", 1.5), w.add_uint64("v.u64", 1 << 40), w.add_int64("v.i64", -1)
        w.add_float64("v.f64", 2.25), w.add_bool("v.bool", True), w.add_string("v.str", "kbit")
        w.add_array("v.ints", [1, 2, 3]), w.add_array("v.strs", ["a", "bc", ""])
        w.add_array("v.floats", [0.5, -1.0]), w.add_array("v.nested", [[1, 2], [3]])
        for i, (q, shape) in enumerate([("Q4_0", (2, 64)), ("Q8_0", (3, 32)),
                                        ("Q4_K", (1, 256)), ("Q5_K", (2, 256)),
                                        ("Q6_K", (256,))]):
            w.add_tensor(f"t{i}.{q.lower()}", _blocks(rng, q, shape), raw_dtype=GT[q])
        w.add_tensor("t.f32", rng.standard_normal((3, 2)).astype(np.float32))
        w.add_tensor("t.f16", rng.standard_normal(5).astype(np.float16))
        w.add_tensor("t.bf16", rng.integers(0, 1 << 16, (2, 3), dtype=np.uint16),
                     raw_dtype=GT.BF16)

    def aligned(w):
        w.add_custom_alignment(64)
        w.add_string("general.name", "aligned")
        w.add_tensor("a.q4_0", _blocks(rng, "Q4_0", (1, 32)), raw_dtype=GT.Q4_0)
        w.add_tensor("a.f32", np.arange(3, dtype=np.float32))
        w.add_tensor("a.q6_k", _blocks(rng, "Q6_K", (1, 256)), raw_dtype=GT.Q6_K)

    def metadata_only(w):
        w.add_array("m.tokens", [f"tok{i}" for i in range(20)])
        w.add_array("m.scores", [float(i) for i in range(20)])

    def one_tensor(w):
        w.add_tensor("w", _blocks(rng, "Q8_0", (4, 64)), raw_dtype=GT.Q8_0)

    return [write("everything.gguf", everything), write("aligned.gguf", aligned),
            write("metadata.gguf", metadata_only), write("one.gguf", one_tensor)]


def gguf_load(path: str):
    return kbit.gguf.load(path, device="cpu", progress=False)


def safetensors_seeds(tmp: str, rng: np.random.Generator) -> list[bytes]:
    """kbit checkpoints (kbit.save: every container, plain tensors) and a plain file of
    the safetensors package."""
    from safetensors.numpy import save_file
    w = rng.standard_normal((8, 64)).astype(np.float32)
    out = []
    for name, tensors in [
            ("kbit", {"w": kbit.quantize(w, k=3, codebook="fit"), "b": w[0].copy()}),
            ("mixed", {"t": kbit.tile(kbit.quantize(w, k=4)),
                       "n": kbit.quantize_nf4(w, compress_statistics=True),
                       "f": kbit.quantize_fp4(w.astype(np.float16), blocksize=128),
                       "e": kbit.quantize(w[:3, :37], k=2, absmax="fp16")})]:
        path = os.path.join(tmp, f"{name}.safetensors")
        kbit.save(tensors, path)
        with open(path, "rb") as f:
            out.append(f.read())
    path = os.path.join(tmp, "plain.safetensors")
    save_file({"a": w, "i": np.arange(5, dtype=np.int64)}, path, metadata={"x": "y"})
    with open(path, "rb") as f:
        out.append(f.read())
    return out


def safetensors_load(path: str):
    return kbit.load(path)


# The readers fuzzed: name -> (seed maker (tmp dir, numpy Generator) -> [file bytes],
# loader (path) that must load or raise KbitError).
READERS = {
    "gguf": (gguf_seeds, gguf_load),
    "safetensors": (safetensors_seeds, safetensors_load),
}


# ---------------------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------------------

INTERESTING_8 = [0, 1, 0x7F, 0x80, 0xFF]
INTERESTING_INT = [0, 1, 2, 3, 7, 8, 9, 12, 31, 32, 64, 255, 256, 1 << 15, 1 << 16,
                   (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, (1 << 63) - 1,
                   1 << 63, (1 << 64) - 1]


def header_end(data: bytes) -> int:
    """About where the tensor data starts: the header is where the structure is."""
    return max(64, min(len(data), len(data) * 3 // 4, 4096))


def mutate(rng: random.Random, data: bytes, seeds: list[bytes]) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        n = len(b)
        limit = header_end(b) if rng.random() < 0.8 else n
        at = rng.randrange(max(1, min(limit, n)))
        op = rng.randrange(9)
        if op == 0 and n:  # flip a bit
            b[at % n] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # an interesting byte
            b[at % n] = rng.choice(INTERESTING_8)
        elif op in (2, 3) and n >= 8:  # an interesting 4- or 8-byte field
            width = 4 if op == 2 else 8
            value = rng.choice(INTERESTING_INT + [n, n - at, rng.randrange(1 << 16)])
            value = (value + rng.choice([0, 0, -1, 1])) % (1 << (8 * width))
            at = min(at, n - width)
            b[at:at + width] = value.to_bytes(width, "little")
        elif op == 4:  # truncate
            del b[rng.randrange(n + 1):]
        elif op == 5:  # junk at the end
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
        elif op == 6 and n:  # delete a chunk
            del b[at:at + rng.randrange(1, 32)]
        elif op == 7 and n:  # duplicate a chunk
            size = rng.randrange(1, 32)
            b[at:at] = b[at:at + size]
        elif op == 8:  # splice: the head of this file, the tail of another
            other = rng.choice(seeds)
            cut = rng.randrange(len(other) + 1)
            b = b[:at] + bytearray(other[cut:])
    return bytes(b)


# ---------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------

def under_sanitizer() -> bool:
    with open("/proc/self/maps") as f:
        return any("libasan" in line or "libtsan" in line for line in f)


def cap_memory(max_mb: int) -> None:
    """Caps the address space at what is mapped now plus max_mb."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    limit = mapped + (max_mb << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


class Failure(Exception):
    pass


# Findings reported and not fixed yet (the readers live outside what this fuzzer may
# change): reader -> [(why, test(path, exception) -> bool)]. They are counted and printed,
# not failed on, unless --strict; remove an entry once its fix lands.
KNOWN: dict = {  # findings not fixed yet: {reader: [(why, test(path, exception))]}
    "gguf": [],
    "safetensors": [],
}


def known(reader: str, path: str, e: BaseException):
    for why, test in KNOWN.get(reader, []):
        try:
            if test(path, e):
                return why
        except Exception:  # noqa: BLE001 (not this finding)
            pass
    return None


def run_case(reader: str, path: str, case_timeout: float, rss_limit_kb: int,
             strict: bool = False) -> str:
    """'loaded', 'error' (KbitError) or 'known' (a KNOWN finding); raises Failure with
    the reason otherwise."""
    faulthandler.dump_traceback_later(case_timeout, exit=True)
    try:
        READERS[reader][1](path)
        outcome = "loaded"
    except KbitError:
        outcome = "error"
    except BaseException as e:  # noqa: BLE001 (every other exception is the finding)
        if not strict and known(reader, path, e):
            return "known"
        raise Failure(f"{type(e).__name__} (not KbitError): {e}\n"
                      + "".join(traceback.format_exception(type(e), e, e.__traceback__)))
    finally:
        faulthandler.cancel_dump_traceback_later()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if rss > rss_limit_kb:
        raise Failure(f"memory: peak RSS {rss >> 10} MB")
    return outcome


def fuzz_reader(name: str, args) -> int:
    make_seeds = READERS[name][0]
    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    current = os.path.join(out, "current")  # the case being run (left there on a hang)
    with tempfile.TemporaryDirectory() as tmp:
        seeds = make_seeds(tmp, np.random.default_rng(args.seed))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_limit = rss0 + (args.max_mb << 10)
    for s in seeds:  # the seeds themselves load
        with open(current, "wb") as f:
            f.write(s)
        try:
            assert run_case(name, current, args.case_timeout, rss_limit, True) == "loaded"
        except (Failure, AssertionError) as e:
            print(f"fuzz_readers {name}: a seed does not load: {e}")
            return 1

    rng = random.Random(args.seed)
    start = time.monotonic()
    counts = {"loaded": 0, "error": 0, "known": 0}
    first_known = {}
    i = 0
    print(f"fuzz_readers {name}: seed {args.seed}, {len(seeds)} seed files; a case "
          f"that hangs is left at {current}", flush=True)
    while i < args.iterations and time.monotonic() - start < args.seconds:
        data = mutate(rng, rng.choice(seeds), seeds)
        with open(current, "wb") as f:
            f.write(data)
        try:
            outcome = run_case(name, current, args.case_timeout, rss_limit, args.strict)
            counts[outcome] += 1
            if outcome == "known" and not first_known:
                first_known[i] = os.path.join(out, f"known-{args.seed}-{i}")
                shutil.copyfile(current, first_known[i])
        except Failure as e:
            kept = os.path.join(out, f"crash-{args.seed}-{i}")
            shutil.copyfile(current, kept)
            print(f"fuzz_readers {name}: FAILED on case {i} (kept at {kept}; replay with "
                  f"--reader {name} --replay {kept}):\n{e}")
            return 1
        i += 1
    took = time.monotonic() - start
    print(f"fuzz_readers {name}: Done {i} runs in {took:.0f} second(s) "
          f"({counts['loaded']} loaded, {counts['error']} KbitError, {counts['known']} known "
          f"findings)")
    for case, kept in first_known.items():
        print(f"fuzz_readers {name}: KNOWN FINDING (not fixed yet, see KNOWN in "
              f"fuzz/fuzz_readers.py) first at case {case}, kept at {kept}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="time budget per reader")
    p.add_argument("--iterations", type=int, default=10 ** 9, help="cases per reader at most")
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--reader", choices=sorted(READERS), action="append",
                   help="fuzz only this reader (repeatable; default: all)")
    p.add_argument("--case-timeout", type=float, default=5.0)
    p.add_argument("--max-mb", type=int, default=2048, help="memory a case may add")
    p.add_argument("--out", default=os.path.join(HERE, "..", "build-fuzz", "readers"))
    p.add_argument("--replay", help="run one file through --reader and report")
    p.add_argument("--strict", action="store_true", help="fail on KNOWN findings too")
    args = p.parse_args(argv)
    if not under_sanitizer():
        cap_memory(args.max_mb + 1024)
    readers = args.reader or sorted(READERS)
    if args.replay:
        rss_limit = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + (args.max_mb << 10)
        for name in readers:
            try:
                print(name, run_case(name, args.replay, args.case_timeout, rss_limit, args.strict))
            except Failure as e:
                print(f"{name}: FAILED: {e}")
                return 1
        return 0
    return max(fuzz_reader(name, args) for name in readers)


if __name__ == "__main__":
    sys.exit(main())
