// GGUF (ggml) block dequantization on the GPU: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K to
// fp16 / bf16 / fp32. The quantized bytes arrive as stored in the file.
//
// One thread decodes one group of consecutive outputs (8 for fp16/bf16, 4 for fp32)
// and writes it with one 16-byte store, so each warp store is 512 contiguous bytes and
// a k-quant warp stays inside one 256-element block (its header is a broadcast load).
// Elements are decoded four per 32-bit word (formats/gguf.h). Blocks are read with the widest
// loads their alignment allows: 144- and 176-byte blocks are 16-byte aligned when the
// buffer is (GGUF data is 32-byte aligned); 210-byte blocks are tested per block;
// 18- and 34-byte blocks use 2-byte loads.
//
// Each thread issues all of its loads before it uses any loaded value (formats/gguf.h orders
// the decoders so): the loads of a 210-byte block branch on its alignment, and header
// math placed before those branches made each thread wait for two memory latencies in
// a row. That held Q6_K to fp16/bf16 at 89% (fewer loads, 4-element groups and
// shared-memory staging had not helped); Q6_K to fp32, whose 4-byte loads need no
// branch, was at 98%.
//
// Measured on an H100 (2^28 elements, against a device-to-device copy of the same
// bytes, bench/RESULTS.md): 95.5-98% for every type and output.
#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/gguf.h"

namespace kbit {
namespace gguf {

static constexpr int kThreads = 256;
// Enough blocks to cover tensors of up to about 2^30 elements in one pass: each thread
// does one load-decode-store, and the hardware keeps every SM full with fresh blocks.
// (Few long-lived blocks that loop reach only 75-90% of copy bandwidth here: each
// warp waits on its loads before it can store.) Larger tensors grid-stride.
static constexpr int kBlocksPerSm = 4096;

// Outputs per thread: one 16-byte store.
template <class Fmt, class T>
constexpr int group_elems() { return 16 / static_cast<int>(sizeof(typename T::storage)); }

// Writes one group of G: one vector store when out is 16-byte aligned (Vec), else
// element by element. Same bits as store_cast.
template <class T, bool Vec, int G>
__device__ __forceinline__ void store_group(typename T::storage *out, const float (&y)[G]) {
    if constexpr (!Vec) {
#pragma unroll
        for (int i = 0; i < G; ++i) out[i] = store_cast(T{}, y[i]);
    } else if constexpr (sizeof(typename T::storage) == 4) {
        static_assert(G == 4, "fp32 groups are 4 elements");
        *reinterpret_cast<float4 *>(out) = make_float4(y[0], y[1], y[2], y[3]);
    } else if constexpr (G == 4) {
        *reinterpret_cast<uint2 *>(out) = make_uint2(pack2(T{}, y[0], y[1]), pack2(T{}, y[2], y[3]));
    } else {
        static_assert(G == 8, "16-bit groups are 4 or 8 elements");
        *reinterpret_cast<uint4 *>(out) =
            make_uint4(pack2(T{}, y[0], y[1]), pack2(T{}, y[2], y[3]),
                       pack2(T{}, y[4], y[5]), pack2(T{}, y[6], y[7]));
    }
}

// Thread g writes outputs [G*g, G*g + G): a warp stores one contiguous run, and a
// warp's groups lie in one k-quant block (its header is a broadcast load).
template <class Fmt, class T, int InAlign, bool VecOut>
static __global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t *__restrict__ blocks, int64_t n_groups,
                      typename T::storage *__restrict__ out) {
    constexpr int G = group_elems<Fmt, T>();
    constexpr int kGroups = Fmt::kElems / G;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         g < n_groups; g += stride) {
        const int64_t b = g / kGroups;
        float y[G];
        Fmt::template group<G>(DeviceLoader<InAlign>{blocks + b * Fmt::kBytes},
                               static_cast<int>(g % kGroups) * G, y);
        store_group<T, VecOut, G>(out + g * G, y);
    }
}

template <class Fmt, class T, int InAlign>
static cudaError_t launch_aligned(const uint8_t *blocks, int64_t n_groups, void *output,
                                  int grid, cudaStream_t stream) {
    auto *out = static_cast<typename T::storage *>(output);
    if (reinterpret_cast<uintptr_t>(output) % 16 == 0)
        dequantize_kernel<Fmt, T, InAlign, true>
            <<<grid, kThreads, 0, stream>>>(blocks, n_groups, out);
    else
        dequantize_kernel<Fmt, T, InAlign, false>
            <<<grid, kThreads, 0, stream>>>(blocks, n_groups, out);
    return launch_error();
}

// Launches the dequantization of n (> 0, a multiple of the block) elements.
template <class Fmt, class T>
static cudaError_t launch_dequantize(const void *blocks, int64_t n, void *output,
                                     cudaStream_t stream) {
    const int64_t n_groups = n / group_elems<Fmt, T>();
    int grid = 0;
    cudaError_t err = grid_for((n_groups + kThreads - 1) / kThreads, kBlocksPerSm, &grid);
    if (err != cudaSuccess) return err;
    const auto *in = static_cast<const uint8_t *>(blocks);
    if constexpr (Fmt::kElems == kQK_K) {
        // k-quants: 144- and 176-byte blocks keep a 16-byte aligned buffer's alignment;
        // otherwise (210-byte blocks, other buffers) test addresses at run time.
        if constexpr (Fmt::kBytes % 16 == 0) {
            if (reinterpret_cast<uintptr_t>(in) % 16 == 0)
                return launch_aligned<Fmt, T, 16>(in, n_groups, output, grid, stream);
        }
        return launch_aligned<Fmt, T, 0>(in, n_groups, output, grid, stream);
    } else {
        // 18- and 34-byte blocks: a warp spans blocks of every alignment; 2-byte loads.
        return launch_aligned<Fmt, T, 2>(in, n_groups, output, grid, stream);
    }
}

template <class Fmt, class T>
static kbit_status dequantize(const void *blocks, int64_t n, void *output, kbit_stream_t stream) {
    KBIT_TRY((check_args<Fmt, T>(blocks, n, output)));
    if (n == 0) return KBIT_SUCCESS;
    return cuda_status(launch_dequantize<Fmt, T>(blocks, n, output, stream),
                       "GGUF dequantize launch");
}

static kbit_status dequantize_any(int ggml_type, const void *blocks, int64_t n, kbit_dtype dtype,
                                  void *output, kbit_stream_t stream) {
    return with_type(ggml_type, [&](auto fmt) {
        return with_dtype(dtype, [&](auto tag) {
            return dequantize<decltype(fmt), decltype(tag)>(blocks, n, output, stream);
        });
    });
}

// kbit_gguf_to_kbit: a thread a 32-element block.
static __global__ void __launch_bounds__(kThreads)
    to_kbit_kernel(const uint8_t *__restrict__ blocks, int64_t n_blocks, kbit_absmax_format fmt,
                   uint32_t *__restrict__ kbit_packed, void *__restrict__ kbit_absmax) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < n_blocks;
         b += stride)
        q4_0_block_to_kbit(blocks, b, fmt, kbit_packed, kbit_absmax);
}

static kbit_status to_kbit(int ggml_type, const void *blocks, int64_t n,
                           kbit_absmax_format absmax_format, uint32_t *kbit_packed,
                           void *kbit_absmax, kbit_stream_t stream) {
    KBIT_TRY(check_to_kbit(ggml_type, blocks, n, absmax_format, kbit_packed, kbit_absmax));
    if (n == 0) return KBIT_SUCCESS;
    const int64_t n_blocks = n / Q4_0::kElems;
    int grid = 0;
    cudaError_t err = grid_for((n_blocks + kThreads - 1) / kThreads, kBlocksPerSm, &grid);
    if (err == cudaSuccess) {
        to_kbit_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t *>(blocks),
                                                      n_blocks, absmax_format, kbit_packed,
                                                      kbit_absmax);
        err = launch_error();
    }
    return cuda_status(err, "kbit_gguf_to_kbit");
}

}  // namespace gguf
}  // namespace kbit

KBIT_GGUF_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
