// Device information shared by the launchers, and the GPU-side library queries.
#include <atomic>

#include "cuda.cuh"

namespace kbit {

namespace {
// A device attribute of the current device, read once per device and slot, at most `cap`
// where cap > 0 (an emulating build's: cuda.cuh).
cudaError_t cached_attribute(int slot, cudaDeviceAttr attr, int *value, int cap = 0) {
    constexpr int kMaxDevices = 64, kSlots = 3;
    static std::atomic<int> cache[kSlots][kMaxDevices];  // 0 = not read yet
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev >= 0 && dev < kMaxDevices) {
        int c = cache[slot][dev].load(std::memory_order_relaxed);
        if (c > 0) {
            *value = c;
            return cudaSuccess;
        }
    }
    int c = 0;
    err = cudaDeviceGetAttribute(&c, attr, dev);
    if (err != cudaSuccess) return err;
    if (cap > 0 && c > cap) c = cap;
    if (dev >= 0 && dev < kMaxDevices) cache[slot][dev].store(c, std::memory_order_relaxed);
    *value = c;
    return cudaSuccess;
}

#ifndef KBIT_TEST_DEVICE_MAJOR
#define KBIT_TEST_DEVICE_MAJOR 0
#endif
#ifndef KBIT_TEST_SMEM_OPTIN
#define KBIT_TEST_SMEM_OPTIN 0
#endif
}  // namespace

cudaError_t sm_count(int *count) {
    return cached_attribute(0, cudaDevAttrMultiProcessorCount, count);
}

cudaError_t compute_major(int *major) {
    return cached_attribute(1, cudaDevAttrComputeCapabilityMajor, major, KBIT_TEST_DEVICE_MAJOR);
}

cudaError_t smem_optin(int *bytes) {
    return cached_attribute(2, cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes, KBIT_TEST_SMEM_OPTIN);
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
