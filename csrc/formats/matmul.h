// Argument checks of the fused dequantize + matmul (SPEC section 6), shared by the GPU
// entries (csrc/matmul/) and the CPU twins (csrc/host/matmul.cpp), so that both accept
// and reject exactly the same calls. Each returns KBIT_SUCCESS or records the failure;
// nothing is written before they pass.
#pragma once

#include "../core/dispatch.h"
#include "bnb4.h"
#include "gguf.h"
#include "kbit.h"
#include "kbit_tiled.h"

namespace kbit {
namespace matmul {

// a * b elements of `elem` bytes fit in the address space (a, b >= 0).
inline kbit_status check_product(int64_t a, int64_t b, size_t elem, const char *what) {
    if (a != 0 && static_cast<uint64_t>(b) > static_cast<uint64_t>(PTRDIFF_MAX) / elem /
                                                   static_cast<uint64_t>(a))
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "%s: %lld x %lld elements of %zu bytes exceed the address space", what,
                    static_cast<long long>(a), static_cast<long long>(b), elem);
    return KBIT_SUCCESS;
}

// What every format shares: dtype, shapes and their sizes. W is stored in blocks of
// `block` elements, `block_bytes` bytes in its largest array.
inline kbit_status check_shapes(kbit_dtype dtype, int64_t m, int64_t k_in, int64_t n_out,
                         int64_t block, int64_t block_bytes) {
    if (!valid_dtype(dtype))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype));
    if (m < 0 || k_in < 0 || n_out < 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "m, k_in and n_out must be >= 0, got %lld, %lld, %lld",
                    static_cast<long long>(m), static_cast<long long>(k_in),
                    static_cast<long long>(n_out));
    if (k_in % block != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "k_in = %lld is not a multiple of the format's block of %lld elements "
                    "(each row of W must hold whole blocks)",
                    static_cast<long long>(k_in), static_cast<long long>(block));
    const size_t elem = dtype_size(dtype);
    KBIT_TRY(check_product(m, k_in, elem, "x"));
    KBIT_TRY(check_product(m, n_out, elem, "y"));
    KBIT_TRY(check_product(n_out, k_in, 1, "W"));
    KBIT_TRY(check_product(n_out, k_in / block, static_cast<size_t>(block_bytes), "W's blocks"));
    return KBIT_SUCCESS;
}

// x, bias and y, which are read or written only when y has elements.
inline kbit_status check_operands(const void *x, const void *bias, const void *y, kbit_dtype dtype,
                           int64_t m, int64_t k_in, int64_t n_out) {
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    const size_t elem = dtype_size(dtype);
    if (k_in > 0) KBIT_TRY(check_ptr(x, "x", elem));
    if (bias) KBIT_TRY(check_ptr(bias, "bias", elem));
    KBIT_TRY(check_ptr(y, "y", elem));
    return KBIT_SUCCESS;
}

// kbit in either layout: k, absmax format, tensor_scale, shapes, then the pointers; the
// codes and scales aligned to `align` (0: the stored layout's element sizes; the tiled
// layout takes 16) and, tiled, the padded sizes within the address space.
inline kbit_status check_matmul_kbit_weight(const void *x, int64_t m, int64_t k_in,
                                            int64_t n_out, kbit_dtype dtype, const void *packed,
                                            const void *absmax, kbit_absmax_format fmt,
                                            float tensor_scale, const float *codebook, int k,
                                            const void *bias, const void *y, size_t align) {
    if (!valid_dtype(dtype))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype));
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    KBIT_TRY(check_common(0, 1, fmt, tensor_scale));  // absmax format and tensor_scale
    KBIT_TRY(check_shapes(dtype, m, k_in, n_out, kBlock, 4 * k));
    if (align && (tiled::packed_bytes(n_out, k_in, k) < 0 || tiled::absmax_bytes(n_out, k_in, fmt) < 0))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "the tiled weight exceeds the address space");
    if (n_out > 0 && k_in > 0) {
        KBIT_TRY(check_ptr(packed, align ? "tiled_packed" : "packed", align ? align : 4));
        KBIT_TRY(check_ptr(absmax, align ? "tiled_absmax" : "absmax", align ? align : absmax_align(fmt)));
        if (codebook) KBIT_TRY(check_ptr(codebook, "codebook", 4));
    }
    return check_operands(x, bias, y, dtype, m, k_in, n_out);
}

inline kbit_status check_matmul_kbit(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint32_t *packed,
                                     const void *absmax, kbit_absmax_format fmt,
                                     float tensor_scale, const float *codebook, int k,
                                     const void *bias, const void *y) {
    return check_matmul_kbit_weight(x, m, k_in, n_out, dtype, packed, absmax, fmt, tensor_scale,
                                    codebook, k, bias, y, 0);
}

// Tiled kbit (formats/kbit_tiled.h): the tiled arrays 16-byte aligned.
inline kbit_status check_matmul_kbit_tiled(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                           kbit_dtype dtype, const void *tiled_packed,
                                           const void *tiled_absmax, kbit_absmax_format fmt,
                                           float tensor_scale, const float *codebook, int k,
                                           const void *bias, const void *y) {
    return check_matmul_kbit_weight(x, m, k_in, n_out, dtype, tiled_packed, tiled_absmax, fmt,
                                    tensor_scale, codebook, k, bias, y, 16);
}

// NF4 / FP4: blocksize, shapes, then the pointers.
inline kbit_status check_matmul_bnb4(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint8_t *packed,
                                     const float *absmax, int blocksize, const void *bias,
                                     const void *y) {
    KBIT_TRY(bnb4::check_blocksize(blocksize));
    KBIT_TRY(check_shapes(dtype, m, k_in, n_out, blocksize, blocksize / 2));
    if (n_out > 0 && k_in > 0) {
        KBIT_TRY(check_ptr(packed, "packed", 1));
        KBIT_TRY(check_ptr(absmax, "absmax", 4));
    }
    return check_operands(x, bias, y, dtype, m, k_in, n_out);
}

// GGUF: the ggml type, then the dtype, shapes and pointers; on success returns
// f(Fmt{}) for the type's format.
template <class F>
inline kbit_status check_matmul_gguf(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, int ggml_type, const void *blocks,
                                     const void *bias, const void *y, F &&f) {
    return gguf::with_type(ggml_type, [&](auto fmt) {
        using Fmt = decltype(fmt);
        KBIT_TRY(check_shapes(dtype, m, k_in, n_out, Fmt::kElems, Fmt::kBytes));
        if (n_out > 0 && k_in > 0) KBIT_TRY(check_ptr(blocks, "blocks", 2));
        KBIT_TRY(check_operands(x, bias, y, dtype, m, k_in, n_out));
        return f(fmt);
    });
}

}  // namespace matmul
}  // namespace kbit
