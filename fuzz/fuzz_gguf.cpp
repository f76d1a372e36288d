// libFuzzer target: GGUF block dequantize on the host (kbit_gguf_dequantize_host and the
// typed cdequantize_<q4_0|q8_0|q4_K|q5_K|q6_K>_<T>_host) on fuzzed blocks: every fp16
// scale (NaN, Inf, subnormal), every code, every packed 6-bit sub-block scale.
//
// Input: [0] type (mod 6: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; 5: an unsupported id from [2]),
// dtype (bits 4-5, mod 3), n not a multiple of the block (bit 6: n + [3] % block_elems);
// [1] blocks (mod 17); [2] unsupported type id; [3] extra elements; then the blocks.
//
// Checks, besides status and guard bytes: SUCCESS for a supported type and whole blocks,
// INVALID_ARGUMENT otherwise (nothing written); kbit_gguf_block_info's geometry; the
// generic and the typed entry give the same bytes; 16-bit outputs are the float32 ones
// rounded once; Q8_0 and Q4_0 element by element as ggml defines them (d * q and
// d * (q - 8), d the block's fp16 scale, float32; Q4_0's element i is the low nibble of
// qs[i], element i + 16 its high nibble).
#include "common.h"

namespace {

struct Type {
    int id;
    int64_t elems, bytes;
};
const Type kTypes[5] = {{KBIT_GGML_TYPE_Q4_0, 32, 18},
                        {KBIT_GGML_TYPE_Q8_0, 32, 34},
                        {KBIT_GGML_TYPE_Q4_K, 256, 144},
                        {KBIT_GGML_TYPE_Q5_K, 256, 176},
                        {KBIT_GGML_TYPE_Q6_K, 256, 210}};

using Deq = kbit_status (*)(const void *, int64_t, void *);
#define FZ_ROW(Q) {cdequantize_##Q##_fp32_host, cdequantize_##Q##_fp16_host, cdequantize_##Q##_bf16_host}
const Deq kTyped[5][3] = {FZ_ROW(q4_0), FZ_ROW(q8_0), FZ_ROW(q4_K), FZ_ROW(q5_K), FZ_ROW(q6_K)};
#undef FZ_ROW

// The index of a supported type id in kTypes, or -1.
int index_of(int id) {
    for (int i = 0; i < 5; ++i)
        if (kTypes[i].id == id) return i;
    return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz::Input in(data, size);
    const uint8_t h0 = in.u8(), h1 = in.u8(), h2 = in.u8(), h3 = in.u8();
    const int sel = (h0 & 15) % 6, dtype = ((h0 >> 4) & 3) % 3;
    const bool ragged = (h0 >> 6) & 1;
    const int id = sel < 5 ? kTypes[sel].id : h2;
    const int ti = index_of(id);  // [2] may name a supported type too
    const bool type_ok = ti >= 0;
    const Type t = type_ok ? kTypes[ti] : Type{id, 32, 18};
    const int64_t n_blocks = h1 % 17;
    const int64_t extra = ragged ? h3 % t.elems : 0;
    const int64_t n = n_blocks * t.elems + extra;

    int64_t elems = -7, bytes = -7;
    const kbit_status si = fz::ret(kbit_gguf_block_info(id, &elems, &bytes));
    if (type_ok) {
        fz::expect_status(si, KBIT_SUCCESS);
        FZ_CHECK(elems == t.elems && bytes == t.bytes);
    } else {
        fz::expect_status(si, KBIT_ERROR_INVALID_ARGUMENT);
        FZ_CHECK(elems == -7 && bytes == -7);
    }

    // The bytes the call may read: whole blocks (a partial one is rejected unread).
    fz::Buffer blocks(static_cast<size_t>(n_blocks * t.bytes));
    in.bytes(blocks.data(), blocks.size());
    const auto blocks_was = fz::snapshot(blocks);
    const size_t out_bytes = static_cast<size_t>(n) * fz::dtype_bytes(dtype);
    fz::Buffer out(out_bytes), out_typed(out_bytes);
    const kbit_status s = fz::ret(kbit_gguf_dequantize_host(id, blocks.data(), n,
                                                            static_cast<kbit_dtype>(dtype),
                                                            out.ptr_or_null()));
    fz::check_output(out, s);
    fz::check_input(blocks, blocks_was);
    const kbit_status want = type_ok && extra == 0 ? KBIT_SUCCESS : KBIT_ERROR_INVALID_ARGUMENT;
    fz::expect_status(s, want);
    if (type_ok) {
        const kbit_status s2 = fz::ret(kTyped[ti][dtype](blocks.data(), n, out_typed.ptr_or_null()));
        fz::check_output(out_typed, s2);
        fz::expect_status(s2, want);
        if (s2 == KBIT_SUCCESS && n > 0)
            FZ_CHECK(std::memcmp(out.data(), out_typed.data(), out_bytes) == 0);
    }
    if (s != KBIT_SUCCESS || n == 0) return 0;

    // float32 values: the formula (Q4_0, Q8_0) or the library's own fp32 output.
    std::vector<float> ref(static_cast<size_t>(n));
    const uint8_t *bp = blocks.data();
    if (id == KBIT_GGML_TYPE_Q4_0 || id == KBIT_GGML_TYPE_Q8_0) {
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t *blk = bp + b * t.bytes;
            const float d = fz::half_to_float(static_cast<uint16_t>(blk[0] | blk[1] << 8));
            for (int i = 0; i < 32; ++i) {
                int q;
                if (id == KBIT_GGML_TYPE_Q8_0) q = static_cast<int8_t>(blk[2 + i]);
                else q = (i < 16 ? blk[2 + i] & 15 : blk[2 + i - 16] >> 4) - 8;
                ref[static_cast<size_t>(b * 32 + i)] = static_cast<float>(q) * d;
            }
        }
    } else {
        fz::Buffer f32(static_cast<size_t>(n) * 4);
        fz::expect_status(kbit_gguf_dequantize_host(id, bp, n, KBIT_DTYPE_FP32, f32.data()),
                          KBIT_SUCCESS);
        fz::check_output(f32, KBIT_SUCCESS);
        std::memcpy(ref.data(), f32.data(), f32.size());
    }
    fz::check_rounded_from_f32(out.data(), dtype, ref.data(), static_cast<size_t>(n));
    return 0;
}
