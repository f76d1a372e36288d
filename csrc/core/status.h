// The runtime every entry shares, host and device builds alike: the per-thread error
// message, the guard that keeps exceptions inside the library, and argument checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>

#include "kbit.h"

namespace kbit {

// ---- per-thread error message -------------------------------------------------------

// Records `status` with a printf-style message for kbit_last_error_message().
kbit_status fail(kbit_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// Clears the message; every exported entry calls it first (via guarded()).
void clear_error();

// Runs an exported entry's body: nothing thrown ever crosses the C boundary.
template <class F>
kbit_status guarded(F &&body) noexcept {
    try {
        clear_error();
        return body();
    } catch (const std::bad_alloc &) {
        return fail(KBIT_ERROR_INTERNAL, "out of host memory");
    } catch (const std::exception &e) {
        return fail(KBIT_ERROR_INTERNAL, "unexpected exception: %s", e.what());
    } catch (...) {
        return fail(KBIT_ERROR_INTERNAL, "unexpected exception");
    }
}

// ---- argument checks (each returns KBIT_SUCCESS or records the failure) ------------

// n elements of `elem` bytes (the largest per-element array of the call): n >= 0, and
// n * elem fits in the address space, so no size or index derived from n overflows.
inline kbit_status check_n(int64_t n, size_t elem) {
    if (n < 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "n must be >= 0, got %lld",
                    static_cast<long long>(n));
    if (static_cast<uint64_t>(n) > static_cast<uint64_t>(PTRDIFF_MAX) / elem)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "n = %lld elements of %zu bytes exceed the address space",
                    static_cast<long long>(n), elem);
    return KBIT_SUCCESS;
}

// ceil(n / per) for n >= 0 (blocks of a tensor), without overflow for any n.
inline int64_t blocks_of(int64_t n, int64_t per) { return n / per + (n % per != 0); }

// Whether p is a multiple of `align` bytes (host and launcher code).
inline bool aligned(const void *p, size_t align) {
    return reinterpret_cast<uintptr_t>(p) % align == 0;
}

inline kbit_status check_ptr(const void *p, const char *name, size_t align) {
    if (p == nullptr) return fail(KBIT_ERROR_NULL_POINTER, "%s is NULL", name);
    if (!aligned(p, align))
        return fail(KBIT_ERROR_MISALIGNED, "%s is not aligned to %zu bytes", name, align);
    return KBIT_SUCCESS;
}

// The scale formats of the exact conversions into kbit (kbit_nf4_to_kbit,
// kbit_gguf_to_kbit): float32 or half, never E4M4 (which rounds).
inline kbit_status check_exact_scales(kbit_absmax_format fmt) {
    if (fmt != KBIT_ABSMAX_FP32 && fmt != KBIT_ABSMAX_FP16)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "absmax_format must be KBIT_ABSMAX_FP32 or KBIT_ABSMAX_FP16, got %d",
                    static_cast<int>(fmt));
    return KBIT_SUCCESS;
}

inline size_t dtype_size(kbit_dtype t) { return t == KBIT_DTYPE_FP32 ? 4 : 2; }

inline bool valid_dtype(int t) { return t >= KBIT_DTYPE_FP32 && t <= KBIT_DTYPE_BF16; }

// Stops at the first failing check: KBIT_TRY(check_ptr(...));
#define KBIT_TRY(expr)                                  \
    do {                                                \
        kbit_status kbit_try_status_ = (expr);          \
        if (kbit_try_status_ != KBIT_SUCCESS) return kbit_try_status_; \
    } while (0)

}  // namespace kbit
