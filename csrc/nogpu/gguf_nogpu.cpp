// GGUF GPU entry points for a build without CUDA: same symbols, KBIT_ERROR_NOT_SUPPORTED.
#include "../gguf.h"

#define KBIT_GGUF_NOGPU_ENTRY(FMT, qname, TAG, tname)                                    \
    extern "C" KBIT_API kbit_status cdequantize_##qname##_##tname(                       \
        const void *, int64_t, void *, kbit_stream_t) {                                  \
        return kbit::guarded([] {                                                        \
            return kbit::fail(KBIT_ERROR_NOT_SUPPORTED,                                  \
                              "cdequantize_" #qname "_" #tname                           \
                              ": libkbit was built without CUDA");                       \
        });                                                                              \
    }
#define KBIT_GGUF_NOGPU_ENTRIES_FOR_TYPE(TAG, tname) \
    KBIT_GGUF_FOR_EACH_FORMAT(KBIT_GGUF_NOGPU_ENTRY, TAG, tname)
KBIT_FOR_EACH_TYPE(KBIT_GGUF_NOGPU_ENTRIES_FOR_TYPE)
#undef KBIT_GGUF_NOGPU_ENTRIES_FOR_TYPE
#undef KBIT_GGUF_NOGPU_ENTRY

extern "C" KBIT_API kbit_status kbit_gguf_dequantize(int, const void *, int64_t, kbit_dtype,
                                                     void *, kbit_stream_t) {
    return kbit::guarded([] {
        return kbit::fail(KBIT_ERROR_NOT_SUPPORTED,
                          "kbit_gguf_dequantize: libkbit was built without CUDA");
    });
}
