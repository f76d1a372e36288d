// Run-time switches from the ABI's enums to template instances: one definition each,
// used by every family's generic entries on the GPU and the CPU.
#pragma once

#include <type_traits>

#include "numeric.h"
#include "status.h"

namespace kbit {

template <int K>
using KConst = std::integral_constant<int, K>;
template <kbit_absmax_format F>
using FormatConst = std::integral_constant<kbit_absmax_format, F>;

// Calls f(F32{} / F16{} / BF16{}) for dtype; an unknown dtype is
// KBIT_ERROR_INVALID_ARGUMENT (f must return kbit_status).
template <class Fn>
kbit_status with_dtype(int dtype, Fn &&f) {
    switch (dtype) {
#define KBIT_DTYPE_CASE_(TAG, tname) \
    case TAG::dtype: return f(TAG{});
        KBIT_FOR_EACH_TYPE(KBIT_DTYPE_CASE_)
#undef KBIT_DTYPE_CASE_
        default: return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
    }
}

// Calls f(KConst<K>{}) for k in 2..5, else KBIT_ERROR_INVALID_ARGUMENT.
template <class Fn>
kbit_status with_k(int k, Fn &&f) {
    switch (k) {
        case 2: return f(KConst<2>{});
        case 3: return f(KConst<3>{});
        case 4: return f(KConst<4>{});
        case 5: return f(KConst<5>{});
        default: return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    }
}

// Calls f(FormatConst<F>{}) for an absmax format validated beforehand, so that one call
// site instantiates all three.
template <class Fn>
auto with_format(kbit_absmax_format fmt, Fn &&f) {
    switch (fmt) {
        case KBIT_ABSMAX_FP32: return f(FormatConst<KBIT_ABSMAX_FP32>{});
        case KBIT_ABSMAX_FP16: return f(FormatConst<KBIT_ABSMAX_FP16>{});
        default: return f(FormatConst<KBIT_ABSMAX_E4M4>{});
    }
}

}  // namespace kbit
