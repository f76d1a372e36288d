// GGUF (ggml) block formats Q4_0, Q8_0, Q4_K, Q5_K, Q6_K: the block layouts and the
// per-group decoders, shared by every operation on them (csrc/quant/gguf.cu,
// csrc/matmul/, csrc/host/) so that all give the same bits.
//
// Work is split into groups of G consecutive outputs (G = 8 for 16-bit outputs and 4
// for fp32 on the GPU: one 16-byte store). A format's `group()` decodes one group of a
// block through a loader that reads little-endian 32-bit words at even byte offsets:
// the host loader assembles bytes, the device loader uses the widest load the
// alignment allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../core/numeric.h"
#include "../core/status.h"
#include "kbit.h"

#if defined(__CUDACC__)
#  include <cuda_bf16.h>
#  include <cuda_fp16.h>
#endif

#if defined(__CUDA_ARCH__)
#  define KBIT_GGUF_UNROLL _Pragma("unroll")
#else
#  define KBIT_GGUF_UNROLL  // constant trip counts: the host compiler unrolls at -O3
#endif

namespace kbit {
namespace gguf {

constexpr int kQK_K = 256;  // elements per k-quant super-block

// ggml's numeric type ids (GGUF tensor info).
enum TypeId : int { kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

// ---- block layouts, byte for byte (fp16 fields held as raw bits) -------------------

struct BlockQ4_0 {
    uint16_t d;        // fp16 scale
    uint8_t qs[16];    // element i: low nibble of qs[i]; element i+16: high nibble
};
struct BlockQ8_0 {
    uint16_t d;        // fp16 scale
    int8_t qs[32];
};
struct BlockQ4_K {
    uint16_t d;          // fp16 scale of the 6-bit sub-block scales
    uint16_t dmin;       // fp16 scale of the 6-bit sub-block mins
    uint8_t scales[12];  // 8 scales and 8 mins, 6 bits each, packed
    uint8_t qs[128];     // 64-element chunk c: qs[32c..32c+31], low nibbles then high
};
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];      // bit s of qh[l]: 5th bit of element l of sub-block s
    uint8_t qs[128];
};
struct BlockQ6_K {
    uint8_t ql[128];     // low 4 bits
    uint8_t qh[64];      // high 2 bits
    int8_t scales[16];   // one signed 8-bit scale per 16 elements
    uint16_t d;          // fp16 super-block scale
};

static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 is 18 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 is 34 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "ggml block_q4_K is 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "ggml block_q5_K is 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "ggml block_q6_K is 210 bytes");
static_assert(offsetof(BlockQ4_K, qs) == 16 && offsetof(BlockQ5_K, qh) == 16 &&
                  offsetof(BlockQ5_K, qs) == 48 && offsetof(BlockQ6_K, qh) == 128 &&
                  offsetof(BlockQ6_K, scales) == 192 && offsetof(BlockQ6_K, d) == 208,
              "field offsets as in ggml");

// ---- arithmetic, identical on both sides ---------------------------------------------

// Products use mul_rn (common.h): rounded once, never fused with a following add, as
// ggml and gguf-py round the product before subtracting the min.

// The low and high IEEE halves of a word as float32 (exact; NaNs turn canonical in the
// first product either way).
KBIT_HD float half_lo(uint32_t w) { return f16_bits_to_f32(static_cast<uint16_t>(w & 0xFFFFu)); }
KBIT_HD float half_hi(uint32_t w) { return f16_bits_to_f32(static_cast<uint16_t>(w >> 16)); }

// Byte i (0..7) of two little-endian words; i must be a compile-time constant in
// unrolled loops so that no register array is indexed at run time.
// Byte i of a little-endian word, minus `bias`, as an exact float: the byte is placed
// in the mantissa of 2^23 (0x4B0000vv = 2^23 + v) and 2^23 + bias is subtracted, which
// is exact for these small integers. One byte permute and one add on the GPU.
KBIT_HD float byte_minus(uint32_t w, int i, float bias) {
#if defined(__CUDA_ARCH__)
    const uint32_t bits = __byte_perm(w, 0x4B000000u, 0x7540u | static_cast<uint32_t>(i));
#else
    const uint32_t bits = 0x4B000000u | ((w >> (8 * i)) & 0xFFu);
#endif
    return f32_from_bits(bits) - (8388608.0f + bias);
}

// Elements are extracted four at a time: each byte of a word holds one element's
// integer code (0..63, or the int8 code + 128 for Q8_0).
constexpr uint32_t kLow4 = 0x0F0F0F0Fu, kLow2 = 0x03030303u, kLow1 = 0x01010101u;

// 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block; s0, s1, s2 are the
// 12 packed bytes as little-endian words. Sub-blocks 0..3: the low 6 bits of bytes s
// and s+4. Sub-blocks 4..7: a nibble of byte s+4 plus the top 2 bits of bytes s-4, s.
KBIT_HD void scale_min_k4(uint32_t s0, uint32_t s1, uint32_t s2, int s, uint32_t *sc,
                          uint32_t *mn) {
    const int sh = 8 * (s & 3);
    const uint32_t a = (s0 >> sh) & 0xFFu, b = (s1 >> sh) & 0xFFu, c = (s2 >> sh) & 0xFFu;
    const bool low = s < 4;  // selects, not branches: a warp holds every sub-block
    *sc = low ? (a & 63u) : ((c & 15u) | ((a >> 6) << 4));
    *mn = low ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4));
}

// The same four at a time: the 6-bit scales (sc) and mins (mn) of sub-blocks 4 half ..
// 4 half + 3 as the bytes of two words (byte j: sub-block 4 half + j).
KBIT_HD void scales_mins_k4(uint32_t s0, uint32_t s1, uint32_t s2, int half, uint32_t &sc,
                            uint32_t &mn) {
    if (half == 0) {
        sc = s0 & 0x3F3F3F3Fu;
        mn = s1 & 0x3F3F3F3Fu;
    } else {
        sc = (s2 & kLow4) | ((s0 >> 2) & 0x30303030u);
        mn = ((s2 >> 4) & kLow4) | ((s1 >> 2) & 0x30303030u);
    }
}

// ---- formats: decode elements e0 .. e0+G-1 of the block behind `ld` into y ---------
//
// G is 4, 8 or 16 (the host's) and e0 a multiple of G, so a group never straddles a
// sub-block, a scale group or a run of packed bytes. Loader interface: ld.template
// words<N, OffAlign>(off, w) fills w[0..N-1] with the 4N bytes at byte offset `off` of
// the block, off being a multiple of OffAlign (>= 2); ld.u16(off) reads 2 bytes at an
// even offset, ld.byte(off) one.
// Every load comes before any use of a loaded value: the device loader may branch on
// alignment, and math placed before such a branch delays the loads behind it.

// Q4_0: element e is the low nibble of qs[e] (e < 16) or the high nibble of qs[e-16].
struct Q4_0 {
    static constexpr int kTypeId = kQ4_0, kElems = 32, kBytes = sizeof(BlockQ4_0);
    template <int G, class L>
    KBIT_HD static void group(const L &ld, int e0, float (&y)[G]) {
        uint32_t q[G / 4];
        const uint32_t d_bits = ld.u16(offsetof(BlockQ4_0, d));
        ld.template words<G / 4, 2>(offsetof(BlockQ4_0, qs) + (e0 & 15), q);
        const float d = half_lo(d_bits);  // after the loads (see above)
        const int shift = 4 * (e0 >> 4);
KBIT_GGUF_UNROLL
        for (int i = 0; i < G; ++i)
            y[i] = mul_rn(d, byte_minus((q[i / 4] >> shift) & kLow4, i % 4, 8.0f));
    }
};

struct Q8_0 {
    static constexpr int kTypeId = kQ8_0, kElems = 32, kBytes = sizeof(BlockQ8_0);
    template <int G, class L>
    KBIT_HD static void group(const L &ld, int e0, float (&y)[G]) {
        uint32_t q[G / 4];
        const uint32_t d_bits = ld.u16(offsetof(BlockQ8_0, d));
        ld.template words<G / 4, 2>(offsetof(BlockQ8_0, qs) + e0, q);
        const float d = half_lo(d_bits);  // after the loads (see above)
KBIT_GGUF_UNROLL
        for (int i = 0; i < G; ++i)  // int8 x: byte x ^ 0x80 is x + 128
            y[i] = mul_rn(d, byte_minus(q[i / 4] ^ 0x80808080u, i % 4, 128.0f));
    }
};

// Q4_K and Q5_K: sub-block s = e/32 has scale d*sc[s] and min dmin*m[s]; element l of
// it is the low (even s) or high (odd s) nibble of qs[32*(s/2) + l]; Q5_K adds bit s
// of qh[l] as the 5th bit. Value: (d*sc) * q - (dmin*m), each product rounded.
template <bool kFifthBit>
struct QK_45 {
    using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
    static constexpr int kTypeId = kFifthBit ? kQ5_K : kQ4_K, kElems = kQK_K,
                         kBytes = sizeof(Block);
    template <int G, class L>
    KBIT_HD static void group(const L &ld, int e0, float (&y)[G]) {
        uint32_t h[4], q[G / 4], qh[G / 4] = {};
        const int s = e0 >> 5, l0 = e0 & 31;
        ld.template words<4, 16>(0, h);  // d, dmin, scales[12]
        if constexpr (kFifthBit) ld.template words<G / 4, G>(offsetof(BlockQ5_K, qh) + l0, qh);
        ld.template words<G / 4, G>(offsetof(Block, qs) + 32 * (s >> 1) + l0, q);
        uint32_t sc, mn;  // after the loads (see above)
        scale_min_k4(h[1], h[2], h[3], s, &sc, &mn);
        const float d1 = mul_rn(half_lo(h[0]), static_cast<float>(sc));
        const float m1 = mul_rn(half_hi(h[0]), static_cast<float>(mn));
        const int shift = 4 * (s & 1);
KBIT_GGUF_UNROLL
        for (int i = 0; i < G; ++i) {
            uint32_t v = (q[i / 4] >> shift) & kLow4;
            if constexpr (kFifthBit) v |= ((qh[i / 4] >> s) & kLow1) << 4;
            y[i] = mul_rn(d1, byte_minus(v, i % 4, 0.0f)) - m1;
        }
    }
};
using Q4_K = QK_45<false>;
using Q5_K = QK_45<true>;

// Q6_K: half hf = e/128, quadrant r = (e%128)/32, element l = e%32 of the quadrant.
// Low 4 bits: ql[64hf + 32(r&1) + l], low nibble for r < 2, high for r >= 2; high 2
// bits: bits 2r of qh[32hf + l]; scale: scales[8hf + 2r + l/16]. Value:
// (d * scale) * (q - 32).
struct Q6_K {
    static constexpr int kTypeId = kQ6_K, kElems = kQK_K, kBytes = sizeof(BlockQ6_K);
    template <int G, class L>
    KBIT_HD static void group(const L &ld, int e0, float (&y)[G]) {
        uint32_t ql[G / 4], qh[G / 4];
        const int hf = e0 >> 7, r = (e0 >> 5) & 3, l0 = e0 & 31;
        const uint32_t d = ld.u16(offsetof(BlockQ6_K, d));
        const uint32_t sc = ld.byte(offsetof(BlockQ6_K, scales) + 8 * hf + 2 * r + (l0 >> 4));
        ld.template words<G / 4, G>(offsetof(BlockQ6_K, ql) + 64 * hf + 32 * (r & 1) + l0, ql);
        ld.template words<G / 4, G>(offsetof(BlockQ6_K, qh) + 32 * hf + l0, qh);
        // Scale math after the element loads (see above): placed before them, it made
        // every GPU thread wait for d and sc first, two memory latencies in a row.
        const float ds = mul_rn(half_lo(d), static_cast<float>(static_cast<int8_t>(sc)));
        const int lshift = 4 * (r >> 1), hshift = 2 * r;
KBIT_GGUF_UNROLL
        for (int i = 0; i < G; ++i) {
            const uint32_t v =
                ((ql[i / 4] >> lshift) & kLow4) | (((qh[i / 4] >> hshift) & kLow2) << 4);
            y[i] = mul_rn(ds, byte_minus(v, i % 4, 32.0f));
        }
    }
};

// Host loader: assembles little-endian words from bytes (any host byte order).
struct HostLoader {
    const uint8_t *p;
    template <int N, int OffAlign>
    void words(int off, uint32_t (&w)[N]) const {
        const uint8_t *q = p + off;
        for (int i = 0; i < N; ++i)
            w[i] = static_cast<uint32_t>(q[4 * i]) | (static_cast<uint32_t>(q[4 * i + 1]) << 8) |
                   (static_cast<uint32_t>(q[4 * i + 2]) << 16) |
                   (static_cast<uint32_t>(q[4 * i + 3]) << 24);
    }
    uint16_t u16(int off) const {
        return static_cast<uint16_t>(p[off] | (static_cast<uint32_t>(p[off + 1]) << 8));
    }
    uint32_t byte(int off) const { return p[off]; }
};

// The host's block decoder (dequantize and the fused matmul): the Fmt::kElems values
// of the block at `block`, in ggml's element order.
template <class Fmt>
inline void dequantize_block_host(const uint8_t *block, float *out) {
    constexpr int kGroup = 16;  // the largest group every format takes (Q4_0, Q6_K)
    const HostLoader ld{block};
    for (int e0 = 0; e0 < Fmt::kElems; e0 += kGroup) {
        float y[kGroup];
        Fmt::template group<kGroup>(ld, e0, y);
        for (int i = 0; i < kGroup; ++i) out[e0 + i] = y[i];
    }
}

#if defined(__CUDACC__)
// ---- device loader ----------------------------------------------------------------------

// Loads N little-endian words from q, which is Align-byte aligned, with the widest
// loads that alignment allows.
template <int Align, int N>
__device__ __forceinline__ void load_words(const uint8_t *q, uint32_t (&w)[N]) {
    if constexpr (Align >= 16 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(q) + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (Align >= 8 && N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const uint2 v = __ldg(reinterpret_cast<const uint2 *>(q) + i);
            w[2 * i] = v.x, w[2 * i + 1] = v.y;
        }
    } else if constexpr (Align >= 4) {
#pragma unroll
        for (int i = 0; i < N; ++i) w[i] = __ldg(reinterpret_cast<const unsigned *>(q) + i);
    } else {
        const unsigned short *h = reinterpret_cast<const unsigned short *>(q);
#pragma unroll
        for (int i = 0; i < N; ++i)
            w[i] = static_cast<uint32_t>(__ldg(h + 2 * i)) |
                   (static_cast<uint32_t>(__ldg(h + 2 * i + 1)) << 16);
    }
}

// Loads N little-endian words from q with q % 4 == 2: a 2-byte load, N - 1 aligned
// 4-byte loads and a 2-byte load (N + 1 loads instead of 2N), none outside the range.
template <int N>
__device__ __forceinline__ void load_words_2mod4(const uint8_t *q, uint32_t (&w)[N]) {
    const uint32_t head = __ldg(reinterpret_cast<const unsigned short *>(q));
    const uint32_t tail = __ldg(reinterpret_cast<const unsigned short *>(q + 4 * N - 2));
    const unsigned *mid = reinterpret_cast<const unsigned *>(q + 2);
    uint32_t prev = head;
#pragma unroll
    for (int i = 0; i < N - 1; ++i) {
        const uint32_t m = __ldg(mid + i);
        w[i] = __byte_perm(prev, m, 0x5410);  // low half of prev, low half of m
        prev = m >> 16;
    }
    w[N - 1] = __byte_perm(prev, tail, 0x5410);
}

// Reads a block whose start is InAlign-byte aligned (see the loader interface in
// formats/gguf.h). InAlign = 0: alignment known only at run time (210-byte blocks, or a buffer
// that is not 16-byte aligned); the loader then tests each address and takes the
// widest load it allows. A warp reads within one k-quant block, so the test goes the
// same way for the whole warp.
template <int InAlign>
struct DeviceLoader {
    const uint8_t *__restrict__ p;

    template <int N, int OffAlign>
    __device__ __forceinline__ void words(int off, uint32_t (&w)[N]) const {
        const uint8_t *q = p + off;
        if constexpr (InAlign == 0) {
            const auto a = static_cast<unsigned>(reinterpret_cast<uintptr_t>(q));
            if constexpr (OffAlign >= 16 && N % 4 == 0) {
                if (a % 16 == 0) return load_words<16>(q, w);
            }
            if constexpr (OffAlign >= 8 && N % 2 == 0) {
                if (a % 8 == 0) return load_words<8>(q, w);
            }
            if constexpr (OffAlign >= 4) {
                if (a % 4 == 0) return load_words<4>(q, w);
                load_words_2mod4(q, w);  // blocks are 2-byte aligned, so a % 4 == 2
            } else {
                load_words<2>(q, w);
            }
        } else {
            load_words<(InAlign < OffAlign ? InAlign : OffAlign)>(q, w);
        }
    }
    __device__ __forceinline__ uint16_t u16(int off) const {
        return __ldg(reinterpret_cast<const unsigned short *>(p + off));
    }
    __device__ __forceinline__ uint32_t byte(int off) const { return __ldg(p + off); }
};

#endif  // __CUDACC__

}  // namespace gguf
}  // namespace kbit

namespace kbit {
namespace gguf {

// Argument checks shared by the GPU and CPU entries (n = 0 is a no-op).
template <class Fmt, class T>
inline kbit_status check_args(const void *blocks, int64_t n, const void *output) {
    KBIT_TRY(check_n(n, sizeof(typename T::storage)));
    if (n % Fmt::kElems != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "n = %lld is not a multiple of the block size %d",
                    static_cast<long long>(n), Fmt::kElems);
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(blocks, "blocks", 2));
    KBIT_TRY(check_ptr(output, "output", sizeof(typename T::storage)));
    return KBIT_SUCCESS;
}

inline kbit_status bad_type(int ggml_type) {
    return fail(KBIT_ERROR_INVALID_ARGUMENT,
                "ggml type %d is not supported (Q4_0=2, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14)",
                ggml_type);
}

// kbit_gguf_to_kbit: a Q4_0 weight as the kbit K = 4 weight that dequantizes to the same
// float32 values (SPEC section 1: out = codebook[c] * d). Block b's code c_i is its nibble
// q_i as it is, its absmax the block's fp16 d (its bits, KBIT_ABSMAX_FP16, or widened,
// KBIT_ABSMAX_FP32, a NaN as 0x7FFFFFFF), and the codebook c - 8 (integers, exact;
// kbit.gguf.Q4_0_CODEBOOK): c - 8 times d is ggml's (q - 8) d, rounded once alike. Only
// Q4_0 has one scale and no offset a 32-element block; the k-quants' mins have no kbit
// form.
inline kbit_status check_to_kbit(int ggml_type, const void *blocks, int64_t n,
                                 kbit_absmax_format fmt, const uint32_t *kbit_packed,
                                 const void *kbit_absmax) {
    if (ggml_type != kQ4_0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "ggml type %d has no exact kbit form: only Q4_0 (2) converts", ggml_type);
    KBIT_TRY(check_n(n, 4));  // (the largest per-element count: kbit's words, n / 8 bytes)
    if (n % Q4_0::kElems != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "n = %lld is not a multiple of the block size 32",
                    static_cast<long long>(n));
    KBIT_TRY(check_exact_scales(fmt));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(blocks, "blocks", 2));
    KBIT_TRY(check_ptr(kbit_packed, "kbit_packed", 4));
    return check_ptr(kbit_absmax, "kbit_absmax", fmt == KBIT_ABSMAX_FP32 ? 4 : 2);
}

// Block b of a Q4_0 weight into kbit K = 4: its four bit planes and its absmax.
KBIT_HD void q4_0_block_to_kbit(const uint8_t *blocks, int64_t b, kbit_absmax_format fmt,
                                uint32_t *kbit_packed, void *kbit_absmax) {
    const uint8_t *blk = blocks + b * sizeof(BlockQ4_0);
    uint32_t planes[4] = {0, 0, 0, 0};
    for (int i = 0; i < 16; ++i) {  // (element i: the low nibble of qs[i], 16 + i the high)
        const uint32_t byte = blk[offsetof(BlockQ4_0, qs) + i];
        set_bitplane_code(planes, 4, i, byte & 15u);
        set_bitplane_code(planes, 4, 16 + i, byte >> 4);
    }
    for (int j = 0; j < 4; ++j) kbit_packed[b * 4 + j] = planes[j];
    const uint16_t d = static_cast<uint16_t>(blk[0] | blk[1] << 8);  // little-endian fp16
    if (fmt == KBIT_ABSMAX_FP32)  // (a NaN canonical: the host's and GPU's bits alike)
        static_cast<float *>(kbit_absmax)[b] = canonical_nan(half_lo(d));
    else
        static_cast<uint16_t *>(kbit_absmax)[b] = d;
}

// The runtime switch from a ggml type id: calls f(Fmt{}) (f returns kbit_status).
template <class F>
inline kbit_status with_type(int ggml_type, F &&f) {
    switch (ggml_type) {
        case kQ4_0: return f(Q4_0{});
        case kQ8_0: return f(Q8_0{});
        case kQ4_K: return f(Q4_K{});
        case kQ5_K: return f(Q5_K{});
        case kQ6_K: return f(Q6_K{});
        default: return bad_type(ggml_type);
    }
}

}  // namespace gguf
}  // namespace kbit
