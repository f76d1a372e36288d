// The wgmma GEMM for Hopper (sm_90a): y = x · Wᵀ for kbit (stored and tiled), NF4 and
// FP4 weights, W decoded on its way from memory to the tensor cores, never written back.
//
// A CTA of two warpgroups owns 128 rows of W (64 a warpgroup: the wgmma's M) and BN rows
// of x (the wgmma's N: 32, 64, 128 or 256) and walks k in stages of 64 elements (two
// 32-element chunks, one 128-byte row of a swizzled tile):
//   1. cp.async brings each stage's x tile, already in the wgmma's layout (K-major rows of
//      128 bytes, 16-byte unit u of row r at u ^ (r % 8)), and the raw bytes of its W
//      rows with their scale windows into a ring of R slots;
//   2. the CTA decodes stage s + 1 of W into a tile of the same layout: the pair tables of
//      decoders.cuh, then one packed multiply a pair by the block's scale, so that W
//      reaches the tensor cores as codebook value times block scale in fp16 / bf16;
//   3. meanwhile the tensor cores multiply stage s: each warpgroup issues 4 asynchronous
//      wgmma m64nBNk16, W as A and x as B, both from shared memory, into fp32
//      accumulators that live across the whole k loop. Decoding and multiplying overlap.
// What the whole weight shares (tensor_scale times the codebook's largest |entry|, over
// the scale format's fixed power of two) multiplies the sums once, at the output. E4M4
// scales (at most 31) are taken times 2^8 so that the smallest products stay normal
// fp16; fp16 scales fit as they are; with fp16 x, fp32 scales (kbit) go to the mma.sync
// GEMM instead (gemv.cu), NF4 / FP4's as bitsandbytes rounds them, to fp16.
//
// Split k, tiles and the raster follow gemm.cuh (formats/matmul.h: gemm90_plan).
//
// Below it, the streamed GEMM of m = 8..64 (stream90_kernel) for stored kbit and NF4 / FP4,
// bound by W's bytes rather than the tensor cores: the GEMV's decode in registers as the
// wgmma's A operand; and the tiled GEMM (tiled_gemm90_kernel), which serves tiled kbit
// weights (kbit.matmul's, NF4 / FP4 ones once tiled) at every m from 9: the same decode,
// its codes gathered in the wgmma's order of k, so that x goes from the TMA to the
// tensor cores untouched. Last, the GGUF GEMM (gguf_gemm90_kernel): the tiled GEMM's CTA
// reading GGUF blocks as the file stores them, from a few rows of x to prefill.
#include "gemm_sm90.h"

#include "decoders.cuh"

#if KBIT_SM90A
#include "wgmma.cuh"
#endif

namespace kbit {
namespace matmul {
namespace sm90 {
namespace {

#if KBIT_SM90A

constexpr int kThreads90 = 256;             // two warpgroups
constexpr int kRows = kGemmRows;            // rows of W a CTA: 64 a warpgroup
constexpr int kBK = kGemmStageK;            // k of a stage: 64 elements, 128 bytes
constexpr int kRowBytes = kBK * 2;
constexpr int kTileBytes = kRows * kRowBytes;  // a decoded W tile (16 KB)
constexpr int kSmem = 227 * 1024;            // a CTA's most dynamic shared memory
constexpr int kMaxRing = 8;

using gemm::kStored;
using gemm::kTiled;

template <int BN> struct NTag;
template <> struct NTag<16> { using type = N16; };
template <> struct NTag<32> { using type = N32; };
template <> struct NTag<64> { using type = N64; };
template <> struct NTag<128> { using type = N128; };
template <> struct NTag<256> { using type = N256; };

// Byte offset of 16-byte unit u of row r in a tile of 128-byte rows, 128-byte swizzle.
__device__ __forceinline__ uint32_t swizzled(int r, int u) {
    return static_cast<uint32_t>(r * kRowBytes + ((u ^ (r & 7)) << 4));
}

// The matrix descriptor of such a tile (1024-byte aligned, K-major): start address,
// leading offset 1 (unused by this layout), 8-row groups 1024 bytes apart, 128-byte swizzle.
constexpr uint64_t kDescHi = uint64_t{64u | (1u << 30)} << 32;
__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
    return kDescHi | (addr >> 4) | (1u << 16);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N of this warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Stores of this thread to shared memory become visible to the tensor cores (the async
// proxy) after the next barrier.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The accumulators are written by the asynchronous wgmma: no access may move across.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A value the compiler may not rebuild from the thread index: it stays in its register
// across the k loop (else the per-stage copies recompute their addresses every stage).
__device__ __forceinline__ uint32_t pinned(uint32_t v) {
    asm volatile("" : "+r"(v));
    return v;
}
__device__ __forceinline__ int64_t pinned(int64_t v) {
    asm volatile("" : "+l"(v));
    return v;
}
__device__ __forceinline__ const uint8_t *pinned(const uint8_t *p) {
    asm volatile("" : "+l"(p));
    return p;
}

// E4M4 block scales (at most 31) are taken times 2^8 on the way to the tensor cores, so
// that the smallest products with codebook values stay normal fp16; fp16 and fp32 scales
// as they are. What the whole kbit weight shares (tensor_scale times the codebook's
// largest |entry|, `book`, over that shift) multiplies the sums at the output.
constexpr float kE4M4Shift = 256.0f;
__device__ __forceinline__ float scale_shift(int sb) { return sb == 1 ? kE4M4Shift : 1.0f; }
template <class Dec>
__device__ __forceinline__ float kbit_out_mul(const Dec &dec, float book) {
    return dec.scale_mul * book / scale_shift(dec.sb);
}

// Four pairs of T times one factor (rounded to T first).
template <class T>
__device__ __forceinline__ void scale_pairs(T, uint32_t (&p)[4], float f) {
    const uint32_t s = splat<T>(f);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = hmul2<T>(p[i], s);
}

// y from a CTA's accumulators (two warpgroups of m64nNk16: acc[4 j + e] of lane (g, t)
// of warp w is W row n0 + 16 w + g (+ 8 for e >= 2), x row m0 + 8 j + 2 t (+ 1 for odd e))
// times out_mul, plus bias; through the split reduction where k was split (the CTA's first
// 256 threads, meeting through sync).
template <class T, int kAcc, class Sync = gemm::BlockSync>
__device__ __forceinline__ void epilogue(const float (&acc)[kAcc], int64_t tile, int64_t n0,
                                         int64_t m0, int64_t m, int64_t n_out, float out_mul,
                                         const typename T::storage *__restrict__ bias,
                                         typename T::storage *__restrict__ y, int split, int splits,
                                         float *partials, unsigned *counters, Sync sync = {}) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t w_base = n0 + 16 * warp + (lane >> 2), x_base = m0 + 2 * (lane & 3);
    auto store = [&](int i, float v) {
        const int64_t wr = w_base + 8 * ((i >> 1) & 1), xr = x_base + 8 * (i >> 2) + (i & 1);
        if (wr < n_out && xr < m) store_y<T>(y, bias, xr, wr, n_out, v * out_mul);
    };
    if (splits == 1) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) store(i, acc[i]);
        return;
    }
    gemm::reduce_splits<kAcc, kThreads90>(acc, tile, split, splits, partials, counters, store, sync);
}

// Shared memory, 1024-byte aligned: [x ring: R x BN rows][kTiles decoded W tiles][raw ring:
// R x (W rows | scale windows, 16 bytes a row)][pair table][the stage's 128 x 2 scales].
// Two stages multiply while a third is decoded, so the ring needs four slots or more: the
// pair table keeps its usual copies where that fits, else half as many (two lanes a bank
// at most); a BN for which neither fits is not built (the launcher takes 128 instead).
constexpr int kTiles = 3;
template <class Dec>
constexpr int raw_row_bytes() { return (2 * Dec::kChunkBytes + 15) / 16 * 16; }
template <class Dec>
constexpr int raw_bytes() { return kRows * (raw_row_bytes<Dec>() + 16); }
template <class Dec, int BN, int kCopies>
struct Layout {
    static constexpr int kTable = table_bytes<Dec, kCopies>();
    static constexpr int kFixed = 1024 + kTiles * kTileBytes + kTable + kRows * 2 * 4;
    static constexpr int kSlot = BN * kRowBytes + raw_bytes<Dec>();
    static constexpr int kFit = (kSmem - kFixed) / kSlot;
    static constexpr int kRing = kFit < kMaxRing ? kFit : kMaxRing;
};
template <class Dec, int BN>
struct Config {
    static constexpr int kFull = table_copies<Dec::kEntries>();
    static constexpr int kCopies = Layout<Dec, BN, kFull>::kRing >= 4 ? kFull : kFull / 2;
    using L = Layout<Dec, BN, kCopies>;
    static constexpr int kRing = L::kRing;
    static constexpr bool kBuilt = kRing >= 4;
};
template <class Dec, int BN>
constexpr int smem_bytes() {
    using C = Config<Dec, BN>;
    return C::L::kFixed + C::kRing * C::L::kSlot;
}

template <class T, class Dec, int kSrc, int BN, int kWUnit>
__global__ void __launch_bounds__(kThreads90, 1)
gemm90_kernel(Dec dec, const float *__restrict__ codebook, int k,
              const typename T::storage *__restrict__ x, int64_t m, int64_t k_in, int64_t n_out,
              const typename T::storage *__restrict__ bias, typename T::storage *__restrict__ y,
              int splits, float *__restrict__ partials, unsigned *__restrict__ counters) {
    using C = Config<Dec, BN>;
    constexpr int R = C::kRing;
    static_assert(C::kBuilt, "the ring needs four slots");
    constexpr int kRawRow = raw_row_bytes<Dec>();
    constexpr int kRaw = raw_bytes<Dec>();
    constexpr int kXBytes = BN * kRowBytes;
    constexpr int kAcc = BN / 2;
    // (pointers derived from smem_raw by arithmetic alone: the compiler keeps them in the
    // shared address space, 32-bit addresses and LDS / STS)
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
    uint8_t *xring = base;
    uint8_t *wtile = xring + R * kXBytes;
    uint8_t *rawring = wtile + kTiles * kTileBytes;
    uint32_t *table = reinterpret_cast<uint32_t *>(rawring + R * kRaw);
    float *wscale = reinterpret_cast<float *>(reinterpret_cast<uint8_t *>(table) + C::L::kTable);
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7;

    // The pair table; what the whole weight shares goes to the output.
    float out_mul = 1.0f;
    const float book = fill_pair_table<Dec, C::kCopies>(table, codebook, k);
    if constexpr (Dec::kUsesCodebook) {
        out_mul = kbit_out_mul(dec, book);
        dec.scale_mul = scale_shift(dec.sb);
    }
    const auto my_table = lane_table<C::kCopies>(table);

    const int64_t chunks = k_in / kChunk;
    const int64_t stages = (chunks + 1) / 2;
    const int64_t tile = blockIdx.x;
    const gemm::TileOrigin origin = gemm::tile_origin(tile, m, n_out, BN);
    const int64_t n0 = origin.n0, m0 = origin.m0;
    const int split = blockIdx.y;
    const int64_t s_begin = stages * split / splits, s_end = stages * (split + 1) / splits;
    const int m_rows = static_cast<int>(m - m0 < BN ? m - m0 : BN);
    const auto *xb = reinterpret_cast<const uint8_t *>(x);

    // What each thread copies of every stage, fixed for the kernel (only a stage offset
    // shared by all threads moves), pinned in registers: x units (row u / 8, 16-byte unit
    // q = u % 8) into the swizzled tile (rows past m read row 0, zero-filled); stored W
    // rows' 16- or 4-byte units (rows past n_out read row n_out - 1: decoded, never
    // stored); the tiled W half segment of lane 4 (p % 8) + p / 8 to position p of tile
    // j = tid / 32 (so that the 8 threads of a shared-memory phase decode rows g = 0..7
    // of one unit column: conflict-free swizzled stores); 4-byte scale words.
    const uint32_t x_slot0 = smem_address(xring), raw_slot0 = smem_address(rawring);
    constexpr int kXCopies = BN * 8 / kThreads90;
    const uint8_t *x_src[kXCopies];
    uint32_t x_dst[kXCopies], x_bytes[kXCopies];
#pragma unroll
    for (int i = 0; i < kXCopies; ++i) {
        const int u = tid + i * kThreads90, row = u >> 3, q = u & 7;
        x_src[i] = pinned(xb + ((m0 + (row < m_rows ? row : 0)) * k_in) * 2 + q * 16);
        x_dst[i] = pinned(swizzled(row, q));
        x_bytes[i] = pinned(row < m_rows ? 16u : 0u);
    }
    const bool x_second = (tid & 7) >= 4;  // this thread's x units hold the stage's second chunk
    constexpr int kWUnits = kSrc == kStored ? kRawRow / kWUnit : 1;
    constexpr int kWCopies = kSrc == kStored ? (kRows * kWUnits + kThreads90 - 1) / kThreads90 : 1;
    const uint8_t *w_src[kWCopies];
    uint32_t w_dst[kWCopies], w_end[kWCopies];
    if constexpr (kSrc == kStored) {
#pragma unroll
        for (int i = 0; i < kWCopies; ++i) {
            const int u = tid + i * kThreads90, row = u / kWUnits, q = u % kWUnits;
            w_src[i] = pinned(dec.packed + (min(n0 + row, n_out - 1) * chunks) * Dec::kChunkBytes +
                              q * kWUnit);
            w_dst[i] = pinned(static_cast<uint32_t>(row * kRawRow + q * kWUnit));
            // the unit's end within the row's stage (past 2 chunks: no copy)
            w_end[i] = pinned(row < kRows ? static_cast<uint32_t>((q + 1) * kWUnit) : 0xFFFFu);
        }
    } else {
        constexpr int kHalf = 4 * Dec::kK;
        const int tj = tid >> 5, tlane = 4 * (lane & 7) + (lane >> 3);
        const int64_t tl = n0 / 16 + tj;
        w_src[0] = pinned(dec.packed + ((tl < dec.geo.tiles ? tl : 0) * dec.geo.groups * 32 + tlane) *
                                           (2 * kHalf));
        w_dst[0] = pinned(static_cast<uint32_t>(tid * kHalf));
        w_end[0] = pinned(tl < dec.geo.tiles ? 1u : 0u);  // live
    }
    // Scales: the byte offset of a row's first scale of stage s is its own part plus the
    // stage's (stored: chunk index row * chunks + 2 s through the format's offset).
    auto row_part = [&](int64_t r) -> int64_t {
        if constexpr (kSrc == kTiled) return ((r / 16) * dec.geo.groups * 64 + (r % 16) * 4) * dec.sb;
        else return r * chunks;
    };
    auto first_scale = [&](int64_t part, int64_t s) -> int64_t {
        if constexpr (kSrc == kTiled) return part + ((s >> 1) * 64 + (s & 1) * 2) * dec.sb;
        else return dec.scale_offset(part + 2 * s);
    };
    // issue: scale words of rows tid / 4 and tid / 4 + 64 (word tid % 4 of each window);
    // scales(): row tid / 2
    const int64_t s_part[2] = {pinned(row_part(min(n0 + tid / 4, n_out - 1))),
                               pinned(row_part(min(n0 + tid / 4 + 64, n_out - 1)))};
    const int64_t my_part = pinned(row_part(min(n0 + (tid >> 1), n_out - 1)));

    // Issues stage s into ring slot `slot` (one commit group a call, empty past the end);
    // a stage's second chunk past k_in is zero-filled (x) or stale (W: its scale is 0).
    auto issue = [&](int64_t s, int slot) {
        if (s < s_end) {
            const uint32_t xa = x_slot0 + slot * kXBytes;
            const uint32_t raw_a = raw_slot0 + slot * kRaw;
            const bool both = 2 * s + 1 < chunks;
            const int64_t x_off = s * (kBK * 2);
#pragma unroll
            for (int i = 0; i < kXCopies; ++i)
                cp_async16(xa + x_dst[i], x_src[i] + x_off, both || !x_second ? x_bytes[i] : 0);
            if constexpr (kSrc == kTiled) {
                constexpr int kHalf = 4 * Dec::kK;
                gemm::cp_async_bytes<kHalf>(raw_a + w_dst[0],
                                            w_src[0] + (s >> 1) * (64 * kHalf) + (s & 1) * kHalf,
                                            w_end[0] != 0);
            } else {
                const uint32_t limit = (both ? 2 : 1) * Dec::kChunkBytes;
                const int64_t w_off = s * (2 * Dec::kChunkBytes);
#pragma unroll
                for (int i = 0; i < kWCopies; ++i) {
                    if (w_end[i] > limit) continue;
                    if constexpr (kWUnit == 16) cp_async16(raw_a + w_dst[i], w_src[i] + w_off, 16);
                    else cp_async4(raw_a + w_dst[i], w_src[i] + w_off, 4);
                }
            }
            // the 4 words from the one holding a row's first scale of the stage
            const uint32_t scales_a = raw_a + kRows * kRawRow + (tid / 4) * 16 + (tid % 4) * 4;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int64_t off = (first_scale(s_part[i], s) & ~int64_t{3}) + 4 * (tid % 4);
                cp_async4(scales_a + i * 64 * 16, dec.absmax + (off < dec.absmax_bytes ? off : 0),
                          inside(off, dec.absmax_bytes, 4));
            }
        }
        cp_async_commit();
    };

    // The stage's float32 scales, one a thread: row tid / 2, chunk tid % 2 (0 past k_in).
    const uint32_t my_window = static_cast<uint32_t>(kRows * kRawRow + (tid >> 1) * 16);
    auto scales = [&](int64_t s, int slot) {
        const uint8_t *raw = rawring + slot * kRaw;
        const int ch = tid & 1;
        const int64_t first = first_scale(my_part, s);
        int delta;  // of chunk 2 s + ch's scale from chunk 2 s's
        if constexpr (kSrc == kTiled) delta = ch * dec.sb;
        else delta = dec.scale_delta(my_part + 2 * s, ch);
        const float f = dec.scale(raw + my_window + static_cast<int>(first & 3) + delta);
        wscale[tid] = 2 * s + ch < chunks ? f : 0.0f;
    };

    // Decodes stage s into tile buffer `buf`: pairs of T times their block's scale.
    auto decode = [&](int buf, int slot) {
        uint8_t *out = wtile + buf * kTileBytes;
        const uint8_t *raw = rawring + slot * kRaw;
        auto put = [&](int row, int unit, int chunk, uint32_t (&p)[4]) {
            scale_pairs(T{}, p, wscale[row * 2 + chunk]);
            *reinterpret_cast<uint4 *>(out + swizzled(row, unit)) = make_uint4(p[0], p[1], p[2], p[3]);
        };
        if constexpr (kSrc == kTiled) {
            // Lane (g, t) = (lane % 8, lane / 8) of tile j: rows 16 j + g, + 8 of both
            // chunks u, elements 8 t .. 8 t + 7: fields 8 u + 4 h + i of its half segment.
            constexpr int K = Dec::kK;
            uint32_t w[K];
            load_words(raw + tid * 4 * K, w);
            const int j = tid >> 5, g = lane & 7, t = lane >> 3;
            gemm::tiled_pairs(w, my_table, [&](int u, int h, uint32_t (&p)[4]) {
                put(16 * j + g + 8 * h, 4 * u + t, u, p);
            });
        } else {
            // Unit du = tid % 8 (chunk du / 4, elements 8 (du % 4) ..) of rows tid / 8 + 32 j.
            const int du = tid & 7;
#pragma unroll
            for (int j = 0; j < kRows * 8 / kThreads90; ++j) {
                const int row = (tid >> 3) + 32 * j;
                uint32_t p[4];
                dec.pairs(raw + row * kRawRow + (du >> 2) * Dec::kChunkBytes, du & 3, my_table, p);
                put(row, du, du >> 2, p);
            }
        }
        fence_proxy_async();
    };

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

    // A stage's four k16 steps: W rows 64 wg .. of tile buffer buf (A), the x slot (B).
    auto multiply = [&](int buf, int slot) {
        const uint32_t a = smem_address(wtile + buf * kTileBytes + wg * 64 * kRowBytes);
        const uint32_t b = smem_address(xring + slot * kXBytes);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
            wgmma(typename NTag<BN>::type{}, T{}, acc, descriptor(a + 32 * kk), descriptor(b + 32 * kk), 1);
        wgmma_commit();
    };

    // Prologue: R stages in flight; stages s_begin and s_begin + 1 decoded and multiplying.
#pragma unroll 1
    for (int i = 0; i < R; ++i) issue(s_begin + i, i);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (s_begin + i < s_end) {
            if (i == 0) cp_async_wait<R - 1>();
            else cp_async_wait<R - 2>();
            __syncthreads();
            scales(s_begin + i, i);
            __syncthreads();
            decode(i, i);
            __syncthreads();
            multiply(i, i);
        }
    }
    // Stage s + 2 is decoded while stages s and s + 1 multiply; then every warpgroup
    // waits for stage s's wgmma, the CTA meets (slot s and tile s are free, tile s + 2 is
    // written), refills slot s with stage s + R, and multiplies stage s + 2.
    int slot = 0, buf = 0;  // of stage s
    for (int64_t s = s_begin; s < s_end; ++s) {
        const bool decode_next = s + 2 < s_end;
        const int slot2 = slot + 2 < R ? slot + 2 : slot + 2 - R;
        const int buf2 = buf == 0 ? 2 : buf - 1;
        if (decode_next) {
            cp_async_wait<R - 3>();
            __syncthreads();
            scales(s + 2, slot2);
            __syncthreads();
            decode(buf2, slot2);
        }
        wgmma_wait<1>();
        fence_operands(acc);
        __syncthreads();
        issue(s + R, slot);
        if (decode_next) multiply(buf2, slot2);
        slot = slot + 1 == R ? 0 : slot + 1;
        buf = buf == 2 ? 0 : buf + 1;
    }
    wgmma_wait<0>();
    fence_operands(acc);
    cp_async_wait<0>();

    epilogue<T>(acc, tile, n0, m0, m, n_out, out_mul, bias, y, split, splits, partials, counters);
}

// The launch for one decoder and CTA shape.
template <class T, class Dec, int kSrc, int BN, int kWUnit>
cudaError_t launch_bn(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                      int64_t k_in, int64_t n_out, const void *bias, void *y, const GemmPlan &plan,
                      void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    return gemm::launch_gemm<gemm90_kernel<T, Dec, kSrc, BN, kWUnit>, T>(
        kThreads90, smem_bytes<Dec, BN>(), BN, plan, dec, codebook, k, x, m, k_in, n_out, bias, y,
        workspace, workspace_bytes, stream);
}

template <class T, class Dec, int kSrc, int kWUnit>
cudaError_t launch(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                   int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
    GemmPlan plan = gemm90_plan(m, k_in, n_out);
    if (plan.bm == 256 && !Config<Dec, 256>::kBuilt) plan = gemm90_plan(m, k_in, n_out, 128);
    switch (plan.bm) {
#define KBIT_GEMM90_BN(BN)                                                                     \
    case BN:                                                                                   \
        return launch_bn<T, Dec, kSrc, BN, kWUnit>(dec, codebook, k, x, m, k_in, n_out, bias, y, \
                                                   plan, workspace, workspace_bytes, stream);
        KBIT_GEMM90_BN(32)
        KBIT_GEMM90_BN(64)
        KBIT_GEMM90_BN(128)
#undef KBIT_GEMM90_BN
    case 256:
        if constexpr (Config<Dec, 256>::kBuilt)
            return launch_bn<T, Dec, kSrc, 256, kWUnit>(dec, codebook, k, x, m, k_in, n_out, bias,
                                                        y, plan, workspace, workspace_bytes, stream);
    }
    return cudaErrorInvalidValue;
}

template <class T, class Dec>
cudaError_t launch_stored(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                          int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
    return gemm::with_w_unit(dec, k_in, [&](auto unit) {
        return launch<T, Dec, kStored, decltype(unit)::value>(dec, codebook, k, x, m, k_in, n_out,
                                                             bias, y, workspace, workspace_bytes, stream);
    });
}

// ---- the streamed GEMM of small m: A from registers ----------------------------------------
//
// From m = 9 to kStream90MaxM rows of x, a layer still waits on the bytes of W: the
// kernel above, built for prefill (W decoded into shared memory, then read back by the
// wgmma), decodes a weight ~5x slower than the streamed GEMV. This one keeps the GEMV's
// stream and decode and gives the tensor cores its result straight from registers:
//  - the CTA's two warpgroups own 128 rows of W (16 a warp) and all BN = 16, 32 or 64
//    rows of x; a stage is 128 elements of k (four 32-element chunks);
//  - one thread issues each stage as three TMA copies (W's bytes of the stage, their
//    scales, the BN rows of x) on the stage's mbarrier, R stages ahead;
//  - lane (g, t) of warp w decodes rows 16 w + g and + 8, elements 8t .. 8t + 7 of each
//    chunk, as the GEMV does (a pair index from its word, one table read a pair) and
//    multiplies each pair by its block's scale: the 32 pairs are exactly the A fragments
//    of the stage's eight k16 steps of an m64nBNk16 wgmma, which reads them from
//    registers while x comes from shared memory;
//  - x must meet that order of k within a chunk (lane t holds elements 8t .. 8t + 7, not
//    the wgmma's 2t, 2t + 1, 2t + 8, 2t + 9), so the CTA permutes each stage's x once,
//    4-byte pairs into the 128-byte-swizzled tile the descriptor reads, one stage ahead
//    (three such tiles: one barrier a stage is enough);
//  - the A registers come in two halves (chunks 0-1 and 2-3): one half is decoded while
//    the wgmma of the other runs.
// W comes from a source: NF4 / FP4 as bitsandbytes stores them (the stage's 64 bytes of each row: lane t's word of a chunk holds its four pairs,
// a byte each), or kbit as stored (the lane transposes byte t of the chunk's planes).
// Rounding and scale shifts are the kernel above's; split k and the reduction too.
constexpr int kSTiles = kThreads90 / 32;  // row tiles (of 16 rows) of a CTA: one a warp
constexpr int kSMaxRing = 8;
constexpr int kStageK = tiled::kGroupChunks * kChunk;  // 128 elements of k a stage

// The stage's three copies: W and its scales (tiled: 3-d maps, 8-byte elements of a unit
// by chunk groups by row tiles, a box of 8 tiles' units of one group; stored: 2-d maps
// over the packed bytes and the scales, by rows) and x (2-d: k by rows; a box of 128
// elements by BN rows). Past the arrays' ends they read zeros.
struct StreamMaps {
    CUtensorMap w, scales, x;
};

// A row's four kbit block scales (sb = 1, 2 or 4 bytes each, contiguous at `at`) as pairs
// of T, two to a word: chunks 0 and 2 in s[0], 1 and 3 in s[1] (a multiply takes its half
// by hmul2_by_half); E4M4 times 2^8 (e4m4_pair_x256), fp16 as it is, fp32 rounded.
template <class T>
__device__ __forceinline__ void kbit_scale_words(uint32_t at, int sb, uint32_t (&s)[2]) {
    if (sb == 1) {
        const uint32_t v = lds_u32(at);
        s[0] = e4m4_pair_x256<T>(v, 0, 2), s[1] = e4m4_pair_x256<T>(v, 1, 3);
        static_assert(kE4M4Shift == 256.0f, "e4m4_pair_x256: times 2^8");
    } else if (sb == 2) {
        const uint2 v = lds_u32x2(at);
        const uint32_t h02 = __byte_perm(v.x, v.y, 0x5410u), h13 = __byte_perm(v.x, v.y, 0x7632u);
        if constexpr (Pack<T>::kF16) {
            s[0] = h02, s[1] = h13;
        } else {
            const float2 f02 = __half22float2(*reinterpret_cast<const __half2 *>(&h02));
            const float2 f13 = __half22float2(*reinterpret_cast<const __half2 *>(&h13));
            s[0] = pack2(T{}, f02.x, f02.y), s[1] = pack2(T{}, f13.x, f13.y);
        }
    } else {
        const uint4 v = lds_u32x4(at);
        s[0] = pack2(T{}, __uint_as_float(v.x), __uint_as_float(v.z));
        s[1] = pack2(T{}, __uint_as_float(v.y), __uint_as_float(v.w));
    }
}

// ... as four pairs of T, chunk i's value in both halves of s[i] (the streamed GEMM's):
// kbit_scale_words' halves, each in both halves of a word.
template <class T>
__device__ __forceinline__ void kbit_scale_pairs(uint32_t at, int sb, uint32_t (&s)[4]) {
    uint32_t w[2];
    kbit_scale_words<T>(at, sb, w);
    s[0] = __byte_perm(w[0], 0u, 0x1010u), s[2] = __byte_perm(w[0], 0u, 0x3232u);
    s[1] = __byte_perm(w[1], 0u, 0x1010u), s[3] = __byte_perm(w[1], 0u, 0x3232u);
}

// Tiled kbit, read by the tiled GEMM below (not by the streamed GEMM: its lanes gather
// their codes from the segments themselves): a warp's unit of (tile, group), its lanes'
// 8K-byte segments holding exactly their pair indices, and the scales of its rows' four
// chunks (1, 2 or 4 bytes each, as stored).
template <class T, int K>
struct TiledSrc {
    using Dec = TiledScale<T, K>;
    static constexpr int kWBytes = kSTiles * tiled::kLanes * 8 * K;                // 8 units
    static constexpr int kSBytes = kSTiles * tiled::kTileRows * tiled::kGroupChunks * 4;  // at most
    // K = 2 and 4: the tiled GEMM's lanes of one g load the four segments of lanes
    // 4g..4g+3 (64 or 128 bytes); unswizzled, the g's of one shared-memory phase met in the
    // same banks (ncu, run 9: a third of the load wavefronts were conflicts at m = 256). So
    // the W box comes 128-byte swizzled (16-byte unit u of line L at u ^ (L % 8)): measured
    // 9-30% faster at every m from 16 (bench/RESULTS.md, session 12). (K = 3 and 5: their
    // 24- and 40-byte segments cross the 16-byte units; left unswizzled.)
    static constexpr bool kSwizzled = K == 2 || K == 4;
    Dec dec;

    __device__ uint32_t stage_bytes() const {
        return kWBytes + kSTiles * tiled::kTileRows * tiled::kGroupChunks * dec.sb;
    }
    __device__ void issue(uint32_t dst, const StreamMaps &maps, int gi, int64_t n0, uint32_t bar,
                          uint64_t policy) const {
        const int tile0 = static_cast<int>(n0 / kTileRows);
        if constexpr (kSwizzled) tma_load(dst, maps.w, 0, 0, gi, tile0, bar, policy);
        else tma_load(dst, maps.w, 0, gi, tile0, bar, policy);
        tma_load(dst + kWBytes, maps.scales, 0, gi, tile0, bar, policy);
    }
    // Row g's scales in a slot (row g + 8's: + s_row8()).
    __device__ uint32_t s_offset(int warp, int g) const {
        return kWBytes + (warp * tiled::kTileRows + g) * tiled::kGroupChunks * dec.sb;
    }
    // Row g's scales of the stage's chunks, two to a word (kbit_scale_words).
    __device__ void scale_words(uint32_t at, uint32_t (&s)[2]) const {
        kbit_scale_words<T>(at, dec.sb, s);
    }
    __device__ uint32_t s_row8() const { return 8 * tiled::kGroupChunks * dec.sb; }  // row g + 8's
    // The factor the sums take at the output, after the table's fill returned `book`.
    __device__ float out_mul(float book) const {
        return kbit_out_mul(dec, book);
    }
};

// NF4 / FP4 (bitsandbytes' layout): 16 bytes a row and chunk, a float32 scale every
// 2^log2_bs elements ((k_in / 2^log2_bs) % 4 == 0: the scale rows on 16 bytes).
template <class T, class Fmt>
struct Bnb4Src {
    using Dec = Bnb4Staged<T, Fmt>;
    static constexpr int kRowBytes = kStageK / 2;                          // 64 bytes a row
    static constexpr int kWBytes = kSTiles * kTileRows * kRowBytes;        // 8 KB
    static constexpr int kSBytes = kSTiles * kTileRows * 16;               // 4 scales a row
    static constexpr int kWords = 8;  // rows g, g + 8 of 4 chunks: word [2 v + h]
    Dec dec;
    int log2_bs;

    __device__ uint32_t stage_bytes() const { return kWBytes + kSBytes; }
    // The stage's first scale column in its box: the stage's first block, down to 4.
    __device__ int first_block(int gi) const { return ((gi * kStageK) >> log2_bs) & ~3; }
    __device__ void issue(uint32_t dst, const StreamMaps &maps, int gi, int64_t n0, uint32_t bar,
                          uint64_t policy) const {
        tma_load(dst, maps.w, gi * kRowBytes, static_cast<int>(n0), bar, policy);
        tma_load(dst + kWBytes, maps.scales, first_block(gi), static_cast<int>(n0), bar, policy);
    }
    __device__ uint32_t w_offset(int warp, int lane) const {
        return (warp * kTileRows + (lane >> 2)) * kRowBytes + (lane & 3) * 4;
    }
    __device__ uint32_t s_offset(int warp, int g) const { return kWBytes + (warp * kTileRows + g) * 16; }
    __device__ void load_words(uint32_t at, uint32_t (&w)[kWords]) const {
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            w[2 * v] = lds_u32(at + 16 * v);
            w[2 * v + 1] = lds_u32(at + 8 * kRowBytes + 16 * v);
        }
    }
    __device__ void scales(uint32_t at, int gi, uint32_t (&s)[4]) const {
        const int base = first_block(gi);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            const int col = ((gi * kStageK + v * kChunk) >> log2_bs) - base;
            const float f = __uint_as_float(lds_u32(at + 4 * col));
            s[v] = pack2(T{}, f, f);
        }
    }
    __device__ uint32_t s_row8() const { return 8 * 16; }
    // Byte i of the chunk's word: elements 8t + 2i (high nibble), 8t + 2i + 1.
    __device__ static uint32_t index(const uint32_t (&w)[kWords], int v, int h, int i) {
        return __byte_perm(w[2 * v + h], 0u, 0x4440u | static_cast<uint32_t>(i));
    }
    __device__ float out_mul(float) const { return 1.0f; }
};

// Stored kbit (kbit_quantize's layout): 4K bytes a row and chunk (K bit planes), a scale
// of sb bytes a chunk; each lane takes the planes' byte t of its rows' chunks and
// transposes them into its four pair indices as it loads them (the row's chunk bytes
// and scales on 16 bytes: (chunks K) % 4 == 0, (chunks sb) % 16 == 0). A TMA box starts
// on 16 bytes (a box that did not measured an illegal instruction), so the scales' box
// is the 16 bytes of each row that hold the stage's four.
template <class T, int K>
struct StoredKbitSrc {
    using Dec = KbitAnyScale<T, K>;
    static constexpr int kRowBytes = tiled::kGroupChunks * 4 * K;          // a row's stage
    static constexpr int kWBytes = kSTiles * kTileRows * kRowBytes;
    static constexpr int kSBytes = kSTiles * kTileRows * 16;               // 16 bytes a row
    static constexpr int kWords = K == 5 ? 16 : 8;  // q of rows g, g + 8, 4 chunks; K = 5: fifth
    Dec dec;

    __device__ uint32_t stage_bytes() const { return kWBytes + kSBytes; }
    __device__ void issue(uint32_t dst, const StreamMaps &maps, int gi, int64_t n0, uint32_t bar,
                          uint64_t policy) const {
        tma_load(dst, maps.w, gi * kRowBytes, static_cast<int>(n0), bar, policy);
        // (a box starts on 16 bytes: the one that holds the stage's 4 sb bytes)
        const int per_box = 16 / dec.sb;
        tma_load(dst + kWBytes, maps.scales, (gi * tiled::kGroupChunks) & ~(per_box - 1),
                 static_cast<int>(n0), bar, policy);
    }
    __device__ uint32_t w_offset(int warp, int lane) const {
        return (warp * kTileRows + (lane >> 2)) * kRowBytes;
    }
    __device__ uint32_t s_offset(int warp, int g) const { return kWBytes + (warp * kTileRows + g) * 16; }
    __device__ void load_words(uint32_t at, uint32_t (&w)[kWords]) const {
        const int t = threadIdx.x & 3;
#pragma unroll
        for (int v = 0; v < 4; ++v)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t chunk = at + h * 8 * kRowBytes + v * 4 * K;
                uint32_t planes[K];
                if constexpr (K == 4) {
                    const uint4 u = lds_u32x4(chunk);
                    planes[0] = u.x, planes[1] = u.y, planes[2] = u.z, planes[3] = u.w;
                } else {
#pragma unroll
                    for (int j = 0; j < K; ++j) planes[j] = lds_u32(chunk + 4 * j);
                }
                uint32_t fifth;
                Dec::transpose(planes, t, w[2 * v + h], fifth);
                if constexpr (K == 5) w[8 + 2 * v + h] = fifth;
            }
    }
    __device__ void scales(uint32_t at, int gi, uint32_t (&s)[4]) const {
        kbit_scale_pairs<T>(at + ((gi * tiled::kGroupChunks * dec.sb) & 15), dec.sb, s);
    }
    __device__ uint32_t s_row8() const { return 8 * 16; }
    __device__ static uint32_t index(const uint32_t (&w)[kWords], int v, int h, int i) {
        return Dec::index(w[2 * v + h], K == 5 ? w[(8 + 2 * v + h) % kWords] : 0u, i);
    }
    __device__ float out_mul(float book) const {
        return kbit_out_mul(dec, book);
    }
};

// A CTA's pair table for a source, filled by all its threads and ending at a barrier.
// Returns the factor the sums take at the output (what the whole weight shares).
template <class T, int kCopies, class Src>
__device__ float fill_source_tables(const Src &src, uint32_t *table, BookEntry book) {
    return src.out_mul(fill_pair_table<typename Src::Dec, kCopies>(table, book));
}

template <class Src, int BN>
struct StreamLayout90 {
    static constexpr int kXRow = kStageK * 2;             // a raw x row
    static constexpr int kX = Src::kWBytes + Src::kSBytes;  // offsets in a slot
    static constexpr int kSlot = kX + BN * kXRow;  // (every part on 128 bytes, for the TMA)
    static constexpr int kB = 2 * BN * kRowBytes;  // a permuted x tile: two 64-k halves
};
constexpr int kStatic = 2048;  // the kernel's static shared memory, at most
// kCtas CTAs an SM (sharing its 228 KB) where a ring of three slots still fits.
template <class Src, int BN, int kCtas>
struct StreamConfig90 {
    using L = StreamLayout90<Src, BN>;
    using Dec = typename Src::Dec;
    static constexpr int kBudget = kCtas == 1 ? kSmem : 228 * 1024 / kCtas - 1024;  // (1 KB: the driver's)
    template <int kCopies>
    static constexpr int fit() {
        return (kBudget - kStatic - 1024 - 3 * L::kB - table_bytes<Dec, kCopies>()) / L::kSlot;
    }
    static constexpr int kFull = table_copies<Dec::kEntries>();
    static constexpr int kCopies = fit<kFull>() >= (kCtas == 1 ? 4 : 3) ? kFull : kFull / 2;
    static constexpr int kRing = fit<kCopies>() < kSMaxRing ? fit<kCopies>() : kSMaxRing;
    static constexpr bool kBuilt = kRing >= 3;
    static constexpr int bytes() { return 1024 + 3 * L::kB + kRing * L::kSlot + table_bytes<Dec, kCopies>(); }
};
// Two CTAs an SM (twice the warps to hide the decode's latency) for 16 and 32 rows of x
// where they fit, else one. (Three for 16 rows, with a ring of three slots and half the
// table's copies, measured slower: bench/RESULTS.md, session 9.)
template <class Src, int BN>
constexpr int stream_ctas() {
    return BN <= 32 && StreamConfig90<Src, BN, 2>::kBuilt ? 2 : 1;
}

template <class T, class Src, int BN, int kCtas>
__global__ void __launch_bounds__(kThreads90, kCtas)
stream90_kernel(Src src, const float *__restrict__ codebook, int k,
                const typename T::storage *__restrict__ x, int64_t m, int64_t k_in, int64_t n_out,
                const typename T::storage *__restrict__ bias, typename T::storage *__restrict__ y,
                int splits, float *__restrict__ partials, unsigned *__restrict__ counters,
                const __grid_constant__ StreamMaps maps) {
    using Dec = typename Src::Dec;
    using C = StreamConfig90<Src, BN, kCtas>;
    static_assert(C::kBuilt, "the ring needs three slots");
    using L = typename C::L;
    constexpr int R = C::kRing;
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
    uint8_t *btile = base;                     // 3 permuted x tiles (1024-byte aligned)
    uint8_t *ring = btile + 3 * L::kB;         // R slots
    uint32_t *table = reinterpret_cast<uint32_t *>(ring + R * L::kSlot);
    __shared__ alignas(8) uint64_t full[kSMaxRing];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2;

    const int64_t groups = (k_in + kStageK - 1) / kStageK;
    const gemm::TileOrigin origin = gemm::tile_origin(blockIdx.x, m, n_out, BN);
    const int64_t n0 = origin.n0, m0 = origin.m0;
    const int split = blockIdx.y;
    const int g_begin = static_cast<int>(groups * split / splits);
    const int stages = static_cast<int>(groups * (split + 1) / splits) - g_begin;
    const uint32_t ring_at = smem_address(ring), b_at = smem_address(btile);
    const uint32_t full_at = smem_address(full);
    const BookEntry book = book_entry<typename Src::Dec>(codebook, k);  // before the copies

    if (tid == 0) {
        for (int s = 0; s < R; ++s) mbar_init(full_at + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // Stage q (k from (g_begin + q) * 128) into slot q % R: three copies by thread 0.
    const uint64_t w_policy = evict_first_policy(), x_policy = evict_last_policy();
    const uint32_t stage_bytes = src.stage_bytes() + BN * L::kXRow;
    auto issue = [&](int q) {
        const int gi = g_begin + q;
        const uint32_t dst = ring_at + (q % R) * L::kSlot, bar = full_at + 8 * (q % R);
        mbar_expect(bar, stage_bytes);
        src.issue(dst, maps, gi, n0, bar, w_policy);
        tma_load(dst + L::kX, maps.x, gi * kStageK, static_cast<int>(m0), bar, x_policy);
    };
    if (tid == 0)
        for (int q = 0; q < (stages < R ? stages : R); ++q) issue(q);

    const float out_mul = fill_source_tables<T, C::kCopies>(src, table, book);
    const auto my_table = lane_table<C::kCopies>(table);

    // Permutes a stage's x (in its slot) into x tile `b`, a 16-byte unit of the tile a
    // thread at a time: unit (row r, chunk c, k16 step j of the chunk, its low or high 8
    // elements h) takes pair 4 t' + 2 j + h of the chunk (elements 8 t' + 4 j + 2 h, + 1:
    // lane t' holds them) as its column pair t' (the A fragment's), and goes to unit
    // 4 (c % 2) + 2 j + h of half c / 2 of the swizzled tile.
    auto permute = [&](uint32_t slot_at, uint8_t *b) {
        constexpr int kUnits = BN * tiled::kGroupChunks * 4;  // BN * 16
#pragma unroll
        for (int i = 0; i < kUnits / kThreads90; ++i) {
            const int u = tid + i * kThreads90, r = u >> 4, c = (u >> 2) & 3, jh = u & 3;
            const uint32_t from = slot_at + L::kX + r * L::kXRow + c * 64 + jh * 4;
            const uint4 v = make_uint4(lds_u32(from), lds_u32(from + 16), lds_u32(from + 32), lds_u32(from + 48));
            *reinterpret_cast<uint4 *>(b + (c >> 1) * (BN * kRowBytes) + swizzled(r, 4 * (c & 1) + jh)) = v;
        }
        fence_proxy_async();
    };

    float acc[kAcc];  // (the first wgmma writes them: D = A B)
    uint32_t a[2][4][4];  // the two halves' A fragments: k16 step j of chunks 2h, 2h + 1
    // (rows past n_out decode the zeros the TMA gives them: no branch)
    const uint32_t w_at = pinned(ring_at + src.w_offset(warp, lane));
    const uint32_t s_at = pinned(ring_at + src.s_offset(warp, g));

    if (stages > 0) permute(ring_at + mbar_wait(full_at, 0), btile);
    __syncthreads();

    int slot = 0, bslot = 0;
    uint32_t phase = 0;
    for (int q = 0; q < stages; ++q) {
        const uint32_t at = slot * L::kSlot;
        uint32_t w[Src::kWords], sa[4], sc[4];  // the lane's words; rows g and g + 8's scales
        src.load_words(w_at + at, w);
        src.scales(s_at + at, g_begin + q, sa);
        src.scales(s_at + at + src.s_row8(), g_begin + q, sc);
        const uint64_t b = descriptor(b_at + bslot * L::kB);  // + (byte offset >> 4) within
        auto half = [&](auto hc) {
            constexpr int h = decltype(hc)::value;
            wgmma_wait<1>();  // the wgmma that last read a[h] is done
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int v = 2 * h + u;  // chunk of the stage
                uint32_t pa[4], pb[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    pa[i] = hmul2<T>(my_table[Src::index(w, v, 0, i)], sa[v]);
                    pb[i] = hmul2<T>(my_table[Src::index(w, v, 1, i)], sc[v]);
                }
                a[h][2 * u][0] = pa[0], a[h][2 * u][1] = pb[0], a[h][2 * u][2] = pa[1], a[h][2 * u][3] = pb[1];
                a[h][2 * u + 1][0] = pa[2], a[h][2 * u + 1][1] = pb[2], a[h][2 * u + 1][2] = pa[3],
                                 a[h][2 * u + 1][3] = pb[3];
            }
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 4; ++j)
                wgmma(typename NTag<BN>::type{}, T{}, acc, a[h][j],
                      b + ((h * (BN * kRowBytes) + 32 * j) >> 4), q + h + j > 0);
            wgmma_commit();
        };
        half(std::integral_constant<int, 0>{});
        half(std::integral_constant<int, 1>{});

        // x of the next stage into the tile stage q - 2 read (done: every warpgroup waited
        // for it before this stage's second half, and the CTA met since).
        const int next = slot + 1 == R ? 0 : slot + 1;
        const uint32_t next_phase = slot + 1 == R ? phase ^ 1u : phase;
        const int bnext = bslot == 2 ? 0 : bslot + 1;
        if (q + 1 < stages)
            permute(ring_at + next * L::kSlot + mbar_wait(full_at + 8 * next, next_phase),
                    btile + bnext * L::kB);
        __syncthreads();  // slot q is read; x tile q + 1 is written
        if (tid == 0 && q + R < stages) issue(q + R);
        slot = next, phase = next_phase, bslot = bnext;
    }
    wgmma_wait<0>();
    fence_operands(acc);

    epilogue<T>(acc, blockIdx.x, n0, m0, m, n_out, out_mul, bias, y, split, splits, partials,
                counters);
}

// The maps of W and its scales.
template <class T, int K>
cudaError_t source_maps(const TiledSrc<T, K> &src, int64_t, int64_t, StreamMaps &maps) {
    constexpr int kUnitW = tiled::kLanes * 8 * K;
    const int unit_s = tiled::kTileRows * tiled::kGroupChunks * src.dec.sb;
    const cuuint64_t groups = static_cast<cuuint64_t>(src.dec.geo.groups),
                     tiles = static_cast<cuuint64_t>(src.dec.geo.tiles);
    cudaError_t err;
    if constexpr (TiledSrc<T, K>::kSwizzled) {  // 128-byte lines of a unit, swizzled
        const cuuint64_t dims[4] = {16, kUnitW / 128, groups, tiles},
                         strides[3] = {128, kUnitW, kUnitW * groups};
        const cuuint32_t box[4] = {16, kUnitW / 128, 1, kSTiles};
        err = tensor_map(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT64, 4, src.dec.packed, dims, strides,
                         box, CU_TENSOR_MAP_SWIZZLE_128B);
    } else {
        const cuuint64_t dims[3] = {kUnitW / 8, groups, tiles}, strides[2] = {kUnitW, kUnitW * groups};
        const cuuint32_t box[3] = {kUnitW / 8, 1, kSTiles};
        err = tensor_map(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT64, 3, src.dec.packed, dims, strides, box);
    }
    if (err != cudaSuccess) return err;
    const cuuint64_t sdims[3] = {static_cast<cuuint64_t>(unit_s / 8), groups, tiles},
                     sstrides[2] = {static_cast<cuuint64_t>(unit_s), unit_s * groups};
    const cuuint32_t sbox[3] = {static_cast<cuuint32_t>(unit_s / 8), 1, kSTiles};
    return tensor_map(&maps.scales, CU_TENSOR_MAP_DATA_TYPE_UINT64, 3, src.dec.absmax, sdims,
                      sstrides, sbox);
}
// The maps of a weight read by rows (NF4 / FP4, stored kbit): its packed bytes (row_bytes
// a row, boxes of box_bytes by the CTA's rows) and its scales (row_scales elements of
// scale_bytes each a row, boxes of 16 bytes).
cudaError_t row_maps(StreamMaps &maps, const void *packed, int64_t row_bytes, int box_bytes,
                     const void *scales, int scale_bytes, int64_t row_scales, int64_t n_out) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(n_out)},
                     strides[1] = {static_cast<cuuint64_t>(row_bytes)};
    const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_bytes), kSTiles * kTileRows};
    cudaError_t err = tensor_map(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, packed, dims, strides, box);
    if (err != cudaSuccess) return err;
    const CUtensorMapDataType type = scale_bytes == 1   ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : scale_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_UINT32;
    const cuuint64_t sdims[2] = {static_cast<cuuint64_t>(row_scales), static_cast<cuuint64_t>(n_out)},
                     sstrides[1] = {static_cast<cuuint64_t>(row_scales * scale_bytes)};
    const cuuint32_t sbox[2] = {static_cast<cuuint32_t>(16 / scale_bytes), kSTiles * kTileRows};
    return tensor_map(&maps.scales, type, 2, scales, sdims, sstrides, sbox);
}
template <class T, class Fmt>
cudaError_t source_maps(const Bnb4Src<T, Fmt> &src, int64_t k_in, int64_t n_out, StreamMaps &maps) {
    return row_maps(maps, src.dec.packed, k_in / 2, Bnb4Src<T, Fmt>::kRowBytes, src.dec.absmax, 4,
                    k_in >> src.log2_bs, n_out);
}
template <class T, int K>
cudaError_t source_maps(const StoredKbitSrc<T, K> &src, int64_t k_in, int64_t n_out,
                        StreamMaps &maps) {
    const int64_t chunks = k_in / kChunk;
    return row_maps(maps, src.dec.packed, chunks * 4 * K, StoredKbitSrc<T, K>::kRowBytes,
                    src.dec.absmax, src.dec.sb, chunks, n_out);
}

template <class T, class Src>
cudaError_t launch_streamed(const Src &src, const float *codebook, int k, const void *x,
                            int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                            void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const int bm = stream90_bm(m);
    const int ctas = bm == 16 ? stream_ctas<Src, 16>() : bm == 32 ? stream_ctas<Src, 32>() : stream_ctas<Src, 64>();
    const GemmPlan plan = stream90_plan(m, k_in, n_out, ctas);
    StreamMaps maps;
    cudaError_t err = source_maps(src, k_in, n_out, maps);
    if (err != cudaSuccess) return err;
    switch (bm) {
#define KBIT_STREAM90_BN(BN)                                                                    \
    case BN: {                                                                                  \
        const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k_in), static_cast<cuuint64_t>(m)}; \
        const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k_in) * 2};                      \
        const cuuint32_t box[2] = {kStageK, BN};                                                \
        err = tensor_map(&maps.x, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, x, dims, strides, box);    \
        if (err != cudaSuccess) return err;                                                     \
        constexpr int kCtas = stream_ctas<Src, BN>();                                           \
        return gemm::launch_gemm<stream90_kernel<T, Src, BN, kCtas>, T>(                        \
            kThreads90, StreamConfig90<Src, BN, kCtas>::bytes(), BN, plan, src, codebook, k, x, \
            m, k_in, n_out, bias, y, workspace, workspace_bytes, stream, maps);                 \
    }
        KBIT_STREAM90_BN(16)
        KBIT_STREAM90_BN(32)
        KBIT_STREAM90_BN(64)
#undef KBIT_STREAM90_BN
    }
    return cudaErrorInvalidValue;
}


// ---- the tiled GEMM: A gathered from the tiled layout, x as the TMA lays it ---------------
//
// The streamed GEMM above permutes each stage's x into the order of k its lanes hold, at a
// CTA barrier a stage; from a few dozen rows of x that permutation and barrier bound it,
// not the tensor cores. Here each lane gathers the codes the wgmma's A fragment asks of it
// instead: lane (g, t) of warp w needs, of each chunk of rows 16 w + g and + 8, the pairs
// of elements 2 t + 8 q (q = 0..3), and the tiled layout keeps those as field t of each
// row's group in the segments of lanes 4 g + q (formats/kbit_tiled.h): four neighbouring
// segments, loaded whole (the warp's four lanes of one g load the same ones). x then needs
// no reordering: the TMA writes it in 64-k halves straight into the 128-byte-swizzled tile
// that the wgmma's descriptor reads.
//  - a CTA: two consumer warpgroups (128 rows of W, 64 a warpgroup, as the kernels above)
//    and a producer warpgroup whose first lane issues the copies: W and its scales a
//    128-k stage into a W ring, x a 64-k half (BN rows of 128 bytes) into an x ring; each
//    slot has a full and an empty mbarrier, so consumers and producer never meet at a CTA
//    barrier. The producer gives its registers to the consumers (setmaxnreg: 40 a thread,
//    the consumers 232 with one CTA an SM, 96 with two: BN = 16, and 32 and 64 where the
//    weight is large or (BN = 32) has many tiles, tiled_ctas). At launch a whole
//    warpgroup counts, so with a producer warp alone ptxas allowed 168, and BN = 256
//    spilled and serialized its wgmmas; at 80 a thread BN = 16 and 32 spilled in the loop;
//  - a consumer decodes a chunk (two k16 steps, 8 pairs) while the tensor cores multiply
//    the one before (two A buffers, one wgmma group a chunk); it releases a W slot once
//    its words are loaded and an x half once the wgmmas that read it are done;
//  - a CTA walks work items (tile, split) gridDim.x apart with one ring (persistent: the
//    producer runs on into the next item while the consumers store one); K = 2 and 4
//    take their W box 128-byte swizzled, so that the g's of a shared-memory phase load
//    from distinct banks (TiledSrc); the plan is tiled90_plan (formats/matmul.h).
// Rounding, scale shifts, split k and the epilogue are those of the kernels above.
constexpr int kTThreads = kThreads90 + 128;  // + the producer warpgroup
constexpr int kTMaxXRing = 8;
// CTAs an SM: two for N = 16; for N = 32 and 64 (m = 17..64) two on weights of
// kTiled90TwoCtaWeights or more, and for N = 32 also where the tiles are half the SMs or
// more, else one: four consumer warpgroups an SM hide more of the decode's latency where
// the plan has enough work items for two CTAs on every SM (8192x28672 and 28672x8192 m =
// 64: 96.4 / 104.3 against 87.6 / 87.7 us), but where it does not the extra splits and
// the uneven second CTAs cost more (m = 64 on 4096x4096, 14336x4096, 4096x14336: 20.9 /
// 31.7 / 35.3 against 27.7 / 35.2 / 39.4; H100, bench/RESULTS.md session 13). At N = 32 on
// 4096-row weights (32 tiles: split 8 ways on two CTAs an SM, items of 8 stages of 64 k
// on 4096x4096, against 4 ways of 16 on one, whose ring has the SM's shared memory) one
// CTA measured 17.8-20.0 against 22.4-25.6 us at m = 24, 32 (4096x14336 28-34 against
// 31-39); on 14336x4096 (112 tiles) 3-7% slower (session 27).
constexpr int64_t kTiled90TwoCtaWeights = int64_t{1} << 27;
inline int tiled_ctas(int64_t m, int64_t k_in, int64_t n_out) {
    if (m > kStream90MaxM) return 1;
    const int bm = stream90_bm(m);
    const bool two = bm == 16 || n_out * k_in >= kTiled90TwoCtaWeights ||
                     (bm == 32 && 2 * gemm_tiles(m, n_out, bm) >= kTiled90Room);
    return two ? 2 : 1;
}

// y from the accumulators (a split item's after their sum) through shared memory, where
// n_out % 8 == 0 and y is on 16 bytes: each warp turns its 16 rows of W by BN rows of x
// into T (times out_mul, plus bias) and stores them with stmatrix, transposed, into its
// own buffer as kEpiCols rows of x of 16 consecutive W rows (32 bytes), then writes each
// as two 16-byte stores, y's contiguous direction. The per-element stores (epilogue
// above) wrote 2 bytes a lane at 4 places a warp instruction, about 20 instructions an
// element with their bounds and bias: at k_in = 4096 a tenth of a prefill tile's time
// with the tensor cores idle. Where BN >= 64 (at BN = 16 and 32 it cost registers and the
// loop spilled, for a few stores a tile).
constexpr bool staged_epilogue(int bn) { return bn >= 64; }
constexpr int kEpiCols = 32;  // rows of x a round
constexpr int epi_bytes(int bn) {
    return staged_epilogue(bn) ? kThreads90 / 32 * kEpiCols * 32 : 0;
}
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t at, uint32_t a, uint32_t b, uint32_t c,
                                                  uint32_t d) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                 "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}
template <class T, int BN>
__device__ __forceinline__ void store_tile_staged(const float (&acc)[BN / 2], int64_t n0,
                                                  int64_t m0, int64_t m, int64_t n_out,
                                                  float out_mul,
                                                  const typename T::storage *__restrict__ bias,
                                                  typename T::storage *__restrict__ y,
                                                  uint32_t staging) {
    constexpr int kCols = kEpiCols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row = n0 + 16 * warp + (lane >> 2);  // the lane's rows: row, row + 8
    const float b0 = bias && row < n_out ? load_f32(T{}, bias[row]) : 0.0f;
    const float b1 = bias && row + 8 < n_out ? load_f32(T{}, bias[row + 8]) : 0.0f;
    const uint32_t mine = staging + warp * kCols * 32;
    // stmatrix: lane 8 q + i addresses column i of matrix q = (x rows 8 (j + q / 2) ..,
    // W rows 8 (q % 2) ..), stored at x row (its index in the round) * 32 + W half * 16
    const uint32_t st_at = mine + ((lane >> 4) * 8 + (lane & 7)) * 32 + ((lane >> 3) & 1) * 16;
    // the stores: lane l's 16 bytes p are x row 16 p + l / 2 of the round, W rows 8 (l % 2) ..
    const int64_t vrow = n0 + 16 * warp + 8 * (lane & 1);
    const bool row_in = vrow + 8 <= n_out;  // (n_out % 8 == 0: all eight rows or none)
#pragma unroll
    for (int c0 = 0; c0 < BN; c0 += kCols) {
#pragma unroll
        for (int j = c0 / 8; j < (c0 + kCols) / 8; j += 2) {
            uint32_t r[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int i = 4 * (j + q / 2) + 2 * (q % 2);
                const float b = q % 2 ? b1 : b0;
                r[q] = pack2(T{}, fmaf(acc[i], out_mul, b), fmaf(acc[i + 1], out_mul, b));
            }
            stmatrix_x4_trans(st_at + (j - c0 / 8) * 8 * 32, r[0], r[1], r[2], r[3]);
        }
        __syncwarp();
#pragma unroll
        for (int p = 0; p < kCols * 32 / 512; ++p) {
            const uint4 v = lds_u32x4_ordered(mine + (32 * p + lane) * 16);
            const int64_t xr = m0 + c0 + 16 * p + (lane >> 1);
            if (row_in && xr < m)
                asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(
                                 y + xr * n_out + vrow),
                             "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                             : "memory");
        }
        __syncwarp();
    }
}

template <class Src, int BN, int kCtas>
struct TiledGemmConfig {
    using Dec = typename Src::Dec;
    static constexpr int kX = BN * kRowBytes;  // an x half (a multiple of 1024 bytes)
    static constexpr int kAlignW = Src::kSwizzled ? 1024 : 128;  // (a swizzled box: its pattern's)
    static constexpr int kW = (Src::kWBytes + Src::kSBytes + kAlignW - 1) / kAlignW * kAlignW;  // a W stage
    // K = 2 through the quad table where x's halves are small (BN <= 32), so that its
    // 32 KB leave the x ring whole
    static constexpr bool kQuads = Dec::kK == 2 && BN <= 32;
    static constexpr int table_for(int copies) {
        return kQuads ? QuadTable<16>::kBytes : 4 * Dec::kEntries * copies;
    }
    // x halves in flight, and W stages: one more than they span (`slack` 1), or as many
    static constexpr int bytes_for(int copies, int x_ring, int slack = 1) {
        return 1024 + x_ring * kX + (x_ring / 2 + slack) * kW + table_for(copies) + epi_bytes(BN);
    }
    static constexpr int kBudget = (kCtas == 1 ? kSmem : 228 * 1024 / kCtas - 1024) - kStatic;
    static constexpr int ring(int copies, int slack = 1) {
        int r = kTMaxXRing;
        while (r > 2 && bytes_for(copies, r, slack) > kBudget) r -= 2;
        return r;
    }
    static constexpr int kFull = table_copies<Dec::kEntries>();
    // The full table where four x halves fit beside it, W's ring one stage shorter if need
    // be; else half the copies. K = 5 at N = 256: 16 copies and two W stages, not 8 copies
    // and three (2-5% faster at m = 256..1024); at N = 32 with two CTAs: 16 copies, four x
    // halves and two W stages, not 8, six and four (0-18% faster at m = 32; H200,
    // bench/RESULTS.md session 19). (K = 5 at N = 16 with half the copies, its x ring eight
    // halves instead of four: measured 16-17% slower on the large weights, session 17.)
    static constexpr int kSlack = ring(kFull) >= 4 || ring(kFull, 0) < 4 ? 1 : 0;
    static constexpr int kCopies = ring(kFull, kSlack) >= 4 ? kFull : kFull / 2;
    static constexpr int kXRing = ring(kCopies, kSlack);
    static constexpr int kWRing = kXRing / 2 + kSlack;
    static constexpr bool kBuilt = kXRing >= 4 && bytes_for(kCopies, kXRing, kSlack) <= kBudget;
    static constexpr int kTable = table_for(kCopies);
    static constexpr int bytes() { return bytes_for(kCopies, kXRing, kSlack); }
};

// The consumer warpgroups' own barrier (the producer warpgroup has left).
struct ConsumerSync {
    __device__ __forceinline__ void operator()() const {
        asm volatile("bar.sync 1, %0;" ::"n"(kThreads90) : "memory");
    }
};

// Half H of a tiled lane segment (4K bytes from byte 4K H, at `at`; segments on 8K bytes):
// the fields of chunks 2H, 2H + 1, in the widest loads its alignment allows.
template <int K, int H>
__device__ __forceinline__ void load_half_segment(uint32_t at, uint32_t (&w)[K]) {
    if constexpr (K == 4) {
        const uint4 v = lds_u32x4(at);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (K == 2) {
        const uint2 v = lds_u32x2(at);
        w[0] = v.x, w[1] = v.y;
    } else {  // K = 3, 5: segments on 8 bytes, halves of 12 or 20 bytes
        static_assert(K % 2 == 1, "K = 3 or 5");
        auto pairs_from = [&](int first) {  // words first .. first + K - 2, 8 bytes a load
#pragma unroll
            for (int i = 0; i + 1 < K; i += 2) {
                const uint2 v = lds_u32x2(at + 4 * (first + i));
                w[first + i] = v.x, w[first + i + 1] = v.y;
            }
        };
        if constexpr (H == 0) {
            pairs_from(0);
            w[K - 1] = lds_u32(at + 4 * (K - 1));
        } else {  // 4 bytes off 8: one word first
            w[0] = lds_u32(at);
            pairs_from(1);
        }
    }
}
// A half segment's words shifted right by 2K t (K != 4): field t of each group moves to
// the group's field 0.
template <int K>
__device__ __forceinline__ void shift_half(uint32_t (&w)[K], uint32_t shift) {
    if constexpr (K != 4) {
#pragma unroll
        for (int i = 0; i < K; ++i) w[i] = i + 1 < K ? __funnelshift_r(w[i], w[i + 1], shift) : w[i] >> shift;
    }
}
// The table entry of the lane's field of group r (0..3: row half and chunk of a half
// segment) of such words: field t of the group (4 fields of 2K bits a group). `sel` is the
// lane's 0x4440 + t for K = 4 (one byte permute and a multiply-add); other K take words
// pre-shifted by 2K t (shift_half), then one shift and the table's LOP3 (field_entry).
template <int K, int kCopies>
__device__ __forceinline__ uint32_t gathered_entry(const uint32_t (&w)[K], int r, uint32_t sel,
                                                   const LaneTable<kCopies> &table) {
    if constexpr (K == 4) return table[__byte_perm(w[r], 0u, sel)];
    else return field_entry<K>(w, 4 * r, table);
}

// The pieces of an item's output tile whose partial sums meet (gemm::sum_pieces): their
// slots from part0 (piece p's part0 + p), their arrival counter, this item's piece.
struct Pieces {
    int64_t part0, counter;
    int piece, pieces;
};
// The work items of a persistent GEMM, gridDim.x apart: tiles [0, whole) whole, then
// (tile, split) of the other tiles, split-major (`slot`: the tile's place in the
// workspace); an item's stages are its split's share of the row's `groups` stages of k.
struct WorkItems {
    int64_t m, n_out, groups, whole, split_tiles;
    int splits, bn;
    struct Item {
        int64_t tile, slot, n0, m0;
        int split, splits, g_begin, stages;
    };
    __device__ WorkItems(int64_t m_, int64_t n_out_, int64_t groups_, int bn_, int64_t whole_,
                         int splits_)
        : m(m_), n_out(n_out_), groups(groups_), whole(whole_), splits(splits_), bn(bn_) {
        split_tiles = gemm_tiles(m, n_out, bn) - whole;
    }
    static constexpr bool kEven = false;  // (split k: the last split adds the others')
    __device__ int64_t count() const { return whole + split_tiles * splits; }
    __device__ Pieces pieces(const Item &w) const {
        return {w.slot * w.splits, w.slot, w.split, w.splits};
    }
    // the CTA's items: first(), first() + step(), ... before end()
    __device__ int64_t first() const { return blockIdx.x; }
    __device__ int64_t end() const { return count(); }
    __device__ int64_t step() const { return gridDim.x; }
    __device__ Item operator[](int64_t it) const {
        Item w;
        const int64_t j = it - whole;
        w.slot = j < 0 ? 0 : j % split_tiles;
        w.tile = j < 0 ? it : whole + w.slot;
        w.split = j < 0 ? 0 : static_cast<int>(j / split_tiles);
        w.splits = j < 0 ? 1 : splits;
        const gemm::TileOrigin origin = gemm::tile_origin(w.tile, m, n_out, bn);
        w.n0 = origin.n0, w.m0 = origin.m0;
        w.g_begin = static_cast<int>(groups * w.split / w.splits);
        w.stages = static_cast<int>(groups * (w.split + 1) / w.splits) - w.g_begin;  // >= 1
        return w;
    }
};

// The even walk of a persistent GEMM's work (tiled90_plan's `even`): the U = tiles x groups
// units (tile, stage of k) in order, CTA c taking [c U / G, (c + 1) U / G) as consecutive
// items, one a tile its run meets. A tile's pieces are those of the CTAs whose runs meet
// it; the first (its CTA's last item: the others are their CTAs' first) adds the others'
// partial sums, each CTA's in its own workspace slot (gemm::sum_pieces).
// Progress: unlike split k's (whose last split waits only on lower CTAs), a first piece
// waits on higher ones, c + 1 and at most c + 2, and only for pieces that never wait
// themselves (a CTA's first item, or a middle piece that is its whole run). The grid is
// at most the SMs' places (launch_tiled_bn, launch_gguf_bn), so on an otherwise idle GPU
// all CTAs are resident at once. Where fewer fit (SMs shared with other work), it relies,
// as split k does, on CTAs starting in order of their index: then any two places suffice
// (the lowest waiter's CTAs either run or take the place of one that finishes); with a
// single place the walk would wait forever (no cooperative launch guarantees more).
struct EvenItems {
    int64_t m, n_out, groups, units;
    int bn;
    struct Item {
        int64_t tile, n0, m0;
        int g_begin, stages;
    };
    static constexpr bool kEven = true;  // (a tile's first piece adds the others')
    __device__ EvenItems(int64_t m_, int64_t n_out_, int64_t groups_, int bn_)
        : m(m_), n_out(n_out_), groups(groups_), bn(bn_) {
        units = gemm_tiles(m, n_out, bn) * groups;
    }
    __device__ int64_t run_at(int64_t c) const { return c * units / gridDim.x; }  // CTA c's first unit
    __device__ int64_t cta_of(int64_t u) const {  // the CTA whose run holds unit u
        return ((u + 1) * gridDim.x + units - 1) / units - 1;
    }
    __device__ int64_t first() const { return run_at(blockIdx.x) / groups; }
    __device__ int64_t end() const { return (run_at(blockIdx.x + 1) - 1) / groups + 1; }
    __device__ int64_t step() const { return 1; }
    __device__ Item operator[](int64_t tile) const {
        Item w;
        const int64_t t0 = tile * groups, lo = run_at(blockIdx.x), hi = run_at(blockIdx.x + 1);
        w.tile = tile;
        w.g_begin = static_cast<int>((lo > t0 ? lo : t0) - t0);
        w.stages = static_cast<int>((hi < t0 + groups ? hi : t0 + groups) - t0) - w.g_begin;
        const gemm::TileOrigin origin = gemm::tile_origin(tile, m, n_out, bn);
        w.n0 = origin.n0, w.m0 = origin.m0;
        return w;
    }
    __device__ Pieces pieces(const Item &w) const {  // (a slot a CTA: part0 the first's)
        const int64_t t0 = w.tile * groups, c0 = cta_of(t0);
        return {c0, w.tile, static_cast<int>(blockIdx.x - c0),
                static_cast<int>(cta_of(t0 + groups - 1) - c0 + 1)};
    }
};
// A persistent GEMM's walk: split k, or the even walk.
template <bool kEven>
using Walk = std::conditional_t<kEven, EvenItems, WorkItems>;
template <bool kEven>
__device__ Walk<kEven> make_walk(int64_t m, int64_t n_out, int64_t groups, int bn, int64_t whole,
                                 int splits) {
    if constexpr (kEven) return EvenItems(m, n_out, groups, bn);
    else return WorkItems(m, n_out, groups, bn, whole, splits);
}

// A ring of shared-memory slots with a full and an empty mbarrier each.
struct Ring {
    uint32_t at, bytes, full, empty;  // first slot, a slot's bytes, the slots' barriers
    int n;
    __device__ void init(int consumers) const {
        for (int i = 0; i < n; ++i) mbar_init(full + 8 * i, 1), mbar_init(empty + 8 * i, consumers);
    }
};
// A position in a ring: slot, and the parity of its current phase.
struct RingPos {
    int slot = 0;
    uint32_t phase = 0;
    bool wrapped = false;  // every slot filled once
    __device__ void next(int n) {
        if (++slot == n) slot = 0, phase ^= 1u, wrapped = true;
    }
};

// The consumers' side of a ring of x halves (slots of kX bytes from `at`, each a wgmma B
// tile): a slot's descriptor once it has landed, and each half's release once its last
// chunk's wgmmas are done, which the consumers see at the next half's second chunk. The
// release goes to `done`, the empty barrier of the half before: at first a spare barrier
// that nobody waits on, so that no release needs a test. (Written out in each GEMM, the
// release's test and the slot before's wraparound, and the descriptor rebuilt from the
// byte address after each wait, took about 30 of the tiled GEMM's 261 instructions a
// stage: bench/RESULTS.md, session 18.)
template <int kX>
struct XHalves {
    uint32_t desc, full, empty, done;  // slot 0's descriptor (low word); barriers
    __device__ XHalves(uint32_t at, uint32_t full_, uint32_t empty_, uint32_t spare)
        : desc(static_cast<uint32_t>(descriptor(at))), full(full_), empty(empty_), done(spare) {}
    __device__ __forceinline__ uint64_t wait(int slot, uint32_t phase) const {
        return kDescHi | (desc + slot * (kX >> 4) + mbar_wait(full + 8 * slot, phase));
    }
    __device__ __forceinline__ void release_before(int slot) {
        mbar_arrive(done);
        done = empty + 8 * slot;
    }
};

// The persistent GEMMs' two rings: RX x halves of kX bytes from x_at, then RW W stages of
// kW bytes; their full and empty mbarriers in `bars` (x's, then W's: pinned, or ptxas
// rebuilds the address from the CTA's shared window every stage) and, last, the x ring's
// spare (XHalves: the consumers' first release goes there). One thread inits them.
template <int RX, int kX, int RW, int kW>
struct Rings {
    static constexpr int kBars = 2 * (RX + RW) + 1;
    Ring x, w;
    __device__ Rings(uint32_t x_at, const uint64_t *bars) {
        const uint32_t b = pinned(smem_address(bars));
        x = Ring{x_at, kX, b, b + 8 * RX, RX};
        w = Ring{x_at + RX * kX, kW, b + 16 * RX, b + 16 * RX + 8 * RW, RW};
    }
    __device__ uint32_t spare() const { return w.empty + 8 * RW; }
    __device__ void init() const {
        x.init(kThreads90), w.init(kThreads90);
        mbar_init(spare(), kThreads90);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __device__ XHalves<kX> halves() const { return XHalves<kX>(x.at, x.full, x.empty, spare()); }
};

// An item's sums (the consumers' accumulators) to y, times out_mul, plus bias: a split
// item's through the workspace, by its last split (the even walk's: by a tile's first
// piece); staged (store_tile_staged)
// where staged_y, else element by element.
template <class T, int BN, class Items>
__device__ __forceinline__ void store_item(float (&acc)[BN / 2], const Items &items,
                                           const typename Items::Item &item,
                                           int64_t m, int64_t n_out, float out_mul,
                                           const typename T::storage *__restrict__ bias,
                                           typename T::storage *__restrict__ y, float *partials,
                                           unsigned *counters, bool staged_y, uint32_t staging) {
    const Pieces p = items.pieces(item);
    if (p.pieces > 1 &&
        !gemm::sum_pieces<BN / 2, kThreads90, Items::kEven>(acc, p.part0, p.counter, p.piece,
                                                            p.pieces, partials, counters,
                                                            ConsumerSync{}))
        return;
    if (staged_y)  // (false where BN < 64)
        store_tile_staged<T, BN>(acc, item.n0, item.m0, m, n_out, out_mul, bias, y, staging);
    else
        epilogue<T>(acc, item.tile, item.n0, item.m0, m, n_out, out_mul, bias, y, 0, 1, nullptr,
                    nullptr, ConsumerSync{});
}

// The producer of the persistent GEMMs (one thread): for each stage of each of the CTA's
// items, W's stage into a slot of the W ring (issue_w(dst, stage, n0, bar, policy), w_bytes),
// then its kHalves 64-k halves of x into slots of the x ring. A slot's n-th refill (n >=
// 1) waits for its n-th release, the phase of parity (n - 1) & 1.
template <int kHalves, class Items, class IssueW>
__device__ __forceinline__ void produce(const Items &items, const Ring &wr, const Ring &xr,
                                        uint32_t w_bytes, const CUtensorMap &xmap, int stage_k,
                                        IssueW issue_w) {
    // W is read again by the CTAs of the other tiles of x, if any
    const uint64_t w_policy = items.m > items.bn ? evict_last_policy() : evict_first_policy();
    const uint64_t x_policy = evict_last_policy();
    RingPos w, x;
    for (int64_t it = items.first(); it < items.end(); it += items.step()) {
        const auto item = items[it];
        for (int q = 0; q < item.stages; ++q) {
            const int gi = item.g_begin + q;
            if (w.wrapped) mbar_wait(wr.empty + 8 * w.slot, w.phase ^ 1u);
            mbar_expect(wr.full + 8 * w.slot, w_bytes);
            issue_w(wr.at + w.slot * wr.bytes, gi, item.n0, wr.full + 8 * w.slot, w_policy);
            w.next(wr.n);
#pragma unroll
            for (int h = 0; h < kHalves; ++h) {
                if (x.wrapped) mbar_wait(xr.empty + 8 * x.slot, x.phase ^ 1u);
                mbar_expect(xr.full + 8 * x.slot, xr.bytes);
                tma_load(xr.at + x.slot * xr.bytes, xmap, gi * stage_k + h * kBK,
                         static_cast<int>(item.m0), xr.full + 8 * x.slot, x_policy);
                x.next(xr.n);
            }
        }
    }
}

template <class T, class Src, int BN, int kCtas, bool kEven>
__global__ void __launch_bounds__(kTThreads, kCtas)
tiled_gemm90_kernel(Src src, const float *__restrict__ codebook, int k,
                    const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                    int64_t n_out, const typename T::storage *__restrict__ bias,
                    typename T::storage *__restrict__ y, int splits, float *__restrict__ partials,
                    unsigned *__restrict__ counters, int64_t whole,
                    const __grid_constant__ StreamMaps maps) {
    using Dec = typename Src::Dec;
    using C = TiledGemmConfig<Src, BN, kCtas>;
    static_assert(C::kBuilt, "the x ring needs four halves");
    constexpr int RX = C::kXRing, RW = C::kWRing, K = Dec::kK;
    static_assert(RX % 2 == 0, "a stage's two x halves in slots 2i, 2i + 1");
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
    const uint32_t x_at = smem_address(base), w_at = x_at + RX * C::kX;
    uint32_t *table = reinterpret_cast<uint32_t *>(base + RX * C::kX + RW * C::kW);
    using Rg = Rings<RX, C::kX, RW, C::kW>;
    __shared__ alignas(8) uint64_t bars[Rg::kBars];
    const Rg rings(x_at, bars);
    const Ring &xr = rings.x, &wr = rings.w;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const int64_t groups = (k_in + kStageK - 1) / kStageK;
    const auto items = make_walk<kEven>(m, n_out, groups, BN, whole, splits);
    if (tid == 0) rings.init();
    const BookEntry book = book_entry<Dec>(codebook, k);
    float out_mul;
    if constexpr (C::kQuads) out_mul = src.out_mul(fill_quad_table<Dec, 16>(table, book));
    else out_mul = fill_source_tables<T, C::kCopies>(src, table, book);

    // The producer's registers to the consumers: 40 a producer thread; a consumer 232 with
    // one CTA an SM, 96 with two (launched at 80: 384 x 80 = 128 x 40 + 256 x 96 + 1024;
    // N = 64 at two CTAs: 80 a consumer spilled in the loop)
    constexpr int kConsumerRegs = kCtas == 1 ? 232 : 96;
    if (warp >= kThreads90 / 32) {  // the producer: W a stage, then x's two halves
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == kThreads90)
            produce<2>(items, wr, xr, src.stage_bytes(), maps.x, kStageK,
                       [&](uint32_t dst, int gi, int64_t n0, uint32_t bar, uint64_t policy) {
                           src.issue(dst, maps, gi, n0, bar, policy);
                       });
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    const auto my_table = lane_table<C::kCopies>(table);
    [[maybe_unused]] const QuadTable<16> quads = [&] {  // (its lane offset is opaque: only where used)
        if constexpr (C::kQuads) return quad_table<16>(table);
        else return QuadTable<16>{};
    }();
    const int g = lane >> 2, t = lane & 3;
    // the segments of lanes 4 g .. 4 g + 3 of the warp's row tile (swizzled: a load's
    // 16-byte unit XORed with its 128-byte line's index, the same for all of a lane's
    // loads: their 4K-byte span never crosses a line), rows g and g + 8's scales
    const uint32_t seg_rel = (warp * tiled::kLanes + 4 * g) * 8 * K;  // in a 1024-byte-aligned slot
    const uint32_t seg_at = pinned(w_at + seg_rel);
    const uint32_t line_xor = pinned(Src::kSwizzled ? ((seg_rel >> 7) & 7) << 4 : 0u);
    const uint32_t s_at = pinned(w_at + src.s_offset(warp, g));
    const uint32_t sel = pinned(K == 4 ? 0x4440u | t : static_cast<uint32_t>(2 * K * t));
    // y through the staging buffer after the table where the stores can be 16 bytes
    const uint32_t staging = smem_address(table) + C::kTable;
    const bool staged_y =
        staged_epilogue(BN) && n_out % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;

    float acc[kAcc];  // (each item's first wgmma overwrites them)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    // A fragments of the two k16 steps of a chunk, two chunks' buffers: chunk c is decoded
    // while chunk c - 1 may still multiply. (Four buffers, three chunks in flight, measured
    // no faster: ptxas then serializes the wgmmas, C7515, unable to prove a buffer free.)
    uint32_t a[2][2][4];
    // Ring positions: a stage's x halves are slots xs and xs + 1 (xs even), of one phase.
    int xs = 0, ws = 0;
    uint32_t x_phase = 0, w_phase = 0;
    XHalves<C::kX> xh = rings.halves();
    for (int64_t it = items.first(); it < items.end(); it += items.step()) {
        const auto item = items[it];
        for (int q = 0; q < item.stages; ++q) {
            const uint32_t w_slot = ws * C::kW + mbar_wait(wr.full + 8 * ws, w_phase);
            // the g's segments in the slot: their span (4 x 8K bytes) starts on its own
            // size, so a load at `at` is seg_base ^ at, swizzled ^ line_xor too (one LOP3);
            // line_xor pinned a stage, or ptxas keeps eight such addresses a lane across
            // the loop (N = 256 spilled and reloaded them every stage)
            const uint32_t seg_base = seg_at + w_slot, lx = pinned(line_xor);
            uint32_t sa[2], sc[2];  // rows g and g + 8's scales: chunks 0, 2 and 1, 3
            src.scale_words(s_at + w_slot, sa);
            src.scale_words(s_at + w_slot + src.s_row8(), sc);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t w[4][K];  // half h of segment q of the four
#pragma unroll
                for (int sq = 0; sq < 4; ++sq) {
                    const int at = sq * 8 * K + h * 4 * K;  // of the half in the g's segments
                    const uint32_t a = Src::kSwizzled ? seg_base ^ lx ^ at : seg_base + at;
                    if (h == 0) load_half_segment<K, 0>(a, w[sq]);
                    else load_half_segment<K, 1>(a, w[sq]);
                }
                if (h == 1) mbar_arrive(wr.empty + 8 * ws);  // the W slot is read
#pragma unroll
                for (int sq = 0; sq < 4; ++sq) shift_half<K>(w[sq], sel);
                const uint64_t b = xh.wait(xs + h, x_phase);
#pragma unroll
                for (int u = 0; u < 2; ++u) {  // chunk 2h + u: rows' groups 2u (row g), 2u + 1
                    // the chunk's table entries first, their loads in flight while the
                    // wgmmas of chunk 2h + u - 2 finish (at N = 128 the loads' latency
                    // was the stall: ncu, bench/RESULTS.md session 18)
                    uint32_t pe[2][2][2];  // [k16 step][segment][row g, g + 8]
#pragma unroll
                    for (int st = 0; st < 2; ++st)    // k16 step: elements 16 st + 2t (+ 8)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {  // segment 2 st + e: elements 16 st + 8 e + 2t
                            const uint32_t(&seg)[K] = w[2 * st + e];
                            if constexpr (C::kQuads) {
                                // groups 2u and 2u + 1 at bits 0 and 16 of word u: one byte
                                // of two pair indices, row g's low, one load of both entries
                                const uint32_t x = seg[u] & 0x000F000Fu;
                                const uint2 q = quads(x + (x >> 12), 0);
                                pe[st][e][0] = q.x, pe[st][e][1] = q.y;
                            } else {
                                pe[st][e][0] = gathered_entry<K>(seg, 2 * u, sel, my_table);
                                pe[st][e][1] = gathered_entry<K>(seg, 2 * u + 1, sel, my_table);
                            }
                        }
                    wgmma_wait<1>();  // chunk 2h + u - 2 is done: a[u] is free
                    if (u == 1) xh.release_before(xs + h);  // so are the x half before's chunks
                    auto &ab = a[u];
#pragma unroll
                    for (int st = 0; st < 2; ++st)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {  // chunk 2h + u's scales: half h of word u
                            ab[st][2 * e] = hmul2_by_half<T>(pe[st][e][0], sa[u], h);
                            ab[st][2 * e + 1] = hmul2_by_half<T>(pe[st][e][1], sc[u], h);
                        }
                    wgmma_fence();
#pragma unroll
                    for (int st = 0; st < 2; ++st)
                        wgmma(typename NTag<BN>::type{}, T{}, acc, ab[st], b + ((64 * u + 32 * st) >> 4),
                              q + h + u + st > 0);  // (the item's first: D = A B)
                    wgmma_commit();
                }
            }
            if ((xs += 2) == RX) xs = 0, x_phase ^= 1u;
            if (++ws == RW) ws = 0, w_phase ^= 1u;
        }
        wgmma_wait<0>();
        fence_operands(acc);
        store_item<T, BN>(acc, items, item, m, n_out, out_mul, bias, y, partials, counters, staged_y,
                          staging);
    }
}

// The map of x that the persistent GEMMs' producers read: 64-k halves of bn rows, in the
// wgmma's 128-byte-swizzled layout.
cudaError_t x_halves_map(CUtensorMap *map, const void *x, int64_t m, int64_t k_in, int bn) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k_in), static_cast<cuuint64_t>(m)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k_in) * 2};
    const cuuint32_t box[2] = {kBK, static_cast<cuuint32_t>(bn)};
    return tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, x, dims, strides, box,
                      CU_TENSOR_MAP_SWIZZLE_128B);
}

// A persistent GEMM's launch (tiled, GGUF): x's map (halves of BN rows), the split
// arguments, the tiles left whole, and the grid: one CTA a work item (tile, split) or the
// even walk's plan's CTAs (a workspace slot each), at most kCtas an SM; and
// run(std::true_type) for the even walk's plans (m <= kStream90MaxM), else
// run(std::false_type).
struct PersistentLaunch {
    gemm::SplitArgs sp;
    int64_t whole, grid;
};
template <int BN>
cudaError_t persistent_launch(const GemmPlan &plan, const void *x, int64_t m, int64_t k_in,
                              void *workspace, size_t workspace_bytes, int ctas,
                              StreamMaps &maps, PersistentLaunch &l) {
    cudaError_t err = x_halves_map(&maps.x, x, m, k_in, BN);
    if (err != cudaSuccess) return err;
    int sms = 0;
    if ((err = sm_count(&sms)) != cudaSuccess) return err;
    l.sp = gemm::split_args(plan, BN, workspace, workspace_bytes);
    l.whole = l.sp.splits > 1 ? plan.whole : 0;
    const int64_t want = l.sp.even ? plan.room : l.whole + (plan.tiles - l.whole) * l.sp.splits;
    const int64_t room = static_cast<int64_t>(sms) * ctas;
    l.grid = want < room ? want : room;
    return cudaSuccess;
}
template <int BN, class Run>
cudaError_t on_walk(const gemm::SplitArgs &sp, Run &&run) {
    if constexpr (BN <= kStream90MaxM)
        if (sp.even) return run(std::true_type{});
    return run(std::false_type{});
}

template <class T, int K, int BN, int kCtas>
cudaError_t launch_tiled_bn(const TiledSrc<T, K> &src, const float *codebook, int k,
                            const void *x, int64_t m, int64_t k_in, int64_t n_out,
                            const void *bias, void *y, const GemmPlan &plan, void *workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
    using Src = TiledSrc<T, K>;
    using C = TiledGemmConfig<Src, BN, kCtas>;
    StreamMaps maps;
    cudaError_t err = source_maps(src, k_in, n_out, maps);
    if (err != cudaSuccess) return err;
    PersistentLaunch l;
    err = persistent_launch<BN>(plan, x, m, k_in, workspace, workspace_bytes, kCtas, maps, l);
    if (err != cudaSuccess) return err;
    const gemm::SplitArgs &sp = l.sp;
    using St = typename T::storage;
    return on_walk<BN>(sp, [&](auto even) {
        constexpr auto kernel = tiled_gemm90_kernel<T, Src, BN, kCtas, decltype(even)::value>;
        if ((err = allow_smem<kernel>(C::bytes())) != cudaSuccess) return err;
        cudaGetLastError();
        kernel<<<static_cast<unsigned>(l.grid), kTThreads, C::bytes(), stream>>>(
            src, codebook, k, static_cast<const St *>(x), m, k_in, n_out,
            static_cast<const St *>(bias), static_cast<St *>(y), sp.splits, sp.partials,
            sp.counters, l.whole, maps);
        return launch_error();
    });
}

template <class T, int K>
cudaError_t launch_tiled(const TiledSrc<T, K> &src, const float *codebook, int k, const void *x,
                         int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                         void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    const int ctas = tiled_ctas(m, k_in, n_out);
    const GemmPlan plan = tiled90_plan(m, k_in, n_out, ctas);
    auto launch = [&](auto bn, auto kctas) {
        return launch_tiled_bn<T, K, decltype(bn)::value, decltype(kctas)::value>(
            src, codebook, k, x, m, k_in, n_out, bias, y, plan, workspace, workspace_bytes, stream);
    };
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    switch (plan.bm) {
    case 16: return launch(std::integral_constant<int, 16>{}, Two{});
    case 32:
        return ctas == 2 ? launch(std::integral_constant<int, 32>{}, Two{})
                         : launch(std::integral_constant<int, 32>{}, One{});
    case 64:
        return ctas == 2 ? launch(std::integral_constant<int, 64>{}, Two{})
                         : launch(std::integral_constant<int, 64>{}, One{});
    case 128: return launch(std::integral_constant<int, 128>{}, One{});
    case 256: return launch(std::integral_constant<int, 256>{}, One{});
    }
    return cudaErrorInvalidValue;
}


// ---- the GGUF GEMM: A decoded from the file's blocks, x as the TMA lays it ---------------
//
// GGUF weights from a few dozen rows of x (prefill) on the tiled GEMM's CTA: the producer
// warpgroup, two consumer warpgroups, rings with full and empty mbarriers, work items and
// epilogue are those above; W is read as the file stores it. A W stage is 256 elements of
// k of the CTA's 128 rows (one k-quant super-block, or eight 32-element blocks, a row):
// one TMA box of the rows' bytes, then the stage's four 64-k halves of x. Lane (g, t) of
// warp w needs, of each 32-element chunk of rows 16 w + g and + 8, the pairs of elements
// 16 st + 8 e + 2t, + 1 (st, e = 0, 1): the wgmma's A fragments, so x needs no reordering.
// In every format those two elements' codes lie in two bytes at an even offset (or in
// the nibbles or bits of such bytes), which the lane loads as they are (LDS.U16) and
// spreads to the low bytes of a pair's halves. A pair is then (q - off) a + b for its scale
// group: a and b in float32 from d, dmin and the sub-block scales (exactly ggml's products);
// in packed halves of T (a and b rounded to T, one fma: three roundings, ~1e-3 of W's size
// in fp16), but for Q8_0 with bf16 x (codes past bf16's mantissa: float32, rounded once).
namespace gg {

constexpr int kStageK = 256;  // elements of k a W stage

// The two bytes at `at` (even) in bytes 0 and 2 of a word.
__device__ __forceinline__ uint32_t pair_bytes(uint32_t at) {
    return __byte_perm(static_cast<uint32_t>(lds_u16(at)), 0u, 0x4140u);
}

// Codes c of a pair (bytes 0 and 2) under fp16's exponent byte of 1024 (bytes 1 and 3:
// 0x64), the words a format's chunk() gives: for fp16 the exact pair 1024 + c (or 64 + c:
// high_nibbles), for bf16 bytes 0 and 2 as they are. One LOP3 each: (v & mask) | 0x64006400, (v ^ flip) |
// 0x64006400, and c | (v & mask) (a code's high bits).
__device__ __forceinline__ uint32_t with_exponent(uint32_t v, uint32_t mask) {
    return lop3<0xEA>(v, mask, 0x64006400u);  // (a & b) | c
}
__device__ __forceinline__ uint32_t with_exponent_xor(uint32_t v, uint32_t flip) {
    return lop3<0xBE>(v, flip, 0x64006400u);  // (a ^ b) | c
}
__device__ __forceinline__ uint32_t with_bits(uint32_t c, uint32_t v, uint32_t mask) {
    return lop3<0xF8>(c, v, mask);  // a | (b & c)
}
// A pair's high nibbles (bits 4..7 of bytes 0 and 2) as code words. fp16: left where they
// are, under the exponent byte 0x54 (64, whose mantissa step is 1/16), the word is exactly
// 64 + c in one LOP3 (the decoder's base() of these words, kHighBase, takes it back to c;
// a code's high bits may sit at bits 8, 9: codes of up to 6 bits); bf16 (7 mantissa bits,
// below bit 7): shifted to bits 0..3, as with_exponent.
constexpr float kHighBase = 64.0f;
// The bit above a high_nibbles<T> word's 4-bit code, where a code's higher bits go.
template <class T>
constexpr int kHighTop = std::is_same_v<T, F16> ? 8 : 4;
template <class T>
__device__ __forceinline__ uint32_t high_nibbles(uint32_t v) {
    if constexpr (std::is_same_v<T, F16>) return lop3<0xEA>(v, 0x00F000F0u, 0x54005400u);
    else return with_exponent(v >> 4, 0x000F000Fu);
}

// value = (q - kOff) a + b for a pair of codes (words with_exponent or, fp16, high_nibbles
// gives), as a pair of T; kBits: the codes' width.
template <class T, int kBits>
struct Affine;
template <int kBits>
struct Affine<F16, kBits> {
    static_assert(kBits <= 8, "codes under fp16's 1024 exponent (with_exponent)");
    uint32_t a, b;
    __device__ static Affine of(float a, float b) { return {pack2(F16{}, a, a), pack2(F16{}, b, b)}; }
    // a = d (fp16 bits), b = 0
    __device__ static Affine of_half(uint32_t d) { return {__byte_perm(d, 0u, 0x1010u), 0u}; }
    // (s - off) d and (m - off) e for the small integers s, m in bytes 0 and 2 of `sm`
    // (with_exponent: 1024 + s, 1024 + m, exact less 1024 + off) and the fp16 pair (d, e):
    // each product rounded once, as `of` rounds the float32 ones
    __device__ static uint32_t products(uint32_t sm, float off, uint32_t de) {
        return hmul2<F16>(hadd2<F16>(sm, splat<F16>(-(1024.0f + off))), de);
    }
    // (a, b) = (s d, m e)
    __device__ static Affine of_products(uint32_t sm, uint32_t de) {
        const uint32_t w = products(sm, 0.0f, de);
        return {__byte_perm(w, 0u, 0x1010u), __byte_perm(w, 0u, 0x3232u)};
    }
    // base: the code words' (1024: with_exponent, kHighBase: high_nibbles)
    template <int kOff, bool kMin>
    __device__ uint32_t value(uint32_t codes, float base) const {
        const uint32_t q = hadd2<F16>(codes, splat<F16>(-(base + kOff)));  // base + c - (base + kOff), exact
        return kMin ? hfma2<F16>(q, a, b) : hmul2<F16>(q, a);
    }
};
// bf16, codes of up to 7 bits: the same words read as bf16 are 2^66 (128 + c) (0x64 and
// the code's top bit are the exponent, c < 128 the 7 mantissa bits), so q - kOff is one
// exact HADD2 to 2^66 (c - kOff), and a is kept as bf16(a 2^-66) = 2^-66 bf16(a): then
// one HFMA2, as for fp16. Three roundings (a, b and the sum; float32 rounds only the sum),
// each within bf16's own 2^-9.
template <int kBits>
struct Affine<BF16, kBits> {
    static_assert(kBits <= 7, "codes within bf16's mantissa (8-bit codes: Affine<BF16, 8>)");
    uint32_t a, b;
    __device__ static Affine of(float a, float b) { return {splat<BF16>(a * 0x1p-66f), splat<BF16>(b)}; }
    __device__ static Affine of_half(uint32_t d) { return of(f16_bits_to_f32(static_cast<uint16_t>(d)), 0.0f); }
    template <int kOff, bool kMin>
    __device__ uint32_t value(uint32_t codes, float) const {  // (fp16's word base)
        const uint32_t q = hadd2<BF16>(codes, splat<BF16>(-0x1p66f * (128 + kOff)));  // exact
        return kMin ? hfma2<BF16>(q, a, b) : hmul2<BF16>(q, a);
    }
};
// bf16, 8-bit codes (Q8_0's 128 + q reaches 255, past bf16's mantissa): in float32,
// rounded once.
template <>
struct Affine<BF16, 8> {
    float a, b;
    __device__ static Affine of(float a, float b) { return {a, b}; }
    __device__ static Affine of_half(uint32_t d) { return {f16_bits_to_f32(static_cast<uint16_t>(d)), 0.0f}; }
    template <int kOff, bool kMin>
    __device__ uint32_t value(uint32_t codes, float) const {  // (fp16's word base)
        // 0x4B0000c is the float 2^23 + c: minus 2^23 + kOff, exact
        const float q0 = __uint_as_float(__byte_perm(codes, 0x4B000000u, 0x7440u)) - (8388608.0f + kOff);
        const float q1 = __uint_as_float(__byte_perm(codes, 0x4B000000u, 0x7442u)) - (8388608.0f + kOff);
        return pack2(BF16{}, fmaf(q0, a, b), fmaf(q1, a, b));
    }
};

// A format's decoder: kStageBytes of a row's stage (kBox in shared memory: rows g = 0..7
// of a warp fall in distinct banks, Q6_K's rows padded for it), Row (what a row's stage holds for
// all its chunks: scales, high bits), Half (the codes of the chunks 2h, 2h + 1 of x half h,
// loaded for kSpan halves at once: those that share their bytes; half<T>, for the words
// T takes), and chunk<T>(): chunk 2h + u's code words [st][e] and scale groups [st];
// base(h, u, st): fp16 code words' base (1024, or kHighBase where chunk() keeps high
// nibbles in place); kBits: the codes' width (Affine);
// kDeepXRing: a deeper ring measured faster (gg::max_x_ring).
//
// Q4_0 and Q8_0: eight 32-element blocks of an fp16 d and codes; Codes::load(q, t, c)
// gives the lane's code words [st][e] of the block whose codes start at q; value
// (q - kOff) d.
template <class Codes>
struct Block32G {
    using Fmt = typename Codes::Fmt;
    static constexpr int kStageBytes = 8 * Fmt::kBytes, kBox = kStageBytes, kSpan = 1;
    static constexpr int kOff = Codes::kOff, kBits = Codes::kBits;
    static constexpr bool kMin = false, kDeepXRing = false;
    struct Row {};
    struct Half {
        uint32_t q[2][2][2], d[2];  // [u][st][e]
    };
    __device__ static Row row(uint32_t, int) { return {}; }
    template <class T>
    __device__ static Half half(uint32_t at, const Row &, int h, int t) {
        Half w;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const uint32_t blk = at + Fmt::kBytes * (2 * h + u);
            w.d[u] = lds_u16(blk);
            Codes::template load<T>(blk + 2, t, w.q[u]);
        }
        return w;
    }
    template <class T>
    __device__ static void chunk(const Row &, const Half &w, int, int u, uint32_t (&c)[2][2],
                                 Affine<T, kBits> (&f)[2]) {
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e) c[st][e] = w.q[u][st][e];
        f[0] = f[1] = Affine<T, kBits>::of_half(w.d[u]);
    }
    __device__ static constexpr float base(int, int, int st) { return Codes::base(st); }
};

// Q4_0: element i < 16 in the low nibble of code byte i, i >= 16 in the high one of byte
// i - 16; offset 8.
struct Q4_0Codes {
    using Fmt = gguf::Q4_0;
    static constexpr int kOff = 8, kBits = 4;
    __device__ static constexpr float base(int st) { return st ? kHighBase : 1024.0f; }  // fp16 words
    template <class T>
    __device__ static void load(uint32_t q, int t, uint32_t (&c)[2][2]) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const uint32_t v = pair_bytes(q + 8 * e + 2 * t);
            c[0][e] = with_exponent(v, 0x000F000Fu);
            c[1][e] = high_nibbles<T>(v);
        }
    }
};
// Q8_0: int8 codes (byte ^ 0x80 is q + 128).
struct Q8_0Codes {
    using Fmt = gguf::Q8_0;
    static constexpr int kOff = 128, kBits = 8;
    __device__ static constexpr float base(int) { return 1024.0f; }
    template <class T>
    __device__ static void load(uint32_t q, int t, uint32_t (&c)[2][2]) {
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e) c[st][e] = with_exponent_xor(pair_bytes(q + 16 * st + 8 * e + 2 * t), 0x00800080u);
    }
};
using Q4_0G = Block32G<Q4_0Codes>;
using Q8_0G = Block32G<Q8_0Codes>;

// Q4_K / Q5_K: one super-block of 144 / 176 bytes: d, dmin, 12 bytes of 6-bit scales and
// mins, (Q5_K: qh, 32 bytes: bit s of byte l is element l of sub-block s's fifth bit), qs:
// sub-block s (chunk s) in the low (even s) or high nibbles of qs[32 (s / 2) ..]; value
// (d sc) q - (dmin m).
template <bool kFifthBit>
struct QK45G {
    using Fmt = gguf::QK_45<kFifthBit>;
    static constexpr int kStageBytes = kFifthBit ? 176 : 144, kBox = kStageBytes, kSpan = 1, kOff = 0;
    static constexpr int kQs = kFifthBit ? 48 : 16, kBits = kFifthBit ? 5 : 4;
    static constexpr bool kMin = true, kDeepXRing = true;
    struct Row {
        uint4 h;             // d, dmin, scales[12]
        uint32_t qh[2][2];   // [st][e] (Q5_K)
    };
    struct Half {
        uint32_t q[2][2];  // [st][e]: low nibbles chunk 2h, high 2h + 1
    };
    __device__ static Row row(uint32_t at, int t) {
        Row r;
        r.h = lds_u32x4(at);
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                r.qh[st][e] = kFifthBit ? pair_bytes(at + 16 + 16 * st + 8 * e + 2 * t) : 0u;
        return r;
    }
    template <class T>
    __device__ static Half half(uint32_t at, const Row &, int h, int t) {
        Half w;
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e) w.q[st][e] = pair_bytes(at + kQs + 32 * h + 16 * st + 8 * e + 2 * t);
        return w;
    }
    template <class T>
    __device__ static void chunk(const Row &r, const Half &w, int h, int u, uint32_t (&c)[2][2],
                                 Affine<T, kBits> (&f)[2]) {
        const int s = 2 * h + u;  // sub-block
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                // the fifth bit (bit s of qh) to bit 4, or 8 above a high nibble kept in place
                const int top = u ? kHighTop<T> : 4;
                c[st][e] = u ? high_nibbles<T>(w.q[st][e]) : with_exponent(w.q[st][e], 0x000F000Fu);
                if constexpr (kFifthBit)
                    c[st][e] = with_bits(c[st][e], s <= top ? r.qh[st][e] << (top - s) : r.qh[st][e] >> (s - top),
                                         0x00010001u << top);
            }
        uint32_t sc, mn;
        gguf::scales_mins_k4(r.h.y, r.h.z, r.h.w, s >> 2, sc, mn);
        if constexpr (std::is_same_v<T, F16>) {  // (sc, mn) times (d, -dmin) in one HMUL2
            const uint32_t j = s & 3;
            const uint32_t scale_min = with_exponent(__byte_perm(sc, mn, j | (j + 4) << 8), 0x00FF00FFu);
            f[0] = f[1] = Affine<T, kBits>::of_products(scale_min, r.h.x ^ 0x80000000u);
        } else {
            const float d = gguf::half_lo(r.h.x), dmin = gguf::half_hi(r.h.x);
            f[0] = f[1] = Affine<T, kBits>::of(d * gguf::byte_minus(sc, s & 3, 0.0f),
                                               -(dmin * gguf::byte_minus(mn, s & 3, 0.0f)));
        }
    }
    __device__ static constexpr float base(int, int u, int) { return u ? kHighBase : 1024.0f; }
};

// Q6_K: one super-block of 210 bytes (on 2 bytes: the box starts on the 16 bytes at or
// before it, the row's stage (210 stage) % 16 bytes in, rows of 240 bytes): ql[128], qh[64], 16 int8 scales (one a 16 elements: a k16
// step), fp16 d. Chunk c: half hf = c / 4, quadrant r = c % 4: 4 bits of ql[64 hf + 32 (r %
// 2) + l] (high nibble from r = 2), bits 2r of qh[32 hf + l]; value d sc (q - 32).
struct Q6_KG {
    using Fmt = gguf::Q6_K;
    static constexpr int kStageBytes = 210, kBox = 240, kSpan = 2, kOff = 32, kBits = 6;
    static constexpr bool kMin = false, kDeepXRing = false;
    struct Row {
        uint32_t sc[8];  // scale bytes 2i, 2i + 1
        float d;
        uint32_t d2;     // d's fp16 bits in both halves
    };
    struct Half {
        uint32_t ql[2][2][2], qh[2][2];  // [u][st][e], [st][e]: x halves 2 hf, 2 hf + 1
    };
    __device__ static Row row(uint32_t at, int) {
        Row r;
#pragma unroll
        for (int i = 0; i < 8; ++i) r.sc[i] = lds_u16(at + 192 + 2 * i);
        const uint32_t d = lds_u16(at + 208);
        r.d = f16_bits_to_f32(d);
        r.d2 = __byte_perm(d, 0u, 0x1010u);
        return r;
    }
    template <class T>
    __device__ static Half half(uint32_t at, const Row &, int h, int t) {
        Half w;
        const int hf = h >> 1;
#pragma unroll
        for (int st = 0; st < 2; ++st)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int l = 16 * st + 8 * e + 2 * t;
#pragma unroll
                for (int u = 0; u < 2; ++u) w.ql[u][st][e] = pair_bytes(at + 64 * hf + 32 * u + l);
                w.qh[st][e] = pair_bytes(at + 128 + 32 * hf + l);
            }
        return w;
    }
    template <class T>
    __device__ static void chunk(const Row &r, const Half &w, int h, int u, uint32_t (&c)[2][2],
                                 Affine<T, kBits> (&f)[2]) {
        const int hf = h >> 1, q = 2 * (h & 1) + u;  // quadrant
#pragma unroll
        for (int st = 0; st < 2; ++st) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                // the high bits (2q, 2q + 1 of qh) to bits 4, 5, or 8, 9 above a high nibble kept in place
                const int top = (h & 1) ? kHighTop<T> : 4;
                const uint32_t hi = 2 * q <= top ? w.qh[st][e] << (top - 2 * q) : w.qh[st][e] >> (2 * q - top);
                const uint32_t lo = (h & 1) ? high_nibbles<T>(w.ql[u][st][e]) : with_exponent(w.ql[u][st][e], 0x000F000Fu);
                c[st][e] = with_bits(lo, hi, 0x00030003u << top);
            }
            // scale byte 8 hf + 2 q + st: int8 (byte ^ 0x80 is sc + 128)
            if constexpr (!std::is_same_v<T, F16>)
                f[st] = Affine<T, kBits>::of(r.d * gguf::byte_minus(r.sc[4 * hf + q] ^ 0x8080u, st, 128.0f), 0.0f);
        }
        if constexpr (std::is_same_v<T, F16>) {
            // both steps' d sc in one HMUL2: the scale bytes (sc + 128) spread to bytes 0
            // and 2, less 128, times d
            const uint32_t w = __byte_perm(r.sc[4 * hf + q] ^ 0x8080u, 0u, 0x4140u);
            const uint32_t p = Affine<T, kBits>::products(with_exponent(w, 0x00FF00FFu), 128.0f, r.d2);
            f[0] = {__byte_perm(p, 0u, 0x1010u), 0u}, f[1] = {__byte_perm(p, 0u, 0x3232u), 0u};
        }
    }
    __device__ static constexpr float base(int h, int, int) { return (h & 1) ? kHighBase : 1024.0f; }
};

template <class Fmt>
struct Of;
template <> struct Of<gguf::Q4_0> { using type = Q4_0G; };
template <> struct Of<gguf::Q8_0> { using type = Q8_0G; };
template <> struct Of<gguf::Q4_K> { using type = QK45G<false>; };
template <> struct Of<gguf::Q5_K> { using type = QK45G<true>; };
template <> struct Of<gguf::Q6_K> { using type = Q6_KG; };

// x halves in flight at most (the W ring: a stage for every four, and one): 8, three W
// stages of 256 k; 12, four, for decoders with kDeepXRing (Q4_K, Q5_K) at N <= 32 (H100,
// m = 16 / 32 on 28672x8192 and 8192x28672: Q4_K fp16 72.0-76.6 against 75.0-79.1 us,
// bf16 (packed decode) 72.2-80.2 against 76.7-81.6, Q5_K 1-2% faster, 4096x14336 level;
// Q6_K and Q8_0 1-3% slower or level with 12, m = 64 mixed; 4, two stages, 13-26% slower
// everywhere; on an H200 16 and 24 halves 3-8% slower than 8: bench/RESULTS.md, sessions
// 28, 29 and 31).
template <class T, class F, int BN>
constexpr int max_x_ring() {
    return F::kDeepXRing && BN <= 32 ? 12 : kTMaxXRing;
}

// Shared memory: [x ring: RX halves of BN rows of 128 bytes][W ring: RW stages of 128 rows
// of kBox bytes][epilogue staging]; a W stage covers four x halves.
template <class T, class F, int BN>
struct Config {
    static constexpr int kX = BN * kRowBytes;
    static constexpr int kW = (kGemmRows * F::kBox + 1023) / 1024 * 1024;
    static constexpr int bytes_for(int x_ring) {
        return 1024 + x_ring * kX + (x_ring / 4 + 1) * kW + epi_bytes(BN);
    }
    static constexpr int kBudget = kSmem - kStatic;
    static constexpr int ring() {
        int r = max_x_ring<T, F, BN>();
        while (r > 4 && bytes_for(r) > kBudget) r -= 2;
        return r;
    }
    static constexpr int kXRing = ring(), kWRing = kXRing / 4 + 1;
    static constexpr bool kBuilt = bytes_for(kXRing) <= kBudget;
    static constexpr int bytes() { return bytes_for(kXRing); }
};

}  // namespace gg

template <class T, class F, int BN, bool kEven>
__global__ void __launch_bounds__(kTThreads, 1)
gguf_gemm90_kernel(int64_t m, int64_t k_in, int64_t n_out,
                   const typename T::storage *__restrict__ bias, typename T::storage *__restrict__ y,
                   int splits, float *__restrict__ partials, unsigned *__restrict__ counters,
                   int64_t whole, const __grid_constant__ StreamMaps maps) {
    using C = gg::Config<T, F, BN>;
    static_assert(C::kBuilt, "the rings fit");
    constexpr int RX = C::kXRing, RW = C::kWRing;
    constexpr int kAcc = BN / 2;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
    const uint32_t x_at = smem_address(base), w_at = x_at + RX * C::kX;
    const uint32_t staging = w_at + RW * C::kW;
    using Rg = Rings<RX, C::kX, RW, C::kW>;
    __shared__ alignas(8) uint64_t bars[Rg::kBars];
    const Rg rings(x_at, bars);
    const Ring &xr = rings.x, &wr = rings.w;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    const auto items = make_walk<kEven>(m, n_out, k_in / gg::kStageK, BN, whole, splits);
    if (tid == 0) rings.init();
    __syncthreads();

    if (warp >= kThreads90 / 32) {  // the producer: W a stage (one box), then x's four halves
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == kThreads90)
            produce<4>(items, wr, xr, kGemmRows * F::kBox, maps.x, gg::kStageK,
                       [&](uint32_t dst, int gi, int64_t n0, uint32_t bar, uint64_t policy) {
                           // the stage's bytes, from the 16 at or before them (4-byte elements)
                           const int64_t at = int64_t{gi} * F::kStageBytes;
                           tma_load(dst, maps.w, static_cast<int>((at & ~int64_t{15}) / 4),
                                    static_cast<int>(n0), bar, policy);
                       });
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int g = lane >> 2, t = lane & 3;
    const uint32_t row_a = pinned(w_at + static_cast<uint32_t>((warp * kTileRows + g) * F::kBox));
    const bool staged_y =
        staged_epilogue(BN) && n_out % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;

    float acc[kAcc];  // (each item's first wgmma overwrites them)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    uint32_t a[2][2][4];  // A fragments of a chunk's two k16 steps, two chunks' buffers
    RingPos ws, xs;
    XHalves<C::kX> xh = rings.halves();
    for (int64_t it = items.first(); it < items.end(); it += items.step()) {
        const auto item = items[it];
        for (int q = 0; q < item.stages; ++q) {
            const int64_t gi = item.g_begin + q;
            const uint32_t ra = row_a + ws.slot * C::kW + mbar_wait(wr.full + 8 * ws.slot, ws.phase) +
                                static_cast<uint32_t>((gi * F::kStageBytes) & 15);
            const uint32_t rb = ra + 8 * F::kBox;
            const typename F::Row row_ga = F::row(ra, t), row_gb = F::row(rb, t);
            typename F::Half wa, wb;
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                if (h % F::kSpan == 0) wa = F::template half<T>(ra, row_ga, h, t), wb = F::template half<T>(rb, row_gb, h, t);
                if (h == 3) mbar_arrive(wr.empty + 8 * ws.slot);  // the W slot is read
                const uint64_t b = xh.wait(xs.slot, xs.phase);
#pragma unroll
                for (int u = 0; u < 2; ++u) {  // chunk 2h + u
                    wgmma_wait<1>();  // chunk 2h + u - 2 is done: a[u] is free
                    if (u == 1) xh.release_before(xs.slot);  // so are the x half before's chunks
                    uint32_t ca[2][2], cb[2][2];
                    gg::Affine<T, F::kBits> fa[2], fb[2];
                    F::template chunk<T>(row_ga, wa, h, u, ca, fa);
                    F::template chunk<T>(row_gb, wb, h, u, cb, fb);
#pragma unroll
                    for (int st = 0; st < 2; ++st)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            a[u][st][2 * e] = fa[st].template value<F::kOff, F::kMin>(ca[st][e], F::base(h, u, st));
                            a[u][st][2 * e + 1] = fb[st].template value<F::kOff, F::kMin>(cb[st][e], F::base(h, u, st));
                        }
                    wgmma_fence();
#pragma unroll
                    for (int st = 0; st < 2; ++st)
                        wgmma(typename NTag<BN>::type{}, T{}, acc, a[u][st], b + ((64 * u + 32 * st) >> 4),
                              q + h + u + st > 0);  // (the item's first: D = A B)
                    wgmma_commit();
                }
                xs.next(RX);
            }
            ws.next(RW);
        }
        wgmma_wait<0>();
        fence_operands(acc);
        store_item<T, BN>(acc, items, item, m, n_out, 1.0f, bias, y, partials, counters, staged_y,
                          staging);
    }
}

template <class T, class F, int BN>
cudaError_t launch_gguf_bn(const void *blocks, const void *x, int64_t m, int64_t k_in,
                           int64_t n_out, const void *bias, void *y, const GemmPlan &plan,
                           void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    using C = gg::Config<T, F, BN>;
    StreamMaps maps;
    const int64_t row_bytes = k_in / gg::kStageK * F::kStageBytes;
    const cuuint64_t wdims[2] = {static_cast<cuuint64_t>(row_bytes / 4), static_cast<cuuint64_t>(n_out)},
                     wstrides[1] = {static_cast<cuuint64_t>(row_bytes)};
    const cuuint32_t wbox[2] = {F::kBox / 4, kGemmRows};
    cudaError_t err = tensor_map(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, blocks, wdims, wstrides, wbox);
    if (err != cudaSuccess) return err;
    PersistentLaunch l;  // (one CTA an SM)
    err = persistent_launch<BN>(plan, x, m, k_in, workspace, workspace_bytes, 1, maps, l);
    if (err != cudaSuccess) return err;
    const gemm::SplitArgs &sp = l.sp;
    using St = typename T::storage;
    return on_walk<BN>(sp, [&](auto even) {
        constexpr auto kernel = gguf_gemm90_kernel<T, F, BN, decltype(even)::value>;
        if ((err = allow_smem<kernel>(C::bytes())) != cudaSuccess) return err;
        cudaGetLastError();
        kernel<<<static_cast<unsigned>(l.grid), kTThreads, C::bytes(), stream>>>(
            m, k_in, n_out, static_cast<const St *>(bias), static_cast<St *>(y), sp.splits,
            sp.partials, sp.counters, l.whole, maps);
        return launch_error();
    });
}

template <class T, class F>
cudaError_t launch_gguf(const void *blocks, const void *x, int64_t m, int64_t k_in, int64_t n_out,
                        const void *bias, void *y, void *workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
    // the tiled GEMM's plan at one CTA an SM (two, as the tiled GEMM takes at 16..32 rows
    // of x, measured 5-25% slower: bench/RESULTS.md, session 15)
    const GemmPlan plan = tiled90_plan(m, k_in, n_out, 1);
    auto launch = [&](auto bn) {
        return launch_gguf_bn<T, F, decltype(bn)::value>(blocks, x, m, k_in, n_out, bias, y, plan,
                                                         workspace, workspace_bytes, stream);
    };
    switch (plan.bm) {
    case 16: return launch(std::integral_constant<int, 16>{});
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    case 256: return launch(std::integral_constant<int, 256>{});
    }
    return cudaErrorInvalidValue;
}

#endif  // KBIT_SM90A

}  // namespace

#if KBIT_SM90A

bool built() { return true; }

// (Tensor-map coordinates are 32-bit: rows and k below 2^31.)
bool fits_maps(int64_t k_in, int64_t n_out) { return k_in < (int64_t{1} << 31) && n_out < (int64_t{1} << 31); }
bool streams(const Bnb4Weight &w, int64_t k_in, int64_t n_out) {
    return fits_maps(k_in, n_out) && aligned(w.packed, 16) && aligned(w.absmax, 16) &&
           (k_in >> w.log2_blocksize) % 4 == 0;
}
bool streams(const KbitWeight &w, int64_t k_in, int64_t n_out) {
    if (!fits_maps(k_in, n_out)) return false;
    if (w.tiled) return true;  // (kbit_tile's arrays are on 16 bytes)
    const int64_t chunks = k_in / kChunk;
    return aligned(w.packed, 16) && aligned(w.absmax, 16) && chunks * w.k % 4 == 0 &&
           chunks * static_cast<int64_t>(absmax_align(w.fmt)) % 16 == 0;
}

cudaError_t matmul(const KbitWeight &w, kbit_dtype dtype, const void *x, int64_t m, int64_t k_in,
                   int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
    cudaError_t err = cudaErrorInvalidValue;
    const int sb = static_cast<int>(absmax_align(w.fmt));
    const auto *packed = static_cast<const uint8_t *>(w.packed);
    const auto *absmax = static_cast<const uint8_t *>(w.absmax);
    with_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, F32>) {
            with_k(w.k, [&](auto kc) {
                if (w.tiled) {
                    using Dec = TiledScale<T, kc.value>;
                    const Dec dec{{{packed, absmax, w.packed_bytes, w.absmax_bytes, w.tensor_scale},
                                   w.fmt, sb},
                                  tiled::geometry(n_out, k_in)};
                    if (streams(w, k_in, n_out))
                        err = launch_tiled<T>(TiledSrc<T, kc.value>{dec}, w.codebook, w.k, x, m,
                                              k_in, n_out, bias, y, workspace, workspace_bytes,
                                              stream);
                    else
                        err = launch<T, Dec, kTiled, 16>(dec, w.codebook, w.k, x, m, k_in, n_out,
                                                         bias, y, workspace, workspace_bytes, stream);
                } else {
                    using Dec = KbitAnyScale<T, kc.value>;
                    const Dec dec{{packed, absmax, w.packed_bytes, w.absmax_bytes, w.tensor_scale},
                                  w.fmt, sb};
                    if (m <= kStream90MaxM && streams(w, k_in, n_out))
                        err = launch_streamed<T>(StoredKbitSrc<T, kc.value>{dec}, w.codebook, w.k,
                                                 x, m, k_in, n_out, bias, y, workspace,
                                                 workspace_bytes, stream);
                    else
                        err = launch_stored<T>(dec, w.codebook, w.k, x, m, k_in, n_out, bias, y,
                                               workspace, workspace_bytes, stream);
                }
                return KBIT_SUCCESS;
            });
        }
        return KBIT_SUCCESS;
    });
    return err;
}

cudaError_t matmul(const Bnb4Weight &w, kbit_dtype dtype, const void *x, int64_t m, int64_t k_in,
                   int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
    cudaError_t err = cudaErrorInvalidValue;
    const auto *packed = static_cast<const uint8_t *>(w.packed);
    const auto *absmax = reinterpret_cast<const uint8_t *>(w.absmax);
    with_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, F32>) {
            auto run = [&](auto fmt) {
                using Dec = Bnb4Staged<T, decltype(fmt)>;
                const Dec dec{packed, absmax, w.packed_bytes, w.absmax_bytes, w.log2_blocksize - 5};
                if (m <= kStream90MaxM && streams(w, k_in, n_out))
                    err = launch_streamed<T>(Bnb4Src<T, decltype(fmt)>{dec, w.log2_blocksize}, nullptr,
                                             4, x, m, k_in, n_out, bias, y, workspace,
                                             workspace_bytes, stream);
                else
                    err = launch_stored<T>(dec, nullptr, 4, x, m, k_in, n_out, bias, y, workspace,
                                           workspace_bytes, stream);
            };
            if (w.fp4) run(bnb4::Fp4{});
            else run(bnb4::Nf4{});
        }
        return KBIT_SUCCESS;
    });
    return err;
}

bool gguf_reads(int ggml_type, const void *blocks, int64_t k_in, int64_t n_out) {
    const int64_t stage_k = ggml_type == gguf::kQ6_K ? 8 * gg::kStageK : gg::kStageK;
    return aligned(blocks, 16) && k_in % stage_k == 0 && fits_maps(k_in, n_out);
}

cudaError_t matmul_gguf(int ggml_type, kbit_dtype dtype, const void *blocks, const void *x,
                        int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                        void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    cudaError_t err = cudaErrorInvalidValue;
    with_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, F32>) {
            auto run = [&](auto fmt) {
                using F = typename gg::Of<decltype(fmt)>::type;
                err = launch_gguf<T, F>(blocks, x, m, k_in, n_out, bias, y, workspace,
                                        workspace_bytes, stream);
            };
            switch (ggml_type) {
            case gguf::kQ4_0: run(gguf::Q4_0{}); break;
            case gguf::kQ8_0: run(gguf::Q8_0{}); break;
            case gguf::kQ4_K: run(gguf::Q4_K{}); break;
            case gguf::kQ5_K: run(gguf::Q5_K{}); break;
            case gguf::kQ6_K: run(gguf::Q6_K{}); break;
            }
        }
        return KBIT_SUCCESS;
    });
    return err;
}

#else  // a build without sm_90: the GEMM of gemm.cuh serves every GPU

bool built() { return false; }
bool streams(const Bnb4Weight &, int64_t, int64_t) { return false; }
bool streams(const KbitWeight &, int64_t, int64_t) { return false; }
bool gguf_reads(int, const void *, int64_t, int64_t) { return false; }
cudaError_t matmul_gguf(int, kbit_dtype, const void *, const void *, int64_t, int64_t, int64_t,
                        const void *, void *, void *, size_t, cudaStream_t) {
    return cudaErrorNotSupported;
}
cudaError_t matmul(const KbitWeight &, kbit_dtype, const void *, int64_t, int64_t, int64_t,
                   const void *, void *, void *, size_t, cudaStream_t) {
    return cudaErrorNotSupported;
}
cudaError_t matmul(const Bnb4Weight &, kbit_dtype, const void *, int64_t, int64_t, int64_t,
                   const void *, void *, void *, size_t, cudaStream_t) {
    return cudaErrorNotSupported;
}

#endif

}  // namespace sm90
}  // namespace matmul
}  // namespace kbit
