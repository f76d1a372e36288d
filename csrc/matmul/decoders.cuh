// The matmul room's shared device pieces: the mma.sync helper, the lanes' pair tables,
// cp.async, mbarriers and the bulk copy engine (the streamed kernels' rings), the tiled
// segments' fields, and the pair decoders that turn 8 elements of one row and chunk of a stored
// (or tiled) weight into four pairs of T. Included by gemv.cu (the GEMV kernels and the
// mma.sync GEMM of gemm.cuh) and gemm_sm90.cu (the wgmma GEMM); every name is internal to
// the including file.
#pragma once

#include <cuda.h>  // CUtensorMap (the driver's encoder is found at run time)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <type_traits>

#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../formats/gguf.h"
#include "../formats/kbit_tiled.h"
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
#define KBIT_MMA_16816(TAG, PTX_TYPE)                                                          \
    __device__ __forceinline__ void mma_16816(TAG, float (&d)[4], const uint32_t (&a)[4],      \
                                              uint32_t b0, uint32_t b1) {                      \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE            \
                     ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"              \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));          \
    }
KBIT_MMA_16816(F16, "f16")
KBIT_MMA_16816(BF16, "bf16")
#undef KBIT_MMA_16816
// The same for one m16n8k8 tile (half the k).
#define KBIT_MMA_1688(TAG, PTX_TYPE)                                                           \
    __device__ __forceinline__ void mma_1688(TAG, float (&d)[4], uint32_t a0, uint32_t a1,     \
                                             uint32_t b) {                                     \
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32." PTX_TYPE "." PTX_TYPE             \
                     ".f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"                        \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                          \
                     : "r"(a0), "r"(a1), "r"(b));                                              \
    }
KBIT_MMA_1688(F16, "f16")
KBIT_MMA_1688(BF16, "bf16")
#undef KBIT_MMA_1688

// Packed T arithmetic on 32-bit words (the GGUF kernels: gguf_stream.cuh, gemm_sm90.cu).
// T's packed pair type, and the code-byte magic: byte 0x64 (fp16) or 0x43 (bf16) is the
// high byte of `base` (1024 or 128), whose low mantissa bits a code byte then fills.
template <class T>
struct Pack {
    static constexpr bool kF16 = std::is_same_v<T, F16>;
    using H2 = std::conditional_t<kF16, __half2, __nv_bfloat162>;
    static constexpr uint32_t kMagic = kF16 ? 0x64646464u : 0x43434343u;
    static constexpr float kBase = kF16 ? 1024.0f : 128.0f;
    static __device__ __forceinline__ H2 h(uint32_t v) { return *reinterpret_cast<H2 *>(&v); }
    static __device__ __forceinline__ uint32_t u(H2 v) { return *reinterpret_cast<uint32_t *>(&v); }
};
template <class T>
__device__ __forceinline__ uint32_t hadd2(uint32_t a, uint32_t b) {
    return Pack<T>::u(__hadd2(Pack<T>::h(a), Pack<T>::h(b)));
}
template <class T>
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    return Pack<T>::u(__hmul2(Pack<T>::h(a), Pack<T>::h(b)));
}
template <class T>
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
    return Pack<T>::u(__hfma2(Pack<T>::h(a), Pack<T>::h(b), Pack<T>::h(c)));
}
template <class T>
__device__ __forceinline__ uint32_t splat(float v) { return pack2(T{}, v, v); }
// A pair of T as two floats (the low half first).
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t v) {
    if constexpr (Pack<T>::kF16) return __half22float2(Pack<T>::h(v));
    else return __bfloat1622float2(Pack<T>::h(v));
}
// Half h of a pair of T in both halves. Taken by a packed multiply or fma, ptxas reads it
// through the operand's swizzle (HMUL2 R, R, R.H0_H0): no instruction of its own.
template <class T>
__device__ __forceinline__ typename Pack<T>::H2 half_of(uint32_t b, int h) {
    using P = Pack<T>;
    if constexpr (P::kF16) return h ? __high2half2(P::h(b)) : __low2half2(P::h(b));
    else return h ? __high2bfloat162(P::h(b)) : __low2bfloat162(P::h(b));
}
// a * (half h of b)
template <class T>
__device__ __forceinline__ uint32_t hmul2_by_half(uint32_t a, uint32_t b, int h) {
    return Pack<T>::u(__hmul2(Pack<T>::h(a), half_of<T>(b, h)));
}
// a * (half h of b) + (half h of c)
template <class T>
__device__ __forceinline__ uint32_t hfma2_by_half(uint32_t a, uint32_t b, uint32_t c, int h) {
    return Pack<T>::u(__hfma2(Pack<T>::h(a), half_of<T>(b, h), half_of<T>(c, h)));
}

// The pair table: entry e at word e * kCopies + (lane % kCopies), so that the lanes of a
// warp read distinct banks (kCopies = 32) or at most two lanes share one (16).
template <int kEntries>
constexpr int table_copies() { return kEntries > 256 ? 16 : 32; }

// v, opaque to the compiler: a lane's fixed offsets stay in registers instead of being
// recomputed from the thread index in every stage of a loop (the GGUF streamed GEMV: 25
// instructions a unit in SASS).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
    asm volatile("mov.b32 %0, %0;" : "+r"(v));
    return v;
}

// Three-input bitwise function kLut of a, b, c (one LOP3; ptxas keeps the asm as written).
template <int kLut>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(kLut));
    return r;
}

// A lane's copy of the pair table as a shared-memory address: entry idx is one
// multiply-add and one load. (Through a pointer, the compiler recomputed the lane's copy
// from the thread index for every lookup: 5 instructions a pair in SASS, now 2-3.)
// An entry's copies are 4 kCopies bytes apart (2^kStride) and the lane's copy is below
// that, so an index already shifted to bit kStride needs only its mask and the lane's
// offset, one LOP3, and the load adds the table's warp-uniform address (`LDS [R+UR]`):
// field() below.
template <int kCopies>
struct LaneTable {
    static constexpr int kStride = 2 + (kCopies >= 2) + (kCopies >= 4) + (kCopies >= 8) +
                                   (kCopies >= 16) + (kCopies >= 32) + (kCopies >= 64);
    static_assert(4 * kCopies == 1 << kStride, "copies a power of two, to 64");
    uint32_t base;   // shared address of entry 0 of this lane's copy
    uint32_t table;  // shared address of the table (the same in every lane)
    uint32_t lane;   // base - table
    __device__ __forceinline__ uint32_t operator[](uint32_t idx) const {
        return lds_u32(base + idx * (4 * kCopies));
    }
    // The entry of bits [bit, bit + 2K) of v, v's bits below and above them anything:
    // (v shifted so that they start at kStride) & mask | lane, plus the table.
    template <int K>
    __device__ __forceinline__ uint32_t at_shifted(uint32_t shifted) const {
        return lds_u32(table + lop3<0xEA>(shifted, ((1u << (2 * K)) - 1u) << kStride, lane));
    }
};
template <int kCopies>
__device__ __forceinline__ LaneTable<kCopies> lane_table(const uint32_t *table) {
    const int lane = threadIdx.x & 31;
    const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(table));
    const uint32_t mine = 4u * static_cast<uint32_t>(lane % kCopies);
    // opaque: not split back into tid math
    return {__shfl_sync(0xFFFFFFFFu, at + mine, lane), at, opaque(mine)};
}

// Fills entries [0, kEntries) of the table with value(e), every one of its `copies`
// (table_copies by default), 16 bytes a store.
// Entry e's copies start at word kRow e (kRow = copies: back to back).
template <int kEntries, int copies = table_copies<kEntries>(), int kRow = copies, class Value>
__device__ void fill_table(uint32_t *table, Value &&value) {
    for (int e = threadIdx.x; e < kEntries; e += blockDim.x) {
        const uint32_t v = value(e);
        uint4 *row = reinterpret_cast<uint4 *>(table + e * kRow);
#pragma unroll
        for (int c = 0; c < copies / 4; ++c) row[c] = make_uint4(v, v, v, v);
    }
}

// ---- cp.async ------------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Copies 16 (or 4) bytes from global to shared memory asynchronously; only the first
// `src_bytes` are read, the rest of the destination is zero-filled.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Bytes of [off, off + unit) that lie inside an array of `total` bytes.
__device__ __forceinline__ int inside(int64_t off, int64_t total, int unit) {
    const int64_t left = total - off;
    return left <= 0 ? 0 : (left < unit ? static_cast<int>(left) : unit);
}

// ---- mbarriers and the bulk copy engine ----------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits for the phase of the given parity to complete. Returns 0, which the compiler
// cannot see: adding it to the addresses of what the phase guards keeps the reads of
// that data (plain asm loads, free to be scheduled) after the wait.
__device__ __forceinline__ uint32_t mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t zero;
    asm volatile(
        "{\n .reg .pred p;\n"
        "KBIT_WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " @!p bra KBIT_WAIT_%=;\n"
        " mov.u32 %0, 0;\n}\n"
        : "=r"(zero)
        : "r"(bar), "r"(parity)
        : "memory");
    return zero;
}
// Copies `bytes` (a multiple of 16, both addresses on 16 bytes) from global to shared
// memory and counts them on the mbarrier; `policy`: an L2 cache policy.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes,
                                          uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ uint64_t evict_last_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// ---- tensor maps (TMA) -----------------------------------------------------------------

// The driver's tensor map encoder (through the runtime: no link to libcuda). Toolkits
// before 12.5 lack the versioned query; their unversioned one gives the same 12.0 entry.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
        const cudaError_t err = cudaGetDriverEntryPointByVersion(
            "cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
        const cudaError_t err =
            cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
        return err == cudaSuccess && found == cudaDriverEntryPointSuccess
                   ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
                   : nullptr;
    }();
    return encode;
}

// A map of `rank` dimensions (dims[0] innermost, in elements; strides of the outer ones
// in bytes) read in boxes of `box`, unswizzled unless `swizzle` says otherwise (128B: the
// 16-byte unit u of a box's 128-byte row r lands at u ^ (r % 8), the wgmma's layout).
inline cudaError_t tensor_map(CUtensorMap *map, CUtensorMapDataType type, int rank,
                              const void *base, const cuuint64_t *dims,
                              const cuuint64_t *strides, const cuuint32_t *box,
                              CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return cudaErrorNotSupported;
    const cuuint32_t steps[5] = {1, 1, 1, 1, 1};  // (one a dimension, to rank 5)
    const CUresult r = encode(map, type, rank, const_cast<void *>(base), dims, strides, box, steps,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The box at coordinates c of `map` into shared memory at dst, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap &map, int c0, int c1,
                                         int c2, uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap &map, int c0, int c1,
                                         int c2, int c3, uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar),
        "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap &map, int c0, int c1,
                                         uint32_t bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
        : "memory");
}

// Field f (2K bits) of a run of segment words (f a compile-time constant).
template <int K, int N>
__device__ __forceinline__ uint32_t segment_field(const uint32_t (&w)[N], int f) {
    if constexpr (K == 4)  // byte fields: one byte permute
        return __byte_perm(w[f / 4], 0u, 0x4440u | static_cast<uint32_t>(f % 4));
    const int bit = 2 * K * f, word = bit / 32, shift = bit % 32;
    const uint32_t lo = w[word] >> shift;
    const uint32_t v = (shift + 2 * K > 32) ? (lo | (w[word + 1] << (32 - shift))) : lo;
    return v & ((1u << (2 * K)) - 1u);
}

// The table entry of field f of a run of segment words: K = 4 a byte permute and a
// multiply-add (the byte is the index), other K one shift (a funnel shift where the field
// spans two words) and the table's LOP3.
template <int K, int N, int kCopies>
__device__ __forceinline__ uint32_t field_entry(const uint32_t (&w)[N], int f,
                                                const LaneTable<kCopies> &table) {
    if constexpr (K == 4) {
        return table[segment_field<K>(w, f)];
    } else {
        constexpr int kS = LaneTable<kCopies>::kStride;
        const int bit = 2 * K * f, word = bit / 32, shift = bit % 32;
        uint32_t v;  // the field at bit kS
        if (shift < kS) v = w[word] << (kS - shift);
        else if (shift + 2 * K > 32) v = __funnelshift_r(w[word], w[word + 1], shift - kS);
        else v = w[word] >> (shift - kS);
        return table.template at_shifted<K>(v);
    }
}

// The pairs of chunk v of a tiled lane's words: fields 8 v + i (row g) into pa, 8 v + 4 + i
// (row g + 8) into pb, each one table read.
template <int K, int N, class Table>
__device__ __forceinline__ void chunk_pairs(const uint32_t (&w)[N], int v, const Table &table,
                                            uint32_t (&pa)[4], uint32_t (&pb)[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        pa[i] = field_entry<K>(w, 8 * v + i, table);
        pb[i] = field_entry<K>(w, 8 * v + 4 + i, table);
    }
}

// Byte v of s (v a compile-time constant), an E4M4 scale, decoded times `mul` without a
// table: the byte at bit 19 is the float32 of e4m4_decode's value times 2^-116 (E4M4's
// subnormals are float32 ones there), which 2^116 makes exact; one rounding, as
// e4m4_decode(c) * mul. (The streamed tiled GEMV read a 256-entry table in shared memory,
// whose loads were a fifth of its shared-memory wavefronts at K = 2: bench/RESULTS.md,
// session 16.)
#if defined(__CUDA_FTZ) && __CUDA_FTZ
#error "e4m4_times needs float32 subnormals (built with -ftz=true or --use_fast_math)"
#endif
__device__ __forceinline__ float e4m4_bits(uint32_t s, int v) {  // the value times 2^-116
    const int up = 19 - 8 * v;
    return __uint_as_float((up >= 0 ? s << up : s >> -up) & (0xFFu << 19));
}
__device__ __forceinline__ float e4m4_times(uint32_t s, int v, float mul) {
    return e4m4_bits(s, v) * 0x1p116f * mul;
}

// The tiled GEMVs' chunk scales times `mul` (tensor_scale times the codebook's largest
// |entry|), one multiply a scale: fp32 and fp16 scales' values times mul, E4M4's float32
// of the code byte at bit 19 (e4m4_bits) times 2^116 mul, folded once here. Where 2^116
// mul would overflow (mul >= 2^11), 2^e of it moves to `out`, which multiplies the sums
// at the output. Powers of two: each scale is e4m4_times' value times 2^-e exactly (it
// stays normal: E4M4's smallest value is 2^-14, mul 2^-e at least 2^10), so the sums are
// bit for bit those of the two multiplies, barring products below float32's normals (and
// where mul >= ~2^123 made e4m4_times' product overflow, they stay finite). From mul's
// exponent bits: 0, subnormal, inf and NaN mul need no special case.
template <int kSB>
struct ChunkScales {
    float mul, out = 1.0f;
    __device__ explicit ChunkScales(float m) : mul(m) {
        if constexpr (kSB == 1) {
            const int biased = static_cast<int>((__float_as_uint(m) >> 23) & 0xFFu);
            const int e = max(0, biased - 137);  // mul in [2^(e + 10), 2^(e + 11)) where e > 0
            mul = m * __uint_as_float(static_cast<uint32_t>(243 - e) << 23);  // 2^(116 - e)
            out = __uint_as_float(static_cast<uint32_t>(127 + e) << 23);      // 2^e
        }
    }
    // Chunk v's scale (v a compile-time constant) of a tiled row's four kSB-byte scales
    // in the words s.
    template <int N>
    __device__ __forceinline__ float operator()(const uint32_t (&s)[N], int v) const {
        if constexpr (kSB == 1) return e4m4_bits(s[0], v) * mul;
        else if constexpr (kSB == 2)
            return f16_bits_to_f32(static_cast<uint16_t>(s[v / 2] >> (16 * (v % 2)))) * mul;
        else return __uint_as_float(s[v]) * mul;
    }
};

// E4M4 bytes lo and hi of v (compile-time constants) as a pair of T of their values times
// 2^8 (the wgmma GEMMs' scales), lo's in the low half, without a table: fp16 by the bytes at
// bit 6 of each half, fp16s of value e4m4_decode(c) 2^-12 (E4M4's subnormals are fp16 ones
// there) times 2^12 in one packed multiply; bf16 through float32 as e4m4_times. Exact, as
// the table's values.
template <class T>
__device__ __forceinline__ uint32_t e4m4_pair_x256(uint32_t v, int lo, int hi) {
    if constexpr (Pack<T>::kF16) {
        const uint32_t two = __byte_perm(v, 0u, 0x4040u | lo | (hi << 8));  // bytes 0 and 2
        return hmul2<T>(two << 6, 0x6C006C00u);                            // times 2^12
    } else {
        return pack2(T{}, e4m4_times(v, lo, 256.0f), e4m4_times(v, hi, 256.0f));
    }
}

// A tiled lane segment (8K bytes at a shared address on 8K-byte boundaries) into 2K
// words, in the widest loads its alignment allows.
template <int K>
__device__ __forceinline__ void load_segment(uint32_t at, uint32_t (&w)[2 * K]) {
    if constexpr (K % 2 == 0) {  // 16 bytes a load
#pragma unroll
        for (int h = 0; h < K / 2; ++h) {
            const uint4 v = lds_u32x4(at + 16 * h);
            w[4 * h] = v.x, w[4 * h + 1] = v.y, w[4 * h + 2] = v.z, w[4 * h + 3] = v.w;
        }
    } else {  // 8 bytes a load
#pragma unroll
        for (int h = 0; h < K; ++h) {
            const uint2 v = lds_u32x2(at + 8 * h);
            w[2 * h] = v.x, w[2 * h + 1] = v.y;
        }
    }
}

// Lane `lane`'s segment of a run of 32 back-to-back tiled segments in shared memory (a
// unit: 8K bytes a lane from `unit`), loaded at a stage's offset. K = 4: the lanes'
// 32-byte segments, loaded as two 16-byte halves, met 2-way bank conflicts in each
// quarter warp (lanes l and l + 4; ncu: 15% of the streamed GEMV's shared-memory
// wavefronts, bench/RESULTS.md session 16), so lanes with l / 4 odd load their second half
// first and selects put the halves back.
template <int K>
struct LaneSegment {
    uint32_t first, second;  // where the lane's first and second loads start
    bool swap;
    __device__ __forceinline__ LaneSegment(uint32_t unit, int lane)
        : swap(K == 4 && ((lane >> 2) & 1)) {
        const uint32_t at = unit + lane * 8 * K;
        first = opaque(at + (swap ? 16 : 0));
        second = K == 4 ? opaque(at + (swap ? 0 : 16)) : 0u;
    }
    __device__ __forceinline__ void load(uint32_t stage, uint32_t (&w)[2 * K]) const {
        if constexpr (K == 4) {
            const uint4 a = lds_u32x4(first + stage), b = lds_u32x4(second + stage);
            const uint4 lo = swap ? b : a, hi = swap ? a : b;
            w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
            w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
        } else {
            load_segment<K>(first + stage, w);
        }
    }
};

// ---- pair decoders: 8 elements of one row and chunk -> 4 pairs of T ------------------------
//
// A staged decoder reads a chunk as stored, from shared memory: pairs(w, t, table, p)
// gives elements (8t + 2q, 8t + 2q + 1) of the chunk whose bytes start at w as pair q,
// the lower element in the low half; scale_offset(c) is the byte offset of chunk c's
// scale in the scale array, scale(s) the chunk's float32 factor from the bytes at s.

// K consecutive 32-bit words from p (aligned to 16 bytes for K = 4, 8 for K = 2): one
// vector load where the alignment allows it.
template <int K>
__device__ __forceinline__ void load_words(const uint8_t *p, uint32_t (&w)[K]) {
    if constexpr (K == 4) {
        const uint4 u = *reinterpret_cast<const uint4 *>(p);
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (K == 2) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        w[0] = u.x, w[1] = u.y;
    } else {
#pragma unroll
        for (int j = 0; j < K; ++j) w[j] = reinterpret_cast<const uint32_t *>(p)[j];
    }
}

// kbit: K bit-plane words per chunk and one scale.
template <class T, int K, kbit_absmax_format FMT>
struct KbitStaged {
    static constexpr int kEntries = 1 << (2 * K);
    static constexpr bool kUsesCodebook = true;
    static constexpr int kChunkBytes = 4 * K;
    static constexpr int kScaleBytes = FMT == KBIT_ABSMAX_E4M4 ? 1 : (FMT == KBIT_ABSMAX_FP16 ? 2 : 4);
    const uint8_t *packed;
    const uint8_t *absmax;
    int64_t packed_bytes, absmax_bytes;
    float scale_mul;  // tensor_scale times the codebook's largest |entry|

    __device__ __forceinline__ int scale_bytes() const { return kScaleBytes; }
    __device__ __forceinline__ int64_t scale_offset(int64_t c) const { return c * kScaleBytes; }
    // scale_offset(c + u) - scale_offset(c)
    __device__ __forceinline__ int scale_delta(int64_t, int u) const { return u * kScaleBytes; }

    __device__ __forceinline__ float scale(const uint8_t *s) const {
        uint32_t bits;
        if constexpr (kScaleBytes == 1) bits = *s;
        else if constexpr (kScaleBytes == 2) bits = *reinterpret_cast<const uint16_t *>(s);
        else bits = *reinterpret_cast<const uint32_t *>(s);
        return decode_scale(FMT, bits) * scale_mul;
    }

    // Byte t of planes 0..3 side by side (q), transposed as a 4x4 matrix of 2-bit
    // fields: byte i of the result holds bits 2i, 2i+1 of every plane, i.e. the codes of
    // pair i interleaved (bit 2j: element 2i's bit j; bit 2j+1: element 2i+1's).
    template <class Table>
    __device__ __forceinline__ void pairs(const uint8_t *w, int t,
                                          const Table &table,
                                          uint32_t (&p)[4]) const {
        uint32_t v[K];
        load_words(w, v);
        uint32_t q, fifth;
        transpose(v, t, q, fifth);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = table[index(q, fifth, i)];
    }
    // The four pair indices of byte t of the planes v: q's byte i holds pair i's low 8
    // bits, fifth (K = 5: plane 4's byte t) its bits 8-9 at 2i.
    __device__ static __forceinline__ void transpose(const uint32_t (&v)[K], int t, uint32_t &q,
                                                     uint32_t &fifth) {
        const uint32_t sel = static_cast<uint32_t>(t) | static_cast<uint32_t>(t + 4) << 4;
        const uint32_t lo = __byte_perm(v[0], v[1], sel);
        const uint32_t hi = K >= 3 ? __byte_perm(v[2], K >= 4 ? v[3] : 0u, sel) : 0u;
        q = __byte_perm(lo, hi, 0x5410);
        uint32_t d = ((q >> 12) ^ q) & 0x0000F0F0u;  // swap the off-diagonal 2x2 blocks
        q ^= d ^ (d << 12);
        d = ((q >> 6) ^ q) & 0x00CC00CCu;            // swap inside the 2x2 blocks
        q ^= d ^ (d << 6);
        fifth = 0;
        if constexpr (K == 5) fifth = v[4] >> (8 * t);
    }
    __device__ static __forceinline__ uint32_t index(uint32_t q, uint32_t fifth, int i) {
        uint32_t idx = (q >> (8 * i)) & 0xFFu;
        if constexpr (K == 5) idx |= ((fifth >> (2 * i)) & 3u) << 8;
        return idx;
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

// kbit with the absmax format chosen at run time: the GEMM decodes one scale per row and
// chunk of a stage, not one per pair, so a switch there costs less than three times the
// kernels.
template <class T, int K>
struct KbitAnyScale : KbitStaged<T, K, KBIT_ABSMAX_FP32> {
    kbit_absmax_format fmt;
    int sb;  // bytes of a scale: 1 (E4M4), 2 (fp16) or 4 (fp32)
    __device__ __forceinline__ int scale_bytes() const { return sb; }
    __device__ __forceinline__ int64_t scale_offset(int64_t c) const { return c * sb; }
    __device__ __forceinline__ int scale_delta(int64_t, int u) const { return u * sb; }
    __device__ __forceinline__ float scale(const uint8_t *s) const {
        const uint32_t bits = sb == 1 ? *s
                            : sb == 2 ? *reinterpret_cast<const uint16_t *>(s)
                                      : *reinterpret_cast<const uint32_t *>(s);
        return decode_scale(fmt, bits) * this->scale_mul;
    }
};

// Tiled kbit in the GEMM (formats/kbit_tiled.h): KbitAnyScale's pair table and scales
// with the layout's geometry; pairs are fields of the lanes' segments.
template <class T, int K>
struct TiledScale : KbitAnyScale<T, K> {
    static constexpr int kK = K;
    tiled::Geometry geo;
};

// NF4 / FP4: 16 packed bytes per chunk (byte i: element 2i high nibble, 2i+1 low), one
// float32 scale per blocksize >= 32 elements.
template <class T, class Fmt>
struct Bnb4Staged {
    static constexpr int kEntries = 256;
    static constexpr bool kUsesCodebook = false;
    static constexpr int kChunkBytes = 16;
    static constexpr int kScaleBytes = 4;
    const uint8_t *packed;
    const uint8_t *absmax;
    int64_t packed_bytes, absmax_bytes;
    int log2_chunks_per_block;  // log2(blocksize / 32)

    __device__ __forceinline__ int scale_bytes() const { return kScaleBytes; }
    __device__ __forceinline__ int64_t scale_offset(int64_t c) const {
        return (c >> log2_chunks_per_block) * 4;
    }
    __device__ __forceinline__ int scale_delta(int64_t c, int u) const {
        return static_cast<int>(((c + u) >> log2_chunks_per_block) - (c >> log2_chunks_per_block)) * 4;
    }
    __device__ __forceinline__ float scale(const uint8_t *s) const {
        return *reinterpret_cast<const float *>(s);
    }
    template <class Table>
    __device__ __forceinline__ void pairs(const uint8_t *w, int t,
                                          const Table &table,
                                          uint32_t (&p)[4]) const {
        const uint32_t b = reinterpret_cast<const uint32_t *>(w)[t];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = table[__byte_perm(b, 0u, 0x4440u | i)];
    }
    __device__ static uint32_t entry(int e) {
        return pack2(T{}, bnb4::table_value(Fmt{}, e >> 4), bnb4::table_value(Fmt{}, e & 15));
    }
};

// GGUF (and any format with a float decoder): each lane decodes its 8 elements with
// the format's own group decoder (formats/gguf.h), which loads what it needs; the
// values carry their scales, so the chunk's factor is 1.
template <class T, class Fmt>
struct FloatDirect {
    const uint8_t *blocks;
    struct Raw {
        float v[8];
    };
    __device__ __forceinline__ Raw load(int64_t c, int t) const {
        Raw r;
        const int64_t e0 = c * kChunk + 8 * t;
        Fmt::template group<8>(gguf::DeviceLoader<0>{blocks + (e0 / Fmt::kElems) * Fmt::kBytes},
                               static_cast<int>(e0 % Fmt::kElems), r.v);
        return r;
    }
    __device__ __forceinline__ void pairs(const Raw &r, uint32_t (&p)[4]) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = pack2(T{}, r.v[2 * i], r.v[2 * i + 1]);
    }
};

// A row of x in shared memory (row_bytes of it), padded so that the rows a shared-memory
// phase reads lie in distinct banks: lane (g, t) reads row g, four lanes a row `read`
// bytes each (16: two rows a quarter warp; 8: four rows a half warp), so consecutive rows
// start 4 `read` bytes apart modulo 128 (the streamed GEMVs; with 16 bytes of padding, as
// before session 17, the two rows of a quarter warp's 16-byte reads met in 3 of their 4
// bank groups: bench/RESULTS.md).
__host__ __device__ constexpr int64_t x_row_stride(int64_t row_bytes, int read) {
    return (row_bytes + 127) / 128 * 128 + 4 * read;
}

// A codebook entry of the first warp's lanes (lane < 2^k; 0.0 past the entries and in the
// other warps), loaded once from global memory (the table fills loaded the codebook twice,
// one load waiting for the other). A kernel that issues bulk copies before it fills its
// table calls book_entry first, so that this load does not queue behind them.
struct BookEntry {
    float v = 0.0f;
};
template <class Dec>
__device__ __forceinline__ BookEntry book_entry(const float *codebook, int k) {
    BookEntry e;
    if constexpr (Dec::kUsesCodebook) {
        const float *cb = codebook ? codebook : g_normal_float.v[k - 2];
        const int lane = threadIdx.x & 31;
        if (threadIdx.x < 32 && lane < (1 << k)) e.v = cb[lane];
    }
    return e;
}

// The factor a codebook's pair entries are divided by (its largest |entry|, 1 if all are
// zero, or for the fixed NF4/FP4 tables), returned after fill(entry) wrote the table from
// entry(e), pair e's value, and a barrier. The first warp puts the codebook (book_entry's)
// in shared memory, which the fill reads: one global load a kernel.
template <class Dec, class Fill>
__device__ float fill_book(uint32_t *table, BookEntry be, Fill &&fill) {
    __shared__ float book[32], book_max;
    if constexpr (!Dec::kUsesCodebook) {
        fill([](int e) { return Dec::entry(e); });
        __syncthreads();
        return 1.0f;
    } else {
        if (threadIdx.x < 32) {
            book[threadIdx.x] = be.v;
            const unsigned mx = __reduce_max_sync(kFull, __float_as_uint(fabsf(be.v)));
            if (threadIdx.x == 0) book_max = mx ? __uint_as_float(mx) : 1.0f;
        }
        __syncthreads();
        const float scale = book_max, inv_max = 1.0f / scale;
        fill([&](int e) { return Dec::entry(e, book, inv_max); });
        __syncthreads();
        return scale;
    }
}

// Fills the CTA's pair table for decoder Dec and returns the factor its entries were
// divided by (fill_book's). Ends with a barrier.
template <class Dec, int kCopies = table_copies<Dec::kEntries>(), int kRow = kCopies>
__device__ float fill_pair_table(uint32_t *table, BookEntry be) {
    return fill_book<Dec>(table, be, [&](auto entry) {
        fill_table<Dec::kEntries, kCopies, kRow>(table, entry);
    });
}
template <class Dec, int kCopies = table_copies<Dec::kEntries>()>
__device__ float fill_pair_table(uint32_t *table, const float *codebook, int k) {
    return fill_pair_table<Dec, kCopies>(table, book_entry<Dec>(codebook, k));
}

// A table whose entries are rows of 256 bytes, 32 copies of kEntryBytes each (the lane's
// copy at kEntryBytes lane, below 256), which a byte of a register indexes: the byte as
// the address' byte 1 beside the lane's offset as byte 0 (zero bytes above) is one byte
// permute, and the load adds the table's warp-uniform address (`LDS [R+UR]`). Rows of
// 128 bytes (16 copies of 8 bytes, or 32 of 4) take a shift or a byte permute and then a
// LOP3 or a multiply-add for the same address: one instruction more an entry.
template <int kEntryBytes>
struct ByteRows {
    static constexpr int kRowBytes = 256, kBytes = 256 * kRowBytes;  // 64 KB
    uint32_t table;  // shared address (the same in every lane)
    uint32_t lane;   // kEntryBytes lane
    // The address of the entry of byte b of w (b a compile-time constant).
    __device__ __forceinline__ uint32_t at(uint32_t w, int b) const {
        return table + __byte_perm(w, lane, 0x7604u | static_cast<uint32_t>(b) << 4);
    }
};
template <int kEntryBytes>
__device__ __forceinline__ ByteRows<kEntryBytes> byte_rows(const uint32_t *table) {
    return {static_cast<uint32_t>(__cvta_generic_to_shared(table)),
            opaque(kEntryBytes * static_cast<uint32_t>(threadIdx.x & 31))};
}

// The pair table of K = 4 (whose pair indices are bytes) in ByteRows: entry e of copy c
// at 256 e + 4 c, the upper half of a row unused. (The streamed tiled GEMV.)
struct BytePairTable : ByteRows<4> {};
template <class Dec>
__device__ float fill_byte_pair_table(uint32_t *table, BookEntry be) {
    static_assert(Dec::kEntries == 256, "K = 4: pairs of 4-bit codes");
    return fill_pair_table<Dec, 32, BytePairTable::kRowBytes / 4>(table, be);
}
__device__ __forceinline__ BytePairTable byte_pair_table(const uint32_t *table) {
    return {byte_rows<4>(table)};
}
// Chunk v's pairs of a K = 4 tiled lane's words: bytes i of words 2 v (row g) and 2 v + 1
// (row g + 8), as chunk_pairs' fields 8 v + i and 8 v + 4 + i.
template <int K, int N>
__device__ __forceinline__ void chunk_pairs(const uint32_t (&w)[N], int v,
                                            const BytePairTable &table, uint32_t (&pa)[4],
                                            uint32_t (&pb)[4]) {
    static_assert(K == 4, "byte pair indices");
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        pa[i] = lds_u32(table.at(w[2 * v], i));
        pb[i] = lds_u32(table.at(w[2 * v + 1], i));
    }
}

// The quad table of K = 2 (the tiled GEMVs and GEMM): entry e, a byte of two pair indices
// (the low nibble's pair first), is the two pairs' entries side by side (8 bytes), in
// kCopies copies 8 bytes apart: entry e of copy c at 8 (kCopies e + c). A 64-bit load is
// served a half warp at a time, so 16 copies (32 KB) keep a load's lanes on distinct
// banks; 32 copies (64 KB) are ByteRows, one instruction less a load.
template <int kCopies>
struct QuadTable {
    static_assert(kCopies == 16 || kCopies == 32, "rows of 128 or 256 bytes");
    static constexpr int kEntries = 256, kBytes = kEntries * kCopies * 8;
    uint32_t table;  // shared address (the same in every lane)
    uint32_t lane;   // the lane's copy: 8 (lane % kCopies)
    // The entry of byte b of w (b a compile-time constant).
    __device__ __forceinline__ uint2 operator()(uint32_t w, int b) const {
        if constexpr (kCopies == 32) return lds_u32x2(ByteRows<8>{table, lane}.at(w, b));
        const uint32_t v = b == 0 ? w << 7 : w >> (8 * b - 7);  // the byte at bit 7
        return lds_u32x2(table + lop3<0xEA>(v, 0x7F80u, lane));
    }
};
// Fills the quad table of the K = 2 pair decoder Dec; returns fill_book's factor.
template <class Dec, int kCopies>
__device__ float fill_quad_table(uint32_t *table, BookEntry be) {
    static_assert(Dec::kEntries == 16, "K = 2: pairs of 2-bit codes");
    return fill_book<Dec>(table, be, [&](auto entry) {
        for (int e = threadIdx.x; e < QuadTable<kCopies>::kEntries; e += blockDim.x) {
            const uint32_t lo = entry(e & 15), hi = entry(e >> 4);
            uint4 *row = reinterpret_cast<uint4 *>(table + e * 2 * kCopies);
#pragma unroll
            for (int c = 0; c < kCopies / 2; ++c) row[c] = make_uint4(lo, hi, lo, hi);
        }
    });
}
template <int kCopies>
__device__ __forceinline__ QuadTable<kCopies> quad_table(const uint32_t *table) {
    return {static_cast<uint32_t>(__cvta_generic_to_shared(table)),
            opaque(8u * static_cast<uint32_t>(threadIdx.x % kCopies))};
}
// Chunk v's pairs of a K = 2 tiled lane's words through the quad table. Word v's nibbles
// are the pair indices of rows g (bytes 0, 1) and g + 8 (bytes 2, 3); x = its low nibbles
// (pairs 0 and 2 of each row), y = its high ones (pairs 1 and 3), and x + (x >> 12) has
// in byte 0 row g's pair 0 beside row g + 8's, in byte 1 their pairs 2. So a load gives
// two registers the mma takes side by side, (pa[i], pb[i]): four weights for about four
// instructions, where the pair table takes six (and moves, had the bytes been rows').
template <int K, int N, int kCopies>
__device__ __forceinline__ void chunk_pairs(const uint32_t (&w)[N], int v,
                                            const QuadTable<kCopies> &quads, uint32_t (&pa)[4],
                                            uint32_t (&pb)[4]) {
    const uint32_t x = w[v] & 0x0F0F0F0Fu, y = (w[v] >> 4) & 0x0F0F0F0Fu;
    const uint32_t zx = x + (x >> 12), zy = y + (y >> 12);  // disjoint nibbles: no carries
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint2 q = quads(i % 2 ? zy : zx, i / 2);
        pa[i] = q.x;
        pb[i] = q.y;
    }
}

// A K = 2 tiled lane's word as two rows' A fragments through the quad table, its bytes
// as stored (the halves decode, chunk_mma_halves in gemv.cu): byte b holds row g's
// (b < 2) or row g + 8's pairs 2 (b & 1) and 2 (b & 1) + 1, one load each; ag row g's
// pairs 0..3, ag8 row g + 8's. No nibble shuffles: four weights a load (its address a
// byte permute with 32 copies, a shift and a LOP3 with 16).
template <int kCopies>
__device__ __forceinline__ void quad_rows(uint32_t w, const QuadTable<kCopies> &quads,
                                          uint32_t (&ag)[4], uint32_t (&ag8)[4]) {
    const uint2 q0 = quads(w, 0), q1 = quads(w, 1), q2 = quads(w, 2), q3 = quads(w, 3);
    ag[0] = q0.x, ag[1] = q0.y, ag[2] = q1.x, ag[3] = q1.y;
    ag8[0] = q2.x, ag8[1] = q2.y, ag8[2] = q3.x, ag8[3] = q3.y;
}

template <class Dec, int kCopies = table_copies<Dec::kEntries>()>
constexpr int table_bytes() { return 4 * Dec::kEntries * kCopies; }

__device__ __forceinline__ void cp_async8(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Raises a kernel's dynamic shared memory limit to `bytes` on the current device (once
// per device and larger size). Always, also below 48 KB: the kernel's static shared
// memory counts against the same default limit.
template <auto Kernel>
cudaError_t allow_smem(int bytes) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> allowed[kMaxDevices];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices && allowed[dev].load(std::memory_order_relaxed) >= bytes)
        return cudaSuccess;
#ifdef KBIT_TEST_SMEM_OPTIN  // refuse as a device of the emulated limit would (core/cuda.cuh)
    cudaFuncAttributes attr{};
    int limit = 0;
    if ((err = cudaFuncGetAttributes(&attr, Kernel)) != cudaSuccess || (err = smem_optin(&limit)) != cudaSuccess)
        return err;
    if (bytes + static_cast<int>(attr.sharedSizeBytes) > limit) return cudaErrorInvalidValue;
#endif
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess && dev < kMaxDevices) allowed[dev].store(bytes, std::memory_order_relaxed);
    return err;
}

// ---- what both GEMMs (gemm.cuh, gemm_sm90.cu) share -------------------------------------------
namespace gemm {

// Where W's bytes come from: the stored layout through the ring (kbit, NF4, FP4), the
// format's own decoder straight from global memory (GGUF), or the tiled kbit layout
// (formats/kbit_tiled.h) through the ring.
enum Source { kStored, kDirect, kTiled };

// A tiled lane's half segment (K words w, formats/kbit_tiled.h) as pairs: f(u, h, p) for
// chunk u = 0, 1 and row half h = 0, 1 (rows g, g + 8 of the lane), p the four pairs of
// elements 8 t .. 8 t + 7 (fields 8 u + 4 h + i of the words).
template <int K, class Table, class F>
__device__ __forceinline__ void tiled_pairs(const uint32_t (&w)[K], const Table &table, F &&f) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        uint32_t pa[4], pb[4];
        chunk_pairs<K>(w, u, table, pa, pb);
        f(u, 0, pa);
        f(u, 1, pb);
    }
}

// The byte offset of the scale of (row, chunk): the stored layouts' chunks run along
// rows; the tiled layout keeps 16 rows x 4 chunks together.
template <int kSrc, class Dec>
__device__ __forceinline__ int64_t scale_of(const Dec &dec, int64_t row, int64_t chunk,
                                            int64_t chunks) {
    if constexpr (kSrc == kTiled) return tiled::scale_at(dec.geo, row, chunk, dec.sb);
    else return dec.scale_offset(row * chunks + chunk);
}

// Split k: each split but the last writes its partial tile to the workspace in the
// threads' own order (coalesced, 16 bytes a store: values 4 j .. 4 j + 3 of thread tid at
// float4 j kN + tid) and counts itself in the tile's counter; the last split (splits - 1)
// waits for the others' count, adds their partials to its own sums in split order
// (deterministic: the same bits whichever CTA finishes first), clears them and the counter,
// and returns true; the others return false. kPer values a thread (a multiple of 4), kN
// threads (the first kN of the CTA), which meet through sync (default: the CTA's barrier).
// The last split never writes or reads its own sums: 2 (splits - 1) tile-sized passes
// through L2 on its SM, not 3 splits + 1 (bench/RESULTS.md, session 19). It may wait only
// for items of lower index, which every CTA takes before its own last split: no CTA
// waits on work queued behind it.
struct BlockSync {
    __device__ __forceinline__ void operator()() const { __syncthreads(); }
};
// sum_pieces: the same for the `pieces` of one output tile whose partial sums go in slots
// part0 + piece, its arrivals in counters[counter]; the piece that adds the others is the
// last (kFirstSums false: split k) or the first (the persistent GEMMs' even walk, where a
// tile's first piece is its CTA's last item and the others their CTAs' first).
template <int kPer, int kN, bool kFirstSums, class Sync = BlockSync>
__device__ __forceinline__ bool sum_pieces(float (&acc)[kPer], int64_t part0, int64_t counter,
                                           int piece, int pieces, float *partials,
                                           unsigned *counters, Sync sync = {}) {
    static_assert(kPer % 4 == 0, "partials go in 16-byte stores");
    constexpr int kVec = kPer / 4;
    const int tid = threadIdx.x;
    float4 *all = reinterpret_cast<float4 *>(partials + part0 * (kPer * kN)) + tid;
    if (piece != (kFirstSums ? 0 : pieces - 1)) {
        float4 *mine = all + piece * (kVec * kN);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
            mine[j * kN] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        __threadfence();
        sync();
        if (tid == 0) atomicAdd(counters + counter, 1u);
        return false;
    }
    if (tid == 0) {
        const unsigned others = static_cast<unsigned>(pieces - 1);
        unsigned seen;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counters + counter) : "memory");
        while (seen != others);
        counters[counter] = 0u;
    }
    sync();
    __threadfence();
    // a piece's kVec loads in flight at once (one round trip to L2 a piece, not one a
    // value), each partial zeroed behind its read for the next call (SPEC 6)
#pragma unroll 1
    for (int sp = kFirstSums ? 1 : 0; sp < (kFirstSums ? pieces : pieces - 1); ++sp) {
        float4 *part = all + sp * (kVec * kN);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
            const float4 v = __ldcg(part + j * kN);
            acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) part[j * kN] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    return true;
}
template <int kPer, int kN, class Sync = BlockSync>
__device__ __forceinline__ bool sum_splits(float (&acc)[kPer], int64_t tile, int split, int splits,
                                           float *partials, unsigned *counters, Sync sync = {}) {
    return sum_pieces<kPer, kN, false>(acc, tile * splits, tile, split, splits, partials, counters,
                                       sync);
}
// The same, the last split storing each sum through store(i, v).
template <int kPer, int kN, class Store, class Sync = BlockSync>
__device__ __forceinline__ void reduce_splits(const float (&acc)[kPer], int64_t tile, int split,
                                              int splits, float *partials, unsigned *counters,
                                              Store &&store, Sync sync = {}) {
    float v[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[i] = acc[i];
    if (!sum_splits<kPer, kN>(v, tile, split, splits, partials, counters, sync)) return;
#pragma unroll
    for (int i = 0; i < kPer; ++i) store(i, v[i]);
}

// The output tile of CTA `tile`: W rows from n0, x rows from m0. Tiles go in groups of
// kGroup rows of m-tiles, m fastest inside a group: the CTAs in flight share a few x tiles
// and W tiles, which L2 then serves.
struct TileOrigin {
    int64_t n0, m0;
};
__device__ __forceinline__ TileOrigin tile_origin(int64_t tile, int64_t m, int64_t n_out, int bm) {
    constexpr int kGroup = 8;
    const int64_t tiles_n = (n_out + kGemmRows - 1) / kGemmRows, tiles_m = (m + bm - 1) / bm;
    const int64_t group = tile / (kGroup * tiles_n), first_m = group * kGroup;
    const int64_t group_m = tiles_m - first_m < kGroup ? tiles_m - first_m : kGroup;
    const int64_t in_group = tile - group * kGroup * tiles_n;
    return {(in_group / group_m) * kGemmRows, (first_m + in_group % group_m) * bm};
}

// kBytes from src to the shared address dst by cp.async in the widest units that divide
// them (16, 8 or 4 bytes); zeros instead where !live.
template <int kBytes>
__device__ __forceinline__ void cp_async_bytes(uint32_t dst, const uint8_t *src, bool live) {
    constexpr int kUnit = kBytes % 16 == 0 ? 16 : (kBytes % 8 == 0 ? 8 : 4);
#pragma unroll
    for (int q = 0; q < kBytes / kUnit; ++q) {
        if constexpr (kUnit == 16) cp_async16(dst + q * kUnit, src + q * kUnit, live ? 16 : 0);
        else if constexpr (kUnit == 8) cp_async8(dst + q * kUnit, src + q * kUnit, live ? 8 : 0);
        else cp_async4(dst + q * kUnit, src + q * kUnit, live ? 4 : 0);
    }
}

// Stored kbit / NF4 / FP4: f(unit) with the byte width of the cp.async copies of W, 16
// where every row's stage (two chunks) starts on 16 bytes (K = 2, 4 and NF4 / FP4,
// aligned), else 4.
template <class Dec, class F>
auto with_w_unit(const Dec &dec, int64_t k_in, F &&f) {
    if constexpr ((2 * Dec::kChunkBytes) % 16 == 0) {
        if (aligned(dec.packed, 16) && (k_in / kChunk) * Dec::kChunkBytes % 16 == 0)
            return f(std::integral_constant<int, 16>{});
    }
    return f(std::integral_constant<int, 4>{});
}

// The split-K arguments of a launch: the plan's split only with a workspace of the plan's
// size (else one split, always correct); partial tiles of bm x kGemmRows floats, then one
// arrival counter a tile.
// The even walk (tiled90_plan) likewise: partial sums a CTA, then a counter a tile.
struct SplitArgs {
    int splits = 1;
    bool even = false;
    float *partials = nullptr;
    unsigned *counters = nullptr;
};
inline SplitArgs split_args(const GemmPlan &plan, int bm, void *workspace, size_t workspace_bytes) {
    SplitArgs a;
    if ((plan.splits < 2 && !plan.even) || workspace == nullptr ||
        workspace_bytes < static_cast<size_t>(plan.workspace) ||
        reinterpret_cast<uintptr_t>(workspace) % 16 != 0)  // (16-byte partials)
        return a;
    a.splits = plan.splits;
    a.even = plan.even;
    a.partials = static_cast<float *>(workspace);
    // (tiled90_plan: only tiles [whole, tiles) split; the even walk: a slot a CTA)
    const int64_t slots = plan.even ? plan.room : (plan.tiles - plan.whole) * a.splits;
    a.counters = reinterpret_cast<unsigned *>(static_cast<uint8_t *>(workspace) +
                                              partial_bytes(slots, bm));
    return a;
}

// Launches Kernel (either GEMM: both take these parameters) over the plan's tiles and
// splits with `threads` threads and `smem` bytes of dynamic shared memory; the split only
// with a workspace of the plan's size (else one split, always correct).
// `extra`: arguments after the common ones (the streamed GEMM's tensor maps).
template <auto Kernel, class T, class Dec, class... Extra>
cudaError_t launch_gemm(int threads, int smem, int bm, const GemmPlan &plan, const Dec &dec,
                        const float *codebook, int k, const void *x, int64_t m, int64_t k_in,
                        int64_t n_out, const void *bias, void *y, void *workspace,
                        size_t workspace_bytes, cudaStream_t stream, const Extra &...extra) {
    using St = typename T::storage;
    cudaError_t err = allow_smem<Kernel>(smem);
    if (err != cudaSuccess) return err;
    const SplitArgs sp = split_args(plan, bm, workspace, workspace_bytes);
    cudaGetLastError();
    Kernel<<<dim3(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(sp.splits)), threads,
             smem, stream>>>(dec, codebook, k, static_cast<const St *>(x), m, k_in, n_out,
                             static_cast<const St *>(bias), static_cast<St *>(y), sp.splits,
                             sp.partials, sp.counters, extra...);
    return launch_error();
}

}  // namespace gemm

}  // namespace
}  // namespace matmul
}  // namespace kbit
