// CPU-only build: the kbit family's GPU entry points exist and report that the library
// was built without CUDA (the _host functions do the work on this build).
#include "../kbit_api.h"

namespace {
kbit_status no_gpu(const char *what) {
    return kbit::fail(KBIT_ERROR_NOT_SUPPORTED, "%s: libkbit was built without CUDA", what);
}
}  // namespace

extern "C" {

#define KBIT_NOGPU_ENTRIES(TAG, NAME, K)                                                     \
    KBIT_API kbit_status cquantize_kbit_##NAME##_k##K(const void *, int64_t, const float *,  \
                                                      kbit_absmax_format, float, void *,     \
                                                      uint32_t *, kbit_stream_t) {           \
        return no_gpu("cquantize_kbit_" #NAME "_k" #K);                                     \
    }                                                                                        \
    KBIT_API kbit_status cdequantize_kbit_##NAME##_k##K(const uint32_t *, const void *,      \
                                                        kbit_absmax_format, float,           \
                                                        const float *, int64_t, void *,      \
                                                        kbit_stream_t) {                     \
        return no_gpu("cdequantize_kbit_" #NAME "_k" #K);                                   \
    }
KBIT_FOR_EACH_KBIT_INSTANCE(KBIT_NOGPU_ENTRIES)
#undef KBIT_NOGPU_ENTRIES

KBIT_API kbit_status kbit_quantize(const void *, int64_t, kbit_dtype, int, const float *,
                                   kbit_absmax_format, float, void *, uint32_t *, kbit_stream_t) {
    return no_gpu("kbit_quantize");
}

KBIT_API kbit_status kbit_dequantize(const uint32_t *, const void *, kbit_absmax_format, float,
                                     const float *, int, int64_t, kbit_dtype, void *,
                                     kbit_stream_t) {
    return no_gpu("kbit_dequantize");
}

KBIT_API kbit_status kbit_get_range_flag(int *, int) { return no_gpu("kbit_get_range_flag"); }

KBIT_API kbit_status kbit_compute_tensor_scale(const void *, int64_t, kbit_dtype,
                                               kbit_absmax_format, float *, kbit_stream_t) {
    return no_gpu("kbit_compute_tensor_scale");
}

KBIT_API int kbit_cuda_available(void) { return 0; }

}  // extern "C"
