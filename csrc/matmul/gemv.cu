// Fused dequantize + matmul on the GPU (SPEC section 6): y = x · Wᵀ (+ bias) with W read
// as stored, for m = 1..8 rows of x per pass (more rows take more passes).
//
// Tensor-core path (kbit K = 2..5, NF4, FP4; fp16 / bf16 x). A CTA of 8 warps owns 16
// rows of W and up to 8 rows of x; its warps split k_in in chunks of 32 elements (one
// kbit block; NF4/FP4 scales are per 32 or more). Per chunk, lane (g, t) of a warp (g =
// lane / 4, t = lane % 4) decodes elements 8t .. 8t+7 of W rows g and g+8 into four
// fp16/bf16 pairs each, loads the same 8 elements of x row g with one 16-byte load, and
// the warp issues two mma.sync m16n8k16 (fp32 accumulators, fresh per chunk), so the
// chunk's scale multiplies the chunk's sums in fp32: 4 FFMA per lane per chunk. The k
// order inside the mma does not matter as long as W and x agree, which lets each lane
// keep its 8 elements contiguous (one 16-byte x load, natural half2 pairs of x).
//
// Decoding is a table lookup of pairs: an element pair's codes (2K bits) index a table
// of half2 values (the codebook over its largest |entry|, so that any finite codebook
// fits fp16), replicated once per lane of a shared-memory phase so that the 32 lookups
// of a warp never share a bank. For kbit, the pair index comes from the bit planes by a
// 4x4 transpose of 2-bit fields (two delta swaps); for NF4/FP4 it is the packed byte.
// Per 8 elements and row: 3 byte permutes + 8 ALU for kbit, 4 table reads, 4 address
// computations. bench/RESULTS.md has the counts and the measurements.
//
// Generic path (every format and dtype, fp32 x, GGUF, misaligned operands): one warp
// per row of W, lanes over 8-element groups decoded by the format's own decoder
// (csrc/formats/), float32 FMAs for every row of x. It is the GPU twin of the host loop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/matmul.h"

namespace kbit {
namespace matmul {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 16;  // rows of W per CTA (the mma's M)
constexpr int kMaxM = 8;       // rows of x per pass (the mma's N)
constexpr int kChunk = 32;     // elements of k per mma pair
constexpr int kUnroll = 4;     // chunks per warp whose loads are issued together

// ---- tensor-core helpers ------------------------------------------------------------------

// D = A · B + C for one m16n8k16 tile with fp32 accumulators; A, B as packed pairs of T.
__device__ __forceinline__ void mma_16816(F16, float (&d)[4], const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(BF16, float (&d)[4], const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The pair table: entry e at word e * kCopies + (lane % kCopies), so that the lanes of a
// warp read distinct banks (kCopies = 32) or at most two lanes share one (16).
template <int kEntries>
constexpr int table_copies() { return kEntries > 256 ? 16 : 32; }

// Fills entries [0, kEntries) of the table with value(e), every copy, 16 bytes a store.
template <int kEntries, class Value>
__device__ void fill_table(uint32_t *table, Value &&value) {
    constexpr int copies = table_copies<kEntries>();
    for (int e = threadIdx.x; e < kEntries; e += kThreads) {
        const uint32_t v = value(e);
        uint4 *row = reinterpret_cast<uint4 *>(table + e * copies);
#pragma unroll
        for (int c = 0; c < copies / 4; ++c) row[c] = make_uint4(v, v, v, v);
    }
}

// ---- pair decoders: 8 elements of one row and chunk -> 4 pairs of T ------------------------
//
// load(chunk) reads what a lane needs of a chunk (issued early); scale(raw) is the
// chunk's float32 factor; pairs(raw, t, table) gives elements (8t + 2q, 8t + 2q + 1) as
// pair q, the lower element in the low half.

// kbit: K bit-plane words per chunk and one scale.
template <class T, int K, kbit_absmax_format FMT, bool kVecWords>
struct KbitPairs {
    static constexpr int kEntries = 1 << (2 * K);
    static constexpr bool kUsesCodebook = true;
    const uint32_t *__restrict__ packed;
    const void *__restrict__ absmax;
    float scale_mul;  // tensor_scale times the codebook's largest |entry|

    struct Raw {
        uint32_t w[K];
        uint32_t s;
    };

    __device__ __forceinline__ Raw load(int64_t c, int) const {
        Raw r;
        const uint32_t *p = packed + c * K;
        if constexpr (kVecWords && K == 4) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
            r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
        } else if constexpr (kVecWords && K == 2) {
            const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
            r.w[0] = v.x, r.w[1] = v.y;
        } else {
#pragma unroll
            for (int j = 0; j < K; ++j) r.w[j] = __ldg(p + j);
        }
        if (FMT == KBIT_ABSMAX_E4M4) r.s = __ldg(static_cast<const uint8_t *>(absmax) + c);
        else if (FMT == KBIT_ABSMAX_FP16) r.s = __ldg(static_cast<const uint16_t *>(absmax) + c);
        else r.s = __ldg(static_cast<const uint32_t *>(absmax) + c);
        return r;
    }

    __device__ __forceinline__ float scale(const Raw &r) const {
        return decode_scale(FMT, r.s) * scale_mul;
    }

    // Byte t of planes 0..3 side by side (Q), transposed as a 4x4 matrix of 2-bit
    // fields: byte q of the result holds bits 2q, 2q+1 of every plane, i.e. the codes of
    // pair q interleaved (bit 2j: element 2q's bit j; bit 2j+1: element 2q+1's).
    __device__ __forceinline__ void pairs(const Raw &r, int t, const uint32_t *table,
                                          uint32_t (&p)[4]) const {
        constexpr int copies = table_copies<kEntries>();
        const uint32_t sel = static_cast<uint32_t>(t) | static_cast<uint32_t>(t + 4) << 4;
        const uint32_t lo = __byte_perm(r.w[0], r.w[1], sel);
        const uint32_t hi = K >= 3 ? __byte_perm(r.w[2], K >= 4 ? r.w[3] : 0u, sel) : 0u;
        uint32_t q = __byte_perm(lo, hi, 0x5410);
        uint32_t d = ((q >> 12) ^ q) & 0x0000F0F0u;  // swap the off-diagonal 2x2 blocks
        q ^= d ^ (d << 12);
        d = ((q >> 6) ^ q) & 0x00CC00CCu;            // swap inside the 2x2 blocks
        q ^= d ^ (d << 6);
        uint32_t fifth = 0;                          // K = 5: plane 4's byte t
        if constexpr (K == 5) fifth = r.w[4] >> (8 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t idx = (q >> (8 * i)) & 0xFFu;
            if constexpr (K == 5) idx |= ((fifth >> (2 * i)) & 3u) << 8;
            p[i] = table[idx * copies];
        }
    }

    // Entry e: the codebook values (over their largest |entry|) of the two codes whose
    // bits e interleaves.
    __device__ static uint32_t entry(int e, const float *cb, float inv_max) {
        int a = 0, b = 0;
#pragma unroll
        for (int j = 0; j < K; ++j) {
            a |= ((e >> (2 * j)) & 1) << j;
            b |= ((e >> (2 * j + 1)) & 1) << j;
        }
        return pack2(T{}, cb[a] * inv_max, cb[b] * inv_max);
    }
};

// NF4 / FP4: 16 packed bytes per chunk (byte i: element 2i high nibble, 2i+1 low), one
// float32 scale per blocksize >= 32 elements.
template <class T, class Fmt>
struct Bnb4Pairs {
    static constexpr int kEntries = 256;
    static constexpr bool kUsesCodebook = false;
    const uint8_t *__restrict__ packed;
    const float *__restrict__ absmax;
    int log2_chunks_per_block;  // log2(blocksize / 32)

    struct Raw {
        uint32_t w;  // the lane's 4 bytes
        float s;
    };

    __device__ __forceinline__ Raw load(int64_t c, int t) const {
        return {__ldg(reinterpret_cast<const uint32_t *>(packed + c * 16) + t),
                __ldg(absmax + (c >> log2_chunks_per_block))};
    }
    __device__ __forceinline__ float scale(const Raw &r) const { return r.s; }
    __device__ __forceinline__ void pairs(const Raw &r, int, const uint32_t *table,
                                          uint32_t (&p)[4]) const {
        constexpr int copies = table_copies<kEntries>();
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = table[((r.w >> (8 * i)) & 0xFFu) * copies];
    }
    __device__ static uint32_t entry(int e) {
        return pack2(T{}, bnb4::table_value(Fmt{}, e >> 4), bnb4::table_value(Fmt{}, e & 15));
    }
};

// ---- the tensor-core kernel ------------------------------------------------------------------

template <class T, class Dec>
__global__ void __launch_bounds__(kThreads)
gemv_mma_kernel(Dec dec, const float *__restrict__ codebook, int k,
                const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                int64_t n_out, const typename T::storage *__restrict__ bias,
                typename T::storage *__restrict__ y) {
    extern __shared__ uint4 smem_table[];
    uint32_t *table = reinterpret_cast<uint32_t *>(smem_table);
    __shared__ float partial[kWarps][kTileRows][kMaxM];
    __shared__ float book_max;

    constexpr int copies = table_copies<Dec::kEntries>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    // The pair table. kbit: entries over the codebook's largest |entry| (1 if all zero).
    if constexpr (!Dec::kUsesCodebook) {
        fill_table<Dec::kEntries>(table, [](int e) { return Dec::entry(e); });
    } else {
        const float *cb = codebook ? codebook : g_normal_float.v[k - 2];
        if (warp == 0) {
            const float a = lane < (1 << k) ? fabsf(cb[lane]) : 0.0f;
            const unsigned mx = __reduce_max_sync(kFull, __float_as_uint(a));
            if (lane == 0) book_max = mx ? __uint_as_float(mx) : 1.0f;
        }
        __syncthreads();
        const float inv_max = 1.0f / book_max;
        dec.scale_mul *= book_max;
        fill_table<Dec::kEntries>(table, [&](int e) { return Dec::entry(e, cb, inv_max); });
    }
    __syncthreads();

    const int64_t chunks = k_in / kChunk;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
    const int64_t row_a = min(r0 + g, n_out - 1), row_b = min(r0 + g + 8, n_out - 1);
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kMaxM;
    const bool has_x = m0 + g < m;
    const uint4 *xrow = reinterpret_cast<const uint4 *>(x + (m0 + g) * k_in) + t;
    const uint32_t *my_table = table + lane % copies;

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t j0 = warp; j0 < chunks; j0 += kWarps * kUnroll) {
        typename Dec::Raw wa[kUnroll], wb[kUnroll];
        uint4 xv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const int64_t j = j0 + u * kWarps;
            if (j < chunks) {
                wa[u] = dec.load(row_a * chunks + j, t);
                wb[u] = dec.load(row_b * chunks + j, t);
                xv[u] = has_x ? __ldg(xrow + j * (kChunk / 8)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            if (j0 + u * kWarps >= chunks) break;
            uint32_t pa[4], pb[4];
            dec.pairs(wa[u], t, my_table, pa);
            dec.pairs(wb[u], t, my_table, pb);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_16816(T{}, c, {pa[0], pb[0], pa[1], pb[1]}, xv[u].x, xv[u].y);
            mma_16816(T{}, c, {pa[2], pb[2], pa[3], pb[3]}, xv[u].z, xv[u].w);
            const float sa = dec.scale(wa[u]), sb = dec.scale(wb[u]);
            acc[0] = fmaf(sa, c[0], acc[0]);
            acc[1] = fmaf(sa, c[1], acc[1]);
            acc[2] = fmaf(sb, c[2], acc[2]);
            acc[3] = fmaf(sb, c[3], acc[3]);
        }
    }

    // The warps' partial sums, added in a fixed order; then bias, one rounding, y.
    partial[warp][g][2 * t] = acc[0];
    partial[warp][g][2 * t + 1] = acc[1];
    partial[warp][g + 8][2 * t] = acc[2];
    partial[warp][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    if (threadIdx.x < kTileRows * kMaxM) {
        const int row = threadIdx.x / kMaxM, col = threadIdx.x % kMaxM;
        const int64_t r = r0 + row, i = m0 + col;
        if (r < n_out && i < m) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) v += partial[w][row][col];
            if (bias) v += load_f32(T{}, bias[r]);
            y[i * n_out + r] = store_cast(T{}, v);
        }
    }
}

// Dynamic shared memory of a tensor-core kernel instance, raised above 48 KB once per
// device where needed.
template <class T, class Dec>
cudaError_t launch_mma(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                       int64_t k_in, int64_t n_out, const void *bias, void *y,
                       cudaStream_t stream) {
    constexpr size_t smem = sizeof(uint32_t) * Dec::kEntries * table_copies<Dec::kEntries>();
    auto kernel = gemv_mma_kernel<T, Dec>;
    if constexpr (smem > 48 * 1024) {
        constexpr int kMaxDevices = 64;
        static std::atomic<bool> raised[kMaxDevices];
        int dev = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err != cudaSuccess) return err;
        if (dev >= kMaxDevices || !raised[dev].load(std::memory_order_relaxed)) {
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
            if (err != cudaSuccess) return err;
            if (dev < kMaxDevices) raised[dev].store(true, std::memory_order_relaxed);
        }
    }
    cudaGetLastError();
    using S = typename T::storage;
    const dim3 grid(static_cast<unsigned>(blocks_of(n_out, kTileRows)),
                    static_cast<unsigned>(blocks_of(m, kMaxM)));
    kernel<<<grid, kThreads, smem, stream>>>(dec, codebook, k, static_cast<const S *>(x), m, k_in,
                                              n_out, static_cast<const S *>(bias),
                                              static_cast<S *>(y));
    return launch_error();
}

// ---- the generic kernel ------------------------------------------------------------------------
//
// values(e0, w): elements e0 .. e0+7 of W taken flat (e0 a multiple of 8, never across a
// block), exactly as the format's dequantize computes them in float32.

struct KbitValues {
    const uint32_t *packed;
    const void *absmax;
    kbit_absmax_format fmt;
    float ts;
    const float *cb;
    int k;
    __device__ void operator()(int64_t e0, float (&w)[8]) const {
        const int64_t b = e0 / kBlock;
        const float d = mul_rn(decode_absmax(fmt, absmax, b), ts);
        const uint32_t *words = packed + b * k;
        const int i0 = static_cast<int>(e0 % kBlock);
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = mul_rn(cb[bitplane_code(words, k, i0 + i)], d);
    }
};

template <class Fmt>
struct Bnb4Values {
    const uint8_t *packed;
    const float *absmax;
    int log2_blocksize;
    __device__ void operator()(int64_t e0, float (&w)[8]) const {
        const float a = absmax[e0 >> log2_blocksize];
#pragma unroll
        for (int i = 0; i < 8; ++i)
            w[i] = bnb4::bnb_mul(bnb4::table_value(Fmt{}, bnb4::element_code(packed, e0 + i)), a);
    }
};

template <class Fmt>
struct GgufValues {
    const uint8_t *blocks;
    __device__ void operator()(int64_t e0, float (&w)[8]) const {
        const int64_t b = e0 / Fmt::kElems;
        Fmt::template group<8>(gguf::DeviceLoader<0>{blocks + b * Fmt::kBytes},
                               static_cast<int>(e0 % Fmt::kElems), w);
    }
};

// One warp per row of W; lane l takes 8-element groups l, l + 32, ...; every row of x.
template <class T, class Values>
__global__ void __launch_bounds__(kThreads)
gemv_generic_kernel(Values values, const typename T::storage *__restrict__ x, int64_t m,
                    int64_t k_in, int64_t n_out, const typename T::storage *__restrict__ bias,
                    typename T::storage *__restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (r >= n_out) return;
    for (int64_t m0 = 0; m0 < m; m0 += kMaxM) {
        const int rows = static_cast<int>(m - m0 < kMaxM ? m - m0 : kMaxM);
        float acc[kMaxM] = {};
        for (int64_t e = 8 * lane; e < k_in; e += 8 * 32) {
            float w[8];
            values(r * k_in + e, w);
#pragma unroll
            for (int i = 0; i < kMaxM; ++i) {
                if (i >= rows) break;
                const typename T::storage *xi = x + (m0 + i) * k_in + e;
#pragma unroll
                for (int q = 0; q < 8; ++q) acc[i] = fmaf(load_f32(T{}, xi[q]), w[q], acc[i]);
            }
        }
        for (int i = 0; i < rows; ++i) {
            float v = acc[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
            if (lane == 0) {
                if (bias) v += load_f32(T{}, bias[r]);
                y[(m0 + i) * n_out + r] = store_cast(T{}, v);
            }
        }
    }
}

template <class Values>
cudaError_t launch_generic(const Values &values, kbit_dtype dtype, const void *x, int64_t m,
                           int64_t k_in, int64_t n_out, const void *bias, void *y,
                           cudaStream_t stream) {
    cudaGetLastError();
    const unsigned grid = static_cast<unsigned>(blocks_of(n_out, kWarps));
    with_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        using S = typename T::storage;
        gemv_generic_kernel<T><<<grid, kThreads, 0, stream>>>(
            values, static_cast<const S *>(x), m, k_in, n_out, static_cast<const S *>(bias),
            static_cast<S *>(y));
        return KBIT_SUCCESS;
    });
    return launch_error();
}

// ---- entries -------------------------------------------------------------------------------------

// kbit on tensor cores: K-word loads as wide as the alignment of `packed` allows.
template <class T, int K, kbit_absmax_format F>
cudaError_t launch_kbit_mma(const uint32_t *packed, const void *absmax, float ts,
                            const float *codebook, const void *x, int64_t m, int64_t k_in,
                            int64_t n_out, const void *bias, void *y, cudaStream_t stream) {
    if constexpr (std::is_same_v<T, F32>) {
        return cudaErrorInvalidValue;  // fp32 x takes the generic path
    } else {
        const bool vec = (K == 2 || K == 4) &&
                         reinterpret_cast<uintptr_t>(packed) % (K == 4 ? 16 : 8) == 0;
        if (vec)
            return launch_mma<T>(KbitPairs<T, K, F, true>{packed, absmax, ts}, codebook, K, x, m,
                                 k_in, n_out, bias, y, stream);
        return launch_mma<T>(KbitPairs<T, K, F, false>{packed, absmax, ts}, codebook, K, x, m,
                             k_in, n_out, bias, y, stream);
    }
}

bool aligned(const void *p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// The tensor-core path takes fp16/bf16 x on 16-byte boundaries.
bool mma_ok(kbit_dtype dtype, const void *x) {
    return dtype != KBIT_DTYPE_FP32 && aligned(x, 16);
}

kbit_status check_workspace(const void *workspace, size_t workspace_bytes) {
    if (workspace == nullptr && workspace_bytes != 0)
        return fail(KBIT_ERROR_NULL_POINTER, "workspace is NULL but workspace_bytes is %zu",
                    workspace_bytes);
    return KBIT_SUCCESS;
}

kbit_status kbit_entry(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                       const uint32_t *packed, const void *absmax, kbit_absmax_format fmt,
                       float ts, const float *codebook, int k, const void *bias, void *y,
                       void *workspace, size_t workspace_bytes, kbit_stream_t stream) {
    KBIT_TRY(check_matmul_kbit(x, m, k_in, n_out, dtype, packed, absmax, fmt, ts, codebook, k,
                               bias, y));
    KBIT_TRY(check_workspace(workspace, workspace_bytes));
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    cudaError_t err = cudaSuccess;
    if (mma_ok(dtype, x)) {
        with_dtype(dtype, [&](auto tag) {
            return with_k(k, [&](auto kc) {
                with_format(fmt, [&](auto f) {
                    err = launch_kbit_mma<decltype(tag), kc.value, decltype(f)::value>(
                        packed, absmax, ts, codebook, x, m, k_in, n_out, bias, y, stream);
                });
                return KBIT_SUCCESS;
            });
        });
    } else {
        const float *cb = codebook;
        if (!cb) {
            void *book = nullptr;
            err = cudaGetSymbolAddress(&book, g_normal_float);
            if (err != cudaSuccess) return cuda_status(err, "kbit_matmul_kbit");
            cb = static_cast<const DeviceCodebooks *>(book)->v[k - 2];
        }
        err = launch_generic(KbitValues{packed, absmax, fmt, ts, cb, k}, dtype, x, m, k_in, n_out,
                             bias, y, stream);
    }
    return cuda_status(err, "kbit_matmul_kbit launch");
}

template <class Fmt>
kbit_status bnb4_entry(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                       const uint8_t *packed, const float *absmax, int blocksize,
                       const void *bias, void *y, void *workspace, size_t workspace_bytes,
                       kbit_stream_t stream) {
    KBIT_TRY(check_matmul_bnb4(x, m, k_in, n_out, dtype, packed, absmax, blocksize, bias, y));
    KBIT_TRY(check_workspace(workspace, workspace_bytes));
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    const int log2_bs = bnb4::log2_of(blocksize);
    cudaError_t err = cudaSuccess;
    if (mma_ok(dtype, x) && aligned(packed, 4)) {
        with_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, F32>)
                err = launch_mma<T>(Bnb4Pairs<T, Fmt>{packed, absmax, log2_bs - 5}, nullptr, 4,
                                    x, m, k_in, n_out, bias, y, stream);
            return KBIT_SUCCESS;
        });
    } else {
        err = launch_generic(Bnb4Values<Fmt>{packed, absmax, log2_bs}, dtype, x, m, k_in, n_out,
                             bias, y, stream);
    }
    return cuda_status(err, "NF4/FP4 matmul launch");
}

kbit_status gguf_entry(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                       int ggml_type, const void *blocks, const void *bias, void *y,
                       void *workspace, size_t workspace_bytes, kbit_stream_t stream) {
    return check_matmul_gguf(x, m, k_in, n_out, dtype, ggml_type, blocks, bias, y, [&](auto fmt) {
        using Fmt = decltype(fmt);
        KBIT_TRY(check_workspace(workspace, workspace_bytes));
        if (m == 0 || n_out == 0) return KBIT_SUCCESS;
        return cuda_status(
            launch_generic(GgufValues<Fmt>{static_cast<const uint8_t *>(blocks)}, dtype, x, m,
                           k_in, n_out, bias, y, stream),
            "GGUF matmul launch");
    });
}

}  // namespace
}  // namespace matmul
}  // namespace kbit

KBIT_MATMUL_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
