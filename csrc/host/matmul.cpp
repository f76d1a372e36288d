// Fused dequantize + matmul on the CPU (SPEC section 6): y = x · Wᵀ (+ bias) for a weight
// W of shape [n_out, k_in] stored in any format, read as stored. These `_host` twins of
// the GPU entries are also the reference the GPU kernels are tested against.
//
// One loop serves every format. A format contributes a row decoder: row r of W as k_in
// float32 values, exactly what its host dequantize gives for fp32 output (it calls the
// family's block decoder, shared with dequantize). run() converts x to float32 (all of
// it, or a slice of its rows for a prefill-sized x) and splits W's rows over the threads;
// each thread decodes its rows kTile at a time, once per slice of x (once per call
// unless x is prefill-sized), and takes their dot products with every row of the slice.
// Products are accumulated in float32 in a fixed order, the bias is added in float32, and
// y is rounded once to the dtype with the conversions the GPU uses (core/numeric.h).
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
constexpr int64_t kXFloats = 1 << 22;      // x converted to float32 at once (16 MiB)

// ---- row decoders: row r of W into w[0 .. k_in) -------------------------------------

// kbit: per 32 elements, k bit-plane words and one scale (SPEC section 1). kTiled: the
// tiled layout (formats/kbit_tiled.h), whose chunk words are rebuilt from the 4 lane
// segments that hold the row, then decoded as stored. K: the bits a code, fixed per call
// (with_k), so that the block decoder takes a plane byte's eight codes at once.
template <bool kTiled, int K>
struct KbitRows {
    const void *packed;
    const void *absmax;
    kbit_absmax_format fmt;
    float tensor_scale;
    const float *codebook;  // resolved: never NULL
    int64_t k_in;

    void operator()(int64_t r, float *w) const {
        const tiled::Geometry geo = tiled::geometry(r + 1, k_in);
        for (int64_t c = 0; c < geo.chunks; ++c) {
            const int64_t b = r * geo.chunks + c;  // the block, as stored
            uint32_t rebuilt[5] = {0, 0, 0, 0, 0};
            const uint32_t *words = static_cast<const uint32_t *>(packed) + b * K;
            int64_t scale = b;
            if constexpr (kTiled) {
                const int sb = static_cast<int>(absmax_align(fmt));
                const int g = static_cast<int>(r % 8), half = static_cast<int>((r % 16) / 8);
                const int u = static_cast<int>(c % tiled::kGroupChunks);
                const int64_t seg0 = ((r / tiled::kTileRows) * geo.groups +
                                      c / tiled::kGroupChunks) * tiled::kLanes;
                for (int t = 0; t < 4; ++t) {
                    const uint8_t *seg = static_cast<const uint8_t *>(packed) + (seg0 + 4 * g + t) * 8 * K;
                    for (int i = 0; i < 4; ++i)
                        tiled::set_pair(rebuilt, K, 8 * t + 2 * i,
                                        tiled::get_field(seg, K, (2 * u + half) * 4 + i));
                }
                words = rebuilt;
                scale = tiled::scale_at(geo, r, c, sb) / sb;
            }
            dequantize_block_k<K>(words, codebook, block_scale(fmt, absmax, scale, tensor_scale),
                                  kBlock, w + c * kBlock);
        }
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
//
// x is converted to float32 once, up to kXFloats at a time (all of it for decoding-sized
// m; a prefill-sized x in slices of x_rows rows, each decoding W again: one decode per
// x_rows dot products, about k_in / kXFloats of their work, at least one row a slice).
template <class T, class Rows>
void run(const Rows &rows, const void *x, int64_t m, int64_t k_in, int64_t n_out,
         const void *bias, void *y) {
    using S = typename T::storage;
    const S *xs = static_cast<const S *>(x);
    const S *bs = static_cast<const S *>(bias);
    S *ys = static_cast<S *>(y);

    // Parts: contiguous ranges of W's rows, one per thread, each with its own scratch
    // (kTile decoded rows of W), all allocated before any thread starts.
    const int64_t work_per_row = (m + 1) * k_in;  // one decode and m dot products
    const int64_t min_rows = std::max<int64_t>(1, kWorkPerPart / std::max<int64_t>(work_per_row, 1));
    const int64_t parts = std::min(max_threads(), blocks_of(n_out, min_rows));
    const int64_t chunk = blocks_of(n_out, parts);
    const int64_t x_rows = std::clamp<int64_t>(kXFloats / std::max<int64_t>(k_in, 1), 1, m);
    if (k_in > PTRDIFF_MAX / static_cast<int64_t>(sizeof(float)) / (kTile * parts + x_rows))
        throw std::bad_alloc();
    std::vector<float> scratch(static_cast<size_t>(parts * kTile * k_in));
    std::vector<float> xf(static_cast<size_t>(x_rows * k_in));

    for (int64_t i0 = 0; i0 < m; i0 += x_rows) {
        const int64_t slice = std::min(x_rows, m - i0);
        const S *xi = xs + i0 * k_in;
        parallel_for(slice * k_in, kWorkPerPart, [&](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) xf[j] = load_f32(T{}, xi[j]);
        });
        parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
            for (int64_t p = p0; p < p1; ++p) {
                float *w = scratch.data() + p * kTile * k_in;  // kTile rows of W
                const int64_t end = std::min(n_out, (p + 1) * chunk);
                for (int64_t r0 = p * chunk; r0 < end; r0 += kTile) {
                    const int64_t tile = std::min(kTile, end - r0);
                    for (int64_t t = 0; t < tile; ++t) rows(r0 + t, w + t * k_in);
                    for (int64_t i = 0; i < slice; ++i)
                        for (int64_t t = 0; t < tile; ++t)
                            store_y<T>(ys, bs, i0 + i, r0 + t, n_out,
                                       dot(xf.data() + i * k_in, w + t * k_in, k_in));
                }
            }
        });
    }
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
    return with_k(k, [&](auto kc) {
        const KbitRows<false, kc.value> rows{packed, absmax, fmt, tensor_scale,
                                             resolve_codebook(codebook, k), k_in};
        return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
    });
}

kbit_status kbit_tiled_host(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                            kbit_dtype dtype, const void *tiled_packed, const void *tiled_absmax,
                            kbit_absmax_format fmt, float tensor_scale, const float *codebook, int k,
                            const void *bias, void *y) {
    KBIT_TRY(check_matmul_kbit_tiled(x, m, k_in, n_out, dtype, tiled_packed, tiled_absmax, fmt,
                                     tensor_scale, codebook, k, bias, y));
    return with_k(k, [&](auto kc) {
        const KbitRows<true, kc.value> rows{tiled_packed, tiled_absmax, fmt, tensor_scale,
                                            resolve_codebook(codebook, k), k_in};
        return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
    });
}

// The tiled layout from the stored one and back (formats/kbit_tiled.h), segment by
// segment; scales are copied one by one. Outputs are cleared first (padding is zero).
kbit_status tile_host(const uint32_t *packed, const void *absmax, kbit_absmax_format fmt, int k,
                      int64_t n_out, int64_t k_in, void *tiled_packed, void *tiled_absmax) {
    KBIT_TRY(tiled::check_tile(packed, absmax, fmt, k, n_out, k_in, tiled_packed, tiled_absmax));
    if (n_out == 0 || k_in == 0) return KBIT_SUCCESS;
    const tiled::Geometry geo = tiled::geometry(n_out, k_in);
    const int sb = static_cast<int>(absmax_align(fmt));
    auto *out = static_cast<uint8_t *>(tiled_packed);
    std::fill(out, out + tiled::packed_bytes(n_out, k_in, k), uint8_t{0});
    parallel_for(geo.tiles * geo.groups, 64, [&](int64_t first, int64_t last) {
        for (int64_t s = first; s < last; ++s)
            for (int lane = 0; lane < tiled::kLanes; ++lane)
                tiled::tile_segment(packed, k, geo, n_out, s / geo.groups, s % geo.groups, lane,
                                    out + (s * tiled::kLanes + lane) * 8 * k);
    });
    auto *sa = static_cast<uint8_t *>(tiled_absmax);
    std::fill(sa, sa + tiled::absmax_bytes(n_out, k_in, fmt), uint8_t{0});
    const auto *src = static_cast<const uint8_t *>(absmax);
    for (int64_t r = 0; r < n_out; ++r)
        for (int64_t c = 0; c < geo.chunks; ++c)
            std::copy(src + (r * geo.chunks + c) * sb, src + (r * geo.chunks + c + 1) * sb,
                      sa + tiled::scale_at(geo, r, c, sb));
    return KBIT_SUCCESS;
}

kbit_status untile_host(const void *tiled_packed, const void *tiled_absmax, kbit_absmax_format fmt,
                        int k, int64_t n_out, int64_t k_in, uint32_t *packed, void *absmax) {
    KBIT_TRY(tiled::check_tile(packed, absmax, fmt, k, n_out, k_in, tiled_packed, tiled_absmax));
    if (n_out == 0 || k_in == 0) return KBIT_SUCCESS;
    const tiled::Geometry geo = tiled::geometry(n_out, k_in);
    const int sb = static_cast<int>(absmax_align(fmt));
    std::fill(packed, packed + n_out * geo.chunks * k, 0u);
    const auto *in = static_cast<const uint8_t *>(tiled_packed);
    parallel_for(geo.tiles * geo.groups, 64, [&](int64_t first, int64_t last) {
        for (int64_t s = first; s < last; ++s)
            for (int lane = 0; lane < tiled::kLanes; ++lane)
                tiled::untile_segment(in + (s * tiled::kLanes + lane) * 8 * k, k, geo, n_out,
                                      s / geo.groups, s % geo.groups, lane, packed);
    });
    const auto *sa = static_cast<const uint8_t *>(tiled_absmax);
    auto *dst = static_cast<uint8_t *>(absmax);
    for (int64_t r = 0; r < n_out; ++r)
        for (int64_t c = 0; c < geo.chunks; ++c) {
            const uint8_t *from = sa + tiled::scale_at(geo, r, c, sb);
            std::copy(from, from + sb, dst + (r * geo.chunks + c) * sb);
        }
    return KBIT_SUCCESS;
}

template <class Fmt>
kbit_status bnb4_host(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                      const uint8_t *packed, const float *absmax, int blocksize,
                      const void *bias, void *y) {
    KBIT_TRY(check_matmul_bnb4(x, m, k_in, n_out, dtype, packed, absmax, blocksize, bias, y));
    // two codes per byte, one float32 scale per blocksize elements (SPEC section 2)
    const auto rows = [=](int64_t r, float *w) {
        for (int64_t j = 0; j < k_in; j += blocksize) {
            const int64_t i0 = r * k_in + j;
            bnb4::dequantize_elements<Fmt>(packed, i0, i0 + blocksize, absmax[i0 / blocksize],
                                           w + j);
        }
    };
    return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
}

kbit_status gguf_host(const void *x, int64_t m, int64_t k_in, int64_t n_out, kbit_dtype dtype,
                      int ggml_type, const void *blocks, const void *bias, void *y) {
    return check_matmul_gguf(x, m, k_in, n_out, dtype, ggml_type, blocks, bias, y,
                             [&](auto fmt) {
                                 using Fmt = decltype(fmt);
                                 // whole ggml blocks (SPEC section 3)
                                 const auto *b = static_cast<const uint8_t *>(blocks);
                                 const int64_t per_row = k_in / Fmt::kElems;
                                 const auto rows = [=](int64_t r, float *w) {
                                     for (int64_t j = 0; j < per_row; ++j)
                                         gguf::dequantize_block_host<Fmt>(
                                             b + (r * per_row + j) * Fmt::kBytes,
                                             w + j * Fmt::kElems);
                                 };
                                 return checked_run(rows, x, m, k_in, n_out, dtype, bias, y);
                             });
}

}  // namespace
}  // namespace matmul
}  // namespace kbit

KBIT_MATMUL_ENTRIES(KBIT_SKIP_ENTRY, KBIT_DEFINE_ENTRY)

// The GEMM's split-K workspace for shapes with too few tiles (formats/matmul.h); 0 where
// no split is worth it. Every kernel is also correct without one.
extern "C" KBIT_API int64_t kbit_matmul_workspace_bytes(int64_t m, int64_t k_in, int64_t n_out) {
    if (m < 0 || k_in < 0 || n_out < 0) return -1;
    return kbit::matmul::gemm_workspace(m, k_in, n_out);
}

extern "C" KBIT_API int64_t kbit_tiled_packed_bytes(int64_t n_out, int64_t k_in, int k) {
    return kbit::tiled::packed_bytes(n_out, k_in, k);
}

extern "C" KBIT_API int64_t kbit_tiled_absmax_bytes(int64_t n_out, int64_t k_in,
                                                    kbit_absmax_format absmax_format) {
    return kbit::tiled::absmax_bytes(n_out, k_in, absmax_format);
}
