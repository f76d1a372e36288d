// Device information shared by the launchers, and the GPU-side library queries.
#include <atomic>

#include "cuda.cuh"

namespace kbit {

namespace {
// A device attribute of the current device, read once per device and slot.
cudaError_t cached_attribute(int slot, cudaDeviceAttr attr, int *value) {
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
    if (dev >= 0 && dev < kMaxDevices) cache[slot][dev].store(c, std::memory_order_relaxed);
    *value = c;
    return cudaSuccess;
}
}  // namespace

cudaError_t sm_count(int *count) {
    return cached_attribute(0, cudaDevAttrMultiProcessorCount, count);
}

cudaError_t compute_major(int *major) {
    const cudaError_t err = cached_attribute(1, cudaDevAttrComputeCapabilityMajor, major);
#ifdef KBIT_TEST_DEVICE_MAJOR
    if (err == cudaSuccess && *major > KBIT_TEST_DEVICE_MAJOR) *major = KBIT_TEST_DEVICE_MAJOR;
#endif
    return err;
}

cudaError_t smem_optin(int *bytes) {
    const cudaError_t err = cached_attribute(2, cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes);
#ifdef KBIT_TEST_SMEM_OPTIN
    if (err == cudaSuccess && *bytes > KBIT_TEST_SMEM_OPTIN) *bytes = KBIT_TEST_SMEM_OPTIN;
#endif
    return err;
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
