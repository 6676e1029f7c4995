// exp2 on the FMA pipe: FA4's software exponential (reference/fa4.md §3.1), and the accurate exp2 the CPU
// backend uses where the policy says "hardware".
//
// Emulated exp2 (degree 3): split x = n + f with n = floor(x), f in [0, 1); approximate 2^f by a degree-3
// polynomial; insert n into the exponent field with an integer add. The coefficients are FA4's (POLY_EX2 in
// flash_attn/cute/utils.py), a Sollya fit: fpminimax(exp(x*log(2.0)), 3, [|1,24...|], [0;1], relative) with
// c0 pinned to 1. Max relative error 8.8e-5 on [0, 1) (FA4 paper, Table 2; our sweep in tests/cpu).
// The same code runs on the host and on the device, so an emulated element is bitwise identical on both:
// every step is exact or a single correctly-rounded fma/add (no contraction ambiguity: fmaf is explicit).
#pragma once

#include <cmath>

#include "numerics/host_device.hpp"

namespace fa4::num {

// Scalars, not an array: a constexpr array indexed in device code would need a __device__ copy.
inline constexpr float kExp2C0 = 1.0f;                            // 0x3F800000
inline constexpr float kExp2C1 = 0.695146143436431884765625f;     // 0x3F31F519
inline constexpr float kExp2C2 = 0.227564394474029541015625f;     // 0x3E6906A4
inline constexpr float kExp2C3 = 0.077119089663028717041015625f;  // 0x3D9DF09D

// floor(x) as a float and as an integer, for x in [-2^22, 2^22), by the FMA pipe's arithmetic: x + 1.5·2^23
// rounded down (toward -inf) lands in [2^23, 2^24), where the float's unit is 1, so it is 1.5·2^23 + floor(x)
// exactly and its low mantissa bits are floor(x) in two's complement. (floorf and the float-to-int conversion
// are FRND and F2I on the GPU, both on the XU pipe that MUFU.EX2 uses: an emulation built on them took two XU
// operations per element where MUFU takes one, perf-log F47.) The host computes the same values with floorf.
inline constexpr float kFloorMagic = 12582912.0f;  // 1.5·2^23, bits 0x4B400000
struct FloorSplit {
  float n;
  int32_t ni;
};
FA4_HD FloorSplit floor_split(float x) {
#if defined(__CUDA_ARCH__)
  const float t = __fadd_rd(x, kFloorMagic);
  return {t - kFloorMagic, bits_as<int32_t>(t) - bits_as<int32_t>(kFloorMagic)};  // the subtraction is exact
#else
  const float n = floorf(x);
  return {n, static_cast<int32_t>(n)};
#endif
}

// Valid for x in [-126, 127); x < -126 (below the smallest normal result) gives +0, as the GPU's
// flush-to-zero does; NaN propagates. Branch-free (selects only) so that CPU loops over it vectorise; on the
// GPU it runs on the FMA and integer pipes only (floor_split).
FA4_HD float exp2_emulated(float x) {
  const float xc = x < -127.0f ? -127.0f : x;  // keeps the exponent arithmetic in range; result zeroed below
  const FloorSplit n = floor_split(xc);
  const float f = xc - n.n;  // exact: f keeps the low bits of x
  float p = fmaf(kExp2C3, f, kExp2C2);
  p = fmaf(p, f, kExp2C1);
  p = fmaf(p, f, kExp2C0);  // p in [1, 2): biased exponent 127
  const float r = bits_as<float>(bits_as<int32_t>(p) + (n.ni << 23));
  return x >= -126.0f ? r : (x != x ? x : 0.0f);
}

// Accurate exp2 for the CPU "hardware" path: round-to-nearest split (f in [-1/2, 1/2]) and the degree-7
// Taylor polynomial of 2^f, truncation error < 5.2e-9 relative (below fp32 rounding); vectorises cleanly.
// Stands in for MUFU.EX2 (which is itself approximate, ~2 ulp): the two are not bitwise equal.
FA4_HD float exp2_accurate(float x) {
  const float xc = x < -127.0f ? -127.0f : (x > 128.0f ? 128.0f : x);
  const float n = rintf(xc);
  const float f = xc - n;
  constexpr float c1 = 0.693147180559945309f, c2 = 0.240226506959100712f, c3 = 0.0555041086648215800f,
                  c4 = 0.00961812910762847716f, c5 = 0.00133335581464284434f, c6 = 0.000154035303933816099f,
                  c7 = 1.52527338040598403e-05f;
  float p = fmaf(c7, f, c6);
  p = fmaf(p, f, c5);
  p = fmaf(p, f, c4);
  p = fmaf(p, f, c3);
  p = fmaf(p, f, c2);
  p = fmaf(p, f, c1);
  p = fmaf(p, f, 1.0f);  // p in [0.70, 1.42]
  // Scale by 2^n in two exact steps, so n = 128 overflows to inf and n = -126 with p < 1 stays subnormal.
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1;
  const float r = p * bits_as<float>((n1 + 127) << 23) * bits_as<float>((ni - n1 + 127) << 23);
  return x >= -126.0f ? r : (x != x ? x : 0.0f);
}

// Which elements the exp2 policy sends to the FMA pipe: by absolute key column j, in groups of 8 columns
// (a group is one register pair per thread in the Hopper wgmma accumulator layout, so the choice is uniform
// across a warp and never diverges). emulated_per16 in [0, 16] is the fraction in sixteenths.
FA4_HD bool exp2_is_emulated(int64_t key_column, int emulated_per16) {
  return static_cast<int>((key_column >> 3) & 15) < emulated_per16;
}

// The policy's exp2 for key column j.
FA4_HD float exp2_policy(float x, int64_t key_column, int emulated_per16) {
  return exp2_is_emulated(key_column, emulated_per16) ? exp2_emulated(x) : exp2_accurate(x);
}

}  // namespace fa4::num
