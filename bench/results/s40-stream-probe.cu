// Dev probe (not shipped): a read-only bulk reader whose CTAs walk W the way the streamed
// tiled GEMV does: runs of `run` consecutive stages (a row tile's), the runs dealt
// round-robin over the CTAs; each stage `wbytes` of W and, optionally, `sbytes` of a
// second region (the scales) at the same stage index. A ring of `ring` slots.
// mode 0: one producer thread, a slot refilled as soon as it is full (the floor's reader);
// mode 1: 16 consumer warps wait for each stage and release it, every lane arriving on
// the slot's empty barrier (512 arrivals: the GEMV's protocol), the producer refills a slot
// once it is released; mode 2: as 1, one lane a warp arrives after __syncwarp (16); mode 3:
// as 2, and only that lane polls the full barrier (the others meet it at __syncwarp).
#include <cuda_runtime.h>
#include <cstdint>
namespace {
constexpr int kMaxRing = 16, kConsumers = 16;
__device__ __forceinline__ uint32_t sa(const void *p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp(uint32_t dst, const char *src, uint32_t bytes, uint32_t bar,
                                   uint64_t pol) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory");
}
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred d;\n w_%=:\n mbarrier.try_wait.parity.shared::cta.b64 d, [%0], %1;\n"
        " @!d bra w_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
template <int kMode>
__global__ void __launch_bounds__(kMode ? (kConsumers + 1) * 32 : 32, 1)
runs_kernel(const char *w, const char *s, int64_t stages, int wbytes, int sbytes, int run, int ring,
            unsigned *sink) {
    extern __shared__ __align__(128) char slots[];
    __shared__ __align__(8) uint64_t full[kMaxRing], empty[kMaxRing];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t runs = (stages + run - 1) / run;
    const int64_t my_runs = (runs - blockIdx.x + gridDim.x - 1) / gridDim.x;
    const int64_t mine = my_runs * run;  // (a short last run: its stages past the end skipped)
    auto stage_of = [&](int64_t i) { return (blockIdx.x + (i / run) * gridDim.x) * run + i % run; };
    // this CTA's stages: its runs', less the part of the last run past the end
    const int64_t last = runs - 1;
    const int64_t count = mine - ((last % gridDim.x == blockIdx.x) ? runs * run - stages : 0);
    const int slot = wbytes + sbytes;
    if (threadIdx.x == 0) {
        for (int i = 0; i < ring; ++i) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&full[i])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(&empty[i])),
                         "r"(kMode == 1 ? kConsumers * 32 : kConsumers));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const bool producer = kMode == 0 ? threadIdx.x == 0 : warp == kConsumers && lane == 0;
    if (producer) {
        uint64_t pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        int64_t next = 0;
        for (int64_t q = 0; q < count; ++q) {
            const int i = static_cast<int>(q % ring);
            const uint32_t lap = static_cast<uint32_t>(q / ring);
            if (q >= ring) {
                if (kMode == 0) wait(sa(&full[i]), (lap - 1) & 1);
                else wait(sa(&empty[i]), (lap - 1) & 1);
            }
            const int64_t st = stage_of(next++);
            const uint32_t bar = sa(&full[i]), dst = sa(slots + int64_t{i} * slot);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                         "r"(wbytes + sbytes) : "memory");
            cp(dst, w + st * wbytes, wbytes, bar, pol);
            if (sbytes) cp(dst + wbytes, s + st * sbytes, sbytes, bar, pol);
        }
        if (kMode == 0)
            for (int64_t q = count > ring ? count - ring : 0; q < count; ++q)
                wait(sa(&full[q % ring]), static_cast<uint32_t>(q / ring) & 1);
        return;
    }
    if (kMode == 0 || warp >= kConsumers) return;
    unsigned acc = 0;
    for (int64_t q = 0; q < count; ++q) {
        const int i = static_cast<int>(q % ring);
        if (kMode == 3) {  // one lane a warp polls
            if (lane == 0) wait(sa(&full[i]), static_cast<uint32_t>(q / ring) & 1);
            __syncwarp();
        } else {
            wait(sa(&full[i]), static_cast<uint32_t>(q / ring) & 1);
        }
        // one 4-byte read a lane of the warp's share, so the release guards a real read
        acc ^= *reinterpret_cast<volatile unsigned *>(slots + int64_t{i} * slot + (warp * 32 + lane) * 4);
        if (kMode == 1) {
            arrive(sa(&empty[i]));
        } else if (kMode == 3) {
            __syncwarp();
            if (lane == 0) arrive(sa(&empty[i]));
        } else {
            __syncwarp();
            if (lane == 0) arrive(sa(&empty[i]));
        }
    }
    if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;
}
template <int kMode>
int launch(const void *w, const void *s, int64_t stages, int wbytes, int sbytes, int run, int ring,
           int ctas, unsigned *sink, cudaStream_t st) {
    const int smem = (wbytes + sbytes) * ring;
    if (cudaFuncSetAttribute(runs_kernel<kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
        return 1;
    runs_kernel<kMode><<<ctas, kMode ? (kConsumers + 1) * 32 : 32, smem, st>>>(
        static_cast<const char *>(w), static_cast<const char *>(s), stages, wbytes, sbytes, run,
        ring, sink);
    return cudaGetLastError();
}
}  // namespace
extern "C" int runs_read(const void *w, const void *s, int64_t stages, int wbytes, int sbytes,
                         int run, int ring, int ctas, int mode, void *sink, void *stream) {
    if (ring > kMaxRing || ring < 1 || wbytes < 4 * 32 * kConsumers) return 1;
    auto *k = static_cast<unsigned *>(sink);
    auto st = static_cast<cudaStream_t>(stream);
    switch (mode) {
        case 0: return launch<0>(w, s, stages, wbytes, sbytes, run, ring, ctas, k, st);
        case 1: return launch<1>(w, s, stages, wbytes, sbytes, run, ring, ctas, k, st);
        case 2: return launch<2>(w, s, stages, wbytes, sbytes, run, ring, ctas, k, st);
        case 3: return launch<3>(w, s, stages, wbytes, sbytes, run, ring, ctas, k, st);
        default: return 1;
    }
}
