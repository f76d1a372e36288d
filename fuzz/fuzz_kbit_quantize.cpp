// libFuzzer target: kbit quantize on the host (kbit_quantize_host, after
// kbit_compute_tensor_scale_host where chosen) on fuzzed floats of every dtype (NaN, Inf,
// subnormals, huge values all come from the raw bits), then dequantize of the result.
//
// Input: [0] k-2 (bits 0-1), dtype (bits 2-3, mod 3), codebook mode (bits 4-5: NULL,
// fuzzed, built-in kind (bits 6-7, mod 3), fuzzed with its non-finite entries replaced);
// [1] absmax format (mod 3) (bits 0-1), tensor_scale mode (bits 2-3: 1.0, from
// kbit_compute_tensor_scale_host, fuzzed float, 2^(int8)[4]), finite-only input (bit 4:
// NaN/Inf elements become 0); [2..3] n (mod 1025); [4] exponent; then the fuzzed
// codebook (2^k float32), the tensor_scale float (mode 2), the n input elements.
//
// Checks, besides status and guard bytes:
//  - status: INVALID_ARGUMENT for a codebook with NaN/Inf or a bad tensor_scale (nothing
//    written); otherwise exactly RANGE when some block does not fit the format (for E4M4:
//    is not finite or has absmax / tensor_scale > 31; fp16: finite and > 65504; fp32:
//    finite and overflowing to inf), else SUCCESS (kbit.h);
//  - kbit_compute_tensor_scale_host gives a finite tensor_scale > 0 under which a finite
//    input quantizes with SUCCESS (its documented promise);
//  - round trip (dequantize to fp32): a block that fits dequantizes to finite values
//    (unless a codebook entry times the block's scale overflows), each within what the codebook's spacing allows of the input (the error bound below);
//    a non-finite block with fp32/fp16 scales dequantizes to NaN (kbit.h);
//  - quantizing the same input twice gives the same bytes.
#include <algorithm>

#include "common.h"

namespace {

constexpr int kBlock = 32;

// The largest distance from a value in [-v, v] to its nearest codebook entry.
double worst_distance(const float *book, int m, double v) {
    std::vector<double> s(book, book + m);
    std::sort(s.begin(), s.end());
    double worst = std::max(s.front() + v, v - s.back());  // beyond the ends
    for (int i = 0; i + 1 < m; ++i) {
        const double lo = std::max(s[i], -v), hi = std::min(s[i + 1], v);
        if (lo < hi) {  // the part of the gap inside [-v, v]
            const double mid = 0.5 * (s[i] + s[i + 1]);
            const double x = std::min(std::max(mid, lo), hi);
            worst = std::max(worst, std::min(x - s[i], s[i + 1] - x));
        }
    }
    return std::max(worst, 0.0);
}

float scale_of(const uint8_t *absmax, int fmt, int64_t b) {
    if (fmt == KBIT_ABSMAX_FP32) {
        float f;
        std::memcpy(&f, absmax + 4 * b, 4);
        return f;
    }
    if (fmt == KBIT_ABSMAX_FP16) {
        uint16_t h;
        std::memcpy(&h, absmax + 2 * b, 2);
        return fz::half_to_float(h);
    }
    return fz::e4m4_value(absmax[b]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz::Input in(data, size);
    const uint8_t h0 = in.u8(), h1 = in.u8();
    const int k = 2 + (h0 & 3), dtype = ((h0 >> 2) & 3) % 3, cb_mode = (h0 >> 4) & 3;
    const int fmt = (h1 & 3) % 3, ts_mode = (h1 >> 2) & 3;
    const bool finite_only = (h1 >> 4) & 1;
    const int64_t n = in.u16() % 1025;
    const int8_t ts_exp = static_cast<int8_t>(in.u8());
    const auto f = static_cast<kbit_absmax_format>(fmt);
    const auto dt = static_cast<kbit_dtype>(dtype);
    const int entries = 1 << k;

    fz::Buffer cb(cb_mode == 0 ? 0 : entries * 4);
    if (cb_mode == 1 || cb_mode == 3) in.bytes(cb.data(), cb.size());
    if (cb_mode == 3)
        for (int i = 0; i < entries; ++i)
            if (!std::isfinite(cb.as<float>()[i])) cb.as<float>()[i] = 0.0f;
    if (cb_mode == 2)
        fz::expect_status(kbit_codebook_host((h0 >> 6) % 3, k, cb.as<float>()), KBIT_SUCCESS);
    float book[32];
    if (cb.size()) std::memcpy(book, cb.data(), cb.size());
    else fz::expect_status(kbit_default_codebook_host(k, book), KBIT_SUCCESS);
    bool cb_ok = true;
    for (int i = 0; i < entries; ++i) cb_ok &= std::isfinite(book[i]);

    float ts_in = ts_mode == 2 ? in.f32() : 1.0f;
    const size_t esize = fz::dtype_bytes(dtype);
    fz::Buffer input(static_cast<size_t>(n) * esize);
    in.bytes(input.data(), input.size());
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        float v = fz::load(input.data(), dtype, static_cast<size_t>(i));
        if (finite_only && !std::isfinite(v)) {
            std::memset(input.data() + i * esize, 0, esize);
            v = 0.0f;
        }
        x[static_cast<size_t>(i)] = v;
    }
    bool all_finite = true;
    for (float v : x) all_finite &= std::isfinite(v);

    float ts = 1.0f;
    if (ts_mode == 1) {
        fz::Buffer out_ts(4);
        const kbit_status s = fz::ret(kbit_compute_tensor_scale_host(input.ptr_or_null(), n, dt, f,
                                                             out_ts.as<float>()));
        fz::check_output(out_ts, s);
        fz::expect_status(s, KBIT_SUCCESS);
        ts = out_ts.as<float>()[0];
        FZ_CHECK_MSG(ts > 0.0f && std::isfinite(ts), "compute_tensor_scale gave %a\n", ts);
    } else if (ts_mode == 2) {
        ts = ts_in;
    } else if (ts_mode == 3) {
        ts = std::ldexp(1.0f, ts_exp);
    }
    const bool ts_ok = ts > 0.0f && std::isfinite(ts);

    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const size_t scale_bytes = static_cast<size_t>(kbit_absmax_bytes(n, f));
    const size_t word_bytes = static_cast<size_t>(kbit_packed_words(n, k)) * 4;
    fz::Buffer absmax(scale_bytes), packed(word_bytes), absmax2(scale_bytes), packed2(word_bytes);
    const auto input_was = fz::snapshot(input), cb_was = fz::snapshot(cb);
    const float *cbp = cb.size() ? cb.as<float>() : nullptr;
    const kbit_status s = fz::ret(kbit_quantize_host(input.ptr_or_null(), n, dt, k, cbp, f, ts,
                                             absmax.ptr_or_null(), packed.as<uint32_t>()));
    fz::check_output(absmax, s);
    fz::check_output(packed, s);
    fz::check_input(input, input_was);
    fz::check_input(cb, cb_was);

    // The expected status.
    kbit_status want = KBIT_SUCCESS;
    if (n > 0 && !cb_ok) want = KBIT_ERROR_INVALID_ARGUMENT;
    if (!ts_ok) want = KBIT_ERROR_INVALID_ARGUMENT;
    std::vector<char> fits(static_cast<size_t>(blocks), 1), finite(static_cast<size_t>(blocks), 1);
    std::vector<float> amax(static_cast<size_t>(blocks), 0.0f);
    if (want == KBIT_SUCCESS) {
        for (int64_t b = 0; b < blocks; ++b) {
            float a = 0.0f;
            bool fin = true;
            for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
                fin &= std::isfinite(x[static_cast<size_t>(i)]);
                a = std::max(a, std::fabs(x[static_cast<size_t>(i)]));
            }
            const volatile float a_s = a / ts;
            bool over;
            if (fmt == KBIT_ABSMAX_E4M4) over = !fin || a_s > 31.0f;
            else if (fmt == KBIT_ABSMAX_FP16) over = fin && a_s > 65504.0f;
            else over = fin && std::isinf(a_s);
            fits[static_cast<size_t>(b)] = !over && fin;
            finite[static_cast<size_t>(b)] = fin;
            amax[static_cast<size_t>(b)] = a;
            if (over) want = KBIT_ERROR_RANGE;
        }
    }
    fz::expect_status(s, want);
    if (ts_mode == 1 && all_finite && cb_ok) FZ_CHECK(s == KBIT_SUCCESS);
    if (want == KBIT_ERROR_INVALID_ARGUMENT || n == 0) return 0;

    // Deterministic.
    const kbit_status again = fz::ret(kbit_quantize_host(input.data(), n, dt, k, cbp, f, ts,
                                                 absmax2.data(), packed2.as<uint32_t>()));
    fz::expect_status(again, s);
    FZ_CHECK(std::memcmp(absmax.data(), absmax2.data(), scale_bytes) == 0);
    FZ_CHECK(std::memcmp(packed.data(), packed2.data(), word_bytes) == 0);

    // Round trip.
    fz::Buffer y(static_cast<size_t>(n) * 4);
    const kbit_status sd = fz::ret(kbit_dequantize_host(packed.as<uint32_t>(), absmax.data(), f, ts, cbp, k,
                                                n, KBIT_DTYPE_FP32, y.data()));
    fz::check_output(y, sd);
    fz::expect_status(sd, KBIT_SUCCESS);
    const float *yv = y.as<float>();
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
        if (!finite[static_cast<size_t>(b)] && fmt != KBIT_ABSMAX_E4M4) {
            for (int64_t i = i0; i < i1; ++i)
                FZ_CHECK_MSG(std::isnan(yv[i]), "non-finite block %lld: y[%lld] = %a\n",
                             static_cast<long long>(b), static_cast<long long>(i), yv[i]);
            continue;
        }
        if (!fits[static_cast<size_t>(b)]) continue;
        // d: the decoded block scale; every |x| / d <= v; each x is within d * worst of a
        // codebook entry times d, plus float32 rounding of the scaling (relative) and,
        // when 1/d is not representable, the whole block (only for |x| < 2^-126).
        const double d = static_cast<double>(scale_of(absmax.data(), fmt, b)) * ts;
        const double a = amax[static_cast<size_t>(b)];
        double cb_max = 0;
        for (int j = 0; j < entries; ++j) cb_max = std::max(cb_max, std::fabs(double(book[j])));
        // (a fuzzed codebook may hold entries so large that entry * scale overflows)
        if (cb_max * d >= 3.4e38) continue;
        for (int64_t i = i0; i < i1; ++i)
            FZ_CHECK_MSG(std::isfinite(yv[i]), "fitting block %lld: y[%lld] = %a from x = %a\n",
                         static_cast<long long>(b), static_cast<long long>(i), yv[i],
                         x[static_cast<size_t>(i)]);
        if (d == 0.0) {  // an all-zero block (or one below the format): every y is 0 * entry
            for (int64_t i = i0; i < i1; ++i) FZ_CHECK(yv[i] == 0.0f);
            continue;
        }
        const double v = a / d;
        double tol = d * worst_distance(book, entries, v) + 1e-5 * d * (v + cb_max) +
                     std::ldexp(1.0, -140);
        if (d < std::ldexp(1.0, -120) || a < std::ldexp(1.0, -120)) tol += 2 * (a + d * cb_max);
        for (int64_t i = i0; i < i1; ++i) {
            const double err = std::fabs(double(yv[i]) - double(x[static_cast<size_t>(i)]));
            FZ_CHECK_MSG(err <= tol,
                         "block %lld (fmt %d, k %d, ts %a, scale %a, amax %a): x[%lld] = %a -> "
                         "%a, error %g > %g\n",
                         static_cast<long long>(b), fmt, k, ts, scale_of(absmax.data(), fmt, b),
                         a, static_cast<long long>(i), x[static_cast<size_t>(i)], yv[i], err, tol);
        }
    }
    return 0;
}
