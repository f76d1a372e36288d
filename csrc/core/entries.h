// The one list of exported entries. Every status-returning function of include/kbit.h
// is a row here with its parameters written once; the families' .cu / .cpp files
// expand their rows into definitions (KBIT_DEFINE_ENTRY), a build without CUDA
// expands the GPU rows into stubs (csrc/nogpu/stubs.cpp), and tests/test_entries.py
// checks the rows against the header, the library's exported symbols and the Python
// signature table. The header stays hand-written: it is the manual.
//
// A row is X(name, PARAMS, TAIL, FN):
//  - PARAMS(P0, P) lists the parameters of the host form, P0(type, name) for the first
//    and P(type, name) for every further one;
//  - TAIL(P) adds what only the GPU form takes (the stream; matmul's workspace);
//  - FN, in parentheses, is the implementation the definition forwards every argument
//    to: a function of the defining file returning kbit_status.
// Each family's list takes two macros, GPU and HOST: the rows of launch entries (stubs
// without CUDA) and of entries that run on the CPU in every build.
#pragma once

#include "kbit.h"

// ---- parameter lists ------------------------------------------------------------------

#define KBIT_TAIL_NONE(P)
#define KBIT_TAIL_STREAM(P) P(kbit_stream_t, stream)
#define KBIT_TAIL_MATMUL(P) P(void *, workspace) P(size_t, workspace_bytes) P(kbit_stream_t, stream)

#define KBIT_PARAMS_KBIT_QUANTIZE(P0, P) \
    P0(const void *, input) P(int64_t, n) P(const float *, codebook) \
    P(kbit_absmax_format, absmax_format) P(float, tensor_scale) P(void *, absmax) P(uint32_t *, packed)
#define KBIT_PARAMS_KBIT_DEQUANTIZE(P0, P) \
    P0(const uint32_t *, packed) P(const void *, absmax) P(kbit_absmax_format, absmax_format) \
    P(float, tensor_scale) P(const float *, codebook) P(int64_t, n) P(void *, output)
#define KBIT_PARAMS_KBIT_QUANTIZE_ANY(P0, P) \
    P0(const void *, input) P(int64_t, n) P(kbit_dtype, dtype) P(int, k) P(const float *, codebook) \
    P(kbit_absmax_format, absmax_format) P(float, tensor_scale) P(void *, absmax) P(uint32_t *, packed)
#define KBIT_PARAMS_KBIT_QUANTIZE_EX(P0, P) \
    P0(const void *, input) P(const float *, importance) P(int64_t, n) P(kbit_dtype, dtype) \
    P(int, k) P(const float *, codebook) P(kbit_absmax_format, absmax_format) \
    P(float, tensor_scale) P(void *, absmax) P(uint32_t *, packed) P(uint32_t *, range_status)
#define KBIT_PARAMS_KBIT_DEQUANTIZE_ANY(P0, P) \
    P0(const uint32_t *, packed) P(const void *, absmax) P(kbit_absmax_format, absmax_format) \
    P(float, tensor_scale) P(const float *, codebook) P(int, k) P(int64_t, n) P(kbit_dtype, dtype) \
    P(void *, output)
#define KBIT_PARAMS_TENSOR_SCALE(P0, P) \
    P0(const void *, input) P(int64_t, n) P(kbit_dtype, dtype) \
    P(kbit_absmax_format, absmax_format) P(float *, tensor_scale)
#define KBIT_PARAMS_RANGE_FLAG(P0, P) P0(int *, raised) P(int, clear)
#define KBIT_PARAMS_DEFAULT_CODEBOOK(P0, P) P0(int, k) P(float *, codebook)
#define KBIT_PARAMS_CODEBOOK(P0, P) P0(int, kind) P(int, k) P(float *, codebook)

#define KBIT_PARAMS_BNB4_QUANTIZE(P0, P) \
    P0(const void *, input) P(int64_t, n) P(int, blocksize) P(float *, absmax) P(uint8_t *, packed)
#define KBIT_PARAMS_BNB4_DEQUANTIZE(P0, P) \
    P0(const uint8_t *, packed) P(const float *, absmax) P(int64_t, n) P(int, blocksize) \
    P(void *, output)
#define KBIT_PARAMS_BNB4_DEQUANTIZE_DQ(P0, P) \
    P0(const uint8_t *, packed) P(const uint8_t *, qabsmax) P(const float *, absmax2) \
    P(const float *, code) P(const float *, offset) P(int64_t, n) P(int, blocksize) P(void *, output)
#define KBIT_PARAMS_BNB4_ABSMAX_MEAN(P0, P) P0(const float *, absmax) P(int64_t, count) P(float *, mean)
#define KBIT_PARAMS_BNB4_QUANTIZE_ABSMAX(P0, P) \
    P0(const float *, absmax) P(int64_t, count) P(const float *, code) P(const float *, offset) \
    P(uint8_t *, qabsmax) P(float *, absmax2)
#define KBIT_PARAMS_BNB4_DEQUANTIZE_ABSMAX(P0, P) \
    P0(const uint8_t *, qabsmax) P(const float *, absmax2) P(const float *, code) \
    P(const float *, offset) P(int64_t, count) P(float *, absmax)
#define KBIT_PARAMS_BNB4_DYNAMIC_MAP(P0, P) P0(float *, code)
#define KBIT_PARAMS_BNB4_TO_KBIT(P0, P) \
    P0(const uint8_t *, packed) P(const float *, absmax) P(int64_t, n) P(int, blocksize) \
    P(kbit_absmax_format, absmax_format) P(uint32_t *, kbit_packed) P(void *, kbit_absmax)

#define KBIT_PARAMS_GGUF_DEQUANTIZE(P0, P) P0(const void *, blocks) P(int64_t, n) P(void *, output)
#define KBIT_PARAMS_GGUF_DEQUANTIZE_ANY(P0, P) \
    P0(int, ggml_type) P(const void *, blocks) P(int64_t, n) P(kbit_dtype, dtype) P(void *, output)
#define KBIT_PARAMS_GGUF_TO_KBIT(P0, P) \
    P0(int, ggml_type) P(const void *, blocks) P(int64_t, n) \
    P(kbit_absmax_format, absmax_format) P(uint32_t *, kbit_packed) P(void *, kbit_absmax)
#define KBIT_PARAMS_GGUF_BLOCK_INFO(P0, P) \
    P0(int, ggml_type) P(int64_t *, block_elems) P(int64_t *, block_bytes)

#define KBIT_PARAMS_MATMUL_HEAD_(P0, P) \
    P0(const void *, x) P(int64_t, m) P(int64_t, k_in) P(int64_t, n_out) P(kbit_dtype, dtype)
#define KBIT_PARAMS_MATMUL_KBIT(P0, P) KBIT_PARAMS_MATMUL_HEAD_(P0, P) \
    P(const uint32_t *, packed) P(const void *, absmax) P(kbit_absmax_format, absmax_format) \
    P(float, tensor_scale) P(const float *, codebook) P(int, k) P(const void *, bias) P(void *, y)
#define KBIT_PARAMS_MATMUL_BNB4(P0, P) KBIT_PARAMS_MATMUL_HEAD_(P0, P) \
    P(const uint8_t *, packed) P(const float *, absmax) P(int, blocksize) P(const void *, bias) \
    P(void *, y)
#define KBIT_PARAMS_MATMUL_GGUF(P0, P) KBIT_PARAMS_MATMUL_HEAD_(P0, P) \
    P(int, ggml_type) P(const void *, blocks) P(const void *, bias) P(void *, y)

#define KBIT_PARAMS_TILE(P0, P) \
    P0(const uint32_t *, packed) P(const void *, absmax) P(kbit_absmax_format, absmax_format) \
    P(int, k) P(int64_t, n_out) P(int64_t, k_in) P(void *, tiled_packed) P(void *, tiled_absmax)
#define KBIT_PARAMS_UNTILE(P0, P) \
    P0(const void *, tiled_packed) P(const void *, tiled_absmax) \
    P(kbit_absmax_format, absmax_format) P(int, k) P(int64_t, n_out) P(int64_t, k_in) \
    P(uint32_t *, packed) P(void *, absmax)
#define KBIT_PARAMS_MATMUL_KBIT_TILED(P0, P) KBIT_PARAMS_MATMUL_HEAD_(P0, P) \
    P(const void *, tiled_packed) P(const void *, tiled_absmax) \
    P(kbit_absmax_format, absmax_format) P(float, tensor_scale) P(const float *, codebook) \
    P(int, k) P(const void *, bias) P(void *, y)

// ---- the rows ---------------------------------------------------------------------------

// ROWS(FMT, F, TAG, T, GPU, HOST) for every element type (tag, C name) of a format.
#define KBIT_ROWS_OF_TYPES_(ROWS, FMT, F, GPU, HOST) \
    ROWS(FMT, F, kbit::F16, fp16, GPU, HOST)         \
    ROWS(FMT, F, kbit::BF16, bf16, GPU, HOST)        \
    ROWS(FMT, F, kbit::F32, fp32, GPU, HOST)

// (type tag, C type name) x K for the kbit family's per-type symbols.
#define KBIT_KBIT_ROWS_OF_(TAG, T, K, GPU, HOST)                                                  \
    GPU(cquantize_kbit_##T##_k##K, KBIT_PARAMS_KBIT_QUANTIZE, KBIT_TAIL_STREAM,                    \
        (kbit::quantize_kbit<TAG, K>))                                                             \
    HOST(cquantize_kbit_##T##_k##K##_host, KBIT_PARAMS_KBIT_QUANTIZE, KBIT_TAIL_NONE,              \
         (kbit::quantize_kbit_host<TAG, K>))                                                       \
    GPU(cdequantize_kbit_##T##_k##K, KBIT_PARAMS_KBIT_DEQUANTIZE, KBIT_TAIL_STREAM,                \
        (kbit::dequantize_kbit<TAG, K>))                                                           \
    HOST(cdequantize_kbit_##T##_k##K##_host, KBIT_PARAMS_KBIT_DEQUANTIZE, KBIT_TAIL_NONE,          \
         (kbit::dequantize_kbit_host<TAG, K>))
#define KBIT_KBIT_ROWS_OF_TYPE_(TAG, T, GPU, HOST) \
    KBIT_KBIT_ROWS_OF_(TAG, T, 2, GPU, HOST) KBIT_KBIT_ROWS_OF_(TAG, T, 3, GPU, HOST) \
    KBIT_KBIT_ROWS_OF_(TAG, T, 4, GPU, HOST) KBIT_KBIT_ROWS_OF_(TAG, T, 5, GPU, HOST)

#define KBIT_KBIT_ENTRIES(GPU, HOST)                                                              \
    KBIT_KBIT_ROWS_OF_TYPE_(kbit::F16, fp16, GPU, HOST)                                           \
    KBIT_KBIT_ROWS_OF_TYPE_(kbit::BF16, bf16, GPU, HOST)                                          \
    KBIT_KBIT_ROWS_OF_TYPE_(kbit::F32, fp32, GPU, HOST)                                           \
    GPU(kbit_quantize, KBIT_PARAMS_KBIT_QUANTIZE_ANY, KBIT_TAIL_STREAM, (kbit::quantize_kbit_any)) \
    HOST(kbit_quantize_host, KBIT_PARAMS_KBIT_QUANTIZE_ANY, KBIT_TAIL_NONE,                       \
         (kbit::quantize_kbit_any_host))                                                          \
    GPU(kbit_quantize_ex, KBIT_PARAMS_KBIT_QUANTIZE_EX, KBIT_TAIL_STREAM,                         \
        (kbit::quantize_kbit_ex))                                                                 \
    HOST(kbit_quantize_ex_host, KBIT_PARAMS_KBIT_QUANTIZE_EX, KBIT_TAIL_NONE,                     \
         (kbit::quantize_kbit_ex_host))                                                           \
    GPU(kbit_dequantize, KBIT_PARAMS_KBIT_DEQUANTIZE_ANY, KBIT_TAIL_STREAM,                       \
        (kbit::dequantize_kbit_any))                                                              \
    HOST(kbit_dequantize_host, KBIT_PARAMS_KBIT_DEQUANTIZE_ANY, KBIT_TAIL_NONE,                   \
         (kbit::dequantize_kbit_any_host))                                                        \
    GPU(kbit_compute_tensor_scale, KBIT_PARAMS_TENSOR_SCALE, KBIT_TAIL_STREAM,                    \
        (kbit::compute_tensor_scale))                                                             \
    HOST(kbit_compute_tensor_scale_host, KBIT_PARAMS_TENSOR_SCALE, KBIT_TAIL_NONE,                \
         (kbit::compute_tensor_scale_host))                                                       \
    GPU(kbit_get_range_flag, KBIT_PARAMS_RANGE_FLAG, KBIT_TAIL_NONE, (kbit::get_range_flag))      \
    HOST(kbit_default_codebook_host, KBIT_PARAMS_DEFAULT_CODEBOOK, KBIT_TAIL_NONE,                \
         (kbit::default_codebook_host))                                                           \
    HOST(kbit_codebook_host, KBIT_PARAMS_CODEBOOK, KBIT_TAIL_NONE, (kbit::codebook_host))

// NF4 and FP4 (bitsandbytes' formats): (format tag, name) x (type tag, name).
#define KBIT_BNB4_ROWS_OF_(FMT, F, TAG, T, GPU, HOST)                                             \
    GPU(cquantize_##F##_##T, KBIT_PARAMS_BNB4_QUANTIZE, KBIT_TAIL_STREAM,                          \
        (kbit::bnb4::quantize<FMT, TAG>))                                                          \
    HOST(cquantize_##F##_##T##_host, KBIT_PARAMS_BNB4_QUANTIZE, KBIT_TAIL_NONE,                    \
         (kbit::bnb4::quantize_host<FMT, TAG>))                                                    \
    GPU(cdequantize_##F##_##T, KBIT_PARAMS_BNB4_DEQUANTIZE, KBIT_TAIL_STREAM,                      \
        (kbit::bnb4::dequantize<FMT, TAG>))                                                        \
    HOST(cdequantize_##F##_##T##_host, KBIT_PARAMS_BNB4_DEQUANTIZE, KBIT_TAIL_NONE,                \
         (kbit::bnb4::dequantize_host<FMT, TAG>))                                                  \
    GPU(cdequantize_##F##_dq_##T, KBIT_PARAMS_BNB4_DEQUANTIZE_DQ, KBIT_TAIL_STREAM,                \
        (kbit::bnb4::dequantize_dq<FMT, TAG>))                                                     \
    HOST(cdequantize_##F##_dq_##T##_host, KBIT_PARAMS_BNB4_DEQUANTIZE_DQ, KBIT_TAIL_NONE,          \
         (kbit::bnb4::dequantize_dq_host<FMT, TAG>))
#define KBIT_BNB4_ENTRIES(GPU, HOST)                                                              \
    KBIT_ROWS_OF_TYPES_(KBIT_BNB4_ROWS_OF_, kbit::bnb4::Nf4, nf4, GPU, HOST)                     \
    KBIT_ROWS_OF_TYPES_(KBIT_BNB4_ROWS_OF_, kbit::bnb4::Fp4, fp4, GPU, HOST)                     \
    GPU(kbit_nf4_absmax_mean, KBIT_PARAMS_BNB4_ABSMAX_MEAN, KBIT_TAIL_STREAM,                     \
        (kbit::bnb4::absmax_mean))                                                                \
    HOST(kbit_nf4_absmax_mean_host, KBIT_PARAMS_BNB4_ABSMAX_MEAN, KBIT_TAIL_NONE,                 \
         (kbit::bnb4::absmax_mean_host))                                                          \
    GPU(kbit_nf4_quantize_absmax, KBIT_PARAMS_BNB4_QUANTIZE_ABSMAX, KBIT_TAIL_STREAM,             \
        (kbit::bnb4::quantize_absmax))                                                            \
    HOST(kbit_nf4_quantize_absmax_host, KBIT_PARAMS_BNB4_QUANTIZE_ABSMAX, KBIT_TAIL_NONE,         \
         (kbit::bnb4::quantize_absmax_host))                                                      \
    GPU(kbit_nf4_dequantize_absmax, KBIT_PARAMS_BNB4_DEQUANTIZE_ABSMAX, KBIT_TAIL_STREAM,         \
        (kbit::bnb4::dequantize_absmax))                                                          \
    HOST(kbit_nf4_dequantize_absmax_host, KBIT_PARAMS_BNB4_DEQUANTIZE_ABSMAX, KBIT_TAIL_NONE,     \
         (kbit::bnb4::dequantize_absmax_host))                                                    \
    HOST(kbit_nf4_dynamic_map_host, KBIT_PARAMS_BNB4_DYNAMIC_MAP, KBIT_TAIL_NONE,                 \
         (kbit::bnb4::dynamic_map_host))                                                          \
    GPU(kbit_nf4_to_kbit, KBIT_PARAMS_BNB4_TO_KBIT, KBIT_TAIL_STREAM, (kbit::bnb4::to_kbit))      \
    HOST(kbit_nf4_to_kbit_host, KBIT_PARAMS_BNB4_TO_KBIT, KBIT_TAIL_NONE, (kbit::bnb4::to_kbit_host))

// GGUF: (format struct, name) x (type tag, name).
#define KBIT_GGUF_ROWS_OF_(FMT, Q, TAG, T, GPU, HOST)                                            \
    GPU(cdequantize_##Q##_##T, KBIT_PARAMS_GGUF_DEQUANTIZE, KBIT_TAIL_STREAM,                     \
        (kbit::gguf::dequantize<FMT, TAG>))                                                       \
    HOST(cdequantize_##Q##_##T##_host, KBIT_PARAMS_GGUF_DEQUANTIZE, KBIT_TAIL_NONE,               \
         (kbit::gguf::dequantize_host<FMT, TAG>))
#define KBIT_GGUF_ENTRIES(GPU, HOST)                                                             \
    KBIT_ROWS_OF_TYPES_(KBIT_GGUF_ROWS_OF_, kbit::gguf::Q4_0, q4_0, GPU, HOST)                   \
    KBIT_ROWS_OF_TYPES_(KBIT_GGUF_ROWS_OF_, kbit::gguf::Q8_0, q8_0, GPU, HOST)                   \
    KBIT_ROWS_OF_TYPES_(KBIT_GGUF_ROWS_OF_, kbit::gguf::Q4_K, q4_K, GPU, HOST)                   \
    KBIT_ROWS_OF_TYPES_(KBIT_GGUF_ROWS_OF_, kbit::gguf::Q5_K, q5_K, GPU, HOST)                   \
    KBIT_ROWS_OF_TYPES_(KBIT_GGUF_ROWS_OF_, kbit::gguf::Q6_K, q6_K, GPU, HOST)                   \
    GPU(kbit_gguf_dequantize, KBIT_PARAMS_GGUF_DEQUANTIZE_ANY, KBIT_TAIL_STREAM,                 \
        (kbit::gguf::dequantize_any))                                                            \
    HOST(kbit_gguf_dequantize_host, KBIT_PARAMS_GGUF_DEQUANTIZE_ANY, KBIT_TAIL_NONE,             \
         (kbit::gguf::dequantize_any_host))                                                      \
    HOST(kbit_gguf_block_info, KBIT_PARAMS_GGUF_BLOCK_INFO, KBIT_TAIL_NONE,                      \
         (kbit::gguf::block_info))                                                               \
    GPU(kbit_gguf_to_kbit, KBIT_PARAMS_GGUF_TO_KBIT, KBIT_TAIL_STREAM, (kbit::gguf::to_kbit))    \
    HOST(kbit_gguf_to_kbit_host, KBIT_PARAMS_GGUF_TO_KBIT, KBIT_TAIL_NONE,                       \
         (kbit::gguf::to_kbit_host))

// Fused dequantize + matmul (SPEC section 6).
#define KBIT_MATMUL_ENTRIES(GPU, HOST)                                                           \
    GPU(kbit_matmul_kbit, KBIT_PARAMS_MATMUL_KBIT, KBIT_TAIL_MATMUL, (kbit::matmul::kbit_entry))  \
    HOST(kbit_matmul_kbit_host, KBIT_PARAMS_MATMUL_KBIT, KBIT_TAIL_NONE,                         \
         (kbit::matmul::kbit_host))                                                              \
    GPU(kbit_matmul_nf4, KBIT_PARAMS_MATMUL_BNB4, KBIT_TAIL_MATMUL,                              \
        (kbit::matmul::bnb4_entry<kbit::bnb4::Nf4>))                                             \
    HOST(kbit_matmul_nf4_host, KBIT_PARAMS_MATMUL_BNB4, KBIT_TAIL_NONE,                          \
         (kbit::matmul::bnb4_host<kbit::bnb4::Nf4>))                                             \
    GPU(kbit_matmul_fp4, KBIT_PARAMS_MATMUL_BNB4, KBIT_TAIL_MATMUL,                              \
        (kbit::matmul::bnb4_entry<kbit::bnb4::Fp4>))                                             \
    HOST(kbit_matmul_fp4_host, KBIT_PARAMS_MATMUL_BNB4, KBIT_TAIL_NONE,                          \
         (kbit::matmul::bnb4_host<kbit::bnb4::Fp4>))                                             \
    GPU(kbit_matmul_gguf, KBIT_PARAMS_MATMUL_GGUF, KBIT_TAIL_MATMUL, (kbit::matmul::gguf_entry))  \
    HOST(kbit_matmul_gguf_host, KBIT_PARAMS_MATMUL_GGUF, KBIT_TAIL_NONE,                         \
         (kbit::matmul::gguf_host))                                                              \
    GPU(kbit_tile, KBIT_PARAMS_TILE, KBIT_TAIL_STREAM, (kbit::matmul::tile_entry))               \
    HOST(kbit_tile_host, KBIT_PARAMS_TILE, KBIT_TAIL_NONE, (kbit::matmul::tile_host))            \
    GPU(kbit_untile, KBIT_PARAMS_UNTILE, KBIT_TAIL_STREAM, (kbit::matmul::untile_entry))         \
    HOST(kbit_untile_host, KBIT_PARAMS_UNTILE, KBIT_TAIL_NONE, (kbit::matmul::untile_host))      \
    GPU(kbit_matmul_kbit_tiled, KBIT_PARAMS_MATMUL_KBIT_TILED, KBIT_TAIL_MATMUL,                 \
        (kbit::matmul::kbit_tiled_entry))                                                        \
    HOST(kbit_matmul_kbit_tiled_host, KBIT_PARAMS_MATMUL_KBIT_TILED, KBIT_TAIL_NONE,             \
         (kbit::matmul::kbit_tiled_host))

// Codebooks fitted to a tensor (issue 13; formats/codebook_fit.h).
#define KBIT_PARAMS_FIT_CODEBOOK(P0, P)                                                     \
    P0(const void *, input) P(const float *, importance) P(int64_t, n) P(kbit_dtype, dtype) \
    P(int, k) P(float *, codebook)
// The GPU form takes a workspace as matmul does (kbit_fit_codebook_workspace_bytes, zeroed
// once, left zeroed).
#define KBIT_CODEBOOK_ENTRIES(GPU, HOST)                                                          \
    GPU(kbit_fit_codebook, KBIT_PARAMS_FIT_CODEBOOK, KBIT_TAIL_MATMUL, (kbit::fit_codebook))      \
    HOST(kbit_fit_codebook_host, KBIT_PARAMS_FIT_CODEBOOK, KBIT_TAIL_NONE, (kbit::fit_codebook_host))

#define KBIT_ALL_ENTRIES(GPU, HOST)                                                              \
    KBIT_KBIT_ENTRIES(GPU, HOST)                                                                 \
    KBIT_CODEBOOK_ENTRIES(GPU, HOST)                                                             \
    KBIT_BNB4_ENTRIES(GPU, HOST)                                                                 \
    KBIT_GGUF_ENTRIES(GPU, HOST)                                                                 \
    KBIT_MATMUL_ENTRIES(GPU, HOST)

// Exported functions that return a value rather than a status (defined by hand, one
// line each; listed here for the consistency test): X(return type, name, PARAMS).
#define KBIT_PARAMS_VOID(P0, P) P0(void, )
#define KBIT_PARAMS_STATUS(P0, P) P0(kbit_status, status)
#define KBIT_PARAMS_N_K(P0, P) P0(int64_t, n) P(int, k)
#define KBIT_PARAMS_N_FORMAT(P0, P) P0(int64_t, n) P(kbit_absmax_format, absmax_format)
#define KBIT_PARAMS_E4M4(P0, P) P0(uint8_t, code)
#define KBIT_PARAMS_N(P0, P) P0(int64_t, n)
#define KBIT_PARAMS_N_BLOCKSIZE(P0, P) P0(int64_t, n) P(int, blocksize)
#define KBIT_PARAMS_COUNT(P0, P) P0(int64_t, count)
#define KBIT_PARAMS_MATMUL_SHAPE(P0, P) P0(int64_t, m) P(int64_t, k_in) P(int64_t, n_out)
#define KBIT_PARAMS_TILED_PACKED(P0, P) P0(int64_t, n_out) P(int64_t, k_in) P(int, k)
#define KBIT_PARAMS_TILED_ABSMAX(P0, P) \
    P0(int64_t, n_out) P(int64_t, k_in) P(kbit_absmax_format, absmax_format)
#define KBIT_VALUE_ENTRIES(X)                                                                    \
    X(int, kbit_version, KBIT_PARAMS_VOID)                                                       \
    X(const char *, kbit_status_string, KBIT_PARAMS_STATUS)                                      \
    X(const char *, kbit_last_error_message, KBIT_PARAMS_VOID)                                   \
    X(int, kbit_cuda_available, KBIT_PARAMS_VOID)                                                \
    X(int64_t, kbit_packed_words, KBIT_PARAMS_N_K)                                               \
    X(int64_t, kbit_absmax_bytes, KBIT_PARAMS_N_FORMAT)                                          \
    X(float, kbit_e4m4_decode, KBIT_PARAMS_E4M4)                                                 \
    X(int64_t, kbit_nf4_packed_bytes, KBIT_PARAMS_N)                                             \
    X(int64_t, kbit_nf4_absmax_count, KBIT_PARAMS_N_BLOCKSIZE)                                   \
    X(int64_t, kbit_nf4_absmax2_count, KBIT_PARAMS_COUNT)                                        \
    X(int64_t, kbit_matmul_workspace_bytes, KBIT_PARAMS_MATMUL_SHAPE)                           \
    X(int64_t, kbit_tiled_packed_bytes, KBIT_PARAMS_TILED_PACKED)                               \
    X(int64_t, kbit_tiled_absmax_bytes, KBIT_PARAMS_TILED_ABSMAX)                               \
    X(int64_t, kbit_fit_codebook_workspace_bytes, KBIT_PARAMS_VOID)

// ---- expanding rows -----------------------------------------------------------------------

#define KBIT_DECL0_(type, name) type name
#define KBIT_DECL_(type, name) , type name
#define KBIT_ARG0_(type, name) name
#define KBIT_ARG_(type, name) , name
#define KBIT_TYPE0_(type, name) type
#define KBIT_TYPE_(type, name) , type

// Drops a row (the other side's rows of a family list).
#define KBIT_SKIP_ENTRY(name, PARAMS, TAIL, FN)

// Defines the exported function `name`: every argument goes to FN, inside guarded() so
// that nothing thrown crosses the C boundary.
#define KBIT_DEFINE_ENTRY(name, PARAMS, TAIL, FN)                                                \
    extern "C" KBIT_API kbit_status name(PARAMS(KBIT_DECL0_, KBIT_DECL_) TAIL(KBIT_DECL_)) {     \
        return kbit::guarded(                                                                    \
            [&] { return FN(PARAMS(KBIT_ARG0_, KBIT_ARG_) TAIL(KBIT_ARG_)); });                  \
    }
