// libFuzzer target: the fused dequantize + matmul host entries (kbit_matmul_kbit_host,
// _kbit_tiled_host after kbit_tile_host, _nf4_host, _fp4_host, _gguf_host) on small
// fuzzed shapes (m 0..4, n_out 0..9, k_in 0..3 blocks) with fuzzed weights, x and bias.
//
// Input: [0] format (bits 0-2, mod 5: kbit, kbit tiled, nf4, fp4, gguf), dtype (bits
// 3-4, mod 3), bias (bit 5), k_in not a multiple of the block (bit 6), small x (bit 7:
// x and bias from int8 / 16 instead of raw bits); [1] m (mod 5); [2] n_out (mod 10);
// [3] k_in in blocks (mod 4); [4] kbit: k-2 (bits 0-1), absmax format (bits 2-3, mod 3),
// codebook (bits 4-5: NULL, fuzzed, NULL, built-in kind 1); nf4/fp4: log2(blocksize)-5
// (mod 3); gguf: type (mod 5); [5] kbit: log2(tensor_scale) (int8 mod 20); then the
// fuzzed codebook (kbit), the weight's arrays (kbit: packed words then scales; nf4/fp4:
// packed then float32 absmax; gguf: the blocks), x, bias.
//
// Checks, besides status and guard bytes (y, and every input unchanged):
//  - SUCCESS for valid arguments, INVALID_ARGUMENT for k_in not a multiple of the block
//    (y untouched);
//  - y within float32 accumulation error of x · Wᵀ + bias computed in double, W being
//    what the format's own dequantize gives in float32 (SPEC section 6), for every
//    output whose terms are finite and far from overflow: |error| <= (k_in + 4) 2^-24
//    (sum |x w| + |bias|), plus the rounding to fp16 / bf16 and subnormal slack;
//  - tiled: kbit_untile_host(kbit_tile_host(W)) gives back W's bytes, and the tiled
//    matmul gives the same bits as the stored-layout one (kbit.h).
#include <algorithm>
#include <memory>

#include "common.h"

namespace {

enum Kind { kKbit = 0, kTiled = 1, kNf4 = 2, kFp4 = 3, kGguf = 4 };
const int kGgufIds[5] = {KBIT_GGML_TYPE_Q4_0, KBIT_GGML_TYPE_Q8_0, KBIT_GGML_TYPE_Q4_K,
                         KBIT_GGML_TYPE_Q5_K, KBIT_GGML_TYPE_Q6_K};
const int64_t kGgufElems[5] = {32, 32, 256, 256, 256};
const int64_t kGgufBytes[5] = {18, 34, 144, 176, 210};

// Fills n elements of dtype: raw bits, or int8 / 16 (exact in every dtype).
void fill(fz::Input &in, fz::Buffer &b, int dtype, size_t n, bool small) {
    if (!small) {
        in.bytes(b.data(), b.size());
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        const float v = static_cast<int8_t>(in.u8()) / 16.0f;
        if (dtype == KBIT_DTYPE_FP32) {
            b.as<float>()[i] = v;
        } else {
            // int8 / 16 has at most 7 significant bits: exact in fp16 and bf16.
            uint16_t h;
            if (dtype == KBIT_DTYPE_BF16) {
                h = static_cast<uint16_t>(fz::bits(v) >> 16);
            } else if (v == 0.0f) {
                h = 0;
            } else {
                const float a = std::fabs(v);
                const int e = std::ilogb(a);
                const int mant = static_cast<int>(std::ldexp(a, 10 - e)) - 1024;
                h = static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | (e + 15) << 10 | mant);
            }
            b.as<uint16_t>()[i] = h;
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz::Input in(data, size);
    const uint8_t h0 = in.u8();
    const int kind = (h0 & 7) % 5, dtype = ((h0 >> 3) & 3) % 3;
    const bool has_bias = (h0 >> 5) & 1, ragged = (h0 >> 6) & 1, small = (h0 >> 7) & 1;
    const int64_t m = in.u8() % 5, n_out = in.u8() % 10, kblocks = in.u8() % 4;
    const uint8_t sub = in.u8();
    const int ts_exp = static_cast<int8_t>(in.u8()) % 20;
    const auto dt = static_cast<kbit_dtype>(dtype);

    // The format's block and the weight's arrays.
    int k = 2, fmt = 0, cb_mode = 0, blocksize = 32, gi = 0;
    int64_t block = 32;
    if (kind == kKbit || kind == kTiled) {
        k = 2 + (sub & 3), fmt = ((sub >> 2) & 3) % 3, cb_mode = (sub >> 4) & 3;
    } else if (kind == kNf4 || kind == kFp4) {
        blocksize = 32 << (sub % 3), block = blocksize;
    } else {
        gi = sub % 5, block = kGgufElems[gi];
    }
    const int64_t k_valid = kblocks * block;
    const int64_t k_in = ragged ? k_valid + 1 + (sub >> 6) : k_valid;  // never a multiple
    const int64_t w_elems = n_out * k_valid;
    const float ts = std::ldexp(1.0f, ts_exp);
    const auto f = static_cast<kbit_absmax_format>(fmt);

    fz::Buffer cb(cb_mode == 1 || cb_mode == 3 ? (4 << k) : 0);
    if (cb_mode == 1) in.bytes(cb.data(), cb.size());
    if (cb_mode == 3) fz::expect_status(kbit_codebook_host(1, k, cb.as<float>()), KBIT_SUCCESS);
    const float *cbp = cb.size() ? cb.as<float>() : nullptr;

    size_t w_bytes = 0, s_bytes = 0;
    if (kind == kKbit || kind == kTiled) {
        w_bytes = static_cast<size_t>(kbit_packed_words(w_elems, k)) * 4;
        s_bytes = static_cast<size_t>(kbit_absmax_bytes(w_elems, f));
    } else if (kind == kNf4 || kind == kFp4) {
        w_bytes = static_cast<size_t>(kbit_nf4_packed_bytes(w_elems));
        s_bytes = static_cast<size_t>(kbit_nf4_absmax_count(w_elems, blocksize)) * 4;
    } else {
        w_bytes = static_cast<size_t>(w_elems / block * kGgufBytes[gi]);
    }
    fz::Buffer wq(w_bytes), ws(s_bytes);
    in.bytes(wq.data(), wq.size());
    in.bytes(ws.data(), ws.size());
    const size_t es = fz::dtype_bytes(dtype);
    fz::Buffer x(static_cast<size_t>(m * k_in) * es), bias(has_bias ? static_cast<size_t>(n_out) * es : 0);
    fill(in, x, dtype, static_cast<size_t>(m * k_in), small);
    fill(in, bias, dtype, static_cast<size_t>(has_bias ? n_out : 0), small);
    const auto wq_was = fz::snapshot(wq), ws_was = fz::snapshot(ws), x_was = fz::snapshot(x),
               bias_was = fz::snapshot(bias), cb_was = fz::snapshot(cb);
    const void *bp = has_bias ? bias.data() : nullptr;

    // Tiled: the repack first (of the valid shape), and back.
    std::unique_ptr<fz::Buffer> tp, ta;
    if (kind == kTiled) {
        const int64_t tpb = kbit_tiled_packed_bytes(n_out, k_valid, k);
        const int64_t tab = kbit_tiled_absmax_bytes(n_out, k_valid, f);
        FZ_CHECK(tpb >= 0 && tab >= 0);
        tp.reset(new fz::Buffer(static_cast<size_t>(tpb)));
        ta.reset(new fz::Buffer(static_cast<size_t>(tab)));
        const kbit_status st = fz::ret(kbit_tile_host(wq.as<uint32_t>(), ws.data(), f, k, n_out,
                                                      k_valid, tp->data(), ta->data()));
        fz::check_output(*tp, st);
        fz::check_output(*ta, st);
        fz::expect_status(st, KBIT_SUCCESS);
        fz::Buffer back_q(w_bytes), back_s(s_bytes);
        const kbit_status su = fz::ret(kbit_untile_host(tp->data(), ta->data(), f, k, n_out, k_valid,
                                                        back_q.as<uint32_t>(), back_s.data()));
        fz::check_output(back_q, su);
        fz::check_output(back_s, su);
        fz::expect_status(su, KBIT_SUCCESS);
        FZ_CHECK(w_bytes == 0 || std::memcmp(back_q.data(), wq.data(), w_bytes) == 0);
        FZ_CHECK(s_bytes == 0 || std::memcmp(back_s.data(), ws.data(), s_bytes) == 0);
    }

    fz::Buffer y(static_cast<size_t>(m * n_out) * es);
    kbit_status s;
    switch (kind) {
        case kKbit:
            s = fz::ret(kbit_matmul_kbit_host(x.data(), m, k_in, n_out, dt, wq.as<uint32_t>(),
                                              ws.data(), f, ts, cbp, k, bp, y.data()));
            break;
        case kTiled:
            s = fz::ret(kbit_matmul_kbit_tiled_host(x.data(), m, k_in, n_out, dt, tp->data(),
                                                    ta->data(), f, ts, cbp, k, bp, y.data()));
            break;
        case kNf4:
        case kFp4:
            s = fz::ret((kind == kNf4 ? kbit_matmul_nf4_host : kbit_matmul_fp4_host)(
                x.data(), m, k_in, n_out, dt, wq.data(), ws.as<float>(), blocksize, bp, y.data()));
            break;
        default:
            s = fz::ret(kbit_matmul_gguf_host(x.data(), m, k_in, n_out, dt, kGgufIds[gi], wq.data(),
                                              bp, y.data()));
    }
    fz::check_output(y, s);
    fz::check_input(wq, wq_was);
    fz::check_input(ws, ws_was);
    fz::check_input(x, x_was);
    fz::check_input(bias, bias_was);
    fz::check_input(cb, cb_was);
    fz::expect_status(s, ragged ? KBIT_ERROR_INVALID_ARGUMENT : KBIT_SUCCESS);
    if (s != KBIT_SUCCESS || m == 0 || n_out == 0) return 0;

    if (kind == kTiled) {  // the same bits as the stored layout
        fz::Buffer y2(y.size());
        fz::expect_status(kbit_matmul_kbit_host(x.data(), m, k_in, n_out, dt, wq.as<uint32_t>(),
                                                ws.data(), f, ts, cbp, k, bp, y2.data()),
                          KBIT_SUCCESS);
        FZ_CHECK(std::memcmp(y.data(), y2.data(), y.size()) == 0);
    }

    // W as the format's dequantize gives it in float32.
    std::vector<float> w(static_cast<size_t>(w_elems));
    if (w_elems > 0) {
        fz::Buffer wf(static_cast<size_t>(w_elems) * 4);
        kbit_status sd;
        if (kind == kKbit || kind == kTiled)
            sd = fz::ret(kbit_dequantize_host(wq.as<uint32_t>(), ws.data(), f, ts, cbp, k, w_elems,
                                              KBIT_DTYPE_FP32, wf.data()));
        else if (kind == kNf4)
            sd = fz::ret(cdequantize_nf4_fp32_host(wq.data(), ws.as<float>(), w_elems, blocksize,
                                                   wf.data()));
        else if (kind == kFp4)
            sd = fz::ret(cdequantize_fp4_fp32_host(wq.data(), ws.as<float>(), w_elems, blocksize,
                                                   wf.data()));
        else
            sd = fz::ret(kbit_gguf_dequantize_host(kGgufIds[gi], wq.data(), w_elems,
                                                   KBIT_DTYPE_FP32, wf.data()));
        fz::expect_status(sd, KBIT_SUCCESS);
        std::memcpy(w.data(), wf.data(), wf.size());
    }

    const double eps = std::ldexp(1.0, -24);
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < n_out; ++r) {
            double ref = 0, mag = 0;
            bool finite = true;
            for (int64_t j = 0; j < k_in; ++j) {
                const double xv = fz::load(x.data(), dtype, static_cast<size_t>(i * k_in + j));
                const double wv = w[static_cast<size_t>(r * k_in + j)];
                finite &= std::isfinite(xv) && std::isfinite(wv);
                ref += xv * wv;
                mag += std::fabs(xv * wv);
            }
            const double bv = has_bias ? fz::load(bias.data(), dtype, static_cast<size_t>(r)) : 0.0;
            finite &= std::isfinite(bv);
            ref += bv;
            mag += std::fabs(bv);
            if (!finite || !(mag < 1e36)) continue;
            double tol = (k_in + 4) * eps * mag + (k_in + 1) * std::ldexp(1.0, -148);
            if (dtype == KBIT_DTYPE_FP16) {
                if (std::fabs(ref) + tol > 65000) continue;  // may round to inf
                tol += std::ldexp(std::fabs(ref) + tol, -11) + std::ldexp(1.0, -25);
            } else if (dtype == KBIT_DTYPE_BF16) {
                tol += std::ldexp(std::fabs(ref) + tol, -8) + std::ldexp(1.0, -133);
            }
            const double got = fz::load(y.data(), dtype, static_cast<size_t>(i * n_out + r));
            FZ_CHECK_MSG(std::fabs(got - ref) <= tol,
                         "kind %d dtype %d m %lld k_in %lld n_out %lld: y[%lld, %lld] = %.9g, "
                         "expected %.9g +- %.3g\n",
                         kind, dtype, static_cast<long long>(m), static_cast<long long>(k_in),
                         static_cast<long long>(n_out), static_cast<long long>(i),
                         static_cast<long long>(r), got, ref, tol);
        }
    }
    return 0;
}
