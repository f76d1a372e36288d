// libFuzzer target: kbit dequantize on the host (kbit_dequantize_host and the typed
// cdequantize_kbit_<T>_k<K>_host) on fuzzed packed codes and block scales in every absmax
// format, k = 2..5, any n, the built-in, a named or a fuzzed codebook (NaN and Inf
// entries included: dequantize does not check them), fuzzed tensor_scale.
//
// Input: [0] k-2 (bits 0-1), dtype (bits 2-3, mod 3), codebook mode (bits 4-5: NULL,
// fuzzed, built-in kind (bits 6-7, mod 3), NULL); [1] absmax format (mod 4; 3: an invalid
// value 3 + [2]); [2] that value; [3..4] n (mod 2049); [5] tensor_scale mode (mod 4: 1.0,
// fuzzed float, 2^(int8)[6], 0.5); [6] exponent; then the fuzzed codebook (2^k float32),
// the tensor_scale float (mode 1), the packed words, the absmax bytes.
//
// Checks: the status is SUCCESS for valid arguments and INVALID_ARGUMENT otherwise
// (nothing written); no byte outside the output is touched and the inputs are not;
// every element is codebook[code] * (decode(absmax[b]) * tensor_scale, held at
// +-FLT_MAX for a finite decode) in float32 (SPEC
// section 1, code i of a block = bit i of its k words), rounded once to the dtype; the
// generic and the typed entry give the same bytes.
#include "common.h"

namespace {

using Deq = kbit_status (*)(const uint32_t *, const void *, kbit_absmax_format, float,
                            const float *, int64_t, void *);
#define FZ_ROW(T) {cdequantize_kbit_##T##_k2_host, cdequantize_kbit_##T##_k3_host, \
                   cdequantize_kbit_##T##_k4_host, cdequantize_kbit_##T##_k5_host}
const Deq kTyped[3][4] = {FZ_ROW(fp32), FZ_ROW(fp16), FZ_ROW(bf16)};  // [dtype][k - 2]
#undef FZ_ROW

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz::Input in(data, size);
    const uint8_t h0 = in.u8(), h1 = in.u8(), h2 = in.u8();
    const int k = 2 + (h0 & 3), dtype = ((h0 >> 2) & 3) % 3, cb_mode = (h0 >> 4) & 3;
    const int fmt_sel = h1 % 4;
    const int fmt = fmt_sel < 3 ? fmt_sel : 3 + h2;
    const bool fmt_ok = fmt_sel < 3;
    const int64_t n = in.u16() % 2049;
    const int ts_mode = in.u8() % 4;
    const int8_t ts_exp = static_cast<int8_t>(in.u8());

    const int entries = 1 << k;
    fz::Buffer cb(cb_mode == 1 || cb_mode == 2 ? entries * 4 : 0);
    if (cb_mode == 1) in.bytes(cb.data(), cb.size());
    if (cb_mode == 2)
        fz::expect_status(kbit_codebook_host((h0 >> 6) % 3, k, cb.as<float>()), KBIT_SUCCESS);
    float book[32];
    if (cb.size()) std::memcpy(book, cb.data(), cb.size());
    else fz::expect_status(kbit_default_codebook_host(k, book), KBIT_SUCCESS);

    float ts = 1.0f;
    if (ts_mode == 1) ts = in.f32();
    if (ts_mode == 2) ts = std::ldexp(1.0f, ts_exp);
    if (ts_mode == 3) ts = 0.5f;
    const bool ts_ok = ts > 0.0f && std::isfinite(ts);

    const int64_t words = kbit_packed_words(n, k);
    FZ_CHECK(words == (n + 31) / 32 * k);
    const int64_t scale_bytes = fmt_ok ? kbit_absmax_bytes(n, static_cast<kbit_absmax_format>(fmt)) : 0;
    FZ_CHECK(scale_bytes >= 0);
    fz::Buffer packed(static_cast<size_t>(words) * 4), absmax(static_cast<size_t>(scale_bytes));
    in.bytes(packed.data(), packed.size());
    in.bytes(absmax.data(), absmax.size());
    const auto packed_was = fz::snapshot(packed), absmax_was = fz::snapshot(absmax),
               cb_was = fz::snapshot(cb);

    const size_t out_bytes = static_cast<size_t>(n) * fz::dtype_bytes(dtype);
    fz::Buffer out(out_bytes), out_typed(out_bytes);
    const float *cbp = cb.size() ? cb.as<float>() : nullptr;
    const auto f = static_cast<kbit_absmax_format>(fmt);
    const kbit_status s = fz::ret(kbit_dequantize_host(packed.as<uint32_t>(), absmax.ptr_or_null(), f, ts,
                                               cbp, k, n, static_cast<kbit_dtype>(dtype),
                                               out.ptr_or_null()));
    const kbit_status s2 = fz::ret(kTyped[dtype][k - 2](packed.as<uint32_t>(), absmax.ptr_or_null(), f, ts,
                                                cbp, n, out_typed.ptr_or_null()));
    fz::check_output(out, s);
    fz::check_output(out_typed, s2);
    fz::check_input(packed, packed_was);
    fz::check_input(absmax, absmax_was);
    fz::check_input(cb, cb_was);
    const kbit_status want = fmt_ok && ts_ok ? KBIT_SUCCESS : KBIT_ERROR_INVALID_ARGUMENT;
    fz::expect_status(s, want);
    fz::expect_status(s2, want);
    if (want != KBIT_SUCCESS || n == 0) return 0;
    FZ_CHECK(std::memcmp(out.data(), out_typed.data(), out_bytes) == 0);

    // The formula, element by element.
    std::vector<float> ref(static_cast<size_t>(n));
    const uint32_t *w = packed.as<uint32_t>();
    for (int64_t i = 0; i < n; ++i) {
        const int64_t b = i / 32;
        uint32_t code = 0;
        for (int j = 0; j < k; ++j) code |= ((w[b * k + j] >> (i % 32)) & 1u) << j;
        float dec;
        if (fmt == KBIT_ABSMAX_FP32) dec = absmax.as<float>()[b];
        else if (fmt == KBIT_ABSMAX_FP16) dec = fz::half_to_float(absmax.as<uint16_t>()[b]);
        else dec = fz::e4m4_value(absmax.as<uint8_t>()[b]);
        volatile float scale = dec * ts;  // rounded to float32 before the product
        // a finite decode whose product rounds past FLT_MAX is held there (SPEC 1.2 as
        // the README states it: finite blocks stay finite)
        if (std::isinf(scale) && std::isfinite(dec))
            scale = std::copysign(3.4028234663852886e38f, static_cast<float>(scale));
        ref[static_cast<size_t>(i)] = book[code] * scale;
    }
    fz::check_rounded_from_f32(out.data(), dtype, ref.data(), static_cast<size_t>(n));
    return 0;
}
