// Strided element access for the CPU code: rows of head_dim elements of any dtype, read into and written
// from fp32/fp64 buffers. Offsets are 64-bit everywhere.
#pragma once

#include <cstdint>
#include <limits>

#include "api/problem.hpp"
#include "fa4/fa4.hpp"
#include "numerics/convert.hpp"

namespace fa4::cpu {

// Offset in elements of [i0, i1, i2, 0] (rank 4) or [i0, i1, i2] (rank 3).
inline int64_t offset_of(const Tensor& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2];
}

template <class T>
inline void load_row(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d, T* dst) {
  const int64_t off = offset_of(t, b, s, h);
  switch (t.dtype) {
    case DType::f32: {
      const float* p = static_cast<const float*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<T>(p[c]);
      break;
    }
    case DType::f64: {
      const double* p = static_cast<const double*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<T>(p[c]);
      break;
    }
    case DType::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<T>(num::bf16_bits_to_float(p[c]));
      break;
    }
    case DType::f16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) dst[c] = static_cast<T>(num::f16_bits_to_float(p[c]));
      break;
    }
  }
}

template <class T>
inline void store_row(const Tensor& t, int64_t b, int64_t s, int64_t h, int64_t d, const T* src) {
  const int64_t off = offset_of(t, b, s, h);
  switch (t.dtype) {
    case DType::f32: {
      float* p = static_cast<float*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) p[c] = static_cast<float>(src[c]);
      break;
    }
    case DType::f64: {
      double* p = static_cast<double*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) p[c] = static_cast<double>(src[c]);
      break;
    }
    case DType::bf16: {
      uint16_t* p = static_cast<uint16_t*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) p[c] = num::float_to_bf16_bits(static_cast<float>(src[c]));
      break;
    }
    case DType::f16: {
      uint16_t* p = static_cast<uint16_t*>(t.data) + off;
      for (int64_t c = 0; c < d; ++c) p[c] = num::float_to_f16_bits(static_cast<float>(src[c]));
      break;
    }
  }
}

// The LSE is [batch, heads, seqlen_q], fp32.
inline float& lse_at(const Tensor& lse, int64_t b, int64_t h, int64_t i) {
  return static_cast<float*>(lse.data)[b * lse.stride[0] + h * lse.stride[1] + i * lse.stride[2]];
}

// Element i of a rank-1 fp32 tensor (the attention sinks and their gradient, [heads_q]).
inline float& vector_at(const Tensor& t, int64_t i) { return static_cast<float*>(t.data)[i * t.stride[0]]; }

// Head h's sink logit (natural-log units of the scaled scores), -inf without sinks: exp(sink) then adds 0.
inline double sink_logit(const detail::Problem& p, int64_t h) {
  return p.sinks ? double(vector_at(*p.sinks, h)) : -std::numeric_limits<double>::infinity();
}

}  // namespace fa4::cpu
