// kbit quantize / dequantize on the GPU: kernels, launchers and the exported entries.
//
// Quantize: one warp per 32-element block, lane i = element i. The absmax is a warp
// max-reduction, the E4M4 scale is chosen among 4 candidate codes by the least
// squared error (an exact integer warp sum, so the CPU makes the same choice), each
// element gets the nearest codebook entry through a shared-memory search table, and K
// __ballot_sync calls produce the K bit-plane words.
//
// Dequantize: each lane turns 8 consecutive elements of a block into one 16-byte store
// (two for fp32): it reads the block's K words, spreads the K bit planes of its byte
// into 8 code bytes with two multiplies per plane, and looks each code up in the
// codebook held one entry per lane with __shfl_sync.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_utils.cuh"
#include "kbit_api.h"
#include "kbit_format.h"

namespace kbit {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kQuantUnroll = 4;     // blocks in flight per warp (independent loads)
constexpr int kTileBlocks = 8;      // dequantize: blocks per warp iteration (32 x 8 elems)
constexpr int kTileElems = kTileBlocks * kBlock;

__device__ unsigned int g_range_flag;  // raised by a quantizer on an out-of-range block

// The built-in codebook travels as a kernel parameter: no allocation, graph-safe.
struct CodebookParam {
    float v[kBlock];
};

__device__ __forceinline__ float codebook_entry(const float *cb, const CodebookParam &def, int i) {
    return cb ? cb[i] : def.v[i];
}

// Element loads/stores with the hardware conversions (same bits as common.h's).
__device__ __forceinline__ float dev_load(F32, float v) { return v; }
__device__ __forceinline__ float dev_load(F16, uint16_t v) { return __half2float(__ushort_as_half(v)); }
__device__ __forceinline__ float dev_load(BF16, uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }
__device__ __forceinline__ float dev_store(F32, float v) { return v; }
__device__ __forceinline__ uint16_t dev_store(F16, float v) { return __half_as_ushort(__float2half_rn(v)); }
__device__ __forceinline__ uint16_t dev_store(BF16, float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Packs 8 floats into 16 bytes of T.
__device__ __forceinline__ void store8(F16, uint16_t *out, const float (&v)[8]) {
    uint4 q;
    uint32_t *w = reinterpret_cast<uint32_t *>(&q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *reinterpret_cast<uint32_t *>(&h);
    }
    *reinterpret_cast<uint4 *>(out) = q;
}
__device__ __forceinline__ void store8(BF16, uint16_t *out, const float (&v)[8]) {
    uint4 q;
    uint32_t *w = reinterpret_cast<uint32_t *>(&q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        w[i] = *reinterpret_cast<uint32_t *>(&h);
    }
    *reinterpret_cast<uint4 *>(out) = q;
}
__device__ __forceinline__ void store8(F32, float *out, const float (&v)[8]) {
    reinterpret_cast<float4 *>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Builds the search table of kbit_format.h in shared memory (same contents as the
// host's build_search_table): warp 0 ranks the entries, all threads fill the bins.
__device__ void build_search_table(SearchTable &tab, const float *cb, const CodebookParam &def,
                                   int m) {
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        const float v = lane < m ? codebook_entry(cb, def, lane) : 0.0f;
        bool first = lane < m;
        for (int j = 0; j < m; ++j) {
            float o = __shfl_sync(kFull, v, j);
            if (j < lane && o == v) first = false;
        }
        int rank = 0;
        for (int j = 0; j < m; ++j) {
            float o = __shfl_sync(kFull, v, j);
            bool fj = __shfl_sync(kFull, first, j);
            rank += (fj && o < v);
        }
        const int unique = __popc(__ballot_sync(kFull, first));
        if (first) {
            tab.value[rank] = v;
            tab.code[rank] = static_cast<uint8_t>(lane);
        }
        __syncwarp();
        if (lane < unique) {
            const bool last = lane == unique - 1;
            const float lo = tab.value[lane];
            const float hi = last ? lo : tab.value[lane + 1];
            const uint8_t clo = tab.code[lane];
            const uint8_t chi = last ? clo : tab.code[lane + 1];
            tab.mid[lane] = last ? INFINITY : midpoint(lo, hi);
            const bool low = last || clo < chi;
            tab.tie_code[lane] = low ? clo : chi;
            tab.tie_value[lane] = low ? lo : hi;
        }
        if (lane == 0) tab.unique = unique;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += blockDim.x)
        tab.start[b] = bin_start(tab.mid, tab.unique, b);
    __syncthreads();
}

// Quantizes block b (this warp; lane = element). Returns nothing: writes K words, the
// scale, and raises the range flag for a block that does not fit.
template <int K, kbit_absmax_format FMT>
__device__ __forceinline__ void quantize_block(float x, bool valid, const SearchTable &tab,
                                               float ts, void *absmax, uint32_t *packed,
                                               int64_t b) {
    const int lane = threadIdx.x & 31;
    const uint32_t amax_bits = __reduce_max_sync(kFull, valid ? abs_bits(x) : 0u);
    const bool finite = bits_finite(amax_bits);
    const float a_s = div_rn(f32_from_bits(amax_bits), ts);
    bool over = false;
    float dec;
    int code = 0;
    bool have_code = false;

    if (FMT == KBIT_ABSMAX_FP32) {
        dec = finite ? a_s : NAN;
        if (lane == 0) static_cast<float *>(absmax)[b] = dec;
    } else if (FMT == KBIT_ABSMAX_FP16) {
        over = finite && a_s > kF16Max;
        const uint16_t h = !finite ? 0x7E00 : (over ? 0x7BFF : f16_ceil_bits(a_s));
        if (lane == 0) static_cast<uint16_t *>(absmax)[b] = h;
        dec = f16_bits_to_f32(h);
    } else {
        const int c0 = finite ? e4m4_ceil(a_s) : 256;
        over = c0 > 255;
        int best = over ? 255 : c0;
        if (!over && c0 > 0) {
            double best_score = INFINITY;
#pragma unroll
            for (int ci = 0; ci < kNumCandidates; ++ci) {
                const int c = c0 + candidate_offset(ci);
                if (c < 1 || c > 255) continue;  // uniform across the warp
                const float dc = e4m4_decode(c);
                const float v = scaled(x, inverse_scale(mul_rn(dc, ts)));
                const Nearest near = search_nearest(tab, v);
                const uint32_t units = __reduce_add_sync(kFull, valid ? error_units(v, near.value) : 0u);
                const double score = static_cast<double>(units) * dc * dc;
                if (score < best_score) {
                    best_score = score;
                    best = c;
                    code = near.code;
                }
            }
            have_code = true;
        }
        if (lane == 0) static_cast<uint8_t *>(absmax)[b] = static_cast<uint8_t>(best);
        dec = e4m4_decode(best);
    }
    if (!have_code) code = search_nearest(tab, scaled(x, finite ? inverse_scale(mul_rn(dec, ts)) : 0.0f)).code;
    if (!valid || !finite) code = 0;

    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        const uint32_t plane = __ballot_sync(kFull, (code >> j) & 1);
        if (lane == j) word = plane;
    }
    if (lane < K) packed[b * K + lane] = word;
    if (lane == 0 && (over || (!finite && FMT == KBIT_ABSMAX_E4M4))) atomicOr(&g_range_flag, 1u);
}

template <class T, int K, kbit_absmax_format FMT>
__global__ void __launch_bounds__(kThreads)
quantize_kernel(const typename T::storage *__restrict__ in, int64_t n,
                const float *__restrict__ codebook, CodebookParam def, float ts,
                void *__restrict__ absmax, uint32_t *__restrict__ packed) {
    __shared__ SearchTable tab;
    build_search_table(tab, codebook, def, 1 << K);

    const int lane = threadIdx.x & 31;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
    for (int64_t b0 = warp * kQuantUnroll; b0 < blocks; b0 += warps * kQuantUnroll) {
        float x[kQuantUnroll];
#pragma unroll
        for (int u = 0; u < kQuantUnroll; ++u) {  // all loads first: memory parallelism
            const int64_t i = (b0 + u) * kBlock + lane;
            x[u] = i < n ? dev_load(T{}, in[i]) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kQuantUnroll; ++u) {
            const int64_t b = b0 + u;
            if (b >= blocks) break;  // uniform across the warp
            quantize_block<K, FMT>(x[u], b * kBlock + lane < n, tab, ts, absmax, packed, b);
        }
    }
}

// Code bytes of the 8 elements [8q, 8q+8) of a block from its K bit-plane words:
// byte e of lo/hi is the code of element e / e+4.
template <int K>
__device__ __forceinline__ void spread_codes(const uint32_t (&w)[K], int q, uint32_t &lo,
                                             uint32_t &hi) {
    lo = hi = 0;
#pragma unroll
    for (int j = 0; j < K; ++j) {
        const uint32_t byte = w[j] >> (8 * q);
        // nibble * 0x204081 puts bit e at bit 8e (no carries); << j selects plane j.
        lo |= ((byte & 0xFu) * (0x204081u << j)) & (0x01010101u << j);
        hi |= (((byte >> 4) & 0xFu) * (0x204081u << j)) & (0x01010101u << j);
    }
}

template <class T, int K, kbit_absmax_format FMT>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(const uint32_t *__restrict__ packed, const void *__restrict__ absmax, float ts,
                  const float *__restrict__ codebook, CodebookParam def, int64_t n,
                  int64_t vec_elems, typename T::storage *__restrict__ out) {
    __shared__ float cb_smem[kBlock];
    const int lane = threadIdx.x & 31;
    const float cb_lane = lane < (1 << K) ? codebook_entry(codebook, def, lane) : 0.0f;
    if (threadIdx.x < 32) cb_smem[lane] = cb_lane;

    // Vector part: whole tiles of 8 blocks, 8 elements and one 16-byte store per lane.
    const int64_t tiles = vec_elems / kTileElems;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
    const int q = lane & 3;
    for (int64_t t = warp; t < tiles; t += warps) {
        const int64_t b = t * kTileBlocks + (lane >> 2);
        uint32_t w[K];
#pragma unroll
        for (int j = 0; j < K; ++j) w[j] = __ldg(packed + b * K + j);
        const float d = mul_rn(decode_absmax(FMT, absmax, b), ts);
        uint32_t lo, hi;
        spread_codes<K>(w, q, lo, hi);
        float v[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            // __shfl_sync reads the source lane modulo 32: the bytes above are ignored.
            v[e] = mul_rn(__shfl_sync(kFull, cb_lane, static_cast<int>(lo >> (8 * e))), d);
            v[e + 4] = mul_rn(__shfl_sync(kFull, cb_lane, static_cast<int>(hi >> (8 * e))), d);
        }
        store8(T{}, out + b * kBlock + 8 * q, v);
    }

    // Scalar part: the tail (and everything when the output is not 16-byte aligned).
    __syncthreads();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = vec_elems + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        const int64_t b = i / kBlock;
        const int bit = static_cast<int>(i % kBlock);
        uint32_t c = 0;
#pragma unroll
        for (int j = 0; j < K; ++j) c |= ((packed[b * K + j] >> bit) & 1u) << j;
        out[i] = dev_store(T{}, mul_rn(cb_smem[c], mul_rn(decode_absmax(FMT, absmax, b), ts)));
    }
}

CodebookParam default_codebook(int k) {
    CodebookParam p{};
    for (int i = 0; i < (1 << k); ++i) p.v[i] = kNormalFloat[k][i];
    return p;
}

template <class T, int K, kbit_absmax_format FMT>
cudaError_t launch_quantize(const void *in, int64_t n, const float *cb, float ts, void *absmax,
                            uint32_t *packed, cudaStream_t stream) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const int64_t ctas = (blocks + kWarps * kQuantUnroll - 1) / (kWarps * kQuantUnroll);
    int grid = 0;
    cudaError_t err = grid_for(ctas, 2048 / kThreads, &grid);
    if (err != cudaSuccess) return err;
    quantize_kernel<T, K, FMT><<<grid, kThreads, 0, stream>>>(
        static_cast<const typename T::storage *>(in), n, cb, default_codebook(K), ts, absmax,
        packed);
    return launch_error();
}

template <class T, int K, kbit_absmax_format FMT>
cudaError_t launch_dequantize(const uint32_t *packed, const void *absmax, float ts,
                              const float *cb, int64_t n, void *out, cudaStream_t stream) {
    const bool aligned = (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
    const int64_t vec_elems = aligned ? n / kTileElems * kTileElems : 0;
    const int64_t work = vec_elems / kTileElems / kWarps + (n - vec_elems + kThreads - 1) / kThreads;
    int grid = 0;
    cudaError_t err = grid_for(work > 0 ? work : 1, 2048 / kThreads, &grid);
    if (err != cudaSuccess) return err;
    dequantize_kernel<T, K, FMT><<<grid, kThreads, 0, stream>>>(
        packed, absmax, ts, cb, default_codebook(K), n, vec_elems,
        static_cast<typename T::storage *>(out));
    return launch_error();
}

template <class T, int K>
kbit_status quantize_entry(const void *input, int64_t n, const float *codebook,
                           kbit_absmax_format fmt, float ts, void *absmax, uint32_t *packed,
                           kbit_stream_t stream) {
    KBIT_TRY(check_quantize(input, n, sizeof(typename T::storage), codebook, fmt, ts, absmax,
                            packed));
    if (n == 0) return KBIT_SUCCESS;
    cudaError_t err;
    switch (fmt) {
        case KBIT_ABSMAX_FP32:
            err = launch_quantize<T, K, KBIT_ABSMAX_FP32>(input, n, codebook, ts, absmax, packed, stream);
            break;
        case KBIT_ABSMAX_FP16:
            err = launch_quantize<T, K, KBIT_ABSMAX_FP16>(input, n, codebook, ts, absmax, packed, stream);
            break;
        default:
            err = launch_quantize<T, K, KBIT_ABSMAX_E4M4>(input, n, codebook, ts, absmax, packed, stream);
            break;
    }
    return cuda_status(err, "kbit quantize launch");
}

template <class T, int K>
kbit_status dequantize_entry(const uint32_t *packed, const void *absmax, kbit_absmax_format fmt,
                             float ts, const float *codebook, int64_t n, void *output,
                             kbit_stream_t stream) {
    KBIT_TRY(check_dequantize(packed, absmax, fmt, ts, codebook, n, output,
                              sizeof(typename T::storage)));
    if (n == 0) return KBIT_SUCCESS;
    cudaError_t err;
    switch (fmt) {
        case KBIT_ABSMAX_FP32:
            err = launch_dequantize<T, K, KBIT_ABSMAX_FP32>(packed, absmax, ts, codebook, n, output, stream);
            break;
        case KBIT_ABSMAX_FP16:
            err = launch_dequantize<T, K, KBIT_ABSMAX_FP16>(packed, absmax, ts, codebook, n, output, stream);
            break;
        default:
            err = launch_dequantize<T, K, KBIT_ABSMAX_E4M4>(packed, absmax, ts, codebook, n, output, stream);
            break;
    }
    return cuda_status(err, "kbit dequantize launch");
}

// Max |x| over the finite elements, as ordered bits, into *result (zeroed beforehand).
template <class T>
__global__ void __launch_bounds__(kThreads)
absmax_kernel(const typename T::storage *__restrict__ in, int64_t n, unsigned int *result) {
    uint32_t m = 0;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint32_t a = abs_bits(dev_load(T{}, in[i]));
        if (bits_finite(a) && a > m) m = a;
    }
    m = __reduce_max_sync(kFull, m);
    if ((threadIdx.x & 31) == 0 && m) atomicMax(result, m);
}

template <class T>
cudaError_t launch_absmax(const void *in, int64_t n, unsigned int *result, cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for((n + kThreads - 1) / kThreads, 2048 / kThreads, &grid);
    if (err != cudaSuccess) return err;
    absmax_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const typename T::storage *>(in), n, result);
    return launch_error();
}

}  // namespace
}  // namespace kbit

extern "C" {

#define KBIT_GPU_ENTRIES(TAG, NAME, K)                                                       \
    KBIT_API kbit_status cquantize_kbit_##NAME##_k##K(                                       \
        const void *input, int64_t n, const float *codebook, kbit_absmax_format absmax_format, \
        float tensor_scale, void *absmax, uint32_t *packed, kbit_stream_t stream) {          \
        return kbit::guarded([&] {                                                           \
            return kbit::quantize_entry<TAG, K>(input, n, codebook, absmax_format,           \
                                                tensor_scale, absmax, packed, stream);       \
        });                                                                                  \
    }                                                                                        \
    KBIT_API kbit_status cdequantize_kbit_##NAME##_k##K(                                     \
        const uint32_t *packed, const void *absmax, kbit_absmax_format absmax_format,        \
        float tensor_scale, const float *codebook, int64_t n, void *output,                  \
        kbit_stream_t stream) {                                                              \
        return kbit::guarded([&] {                                                           \
            return kbit::dequantize_entry<TAG, K>(packed, absmax, absmax_format,             \
                                                  tensor_scale, codebook, n, output, stream); \
        });                                                                                  \
    }
KBIT_FOR_EACH_KBIT_INSTANCE(KBIT_GPU_ENTRIES)
#undef KBIT_GPU_ENTRIES

#define KBIT_GPU_CASE(TAG, NAME, K)                                                          \
    if (dtype == TAG::dtype && k == K) return kbit::quantize_entry<TAG, K>(                  \
        input, n, codebook, absmax_format, tensor_scale, absmax, packed, stream);
KBIT_API kbit_status kbit_quantize(const void *input, int64_t n, kbit_dtype dtype, int k,
                                   const float *codebook, kbit_absmax_format absmax_format,
                                   float tensor_scale, void *absmax, uint32_t *packed,
                                   kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_dtype_k(dtype, k));
        KBIT_FOR_EACH_KBIT_INSTANCE(KBIT_GPU_CASE)
        return kbit::fail(KBIT_ERROR_INTERNAL, "no instance for dtype %d, k %d", dtype, k);
    });
}
#undef KBIT_GPU_CASE

#define KBIT_GPU_CASE(TAG, NAME, K)                                                          \
    if (dtype == TAG::dtype && k == K) return kbit::dequantize_entry<TAG, K>(                \
        packed, absmax, absmax_format, tensor_scale, codebook, n, output, stream);
KBIT_API kbit_status kbit_dequantize(const uint32_t *packed, const void *absmax,
                                     kbit_absmax_format absmax_format, float tensor_scale,
                                     const float *codebook, int k, int64_t n, kbit_dtype dtype,
                                     void *output, kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_dtype_k(dtype, k));
        KBIT_FOR_EACH_KBIT_INSTANCE(KBIT_GPU_CASE)
        return kbit::fail(KBIT_ERROR_INTERNAL, "no instance for dtype %d, k %d", dtype, k);
    });
}
#undef KBIT_GPU_CASE

KBIT_API kbit_status kbit_get_range_flag(int *raised, int clear) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_ptr(raised, "raised", alignof(int)));
        unsigned int flag = 0;
        KBIT_TRY(kbit::cuda_status(cudaMemcpyFromSymbol(&flag, kbit::g_range_flag, sizeof flag),
                                   "reading the range flag"));
        if (clear) {
            const unsigned int zero = 0;
            KBIT_TRY(kbit::cuda_status(cudaMemcpyToSymbol(kbit::g_range_flag, &zero, sizeof zero),
                                       "clearing the range flag"));
        }
        *raised = flag ? 1 : 0;
        return KBIT_SUCCESS;
    });
}

KBIT_API kbit_status kbit_compute_tensor_scale(const void *input, int64_t n, kbit_dtype dtype,
                                               kbit_absmax_format absmax_format,
                                               float *tensor_scale, kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_common(n, absmax_format, 1.0f));
        if (!kbit::valid_dtype(dtype))
            return kbit::fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
        KBIT_TRY(kbit::check_ptr(tensor_scale, "tensor_scale", 4));
        if (n == 0) {
            *tensor_scale = 1.0f;
            return KBIT_SUCCESS;
        }
        KBIT_TRY(kbit::check_ptr(input, "input", kbit::dtype_size(dtype)));
        unsigned int *result = nullptr;
        KBIT_TRY(kbit::cuda_status(cudaMallocAsync(&result, sizeof *result, stream), "cudaMallocAsync"));
        cudaError_t err = cudaMemsetAsync(result, 0, sizeof *result, stream);
        if (err == cudaSuccess) {
            err = dtype == KBIT_DTYPE_FP32   ? kbit::launch_absmax<kbit::F32>(input, n, result, stream)
                  : dtype == KBIT_DTYPE_FP16 ? kbit::launch_absmax<kbit::F16>(input, n, result, stream)
                                             : kbit::launch_absmax<kbit::BF16>(input, n, result, stream);
        }
        unsigned int bits = 0;
        if (err == cudaSuccess)
            err = cudaMemcpyAsync(&bits, result, sizeof bits, cudaMemcpyDeviceToHost, stream);
        cudaError_t free_err = cudaFreeAsync(result, stream);
        if (err == cudaSuccess) err = free_err;
        if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
        KBIT_TRY(kbit::cuda_status(err, "kbit_compute_tensor_scale"));
        *tensor_scale = kbit::tensor_scale_for(kbit::f32_from_bits(bits), absmax_format);
        return KBIT_SUCCESS;
    });
}

}  // extern "C"
