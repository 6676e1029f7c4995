// Host-side construction of TMA tensor maps (CUtensorMap) for tiled loads/stores of bf16/fp16 tensors.
// cuTensorMapEncodeTiled is reached through the runtime's driver entry-point lookup, so nothing links libcuda.
#pragma once

#include <cuda.h>  // CUtensorMap and the driver enums (header only)

#include <array>
#include <cstdint>
#include <cstring>

#include "fa4/fa4.hpp"

namespace fa4::cuda {

enum class TmaSwizzle { none, b32, b64, b128 };

inline constexpr int kTmaMaxRank = 5;
inline constexpr uint32_t kTmaMaxBoxDim = 256;

// A strided global tensor and the box one TMA instruction moves. Dimension 0 is the innermost (contiguous) one,
// as the driver orders them; e.g. a [batch, seqlen, heads, dim] tensor is rank 4 with
// dims = {dim, seqlen, heads, batch} and box = {64, rows, 1, 1} (reference/fa3.md §3.7).
struct TmaTensorSpec {
  const void* data = nullptr;                         // global memory, 16-byte aligned
  DType dtype = DType::bf16;                          // bf16 or f16
  int rank = 2;                                       // 1..5
  std::array<uint64_t, kTmaMaxRank> dims{};           // elements per dimension, each in [1, 2^32]
  std::array<uint64_t, kTmaMaxRank> strides_bytes{};  // [0] = element size (unit stride); [i>0] multiple of 16, < 2^40
  std::array<uint32_t, kTmaMaxRank> box{};            // elements per dimension, each in [1, 256]
  TmaSwizzle swizzle = TmaSwizzle::b128;              // box[0]·element size must not exceed the swizzle span
};

// Encodes the map into *out (or copies it from a per-thread cache of the last 32 specs encoded: an engine calls
// with the same K/V cache and shapes every step, and an encode is a driver call; a map depends on nothing but the
// spec, so a hit is exactly what encoding would give): interleave none, element strides 1, L2 promotion 128B, out-of-bounds elements
// filled with zeros. Throws fa4::Error(Status::cuda_error, ...) naming the offending field, or the driver's
// error; *out is unspecified after a throw.
//
// `out` must be 64-byte aligned (the driver requires it of the tensor map; a named CUtensorMap variable, a
// member of an aligned struct or a __grid_constant__ parameter is). It is checked, and a misaligned `out` throws.
// The map is an out-parameter, not a return value, on purpose: g++ 13 gives the hidden return slot of a call
// whose result is discarded, `(void)make(...)`, only 16-byte alignment although CUtensorMap is alignas(64)
// (reproduced with g++ 13.3 and nvcc 13.0), and code compiled with -march=native may write the map there with
// aligned vector stores -- a SIGSEGV, as on the H200 (device-check run 6, GpuTma.BadArgumentsNameTheField).
void make_tma_tensor_map(const TmaTensorSpec& spec, CUtensorMap* out);

// By-value convenience (`m.map = make_tma_tensor_map(spec);`), safe against the misaligned return slot above:
// the map is encoded into an aligned local and copied out through a pointer whose alignment the compiler cannot
// assume (the asm hides it), so the copy uses unaligned moves. Prefer the out-parameter form in new code.
[[nodiscard]] inline CUtensorMap make_tma_tensor_map(const TmaTensorSpec& spec) {
  alignas(64) CUtensorMap encoded;
  make_tma_tensor_map(spec, &encoded);
  CUtensorMap result;
  unsigned char* dst = reinterpret_cast<unsigned char*>(&result);
  asm("" : "+r"(dst));  // the return slot may be only 16-byte aligned (g++ 13); do not let memcpy assume 64
  std::memcpy(dst, &encoded, sizeof(CUtensorMap));
  return result;
}

}  // namespace fa4::cuda
