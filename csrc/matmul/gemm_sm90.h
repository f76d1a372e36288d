// The wgmma GEMMs for Hopper (gemm_sm90.cu: prefill, and the streamed one of m = 9..64),
// as gemv.cu's entries call them: plain arguments, the kernels' templates stay inside
// that file (built for sm_90a alone).
#pragma once

#include <cuda_runtime.h>

#include "../core/status.h"

namespace kbit {
namespace matmul {
namespace sm90 {

// Whether this library carries the sm_90a kernels (its CUDA architectures named 90); they
// run on compute capability 9.0 alone.
bool built();

// A kbit weight, stored (kbit_quantize's layout) or tiled (kbit_tile's); bytes of its two
// arrays; the call's tensor_scale and codebook (NULL: the built-in one).
struct KbitWeight {
    bool tiled;
    const void *packed, *absmax;
    int64_t packed_bytes, absmax_bytes;
    kbit_absmax_format fmt;
    float tensor_scale;
    const float *codebook;
    int k;
};

// NF4 (fp4 = false) or FP4 with float32 block scales every 2^log2_blocksize elements.
struct Bnb4Weight {
    bool fp4;
    const void *packed;
    const float *absmax;
    int64_t packed_bytes, absmax_bytes;
    int log2_blocksize;
};

// Whether the streamed GEMM (m <= kStream90MaxM) can read this NF4 / FP4 weight: its
// arrays on 16 bytes, its scale rows (k_in / blocksize of them) a multiple of 4, k_in and
// n_out below 2^31; else the wgmma GEMM takes it, from m = kGemm90MinM.
bool streams(const Bnb4Weight &w, int64_t k_in, int64_t n_out);
// The same for kbit: tiled within the sizes; stored also with its arrays on 16 bytes, a
// row's bytes a multiple of 16 ((k_in / 32) K % 4 == 0) and its scales too.
bool streams(const KbitWeight &w, int64_t k_in, int64_t n_out);

// y = x · Wᵀ (+ bias) for fp16 / bf16 x (16-byte aligned; the stored W's arrays 4-byte
// aligned): a tiled kbit weight by the tiled GEMM at any m from kGemmMinM; stored kbit and
// NF4 / FP4 by the streamed GEMM at m = kStream90StoredMinM .. kStream90MaxM rows where
// streams(), else m >= kGemm90MinM by the prefill GEMM; split k through the workspace
// where the plan asks for it (formats/matmul.h: tiled90_plan, stream90_plan, gemm90_plan)
// and the workspace is large enough, else one split.
cudaError_t matmul(const KbitWeight &w, kbit_dtype dtype, const void *x, int64_t m, int64_t k_in,
                   int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream);
cudaError_t matmul(const Bnb4Weight &w, kbit_dtype dtype, const void *x, int64_t m, int64_t k_in,
                   int64_t n_out, const void *bias, void *y, void *workspace,
                   size_t workspace_bytes, cudaStream_t stream);

// GGUF weights (ggml types Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) read as the file stores them by
// the GGUF GEMM: whether it reads this one (blocks on 16 bytes, a row's bytes whole
// 16-byte runs: k_in % 256 == 0, Q6_K's % 2048; k_in and n_out below 2^31), and y = x ·
// Wᵀ (+ bias) for fp16 / bf16 x (16-byte aligned), m >= kStream90StoredMinM and k_in > 0
// (gemv.cu calls it from gguf90_min_m, formats/matmul.h), split k through the
// workspace as the tiled GEMM's plan asks (tiled90_plan) where it is large enough.
bool gguf_reads(int ggml_type, const void *blocks, int64_t k_in, int64_t n_out);
cudaError_t matmul_gguf(int ggml_type, kbit_dtype dtype, const void *blocks, const void *x,
                        int64_t m, int64_t k_in, int64_t n_out, const void *bias, void *y,
                        void *workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace sm90
}  // namespace matmul
}  // namespace kbit
