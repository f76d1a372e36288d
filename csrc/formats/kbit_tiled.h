// The tiled kbit layout: a one-time repack of a kbit weight W [n_out, k_in] into the
// order in which the tensor-core GEMV (csrc/matmul/gemv.cu) reads it, so that every lane
// loads only its own bytes, already in the form its table lookups take. Same bits per
// weight as the stored format, plus zero padding to whole tiles.
//
// Rows are taken 16 at a time (a tile; rows padded to a multiple of 16) and each row's
// 32-element chunks (kbit blocks) 4 at a time (a group; chunks padded to a multiple of
// 4). Per (tile, group), in tile-major then group order:
//  - packed: 32 lane segments of 8K bytes. Lane l = 4g + t holds, for chunk u = 0..3 and
//    row r = g, g + 8, the four pair indices of elements (8t + 2i, 8t + 2i + 1), i = 0..3,
//    as 2K-bit fields of a little-endian bit stream: field f = (2u + (r >= 8)) * 4 + i
//    at bit 2K f. A pair index interleaves the two codes: bit 2j is bit j of the first
//    element's code, bit 2j + 1 bit j of the second's.
//  - absmax: the 16 rows x 4 chunks scales as stored (1, 2 or 4 bytes each), row-major.
// Padding rows and chunks are zero.
#pragma once

#include "kbit.h"

namespace kbit {
namespace tiled {

constexpr int kTileRows = 16;
constexpr int kGroupChunks = 4;
constexpr int kLanes = 32;

struct Geometry {
    int64_t tiles, groups;  // row tiles, chunk groups per row
    int64_t chunks;         // chunks per row (k_in / 32)
};
KBIT_HD Geometry geometry(int64_t n_out, int64_t k_in) {
    const int64_t chunks = k_in / kBlock;
    return {(n_out + kTileRows - 1) / kTileRows, (chunks + kGroupChunks - 1) / kGroupChunks, chunks};
}

// Bytes of the tiled arrays, or -1 for bad arguments.
inline int64_t packed_bytes(int64_t n_out, int64_t k_in, int k) {
    if (n_out < 0 || k_in < 0 || k_in % kBlock != 0 || k < 2 || k > 5) return -1;
    const Geometry g = geometry(n_out, k_in);
    if (g.tiles > 0 && g.groups > INT64_MAX / g.tiles / (kLanes * 8 * k)) return -1;
    return g.tiles * g.groups * kLanes * 8 * k;
}
inline int64_t absmax_bytes(int64_t n_out, int64_t k_in, kbit_absmax_format fmt) {
    const int f = static_cast<int>(fmt);
    if (n_out < 0 || k_in < 0 || k_in % kBlock != 0 || f < KBIT_ABSMAX_FP32 || f > KBIT_ABSMAX_E4M4)
        return -1;
    const Geometry g = geometry(n_out, k_in);
    const int64_t per = kTileRows * kGroupChunks * static_cast<int64_t>(absmax_align(fmt));
    if (g.tiles > 0 && g.groups > INT64_MAX / g.tiles / per) return -1;
    return g.tiles * g.groups * per;
}

// The pair index of elements (e, e + 1) of a chunk whose K bit-plane words are w.
KBIT_HD uint32_t pair_index(const uint32_t *w, int k, int e) {
    uint32_t idx = 0;
    for (int j = 0; j < k; ++j)
        idx |= ((w[j] >> e) & 1u) << (2 * j) | ((w[j] >> (e + 1)) & 1u) << (2 * j + 1);
    return idx;
}
// The inverse: sets the bits of elements (e, e + 1) in w (whose bits there are zero).
KBIT_HD void set_pair(uint32_t *w, int k, int e, uint32_t idx) {
    for (int j = 0; j < k; ++j)
        w[j] |= ((idx >> (2 * j)) & 1u) << e | ((idx >> (2 * j + 1)) & 1u) << (e + 1);
}

// Field f of a lane segment (a little-endian bit stream of 2K-bit fields).
KBIT_HD uint32_t get_field(const uint8_t *seg, int k, int f) {
    const int bit = 2 * k * f;
    uint32_t v = 0;
    for (int b = 0; b < 2 * k; ++b) v |= ((seg[(bit + b) >> 3] >> ((bit + b) & 7)) & 1u) << b;
    return v;
}
KBIT_HD void put_field(uint8_t *seg, int k, int f, uint32_t v) {
    const int bit = 2 * k * f;
    for (int b = 0; b < 2 * k; ++b)
        seg[(bit + b) >> 3] |= static_cast<uint8_t>(((v >> b) & 1u) << ((bit + b) & 7));
}

// Calls f(row, chunk, t, field0) for every (row, chunk) of W whose pair indices lie in
// lane `lane`'s segment of (tile, group): fields field0 .. field0 + 3 of the segment hold
// the pairs of elements 8t .. 8t+7 of that row's chunk. Padding is skipped.
template <class F>
KBIT_HD void for_each_row_chunk(const Geometry &geo, int64_t n_out, int64_t tile, int64_t group,
                                int lane, F &&f) {
    const int g = lane >> 2, t = lane & 3;
    for (int u = 0; u < kGroupChunks; ++u) {
        const int64_t chunk = group * kGroupChunks + u;
        for (int half = 0; half < 2; ++half) {
            const int64_t row = tile * kTileRows + g + 8 * half;
            if (chunk < geo.chunks && row < n_out) f(row, chunk, t, (2 * u + half) * 4);
        }
    }
}

// Builds lane `lane`'s segment of (tile, group) from the stored words; seg is zeroed.
KBIT_HD void tile_segment(const uint32_t *packed, int k, const Geometry &geo, int64_t n_out,
                          int64_t tile, int64_t group, int lane, uint8_t *seg) {
    for_each_row_chunk(geo, n_out, tile, group, lane, [&](int64_t row, int64_t chunk, int t, int f0) {
        const uint32_t *w = packed + (row * geo.chunks + chunk) * k;
        for (int i = 0; i < 4; ++i) put_field(seg, k, f0 + i, pair_index(w, k, 8 * t + 2 * i));
    });
}

// The inverse for one lane segment: lane t owns bits 8t .. 8t+7 of each stored word, so
// it writes those bytes alone (no two segments write the same byte).
KBIT_HD void untile_segment(const uint8_t *seg, int k, const Geometry &geo, int64_t n_out,
                            int64_t tile, int64_t group, int lane, uint32_t *packed) {
    for_each_row_chunk(geo, n_out, tile, group, lane, [&](int64_t row, int64_t chunk, int t, int f0) {
        uint32_t w[5] = {0, 0, 0, 0, 0};
        for (int i = 0; i < 4; ++i) set_pair(w, k, 8 * t + 2 * i, get_field(seg, k, f0 + i));
        uint8_t *dst = reinterpret_cast<uint8_t *>(packed + (row * geo.chunks + chunk) * k);
        for (int j = 0; j < k; ++j) dst[4 * j + t] = static_cast<uint8_t>(w[j] >> (8 * t));
    });
}

// Byte offset of the scale of (row, chunk) in the tiled absmax array (sb bytes each).
KBIT_HD int64_t scale_at(const Geometry &geo, int64_t row, int64_t chunk, int sb) {
    const int64_t tile = row / kTileRows, group = chunk / kGroupChunks;
    return ((tile * geo.groups + group) * kTileRows * kGroupChunks +
            (row % kTileRows) * kGroupChunks + chunk % kGroupChunks) * sb;
}

// Argument checks of tile / untile (sizes from the shape).
inline kbit_status check_tile(const void *packed, const void *absmax, kbit_absmax_format fmt, int k,
                              int64_t n_out, int64_t k_in, const void *tiled_packed,
                              const void *tiled_absmax) {
    if (k < 2 || k > 5) return fail(KBIT_ERROR_INVALID_ARGUMENT, "k must be 2..5, got %d", k);
    KBIT_TRY(check_common(0, 1, fmt, 1.0f));
    if (n_out < 0 || k_in < 0 || k_in % kBlock != 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT,
                    "n_out = %lld and k_in = %lld must be >= 0 with k_in a multiple of 32",
                    static_cast<long long>(n_out), static_cast<long long>(k_in));
    if (packed_bytes(n_out, k_in, k) < 0 || absmax_bytes(n_out, k_in, fmt) < 0)
        return fail(KBIT_ERROR_INVALID_ARGUMENT, "the tiled weight exceeds the address space");
    if (n_out == 0 || k_in == 0) return KBIT_SUCCESS;
    KBIT_TRY(check_ptr(packed, "packed", 4));
    KBIT_TRY(check_ptr(absmax, "absmax", absmax_align(fmt)));
    KBIT_TRY(check_ptr(tiled_packed, "tiled_packed", 16));
    KBIT_TRY(check_ptr(tiled_absmax, "tiled_absmax", 16));
    return KBIT_SUCCESS;
}

}  // namespace tiled
}  // namespace kbit
