// Fused dequantize + matmul on the CPU (SPEC section 6): y = x · Wᵀ (+ bias) for a weight
// W of shape [n_out, k_in] stored in any format, read as stored. These `_host` twins of
// the GPU entries are also the reference the GPU kernels are tested against.
//
// One loop serves every format. A format contributes a row decoder: row r of W as k_in
// float32 values, exactly what its host dequantize gives for fp32 output (it calls the
// family's block decoder, shared with dequantize). run() splits W's rows over the
// threads; each thread decodes its rows kTile at a time, once per call, and takes their
// dot products with every row of x (converted to float32 once per tile). Products are
// accumulated in float32 in a fixed order, the bias is added in float32, and y is
// rounded once to the dtype with the conversions the GPU uses (core/numeric.h).
#include <algorithm>
#include <new>
#include <vector>

#include "../core/dispatch.h"
#include "../core/entries.h"
#include "../formats/matmul.h"
#include "parallel.h"

namespace kbit {
namespace matmul {
namespace {

constexpr int64_t kTile = 8;               // rows of W decoded together
constexpr int kLanes = 8;                  // interleaved partial sums of a dot product
constexpr int64_t kWorkPerPart = 1 << 20;  // multiply-adds worth starting a thread for

// ---- row decoders: row r of W into w[0 .. k_in) -------------------------------------

// kbit: per 32 elements, k bit-plane words and one scale (SPEC section 1).
struct KbitRows {
    const uint32_t *packed;
    const void *absmax;
    kbit_absmax_format fmt;
    float tensor_scale;
    const float *codebook;  // resolved: never NULL
    int k;
    int64_t k_in;

    void operator()(int64_t r, float *w) const {
        const int64_t per_row = k_in / kBlock;
        for (int64_t j = 0; j < per_row; ++j) {
            const int64_t b = r * per_row + j;
            dequantize_block(packed + b * k, k, codebook, block_scale(fmt, absmax, b, tensor_scale),
                             kBlock, w + j * kBlock);
        }
    }
};

// NF4 / FP4: two codes per byte, one float32 scale per blocksize elements (SPEC section 2).
template <class Fmt>
struct Bnb4Rows {
    const uint8_t *packed;
    const float *absmax;
    int blocksize;
    int64_t k_in;

    void operator()(int64_t r, float *w) const {
        for (int64_t j = 0; j < k_in; j += blocksize) {
            const int64_t i0 = r * k_in + j;
            bnb4::dequantize_elements<Fmt>(packed, i0, i0 + blocksize, absmax[i0 / blocksize],
                                           w + j);
        }
    }
};

// GGUF: whole ggml blocks (SPEC section 3).
template <class Fmt>
struct GgufRows {
    const uint8_t *blocks;
    int64_t k_in;

    void operator()(int64_t r, float *w) const {
        const int64_t per_row = k_in / Fmt::kElems;
        for (int64_t j = 0; j < per_row; ++j)
            gguf::dequantize_block_host<Fmt>(blocks + (r * per_row + j) * Fmt::kBytes,
                                             w + j * Fmt::kElems);
    }
};

// ---- the loop every format shares -----------------------------------------------------

// sum of x[j] * w[j] for j < n (a multiple of kLanes), in float32 in a fixed order:
// kLanes interleaved partial sums (independent, so the compiler may keep them in one
// vector register), then added pairwise.
float dot(const float *x, const float *w, int64_t n) {
    float acc[kLanes] = {};
    for (int64_t j = 0; j < n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l] * w[j + l];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y[m, n_out] = x[m, k_in] · Wᵀ (+ bias) with rows(r, w) decoding row r of W. Arguments
// are valid (checked by the entry) and m * n_out > 0.
template <class T, class Rows>
void run(const Rows &rows, const void *x, int64_t m, int64_t k_in, int64_t n_out,
         const void *bias, void *y) {
    using S = typename T::storage;
    const S *xs = static_cast<const S *>(x);
    const S *bs = static_cast<const S *>(bias);
    S *ys = static_cast<S *>(y);

    // Parts: contiguous ranges of W's rows, one per thread, each with its own scratch
    // (kTile decoded rows of W and one row of x), all allocated before any thread starts.
    const int64_t work_per_row = (m + 1) * k_in;  // one decode and m dot products
    const int64_t min_rows = std::max<int64_t>(1, kWorkPerPart / std::max<int64_t>(work_per_row, 1));
    const int64_t parts = std::min(max_threads(), blocks_of(n_out, min_rows));
    const int64_t chunk = blocks_of(n_out, parts);
    const int64_t stride = (kTile + 1) * k_in;  // floats of scratch per part
    if (k_in > PTRDIFF_MAX / static_cast<int64_t>(sizeof(float)) / ((kTile + 1) * parts))
        throw std::bad_alloc();
    std::vector<float> scratch(static_cast<size_t>(parts * stride));

    parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
            float *w = scratch.data() + p * stride;  // kTile rows of W
            float *xf = w + kTile * k_in;            // one row of x
            const int64_t end = std::min(n_out, (p + 1) * chunk);
            for (int64_t r0 = p * chunk; r0 < end; r0 += kTile) {
                const int64_t tile = std::min(kTile, end - r0);
                for (int64_t t = 0; t < tile; ++t) rows(r0 + t, w + t * k_in);
                for (int64_t i = 0; i < m; ++i) {
                    for (int64_t j = 0; j < k_in; ++j) xf[j] = load_f32(T{}, xs[i * k_in + j]);
                    for (int64_t t = 0; t < tile; ++t) {
                        float acc = dot(xf, w + t * k_in, k_in);
                        if (bs) acc += load_f32(T{}, bs[r0 + t]);
                        ys[i * n_out + r0 + t] = store_cast(T{}, acc);
                    }
                }
            }
        }
    });
}

// Checks x, bias and y, then runs the loop for the dtype (a no-op when y is empty).
template <class Rows>
kbit_status checked_run(const Rows &rows, const void *x, int64_t m, int64_t k_in, int64_t n_out,
                        kbit_dtype dtype, const void *bias, void *y) {
    if (m == 0 || n_out == 0) return KBIT_SUCCESS;
    return with_dtype(dtype, [&](auto tag) {
        run<decltype(tag)>(rows, x, m, k_in, n_out, bias, y);
        return KBIT_SUCCESS;
    });
}

// ---- one function per family: its checks (formats/matmul.h) and its row decoder ------------

kbit_status kbit_host(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                      const uint32_t *packed, const void *absmax, kbit_absmax_format fmt,
                      float tensor_scale, const float *codebook, int k, const void *bias,
                      void *y) {
    KBIT_TRY(check_matmul_kbit(x, m, k_in, n_out, dtype, packed, absmax, fmt, tensor_scale,
                               codebook, k, bias, y));
    const KbitRows rows{packed, absmax, fmt, tensor_scale, resolve_codebook(codebook, k), k, k_in};
    return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
}

template <class Fmt>
kbit_status bnb4_host(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                      const uint8_t *packed, const float *absmax, int blocksize,
                      const void *bias, void *y) {
    KBIT_TRY(check_matmul_bnb4(x, m, k_in, n_out, dtype, packed, absmax, blocksize, bias, y));
    const Bnb4Rows<Fmt> rows{packed, absmax, blocksize, k_in};
    return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
}

kbit_status gguf_host(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                      int ggml_type, const void *blocks, const void *bias, void *y) {
    return check_matmul_gguf(x, m, k_in, n_out, dtype, ggml_type, blocks, bias, y,
                             [&](auto fmt) {
                                 using Fmt = decltype(fmt);
                                 const GgufRows<Fmt> rows{static_cast<const uint8_t *>(blocks),
                                                          k_in};
                                 return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
                             });
}

}  // namespace
}  // namespace matmul
}  // namespace kbit

KBIT_MATMUL_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)

// No shape needs a workspace yet: every matmul kernel is correct and complete without one.
extern "C" KBIT_API int64_t kbit_matmul_workspace_bytes(int64_t m, int64_t k_in, int64_t n_out) {
    return (m < 0 || k_in < 0 || n_out < 0) ? -1 : 0;
}
