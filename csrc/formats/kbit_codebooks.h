// Built-in normal-float codebooks (SPEC 1.1): quantiles of N(0,1) at (i + 0.5) / 2^K,
// scaled to span [-1, 1], ascending. Generated from kbit.reference.create_normal_float_codebook;
// tests check that the two agree bit for bit.
#pragma once

namespace kbit {

constexpr float kNormalFloatK2[4] = {
    -0x1.0000000000000p+0f, -0x1.1ba4320000000p-2f, 0x1.1ba4320000000p-2f, 0x1.0000000000000p+0f};
constexpr float kNormalFloatK3[8] = {
    -0x1.0000000000000p+0f, -0x1.2813ea0000000p-1f, -0x1.46400a0000000p-2f, -0x1.a402540000000p-4f,
    0x1.a402540000000p-4f, 0x1.46400a0000000p-2f, 0x1.2813ea0000000p-1f, 0x1.0000000000000p+0f};
constexpr float kNormalFloatK4[16] = {
    -0x1.0000000000000p+0f, -0x1.6a46740000000p-1f, -0x1.159c6e0000000p-1f, -0x1.aad2900000000p-2f,
    -0x1.3e5dd00000000p-2f, -0x1.ba420e0000000p-3f, -0x1.04cb5a0000000p-3f, -0x1.58d86c0000000p-5f,
    0x1.58d86c0000000p-5f, 0x1.04cb5a0000000p-3f, 0x1.ba420e0000000p-3f, 0x1.3e5dd00000000p-2f,
    0x1.aad2900000000p-2f, 0x1.159c6e0000000p-1f, 0x1.6a46740000000p-1f, 0x1.0000000000000p+0f};
constexpr float kNormalFloatK5[32] = {
    -0x1.0000000000000p+0f, -0x1.8e63b80000000p-1f, -0x1.5106b20000000p-1f, -0x1.2459e40000000p-1f,
    -0x1.0023300000000p-1f, -0x1.c21f020000000p-2f, -0x1.8ad7e60000000p-2f, -0x1.5873460000000p-2f,
    -0x1.29a9520000000p-2f, -0x1.fb30900000000p-3f, -0x1.a737b40000000p-3f, -0x1.566d740000000p-3f,
    -0x1.080a5a0000000p-3f, -0x1.76d2380000000p-4f, -0x1.bfec620000000p-5f, -0x1.2a00c00000000p-6f,
    0x1.2a00c00000000p-6f, 0x1.bfec620000000p-5f, 0x1.76d2380000000p-4f, 0x1.080a5a0000000p-3f,
    0x1.566d740000000p-3f, 0x1.a737b40000000p-3f, 0x1.fb30900000000p-3f, 0x1.29a9520000000p-2f,
    0x1.5873460000000p-2f, 0x1.8ad7e60000000p-2f, 0x1.c21f020000000p-2f, 0x1.0023300000000p-1f,
    0x1.2459e40000000p-1f, 0x1.5106b20000000p-1f, 0x1.8e63b80000000p-1f, 0x1.0000000000000p+0f};

constexpr const float *kNormalFloat[6] = {nullptr, nullptr, kNormalFloatK2, kNormalFloatK3,
                                           kNormalFloatK4, kNormalFloatK5};

// Further built-in books (kbit_codebook_host): NF0, the normal-float book with an exact
// zero (NF4's construction for every K; at K = 4 NF4's table), and the uniform grid.
// Generated from kbit.reference.create_nf0_codebook / create_uniform_codebook; tests
// check that they agree bit for bit.
constexpr float kNf0K2[4] = {
    -0x1.0000000000000p+0f, 0x0.0p+0f, 0x1.be471e0000000p-2f, 0x1.0000000000000p+0f};
constexpr float kNf0K3[8] = {
    -0x1.0000000000000p+0f, -0x1.11ee800000000p-1f, -0x1.f9b7300000000p-3f, 0x0.0p+0f,
    0x1.7779a40000000p-3f, 0x1.87296c0000000p-2f, 0x1.3ef7fc0000000p-1f, 0x1.0000000000000p+0f};
constexpr float kNf0K4[16] = {
    -0x1.0000000000000p+0f, -0x1.6473620000000p-1f, -0x1.0cd65c0000000p-1f, -0x1.94653c0000000p-2f,
    -0x1.2344960000000p-2f, -0x1.7a6a7a0000000p-3f, -0x1.74f0d20000000p-4f, 0x0.0p+0f,
    0x1.45f6020000000p-4f, 0x1.4995be0000000p-3f, 0x1.f809b40000000p-3f, 0x1.5a066c0000000p-2f,
    0x1.c3496a0000000p-2f, 0x1.200f520000000p-1f, 0x1.7227600000000p-1f, 0x1.0000000000000p+0f};
constexpr float kNf0K5[32] = {
    -0x1.0000000000000p+0f, -0x1.8c7fa80000000p-1f, -0x1.4e4f880000000p-1f, -0x1.2107b00000000p-1f,
    -0x1.f899420000000p-2f, -0x1.b97f480000000p-2f, -0x1.8150760000000p-2f, -0x1.4e08680000000p-2f,
    -0x1.1e5ac60000000p-2f, -0x1.e2c4860000000p-3f, -0x1.8ceefc0000000p-3f, -0x1.3a34740000000p-3f,
    -0x1.d38efa0000000p-4f, -0x1.35f8880000000p-4f, -0x1.34f2fe0000000p-5f, 0x0.0p+0f,
    0x1.2199fc0000000p-5f, 0x1.22712e0000000p-4f, 0x1.b5cca80000000p-4f, 0x1.25e9200000000p-3f,
    0x1.72c9c40000000p-3f, 0x1.c2285e0000000p-3f, 0x1.0a63be0000000p-2f, 0x1.35ce6e0000000p-2f,
    0x1.63f5d80000000p-2f, 0x1.95b8780000000p-2f, 0x1.cc59780000000p-2f, 0x1.04e7920000000p-1f,
    0x1.28b87a0000000p-1f, 0x1.54e17a0000000p-1f, 0x1.91630c0000000p-1f, 0x1.0000000000000p+0f};
constexpr float kUniformK2[4] = {
    -0x1.0000000000000p+0f, -0x1.5555560000000p-2f, 0x1.5555560000000p-2f, 0x1.0000000000000p+0f};
constexpr float kUniformK3[8] = {
    -0x1.0000000000000p+0f, -0x1.6db6dc0000000p-1f, -0x1.b6db6e0000000p-2f, -0x1.24924a0000000p-3f,
    0x1.24924a0000000p-3f, 0x1.b6db6e0000000p-2f, 0x1.6db6dc0000000p-1f, 0x1.0000000000000p+0f};
constexpr float kUniformK4[16] = {
    -0x1.0000000000000p+0f, -0x1.bbbbbc0000000p-1f, -0x1.7777780000000p-1f, -0x1.3333340000000p-1f,
    -0x1.ddddde0000000p-2f, -0x1.5555560000000p-2f, -0x1.99999a0000000p-3f, -0x1.1111120000000p-4f,
    0x1.1111120000000p-4f, 0x1.99999a0000000p-3f, 0x1.5555560000000p-2f, 0x1.ddddde0000000p-2f,
    0x1.3333340000000p-1f, 0x1.7777780000000p-1f, 0x1.bbbbbc0000000p-1f, 0x1.0000000000000p+0f};
constexpr float kUniformK5[32] = {
    -0x1.0000000000000p+0f, -0x1.def7be0000000p-1f, -0x1.bdef7c0000000p-1f, -0x1.9ce73a0000000p-1f,
    -0x1.7bdef80000000p-1f, -0x1.5ad6b60000000p-1f, -0x1.39ce740000000p-1f, -0x1.18c6320000000p-1f,
    -0x1.ef7bde0000000p-2f, -0x1.ad6b5a0000000p-2f, -0x1.6b5ad60000000p-2f, -0x1.294a520000000p-2f,
    -0x1.ce739c0000000p-3f, -0x1.4a52940000000p-3f, -0x1.8c63180000000p-4f, -0x1.0842100000000p-5f,
    0x1.0842100000000p-5f, 0x1.8c63180000000p-4f, 0x1.4a52940000000p-3f, 0x1.ce739c0000000p-3f,
    0x1.294a520000000p-2f, 0x1.6b5ad60000000p-2f, 0x1.ad6b5a0000000p-2f, 0x1.ef7bde0000000p-2f,
    0x1.18c6320000000p-1f, 0x1.39ce740000000p-1f, 0x1.5ad6b60000000p-1f, 0x1.7bdef80000000p-1f,
    0x1.9ce73a0000000p-1f, 0x1.bdef7c0000000p-1f, 0x1.def7be0000000p-1f, 0x1.0000000000000p+0f};

constexpr const float *kNf0[6] = {nullptr, nullptr, kNf0K2, kNf0K3, kNf0K4, kNf0K5};
constexpr const float *kUniform[6] = {nullptr, nullptr, kUniformK2, kUniformK3, kUniformK4,
                                      kUniformK5};

}  // namespace kbit
