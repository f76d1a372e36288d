/* A program that uses libkbit: quantizes 4096 values to 4 bits on the CPU, dequantizes
 * them and prints the signal-to-noise ratio. Built three ways by the tests: CMake with
 * find_package(kbit), CMake with add_subdirectory(kbit), and make with pkg-config. */
#include <kbit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    enum { N = 4096, K = 4 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint32_t *packed = malloc((size_t)kbit_packed_words(N, K) * sizeof *packed);
    uint8_t *absmax = malloc((size_t)kbit_absmax_bytes(N, KBIT_ABSMAX_E4M4));
    if (!x || !y || !packed || !absmax) return 1;
    for (int i = 0; i < N; ++i) x[i] = sinf(0.37f * i) * (1.0f + 0.001f * i);

    kbit_status s = kbit_quantize_host(x, N, KBIT_DTYPE_FP32, K, NULL, KBIT_ABSMAX_E4M4, 1.0f,
                                       absmax, packed);
    if (s == KBIT_SUCCESS)
        s = kbit_dequantize_host(packed, absmax, KBIT_ABSMAX_E4M4, 1.0f, NULL, K, N,
                                 KBIT_DTYPE_FP32, y);
    if (s != KBIT_SUCCESS) {
        fprintf(stderr, "kbit: %s: %s\n", kbit_status_string(s), kbit_last_error_message());
        return 1;
    }
    double signal = 0, noise = 0;
    for (int i = 0; i < N; ++i) {
        signal += (double)x[i] * x[i];
        noise += (double)(x[i] - y[i]) * (x[i] - y[i]);
    }
    double sqnr = 10 * log10(signal / noise);
    printf("kbit %d: K=%d SQNR %.2f dB\n", kbit_version(), K, sqnr);
    free(x), free(y), free(packed), free(absmax);
    return sqnr > 15 ? 0 : 1;  /* 4-bit codes of smooth data: about 20 dB */
}
