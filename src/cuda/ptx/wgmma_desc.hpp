// The 64-bit shared-memory matrix descriptor of wgmma.mma_async (PTX ISA "Matrix Descriptor Format" for wgmma;
// reference/fa3.md §3.1). Plain C++ so host code and CPU tests can build and print it; device code passes `bits`
// straight to the instruction.
//
//   bits  0-13  start address      (smem byte address & 0x3FFFF) >> 4
//   bits 16-29  leading byte offset (LBO) >> 4
//   bits 32-45  stride byte offset  (SBO) >> 4
//   bits 49-51  base offset         (only for swizzled tiles that do not start on a swizzle-repeat boundary)
//   bits 62-63  swizzle mode        0 none (interleave), 1 = 128B, 2 = 64B, 3 = 32B
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "numerics/host_device.hpp"

namespace fa4::ptx {

// Values are the hardware encoding of bits 62-63 (not the TMA enum, which orders them differently).
enum class SmemSwizzle : uint32_t { none = 0, b128 = 1, b64 = 2, b32 = 3 };

struct WgmmaDesc {
  uint64_t bits = 0;

  static constexpr int kStartShift = 0;
  static constexpr int kLboShift = 16;
  static constexpr int kSboShift = 32;
  static constexpr int kBaseOffsetShift = 49;
  static constexpr int kSwizzleShift = 62;
  static constexpr uint64_t kOffsetFieldMask = 0x3FFF;  // 14 bits of (bytes >> 4): 256 KiB, more than any SM's smem
  static constexpr uint64_t kBaseOffsetMask = 0x7;
  static_assert(kLboShift - kStartShift >= 14 && kSboShift - kLboShift >= 14 && kBaseOffsetShift - kSboShift >= 14,
                "the 14-bit offset fields must not overlap");
  static_assert(kSwizzleShift - kBaseOffsetShift >= 3, "the 3-bit base offset must not reach the swizzle bits");

  // Offsets are encoded in 16-byte units; the start address keeps 18 bits of the byte address.
  FA4_HD static constexpr uint64_t encode_bytes(uint32_t bytes) { return (bytes & 0x3FFFFu) >> 4; }

  FA4_HD static constexpr WgmmaDesc make(uint32_t start_address, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                         SmemSwizzle swizzle, uint32_t base_offset = 0) {
    WgmmaDesc d;
    d.bits = (encode_bytes(start_address) << kStartShift) | (encode_bytes(lbo_bytes) << kLboShift) |
             (encode_bytes(sbo_bytes) << kSboShift) | ((base_offset & kBaseOffsetMask) << kBaseOffsetShift) |
             (static_cast<uint64_t>(swizzle) << kSwizzleShift);
    return d;
  }

  FA4_HD constexpr uint32_t start_address() const {
    return static_cast<uint32_t>(((bits >> kStartShift) & kOffsetFieldMask) << 4);
  }
  FA4_HD constexpr uint32_t lbo_bytes() const {
    return static_cast<uint32_t>(((bits >> kLboShift) & kOffsetFieldMask) << 4);
  }
  FA4_HD constexpr uint32_t sbo_bytes() const {
    return static_cast<uint32_t>(((bits >> kSboShift) & kOffsetFieldMask) << 4);
  }
  FA4_HD constexpr uint32_t base_offset() const {
    return static_cast<uint32_t>((bits >> kBaseOffsetShift) & kBaseOffsetMask);
  }
  FA4_HD constexpr SmemSwizzle swizzle() const { return static_cast<SmemSwizzle>(bits >> kSwizzleShift); }

  // The same matrix moved by `bytes` (a k-step inside a tile, or the next tile). Adds to the start-address field
  // only, as the hardware expects; one 64-bit add in a hot loop. Precondition: start_address() + bytes < 2^18,
  // true for every shared-memory address, so the add never carries into bits 14-15.
  FA4_HD constexpr WgmmaDesc advanced(uint32_t bytes) const {
    WgmmaDesc d;
    d.bits = bits + (static_cast<uint64_t>(bytes) >> 4);
    return d;
  }
};
static_assert(sizeof(WgmmaDesc) == 8, "the descriptor is one 64-bit register");

// The two canonical 128B-swizzled bf16/fp16 operand tiles of the forward kernel (reference/fa3.md §3.1-3.3). Both
// are stored as [chunks of 64 elements][rows][128 bytes], 1024-byte aligned (so base offset 0).
//
// K-major (Q as A, K as B of S = Q·Kᵀ): rows are M or N, the 128-byte row holds 64 consecutive k. SBO is the
// stride between 8-row groups = one swizzle atom; LBO is not used by swizzled K-major layouts (encoded as 1, as
// CuTe does). A k-step of 16 elements moves the start by 32 bytes inside the atom row; the next 64-wide chunk
// starts rows·128 bytes further.
FA4_HD constexpr WgmmaDesc sw128_k_major_desc(uint32_t start_address) {
  return WgmmaDesc::make(start_address, /*lbo_bytes=*/16, /*sbo_bytes=*/1024, SmemSwizzle::b128);
}

// MN-major (V as B of O = P·V): the 128-byte row holds 64 consecutive n (head-dim) elements of one k (sequence
// position). SBO = stride between 8-row k groups (one atom); LBO = stride between 64-wide n chunks = k_rows·128.
// A k-step of 16 rows moves the start by 2048 bytes.
FA4_HD constexpr WgmmaDesc sw128_mn_major_desc(uint32_t start_address, uint32_t n_chunk_stride_bytes) {
  return WgmmaDesc::make(start_address, n_chunk_stride_bytes, /*sbo_bytes=*/1024, SmemSwizzle::b128);
}

inline const char* to_string(SmemSwizzle s) {
  switch (s) {
    case SmemSwizzle::none:
      return "none";
    case SmemSwizzle::b128:
      return "128B";
    case SmemSwizzle::b64:
      return "64B";
    case SmemSwizzle::b32:
      return "32B";
  }
  return "?";
}

// e.g. "WgmmaDesc{0x4000004000010040: start 0x400, lbo 16, sbo 1024, base_offset 0, swizzle 128B}"
inline std::string to_string(WgmmaDesc d) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "WgmmaDesc{0x%016llx: start 0x%x, lbo %u, sbo %u, base_offset %u, swizzle %s}",
                static_cast<unsigned long long>(d.bits), d.start_address(), d.lbo_bytes(), d.sbo_bytes(),
                d.base_offset(), to_string(d.swizzle()));
  return buf;
}

}  // namespace fa4::ptx
