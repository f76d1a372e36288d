// Tensor-core GEMM for m >= kGemmMinM rows of x (batched decoding, prefill): y = x · Wᵀ
// with W decoded on its way from memory to the mma, never written back. Included by
// gemv.cu after the pair decoders it shares with the GEMV kernels.
//
// A CTA of 8 warps owns kGemmRows = 128 rows of W and BM rows of x (16, 32 or 128,
// by m: formats/matmul.h) and walks k in stages of 64 elements (two kbit blocks):
//   1. cp.async brings the stage's x tile and, for kbit (stored or tiled) / NF4 / FP4,
//      the raw bytes of its W rows and their scale windows into a ring of kRing slots;
//   2. the CTA decodes the raw W into a tile of fp16/bf16 pairs (the codebook over its
//      largest |entry|, exactly the GEMV's pair tables) and the rows' float32 chunk
//      scales; GGUF is decoded straight from global memory by its group decoders, one
//      stage ahead in registers, with the scales inside the values;
//   3. warps multiply with ldmatrix + mma.sync m16n8k16, x as the A operand and W as B
//      ([n][k] is the "col" layout), every 32-element chunk into fresh accumulators that
//      the chunk's scale adds in float32 (so that no scale ever meets fp16's range).
// Tiles are swizzled by 16-byte units (unit u of row r at u ^ (r % 8)) so that ldmatrix
// and the decoder's stores are free of bank conflicts. With a workspace, shapes with few
// tiles split k: every split but the last writes its partial tile, the last (once a
// counter per tile says the others are in) adds them in split order (deterministic),
// writes y and leaves the workspace zero (sum_splits, decoders.cuh).

namespace gemm {


constexpr int kBK = kGemmStageK;                // 64: k of a stage
constexpr int kUnits = kBK * 2 / 16;            // 16-byte units of a tile row (8)
constexpr int kTileBytes = kGemmRows * kBK * 2; // a decoded W tile (16 KB)

// 16-byte unit u of row r sits at u ^ f(r % 8), f = 0 4 1 5 2 6 3 7: eight consecutive rows
// at one unit (an ldmatrix) and one row's eight units (the stored decoder's stores) fill
// all banks, and so do rows g, g + 1 at units 4u .. 4u + 3 (the tiled decoder's).
__host__ __device__ constexpr int swizzle(int row, int unit) {
    return unit ^ (((row >> 1) & 3) | ((row & 1) << 2));
}

// Warps over the CTA tile: 128 rows of x as 2 x 4 warps, fewer rows as 1 x 8.
template <int BM>
struct Shape {
    static constexpr int kWarpsN = BM == 128 ? 4 : 8;     // warps along W's rows
    static constexpr int kWarpsM = kWarps / kWarpsN;
    static constexpr int MT = BM / 16 / kWarpsM;          // m16 tiles of a warp
    static constexpr int NT = kGemmRows / 8 / kWarpsN;    // n8 tiles of a warp (2 or 4)
};



__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// What a direct decoder loads a stage ahead (its Raw); staged decoders load nothing.
template <class Dec, class = void>
struct RawOf { using type = uint4; };
template <class Dec>
struct RawOf<Dec, std::void_t<typename Dec::Raw>> { using type = typename Dec::Raw; };

// Shared memory: [pair table][2 decoded W tiles][2 x 128 x 2 float chunk scales]
// [ring slots of: x tile (BM x 128 bytes) | raw W rows | raw scale windows (16 B a row)].
// A tiled stage is 8 row tiles x 32 lanes x half a segment (4K bytes), as many bytes as
// 128 stored rows of two chunks.
template <class Dec, int kSrc>
constexpr int raw_row_bytes() {
    if constexpr (kSrc != kDirect) return (2 * Dec::kChunkBytes + 15) / 16 * 16;
    else return 0;
}
template <class Dec, int kSrc>
__host__ __device__ constexpr int slot_bytes(int bm) {
    return bm * kBK * 2 + (kSrc != kDirect ? kGemmRows * (raw_row_bytes<Dec, kSrc>() + 16) : 0);
}
template <class Dec, int kSrc>
__host__ __device__ constexpr int table_bytes_of(int copies) {
    if constexpr (kSrc != kDirect) return 4 * Dec::kEntries * copies;
    else return 0;
}

// A CTA's ring slots and pair table copies, within kBudget bytes of shared memory: the
// deepest ring (4 slots, 3 stages in flight, down to 2) that fits beside 8 copies of the
// table (or all of them, where fewer), then the most copies that fit beside that ring (at
// least 4: fill_table stores 16 bytes of copies at a time). kSmemLarge is sm_80's opt-in
// limit (163 KB; sm_90 takes the same CTAs), kSmemSmall that of sm_86 / 89 / 120 (99 KB),
// each less 1 KB for static shared memory. (With the full table and ring, K = 5 at BM =
// 128 asked 194 KB, and on 99 KB K = 2..5 and NF4 / FP4 failed to launch from BM = 16..128.)
constexpr int kSmemLarge = 162 * 1024, kSmemSmall = 98 * 1024;
template <class Dec, int kSrc, int BM, int kBudget>
struct Fit {
    static constexpr int bytes(int copies, int ring) {
        return table_bytes_of<Dec, kSrc>(copies) + 2 * kTileBytes + 2 * kGemmRows * 2 * 4 +
               ring * slot_bytes<Dec, kSrc>(BM);
    }
    struct Choice {
        int copies, ring;
    };
    static constexpr Choice choose() {
        int full = 1;
        if constexpr (kSrc != kDirect) full = table_copies<Dec::kEntries>();
        Choice c{full < 8 ? full : 8, 4};
        while (c.ring > 2 && bytes(c.copies, c.ring) > kBudget) --c.ring;
        c.copies = full;
        while (c.copies > 4 && bytes(c.copies, c.ring) > kBudget) c.copies /= 2;
        return c;
    }
    static constexpr int kCopies = choose().copies, kRing = choose().ring;
    static constexpr int kBytes = bytes(kCopies, kRing);
    static constexpr bool kFits = kBytes <= kBudget;
    static_assert(kSrc == kDirect || kCopies >= 4, "fill_table stores four copies at a time");
};


// Dec: a pair decoder with a table (KbitAnyScale, Bnb4Staged; TiledScale for kTiled), or
// FloatDirect for kDirect. kWUnit: bytes of each cp.async of stored W (16 or 4, as the
// rows' alignment allows).
template <class T, class Dec, int kSrc, int BM, int kWUnit, int kRing, int kCopies>
__global__ void __launch_bounds__(kThreads)
gemm_kernel(Dec dec, const float *__restrict__ codebook, int k,
            const typename T::storage *__restrict__ x, int64_t m, int64_t k_in, int64_t n_out,
            const typename T::storage *__restrict__ bias, typename T::storage *__restrict__ y,
            int splits, float *__restrict__ partials, unsigned *__restrict__ counters) {
    using S = Shape<BM>;
    constexpr int MT = S::MT, NT = S::NT;
    constexpr bool kStaged = kSrc != kDirect;
    constexpr int kRawRow = raw_row_bytes<Dec, kSrc>();
    constexpr int kSlot = slot_bytes<Dec, kSrc>(BM);
    extern __shared__ uint4 smem[];
    uint8_t *base = reinterpret_cast<uint8_t *>(smem);
    uint32_t *table = reinterpret_cast<uint32_t *>(base);
    uint8_t *wtile = base + table_bytes_of<Dec, kSrc>(kCopies);
    float *wscale = reinterpret_cast<float *>(wtile + 2 * kTileBytes);  // [2][128][2]
    uint8_t *ring = reinterpret_cast<uint8_t *>(wscale + 2 * kGemmRows * 2);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp / S::kWarpsN, wn = warp % S::kWarpsN;

    float scale_mul = 1.0f;
    if constexpr (kStaged) {
        scale_mul = fill_pair_table<Dec, kCopies>(table, codebook, k);
        if constexpr (Dec::kUsesCodebook) dec.scale_mul *= scale_mul;
    }
    const auto my_table = [&] {
        if constexpr (kStaged) return lane_table<kCopies>(table);
        else return 0;
    }();

    const int64_t chunks = k_in / kChunk;
    const int64_t stages = (chunks + 1) / 2;
    const int64_t tile = blockIdx.x;
    const TileOrigin origin = tile_origin(tile, m, n_out, BM);
    const int64_t n0 = origin.n0, m0 = origin.m0;
    const int split = blockIdx.y;
    const int64_t s_begin = stages * split / splits, s_end = stages * (split + 1) / splits;
    const int m_rows = static_cast<int>(m - m0 < BM ? m - m0 : BM);
    const auto *xb = reinterpret_cast<const uint8_t *>(x);

    // The decoder's share of a stage: unit u = tid % 8 (chunk u / 4, lane slot t = u % 4)
    // of W rows tid / 8 + 32 j.
    const int du = tid & 7, dchunk = du >> 2, dt = du & 3;
    constexpr int kDecRows = kGemmRows * kUnits / kThreads;  // 4
    int64_t drow[kDecRows];
#pragma unroll
    for (int j = 0; j < kDecRows; ++j) drow[j] = min(n0 + (tid >> 3) + 32 * j, n_out - 1);

    // What each thread copies of every stage, fixed for the kernel (only the stage's k
    // offset moves): x units (row, 16-byte unit), W units of the stored rows (row, unit),
    // the 4-byte scale words of rows' windows. Rows past m or n_out read row m - 1 /
    // n_out - 1 (x: zero-filled; W: decoded, never stored).
    constexpr int kXCopies = (BM * kUnits + kThreads - 1) / kThreads;
    const uint8_t *x_src[kXCopies];
    uint32_t x_dst[kXCopies];
    bool x_live[kXCopies];
#pragma unroll
    for (int i = 0; i < kXCopies; ++i) {
        const int u = tid + i * kThreads, row = (u / kUnits) % BM, q = u % kUnits;
        x_live[i] = u < BM * kUnits && row < m_rows;
        x_src[i] = xb + ((m0 + (row < m_rows ? row : 0)) * k_in) * 2 + q * 16;
        x_dst[i] = row * (kBK * 2) + swizzle(row, q) * 16;
    }
    constexpr int kWUnits = kSrc == kStored ? kRawRow / kWUnit : 1;  // of a stored row's stage
    constexpr int kWCopies = kSrc == kStored ? (kGemmRows * kWUnits + kThreads - 1) / kThreads : 0;
    const uint8_t *w_src[kWCopies > 0 ? kWCopies : 1];
    int w_q[kWCopies > 0 ? kWCopies : 1];
    if constexpr (kSrc == kStored) {
#pragma unroll
        for (int i = 0; i < kWCopies; ++i) {
            const int u = tid + i * kThreads, row = u / kWUnits, q = u % kWUnits;
            w_q[i] = row < kGemmRows ? q : kWUnits;  // kWUnits: no copy
            w_src[i] = dec.packed + (min(n0 + row, n_out - 1) * chunks) * Dec::kChunkBytes +
                       q * kWUnit;
        }
    }
    constexpr int kSCopies = kStaged ? kGemmRows * 4 / kThreads : 0;  // 2
    const int64_t s_row = min(n0 + tid / 4, n_out - 1);  // scale words: rows tid/4 (+64)
    const int64_t s_row2 = min(n0 + tid / 4 + 64, n_out - 1);

    // Issues stage s into ring slot s % kRing (one commit group a call, empty past the
    // end); a stage's second chunk past k_in is zero-filled.
    auto issue = [&](int64_t s) {
        if (s < s_end) {
            uint8_t *slot = ring + static_cast<int>(s % kRing) * kSlot;
            const uint32_t slot_a = smem_address(slot);
            const int64_t c0 = 2 * s;
            const bool both = c0 + 1 < chunks;
#pragma unroll
            for (int i = 0; i < kXCopies; ++i) {
                if (kXCopies * kThreads > BM * kUnits && tid + i * kThreads >= BM * kUnits) continue;
                const int q = (tid + i * kThreads) % kUnits;
                const bool live = x_live[i] && (both || q < kUnits / 2);
                cp_async16(slot_a + x_dst[i], x_src[i] + c0 * kChunk * 2, live ? 16 : 0);
            }
            const uint32_t raw_a = slot_a + BM * kBK * 2;
            if constexpr (kSrc == kTiled) {
                // Half segment s % 2 of group s / 2 of every lane of the 8 row tiles, in
                // (tile, lane) order; tiles past the padded rows read as zeros.
                constexpr int kHalf = 4 * Dec::kK;
                const int j = tid >> 5, ln = tid & 31;  // kThreads = 8 tiles x 32 lanes
                const int64_t tl = n0 / 16 + j;
                const bool live = tl < dec.geo.tiles;
                const int64_t seg = ((live ? tl : 0) * dec.geo.groups + (s >> 1)) * 32 + ln;
                cp_async_bytes<kHalf>(raw_a + tid * kHalf, dec.packed + seg * (2 * kHalf) + (s & 1) * kHalf,
                                      live);
            } else if constexpr (kSrc == kStored) {
                const int limit = (both ? 2 : 1) * Dec::kChunkBytes;
#pragma unroll
                for (int i = 0; i < kWCopies; ++i) {
                    const int u = tid + i * kThreads;
                    if (w_q[i] * kWUnit >= limit) continue;
                    const uint32_t dst = raw_a + (u / kWUnits) * kRawRow + w_q[i] * kWUnit;
                    const uint8_t *src = w_src[i] + c0 * Dec::kChunkBytes;
                    if constexpr (kWUnit == 16) cp_async16(dst, src, 16);
                    else cp_async4(dst, src, 4);
                }
            }
            if constexpr (kStaged) {  // the 4 words from the one holding a row's first scale
                const uint32_t scales_a = raw_a + kGemmRows * kRawRow;
#pragma unroll
                for (int i = 0; i < kSCopies; ++i) {
                    const int row = tid / 4 + 64 * i, q = tid % 4;
                    const int64_t first = scale_of<kSrc>(dec, i ? s_row2 : s_row, c0, chunks);
                    const int64_t off = first / 4 * 4 + 4 * q;
                    cp_async4(scales_a + row * 16 + 4 * q, dec.absmax + (off < dec.absmax_bytes ? off : 0),
                              inside(off, dec.absmax_bytes, 4));
                }
            }
        }
        cp_async_commit();
    };

    // Direct decoders: the next stage's raw values in registers.
    typename RawOf<Dec>::type raw_next[kDecRows];
    auto load_direct = [&](int64_t s) {
        if constexpr (!kStaged) {
            const int64_t c = 2 * s + dchunk;
            if (s < s_end && c < chunks) {
#pragma unroll
                for (int j = 0; j < kDecRows; ++j) raw_next[j] = dec.load(drow[j] * chunks + c, dt);
            }
        }
    };

    // Decodes stage s into tile buffer s % 2: pairs of T (zero past k_in) and, staged,
    // the float32 scale of each row's two chunks.
    // Decodes stage s into tile buffer s % 2: pairs of T, zero past k_in (the raw bytes
    // there are stale, so they are replaced, not branched around), and, staged, the
    // float32 scales of the 128 rows' two chunks: one a thread (row tid / 2, chunk tid % 2).
    auto decode = [&](int64_t s) {
        uint8_t *tile_out = wtile + (s & 1) * kTileBytes;
        const uint8_t *slot = ring + static_cast<int>(s % kRing) * kSlot + BM * kBK * 2;
        if constexpr (kStaged) {
            const int row = tid >> 1, ch = tid & 1;
            const int64_t r = min(n0 + row, n_out - 1);
            const int64_t first = scale_of<kSrc>(dec, r, 2 * s, chunks);
            const uint8_t *win = slot + kGemmRows * kRawRow + row * 16 + (first & 3);
            const float f = dec.scale(win + (scale_of<kSrc>(dec, r, 2 * s + ch, chunks) - first));
            wscale[(s & 1) * kGemmRows * 2 + tid] = 2 * s + ch < chunks ? f : 0.0f;
        }
        auto put = [&](int row, int unit, uint32_t (&p)[4], bool valid) {
            if (!valid) p[0] = p[1] = p[2] = p[3] = 0u;
            *reinterpret_cast<uint4 *>(tile_out + row * (kBK * 2) + swizzle(row, unit) * 16) =
                make_uint4(p[0], p[1], p[2], p[3]);
        };
        if constexpr (kSrc == kTiled) {
            // Thread (tile j, lane g, t): rows 16 j + g, 16 j + g + 8 of both chunks, elements
            // 8t .. 8t+7: fields 8 u + 4 h + i of its half segment (u chunk, h row half).
            constexpr int K = Dec::kK;
            uint32_t w[K];
            load_words(slot + tid * 4 * K, w);
            const int j = tid >> 5, tg = (tid & 31) >> 2, tt = tid & 3;
            tiled_pairs(w, my_table, [&](int u, int h, uint32_t (&p)[4]) {
                put(16 * j + tg + 8 * h, 4 * u + tt, p, 2 * s + u < chunks);
            });
        } else {
            const bool valid = 2 * s + dchunk < chunks;
#pragma unroll
            for (int j = 0; j < kDecRows; ++j) {
                const int row = (tid >> 3) + 32 * j;
                uint32_t p[4];
                if constexpr (kStaged)
                    dec.pairs(slot + row * kRawRow + dchunk * Dec::kChunkBytes, dt, my_table, p);
                else
                    dec.pairs(raw_next[j], p);
                put(row, du, p, valid);
            }
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    // ldmatrix addresses: A (x) rows wm * MT * 16 + lane % 16, k unit lane / 16; B (W)
    // rows wn * NT * 8 + lane % 8 + (lane / 16) * 8, k unit (lane / 8) % 2.
    const int a_row = wm * MT * 16 + (lane & 15), a_unit = lane >> 4;
    const int b_row = wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3), b_unit = (lane >> 3) & 1;

    auto multiply = [&](int64_t s) {
        const uint8_t *xs = ring + static_cast<int>(s % kRing) * kSlot;
        const uint8_t *ws = wtile + (s & 1) * kTileBytes;
        const uint32_t xs_a = smem_address(xs), ws_a = smem_address(ws);
#pragma unroll
        for (int ch = 0; ch < 2; ++ch) {
            uint32_t a[2][MT][4], b[2][NT][2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int unit = (2 * ch + h) * 2;
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    const int row = a_row + 16 * i;
                    ldmatrix_x4(a[h][i], xs_a + row * (kBK * 2) + swizzle(row, unit + a_unit) * 16);
                }
#pragma unroll
                for (int j = 0; j < NT / 2; ++j) {
                    const int row = b_row + 16 * j;
                    uint32_t r[4];
                    ldmatrix_x4(r, ws_a + row * (kBK * 2) + swizzle(row, unit + b_unit) * 16);
                    b[h][2 * j][0] = r[0], b[h][2 * j][1] = r[1];
                    b[h][2 * j + 1][0] = r[2], b[h][2 * j + 1][1] = r[3];
                }
            }
            if constexpr (kStaged) {
                // C columns 2t, 2t+1 of n-tile j are W rows b0 + 8j + 2t (+1).
                const float *sc = wscale + (s & 1) * kGemmRows * 2;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int r = wn * NT * 8 + 8 * j + 2 * t;
                    const float f0 = sc[r * 2 + ch], f1 = sc[(r + 1) * 2 + ch];
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_16816(T{}, c, a[0][i], b[0][j][0], b[0][j][1]);
                        mma_16816(T{}, c, a[1][i], b[1][j][0], b[1][j][1]);
                        acc[i][j][0] = fmaf(f0, c[0], acc[i][j][0]);
                        acc[i][j][1] = fmaf(f1, c[1], acc[i][j][1]);
                        acc[i][j][2] = fmaf(f0, c[2], acc[i][j][2]);
                        acc[i][j][3] = fmaf(f1, c[3], acc[i][j][3]);
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        mma_16816(T{}, acc[i][j], a[0][i], b[0][j][0], b[0][j][1]);
                        mma_16816(T{}, acc[i][j], a[1][i], b[1][j][0], b[1][j][1]);
                    }
            }
        }
    };

    // The main loop: two barriers a stage. After the first, stage s has landed and every
    // warp is done with stage s - 1, whose ring slot and tile buffer s - 1 may be reused.
#pragma unroll
    for (int i = 0; i < kRing - 1; ++i) issue(s_begin + i);
    load_direct(s_begin);
    for (int64_t s = s_begin; s < s_end; ++s) {
        cp_async_wait<kRing - 2>();
        __syncthreads();
        decode(s);
        load_direct(s + 1);
        issue(s + kRing - 1);
        __syncthreads();
        multiply(s);
    }
    cp_async_wait<0>();

    // Epilogue. acc[i][j]: rows (of x) r_i + g, r_i + g + 8; columns (rows of W) c_j + 2t, +1.
    const int64_t r_base = m0 + wm * MT * 16 + g, c_base = n0 + wn * NT * 8 + 2 * t;
    auto store = [&](int i, int j, int e, float v) {
        const int64_t r = r_base + 16 * i + 8 * (e >> 1), col = c_base + 8 * j + (e & 1);
        if (r < m && col < n_out) store_y<T>(y, bias, r, col, n_out, v);
    };
    if (splits == 1) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) store(i, j, e, acc[i][j][e]);
        return;
    }
    constexpr int kPer = MT * NT * 4;
    float flat[kPer];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) flat[(i * NT + j) * 4 + e] = acc[i][j][e];
    reduce_splits<kPer, kThreads>(flat, tile, split, splits, partials, counters,
                                  [&](int f, float v) { store(f / (NT * 4), (f / 4) % NT, f % 4, v); });
}

// The launch for one decoder and CTA shape: Fit's CTA for the device's shared memory
// (kSmemLarge's where it fits with 1 KB to spare for static shared memory, else kSmemSmall's;
// one kernel where both are the same).
template <class T, class Dec, int kSrc, int BM, int kWUnit>
cudaError_t launch_bm(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                      int64_t k_in, int64_t n_out, const void *bias, void *y, const GemmPlan &plan,
                      void *workspace, size_t workspace_bytes, cudaStream_t stream) {
    using Large = Fit<Dec, kSrc, BM, kSmemLarge>;
    using Small = Fit<Dec, kSrc, BM, kSmemSmall>;
    static_assert(Large::kFits && Small::kFits, "a GEMM CTA fits either budget");
    auto run = [&](auto fit) {
        using F = decltype(fit);
        return launch_gemm<gemm_kernel<T, Dec, kSrc, BM, kWUnit, F::kRing, F::kCopies>, T>(
            kThreads, F::kBytes, BM, plan, dec, codebook, k, x, m, k_in, n_out, bias, y,
            workspace, workspace_bytes, stream);
    };
    if constexpr (Large::kRing == Small::kRing && Large::kCopies == Small::kCopies) {
        return run(Large{});
    } else {
        int limit = 0;
        const cudaError_t err = smem_optin(&limit);
        if (err != cudaSuccess) return err;
        return limit >= Large::kBytes + 1024 ? run(Large{}) : run(Small{});
    }
}

template <class T, class Dec, int kSrc, int kWUnit>
cudaError_t launch(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                   int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
    const GemmPlan plan = gemm_plan(m, k_in, n_out);
    switch (plan.bm) {
#define KBIT_GEMM_BM(BM)                                                                      \
    case BM:                                                                                  \
        return launch_bm<T, Dec, kSrc, BM, kWUnit>(dec, codebook, k, x, m, k_in, n_out, bias, \
                                                   y, plan, workspace, workspace_bytes, stream);
        KBIT_GEMM_BM(16)
        KBIT_GEMM_BM(32)
        KBIT_GEMM_BM(128)
#undef KBIT_GEMM_BM
    }
    return cudaErrorInvalidValue;
}

template <class T, class Dec>
cudaError_t launch_stored(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                          int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
                          size_t workspace_bytes, cudaStream_t stream) {
    return with_w_unit(dec, k_in, [&](auto unit) {
        return launch<T, Dec, kStored, decltype(unit)::value>(dec, codebook, k, x, m, k_in, n_out,
                                                             bias, y, workspace, workspace_bytes, stream);
    });
}

template <class T, class Dec>
cudaError_t launch_direct(const Dec &dec, const void *x, int64_t m, int64_t k_in, int64_t n_out,
                          const void *bias, void *y, void *workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
    return launch<T, Dec, kDirect, 16>(dec, nullptr, 0, x, m, k_in, n_out, bias, y, workspace,
                                       workspace_bytes, stream);
}

template <class T, class Dec>
cudaError_t launch_tiled(const Dec &dec, const float *codebook, int k, const void *x, int64_t m,
                         int64_t k_in, int64_t n_out, const void *bias, void *y, void *workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    return launch<T, Dec, kTiled, 16>(dec, codebook, k, x, m, k_in, n_out, bias, y, workspace,
                                      workspace_bytes, stream);
}

}  // namespace gemm
