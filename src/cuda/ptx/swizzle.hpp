// The 128-byte shared-memory swizzle that TMA writes (CU_TENSOR_MAP_SWIZZLE_128B) and wgmma reads (layout type 1).
// One definition, host and device: kernels use it for fragment stores into swizzled tiles, tests use it to decode
// what TMA wrote (reference/fa3.md §3.2).
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::ptx {

// A swizzle atom is 8 rows of 128 bytes; the pattern repeats every 1024 bytes and is a function of the absolute
// shared-memory address bits [4,10), so a tile must start 1024-byte aligned for offsets to equal addresses.
inline constexpr uint32_t kSw128RowBytes = 128;
inline constexpr uint32_t kSw128AtomRows = 8;
inline constexpr uint32_t kSw128AtomBytes = kSw128RowBytes * kSw128AtomRows;
inline constexpr uint32_t kSw128Alignment = kSw128AtomBytes;
static_assert(kSw128AtomBytes == 1024, "the 128B swizzle repeats every 8 rows of 128 bytes");

// Byte offset of element (row, col) inside a [rows][128 bytes] tile written with the 128B swizzle: the 16-byte chunk
// index (address bits [4,7)) is XORed with the row index modulo 8 (address bits [7,10)).
FA4_HD constexpr uint32_t sw128_offset(uint32_t row, uint32_t col, uint32_t elem_bytes) {
  const uint32_t linear = row * kSw128RowBytes + col * elem_bytes;
  return linear ^ (((linear >> 7) & 7u) << 4);
}
static_assert(sw128_offset(0, 9, 2) == 18, "row 0 is not permuted");
static_assert(sw128_offset(1, 0, 2) == 128 + 16, "row 1 moves chunk 0 to chunk 1");
static_assert(sw128_offset(7, 63, 2) == 7 * 128 + ((7 ^ 7) * 16) + 14, "row 7 moves chunk 7 to chunk 0");
static_assert(sw128_offset(9, 8, 2) == 9 * 128 + ((1 ^ 1) * 16), "the pattern repeats every 8 rows");

#if defined(__CUDACC__)
// The kernel's dynamic shared memory as a T whose base is rounded up to the 1024-byte swizzle repeat (tile
// descriptors then use base offset 0); launches request sizeof(T) + 1024 bytes.
template <class T>
__device__ __forceinline__ T& sw128_aligned_dynamic_smem() {
  extern __shared__ uint8_t dynamic_smem[];
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  return *reinterpret_cast<T*>(dynamic_smem + ((kSw128Alignment - (addr & (kSw128Alignment - 1))) & (kSw128Alignment - 1)));
}
// The same for a launch that requests exactly sizeof(T): the base must already be at the repeat. A base that is
// not traps (the kernel fails loudly) instead of placing the storage past the allocation.
template <class T>
__device__ __forceinline__ T& sw128_dynamic_smem_at_base() {
  extern __shared__ uint8_t dynamic_smem[];
  if ((static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem)) & (kSw128Alignment - 1)) != 0) __trap();
  return *reinterpret_cast<T*>(dynamic_smem);
}
#endif

}  // namespace fa4::ptx
