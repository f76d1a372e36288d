// GGUF (ggml) block dequantization on the CPU: the `_host` twins of csrc/quant/gguf.cu,
// decoding through the same per-group math (csrc/formats/gguf.h), so the bits are
// identical.
#include <algorithm>
#include <cstring>

#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/gguf.h"
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

static kbit_status dequantize_any_host(int ggml_type, const void *blocks, int64_t n,
                                       kbit_dtype dtype, void *output) {
    return with_type(ggml_type, [&](auto fmt) {
        return with_dtype(dtype, [&](auto tag) {
            return dequantize_host<decltype(fmt), decltype(tag)>(blocks, n, output);
        });
    });
}

// The outputs need no alignment (tests/test_abi_fuzz.py passes them at any): written
// byte-wise, not as int64_t stores (undefined behaviour when misaligned).
static kbit_status block_info(int ggml_type, int64_t *block_elems, int64_t *block_bytes) {
    return with_type(ggml_type, [&](auto fmt) {
        using Fmt = decltype(fmt);
        const int64_t elems = Fmt::kElems, bytes = Fmt::kBytes;
        if (block_elems) std::memcpy(block_elems, &elems, sizeof elems);
        if (block_bytes) std::memcpy(block_bytes, &bytes, sizeof bytes);
        return KBIT_SUCCESS;
    });
}

static kbit_status to_kbit_host(int ggml_type, const void *blocks, int64_t n,
                                kbit_absmax_format absmax_format, uint32_t *kbit_packed,
                                void *kbit_absmax) {
    KBIT_TRY(check_to_kbit(ggml_type, blocks, n, absmax_format, kbit_packed, kbit_absmax));
    const auto *in = static_cast<const uint8_t *>(blocks);
    parallel_for(n / Q4_0::kElems, int64_t{1} << 16, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b)
            q4_0_block_to_kbit(in, b, absmax_format, kbit_packed, kbit_absmax);
    });
    return KBIT_SUCCESS;
}

}  // namespace gguf
}  // namespace kbit

KBIT_GGUF_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)
