// libFuzzer target: NF4 / FP4 on the host. Dequantize with plain float32 absmax and with
// the nested (double-quantized) state: qabsmax codes, absmax2, offset and the 256-entry
// code table (fuzzed or NULL for the built-in dynamic map); the second-level helpers
// (kbit_nf4_dequantize_absmax_host, _quantize_absmax_host, _absmax_mean_host); and quantize
// of fuzzed input (NaN, Inf, subnormals from the raw bits).
//
// Input: [0] format (bit 0: nf4 / fp4), dtype (bits 1-2, mod 3), mode (bits 3-4: plain
// dequantize, nested dequantize, nested with a fuzzed code table, quantize), bad
// blocksize (bit 5: blocksize = [1] * 3, never valid unless it happens to be a power of
// two in range); [1] log2(blocksize) - 5 (mod 8); [2..3] n (mod 4097); then per mode:
// plain: packed ((n+1)/2 bytes), absmax (count float32); nested: packed, qabsmax (count
// bytes), absmax2 (ceil(count/256) float32), offset (float32), [table: 256 float32];
// quantize: n input elements.
//
// Checks, besides status and guard bytes:
//  - element i = bnb_mul(table[code_i], scale of its block), code_i the high nibble of
//    byte i/2 for even i, the low one for odd i; bnb_mul = float32 product with
//    subnormal operands and result flushed to zero (bitsandbytes' .ftz); the 16-entry
//    table read once from the library (codes 0..15 against a scale of 1);
//  - nested: the block scale is (code[q] * absmax2[b/256]) + offset (ftz product, then a
//    float32 sum), exactly what kbit_nf4_dequantize_absmax_host writes, and the nested
//    dequantize equals the plain one over those scales byte for byte;
//  - 16-bit outputs are the float32 values rounded once;
//  - quantize: SUCCESS, absmax[b] = max |x| over the block (NaN ignored, subnormals as 0,
//    padding counted as 0), and a finite block dequantizes to finite values within
//    absmax * (largest gap of the table) / 2 of the input (plus float32 rounding).
#include <algorithm>

#include "common.h"

namespace {

using Deq = kbit_status (*)(const uint8_t *, const float *, int64_t, int, void *);
using DeqDq = kbit_status (*)(const uint8_t *, const uint8_t *, const float *, const float *,
                              const float *, int64_t, int, void *);
using Quant = kbit_status (*)(const void *, int64_t, int, float *, uint8_t *);
const Deq kDeq[2][3] = {{cdequantize_nf4_fp32_host, cdequantize_nf4_fp16_host, cdequantize_nf4_bf16_host},
                        {cdequantize_fp4_fp32_host, cdequantize_fp4_fp16_host, cdequantize_fp4_bf16_host}};
const DeqDq kDeqDq[2][3] = {
    {cdequantize_nf4_dq_fp32_host, cdequantize_nf4_dq_fp16_host, cdequantize_nf4_dq_bf16_host},
    {cdequantize_fp4_dq_fp32_host, cdequantize_fp4_dq_fp16_host, cdequantize_fp4_dq_bf16_host}};
const Quant kQuant[2][3] = {{cquantize_nf4_fp32_host, cquantize_nf4_fp16_host, cquantize_nf4_bf16_host},
                            {cquantize_fp4_fp32_host, cquantize_fp4_fp16_host, cquantize_fp4_bf16_host}};

// The 16 table values of a format, as the library decodes them against a scale of 1.
struct Table {
    float v[16];
    explicit Table(int fmt) {
        uint8_t packed[8];
        for (int i = 0; i < 8; ++i) packed[i] = static_cast<uint8_t>((2 * i) << 4 | (2 * i + 1));
        float one = 1.0f, out[16];
        fz::expect_status(kDeq[fmt][0](packed, &one, 16, 32, out), KBIT_SUCCESS);
        std::memcpy(v, out, sizeof v);
    }
};

float bnb_mul(float a, float b) {
    const volatile float p = fz::ftz(a) * fz::ftz(b);
    return fz::ftz(p);
}

int code_at(const uint8_t *packed, int64_t i) {
    return (i & 1) ? packed[i / 2] & 15 : packed[i / 2] >> 4;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const Table tables[2] = {Table(0), Table(1)};
    fz::Input in(data, size);
    const uint8_t h0 = in.u8(), h1 = in.u8();
    const int fmt = h0 & 1, dtype = ((h0 >> 1) & 3) % 3, mode = (h0 >> 3) & 3;
    const bool bad_bs = (h0 >> 5) & 1;
    int blocksize = 32 << (h1 % 8);
    if (bad_bs) blocksize = h1 * 3;
    const bool bs_ok = blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0;
    const int64_t n = in.u16() % 4097;
    const auto dt = static_cast<kbit_dtype>(dtype);
    const Table &table = tables[fmt];

    const int64_t count = kbit_nf4_absmax_count(n, blocksize);
    FZ_CHECK(bs_ok ? count == (n + blocksize - 1) / blocksize : count == -1);
    const int64_t count_or_0 = bs_ok ? count : 0;
    const int64_t count2 = kbit_nf4_absmax2_count(count_or_0);
    FZ_CHECK(count2 == (count_or_0 + 255) / 256);
    const size_t packed_bytes = static_cast<size_t>(kbit_nf4_packed_bytes(n));
    FZ_CHECK(packed_bytes == static_cast<size_t>((n + 1) / 2));
    const size_t esize = fz::dtype_bytes(dtype);
    const kbit_status want = bs_ok ? KBIT_SUCCESS : KBIT_ERROR_INVALID_ARGUMENT;

    if (mode == 3) {  // quantize
        fz::Buffer input(static_cast<size_t>(n) * esize), absmax(static_cast<size_t>(count_or_0) * 4),
            packed(packed_bytes);
        in.bytes(input.data(), input.size());
        const auto input_was = fz::snapshot(input);
        const kbit_status s = fz::ret(kQuant[fmt][dtype](input.ptr_or_null(), n, blocksize,
                                                 absmax.as<float>(), packed.as<uint8_t>()));
        fz::check_output(absmax, s);
        fz::check_output(packed, s);
        fz::check_input(input, input_was);
        fz::expect_status(s, want);
        if (s != KBIT_SUCCESS || n == 0) return 0;
        fz::Buffer y(static_cast<size_t>(n) * 4);
        fz::expect_status(kDeq[fmt][0](packed.data(), absmax.as<float>(), n, blocksize, y.data()),
                          KBIT_SUCCESS);
        fz::check_output(y, KBIT_SUCCESS);
        float gap = 0;
        std::vector<float> sorted(table.v, table.v + 16);
        std::sort(sorted.begin(), sorted.end());
        for (int i = 0; i + 1 < 16; ++i) gap = std::max(gap, sorted[i + 1] - sorted[i]);
        for (int64_t b = 0; b < count; ++b) {
            const int64_t i0 = b * blocksize, i1 = std::min(n, i0 + blocksize);
            float m = i1 - i0 < blocksize ? 0.0f : -3.4028234663852886e38f;
            bool fin = true;
            for (int64_t i = i0; i < i1; ++i) {
                const float v = fz::load(input.data(), dtype, static_cast<size_t>(i));
                fin &= std::isfinite(v);
                if (!std::isnan(v)) m = std::max(m, fz::ftz(std::fabs(v)));
            }
            const float got = absmax.as<float>()[b];
            FZ_CHECK_MSG(fz::same_or_both_nan(got, m), "absmax[%lld] = %a, expected %a\n",
                         static_cast<long long>(b), got, m);
            if (!fin || !(m > std::ldexp(1.0f, -100)) || m > 1e37f) continue;
            for (int64_t i = i0; i < i1; ++i) {
                const float x = fz::load(input.data(), dtype, static_cast<size_t>(i));
                const float yv = y.as<float>()[i];
                const double tol = m * (0.5 * gap + 1e-5) + std::ldexp(1.0, -126);
                FZ_CHECK_MSG(std::isfinite(yv) && std::fabs(double(yv) - x) <= tol,
                             "fmt %d: x[%lld] = %a -> %a (absmax %a)\n", fmt,
                             static_cast<long long>(i), x, yv, m);
            }
        }
        return 0;
    }

    fz::Buffer packed(packed_bytes);
    in.bytes(packed.data(), packed.size());
    const auto packed_was = fz::snapshot(packed);
    std::vector<float> scales(static_cast<size_t>(count_or_0));
    fz::Buffer out(static_cast<size_t>(n) * esize);
    kbit_status s;
    if (mode == 0) {
        fz::Buffer absmax(static_cast<size_t>(count_or_0) * 4);
        in.bytes(absmax.data(), absmax.size());
        const auto absmax_was = fz::snapshot(absmax);
        s = fz::ret(kDeq[fmt][dtype](packed.data(), absmax.as<float>(), n, blocksize, out.ptr_or_null()));
        fz::check_input(absmax, absmax_was);
        if (count_or_0) std::memcpy(scales.data(), absmax.data(), absmax.size());
    } else {
        fz::Buffer qabsmax(static_cast<size_t>(count_or_0)), absmax2(static_cast<size_t>(count2) * 4),
            offset(4), code(mode == 2 ? 256 * 4 : 0);
        in.bytes(qabsmax.data(), qabsmax.size());
        in.bytes(absmax2.data(), absmax2.size());
        in.bytes(offset.data(), 4);
        in.bytes(code.data(), code.size());
        const auto q_was = fz::snapshot(qabsmax), a2_was = fz::snapshot(absmax2),
                   off_was = fz::snapshot(offset), code_was = fz::snapshot(code);
        const float *codep = code.size() ? code.as<float>() : nullptr;
        s = fz::ret(kDeqDq[fmt][dtype](packed.data(), qabsmax.as<uint8_t>(), absmax2.as<float>(), codep,
                               offset.as<float>(), n, blocksize, out.ptr_or_null()));
        // The scales the helper rebuilds, and the formula.
        fz::Buffer rebuilt(static_cast<size_t>(count_or_0) * 4);
        const kbit_status sr = fz::ret(kbit_nf4_dequantize_absmax_host(
            qabsmax.as<uint8_t>(), absmax2.as<float>(), codep, offset.as<float>(), count_or_0,
            rebuilt.as<float>()));
        fz::check_output(rebuilt, sr);
        fz::expect_status(sr, KBIT_SUCCESS);
        float map[256];
        if (codep) std::memcpy(map, codep, sizeof map);
        else fz::expect_status(kbit_nf4_dynamic_map_host(map), KBIT_SUCCESS);
        for (int64_t b = 0; b < count_or_0; ++b) {
            const volatile float prod = bnb_mul(map[qabsmax.data()[b]], absmax2.as<float>()[b / 256]);
            const float want_scale = prod + offset.as<float>()[0];
            const float got = rebuilt.as<float>()[b];
            FZ_CHECK_MSG(fz::same_or_both_nan(got, want_scale) &&
                             (!std::isnan(got) || fz::bits(got) == 0x7FFFFFFFu),
                         "nested scale %lld: %a, expected %a\n", static_cast<long long>(b), got,
                         want_scale);
            scales[static_cast<size_t>(b)] = got;
        }
        // Second-level quantize and mean over those scales: status, guards, finiteness.
        if (count_or_0 > 0) {
            fz::Buffer mean(4), q2(static_cast<size_t>(count_or_0)), a2(static_cast<size_t>(count2) * 4);
            const kbit_status sm = fz::ret(kbit_nf4_absmax_mean_host(rebuilt.as<float>(), count_or_0,
                                                             mean.as<float>()));
            fz::check_output(mean, sm);
            fz::expect_status(sm, KBIT_SUCCESS);
            const kbit_status sq = fz::ret(kbit_nf4_quantize_absmax_host(
                rebuilt.as<float>(), count_or_0, codep, offset.as<float>(), q2.as<uint8_t>(),
                a2.as<float>()));
            fz::check_output(q2, sq);
            fz::check_output(a2, sq);
            fz::expect_status(sq, KBIT_SUCCESS);
        }
        fz::check_input(qabsmax, q_was);
        fz::check_input(absmax2, a2_was);
        fz::check_input(offset, off_was);
        fz::check_input(code, code_was);
        // The nested dequantize is the plain one over the rebuilt scales.
        if (s == KBIT_SUCCESS && n > 0) {
            fz::Buffer plain(out.size());
            fz::expect_status(kDeq[fmt][dtype](packed.data(), rebuilt.as<float>(), n, blocksize,
                                               plain.data()),
                              KBIT_SUCCESS);
            FZ_CHECK(std::memcmp(plain.data(), out.data(), out.size()) == 0);
        }
    }
    fz::check_output(out, s);
    fz::check_input(packed, packed_was);
    fz::expect_status(s, want);
    if (s != KBIT_SUCCESS || n == 0) return 0;

    std::vector<float> ref(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
        ref[static_cast<size_t>(i)] =
            bnb_mul(table.v[code_at(packed.data(), i)], scales[static_cast<size_t>(i / blocksize)]);
    fz::check_rounded_from_f32(out.data(), dtype, ref.data(), static_cast<size_t>(n));
    return 0;
}
