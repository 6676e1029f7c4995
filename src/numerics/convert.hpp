// fp32 <-> bf16 / fp16 conversions, round to nearest even, shared by host and device so that the CPU backend
// rounds exactly as the GPU's cvt.rn does. NaN stays NaN (quiet), overflow goes to inf, subnormals are kept.
#pragma once

#include "numerics/host_device.hpp"

namespace fa4::num {

struct bf16_bits { uint16_t bits; };
struct f16_bits { uint16_t bits; };

FA4_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = bits_as<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (overflow carries into inf correctly)
  return static_cast<uint16_t>(u >> 16);
}

FA4_HD float bf16_bits_to_float(uint16_t h) { return bits_as<float>(static_cast<uint32_t>(h) << 16); }

FA4_HD uint16_t float_to_f16_bits(float f) {
  const uint32_t u = bits_as<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {  // normal half: rebias the exponent (127 -> 15), round 13 dropped bits to even
    const uint32_t r = a - 0x38000000u;  // (127 - 15) << 23
    return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below half of the smallest subnormal: +-0
  // subnormal half: value = m * 2^-24; shift the full significand, round to nearest even
  const uint32_t exp = a >> 23;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // exp in [102, 112] -> shift in [14, 24]
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t q = mant >> shift;
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

FA4_HD float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_as<float>(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_as<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24, exact in fp32
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

// Round a float through the storage type and back: what the kernels see after storing to bf16/fp16.
FA4_HD float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }
FA4_HD float round_to_f16(float f) { return f16_bits_to_float(float_to_f16_bits(f)); }

}  // namespace fa4::num
