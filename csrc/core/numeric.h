// Float conversions and explicitly rounded arithmetic that give the same bits on the
// CPU and the GPU, and the element-type tags every family is templated on.
#pragma once

#include <cstdint>
#include <cstring>

#include "kbit.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#  define KBIT_HD __host__ __device__ __forceinline__
#else
#  define KBIT_HD inline
#endif

// The first expression in device code, the second on the host (the hardware
// instruction, and the host's bit-exact equivalent).
#if defined(__CUDA_ARCH__)
#  define KBIT_DEVICE_ELSE(device, host) (device)
#else
#  define KBIT_DEVICE_ELSE(device, host) (host)
#endif

namespace kbit {

// ---- float conversions, bit-exact on host and device --------------------------------

KBIT_HD uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
KBIT_HD float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// NaN outputs are the canonical NaN the GPU's conversions and arithmetic produce
// (0x7FFF for half and bfloat16, 0x7FFFFFFF for float), so CPU and GPU bytes agree.

// v, or the canonical float NaN where v is a NaN (whose payload the host keeps and the
// GPU may not).
KBIT_HD float canonical_nan(float v) { return v != v ? f32_from_bits(0x7FFFFFFFu) : v; }

// float32 -> IEEE half bits, round to nearest even; NaN -> 0x7FFF.
KBIT_HD uint16_t f32_to_f16_bits(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return 0x7FFFu;               // NaN
    if (ax >= 0x477FF000u) return sign | 0x7C00u;       // rounds to >= 65520: inf
    if (ax >= 0x38800000u) {                            // normal half
        uint32_t mant = ax + 0xC8000FFFu + ((ax >> 13) & 1u);  // rebias + round
        return static_cast<uint16_t>(sign | (mant >> 13));
    }
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // < half of 2^-24
    // subnormal half: value = m * 2^-24
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;  // 14..24 + ...
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
}

KBIT_HD float f16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));  // exact; the same bits as below (NaN: a NaN)
#else
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) return f32_from_bits(sign | 0x7F800000u | (m << 13));
    if (e != 0) return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
#endif
}

// float32 -> bfloat16 bits, round to nearest even; NaN -> 0x7FFF.
KBIT_HD uint16_t f32_to_bf16_bits(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
    x += 0x7FFFu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

KBIT_HD float bf16_bits_to_f32(uint16_t b) {
    return f32_from_bits(static_cast<uint32_t>(b) << 16);
}

// ---- float operations with explicit rounding (never fused into an FMA), the same
// on host and device ---------------------------------------------------------------

KBIT_HD float mul_rn(float a, float b) {
    return KBIT_DEVICE_ELSE(__fmul_rn(a, b), a * b);
}
KBIT_HD float sub_rn(float a, float b) {
    return KBIT_DEVICE_ELSE(__fsub_rn(a, b), a - b);
}
KBIT_HD float div_rn(float a, float b) {
    return KBIT_DEVICE_ELSE(__fdiv_rn(a, b), a / b);
}
KBIT_HD float add_rn(float a, float b) {
    return KBIT_DEVICE_ELSE(__fadd_rn(a, b), a + b);
}
// Correctly rounded 1/d, capped at FLT_MAX so that x * (1/d) is never NaN for finite x.
KBIT_HD float rcp_rn(float d) {
#if defined(__CUDA_ARCH__)
    float r = __frcp_rn(d);
#else
    float r = 1.0f / d;
#endif
    return r < 3.4028234663852886e38f ? r : 3.4028234663852886e38f;
}

// Element access by dtype tag, for code templated on the storage type.
struct F32 { using storage = float; static constexpr kbit_dtype dtype = KBIT_DTYPE_FP32; };
struct F16 { using storage = uint16_t; static constexpr kbit_dtype dtype = KBIT_DTYPE_FP16; };
struct BF16 { using storage = uint16_t; static constexpr kbit_dtype dtype = KBIT_DTYPE_BF16; };

// Input conversion (exact): the hardware instructions on the GPU, bit operations on the
// CPU.
KBIT_HD float load_f32(F32, float v) { return v; }
KBIT_HD float load_f32(F16, uint16_t v) {
    return KBIT_DEVICE_ELSE(__half2float(__ushort_as_half(v)), f16_bits_to_f32(v));
}
KBIT_HD float load_f32(BF16, uint16_t v) { return bf16_bits_to_f32(v); }
// Output conversion, round to nearest even: the hardware instructions on the GPU, their
// bit-exact equivalents on the CPU (NaN included).
KBIT_HD float store_cast(F32, float v) {
    return KBIT_DEVICE_ELSE(v, v == v ? v : f32_from_bits(0x7FFFFFFFu));
}
KBIT_HD uint16_t store_cast(F16, float v) {
    return KBIT_DEVICE_ELSE(__half_as_ushort(__float2half_rn(v)), f32_to_f16_bits(v));
}
KBIT_HD uint16_t store_cast(BF16, float v) {
    return KBIT_DEVICE_ELSE(__bfloat16_as_ushort(__float2bfloat16_rn(v)), f32_to_bf16_bits(v));
}

// A matmul's output y[i][r] (x row i, W row r; y row-major, n_out a row): the float32
// sum plus bias[r] where there is a bias, rounded once (SPEC 6). Every matmul kernel and
// the host loop store through it.
template <class T>
KBIT_HD void store_y(typename T::storage *y, const typename T::storage *bias, int64_t i,
                     int64_t r, int64_t n_out, float v) {
    if (bias) v += load_f32(T{}, bias[r]);
    y[i * n_out + r] = store_cast(T{}, v);
}

}  // namespace kbit

// (type tag, C name) for every element type: one list feeds every family's
// instances and runtime switches.
#define KBIT_FOR_EACH_TYPE(X) \
    X(kbit::F16, fp16)        \
    X(kbit::BF16, bf16)       \
    X(kbit::F32, fp32)
