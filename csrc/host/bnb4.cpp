// NF4 / FP4 on the CPU: the same bytes as the GPU kernels of csrc/quant/bnb4.cu (and as
// bitsandbytes' CUDA kernels), block by block, with the shared arithmetic of formats/bnb4.h.
// Also the size helpers and the dynamic map, which need no GPU.
#include <algorithm>
#include <vector>

#include "../core/entries.h"
#include "../formats/bnb4.h"

namespace kbit {
namespace bnb4 {
namespace {

const uint32_t kRcpPlus[32] = KBIT_BNB_RCP_PLUS;
const uint32_t kRcpMinus[32] = KBIT_BNB_RCP_MINUS;

float block_rcp(float a) { return bnb_rcp(a, kRcpPlus, kRcpMinus); }

// The encoding thresholds, filled once from formats/bnb4.h.
template <class Fmt>
struct Tables {
    float thr[16];
    Tables() {
        for (int i = 0; i < 16; ++i) thr[i] = threshold(Fmt{}, i);
    }
};

template <class Fmt>
const Tables<Fmt> &tables() {
    static const Tables<Fmt> t;
    return t;
}

template <class T>
float load(const void *p, int64_t i) {
    return load_f32(T{}, static_cast<const typename T::storage *>(p)[i]);
}

template <class T>
void store(void *p, int64_t i, float v) {
    static_cast<typename T::storage *>(p)[i] = store_cast(T{}, v);
}

template <class T, class Fmt>
void quantize_blocks(const void *input, int64_t n, int bs, float *absmax, uint8_t *packed) {
    const Tables<Fmt> &tab = tables<Fmt>();
    const int64_t n_blocks = blocks_of(n, bs);
    std::vector<float> x(bs);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t i0 = b * bs;
        const int valid = static_cast<int>(std::min<int64_t>(bs, n - i0));
        float m = kFoldStart;
        for (int k = 0; k < valid; ++k) {
            x[k] = load<T>(input, i0 + k);
            m = fold_abs(m, x[k]);
        }
        for (int k = valid; k < bs; ++k) x[k] = 0.0f;     // padding, as bitsandbytes
        if (valid < bs) m = fold_abs(m, 0.0f);
        absmax[b] = m;
        const float inv = block_rcp(m);
        const int bytes = (valid + 1) / 2;
        for (int j = 0; j < bytes; ++j) {
            const int hi = encode(Fmt{}, tab.thr, bnb_mul(x[2 * j], inv));
            const int lo = encode(Fmt{}, tab.thr, bnb_mul(x[2 * j + 1], inv));
            packed[i0 / 2 + j] = static_cast<uint8_t>((hi << 4) | lo);
        }
    }
}

// Writes the n outputs of blocks whose scale scale(b) gives.
template <class T, class Fmt, class Scale>
void dequantize_blocks(const uint8_t *packed, const Scale &scale, int64_t n, int bs, void *output) {
    const int64_t n_blocks = blocks_of(n, bs);
    std::vector<float> v(bs);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t i0 = b * bs, i1 = std::min<int64_t>(n, i0 + bs);
        dequantize_elements<Fmt>(packed, i0, i1, scale(b), v.data());
        for (int64_t i = i0; i < i1; ++i) store<T>(output, i, v[i - i0]);
    }
}

struct PlainScale {
    const float *absmax;
    float operator()(int64_t b) const { return absmax[b]; }
};

struct DqScale {
    const uint8_t *qabsmax;
    const float *absmax2;
    const float *code;
    float offset;
    float operator()(int64_t b) const {
        return add_rn(bnb_mul(code[qabsmax[b]], absmax2[b / kDqBlock]), offset);
    }
};

template <class Fmt, class T>
kbit_status quantize_host(const void *input, int64_t n, int blocksize, float *absmax,
                          uint8_t *packed) {
    KBIT_TRY(check_quantize(input, n, sizeof(typename T::storage), blocksize, absmax, packed));
    quantize_blocks<T, Fmt>(input, n, blocksize, absmax, packed);
    return KBIT_SUCCESS;
}

template <class Fmt, class T>
kbit_status dequantize_host(const uint8_t *packed, const float *absmax, int64_t n, int blocksize,
                            void *output) {
    KBIT_TRY(check_dequantize(packed, absmax, n, blocksize, output, sizeof(typename T::storage)));
    dequantize_blocks<T, Fmt>(packed, PlainScale{absmax}, n, blocksize, output);
    return KBIT_SUCCESS;
}

template <class Fmt, class T>
kbit_status dequantize_dq_host(const uint8_t *packed, const uint8_t *qabsmax,
                               const float *absmax2, const float *code, const float *offset,
                               int64_t n, int blocksize, void *output) {
    KBIT_TRY(check_dequantize_dq(packed, qabsmax, absmax2, code, offset, n, blocksize, output,
                                 sizeof(typename T::storage)));
    if (n == 0) return KBIT_SUCCESS;
    const DqScale scale{qabsmax, absmax2, code ? code : dynamic_map(), *offset};
    dequantize_blocks<T, Fmt>(packed, scale, n, blocksize, output);
    return KBIT_SUCCESS;
}

kbit_status dynamic_map_host(float *code) {
    KBIT_TRY(check_ptr(code, "code", 4));
    const float *map = dynamic_map();
    std::copy(map, map + kDynamicEntries, code);
    return KBIT_SUCCESS;
}

kbit_status absmax_mean_host(const float *absmax, int64_t count, float *mean) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_ptr(mean, "mean", 4));
    // The GPU kernel's order: 1024 strided partial sums, then a pairwise tree.
    constexpr int kParts = 1024;
    std::vector<double> part(kParts, 0.0);
    for (int t = 0; t < kParts; ++t)
        for (int64_t i = t; i < count; i += kParts) part[t] += static_cast<double>(absmax[i]);
    for (int w = kParts / 2; w > 0; w >>= 1)
        for (int t = 0; t < w; ++t) part[t] += part[t + w];
    *mean = canonical_nan(static_cast<float>(part[0] / static_cast<double>(count)));
    return KBIT_SUCCESS;
}

kbit_status quantize_absmax_host(const float *absmax, int64_t count, const float *code,
                                 const float *offset, uint8_t *qabsmax, float *absmax2) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    KBIT_TRY(check_dq_state(qabsmax, absmax2, code, offset));
    const float *map = code ? code : dynamic_map();
    const float off = *offset;
    const int64_t blocks = blocks_of(count, kDqBlock);
    float v[kDqBlock];
    for (int64_t j = 0; j < blocks; ++j) {
        const int64_t i0 = j * kDqBlock;
        const int valid = static_cast<int>(std::min<int64_t>(kDqBlock, count - i0));
        float m = kFoldStart;
        for (int k = 0; k < valid; ++k) {
            v[k] = sub_rn(absmax[i0 + k], off);
            m = fold_abs(m, v[k]);
        }
        if (valid < kDqBlock) m = fold_abs(m, 0.0f);  // zero padding, as bitsandbytes
        absmax2[j] = m;
        const float inv = block_rcp(m);
        for (int k = 0; k < valid; ++k)
            qabsmax[i0 + k] = static_cast<uint8_t>(encode_dynamic(map, bnb_mul(v[k], inv)));
    }
    return KBIT_SUCCESS;
}

kbit_status dequantize_absmax_host(const uint8_t *qabsmax, const float *absmax2,
                                   const float *code, const float *offset, int64_t count,
                                   float *absmax) {
    KBIT_TRY(check_n(count, sizeof(float)));
    if (count == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_dq_state(qabsmax, absmax2, code, offset));
    KBIT_TRY(check_ptr(absmax, "absmax", 4));
    const DqScale scale{qabsmax, absmax2, code ? code : dynamic_map(), *offset};
    for (int64_t i = 0; i < count; ++i) absmax[i] = canonical_nan(scale(i));
    return KBIT_SUCCESS;
}

kbit_status to_kbit_host(const uint8_t *packed, const float *absmax, int64_t n, int blocksize,
                         kbit_absmax_format fmt, uint32_t *kbit_packed, void *kbit_absmax) {
    KBIT_TRY(check_to_kbit(packed, absmax, n, blocksize, fmt, kbit_packed, kbit_absmax));
    if (n == 0) return KBIT_SUCCESS;
    for (int64_t i = 0; fmt == KBIT_ABSMAX_FP16 && i < blocks_of(n, blocksize); ++i)
        if (beyond_half(absmax[i]))  // nothing written
            return fail(KBIT_ERROR_RANGE,
                        "absmax[%lld] = %g is beyond half's range; use KBIT_ABSMAX_FP32",
                        static_cast<long long>(i), static_cast<double>(absmax[i]));
    for (int64_t b = 0; b < blocks_of(n, 32); ++b)
        block_to_kbit(packed, absmax, n, blocksize, fmt, b, kbit_packed, kbit_absmax);
    return KBIT_SUCCESS;
}

}  // namespace
}  // namespace bnb4
}  // namespace kbit

KBIT_BNB4_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)

extern "C" {

KBIT_API int64_t kbit_nf4_packed_bytes(int64_t n) { return n < 0 ? -1 : n / 2 + (n & 1); }

KBIT_API int64_t kbit_nf4_absmax_count(int64_t n, int blocksize) {
    if (n < 0 || !kbit::bnb4::valid_blocksize(blocksize)) return -1;
    return kbit::blocks_of(n, blocksize);
}

KBIT_API int64_t kbit_nf4_absmax2_count(int64_t count) {
    return count < 0 ? -1 : kbit::blocks_of(count, kbit::bnb4::kDqBlock);
}

}  // extern "C"
