/* Links libkbit like any C program: version, status strings, sizes, a host round trip
 * at every K and type, error statuses, and the GPU entry points' behaviour without a GPU. */
#include <kbit.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__,     \
                    __LINE__, #cond, kbit_last_error_message());            \
            ++failures;                                                     \
        }                                                                   \
    } while (0)

static float rnd(unsigned *state) { /* standard normal via Box-Muller on an LCG */
    *state = *state * 1664525u + 1013904223u;
    float u1 = ((*state >> 8) + 1.0f) / 16777218.0f;
    *state = *state * 1664525u + 1013904223u;
    float u2 = (*state >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

int main(void) {
    CHECK(kbit_version() == KBIT_VERSION_CODE);
    CHECK(strcmp(kbit_status_string(KBIT_SUCCESS), "KBIT_SUCCESS") == 0);
    CHECK(strcmp(kbit_status_string(KBIT_ERROR_RANGE), "KBIT_ERROR_RANGE") == 0);
    CHECK(strcmp(kbit_status_string((kbit_status)1234), "unknown status") == 0);
    CHECK(kbit_packed_words(33, 3) == 6);
    CHECK(kbit_packed_words(-1, 3) == -1 && kbit_packed_words(10, 6) == -1);
    CHECK(kbit_absmax_bytes(65, KBIT_ABSMAX_FP16) == 6);
    CHECK(kbit_e4m4_decode(255) == 31.0f && kbit_e4m4_decode(1) == ldexpf(1.0f, -14));

    enum { N = 1000 };
    static float x[N], y[N];
    unsigned state = 12345;
    for (int i = 0; i < N; ++i) x[i] = rnd(&state);
    static const double min_sqnr[6] = {0, 0, 6.5, 14.0, 20.0, 25.0};
    for (int k = 2; k <= 5; ++k) {
        uint32_t packed[(N + 31) / 32 * 5];
        uint8_t absmax[(N + 31) / 32];
        CHECK(kbit_quantize_host(x, N, KBIT_DTYPE_FP32, k, NULL, KBIT_ABSMAX_E4M4, 1.0f, absmax,
                                 packed) == KBIT_SUCCESS);
        CHECK(kbit_dequantize_host(packed, absmax, KBIT_ABSMAX_E4M4, 1.0f, NULL, k, N,
                                   KBIT_DTYPE_FP32, y) == KBIT_SUCCESS);
        double se = 0, ss = 0;
        for (int i = 0; i < N; ++i) {
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            ss += (double)x[i] * x[i];
        }
        double sqnr = 10 * log10(ss / se);
        printf("K=%d host round trip SQNR %.2f dB\n", k, sqnr);
        CHECK(sqnr > min_sqnr[k]);
    }
    /* The per-type symbol is the same function as the generic one. */
    {
        uint32_t p1[32 * 4 / 32 * 40], p2[32 * 4 / 32 * 40];
        uint8_t a1[40], a2[40];
        CHECK(cquantize_kbit_fp32_k4_host(x, N, NULL, KBIT_ABSMAX_E4M4, 1.0f, a1, p1) == KBIT_SUCCESS);
        CHECK(kbit_quantize_host(x, N, KBIT_DTYPE_FP32, 4, NULL, KBIT_ABSMAX_E4M4, 1.0f, a2, p2) ==
              KBIT_SUCCESS);
        CHECK(memcmp(p1, p2, sizeof(uint32_t) * kbit_packed_words(N, 4)) == 0);
        CHECK(memcmp(a1, a2, (size_t)kbit_absmax_bytes(N, KBIT_ABSMAX_E4M4)) == 0);
    }
    /* Bad input: a status, a message, nothing written. */
    {
        uint32_t packed[8];
        uint8_t absmax[2] = {7, 7};
        memset(packed, 0xAB, sizeof packed);
        CHECK(kbit_quantize_host(NULL, 10, KBIT_DTYPE_FP32, 4, NULL, KBIT_ABSMAX_E4M4, 1.0f,
                                 absmax, packed) == KBIT_ERROR_NULL_POINTER);
        CHECK(strlen(kbit_last_error_message()) > 0);
        CHECK(kbit_quantize_host(x, -1, KBIT_DTYPE_FP32, 4, NULL, KBIT_ABSMAX_E4M4, 1.0f,
                                 absmax, packed) == KBIT_ERROR_INVALID_ARGUMENT);
        CHECK(kbit_quantize_host(x, 10, KBIT_DTYPE_FP32, 7, NULL, KBIT_ABSMAX_E4M4, 1.0f,
                                 absmax, packed) == KBIT_ERROR_INVALID_ARGUMENT);
        CHECK(kbit_quantize_host((const char *)x + 1, 10, KBIT_DTYPE_FP32, 4, NULL,
                                 KBIT_ABSMAX_E4M4, 1.0f, absmax, packed) == KBIT_ERROR_MISALIGNED);
        CHECK(kbit_quantize_host(x, 0, KBIT_DTYPE_FP32, 4, NULL, KBIT_ABSMAX_E4M4, 1.0f, NULL,
                                 NULL) == KBIT_SUCCESS);
        CHECK(packed[0] == 0xABABABABu && absmax[0] == 7);
    }
    /* GPU entries without a GPU: a status, never a crash. */
    if (!kbit_cuda_available()) {
        uint32_t packed[8];
        uint8_t absmax[1];
        kbit_status s = cquantize_kbit_fp16_k3(x, 32, NULL, KBIT_ABSMAX_E4M4, 1.0f, absmax,
                                               packed, NULL);
        printf("GPU entry without a GPU: %s (%s)\n", kbit_status_string(s),
               kbit_last_error_message());
        CHECK(s == KBIT_ERROR_NOT_SUPPORTED || s == KBIT_ERROR_NO_DEVICE);
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
