// NF4 / FP4 (bitsandbytes-compatible 4-bit) on the GPU: kernels, launchers and the
// exported entries. The arithmetic and the byte layout are in formats/bnb4.h.
//
// Both directions work on chunks of 16 bytes of unpacked data (8 fp16/bf16 or 4 fp32
// elements, E/2 packed bytes), lane l of a warp on chunk l of 32 consecutive ones, so
// every load and store instruction of a warp touches one contiguous span.
//
// Quantize: a CTA takes a tile of 4096 elements (the largest blocksize) in 2 (16-bit)
// or 4 (fp32) rounds of 256 chunks; whole tiles arrive in shared memory by cp.async
// (the next one is copied while this one is computed). The lanes of
// a block reduce its absmax with shuffles (through shared memory beyond 32 chunks), one
// lane per round takes the scale's reciprocal, then each thread encodes its chunks with
// one bucket-table lookup per element (see fast_encode).
//
// Dequantize: each thread takes 8 chunks a step: their packed words (4 or 2 bytes) and
// block scales are loaded first, then each chunk becomes one 16-byte streaming store
// through the 16-entry table in shared memory. The double-quantized variant rebuilds
// each block scale from its 8-bit code, the 256-block's absmax2 and the offset.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/block/block_reduce.cuh>

#include "../core/cuda.cuh"
#include "../core/entries.h"
#include "../formats/bnb4.h"

namespace kbit {
namespace bnb4 {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kQuantTile = 4096;                          // elements per quantizer CTA step
constexpr int kQuantTileLog2 = 12;
constexpr int kDequantRounds = 8;                         // chunks per dequantizer thread step
constexpr int kPerSm = 8;                                 // resident CTAs per SM to aim for
// Quantize: up to 6 waves of resident CTAs, each CTA with at least 2 tiles (measured
// at 2^24..2^28 elements with 1, 2, 3, 4 and 6 waves: bench/RESULTS.md).
constexpr int kQuantMaxWaves = 6;
constexpr int kQuantMinTiles = 2;
// Dequantize: one step per thread, enough CTAs to cover about 2^33 elements before the
// loop strides (short-lived CTAs keep more loads in flight than looping ones).
constexpr int kDequantPerSm = 4096;
constexpr int kMeanThreads = 1024;                        // one CTA: a fixed summation order

static_assert(kQuantTile == kMaxBlock, "a quantizer tile holds whole blocks");
static_assert(kQuantTile == 1 << kQuantTileLog2, "kQuantTileLog2");
static_assert(kDqBlock == kThreads, "one CTA per 256-block of absmax values");

// bitsandbytes' reciprocal deviations (csrc/formats/bnb4.h).
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
    static constexpr int kLog2E = E == 8 ? 3 : 2;
    static constexpr int R = kQuantTile / (kThreads * E);  // quantizer rounds per tile
    static_assert(R <= kMinBlock / E, "a block spans at least R chunks");
};

// The E elements of a chunk held in a 16-byte word, as floats.
template <class T>
__device__ __forceinline__ void unpack_chunk(const uint4 &q, float (&x)[Chunk<T>::E]) {
    const typename T::storage *e = reinterpret_cast<const typename T::storage *>(&q);
#pragma unroll
    for (int k = 0; k < Chunk<T>::E; ++k) x[k] = load_f32(T{}, e[k]);
}

// The E input elements of chunk i0 (an element index) as loaded, zero past n (zero
// bits are +0.0 in every type).
__device__ __forceinline__ uint32_t raw_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ uint32_t raw_bits(uint16_t v) { return v; }
template <class T>
__device__ __forceinline__ uint4 load_chunk(const typename T::storage *__restrict__ in, int64_t i0,
                                            int64_t n, bool vec) {
    constexpr int E = Chunk<T>::E;
    constexpr int kBits = 128 / E;
    if (vec && i0 + E <= n) return __ldg(reinterpret_cast<const uint4 *>(in + i0));
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < E; ++k)
        if (i0 + k < n) w[k * kBits / 32] |= raw_bits(in[i0 + k]) << (k * kBits % 32);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// fold_abs over the E elements of a chunk. 16-bit input: the maximum |x| is taken on the
// packed pairs (HMNMX2, NaN ignored, nothing flushed), then folded once as a float. That
// is the same value: the conversion to float is exact and monotone, fp16 has no values
// that are float subnormals, and bf16 subnormals, which fold_abs flushes to 0, can only
// be the pair maximum when every element is a subnormal, a zero or NaN.
__device__ __forceinline__ float chunk_absmax(F32, const uint4 &q) {
    float m = fold_abs(kFoldStart, __uint_as_float(q.x));
    m = fold_abs(m, __uint_as_float(q.y));
    m = fold_abs(m, __uint_as_float(q.z));
    return fold_abs(m, __uint_as_float(q.w));
}
__device__ __forceinline__ float pair_max(__half2 m) {
    return __half2float(__hmax(__low2half(m), __high2half(m)));
}
__device__ __forceinline__ float pair_max(__nv_bfloat162 m) {
    return __bfloat162float(__hmax(__low2bfloat16(m), __high2bfloat16(m)));
}
template <class H2>
__device__ __forceinline__ float pair_absmax(const uint4 &q) {
    const H2 *h = reinterpret_cast<const H2 *>(&q);
    const H2 m01 = __hmax2(__habs2(h[0]), __habs2(h[1]));
    const H2 m23 = __hmax2(__habs2(h[2]), __habs2(h[3]));
    return fold_abs(kFoldStart, pair_max(__hmax2(m01, m23)));
}
__device__ __forceinline__ float chunk_absmax(F16, const uint4 &q) { return pair_absmax<__half2>(q); }
__device__ __forceinline__ float chunk_absmax(BF16, const uint4 &q) {
    return pair_absmax<__nv_bfloat162>(q);
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
// thresholds below v: the same code as formats/bnb4.h's encode() (the host's), for every v.
//
// Every step is one instruction: the bucket comes as kRoundMagicBits + bucket in the bits
// of fma(s, 64, kRoundMagic), which one LEA turns into the entry's address in a table
// address biased by kRoundMagicBits entries; base is stored as the float 2^23 + base, so
// base + (v > thr) is one FSET and one FADD whose low 4 bits are the code (FP4: the
// shift 4 * rank, + 4 by one FFMA); the codes enter the packed word by funnel shifts
// that drop the bits above them.
//
// The lanes of a warp look up random buckets, so the table is held in kBucketCopies
// copies, entry-major: copy c of entry i at tab[i * kBucketCopies + c], and lane l reads
// copy l % 16. An 8-byte load is served in two phases of 16 lanes; the 16 lanes of a
// phase read 16 different copies, whose entries lie in 16 different bank pairs
// (2c, 2c + 1) whatever the buckets: no bank conflicts, two wavefronts per lookup.
struct alignas(8) Bucket {
    float thr;   // the threshold inside this bucket, +inf if none
    float base;  // 2^23 + the thresholds in lower buckets (FP4: + 4 * magnitude rank)
};

constexpr float kRoundMagic = 12582912.0f;        // 1.5 * 2^23: adding it rounds to an integer
constexpr uint32_t kRoundMagicBits = 0x4B400000u;  // its bits; + bucket = the sum's bits
constexpr float kIntMagic = 8388608.0f;            // 2^23: the low bits of 2^23 + i are i

// kRoundMagicBits + bucket.
__device__ __forceinline__ uint32_t bucket_bits(Nf4, float v) {
    const float s = __saturatef(__fmaf_rn(v, 0.25f, 0.5f));
    return __float_as_uint(__fmaf_rn(s, 64.0f, kRoundMagic));
}
__device__ __forceinline__ uint32_t bucket_bits(Fp4, float v) {
    const float s = __saturatef(__fmul_rn(fabsf(v), 0.5f));
    return __float_as_uint(__fmaf_rn(s, 32.0f, kRoundMagic));
}
template <class Fmt>
__device__ __forceinline__ int bucket_of(Fmt, float v) {
    return static_cast<int>(bucket_bits(Fmt{}, v) - kRoundMagicBits);
}
constexpr int buckets(Nf4) { return 65; }
constexpr int buckets(Fp4) { return 33; }
constexpr int thresholds(Nf4) { return 15; }
constexpr int thresholds(Fp4) { return 7; }
constexpr int kBucketCopies = 16;

// Fills the (replicated) bucket table in shared memory; the caller synchronises.
template <class Fmt>
__device__ __forceinline__ void build_buckets(Bucket *tab) {
    for (int i = threadIdx.x; i < buckets(Fmt{}); i += blockDim.x) {
        float thr = INFINITY;
        int base = 0;
        for (int j = 0; j < thresholds(Fmt{}); ++j) {
            const float t = threshold(Fmt{}, j);
            const int b = bucket_of(Fmt{}, t);
            base += b < i;
            if (b == i) thr = t;
        }
        if (thresholds(Fmt{}) == 7) base *= 4;  // FP4: a shift count into kFp4Codes
        const Bucket e{thr, kIntMagic + static_cast<float>(base)};
#pragma unroll
        for (int c = 0; c < kBucketCopies; ++c) tab[i * kBucketCopies + c] = e;
    }
}

// Bytes from one entry of the table to the next (all copies of an entry lie between).
constexpr uint32_t kBucketStride = kBucketCopies * sizeof(Bucket);

// The shared-memory address of this lane's copy of the table less kRoundMagicBits
// entries (mod 2^32), so that entry bucket_bits() is the bucket's. (The shuffle keeps
// the compiler from splitting the bias back out into an add per lookup.)
__device__ __forceinline__ uint32_t biased_buckets(const Bucket *tab) {
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(tab)) +
                        (lane % kBucketCopies) * static_cast<uint32_t>(sizeof(Bucket));
    return __shfl_sync(kFull, at - kRoundMagicBits * kBucketStride, lane);
}
__device__ __forceinline__ Bucket lookup(uint32_t tab_at, uint32_t bits) {
    const float2 e = lds_float2(tab_at + bits * kBucketStride);
    return Bucket{e.x, e.y};
}

// 1.0f when a > b, else 0.0f (also for NaN): one FSET.
__device__ __forceinline__ float gt_one(float a, float b) {
    float r;
    asm("set.gt.f32.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// The code of v in the low 4 bits (the bits above are not part of it).
__device__ __forceinline__ uint32_t fast_encode(Nf4, uint32_t tab_at, float v) {
    const Bucket e = lookup(tab_at, bucket_bits(Nf4{}, v));
    return __float_as_uint(e.base + gt_one(v, e.thr));  // 2^23 + base + (v > thr), exact
}
constexpr uint32_t kFp4Codes = 0x32547610u;  // nibble r: the code bits of magnitude rank r
constexpr uint32_t kFp4Sign = 0x88888888u;   // the sign bit (8) in every nibble
__device__ __forceinline__ uint32_t fast_encode(Fp4, uint32_t tab_at, float v) {
    const float a = fabsf(v);
    const Bucket e = lookup(tab_at, bucket_bits(Fp4{}, v));
    // 2^23 + 4 * rank, + 4 when a > thr: the shift in its low 5 bits (the wrap mode uses
    // only those).
    const uint32_t shift = __float_as_uint(__fmaf_rn(gt_one(a, e.thr), 4.0f, e.base));
    const uint32_t codes = v < 0.0f ? kFp4Codes | kFp4Sign : kFp4Codes;  // -0.0, NaN: positive
    return __funnelshift_r(codes, 0u, shift);
}

// The E codes of a chunk packed in E/2 bytes: byte j = element 2j in the high nibble,
// element 2j + 1 in the low one. Each code enters at the top of w as w moves down 4 bits
// (one funnel shift, which also drops the bits above the code), so they go in from the
// lowest nibble's (element 1, 0, 3, 2, ...).
template <class T, class Fmt>
__device__ __forceinline__ uint32_t encode_chunk(uint32_t tab_at, const uint4 &q, float inv) {
    constexpr int E = Chunk<T>::E;
    float x[E];
    unpack_chunk<T>(q, x);
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < E / 2; ++j) {
        const uint32_t hi = fast_encode(Fmt{}, tab_at, bnb_mul(x[2 * j], inv));
        const uint32_t lo = fast_encode(Fmt{}, tab_at, bnb_mul(x[2 * j + 1], inv));
        w = __funnelshift_rc(w, lo, 4);
        w = __funnelshift_rc(w, hi, 4);
    }
    return E == 8 ? w : w >> 16;
}

// bnb_rcp (csrc/formats/bnb4.h) with its two 1024-bit maps copied to shared memory: reads from the
// constant bank serialise when the lanes of a warp hold different scales. Each map is 32
// words, one per bank, so lanes that read different words never share a bank and the
// lanes that read the same word get it broadcast: one wavefront per load.
constexpr int kRcpWords = 32;
struct RcpMaps {
    uint32_t plus[kRcpWords];
    uint32_t minus[kRcpWords];
};
__device__ __forceinline__ void build_rcp_maps(RcpMaps *maps) {
    if (threadIdx.x < kRcpWords) {
        maps->plus[threadIdx.x] = c_rcp_plus[threadIdx.x];
        maps->minus[threadIdx.x] = c_rcp_minus[threadIdx.x];
    }
}
__device__ __forceinline__ float table_rcp(float a, const RcpMaps *maps) {
    return bnb_rcp(a, maps->plus, maps->minus);
}

// ---- quantize ---------------------------------------------------------------------------

// Whole tiles travel through shared memory: each thread copies its R chunks of the CTA's
// next whole tile with cp.async (16 bytes each, L1 bypassed) into the stage buffer that
// is not in use, and reads them back itself once they have landed, so no registers hold
// loads in flight and no barrier is needed. In a stage buffer, chunk c of the tile lies
// at c: the 32 lanes of a warp read 512 contiguous bytes, four conflict-free wavefronts.
template <class T>
__device__ __forceinline__ void stage_tile(const typename T::storage *__restrict__ in,
                                           int64_t tile, uint4 *stage) {
    const uint4 *p = reinterpret_cast<const uint4 *>(in + tile * kQuantTile) + threadIdx.x;
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(stage + threadIdx.x));
#pragma unroll
    for (int r = 0; r < Chunk<T>::R; ++r)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                         at + r * kThreads * static_cast<uint32_t>(sizeof(uint4))),
                     "l"(p + r * kThreads)
                     : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits for this thread's copies but the latest `pending` groups.
template <int kPending>
__device__ __forceinline__ void stage_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// What every tile of a quantizer CTA needs besides its elements.
template <class T>
struct QuantState {
    static constexpr int kGroups = kQuantTile / Chunk<T>::E / 32;  // 32-chunk groups per tile
    uint32_t tab_at;          // biased_buckets of the bucket table
    const RcpMaps *rcp_maps;  // shared
    float *group_max;         // shared, kGroups
    float *block_max;         // shared, kGroups / 2
    int log2_bs;
    int log2_g;               // log2 of G, the chunks per block (G >= R)
    int64_t n, n_blocks, n_bytes;
    bool vec_out;
    float *absmax;
    uint8_t *packed;
};

// One tile, the R chunks of this thread as loaded in q (zero past n): block absmax, scale
// reciprocals, codes. kWhole: the tile lies inside the tensor and the output is aligned.
//
// The block maximum is reduced "transposed": in the first log2(R) shuffle steps each lane
// keeps half of its rounds and hands the other half to its partner, so that lane j of
// every aligned group of R lanes ends with round j's maximum over the group (the group
// lies in one block in every round, as G >= R) and the remaining steps move one value,
// not R. That lane then stores round j's absmax and takes its reciprocal, which the
// group shares by shuffles: one reciprocal per thread, not R.
template <class T, class Fmt, bool kWhole>
__device__ __forceinline__ void quantize_tile(const QuantState<T> &s, int64_t tile,
                                              const uint4 (&q)[Chunk<T>::R]) {
    constexpr int E = Chunk<T>::E;
    constexpr int kBytes = Chunk<T>::kBytes;
    constexpr int R = Chunk<T>::R;
    constexpr int kGroups = QuantState<T>::kGroups;
    const int G = 1 << s.log2_g;
    const int lane = threadIdx.x & 31;
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = chunk_absmax(T{}, q[r]);
#pragma unroll
    for (int off = 1, live = R; off < R; off <<= 1, live >>= 1) {
        // v[k] holds round k * off + (lane & (off - 1)): v[2k] and v[2k + 1] differ in bit off.
        const bool upper = lane & off;
#pragma unroll
        for (int k = 0; k < live / 2; ++k) {
            const float keep = upper ? v[2 * k + 1] : v[2 * k];
            const float give = upper ? v[2 * k] : v[2 * k + 1];
            v[k] = fmaxf(keep, __shfl_xor_sync(kFull, give, off));
        }
    }
    // The rest of the block within the warp (offsets at or past G are skipped: uniform).
    float own = v[0];  // round lane & (R - 1)
#pragma unroll
    for (int off = R; off < 32; off <<= 1)
        if (off < G) own = fmaxf(own, __shfl_xor_sync(kFull, own, off));
    const int own_chunk = (lane & (R - 1)) * kThreads + threadIdx.x;
    if (G > 32) {  // uniform: the whole CTA takes this branch or none of it
        if (lane < R) s.group_max[own_chunk >> 5] = own;  // lane j holds round j
        __syncthreads();
        if (threadIdx.x < 32) {  // one warp folds the group maxima of each block
            const int per = G / 32;  // groups per block: 2..32
            float g = threadIdx.x < kGroups ? s.group_max[threadIdx.x] : kFoldStart;
            for (int off = 1; off < per; off <<= 1) g = fmaxf(g, __shfl_xor_sync(kFull, g, off));
            if (threadIdx.x < kGroups && (threadIdx.x & (per - 1)) == 0)
                s.block_max[threadIdx.x >> (s.log2_g - 5)] = g;
        }
        __syncthreads();  // the next tile writes these only after all reads below
        own = s.block_max[own_chunk >> s.log2_g];
    }
    // The first R lanes of each block (in thread order) store rounds 0..R-1; with
    // blocks of more than 256 chunks they store the same value to the same place.
    const bool stores = (threadIdx.x & (G - 1)) < R;
    if (kWhole) {
        const int64_t b0 = tile << (kQuantTileLog2 - s.log2_bs);  // the tile's first block
        if (stores) s.absmax[b0 + (own_chunk >> s.log2_g)] = own;
    } else {
        const int64_t b = (tile * kQuantTile + static_cast<int64_t>(own_chunk) * E) >> s.log2_bs;
        if (stores && b < s.n_blocks) s.absmax[b] = own;
    }
    const float own_inv = table_rcp(own, s.rcp_maps);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int c = r * kThreads + threadIdx.x;
        const float inv = __shfl_sync(kFull, own_inv, r, R);
        const uint32_t w = encode_chunk<T, Fmt>(s.tab_at, q[r], inv);
        if (kWhole) {
            uint8_t *out = s.packed + tile * (kQuantTile / 2) + c * kBytes;
            if (kBytes == 4) *reinterpret_cast<uint32_t *>(out) = w;
            else *reinterpret_cast<uint16_t *>(out) = static_cast<uint16_t>(w);
        } else {
            const int64_t i0 = tile * kQuantTile + static_cast<int64_t>(c) * E;
            store_packed<kBytes>(s.packed, i0 >> 1, s.n_bytes, s.vec_out, w);
        }
    }
}

// One tile of the grid-stride loop: this thread's chunks are in (or on their way to)
// the stage buffer cur when the tile is whole (then the next whole tile of the CTA is
// staged into nxt), else they are loaded here with masks (then L2 is asked for the next
// tile).
template <class T, class Fmt>
__device__ __forceinline__ void quantize_step(const QuantState<T> &s,
                                              const typename T::storage *__restrict__ in,
                                              bool vec_in, int64_t tile, int64_t whole_tiles,
                                              const uint4 *cur, uint4 *nxt) {
    constexpr int E = Chunk<T>::E;
    constexpr int R = Chunk<T>::R;
    uint4 q[R];
    if (tile < whole_tiles) {  // uniform: the whole CTA takes one path
        if (tile + gridDim.x < whole_tiles) {
            stage_tile<T>(in, tile + gridDim.x, nxt);
            stage_wait<1>();
        } else {
            stage_wait<0>();
        }
#pragma unroll
        for (int r = 0; r < R; ++r) q[r] = cur[r * kThreads + threadIdx.x];
        quantize_tile<T, Fmt, true>(s, tile, q);
        return;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // all loads first: memory parallelism
        const int c = r * kThreads + threadIdx.x;
        q[r] = load_chunk<T>(in, tile * kQuantTile + static_cast<int64_t>(c) * E, s.n, vec_in);
    }
    if (tile + gridDim.x < (s.n + kQuantTile - 1) / kQuantTile) {  // warm L2 with the next tile
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int64_t i = (tile + gridDim.x) * kQuantTile + (r * kThreads + threadIdx.x) * E;
            if (i < s.n) asm volatile("prefetch.global.L2 [%0];" ::"l"(in + i));
        }
    }
    quantize_tile<T, Fmt, false>(s, tile, q);
}

// A CTA takes a tile of 4096 elements (the largest blocksize) in R rounds: in round r
// thread t holds chunk r * 256 + t. A block is G = blocksize / E consecutive chunks:
// G <= 32 lanes reduce its absmax with shuffles; larger blocks go through one
// shared-memory maximum per 32 chunks.
// Whole tiles (with aligned input and output) take a path without tail masks, and the
// CTA's next whole tile is copied to shared memory while it works on this one. Other
// tiles (the partial last one, unaligned data) load with masks and ask L2 for the next
// tile instead.
// Resident CTAs per SM: 8 for 16-bit inputs (32 registers, 25 KB of shared memory),
// 4 for fp32 (64 registers, 41 KB).
template <class T, class Fmt>
__global__ void __launch_bounds__(kThreads, sizeof(typename T::storage) == 2 ? 8 : 4)
quantize_kernel(const typename T::storage *__restrict__ in, int64_t n, int log2_bs,
                bool vec_in, bool vec_out, float *__restrict__ absmax,
                uint8_t *__restrict__ packed) {
    constexpr int R = Chunk<T>::R;
    constexpr int kGroups = QuantState<T>::kGroups;
    __shared__ Bucket tab[buckets(Fmt{}) * kBucketCopies];
    __shared__ RcpMaps rcp_maps;
    __shared__ float group_max[kGroups];
    __shared__ float block_max[kGroups / 2];
    __shared__ uint4 stage[2][R * kThreads];  // two tiles, 8 (16-bit) or 16 KB (fp32) each
    build_rcp_maps(&rcp_maps);
    build_buckets<Fmt>(tab);
    __syncthreads();
    const QuantState<T> s{biased_buckets(tab), &rcp_maps, group_max, block_max, log2_bs,
                          log2_bs - Chunk<T>::kLog2E, n, ((n - 1) >> log2_bs) + 1, (n + 1) >> 1,
                          vec_out, absmax, packed};

    const int64_t tiles = (n + kQuantTile - 1) / kQuantTile;
    const int64_t whole_tiles = vec_in && vec_out ? n / kQuantTile : 0;
    // Two stage buffers that trade places every tile.
    if (blockIdx.x < whole_tiles) stage_tile<T>(in, blockIdx.x, stage[0]);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += 2 * static_cast<int64_t>(gridDim.x)) {
        quantize_step<T, Fmt>(s, in, vec_in, tile, whole_tiles, stage[0], stage[1]);
        if (tile + gridDim.x >= tiles) break;
        quantize_step<T, Fmt>(s, in, vec_in, tile + gridDim.x, whole_tiles, stage[1], stage[0]);
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

template <class T>
int64_t dequantize_ctas(int64_t n) {
    const int64_t chunks = (n + Chunk<T>::E - 1) / Chunk<T>::E;
    return (chunks + kThreads * kDequantRounds - 1) / (kThreads * kDequantRounds);
}

template <class T, class Fmt>
cudaError_t launch_quantize(const void *input, int64_t n, int blocksize, float *absmax,
                            uint8_t *packed, cudaStream_t stream) {
    // Long-lived CTAs that loop over tiles, in several waves on large tensors: with one
    // wave the SMs finished unevenly (ncu: idle for 13% of the kernel at 2^26 elements).
    int grid = 0;
    cudaError_t err = resident_grid<quantize_kernel<T, Fmt>>(
        kThreads, 0, (n + kQuantTile - 1) / kQuantTile, &grid, kQuantMaxWaves, kQuantMinTiles);
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

__global__ void __launch_bounds__(kThreads)
to_kbit_kernel(const uint8_t *__restrict__ packed, const float *__restrict__ absmax, int64_t n,
               int64_t blocks, int blocksize, kbit_absmax_format fmt,
               uint32_t *__restrict__ kbit_packed, void *__restrict__ kbit_absmax,
               unsigned int *__restrict__ range_flag) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
         b += stride) {
        block_to_kbit(packed, absmax, n, blocksize, fmt, b, kbit_packed, kbit_absmax);
        if (fmt == KBIT_ABSMAX_FP16 && beyond_half(absmax[b * 32 / blocksize]))
            atomicOr(range_flag, 1u);
    }
}

cudaError_t launch_absmax_mean(const float *absmax, int64_t count, float *mean,
                               cudaStream_t stream) {
    absmax_mean_kernel<<<1, kMeanThreads, 0, stream>>>(absmax, count, mean);
    return launch_error();
}

// ---- entries ------------------------------------------------------------------------------

template <class Fmt, class T>
kbit_status quantize(const void *input, int64_t n, int blocksize, float *absmax,
                     uint8_t *packed, kbit_stream_t stream) {
    KBIT_TRY(check_quantize(input, n, sizeof(typename T::storage), blocksize, absmax, packed));
    if (n == 0) return KBIT_SUCCESS;
    return cuda_status(launch_quantize<T, Fmt>(input, n, blocksize, absmax, packed, stream),
                       "NF4/FP4 quantize launch");
}

template <class Fmt, class T>
kbit_status dequantize(const uint8_t *packed, const float *absmax, int64_t n, int blocksize,
                       void *output, kbit_stream_t stream) {
    KBIT_TRY(check_dequantize(packed, absmax, n, blocksize, output, sizeof(typename T::storage)));
    if (n == 0) return KBIT_SUCCESS;
    return cuda_status(launch_dequantize<T, Fmt>(packed, absmax, n, blocksize, output, stream),
                       "NF4/FP4 dequantize launch");
}

template <class Fmt, class T>
kbit_status dequantize_dq(const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,
                          const float *code, const float *offset, int64_t n, int blocksize,
                          void *output, kbit_stream_t stream) {
    KBIT_TRY(check_dequantize_dq(packed, qabsmax, absmax2, code, offset, n, blocksize, output,
                                 sizeof(typename T::storage)));
    if (n == 0) return KBIT_SUCCESS;
    return cuda_status(launch_dequantize_dq<T, Fmt>(packed, qabsmax, absmax2, code, offset, n,
                                                    blocksize, output, stream),
                       "NF4/FP4 dequantize launch");
}

kbit_status absmax_mean(const float *absmax, int64_t count, float *mean, kbit_stream_t stream) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_ptr(mean, "mean", 4));
    return cuda_status(launch_absmax_mean(absmax, count, mean, stream), "kbit_nf4_absmax_mean");
}

kbit_status quantize_absmax(const float *absmax, int64_t count, const float *code,
                            const float *offset, uint8_t *qabsmax, float *absmax2,
                            kbit_stream_t stream) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_dq_state(qabsmax, absmax2, code, offset));
    return cuda_status(launch_quantize_absmax(absmax, count, code, offset, qabsmax, absmax2, stream),
                       "kbit_nf4_quantize_absmax");
}

kbit_status dequantize_absmax(const uint8_t *qabsmax, const float *absmax2, const float *code,
                              const float *offset, int64_t count, float *absmax,
                              kbit_stream_t stream) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_dq_state(qabsmax, absmax2, code, offset));
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    return cuda_status(
        launch_dequantize_absmax(qabsmax, absmax2, code, offset, count, absmax, stream),
        "kbit_nf4_dequantize_absmax");
}

kbit_status to_kbit(const uint8_t *packed, const float *absmax, int64_t n, int blocksize,
                    kbit_absmax_format fmt, uint32_t *kbit_packed, void *kbit_absmax,
                    kbit_stream_t stream) {
    KBIT_TRY(check_to_kbit(packed, absmax, n, blocksize, fmt, kbit_packed, kbit_absmax));
    if (n == 0) return KBIT_SUCCESS;
    unsigned int *flag = nullptr;
    cudaError_t err = device_range_flag(&flag);
    const int64_t blocks = blocks_of(n, 32);
    int grid = 0;
    if (err == cudaSuccess) err = grid_for(blocks_of(blocks, kThreads), kPerSm, &grid);
    if (err == cudaSuccess) {
        to_kbit_kernel<<<grid, kThreads, 0, stream>>>(packed, absmax, n, blocks, blocksize, fmt,
                                                      kbit_packed, kbit_absmax, flag);
        err = launch_error();
    }
    return cuda_status(err, "kbit_nf4_to_kbit");
}

}  // namespace
}  // namespace bnb4
}  // namespace kbit

KBIT_BNB4_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
