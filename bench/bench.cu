// kbit benchmark: every kernel against a device-to-device copy of the same bytes,
// measured in the same run (see bench/README in RESULTS.md for the method).
//
//   kbit_bench [--json FILE] [--small] [--check-only] [--sizes 20,24,26,28] [--filter STR]
//
// Each case is checked once against the CPU implementation (bit-exact), then timed with
// CUDA events: warm-up, then `reps` runs each preceded by an L2 flush (a 256 MiB memset
// outside the timed region), median reported. Bytes per case are written out below.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_common.h"
#include "kbit.h"

namespace {

const char *kFmtName[] = {"fp32", "fp16", "e4m4"};
size_t absmax_size(kbit_absmax_format f) { return f == KBIT_ABSMAX_FP32 ? 4 : (f == KBIT_ABSMAX_FP16 ? 2 : 1); }

// One kbit configuration: quantize and dequantize cases sharing buffers.
void add_kbit_cases(bench::Runner &run, int64_t n, kbit_dtype t, int k, kbit_absmax_format f) {
    const int64_t nb = (n + 31) / 32;
    const size_t in_bytes = n * bench::type_size(t);
    const size_t packed_bytes = nb * k * 4;
    const size_t absmax_bytes = nb * absmax_size(f);
    auto host_in = bench::normal_input(n, t, 1234);
    bench::DeviceBuffer in(in_bytes), packed(packed_bytes), absmax(absmax_bytes), out(in_bytes);
    in.upload(host_in->data(), in_bytes);
    auto bufs = std::make_shared<std::vector<bench::DeviceBuffer>>();
    bufs->push_back(std::move(in));
    bufs->push_back(std::move(packed));
    bufs->push_back(std::move(absmax));
    bufs->push_back(std::move(out));
    void *d_in = (*bufs)[0].ptr, *d_packed = (*bufs)[1].ptr, *d_absmax = (*bufs)[2].ptr,
         *d_out = (*bufs)[3].ptr;

    char label[160];
    std::snprintf(label, sizeof label, "kbit K=%d %s absmax=%s", k, bench::type_name(t), kFmtName[f]);

    bench::Case q;
    q.family = "kbit";
    q.op = "quantize";
    q.config = label;
    q.n = n;
    // quantize reads the input once, writes K bits + the scale per element.
    q.bytes_read = in_bytes;
    q.bytes_written = packed_bytes + absmax_bytes;
    q.run = [=](cudaStream_t s) {
        return kbit_quantize(d_in, n, t, k, nullptr, f, 1.0f, d_absmax,
                             static_cast<uint32_t *>(d_packed), s);
    };
    q.check = [=]() {
        std::vector<uint8_t> hp(packed_bytes), ha(absmax_bytes), gp(packed_bytes), ga(absmax_bytes);
        if (kbit_quantize_host(host_in->data(), n, t, k, nullptr, f, 1.0f, ha.data(),
                               reinterpret_cast<uint32_t *>(hp.data())) != KBIT_SUCCESS)
            return std::string("host quantize failed: ") + kbit_last_error_message();
        bench::download(gp.data(), d_packed, packed_bytes);
        bench::download(ga.data(), d_absmax, absmax_bytes);
        if (gp != hp) return std::string("packed words differ from the host");
        if (ga != ha) return std::string("absmax differs from the host");
        return std::string();
    };
    q.keep = bufs;
    run.add(std::move(q));

    bench::Case d;
    d.family = "kbit";
    d.op = "dequantize";
    d.config = label;
    d.n = n;
    // dequantize reads K bits + the scale per element, writes the output type.
    d.bytes_read = packed_bytes + absmax_bytes;
    d.bytes_written = in_bytes;
    d.run = [=](cudaStream_t s) {
        return kbit_dequantize(static_cast<const uint32_t *>(d_packed), d_absmax, f, 1.0f,
                               nullptr, k, n, t, d_out, s);
    };
    d.check = [=]() {  // the host dequantize of the GPU's packed bytes (checked above)
        std::vector<uint8_t> gp(packed_bytes), ga(absmax_bytes), want(in_bytes), got(in_bytes);
        bench::download(gp.data(), d_packed, packed_bytes);
        bench::download(ga.data(), d_absmax, absmax_bytes);
        if (kbit_dequantize_host(reinterpret_cast<uint32_t *>(gp.data()), ga.data(), f, 1.0f,
                                 nullptr, k, n, t, want.data()) != KBIT_SUCCESS)
            return std::string("host dequantize failed: ") + kbit_last_error_message();
        bench::download(got.data(), d_out, in_bytes);
        if (got != want) return std::string("dequantized values differ from the host");
        return std::string();
    };
    d.keep = bufs;
    run.add(std::move(d));
}

}  // namespace

int main(int argc, char **argv) {
    bench::Options opt = bench::parse_options(argc, argv);
    bench::Runner run(opt);
    if (!run.ready()) return 1;

    const kbit_dtype types[] = {KBIT_DTYPE_FP16, KBIT_DTYPE_BF16, KBIT_DTYPE_FP32};
    const kbit_absmax_format fmts[] = {KBIT_ABSMAX_E4M4, KBIT_ABSMAX_FP16, KBIT_ABSMAX_FP32};
    for (int log2n : opt.sizes) {
        // A size is prepared, checked and timed before the next one allocates.
        const int64_t n = (int64_t{1} << log2n) + (opt.small ? 7 : 0);
        for (kbit_dtype t : types)
            for (int k = 2; k <= 5; ++k)
                for (kbit_absmax_format f : fmts) {
                    add_kbit_cases(run, n, t, k, f);
                    run.flush();
                }
        bench::add_family_cases(run, n);
        run.flush();
    }
    return run.finish();
}
