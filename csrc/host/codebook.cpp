// Codebook fitting on the CPU (formats/codebook_fit.h): a threaded integer histogram of the
// block-normalised values, then Lloyd-Max from the default book.
#include <algorithm>
#include <atomic>
#include <vector>

#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/codebook_fit.h"
#include "../formats/kbit_codebooks.h"
#include "parallel.h"

namespace kbit {
namespace {

kbit_status fit_codebook_host(const void *input, const float *importance, int64_t n,
                              kbit_dtype dtype, int k, float *codebook) {
    KBIT_TRY(fit::check_fit(input, importance, n, dtype, k, codebook));
    float w_max = 0.0f;
    if (importance) {
        for (int64_t i = 0; i < n; ++i) {
            if (!(importance[i] >= 0.0f) || !std::isfinite(importance[i]))
                return fail(KBIT_ERROR_INVALID_ARGUMENT,
                            "importance[%lld] = %g: weights must be finite and >= 0",
                            static_cast<long long>(i), static_cast<double>(importance[i]));
            w_max = std::max(w_max, importance[i]);
        }
        if (w_max == 0.0f)
            return fail(KBIT_ERROR_INVALID_ARGUMENT, "cannot fit a codebook: every importance is 0");
    }
    const int64_t blocks = blocks_of(n, kBlock);
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(max_threads(), blocks / 256));
    // one histogram a call of the body (parallel_for makes at most threads + 1)
    std::vector<std::vector<uint64_t>> hists(static_cast<size_t>(threads + 1),
                                             std::vector<uint64_t>(fit::kBins, 0));
    std::atomic<int64_t> non_finite{0};
    std::atomic<int64_t> next_slot{0};
    with_dtype(dtype, [&](auto tag) {
        const auto *in = static_cast<const typename decltype(tag)::storage *>(input);
        parallel_for(blocks, (blocks + threads - 1) / threads, [&](int64_t first, int64_t last) {
            std::vector<uint64_t> &h = hists[static_cast<size_t>(next_slot.fetch_add(1))];
            float v[kBlock];
            for (int64_t b = first; b < last; ++b) {
                const int valid = static_cast<int>(std::min<int64_t>(kBlock, n - b * kBlock));
                float amax = 0.0f;
                for (int i = 0; i < valid; ++i) {
                    v[i] = load_f32(decltype(tag){}, in[b * kBlock + i]);
                    if (!std::isfinite(v[i])) {
                        non_finite.fetch_add(1, std::memory_order_relaxed);
                        return;
                    }
                    amax = std::max(amax, std::fabs(v[i]));
                }
                if (amax == 0.0f) continue;  // an all-zero block says nothing about the book
                for (int i = 0; i < valid; ++i)
                    h[static_cast<size_t>(fit::bin_of(v[i] / amax))] +=
                        importance ? fit::weight_units(importance[b * kBlock + i], w_max)
                                   : fit::kWeightOne;
            }
        });
        return KBIT_SUCCESS;
    });
    if (non_finite.load() != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "cannot fit a codebook: the input has NaN or Inf");
    std::vector<uint64_t> hist(fit::kBins, 0);
    uint64_t total = 0;
    for (const auto &h : hists)
        for (int b = 0; b < fit::kBins; ++b) hist[static_cast<size_t>(b)] += h[static_cast<size_t>(b)];
    for (uint64_t c : hist) total += c;
    if (total == 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "cannot fit a codebook: the input is all zeros (or weighs nothing)");
    const int m = 1 << k;
    double book[32];
    for (int j = 0; j < m; ++j) book[j] = kNormalFloat[k][j];
    fit::lloyd(hist.data(), m, book);
    for (int j = 0; j < m; ++j) codebook[j] = static_cast<float>(book[j]);
    return KBIT_SUCCESS;
}

}  // namespace
}  // namespace kbit

KBIT_CODEBOOK_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)

extern "C" KBIT_API int64_t kbit_fit_codebook_workspace_bytes(void) {
    return kbit::fit::kWorkspaceBytes;
}
