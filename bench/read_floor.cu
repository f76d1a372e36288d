// What a kernel that only reads N bytes from global memory takes on this GPU: the floor
// under every matmul kernel whose time is bound by reading its weight. Not part of the
// library; bench/read_floor.py loads it (ctypes) and times each way of reading the same
// bytes the way bench/bench_matmul.py times the matmul (L2 flushed, the launch hidden).
//
// Two families of readers, each launched as one kernel over a byte range:
//   ldg:  every thread issues `unroll` independent 16-byte loads a step, grid-stride (a
//         warp reads 512 contiguous bytes a load), with a choice of cache hints;
//   bulk: one thread a CTA streams stages of `stage` bytes into a shared-memory ring of
//         `ring` slots with cp.async.bulk (the TMA engine, as the streamed GEMVs do),
//         waiting on each stage's mbarrier and refilling its slot at once; the stages are
//         a CTA's even contiguous share, dealt round-robin, or taken from a counter.
// Nothing is written but, in the counter mode, the counter's reset by the last CTA.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

enum Hint : int {
    kPlain = 0,        // ld.global
    kNoAllocate = 1,   // ld.global.nc, L1 not allocated
    kPrefetch256 = 2,  // the same, and L2 fetches 256-byte lines
    kEvictFirst = 3,   // the same, and L2 keeps the lines evict-first
};

__device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

template <int kHint>
__device__ __forceinline__ uint4 load16(const uint4 *p, uint64_t policy) {
    uint4 v;
    if constexpr (kHint == kPlain) {
        asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if constexpr (kHint == kNoAllocate) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if constexpr (kHint == kPrefetch256) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else {
        asm volatile(
            "ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
    }
    return v;
}

// (1024, 1): without the minimum of one CTA, ptxas aims at 2048 threads an SM (32 registers)
// and, at kUnroll = 8, reuses the first loads' registers: only 4 loads in flight (SASS).
template <int kUnroll, int kHint>
__global__ void __launch_bounds__(1024, 1) read_ldg(const uint4 *__restrict__ p, int64_t n16,
                                                    unsigned *sink) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
    const uint64_t policy = kHint == kEvictFirst ? evict_first_policy() : 0;
    unsigned acc = 0;
    for (; i + (kUnroll - 1) * stride < n16; i += kUnroll * stride) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = load16<kHint>(p + i + u * stride, policy);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = load16<kHint>(p + i, policy);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;  // a use of the loads, in practice never
}

enum Walk : int { kEven = 0, kRoundRobin = 1, kCounter = 2 };
constexpr int kMaxRing = 16;

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // the bulk reader's helpers
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void bulk_stage(uint32_t dst, const char *src, uint32_t bytes,
                                           uint32_t bar, bool evict_first, uint64_t policy) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
    if (evict_first) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
            " [%0], [%1], %2, [%3], %4;" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
            : "memory");
    } else {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
            : "memory");
    }
}

__device__ __forceinline__ void wait_parity(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred done;\n wait_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra wait_%=;\n}" ::"r"(bar), "r"(parity)
        : "memory");
}
#endif

// One thread a CTA: stages of `stage` bytes (a multiple of 16) through `ring` slots.
// counters (kCounter): [0] the next stage, [1] CTAs done; the last CTA zeroes both.
template <int kWalk>
__global__ void __launch_bounds__(32) read_bulk(const char *__restrict__ p, int64_t bytes,
                                                int stage, int ring, int evict_first,
                                                unsigned *counters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // cp.async.bulk: Hopper on
    extern __shared__ __align__(128) char slots[];
    __shared__ __align__(8) uint64_t full[kMaxRing];
    if (threadIdx.x != 0) return;
    const int64_t stages = (bytes + stage - 1) / stage;
    const int64_t ctas = gridDim.x, cta = blockIdx.x;
    int64_t first = 0, end = stages, step = 1;  // kEven: this CTA's contiguous share
    if (kWalk == kEven) first = stages * cta / ctas, end = stages * (cta + 1) / ctas;
    if (kWalk == kRoundRobin) first = cta, step = ctas;
    const uint64_t policy = evict_first_policy();
    for (int s = 0; s < ring; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");

    int64_t next = first;  // the next stage to issue (kCounter: taken from the counter)
    auto take = [&]() -> int64_t {
        if (kWalk == kCounter) return atomicAdd(&counters[0], 1u);
        const int64_t s = next;
        next += step;
        return s;
    };
    int64_t issued[kMaxRing];  // the stage in each slot (end: none)
    auto issue = [&](int s) {   // the next stage into slot s, if there is one
        issued[s] = take();
        if (issued[s] >= end) return false;
        const int64_t off = issued[s] * stage;
        bulk_stage(smem_addr(slots + int64_t{s} * stage), p + off,
                   static_cast<uint32_t>(bytes - off < stage ? bytes - off : stage),
                   smem_addr(&full[s]), evict_first, policy);
        return true;
    };
    for (int s = 0; s < ring; ++s) issued[s] = end;
    for (int s = 0; s < ring && issue(s); ++s) {
    }
    for (uint32_t lap = 0;; ++lap) {  // slot s's lap-th stage completes phase lap
        bool any = false;
        for (int s = 0; s < ring; ++s) {
            if (issued[s] >= end) continue;
            any = true;
            wait_parity(smem_addr(&full[s]), lap & 1);
            issue(s);
        }
        if (!any) break;
    }
    if (kWalk == kCounter) {
        __threadfence();
        if (atomicAdd(&counters[1], 1u) == gridDim.x - 1) {
            __threadfence();  // every other CTA's last take is before its count: acquire
            counters[0] = 0, counters[1] = 0;
        }
    }
#endif
}

template <int kHint>
cudaError_t launch_ldg(const void *p, int64_t n16, int ctas, int threads, int unroll,
                       unsigned *sink, cudaStream_t s) {
    const auto *q = static_cast<const uint4 *>(p);
    switch (unroll) {
        case 1: read_ldg<1, kHint><<<ctas, threads, 0, s>>>(q, n16, sink); break;
        case 2: read_ldg<2, kHint><<<ctas, threads, 0, s>>>(q, n16, sink); break;
        case 4: read_ldg<4, kHint><<<ctas, threads, 0, s>>>(q, n16, sink); break;
        case 8: read_ldg<8, kHint><<<ctas, threads, 0, s>>>(q, n16, sink); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <int kWalk>
cudaError_t launch_bulk(const char *p, int64_t bytes, int ctas, int stage, int ring,
                        int evict_first, unsigned *counters, cudaStream_t s) {
    const int smem = stage * ring;
    const cudaError_t e =
        cudaFuncSetAttribute(read_bulk<kWalk>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        cudaGetLastError();  // a refusal, not left pending for the caller's next launch
        return e;
    }
    read_bulk<kWalk><<<ctas, 32, smem, s>>>(p, bytes, stage, ring, evict_first, counters);
    return cudaGetLastError();
}

}  // namespace

extern "C" {

// Reads bytes (a multiple of 16, p 16-byte aligned) with ctas x threads threads, `unroll`
// (1, 2, 4, 8) loads in flight a thread and cache hint `hint` (enum Hint). sink: ctas
// unsigned (never written in practice). Returns a cudaError_t.
int rf_ldg(const void *p, int64_t bytes, int ctas, int threads, int unroll, int hint,
           void *sink, void *stream) {
    if (!p || bytes % 16 || ctas < 1 || threads < 32 || threads > 1024) return cudaErrorInvalidValue;
    auto *k = static_cast<unsigned *>(sink);
    auto s = static_cast<cudaStream_t>(stream);
    switch (hint) {
        case kPlain: return launch_ldg<kPlain>(p, bytes / 16, ctas, threads, unroll, k, s);
        case kNoAllocate: return launch_ldg<kNoAllocate>(p, bytes / 16, ctas, threads, unroll, k, s);
        case kPrefetch256: return launch_ldg<kPrefetch256>(p, bytes / 16, ctas, threads, unroll, k, s);
        case kEvictFirst: return launch_ldg<kEvictFirst>(p, bytes / 16, ctas, threads, unroll, k, s);
        default: return cudaErrorInvalidValue;
    }
}

// Reads bytes (a multiple of 16, p 16-byte aligned) in stages of stage_bytes (a multiple
// of 16) through a ring of `ring` (1..16) slots a CTA, walking the stages as `walk` (enum
// Walk); counters: two zeroed unsigned (kCounter; left zeroed). Needs compute capability
// 9.0 or later (cudaErrorNotSupported below). Returns a cudaError_t.
int rf_bulk(const void *p, int64_t bytes, int ctas, int stage_bytes, int ring, int walk,
            int evict_first, void *counters, void *stream) {
    if (!p || bytes % 16 || stage_bytes % 16 || stage_bytes <= 0 || ctas < 1 || ring < 1 ||
        ring > kMaxRing || int64_t{stage_bytes} * ring > (227 << 10) ||
        (walk == kCounter && !counters))
        return cudaErrorInvalidValue;
    // Once a process (the readers run on one device): cp.async.bulk needs compute
    // capability 9.0, and code built for it: a library without a 9.0 target runs its
    // compute_80 PTX, where the body is compiled out, and an empty kernel would time as a
    // (bogus) floor.
    static const cudaError_t usable = [] {
        int dev = 0, major = 0;
        cudaFuncAttributes fa{};
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
            return cudaErrorNoDevice;
        if (major < 9 || cudaFuncGetAttributes(&fa, read_bulk<kEven>) != cudaSuccess ||
            fa.ptxVersion < 90) {
            cudaGetLastError();  // (no image for this device: not left pending)
            return cudaErrorNotSupported;
        }
        return cudaSuccess;
    }();
    if (usable != cudaSuccess) return usable;
    const auto *q = static_cast<const char *>(p);
    auto *c = static_cast<unsigned *>(counters);
    auto s = static_cast<cudaStream_t>(stream);
    switch (walk) {
        case kEven: return launch_bulk<kEven>(q, bytes, ctas, stage_bytes, ring, evict_first, c, s);
        case kRoundRobin:
            return launch_bulk<kRoundRobin>(q, bytes, ctas, stage_bytes, ring, evict_first, c, s);
        case kCounter: return launch_bulk<kCounter>(q, bytes, ctas, stage_bytes, ring, evict_first, c, s);
        default: return cudaErrorInvalidValue;
    }
}

}  // extern "C"
