/* Loads libkbit with dlopen, as a program in any language would, and round-trips one
 * block through symbols looked up by name. */
#include <dlfcn.h>
#include <kbit.h>
#include <math.h>
#include <stdio.h>

typedef kbit_status (*quantize_fn)(const void *, int64_t, const float *, kbit_absmax_format,
                                   float, void *, uint32_t *);
typedef kbit_status (*dequantize_fn)(const uint32_t *, const void *, kbit_absmax_format, float,
                                     const float *, int64_t, void *);
typedef int (*version_fn)(void);

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "libkbit.so";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen(%s) failed: %s\n", path, dlerror());
        return 1;
    }
    version_fn version = (version_fn)dlsym(lib, "kbit_version");
    quantize_fn q = (quantize_fn)dlsym(lib, "cquantize_kbit_fp32_k5_host");
    dequantize_fn dq = (dequantize_fn)dlsym(lib, "cdequantize_kbit_fp32_k5_host");
    /* Internals stay hidden: only the C API is exported. */
    void *hidden = dlsym(lib, "_ZN4kbit4failE11kbit_statusPKcz");
    void *cudart = dlsym(lib, "cudaMalloc");
    if (!version || !q || !dq || hidden || cudart) {
        fprintf(stderr, "symbol check failed: version=%p q=%p dq=%p hidden=%p cudaMalloc=%p\n",
                (void *)version, (void *)q, (void *)dq, hidden, cudart);
        return 1;
    }
    float x[32], y[32];
    for (int i = 0; i < 32; ++i) x[i] = sinf(0.7f * i) * (1.0f + i);
    uint32_t packed[5];
    float absmax[1];
    if (q(x, 32, NULL, KBIT_ABSMAX_FP32, 1.0f, absmax, packed) != KBIT_SUCCESS ||
        dq(packed, absmax, KBIT_ABSMAX_FP32, 1.0f, NULL, 32, y) != KBIT_SUCCESS) {
        fprintf(stderr, "round trip failed\n");
        return 1;
    }
    double worst = 0;
    for (int i = 0; i < 32; ++i) worst = fmax(worst, fabs(x[i] - y[i]) / absmax[0]);
    printf("dlopen(%s): version %d, K=5 worst error %.4f of absmax\n", path, version(), worst);
    dlclose(lib);
    /* K=5 normal-float: the largest gap between entries is < 0.2 of the scale. */
    return worst < 0.1 ? 0 : 1;
}
