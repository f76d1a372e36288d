// Argument checks of the fused dequantize + matmul (SPEC section 6), shared by the GPU
// entries (csrc/matmul/) and the CPU twins (csrc/host/matmul.cpp), so that both accept
// and reject exactly the same calls. Each returns KBIT_SUCCESS or records the failure;
// nothing is written before they pass.
#pragma once

#include "../core/dispatch.h"
#include "bnb4.h"
#include "gguf.h"
#include "kbit.h"
#include "kbit_tiled.h"

namespace kbit {
namespace matmul {

// a * b elements of `elem` bytes fit in the address space (a, b >= 0).
inline kbit_status check_product(int64_t a, int64_t b, size_t elem, const char *what) {
    if (a != 0 && static_cast<uint64_t>(b) > static_cast<uint64_t>(PTRDIFF_MAX) / elem /
                                                   static_cast<uint64_t>(a))
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "%s: %lld x %lld elements of %zu bytes exceed the address space", what,
                    static_cast<long long>(a), static_cast<long long>(b), elem);
    return KBIT_SUCCESS;
}

// What every format shares: dtype, shapes and their sizes. W is stored in blocks of
// `block` elements, `block_bytes` bytes in its largest array.
inline kbit_status check_shapes(kbit_dtype dtype, int64_t m, int64_t k_in, int64_t n_out,
                         int64_t block, int64_t block_bytes) {
    if (!valid_dtype(dtype))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype));
    if (m < 0 || k_in < 0 || n_out < 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "m, k_in and n_out must be >= 0, got %lld, %lld, %lld",
                    static_cast<long long>(m), static_cast<long long>(k_in),
                    static_cast<long long>(n_out));
    if (k_in % block != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "k_in = %lld is not a multiple of the format's block of %lld elements "
                    "(each row of W must hold whole blocks)",
                    static_cast<long long>(k_in), static_cast<long long>(block));
    const size_t elem = dtype_size(dtype);
    KBIT_TRY(check_product(m, k_in, elem, "x"));
    KBIT_TRY(check_product(m, n_out, elem, "y"));
    KBIT_TRY(check_product(n_out, k_in, 1, "W"));
    KBIT_TRY(check_product(n_out, k_in / block, static_cast<size_t>(block_bytes), "W's blocks"));
    return KBIT_SUCCESS;
}

// x, bias and y, which are read or written only when y has elements.
inline kbit_status check_operands(const void *x, const void *bias, const void *y, kbit_dtype dtype,
                           int64_t m, int64_t k_in, int64_t n_out) {
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    const size_t elem = dtype_size(dtype);
    if (k_in > 0) KBIT_TRY(check_ptr(x, "x", elem));
    if (bias) KBIT_TRY(check_ptr(bias, "bias", elem));
    KBIT_TRY(check_ptr(y, "y", elem));
    return KBIT_SUCCESS;
}

// kbit in either layout: k, absmax format, tensor_scale, shapes, then the pointers; the
// codes and scales aligned to `align` (0: the stored layout's element sizes; the tiled
// layout takes 16) and, tiled, the padded sizes within the address space.
inline kbit_status check_matmul_kbit_weight(const void *x, int64_t m, int64_t k_in,
                                            int64_t n_out, kbit_dtype dtype, const void *packed,
                                            const void *absmax, kbit_absmax_format fmt,
                                            float tensor_scale, const float *codebook, int k,
                                            const void *bias, const void *y, size_t align) {
    if (!valid_dtype(dtype))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype));
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    KBIT_TRY(check_common(0, 1, fmt, tensor_scale));  // absmax format and tensor_scale
    KBIT_TRY(check_shapes(dtype, m, k_in, n_out, kBlock, 4 * k));
    if (align && (tiled::packed_bytes(n_out, k_in, k) < 0 || tiled::absmax_bytes(n_out, k_in, fmt) < 0))
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "the tiled weight exceeds the address space");
    if (n_out > 0 && k_in > 0) {
        KBIT_TRY(check_ptr(packed, align ? "tiled_packed" : "packed", align ? align : 4));
        KBIT_TRY(check_ptr(absmax, align ? "tiled_absmax" : "absmax", align ? align : absmax_align(fmt)));
        if (codebook) KBIT_TRY(check_ptr(codebook, "codebook", 4));
    }
    return check_operands(x, bias, y, dtype, m, k_in, n_out);
}

inline kbit_status check_matmul_kbit(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint32_t *packed,
                                     const void *absmax, kbit_absmax_format fmt,
                                     float tensor_scale, const float *codebook, int k,
                                     const void *bias, const void *y) {
    return check_matmul_kbit_weight(x, m, k_in, n_out, dtype, packed, absmax, fmt, tensor_scale,
                                    codebook, k, bias, y, 0);
}

// Tiled kbit (formats/kbit_tiled.h): the tiled arrays 16-byte aligned.
inline kbit_status check_matmul_kbit_tiled(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                           kbit_dtype dtype, const void *tiled_packed,
                                           const void *tiled_absmax, kbit_absmax_format fmt,
                                           float tensor_scale, const float *codebook, int k,
                                           const void *bias, const void *y) {
    return check_matmul_kbit_weight(x, m, k_in, n_out, dtype, tiled_packed, tiled_absmax, fmt,
                                    tensor_scale, codebook, k, bias, y, 16);
}

// NF4 / FP4: blocksize, shapes, then the pointers.
inline kbit_status check_matmul_bnb4(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint8_t *packed,
                                     const float *absmax, int blocksize, const void *bias,
                                     const void *y) {
    KBIT_TRY(bnb4::check_blocksize(blocksize));
    KBIT_TRY(check_shapes(dtype, m, k_in, n_out, blocksize, blocksize / 2));
    if (n_out > 0 && k_in > 0) {
        KBIT_TRY(check_ptr(packed, "packed", 1));
        KBIT_TRY(check_ptr(absmax, "absmax", 4));
    }
    return check_operands(x, bias, y, dtype, m, k_in, n_out);
}

// GGUF: the ggml type, then the dtype, shapes and pointers; on success returns
// f(Fmt{}) for the type's format.
template <class F>
inline kbit_status check_matmul_gguf(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, int ggml_type, const void *blocks,
                                     const void *bias, const void *y, F &&f) {
    return gguf::with_type(ggml_type, [&](auto fmt) {
        using Fmt = decltype(fmt);
        KBIT_TRY(check_shapes(dtype, m, k_in, n_out, Fmt::kElems, Fmt::kBytes));
        if (n_out > 0 && k_in > 0) KBIT_TRY(check_ptr(blocks, "blocks", 2));
        KBIT_TRY(check_operands(x, bias, y, dtype, m, k_in, n_out));
        return f(fmt);
    });
}


// ---- the tensor-core GEMM's tiling (csrc/matmul/gemm.cuh) -----------------------------------
// Shared with kbit_matmul_workspace_bytes, so that the size it asks for is the size a call
// uses. From m = kGemmMinM rows of x the GEMM runs (below, the GEMV kernels): CTAs of
// kGemmRows rows of W by bm rows of x, k in stages of kGemmStageK. A shape with fewer
// tiles than the GPU has room for splits k over `splits` CTAs a tile when the caller gives
// the workspace (partial sums and one arrival counter a tile).
constexpr int64_t kGemmMinM = 9;
constexpr int kGemmRows = 128;
constexpr int kGemmStageK = 64;

struct GemmPlan {
    int bm = 0;           // rows of x per CTA: 16, 32 or 128 (gemm90_plan: 32 .. 256)
    int64_t tiles = 0;    // output tiles (CTAs per split)
    int64_t stages = 0;   // k stages of a row
    int splits = 1;       // CTAs per tile along k (1: no workspace needed)
    int64_t whole = 0;    // tiled90_plan: tiles [0, whole) not split, only the rest
    int64_t workspace = 0;
    // tiled90_plan: the even walk (`room` CTAs, each an equal run of the tiles' k stages;
    // a tile in two or three pieces at the runs' ends, their partial sums a CTA's slot)
    bool even = false;
    int64_t room = 0;
};

// 16 rows of x for m <= 16, 32 (one or two tiles) up to 64, then 128.
inline int gemm_bm(int64_t m) { return m <= 16 ? 16 : m <= 64 ? 32 : 128; }

// The split chosen for a shape: tiles times splits stays within about one wave of CTAs
// (132 SMs; the 128-row configuration fits one CTA an SM, the smaller ones two) and each
// split keeps at least 8 stages; sizes are fixed by the shape alone, not by the device.
// The plan of CTAs of bm rows of x for a shape (m, k_in, n_out > 0); `room`: CTAs a wave.
// split_tiles of p's tiles (the last ones) split k in up to room / split_tiles ways, at
// least 2 and 8 stages each, at most 16: p with its splits and workspace (partial sums
// and a counter a split tile), or p unchanged where no split fits.
// The output tiles of bm rows of x by kGemmRows rows of W.
KBIT_HD int64_t gemm_tiles(int64_t m, int64_t n_out, int64_t bm) {
    return ((m + bm - 1) / bm) * ((n_out + kGemmRows - 1) / kGemmRows);
}
// A workspace (split k, the even walk): `slots` partial tiles of bm x kGemmRows floats,
// then an arrival counter a tile, padded to 16 bytes.
inline int64_t partial_bytes(int64_t slots, int64_t bm) { return slots * bm * kGemmRows * 4; }
inline int64_t workspace_for(int64_t slots, int64_t bm, int64_t tiles) {
    return partial_bytes(slots, bm) + (tiles * 4 + 15) / 16 * 16;
}
inline GemmPlan split_last(GemmPlan p, int64_t room, int64_t split_tiles) {
    int64_t s = room / split_tiles;
    if (s > p.stages / 8) s = p.stages / 8;
    if (s > 16) s = 16;
    if (s < 2) return p;
    p.whole = p.tiles - split_tiles;
    p.splits = static_cast<int>(s);
    p.workspace = workspace_for(split_tiles * s, p.bm, split_tiles);
    return p;
}
inline GemmPlan plan_for(int bm, int64_t room, int64_t m, int64_t k_in, int64_t n_out) {
    GemmPlan p;
    p.bm = bm;
    p.tiles = gemm_tiles(m, n_out, p.bm);
    p.stages = (k_in + kGemmStageK - 1) / kGemmStageK;
    return split_last(p, room, p.tiles);
}

inline GemmPlan gemm_plan(int64_t m, int64_t k_in, int64_t n_out) {
    if (m < kGemmMinM || k_in <= 0 || n_out <= 0) return GemmPlan{};
    const int bm = gemm_bm(m);
    return plan_for(bm, bm == 128 ? 132 : 264, m, k_in, n_out);
}

// The wgmma GEMM of Hopper GPUs (csrc/matmul/gemm_sm90.cu), from m = kGemm90MinM: CTAs
// of kGemmRows rows of W by bm = 32, 64, 128 or 256 rows of x (the wgmma's N: the
// smallest that holds m, and 256 only where that still gives min_tiles256 tiles: a wave
// by default), one CTA an SM; the split rule of gemm_plan. max_bm: a decoder whose tables
// leave no room for 256 rows of x takes 128.
constexpr int64_t kGemm90MinM = 17;
inline GemmPlan gemm90_plan(int64_t m, int64_t k_in, int64_t n_out, int max_bm = 256,
                            int64_t min_tiles256 = 132) {
    if (m < kGemm90MinM || k_in <= 0 || n_out <= 0) return GemmPlan{};
    const int64_t tiles_n = (n_out + kGemmRows - 1) / kGemmRows;
    int bm = m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 || tiles_n * ((m + 255) / 256) < min_tiles256 ? 128 : 256;
    return plan_for(bm < max_bm ? bm : max_bm, 132, m, k_in, n_out);
}

// The streamed wgmma GEMM of stored kbit and NF4 / FP4 weights on Hopper (gemm_sm90.cu)
// for m = kStream90StoredMinM .. kStream90MaxM, and the tiled GEMM's plan to that m: CTAs
// of kGemmRows rows of W by bm = 16, 32 or 64 rows of x (all of them), `ctas` an SM (1 or
// 2: the kernel's choice for the decoder), split as gemm_plan splits.
constexpr int64_t kStream90MaxM = 64;
inline int stream90_bm(int64_t m) { return m <= 16 ? 16 : m <= 32 ? 32 : 64; }
// From m = kGemmMinM it takes weights of kStream90MinRows rows or more; below, m = 9..16
// stays on the GEMV (a 16-row tile a CTA, no split). Tiled (now the tiled GEMM, with this
// plan to m = 64): the register GEMV measured faster on 4096 rows (4096x14336: 31 against
// 36 us; 4096x4096: 14 against 24) and slower from 8192 (105 against 73 us) against the
// streamed GEMM of session 9, and against the tiled GEMM (session 13: 4096x4096 m = 9..16
// 14 against 21 us; 4096x14336 equal). Stored kbit and NF4 / FP4, whose staged GEMV is
// slower, also from kStream90MinWeights weights (NF4 4096x14336 m = 16: 37 against 46
// us; 4096x4096: 22 against 20; H200, bench/RESULTS.md session 9). From m = 17 it takes
// every weight.
// Stored kbit (K >= 4) and NF4 / FP4 of kStream90MinRows rows or more from m =
// kStream90StoredMinM too: their staged GEMV measured 10-28% slower there (H100, session
// 11, m = 8: NF4 8192x28672 138 against 116 us, 28672x8192 161 against 116; K = 4 151 /
// 170 against 125 / 133; K = 5 183 / 204 against 165 / 165); at m = 5..7, at K = 2 and 3
// (14336x4096 K = 3: 41 against 47) and on 4096 rows (4096x14336 NF4: 40 against 46) it
// measured as fast or faster.
// Tiled weights keep the streamed GEMV to m = 8 (session 16 took tiled K = 4 of 2^27
// weights to the tiled GEMM from m = 8; once the GEMV's x rows were read without bank
// conflicts and held resident to 136 KB, it measured as fast or up to 3% faster there:
// H100, session 17, 28672x8192 / 8192x28672 kbit4 tiled m = 8 62.9 / 62.1 against 64.7 /
// 64.1 us).
constexpr int64_t kStream90MinRows = 8192;
constexpr int64_t kStream90MinWeights = int64_t{1} << 25;
constexpr int64_t kStream90StoredMinM = 8;
inline int64_t stream90_min_m(int64_t n_out, int64_t k_in, bool tiled, int k = 4) {
    const bool rows = n_out >= kStream90MinRows;
    if (!rows && (tiled || n_out * k_in < kStream90MinWeights)) return kGemm90MinM;
    return !tiled && rows && k >= 4 ? kStream90StoredMinM : kGemmMinM;
}
inline GemmPlan stream90_plan(int64_t m, int64_t k_in, int64_t n_out, int ctas) {
    if (m < kStream90StoredMinM || m > kStream90MaxM || k_in <= 0 || n_out <= 0) return GemmPlan{};
    return plan_for(stream90_bm(m), 132 * ctas, m, k_in, n_out);
}

// The tiled GEMM's plan (gemm_sm90.cu), `ctas` of its CTAs an SM: to kStream90MaxM
// stream90_plan's, then 128 rows of x a CTA to m = 128 and 256 where that gives half a
// wave of tiles or more (kTiled90MinTiles256), split k as plan_for splits. Its 256-row
// CTAs measured faster than 128-row ones even short of a full wave (H100,
// bench/RESULTS.md session 12: 4096x4096 m = 1024, 128 tiles,
// 58 against 73 us; 14336x4096 m = 256, 112 tiles, 57 against 74), as fast with 64 tiles
// split in two (8192x28672 m = 256: 216 against 219), and slower with 32 split in four
// (4096x4096 m = 256: 72 against 32 us; again with the 16-byte partial sums of session
// 13: 52 against 30.6).
// Where its tiles make whole waves and a last one at most half full (14336x4096 m = 1024:
// 448 tiles, 3.4 waves), the tiles of the last wave split k (so it takes half the time or
// less) and the others do not: `whole` tiles, then tiles - whole split `splits` ways
// (measured 3% faster there, session 13).
constexpr int64_t kTiled90MinTiles256 = 64;
constexpr int64_t kTiled90Room = 132;  // CTAs a wave (one an SM from m = 65)
// To m = kStream90MaxM the persistent GEMMs (tiled, GGUF) walk their k stages evenly
// where split_last's plan leaves the busiest CTA more than kEvenSlack times an equal share,
// the tiles are half the CTAs or more (a tile in at most three pieces) and a CTA's run
// is kEvenMinStages stages of 64 k or more: CTA c takes the stages [c U / G, (c + 1) U /
// G) of the U of all tiles in order. At m = 16 on 28672x8192 (224 tiles of 128 rows, 264
// CTAs) split k leaves two tiles on 92 SMs, one on 40. Measured there (H100,
// bench/RESULTS.md session 27) at m = 16..64: K = 2, 3, 5 and GGUF 1-10% faster, K = 4
// 4% from m = 32, K = 4 m = 16 level, NF4 m = 16 6% slower. Runs of 54 stages (14336x4096
// on 132 CTAs) measured 5-20% slower than split k (session 26, run 5: each run's second
// item, its epilogue and partial sums, costs more than the balance gains there).
constexpr double kEvenSlack = 1.08;
constexpr int64_t kEvenMinStages = 96;
inline GemmPlan even_walk(GemmPlan p, int64_t room) {
    const int64_t s = p.splits;
    const double busiest = static_cast<double>((p.tiles * s + room - 1) / room) / s;
    if (p.tiles * 2 < room || p.tiles * p.stages < kEvenMinStages * room ||
        busiest <= kEvenSlack * static_cast<double>(p.tiles) / room)
        return p;
    p.splits = 1, p.whole = 0, p.even = true, p.room = room;
    p.workspace = workspace_for(room, p.bm, p.tiles);
    return p;
}
inline GemmPlan tiled90_plan(int64_t m, int64_t k_in, int64_t n_out, int ctas) {
    if (m <= kStream90MaxM)
        return even_walk(stream90_plan(m, k_in, n_out, ctas), kTiled90Room * ctas);
    GemmPlan p = gemm90_plan(m, k_in, n_out, 256, kTiled90MinTiles256);
    const int64_t tail = p.tiles % kTiled90Room;
    if (p.splits > 1 || p.tiles < kTiled90Room || tail == 0 || 2 * tail > kTiled90Room) return p;
    return split_last(p, kTiled90Room, tail);
}

// GGUF weights on Hopper: the GGUF GEMM (gemm_sm90.cu, on the tiled GEMM's plan) from m =
// 17, and from 16 on weights of kStream90MinWeights or more; below, the streamed GGUF GEMV.
// Measured against the GEMV (in passes of 32 rows from m = 33; H100, bench/RESULTS.md
// session 15): at m = 9 the GEMV as fast or faster (4096x4096 Q4_K 13.5 against 18.2 us,
// 8192x28672 Q8_0 111 against 120); at m = 16 the GEMM faster on the four large shapes
// (8192x28672 Q4_K 80.5 against 94.5, Q6_K 112 against 135; Q8_0 within 4%) but slower on
// 4096x4096 (18.3 against 16.5); from m = 24 the GEMM faster on every shape and format, up
// to 5.5x at m = 64 (Q6_K, whose stream took the direct GEMM from m = 49).
inline int64_t gguf90_min_m(int64_t n_out, int64_t k_in) {
    return n_out * k_in >= kStream90MinWeights ? 16 : 17;
}

// kbit_matmul_workspace_bytes: enough for any GEMM (the device picks one at the call).
inline int64_t gemm_workspace(int64_t m, int64_t k_in, int64_t n_out) {
    // the streamed GEMM below kGemmMinM only where stored weights take it
    const bool streamed = m >= kGemmMinM || m >= stream90_min_m(n_out, k_in, false);
    const int64_t ws[] = {gemm_plan(m, k_in, n_out).workspace, gemm90_plan(m, k_in, n_out).workspace,
                          gemm90_plan(m, k_in, n_out, 128).workspace,
                          m >= kGemmMinM ? tiled90_plan(m, k_in, n_out, 1).workspace : 0,
                          m >= kGemmMinM ? tiled90_plan(m, k_in, n_out, 2).workspace : 0,
                          streamed ? stream90_plan(m, k_in, n_out, 1).workspace : 0,
                          streamed ? stream90_plan(m, k_in, n_out, 2).workspace : 0};
    int64_t most = 0;
    for (int64_t w : ws) most = w > most ? w : most;
    return most;
}

}  // namespace matmul
}  // namespace kbit
