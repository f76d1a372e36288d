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

}  // namespace kbit
