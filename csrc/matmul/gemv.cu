// Fused dequantize + matmul on the GPU (SPEC section 6): y = x · Wᵀ (+ bias) with W read
// as stored, for up to 8 rows of x a pass, or 16 (two n8 tiles on one decode) at m = 9..16
// (kbit, NF4 / FP4, streamed GGUF); larger m go to the GEMMs of gemm.cuh and gemm_sm90.cu.
//
// Tensor-core paths (fp16 / bf16 x). A CTA of 8 warps owns 16 rows of W and up to 8 rows
// of x; its warps split k_in in chunks of 32 elements (one kbit block; NF4/FP4 scales
// cover 32 or more). Per chunk, lane (g, t) of a warp (g = lane / 4, t = lane % 4) turns
// elements 8t .. 8t+7 of W rows g and g+8 into four fp16/bf16 pairs each, takes the same
// 8 elements of x row g, and the warp issues two mma.sync m16n8k16 with fresh fp32
// accumulators, so that the chunk's scale multiplies the chunk's sums in fp32 (4 FFMA
// per lane and chunk). The k order inside an mma does not matter as long as W and x
// agree, which lets each lane keep 8 contiguous elements: x pairs are its natural half2s.
//
// - Staged (kbit K = 2..5, NF4, FP4): each warp streams stages of 4 chunks of the 16 rows,
//   their scales and the same chunks of x into its own ring of shared-memory slots with
//   cp.async, 2 stages ahead of the one it computes, so that the bytes in flight do not
//   live in registers (the first version loaded W into registers, 4 lanes holding the
//   same words, and ran at a third of copy bandwidth: bench/RESULTS.md). A pair's codes
//   (2K bits) index a table of half2 values (the codebook over its largest |entry|, so
//   that any finite codebook fits fp16), replicated once per lane of a shared-memory
//   phase so that a warp's 32 lookups never share a bank. For kbit the pair index comes
//   from the bit planes by a 4x4 transpose of 2-bit fields (two delta swaps); for
//   NF4/FP4 it is the packed byte.
// - Tiled (kbit weights repacked once by kbit_tile, formats/kbit_tiled.h): no transposes
//   (the repack did them). m <= 8 on sm_90: streamed, a persistent CTA an SM reading
//   every grid-th row tile (the two-tile kernels of K = 2, and of K = 3 where x
//   outweighs W: a run of pairs), each one contiguous range, through a ring of
//   shared-memory stages that the bulk copy engine fills (gemv_tiled_kernel; K = 2 at
//   m <= 4 on its quad table: the halves decode, halves_decode); m = 9..16
//   and older GPUs: each lane loads its own pair indices into registers one group ahead
//   (gemv_tiled_regs_kernel).
// - GGUF streamed (gguf_stream.cuh, sm_90, m <= 16 below gguf90_min_m): the tiled
//   streamed kernel's ring over the file's blocks (a TMA box of 16 rows a stage and row
//   tile, one or four tiles a stage), integer codes turned into exact fp16/bf16 pairs by
//   byte permutes, scales on the fp32 sums; from gguf90_min_m the GGUF GEMM of
//   gemm_sm90.cu.
// - Direct (GGUF otherwise): each lane decodes its 8 elements with the format's own group
//   decoder (csrc/formats/gguf.h), whose values carry their scales, and packs them into pairs.
//
// Generic path (fp32 x, misaligned operands): one warp per row of W, lanes over 8-element
// groups decoded by the format's decoder, float32 FMAs for every row of x: the GPU twin
// of the host loop.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <type_traits>

#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/kbit_tiled.h"
#include "../formats/matmul.h"
#include "decoders.cuh"
#include "gemm_sm90.h"

namespace kbit {
namespace matmul {
namespace {

// ---- the tensor-core kernels -----------------------------------------------------------------

// C += the chunk's two mma steps: A rows g / g+8 from pa / pb, B from the 8 x values.
template <class T>
__device__ __forceinline__ void chunk_mma(const uint32_t (&pa)[4], const uint32_t (&pb)[4],
                                          const uint4 &xv, float sa, float sb, float (&acc)[4]) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_16816(T{}, c, {pa[0], pb[0], pa[1], pb[1]}, xv.x, xv.y);
    mma_16816(T{}, c, {pa[2], pb[2], pa[3], pb[3]}, xv.z, xv.w);
    acc[0] = fmaf(sa, c[0], acc[0]);
    acc[1] = fmaf(sa, c[1], acc[1]);
    acc[2] = fmaf(sb, c[2], acc[2]);
    acc[3] = fmaf(sb, c[3], acc[3]);
}

// K = 2 at m <= kHalvesMaxM ("halves", on the quad table: quad_rows): an mma step takes
// one row's four pairs of a chunk as its A, so its two rows of C hold that row's even and
// odd pairs of k. B holds each row j of x twice, the elements of the even pairs in column
// 2j and of the odd ones in 2j + 1 (lane (g, t): row g / 2 of x, the pairs of parity
// g % 2, xb its two 4-byte loads at elements 8t + 2 (g % 2) and 8t + 4 + 2 (g % 2)), and
// C(g, 2j) + C(g + 8, 2j + 1) is the row's sum against x row j, held by lane (g, t = j).
// Rows g and g + 8 take an mma step each, into sums of their own: acc[0] row g, acc[2]
// row g + 8, column t (acc[1], acc[3] unused).
constexpr int kHalvesMaxM = kMaxM / 2;  // two columns of B an x row
// The streamed tiled kernels that take the halves decode at m <= kHalvesMaxM, as measured
// (bench/RESULTS.md, session 39): K = 2 on the quad table with two units a warp (one row
// tile a stage: 2-10% faster with every scale format), or with two row tiles a stage and
// E4M4 scales (2-8% faster; with fp16 / fp32 scales those spill and ran 3-15% slower).
// One unit of one row tile a warp was not measured and keeps the committed decode.
template <int K, kbit_absmax_format F, int kQuads, int kPerWarp, int kTiles>
constexpr bool halves_decode() {
    return K == 2 && kQuads > 0 &&
           (kPerWarp == 2 || (kTiles == 2 && F == KBIT_ABSMAX_E4M4));
}
template <class T>
__device__ __forceinline__ void chunk_mma_halves(const uint32_t (&ag)[4], const uint32_t (&ag8)[4],
                                                 uint2 xb, float sa, float sb, float (&acc)[4]) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_16816(T{}, c, ag, xb.x, xb.y);   // row g
    mma_16816(T{}, d, ag8, xb.x, xb.y);  // row g + 8
    acc[0] = fmaf(sa, c[0] + c[3], acc[0]);
    acc[2] = fmaf(sb, d[0] + d[3], acc[2]);
}

// The partial sums of the CTA's kWarps warps of a 16 x 8 tile, added in a fixed order;
// bias, one rounding, y. acc: lane (g, t)'s C fragment (rows g, g+8; columns 2t, 2t+1).
// Before its next call, the CTA must meet again (its shared partial sums are reused).
template <class T>
__device__ __forceinline__ void store_tile(const float (&acc)[4], int64_t r0, int64_t m0,
                                           int64_t m, int64_t n_out,
                                           const typename T::storage *bias,
                                           typename T::storage *y) {
    __shared__ float partial[kWarps][kTileRows][kMaxM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
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
            store_y<T>(y, bias, i, r, n_out, v);
        }
    }
}

// Shared memory of the staged kernel: the pair table, then per warp kStages slots of
// [W: 16 rows x row bytes][scales: 16 rows x 16 bytes][x: m_rows x kXRow bytes].
constexpr int kStages = 3;        // slots per warp: kStages - 1 stages in flight
constexpr int kStageChunks = 4;   // chunks per row and stage
// One x row of a stage, padded by 16 bytes, which leaves the two rows of a quarter warp's
// 16-byte reads 2-way conflicted from m = 2; x_row_stride's 64 would not, but it costs
// shared memory that sm_80 / 86 / 89 lack for this kernel at m = 5..16 (a review, session
// 17), where this kernel serves every m to 16, and measured 0-2% on the H100 (NF4).
constexpr int kXRow = kStageChunks * kChunk * 2 + 16;
template <class Dec>
constexpr int w_row_bytes() { return (kStageChunks * Dec::kChunkBytes + 15) / 16 * 16; }
template <class Dec>
__host__ __device__ constexpr int slot_bytes(int m_rows) {
    return kTileRows * w_row_bytes<Dec>() + kTileRows * 16 + m_rows * kXRow;
}
template <class Dec>
__host__ __device__ constexpr int staged_smem(int m_rows) {
    return table_bytes<Dec>() + kWarps * kStages * slot_bytes<Dec>(m_rows);
}

// Staged: every warp streams its stages (kStageChunks chunks of the CTA's 16 rows, their
// scales and the same chunks of x) into its own ring of shared-memory slots with
// cp.async, kStages - 1 ahead of the one it computes. kWUnit: 16-byte copies of W (its
// rows start on 16 bytes) or 4-byte ones.
// NT: n8 tiles of x rows a CTA takes (8 NT rows), sharing each chunk's decoded pairs.
template <class T, class Dec, int kWUnit, int NT>
__global__ void __launch_bounds__(kThreads)
gemv_staged_kernel(Dec dec, const float *__restrict__ codebook, int k,
                   const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                   int64_t n_out, const typename T::storage *__restrict__ bias,
                   typename T::storage *__restrict__ y) {
    extern __shared__ uint4 smem[];
    uint32_t *table = reinterpret_cast<uint32_t *>(smem);
    constexpr int copies = table_copies<Dec::kEntries>();
    constexpr int kRowBytes = w_row_bytes<Dec>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    const float book_scale = fill_pair_table<Dec>(table, codebook, k);
    if constexpr (Dec::kUsesCodebook) dec.scale_mul *= book_scale;

    const int64_t chunks = k_in / kChunk;
    const int64_t stages = (chunks + kStageChunks - 1) / kStageChunks;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * (kMaxM * NT);
    const int m_rows = static_cast<int>(m - m0 < kMaxM * NT ? m - m0 : kMaxM * NT);
    const int slot = slot_bytes<Dec>(m_rows);
    uint8_t *ring = reinterpret_cast<uint8_t *>(smem) + table_bytes<Dec>() +
                    warp * kStages * slot;
    const auto *xb = reinterpret_cast<const uint8_t *>(x);

    // What each lane copies of every stage, fixed for the whole kernel: W units (row,
    // unit of the row's stage bytes), scale words (row, word of the row's window), x
    // units (row of x, 16-byte unit of its stage). Per stage only the chunk offset moves.
    constexpr int w_units = kRowBytes / kWUnit;
    constexpr int w_per_lane = (kTileRows * w_units + 31) / 32;
    constexpr int x_units = kStageChunks * kChunk * 2 / 16;
    constexpr int x_per_lane = kMaxM * NT * x_units / 32;
    int64_t w_src[w_per_lane], s_chunk[2], x_src[x_per_lane];
#pragma unroll
    for (int i = 0; i < w_per_lane; ++i) {
        const int u = lane + 32 * i, row = u / w_units, q = u % w_units;
        w_src[i] = (min(r0 + row, n_out - 1) * chunks) * Dec::kChunkBytes + q * kWUnit;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) s_chunk[i] = min(r0 + (lane + 32 * i) / 4, n_out - 1) * chunks;
#pragma unroll
    for (int i = 0; i < x_per_lane; ++i) {
        const int u = lane + 32 * i;
        x_src[i] = ((m0 + u / x_units) * k_in) * 2 + (u % x_units) * 16;
    }

    // Issues stage s (the warp's i-th: s = warp + i * kWarps) into ring slot i % kStages;
    // one commit group per call, empty past the last stage.
    auto issue = [&](int64_t i) {
        const int64_t s = warp + i * kWarps;
        if (s < stages) {
            uint8_t *base = ring + (i % kStages) * slot;
            const int64_t j0 = s * kStageChunks;
            const int n = static_cast<int>(chunks - j0 < kStageChunks ? chunks - j0 : kStageChunks);
            // A whole stage never reads past its rows: no bounds to check.
            const bool whole = n == kStageChunks && (kTileRows * w_units) % 32 == 0;
#pragma unroll
            for (int i = 0; i < w_per_lane; ++i) {
                const int u = lane + 32 * i, row = u / w_units, q = u % w_units;
                const int64_t off = w_src[i] + j0 * Dec::kChunkBytes;
                const uint32_t dst = smem_address(base + row * kRowBytes + q * kWUnit);
                if (whole) {
                    if constexpr (kWUnit == 16) cp_async16(dst, dec.packed + off, 16);
                    else cp_async4(dst, dec.packed + off, 4);
                    continue;
                }
                if (row >= kTileRows || q * kWUnit >= n * Dec::kChunkBytes) continue;
                if constexpr (kWUnit == 16)
                    cp_async16(dst, dec.packed + off, inside(off, dec.packed_bytes, 16));
                else
                    cp_async4(dst, dec.packed + off, inside(off, dec.packed_bytes, 4));
            }
            uint8_t *scales = base + kTileRows * kRowBytes;
#pragma unroll
            for (int i = 0; i < 2; ++i) {  // the 4-byte words that hold the row's scales
                const int u = lane + 32 * i, row = u / 4, q = u % 4;
                const int64_t c = s_chunk[i] + j0;
                const int64_t off = dec.scale_offset(c) / 4 * 4 + 4 * q;
                if (off < dec.scale_offset(c + n - 1) + Dec::kScaleBytes)
                    cp_async4(smem_address(scales + row * 16 + 4 * q), dec.absmax + off,
                              inside(off, dec.absmax_bytes, 4));
            }
            uint8_t *xs = scales + kTileRows * 16;
#pragma unroll
            for (int i = 0; i < x_per_lane; ++i) {
                const int u = lane + 32 * i, row = u / x_units, q = u % x_units;
                if (row >= m_rows || q / (kChunk * 2 / 16) >= n) continue;
                const int64_t off = x_src[i] + j0 * (kChunk * 2);
                cp_async16(smem_address(xs + row * kXRow + q * 16), xb + off, 16);
            }
        }
        cp_async_commit();
    };

    const int64_t mine = warp < stages ? (stages - warp + kWarps - 1) / kWarps : 0;
    const int64_t row_a = min(r0 + g, n_out - 1), row_b = min(r0 + g + 8, n_out - 1);
    const auto my_table = lane_table<copies>(table);
    float acc[NT][4] = {};
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) issue(i);
    for (int64_t i = 0; i < mine; ++i) {
        issue(i + kStages - 1);
        cp_async_wait<kStages - 1>();
        __syncwarp();
        const uint8_t *base = ring + (i % kStages) * slot;
        const uint8_t *scales = base + kTileRows * kRowBytes;
        const uint8_t *xs = scales + kTileRows * 16 + g * kXRow + t * 16;
        const int64_t j0 = (warp + i * kWarps) * kStageChunks;
        const int n = static_cast<int>(chunks - j0 < kStageChunks ? chunks - j0 : kStageChunks);
        const int64_t ca = row_a * chunks + j0, cb = row_b * chunks + j0;
        // this stage's scales of rows g and g+8 in their windows
        const uint8_t *sa = scales + g * 16 + (dec.scale_offset(ca) & 3);
        const uint8_t *sb = scales + (g + 8) * 16 + (dec.scale_offset(cb) & 3);
        const uint8_t *wa = base + g * kRowBytes, *wb = base + (g + 8) * kRowBytes;
#pragma unroll
        for (int u = 0; u < kStageChunks; ++u) {
            if (u >= n) break;
            uint32_t pa[4], pb[4];
            dec.pairs(wa + u * Dec::kChunkBytes, t, my_table, pa);
            dec.pairs(wb + u * Dec::kChunkBytes, t, my_table, pb);
            const float fa = dec.scale(sa + dec.scale_delta(ca, u));
            const float fb = dec.scale(sb + dec.scale_delta(cb, u));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 xv = g + 8 * nt < m_rows
                                     ? *reinterpret_cast<const uint4 *>(xs + 8 * nt * kXRow + u * 64)
                                     : make_uint4(0, 0, 0, 0);
                chunk_mma<T>(pa, pb, xv, fa, fb, acc[nt]);
            }
        }
        __syncwarp();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        if (nt > 0) __syncthreads();  // store_tile's shared partials are reused
        store_tile<T>(acc[nt], r0, m0 + 8 * nt, m, n_out, bias, y);
    }
}

// Direct: each lane's decoder loads its own elements (GGUF blocks, whose chunks are not
// contiguous runs of whole words); kUnroll chunks' loads are issued together.
template <class T, class Dec>
__global__ void __launch_bounds__(kThreads)
gemv_direct_kernel(Dec dec, const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                   int64_t n_out, const typename T::storage *__restrict__ bias,
                   typename T::storage *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int64_t chunks = k_in / kChunk;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
    const int64_t row_a = min(r0 + g, n_out - 1), row_b = min(r0 + g + 8, n_out - 1);
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kMaxM;
    const bool has_x = m0 + g < m;
    const uint4 *xrow = reinterpret_cast<const uint4 *>(x + (m0 + g) * k_in) + t;

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
            dec.pairs(wa[u], pa);
            dec.pairs(wb[u], pb);
            chunk_mma<T>(pa, pb, xv[u], 1.0f, 1.0f, acc);
        }
    }
    store_tile<T>(acc, r0, m0, m, n_out, bias, y);
}

// Tiled kbit (formats/kbit_tiled.h), streamed: a persistent CTA per SM owns row tiles
// (StreamWalk), whose (tile, group) units lie back to back in memory, and streams them
// through a ring of shared-memory stages with the bulk copy engine. One producer lane
// issues each stage as a few cp.async.bulk copies (the stage's units of W, their scales
// and the x elements they meet) completing on the stage's "full" mbarrier; the 16
// consumer warps decode the stage's units and release the slot on its "empty" mbarrier.
// The bytes in flight are the ring's (tens of KB an SM), not the registers', and a CTA
// reads each of its row tiles (or pairs) as one contiguous range of W. Lane (g, t) reads
// its segment and rows g and g+8's scales from the stage, takes each pair index as a
// fixed-position bit field and looks it up in the pair table (one shift, one LOP3 and one
// load; at K = 2 on long runs the quad table, two pairs a load), E4M4 scales decoded by
// arithmetic; after a tile's last stage the warps hand their sums to a reducer warp
// through shared memory (TileSums) and go on. At K = 2 (K = 3 where x, copied with each
// stage, outweighs W) a stage may hold the same groups of two row tiles, whose units a
// warp decodes against one load of x (kAcrossMinRing). Every per-stage address is a
// lane's fixed offset plus the slot's: the loop keeps to 32-bit arithmetic
// (bench/RESULTS.md, session 7: a version that recomputed them issued 0.21
// warp-instructions per weight, this one 0.115 at K = 4).
constexpr int kStreamWarps = 16;  // consumer warps (24 measured no faster: bench/RESULTS.md)
constexpr int kStreamThreads = (kStreamWarps + 1) * 32;  // and one producer warp
// Ring stages: at most kStreamMaxStages; kStreamLeanStages where x is resident (the stages
// W alone) for the kernels whose decode runs well ahead of their copies (kbit K >= 4 and
// NF4 / FP4 tiled; GGUF but Q4_K). Fewer stages in flight measured faster than the eight
// that fit before (H100, bench/RESULTS.md session 24; m = 1: 8192x28672 Q4_0 57.3
// against 60.6 us, Q4_K 58.5 against 64.7, 28672x8192 K = 4 53.5 against 55.3;
// 14336x4096 Q5_K 23.6 against 26.6), two slower; K = 2, 3 and Q4_K (whose decode comes
// nearest its copies), and GGUF stages that carry x, lose 1-4% with three: they keep four.
constexpr int kStreamMaxStages = 4;
constexpr int kStreamLeanStages = 3;
// The ring's stages at most where x is resident, for a kernel family whose decode runs
// well ahead of its copies (decode_ahead) or not.
constexpr int resident_ring_stages(bool decode_ahead) {
    return decode_ahead ? kStreamLeanStages : kStreamMaxStages;
}
// dynamic shared memory: pair table + ring (with the static arrays, within 227 KB)
constexpr int kStreamSmem = 216 * 1024;

// One stage of the ring: [W: kUnits units][scales: kUnits units][x: rows of kUnits units],
// kPerWarp units a consumer warp (warp w takes units w, w + kStreamWarps, ...). (Two warps
// a unit, for m = 9..16, measured slower than the register kernel: bench/RESULTS.md,
// session 7.)
template <int K, kbit_absmax_format FMT, int kPerWarp = 1, int kTiles = 1>
struct StreamStage {
    static constexpr int kUnits = kStreamWarps * kPerWarp * kTiles;  // slots of W and scales
    static constexpr int kGroups = kStreamWarps * kPerWarp;           // of x
    static constexpr int kSB = FMT == KBIT_ABSMAX_E4M4 ? 1 : (FMT == KBIT_ABSMAX_FP16 ? 2 : 4);
    static constexpr int kUnitW = tiled::kLanes * 8 * K;                        // bytes of W
    static constexpr int kUnitS = tiled::kTileRows * tiled::kGroupChunks * kSB;  // of scales
    static constexpr int kXUnit = tiled::kGroupChunks * kChunk * 2;  // x bytes of a unit, a row
    static constexpr int kScales = kUnits * kUnitW;                  // offsets in a stage
    static constexpr int kX = kScales + kUnits * kUnitS;
    static constexpr int kXRow = static_cast<int>(x_row_stride(kGroups * kXUnit, 16));
    static __host__ __device__ constexpr int bytes(int x_rows) { return kX + x_rows * kXRow; }
};

// The streamed tiled GEMV's table: the quad table (K = 2, four weights a load) or the pair
// table. K = 2 takes the quad table where a CTA reads kQuadMinStages stages or more: its
// 32 or 64 KB are filled before a stage is read, which measured slower on fewer
// (bench/RESULTS.md, session 16).
constexpr int kQuadMinStages = 24;
// The quad table's 32 copies (64 KB) where they leave a ring of kQuadMinRing stages or more,
// else 16 (H100, bench/RESULTS.md session 21: 8192x28672 at m = 5, x copied with each stage,
// 13% slower with 32 copies and a ring of two than with 16 and a ring of two; at m = 1, 2
// with rings of five or more 1-3% faster).
constexpr int kQuadMinRing = 3;
// K = 2 and 3, whose units are short, take two units a warp a stage (a stage's wait,
// release and bookkeeping paid once for twice the weights) where a row has kPairMinGroups
// groups or more. Measured (H100, bench/RESULTS.md, session 20): 8192x28672 (224 groups)
// K = 2 / 3 at m = 4 and 8 9-14% faster, m = 1 -2% / +1%; 4096x14336 (112 groups) 3-11%
// slower at m = 1..8; rows of 64 groups or fewer up to 5% slower at m = 1..4 and 11-15% at
// m = 8 (fewer, larger stages a CTA).
constexpr int kPairMinGroups = 128;
constexpr int kFirstStages = 2;  // the producer's copies before the table is filled
// K = 2 takes two row tiles a stage (kTiles = 2: a warp's two units are one group of each,
// which share its x loads, and a stage carries one copy of x for both) where a CTA has two
// row tiles or more, reads kAcrossMinStages such stages or more, and keeps x's residence
// and a ring of kAcrossMinRing. At m = 1 the decode alone (its W copies removed) ran 37 µs
// on 8192x28672 against 30 for the copies alone: K = 2 is bound by its decode, whose
// shared-memory loads return x's 16 bytes a lane a chunk beside the table's 32 (H100,
// bench/RESULTS.md session 23). Measured: 28672x8192 m = 1..4 8-9% faster, 8192x28672
// m = 1 6% and m = 8 9% (m = 4 1-3% slower), 4096x14336 m = 1..4 1-3% and m = 8 13%; with a
// ring of two (28672x8192 at m = 8) 2% slower, and 4096x4096 (two such stages a CTA) 3-5%
// slower. (K = 3, 4, 5 and NF4, bound by the copies, measured -3% to +3% by shape with x
// resident: not taken.)
// K = 3 takes them too where x comes with each stage and outweighs W there more than twice
// (x_outweighs_w: with one tile a stage, x's shared-memory traffic, not W's, is the load):
// 8192x28672 and 4096x14336 at m = 8 8-10% faster; at m = 1, 2 on 4096x14336 and m = 4
// on 8192x28672 (x 1.3 times W or less) 3-10% slower, and K = 4 at m = 8 (x twice W) level
// (H100, bench/RESULTS.md session 26; m = 5..7 not measured: the rule takes m = 7, which
// on 8192x28672 also leaves two units a warp for it).
constexpr int kAcrossMinRing = 3, kAcrossMinStages = 4;
// A stage's x (m rows of x_bytes-byte elements) against its row tile's W codes (16 rows of
// K bits; the scales not counted), for the same k: more than twice as many bytes.
constexpr bool x_outweighs_w(int64_t m, int x_bytes, int K) { return m * x_bytes > 4 * K; }
// The bytes of the streamed tiled GEMV's table: K = 2's quad table in kQuads copies (32:
// rows of 256 bytes, 64 KB; 16: 32 KB, where 32 copies would cost x its residence or leave
// fewer than kQuadMinRing stages), K = 4's pair table in rows of 256 bytes (64 KB), other K
// the pair table. Rows of 256 bytes take one byte permute an address where rows of 128
// took two instructions (ByteRows).
template <class T, int K, kbit_absmax_format FMT, int kQuads>
constexpr int stream_table_bytes() {
    if constexpr (kQuads > 0) return QuadTable<kQuads>::kBytes;
    else if constexpr (K == 4) return BytePairTable::kBytes;
    else return table_bytes<KbitStaged<T, K, FMT>>();
}

// The quad table's bytes in `copies` copies (16 or 32), chosen at run time.
constexpr int quad_table_bytes(int copies) {
    return copies == 32 ? QuadTable<32>::kBytes : QuadTable<16>::kBytes;
}

// The consumer warps' own barrier (the producer warp never joins it).
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamWarps * 32) : "memory");
}

// x held in shared memory for the whole kernel, rather than copied again with every
// stage (every row tile of a CTA reads the same x), where its rows fit kResidentX bytes
// and a CTA has kResidentTiles row tiles or more to reuse them (8192x28672: 3.9 a CTA on
// 132 SMs; 4096x4096: 1.9): the stages then carry W alone. Measured (bench/RESULTS.md,
// session 10): the tiled GEMV at m = 1 3-10% faster; with two tiles a CTA (4096x4096), up
// to 10% slower at m = 4..8 (x then arrived before the first stage was read; the tiled
// GEMV's x, and since session 26 the GGUF stream's, now comes a piece with each of its
// first tile's (or group's) stages, and the tiled GEMV's rule measured still best there:
// session 25, 4096x4096 K = 5 m = 8 5% faster resident, 8192x28672 K = 2 m = 2 3%
// slower, the rest within 1%). Rows at
// `stride` bytes (x_row_stride of k_in * 2 for the kernel's x reads of `read` bytes) from
// the start of the dynamic shared memory after the pair table, the ring after them.
// The tiled GEMV holds up to kResidentXTiled bytes where its ring keeps kResidentMinRing
// stages beside them and a CTA has kResidentTilesLarge row tiles or more (H100, session 16:
// 28672x8192, 13.6 tiles a CTA, m = 5..8 12-26% faster; session 21: a ring of 3 stages,
// was 4, m = 7 K = 4 / 5 8% faster; at m = 1, 2 rings of 3 to 8 stages measured alike
// there, and three or four faster than eight in session 24: kStreamMaxStages).
constexpr int kResidentX = 72 * 1024;
constexpr int kResidentXTiled = 136 * 1024;
constexpr int kResidentMinRing = 3;
constexpr int kResidentTiles = 3;
constexpr int kResidentTilesLarge = 8;
inline int resident_x_stride(int x_rows, int64_t k_in, int64_t n_out, int ctas, int read,
                             int limit = kResidentX) {
    const int64_t stride = x_row_stride(k_in * 2, read), tiles = blocks_of(n_out, kTileRows);
    // past kResidentX only where a CTA reads x kResidentTilesLarge times or more
    // (8192x28672, 3.9 tiles a CTA, m = 2: 115 KB, 1-3% slower resident in session 16,
    // where x arrived before the first stage; 3% at K = 2 in session 25, in pieces)
    const int reuse = x_rows * stride > kResidentX ? kResidentTilesLarge : kResidentTiles;
    const bool reused = tiles >= static_cast<int64_t>(reuse) * ctas;
    return reused && x_rows * stride <= limit ? static_cast<int>(stride) : 0;
}
__host__ __device__ inline int resident_x_bytes(int x_rows, int stride) {
    return (x_rows * stride + 127) / 128 * 128;
}
struct ResidentX {
    int stride, rows;  // stride 0: x comes with the stages
    uint32_t base;     // shared address of row 0
    __device__ __forceinline__ bool on() const { return stride != 0; }
    __device__ __forceinline__ uint32_t row_at(int r) const { return base + r * stride; }
    __device__ __forceinline__ uint32_t ring_at() const {
        return base + (on() ? resident_x_bytes(rows, stride) : 0);
    }
    // Where x's `rows` (xb, k_in elements each) go for a stage: the ring slot's copy (at
    // `slot`, rows `slot_stride` apart) or, resident, their own place. A resident x comes
    // a piece at a time with the CTA's first row tile's (or group's) stages, each stage
    // carrying the k elements its units meet, so the consumers wait for no more than the
    // stage they decode (one copy of all of x before the first stage held them for up to
    // 115 KB: bench/RESULTS.md, session 25; the GGUF stream's m = 2..8 2-6% faster on
    // 14336x4096, session 26). x_piece: the elements of x a stage carries, `elems` (its
    // units' k) where x comes with every stage or in the first tile's (group's) stages,
    // else 0.
    __device__ __forceinline__ int x_piece(bool first_tile, int elems) const {
        return (!on() || first_tile) ? elems : 0;
    }
    // The producer lane: elements [k0, k0 + elems) of every row, on `bar` (whose expected
    // bytes the caller counts: rows * elems * 2).
    __device__ __forceinline__ void copy(uint32_t bar, const uint8_t *xb, int64_t k_in, int k0,
                                         int elems, uint32_t slot, int slot_stride,
                                         uint64_t policy) const {
        for (int i = 0; i < rows && elems > 0; ++i)
            bulk_copy(on() ? row_at(i) + k0 * 2 : slot + i * slot_stride,
                      xb + (i * k_in + static_cast<int64_t>(k0)) * 2,
                      static_cast<uint32_t>(elems * 2), bar, policy);
    }
};

// The ring's barriers (one thread): a full and an empty one a slot; then the fence that
// publishes them and any the caller initialised before (the kernel's own).
__device__ __forceinline__ void ring_init(uint32_t full_at, uint32_t empty_at, int stages) {
    for (int s = 0; s < stages; ++s) {
        mbar_init(full_at + 8 * s, 1);
        mbar_init(empty_at + 8 * s, kStreamWarps * 32);  // every consumer lane
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// How many of `items` (row tiles, or the GGUF stream's groups of them) a CTA takes when
// they are dealt round-robin over the grid: CTA b takes b, b + gridDim.x, ..., so that the
// grid reads neighbouring rows of W at a time.
__device__ __forceinline__ int64_t round_robin_count(int64_t items) {
    return (items - blockIdx.x + gridDim.x - 1) / gridDim.x;
}

// A streamed CTA's share of the work: `count` row tiles, the CTA's i-th at first + i step,
// taken in groups of kTiles; their `stages` stages; and the rows of x (all of them: one
// pass, m <= pass_rows, as the launchers ask). Single tiles are dealt round-robin
// (round_robin_count), 1-6% faster than a run of consecutive tiles a CTA at K = 3..5 and
// NF4, m = 1..4 on the large weights, within 1% at m = 8 (H100, bench/RESULTS.md session
// 25). Groups of two tiles (K = 2, and K = 3 where x outweighs W) keep a run a CTA: dealt
// round-robin as pairs, the fullest CTA took a tile more (448 pairs over 132 CTAs), and a
// CTA pairing its own round-robin tiles ran 0.5-1.5% slower at m = 2..8.
struct StreamWalk {
    int64_t first, step, count, stages;
    int x_rows;
    __device__ __forceinline__ int64_t tile(int64_t i) const { return first + i * step; }
    // row tiles of the CTA's j-th group of kTiles
    template <int kTiles>
    __device__ __forceinline__ int group_tiles(int64_t j) const {
        if constexpr (kTiles == 1) return 1;
        else return static_cast<int>(min(static_cast<int64_t>(kTiles), count - j * kTiles));
    }
};
// (stages: those of the CTA's groups of kTiles row tiles, stages_per_tile each)
template <int kTiles = 1>
__device__ __forceinline__ StreamWalk stream_walk(int64_t n_out, int stages_per_tile, int64_t m,
                                                  int pass_rows) {
    const int64_t tiles = (n_out + kTileRows - 1) / kTileRows;
    const int x_rows = static_cast<int>(m < pass_rows ? m : pass_rows);
    if constexpr (kTiles == 1) {
        const int64_t count = round_robin_count(tiles);
        return {blockIdx.x, gridDim.x, count, count * stages_per_tile, x_rows};
    } else {
        const int64_t first = blockIdx.x * tiles / gridDim.x,
                      last = (blockIdx.x + 1) * tiles / gridDim.x;
        return {first, 1, last - first, (last - first + kTiles - 1) / kTiles * stages_per_tile,
                x_rows};
    }
}

// A position in the ring: the slot, its barriers' phase and its byte offset, advanced a
// stage at a time alike by the producer and the consumers.
struct RingSlot {
    int slot = 0;
    uint32_t phase = 0, at = 0;  // at: slot * stage_bytes
    __device__ __forceinline__ void next(int ring_stages, int stage_bytes) {
        if (++slot == ring_stages) slot = 0, at = 0, phase ^= 1u;
        else at += stage_bytes;
    }
};

// C fragments of NT tiles a lane holds for its warp: n8 tiles of x (rows g + 8 nt), or in
// the streamed tiled GEMV the row tiles of a stage.
template <int NT>
struct Sums {
    float v[NT][4] = {};
};

// The streamed tiled GEMV's row-tile sums leave its consumers without a CTA barrier: each
// consumer warp writes its C fragment, times out, into a buffer of partial sums and
// arrives on the buffer's `full` barrier; a reducer warp adds the 16 warps' sums in warp
// order (store_tile's order: the same bits), adds the bias, stores y and releases the
// buffer on its `empty` barrier. A consumer waits only where the reducer has not yet read
// the previous tile's sums: a warp runs up to a tile ahead of the slowest one, not in
// step with it. (Two CTA-wide barriers a tile had every warp wait for the slowest:
// H100, bench/RESULTS.md session 22, 28672x8192 at K = 2 and 3, 13.6 tiles a CTA, 5-6%
// slower than with the reducer. On 4096-row weights, two tiles a CTA, this kernel is 1-3%
// slower than the barrier version, and was so too where those CTAs kept the barriers: not
// the hand-off's cost. Two buffers, a warp up to two tiles ahead, cost K = 4 at m = 8 a
// stage of its ring of three: 6-9% slower.)
constexpr int kTiledStreamThreads = (kStreamWarps + 2) * 32;  // + the producer and the reducer
constexpr int kTileSumBytes = kTileRows * kMaxM * 4;          // a warp's 16 x 8 floats
constexpr int kTileSumsBytes = kStreamWarps * kTileSumBytes;  // the buffer, 8 KB
// Dynamic shared memory of the tiled kernel (the buffer above, then as kStreamSmem), whose
// static arrays are only its barriers and the codebook (under 2 KB; store_tile's 8 KB of
// partial sums are the buffer).
constexpr int kTiledStreamSmem = 225 * 1024;

template <int kTiles = 1>
struct TileSums {
    uint32_t at, full, empty;  // the buffer's shared address and barriers
    // A consumer lane's fragments (rows g, g + 8; columns 2t, 2t + 1, or with kHalves
    // column t: v[u][0] and v[u][2]) of the j-th group of kTiles row tiles of its CTA (n of
    // them), once the reducer has read group j - 1's. (kHalves never writes columns 4..7:
    // the reducer adds what they hold but stores only the columns below m <= 4.)
    template <bool kHalves = false>
    __device__ __forceinline__ void put(int64_t j, int warp, int g, int t,
                                        const float (&v)[kTiles][4], int n) const {
        if (j >= 1) mbar_wait(empty, static_cast<uint32_t>((j - 1) & 1));
#pragma unroll
        for (int u = 0; u < kTiles; ++u) {
            if (u >= n) break;
            const uint32_t w = at + u * kTileSumsBytes + warp * kTileSumBytes +
                               (g * kMaxM + (kHalves ? t : 2 * t)) * 4;
            if constexpr (kHalves) {
                sts_u32(w, __float_as_uint(v[u][0]));                   // row g
                sts_u32(w + 8 * kMaxM * 4, __float_as_uint(v[u][2]));  // row g + 8
            } else {
                sts_u32x2(w, __float_as_uint(v[u][0]), __float_as_uint(v[u][1]));  // row g
                sts_u32x2(w + 8 * kMaxM * 4, __float_as_uint(v[u][2]),
                          __float_as_uint(v[u][3]));  // row g + 8
            }
        }
        mbar_arrive(full);
    }
    // The reducer warp: the j-th group's n row tiles (rows r0.., r0 + r_step.., ...) to
    // y, lane l the outputs 4 l .. 4 l + 3 of each row-major 16 x 8 tile (row l / 2).
    template <class T>
    __device__ __forceinline__ void reduce(int64_t j, int64_t r0, int64_t r_step, int n,
                                           int64_t m, int64_t n_out,
                                           const typename T::storage *bias,
                                           typename T::storage *y) const {
        const int lane = threadIdx.x & 31;
        const uint32_t from = at + mbar_wait(full, static_cast<uint32_t>(j & 1)) + 16 * lane;
        float v[kTiles][4] = {};
#pragma unroll
        for (int u = 0; u < kTiles; ++u) {
            if (u >= n) break;
#pragma unroll
            for (int w = 0; w < kStreamWarps; ++w) {  // (ordered: read before the release)
                const uint4 p = lds_u32x4_ordered(from + u * kTileSumsBytes + w * kTileSumBytes);
                v[u][0] += __uint_as_float(p.x), v[u][1] += __uint_as_float(p.y);
                v[u][2] += __uint_as_float(p.z), v[u][3] += __uint_as_float(p.w);
            }
        }
        mbar_arrive(empty);
#pragma unroll
        for (int u = 0; u < kTiles; ++u) {
            const int64_t r = r0 + u * r_step + lane / 2;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int64_t i = (lane & 1) * 4 + k;
                if (u < n && r < n_out && i < m) store_y<T>(y, bias, i, r, n_out, v[u][k]);
            }
        }
    }
};

// The consumer warps' walk over a CTA's stages: each stage waited for, body(at, g0) (its
// slot's shared offset and its first unit of the row of `groups` units, kUnits a stage,
// both carrying the wait's zero: a resident x is read at g0's place, and its first
// tile's stages bring it), released by every lane (each its own reads); after the j-th
// group of row tiles' last stage, tile_end(j).
template <int kUnits, class Body, class TileEnd>
__device__ __forceinline__ void consume_stages(const StreamWalk &walk, int groups,
                                               uint32_t full_at, uint32_t empty_at,
                                               int ring_stages, int stage_bytes, Body &&body,
                                               TileEnd &&tile_end) {
    RingSlot c;
    int g0 = 0;
    int64_t j = 0;
    for (int64_t q = 0; q < walk.stages; ++q) {
        const uint32_t zero = mbar_wait(full_at + 8 * c.slot, c.phase);
        body(c.at + zero, g0 + static_cast<int>(zero));
        mbar_arrive(empty_at + 8 * c.slot);
        c.next(ring_stages, stage_bytes);
        if ((g0 += kUnits) < groups) continue;
        g0 = 0;
        tile_end(j++);
    }
}

// Up to 8 rows of x (one n8 tile). kTiles > 1 (with kPerWarp 1): a stage
// holds the same groups of kTiles consecutive row tiles, and a warp's units are one group
// of each, which share its x loads. kHalves: K = 2's quad table with the halves decode
// (chunk_mma_halves), only for m <= kHalvesMaxM (the launcher's to ensure: larger m would
// be summed wrong).
template <class T, int K, kbit_absmax_format FMT, int kQuads, int kPerWarp, int kTiles = 1,
          bool kHalves = false>
__global__ void __launch_bounds__(kTiledStreamThreads, 1)
gemv_tiled_kernel(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ absmax,
                  float ts, const float *__restrict__ codebook,
                  const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                  int64_t n_out, const typename T::storage *__restrict__ bias,
                  typename T::storage *__restrict__ y, int ring_stages, int x_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    __trap();  // the bulk copy engine and mbarrier waits are sm_90's; never launched below
#else
    static_assert(!kQuads || K == 2, "the quad table is K = 2's");
    static_assert(kTiles == 1 || kPerWarp == 1, "a warp's units: one tile's or kTiles'");
    static_assert(!kHalves || halves_decode<K, FMT, kQuads, kPerWarp, kTiles>(),
                  "halves: where halves_decode says");
    using Dec = KbitStaged<T, K, FMT>;  // its pair entries
    using St = StreamStage<K, FMT, kPerWarp, kTiles>;
    constexpr int kSB = St::kSB, kUnits = kStreamWarps * kPerWarp;  // kUnits: groups a stage
    constexpr int kUnitChunks = tiled::kGroupChunks;
    extern __shared__ uint4 smem[];
    uint32_t *table = reinterpret_cast<uint32_t *>(smem);
    __shared__ alignas(8) uint64_t full[kStreamMaxStages], empty[kStreamMaxStages], sums_full,
        sums_empty;
    constexpr int copies = table_copies<Dec::kEntries>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    // Groups of a row and stages of a tile fit in 32 bits (k_in < 2^38 elements).
    const int chunks = static_cast<int>(k_in / kChunk);
    const int groups = (chunks + tiled::kGroupChunks - 1) / tiled::kGroupChunks;
    const int stages_per_tile = (groups + kUnits - 1) / kUnits;
    const StreamWalk walk = stream_walk<kTiles>(n_out, stages_per_tile, m, kMaxM);
    const int64_t stages = walk.stages;
    const int x_rows = walk.x_rows;
    // dynamic shared memory: the table, the tile sums' buffer, x (if resident), the ring
    const TileSums<kTiles> sums{smem_address(smem) + stream_table_bytes<T, K, FMT, kQuads>(),
                                smem_address(&sums_full), smem_address(&sums_empty)};
    const ResidentX rx{x_stride, x_rows, sums.at + kTiles * kTileSumsBytes};
    const int stage_bytes = St::bytes(rx.on() ? 0 : x_rows);
    const uint32_t ring_at = rx.ring_at();
    // (opaque: kept in registers, where the loop recomputed each from the CTA's cluster id)
    const uint32_t full_at = opaque(smem_address(full)), empty_at = opaque(smem_address(empty));
    const BookEntry book_at_start = book_entry<Dec>(codebook, K);  // before the copies below
    if (threadIdx.x == 0) {
        mbar_init(sums.full, kStreamWarps * 32);  // every consumer lane
        mbar_init(sums.empty, 32);                // the reducer's lanes
        ring_init(full_at, empty_at, ring_stages);  // (its fence covers them)
    }
    __syncthreads();

    // The producer (one lane): stage q is groups [g0, g0 + n) of the tiles of the CTA's
    // group q / stages_per_tile, g0 = kUnits (q % stages_per_tile), in slot q % ring_stages; it
    // waits for the slot's release from its last round before reusing it. The first
    // kFirstStages stages go out before the pair table is filled, the rest after (the whole
    // first round there kept the fill's barrier waiting for this lane: bench/RESULTS.md,
    // session 20).
    const bool producer = warp == kStreamWarps;
    const uint64_t w_policy = evict_first_policy(), x_policy = evict_last_policy();
    const auto *xb = reinterpret_cast<const uint8_t *>(x);
    RingSlot p;
    int p_g0 = 0;
    int64_t issued = 0, p_group = 0;  // p_group: the CTA's group of row tiles of stage `issued`
    auto produce = [&](int64_t until) {
        for (; issued < until; ++issued) {
            if (issued >= ring_stages) mbar_wait(empty_at + 8 * p.slot, p.phase ^ 1u);
            const int n = groups - p_g0 < kUnits ? groups - p_g0 : kUnits;
            const int x_elems = rx.x_piece(issued < stages_per_tile,
                                           min((p_g0 + n) * 128, chunks * kChunk) - p_g0 * 128);
            const uint32_t bar = full_at + 8 * p.slot, dst = ring_at + p.at;
            const int nt = walk.group_tiles<kTiles>(p_group);  // n units of each tile, one x for them
            mbar_expect(bar, nt * n * (St::kUnitW + St::kUnitS) + x_rows * x_elems * 2);
            for (int u = 0; u < nt; ++u) {
                const int64_t unit = walk.tile(p_group * kTiles + u) * groups + p_g0;
                bulk_copy(dst + u * kStreamWarps * St::kUnitW, packed + unit * St::kUnitW,
                          n * St::kUnitW, bar, w_policy);
                bulk_copy(dst + St::kScales + u * kStreamWarps * St::kUnitS,
                          absmax + unit * St::kUnitS, n * St::kUnitS, bar, w_policy);
            }
            rx.copy(bar, xb, k_in, p_g0 * 128, x_elems, dst + St::kX, St::kXRow, x_policy);
            p.next(ring_stages, stage_bytes);
            if ((p_g0 += kUnits) >= groups) p_g0 = 0, ++p_group;
        }
    };
    if (producer && lane == 0) produce(stages < kFirstStages ? stages : kFirstStages);

    float book;
    if constexpr (kQuads > 0) book = fill_quad_table<Dec, kQuads>(table, book_at_start);
    else if constexpr (K == 4) book = fill_byte_pair_table<Dec>(table, book_at_start);
    else book = fill_pair_table<Dec>(table, book_at_start);
    const ChunkScales<kSB> scale(ts * book);
    if (producer) {
        if (lane == 0) produce(stages);
        return;
    }
    if (warp == kStreamWarps + 1) {  // the reducer: each row tile's sums to y
        for (int64_t j = 0; j < stages / stages_per_tile; ++j)
            sums.template reduce<T>(j, walk.tile(j * kTiles) * kTileRows, walk.step * kTileRows,
                                    walk.group_tiles<kTiles>(j), m, n_out, bias, y);
        return;
    }

    // The consumers: warp w takes unit w of each stage.
    const auto my_table = [&] {
        if constexpr (kQuads > 0) return quad_table<kQuads>(table);
        else if constexpr (K == 4) return byte_pair_table(table);
        else return lane_table<copies>(table);
    }();
    const LaneSegment<K> seg(ring_at + warp * St::kUnitW, lane);
    const uint32_t sc_at =
        opaque(ring_at + St::kScales + warp * St::kUnitS + g * tiled::kGroupChunks * kSB);
    // x: the stage's copy (at + x_at), or the resident rows (x_at + the stage's k); lanes
    // past x's rows read its last row (their sums are never stored). kHalves: row g / 2,
    // from its pairs of parity g % 2
    const int xg = min(kHalves ? g >> 1 : g, x_rows - 1);
    const uint32_t x_at = opaque((rx.on() ? rx.row_at(xg) : ring_at + St::kX + xg * St::kXRow) +
                                 warp * St::kXUnit + t * 16 + (kHalves ? 4 * (g & 1) : 0));
    // The scales of a unit's chunks, a row: kUnitChunks of kSB bytes in one to four words.
    constexpr int kScaleBytes = kSB * kUnitChunks, kScaleWords = kScaleBytes > 4 ? kScaleBytes / 4 : 1;
    auto load_scales = [&](uint32_t at, uint32_t (&s)[kScaleWords]) {
        if constexpr (kScaleBytes == 2) {
            s[0] = lds_u16(at);
        } else if constexpr (kScaleBytes == 4) {
            s[0] = lds_u32(at);
        } else if constexpr (kScaleBytes == 8) {
            const uint2 v = lds_u32x2(at);
            s[0] = v.x, s[1] = v.y;
        } else {
            const uint4 v = lds_u32x4(at);
            s[0] = v.x, s[1] = v.y, s[2] = v.z, s[3] = v.w;
        }
    };

    // (kHalves) chunk v's x at xu: the lane's two 4-byte loads; a word's chunk decoded and
    // multiplied
    [[maybe_unused]] auto x_halves = [&](uint32_t xu, int v) {
        return make_uint2(lds_u32(xu + v * kChunk * 2), lds_u32(xu + v * kChunk * 2 + 8));
    };
    [[maybe_unused]] auto halves = [&](uint32_t word, uint2 xb, float fa, float fb,
                                        float (&out)[4]) {
        if constexpr (kHalves) {
            uint32_t ag[4], ag8[4];
            quad_rows(word, my_table, ag, ag8);
            chunk_mma_halves<T>(ag, ag8, xb, fa, fb, out);
        }
    };
    Sums<kTiles> acc;         // row tile u of the group: acc.v[u]
    int nt = walk.group_tiles<kTiles>(0);  // row tiles of the current group
    // Chunk v of the warp's units: N row tiles' segments w, scales sa / sb (rows g, g + 8),
    // x at xu (shared by the N units: one group of N row tiles).
    auto chunk = [&](auto tiles, int v, const uint32_t (&w)[kTiles][2 * K],
                     const uint32_t (&sa)[kTiles][kScaleWords],
                     const uint32_t (&sb)[kTiles][kScaleWords], uint32_t xu) {
        constexpr int N = decltype(tiles)::value;
        if constexpr (kHalves) {
            const uint2 xb = x_halves(xu, v);
#pragma unroll
            for (int u = 0; u < N; ++u)
                halves(w[u][v], xb, scale(sa[u], v), scale(sb[u], v), acc.v[u]);
        } else {
            const uint4 xv = lds_u32x4(xu + v * kChunk * 2);
#pragma unroll
            for (int u = 0; u < N; ++u) {
                uint32_t pa[4], pb[4];
                chunk_pairs<K>(w[u], v, my_table, pa, pb);
                chunk_mma<T>(pa, pb, xv, scale(sa[u], v), scale(sb[u], v), acc.v[u]);
            }
        }
    };
    // (kTiles > 1) The warp's units of the stage at `at`: group `unit` of the group's first
    // N row tiles (slots u kStreamWarps + warp); the chunks that hold elements of k_in.
    auto units = [&](auto tiles, uint32_t at, int unit, uint32_t xu) {
        constexpr int N = decltype(tiles)::value;
        // chunks of the unit that hold elements of k_in (<= 0: none, or no unit)
        const int left = chunks - unit * tiled::kGroupChunks;
        if (left <= 0 || unit >= groups) return;
        uint32_t w[kTiles][2 * K];  // the lane's segments
        uint32_t sa[kTiles][kScaleWords], sb[kTiles][kScaleWords];
#pragma unroll
        for (int u = 0; u < N; ++u) {
            seg.load(at + u * kStreamWarps * St::kUnitW, w[u]);
            const uint32_t us = sc_at + at + u * kStreamWarps * St::kUnitS;
            load_scales(us, sa[u]);
            load_scales(us + 8 * tiled::kGroupChunks * kSB, sb[u]);
        }
        if (left >= kUnitChunks) {  // every unit but a row's last: no per-chunk branch
#pragma unroll
            for (int v = 0; v < kUnitChunks; ++v) chunk(tiles, v, w, sa, sb, xu);
        } else {
#pragma unroll
            for (int v = 0; v < kUnitChunks; ++v)
                if (v < left) chunk(tiles, v, w, sa, sb, xu);
        }
    };
    using One = std::integral_constant<int, 1>;
    consume_stages<kUnits>(walk, groups, full_at, empty_at, ring_stages, stage_bytes,
                           [&](uint32_t at, int g0) {
        if constexpr (kTiles > 1) {
            static_assert(kTiles == 2, "a group's last tile alone: N = 1");
            const uint32_t xu = rx.on() ? x_at + g0 * St::kXUnit : x_at + at;
            if (nt == kTiles) units(std::integral_constant<int, kTiles>{}, at, g0 + warp, xu);
            else units(One{}, at, g0 + warp, xu);
        } else {  // (not through `units`: there ptxas gave the fp16-scale K = 4 kernel 8 more
                  // table loads a loop, NF4 tiled 3% slower on 4096x4096: RESULTS session 23)
#pragma unroll
            for (int u = 0; u < kPerWarp; ++u) {  // unit warp + u kStreamWarps of the stage
                const int unit = g0 + warp + u * kStreamWarps;
                const uint32_t ua = at + u * kStreamWarps * St::kUnitW,
                               us = at + u * kStreamWarps * St::kUnitS;
                // chunks of the warp's unit that hold elements of k_in (<= 0: none, or no unit)
                const int left = chunks - unit * tiled::kGroupChunks;
                if (left > 0 && unit < groups) {
                    uint32_t w[2 * K];  // the lane's segment
                    seg.load(ua, w);
                    uint32_t sa[kScaleWords], sb[kScaleWords];  // rows g, g + 8
                    load_scales(sc_at + us, sa);
                    load_scales(sc_at + us + 8 * tiled::kGroupChunks * kSB, sb);
                    const uint32_t xu = (rx.on() ? x_at + g0 * St::kXUnit : x_at + at) +
                                        u * kStreamWarps * St::kXUnit;
                    auto one = [&](int v) {  // chunk v of the unit
                        if constexpr (kHalves) {
                            halves(w[v], x_halves(xu, v), scale(sa, v), scale(sb, v), acc.v[0]);
                        } else {
                            uint32_t pa[4], pb[4];
                            chunk_pairs<K>(w, v, my_table, pa, pb);
                            const float fa = scale(sa, v), fb = scale(sb, v);
                            const uint4 xv = lds_u32x4(xu + v * kChunk * 2);
                            chunk_mma<T>(pa, pb, xv, fa, fb, acc.v[0]);
                        }
                    };
                    if (left >= kUnitChunks) {  // every unit but a row's last: no per-chunk branch
#pragma unroll
                        for (int v = 0; v < kUnitChunks; ++v) one(v);
                    } else {
#pragma unroll
                        for (int v = 0; v < kUnitChunks; ++v)
                            if (v < left) one(v);
                    }
                }
            }
        }
    }, [&](int64_t j) {  // the group's row tiles' sums, times out, to the reducer
#pragma unroll
        for (int u = 0; u < kTiles; ++u)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc.v[u][i] *= scale.out;
        sums.template put<kHalves>(j, warp, g, t, acc.v, nt);
        acc = Sums<kTiles>{};
        nt = walk.group_tiles<kTiles>(j + 1);
    });
#endif
}

#include "gguf_stream.cuh"

// Tiled kbit (formats/kbit_tiled.h), from registers (m = 9..16, where it measured faster
// than the streamed kernel above: bench/RESULTS.md; and GPUs before sm_90): a CTA of 8
// warps per row tile, lane (g, t) loads its own 8K-byte segment of each (tile, group)
// and the 4 scales of rows g and g+8 straight into registers, one group ahead of the one
// it computes; each pair index is a fixed-position bit field of the segment, so a pair
// costs a field extraction, an address and a table read.
template <int K, kbit_absmax_format FMT, int NT>
struct TiledGroup {
    static constexpr int kSB = FMT == KBIT_ABSMAX_E4M4 ? 1 : (FMT == KBIT_ABSMAX_FP16 ? 2 : 4);
    uint32_t w[2 * K];   // the lane's segment
    uint32_t s[2][kSB];  // rows g, g+8: 4 scales of kSB bytes each
    uint4 x[NT][4];      // x rows g + 8 n, elements 8t .. 8t+7 of the group's 4 chunks
};

// NT: n8 tiles of x rows a CTA takes (8 NT rows): the A fragments decoded once serve NT
// mma pairs.
template <class T, int K, kbit_absmax_format FMT, int NT>
__global__ void __launch_bounds__(kThreads)
gemv_tiled_regs_kernel(const uint8_t *__restrict__ packed, const uint8_t *__restrict__ absmax,
                  float ts, const float *__restrict__ codebook,
                  const typename T::storage *__restrict__ x, int64_t m, int64_t k_in,
                  int64_t n_out, const typename T::storage *__restrict__ bias,
                  typename T::storage *__restrict__ y) {
    using Dec = KbitStaged<T, K, FMT>;  // its pair table
    using Group = TiledGroup<K, FMT, NT>;
    constexpr int kSB = Group::kSB;
    extern __shared__ uint4 smem[];
    uint32_t *table = reinterpret_cast<uint32_t *>(smem);
    constexpr int copies = table_copies<Dec::kEntries>();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;

    const ChunkScales<kSB> scale(ts * fill_pair_table<Dec>(table, codebook, K));

    const int64_t chunks = k_in / kChunk, groups = (chunks + 3) / 4;
    const int64_t tile = blockIdx.x, r0 = tile * kTileRows;
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * (kMaxM * NT);
    bool has_x[NT];
    const uint4 *xrow[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        has_x[n] = m0 + g + 8 * n < m;
        xrow[n] = reinterpret_cast<const uint4 *>(x + (has_x[n] ? m0 + g + 8 * n : 0) * k_in) + t;
    }
    const auto my_table = lane_table<copies>(table);

    auto load = [&](Group &G, int64_t grp) {
        const int64_t seg = (tile * groups + grp) * 32 + lane;
        const uint8_t *wp = packed + seg * 8 * K;
        if constexpr (K == 2) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(wp));
            G.w[0] = v.x, G.w[1] = v.y, G.w[2] = v.z, G.w[3] = v.w;
        } else if constexpr (K == 4) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4 v = __ldg(reinterpret_cast<const uint4 *>(wp) + h);
                G.w[4 * h] = v.x, G.w[4 * h + 1] = v.y, G.w[4 * h + 2] = v.z, G.w[4 * h + 3] = v.w;
            }
        } else {
#pragma unroll
            for (int h = 0; h < K; ++h) {
                const uint2 v = __ldg(reinterpret_cast<const uint2 *>(wp) + h);
                G.w[2 * h] = v.x, G.w[2 * h + 1] = v.y;
            }
        }
        const uint8_t *sp = absmax + (tile * groups + grp) * (kTileRows * 4 * kSB);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint8_t *row = sp + (g + 8 * h) * 4 * kSB;
            if constexpr (kSB == 1) {
                G.s[h][0] = __ldg(reinterpret_cast<const uint32_t *>(row));
            } else if constexpr (kSB == 2) {
                const uint2 v = __ldg(reinterpret_cast<const uint2 *>(row));
                G.s[h][0] = v.x, G.s[h][1] = v.y;
            } else {
                const uint4 v = __ldg(reinterpret_cast<const uint4 *>(row));
                G.s[h][0] = v.x, G.s[h][1] = v.y, G.s[h][2] = v.z, G.s[h][3] = v.w;
            }
        }
        const int64_t c0 = grp * 4;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int u = 0; u < 4; ++u)
                G.x[n][u] = has_x[n] && c0 + u < chunks ? __ldg(xrow[n] + (c0 + u) * (kChunk / 8))
                                                        : make_uint4(0, 0, 0, 0);
    };

    float acc[NT][4] = {};
    auto compute = [&](const Group &G, int64_t grp) {
        const int n = static_cast<int>(chunks - grp * 4 < 4 ? chunks - grp * 4 : 4);
        auto one = [&](int u) {
            uint32_t pa[4], pb[4];
            chunk_pairs<K>(G.w, u, my_table, pa, pb);
            const float sa = scale(G.s[0], u), sb = scale(G.s[1], u);
#pragma unroll
            for (int n = 0; n < NT; ++n) chunk_mma<T>(pa, pb, G.x[n][u], sa, sb, acc[n]);
        };
        if (n == 4) {  // every group but a row's last: no per-chunk branch
#pragma unroll
            for (int u = 0; u < 4; ++u) one(u);
        } else {
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (u < n) one(u);
        }
    };
    // Two register buffers in turn: the next group's loads are in flight while this one
    // is computed.
    Group a, b;
    if (warp < groups) load(a, warp);
    for (int64_t grp = warp; grp < groups; grp += 2 * kWarps) {
        if (grp + kWarps < groups) load(b, grp + kWarps);
        compute(a, grp);
        if (grp + kWarps >= groups) break;
        if (grp + 2 * kWarps < groups) load(a, grp + 2 * kWarps);
        compute(b, grp + kWarps);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        if (n > 0) __syncthreads();  // store_tile's shared partials are reused
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[n][i] *= scale.out;
        store_tile<T>(acc[n], r0, m0 + 8 * n, m, n_out, bias, y);
    }
}

// Ring stages for a stage of `stage_bytes` beside a pair table of `table` bytes.
// (before: bytes ahead of the ring; budget: the kernel's dynamic shared memory)
inline int stream_stages(int before, int stage_bytes, int budget = kStreamSmem) {
    const int s = (budget - before) / stage_bytes;
    return s < kStreamMaxStages ? s : kStreamMaxStages;
}

// A streamed GEMV's launch: a CTA an SM (no more than the row tiles); x's `rows` held for
// the whole kernel where resident_x_stride allows (and may_reside), else `slot_rows` of
// them copied with each stage; as many ring stages of stage_bytes(x rows a slot) as fit
// after the `table` bytes and resident x, at most `resident_most` where x is resident
// (resident_ring_stages). x_read: the bytes a lane reads of x at a time (x_row_stride);
// resident_extra: bytes a resident x takes beside its rows (the GGUF stream's means).
// Run it where ring >= 2.
struct StreamLaunch {
    int ctas = 0, x_stride = 0, before = 0, stage = 0, ring = 0;
    int smem() const { return before + ring * stage; }
};
template <class StageBytes>
cudaError_t stream_launch(int64_t n_out, int64_t k_in, int rows, int slot_rows, bool may_reside,
                          int x_read, int table, StageBytes &&stage_bytes, int resident_most,
                          StreamLaunch &l, int resident_limit = kResidentX,
                          int budget = kStreamSmem, int resident_extra = 0) {
    const cudaError_t err = grid_for(blocks_of(n_out, kTileRows), 1, &l.ctas);
    if (err != cudaSuccess) return err;
    auto plan = [&](int limit) {
        l.x_stride = may_reside ? resident_x_stride(rows, k_in, n_out, l.ctas, x_read, limit) : 0;
        l.before = table + (l.x_stride ? resident_x_bytes(rows, l.x_stride) + resident_extra : 0);
        l.stage = stage_bytes(l.x_stride ? 0 : slot_rows);
        l.ring = stream_stages(l.before, l.stage, budget);
    };
    plan(resident_limit);
    if (resident_limit > kResidentX && l.x_stride && l.ring < kResidentMinRing) plan(kResidentX);
    if (l.x_stride && l.ring > resident_most) l.ring = resident_most;
    return cudaSuccess;
}

// One thread per (segment, lane): the lane's segment from the stored words (tile) or back
// (untile); the scales one thread each. Padding: the tile kernel writes zero segments
// for it, the launcher clears the tiled scales first.
__global__ void tile_kernel(const uint32_t *__restrict__ packed, int k, tiled::Geometry geo,
                            int64_t n_out, uint8_t *__restrict__ out) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= geo.tiles * geo.groups * tiled::kLanes) return;
    uint8_t seg[40] = {};
    const int64_t s = i / tiled::kLanes;
    tiled::tile_segment(packed, k, geo, n_out, s / geo.groups, s % geo.groups,
                        static_cast<int>(i % tiled::kLanes), seg);
    for (int b = 0; b < 8 * k; ++b) out[i * 8 * k + b] = seg[b];
}
__global__ void untile_kernel(const uint8_t *__restrict__ in, int k, tiled::Geometry geo,
                              int64_t n_out, uint32_t *__restrict__ packed) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= geo.tiles * geo.groups * tiled::kLanes) return;
    const int64_t s = i / tiled::kLanes;
    tiled::untile_segment(in + i * 8 * k, k, geo, n_out, s / geo.groups, s % geo.groups,
                          static_cast<int>(i % tiled::kLanes), packed);
}
// Scales between the layouts: to_tiled copies stored -> tiled, else back.
__global__ void tile_scales_kernel(const uint8_t *__restrict__ from, uint8_t *__restrict__ to,
                                   tiled::Geometry geo, int64_t n_out, int sb, bool to_tiled) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_out * geo.chunks) return;
    const int64_t at = tiled::scale_at(geo, i / geo.chunks, i % geo.chunks, sb);
    for (int b = 0; b < sb; ++b) {
        if (to_tiled) to[at + b] = from[i * sb + b];
        else to[i * sb + b] = from[at + b];
    }
}


dim3 tile_grid(int64_t m, int64_t n_out) {
    return dim3(static_cast<unsigned>(blocks_of(n_out, kTileRows)),
                static_cast<unsigned>(blocks_of(m, kMaxM)));
}

template <class T, class Dec, int kWUnit, int NT>
cudaError_t launch_staged_nt(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                             int64_t k_in, int64_t n_out, const void *bias, void *y,
                             cudaStream_t stream) {
    using S = typename T::storage;
    const int smem = staged_smem<Dec>(static_cast<int>(m < kMaxM * NT ? m : kMaxM * NT));
    const cudaError_t err = allow_smem<gemv_staged_kernel<T, Dec, kWUnit, NT>>(smem);
    if (err != cudaSuccess) return err;
    cudaGetLastError();
    const dim3 grid(static_cast<unsigned>(blocks_of(n_out, kTileRows)),
                    static_cast<unsigned>(blocks_of(m, kMaxM * NT)));
    gemv_staged_kernel<T, Dec, kWUnit, NT><<<grid, kThreads, smem, stream>>>(
        dec, codebook, k, static_cast<const S *>(x), m, k_in, n_out, static_cast<const S *>(bias),
        static_cast<S *>(y));
    return launch_error();
}

// The rows of x a staged CTA takes where the device's shared memory holds its slots: 16
// (two n8 tiles on one decode) from m = 9, else up to 8; fewer where the slots for them do
// not fit (sm_80's 163 KB: K = 4 and NF4 / FP4 at m = 16, K = 5 from m = 10; sm_86 / 89's
// 99 KB: K = 2 from m = 12, K = 3 from 10, K = 4 from 6, K = 5 at every m); 0 where not
// even one row fits (launch_staged leaves the call to the generic kernel). kStagedStatic:
// at least the kernel's static shared memory (store_tile's partial sums, 4 KB).
constexpr int kStagedStatic = 8 * 1024;
template <class Dec>
cudaError_t staged_rows(int64_t m, int *rows) {
    int limit = 0;
    const cudaError_t err = smem_optin(&limit);
    if (err != cudaSuccess) return err;
    auto fits = [&](int r) { return staged_smem<Dec>(r) + kStagedStatic <= limit; };
    if (m > kMaxM && fits(2 * kMaxM)) {
        *rows = 2 * kMaxM;
        return cudaSuccess;
    }
    int r = static_cast<int>(m < kMaxM ? m : kMaxM);
    while (r > 0 && !fits(r)) --r;
    *rows = r;
    return cudaSuccess;
}

// `rows` (staged_rows) of x a CTA: 16 with two n8 tiles, up to 8 with one, the grid's
// blocks of them over m; below 8 where m has more, passes of `rows` rows, each a launch of
// its own reading W again.
template <class T, class Dec, int kWUnit>
cudaError_t launch_staged_rows(const Dec &dec, const float *codebook, int k, const void *x,
                               int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                               int rows, cudaStream_t stream) {
    if (rows > kMaxM)
        return launch_staged_nt<T, Dec, kWUnit, 2>(dec, codebook, k, x, m, k_in, n_out, bias, y,
                                                   stream);
    if (rows >= kMaxM || rows >= m)
        return launch_staged_nt<T, Dec, kWUnit, 1>(dec, codebook, k, x, m, k_in, n_out, bias, y,
                                                   stream);
    using S = typename T::storage;
    for (int64_t i = 0; i < m; i += rows) {
        const cudaError_t err = launch_staged_nt<T, Dec, kWUnit, 1>(
            dec, codebook, k, static_cast<const S *>(x) + i * k_in, m - i < rows ? m - i : rows,
            k_in, n_out, bias, static_cast<S *>(y) + i * n_out, stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

// The staged kernel with the widest W copies the layout allows (16 bytes when every row
// of chunks starts on 16 bytes) and the rows of x the device's shared memory allows
// (staged_rows): runs the call (err: its launch status) and returns true, or returns false
// where not even one row fits, for the generic kernel (as run_sm90 does).
template <class T, class Dec>
bool launch_staged(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                   int64_t k_in, int64_t n_out, const void *bias, void *y, cudaStream_t stream,
                   cudaError_t &err) {
    int rows = 0;
    if ((err = staged_rows<Dec>(m, &rows)) != cudaSuccess) return true;
    if (rows == 0) return false;
    const bool vec = aligned(dec.packed, 16) &&
                     (k_in / kChunk) * Dec::kChunkBytes % 16 == 0;
    err = vec ? launch_staged_rows<T, Dec, 16>(dec, codebook, k, x, m, k_in, n_out, bias, y, rows,
                                               stream)
              : launch_staged_rows<T, Dec, 4>(dec, codebook, k, x, m, k_in, n_out, bias, y, rows,
                                              stream);
    return true;
}

template <class T, class Dec>
cudaError_t launch_direct(const Dec &dec, const void *x, int64_t m, int64_t k_in, int64_t n_out,
                          const void *bias, void *y, cudaStream_t stream) {
    using S = typename T::storage;
    cudaGetLastError();
    gemv_direct_kernel<T><<<tile_grid(m, n_out), kThreads, 0, stream>>>(
        dec, static_cast<const S *>(x), m, k_in, n_out, static_cast<const S *>(bias),
        static_cast<S *>(y));
    return launch_error();
}

#include "gemm.cuh"

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
            if (lane == 0) store_y<T>(y, bias, m0 + i, r, n_out, v);
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

// The tensor-core paths take fp16/bf16 x on 16-byte boundaries and some k (k_in = 0, an
// empty weight: the generic path writes y = bias); the staged one also copies W and its
// scales in whole 4-byte words.
bool mma_ok(kbit_dtype dtype, const void *x, int64_t k_in) {
    return dtype != KBIT_DTYPE_FP32 && aligned(x, 16) && k_in > 0;
}
bool staged_ok(kbit_dtype dtype, const void *x, int64_t k_in, const void *packed,
               const void *absmax) {
    return mma_ok(dtype, x, k_in) && aligned(packed, 4) && aligned(absmax, 4);
}

// The sm_90a kernels (gemm_sm90.cu) run on compute capability 9.0 where the build
// carries them: the streamed GEMM from m = stream90_min_m for weights it reads
// (sm90::streams; to kStream90MaxM), else the wgmma GEMM from m = kGemm90MinM. Both round
// block scale times codebook value to the type of x, so fp16 x with kbit's fp32 block
// scales (which may lie beyond fp16's range) stays on the mma.sync paths, whose scales
// stay float32; fp32_scales: the weight is kbit with fp32 block scales (NF4 / FP4's fp32
// scales are bitsandbytes', rounded to fp16 as it does). Runs the call there (err: its
// launch status) and returns true, or returns false for the other paths.
bool is_tiled(const sm90::KbitWeight &w) { return w.tiled; }
bool is_tiled(const sm90::Bnb4Weight &) { return false; }
int bits_of(const sm90::KbitWeight &w) { return w.k; }
int bits_of(const sm90::Bnb4Weight &) { return 4; }
template <class W>
bool run_sm90(const W &w, bool fp32_scales, kbit_dtype dtype, const void *x, int64_t m,
              int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
              size_t workspace_bytes, cudaStream_t stream, cudaError_t &err) {
    const int64_t min_m =
        sm90::streams(w, k_in, n_out) ? stream90_min_m(n_out, k_in, is_tiled(w), bits_of(w))
                                      : kGemm90MinM;
    if (m < min_m || !sm90::built()) return false;
    if (dtype == KBIT_DTYPE_FP16 && fp32_scales) return false;
    int major = 0;
    if (compute_major(&major) != cudaSuccess || major != 9) return false;
    err = sm90::matmul(w, dtype, x, m, k_in, n_out, bias, y, workspace, workspace_bytes, stream);
    return true;
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
    bool generic = !staged_ok(dtype, x, k_in, packed, absmax);  // or no staged CTA fits
    if (!generic) {
        const int64_t blocks = n_out * (k_in / kBlock);
        with_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, F32>) {
                with_k(k, [&](auto kc) {
                    using Dec = KbitAnyScale<T, kc.value>;
                    const int sb = static_cast<int>(absmax_align(fmt));
                    const sm90::KbitWeight w90{false, packed, absmax, blocks * Dec::kChunkBytes,
                                               blocks * sb, fmt, ts, codebook, k};
                    if (run_sm90(w90, fmt == KBIT_ABSMAX_FP32, dtype, x, m, k_in, n_out, bias, y,
                                 workspace, workspace_bytes, stream, err))
                        return KBIT_SUCCESS;
                    if (m > 2 * kMaxM) {  // the GEMM; to m = 16 the GEMV (two n8 tiles)
                        const Dec dec{{reinterpret_cast<const uint8_t *>(packed),
                                       static_cast<const uint8_t *>(absmax),
                                       blocks * Dec::kChunkBytes, blocks * sb, ts},
                                      fmt, sb};
                        err = gemm::launch_stored<T>(dec, codebook, k, x, m, k_in, n_out, bias,
                                                     y, workspace, workspace_bytes, stream);
                        return KBIT_SUCCESS;
                    }
                    with_format(fmt, [&](auto f) {
                        using Dec = KbitStaged<T, kc.value, decltype(f)::value>;
                        const Dec dec{reinterpret_cast<const uint8_t *>(packed),
                                      static_cast<const uint8_t *>(absmax),
                                      blocks * Dec::kChunkBytes, blocks * Dec::kScaleBytes, ts};
                        generic = !launch_staged<T>(dec, codebook, k, x, m, k_in, n_out, bias, y,
                                                    stream, err);
                    });
                    return KBIT_SUCCESS;
                });
            }
            return KBIT_SUCCESS;
        });
    }
    if (generic && err == cudaSuccess) {
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

kbit_status kbit_tiled_entry(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                             kbit_dtype dtype, const void *tiled_packed, const void *tiled_absmax,
                             kbit_absmax_format fmt, float ts, const float *codebook, int k,
                             const void *bias, void *y, void *workspace, size_t workspace_bytes,
                             kbit_stream_t stream) {
    KBIT_TRY(check_matmul_kbit_tiled(x, m, k_in, n_out, dtype, tiled_packed, tiled_absmax, fmt, ts,
                                     codebook, k, bias, y));
    KBIT_TRY(check_workspace(workspace, workspace_bytes));
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    if (k_in == 0)  // an empty weight: y = bias (the generic kernel decodes nothing of W)
        return cuda_status(launch_generic(KbitValues{static_cast<const uint32_t *>(tiled_packed),
                                                     tiled_absmax, fmt, ts, codebook, k},
                                          dtype, x, m, k_in, n_out, bias, y, stream),
                           "kbit_matmul_kbit_tiled launch");
    if (!mma_ok(dtype, x, k_in))
        return fail(KBIT_ERROR_NOT_SUPPORTED,
                    "the tiled matmul takes fp16 or bf16 x on 16-byte boundaries; use "
                    "kbit_matmul_kbit on the stored weight for fp32 or unaligned x");
    cudaError_t err = cudaSuccess;
    with_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, F32>) {
            with_k(k, [&](auto kc) {
                const sm90::KbitWeight w90{true, tiled_packed, tiled_absmax,
                                           tiled::packed_bytes(n_out, k_in, k),
                                           tiled::absmax_bytes(n_out, k_in, fmt), fmt, ts,
                                           codebook, k};
                if (run_sm90(w90, fmt == KBIT_ABSMAX_FP32, dtype, x, m, k_in, n_out, bias, y,
                             workspace, workspace_bytes, stream, err))
                    return KBIT_SUCCESS;
                if (m > 2 * kMaxM) {  // the GEMM; to m = 16 the GEMV (two n8 tiles)
                    using Dec = TiledScale<T, kc.value>;
                    const int sb = static_cast<int>(absmax_align(fmt));
                    const Dec dec{{{static_cast<const uint8_t *>(tiled_packed),
                                    static_cast<const uint8_t *>(tiled_absmax),
                                    tiled::packed_bytes(n_out, k_in, k),
                                    tiled::absmax_bytes(n_out, k_in, fmt), ts},
                                   fmt, sb},
                                  tiled::geometry(n_out, k_in)};
                    err = gemm::launch_tiled<T>(dec, codebook, k, x, m, k_in, n_out, bias, y,
                                                workspace, workspace_bytes, stream);
                    return KBIT_SUCCESS;
                }
                with_format(fmt, [&](auto f) {
                    constexpr int K = kc.value;
                    constexpr kbit_absmax_format F = decltype(f)::value;
                    using S = typename T::storage;
                    int major = 0;
                    err = compute_major(&major);
                    if (err != cudaSuccess) return;
                    // streamed: a persistent CTA an SM, with a ring of two stages or more
                    StreamLaunch l;
                    int quads = 0;  // the quad table's copies (K = 2)
                    bool across = false;  // two row tiles a stage
                    const int64_t groups = blocks_of(k_in / kChunk, tiled::kGroupChunks);
                    const bool pairs = K <= 3 && groups >= kPairMinGroups;
                    if (m <= kMaxM && major >= 9) {
                        const int rows = static_cast<int>(m);
                        // (tiles: two row tiles a stage, else the units a warp of `pairs`)
                        auto plan = [&](int table, bool tiles = false) {
                            return stream_launch(n_out, k_in, rows, rows, true, 16,
                                                 table + (tiles ? 2 : 1) * kTileSumsBytes,
                                                 tiles   ? StreamStage<K, F, 1, 2>::bytes
                                                 : pairs ? StreamStage<K, F, 2>::bytes
                                                         : StreamStage<K, F, 1>::bytes,
                                                 resident_ring_stages(K >= 4),
                                                 l, kResidentXTiled, kTiledStreamSmem);
                        };
                        err = plan(stream_table_bytes<T, K, F, 0>());
                        if (err != cudaSuccess) return;
                        // K = 2: the quad table where a CTA reads enough stages (counted
                        // in stages of kStreamWarps units, whichever its kernel takes)
                        const int64_t per_tile = blocks_of(groups, kStreamWarps);
                        // in 32 copies where they leave x its residence and a ring of
                        // kQuadMinRing, else 16 (a ring of two)
                        const StreamLaunch pair_table = l;
                        if (K == 2 && blocks_of(blocks_of(n_out, kTileRows), l.ctas) * per_tile >=
                                          kQuadMinStages) {
                            for (const int copies : {32, 16}) {
                                err = plan(quad_table_bytes(copies));
                                if (err != cudaSuccess) return;
                                if (l.ring >= (copies == 32 ? kQuadMinRing : 2) &&
                                    (l.x_stride || !pair_table.x_stride)) {
                                    quads = copies;
                                    break;
                                }
                            }
                            if (quads == 0) l = pair_table;
                        }
                        // K = 2 (and K = 3 where x comes with the stages and outweighs
                        // W): two row tiles a stage where a CTA reads kAcrossMinStages of
                        // them or more and where that keeps x's residence and leaves a
                        // ring of kAcrossMinRing
                        // (the two-tile kernels are built for K <= 3: per_warp below)
                        const int64_t cta_tiles = blocks_of(blocks_of(n_out, kTileRows), l.ctas);
                        const bool x_heavy = !l.x_stride && x_outweighs_w(m, sizeof(S), K);
                        if (K <= 3 && (K == 2 || x_heavy) && cta_tiles >= 2 &&
                            blocks_of(cta_tiles, 2) * per_tile >= kAcrossMinStages) {
                            const StreamLaunch one = l;
                            err = plan(quads ? quad_table_bytes(quads)
                                             : stream_table_bytes<T, K, F, 0>(),
                                       true);
                            if (err != cudaSuccess) return;
                            if ((l.x_stride || !one.x_stride) && l.ring >= kAcrossMinRing)
                                across = true;
                            else
                                l = one;
                        }
                    }
                    auto streamed = [&](auto q, auto per_warp, auto tiles, auto h) {
                        constexpr auto kernel =
                            gemv_tiled_kernel<T, K, F, decltype(q)::value,
                                              decltype(per_warp)::value, decltype(tiles)::value,
                                              decltype(h)::value>;
                        err = allow_smem<kernel>(kTiledStreamSmem);
                        if (err != cudaSuccess) return;
                        kernel<<<l.ctas, kTiledStreamThreads, l.smem(), stream>>>(
                            static_cast<const uint8_t *>(tiled_packed),
                            static_cast<const uint8_t *>(tiled_absmax), ts, codebook,
                            static_cast<const S *>(x), m, k_in, n_out,
                            static_cast<const S *>(bias), static_cast<S *>(y), l.ring,
                            l.x_stride);
                    };
                    // two units a warp only at K <= 3 (`pairs` is false above)
                    auto per_warp = [&](auto q) {
                        using One = std::integral_constant<int, 1>;
                        using Two = std::integral_constant<int, 2>;
                        constexpr int kQ = decltype(q)::value;
                        auto go = [&](auto pw, auto tl) {  // the halves decode where it won
                            if constexpr (halves_decode<K, F, kQ, decltype(pw)::value,
                                                        decltype(tl)::value>()) {
                                if (m <= kHalvesMaxM)
                                    return streamed(q, pw, tl, std::true_type{});
                            }
                            streamed(q, pw, tl, std::false_type{});
                        };
                        if constexpr (K <= 3) {
                            if (across) return go(One{}, Two{});
                            if (pairs) return go(Two{}, One{});
                        }
                        go(One{}, One{});
                    };
                    if (l.ring >= 2) {
                        if constexpr (K == 2) {
                            if (quads == 32) per_warp(std::integral_constant<int, 32>{});
                            else if (quads == 16) per_warp(std::integral_constant<int, 16>{});
                            else per_warp(std::integral_constant<int, 0>{});
                        } else {
                            per_warp(std::integral_constant<int, 0>{});
                        }
                    } else {  // m = 9..16 (two n8 tiles on one decode), or before sm_90
                        auto regs = [&](auto nt) {
                            constexpr int NT = decltype(nt)::value;
                            constexpr auto kernel = gemv_tiled_regs_kernel<T, K, F, NT>;
                            const int smem = table_bytes<KbitStaged<T, K, F>>();
                            err = allow_smem<kernel>(smem);
                            if (err != cudaSuccess) return;
                            cudaGetLastError();
                            const dim3 grid(static_cast<unsigned>(blocks_of(n_out, kTileRows)),
                                            static_cast<unsigned>(blocks_of(m, kMaxM * NT)));
                            kernel<<<grid, kThreads, smem, stream>>>(
                                static_cast<const uint8_t *>(tiled_packed),
                                static_cast<const uint8_t *>(tiled_absmax), ts, codebook,
                                static_cast<const S *>(x), m, k_in, n_out,
                                static_cast<const S *>(bias), static_cast<S *>(y));
                        };
                        if (m > kMaxM) regs(std::integral_constant<int, 2>{});
                        else regs(std::integral_constant<int, 1>{});
                    }
                    err = launch_error();
                });
                return KBIT_SUCCESS;
            });
        }
        return KBIT_SUCCESS;
    });
    return cuda_status(err, "kbit_matmul_kbit_tiled launch");
}

// Both directions of the repack: one thread per lane segment, one per scale. Tiling
// clears the tiled scales first (padding is zero); the segment kernel writes every byte.
kbit_status retile(bool to_tiled, const uint32_t *packed, const void *absmax,
                   kbit_absmax_format fmt, int k, int64_t n_out, int64_t k_in,
                   const void *tiled_packed, const void *tiled_absmax, cudaStream_t stream) {
    KBIT_TRY(tiled::check_tile(packed, absmax, fmt, k, n_out, k_in, tiled_packed, tiled_absmax));
    if (n_out == 0 || k_in == 0) return KBIT_SUCCESS;
    const tiled::Geometry geo = tiled::geometry(n_out, k_in);
    auto *tp = static_cast<uint8_t *>(const_cast<void *>(tiled_packed));
    auto *ta = static_cast<uint8_t *>(const_cast<void *>(tiled_absmax));
    auto *sa = static_cast<uint8_t *>(const_cast<void *>(absmax));
    cudaGetLastError();
    cudaError_t err = to_tiled ? cudaMemsetAsync(ta, 0, tiled::absmax_bytes(n_out, k_in, fmt), stream)
                               : cudaSuccess;
    if (err == cudaSuccess) {
        const auto segments = static_cast<unsigned>(
            blocks_of(geo.tiles * geo.groups * tiled::kLanes, kThreads));
        if (to_tiled) tile_kernel<<<segments, kThreads, 0, stream>>>(packed, k, geo, n_out, tp);
        else untile_kernel<<<segments, kThreads, 0, stream>>>(tp, k, geo, n_out,
                                                               const_cast<uint32_t *>(packed));
        tile_scales_kernel<<<static_cast<unsigned>(blocks_of(n_out * geo.chunks, kThreads)),
                             kThreads, 0, stream>>>(to_tiled ? sa : ta, to_tiled ? ta : sa, geo,
                                                    n_out, static_cast<int>(absmax_align(fmt)),
                                                    to_tiled);
        err = launch_error();
    }
    return cuda_status(err, to_tiled ? "kbit_tile launch" : "kbit_untile launch");
}

kbit_status tile_entry(const uint32_t *packed, const void *absmax, kbit_absmax_format fmt, int k,
                       int64_t n_out, int64_t k_in, void *tiled_packed, void *tiled_absmax,
                       kbit_stream_t stream) {
    return retile(true, packed, absmax, fmt, k, n_out, k_in, tiled_packed, tiled_absmax, stream);
}

kbit_status untile_entry(const void *tiled_packed, const void *tiled_absmax, kbit_absmax_format fmt,
                         int k, int64_t n_out, int64_t k_in, uint32_t *packed, void *absmax,
                         kbit_stream_t stream) {
    return retile(false, packed, absmax, fmt, k, n_out, k_in, tiled_packed, tiled_absmax, stream);
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
    bool generic = !staged_ok(dtype, x, k_in, packed, absmax);  // or no staged CTA fits
    if (!generic) {
        const int64_t n = n_out * k_in;
        with_dtype(dtype, [&](auto tag) {
            using T = decltype(tag);
            if constexpr (!std::is_same_v<T, F32>) {
                const Bnb4Staged<T, Fmt> dec{packed, reinterpret_cast<const uint8_t *>(absmax),
                                             n / 2, (n >> log2_bs) * 4, log2_bs - 5};
                const sm90::Bnb4Weight w90{std::is_same_v<Fmt, bnb4::Fp4>, packed, absmax, n / 2,
                                           (n >> log2_bs) * 4, log2_bs};
                if (run_sm90(w90, false, dtype, x, m, k_in, n_out, bias, y, workspace,
                             workspace_bytes, stream, err))
                    return KBIT_SUCCESS;
                if (m > 2 * kMaxM) {
                    err = gemm::launch_stored<T>(dec, nullptr, 4, x, m, k_in, n_out, bias, y,
                                                 workspace, workspace_bytes, stream);
                    return KBIT_SUCCESS;
                }
                generic = !launch_staged<T>(dec, nullptr, 4, x, m, k_in, n_out, bias, y, stream, err);
            }
            return KBIT_SUCCESS;
        });
    }
    if (generic && err == cudaSuccess)
        err = launch_generic(Bnb4Values<Fmt>{packed, absmax, log2_bs}, dtype, x, m, k_in, n_out,
                             bias, y, stream);
    return cuda_status(err, "NF4/FP4 matmul launch");
}

// GGUF at m <= 8 NT on sm_90: the streamed kernel (gguf_stream.cuh) where it reads the
// weight and a ring of two stages fits, its stages of kR row tiles (stage_tiles); runs it
// (err: its launch status) and returns true, or returns false for the direct kernels.
template <class T, class Fmt, int NT, int kR, bool kMeans = false>
bool launch_gguf_stream_r(const uint8_t *blocks, const void *x, int64_t m, int64_t k_in,
                          int64_t n_out, const void *bias, void *y, const StreamLaunch &l,
                          cudaStream_t stream, cudaError_t &err) {
    using S = typename T::storage;
    if (l.ring < 2) return false;
    CUtensorMap map;
    if (gguf_stream::weight_map<Fmt, kR>(&map, blocks, k_in, n_out) != cudaSuccess) return false;
    constexpr auto kernel = gemv_gguf_kernel<T, Fmt, NT, kR, kMeans>;
    err = allow_smem<kernel>(kStreamSmem);
    if (err != cudaSuccess) return true;
    kernel<<<l.ctas, kStreamThreads, l.smem(), stream>>>(
        map, static_cast<const S *>(x), m, k_in, n_out, static_cast<const S *>(bias),
        static_cast<S *>(y), l.ring, l.x_stride);
    err = launch_error();
    return true;
}
template <class T, class Fmt, int NT>
bool launch_gguf_stream(const uint8_t *blocks, const void *x, int64_t m, int64_t k_in,
                        int64_t n_out, const void *bias, void *y, cudaStream_t stream,
                        cudaError_t &err) {
    if (!gguf_stream::streams<Fmt>(blocks, k_in, n_out)) return false;
    int major = 0;
    if (compute_major(&major) != cudaSuccess || major < 9) return false;
    const int rows = static_cast<int>(m < kMaxM * NT ? m : kMaxM * NT);
    const int slot_rows = gguf_stream::slot_x_rows<NT>(rows);
    int sms = 0, ctas = 0;  // a CTA an SM (as stream_launch)
    err = sm_count(&sms);
    if (err == cudaSuccess) err = grid_for(blocks_of(n_out, kTileRows), 1, &ctas);
    if (err != cudaSuccess) return true;
    // x held for the whole kernel with one n8 tile only, Q4_K's means beside it
    // where a CTA will have enough row tiles (mins_by_means)
    const bool means = gguf_stream::mins_by_means<Fmt, NT>(n_out, ctas);
    StreamLaunch l;
    err = stream_launch(n_out, k_in, rows, slot_rows, NT == 1, 8, 0,
                        gguf_stream::Stage<Fmt, 1>::bytes,
                        resident_ring_stages(gguf_stream::decode_ahead<Fmt>()), l, kResidentX,
                        kStreamSmem, means ? gguf_stream::means_bytes(rows, k_in) : 0);
    if (err != cudaSuccess) return true;
    const int64_t x_bytes = l.x_stride ? 0 : int64_t{slot_rows} * k_in * 2;
    const int r = gguf_stream::stage_tiles<Fmt>(n_out, k_in, x_bytes, sms, l.ring >= 2);
    if constexpr (gguf_stream::groups_ok<Fmt, 4>()) {
        if (r == 4) {
            const int64_t groups = blocks_of(blocks_of(n_out, kTileRows), 4);
            l.ctas = static_cast<int>(groups < sms ? groups : sms);
            l.stage = gguf_stream::Stage<Fmt, 4>::bytes(slot_rows);
            l.ring = stream_stages(l.before, l.stage);
            return launch_gguf_stream_r<T, Fmt, NT, 4>(blocks, x, m, k_in, n_out, bias, y, l,
                                                       stream, err);
        }
    }
    if constexpr (gguf_stream::Stream<Fmt>::kMinsByMeans && NT == 1) {
        if (means && l.x_stride)
            return launch_gguf_stream_r<T, Fmt, NT, 1, true>(blocks, x, m, k_in, n_out, bias, y, l,
                                                             stream, err);
    }
    return launch_gguf_stream_r<T, Fmt, NT, 1>(blocks, x, m, k_in, n_out, bias, y, l, stream, err);
}

// GGUF from m = gguf90_min_m on sm_90: the GGUF GEMM (gemm_sm90.cu) where it reads the
// weight; runs the call (err: its launch status) and returns true, or returns false.
bool run_gguf_sm90(int ggml_type, kbit_dtype dtype, const uint8_t *blocks, const void *x,
                   int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                   void *workspace, size_t workspace_bytes, cudaStream_t stream, cudaError_t &err) {
    if (m < gguf90_min_m(n_out, k_in) || !sm90::built() ||
        !sm90::gguf_reads(ggml_type, blocks, k_in, n_out))
        return false;
    int major = 0;
    if (compute_major(&major) != cudaSuccess || major != 9) return false;
    err = sm90::matmul_gguf(ggml_type, dtype, blocks, x, m, k_in, n_out, bias, y, workspace,
                            workspace_bytes, stream);
    return true;
}

kbit_status gguf_entry(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                       int ggml_type, const void *blocks, const void *bias, void *y,
                       void *workspace, size_t workspace_bytes, kbit_stream_t stream) {
    return check_matmul_gguf(x, m, k_in, n_out, dtype, ggml_type, blocks, bias, y, [&](auto fmt) {
        using Fmt = decltype(fmt);
        KBIT_TRY(check_workspace(workspace, workspace_bytes));
        if (m == 0 || n_out == 0) return KBIT_SUCCESS;
        const auto *b = static_cast<const uint8_t *>(blocks);
        cudaError_t err = cudaSuccess;
        if (!mma_ok(dtype, x, k_in)) {
            err = launch_generic(GgufValues<Fmt>{b}, dtype, x, m, k_in, n_out, bias, y, stream);
        } else if (!run_gguf_sm90(Fmt::kTypeId, dtype, b, x, m, k_in, n_out, bias, y, workspace,
                                  workspace_bytes, stream, err)) {
            with_dtype(dtype, [&](auto tag) {
                using T = decltype(tag);
                if constexpr (!std::is_same_v<T, F32>) {
                    // the streamed GEMV to 16 rows of x (one or two n8 tiles on one decode),
                    // below the GGUF GEMM's rows (run_gguf_sm90); else, or where the stream
                    // cannot read W, the direct kernels: the GEMV to 8 rows, the GEMM from 9
                    const bool streamed =
                        m <= kMaxM ? launch_gguf_stream<T, Fmt, 1>(b, x, m, k_in, n_out, bias, y,
                                                                    stream, err)
                        : m <= 2 * kMaxM
                            ? launch_gguf_stream<T, Fmt, 2>(b, x, m, k_in, n_out, bias, y, stream, err)
                            : false;
                    const FloatDirect<T, Fmt> dec{b};
                    if (streamed)
                        return KBIT_SUCCESS;
                    if (m >= kGemmMinM)
                        err = gemm::launch_direct<T>(dec, x, m, k_in, n_out, bias, y, workspace,
                                                     workspace_bytes, stream);
                    else
                        err = launch_direct<T>(dec, x, m, k_in, n_out, bias, y, stream);
                }
                return KBIT_SUCCESS;
            });
        }
        return cuda_status(err, "GGUF matmul launch");
    });
}

}  // namespace
}  // namespace matmul
}  // namespace kbit

KBIT_MATMUL_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
