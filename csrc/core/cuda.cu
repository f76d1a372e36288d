// Device information shared by the launchers, and the GPU-side library queries.
#include <atomic>

#include "cuda.cuh"

namespace kbit {

cudaError_t sm_count(int *count) {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> cache[kMaxDevices];  // 0 = not read yet
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev >= 0 && dev < kMaxDevices) {
        int c = cache[dev].load(std::memory_order_relaxed);
        if (c > 0) {
            *count = c;
            return cudaSuccess;
        }
    }
    int c = 0;
    err = cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    if (dev >= 0 && dev < kMaxDevices) cache[dev].store(c, std::memory_order_relaxed);
    *count = c;
    return cudaSuccess;
}

}  // namespace kbit

extern "C" KBIT_API int kbit_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0 ? 1 : 0;
}
