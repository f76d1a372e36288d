#!/usr/bin/env python3
"""Checks, on the CPU, the byte-permute decode of bench/pending/k2-prmt-decode.diff (K = 2's
tiled words turned into fp16/bf16 pairs without table loads): for every value of each
byte of a lane's word (the pair indices of four elements of row g or g + 8,
formats/kbit_tiled.h) and random codebooks, the selectors n * 0x11 + 0x2020 and
umulhi(n, 0x110000) + 0x2020 of n = (w >> (j % 2 + 4 (j / 2))) & 0x05050505 pick from the
book registers (lo, hi) = prmt(e0, e3, 0x5140), prmt(e12, e15, 0x5140) exactly the entries
of elements (j, 4 + j) of rows g (bytes 0, 1) and g + 8 (bytes 2, 3), every selector nibble
below 8 (prmt.b32 reads a set bit 3 as sign replication); and x's halves in the pairs
(j, 4 + j) (pair_halves). It first checks that the diff still writes these expressions.
Run: python3 bench/pending/k2_prmt_check.py"""
import os
import random
import struct


def prmt(a, b, s):
    """PTX prmt.b32 (default mode) for selectors whose nibbles are below 8."""
    src = struct.pack("<II", a, b)
    out = 0
    for i in range(4):
        nib = (s >> 4 * i) & 0xF
        assert nib < 8, f"selector nibble {nib:#x} has its sign bit set"
        out |= src[nib] << 8 * i
    return out


def pair_index(c0, c1):
    """kbit_tiled.h: bit 2j is bit j of the first element's code, 2j + 1 the second's."""
    return (c0 & 1) | (c1 & 1) << 1 | (c0 >> 1) << 2 | (c1 >> 1) << 3


# The expressions checked here, as the diff writes them (a diff that changes one fails).
DIFF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "k2-prmt-decode.diff")
IN_DIFF = ["(w[v] >> (j % 2 + 4 * (j / 2))) & 0x05050505u",
           "prmt(book.lo, book.hi, n * 0x11u + 0x2020u)",
           "prmt(book.lo, book.hi, __umulhi(n, 0x110000u) + 0x2020u)",
           "__byte_perm(entry(0), entry(3), 0x5140u), __byte_perm(entry(12), entry(15), 0x5140u)",
           "__byte_perm(x.x, x.z, 0x5410u), __byte_perm(x.x, x.z, 0x7632u)",
           "__byte_perm(x.y, x.w, 0x5410u), __byte_perm(x.y, x.w, 0x7632u)"]


def main():
    with open(DIFF) as f:
        added = "\n".join(line[1:] for line in f if line.startswith("+"))
    missing = [e for e in IN_DIFF if e not in added]
    assert not missing, f"the diff no longer writes {missing}: update this check"
    rng = random.Random(36)
    checked = 0
    for _ in range(64):
        v = [rng.getrandbits(16) for _ in range(4)]  # the four entries' bit patterns
        entry = [v[c] | v[c] << 16 for c in range(4)]  # the pair (c, c)'s table entry
        lo, hi = prmt(entry[0], entry[1], 0x5140), prmt(entry[2], entry[3], 0x5140)
        for byte in range(4):
            for value in range(256):
                # one byte set to every value, the others random
                codes = [[rng.randrange(4) for _ in range(8)] for _ in range(2)]  # rows g, g + 8
                w = 0
                for h in range(2):
                    for i in range(4):
                        w |= pair_index(codes[h][2 * i], codes[h][2 * i + 1]) << (16 * h + 4 * i)
                w = (w & ~(0xFF << 8 * byte)) | value << 8 * byte
                # the codes the word now holds: element e of row half h
                for h in range(2):
                    for i in range(4):
                        p = (w >> (16 * h + 4 * i)) & 0xF
                        codes[h][2 * i] = (p & 1) | ((p >> 2) & 1) << 1
                        codes[h][2 * i + 1] = ((p >> 1) & 1) | ((p >> 3) & 1) << 1
                for j in range(4):
                    n = (w >> (j % 2 + 4 * (j // 2))) & 0x05050505
                    pa = prmt(lo, hi, (n * 0x11 + 0x2020) & 0xFFFFFFFF)
                    pb = prmt(lo, hi, ((n * 0x110000) >> 32) + 0x2020)
                    assert pa == v[codes[0][j]] | v[codes[0][4 + j]] << 16, (byte, value, j)
                    assert pb == v[codes[1][j]] | v[codes[1][4 + j]] << 16, (byte, value, j)
                    checked += 2
        xs = [rng.getrandbits(16) for _ in range(8)]
        x = [xs[2 * i] | xs[2 * i + 1] << 16 for i in range(4)]
        halves = [prmt(x[0], x[2], 0x5410), prmt(x[0], x[2], 0x7632),
                  prmt(x[1], x[3], 0x5410), prmt(x[1], x[3], 0x7632)]
        assert halves == [xs[j] | xs[4 + j] << 16 for j in range(4)]
    print(f"ok: {checked} pairs decoded as the table would")


if __name__ == "__main__":
    main()
