// NF4 / FP4 (bitsandbytes-compatible 4-bit) on the GPU: kernels, launchers and the
// exported entries. The arithmetic and the byte layout are in nf4.h.
//
// Both directions work on chunks of 16 bytes of unpacked data (8 fp16/bf16 or 4 fp32
// elements, E/2 packed bytes), lane l of a warp on chunk l of 32 consecutive ones, so
// every load and store instruction of a warp touches one contiguous span.
//
// Quantize: a CTA takes a tile of 4096 elements (the largest blocksize) in 2 (16-bit)
// or 4 (fp32) rounds of 256 chunks, all loads first, and asks L2 for its next tile
// while it computes this one. The lanes of a block reduce its absmax with shuffles
// (through shared memory beyond 32 chunks), then each thread encodes its chunks with
// one bucket-table lookup per element (see fast_encode).
//
// Dequantize: each thread takes 8 chunks a step: their packed words (4 or 2 bytes) and
// block scales are loaded first, then each chunk becomes one 16-byte streaming store
// through the 16-entry table in shared memory. The double-quantized variant rebuilds
// each block scale from its 8-bit code, the 256-block's absmax2 and the offset.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>

#include "cuda_utils.cuh"
#include "nf4.h"

namespace kbit {
namespace bnb4 {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kQuantTile = 4096;                          // elements per quantizer CTA step
constexpr int kDequantRounds = 8;                         // chunks per dequantizer thread step
constexpr int kPerSm = 8;                                 // resident CTAs per SM to aim for
// Dequantize: one step per thread, enough CTAs to cover about 2^33 elements before the
// loop strides (short-lived CTAs keep more loads in flight than looping ones).
constexpr int kDequantPerSm = 4096;
constexpr int kMeanThreads = 1024;                        // one CTA: a fixed summation order

static_assert(kQuantTile == kMaxBlock, "a quantizer tile holds whole blocks");
static_assert(kDqBlock == kThreads, "one CTA per 256-block of absmax values");

// bitsandbytes' reciprocal deviations (nf4.h).
__constant__ uint32_t c_rcp_plus[32] = KBIT_BNB_RCP_PLUS;
__constant__ uint32_t c_rcp_minus[32] = KBIT_BNB_RCP_MINUS;

__device__ __forceinline__ float block_rcp(float a) { return bnb_rcp(a, c_rcp_plus, c_rcp_minus); }

// The built-in dynamic map travels as a kernel parameter: no allocation, graph-safe.
struct DynamicMap {
    float v[kDynamicEntries];
};

DynamicMap builtin_map() {
    DynamicMap m;
    const float *src = dynamic_map();
    for (int i = 0; i < kDynamicEntries; ++i) m.v[i] = src[i];
    return m;
}

// A chunk is the E = 16 / sizeof(T) consecutive elements of one 16-byte load or
// store (8 for fp16/bf16, 4 for fp32), packed in E/2 bytes. The 32 lanes of a warp
// take 32 consecutive chunks, so every memory instruction of a warp is contiguous.
template <class T>
struct Chunk {
    using S = typename T::storage;
    static constexpr int E = 16 / static_cast<int>(sizeof(S));
    static constexpr int kBytes = E / 2;
};

// The E elements of a chunk held in a 16-byte word, as floats.
template <class T>
__device__ __forceinline__ void unpack_chunk(const uint4 &q, float (&x)[Chunk<T>::E]) {
    const typename T::storage *e = reinterpret_cast<const typename T::storage *>(&q);
#pragma unroll
    for (int k = 0; k < Chunk<T>::E; ++k) x[k] = load_f32(T{}, e[k]);
}

// The E input elements of chunk i0 (an element index), zero past n.
template <class T>
__device__ __forceinline__ void load_chunk(const typename T::storage *__restrict__ in, int64_t i0,
                                           int64_t n, bool vec, float (&x)[Chunk<T>::E]) {
    using S = typename T::storage;
    constexpr int E = Chunk<T>::E;
    if (vec && i0 + E <= n) {
        unpack_chunk<T>(__ldg(reinterpret_cast<const uint4 *>(in + i0)), x);
    } else {
#pragma unroll
        for (int k = 0; k < E; ++k) x[k] = i0 + k < n ? load_f32(T{}, in[i0 + k]) : 0.0f;
    }
}

// The E outputs of chunk i0 (< n): one 16-byte store when whole and aligned.
__device__ __forceinline__ void store_chunk(F32, float *out, int64_t i0, int64_t n, bool vec,
                                            const float (&v)[4]) {
    if (vec && i0 + 4 <= n) {
        __stcs(reinterpret_cast<float4 *>(out + i0), make_float4(v[0], v[1], v[2], v[3]));
    } else {
        for (int k = 0; k < 4 && i0 + k < n; ++k) out[i0 + k] = v[k];
    }
}
template <class T>
__device__ __forceinline__ void store_chunk(T, uint16_t *out, int64_t i0, int64_t n, bool vec,
                                            const float (&v)[8]) {
    if (vec && i0 + 8 <= n) {
        const uint4 q = make_uint4(pack2(T{}, v[0], v[1]), pack2(T{}, v[2], v[3]),
                                   pack2(T{}, v[4], v[5]), pack2(T{}, v[6], v[7]));
        __stcs(reinterpret_cast<uint4 *>(out + i0), q);  // streaming: written once
    } else {
        for (int k = 0; k < 8 && i0 + k < n; ++k) out[i0 + k] = store_cast(T{}, v[k]);
    }
}

// The kBytes packed bytes from byte b0 as one little-endian word (zero past n_bytes).
template <int kBytes>
__device__ __forceinline__ uint32_t load_packed(const uint8_t *__restrict__ packed, int64_t b0,
                                                int64_t n_bytes, bool vec) {
    if (vec && b0 + kBytes <= n_bytes) {
        return kBytes == 4 ? __ldg(reinterpret_cast<const uint32_t *>(packed + b0))
                           : __ldg(reinterpret_cast<const uint16_t *>(packed + b0));
    }
    uint32_t w = 0;
#pragma unroll
    for (int k = 0; k < kBytes; ++k)
        if (b0 + k < n_bytes) w |= static_cast<uint32_t>(packed[b0 + k]) << (8 * k);
    return w;
}

template <int kBytes>
__device__ __forceinline__ void store_packed(uint8_t *__restrict__ packed, int64_t b0,
                                             int64_t n_bytes, bool vec, uint32_t w) {
    if (vec && b0 + kBytes <= n_bytes) {
        if (kBytes == 4) *reinterpret_cast<uint32_t *>(packed + b0) = w;
        else *reinterpret_cast<uint16_t *>(packed + b0) = static_cast<uint16_t>(w);
    } else {
#pragma unroll
        for (int k = 0; k < kBytes; ++k)
            if (b0 + k < n_bytes) packed[b0 + k] = static_cast<uint8_t>(w >> (8 * k));
    }
}

// ---- fast encoder ---------------------------------------------------------------------------

// The GPU encodes with one table lookup instead of a 4-step search. v is mapped
// monotonically to a bucket of width 1/16 (NF4: s = sat(v/4 + 1/2), bucket = RN(64 s),
// 65 buckets over [-2, 2]; FP4: s = sat(|v|/2), bucket = RN(32 s), 33 buckets over
// |v| in [0, 2]; saturation sends NaN to bucket 0 and +-inf to the ends). Adjacent
// thresholds are more than 1/16 apart, so a bucket holds at most one of them, and
//   code = base[bucket] + (v > thr[bucket])
// with base = the number of thresholds in lower buckets is exactly the number of
// thresholds below v: the same code as nf4.h's encode() (the host's), for every v.
struct Bucket {
    float thr;  // the threshold inside this bucket, +inf if none
    int base;   // thresholds in lower buckets (FP4: 4 * magnitude rank)
};

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer

__device__ __forceinline__ int bucket_of(Nf4, float v) {
    const float s = __saturatef(__fmaf_rn(v, 0.25f, 0.5f));
    return __float_as_int(__fmaf_rn(s, 64.0f, kRoundMagic)) - __float_as_int(kRoundMagic);
}
__device__ __forceinline__ int bucket_of(Fp4, float v) {
    const float s = __saturatef(__fmul_rn(fabsf(v), 0.5f));
    return __float_as_int(__fmaf_rn(s, 32.0f, kRoundMagic)) - __float_as_int(kRoundMagic);
}
constexpr int buckets(Nf4) { return 65; }
constexpr int buckets(Fp4) { return 33; }
constexpr int thresholds(Nf4) { return 15; }
constexpr int thresholds(Fp4) { return 7; }

// Fills the bucket table in shared memory (then synchronises the CTA).
template <class Fmt>
__device__ __forceinline__ void build_buckets(Bucket *tab) {
    for (int i = threadIdx.x; i < buckets(Fmt{}); i += blockDim.x) {
        Bucket e{INFINITY, 0};
        for (int j = 0; j < thresholds(Fmt{}); ++j) {
            const float t = threshold(Fmt{}, j);
            const int b = bucket_of(Fmt{}, t);
            e.base += b < i;
            if (b == i) e.thr = t;
        }
        if (thresholds(Fmt{}) == 7) e.base *= 4;  // FP4: a shift count into kFp4Codes
        tab[i] = e;
    }
    __syncthreads();
}

__device__ __forceinline__ uint32_t fast_encode(Nf4, const Bucket *tab, float v) {
    const Bucket e = tab[bucket_of(Nf4{}, v)];
    return e.base + (v > e.thr);
}
constexpr uint32_t kFp4Codes = 0x32547610u;  // nibble r: the code bits of magnitude rank r
__device__ __forceinline__ uint32_t fast_encode(Fp4, const Bucket *tab, float v) {
    const Bucket e = tab[bucket_of(Fp4{}, v)];
    const uint32_t shift = e.base + (fabsf(v) > e.thr ? 4u : 0u);
    return ((kFp4Codes >> shift) & 15u) | (v < 0.0f ? 8u : 0u);
}

// ---- quantize ---------------------------------------------------------------------------

// A CTA takes a tile of 4096 elements (the largest blocksize) in R rounds: in round r
// thread t holds chunk r * 256 + t. A block is G = blocksize / E consecutive chunks:
// G <= 32 lanes reduce its absmax with shuffles; larger blocks go through one
// shared-memory maximum per 32 chunks.
// 16-bit inputs: 8 resident CTAs per SM (32 registers) keep enough loads in flight.
template <class T, class Fmt>
__global__ void __launch_bounds__(kThreads, sizeof(typename T::storage) == 2 ? 8 : 1)
quantize_kernel(const typename T::storage *__restrict__ in, int64_t n, int log2_bs,
                bool vec_in, bool vec_out, float *__restrict__ absmax,
                uint8_t *__restrict__ packed) {
    constexpr int E = Chunk<T>::E;
    constexpr int kBytes = Chunk<T>::kBytes;
    constexpr int R = kQuantTile / (kThreads * E);
    __shared__ Bucket tab[buckets(Fmt{})];
    constexpr int kGroups = kQuantTile / E / 32;  // 32-chunk groups per tile: 16 or 32
    __shared__ float group_max[kGroups];
    __shared__ float block_max[kGroups / 2];
    build_buckets<Fmt>(tab);

    const int G = (1 << log2_bs) / E;  // chunks per block (a power of two)
    const int64_t tiles = (n + kQuantTile - 1) / kQuantTile;
    const int64_t n_blocks = ((n - 1) >> log2_bs) + 1;
    const int64_t n_bytes = (n + 1) >> 1;

    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        float x[R][E];
        float m[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {  // all loads first: memory parallelism
            const int c = r * kThreads + threadIdx.x;
            load_chunk<T>(in, tile * kQuantTile + static_cast<int64_t>(c) * E, n, vec_in, x[r]);
        }
        if (tile + gridDim.x < tiles) {  // warm L2 with the next tile while this one computes
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int64_t i =
                    (tile + gridDim.x) * kQuantTile + (r * kThreads + threadIdx.x) * E;
                if (i < n) asm volatile("prefetch.global.L2 [%0];" ::"l"(in + i));
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            m[r] = kFoldStart;
#pragma unroll
            for (int k = 0; k < E; ++k) m[r] = fold_abs(m[r], x[r][k]);
        }
        if (G <= 32) {
#pragma unroll
            for (int r = 0; r < R; ++r)
                for (int off = 1; off < G; off <<= 1)
                    m[r] = fmaxf(m[r], __shfl_xor_sync(kFull, m[r], off));
        } else {  // uniform: the whole CTA takes this branch or none of it
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int off = 1; off < 32; off <<= 1)
                    m[r] = fmaxf(m[r], __shfl_xor_sync(kFull, m[r], off));
                if ((threadIdx.x & 31) == 0) group_max[(r * kThreads + threadIdx.x) / 32] = m[r];
            }
            __syncthreads();
            if (threadIdx.x < 32) {  // one warp folds the group maxima of each block
                const int per = G / 32;  // groups per block: 2..32
                float v = threadIdx.x < kGroups ? group_max[threadIdx.x] : kFoldStart;
                for (int off = 1; off < per; off <<= 1)
                    v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
                if (threadIdx.x < kGroups && (threadIdx.x & (per - 1)) == 0)
                    block_max[threadIdx.x / per] = v;
            }
            __syncthreads();  // the next tile writes these only after all reads below
#pragma unroll
            for (int r = 0; r < R; ++r) m[r] = block_max[(r * kThreads + threadIdx.x) / G];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int c = r * kThreads + threadIdx.x;
            const int64_t i0 = tile * kQuantTile + static_cast<int64_t>(c) * E;
            const int64_t b = i0 >> log2_bs;
            if ((c & (G - 1)) == 0 && b < n_blocks) absmax[b] = m[r];
            const float inv = block_rcp(m[r]);
            uint32_t w = 0;
#pragma unroll
            for (int j = 0; j < E / 2; ++j) {
                const uint32_t hi = fast_encode(Fmt{}, tab, bnb_mul(x[r][2 * j], inv));
                const uint32_t lo = fast_encode(Fmt{}, tab, bnb_mul(x[r][2 * j + 1], inv));
                w |= ((hi << 4) | lo) << (8 * j);
            }
            store_packed<kBytes>(packed, i0 >> 1, n_bytes, vec_out, w);
        }
    }
}

// ---- dequantize -------------------------------------------------------------------------

// Block scale read straight from the float32 absmax array.
struct PlainScale {
    const float *absmax;
    __device__ __forceinline__ float operator()(int64_t b) const { return __ldg(absmax + b); }
};

// Block scale rebuilt from the double-quantized state: (code[q[b]] * absmax2[b/256]) + offset
// (bitsandbytes: a fast-math product, then torch's IEEE add).
struct DqScale {
    const uint8_t *qabsmax;
    const float *absmax2;
    const float *code;  // shared memory
    float offset;
    __device__ __forceinline__ float operator()(int64_t b) const {
        return add_rn(bnb_mul(code[__ldg(qabsmax + b)], __ldg(absmax2 + (b >> 8))), offset);
    }
};

// Each thread takes kDequantRounds chunks a step (chunk c0 + r * blockDim.x): their
// packed words and scales are loaded first, then decoded and stored.
template <class T, class Fmt, class Scale>
__device__ __forceinline__ void dequantize_body(const uint8_t *__restrict__ packed,
                                                const Scale &scale, int64_t n, int log2_bs,
                                                bool vec_in, bool vec_out,
                                                typename T::storage *__restrict__ out) {
    constexpr int E = Chunk<T>::E;
    constexpr int kBytes = Chunk<T>::kBytes;
    constexpr int R = kDequantRounds;
    __shared__ float lut[16];
    if (threadIdx.x < 16) lut[threadIdx.x] = table_value(Fmt{}, threadIdx.x);
    __syncthreads();

    const int64_t chunks = (n + E - 1) / E;
    const int64_t n_bytes = (n + 1) >> 1;
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x * R;
    for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * blockDim.x * R + threadIdx.x;
         c0 < chunks; c0 += step) {
        uint32_t w[R];
        float a[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t c = c0 + static_cast<int64_t>(r) * blockDim.x;
            if (c < chunks) {
                w[r] = load_packed<kBytes>(packed, c * kBytes, n_bytes, vec_in);
                a[r] = scale((c * E) >> log2_bs);  // a chunk never straddles a block
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t c = c0 + static_cast<int64_t>(r) * blockDim.x;
            if (c >= chunks) break;
            float v[E];
#pragma unroll
            for (int j = 0; j < E / 2; ++j) {
                const uint32_t byte = w[r] >> (8 * j);
                v[2 * j] = bnb_mul(lut[(byte >> 4) & 15], a[r]);
                v[2 * j + 1] = bnb_mul(lut[byte & 15], a[r]);
            }
            store_chunk(T{}, out, c * E, n, vec_out, v);
        }
    }
}

template <class T, class Fmt>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(const uint8_t *__restrict__ packed, const float *__restrict__ absmax,
                  int64_t n, int log2_bs, bool vec_in, bool vec_out,
                  typename T::storage *__restrict__ out) {
    dequantize_body<T, Fmt>(packed, PlainScale{absmax}, n, log2_bs, vec_in, vec_out, out);
}

// Fills the 256-entry dynamic map in shared memory (code may be NULL: the built-in map).
__device__ __forceinline__ void load_map(float *dst, const float *code, const DynamicMap &builtin) {
    for (int i = threadIdx.x; i < kDynamicEntries; i += blockDim.x)
        dst[i] = code ? code[i] : builtin.v[i];
    __syncthreads();
}

template <class T, class Fmt>
__global__ void __launch_bounds__(kThreads)
dequantize_dq_kernel(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ qabsmax,
                     const float *__restrict__ absmax2, const float *__restrict__ code,
                     const __grid_constant__ DynamicMap builtin, const float *__restrict__ offset,
                     int64_t n, int log2_bs, bool vec_in, bool vec_out,
                     typename T::storage *__restrict__ out) {
    __shared__ float map[kDynamicEntries];
    load_map(map, code, builtin);
    const DqScale scale{qabsmax, absmax2, map, __ldg(offset)};
    dequantize_body<T, Fmt>(packed, scale, n, log2_bs, vec_in, vec_out, out);
}

// ---- second-level (absmax) quantization ---------------------------------------------------

struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// One 256-block of absmax values per CTA step: v = absmax - offset, absmax2 = max |v|
// (zero padding counted in the partial last block), q = encode_dynamic(v / absmax2).
__global__ void __launch_bounds__(kThreads)
quantize_absmax_kernel(const float *__restrict__ absmax, int64_t count,
                       const float *__restrict__ code, const __grid_constant__ DynamicMap builtin,
                       const float *__restrict__ offset, uint8_t *__restrict__ qabsmax,
                       float *__restrict__ absmax2) {
    using Reduce = cub::BlockReduce<float, kThreads>;
    __shared__ typename Reduce::TempStorage temp;
    __shared__ float map[kDynamicEntries];
    __shared__ float block_max;
    load_map(map, code, builtin);
    const float off = __ldg(offset);
    const int64_t blocks = (count + kDqBlock - 1) / kDqBlock;
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        const int64_t i = blk * kDqBlock + threadIdx.x;
        const float v = i < count ? sub_rn(__ldg(absmax + i), off) : 0.0f;
        const float m = Reduce(temp).Reduce(fold_abs(kFoldStart, v), MaxOp{});
        if (threadIdx.x == 0) {
            block_max = m;
            absmax2[blk] = m;
        }
        __syncthreads();
        const float inv = block_rcp(block_max);
        if (i < count) qabsmax[i] = static_cast<uint8_t>(encode_dynamic(map, bnb_mul(v, inv)));
        __syncthreads();  // temp and block_max are reused by the next step
    }
}

__global__ void __launch_bounds__(kThreads)
dequantize_absmax_kernel(const uint8_t *__restrict__ qabsmax, const float *__restrict__ absmax2,
                         const float *__restrict__ code, const __grid_constant__ DynamicMap builtin,
                         const float *__restrict__ offset, int64_t count,
                         float *__restrict__ absmax) {
    __shared__ float map[kDynamicEntries];
    load_map(map, code, builtin);
    const DqScale scale{qabsmax, absmax2, map, __ldg(offset)};
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride)
        absmax[i] = scale(i);
}

// mean = float(sum / count), the sum in double in a fixed order that the host repeats:
// thread t adds elements t, t + 1024, ... in turn, then a pairwise tree over the threads.
__global__ void __launch_bounds__(kMeanThreads)
absmax_mean_kernel(const float *__restrict__ absmax, int64_t count, float *__restrict__ mean) {
    __shared__ double part[kMeanThreads];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < count; i += kMeanThreads)
        s += static_cast<double>(__ldg(absmax + i));
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = kMeanThreads / 2; w > 0; w >>= 1) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *mean = static_cast<float>(part[0] / static_cast<double>(count));
}

// ---- launchers --------------------------------------------------------------------------

bool aligned(const void *p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

template <class T>
int64_t dequantize_ctas(int64_t n) {
    const int64_t chunks = (n + Chunk<T>::E - 1) / Chunk<T>::E;
    return (chunks + kThreads * kDequantRounds - 1) / (kThreads * kDequantRounds);
}

template <class T, class Fmt>
cudaError_t launch_quantize(const void *input, int64_t n, int blocksize, float *absmax,
                            uint8_t *packed, cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for((n + kQuantTile - 1) / kQuantTile, kPerSm, &grid);
    if (err != cudaSuccess) return err;
    quantize_kernel<T, Fmt><<<grid, kThreads, 0, stream>>>(
        static_cast<const typename T::storage *>(input), n, log2_of(blocksize),
        aligned(input, 16), aligned(packed, Chunk<T>::kBytes), absmax, packed);
    return launch_error();
}

template <class T, class Fmt>
cudaError_t launch_dequantize(const uint8_t *packed, const float *absmax, int64_t n,
                              int blocksize, void *output, cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for(dequantize_ctas<T>(n), kDequantPerSm, &grid);
    if (err != cudaSuccess) return err;
    dequantize_kernel<T, Fmt><<<grid, kThreads, 0, stream>>>(
        packed, absmax, n, log2_of(blocksize), aligned(packed, Chunk<T>::kBytes),
        aligned(output, 16),
        static_cast<typename T::storage *>(output));
    return launch_error();
}

template <class T, class Fmt>
cudaError_t launch_dequantize_dq(const uint8_t *packed, const uint8_t *qabsmax,
                                 const float *absmax2, const float *code, const float *offset,
                                 int64_t n, int blocksize, void *output, cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for(dequantize_ctas<T>(n), kDequantPerSm, &grid);
    if (err != cudaSuccess) return err;
    dequantize_dq_kernel<T, Fmt><<<grid, kThreads, 0, stream>>>(
        packed, qabsmax, absmax2, code, builtin_map(), offset, n, log2_of(blocksize),
        aligned(packed, Chunk<T>::kBytes), aligned(output, 16),
        static_cast<typename T::storage *>(output));
    return launch_error();
}

cudaError_t launch_quantize_absmax(const float *absmax, int64_t count, const float *code,
                                   const float *offset, uint8_t *qabsmax, float *absmax2,
                                   cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for((count + kDqBlock - 1) / kDqBlock, kPerSm, &grid);
    if (err != cudaSuccess) return err;
    quantize_absmax_kernel<<<grid, kThreads, 0, stream>>>(absmax, count, code, builtin_map(),
                                                          offset, qabsmax, absmax2);
    return launch_error();
}

cudaError_t launch_dequantize_absmax(const uint8_t *qabsmax, const float *absmax2,
                                     const float *code, const float *offset, int64_t count,
                                     float *absmax, cudaStream_t stream) {
    int grid = 0;
    cudaError_t err = grid_for((count + kThreads - 1) / kThreads, kPerSm, &grid);
    if (err != cudaSuccess) return err;
    dequantize_absmax_kernel<<<grid, kThreads, 0, stream>>>(qabsmax, absmax2, code,
                                                            builtin_map(), offset, count, absmax);
    return launch_error();
}

cudaError_t launch_absmax_mean(const float *absmax, int64_t count, float *mean,
                               cudaStream_t stream) {
    absmax_mean_kernel<<<1, kMeanThreads, 0, stream>>>(absmax, count, mean);
    return launch_error();
}

}  // namespace
}  // namespace bnb4
}  // namespace kbit

// ---- exported entries ---------------------------------------------------------------------

extern "C" {

#define KBIT_NF4_INSTANCE(FMT, FNAME, TAG, TNAME)                                               \
    KBIT_API kbit_status cquantize_##FNAME##_##TNAME(const void *input, int64_t n,              \
                                                     int blocksize, float *absmax,              \
                                                     uint8_t *packed, kbit_stream_t stream) {   \
        return kbit::guarded([&] {                                                             \
            KBIT_TRY(kbit::bnb4::check_quantize(input, n, sizeof(TAG::storage), blocksize,     \
                                                absmax, packed));                              \
            if (n == 0) return KBIT_SUCCESS;                                                   \
            return kbit::cuda_status(kbit::bnb4::launch_quantize<TAG, FMT>(                     \
                                         input, n, blocksize, absmax, packed, stream),          \
                                     "cquantize_" #FNAME "_" #TNAME);                          \
        });                                                                                    \
    }                                                                                          \
    KBIT_API kbit_status cdequantize_##FNAME##_##TNAME(const uint8_t *packed,                   \
                                                       const float *absmax, int64_t n,          \
                                                       int blocksize, void *output,             \
                                                       kbit_stream_t stream) {                  \
        return kbit::guarded([&] {                                                             \
            KBIT_TRY(kbit::bnb4::check_dequantize(packed, absmax, n, blocksize, output,        \
                                                  sizeof(TAG::storage)));                      \
            if (n == 0) return KBIT_SUCCESS;                                                   \
            return kbit::cuda_status(kbit::bnb4::launch_dequantize<TAG, FMT>(                   \
                                         packed, absmax, n, blocksize, output, stream),         \
                                     "cdequantize_" #FNAME "_" #TNAME);                        \
        });                                                                                    \
    }                                                                                          \
    KBIT_API kbit_status cdequantize_##FNAME##_dq_##TNAME(                                     \
        const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,                   \
        const float *code, const float *offset, int64_t n, int blocksize, void *output,        \
        kbit_stream_t stream) {                                                                \
        return kbit::guarded([&] {                                                             \
            KBIT_TRY(kbit::bnb4::check_dequantize_dq(packed, qabsmax, absmax2, code, offset,   \
                                                     n, blocksize, output,                     \
                                                     sizeof(TAG::storage)));                   \
            if (n == 0) return KBIT_SUCCESS;                                                   \
            return kbit::cuda_status(kbit::bnb4::launch_dequantize_dq<TAG, FMT>(                \
                                         packed, qabsmax, absmax2, code, offset, n,            \
                                         blocksize, output, stream),                           \
                                     "cdequantize_" #FNAME "_dq_" #TNAME);                     \
        });                                                                                    \
    }
KBIT_FOR_EACH_NF4_INSTANCE
#undef KBIT_NF4_INSTANCE

KBIT_API kbit_status kbit_nf4_absmax_mean(const float *absmax, int64_t count, float *mean,
                                          kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_n(count));
        if (count == 0) return KBIT_SUCCESS;
        KBIT_TRY(kbit::check_ptr(absmax, "absmax", 4));
        KBIT_TRY(kbit::check_ptr(mean, "mean", 4));
        return kbit::cuda_status(kbit::bnb4::launch_absmax_mean(absmax, count, mean, stream),
                                 "kbit_nf4_absmax_mean");
    });
}

KBIT_API kbit_status kbit_nf4_quantize_absmax(const float *absmax, int64_t count,
                                              const float *code, const float *offset,
                                              uint8_t *qabsmax, float *absmax2,
                                              kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_n(count));
        if (count == 0) return KBIT_SUCCESS;
        KBIT_TRY(kbit::check_ptr(absmax, "absmax", 4));
        KBIT_TRY(kbit::bnb4::check_dq_state(qabsmax, absmax2, code, offset));
        return kbit::cuda_status(kbit::bnb4::launch_quantize_absmax(absmax, count, code, offset,
                                                                    qabsmax, absmax2, stream),
                                 "kbit_nf4_quantize_absmax");
    });
}

KBIT_API kbit_status kbit_nf4_dequantize_absmax(const uint8_t *qabsmax, const float *absmax2,
                                                const float *code, const float *offset,
                                                int64_t count, float *absmax,
                                                kbit_stream_t stream) {
    return kbit::guarded([&] {
        KBIT_TRY(kbit::check_n(count));
        if (count == 0) return KBIT_SUCCESS;
        KBIT_TRY(kbit::bnb4::check_dq_state(qabsmax, absmax2, code, offset));
        KBIT_TRY(kbit::check_ptr(absmax, "absmax", 4));
        return kbit::cuda_status(kbit::bnb4::launch_dequantize_absmax(qabsmax, absmax2, code,
                                                                      offset, count, absmax,
                                                                      stream),
                                 "kbit_nf4_dequantize_absmax");
    });
}

}  // extern "C"
