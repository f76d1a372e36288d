// GGUF (ggml) block dequantization on the CPU: the `_host` twins of csrc/gguf.cu,
// decoding through the same per-group math (csrc/gguf.h), so the bits are identical.
#include <algorithm>

#include "../gguf.h"
#include "parallel.h"

namespace kbit {
namespace gguf {

// Dequantizes blocks [b0, b1).
template <class Fmt, class T>
static void dequantize_range(const uint8_t *blocks, int64_t b0, int64_t b1,
                             typename T::storage *out) {
    float y[Fmt::kElems];
    for (int64_t b = b0; b < b1; ++b) {
        dequantize_block_host<Fmt>(blocks + b * Fmt::kBytes, y);
        for (int i = 0; i < Fmt::kElems; ++i) out[b * Fmt::kElems + i] = store_cast(T{}, y[i]);
    }
}

template <class Fmt, class T>
static kbit_status dequantize_host(const void *blocks, int64_t n, void *output) {
    KBIT_TRY((check_args<Fmt, T>(blocks, n, output)));
    if (n == 0) return KBIT_SUCCESS;
    const auto *in = static_cast<const uint8_t *>(blocks);
    auto *out = static_cast<typename T::storage *>(output);
    const int64_t n_blocks = n / Fmt::kElems;
    // Large tensors (whole-model loads on the CPU) are split over the cores.
    const int64_t blocks_per_thread = std::max<int64_t>(1, (int64_t{1} << 21) / Fmt::kElems);
    parallel_for(n_blocks, blocks_per_thread, [&](int64_t b0, int64_t b1) {
        dequantize_range<Fmt, T>(in, b0, b1, out);
    });
    return KBIT_SUCCESS;
}

}  // namespace gguf
}  // namespace kbit

#define KBIT_GGUF_HOST_ENTRY(FMT, qname, TAG, tname)                                     \
    extern "C" KBIT_API kbit_status cdequantize_##qname##_##tname##_host(                \
        const void *blocks, int64_t n, void *output) {                                   \
        return kbit::guarded(                                                            \
            [&] { return kbit::gguf::dequantize_host<FMT, TAG>(blocks, n, output); });    \
    }
#define KBIT_GGUF_HOST_ENTRIES_FOR_TYPE(TAG, tname) \
    KBIT_GGUF_FOR_EACH_FORMAT(KBIT_GGUF_HOST_ENTRY, TAG, tname)
KBIT_FOR_EACH_TYPE(KBIT_GGUF_HOST_ENTRIES_FOR_TYPE)
#undef KBIT_GGUF_HOST_ENTRIES_FOR_TYPE
#undef KBIT_GGUF_HOST_ENTRY

extern "C" KBIT_API kbit_status kbit_gguf_dequantize_host(int ggml_type, const void *blocks,
                                                          int64_t n, kbit_dtype dtype,
                                                          void *output) {
    return kbit::guarded([&] {
        return kbit::gguf::dispatch(ggml_type, dtype, [&](auto fmt, auto tag) {
            return kbit::gguf::dequantize_host<decltype(fmt), decltype(tag)>(blocks, n, output);
        });
    });
}

extern "C" KBIT_API kbit_status kbit_gguf_block_info(int ggml_type, int64_t *block_elems,
                                                     int64_t *block_bytes) {
    return kbit::guarded([&] {
        // Any output type: only the format's geometry is used.
        return kbit::gguf::dispatch(ggml_type, KBIT_DTYPE_FP32, [&](auto fmt, auto) {
            using Fmt = decltype(fmt);
            if (block_elems) *block_elems = Fmt::kElems;
            if (block_bytes) *block_bytes = Fmt::kBytes;
            return KBIT_SUCCESS;
        });
    });
}
