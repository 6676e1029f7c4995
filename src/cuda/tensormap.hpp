// Host-side construction of TMA tensor maps (CUtensorMap) for tiled loads/stores of bf16/fp16 tensors.
// cuTensorMapEncodeTiled is reached through the runtime's driver entry-point lookup, so nothing links libcuda.
#pragma once

#include <cuda.h>  // CUtensorMap and the driver enums (header only)

#include <array>
#include <cstdint>

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

// Encodes the map: interleave none, element strides 1, L2 promotion 128B, out-of-bounds elements filled with
// zeros. Throws fa4::Error(Status::cuda_error, ...) naming the offending field, or the driver's error.
CUtensorMap make_tma_tensor_map(const TmaTensorSpec& spec);

}  // namespace fa4::cuda
