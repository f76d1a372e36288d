"""The K = 2 halves decode of bench/pending/k2-halves-final.diff, checked on the CPU: one
warp's unit of a weight quantized and tiled by the library (kbit.quantize with a random
codebook and fp32 scales, kbit.tile: the layout of csrc/formats/kbit_tiled.h as the
library writes it) through the quad table, laid out in
a simulated shared memory as fill_quad_table writes it and addressed as QuadTable does
(16 and 32 copies), with the m16n8k16 fragment layout of mma.sync simulated lane by lane,
the tile sums written as TileSums::put places them (columns never written hold NaN) and
read back as the reducer does, against the library's dequantized W times x (every m the
decode takes); and the committed decode (chunk_pairs' x + (x >> 12) and
chunk_mma) through the same simulation, so that a wrong model fails both. It also fails
where the diff no longer writes the expressions simulated here.
Usage (with the library built: make build): python3 bench/pending/k2_halves_check.py [SEED]
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
import kbit  # noqa: E402
EXPRESSIONS = [  # what the diff writes, as simulated below
    "min(kHalves ? g >> 1 : g, x_rows - 1)",       # lane (g, t): row g / 2 of x
    "t * 16 + (kHalves ? 4 * (g & 1) : 0)",        # its pairs of parity g % 2
    "lds_u32(xu + v * kChunk * 2 + 8)",            # b1: 4 elements on
    "quads(w, 0), q1 = quads(w, 1), q2 = quads(w, 2), q3 = quads(w, 3)",
    "ag[0] = q0.x, ag[1] = q0.y, ag[2] = q1.x, ag[3] = q1.y;",      # row g's A
    "ag8[0] = q2.x, ag8[1] = q2.y, ag8[2] = q3.x, ag8[3] = q3.y;",  # row g + 8's
    "mma_16816(T{}, c, ag, xb.x, xb.y);   // row g",
    "mma_16816(T{}, d, ag8, xb.x, xb.y);  // row g + 8",
    "acc[0] = fmaf(sa, c[0] + c[3], acc[0]);",
    "acc[2] = fmaf(sb, d[0] + d[3], acc[2]);",
    "(g * kMaxM + (kHalves ? t : 2 * t)) * 4",      # column t of the tile sums
    "m <= kHalvesMaxM",
    "constexpr int kHalvesMaxM = 4;",
]


def check_diff():
    with open(os.path.join(HERE, "k2-halves-final.diff")) as f:
        added = "\n".join(l[1:] for l in f.read().splitlines() if l.startswith("+"))
    missing = [e for e in EXPRESSIONS if e not in added]
    assert not missing, f"the diff no longer writes {missing}"


def unit(rng, book):
    """A random 16 x 128 weight quantized by the library at K = 2 with codebook `book` and
    fp32 scales, and tiled: its 32 lanes' 4 words (one tile, one group), its block scales
    (16 rows x 4 chunks) and W dequantized by the library."""
    w = rng.standard_normal((16, 128)).astype(np.float32)
    q = kbit.quantize(w, k=2, absmax="fp32", codebook=book)
    words = np.frombuffer(np.asarray(kbit.tile(q).packed).tobytes(), "<u4").reshape(32, 4)
    scales = np.asarray(q.absmax, dtype=np.float32).astype(np.float64).reshape(16, 4)
    return words, scales, kbit.dequantize(q, dtype="float32").astype(np.float64)


def mma(a, b):
    """m16n8k16 with each lane's fragments: a[lane] = 4 (lo, hi) pairs (a0..a3), b[lane] =
    2 pairs (b0, b1); returns each lane's (c0, c1, c2, c3) in float64."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for reg, (r, k) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
            A[r, k:k + 2] = a[lane][reg]
        for reg, k in enumerate((2 * t, 2 * t + 8)):
            B[k:k + 2, g] = b[lane][reg]
    C = A @ B
    return [(C[l >> 2, 2 * (l & 3)], C[l >> 2, 2 * (l & 3) + 1], C[(l >> 2) + 8, 2 * (l & 3)],
             C[(l >> 2) + 8, 2 * (l & 3) + 1]) for l in range(32)]


def quad_table(entry, copies):
    """fill_quad_table's shared memory: word address -> value; entry e's row of copies
    uint4 (lo, hi, lo, hi) at byte 8 copies e."""
    smem = {}
    for e in range(256):
        lo, hi = entry(e & 15), entry(e >> 4)
        for c in range(copies // 2):
            a = 8 * copies * e + 16 * c
            smem[a], smem[a + 4], smem[a + 8], smem[a + 12] = lo, hi, lo, hi
    return smem


def quad_load(smem, copies, w, b, lane):
    """QuadTable<copies>(w, b) in lane `lane`: the 8 bytes at the entry of byte b of w."""
    if copies == 32:  # ByteRows<8>::at: __byte_perm(w, 8 lane, 0x7604 | b << 4)
        src = list(w.to_bytes(4, "little")) + list((8 * lane).to_bytes(4, "little"))
        addr = int.from_bytes(bytes(src[i] for i in (4, b, 6, 7)), "little")
    else:
        v = (w << 7) & 0xFFFFFFFF if b == 0 else w >> (8 * b - 7)
        addr = (v & 0x7F80) | (8 * (lane % 16))  # lop3<0xEA>(v, 0x7F80, lane)
    return smem[addr], smem[addr + 4]


def run(rng, m, halves, copies):
    book = np.sort(rng.uniform(-1.0, 1.0, 4)).astype(np.float32)
    book /= np.abs(book).max()
    words, scales, wref = unit(rng, book)
    book = book.astype(np.float64)
    # a pair index's entries: bit 2j of the first element's code j, 2j + 1 the second's
    entry = lambda p: (book[(p & 1) | (p >> 1 & 2)], book[(p >> 1 & 1) | (p >> 2 & 2)])
    smem = quad_table(entry, copies)
    x = rng.standard_normal((m, 128))
    acc = np.zeros((32, 4))
    for v in range(4):
        w = [int(words[l, v]) for l in range(32)]
        if halves:
            b = []
            for l in range(32):
                g, t = l >> 2, l & 3
                xr, e = x[min(g >> 1, m - 1), 32 * v:], 8 * t + 2 * (g & 1)
                b.append((xr[e:e + 2], xr[e + 4:e + 6]))
            q = [[quad_load(smem, copies, w[l], i, l) for i in range(4)] for l in range(32)]
            c = mma([(q[l][0][0], q[l][0][1], q[l][1][0], q[l][1][1]) for l in range(32)], b)
            d = mma([(q[l][2][0], q[l][2][1], q[l][3][0], q[l][3][1]) for l in range(32)], b)
            for l in range(32):
                g = l >> 2
                acc[l, 0] += scales[g, v] * (c[l][0] + c[l][3])
                acc[l, 2] += scales[g + 8, v] * (d[l][0] + d[l][3])
        else:  # the committed decode: x + (x >> 12) of each nibble set, pairs (pa[i], pb[i])
            pa, pb, xv = [], [], []
            for l in range(32):
                g, t = l >> 2, l & 3
                lo, hi = w[l] & 0x0F0F0F0F, (w[l] >> 4) & 0x0F0F0F0F
                zx, zy = (lo + (lo >> 12)) & 0xFFFFFFFF, (hi + (hi >> 12)) & 0xFFFFFFFF
                qs = [quad_load(smem, copies, zy if i % 2 else zx, i // 2, l) for i in range(4)]
                pa.append([qq[0] for qq in qs])
                pb.append([qq[1] for qq in qs])
                xr = x[min(g, m - 1), 32 * v + 8 * t:]
                xv.append([xr[2 * j:2 * j + 2] for j in range(4)])
            c = np.zeros((32, 4))
            for half in range(2):
                cc = mma([(pa[l][2 * half], pb[l][2 * half], pa[l][2 * half + 1], pb[l][2 * half + 1])
                          for l in range(32)], [(xv[l][2 * half], xv[l][2 * half + 1]) for l in range(32)])
                c += np.array(cc)
            for l in range(32):
                g = l >> 2
                acc[l] += [scales[g, v] * c[l][0], scales[g, v] * c[l][1],
                           scales[g + 8, v] * c[l][2], scales[g + 8, v] * c[l][3]]
    sums = np.full(16 * 8, np.nan)  # TileSums::put: one warp's 16 x 8 floats
    for l in range(32):
        g, t = l >> 2, l & 3
        cols = [(t, 0, 2)] if halves else [(2 * t, 0, 2), (2 * t + 1, 1, 3)]
        for col, ig, ig8 in cols:
            sums[g * 8 + col], sums[(g + 8) * 8 + col] = acc[l, ig], acc[l, ig8]
    y = np.full((16, m), np.nan)  # the reducer: lane l, outputs 4 l .. 4 l + 3, columns < m
    for l in range(32):
        for k in range(4):
            if (l & 1) * 4 + k < m:
                y[l // 2, (l & 1) * 4 + k] = sums[4 * l + k]
    ref = wref @ x.T  # (W in float32: its products rounded once)
    err = np.abs(y - ref).max() / np.abs(ref).max()
    assert err < 1e-6, f"m={m} halves={halves} copies={copies}: error {err}"


def main():
    check_diff()
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for copies in (16, 32):
        for _ in range(2):
            for m in range(1, 9):
                run(rng, m, halves=False, copies=copies)
            for m in range(1, 5):
                run(rng, m, halves=True, copies=copies)
    print("k2 halves check passed: the halves decode (m = 1..4) and the committed one "
          "(m = 1..8) equal W x through the simulated quad tables (16 and 32 copies), mma "
          "fragments and tile sums")


if __name__ == "__main__":
    main()
