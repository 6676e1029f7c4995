// Reductions over the 4 lanes of a quad: in the fragments of wgmma's and mma.sync's accumulators, lanes 4q .. 4q+3
// hold the columns of the same rows, so a row's max or sum over a thread's columns ends with these.
#pragma once

namespace fa4::sm90 {

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace fa4::sm90
