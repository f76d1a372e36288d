// CUDA helpers shared by the kernel families: error mapping and launch geometry.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "numeric.h"
#include "status.h"

namespace kbit {

// Maps a CUDA error to a status, keeping the CUDA text for kbit_last_error_message()
// and clearing the (non-sticky) error state so that it is not reported twice.
inline kbit_status cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return KBIT_SUCCESS;
    cudaGetLastError();
    kbit_status s = (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
                     err == cudaErrorInitializationError)
                        ? KBIT_ERROR_NO_DEVICE
                        : KBIT_ERROR_CUDA;
    return fail(s, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

// Number of resident blocks of `threads` threads to launch for a grid-stride kernel:
// enough to fill every SM `per_sm` times, never more than the work needs.
// Cached per device: cudaGetDevice/cudaDeviceGetAttribute are cheap but not free.
cudaError_t sm_count(int *count);
// The current device's compute capability major number (cached per device too).
cudaError_t compute_major(int *major);
// The shared memory a block of the current device may opt in to (cached per device; 227 KB
// on sm_90, 163 KB on sm_80, 99 KB on sm_86 / 89 / 120).
cudaError_t smem_optin(int *bytes);
// Emulating a smaller GPU (development builds; `make emulated-check`): a build with
// KBIT_TEST_SMEM_OPTIN defined caps smem_optin there, and allow_smem refuses what a device
// of that limit would refuse; with KBIT_TEST_DEVICE_MAJOR, compute_major reports at most
// that major. An H100 then runs the launchers' paths of an A100 (8, 166912) or of an sm_86
// / 89 GPU (8, 101376): the same kernels, their choices and fallbacks.
// The current device's range flag (kbit_get_range_flag; csrc/quant/kbit.cu): a GPU entry
// that cannot return KBIT_ERROR_RANGE without synchronising raises it (atomicOr 1).
cudaError_t device_range_flag(unsigned int **flag);

inline cudaError_t grid_for(int64_t work_items, int per_sm, int *grid) {
    // A non-sticky error left by the caller's own earlier CUDA call is not ours to
    // report after our launch: drop it first.
    cudaGetLastError();
    int sms = 0;
    cudaError_t err = sm_count(&sms);
    if (err != cudaSuccess) return err;
    int64_t cap = static_cast<int64_t>(sms) * per_sm;
    int64_t g = work_items < cap ? work_items : cap;
    *grid = static_cast<int>(g < 1 ? 1 : g);
    return cudaSuccess;
}

// Grid for a grid-stride kernel: as many blocks as are resident at once on every SM
// (from the occupancy calculator, read once per kernel), never more than the work.
// With max_waves > 1, up to that many times as many, as long as every block still gets
// min_items work items: the hardware then hands the last blocks to whichever SMs are
// free, so SMs that progress unevenly cost less at the end of the kernel.
template <auto Kernel>
cudaError_t resident_grid(int threads, size_t smem, int64_t work_items, int *grid,
                          int max_waves = 1, int64_t min_items = 1) {
    static std::atomic<int> per_sm{0};
    int b = per_sm.load(std::memory_order_relaxed);
    if (b == 0) {
        cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, threads, smem);
        if (err != cudaSuccess) return err;
        b = b < 1 ? 1 : b;
        per_sm.store(b, std::memory_order_relaxed);
    }
    int sms = 0;
    cudaError_t err = sm_count(&sms);
    if (err != cudaSuccess) return err;
    const int64_t one_wave = static_cast<int64_t>(sms) * b;
    int64_t waves = work_items / (one_wave * min_items);
    waves = waves < 1 ? 1 : (waves > max_waves ? max_waves : waves);
    return grid_for(work_items, static_cast<int>(b * waves), grid);
}

// Two floats rounded to T (fp16/bf16) and packed into one word, a in the low half (the
// lower address): the kernels build 16-byte stores from these.
__device__ __forceinline__ uint32_t pack2(F16, float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ uint32_t pack2(BF16, float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// Shared-memory loads at 32-bit shared addresses (__cvta_generic_to_shared). Plain asm,
// so the compiler schedules them freely: data that a barrier guards must carry the
// dependence in the address (see mbar_wait in csrc/matmul/gemv.cu). lds_u32x4_if reads
// only where `on`, else gives zeros.
__device__ __forceinline__ uint16_t lds_u16(uint32_t at) {
    uint16_t v;
    asm("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(at));
    return v;
}
__device__ __forceinline__ uint32_t lds_u32(uint32_t at) {
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(at));
    return v;
}
__device__ __forceinline__ uint2 lds_u32x2(uint32_t at) {
    uint2 v;
    asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(at));
    return v;
}
__device__ __forceinline__ uint4 lds_u32x4(uint32_t at) {
    uint4 v;
    asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "r"(at));
    return v;
}
// The same load kept in program order among the shared-memory stores, barriers and
// arrivals around it (volatile, a memory clobber): for data handed between threads with
// no address dependence to order it.
__device__ __forceinline__ uint4 lds_u32x4_ordered(uint32_t at) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(at)
                 : "memory");
    return v;
}
// 32- and 64-bit shared-memory stores, in program order as lds_u32x4_ordered.
__device__ __forceinline__ void sts_u32(uint32_t at, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_u32x2(uint32_t at, uint32_t a, uint32_t b) {
    asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(at), "r"(a), "r"(b) : "memory");
}
__device__ __forceinline__ uint4 lds_u32x4_if(bool on, uint32_t at) {
    uint4 v = make_uint4(0, 0, 0, 0);
    asm(
        "{\n .reg .pred p;\n setp.ne.b32 p, %4, 0;\n"
        " @p ld.shared.v4.u32 {%0, %1, %2, %3}, [%5];\n}\n"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "r"(static_cast<uint32_t>(on)), "r"(at));
    return v;
}
__device__ __forceinline__ float2 lds_float2(uint32_t at) {
    float2 v;
    asm("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(at));
    return v;
}
__device__ __forceinline__ float4 lds_float4(uint32_t at) {
    float4 v;
    asm("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
        : "r"(at));
    return v;
}

// After a launch: the launch's own error, if any.
inline cudaError_t launch_error() { return cudaGetLastError(); }

}  // namespace kbit
