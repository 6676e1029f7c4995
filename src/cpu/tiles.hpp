// Register-blocked fp32 micro-kernels and per-thread tiles of the CPU backend. The loops are written with
// GCC vector types of 16 floats (one AVX-512 register; two AVX2 ones) and compile-time trip counts, so the
// accumulators stay in registers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "numerics/exp2.hpp"

namespace fa4::cpu {

inline constexpr int kLanes = 16;         // floats per vector
inline constexpr int kBlockKeys = 64;     // keys per kv block (columns of S)
inline constexpr int kBlockRows = 64;     // query rows per q block
inline constexpr int kRowGroup = 4;       // rows per register block
static_assert(kBlockKeys % kLanes == 0 && kBlockRows % kRowGroup == 0, "tile shapes must fit the vectors");

using vf = float __attribute__((vector_size(kLanes * sizeof(float))));

inline vf load_vf(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store_vf(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// head_dim rounded up to whole vectors: the padding columns of every tile are kept at zero.
inline int64_t padded_dim(int64_t d) { return (d + kLanes - 1) / kLanes * kLanes; }

// C[rows][kBlockKeys] = A[rows][ld_a] (first `depth` columns) x Bt[depth][kBlockKeys]; rows % kRowGroup == 0.
inline void gemm_rows_by_keys(const float* a, int64_t ld_a, const float* bt, int64_t depth, int64_t rows, float* c) {
  constexpr int kVecs = kBlockKeys / kLanes;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    vf acc[kRowGroup][kVecs] = {};
    for (int64_t x = 0; x < depth; ++x) {
      vf b[kVecs];
      for (int u = 0; u < kVecs; ++u) b[u] = load_vf(bt + x * kBlockKeys + u * kLanes);
      for (int r = 0; r < kRowGroup; ++r) {
        const float ar = a[(r0 + r) * ld_a + x];
        for (int u = 0; u < kVecs; ++u) acc[r][u] += ar * b[u];
      }
    }
    for (int r = 0; r < kRowGroup; ++r)
      for (int u = 0; u < kVecs; ++u) store_vf(c + (r0 + r) * kBlockKeys + u * kLanes, acc[r][u]);
  }
}

// C[rows][dpad] += P[rows][ld_p] (first `depth` columns) x B[depth][dpad]; rows % kRowGroup == 0,
// dpad % kLanes == 0. Columns go in chunks of up to 4 vectors so that 16 accumulators stay in registers.
inline void gemm_accumulate(const float* p, int64_t ld_p, const float* b, int64_t depth, int64_t rows, int64_t dpad,
                            float* c) {
  constexpr int kChunk = 4;
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    for (int64_t c0 = 0; c0 < dpad; c0 += kChunk * kLanes) {
      const int nv = static_cast<int>(std::min<int64_t>(kChunk, (dpad - c0) / kLanes));
      if (nv == kChunk) {
        vf acc[kRowGroup][kChunk];
        for (int r = 0; r < kRowGroup; ++r)
          for (int u = 0; u < kChunk; ++u) acc[r][u] = load_vf(c + (r0 + r) * dpad + c0 + u * kLanes);
        for (int64_t x = 0; x < depth; ++x) {
          vf bv[kChunk];
          for (int u = 0; u < kChunk; ++u) bv[u] = load_vf(b + x * dpad + c0 + u * kLanes);
          for (int r = 0; r < kRowGroup; ++r) {
            const float pr = p[(r0 + r) * ld_p + x];
            for (int u = 0; u < kChunk; ++u) acc[r][u] += pr * bv[u];
          }
        }
        for (int r = 0; r < kRowGroup; ++r)
          for (int u = 0; u < kChunk; ++u) store_vf(c + (r0 + r) * dpad + c0 + u * kLanes, acc[r][u]);
      } else {  // the last 1-3 vectors of a head_dim that is not a multiple of 64
        for (int r = 0; r < kRowGroup; ++r) {
          for (int u = 0; u < nv; ++u) {
            vf acc = load_vf(c + (r0 + r) * dpad + c0 + u * kLanes);
            for (int64_t x = 0; x < depth; ++x) acc += p[(r0 + r) * ld_p + x] * load_vf(b + x * dpad + c0 + u * kLanes);
            store_vf(c + (r0 + r) * dpad + c0 + u * kLanes, acc);
          }
        }
      }
    }
  }
}

// Lane reductions as a tree of half-width vectors (halves added pairwise): a fixed order, log2(16) dependent
// steps, and register shuffles (subscripting the vector instead went through the stack: ~25% of the softmax).
using vf8 = float __attribute__((vector_size(8 * sizeof(float))));
using vf4 = float __attribute__((vector_size(4 * sizeof(float))));
static_assert(kLanes == 16, "the reduction trees below halve 16 lanes");

inline float lane_sum(vf acc) {
  const vf8 s8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

inline float lane_max(vf acc) {
  const vf8 lo = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7);
  const vf8 hi = __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf8 m8 = lo > hi ? lo : hi;
  const vf4 a = __builtin_shufflevector(m8, m8, 0, 1, 2, 3), b = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const vf4 m4 = a > b ? a : b;
  const float x = m4[0] > m4[2] ? m4[0] : m4[2], y = m4[1] > m4[3] ? m4[1] : m4[3];
  return x > y ? x : y;
}

// x[0..width) <- exp2(x - m) under the policy (emulated for some 8-column groups of absolute key columns);
// returns the sum, added in a fixed order (deterministic). Masked entries are -inf and give 0. width is a
// multiple of kBlockKeys (the AMX forward steps over two kv blocks at a time).
inline float exp2_block(float* x, float m, int64_t first_key, int emulated_per16, int width = kBlockKeys) {
  if (emulated_per16 == 0) {
    for (int j = 0; j < width; ++j) x[j] = num::exp2_accurate(x[j] - m);
  } else {
    for (int j0 = 0; j0 < width; j0 += 8) {  // block starts are multiples of 8
      if (num::exp2_is_emulated(first_key + j0, emulated_per16)) {
        for (int j = j0; j < j0 + 8; ++j) x[j] = num::exp2_emulated(x[j] - m);
      } else {
        for (int j = j0; j < j0 + 8; ++j) x[j] = num::exp2_accurate(x[j] - m);
      }
    }
  }
  vf acc = load_vf(x);
  for (int u = 1; u < width / kLanes; ++u) acc += load_vf(x + u * kLanes);
  return lane_sum(acc);
}

inline float max_block(const float* x, int width = kBlockKeys) {
  vf acc = load_vf(x);
  for (int u = 1; u < width / kLanes; ++u) {
    const vf y = load_vf(x + u * kLanes);
    acc = acc > y ? acc : y;
  }
  return lane_max(acc);
}

// A 64-byte aligned, zero-initialised float buffer.
struct Scratch {
  std::vector<float> storage;
  float* base = nullptr;
  explicit Scratch(int64_t n) : storage(static_cast<size_t>(n + kLanes)) {
    auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    base = storage.data() + ((64 - addr % 64) % 64) / sizeof(float);
  }
  float* data() { return base; }
};

}  // namespace fa4::cpu
