// Fitting a kbit codebook to a tensor (issue 13), shared by the CPU (csrc/host/codebook.cpp)
// and, later, the GPU: the same integer histogram and the same Lloyd-Max iterations give
// the same book on both.
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

// The bin of a normalised value v in [-1, 1].
KBIT_HD int bin_of(float v) {
    const int b = static_cast<int>(floorf((v + 1.0f) * (kBins / 2)));
    return b < 0 ? 0 : (b >= kBins ? kBins - 1 : b);
}
// A bin's centre is (2b + 1) / kBins - 1: sums of (2b + 1) are integers.
KBIT_HD double centre_of(double twice_plus_one) { return twice_plus_one / kBins - 1.0; }

// Lloyd-Max on histogram `hist` for a book of m entries: book (ascending, ends -1 and 1)
// is the start and the result. Cells: bin b belongs to the entry nearest its centre.
KBIT_HD void lloyd(const uint64_t *hist, int m, double *book) {
    for (int it = 0; it < kIterations; ++it) {
        uint64_t count[32] = {}, sum[32] = {};
        int cell = 0;
        for (int b = 0; b < kBins; ++b) {
            const double c = centre_of(2.0 * b + 1.0);
            while (cell + 1 < m && c > 0.5 * (book[cell] + book[cell + 1])) ++cell;
            count[cell] += hist[b];
            sum[cell] += hist[b] * static_cast<uint64_t>(2 * b + 1);
        }
        bool moved = false;
        for (int j = 1; j + 1 < m; ++j) {
            if (count[j] == 0) continue;  // an empty cell keeps its entry
            const double v = centre_of(static_cast<double>(sum[j]) / static_cast<double>(count[j]));
            moved |= v != book[j];
            book[j] = v;
        }
        if (!moved) break;
    }
}

}  // namespace fit
}  // namespace kbit
