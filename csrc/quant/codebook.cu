// Codebook fitting on the GPU (formats/codebook_fit.h): one pass builds the integer
// histogram of the block-normalised values (a warp per 32-element block, shared-memory
// bins, 64-bit global bins in the caller's workspace), then one CTA runs the Lloyd-Max
// steps with the bins split over its threads, writes the book and clears the workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// The workspace: kBins 64-bit bins, then one word set when a block holds NaN or Inf.
struct FitWorkspace {
    unsigned long long hist[fit::kBins];
    unsigned bad;
};
static_assert(sizeof(FitWorkspace) <= fit::kWorkspaceBytes, "fit workspace size");

template <class T>
__global__ void __launch_bounds__(kThreads)
histogram_kernel(const typename T::storage *__restrict__ x, int64_t n, FitWorkspace *ws) {
    __shared__ unsigned bins[fit::kBins];
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
        atomicAdd(&bins[fit::bin_of(v / __uint_as_float(amax))], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < fit::kBins; b += kThreads)
        if (bins[b]) atomicAdd(&ws->hist[b], static_cast<unsigned long long>(bins[b]));
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
    if (threadIdx.x == 0) ws->bad = 0;
}

kbit_status fit_codebook(const void *input, int64_t n, kbit_dtype dtype, int k, float *codebook,
                         void *workspace, size_t workspace_bytes, kbit_stream_t stream) {
    KBIT_TRY(fit::check_fit(input, n, dtype, k, codebook));
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
        with_dtype(dtype, [&](auto tag) {
            histogram_kernel<decltype(tag)><<<grid, kThreads, 0, s>>>(
                static_cast<const typename decltype(tag)::storage *>(input), n, ws);
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
