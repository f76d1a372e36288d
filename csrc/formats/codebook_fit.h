// Fitting a kbit codebook to a tensor (issue 13), shared by the CPU (csrc/host/codebook.cpp)
// and the GPU (csrc/quant/codebook.cu): the same integer histogram and the same Lloyd-Max
// steps give the same book on both.
//
// With importance weights (e.g. mean squared activations) the histogram counts each value
// by its weight, so the error minimised is weighted.
//
// The scale rule fitted to: each 32-element block over its largest |value| (the absmax
// rule every absmax format starts from), so every value lies in [-1, 1] and each nonzero
// block has one value at exactly +-1. The book keeps -1 and +1 as its ends and moves its
// 2^k - 2 inner entries to the centroids of their cells (Lloyd-Max: cells split halfway
// between neighbours), over a histogram of kBins bins whose counts and sums are integers:
// any order of adding them gives the same numbers, so the result does not depend on
// threads or atomics.
#pragma once

#include <cmath>
#include <cstdint>

#include "kbit.h"

namespace kbit {
namespace fit {

constexpr int kBins = 4096;
constexpr int kIterations = 40;
constexpr int64_t kWorkspaceBytes = kBins * 8 + 16;  // the GPU fit's: 64-bit bins, a flag

// Importance weights (optional, one float >= 0 an element) count as integers: w over the
// largest weight in units of 1/kWeightOne, rounded (the same integers on host and GPU:
// an IEEE division, then exact steps). Without weights every element counts kWeightOne.
constexpr uint32_t kWeightOne = 4096;
KBIT_HD uint32_t weight_units(float w, float w_max) {
    return static_cast<uint32_t>(floorf(w / w_max * static_cast<float>(kWeightOne) + 0.5f));
}

// The bin of a normalised value v in [-1, 1].
KBIT_HD int bin_of(float v) {
    const int b = static_cast<int>(floorf((v + 1.0f) * (kBins / 2)));
    return b < 0 ? 0 : (b >= kBins ? kBins - 1 : b);
}
// A bin's centre is (2b + 1) / kBins - 1: sums of (2b + 1) are integers.
KBIT_HD double centre_of(double twice_plus_one) { return twice_plus_one / kBins - 1.0; }

// The cell of bin b for a book of m ascending entries: how many of the m - 1 boundaries
// (halfway between neighbours) lie below the bin's centre.
KBIT_HD int cell_of(int b, const double *book, int m) {
    const double c = centre_of(2.0 * b + 1.0);
    int cell = 0;
    while (cell + 1 < m && c > 0.5 * (book[cell] + book[cell + 1])) ++cell;
    return cell;
}

// One Lloyd step's update from the cells' integer sums (count, sum of 2b + 1): inner
// entries move to their cells' centroids, ends and empty cells stay. Returns whether an
// entry moved.
KBIT_HD bool update(const uint64_t *count, const uint64_t *sum, int m, double *book) {
    bool moved = false;
    for (int j = 1; j + 1 < m; ++j) {
        if (count[j] == 0) continue;
        const double v = centre_of(static_cast<double>(sum[j]) / static_cast<double>(count[j]));
        moved |= v != book[j];
        book[j] = v;
    }
    return moved;
}

// Lloyd-Max on histogram `hist` for a book of m entries: book (ascending, ends -1 and 1)
// is the start and the result. The GPU runs the same steps with the bins split over
// threads; the sums are integers, so both give the same book.
inline void lloyd(const uint64_t *hist, int m, double *book) {
    for (int it = 0; it < kIterations; ++it) {
        uint64_t count[32] = {}, sum[32] = {};
        for (int b = 0; b < kBins; ++b) {
            const int cell = cell_of(b, book, m);
            count[cell] += hist[b];
            sum[cell] += hist[b] * static_cast<uint64_t>(2 * b + 1);
        }
        if (!update(count, sum, m, book)) break;
    }
}

// The argument checks of both fits (nothing is written before they pass).
inline kbit_status check_fit(const void *input, const float *importance, int64_t n,
                             kbit_dtype dtype, int k, const float *codebook) {
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    if (!valid_dtype(dtype)) return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
    if (n <= 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "cannot fit a codebook to %lld elements",
                    static_cast<long long>(n));
    KBIT_TRY(check_ptr(input, "input", dtype_size(dtype)));
    if (importance) KBIT_TRY(check_ptr(importance, "importance", 4));
    return check_ptr(codebook, "codebook", 4);
}

}  // namespace fit
}  // namespace kbit
