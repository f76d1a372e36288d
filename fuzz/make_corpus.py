#!/usr/bin/env python3
"""Writes the seed corpus of every libFuzzer target: fuzz/corpus/<target>/<name>.

Deterministic (a fixed seed, numpy only, no kbit): running it again gives the same files,
which are committed with it. Each seed follows the input layout written at the top of its
target's .cpp (header bytes choosing the call, then the data) and picks a case worth
starting from: each format, dtype and mode, sensible scales next to NaN / Inf /
subnormal / huge values, partial blocks, invalid arguments. Total well under 200 KB.

    python3 fuzz/make_corpus.py            # rewrites fuzz/corpus/
"""
import os
import shutil
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")
RNG = np.random.default_rng(15)  # issue 15

SPECIALS = np.array([np.nan, np.inf, -np.inf, 1e-40, -1e-45, 3e38, -0.0, 65504.0, 1e-8],
                    np.float32)


def u8(*v):
    return bytes(x & 0xFF for x in v)


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def f32(*v):
    return np.asarray(v, np.float32).tobytes()


def values(n, dtype, specials=0, scale=1.0):
    """n elements of dtype (0 fp32, 1 fp16, 2 bf16): normal * scale, some specials."""
    x = (RNG.standard_normal(n) * scale).astype(np.float32)
    if specials and n:
        at = RNG.choice(n, min(specials, n), replace=False)
        x[at] = SPECIALS[RNG.integers(0, len(SPECIALS), len(at))]
    if dtype == 0:
        return x.tobytes()
    if dtype == 1:
        with np.errstate(over="ignore"):
            return x.astype(np.float16).tobytes()
    return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def random_bytes(n):
    return RNG.integers(0, 256, n, dtype=np.uint8).tobytes()


def half_bits(v):
    return np.float16(v).view(np.uint16).item()


# ---- one function per target: {name: bytes} ------------------------------------------

def kbit_dequantize():
    seeds = {}
    absmax_bytes = {0: 4, 1: 2, 2: 1}
    for name, k, dtype, cb_mode, fmt, n, ts_mode in [
            ("k4-fp32-default-e4m4", 4, 0, 0, 2, 64, 0),
            ("k2-fp16-fuzzedbook-fp16", 2, 1, 1, 1, 100, 3),
            ("k3-bf16-nf0-fp32", 3, 2, 2, 0, 33, 1),
            ("k5-fp32-default-fp32-partial", 5, 0, 0, 0, 95, 2),
            ("bad-format", 4, 0, 0, 3, 32, 0)]:
        h0 = (k - 2) | dtype << 2 | cb_mode << 4 | 1 << 6
        body = u8(h0, fmt, 7) + u16(n) + u8(ts_mode, 0xFC)
        if cb_mode == 1:
            book = np.sort(RNG.uniform(-1, 1, 1 << k)).astype(np.float32)
            book[0], book[-1] = np.nan, np.inf
            body += book.tobytes()
        if ts_mode == 1:
            body += f32(0.125)
        blocks = (n + 31) // 32
        body += random_bytes(blocks * k * 4)
        if fmt == 0:
            body += f32(*RNG.uniform(0.01, 4, blocks))
        elif fmt == 1:
            body += np.float16(RNG.uniform(0.01, 4, blocks)).tobytes()
        elif fmt == 2:
            body += random_bytes(blocks)
        seeds[name] = body
    seeds["fp16-scales-special"] = (u8(2 | 0 << 2, 1, 0) + u16(128) + u8(0, 0)
                                    + random_bytes(4 * 4 * 4)
                                    + np.array([np.inf, np.nan, 6e-8, 65504], np.float16).tobytes())
    return seeds


def kbit_quantize():
    seeds = {}
    for name, k, dtype, cb_mode, fmt, ts_mode, finite, n, specials, scale in [
            ("k4-fp32-e4m4-computed-scale", 4, 0, 0, 2, 1, 0, 256, 0, 1.0),
            ("k3-fp16-e4m4-specials", 3, 1, 0, 2, 0, 0, 100, 6, 1.0),
            ("k2-bf16-fp16-huge", 2, 2, 2, 1, 0, 0, 64, 0, 1e6),
            ("k5-fp32-fp32-tiny", 5, 0, 0, 0, 3, 1, 90, 4, 1e-30),
            ("k4-fp32-fuzzedbook", 4, 0, 1, 2, 2, 1, 48, 2, 3.0),
            ("k3-fp16-finitebook", 3, 1, 3, 0, 1, 0, 77, 3, 20.0)]:
        h0 = (k - 2) | dtype << 2 | cb_mode << 4 | 1 << 6
        h1 = fmt | ts_mode << 2 | finite << 4
        body = u8(h0, h1) + u16(n) + u8(0xF8)
        if cb_mode in (1, 3):
            book = RNG.uniform(-1.5, 1.5, 1 << k).astype(np.float32)
            if cb_mode == 3:
                book[1] = np.inf
            body += book.tobytes()
        if ts_mode == 2:
            body += f32(0.75)
        body += values(n, dtype, specials, scale)
        seeds[name] = body
    return seeds


def nf4():
    seeds = {}
    for name, fmt, dtype, mode, log_bs, n in [
            ("nf4-fp32-plain-64", 0, 0, 0, 1, 256),
            ("fp4-fp16-plain-32-odd", 1, 1, 0, 0, 99),
            ("nf4-bf16-nested-builtin-map", 0, 2, 1, 0, 600),
            ("fp4-fp32-nested-fuzzed-map", 1, 0, 2, 1, 300),
            ("nf4-fp16-quantize", 0, 1, 3, 1, 200),
            ("fp4-fp32-quantize-specials", 1, 0, 3, 0, 70)]:
        bs = 32 << log_bs
        count = -(-n // bs)
        body = u8(fmt | dtype << 1 | mode << 3, log_bs) + u16(n)
        if mode == 3:
            body += values(n, dtype, 5 if "specials" in name else 0)
        else:
            body += random_bytes((n + 1) // 2)
            if mode == 0:
                body += f32(*RNG.uniform(0.01, 3, count))
            else:
                body += random_bytes(count)                      # qabsmax
                body += f32(*RNG.uniform(0.1, 2, -(-count // 256)))  # absmax2
                body += f32(0.5)                                  # offset
                if mode == 2:
                    table = np.sort(RNG.uniform(-1, 1, 256)).astype(np.float32)
                    table[[0, 255]] = [np.nan, np.inf]
                    body += table.tobytes()
        seeds[name] = body
    seeds["bad-blocksize"] = u8(1 << 5, 21) + u16(64) + random_bytes(40)
    return seeds


def gguf():
    seeds = {}
    sizes = [(32, 18), (32, 34), (256, 144), (256, 176), (256, 210)]
    names = ["q4_0", "q8_0", "q4_K", "q5_K", "q6_K"]
    for sel, (elems, nbytes) in enumerate(sizes):
        for dtype in ((0, 1) if sel % 2 == 0 else (0, 2)):
            nblocks = 3
            body = u8(sel | dtype << 4, nblocks, 0, 0)
            for _ in range(nblocks):
                blk = bytearray(random_bytes(nbytes))
                blk[0:2] = u16(half_bits(RNG.uniform(1e-3, 0.05)))
                if sel >= 2 and sel < 4:  # dmin of Q4_K / Q5_K
                    blk[2:4] = u16(half_bits(RNG.uniform(1e-3, 0.05)))
                if sel == 4:  # Q6_K keeps its d at the end
                    blk[-2:] = u16(half_bits(RNG.uniform(1e-3, 0.05)))
                body += bytes(blk)
            seeds[f"{names[sel]}-{('fp32', 'fp16', 'bf16')[dtype]}"] = body
    seeds["q8_0-special-scales"] = (u8(1, 4, 0, 0) + b"".join(
        u16(h) + random_bytes(32) for h in (0x7C00, 0x7E00, 0x0001, 0x7BFF)))
    seeds["ragged-n"] = u8(0 | 1 << 6, 2, 0, 5) + random_bytes(36)
    seeds["unsupported-type"] = u8(5, 1, 3, 0) + random_bytes(18)
    return seeds


def matmul():
    seeds = {}
    for name, kind, dtype, bias, m, n_out, kblocks, sub in [
            ("kbit-fp32-e4m4", 0, 0, 1, 2, 5, 2, 2 | 2 << 2),
            ("kbit-tiled-fp16", 1, 1, 0, 3, 9, 1, 1 | 1 << 2 | 3 << 4),
            ("nf4-bf16-64", 2, 2, 1, 1, 4, 2, 1),
            ("fp4-fp32-128", 3, 0, 0, 4, 3, 1, 2),
            ("gguf-q4_K-fp16", 4, 1, 1, 2, 2, 1, 2),
            ("gguf-q8_0-fp32", 4, 0, 0, 1, 7, 3, 1)]:
        h0 = kind | dtype << 3 | bias << 5 | 1 << 7  # small x
        body = u8(h0, m, n_out, kblocks, sub, 0)
        seeds[name] = body + random_bytes(2400)
    seeds["ragged-k"] = u8(0 | 1 << 6 | 1 << 7, 2, 3, 1, 2, 0) + random_bytes(400)
    seeds["raw-x"] = u8(2, 2, 2, 1, 1, 3) + random_bytes(600)
    return seeds


TARGETS = {"fuzz_kbit_dequantize": kbit_dequantize, "fuzz_kbit_quantize": kbit_quantize,
           "fuzz_nf4": nf4, "fuzz_gguf": gguf, "fuzz_matmul": matmul}


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    total = 0
    for target, make in TARGETS.items():
        os.makedirs(os.path.join(OUT, target))
        for name, body in make().items():
            with open(os.path.join(OUT, target, name), "wb") as f:
                f.write(body)
            total += len(body)
    print(f"{OUT}: {sum(len(f) for _, _, f in os.walk(OUT))} files, {total} bytes")
    return 0 if total < 200_000 else 1


if __name__ == "__main__":
    sys.exit(main())
