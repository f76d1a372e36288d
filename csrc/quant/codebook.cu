// Codebook fitting on the GPU (formats/codebook_fit.h): one pass builds the integer
// histogram of the block-normalised values (a warp per 32-element block, shared-memory
// bins, 64-bit global bins in the caller's workspace), then one CTA runs the Lloyd-Max
// steps with the bins split over its threads, writes the book and clears the workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/codebook_fit.h"
#include "../formats/kbit_codebooks.h"

namespace kbit {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;
static_assert(fit::kBins % kThreads == 0, "the Lloyd kernel gives each thread whole runs");

// The workspace: kBins 64-bit bins, a word set when a block holds NaN or Inf (or a weight
// is negative or not finite), and the largest weight's bits.
struct FitWorkspace {
    unsigned long long hist[fit::kBins];
    unsigned bad;
    unsigned w_max;
};

// The largest importance weight (the bits of non-negative floats order as the floats).
__global__ void __launch_bounds__(kThreads)
weight_max_kernel(const float *__restrict__ w, int64_t n, FitWorkspace *ws) {
    unsigned mine = 0;
    bool bad = false;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * kThreads) {
        const float v = w[i];
        bad |= !(v >= 0.0f) || !isfinite(v);
        mine = max(mine, __float_as_uint(v));
    }
    mine = __reduce_max_sync(kFull, bad ? 0u : mine);
    if (__any_sync(kFull, bad) && (threadIdx.x & 31) == 0) atomicOr(&ws->bad, 1u);
    if ((threadIdx.x & 31) == 0 && mine) atomicMax(&ws->w_max, mine);
}
static_assert(sizeof(FitWorkspace) <= fit::kWorkspaceBytes, "fit workspace size");

// kWeighted: 64-bit shared bins of weight units; else 32-bit counts (faster atomics),
// scaled to units when added to the workspace.
template <class T, bool kWeighted>
__global__ void __launch_bounds__(kThreads)
histogram_kernel(const typename T::storage *__restrict__ x, const float *__restrict__ importance,
                 int64_t n, FitWorkspace *ws) {
    using Bin = std::conditional_t<kWeighted, unsigned long long, unsigned>;
    __shared__ Bin bins[fit::kBins];
    const float w_max = kWeighted ? __uint_as_float(ws->w_max) : 0.0f;
    for (int b = threadIdx.x; b < fit::kBins; b += kThreads) bins[b] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
    for (int64_t b = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
         b < blocks; b += warps) {
        const int64_t i = b * kBlock + lane;
        const float v = i < n ? load_f32(T{}, x[i]) : 0.0f;
        if (__any_sync(kFull, !isfinite(v))) {
            if (lane == 0) atomicOr(&ws->bad, 1u);
            continue;
        }
        const unsigned amax = __reduce_max_sync(kFull, __float_as_uint(fabsf(v)));
        if (amax == 0 || i >= n) continue;
        Bin units = 1;
        if constexpr (kWeighted) units = w_max > 0.0f ? fit::weight_units(importance[i], w_max) : 0u;
        if (units) atomicAdd(&bins[fit::bin_of(v / __uint_as_float(amax))], units);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < fit::kBins; b += kThreads)
        if (bins[b])
            atomicAdd(&ws->hist[b], static_cast<unsigned long long>(bins[b]) *
                                        (kWeighted ? 1u : fit::kWeightOne));
}

// One CTA: Lloyd-Max from the default book; NaN entries for an input with NaN/Inf or no
// nonzero block (the host twin returns an error there). Leaves the workspace zeroed.
__global__ void __launch_bounds__(kThreads) lloyd_kernel(FitWorkspace *ws, int k, float *codebook) {
    __shared__ double book[32];
    __shared__ unsigned long long count[32], sum[32];
    __shared__ unsigned long long total;
    __shared__ bool moved;
    const int m = 1 << k;
    if (threadIdx.x < m) book[threadIdx.x] = g_normal_float.v[k - 2][threadIdx.x];
    if (threadIdx.x == 0) total = 0;
    __syncthreads();
    unsigned long long mine = 0;
    for (int b = threadIdx.x; b < fit::kBins; b += kThreads) mine += ws->hist[b];
    atomicAdd(&total, mine);
    __syncthreads();
    const bool failed = ws->bad != 0 || total == 0;
    for (int it = 0; it < fit::kIterations && !failed; ++it) {
        if (threadIdx.x < 32) count[threadIdx.x] = sum[threadIdx.x] = 0;
        __syncthreads();
        // Each thread sums a run of kPer bins: the cell index only grows along a run, so
        // a thread adds to a few cells once each (the cells are cell_of's, advanced with
        // the same comparison).
        constexpr int kPer = fit::kBins / kThreads;
        const int b0 = threadIdx.x * kPer;
        int cell = fit::cell_of(b0, book, m);
        unsigned long long c = 0, s = 0;
        for (int b = b0; b < b0 + kPer; ++b) {
            const double centre = fit::centre_of(2.0 * b + 1.0);
            while (cell + 1 < m && centre > 0.5 * (book[cell] + book[cell + 1])) {
                if (c) atomicAdd(&count[cell], c), atomicAdd(&sum[cell], s);
                c = s = 0;
                ++cell;
            }
            const unsigned long long h = ws->hist[b];
            c += h;
            s += h * static_cast<unsigned long long>(2 * b + 1);
        }
        if (c) atomicAdd(&count[cell], c), atomicAdd(&sum[cell], s);
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t c[32], s[32];
            for (int j = 0; j < m; ++j) c[j] = count[j], s[j] = sum[j];
            moved = fit::update(c, s, m, book);
        }
        __syncthreads();
        if (!moved) break;
    }
    if (threadIdx.x < m) codebook[threadIdx.x] = failed ? __int_as_float(0x7fc00000) : static_cast<float>(book[threadIdx.x]);
    __syncthreads();
    for (int b = threadIdx.x; b < fit::kBins; b += kThreads) ws->hist[b] = 0;
    if (threadIdx.x == 0) ws->bad = ws->w_max = 0;
}

kbit_status fit_codebook(const void *input, const float *importance, int64_t n, kbit_dtype dtype,
                         int k, float *codebook, void *workspace, size_t workspace_bytes,
                         kbit_stream_t stream) {
    KBIT_TRY(fit::check_fit(input, importance, n, dtype, k, codebook));
    KBIT_TRY(check_ptr(workspace, "workspace", 8));
    if (workspace_bytes < static_cast<size_t>(fit::kWorkspaceBytes))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "workspace_bytes is %zu, the fit needs %lld "
                    "(kbit_fit_codebook_workspace_bytes)", workspace_bytes,
                    static_cast<long long>(fit::kWorkspaceBytes));
    auto *ws = static_cast<FitWorkspace *>(workspace);
    auto s = static_cast<cudaStream_t>(stream);
    cudaGetLastError();
    int grid = 0;  // a warp a block: enough CTAs for 8 resident an SM, never more than needed
    cudaError_t err = grid_for(blocks_of(blocks_of(n, kBlock), kThreads / 32), 8, &grid);
    if (err == cudaSuccess) {
        if (importance) weight_max_kernel<<<grid, kThreads, 0, s>>>(importance, n, ws);
        with_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            const auto *in = static_cast<const typename T::storage *>(input);
            if (importance) histogram_kernel<T, true><<<grid, kThreads, 0, s>>>(in, importance, n, ws);
            else histogram_kernel<T, false><<<grid, kThreads, 0, s>>>(in, nullptr, n, ws);
            return KBIT_SUCCESS;
        });
        lloyd_kernel<<<1, kThreads, 0, s>>>(ws, k, codebook);
        err = launch_error();
    }
    return cuda_status(err, "kbit_fit_codebook launch");
}

}  // namespace
}  // namespace kbit

KBIT_CODEBOOK_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
