// CPU-only build: the NF4 / FP4 GPU entry points exist and report that the library was
// built without CUDA (the _host functions of csrc/host/nf4_host.cpp do the work).
#include "../nf4.h"

namespace {
kbit_status no_gpu(const char *what) {
    return kbit::fail(KBIT_ERROR_NOT_SUPPORTED, "%s: libkbit was built without CUDA", what);
}
}  // namespace

extern "C" {

#define KBIT_NF4_INSTANCE(FMT, FNAME, TAG, TNAME)                                              \
    KBIT_API kbit_status cquantize_##FNAME##_##TNAME(const void *, int64_t, int, float *,      \
                                                     uint8_t *, kbit_stream_t) {               \
        return no_gpu("cquantize_" #FNAME "_" #TNAME);                                        \
    }                                                                                         \
    KBIT_API kbit_status cdequantize_##FNAME##_##TNAME(const uint8_t *, const float *,         \
                                                       int64_t, int, void *, kbit_stream_t) {  \
        return no_gpu("cdequantize_" #FNAME "_" #TNAME);                                      \
    }                                                                                         \
    KBIT_API kbit_status cdequantize_##FNAME##_dq_##TNAME(const uint8_t *, const uint8_t *,    \
                                                          const float *, const float *,       \
                                                          const float *, int64_t, int, void *, \
                                                          kbit_stream_t) {                    \
        return no_gpu("cdequantize_" #FNAME "_dq_" #TNAME);                                   \
    }
KBIT_FOR_EACH_NF4_INSTANCE
#undef KBIT_NF4_INSTANCE

KBIT_API kbit_status kbit_nf4_absmax_mean(const float *, int64_t, float *, kbit_stream_t) {
    return no_gpu("kbit_nf4_absmax_mean");
}

KBIT_API kbit_status kbit_nf4_quantize_absmax(const float *, int64_t, const float *,
                                              const float *, uint8_t *, float *, kbit_stream_t) {
    return no_gpu("kbit_nf4_quantize_absmax");
}

KBIT_API kbit_status kbit_nf4_dequantize_absmax(const uint8_t *, const float *, const float *,
                                                const float *, int64_t, float *, kbit_stream_t) {
    return no_gpu("kbit_nf4_dequantize_absmax");
}

}  // extern "C"
