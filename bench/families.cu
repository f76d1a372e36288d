// Benchmark cases of the NF4/FP4 and GGUF families, checked against their CPU versions.
#include <cstring>
#include <random>

#include "bench_common.h"

namespace bench {
namespace {

template <class F>
std::string compare_with_host(F &&host, const void *device_out, size_t bytes) {
    std::vector<uint8_t> want(bytes), got(bytes);
    if (host(want.data()) != KBIT_SUCCESS) return std::string("host failed: ") + kbit_last_error_message();
    download(got.data(), device_out, bytes);
    return got == want ? std::string() : std::string("differs from the host");
}

// NF4/FP4 (bitsandbytes layout), blocksize 64: quantize and dequantize.
void add_nf4_cases(Runner &run, int64_t n, bool fp4, kbit_dtype t) {
    const int bs = 64;
    const size_t in_bytes = n * type_size(t), packed_bytes = (n + 1) / 2,
                 absmax_bytes = ((n + bs - 1) / bs) * 4;
    auto host_in = normal_input(n, t, 7);
    auto bufs = std::make_shared<std::vector<DeviceBuffer>>();
    bufs->emplace_back(in_bytes);
    bufs->emplace_back(packed_bytes);
    bufs->emplace_back(absmax_bytes);
    bufs->emplace_back(in_bytes);
    (*bufs)[0].upload(host_in->data(), in_bytes);
    void *in = (*bufs)[0].ptr, *out = (*bufs)[3].ptr;
    auto *packed = static_cast<uint8_t *>((*bufs)[1].ptr);
    auto *absmax = static_cast<float *>((*bufs)[2].ptr);

    using Q = kbit_status (*)(const void *, int64_t, int, float *, uint8_t *, kbit_stream_t);
    using QH = kbit_status (*)(const void *, int64_t, int, float *, uint8_t *);
    using D = kbit_status (*)(const uint8_t *, const float *, int64_t, int, void *, kbit_stream_t);
    using DH = kbit_status (*)(const uint8_t *, const float *, int64_t, int, void *);
    Q q_fn;
    QH qh_fn;
    D d_fn;
    DH dh_fn;
#define BENCH_PICK(F, T)                                                                   \
    q_fn = cquantize_##F##_##T, qh_fn = cquantize_##F##_##T##_host,                       \
    d_fn = cdequantize_##F##_##T, dh_fn = cdequantize_##F##_##T##_host
    if (!fp4) {
        if (t == KBIT_DTYPE_FP16) BENCH_PICK(nf4, fp16);
        else if (t == KBIT_DTYPE_BF16) BENCH_PICK(nf4, bf16);
        else BENCH_PICK(nf4, fp32);
    } else {
        if (t == KBIT_DTYPE_FP16) BENCH_PICK(fp4, fp16);
        else if (t == KBIT_DTYPE_BF16) BENCH_PICK(fp4, bf16);
        else BENCH_PICK(fp4, fp32);
    }
#undef BENCH_PICK
    char label[96];
    std::snprintf(label, sizeof label, "%s %s blocksize=64", fp4 ? "FP4" : "NF4", type_name(t));

    const char *family = fp4 ? "fp4" : "nf4";
    Case qc;
    qc.family = family;
    qc.op = "quantize";
    qc.config = label;
    qc.n = n;
    qc.bytes_read = in_bytes;                       // the input once
    qc.bytes_written = packed_bytes + absmax_bytes;  // 4 bits per element + fp32 per block
    qc.run = [=](cudaStream_t s) { return q_fn(in, n, bs, absmax, packed, s); };
    qc.check = [=]() {
        std::vector<uint8_t> hp(packed_bytes), ha(absmax_bytes), gp(packed_bytes), ga(absmax_bytes);
        if (qh_fn(host_in->data(), n, bs, reinterpret_cast<float *>(ha.data()), hp.data()) != KBIT_SUCCESS)
            return std::string("host quantize failed");
        download(gp.data(), packed, packed_bytes);
        download(ga.data(), absmax, absmax_bytes);
        return gp == hp && ga == ha ? std::string() : std::string("differs from the host");
    };
    qc.keep = bufs;
    run.add(std::move(qc));

    Case dc;
    dc.family = family;
    dc.op = "dequantize";
    dc.config = label;
    dc.n = n;
    dc.bytes_read = packed_bytes + absmax_bytes;
    dc.bytes_written = in_bytes;
    dc.run = [=](cudaStream_t s) { return d_fn(packed, absmax, n, bs, out, s); };
    dc.check = [=]() {
        std::vector<uint8_t> hp(packed_bytes), ha(absmax_bytes);
        download(hp.data(), packed, packed_bytes);
        download(ha.data(), absmax, absmax_bytes);
        return compare_with_host([&](void *dst) {
            return dh_fn(hp.data(), reinterpret_cast<float *>(ha.data()), n, bs, dst);
        }, out, in_bytes);
    };
    dc.keep = bufs;
    run.add(std::move(dc));
}

// GGUF blocks of one type: random quants with small, finite fp16 scales.
void add_gguf_case(Runner &run, int64_t n, int type, const char *name, kbit_dtype t) {
    int64_t elems = 0, bytes = 0;
    if (kbit_gguf_block_info(type, &elems, &bytes) != KBIT_SUCCESS) return;
    n = n / elems * elems;
    const int64_t blocks = n / elems;
    const size_t in_bytes = blocks * bytes, out_bytes = n * type_size(t);
    auto host_in = std::make_shared<std::vector<uint8_t>>(in_bytes);
    std::mt19937 gen(11 + type);
    for (auto &b : *host_in) b = static_cast<uint8_t>(gen());
    // Offsets of the fp16 scale fields (d, and dmin for the K-quants) in each block.
    std::vector<int> halves;
    if (type == KBIT_GGML_TYPE_Q4_0 || type == KBIT_GGML_TYPE_Q8_0) halves = {0};
    else if (type == KBIT_GGML_TYPE_Q6_K) halves = {208};
    else halves = {0, 2};
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    for (int64_t b = 0; b < blocks; ++b)
        for (int off : halves) {
            uint16_t h = f32_to_f16(scale(gen));
            std::memcpy(&(*host_in)[b * bytes + off], &h, 2);
        }
    auto bufs = std::make_shared<std::vector<DeviceBuffer>>();
    bufs->emplace_back(in_bytes);
    bufs->emplace_back(out_bytes);
    (*bufs)[0].upload(host_in->data(), in_bytes);
    const void *in = (*bufs)[0].ptr;
    void *out = (*bufs)[1].ptr;

    Case c;
    c.family = "gguf";
    c.op = "dequantize";
    char label[96];
    std::snprintf(label, sizeof label, "%s -> %s", name, type_name(t));
    c.config = label;
    c.n = n;
    c.bytes_read = in_bytes;  // the quantized blocks as stored
    c.bytes_written = out_bytes;
    c.run = [=](cudaStream_t s) { return kbit_gguf_dequantize(type, in, n, t, out, s); };
    c.check = [=]() {
        return compare_with_host([&](void *dst) {
            return kbit_gguf_dequantize_host(type, host_in->data(), n, t, dst);
        }, out, out_bytes);
    };
    c.keep = bufs;
    run.add(std::move(c));
}

}  // namespace

void add_family_cases(Runner &run, int64_t n) {
    for (kbit_dtype t : {KBIT_DTYPE_FP16, KBIT_DTYPE_BF16, KBIT_DTYPE_FP32}) {
        add_nf4_cases(run, n, false, t);
        run.flush();
    }
    add_nf4_cases(run, n, true, KBIT_DTYPE_FP16);
    run.flush();
    const struct {
        int type;
        const char *name;
    } types[] = {{KBIT_GGML_TYPE_Q4_0, "Q4_0"}, {KBIT_GGML_TYPE_Q8_0, "Q8_0"},
                 {KBIT_GGML_TYPE_Q4_K, "Q4_K"}, {KBIT_GGML_TYPE_Q5_K, "Q5_K"},
                 {KBIT_GGML_TYPE_Q6_K, "Q6_K"}};
    for (auto ty : types)
        for (kbit_dtype t : {KBIT_DTYPE_FP16, KBIT_DTYPE_FP32}) {
            add_gguf_case(run, n, ty.type, ty.name, t);
            run.flush();
        }
}

}  // namespace bench
