// Reductions over the 4 lanes of a quad: in the fragments of wgmma's and mma.sync's accumulators, lanes 4q .. 4q+3
// hold the columns of the same rows, so a row's max or sum over a thread's columns ends with these.
#pragma once

namespace fa4::sm90 {

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
// Both of a thread's rows at once: each shuffle round issues the two rows' shuffles together, so their latencies
// overlap (one row after the other put four shuffle round trips in a row on the softmax's path; perf-log F41).
__device__ __forceinline__ void quad_max_pair(float (&v)[2]) {
  const float a1 = __shfl_xor_sync(0xffffffffu, v[0], 1), b1 = __shfl_xor_sync(0xffffffffu, v[1], 1);
  v[0] = fmaxf(v[0], a1), v[1] = fmaxf(v[1], b1);
  const float a2 = __shfl_xor_sync(0xffffffffu, v[0], 2), b2 = __shfl_xor_sync(0xffffffffu, v[1], 2);
  v[0] = fmaxf(v[0], a2), v[1] = fmaxf(v[1], b2);
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

}  // namespace fa4::sm90
