// The kbit format (SPEC section 1): its layout, scale formats, arithmetic, decoder and
// argument checks, shared by every operation on it (csrc/quant/kbit.cu, csrc/matmul/,
// csrc/host/). Every function here gives the same bits on the CPU and the GPU: float
// operations are written with explicit rounding (no contraction into FMA), so both sides
// produce identical packed codes and scales.
#pragma once

#include <cmath>
#include <cstdint>

#include "../core/numeric.h"
#include "../core/status.h"
#include "kbit_codebooks.h"

namespace kbit {

constexpr int kBlock = 32;
constexpr float kE4M4Max = 31.0f;
constexpr float kF16Max = 65504.0f;
constexpr float kF32Max = 3.4028234663852886e38f;
// E4M4 scale search: offsets from c0 (the smallest code >= absmax) in preference order;
// the first candidate with the least error wins.
constexpr int kNumCandidates = 4;
KBIT_HD int candidate_offset(int i) { return i == 0 ? 0 : (i == 3 ? 1 : -i); }
// A candidate's error is sum (v - value)^2 over the block in float32, summed in a fixed
// order on both sides: each run of 8 elements in element order, then the 4 runs as
// (r0 + r1) + (r2 + r3), and weighted by decode(c)^2 (exact).
constexpr int kRun = 8;
// Search table bins: v in [-2, 2) in steps of 1/128, clamped at both ends.
constexpr int kBins = 512;

// |x| as ordered bits: NaN > +inf > finite, so a max over bits finds non-finite too.
KBIT_HD uint32_t abs_bits(float x) { return f32_bits(x) & 0x7FFFFFFFu; }
KBIT_HD bool bits_finite(uint32_t abits) { return abits < 0x7F800000u; }

// ---- absmax formats ----------------------------------------------------------------

// Exact E4M4 decode, built from the float32 bits: e > 0: 2^(e-11) * (1 + m/16);
// e = 0: m * 2^-14.
KBIT_HD float e4m4_decode(uint32_t code) {
    uint32_t e = code >> 4, m = code & 15u;
    float normal = f32_from_bits(((e + 116u) << 23) | (m << 19));
    float sub = static_cast<float>(m) * 6.103515625e-05f;
    return e ? normal : sub;
}

// Smallest E4M4 code whose value is >= a (a finite, >= 0); 256 if a > 31.
KBIT_HD int e4m4_ceil(float a) {
    if (!(a > 0.0f)) return 0;
    if (a > kE4M4Max) return 256;
    if (a <= 9.765625e-04f) {  // a <= 2^-10: subnormal range, steps of 2^-14
        float q = a * 16384.0f;  // exact
        int c = static_cast<int>(q);
        return static_cast<float>(c) < q ? c + 1 : c;  // ceil; 16 = code of 2^-10
    }
    uint32_t bits = f32_bits(a);
    int e = static_cast<int>(bits >> 23) - 127 + 11;
    int m = static_cast<int>((bits >> 19) & 15u);
    if (bits & 0x7FFFFu) ++m;
    if (m == 16) { m = 0; ++e; }
    return (e << 4) | m;
}

// Smallest fp16 (as bits) >= a (a finite, 0 <= a <= 65504).
KBIT_HD uint16_t f16_ceil_bits(float a) {
    const uint16_t h = store_cast(F16{}, a);  // round to nearest (the hardware's on the GPU)
    return f16_bits_to_f32(h) < a ? static_cast<uint16_t>(h + 1) : h;
}

// The fp32 or fp16 scale stored for a block with a_s = absmax / tensor_scale: its bits
// and value, and whether the block is over the format's range. A block over the range
// is stored at the format's maximum (fp32: only with a caller's tensor_scale < 1); a
// non-finite block stores NaN.
struct PlainScale {
    uint32_t bits;
    float value;
    bool over;
};
KBIT_HD PlainScale plain_scale(kbit_absmax_format fmt, float a_s, bool finite) {
    if (fmt == KBIT_ABSMAX_FP32) {
        const bool over = finite && a_s > kF32Max;
        const float v = !finite ? NAN : (over ? kF32Max : a_s);
        return {f32_bits(v), v, over};
    }
    const bool over = finite && a_s > kF16Max;
    const uint16_t h = !finite ? 0x7E00 : (over ? 0x7BFF : f16_ceil_bits(a_s));
    return {h, f16_bits_to_f32(h), over};
}

// A stored block scale, given as its raw bits (1, 2 or 4 bytes), as a float.
KBIT_HD float decode_scale(kbit_absmax_format fmt, uint32_t bits) {
    if (fmt == KBIT_ABSMAX_E4M4) return e4m4_decode(bits);
    if (fmt == KBIT_ABSMAX_FP16) return f16_bits_to_f32(static_cast<uint16_t>(bits));
    return f32_from_bits(bits);
}
// The raw bits of block b's stored scale.
KBIT_HD uint32_t scale_bits(kbit_absmax_format fmt, const void *absmax, int64_t b) {
    if (fmt == KBIT_ABSMAX_E4M4) return static_cast<const uint8_t *>(absmax)[b];
    if (fmt == KBIT_ABSMAX_FP16) return static_cast<const uint16_t *>(absmax)[b];
    return static_cast<const uint32_t *>(absmax)[b];
}
KBIT_HD float decode_absmax(kbit_absmax_format fmt, const void *absmax, int64_t b) {
    return decode_scale(fmt, scale_bits(fmt, absmax, b));
}

// The tensor_scale for a tensor whose largest finite |x| is max_abs:
//  - above the format's maximum: max_abs / limit (rounded up until it fits);
//  - a small tensor: the power of two that brings max_abs into [limit / 2, limit), so
//    that block scales stay in the format's normal range, whose subnormal scales are
//    coarse (a power of two keeps decode * tensor_scale exact, and the dequantized
//    values are those of tensor_scale 1 wherever both scales are normal). Small is
//    max_abs <= limit / 2 for E4M4, and max_abs < 2^-4 for fp16 (below that, blocks
//    within 2^10 of the maximum could get subnormal fp16 scales; at 1e-12 every block
//    did, and lost all accuracy). The power of two is at least 2^-126 (a normal float);
//  - otherwise 1.
inline float tensor_scale_for(float max_abs, kbit_absmax_format fmt) {
    float limit = fmt == KBIT_ABSMAX_E4M4 ? kE4M4Max : (fmt == KBIT_ABSMAX_FP16 ? kF16Max : INFINITY);
    if (max_abs > limit) {
        float ts = max_abs / limit;
        while (max_abs / ts > limit) ts = std::nextafter(ts, INFINITY);
        return ts;
    }
    const bool small = fmt == KBIT_ABSMAX_E4M4   ? max_abs <= 0.5f * limit
                       : fmt == KBIT_ABSMAX_FP16 ? max_abs < 0.0625f
                                                 : false;
    if (!small || !(max_abs > 0.0f)) return 1.0f;
    int e = 0;
    std::frexp(static_cast<double>(max_abs) / limit, &e);  // exactly f * 2^e, f in [0.5, 1)
    return std::ldexp(1.0f, e < -126 ? -126 : e);          // max_abs / ts = limit * f
}

// ---- dequantization ---------------------------------------------------------------

// What every element of block b is multiplied by: decode(absmax[b]) * tensor_scale. A
// finite decode whose product rounds past FLT_MAX is held there: a tensor whose largest
// |x| is FLT_MAX gets a tensor_scale with which the top block's product does, and its
// finite values must stay finite. (NaN and infinite stored scales pass through.)
KBIT_HD float scale_product(float dec, float ts) {
    const float d = mul_rn(dec, ts);
    const bool held = !bits_finite(abs_bits(d)) && bits_finite(abs_bits(dec)) && d == d;
    return held ? f32_from_bits((f32_bits(d) & 0x80000000u) | 0x7F7FFFFFu) : d;
}
KBIT_HD float block_scale(kbit_absmax_format fmt, const void *absmax, int64_t b, float ts) {
    return scale_product(decode_absmax(fmt, absmax, b), ts);
}

// The code of element i (0..31) of a block: bit j is bit i of the block's word j.
KBIT_HD uint32_t bitplane_code(const uint32_t *words, int k, int i) {
    uint32_t c = 0;
    for (int j = 0; j < k; ++j) c |= ((words[j] >> i) & 1u) << j;
    return c;
}
// Its inverse: code c of element i into the block's k words (whose bits i are zero).
KBIT_HD void set_bitplane_code(uint32_t *words, int k, int i, uint32_t c) {
    for (int j = 0; j < k; ++j) words[j] |= ((c >> j) & 1u) << i;
}

// The codebook of a call: the caller's, or the built-in one for k when it passed NULL.
inline const float *resolve_codebook(const float *codebook, int k) {
    return codebook ? codebook : kNormalFloat[k];
}

// The codes of elements 8g .. 8g + 7 of a block, one a byte (element 8g + i in byte i):
// each plane's byte g has its bit i moved to bit 0 of byte i (the multiply copies the byte
// into all eight, the mask keeps bit i of byte i, the add carries a set bit to the byte's
// top bit, no further), and plane j is shifted to bit j. For the host, K <= 8.
template <int K>
inline uint64_t bitplane_codes8(const uint32_t *words, int g) {
    constexpr uint64_t kOnes = 0x0101010101010101ull;
    uint64_t codes = 0;
    for (int j = 0; j < K; ++j) {
        const uint64_t b = (words[j] >> (8 * g)) & 0xFFu;
        codes |= ((((b * kOnes) & 0x8040201008040201ull) + 0x7F * kOnes) >> 7 & kOnes) << j;
    }
    return codes;
}

// The host's block decoder (dequantize and the fused matmul, which fix K per call with
// with_k): out[i] = codebook[c_i] * d for the first `valid` elements of the block whose K
// words are `words`; eight codes at a time (the same values as bitplane_code's).
template <int K>
inline void dequantize_block_k(const uint32_t *words, const float *codebook, float d, int valid,
                               float *out) {
    for (int g = 0; 8 * g < valid; ++g) {
        const uint64_t codes = bitplane_codes8<K>(words, g);
        const int n = valid - 8 * g < 8 ? valid - 8 * g : 8;
        for (int i = 0; i < n; ++i)
            out[8 * g + i] = mul_rn(codebook[(codes >> (8 * i)) & 0xFFu], d);
    }
}

// ---- nearest codebook entry ----------------------------------------------------------

// The nearest codebook entry. Over the sorted distinct entries s[0..u), the midpoints
// (s[j] + s[j+1]) / 2 are computed in float32, and an exact midpoint goes to the entry
// with the lower original index. That tie rule is folded into thresholds: thr[j] is the
// midpoint, or the float just below it when the tie goes up, so the entry is s[p] with
// p = #{j : v > thr[j]} for every v (NaN: p = 0). The host and the GPU both search
// these thresholds, each with its own binning of v: any monotone binning gives, per
// bin, a lower bound of p (the first threshold of the bin onwards).

// The float just below x (x finite).
KBIT_HD float next_below(float x) {
    const uint32_t b = f32_bits(x);
    return x == 0.0f ? f32_from_bits(0x80000001u) : f32_from_bits(x > 0.0f ? b - 1 : b + 1);
}

KBIT_HD float midpoint(float a, float b) { return mul_rn(a + b, 0.5f); }

// Threshold between neighbouring sorted entries lo < hi whose lowest original indices
// are code_lo and code_hi.
// The threshold stays within [lo, hi): a midpoint rounded onto an entry (entries an ulp
// or two apart) must not take a v equal to that entry away from it.
KBIT_HD float tie_threshold(float lo, float hi, int code_lo, int code_hi) {
    const float mid = midpoint(lo, hi);
    const float thr = code_lo < code_hi ? mid : next_below(mid);
    const float top = next_below(hi);
    return thr < lo ? lo : (thr > top ? top : thr);
}

// The host's table: sorted distinct entries, their codes and thresholds, and per bin of
// v the number of thresholds in lower bins.
struct SearchTable {
    float thr[kBlock];     // thr[unique - 1] = +inf
    float value[kBlock];   // s[j]
    uint8_t code[kBlock];  // lowest original index holding s[j]
    uint8_t start[kBins];
    int unique;
};

// The host's bin of v: floor((v + 2) * 128) clamped to the table (NaN: bin 0).
inline int search_bin(float v) {
    float y = (v + 2.0f) * 128.0f;
    if (!(y > 0.0f)) return 0;
    if (y >= static_cast<float>(kBins - 1)) return kBins - 1;
    return static_cast<int>(y);
}

struct Nearest {
    int code;
    float value;
};

inline Nearest search_nearest(const SearchTable &tab, float v) {
    int p = tab.start[search_bin(v)];
    while (v > tab.thr[p]) ++p;
    return {tab.code[p], tab.value[p]};
}

// v = x / d as the quantizer computes it: x * rcp_rn(d) (never NaN for finite x).
KBIT_HD float scaled(float x, float inv) { return mul_rn(x, inv); }

// Tiny blocks: 1/d of a block scale below about 2^-128 is past FLT_MAX, so a block whose
// largest |x| is below 2^-64 (and a tensor_scale that allows it) is quantized as
// x * 2^64 against the scale d * 2^64 (both exact; elsewhere the two agree bit for bit).
// Its stored scale is unchanged.
constexpr float kTinyBlock = 0x1p-64f, kTinyShift = 0x1p64f, kTinyMaxTs = 0x1p60f;
KBIT_HD bool tiny_block(float a, bool finite, float ts) {
    return finite && a > 0.0f && a < kTinyBlock && ts < kTinyMaxTs;
}

// Reciprocal of a block scale; 0 for a zero block (every element then maps to v = 0).
KBIT_HD float inverse_scale(float d) { return d > 0.0f ? rcp_rn(d) : 0.0f; }

// Reciprocal of E4M4 candidate c's scale decode(c) * tensor_scale, defined as
// rcp(decode(c)) * rcp(tensor_scale) so that the GPU reads rcp(decode(c)) from a table.
KBIT_HD float e4m4_inverse(float rcp_dec, float rcp_ts) {
    const float r = mul_rn(rcp_dec, rcp_ts);
    return r < kF32Max ? r : kF32Max;
}

// The inverse of a block's stored scale dec when the codes are taken against it
// directly (fp32/fp16 scales, or an E4M4 block for which no candidate was chosen): 0
// for a non-finite block; for an E4M4 code the search could have tried (in range and
// non-zero) the candidates' own definition, e4m4_inverse(rcp_dec = rcp(dec)); else
// 1 / (dec * ts).
KBIT_HD float stored_inverse(bool e4m4, bool finite, bool over, float dec, float rcp_dec,
                             float ts, float rcp_ts) {
    if (!finite) return 0.0f;
    if (e4m4 && !over && dec > 0.0f) return e4m4_inverse(rcp_dec, rcp_ts);
    return inverse_scale(mul_rn(dec, ts));
}

// Adds one element's squared residual to a run's sum.
KBIT_HD float add_error(float acc, float v, float value) {
    const float r = sub_rn(v, value);
    return add_rn(acc, mul_rn(r, r));
}
// The same weighted by an element's importance w (kbit_quantize_ex): acc + w * r^2.
KBIT_HD float add_error(float acc, float v, float value, float w) {
    const float r = sub_rn(v, value);
    return add_rn(acc, mul_rn(w, mul_rn(r, r)));
}

// ---- decoding ----------------------------------------------------------------------------

// Code bytes of the 8 elements [8q, 8q+8) of a block from its K bit-plane words w:
// byte e of lo / hi is the code of element 8q + e / 8q + 4 + e.
template <int K>
KBIT_HD void spread_codes(const uint32_t (&w)[K], int q, uint32_t &lo, uint32_t &hi) {
    lo = hi = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < K; ++j) {
        const uint32_t byte = w[j] >> (8 * q);
        // nibble * 0x204081 puts bit e at bit 8e (no carries); << j selects plane j.
        lo |= ((byte & 0xFu) * (0x204081u << j)) & (0x01010101u << j);
        hi |= (((byte >> 4) & 0xFu) * (0x204081u << j)) & (0x01010101u << j);
    }
}

#if defined(__CUDACC__)
// The built-in codebooks in device memory (one copy per kernel file): a warp reads its
// K-bit book with one coalesced load, graph-safe and with no allocation.
struct DeviceCodebooks {
    float v[4][kBlock];  // [K - 2][i]
};
constexpr DeviceCodebooks make_device_codebooks() {
    DeviceCodebooks d{};
    for (int k = 2; k <= 5; ++k)
        for (int i = 0; i < (1 << k); ++i) d.v[k - 2][i] = kNormalFloat[k][i];
    return d;
}
static __device__ const DeviceCodebooks g_normal_float = make_device_codebooks();

#endif

// ---- argument checks ---------------------------------------------------------------------

inline size_t absmax_align(kbit_absmax_format f) {
    return f == KBIT_ABSMAX_FP32 ? 4 : (f == KBIT_ABSMAX_FP16 ? 2 : 1);
}

// elem: bytes per element of the input (quantize) or output (dequantize).
inline kbit_status check_common(int64_t n, size_t elem, kbit_absmax_format fmt,
                                float tensor_scale) {
    KBIT_TRY(check_n(n, elem));
    if (static_cast<int>(fmt) < KBIT_ABSMAX_FP32 || static_cast<int>(fmt) > KBIT_ABSMAX_E4M4)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown absmax format %d", static_cast<int>(fmt));
    if (!(tensor_scale > 0.0f) || !std::isfinite(tensor_scale))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "tensor_scale must be finite and > 0, got %g",
                    static_cast<double>(tensor_scale));
    return KBIT_SUCCESS;
}

// Checks a quantize call; KBIT_SUCCESS with *noop set when n == 0.
inline kbit_status check_quantize(const void *input, int64_t n, size_t elem,
                                  const float *codebook, kbit_absmax_format fmt,
                                  float tensor_scale, const void *absmax, const uint32_t *packed) {
    KBIT_TRY(check_common(n, elem, fmt, tensor_scale));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(input, "input", elem));
    if (codebook) KBIT_TRY(check_ptr(codebook, "codebook", 4));
    KBIT_TRY(check_ptr(absmax, "absmax", absmax_align(fmt)));
    KBIT_TRY(check_ptr(packed, "packed", 4));
    return KBIT_SUCCESS;
}

// kbit_quantize_ex's extra arguments (importance: n floats, range_status: one word).
inline kbit_status check_quantize_ex(int64_t n, const float *importance,
                                     const uint32_t *range_status) {
    if (n == 0) return KBIT_SUCCESS;
    if (importance) KBIT_TRY(check_ptr(importance, "importance", 4));
    if (range_status) KBIT_TRY(check_ptr(range_status, "range_status", 4));
    return KBIT_SUCCESS;
}

inline kbit_status check_dequantize(const uint32_t *packed, const void *absmax,
                                    kbit_absmax_format fmt, float tensor_scale,
                                    const float *codebook, int64_t n, const void *output,
                                    size_t elem) {
    KBIT_TRY(check_common(n, elem, fmt, tensor_scale));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(packed, "packed", 4));
    KBIT_TRY(check_ptr(absmax, "absmax", absmax_align(fmt)));
    if (codebook) KBIT_TRY(check_ptr(codebook, "codebook", 4));
    KBIT_TRY(check_ptr(output, "output", elem));
    return KBIT_SUCCESS;
}

}  // namespace kbit
