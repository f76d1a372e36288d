// Benchmark harness shared by every family: device buffers, options, and a runner that
// checks each case once, times it against a device-to-device copy of the same bytes
// and prints a table (plus JSON).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kbit.h"

namespace bench {

#define BENCH_CUDA(call)                                                                \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
                         cudaGetErrorString(e_));                                       \
            std::exit(2);                                                               \
        }                                                                               \
    } while (0)

inline uint16_t f32_to_f16(float f) {  // round to nearest even (normal range suffices here)
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax < 0x38800000u) return static_cast<uint16_t>(sign);  // flush tiny values
    if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7BFFu);
    return static_cast<uint16_t>(sign | ((ax + 0xC8000FFFu + ((ax >> 13) & 1u)) >> 13));
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

inline const char *type_name(kbit_dtype t) {
    return t == KBIT_DTYPE_FP32 ? "fp32" : (t == KBIT_DTYPE_FP16 ? "fp16" : "bf16");
}
inline size_t type_size(kbit_dtype t) { return t == KBIT_DTYPE_FP32 ? 4 : 2; }

// n values from N(0, 1) in type t (fp16/bf16 as raw bits), made on the host.
inline std::vector<uint8_t> make_normal_input(int64_t n, kbit_dtype t, uint32_t seed) {
    std::vector<uint8_t> buf(n * type_size(t));
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist;
    for (int64_t i = 0; i < n; ++i) {
        const float x = dist(gen);
        if (t == KBIT_DTYPE_FP32) {
            std::memcpy(&buf[i * 4], &x, 4);
        } else {
            const uint16_t h = t == KBIT_DTYPE_FP16 ? f32_to_f16(x) : f32_to_bf16(x);
            std::memcpy(&buf[i * 2], &h, 2);
        }
    }
    return buf;
}

// The same, made once per (n, type, seed) and shared: generating 2^28 normals takes
// seconds, and every K and absmax format of a size reads the same input. The cache
// holds one size at a time.
inline std::shared_ptr<const std::vector<uint8_t>> normal_input(int64_t n, kbit_dtype t,
                                                                uint32_t seed) {
    static std::map<std::pair<int, uint32_t>, std::shared_ptr<const std::vector<uint8_t>>> cache;
    static int64_t cached_n = -1;
    if (n != cached_n) cache.clear(), cached_n = n;
    auto &slot = cache[{static_cast<int>(t), seed}];
    if (!slot) slot = std::make_shared<const std::vector<uint8_t>>(make_normal_input(n, t, seed));
    return slot;
}

struct DeviceBuffer {
    void *ptr = nullptr;
    size_t bytes = 0;
    explicit DeviceBuffer(size_t n) : bytes(n) { BENCH_CUDA(cudaMalloc(&ptr, n ? n : 1)); }
    DeviceBuffer(DeviceBuffer &&o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; }
    DeviceBuffer(const DeviceBuffer &) = delete;
    ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
    void upload(const void *src, size_t n) { BENCH_CUDA(cudaMemcpy(ptr, src, n, cudaMemcpyHostToDevice)); }
};

inline void download(void *dst, const void *src, size_t n) {
    BENCH_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

struct Case {
    std::string family, op, config;
    int64_t n = 0;
    size_t bytes_read = 0, bytes_written = 0;  // the minimum traffic of the operation
    std::function<kbit_status(cudaStream_t)> run;
    std::function<std::string()> check;          // "" when the GPU result is right
    std::shared_ptr<void> keep;                  // buffers the lambdas use
};

struct Options {
    std::vector<int> sizes{20, 24, 26, 28};
    bool small = false, check_only = false;
    std::string json, filter;
};

inline Options parse_options(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--small") { o.small = true; o.sizes = {12}; }
        else if (a == "--check-only") o.check_only = true;
        else if (a == "--json" && i + 1 < argc) o.json = argv[++i];
        else if (a == "--filter" && i + 1 < argc) o.filter = argv[++i];
        else if (a == "--sizes" && i + 1 < argc) {
            o.sizes.clear();
            std::string s = argv[++i];
            for (size_t p = 0; p < s.size();) {
                size_t q = s.find(',', p);
                o.sizes.push_back(std::atoi(s.substr(p, q - p).c_str()));
                p = q == std::string::npos ? s.size() : q + 1;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--json FILE] [--small] [--check-only] "
                                 "[--sizes 20,24,26,28] [--filter STR]\n", argv[0]);
            std::exit(2);
        }
    }
    return o;
}

class Runner {
public:
    explicit Runner(Options opt) : opt_(std::move(opt)) {
        int dev = 0;
        cudaDeviceProp prop{};
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
            std::fprintf(stderr, "kbit_bench: no CUDA device\n");
            return;
        }
        device_ = prop.name;
        BENCH_CUDA(cudaStreamCreate(&stream_));
        BENCH_CUDA(cudaEventCreate(&start_));
        BENCH_CUDA(cudaEventCreate(&stop_));
        BENCH_CUDA(cudaMalloc(&flush_, kFlushBytes));
        ok_ = true;
        std::printf("device: %s (%d SMs, L2 %d MiB), libkbit %d\n", prop.name,
                    prop.multiProcessorCount, prop.l2CacheSize >> 20, kbit_version());
        std::printf("%-10s %-10s %-34s %11s %10s %8s %8s %7s  %s\n", "family", "op", "config", "n",
                    "time_us", "GB/s", "copyGB/s", "%copy", "check");
    }
    ~Runner() {
        if (flush_) cudaFree(flush_);
    }
    bool ready() const { return ok_; }
    bool wants(const std::string &family) const {
        return opt_.filter.empty() || family.find(opt_.filter) != std::string::npos;
    }
    void add(Case c) {
        if (wants(c.family + " " + c.op + " " + c.config)) pending_.push_back(std::move(c));
    }

    // Checks and times the pending cases, then frees their buffers.
    void flush() {
        for (Case &c : pending_) run_case(c);
        pending_.clear();
    }

    int finish() {
        flush();
        if (!opt_.json.empty()) write_json();
        std::printf("%d case(s), %d check failure(s)\n", cases_, failures_);
        return failures_ ? 1 : 0;
    }

private:
    static constexpr size_t kFlushBytes = size_t{256} << 20;

    template <class F>
    float median_ms(F &&launch, int reps) {
        for (int i = 0; i < 3; ++i) launch();
        std::vector<float> t(reps);
        for (int r = 0; r < reps; ++r) {
            BENCH_CUDA(cudaMemsetAsync(flush_, r & 0xFF, kFlushBytes, stream_));
            BENCH_CUDA(cudaEventRecord(start_, stream_));
            launch();
            BENCH_CUDA(cudaEventRecord(stop_, stream_));
            BENCH_CUDA(cudaEventSynchronize(stop_));
            BENCH_CUDA(cudaEventElapsedTime(&t[r], start_, stop_));
        }
        std::sort(t.begin(), t.end());
        return t[reps / 2];
    }

    // A device-to-device copy moving the same traffic (half read, half written).
    float copy_ms(size_t traffic) {
        auto it = copy_cache_.find(traffic);
        if (it != copy_cache_.end()) return it->second;
        size_t half = traffic / 2;
        DeviceBuffer a(half), b(half);
        BENCH_CUDA(cudaMemsetAsync(a.ptr, 1, half, stream_));
        float ms = median_ms([&] { BENCH_CUDA(cudaMemcpyAsync(b.ptr, a.ptr, half,
                                                              cudaMemcpyDeviceToDevice, stream_)); },
                             reps_for(traffic));
        copy_cache_[traffic] = ms;
        return ms;
    }

    static int reps_for(size_t traffic) { return traffic > (size_t{256} << 20) ? 20 : 50; }

    void run_case(Case &c) {
        ++cases_;
        kbit_status s = c.run(stream_);
        BENCH_CUDA(cudaStreamSynchronize(stream_));
        // The CPU reference is single-threaded: check up to 2^24 elements (every
        // configuration is checked at the smaller sizes of the same run).
        const bool checked = c.n <= (int64_t{1} << 24);
        std::string err = s != KBIT_SUCCESS ? std::string(kbit_status_string(s)) + ": " +
                                                  kbit_last_error_message()
                          : checked ? c.check() : std::string();
        Row row{c.family, c.op, c.config, c.n, 0, 0, 0,
                err.empty() ? (checked ? "ok" : "ok (not rechecked)") : err};
        if (!err.empty()) ++failures_;
        size_t traffic = c.bytes_read + c.bytes_written;
        if (err.empty() && !opt_.check_only) {
            float ms = median_ms([&] { c.run(stream_); }, reps_for(traffic));
            float cms = copy_ms(traffic);
            row.time_us = ms * 1e3;
            row.gbps = traffic / (ms * 1e-3) / 1e9;
            row.copy_gbps = traffic / (cms * 1e-3) / 1e9;
        }
        std::printf("%-10s %-10s %-34s %11lld %10.1f %8.0f %8.0f %6.1f%%  %s\n", row.family.c_str(),
                    row.op.c_str(), row.config.c_str(), static_cast<long long>(row.n), row.time_us,
                    row.gbps, row.copy_gbps, row.copy_gbps > 0 ? 100.0 * row.gbps / row.copy_gbps : 0.0,
                    row.check.c_str());
        std::fflush(stdout);
        rows_.push_back(row);
    }

    void write_json() {
        FILE *f = std::fopen(opt_.json.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "cannot write %s\n", opt_.json.c_str());
            return;
        }
        std::fprintf(f, "{\"device\": \"%s\", \"rows\": [\n", device_.c_str());
        for (size_t i = 0; i < rows_.size(); ++i) {
            const Row &r = rows_[i];
            std::fprintf(f, "  {\"family\": \"%s\", \"op\": \"%s\", \"config\": \"%s\", \"n\": %lld, "
                            "\"time_us\": %.2f, \"gbps\": %.1f, \"copy_gbps\": %.1f, \"pct_copy\": %.2f, "
                            "\"check\": \"%s\"}%s\n",
                         r.family.c_str(), r.op.c_str(), r.config.c_str(), static_cast<long long>(r.n),
                         r.time_us, r.gbps, r.copy_gbps,
                         r.copy_gbps > 0 ? 100.0 * r.gbps / r.copy_gbps : 0.0, r.check.c_str(),
                         i + 1 < rows_.size() ? "," : "");
        }
        std::fprintf(f, "]}\n");
        std::fclose(f);
    }

    struct Row {
        std::string family, op, config;
        int64_t n;
        double time_us, gbps, copy_gbps;
        std::string check;
    };

    Options opt_;
    bool ok_ = false;
    std::string device_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t start_ = nullptr, stop_ = nullptr;
    void *flush_ = nullptr;
    std::map<size_t, float> copy_cache_;
    std::vector<Case> pending_;
    std::vector<Row> rows_;
    int cases_ = 0, failures_ = 0;
};

// Cases of the other families (NF4/FP4, GGUF) at n elements: bench/families.cu.
void add_family_cases(Runner &run, int64_t n);

}  // namespace bench
