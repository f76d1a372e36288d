/*
 * kbit: k-bit blockwise quantization of LLM weights, on the GPU and the CPU.
 *
 * Plain C ABI (C99 and C++), no CUDA header needed. Formats and symbol names follow
 * docs/SPEC.md; status values are pinned forever and never renumbered.
 *
 * Conventions for every function below:
 *  - Pointers are to device memory unless the function name ends in `_host`.
 *  - Launch functions (no `_host` suffix) are asynchronous on `stream`, allocate
 *    nothing, never synchronise the device, are thread-safe and may be captured in a
 *    CUDA graph. NULL is the default stream.
 *  - n = 0 is a valid no-op. A null pointer with n > 0, n < 0, a bad k or enum value,
 *    or a pointer not aligned to its element size (packed words: 4 bytes) is
 *    rejected with a status before anything is written.
 *  - On failure kbit_last_error_message() tells why (per thread, with the CUDA text
 *    where there is one).
 *  - Devices, as cuBLAS: a GPU entry runs on the calling thread's current device
 *    (cudaSetDevice), whose memory its pointers and whose stream `stream` must be. kbit
 *    never changes the current device, and its per-device state (kernel settings, the
 *    range flag of kbit_get_range_flag) is the current device's. To work on several
 *    GPUs, make each current in turn (or one per thread); the Python package does this
 *    for every call from the arrays' own device.
 */
#ifndef KBIT_H_
#define KBIT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define KBIT_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define KBIT_API __attribute__((visibility("default")))
#else
#  define KBIT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KBIT_VERSION_MAJOR 0
#define KBIT_VERSION_MINOR 1
#define KBIT_VERSION_PATCH 0
#define KBIT_VERSION_CODE \
    (KBIT_VERSION_MAJOR * 10000 + KBIT_VERSION_MINOR * 100 + KBIT_VERSION_PATCH)

/* Elements per kbit block. */
#define KBIT_BLOCK_SIZE 32

/* Same type as cudaStream_t; NULL is the default stream. */
typedef struct CUstream_st *kbit_stream_t;

/* Status codes: pinned, never renumbered. */
typedef enum kbit_status {
    KBIT_SUCCESS = 0,
    KBIT_ERROR_INVALID_ARGUMENT = 1, /* n < 0 or beyond the address space, k or enum out
                                        of range, bad size */
    KBIT_ERROR_NULL_POINTER = 2,     /* a required pointer is NULL while n > 0 */
    KBIT_ERROR_MISALIGNED = 3,       /* pointer not aligned to its element size */
    KBIT_ERROR_RANGE = 4,            /* a block scale does not fit the absmax format */
    KBIT_ERROR_NOT_SUPPORTED = 5,    /* library built without CUDA: no GPU path */
    KBIT_ERROR_NO_DEVICE = 6,        /* no usable CUDA device or driver */
    KBIT_ERROR_CUDA = 7,             /* a CUDA runtime error (see last error message) */
    KBIT_ERROR_INVALID_DATA = 8,     /* malformed quantized data or file */
    KBIT_ERROR_INTERNAL = 9          /* a bug in kbit: please report it */
} kbit_status;

typedef enum kbit_dtype {
    KBIT_DTYPE_FP32 = 0,
    KBIT_DTYPE_FP16 = 1,
    KBIT_DTYPE_BF16 = 2
} kbit_dtype;

typedef enum kbit_absmax_format {
    KBIT_ABSMAX_FP32 = 0, /* float32, 4 bytes per block */
    KBIT_ABSMAX_FP16 = 1, /* IEEE half, 2 bytes per block */
    KBIT_ABSMAX_E4M4 = 2  /* 1-byte micro-float, bias 11, max 31.0 (the default) */
} kbit_absmax_format;

/* ---------------------------------------------------------------------------------
 * Library information and errors
 * ------------------------------------------------------------------------------- */

/*! @return MAJOR*10000 + MINOR*100 + PATCH of the loaded library. */
KBIT_API int kbit_version(void);

/*! @return a static, human-readable name for `status` ("unknown status" if none). */
KBIT_API const char *kbit_status_string(kbit_status status);

/*! @return the message of the last failure on the calling thread ("" if none).
 *  The pointer stays valid until the next kbit call on this thread. */
KBIT_API const char *kbit_last_error_message(void);

/*! @return 1 if the library was built with CUDA and a device is usable, else 0. */
KBIT_API int kbit_cuda_available(void);

/* ---------------------------------------------------------------------------------
 * kbit format: sizes and scales
 * ------------------------------------------------------------------------------- */

/*! @return number of uint32 words of packed codes for n elements at k bits
 *  (ceil(n/32) * k), or -1 if n < 0 or k is not in 2..5. */
KBIT_API int64_t kbit_packed_words(int64_t n, int k);

/*! @return bytes of absmax storage for n elements (ceil(n/32) * 4, 2 or 1),
 *  or -1 if n < 0 or the format is unknown. */
KBIT_API int64_t kbit_absmax_bytes(int64_t n, kbit_absmax_format absmax_format);

/*! Decodes one E4M4 byte exactly. @return the value (0.0 to 31.0). */
KBIT_API float kbit_e4m4_decode(uint8_t code);

/*! Computes a tensor_scale under which every block of `input` (host memory) fits
 *  `absmax_format`: slightly above max|x| / format_max when max|x| exceeds the format;
 *  for E4M4 with max|x| <= 15.5, or fp16 with max|x| < 2^-4, the power of two (at least
 *  2^-126) that brings max|x| into [format_max / 2, format_max), keeping small tensors'
 *  block scales in the format's normal range; else 1.0. Non-finite values are ignored.
 *  @return KBIT_SUCCESS and *tensor_scale, or an error status. */
KBIT_API kbit_status kbit_compute_tensor_scale_host(const void *input, int64_t n,
                                                    kbit_dtype dtype,
                                                    kbit_absmax_format absmax_format,
                                                    float *tensor_scale);

/*! The same for device memory `input`. Not a launch function: it allocates 4 bytes
 *  stream-ordered, and synchronises `stream` to return *tensor_scale (host memory). */
KBIT_API kbit_status kbit_compute_tensor_scale(const void *input, int64_t n,
                                               kbit_dtype dtype,
                                               kbit_absmax_format absmax_format,
                                               float *tensor_scale, kbit_stream_t stream);

/*! The GPU quantizers cannot return KBIT_ERROR_RANGE without synchronising, so a
 *  block whose absmax / tensor_scale exceeds the format (or, for E4M4, is not
 *  finite) is stored at the format's largest value and raises a flag of the current
 *  device (so does kbit_nf4_to_kbit for a half scale it cannot hold). This synchronises the current device (every stream), reads the flag into
 *  *raised (0 or 1) and clears it if `clear` is non-zero. The flag is shared by all
 *  threads and streams on the device: clear it before the quantize calls it should
 *  cover, and read it when no other thread's quantize is in flight. */
KBIT_API kbit_status kbit_get_range_flag(int *raised, int clear);

/* ---------------------------------------------------------------------------------
 * kbit quantize / dequantize (SPEC section 1 and 4)
 *
 * input / output: n elements of the type in the name; codebook: 2^K finite float32
 * values in any order, duplicates allowed (NULL: the built-in normal-float codebook), in
 * device memory for the GPU functions (host versions reject non-finite entries; the GPU
 * ones do not check them);
 * absmax: kbit_absmax_bytes(n, format) bytes; packed: kbit_packed_words(n, K) words.
 * tensor_scale multiplies every decoded block scale (pass 1.0f when not needed; it
 * must be finite and > 0).
 * Host versions return KBIT_ERROR_RANGE (having written every block) when a block's
 * absmax / tensor_scale exceeds the format (for fp32: overflows to inf; the block is
 * stored at FLT_MAX), or when an E4M4 block holds NaN/Inf (E4M4
 * has no NaN; with fp32/fp16 absmax such a block dequantizes to NaN); the GPU versions
 * raise the range flag instead.
 * ------------------------------------------------------------------------------- */

#define KBIT_DECLARE_KBIT_FUNCS(T, K)                                                  \
    KBIT_API kbit_status cquantize_kbit_##T##_k##K(                                    \
        const void *input, int64_t n, const float *codebook,                           \
        kbit_absmax_format absmax_format, float tensor_scale, void *absmax,            \
        uint32_t *packed, kbit_stream_t stream);                                       \
    KBIT_API kbit_status cdequantize_kbit_##T##_k##K(                                  \
        const uint32_t *packed, const void *absmax, kbit_absmax_format absmax_format,  \
        float tensor_scale, const float *codebook, int64_t n, void *output,            \
        kbit_stream_t stream);                                                         \
    KBIT_API kbit_status cquantize_kbit_##T##_k##K##_host(                             \
        const void *input, int64_t n, const float *codebook,                           \
        kbit_absmax_format absmax_format, float tensor_scale, void *absmax,            \
        uint32_t *packed);                                                             \
    KBIT_API kbit_status cdequantize_kbit_##T##_k##K##_host(                           \
        const uint32_t *packed, const void *absmax, kbit_absmax_format absmax_format,  \
        float tensor_scale, const float *codebook, int64_t n, void *output);

#define KBIT_DECLARE_KBIT_TYPE(T)                                                      \
    KBIT_DECLARE_KBIT_FUNCS(T, 2)                                                      \
    KBIT_DECLARE_KBIT_FUNCS(T, 3)                                                      \
    KBIT_DECLARE_KBIT_FUNCS(T, 4)                                                      \
    KBIT_DECLARE_KBIT_FUNCS(T, 5)

KBIT_DECLARE_KBIT_TYPE(fp16)
KBIT_DECLARE_KBIT_TYPE(bf16)
KBIT_DECLARE_KBIT_TYPE(fp32)

#undef KBIT_DECLARE_KBIT_TYPE
#undef KBIT_DECLARE_KBIT_FUNCS

/*! Generic quantize: dispatches on dtype and k (2..5) to cquantize_kbit_<T>_k<K>. */
KBIT_API kbit_status kbit_quantize(const void *input, int64_t n, kbit_dtype dtype, int k,
                                   const float *codebook, kbit_absmax_format absmax_format,
                                   float tensor_scale, void *absmax, uint32_t *packed,
                                   kbit_stream_t stream);
KBIT_API kbit_status kbit_quantize_host(const void *input, int64_t n, kbit_dtype dtype,
                                        int k, const float *codebook,
                                        kbit_absmax_format absmax_format,
                                        float tensor_scale, void *absmax,
                                        uint32_t *packed);

/*! kbit_quantize with two options, each ignored when NULL:
 *  - importance: n float32 weights >= 0 (finite), where the input lives. The E4M4 scale
 *    search then picks, per block, the candidate scale minimising sum_i w_i (x_i - q_i)^2
 *    instead of the unweighted error (e.g. w = mean squared activations of the input
 *    channel, as llama.cpp's imatrix). fp16/fp32 scales have no search: it is unused there.
 *    All-ones weights give exactly kbit_quantize's bytes. The host entry rejects negative
 *    or non-finite weights (KBIT_ERROR_INVALID_ARGUMENT); the GPU entry does not read
 *    them for that, and such weights leave the choice of scale unspecified.
 *  - range_status: one uint32, where the input lives, that the caller zeroed. A block
 *    that does not fit the format (see kbit_get_range_flag) sets it to non-zero instead
 *    of raising the device's flag, so a caller checks its own call on its own stream
 *    with one read after the stream's work. The host entry sets it and also returns
 *    KBIT_ERROR_RANGE, as kbit_quantize_host does.
 *  Sizes, alignments and the other arguments are kbit_quantize's. */
KBIT_API kbit_status kbit_quantize_ex(const void *input, const float *importance, int64_t n,
                                      kbit_dtype dtype, int k, const float *codebook,
                                      kbit_absmax_format absmax_format, float tensor_scale,
                                      void *absmax, uint32_t *packed, uint32_t *range_status,
                                      kbit_stream_t stream);
KBIT_API kbit_status kbit_quantize_ex_host(const void *input, const float *importance,
                                           int64_t n, kbit_dtype dtype, int k,
                                           const float *codebook,
                                           kbit_absmax_format absmax_format,
                                           float tensor_scale, void *absmax, uint32_t *packed,
                                           uint32_t *range_status);

/*! Generic dequantize: dispatches on dtype (of output) and k to cdequantize_kbit_*. */
KBIT_API kbit_status kbit_dequantize(const uint32_t *packed, const void *absmax,
                                     kbit_absmax_format absmax_format, float tensor_scale,
                                     const float *codebook, int k, int64_t n,
                                     kbit_dtype dtype, void *output, kbit_stream_t stream);
KBIT_API kbit_status kbit_dequantize_host(const uint32_t *packed, const void *absmax,
                                          kbit_absmax_format absmax_format,
                                          float tensor_scale, const float *codebook,
                                          int k, int64_t n, kbit_dtype dtype,
                                          void *output);

/*! Writes the built-in normal-float codebook for k (2^k floats) to host memory. */
KBIT_API kbit_status kbit_default_codebook_host(int k, float *codebook);

/*! Built-in codebooks by kind (values pinned). Each is 2^k ascending floats spanning
 *  [-1, 1]; any of them (or any other 2^k finite floats) is passed as `codebook`. */
typedef enum kbit_codebook_kind {
    KBIT_CODEBOOK_NORMAL = 0,  /* SPEC 1.1's symmetric normal-float book (the NULL codebook) */
    KBIT_CODEBOOK_NF0 = 1,     /* normal-float with an exact zero (NF4's table at k = 4) */
    KBIT_CODEBOOK_UNIFORM = 2  /* 2^k evenly spaced entries from -1 to 1 */
} kbit_codebook_kind;

/*! Writes built-in codebook `kind` (a kbit_codebook_kind) for k = 2..5 to host memory
 *  (2^k floats). @return KBIT_SUCCESS, KBIT_ERROR_INVALID_ARGUMENT (kind or k) or
 *  KBIT_ERROR_NULL_POINTER / KBIT_ERROR_MISALIGNED; nothing is written on failure. */
KBIT_API kbit_status kbit_codebook_host(int kind, int k, float *codebook);

/*! Fits a codebook of 2^k float32 entries (k = 2..5) to the n values at `input` (host
 *  memory, dtype fp32/fp16/bf16) and writes it to `codebook` (host memory). importance:
 *  NULL, or n float32 weights >= 0 (e.g. mean squared activations of each weight's input
 *  channel) that weight each value's squared error; they count in units of 1/4096 of the
 *  largest. The values
 *  are taken in blocks of 32 over their block's largest |value| (the absmax rule) and
 *  the book is fitted by Lloyd-Max on an integer histogram of 4096 bins: ends fixed at
 *  -1 and +1, inner entries moved to their cells' centroids, starting from the default
 *  book; deterministic (the same bytes give the same book on any number of threads).
 *  @return KBIT_SUCCESS; KBIT_ERROR_INVALID_ARGUMENT for bad k / dtype, n <= 0, NaN or Inf
 *  in the input, or an all-zero input; a pointer error. Nothing is written on failure. */
KBIT_API kbit_status kbit_fit_codebook_host(const void *input, const float *importance,
                                            int64_t n, kbit_dtype dtype, int k, float *codebook);

/*! kbit_fit_codebook_host on the GPU: input and codebook in device memory, asynchronous on
 *  `stream`, the same book for the same bytes. workspace: kbit_fit_codebook_workspace_bytes()
 *  bytes of device memory, zeroed once after allocation and left zeroed by every call
 *  (calls that may run at the same time need separate workspaces). An input with NaN or
 *  Inf, with no nonzero value, or with a weight that is negative, not finite or all zero
 *  cannot be reported before the kernels run: the book is then written as NaN. @return a status as kbit_fit_codebook_host, checked before any
 *  launch, or KBIT_ERROR_INVALID_ARGUMENT for a short workspace. */
KBIT_API kbit_status kbit_fit_codebook(const void *input, const float *importance, int64_t n,
                                       kbit_dtype dtype, int k, float *codebook, void *workspace,
                                       size_t workspace_bytes, kbit_stream_t stream);

/*! @return the bytes of device workspace kbit_fit_codebook takes. */
KBIT_API int64_t kbit_fit_codebook_workspace_bytes(void);

/* ---------------------------------------------------------------------------------
 * NF4 / FP4: bitsandbytes-compatible 4-bit blockwise quantization (SPEC section 2)
 *
 * Byte for byte what bitsandbytes' quantize_4bit(quant_type="nf4" / "fp4") produces
 * and dequantize_4bit reads. A tensor of n elements, flat, is cut into
 * kbit_nf4_absmax_count(n, blocksize) blocks of `blocksize` elements (a power of two,
 * 32..4096; bitsandbytes' default is 64); the last block may be partial.
 *  - absmax: one float32 per block, max |x| over the block.
 *  - packed: kbit_nf4_packed_bytes(n) = (n+1)/2 bytes; byte i holds the code of
 *    element 2i in its high nibble and of element 2i+1 in its low nibble (for odd n
 *    the last low nibble is the code of 0.0). Codes index the 16-entry NF4 table of
 *    the QLoRA paper or bitsandbytes' FP4 table (sign bit 8), with bitsandbytes'
 *    float32 values and its decision thresholds.
 *  - out[i] = table[code] * absmax[block] in float32, rounded to the output type.
 * "Double quantization" (bitsandbytes' compress_statistics=True) stores the absmax
 * array as 8-bit codes (qabsmax, one byte per block) of (absmax - offset) in blocks of
 * 256 with the signed dynamic map `code` (256 floats), one float32 absmax2 per
 * 256 blocks (kbit_nf4_absmax2_count) and one float32 offset (bitsandbytes uses the
 * mean of absmax); the block scale is then (code[q] * absmax2) + offset.
 *
 * T in the names is the element type of input (quantize) or output (dequantize).
 * Alignment: input/output to their element size, absmax/absmax2/code/offset to 4
 * bytes; packed and qabsmax need none (16-byte aligned pointers take the fast path).
 * An invalid blocksize returns KBIT_ERROR_INVALID_ARGUMENT. Every function below
 * has a `_host` twin (same arguments minus the stream, host memory) giving the same
 * bytes as the GPU one. The kbit_nf4_* helpers serve NF4 and FP4 alike.
 * ------------------------------------------------------------------------------- */

#define KBIT_NF4_DEFAULT_BLOCKSIZE 64
#define KBIT_NF4_DQ_BLOCKSIZE 256 /* blocksize of the second-level absmax codes */

/*! @return the packed size in bytes for n elements, (n+1)/2, or -1 if n < 0. */
KBIT_API int64_t kbit_nf4_packed_bytes(int64_t n);

/*! @return the number of blocks (absmax entries) for n elements, ceil(n/blocksize),
 *  or -1 if n < 0 or blocksize is not a power of two in 32..4096. */
KBIT_API int64_t kbit_nf4_absmax_count(int64_t n, int blocksize);

/*! @return the number of absmax2 entries for `count` absmax values under double
 *  quantization, ceil(count/256), or -1 if count < 0. */
KBIT_API int64_t kbit_nf4_absmax2_count(int64_t count);

/*! Writes bitsandbytes' signed dynamic map (create_dynamic_map(signed=True), the
 *  `code` of double quantization: 256 ascending floats from -1 to 1) to host memory.
 *  @return KBIT_SUCCESS, or KBIT_ERROR_NULL_POINTER / KBIT_ERROR_MISALIGNED. */
KBIT_API kbit_status kbit_nf4_dynamic_map_host(float *code);

/*! Per-type entries, F in {nf4, fp4} and T in {fp16, bf16, fp32}:
 *  - cquantize_<F>_<T>: quantizes n elements of input (T) into absmax[count] and
 *    packed[(n+1)/2];
 *  - cdequantize_<F>_<T>: writes n elements of output (T) from packed and absmax;
 *  - cdequantize_<F>_dq_<T>: the same from double-quantized scales: qabsmax[count]
 *    bytes, absmax2[ceil(count/256)], code[256] (NULL: the built-in dynamic map) and
 *    one offset float (in device memory for the GPU version);
 *  where count = kbit_nf4_absmax_count(n, blocksize).
 *  @return KBIT_SUCCESS, or KBIT_ERROR_INVALID_ARGUMENT (n < 0, bad blocksize),
 *  KBIT_ERROR_NULL_POINTER, KBIT_ERROR_MISALIGNED (nothing written), or a device
 *  error (KBIT_ERROR_NO_DEVICE, KBIT_ERROR_CUDA; KBIT_ERROR_NOT_SUPPORTED without CUDA). */
#define KBIT_DECLARE_NF4_FUNCS(F, T)                                                    \
    KBIT_API kbit_status cquantize_##F##_##T(const void *input, int64_t n, int blocksize, \
                                             float *absmax, uint8_t *packed,            \
                                             kbit_stream_t stream);                     \
    KBIT_API kbit_status cquantize_##F##_##T##_host(const void *input, int64_t n,       \
                                                    int blocksize, float *absmax,       \
                                                    uint8_t *packed);                   \
    KBIT_API kbit_status cdequantize_##F##_##T(const uint8_t *packed, const float *absmax, \
                                               int64_t n, int blocksize, void *output,  \
                                               kbit_stream_t stream);                   \
    KBIT_API kbit_status cdequantize_##F##_##T##_host(const uint8_t *packed,            \
                                                      const float *absmax, int64_t n,   \
                                                      int blocksize, void *output);     \
    KBIT_API kbit_status cdequantize_##F##_dq_##T(                                      \
        const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,            \
        const float *code, const float *offset, int64_t n, int blocksize, void *output, \
        kbit_stream_t stream);                                                          \
    KBIT_API kbit_status cdequantize_##F##_dq_##T##_host(                               \
        const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,            \
        const float *code, const float *offset, int64_t n, int blocksize, void *output);

KBIT_DECLARE_NF4_FUNCS(nf4, fp16)
KBIT_DECLARE_NF4_FUNCS(nf4, bf16)
KBIT_DECLARE_NF4_FUNCS(nf4, fp32)
KBIT_DECLARE_NF4_FUNCS(fp4, fp16)
KBIT_DECLARE_NF4_FUNCS(fp4, bf16)
KBIT_DECLARE_NF4_FUNCS(fp4, fp32)

#undef KBIT_DECLARE_NF4_FUNCS

/*! Writes the mean of absmax[0..count) to *mean (one float; device memory for the GPU
 *  version, written asynchronously): float(sum / count) with the sum in double in a
 *  fixed order, so host and GPU agree. count = 0 writes nothing. (bitsandbytes takes
 *  torch's float32 mean, which may differ in the last bit.) @return a status. */
KBIT_API kbit_status kbit_nf4_absmax_mean(const float *absmax, int64_t count, float *mean,
                                          kbit_stream_t stream);
KBIT_API kbit_status kbit_nf4_absmax_mean_host(const float *absmax, int64_t count,
                                               float *mean);

/*! Second-level quantization of count absmax values as bitsandbytes does it:
 *  v = absmax - *offset, absmax2[j] = max |v| over 256-block j, qabsmax[i] = the
 *  dynamic-map code of v / absmax2 (code: 256 floats, NULL for the built-in map).
 *  @return a status; nothing is written on bad input. */
KBIT_API kbit_status kbit_nf4_quantize_absmax(const float *absmax, int64_t count,
                                              const float *code, const float *offset,
                                              uint8_t *qabsmax, float *absmax2,
                                              kbit_stream_t stream);
KBIT_API kbit_status kbit_nf4_quantize_absmax_host(const float *absmax, int64_t count,
                                                   const float *code, const float *offset,
                                                   uint8_t *qabsmax, float *absmax2);

/*! Rebuilds count float32 absmax values: (code[qabsmax[i]] * absmax2[i/256]) + *offset.
 *  @return a status. */
KBIT_API kbit_status kbit_nf4_dequantize_absmax(const uint8_t *qabsmax, const float *absmax2,
                                                const float *code, const float *offset,
                                                int64_t count, float *absmax,
                                                kbit_stream_t stream);
KBIT_API kbit_status kbit_nf4_dequantize_absmax_host(const uint8_t *qabsmax,
                                                     const float *absmax2,
                                                     const float *code, const float *offset,
                                                     int64_t count, float *absmax);

/*! The n codes of a 4-bit weight in bitsandbytes' layout (NF4 or FP4; packed and float32
 *  absmax as cquantize_nf4_* writes them, a nested state expanded first with
 *  kbit_nf4_dequantize_absmax) as a kbit K = 4 weight (section 1 of the format):
 *  kbit_packed gets kbit_packed_words(n, 4) words (block b's bit planes, codes past n
 *  zero), kbit_absmax kbit_absmax_bytes(n, absmax_format) bytes: each 32-element block the
 *  absmax of the 4-bit block that holds it, as float32 (KBIT_ABSMAX_FP32) or rounded to
 *  half (KBIT_ABSMAX_FP16). With the format's 16-entry table as the codebook and
 *  tensor_scale 1 it dequantizes to exactly the same float32 values (with FP16: where
 *  every absmax is a half value, as the absmax of float16 weights is; a finite absmax
 *  beyond 65504 is KBIT_ERROR_RANGE on the host, nothing written, and on the GPU inf,
 *  raising the range flag of kbit_get_range_flag), and kbit_tile then repacks it for
 *  kbit_matmul_kbit_tiled. Asynchronous on `stream`.
 *  @return a status; nothing is written on bad input. */
KBIT_API kbit_status kbit_nf4_to_kbit(const uint8_t *packed, const float *absmax, int64_t n,
                                      int blocksize, kbit_absmax_format absmax_format,
                                      uint32_t *kbit_packed, void *kbit_absmax,
                                      kbit_stream_t stream);
KBIT_API kbit_status kbit_nf4_to_kbit_host(const uint8_t *packed, const float *absmax, int64_t n,
                                           int blocksize, kbit_absmax_format absmax_format,
                                           uint32_t *kbit_packed, void *kbit_absmax);

/* ---------------------------------------------------------------------------------
 * GGUF (ggml) blocks (SPEC section 3): Q4_0, Q8_0, Q4_K, Q5_K, Q6_K exactly as ggml
 * stores them (QK_K = 256), dequantized in ggml's element order.
 *
 * blocks: n / block_elems consecutive blocks of block_bytes each, as found in a GGUF
 * file (little-endian); the pointer needs only 2-byte alignment. n must be a multiple
 * of the type's block_elems (32 for Q4_0/Q8_0, 256 for the k-quants), else
 * KBIT_ERROR_INVALID_ARGUMENT. output: n elements of the type in the name (aligned to
 * its size; 16-byte alignment is fastest). Values are computed in float32 as ggml does
 * (products rounded before the min is subtracted), then rounded to nearest even.
 * ------------------------------------------------------------------------------- */

/* ggml's numeric tensor type ids (the values GGUF files store). */
#define KBIT_GGML_TYPE_Q4_0 2
#define KBIT_GGML_TYPE_Q8_0 8
#define KBIT_GGML_TYPE_Q4_K 12
#define KBIT_GGML_TYPE_Q5_K 13
#define KBIT_GGML_TYPE_Q6_K 14

/*! Block geometry of a supported ggml type: elements and bytes per block (either
 *  output pointer may be NULL). @return KBIT_SUCCESS, or KBIT_ERROR_INVALID_ARGUMENT
 *  for a type kbit does not dequantize (outputs untouched). */
KBIT_API kbit_status kbit_gguf_block_info(int ggml_type, int64_t *block_elems,
                                          int64_t *block_bytes);

#define KBIT_DECLARE_GGUF_FUNCS(Q, T)                                                  \
    KBIT_API kbit_status cdequantize_##Q##_##T(const void *blocks, int64_t n,          \
                                               void *output, kbit_stream_t stream);    \
    KBIT_API kbit_status cdequantize_##Q##_##T##_host(const void *blocks, int64_t n,   \
                                                      void *output);

#define KBIT_DECLARE_GGUF_TYPE(Q)                                                      \
    KBIT_DECLARE_GGUF_FUNCS(Q, fp16)                                                   \
    KBIT_DECLARE_GGUF_FUNCS(Q, bf16)                                                   \
    KBIT_DECLARE_GGUF_FUNCS(Q, fp32)

/*! cdequantize_<q4_0|q8_0|q4_K|q5_K|q6_K>_<fp16|bf16|fp32>[_host]: dequantizes n
 *  elements of `blocks` into `output`. @return KBIT_SUCCESS; KBIT_ERROR_INVALID_ARGUMENT
 *  (n < 0 or not a multiple of the block), KBIT_ERROR_NULL_POINTER,
 *  KBIT_ERROR_MISALIGNED, or a CUDA status; nothing is written on failure. */
KBIT_DECLARE_GGUF_TYPE(q4_0)
KBIT_DECLARE_GGUF_TYPE(q8_0)
KBIT_DECLARE_GGUF_TYPE(q4_K)
KBIT_DECLARE_GGUF_TYPE(q5_K)
KBIT_DECLARE_GGUF_TYPE(q6_K)

#undef KBIT_DECLARE_GGUF_TYPE
#undef KBIT_DECLARE_GGUF_FUNCS

/*! Generic GGUF dequantize: dispatches on ggml_type (KBIT_GGML_TYPE_*) and dtype (of
 *  output) to cdequantize_<type>_<T>. @return as those, plus
 *  KBIT_ERROR_INVALID_ARGUMENT for an unsupported ggml_type or dtype. */
KBIT_API kbit_status kbit_gguf_dequantize(int ggml_type, const void *blocks, int64_t n,
                                          kbit_dtype dtype, void *output,
                                          kbit_stream_t stream);
KBIT_API kbit_status kbit_gguf_dequantize_host(int ggml_type, const void *blocks,
                                               int64_t n, kbit_dtype dtype,
                                               void *output);

/*! A Q4_0 weight (ggml_type KBIT_GGML_TYPE_Q4_0, n elements, a multiple of 32) as a kbit
 *  K = 4 weight (section 1 of the format) that dequantizes to exactly the same float32
 *  values, so that kbit_tile and the kbit matmul kernels take it: kbit_packed gets
 *  kbit_packed_words(n, 4) words (block b's code i is its nibble q_i as it is, in bit
 *  planes), kbit_absmax kbit_absmax_bytes(n, absmax_format) bytes (block b's fp16 d, its
 *  bits for KBIT_ABSMAX_FP16, widened for KBIT_ABSMAX_FP32, a NaN as 0x7FFFFFFF). With the codebook
 *  {-8, -7, ..., 7} (entry c = c - 8) and tensor_scale 1, codebook[q] * d is ggml's
 *  (q - 8) * d. Other types: KBIT_ERROR_INVALID_ARGUMENT (the k-quants' per-block mins
 *  have no kbit form). blocks on 2 bytes, kbit_packed on 4, kbit_absmax on 4 (FP32) or 2
 *  (FP16). Asynchronous on `stream`.
 *  @return a status; nothing is written on bad input. */
KBIT_API kbit_status kbit_gguf_to_kbit(int ggml_type, const void *blocks, int64_t n,
                                       kbit_absmax_format absmax_format, uint32_t *kbit_packed,
                                       void *kbit_absmax, kbit_stream_t stream);
KBIT_API kbit_status kbit_gguf_to_kbit_host(int ggml_type, const void *blocks, int64_t n,
                                            kbit_absmax_format absmax_format,
                                            uint32_t *kbit_packed, void *kbit_absmax);

/* ---------------------------------------------------------------------------------
 * Fused dequantize + matmul (SPEC section 6)
 *
 * y = x · Wᵀ (+ bias) for a quantized weight W of shape [n_out, k_in], read as stored:
 * W is the flat row-major tensor of n_out * k_in elements in one of the formats above
 * (row r is elements r*k_in .. r*k_in + k_in - 1), so k_in must be a multiple of the
 * format's block: 32 for kbit, blocksize for NF4/FP4, the ggml type's block_elems for
 * GGUF. W's arrays are exactly those the format's quantize functions write for n =
 * n_out * k_in elements, with the same alignment rules. No dequantized copy of W is
 * written anywhere.
 *  - x: m * k_in elements, y: m * n_out elements, both row-major, contiguous and of
 *    `dtype`; bias: NULL or n_out elements of `dtype`, added to every row of y.
 *    x, y and bias are aligned to the element size, and y must not overlap the inputs.
 *  - W's values are those the format's dequantize gives in float32; products are
 *    accumulated in float32, the bias is added in float32 and y is rounded once to
 *    `dtype` (round to nearest even). On the GPU, fp16 / bf16 x meets W on tensor
 *    cores with W's codebook values rounded to x's type; on compute capability 9.0 from
 *    m = 17 rows (the wgmma GEMMs; from m = 9 for weights of 8192 rows or more, or stored
 *    ones of 2^25 elements or more, and from m = 8 for stored kbit with K >= 4 and NF4 /
 *    FP4 of 8192 rows or more, that the streamed one reads: tiled kbit, stored kbit
 *    whose rows of codes and scales are multiples of 16 bytes, NF4 / FP4 with k_in /
 *    blocksize a multiple of 4, arrays on 16 bytes) each weight's codebook value times its
 *    block scale is rounded once to x's type
 *    (tensor_scale stays float32, applied to the sums), except for fp16 x with fp32 kbit
 *    block scales, whose scales stay float32. NF4 / FP4 block
 *    scales above 65504 with fp16 x overflow there as in bitsandbytes' fp16 dequantize.
 *    GGUF weights there (from m = 17, or 16 for 2^25 elements or more; blocks on 16
 *    bytes, k_in % 256 == 0, Q6_K's % 2048) reach the tensor cores as (q - offset) * a + b
 *    for each scale group, a = d * sub-block scale, b = -dmin * min: with fp16 x, a, b and
 *    the result each rounded to fp16 (within about 1.5e-3 of a block's largest |W|); with
 *    bf16 x, computed in float32 and rounded once.
 *  - Any m >= 0; m = 0 or n_out = 0 writes nothing (the arguments are still checked).
 *    Pointers to arrays of zero elements may be NULL.
 *  - workspace (GPU entries): NULL with workspace_bytes 0 is always valid. The fastest
 *    path takes kbit_matmul_workspace_bytes(m, k_in, n_out) bytes of device memory,
 *    zeroed once after allocation; every call leaves it zeroed again. Calls that may run
 *    at the same time need separate workspaces.
 * Every entry returns KBIT_SUCCESS; KBIT_ERROR_INVALID_ARGUMENT (bad dtype, k, absmax
 * format, tensor_scale, blocksize or ggml type; a negative size, k_in not a multiple of
 * the block, or sizes whose bytes exceed the address space), KBIT_ERROR_NULL_POINTER,
 * KBIT_ERROR_MISALIGNED, or a device error (KBIT_ERROR_NO_DEVICE, KBIT_ERROR_CUDA;
 * KBIT_ERROR_NOT_SUPPORTED without CUDA). Nothing is written on failure.
 * ------------------------------------------------------------------------------- */

/*! kbit-format W: packed (kbit_packed_words(n_out * k_in, k) words, 4-byte aligned),
 *  absmax (kbit_absmax_bytes(n_out * k_in, absmax_format) bytes, aligned to its
 *  element), tensor_scale (finite, > 0), codebook (2^k floats; NULL: the built-in one),
 *  k in 2..5. Asynchronous on `stream`. @return a status (see above). */
KBIT_API kbit_status kbit_matmul_kbit(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                      kbit_dtype dtype, const uint32_t *packed,
                                      const void *absmax, kbit_absmax_format absmax_format,
                                      float tensor_scale, const float *codebook, int k,
                                      const void *bias, void *y, void *workspace,
                                      size_t workspace_bytes, kbit_stream_t stream);

/*! NF4 W in bitsandbytes' layout: packed ((n_out * k_in) / 2 bytes, any alignment),
 *  absmax (one float32 per blocksize elements, 4-byte aligned; expand a double-quantized
 *  state first with kbit_nf4_dequantize_absmax), blocksize a power of two in 32..4096.
 *  Asynchronous on `stream`. @return a status (see above). */
KBIT_API kbit_status kbit_matmul_nf4(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint8_t *packed,
                                     const float *absmax, int blocksize, const void *bias,
                                     void *y, void *workspace, size_t workspace_bytes,
                                     kbit_stream_t stream);

/*! kbit_matmul_nf4 for bitsandbytes' FP4 table. @return a status (see above). */
KBIT_API kbit_status kbit_matmul_fp4(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                     kbit_dtype dtype, const uint8_t *packed,
                                     const float *absmax, int blocksize, const void *bias,
                                     void *y, void *workspace, size_t workspace_bytes,
                                     kbit_stream_t stream);

/*! GGUF W: blocks of ggml_type (KBIT_GGML_TYPE_*), n_out * k_in / block_elems blocks of
 *  block_bytes each as stored in the file, 2-byte aligned. Asynchronous on `stream`.
 *  @return a status (see above). */
KBIT_API kbit_status kbit_matmul_gguf(const void *x, int64_t m, int64_t k_in, int64_t n_out,
                                      kbit_dtype dtype, int ggml_type, const void *blocks,
                                      const void *bias, void *y, void *workspace,
                                      size_t workspace_bytes, kbit_stream_t stream);

/*! @return the bytes of device workspace that let the kbit_matmul_* entries take their
 *  fastest path for this shape (0 when none helps), or -1 for a negative size. */
KBIT_API int64_t kbit_matmul_workspace_bytes(int64_t m, int64_t k_in, int64_t n_out);

/*! Host twin of kbit_matmul_kbit: the same arguments minus workspace, workspace_bytes
 *  and stream, every pointer in host memory; the work is split over the CPU's cores.
 *  @return a status (see above; KBIT_ERROR_INTERNAL if host memory for the few decoded
 *  rows of W each thread keeps runs out). */
KBIT_API kbit_status kbit_matmul_kbit_host(const void *x, int64_t m, int64_t k_in,
                                           int64_t n_out, kbit_dtype dtype,
                                           const uint32_t *packed, const void *absmax,
                                           kbit_absmax_format absmax_format,
                                           float tensor_scale, const float *codebook, int k,
                                           const void *bias, void *y);

/*! Host twin of kbit_matmul_nf4 (host memory, no workspace or stream).
 *  @return a status, as kbit_matmul_kbit_host. */
KBIT_API kbit_status kbit_matmul_nf4_host(const void *x, int64_t m, int64_t k_in,
                                          int64_t n_out, kbit_dtype dtype,
                                          const uint8_t *packed, const float *absmax,
                                          int blocksize, const void *bias, void *y);

/*! Host twin of kbit_matmul_fp4 (host memory, no workspace or stream).
 *  @return a status, as kbit_matmul_kbit_host. */
KBIT_API kbit_status kbit_matmul_fp4_host(const void *x, int64_t m, int64_t k_in,
                                          int64_t n_out, kbit_dtype dtype,
                                          const uint8_t *packed, const float *absmax,
                                          int blocksize, const void *bias, void *y);

/*! Host twin of kbit_matmul_gguf (host memory, no workspace or stream).
 *  @return a status, as kbit_matmul_kbit_host. */
KBIT_API kbit_status kbit_matmul_gguf_host(const void *x, int64_t m, int64_t k_in,
                                           int64_t n_out, kbit_dtype dtype, int ggml_type,
                                           const void *blocks, const void *bias, void *y);

/* ---------------------------------------------------------------------------------
 * Tiled kbit weights: a one-time repack for the fused matmul
 *
 * The same codes and scales as a kbit weight W [n_out, k_in] (k_in a multiple of 32),
 * reordered into the order the GPU matmul reads them: rows in tiles of 16, each row's
 * 32-element blocks in groups of 4, every lane's bits together and its element pairs'
 * codes interleaved (the layout is written out in csrc/formats/kbit_tiled.h). Rows and
 * blocks are padded with zeros to whole tiles and groups. kbit_matmul_kbit_tiled reads
 * it with about a third of the instructions per weight of kbit_matmul_kbit on the stored
 * layout (bench/RESULTS.md); the stored layout stays the format of record.
 * ------------------------------------------------------------------------------- */

/*! @return the bytes of the tiled codes of an [n_out, k_in] weight at k bits, or -1
 *  for a negative size, k_in not a multiple of 32, or k outside 2..5. */
KBIT_API int64_t kbit_tiled_packed_bytes(int64_t n_out, int64_t k_in, int k);

/*! @return the bytes of the tiled scales (absmax_format's size per block, padded like
 *  the codes), or -1 for bad arguments. */
KBIT_API int64_t kbit_tiled_absmax_bytes(int64_t n_out, int64_t k_in,
                                         kbit_absmax_format absmax_format);

/*! Repacks a stored kbit weight (packed: n_out * k_in / 32 * k words, absmax: its
 *  scales) into tiled_packed (kbit_tiled_packed_bytes) and tiled_absmax
 *  (kbit_tiled_absmax_bytes), both 16-byte aligned. Asynchronous on `stream`.
 *  @return KBIT_SUCCESS, KBIT_ERROR_INVALID_ARGUMENT, KBIT_ERROR_NULL_POINTER,
 *  KBIT_ERROR_MISALIGNED (nothing written) or a device error. */
KBIT_API kbit_status kbit_tile(const uint32_t *packed, const void *absmax,
                               kbit_absmax_format absmax_format, int k, int64_t n_out,
                               int64_t k_in, void *tiled_packed, void *tiled_absmax,
                               kbit_stream_t stream);
KBIT_API kbit_status kbit_tile_host(const uint32_t *packed, const void *absmax,
                                    kbit_absmax_format absmax_format, int k, int64_t n_out,
                                    int64_t k_in, void *tiled_packed, void *tiled_absmax);

/*! The inverse of kbit_tile: the stored packed words and absmax bytes, exactly.
 *  @return as kbit_tile. */
KBIT_API kbit_status kbit_untile(const void *tiled_packed, const void *tiled_absmax,
                                 kbit_absmax_format absmax_format, int k, int64_t n_out,
                                 int64_t k_in, uint32_t *packed, void *absmax,
                                 kbit_stream_t stream);
KBIT_API kbit_status kbit_untile_host(const void *tiled_packed, const void *tiled_absmax,
                                      kbit_absmax_format absmax_format, int k, int64_t n_out,
                                      int64_t k_in, uint32_t *packed, void *absmax);

/*! kbit_matmul_kbit on a tiled weight: the same result (the host twin gives the same
 *  bits as kbit_matmul_kbit_host). The GPU entry takes fp16 or bf16 x on 16-byte
 *  boundaries (else KBIT_ERROR_NOT_SUPPORTED: use kbit_matmul_kbit on the stored weight);
 *  the host twin takes every dtype. @return a status as kbit_matmul_kbit. */
KBIT_API kbit_status kbit_matmul_kbit_tiled(const void *x, int64_t m, int64_t k_in,
                                            int64_t n_out, kbit_dtype dtype,
                                            const void *tiled_packed,
                                            const void *tiled_absmax,
                                            kbit_absmax_format absmax_format,
                                            float tensor_scale, const float *codebook, int k,
                                            const void *bias, void *y, void *workspace,
                                            size_t workspace_bytes, kbit_stream_t stream);
KBIT_API kbit_status kbit_matmul_kbit_tiled_host(const void *x, int64_t m, int64_t k_in,
                                                 int64_t n_out, kbit_dtype dtype,
                                                 const void *tiled_packed,
                                                 const void *tiled_absmax,
                                                 kbit_absmax_format absmax_format,
                                                 float tensor_scale, const float *codebook,
                                                 int k, const void *bias, void *y);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KBIT_H_ */
