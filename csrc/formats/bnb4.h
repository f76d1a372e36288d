// NF4 / FP4, the bitsandbytes-compatible 4-bit formats (SPEC section 2): the tables, the
// per-element arithmetic and decoder shared by every operation on them (csrc/quant/bnb4.cu,
// csrc/matmul/, csrc/host/), and the argument checks.
//
// The bytes are those of bitsandbytes' CUDA quantize_4bit / dequantize_4bit:
//  - absmax[b] = max |x| over block b in float32 (NaN ignored, subnormals count as 0;
//    a partial last block also counts its zero padding, so an all-NaN block stores
//    -FLT_MAX when full and 0 when partial, as bitsandbytes does);
//  - code(x) = the encoding of x * rcp(absmax[b]) through bitsandbytes' fixed decision
//    thresholds (NaN -> code 0), with its fast-math reciprocal and flushing product
//    (bnb_rcp, bnb_mul below);
//  - byte i holds element 2i in its high nibble, element 2i+1 in its low nibble; for
//    odd n the last low nibble encodes 0.0 * rcp(absmax) of the padding element;
//  - out = bnb_mul(table[code], absmax[b]), rounded to the output type (RN-even).
// With "double quantization" (bitsandbytes' compress_statistics) the absmax values are
// stored as 8-bit codes of (absmax - offset) in blocks of 256 with the signed dynamic
// map, a float32 absmax2 per 256-block and one float32 offset; the dequantized absmax
// is bnb_mul(code[q], absmax2) + offset.
//
// Host and GPU agree bit for bit, NaN included: the GPU's arithmetic NaN is 0x7FFFFFFF
// and its f16/bf16 conversions give 0x7FFF, so the host canonicalises its NaNs to those.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "../core/numeric.h"
#include "kbit.h"
#include "../core/status.h"

namespace kbit {
namespace bnb4 {

constexpr int kMinBlock = 32;
constexpr int kMaxBlock = 4096;
constexpr int kDqBlock = 256;  // blocksize of the second-level (absmax) quantization
constexpr int kDynamicEntries = 256;

struct Nf4 {
    static constexpr const char *name = "nf4";
};
struct Fp4 {
    static constexpr const char *name = "fp4";
};

// ---- tables (bitsandbytes' float32 values) ------------------------------------------

// Dequantization value of a 4-bit code.
KBIT_HD float table_value(Nf4, int c) {
    const float t[16] = {-1.0f,
                         -0.6961928009986877f,
                         -0.5250730514526367f,
                         -0.39491748809814453f,
                         -0.28444138169288635f,
                         -0.18477343022823334f,
                         -0.09105003625154495f,
                         0.0f,
                         0.07958029955625534f,
                         0.16093020141124725f,
                         0.24611230194568634f,
                         0.33791524171829224f,
                         0.44070982933044434f,
                         0.5626170039176941f,
                         0.7229568362236023f,
                         1.0f};
    return t[c & 15];
}

// FP4 (sign bit 8, three magnitude bits): magnitudes in code order, i.e. 0, 1/192,
// 8/12, 12/12, 4/12, 6/12, 2/12, 3/12 as bitsandbytes rounds them to float32.
KBIT_HD float table_value(Fp4, int c) {
    const float m[8] = {0.0f,        0.005208333333f, 0.66666667f, 1.0f,
                        0.33333333f, 0.5f,            0.16666667f, 0.25f};
    const float v = m[c & 7];
    return (c & 8) ? -v : v;
}

// Encoding thresholds, ascending. NF4: the 15 decision points between the 16 sorted
// values (code = how many of them x exceeds). FP4: the 7 points between the 8 sorted
// magnitudes (rank = how many of them |x| exceeds). Unused slots are +inf.
KBIT_HD float threshold(Nf4, int i) {
    const float t[16] = {-0.8480964004993439f,   -0.6106329262256622f,  -0.4599952697753906f,
                         -0.33967943489551544f,  -0.23460740596055984f, -0.13791173323988914f,
                         -0.045525018125772476f, 0.03979014977812767f,  0.1202552504837513f,
                         0.2035212516784668f,    0.2920137718319893f,   0.3893125355243683f,
                         0.5016634166240692f,    0.6427869200706482f,   0.8614784181118011f,
                         INFINITY};
    return t[i & 15];
}
KBIT_HD float threshold(Fp4, int i) {
    const float t[8] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                        0.4166667f,  0.583333f,  0.8333333f,  INFINITY};
    return t[i & 7];
}

// ---- per-element arithmetic -----------------------------------------------------------
//
// bitsandbytes builds its kernels with --use_fast_math, so its quantizers flush
// subnormals to zero (abs, max, mul) and take 1.0f / absmax with the hardware's
// approximate reciprocal (rcp.approx.ftz.f32, within 1 ulp of the exact one). kbit
// reproduces that arithmetic on both sides: flushes as the hardware does, and
// bnb_rcp() = the correctly rounded reciprocal moved by the hardware's measured
// deviation (+-1 ulp, on an H100) for every input whose mantissa fits in 10 bits,
// i.e. every absmax of an fp16 or bf16 tensor. For other inputs (fp32 tensors, the
// second-level absmax2) bnb_rcp is the correctly rounded reciprocal, which differs
// from the hardware's on ~13% of mantissas; a code can then differ from bitsandbytes'
// when x / absmax lands within 1 ulp of a decision threshold (~1e-7 per element).

// Mantissas m (10 bits) where rcp.approx.ftz.f32(1.m) is one ulp above (plus) or
// below (minus) the correctly rounded 1 / 1.m: bit m of the 1024-bit maps.
#define KBIT_BNB_RCP_PLUS                                                                   \
    {0x00160800u, 0x00010000u, 0x08000000u, 0x00020306u, 0x02180400u, 0x00000000u,         \
     0x00021800u, 0x10000006u, 0x00000010u, 0x00030500u, 0x04000000u, 0x00080000u,         \
     0x03081804u, 0x00800202u, 0x00080462u, 0x0A040102u, 0x80090380u, 0x00180008u,         \
     0x00000000u, 0x00080000u, 0x08000D80u, 0x30008018u, 0x01100000u, 0x00000000u,         \
     0x002E0000u, 0x008020A0u, 0x00000000u, 0x20005500u, 0x09000000u, 0x00010001u,         \
     0x18000100u, 0x00000020u}
#define KBIT_BNB_RCP_MINUS                                                                  \
    {0x00004040u, 0x40004001u, 0x01C02040u, 0xC0000000u, 0x00000080u, 0x00090001u,         \
     0x28400000u, 0x00000000u, 0x80040000u, 0x00000000u, 0x20000020u, 0x00000000u,         \
     0x80020000u, 0x28000000u, 0x06000000u, 0x00000000u, 0x00000000u, 0x00004000u,         \
     0x00000000u, 0x00000040u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00008000u,         \
     0x00008000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x34400000u,         \
     0x00000020u, 0x01040000u}

// Subnormals become zero of the same sign (the hardware's .ftz).
KBIT_HD float flush(float x) {
    const uint32_t u = f32_bits(x);
    return (u & 0x7F800000u) == 0 ? f32_from_bits(u & 0x80000000u) : x;
}

// bitsandbytes' a * b: mul.rn.ftz.f32.
KBIT_HD float bnb_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return flush(mul_rn(flush(a), flush(b)));
#endif
}

// Start value of a block's absmax fold; fold_abs = max.ftz(acc, abs.ftz(x)), which
// ignores NaN.
constexpr float kFoldStart = -FLT_MAX;
KBIT_HD float fold_abs(float acc, float x) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("{\n\t.reg .f32 t;\n\tabs.ftz.f32 t, %2;\n\tmax.ftz.f32 %0, %1, t;\n\t}"
        : "=f"(r)
        : "f"(acc), "f"(x));
    return r;
#else
    return fmaxf(acc, flush(fabsf(x)));
#endif
}

// bitsandbytes' 1.0f / a (see the top of this section); plus / minus are the maps.
KBIT_HD float bnb_rcp(float a, const uint32_t *plus, const uint32_t *minus) {
    const float f = flush(a);
#if defined(__CUDA_ARCH__)
    const float r = __frcp_rn(f);
#else
    const float r = 1.0f / f;
#endif
    const uint32_t fb = f32_bits(f), rb = f32_bits(r), e = rb & 0x7F800000u;
    if ((fb & 0x1FFFu) == 0 && e != 0 && e != 0x7F800000u) {
        const uint32_t m = (fb >> 13) & 1023u;
        const uint32_t up = (plus[m >> 5] >> (m & 31)) & 1u;
        const uint32_t down = (minus[m >> 5] >> (m & 31)) & 1u;
        return flush(f32_from_bits(rb + up - down));  // one ulp in magnitude
    }
    return flush(r);
}

// Code of v = x / absmax, a branch-free binary search over the threshold table `thr`
// (16 floats; bitsandbytes' decision tree gives the same codes). NaN -> 0.
KBIT_HD int encode(Nf4, const float *thr, float v) {
    int c = v > thr[7] ? 8 : 0;
    c += v > thr[c + 3] ? 4 : 0;
    c += v > thr[c + 1] ? 2 : 0;
    c += v > thr[c] ? 1 : 0;
    return c;
}
KBIT_HD int encode(Fp4, const float *thr, float v) {
    const int sign = v < 0.0f ? 8 : 0;  // -0.0 and NaN count as positive
    const float a = fabsf(v);
    int r = a > thr[3] ? 4 : 0;
    r += a > thr[r + 1] ? 2 : 0;
    r += a > thr[r] ? 1 : 0;
    // magnitude rank 0..7 -> code bits: 0, 1, 6, 7, 4, 5, 2, 3
    return sign | static_cast<int>((0x32547610u >> (4 * r)) & 15u);
}

// bitsandbytes' 8-bit blockwise encoding against a sorted 256-entry code table: a
// 7-step binary search from entry 127, then the nearer of the bracketing entries by
// their float32 midpoint (strictly beyond the midpoint moves away from the pivot).
KBIT_HD int encode_dynamic(const float *code, float v) {
    int pivot = 127, hi_idx = 255, lo_idx = 0;
    float lo = code[0], hi = code[255], val = code[127];
    for (int step = 64; step > 0; step >>= 1) {
        if (v > val) {
            lo_idx = pivot;
            lo = val;
            pivot += step;
        } else {
            hi_idx = pivot;
            hi = val;
            pivot -= step;
        }
        val = code[pivot];
    }
    if (v > val) return v > mul_rn(add_rn(hi, val), 0.5f) ? hi_idx : pivot;
    return v < mul_rn(add_rn(lo, val), 0.5f) ? lo_idx : pivot;
}

// The 4-bit code of element i: the high nibble of byte i/2 for even i, the low for odd.
KBIT_HD int element_code(const uint8_t *packed, int64_t i) {
    const uint32_t byte = packed[i >> 1];
    return static_cast<int>((i & 1) ? (byte & 15u) : (byte >> 4));
}

// The host's decoder (dequantize and the fused matmul): elements [i0, i1) of one block,
// whose scale is a, as out[i - i0] = table[c_i] * a (element i: the high nibble of byte
// i/2 for even i, the low nibble for odd i); the 16 products are taken once a call.
template <class Fmt>
inline void dequantize_elements(const uint8_t *packed, int64_t i0, int64_t i1, float a,
                                float *out) {
    float v[16];
    for (int c = 0; c < 16; ++c) v[c] = bnb_mul(table_value(Fmt{}, c), a);
    for (int64_t i = i0; i < i1; ++i) out[i - i0] = v[element_code(packed, i)];
}

// ---- sizes and argument checks ----------------------------------------------------------

inline bool valid_blocksize(int bs) {
    return bs >= kMinBlock && bs <= kMaxBlock && (bs & (bs - 1)) == 0;
}

inline int log2_of(int bs) {
    int l = 0;
    while ((1 << l) < bs) ++l;
    return l;
}

inline kbit_status check_blocksize(int bs) {
    return valid_blocksize(bs)
               ? KBIT_SUCCESS
               : fail(KBIT_ERROR_INVALID_ARGUMENT,
                      "blocksize must be a power of two in 32..4096, got %d", bs);
}

inline kbit_status check_quantize(const void *input, int64_t n, size_t elem, int bs,
                                  const float *absmax, const uint8_t *packed) {
    KBIT_TRY(check_n(n, elem));
    KBIT_TRY(check_blocksize(bs));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(input, "input", elem));
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_ptr(packed, "packed", 1));
    return KBIT_SUCCESS;
}

inline kbit_status check_dequantize(const uint8_t *packed, const float *absmax, int64_t n,
                                    int bs, const void *output, size_t elem) {
    KBIT_TRY(check_n(n, elem));
    KBIT_TRY(check_blocksize(bs));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(packed, "packed", 1));
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_ptr(output, "output", elem));
    return KBIT_SUCCESS;
}

// kbit_nf4_to_kbit: the 4-bit codes of bitsandbytes' layout (NF4 or FP4 alike) as a kbit
// K = 4 weight (SPEC section 1): 32-element block b's bit planes from its 16 bytes (first
// element of a pair in the high nibble; codes past n are 0) and its scale the absmax of the
// 4-bit block that holds it (blocksizes are multiples of 32), as float32 or rounded to half
// (absmax_format FP32 / FP16), so that with the format's table as the codebook it
// dequantizes to the same float32 values (with FP16, where every absmax is a half value;
// a finite absmax beyond half's range: the host refuses it with KBIT_ERROR_RANGE, the GPU
// writes it as inf and raises the device's range flag, as its quantizers do).
inline kbit_status check_to_kbit(const uint8_t *packed, const float *absmax, int64_t n, int bs,
                                 kbit_absmax_format fmt, const uint32_t *kbit_packed,
                                 const void *kbit_absmax) {
    KBIT_TRY(check_n(n, 2));  // (to 2^62 elements, as the 16-bit entries)
    KBIT_TRY(check_blocksize(bs));
    KBIT_TRY(check_exact_scales(fmt));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(packed, "packed", 1));
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_ptr(kbit_packed, "kbit_packed", 4));
    KBIT_TRY(check_ptr(kbit_absmax, "kbit_absmax", fmt == KBIT_ABSMAX_FP32 ? 4 : 2));
    return KBIT_SUCCESS;
}
// A finite scale that half cannot hold (f32_to_f16_bits would make it inf).
KBIT_HD bool beyond_half(float scale) {
    return std::isfinite(scale) && std::fabs(scale) > 65504.0f;
}
// Block b (32 elements) of the conversion.
KBIT_HD void block_to_kbit(const uint8_t *packed, const float *absmax, int64_t n, int bs,
                           kbit_absmax_format fmt, int64_t b, uint32_t *kbit_packed,
                           void *kbit_absmax) {
    const int64_t e0 = b * 32;
    const int count = n - e0 < 32 ? static_cast<int>(n - e0) : 32;
    uint32_t planes[4] = {0, 0, 0, 0};
    for (int i = 0; i < count; ++i) {
        const uint8_t byte = packed[(e0 + i) >> 1];
        const uint32_t c = (i & 1) ? byte & 15u : byte >> 4;
        set_bitplane_code(planes, 4, i, c);
    }
    for (int j = 0; j < 4; ++j) kbit_packed[b * 4 + j] = planes[j];
    const float scale = absmax[e0 / bs];
    if (fmt == KBIT_ABSMAX_FP32) static_cast<float *>(kbit_absmax)[b] = scale;
    else static_cast<uint16_t *>(kbit_absmax)[b] = f32_to_f16_bits(scale);
}

// Second-level absmax arguments (code may be NULL: the built-in dynamic map).
inline kbit_status check_dq_state(const uint8_t *qabsmax, const float *absmax2,
                                  const float *code, const float *offset) {
    KBIT_TRY(check_ptr(qabsmax, "qabsmax", 1));
    KBIT_TRY(check_ptr(absmax2, "absmax2", 4));
    if (code) KBIT_TRY(check_ptr(code, "code", 4));
    KBIT_TRY(check_ptr(offset, "offset", 4));
    return KBIT_SUCCESS;
}

inline kbit_status check_dequantize_dq(const uint8_t *packed, const uint8_t *qabsmax,
                                       const float *absmax2, const float *code,
                                       const float *offset, int64_t n, int bs,
                                       const void *output, size_t elem) {
    KBIT_TRY(check_n(n, elem));
    KBIT_TRY(check_blocksize(bs));
    if (n == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(packed, "packed", 1));
    KBIT_TRY(check_dq_state(qabsmax, absmax2, code, offset));
    KBIT_TRY(check_ptr(output, "output", elem));
    return KBIT_SUCCESS;
}

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8),
// with torch's float32 arithmetic (checked against torch 2.11 on an AVX-512 CPU): for
// i = 0..6, the 2^i midpoints of linspace(0.1, 1, 2^i + 1) scaled by 10^(i-6), both
// signs, then 0 and 1, sorted. Every float32 operation is written as an exact double
// computation rounded once, so no compiler contraction can change a bit.
inline std::vector<float> build_dynamic_map() {
    const float scales[7] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1e0f};
    std::vector<float> data;
    data.reserve(kDynamicEntries);
    for (int i = 0; i < 7; ++i) {
        const int steps = (1 << i) + 1;
        const float start = 0.1f, end = 1.0f;
        // torch.linspace (float32, as its vectorised CPU build computes it): step =
        // (end - start) / (steps - 1); the first half is fma(step, k, start), the second
        // half fma(-step, steps - 1 - k, end), each rounded once (exact in double here).
        const float step = static_cast<float>(static_cast<double>(end - start) / (steps - 1));
        std::vector<float> b(steps);
        for (int k = 0; k < steps; ++k) {
            const int mult = k < steps / 2 ? k : steps - 1 - k;
            const double p = static_cast<double>(step) * mult;
            b[k] = static_cast<float>(k < steps / 2 ? static_cast<double>(start) + p
                                                    : static_cast<double>(end) - p);
        }
        for (int k = 0; k + 1 < steps; ++k) {
            const float mean = static_cast<float>(static_cast<double>(b[k]) + b[k + 1]) / 2.0f;
            const float v = static_cast<float>(static_cast<double>(scales[i]) * mean);
            data.push_back(v);
            data.push_back(-v);
        }
    }
    data.push_back(0.0f);
    data.push_back(1.0f);
    std::sort(data.begin(), data.end());
    return data;
}

// The built-in signed dynamic map, built once (host code).
inline const float *dynamic_map() {
    static const std::vector<float> map = build_dynamic_map();
    return map.data();
}

}  // namespace bnb4
}  // namespace kbit
