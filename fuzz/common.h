// Shared by the libFuzzer targets of fuzz/: reading the fuzzer's bytes, output buffers
// between poisoned guard bytes, status checks, and float conversions written
// independently of the library's (csrc/core/numeric.h) so that the targets can check
// its results against the documented formulas.
//
// Input convention of every target: a few header bytes that choose the call (format,
// dtype, k, sizes, ...), then the data the call reads; bytes past the end read as 0, so
// every input, however short, is a valid test case. fuzz/make_corpus.py writes seeds in
// the same layouts.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kbit.h"

#if defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define KBIT_FUZZ_ASAN 1
#  endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#  define KBIT_FUZZ_ASAN 1
#endif
#ifdef KBIT_FUZZ_ASAN
#  include <sanitizer/asan_interface.h>
#endif

namespace fz {

// ---- failure -----------------------------------------------------------------------

[[noreturn]] inline void die(const char *file, int line, const char *what) {
    std::fprintf(stderr, "\nFUZZ CHECK FAILED at %s:%d: %s\n  last kbit message: %s\n", file,
                 line, what, kbit_last_error_message());
    std::abort();  // libFuzzer reports the input as a crash
}
#define FZ_CHECK(cond)                                                     \
    do {                                                                   \
        if (!(cond)) ::fz::die(__FILE__, __LINE__, #cond);                 \
    } while (0)
#define FZ_CHECK_MSG(cond, ...)                                            \
    do {                                                                   \
        if (!(cond)) {                                                     \
            std::fprintf(stderr, "\n" __VA_ARGS__);                        \
            ::fz::die(__FILE__, __LINE__, #cond);                          \
        }                                                                  \
    } while (0)

// A status is one of the pinned enum values.
inline void check_range(kbit_status s) {
    const int v = static_cast<int>(s);
    FZ_CHECK_MSG(v >= KBIT_SUCCESS && v <= KBIT_ERROR_INTERNAL, "status %d\n", v);
}
// ... and a failure leaves a message. Wraps every call whose status is kept (the message
// is the calling thread's, cleared by the next kbit call):
//   const kbit_status s = fz::ret(kbit_...(...));
inline kbit_status ret(kbit_status s) {
    check_range(s);
    if (s != KBIT_SUCCESS)
        FZ_CHECK_MSG(kbit_last_error_message()[0] != '\0', "status %d without a message\n",
                     static_cast<int>(s));
    return s;
}
// The status is exactly the one expected. Pass either a call directly or a status
// kept through ret().
inline void expect_status(kbit_status got, kbit_status want) {
    check_range(got);
    FZ_CHECK_MSG(got == want, "status %d (%s), expected %d (%s)\n", static_cast<int>(got),
                 kbit_status_string(got), static_cast<int>(want), kbit_status_string(want));
}

// ---- the fuzzer's bytes --------------------------------------------------------------

class Input {
  public:
    Input(const uint8_t *data, size_t size) : p_(data), end_(data + size) {}
    uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
    uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
    uint32_t u32() { return u16() | (static_cast<uint32_t>(u16()) << 16); }
    float f32() {
        const uint32_t b = u32();
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    // n bytes into dst (zeros past the end of the input).
    void bytes(void *dst, size_t n) {
        auto *d = static_cast<uint8_t *>(dst);
        const size_t have = std::min<size_t>(n, static_cast<size_t>(end_ - p_));
        if (have) std::memcpy(d, p_, have);
        std::memset(d + have, 0, n - have);
        p_ += have;
    }
    size_t left() const { return static_cast<size_t>(end_ - p_); }

  private:
    const uint8_t *p_, *end_;
};

// ---- buffers -----------------------------------------------------------------------

// n bytes between kGuard poisoned bytes on each side (16-byte aligned data). Under ASan
// the guards are also poisoned in ASan's shadow, so any read or write of them is
// reported where it happens; without ASan, intact() finds writes afterwards.
class Buffer {
  public:
    static constexpr size_t kGuard = 64;
    static constexpr uint8_t kPoison = 0xA5;

    explicit Buffer(size_t n, uint8_t fill = kPoison) : n_(n) {
        raw_ = static_cast<uint8_t *>(std::aligned_alloc(16, round16(kGuard + n + kGuard)));
        FZ_CHECK(raw_ != nullptr);
        std::memset(raw_, kPoison, kGuard);
        std::memset(raw_ + kGuard, fill, n);
        std::memset(raw_ + kGuard + n, kPoison, round16(kGuard + n + kGuard) - kGuard - n);
        poison(true);
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    ~Buffer() {
        poison(false);
        std::free(raw_);
    }

    uint8_t *data() { return raw_ + kGuard; }
    const uint8_t *data() const { return raw_ + kGuard; }
    size_t size() const { return n_; }
    template <class T>
    T *as() { return reinterpret_cast<T *>(data()); }
    // Null for an empty buffer (pointers to zero elements may be NULL) when asked.
    void *ptr_or_null() { return n_ ? data() : nullptr; }

    // The guards still hold the poison.
    bool guards_intact() {
        poison(false);
        bool ok = true;
        const size_t total = round16(kGuard + n_ + kGuard);
        for (size_t i = 0; i < kGuard; ++i) ok &= raw_[i] == kPoison;
        for (size_t i = kGuard + n_; i < total; ++i) ok &= raw_[i] == kPoison;
        poison(true);
        return ok;
    }
    // Every data byte is still `fill` (nothing written).
    bool untouched(uint8_t fill = kPoison) const {
        for (size_t i = 0; i < n_; ++i)
            if (data()[i] != fill) return false;
        return true;
    }

  private:
    static size_t round16(size_t v) { return (v + 15) / 16 * 16; }
    void poison(bool on) {
#ifdef KBIT_FUZZ_ASAN
        const size_t total = round16(kGuard + n_ + kGuard);
        if (on) {
            ASAN_POISON_MEMORY_REGION(raw_, kGuard);
            ASAN_POISON_MEMORY_REGION(raw_ + kGuard + n_, total - kGuard - n_);
        } else {
            ASAN_UNPOISON_MEMORY_REGION(raw_, total);
        }
#else
        (void)on;
#endif
    }
    size_t n_;
    uint8_t *raw_;
};

// An output buffer: guards intact after the call; untouched too when the call failed.
inline void check_output(Buffer &b, kbit_status s) {
    FZ_CHECK_MSG(b.guards_intact(), "a write past an output of %zu bytes\n", b.size());
    if (s != KBIT_SUCCESS && s != KBIT_ERROR_RANGE)
        FZ_CHECK_MSG(b.untouched(), "output written by a call that failed with %d\n",
                     static_cast<int>(s));
}
// An input buffer: nothing written anywhere.
inline void check_input(Buffer &b, const std::vector<uint8_t> &was) {
    FZ_CHECK(b.guards_intact());
    FZ_CHECK_MSG(b.size() == was.size() &&
                     (was.empty() || std::memcmp(b.data(), was.data(), was.size()) == 0),
                 "an input of %zu bytes was modified\n", b.size());
}
inline std::vector<uint8_t> snapshot(const Buffer &b) {
    return std::vector<uint8_t>(b.data(), b.data() + b.size());
}

// ---- floats, independent of the library ------------------------------------------------

inline uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline bool same_or_both_nan(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b);
}

// IEEE half bits -> float (exact).
inline float half_to_float(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (e == 31) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
    return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
}
inline float bf16_to_float(uint16_t b) { return from_bits(static_cast<uint32_t>(b) << 16); }

// v rounded to nearest even with `mant` stored mantissa bits, smallest normal exponent
// `emin` and largest finite value `max` (overflow to inf past max + half an ulp).
inline double round_to(double v, int mant, int emin, double max) {
    if (std::isnan(v) || std::isinf(v) || v == 0) return v;
    const double a = std::fabs(v);
    const int e = std::max(std::ilogb(a), emin);
    const double q = std::ldexp(std::nearbyint(std::ldexp(a, mant - e)), e - mant);
    const double r = q > max ? INFINITY : q;
    return v < 0 ? -r : r;
}
inline double round_half(double v) { return round_to(v, 10, -14, 65504.0); }
inline double round_bf16(double v) { return round_to(v, 7, -126, 3.3895313892515355e38); }

// The float stored at element i of an output of dtype (0 fp32, 1 fp16, 2 bf16).
inline float load(const void *p, int dtype, size_t i) {
    if (dtype == KBIT_DTYPE_FP32) return static_cast<const float *>(p)[i];
    const uint16_t h = static_cast<const uint16_t *>(p)[i];
    return dtype == KBIT_DTYPE_FP16 ? half_to_float(h) : bf16_to_float(h);
}
inline size_t dtype_bytes(int dtype) { return dtype == KBIT_DTYPE_FP32 ? 4 : 2; }

// An fp16 / bf16 result is the float32 one rounded once (NaN: the canonical 0x7FFF; fp32
// NaN: 0x7FFFFFFF, as the GPU gives).
inline void check_rounded_from_f32(const void *out, int dtype, const float *f32, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (dtype == KBIT_DTYPE_FP32) {
            const uint32_t b = static_cast<const uint32_t *>(out)[i];
            if (std::isnan(f32[i])) FZ_CHECK_MSG(b == 0x7FFFFFFFu, "fp32 NaN %08x at %zu\n", b, i);
            else FZ_CHECK_MSG(b == bits(f32[i]), "fp32 %08x vs %08x at %zu\n", b, bits(f32[i]), i);
            continue;
        }
        const uint16_t h = static_cast<const uint16_t *>(out)[i];
        if (std::isnan(f32[i])) {
            FZ_CHECK_MSG(h == 0x7FFF, "16-bit NaN %04x at %zu\n", h, i);
            continue;
        }
        const double want = dtype == KBIT_DTYPE_FP16 ? round_half(f32[i]) : round_bf16(f32[i]);
        const float got = load(out, dtype, i);
        FZ_CHECK_MSG(static_cast<double>(got) == want && std::signbit(got) == std::signbit(f32[i]),
                     "dtype %d: %a from %a, expected %a at %zu\n", dtype, got, f32[i], want, i);
    }
}

// E4M4 (SPEC: 4 exponent bits, bias 11, 4 mantissa bits, subnormals, no inf/NaN).
inline float e4m4_value(uint8_t c) {
    const int e = c >> 4, m = c & 15;
    return e ? std::ldexp(16.0f + m, e - 15) : std::ldexp(static_cast<float>(m), -14);
}

// Flush a subnormal to a zero of its sign (bitsandbytes' .ftz arithmetic).
inline float ftz(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

}  // namespace fz
