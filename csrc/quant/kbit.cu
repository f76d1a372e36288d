// kbit quantize / dequantize on the GPU: kernels, launchers and the exported entries.
//
// Quantize: a warp takes 16 blocks of 32 at a time, 2 lanes per block with 16 elements
// each (two 16-byte loads for 16-bit input), so the per-block work (absmax, scale,
// reciprocal, packing, stores) is shared by 2 lanes rather than repeated by 4 or 32.
// The absmax is a 2-lane max; the E4M4 scale is chosen among 4 candidate codes by the
// least squared error (summed in a fixed order, so the CPU makes the same choice); each
// element gets the nearest codebook entry from a conflict-free shared-memory search
// table and one comparison; the bit planes come from a byte gather (multiplies, see
// gather_planes) and one exchange of half-words between the 2 lanes. How each step
// was measured: bench/RESULTS.md.
//
// Dequantize: each lane turns 8 consecutive elements of a block into one 16-byte store
// (two for fp32): it reads the block's K words, spreads the K bit planes of its byte
// into 8 code bytes with two multiplies per plane, and looks each code up in the
// codebook held one entry per lane with __shfl_sync.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../core/cuda.cuh"
#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/kbit.h"

namespace kbit {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileBlocks = 8;  // dequantize: blocks per warp tile, 8 elements per lane
constexpr int kTileElems = kTileBlocks * kBlock;
constexpr int kLaneElems = 16;   // quantize: elements per lane, 2 lanes per block
constexpr int kQTileBlocks = 16;  // quantize: blocks per warp tile
constexpr int kQTileElems = kQTileBlocks * kBlock;
// Dequantize launches kDequantTiles tiles per warp (their loads issued together) and
// enough CTAs to cover about 2^31 elements before it grid-strides: short-lived CTAs keep
// every SM's loads in flight, where long-lived ones that loop wait on each iteration's
// loads (measured: bench/RESULTS.md).
constexpr int kDequantCtasPerSm = 4096;
constexpr int kDequantTiles = 2;

__device__ unsigned int g_range_flag;  // raised by a quantizer on an out-of-range block

// Packs 8 floats into 16 bytes of T: one 16-byte store. (A plain assignment through a
// uint4 pointer compiled to four 4-byte stores here, which cost 5-20% of bandwidth.)
template <class T>
__device__ __forceinline__ void store8(T, uint16_t *out, const float (&v)[8]) {
    __stwb(reinterpret_cast<uint4 *>(out), make_uint4(pack2(T{}, v[0], v[1]), pack2(T{}, v[2], v[3]),
                                                     pack2(T{}, v[4], v[5]), pack2(T{}, v[6], v[7])));
}
__device__ __forceinline__ void store8(F32, float *out, const float (&v)[8]) {
    reinterpret_cast<float4 *>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4 *>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// A lane's 16 consecutive input elements (16-byte aligned) as loaded, streaming (read
// once), and as float: with an fp32/fp16 absmax the quantizer issues the next tile's
// loads before it works on the current one.
template <class T>
struct Raw16 {
    uint4 r[sizeof(typename T::storage) * kLaneElems / 16];
};
template <class T>
__device__ __forceinline__ Raw16<T> load_raw16(const typename T::storage *in) {
    Raw16<T> raw;
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(raw.r) / 16); ++i)
        raw.r[i] = __ldcs(reinterpret_cast<const uint4 *>(in) + i);
    return raw;
}
__device__ __forceinline__ void to_float16(F16, const Raw16<F16> &raw, float (&x)[kLaneElems]) {
    const __half2 *h = reinterpret_cast<const __half2 *>(&raw.r[0]);
#pragma unroll
    for (int i = 0; i < kLaneElems / 2; ++i) {
        const float2 f = __half22float2(h[i]);
        x[2 * i] = f.x, x[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ void to_float16(BF16, const Raw16<BF16> &raw, float (&x)[kLaneElems]) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(&raw.r[0]);
#pragma unroll
    for (int i = 0; i < kLaneElems / 2; ++i) {
        x[2 * i] = __uint_as_float(w[i] << 16);
        x[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}
__device__ __forceinline__ void to_float16(F32, const Raw16<F32> &raw, float (&x)[kLaneElems]) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(&raw.r[0]);
#pragma unroll
    for (int i = 0; i < kLaneElems; ++i) x[i] = __uint_as_float(w[i]);
}

// Bit planes of 8 codes held one per byte in lo (elements 0..3) and hi (4..7): byte 3 of
// planes[j] has bit 24 + e = bit j of element e's code. Bits 0..3 of the codes are
// merged into one word w (byte e: element e's in the low nibble, e + 4's in the high);
// plane j is then bits j and j + 4 of every byte, and one multiply by 0x01020408 >> j
// gathers them into byte 3 without carries. Bit 4 (K = 5) is gathered the same way.
template <int K>
__device__ __forceinline__ void gather_planes(uint32_t lo, uint32_t hi, uint32_t (&planes)[K]) {
    const uint32_t w = K == 5 ? (lo & 0x0F0F0F0Fu) | ((hi & 0x0F0F0F0Fu) << 4) : lo | (hi << 4);
#pragma unroll
    for (int j = 0; j < (K < 4 ? K : 4); ++j)
        planes[j] = (w & (0x11111111u << j)) * (0x01020408u >> j);
    if constexpr (K == 5)
        planes[4] = (((lo >> 4) & 0x01010101u) | (hi & 0x10101010u)) * 0x01020408u;
}

// The two lanes of a block (h = 0: elements 0..15, h = 1: 16..31) turn their codes
// (c[i]: elements 4i..4i+3 of the lane's half, one per byte) into the block's K plane
// words and store them: word j is plane j of half 0 in its low 16 bits and of half 1
// in its high 16 bits. Lane 0 stores words 0..n0-1 and lane 1 words n0..K-1
// (n0 = ceil(K/2)); each sends the other the half-planes that the other stores, packed
// two to a word (one shuffle, two for K = 5).
template <int K>
__device__ __forceinline__ void store_planes(const uint32_t (&c)[4], int h,
                                             uint32_t *__restrict__ words, bool store) {
    uint32_t a[K], b[K];
    gather_planes<K>(c[0], c[1], a);
    gather_planes<K>(c[2], c[3], b);
    uint32_t p[K];  // low 16 bits: plane j of this lane's 16 elements
#pragma unroll
    for (int j = 0; j < K; ++j) p[j] = __byte_perm(a[j], b[j], 0x0073);
    constexpr int n0 = (K + 1) / 2;
    // Lane 1 sends planes 0..n0-1, lane 0 sends planes n0..K-1.
    auto pair = [&](int j) {  // planes j, j + 1 in the low and high halves (j + 1 may be K)
        return __byte_perm(p[j], j + 1 < K ? p[j + 1] : 0u, 0x5410);
    };
    const uint32_t got0 = __shfl_xor_sync(kFull, h ? pair(0) : pair(n0), 16);
    uint32_t got1 = 0;
    if constexpr (n0 > 2) got1 = __shfl_xor_sync(kFull, h ? p[2] : 0u, 16);
    if (!store) return;
    if (h == 0) {
#pragma unroll
        for (int j = 0; j < n0; ++j) {  // my plane j low, the partner's high
            const uint32_t theirs = j < 2 ? got0 : got1;
            words[j] = __byte_perm(p[j], theirs, (j & 1) ? 0x7610 : 0x5410);
        }
    } else {
#pragma unroll
        for (int j = n0; j < K; ++j) {  // the partner's plane j low, mine high
            words[j] = __byte_perm(got0, p[j], (j - n0) & 1 ? 0x5432 : 0x5410);
        }
    }
}

// ---- nearest codebook entry on the GPU ---------------------------------------------
//
// The search counts the thresholds below v (formats/kbit.h: the tie rule is folded into
// them), as on the host, with the GPU's own binning of v: 2^(K+1) steps over [-1, 1],
// clamped. When every bin holds at most one threshold
// (`single`: true of every built-in codebook, and of any codebook whose entries are
// more than 2^-K apart within [-1, 1]), one table read and one comparison find the
// entry; otherwise the search walks the thresholds from the bin's first one.
//
// The lookups are random reads of shared memory, and bank conflicts between the lanes
// of a warp were the quantizer's bottleneck (ncu: about 6 wavefronts per 8-byte read
// with one 513-bin table). The bin table is therefore small and replicated: lane l
// reads copy l % kCopies, laid out so that the lanes of one shared-memory phase (16
// lanes for 8-byte reads, 8 for 16-byte reads) always hit distinct banks.

template <int K>
constexpr int kGpuBins = (2 << K) + 1;

// round((v / 2 + 1 / 2) * 2^(K+1)) clamped to [0, 2^(K+1)], plus 2^23, as float bits:
// the saturated fma clamps, and adding 2^23 in the second fma rounds to an integer
// held in the low mantissa bits. Monotone in v (a NaN lands in bin 0). Two
// instructions; a table address is then one multiply-add onto a biased base.
constexpr uint32_t kBinBias = 0x4B000000u;  // the bits of 2^23
template <int K>
__device__ __forceinline__ uint32_t gpu_bin_biased(float v) {
    const float t = __saturatef(__fmaf_rn(v, 0.5f, 0.5f));
    return __float_as_uint(__fmaf_rn(t, static_cast<float>(2 << K), 8388608.0f));
}
template <int K>
__device__ __forceinline__ int gpu_bin(float v) {
    return static_cast<int>(gpu_bin_biased<K>(v) - kBinBias);
}

// Bin entries. Code only: the bin's first threshold thr[p0] and the codes of entries p0
// and p0 + 1 (info = code | code << 8). With the value (the E4M4 error): also the two
// entries' values.
struct Bin8 {
    float thr;
    uint32_t info;
};
struct alignas(16) Bin16 {
    float thr;
    uint32_t info;
    float lo, hi;
};

template <int K, bool WithValue>
struct QuantTable {
    using Entry = std::conditional_t<WithValue, Bin16, Bin8>;
    static constexpr int kBins = kGpuBins<K>;
    static constexpr int kCopies = WithValue ? 8 : 16;  // lanes per shared-memory phase
    Entry bins[kBins][kCopies];  // copy c of bin b: banks 2c or 4c onwards, for every b
    uint8_t first[kBins];        // p0 of each bin, where the walk starts
    float thr[kBlock];           // thr[unique - 1] = +inf
    float value[kBlock];         // the sorted distinct entries
    uint8_t code[kBlock];        // the lowest original index holding value[j]
    float rcp_e4m4[WithValue ? 256 : 1];  // E4M4 only: rcp_rn(e4m4_decode(c))
    int unique;
};

// The shared-memory address of this lane's copy of bins[0], less the bin bias times
// the bin stride: adding biased_bin * stride gives the entry's address (unsigned
// arithmetic wraps). It passes through a shuffle so that the compiler cannot split the
// constant back out, which would cost an add per lookup.
template <class Table>
__device__ __forceinline__ uint32_t biased_bins(const Table &t) {
    constexpr uint32_t stride = sizeof(t.bins[0]);
    const uint32_t at = static_cast<uint32_t>(
        __cvta_generic_to_shared(&t.bins[0][(threadIdx.x & 31) % Table::kCopies]));
    return __shfl_sync(kFull, at - kBinBias * stride, threadIdx.x & 31);
}

// A lane's view of its CTA's table for the lookups.
template <int K, bool WithValue>
struct Searcher {
    using Table = QuantTable<K, WithValue>;
    const Table &t;
    bool single;
    uint32_t bins_at;  // biased_bins(t)
};

// Entry `lane` of the codebook (the built-in one when cb is null), 0 for lane >= 2^K.
template <int K>
__device__ __forceinline__ float lane_entry(const float *cb, int lane) {
    const float *book = cb ? cb : g_normal_float.v[K - 2];
    return lane < (1 << K) ? book[lane] : 0.0f;
}

// Builds the table (the same sorted entries and ties as the host's build_search_table):
// warp 0 sorts and ranks the entries, one thread per bin fills the bin's copies.
// Returns `single`.
template <int K, bool WithValue>
__device__ bool build_quant_table(QuantTable<K, WithValue> &t, const float *cb) {
    using Table = QuantTable<K, WithValue>;
    constexpr int m = 1 << K;
    const int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        const float v = lane_entry<K>(cb, lane);
        bool first = lane < m;  // the lowest index holding its value
        int rank = 0;           // distinct values below v
        for (int j = 0; j < m; ++j) {
            const float o = __shfl_sync(kFull, v, j);
            if (j < lane && o == v) first = false;
        }
        for (int j = 0; j < m; ++j) {
            const float o = __shfl_sync(kFull, v, j);
            const bool fj = __shfl_sync(kFull, first, j);
            rank += (fj && o < v);
        }
        const int unique = __popc(__ballot_sync(kFull, first));
        if (first) {
            t.value[rank] = v;
            t.code[rank] = static_cast<uint8_t>(lane);
        }
        __syncwarp();
        if (lane < unique) {
            t.thr[lane] = lane + 1 < unique ? tie_threshold(t.value[lane], t.value[lane + 1],
                                                            t.code[lane], t.code[lane + 1])
                                            : INFINITY;
        }
        if (lane == 0) t.unique = unique;
    }
    if constexpr (WithValue)
        for (int c = threadIdx.x; c < 256; c += blockDim.x) t.rcp_e4m4[c] = rcp_rn(e4m4_decode(c));
    __syncthreads();
    const int unique = t.unique;
    bool single = true;
    for (int b = threadIdx.x; b < Table::kBins; b += blockDim.x) {
        int below = 0, inside = 0;
        for (int j = 0; j + 1 < unique; ++j) {
            const int bj = gpu_bin<K>(t.thr[j]);
            below += bj < b;
            inside += bj == b;
        }
        single &= inside <= 1;
        t.first[b] = static_cast<uint8_t>(below);
        const int p1 = min(below + 1, unique - 1);
        typename Table::Entry e;
        e.thr = t.thr[below];
        e.info = t.code[below] | static_cast<uint32_t>(t.code[p1]) << 8;
        if constexpr (WithValue) e.lo = t.value[below], e.hi = t.value[p1];
        for (int c = 0; c < Table::kCopies; ++c) t.bins[b][c] = e;
    }
    return __syncthreads_and(single);
}

// The entry nearest to v: its value (if the table has them), and its code as byte `up`
// of `info`.
struct Pick {
    float value;
    uint32_t info;
    bool up;
};

template <bool Single, int K, bool WithValue>
__device__ __forceinline__ Pick nearest(const Searcher<K, WithValue> &s, float v) {
    constexpr uint32_t stride = sizeof(s.t.bins[0]);
    const uint32_t bin = gpu_bin_biased<K>(v);
    if (Single) {
        if constexpr (WithValue) {
            const float4 e = lds_float4(s.bins_at + bin * stride);
            const bool up = v > e.x;
            return {up ? e.w : e.z, __float_as_uint(e.y), up};
        } else {
            const float2 e = lds_float2(s.bins_at + bin * stride);
            return {0.0f, __float_as_uint(e.y), v > e.x};
        }
    }
    int p = s.t.first[bin - kBinBias];
    while (v > s.t.thr[p]) ++p;
    return {s.t.value[p], s.t.code[p], false};
}

// w with the picked code in byte e (which is zero in w): one byte permute.
__device__ __forceinline__ uint32_t put_code(uint32_t w, int e, const Pick &p) {
    const uint32_t keep = 0x7654u & ~(0xFu << (4 * e));  // bytes of w, byte e from info
    return __byte_perm(p.info, w, p.up ? keep | (1u << (4 * e)) : keep);
}

// Codes of a lane's 16 elements against the inverse scale inv: element e in byte e % 4
// of c[e / 4]. WithError: *err = the squared error of the lane's two runs of 8 (valid
// elements only), each summed in element order, then run 0 + run 1.
// With Weighted, element e's squared error is weighted by w[e] (its importance).
template <bool Full, bool Single, bool WithError, bool Weighted, class S>
__device__ __forceinline__ void pick_run(const S &s, const float (&x)[kLaneElems],
                                         const float *w, int nvalid, float inv, uint32_t (&c)[4],
                                         float *err) {
    float acc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i) c[i] = 0;
#pragma unroll
    for (int e = 0; e < kLaneElems; ++e) {
        const float v = scaled(x[e], inv);
        const Pick p = nearest<Single>(s, v);
        if (WithError && (Full || e < nvalid))
            acc[e / kRun] = Weighted ? add_error(acc[e / kRun], v, p.value, w[e])
                                     : add_error(acc[e / kRun], v, p.value);
        c[e / 4] = put_code(c[e / 4], e % 4, p);
    }
    if (WithError) *err = add_rn(acc[0], acc[1]);
}

// The same, the table's `single` decided once per call (it is uniform).
template <bool Full, bool WithError, bool Weighted = false, class S>
__device__ __forceinline__ void pick_codes(const S &s, const float (&x)[kLaneElems], int nvalid,
                                           float inv, uint32_t (&c)[4], float *err = nullptr,
                                           const float *w = nullptr) {
    if (s.single) pick_run<Full, true, WithError, Weighted>(s, x, w, nvalid, inv, c, err);
    else pick_run<Full, false, WithError, Weighted>(s, x, w, nvalid, inv, c, err);
}

// The scale type of an absmax format.
template <kbit_absmax_format FMT>
using ScaleT = std::conditional_t<FMT == KBIT_ABSMAX_FP32, float,
                                  std::conditional_t<FMT == KBIT_ABSMAX_FP16, uint16_t, uint8_t>>;

// One lane's half of a block: lane l of a warp takes half h = l >> 4 (elements
// 16h..16h+15) of block l & 15 of the warp's tile, so the two lanes of a block are l and
// l ^ 16 and reduce with one shuffle. x: the half (nvalid elements, the rest 0); Full:
// all 16 valid. Writes the block's scale to *scale (lane h == 0) and its plane words to
// words[0..K) when `in_range` (the block exists). Each lane holds two of the runs of 8
// in which the E4M4 error is summed, so the fixed order (r0 + r1) + (r2 + r3) is the
// lane's own sum plus its partner's. Weighted: w holds the half's importance weights
// (kbit_quantize_ex), which weight the E4M4 search's errors. A block that does not fit
// raises *flag.
template <class T, int K, kbit_absmax_format FMT, bool Full, bool Weighted = false>
__device__ __forceinline__ void quantize_half(const Searcher<K, FMT == KBIT_ABSMAX_E4M4> &s,
                                              float (&x)[kLaneElems], const float *w,
                                              int nvalid, int h, float ts, float rcp_ts,
                                              ScaleT<FMT> *scale, uint32_t *__restrict__ words,
                                              bool in_range, unsigned int *flag) {
    uint32_t amax_bits = 0;
#pragma unroll
    for (int e = 0; e < kLaneElems; ++e)
        amax_bits = max(amax_bits, Full || e < nvalid ? abs_bits(x[e]) : 0u);
    amax_bits = max(amax_bits, __shfl_xor_sync(kFull, amax_bits, 16));
    const bool finite = bits_finite(amax_bits);
    const float a = f32_from_bits(amax_bits);
    const float a_s = ts == 1.0f ? a : div_rn(a, ts);
    if (tiny_block(a, finite, ts)) {  // formats/kbit.h: x and the scale's inverse, * 2^64
#pragma unroll
        for (int e = 0; e < kLaneElems; ++e) x[e] = mul_rn(x[e], kTinyShift);
        ts = mul_rn(ts, kTinyShift);
        rcp_ts = rcp_rn(ts);
    }
    bool over = false;
    uint32_t c[4];  // the codes, one per byte

    if constexpr (FMT == KBIT_ABSMAX_E4M4) {
        const int c0 = finite ? e4m4_ceil(a_s) : 256;
        over = c0 > 255;
        int best = over ? 255 : c0;
        float best_score = INFINITY;
#pragma unroll 1  // unrolled, the candidates would hold about twice the registers
        for (int ci = 0; ci < kNumCandidates; ++ci) {
            // Every lane evaluates (the shuffle needs the whole warp); `ok` decides.
            const int cand = c0 + candidate_offset(ci);
            const bool ok = !over && c0 > 0 && cand >= 1 && cand <= 255;
            const int cc = ok ? cand : 1;
            const float dc = e4m4_decode(cc);
            float acc;
            uint32_t cc_codes[4];
            pick_codes<Full, true, Weighted>(s, x, nvalid,
                                             e4m4_inverse(s.t.rcp_e4m4[cc], rcp_ts), cc_codes,
                                             &acc, w);
            acc = add_rn(acc, __shfl_xor_sync(kFull, acc, 16));  // (r0 + r1) + (r2 + r3)
            const float score = mul_rn(acc, mul_rn(dc, dc));
            if (ok && score < best_score) {
                best_score = score;
                best = cand;
#pragma unroll
                for (int i = 0; i < 4; ++i) c[i] = cc_codes[i];
            }
        }
        if (h == 0 && in_range) *scale = static_cast<uint8_t>(best);
        if (best_score == INFINITY) {  // nothing chosen: zero, non-finite or clipped block
            const float inv = stored_inverse(true, finite, over, e4m4_decode(best),
                                             s.t.rcp_e4m4[best], ts, rcp_ts);
            pick_codes<Full, false>(s, x, nvalid, inv, c);
        }
    } else {
        const PlainScale sc = plain_scale(FMT, a_s, finite);
        over = sc.over;
        if (h == 0 && in_range) {
            if constexpr (FMT == KBIT_ABSMAX_FP32) *scale = sc.value;
            else *scale = static_cast<uint16_t>(sc.bits);
        }
        pick_codes<Full, false>(s, x, nvalid,
                                stored_inverse(false, finite, over, sc.value, 0.0f, ts, rcp_ts), c);
    }

    // Non-finite blocks and elements past n get code 0.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        uint32_t keep = finite ? ~0u : 0u;
        if (!Full) {
            const int valid = nvalid - 4 * i;  // elements of c[i] inside the tensor
            keep &= valid >= 4 ? ~0u : (valid <= 0 ? 0u : (1u << (8 * valid)) - 1u);
        }
        c[i] &= keep;
    }
    store_planes<K>(c, h, words, in_range);
    if (h == 0 && in_range && (over || (!finite && FMT == KBIT_ABSMAX_E4M4))) atomicOr(flag, 1u);
}

// Quantize: each warp takes tiles of 16 blocks in a grid-stride loop over a table built
// once per CTA. With an fp32/fp16 absmax it loads the next full tile before it works on
// the current one; E4M4, bound by its table lookups rather than by memory, spends those
// registers on occupancy instead: it is held to 64 registers, 4 CTAs per SM (at 93
// registers it ran 2 CTAs per SM and latency-bound, ncu: 62% issue-active; 4 CTAs, with
// a few spills outside the element loop, measured 7-10% faster). The lane's input,
// scale and word pointers advance by one stride per iteration (64-bit index arithmetic
// per tile had cost several instructions per element).
// Weighted (E4M4 only): the search weights each element's error by importance[i].
// flag: the word a block that does not fit raises (the caller's range_status, or the
// device's flag).
template <class T, int K, kbit_absmax_format FMT, bool Weighted = false>
__global__ void __launch_bounds__(kThreads, FMT == KBIT_ABSMAX_E4M4 ? 4 : 1)
quantize_kernel(const typename T::storage *__restrict__ in, const float *__restrict__ importance,
                int64_t n, const float *__restrict__ codebook, float ts,
                void *__restrict__ absmax, uint32_t *__restrict__ packed,
                unsigned int *__restrict__ flag) {
    constexpr bool kWithValue = FMT == KBIT_ABSMAX_E4M4;
    __shared__ QuantTable<K, kWithValue> t;
    const Searcher<K, kWithValue> s{t, build_quant_table(t, codebook), biased_bins(t)};
    const float rcp_ts = rcp_rn(ts);
    const int64_t tiles = (n + kQTileElems - 1) / kQTileElems;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const bool aligned = (reinterpret_cast<uintptr_t>(in) & 15u) == 0;
    const int64_t full_tiles = aligned ? n / kQTileElems : 0;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
    const int lane = threadIdx.x & 31;
    const int h = lane >> 4;
    // This lane's block and half in the warp's first tile, and the stride per tile.
    int64_t b = warp * kQTileBlocks + (lane & 15);
    const typename T::storage *src = in + b * kBlock + h * kLaneElems;
    ScaleT<FMT> *scale = static_cast<ScaleT<FMT> *>(absmax) + b;
    uint32_t *words = packed + b * K;
    const int64_t step = warps * kQTileBlocks;  // blocks
    constexpr bool kPrefetch = FMT != KBIT_ABSMAX_E4M4;
    Raw16<T> next{};
    if (kPrefetch && warp < full_tiles) next = load_raw16<T>(src);
    for (int64_t tile = warp; tile < tiles;
         tile += warps, b += step, src += step * kBlock, scale += step, words += step * K) {
        float x[kLaneElems];
        float w[Weighted ? kLaneElems : 1];
        if (Weighted) {
            const int64_t first = b * kBlock + h * kLaneElems;
#pragma unroll
            for (int e = 0; e < kLaneElems; ++e)
                w[Weighted ? e : 0] = first + e < n ? __ldg(importance + first + e) : 0.0f;
        }
        if (tile < full_tiles) {
            if (kPrefetch) {
                to_float16(T{}, next, x);
                if (tile + warps < full_tiles) next = load_raw16<T>(src + step * kBlock);
            } else {
                to_float16(T{}, load_raw16<T>(src), x);
            }
            quantize_half<T, K, FMT, true, Weighted>(s, x, w, kLaneElems, h, ts, rcp_ts, scale,
                                                     words, true, flag);
        } else {  // the last tile, or an unaligned input: element by element
            const int64_t left = n - (b * kBlock + h * kLaneElems);
            const int nvalid =
                left >= kLaneElems ? kLaneElems : (left > 0 ? static_cast<int>(left) : 0);
#pragma unroll
            for (int e = 0; e < kLaneElems; ++e) x[e] = e < nvalid ? load_f32(T{}, src[e]) : 0.0f;
            quantize_half<T, K, FMT, false, Weighted>(s, x, w, nvalid, h, ts, rcp_ts, scale,
                                                      words, b < blocks, flag);
        }
    }
}

// Block b's stored scale as raw bits, read-only load: the dequantizer issues these
// loads before it decodes any (decode_scale).
__device__ __forceinline__ uint32_t load_scale_bits(kbit_absmax_format fmt, const void *absmax,
                                                    int64_t b) {
    if (fmt == KBIT_ABSMAX_E4M4) return __ldg(static_cast<const uint8_t *>(absmax) + b);
    if (fmt == KBIT_ABSMAX_FP16) return __ldg(static_cast<const uint16_t *>(absmax) + b);
    return __ldg(static_cast<const uint32_t *>(absmax) + b);
}

// The K words of block b: one 8- or 16-byte load where K and the alignment of
// `packed` allow (`vec`), else K loads.
template <int K>
__device__ __forceinline__ void load_words(const uint32_t *__restrict__ packed, int64_t b,
                                           bool vec, uint32_t (&w)[K]) {
    const uint32_t *p = packed + b * K;
    if (!vec) {
#pragma unroll
        for (int j = 0; j < K; ++j) w[j] = __ldg(p + j);
    } else if constexpr (K == 4) {
        const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (K == 2) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        w[0] = v.x, w[1] = v.y;
    } else {
#pragma unroll
        for (int j = 0; j < K; ++j) w[j] = __ldg(p + j);
    }
}

template <class T, int K, kbit_absmax_format FMT>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(const uint32_t *__restrict__ packed, const void *__restrict__ absmax, float ts,
                  const float *__restrict__ codebook, int64_t n,
                  int64_t vec_elems, bool vec_words, typename T::storage *__restrict__ out) {
    __shared__ float cb_smem[kBlock];
    const int lane = threadIdx.x & 31;
    const float cb_lane = lane_entry<K>(codebook, lane);
    if (threadIdx.x < 32) cb_smem[lane] = cb_lane;

    // Vector part: whole tiles of 8 blocks, 8 elements and one 16-byte store per lane;
    // a warp takes kDequantTiles consecutive tiles and issues all their loads first.
    const int64_t tiles = vec_elems / kTileElems;
    const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
    const int q = lane & 3;
    for (int64_t t0 = warp * kDequantTiles; t0 < tiles; t0 += warps * kDequantTiles) {
        uint32_t w[kDequantTiles][K];
        uint32_t raw_scale[kDequantTiles];
#pragma unroll
        for (int u = 0; u < kDequantTiles; ++u) {
            const int64_t b = (t0 + u) * kTileBlocks + (lane >> 2);
            if (t0 + u < tiles) {
                load_words<K>(packed, b, vec_words, w[u]);
                raw_scale[u] = load_scale_bits(FMT, absmax, b);
            }
        }
#pragma unroll
        for (int u = 0; u < kDequantTiles; ++u) {
            if (t0 + u >= tiles) break;
            const int64_t b = (t0 + u) * kTileBlocks + (lane >> 2);
            const float scale = scale_product(decode_scale(FMT, raw_scale[u]), ts);
            uint32_t lo, hi;
            spread_codes<K>(w[u], q, lo, hi);
            float v[8];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                // __shfl_sync reads the source lane modulo 32: the bytes above are ignored.
                v[e] = mul_rn(__shfl_sync(kFull, cb_lane, static_cast<int>(lo >> (8 * e))), scale);
                v[e + 4] = mul_rn(__shfl_sync(kFull, cb_lane, static_cast<int>(hi >> (8 * e))), scale);
            }
            store8(T{}, out + b * kBlock + 8 * q, v);
        }
    }

    // Scalar part: the tail (and everything when the output is not 16-byte aligned).
    if (vec_elems == n) return;
    __syncthreads();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = vec_elems + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         i < n; i += stride) {
        const int64_t b = i / kBlock;
        const int bit = static_cast<int>(i % kBlock);
        uint32_t c = 0;
#pragma unroll
        for (int j = 0; j < K; ++j) c |= ((packed[b * K + j] >> bit) & 1u) << j;
        out[i] = store_cast(T{}, mul_rn(cb_smem[c], block_scale(FMT, absmax, b, ts)));
    }
}

template <class T, int K, kbit_absmax_format FMT, bool Weighted>
cudaError_t launch_quantize(const void *in, const float *importance, int64_t n, const float *cb,
                            float ts, void *absmax, uint32_t *packed, unsigned int *flag,
                            cudaStream_t stream) {
    const int64_t tiles = (n + kQTileElems - 1) / kQTileElems;
    const int64_t ctas = (tiles + kWarps - 1) / kWarps;
    int grid = 0;
    cudaError_t err = resident_grid<quantize_kernel<T, K, FMT, Weighted>>(kThreads, 0, ctas, &grid);
    if (err != cudaSuccess) return err;
    quantize_kernel<T, K, FMT, Weighted><<<grid, kThreads, 0, stream>>>(
        static_cast<const typename T::storage *>(in), importance, n, cb, ts, absmax, packed,
        flag);
    return launch_error();
}

}  // namespace

// The device's range flag (core/cuda.cuh).
cudaError_t device_range_flag(unsigned int **flag) {
    return cudaGetSymbolAddress(reinterpret_cast<void **>(flag), g_range_flag);
}

namespace {

template <class T, int K, kbit_absmax_format FMT>
cudaError_t launch_dequantize(const uint32_t *packed, const void *absmax, float ts,
                              const float *cb, int64_t n, void *out, cudaStream_t stream) {
    const bool aligned = (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
    const int64_t vec_elems = aligned ? n / kTileElems * kTileElems : 0;
    const int64_t vec_ctas =
        (vec_elems / kTileElems + kWarps * kDequantTiles - 1) / (kWarps * kDequantTiles);
    const int64_t tail_ctas = (n - vec_elems + kThreads - 1) / kThreads;
    int grid = 0;
    const bool words_vec = (reinterpret_cast<uintptr_t>(packed) & (K == 4 ? 15u : 7u)) == 0;
    cudaError_t err = grid_for(vec_ctas > tail_ctas ? vec_ctas : tail_ctas, kDequantCtasPerSm, &grid);
    if (err != cudaSuccess) return err;
    dequantize_kernel<T, K, FMT><<<grid, kThreads, 0, stream>>>(
        packed, absmax, ts, cb, n, vec_elems, words_vec,
        static_cast<typename T::storage *>(out));
    return launch_error();
}

// quantize with kbit_quantize_ex's options: importance (null: unweighted; only the E4M4
// search uses it) and range_status (null: the device's flag).
template <class T, int K>
kbit_status quantize_kbit_ex_t(const void *input, const float *importance, int64_t n,
                               const float *codebook, kbit_absmax_format fmt, float ts,
                               void *absmax, uint32_t *packed, uint32_t *range_status,
                               kbit_stream_t stream) {
    KBIT_TRY(check_quantize(input, n, sizeof(typename T::storage), codebook, fmt, ts, absmax,
                            packed));
    KBIT_TRY(check_quantize_ex(n, importance, range_status));
    if (n == 0) return KBIT_SUCCESS;
    unsigned int *flag = range_status;
    if (!flag) KBIT_TRY(cuda_status(device_range_flag(&flag), "finding the range flag"));
    const cudaError_t err = with_format(fmt, [&](auto f) {
        constexpr kbit_absmax_format F = decltype(f)::value;
        if constexpr (F == KBIT_ABSMAX_E4M4) {
            if (importance)
                return launch_quantize<T, K, F, true>(input, importance, n, codebook, ts, absmax,
                                                      packed, flag, stream);
        }
        return launch_quantize<T, K, F, false>(input, nullptr, n, codebook, ts, absmax, packed,
                                               flag, stream);
    });
    return cuda_status(err, "kbit quantize launch");
}

template <class T, int K>
kbit_status quantize_kbit(const void *input, int64_t n, const float *codebook,
                           kbit_absmax_format fmt, float ts, void *absmax, uint32_t *packed,
                           kbit_stream_t stream) {
    return quantize_kbit_ex_t<T, K>(input, nullptr, n, codebook, fmt, ts, absmax, packed,
                                    nullptr, stream);
}

template <class T, int K>
kbit_status dequantize_kbit(const uint32_t *packed, const void *absmax, kbit_absmax_format fmt,
                             float ts, const float *codebook, int64_t n, void *output,
                             kbit_stream_t stream) {
    KBIT_TRY(check_dequantize(packed, absmax, fmt, ts, codebook, n, output,
                              sizeof(typename T::storage)));
    if (n == 0) return KBIT_SUCCESS;
    const cudaError_t err = with_format(fmt, [&](auto f) {
        return launch_dequantize<T, K, decltype(f)::value>(packed, absmax, ts, codebook, n,
                                                          output, stream);
    });
    return cuda_status(err, "kbit dequantize launch");
}

// Max |x| over the finite elements, as ordered bits, into *result (zeroed beforehand).
template <class T>
__global__ void __launch_bounds__(kThreads)
absmax_kernel(const typename T::storage *__restrict__ in, int64_t n, unsigned int *result) {
    uint32_t m = 0;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint32_t a = abs_bits(load_f32(T{}, in[i]));
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

// The generic entries: the run-time switch to the per-type instances.
kbit_status quantize_kbit_any(const void *input, int64_t n, kbit_dtype dtype, int k,
                              const float *codebook, kbit_absmax_format fmt, float ts,
                              void *absmax, uint32_t *packed, kbit_stream_t stream) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return quantize_kbit<decltype(tag), kc.value>(input, n, codebook, fmt, ts, absmax,
                                                          packed, stream);
        });
    });
}

kbit_status quantize_kbit_ex(const void *input, const float *importance, int64_t n,
                             kbit_dtype dtype, int k, const float *codebook,
                             kbit_absmax_format fmt, float ts, void *absmax, uint32_t *packed,
                             uint32_t *range_status, kbit_stream_t stream) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return quantize_kbit_ex_t<decltype(tag), kc.value>(
                input, importance, n, codebook, fmt, ts, absmax, packed, range_status, stream);
        });
    });
}

kbit_status dequantize_kbit_any(const uint32_t *packed, const void *absmax,
                                kbit_absmax_format fmt, float ts, const float *codebook, int k,
                                int64_t n, kbit_dtype dtype, void *output, kbit_stream_t stream) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return dequantize_kbit<decltype(tag), kc.value>(packed, absmax, fmt, ts, codebook, n,
                                                            output, stream);
        });
    });
}

kbit_status get_range_flag(int *raised, int clear) {
    KBIT_TRY(check_ptr(raised, "raised", alignof(int)));
    unsigned int flag = 0;
    // Every stream's quantize kernels must have finished, non-blocking ones too.
    KBIT_TRY(cuda_status(cudaDeviceSynchronize(), "synchronising the device"));
    KBIT_TRY(cuda_status(cudaMemcpyFromSymbol(&flag, g_range_flag, sizeof flag),
                         "reading the range flag"));
    if (clear) {
        const unsigned int zero = 0;
        KBIT_TRY(cuda_status(cudaMemcpyToSymbol(g_range_flag, &zero, sizeof zero),
                             "clearing the range flag"));
    }
    *raised = flag ? 1 : 0;
    return KBIT_SUCCESS;
}

kbit_status compute_tensor_scale(const void *input, int64_t n, kbit_dtype dtype,
                                 kbit_absmax_format fmt, float *tensor_scale,
                                 kbit_stream_t stream) {
    KBIT_TRY(check_common(n, dtype_size(dtype), fmt, 1.0f));
    if (!valid_dtype(dtype)) return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
    KBIT_TRY(check_ptr(tensor_scale, "tensor_scale", 4));
    if (n == 0) {
        *tensor_scale = 1.0f;
        return KBIT_SUCCESS;
    }
    KBIT_TRY(check_ptr(input, "input", dtype_size(dtype)));
    unsigned int *result = nullptr;
    KBIT_TRY(cuda_status(cudaMallocAsync(&result, sizeof *result, stream), "cudaMallocAsync"));
    cudaError_t err = cudaMemsetAsync(result, 0, sizeof *result, stream);
    if (err == cudaSuccess) {
        with_dtype(dtype, [&](auto tag) {
            err = launch_absmax<decltype(tag)>(input, n, result, stream);
            return KBIT_SUCCESS;
        });
    }
    unsigned int bits = 0;
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(&bits, result, sizeof bits, cudaMemcpyDeviceToHost, stream);
    const cudaError_t free_err = cudaFreeAsync(result, stream);
    if (err == cudaSuccess) err = free_err;
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    KBIT_TRY(cuda_status(err, "kbit_compute_tensor_scale"));
    *tensor_scale = tensor_scale_for(f32_from_bits(bits), fmt);
    return KBIT_SUCCESS;
}

}  // namespace
}  // namespace kbit

KBIT_KBIT_ENTRIES(KBIT_DEFINE_ENTRY, KBIT_SKIP_ENTRY)
