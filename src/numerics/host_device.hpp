// FA4_HD marks functions shared by the CPU backend and the CUDA kernels: one definition of the numerics.
#pragma once

#if defined(__CUDACC__)
#define FA4_HD __host__ __device__ __forceinline__
#else
#define FA4_HD inline __attribute__((always_inline))
#endif

#include <cstdint>
#include <cstring>

namespace fa4::num {

// std::bit_cast is not usable in device code with every nvcc; memcpy is, and compiles to a move.
template <class To, class From>
FA4_HD To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From), "bits_as: sizes differ");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

}  // namespace fa4::num
