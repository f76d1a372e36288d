// The kbit family's argument checks and instance list, shared by the GPU entry points
// (csrc/kbit.cu), the CPU ones (csrc/host/kbit_host.cpp) and the CPU-only stubs.
#pragma once

#include <cmath>
#include <type_traits>

#include "common.h"

// (type tag, C type name, K) for every exported kbit instance.
#define KBIT_FOR_EACH_K(X, TAG, NAME) X(TAG, NAME, 2) X(TAG, NAME, 3) X(TAG, NAME, 4) X(TAG, NAME, 5)
#define KBIT_FOR_EACH_KBIT_INSTANCE(X)      \
    KBIT_FOR_EACH_K(X, kbit::F16, fp16)     \
    KBIT_FOR_EACH_K(X, kbit::BF16, bf16)    \
    KBIT_FOR_EACH_K(X, kbit::F32, fp32)

namespace kbit {

// Calls f(std::integral_constant<kbit_absmax_format, F>{}) for the run-time format
// (validated beforehand), so one call site instantiates all three.
template <class Fn>
auto with_format(kbit_absmax_format fmt, Fn &&f) {
    switch (fmt) {
        case KBIT_ABSMAX_FP32: return f(std::integral_constant<kbit_absmax_format, KBIT_ABSMAX_FP32>{});
        case KBIT_ABSMAX_FP16: return f(std::integral_constant<kbit_absmax_format, KBIT_ABSMAX_FP16>{});
        default: return f(std::integral_constant<kbit_absmax_format, KBIT_ABSMAX_E4M4>{});
    }
}

// Calls f(tag) with the element type tag (F32, F16, BF16) of a validated dtype.
template <class Fn>
auto with_dtype(kbit_dtype dtype, Fn &&f) {
    switch (dtype) {
        case KBIT_DTYPE_FP32: return f(F32{});
        case KBIT_DTYPE_FP16: return f(F16{});
        default: return f(BF16{});
    }
}

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

inline kbit_status check_dtype_k(int dtype, int k) {
    if (!valid_dtype(dtype))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    return KBIT_SUCCESS;
}

}  // namespace kbit
