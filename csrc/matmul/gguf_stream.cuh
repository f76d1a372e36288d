// GGUF streamed GEMV (m <= 16 rows of x, sm_90): included by gemv.cu after the
// tiled streamed kernel, whose ring, resident x and consumer barrier it shares.
//
// The blocks are read exactly as a GGUF file stores them (row after row of W). A persistent
// CTA per SM owns every gridDim.x-th tile group of kR 16-row tiles (kR = 1, or 4 where x
// comes with the stages: stage_tiles), so that the grid reads neighbouring rows at a time
// (measured 2-7% faster than a run of neighbouring groups each: bench/RESULTS.md, session
// 24); a stage is 2048 / kR elements of k of each tile of a group: its 16 rows' bytes (one
// TMA box of a 2-d tensor map over the rows a tile, two for Q8_0 at kR = 1, whose stage
// rows exceed a box) and, unless x is held for the whole kernel (ResidentX), the same
// elements of every row of x (a bulk copy a row, once for the kR tiles), issued by one
// producer lane into a ring of shared-memory slots. (A bulk copy a row of W, 17 copies a
// stage, left the producer the bound: bench/RESULTS.md, session 10.) Each of the 16
// consumer warps takes a unit of 128 elements (four 32-element chunks) of all 16 rows of
// one tile: lane (g, t) decodes elements 4t..4t+3 and 16+4t..16+4t+3 of each chunk of rows
// g and g+8 into pairs of T and the warp multiplies them with two mma.sync m16n8k16 a chunk
// and n8 tile of x (the pairs sit in the A fragment's k order up to a fixed permutation,
// under which x's pairs are its natural words: no reordering of x); a tile's warps' sums
// meet after the group's last stage.
//
// Integers to T: a code byte c (c < 128 for bf16) placed under the exponent byte of
// `base` (1024 for fp16, 128 for bf16) is the exact value base + c, one byte permute a
// pair; the offsets and the k-quants' 6/8-bit sub-block scales are folded in with one
// packed add or fma, exact or rounded once to T. Each scale group's fp32 mma sums are
// multiplied by its fp16 super-scale (d, and dmin for the k-quant mins, whose sums come
// from a second mma with the min broadcast along k, or for Q4_K where x is resident and a
// CTA has six row tiles or more from one m16n8k8 a unit against x's sub-block means:
// MeansAt).
//
// Needs blocks on 16 bytes, rows whose stage pieces are whole 16-byte runs (k_in % 256
// == 0; Q6_K: % 2048) and the map's 32-bit coordinates; streams() says so. Otherwise the
// direct kernels.
namespace gguf_stream {

constexpr int kStageK = 2048;  // elements of k a stage of one row tile (kR = 1)
constexpr int kUnitK = kStageK / kStreamWarps;  // 128: a consumer warp's unit
static_assert(kUnitK == 4 * kChunk, "a unit is four chunks");
// A stage of kR row tiles is kStageK / kR elements of k of each, and one copy of x for
// them all: x's bytes a weight byte fall by kR (m >= 2, where x comes with the stages:
// at m = 16 and kR = 1 x is three quarters of a stage's bytes). A stage's row of x,
// padded for the lanes' 8-byte reads (x_row_stride):
template <int kR>
constexpr int x_stride() { return static_cast<int>(x_row_stride(kStageK / kR * 2, 8)); }

// The arguments below that pick bytes are constants once the callers' loops unroll, so
// each is one byte permute with an immediate selector.
// Bytes (0, 1) (half 0) or (2, 3) (half 1) of a word of codes as the pair (base + c0,
// base + c1).
template <class T>
__device__ __forceinline__ uint32_t biased(uint32_t codes, int half) {
    return __byte_perm(codes, Pack<T>::kMagic, half ? 0x4342u : 0x4140u);
}
// Byte j of a word as the pair (base + c, base + c).
template <class T>
__device__ __forceinline__ uint32_t biased_splat(uint32_t bytes, int j) {
    return __byte_perm(bytes, Pack<T>::kMagic, 0x4040u | (j << 8) | j);
}

// 4 bytes of shared memory at an address that is 4-byte aligned, or only 2-byte
// aligned (two halves).
__device__ __forceinline__ uint32_t lds_word(bool aligned, uint32_t at) {
    return aligned ? lds_u32(at) : __byte_perm(lds_u16(at), lds_u16(at + 2), 0x5410u);
}

// One k16 step's A fragment from the pairs (4t, 4t+1) and (4t+2, 4t+3) of rows g (a)
// and g+8 (b).
struct Frag {
    uint32_t r[4];
};
__device__ __forceinline__ Frag frag(uint32_t a01, uint32_t a23, uint32_t b01, uint32_t b23) {
    return {{a01, b01, a23, b23}};
}

// The lane's x of one chunk: elements 4t..4t+3 (step 0) and 16+4t..16+4t+3 (step 1) of
// its row of x.
struct ChunkX {
    uint2 s0, s1;
};
__device__ __forceinline__ ChunkX chunk_x(uint32_t at) {
    return {lds_u32x2(at), lds_u32x2(at + 32)};
}

// The chunk's two k16 steps (A fragments s0, s1) times each n8 tile of x, whose lane's
// elements of the chunk start at x_at (tile 0; tile nt x_nt * nt bytes further).
template <class T, int NT>
__device__ __forceinline__ void mma_chunk(Sums<NT> &c, const Frag &s0, const Frag &s1,
                                          uint32_t x_at, uint32_t x_nt) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const ChunkX x = chunk_x(x_at + nt * x_nt);
        mma_16816(T{}, c.v[nt], s0.r, x.s0.x, x.s0.y);
        mma_16816(T{}, c.v[nt], s1.r, x.s1.x, x.s1.y);
    }
}

// C fragments times per-row factors (row g: fa, row g+8: fb) into acc.
template <int NT>
__device__ __forceinline__ void scale_add(Sums<NT> &acc, const Sums<NT> &c, float fa, float fb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        acc.v[nt][0] = fmaf(fa, c.v[nt][0], acc.v[nt][0]);
        acc.v[nt][1] = fmaf(fa, c.v[nt][1], acc.v[nt][1]);
        acc.v[nt][2] = fmaf(fb, c.v[nt][2], acc.v[nt][2]);
        acc.v[nt][3] = fmaf(fb, c.v[nt][3], acc.v[nt][3]);
    }
}

// x's sub-block means, for Q4_K's mins where x is resident and one n8 tile (NT = 1):
// the mins' sums m (x_0 + .. + x_31) of a sub-block and row of x, one mma a unit
// instead of one a sub-block (bench/RESULTS.md, session 32). Lane (g, t) keeps the mean
// of sub-block t of each of its units in row g of x as a pair of T, hi + lo (the B
// fragment of an m16n8k8 against the four sub-blocks' mins): it computes it from x in the
// CTA's first tile group, whose stages bring x, and reads it back in the later ones (a
// consumer barrier between, store_stream_group's). Rows of k_in / 32 + 4 words: rows g
// land in distinct banks. The first group's means cost about three units' saving, so
// the launcher takes them where a CTA has kMeansMinTiles row tiles or more.
constexpr int kMeansMinTiles = 6;
struct MeansAt {
    uint32_t at = 0, x = 0;  // the lane's word of the unit; its sub-block of x
    bool first = false;      // the CTA's first tile group
    bool store = false;      // the lane owns its word (g < x's rows)
};
__host__ __device__ constexpr int means_stride(int64_t k_in) {
    return static_cast<int>((k_in / kChunk + 4) * 4);
}
__host__ __device__ constexpr int means_bytes(int x_rows, int64_t k_in) {
    return (x_rows * means_stride(k_in) + 127) / 128 * 128;
}
// The mean of the 32 elements of T at `at` (on 16 bytes) as the pair (hi, lo 2^11):
// hi + lo within 2^-22 (fp16) or 2^-16 (bf16) of the float32 mean. lo is carried 2^11 up
// (exact: a power of two) so that it stays a normal fp16 number wherever hi is one (|mean|
// from 2^-14; unscaled, lo fell into fp16's subnormals below |mean| ~ 2^-3 and x of order
// 1e-6 lost the mins' precision); the mma's A carries the 2^-11 back (QK45S::unit). The
// mean of fp16 values, and |lo| 2^11 <= |mean|, are never past fp16's range.
constexpr float kMeanLoScale = 2048.0f;
template <class T>
__device__ __forceinline__ uint32_t x_mean(uint32_t at) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint4 v = lds_u32x4(at + 16 * i);
        const float2 a = unpack2<T>(v.x), b = unpack2<T>(v.y), c = unpack2<T>(v.z),
                     d = unpack2<T>(v.w);
        s += ((a.x + a.y) + (b.x + b.y)) + ((c.x + c.y) + (d.x + d.y));
    }
    const float mean = s * (1.0f / kChunk), hi = unpack2<T>(splat<T>(mean)).x;
    return pack2(T{}, hi, (mean - hi) * kMeanLoScale);
}
// The lane's word of its unit: computed and kept (first group) or read back.
template <class T>
__device__ __forceinline__ uint32_t means_word(const MeansAt &m) {
    if (!m.first) return lds_u32(m.at);
    const uint32_t w = x_mean<T>(m.x);
    if (m.store) sts_u32(m.at, w);
    return w;
}

// The unit's arguments: shared addresses of its first byte in rows g and g+8, and the
// lane's x at the unit's first element (element 4t of row g of x; of the last row where
// x has fewer rows: their sums are never stored; tile nt's rows x_nt * nt bytes further).
struct UnitAt {
    uint32_t wa, wb, x, x_nt;
    int t;
    MeansAt means;  // (run_means)
};

// ---- formats -----------------------------------------------------------------------------
//
// run<T, NT>(u, odd_half, aligned4, acc): the unit's sums into the C fragments acc (the
// Q4_K's run_means<T>(u, odd_half, acc) too: its mins against x's means);
// odd_half: the unit is the second half of a 256-element super-block (k-quants),
// aligned4: its block starts on 4 bytes (only Q6_K's 210-byte blocks may not; the others'
// alignment is fixed per chunk). Each format turns these run-time facts, the same for a
// warp all kernel long, into template arguments of its own decoder.

// Q4_0 and Q8_0: a unit is four 32-element blocks (one chunk each) of an fp16 scale d and
// codes; Codes::words(q, t, aligned, w) gives the code bytes of elements 4t..4t+3 (w[0])
// and 16+4t..16+4t+3 (w[1]) from the block's codes at q, Codes::pair<T>(w, half) two of
// them as the exact pair of values. Blocks of 18 and 34 bytes from a unit on 8: the codes
// (at 2) lie on whole words in odd blocks only.
template <class Codes>
struct Block32S {
    using Fmt = typename Codes::Fmt;
    static constexpr bool kMinsByMeans = false;
    static constexpr int kStreamK = 256;  // 8 blocks: whole 16-byte runs
    template <class T, int NT>
    static __device__ __forceinline__ void run(const UnitAt &u, bool, bool, Sums<NT> &acc) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const uint32_t a = u.wa + c * Fmt::kBytes, b = u.wb + c * Fmt::kBytes;
            uint32_t wa[2], wb[2];
            Codes::words(a + 2, u.t, c % 2 == 1, wa);
            Codes::words(b + 2, u.t, c % 2 == 1, wb);
            const float da = f16_bits_to_f32(lds_u16(a));
            const float db = f16_bits_to_f32(lds_u16(b));
            Frag st[2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                st[i] = frag(Codes::template pair<T>(wa[i], 0), Codes::template pair<T>(wa[i], 1),
                             Codes::template pair<T>(wb[i], 0), Codes::template pair<T>(wb[i], 1));
            Sums<NT> c4;
            mma_chunk<T>(c4, st[0], st[1], u.x + c * kChunk * 2, u.x_nt);
            scale_add(acc, c4, da, db);
        }
    }
};

// Q4_0: element e < 16 is the low nibble of qs[e], e >= 16 the high nibble of qs[e - 16];
// value d (q - 8).
struct Q4_0Codes {
    using Fmt = gguf::Q4_0;
    static __device__ __forceinline__ void words(uint32_t q, int t, bool aligned,
                                                 uint32_t (&w)[2]) {
        const uint32_t v = lds_word(aligned, q + 4 * t);
        w[0] = v & gguf::kLow4;
        w[1] = (v >> 4) & gguf::kLow4;
    }
    template <class T>
    static __device__ __forceinline__ uint32_t pair(uint32_t w, int half) {
        return hadd2<T>(biased<T>(w, half), splat<T>(-(Pack<T>::kBase + 8.0f)));
    }
};

// Q8_0: int8 codes, value d q. fp16 takes base + (q + 128) exactly; bf16 (8 significant
// bits) takes the pair through float32.
struct Q8_0Codes {
    using Fmt = gguf::Q8_0;
    static __device__ __forceinline__ void words(uint32_t q, int t, bool aligned,
                                                 uint32_t (&w)[2]) {
        w[0] = lds_word(aligned, q + 4 * t);
        w[1] = lds_word(aligned, q + 16 + 4 * t);
    }
    template <class T>
    static __device__ __forceinline__ uint32_t pair(uint32_t w, int half) {
        if constexpr (Pack<T>::kF16) {
            return hadd2<T>(biased<T>(w ^ 0x80808080u, half), splat<T>(-(Pack<T>::kBase + 128.0f)));
        } else {
            const int lo = static_cast<int8_t>(w >> (16 * half));
            const int hi = static_cast<int8_t>(w >> (16 * half + 8));
            return pack2(T{}, static_cast<float>(lo), static_cast<float>(hi));
        }
    }
};

// Q4_K / Q5_K: the unit is sub-blocks 4 kHalf .. 4 kHalf + 3 of one block (their 6-bit
// scales and mins as bytes of two words: gguf::scales_mins_k4).

template <bool kFifthBit>
struct QK45S {
    using Fmt = gguf::QK_45<kFifthBit>;
    using Block = typename Fmt::Block;
    static constexpr int kStreamK = 256;  // one block: 144 or 176 bytes
    // the mins against x's means where x is resident (MeansAt): Q4_K; Q5_K measured 1%
    // slower on 28672x8192 at m = 1..4 (3% faster on 14336x4096), where it already
    // streams as fast as Q4_K with them (bench/RESULTS.md, session 32)
    static constexpr bool kMinsByMeans = !kFifthBit;
    // whether T keeps the high nibbles in place (fp16's 10 mantissa bits hold 16 q; not
    // with Q5_K's fifth bit above them, nor in bf16's 7)
    template <class T>
    static constexpr bool kHighInPlace = Pack<T>::kF16 && !kFifthBit;
    // A scale word base + sc as the pair sc (or sc / 16 for high nibbles in place).
    template <class T>
    static __device__ __forceinline__ uint32_t sub_block_scale(uint32_t word, bool in_place) {
        constexpr float kBase = Pack<T>::kBase;
        return in_place ? hfma2<T>(word, splat<T>(1.0f / 16), splat<T>(-kBase / 16))
                        : hadd2<T>(word, splat<T>(-kBase));
    }
    // kMeans: the mins against x's sub-block means (MeansAt), else an mma a sub-block
    template <class T, int kHalf, bool kMeans, int NT>
    static __device__ __forceinline__ void unit(const UnitAt &u, Sums<NT> &acc) {
        const uint4 ha = lds_u32x4(u.wa), hb = lds_u32x4(u.wb);  // d, dmin, scales[12]
        uint32_t qha[2] = {}, qhb[2] = {};
        if constexpr (kFifthBit) {
            qha[0] = lds_u32(u.wa + offsetof(gguf::BlockQ5_K, qh) + 4 * u.t);
            qha[1] = lds_u32(u.wa + offsetof(gguf::BlockQ5_K, qh) + 16 + 4 * u.t);
            qhb[0] = lds_u32(u.wb + offsetof(gguf::BlockQ5_K, qh) + 4 * u.t);
            qhb[1] = lds_u32(u.wb + offsetof(gguf::BlockQ5_K, qh) + 16 + 4 * u.t);
        }
        uint32_t sca, mna, scb, mnb;
        gguf::scales_mins_k4(ha.y, ha.z, ha.w, kHalf, sca, mna);
        gguf::scales_mins_k4(hb.y, hb.z, hb.w, kHalf, scb, mnb);
        const uint32_t nbase = splat<T>(-Pack<T>::kBase);
        Sums<NT> c1, c2;
#pragma unroll
        for (int jp = 0; jp < 2; ++jp) {  // sub-blocks 4 kHalf + 2 jp (low nibbles), + 1 (high)
            const uint32_t q = offsetof(Block, qs) + 32 * (2 * kHalf + jp) + 4 * u.t;
            const uint32_t wa[2] = {lds_u32(u.wa + q), lds_u32(u.wa + q + 16)};
            const uint32_t wb[2] = {lds_u32(u.wb + q), lds_u32(u.wb + q + 16)};
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int j = 2 * jp + hi, s = 4 * kHalf + j;  // sub-block
                // Q4_K, fp16: a high nibble kept in place is the byte 16 q, base + 16 q
                // under the exponent: its scale sc / 16 (exact) gives q sc as well
                const bool in_place = hi && kHighInPlace<T>;
                uint32_t ca[2], cb[2];  // codes of steps 0, 1
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    ca[st] = in_place ? wa[st] & ~gguf::kLow4 : (hi ? wa[st] >> 4 : wa[st]) & gguf::kLow4;
                    cb[st] = in_place ? wb[st] & ~gguf::kLow4 : (hi ? wb[st] >> 4 : wb[st]) & gguf::kLow4;
                    if constexpr (kFifthBit) {
                        ca[st] |= (s <= 4 ? qha[st] << (4 - s) : qha[st] >> (s - 4)) & 0x10101010u;
                        cb[st] |= (s <= 4 ? qhb[st] << (4 - s) : qhb[st] >> (s - 4)) & 0x10101010u;
                    }
                }
                // (base + q) * sc - base * sc = q * sc, rounded once; in place, with sc / 16 =
                // (base + sc) / 16 - base / 16 exactly
                const uint32_t sa = sub_block_scale<T>(biased_splat<T>(sca, j), in_place);
                const uint32_t sb = sub_block_scale<T>(biased_splat<T>(scb, j), in_place);
                const uint32_t oa = hmul2<T>(sa, nbase), ob = hmul2<T>(sb, nbase);
                Frag st[2];
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    st[i] = frag(hfma2<T>(biased<T>(ca[i], 0), sa, oa),
                                 hfma2<T>(biased<T>(ca[i], 1), sa, oa),
                                 hfma2<T>(biased<T>(cb[i], 0), sb, ob),
                                 hfma2<T>(biased<T>(cb[i], 1), sb, ob));
                mma_chunk<T>(c1, st[0], st[1], u.x + j * kChunk * 2, u.x_nt);
                if constexpr (!kMeans) {  // the mins, broadcast along k: sum of m x
                    const uint32_t ma = hadd2<T>(biased_splat<T>(mna, j), nbase);
                    const uint32_t mb = hadd2<T>(biased_splat<T>(mnb, j), nbase);
                    const Frag mf = frag(ma, ma, mb, mb);
                    mma_chunk<T>(c2, mf, mf, u.x + j * kChunk * 2, u.x_nt);
                }
            }
        }
        if constexpr (kMeans) {
            static_assert(NT == 1, "x's means: one n8 tile");
            // k 2t, 2t + 1: 32 m of lane t's sub-block against its mean's hi, and 32 m / 2^11
            // against lo 2^11: (base + m) 32 - 32 base and (base + m) / 64 - base / 64, each
            // exact (m / 64 is on the grid of fp16 and bf16 at base + m)
            constexpr float kLo = kChunk / kMeanLoScale;
            const uint32_t k32 = pack2(T{}, kChunk, kLo);
            const uint32_t off = pack2(T{}, -kChunk * Pack<T>::kBase, -kLo * Pack<T>::kBase);
            mma_1688(T{}, c2.v[0], hfma2<T>(biased_splat<T>(mna, u.t), k32, off),
                     hfma2<T>(biased_splat<T>(mnb, u.t), k32, off), means_word<T>(u.means));
        }
        const float da = f16_bits_to_f32(static_cast<uint16_t>(ha.x));
        const float db = f16_bits_to_f32(static_cast<uint16_t>(hb.x));
        const float ma = f16_bits_to_f32(static_cast<uint16_t>(ha.x >> 16));
        const float mb = f16_bits_to_f32(static_cast<uint16_t>(hb.x >> 16));
        scale_add(acc, c1, da, db);
        scale_add(acc, c2, -ma, -mb);
    }
    template <class T, int NT>
    static __device__ __forceinline__ void run(const UnitAt &u, bool odd_half, bool,
                                               Sums<NT> &acc) {
        if (odd_half) unit<T, 1, false, NT>(u, acc);
        else unit<T, 0, false, NT>(u, acc);
    }
    template <class T>
    static __device__ __forceinline__ void run_means(const UnitAt &u, bool odd_half, Sums<1> &acc) {
        if (odd_half) unit<T, 1, true, 1>(u, acc);
        else unit<T, 0, true, 1>(u, acc);
    }
};

// Q6_K: the unit is half kHalf (elements 128 kHalf ..) of one block: quadrants r = 0..3,
// element l of quadrant r: 4 bits of ql[64 kHalf + 32 (r & 1) + l] (low nibble r < 2),
// bits 2r of qh[32 kHalf + l], scale scales[8 kHalf + 2r + l / 16]: k16 step st of a
// chunk is one scale. 210-byte blocks: a unit's block starts on 4 bytes or on 2.
struct Q6_KS {
    using Fmt = gguf::Q6_K;
    static constexpr bool kMinsByMeans = false;
    static constexpr int kStreamK = 2048;  // 8 blocks: 1680 bytes
    struct Row {
        uint32_t ql[2][2], qh[2], sc[2];  // ql[r & 1][step], qh[step], scales 8 kHalf ..
        float d;
    };
    template <int kHalf, bool kAligned>
    static __device__ __forceinline__ Row row(uint32_t at, int t) {
        Row r;
#pragma unroll
        for (int st = 0; st < 2; ++st) {
#pragma unroll
            for (int odd = 0; odd < 2; ++odd)
                r.ql[odd][st] = lds_word(kAligned, at + 64 * kHalf + 32 * odd + 16 * st + 4 * t);
            r.qh[st] = lds_word(kAligned,
                                at + offsetof(gguf::BlockQ6_K, qh) + 32 * kHalf + 16 * st + 4 * t);
            r.sc[st] =
                lds_word(kAligned, at + offsetof(gguf::BlockQ6_K, scales) + 8 * kHalf + 4 * st);
        }
        r.d = f16_bits_to_f32(lds_u16(at + offsetof(gguf::BlockQ6_K, d)));
        return r;
    }
    // Codes of quadrant q, step st: the bytes q, or 4q (kTimes4: fp16's fused pairs, unit).
    template <bool kTimes4>
    static __device__ __forceinline__ uint32_t codes(const Row &r, int q, int st) {
        const uint32_t l = r.ql[q & 1][st], h = r.qh[st];
        if constexpr (kTimes4)
            return ((q < 2 ? l << 2 : l >> 2) & 0x3C3C3C3Cu) | ((h << (6 - 2 * q)) & 0xC0C0C0C0u);
        const uint32_t hi = (q < 2 ? h << (4 - 2 * q) : h >> (2 * q - 4)) & 0x30303030u;
        return ((l >> (4 * (q >> 1))) & gguf::kLow4) | hi;
    }
    // The int8 scales of quadrant q's two steps (bytes 2 (q & 1), + 1 of word q / 2 of the
    // half's 8) as a pair of T, step st in half st (read through the operand swizzles): sc,
    // or sc / 4 for fp16 (base + sc + 128 by a byte permute, then an exact fma); bf16
    // through float32.
    template <class T>
    static __device__ __forceinline__ uint32_t scales(const Row &r, int q) {
        const uint32_t w = r.sc[q >> 1];
        constexpr float kBase = Pack<T>::kBase;
        if constexpr (Pack<T>::kF16)
            return hfma2<T>(biased<T>(w ^ 0x80808080u, q & 1), splat<T>(0.25f),
                            splat<T>(-(kBase + 128.0f) / 4));
        const int at = 16 * (q & 1);
        return pack2(T{}, static_cast<float>(static_cast<int8_t>(w >> at)),
                     static_cast<float>(static_cast<int8_t>(w >> (at + 8))));
    }
    // fp16 takes each pair in one fma (kF): codes 4q put base + 4q under the exponent, and
    // (base + 4q) sc / 4 - (base / 4 + 32) sc = (q - 32) sc is exact before the fma's one
    // rounding (sc / 4 and 288 sc are exact: 9 sc has 11 bits, |288 sc| <= 36864), the bits
    // of the exact q - 32 times sc. (Codes q would need 1056 sc: past fp16's range.) bf16
    // (8 significant bits, codes below 128) takes q - 32, then sc.
    template <class T, int kHalf, bool kAligned, int NT>
    static __device__ __forceinline__ void unit(const UnitAt &u, Sums<NT> &acc) {
        const Row ra = row<kHalf, kAligned>(u.wa, u.t), rb = row<kHalf, kAligned>(u.wb, u.t);
        constexpr bool kF = Pack<T>::kF16;
        constexpr float kBase = Pack<T>::kBase;
        const uint32_t off = splat<T>(-(kBase + 32.0f));  // q - 32 (bf16)
        Sums<NT> c;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const uint32_t sa = scales<T>(ra, q), sb = scales<T>(rb, q);
            // fp16: the fma's addends -(base / 4 + 32) sc, from sc / 4
            const uint32_t oa = kF ? hmul2<T>(sa, splat<T>(-4.0f * (kBase / 4 + 32.0f))) : 0u;
            const uint32_t ob = kF ? hmul2<T>(sb, splat<T>(-4.0f * (kBase / 4 + 32.0f))) : 0u;
            Frag s[2];
#pragma unroll
            for (int st = 0; st < 2; ++st) {
                const uint32_t ca = codes<kF>(ra, q, st), cb = codes<kF>(rb, q, st);
                uint32_t p[4];  // rows g, g + 8: pairs 0, 1
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const uint32_t b = biased<T>(i < 2 ? ca : cb, i & 1), sc = i < 2 ? sa : sb;
                    p[i] = kF ? hfma2_by_half<T>(b, sc, i < 2 ? oa : ob, st)
                              : hmul2_by_half<T>(hadd2<T>(b, off), sc, st);
                }
                s[st] = frag(p[0], p[1], p[2], p[3]);
            }
            mma_chunk<T>(c, s[0], s[1], u.x + q * kChunk * 2, u.x_nt);
        }
        scale_add(acc, c, ra.d, rb.d);
    }
    template <class T, int NT>
    static __device__ __forceinline__ void run(const UnitAt &u, bool odd_half, bool aligned4,
                                               Sums<NT> &acc) {
        if (odd_half) {
            if (aligned4) unit<T, 1, true, NT>(u, acc);
            else unit<T, 1, false, NT>(u, acc);
        } else {
            if (aligned4) unit<T, 0, true, NT>(u, acc);
            else unit<T, 0, false, NT>(u, acc);
        }
    }
};

template <class Fmt>
struct Stream;
template <>
struct Stream<gguf::Q4_0> : Block32S<Q4_0Codes> {};
template <>
struct Stream<gguf::Q8_0> : Block32S<Q8_0Codes> {};
template <>
struct Stream<gguf::Q4_K> : QK45S<false> {};
template <>
struct Stream<gguf::Q5_K> : QK45S<true> {};
template <>
struct Stream<gguf::Q6_K> : Q6_KS {};

// One stage: [W: kR tiles of kPieces boxes of 16 rows x kPieceStride bytes][x: rows of
// kStageK / kR elements]. A box row is a piece of the stage's row bytes (all of them but
// for Q8_0 at kR = 1, whose 2176 exceed a box's 256 8-byte elements: two halves), read
// with up to 16 more bytes of the row (or zeros past its end) so that it is an odd
// number of 16-byte units: rows g = 0..7 fall in distinct banks. The consumer warps take
// kUnits units of each of the kR tiles.
template <class Fmt, int kR>
struct Stage {
    static constexpr int kUnits = kStreamWarps / kR;  // of a tile's row a stage
    static constexpr int kRowBytes = kStageK / kR / Fmt::kElems * Fmt::kBytes;
    static constexpr int kPieces = kRowBytes + 16 > 256 * 8 ? 2 : 1;
    static constexpr int kPieceBytes = kRowBytes / kPieces;
    static constexpr int kPieceStride = kPieceBytes + ((kPieceBytes / 16) % 2 == 0 ? 16 : 0);
    static constexpr int kBox = kTileRows * kPieceStride;  // bytes of a box
    static constexpr int kUnitsPerPiece = kUnits / kPieces;
    static constexpr int kTile = kPieces * kBox;  // a tile's boxes
    static constexpr int kX = kR * kTile;
    static constexpr int kXStride = x_stride<kR>();
    static_assert(kPieceBytes % 16 == 0 && kPieceStride <= 256 * 8, "TMA boxes");
    static_assert(kUnits % 2 == 0, "k-quant units come in block halves");
    // on 128 bytes, as TMA boxes land
    static __host__ __device__ constexpr int bytes(int x_rows) {
        return (kX + x_rows * kXStride + 127) / 128 * 128;
    }
    // Bytes of a row's first n units: n is even (a multiple of 16 for Q6_K) wherever
    // the kernel asks, so these are whole blocks and whole 16-byte runs.
    static __host__ __device__ constexpr int64_t unit_bytes(int64_t n) {
        return n * kUnitK * Fmt::kBytes / Fmt::kElems;
    }
};

// Whether a launch over `ctas` CTAs takes the mins against x's means (MeansAt) where x is
// resident: Q4_K (Stream::kMinsByMeans), one n8 tile and kMeansMinTiles row tiles a CTA or
// more.
template <class Fmt, int NT>
bool mins_by_means(int64_t n_out, int ctas) {
    return Stream<Fmt>::kMinsByMeans && NT == 1 &&
           (n_out + kTileRows - 1) / kTileRows >= int64_t{kMeansMinTiles} * ctas;
}

// Whether a format's decode runs well ahead of its copies, for the ring's depth where x is
// resident (gemv.cu, resident_ring_stages): all but Q4_K's, which comes nearest its copies
// and measured faster with four stages, the others with three (bench/RESULTS.md, session 24).
template <class Fmt>
constexpr bool decode_ahead() {
    return !std::is_same_v<Fmt, gguf::Q4_K>;
}

// Rows of x a slot holds: x's rows of the pass for one n8 tile (the lanes past them read
// the last row), 8 NT for more (16 for two, 32 for four: rows past m read stale bytes;
// their sums are never stored).
template <int NT>
__host__ __device__ constexpr int slot_x_rows(int x_rows) { return NT == 1 ? x_rows : 8 * NT; }

// The stage kR a format allows: 2048 / kR elements of a row must be whole 16-byte runs
// (Q6_K's 210-byte blocks: only 2048).
template <class Fmt, int kR>
constexpr bool groups_ok() {
    return (kStageK / kR / Fmt::kElems * Fmt::kBytes) % 16 == 0 && kStageK / kR % Fmt::kElems == 0;
}

// The stage kR (1 or 4) a launch takes, x_bytes being x's bytes a tile group copies (0
// when x is held for the whole kernel): 4 where a one-tile stage leaves no ring of two
// (one_fits false: x's rows too many for it), else where four-tile groups still fill 90% of the
// SMs and their fullest CTA reads fewer bytes, W's tiles and x once a group. (Measured,
// bench/RESULTS.md session 14: where four-tile groups leave SMs idle, 256-tile weights at
// m = 16, their CTAs' decode is the bound, not the bytes.)
template <class Fmt>
int stage_tiles(int64_t n_out, int64_t k_in, int64_t x_bytes, int sms, bool one_fits) {
    if (!groups_ok<Fmt, 4>() || x_bytes == 0) return 1;
    if (!one_fits) return 4;
    const int64_t tiles = (n_out + kTileRows - 1) / kTileRows;
    if ((tiles + 3) / 4 * 10 < int64_t{sms} * 9) return 1;
    const int64_t tile_bytes = kTileRows * (k_in / Fmt::kElems * Fmt::kBytes);
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int r : {1, 4}) {
        const int64_t groups = (tiles + r - 1) / r, c = groups < sms ? groups : sms;
        const int64_t cost = (groups + c - 1) / c * (r * tile_bytes + x_bytes);
        if (cost < best_cost) best = r, best_cost = cost;
    }
    return best;
}

// Whether the streamed kernel reads this weight (see the top of the file).
template <class Fmt>
bool streams(const void *blocks, int64_t k_in, int64_t n_out) {
    return aligned(blocks, 16) && k_in % Stream<Fmt>::kStreamK == 0 && n_out < (int64_t{1} << 31) &&
           k_in / Fmt::kElems * Fmt::kBytes / 8 < (int64_t{1} << 31);
}

// The 2-d map over W (8-byte elements: a row's bytes by rows), boxes of one stage piece by
// 16 rows.
template <class Fmt, int kR>
cudaError_t weight_map(CUtensorMap *map, const void *blocks, int64_t k_in, int64_t n_out) {
    const int64_t row_bytes = k_in / Fmt::kElems * Fmt::kBytes;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes / 8),
                                static_cast<cuuint64_t>(n_out)},
                     strides[1] = {static_cast<cuuint64_t>(row_bytes)};
    const cuuint32_t box[2] = {Stage<Fmt, kR>::kPieceStride / 8, kTileRows};
    return tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, blocks, dims, strides, box);
}

}  // namespace gguf_stream

// A tile group's last stage: the sums of its `live` row tiles from tile0 (tile r: warps
// r U .. r U + U - 1, U = kStreamWarps / kR, added in warp order) meet, bias, y; the sums
// start again from zero.
template <class T, int NT, int kR>
__device__ __forceinline__ void store_stream_group(Sums<NT> &acc, int64_t tile0, int live,
                                                   int64_t m, int64_t n_out,
                                                   const typename T::storage *bias,
                                                   typename T::storage *y) {
    constexpr int kU = kStreamWarps / kR;
    __shared__ float partial[kStreamWarps][kTileRows][kMaxM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    static_assert(kR * kTileRows * kMaxM <= kStreamWarps * 32, "a thread an output");
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        if (nt > 0) consumers_sync();  // the partial sums are reused
        partial[warp][g][2 * t] = acc.v[nt][0];
        partial[warp][g][2 * t + 1] = acc.v[nt][1];
        partial[warp][g + 8][2 * t] = acc.v[nt][2];
        partial[warp][g + 8][2 * t + 1] = acc.v[nt][3];
        consumers_sync();
        const int r = threadIdx.x / (kTileRows * kMaxM), row = threadIdx.x / kMaxM % kTileRows,
                  col = threadIdx.x % kMaxM;
        const int64_t n = (tile0 + r) * kTileRows + row, i = 8 * nt + col;
        if (r < live && n < n_out && i < m) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kU; ++w) v += partial[r * kU + w][row][col];
            store_y<T>(y, bias, i, n, n_out, v);
        }
    }
    acc = Sums<NT>{};
    consumers_sync();  // the partial sums are read before the next group's
}

// NT n8 tiles of x (8 NT rows) a pass, sharing each chunk's decode (m = 9..16: NT = 2;
// from 16 or 17 rows the GGUF GEMM of gemm_sm90.cu); stages of kR row tiles (a tile group; gguf_stream::Stage);
// kMeans: Q4_K's mins against x's means (MeansAt; x resident, NT = kR = 1).
template <class T, class Fmt, int NT, int kR, bool kMeans>
__global__ void __launch_bounds__(kStreamThreads, 1)
gemv_gguf_kernel(const __grid_constant__ CUtensorMap wmap,
                 const typename T::storage *__restrict__ x, int64_t m, int64_t k_in, int64_t n_out,
                 const typename T::storage *__restrict__ bias, typename T::storage *__restrict__ y,
                 int ring_stages, int x_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // the bulk copy engine and mbarrier waits are sm_90's; never launched below
#else
    using namespace gguf_stream;
    using St = Stage<Fmt, kR>;
    using S = Stream<Fmt>;
    constexpr int kU = St::kUnits;
    extern __shared__ __align__(128) uint4 smem[];
    __shared__ alignas(8) uint64_t full[kStreamMaxStages], empty[kStreamMaxStages];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    // The CTA's tile groups: blockIdx.x, then every gridDim.x-th after it (the grid reads
    // neighbouring rows at a time); a group's stages run over the units of its rows, kU a
    // stage.
    const int groups = static_cast<int>(k_in / kUnitK);  // units of a row
    const int64_t tiles = (n_out + kTileRows - 1) / kTileRows;
    const int64_t tgroups = (tiles + kR - 1) / kR;
    const int64_t tile_step = int64_t{gridDim.x} * kR;  // from one of the CTA's groups to the next
    const int stages_per_group = (groups + kU - 1) / kU;
    const int64_t stages = round_robin_count(tgroups) * stages_per_group;
    const int x_rows = static_cast<int>(m < kMaxM * NT ? m : kMaxM * NT);
    const ResidentX rx{NT == 1 && kR == 1 ? x_stride : 0, x_rows, smem_address(smem)};
    const int stage_bytes = St::bytes(rx.on() ? 0 : slot_x_rows<NT>(x_rows));
    // x's sub-block means beside a resident x (MeansAt), then the ring
    static_assert(!kMeans || (S::kMinsByMeans && NT == 1 && kR == 1), "x's means: Q4_K, NT = kR = 1");
    const uint32_t means_at = rx.ring_at();
    const uint32_t ring_at = means_at + (kMeans ? means_bytes(x_rows, k_in) : 0);
    const uint32_t full_at = smem_address(full), empty_at = smem_address(empty);
    if (threadIdx.x == 0) ring_init(full_at, empty_at, ring_stages);
    __syncthreads();

    // The producer (one lane): stage q is units [g0, g0 + n) of the live tiles of group
    // blockIdx.x + (q / stages_per_group) gridDim.x, in slot q % ring_stages: W's boxes
    // (zeros past the rows and their ends) and x.
    if (warp == kStreamWarps) {
        if (lane != 0) return;
        const uint64_t w_policy = evict_first_policy(), x_policy = evict_last_policy();
        const auto *xb = reinterpret_cast<const uint8_t *>(x);
        RingSlot p;
        int g0 = 0;
        int64_t tile0 = int64_t{blockIdx.x} * kR;
        for (int64_t q = 0; q < stages; ++q) {
            if (q >= ring_stages) mbar_wait(empty_at + 8 * p.slot, p.phase ^ 1u);
            const int n = groups - g0 < kU ? groups - g0 : kU;
            const int live = static_cast<int>(tiles - tile0 < kR ? tiles - tile0 : kR);
            const int x_bytes = rx.on() ? 0 : n * kUnitK * 2;
            // a resident x: a piece with each stage of the CTA's first group
            const int x_piece = rx.on() ? rx.x_piece(q < stages_per_group, n * kUnitK) : 0;
            const uint32_t bar = full_at + 8 * p.slot, dst = ring_at + p.at;
            mbar_expect(bar, live * St::kTile + x_rows * (x_bytes + 2 * x_piece));
            for (int r = 0; r < live; ++r)
#pragma unroll
                for (int i = 0; i < St::kPieces; ++i)
                    tma_load(dst + r * St::kTile + i * St::kBox, wmap,
                             static_cast<int>((St::unit_bytes(g0) + i * St::kPieceBytes) / 8),
                             static_cast<int>((tile0 + r) * kTileRows), bar, w_policy);
            // (x copied with each stage through a loop of its own: through ResidentX::copy,
            // as the tiled GEMV's, m = 8 on the long weights measured 1.5-3.5% slower:
            // bench/RESULTS.md, session 25)
            for (int i = 0; i < x_rows && !rx.on(); ++i)
                bulk_copy(dst + St::kX + i * St::kXStride,
                          xb + (i * k_in + static_cast<int64_t>(g0) * kUnitK) * 2, x_bytes, bar,
                          x_policy);
            if (x_piece) rx.copy(bar, xb, k_in, g0 * kUnitK, x_piece, 0, 0, x_policy);
            p.next(ring_stages, stage_bytes);
            if ((g0 += kU) >= groups) g0 = 0, tile0 += tile_step;
        }
        return;
    }

    // The consumers: warp w takes unit j = w % kU of tile r = w / kU of each stage.
    const int r = warp / kU, j = warp % kU;
    UnitAt u;
    u.t = t;
    u.x_nt = 8 * St::kXStride;
    // Q4_0 / Q8_0: a unit is 4 blocks; k-quants: half a block (the half is j & 1)
    const int piece = j / St::kUnitsPerPiece, in_piece = j % St::kUnitsPerPiece;
    const uint32_t w_lane = opaque(ring_at + r * St::kTile + piece * St::kBox +
                                   g * St::kPieceStride +
                                   (Fmt::kElems == kChunk ? in_piece * 4 * Fmt::kBytes
                                                          : (in_piece >> 1) * Fmt::kBytes));
    // x: the stage's copy (at + x_lane), or the resident rows (x_lane + the stage's k,
    // with the stage wait's zero: its first group's stages bring them)
    const int x_row = min(g, x_rows - 1);
    const uint32_t x_lane =
        opaque((rx.on() ? rx.row_at(x_row) : ring_at + St::kX + x_row * St::kXStride) +
               j * kUnitK * 2 + 8 * t);
    const bool odd_half = (j & 1) != 0;
    const bool aligned4 = ((in_piece >> 1) * Fmt::kBytes) % 4 == 0;  // Q6_K's 210-byte blocks
    // the lane's means word and sub-block of x of unit j (the stage's units g0 further)
    const uint32_t means_lane =
        kMeans ? opaque(means_at + x_row * means_stride(k_in) + (4 * j + t) * 4) : 0;
    const uint32_t x_sub = kMeans ? opaque(rx.row_at(x_row) + (j * kUnitK + t * kChunk) * 2) : 0;
    u.means.store = g < x_rows;

    Sums<NT> acc;
    RingSlot c;
    int g0 = 0;
    int64_t tile0 = int64_t{blockIdx.x} * kR;
    for (int64_t q = 0; q < stages; ++q) {
        const uint32_t zero = mbar_wait(full_at + 8 * c.slot, c.phase), at = c.at + zero;
        const int live = static_cast<int>(tiles - tile0 < kR ? tiles - tile0 : kR);
        if (r < live && g0 + j < groups) {
            u.wa = at + w_lane;
            u.wb = u.wa + 8 * St::kPieceStride;
            u.x = rx.on() ? x_lane + g0 * (kUnitK * 2) + zero : at + x_lane;
            if constexpr (kMeans) {
                u.means.at = means_lane + g0 * 16 + zero;
                u.means.x = x_sub + g0 * (kUnitK * 2) + zero;
                u.means.first = q < stages_per_group;
                S::template run_means<T>(u, odd_half, acc);
            } else {
                S::template run<T, NT>(u, odd_half, aligned4, acc);
            }
        }
        mbar_arrive(empty_at + 8 * c.slot);
        c.next(ring_stages, stage_bytes);
        if ((g0 += kU) < groups) continue;
        g0 = 0;
        store_stream_group<T, NT, kR>(acc, tile0, live, m, n_out, bias, y);
        tile0 += tile_step;
    }
#endif
}
