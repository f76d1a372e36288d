// CPU implementation of the kbit format: the same packed words and scales as the GPU
// kernels in csrc/quant/kbit.cu, block by block, using the shared arithmetic of
// csrc/formats/kbit.h.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/kbit.h"
#include "parallel.h"

namespace kbit {
namespace {

constexpr int64_t kBlocksPerThread = 4096;  // below this a thread costs more than it saves

// Sorted distinct entries (by value, then index), thresholds and bin starts.
SearchTable build_search_table(const float *cb, int m) {
    SearchTable tab{};
    int order[kBlock];
    for (int i = 0; i < m; ++i) order[i] = i;
    std::stable_sort(order, order + m, [&](int a, int b) { return cb[a] < cb[b]; });
    int u = 0;
    for (int i = 0; i < m; ++i) {
        float v = cb[order[i]];
        if (u > 0 && tab.value[u - 1] == v) continue;  // duplicate: keep the lowest index
        tab.value[u] = v;
        tab.code[u] = static_cast<uint8_t>(order[i]);
        ++u;
    }
    tab.unique = u;
    for (int j = 0; j < u; ++j)
        tab.thr[j] = j + 1 < u ? tie_threshold(tab.value[j], tab.value[j + 1], tab.code[j],
                                               tab.code[j + 1])
                               : INFINITY;
    for (int b = 0; b < kBins; ++b) {
        int below = 0;  // thresholds in lower bins
        for (int j = 0; j + 1 < u; ++j) below += search_bin(tab.thr[j]) < b;
        tab.start[b] = static_cast<uint8_t>(below);
    }
    return tab;
}

// What quantize_block reports about a block that the format cannot hold.
enum BlockFit { kFits = 0, kOverRange = 1, kNonFiniteE4M4 = 2 };

// One block: writes the K packed words and the stored scale; says whether the block
// fits the format (else it is stored at the format's maximum). rcp_ts = rcp_rn(ts).
// w: the elements' importance for the E4M4 scale search, or null (all 1).
template <int K>
BlockFit quantize_block(float *x, const float *w, int valid, const SearchTable &tab,
                        kbit_absmax_format fmt, float ts, float rcp_ts, void *absmax, int64_t b,
                        uint32_t *words) {
    uint8_t codes[kBlock];
    bool have_codes = false;
    uint32_t amax_bits = 0;
    for (int i = 0; i < valid; ++i) amax_bits = std::max(amax_bits, abs_bits(x[i]));
    const bool finite = bits_finite(amax_bits);
    const float a_s = div_rn(f32_from_bits(amax_bits), ts);
    if (tiny_block(f32_from_bits(amax_bits), finite, ts)) {  // x and the scale's inverse, * 2^64
        for (int i = 0; i < valid; ++i) x[i] = mul_rn(x[i], kTinyShift);
        ts = mul_rn(ts, kTinyShift);
        rcp_ts = rcp_rn(ts);
    }
    bool over = false;
    float dec = 0.0f;

    if (fmt != KBIT_ABSMAX_E4M4) {
        const PlainScale sc = plain_scale(fmt, a_s, finite);
        over = sc.over;
        dec = sc.value;
        if (fmt == KBIT_ABSMAX_FP32) static_cast<float *>(absmax)[b] = sc.value;
        else static_cast<uint16_t *>(absmax)[b] = static_cast<uint16_t>(sc.bits);
    } else {
        int c0 = finite ? e4m4_ceil(a_s) : 256;
        over = c0 > 255;
        int best = over ? 255 : c0;
        if (!over && c0 > 0) {
            float best_score = INFINITY;
            for (int ci = 0; ci < kNumCandidates; ++ci) {
                int c = c0 + candidate_offset(ci);
                if (c < 1 || c > 255) continue;
                const float dc = e4m4_decode(c);
                const float inv = e4m4_inverse(rcp_rn(dc), rcp_ts);
                float run[kBlock / kRun] = {};
                uint8_t cand[kBlock];
                for (int i = 0; i < valid; ++i) {
                    const float v = scaled(x[i], inv);
                    const Nearest near = search_nearest(tab, v);
                    run[i / kRun] = w ? add_error(run[i / kRun], v, near.value, w[i])
                                      : add_error(run[i / kRun], v, near.value);
                    cand[i] = static_cast<uint8_t>(near.code);
                }
                const float total = add_rn(add_rn(run[0], run[1]), add_rn(run[2], run[3]));
                const float score = mul_rn(total, mul_rn(dc, dc));
                if (score < best_score) {  // the codes of the chosen scale are final
                    best_score = score;
                    best = c;
                    std::copy(cand, cand + valid, codes);
                    have_codes = true;
                }
            }
        }
        static_cast<uint8_t *>(absmax)[b] = static_cast<uint8_t>(best);
        dec = e4m4_decode(best);
    }

    if (!have_codes) {  // no scale searched (or none chosen): codes against the stored one
        const bool e4m4 = fmt == KBIT_ABSMAX_E4M4;
        const float inv = stored_inverse(e4m4, finite, over, dec, e4m4 ? rcp_rn(dec) : 0.0f, ts,
                                         rcp_ts);
        for (int i = 0; i < valid; ++i)
            codes[i] = finite ? static_cast<uint8_t>(search_nearest(tab, scaled(x[i], inv)).code) : 0;
    }
    for (int j = 0; j < K; ++j) words[j] = 0;
    for (int i = 0; i < valid; ++i)
        set_bitplane_code(words, K, i, codes[i]);
    if (!finite && fmt == KBIT_ABSMAX_E4M4) return kNonFiniteE4M4;
    return over ? kOverRange : kFits;
}

// quantize_kbit_host with kbit_quantize_ex's options: importance (null: unweighted) and
// range_status (null: none; else set to 1 when a block does not fit).
template <class T, int K>
kbit_status quantize_kbit_ex_host_t(const void *input, const float *importance, int64_t n,
                                    const float *codebook, kbit_absmax_format fmt, float ts,
                                    void *absmax, uint32_t *packed, uint32_t *range_status) {
    KBIT_TRY(check_quantize(input, n, sizeof(typename T::storage), codebook, fmt, ts, absmax,
                            packed));
    KBIT_TRY(check_quantize_ex(n, importance, range_status));
    if (n == 0) return KBIT_SUCCESS;
    if (codebook)
        for (int i = 0; i < (1 << K); ++i)
            if (!std::isfinite(codebook[i]))
                return fail(KBIT_ERROR_INVALID_ARGUMENT, "codebook[%d] is not finite", i);
    if (importance)
        for (int64_t i = 0; i < n; ++i)
            if (!(importance[i] >= 0.0f && importance[i] <= kF32Max))
                return fail(KBIT_ERROR_INVALID_ARGUMENT,
                            "importance[%lld] = %g: weights must be finite and >= 0",
                            static_cast<long long>(i), static_cast<double>(importance[i]));
    const SearchTable tab = build_search_table(resolve_codebook(codebook, K), 1 << K);
    const auto *in = static_cast<const typename T::storage *>(input);
    const int64_t blocks = blocks_of(n, kBlock);
    const float rcp_ts = rcp_rn(ts);
    std::atomic<int64_t> over{0}, nonfinite{0};
    parallel_for(blocks, kBlocksPerThread, [&](int64_t first, int64_t last) {
        int64_t local_over = 0, local_nonfinite = 0;
        float x[kBlock];
        for (int64_t b = first; b < last; ++b) {
            const int valid = static_cast<int>(std::min<int64_t>(kBlock, n - b * kBlock));
            for (int i = 0; i < valid; ++i) x[i] = load_f32(T{}, in[b * kBlock + i]);
            const float *w = importance ? importance + b * kBlock : nullptr;
            const BlockFit fit = quantize_block<K>(x, w, valid, tab, fmt, ts, rcp_ts, absmax, b,
                                                    packed + b * K);
            local_over += fit == kOverRange;
            local_nonfinite += fit == kNonFiniteE4M4;
        }
        over += local_over;
        nonfinite += local_nonfinite;
    });
    if (range_status && (over || nonfinite)) *range_status = 1;
    if (nonfinite)
        return fail(KBIT_ERROR_RANGE,
                    "%lld block(s) hold NaN or Inf, which the E4M4 absmax format cannot "
                    "represent (stored as 31.0); use the fp16 or fp32 absmax format, whose "
                    "blocks dequantize to NaN",
                    static_cast<long long>(nonfinite.load()));
    if (over)
        return fail(KBIT_ERROR_RANGE,
                    "%lld block(s) exceed the absmax format's range at tensor_scale=%g "
                    "(stored clipped); use kbit_compute_tensor_scale_host",
                    static_cast<long long>(over.load()), static_cast<double>(ts));
    return KBIT_SUCCESS;
}

template <class T, int K>
kbit_status quantize_kbit_host(const void *input, int64_t n, const float *codebook,
                               kbit_absmax_format fmt, float ts, void *absmax, uint32_t *packed) {
    return quantize_kbit_ex_host_t<T, K>(input, nullptr, n, codebook, fmt, ts, absmax, packed,
                                         nullptr);
}

template <class T, int K>
kbit_status dequantize_kbit_host(const uint32_t *packed, const void *absmax, kbit_absmax_format fmt,
                            float ts, const float *codebook, int64_t n, void *output) {
    KBIT_TRY(check_dequantize(packed, absmax, fmt, ts, codebook, n, output,
                              sizeof(typename T::storage)));
    const float *cb = resolve_codebook(codebook, K);
    auto *out = static_cast<typename T::storage *>(output);
    const int64_t blocks = blocks_of(n, kBlock);
    parallel_for(blocks, kBlocksPerThread, [&](int64_t first, int64_t last) {
        float v[kBlock];
        for (int64_t b = first; b < last; ++b) {
            const int valid = static_cast<int>(std::min<int64_t>(kBlock, n - b * kBlock));
            dequantize_block_k<K>(packed + b * K, cb, block_scale(fmt, absmax, b, ts), valid, v);
            for (int i = 0; i < valid; ++i) out[b * kBlock + i] = store_cast(T{}, v[i]);
        }
    });
    return KBIT_SUCCESS;
}

kbit_status quantize_kbit_any_host(const void *input, int64_t n, kbit_dtype dtype, int k,
                                   const float *codebook, kbit_absmax_format fmt, float ts,
                                   void *absmax, uint32_t *packed) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return quantize_kbit_host<decltype(tag), kc.value>(input, n, codebook, fmt, ts,
                                                               absmax, packed);
        });
    });
}

kbit_status quantize_kbit_ex_host(const void *input, const float *importance, int64_t n,
                                  kbit_dtype dtype, int k, const float *codebook,
                                  kbit_absmax_format fmt, float ts, void *absmax,
                                  uint32_t *packed, uint32_t *range_status) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return quantize_kbit_ex_host_t<decltype(tag), kc.value>(
                input, importance, n, codebook, fmt, ts, absmax, packed, range_status);
        });
    });
}

kbit_status dequantize_kbit_any_host(const uint32_t *packed, const void *absmax,
                                     kbit_absmax_format fmt, float ts, const float *codebook,
                                     int k, int64_t n, kbit_dtype dtype, void *output) {
    return with_dtype(dtype, [&](auto tag) {
        return with_k(k, [&](auto kc) {
            return dequantize_kbit_host<decltype(tag), kc.value>(packed, absmax, fmt, ts,
                                                                 codebook, n, output);
        });
    });
}

kbit_status default_codebook_host(int k, float *codebook) {
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    KBIT_TRY(check_ptr(codebook, "codebook", 4));
    std::copy(kNormalFloat[k], kNormalFloat[k] + (1 << k), codebook);
    return KBIT_SUCCESS;
}

kbit_status codebook_host(int kind, int k, float *codebook) {
    if (kind < KBIT_CODEBOOK_NORMAL || kind > KBIT_CODEBOOK_UNIFORM)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "unknown codebook kind %d (0 normal, 1 nf0, 2 uniform)", kind);
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    KBIT_TRY(check_ptr(codebook, "codebook", 4));
    const float *const *books[] = {kNormalFloat, kNf0, kUniform};
    std::copy(books[kind][k], books[kind][k] + (1 << k), codebook);
    return KBIT_SUCCESS;
}

kbit_status compute_tensor_scale_host(const void *input, int64_t n, kbit_dtype dtype,
                                      kbit_absmax_format fmt, float *tensor_scale) {
    KBIT_TRY(check_common(n, dtype_size(dtype), fmt, 1.0f));
    if (!valid_dtype(dtype)) return fail(KBIT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", dtype);
    KBIT_TRY(check_ptr(tensor_scale, "tensor_scale", 4));
    if (n > 0) KBIT_TRY(check_ptr(input, "input", dtype_size(dtype)));
    uint32_t amax = 0;
    with_dtype(dtype, [&](auto tag) {
        const auto *in = static_cast<const typename decltype(tag)::storage *>(input);
        for (int64_t i = 0; i < n; ++i) {
            const uint32_t a = abs_bits(load_f32(tag, in[i]));
            if (bits_finite(a)) amax = std::max(amax, a);
        }
        return KBIT_SUCCESS;
    });
    *tensor_scale = tensor_scale_for(f32_from_bits(amax), fmt);
    return KBIT_SUCCESS;
}

}  // namespace
}  // namespace kbit

KBIT_KBIT_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)

extern "C" {

KBIT_API int64_t kbit_packed_words(int64_t n, int k) {
    if (n < 0 || k < 2 || k > 5) return -1;
    return kbit::blocks_of(n, kbit::kBlock) * k;
}

KBIT_API int64_t kbit_absmax_bytes(int64_t n, kbit_absmax_format absmax_format) {
    int f = static_cast<int>(absmax_format);
    if (n < 0 || f < KBIT_ABSMAX_FP32 || f > KBIT_ABSMAX_E4M4) return -1;
    return kbit::blocks_of(n, kbit::kBlock) * static_cast<int64_t>(kbit::absmax_align(absmax_format));
}

KBIT_API float kbit_e4m4_decode(uint8_t code) { return kbit::e4m4_decode(code); }

}  // extern "C"
