// What validation hands to a backend: sizes, the resolved options and the numerics policy. Everything here
// has been checked (api/validate.cpp); backends trust it.
#pragma once

#include <cstdint>

#include "fa4/fa4.hpp"
#include "numerics/mask.hpp"

namespace fa4::detail {

struct Problem {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;  // of q (every tensor is on the same device)
  float scale = 0.0f;  // resolved: the default is 1/sqrt(head_dim)
  float softcap = 0.0f;
  num::Mask mask;
  float rescale_threshold = 8.0f;
  int exp2_emulated_per16 = 0;
  bool deterministic = false;
  const Tensor* sinks = nullptr;   // fp32 [heads_q] (validated); nullptr: none
  const Tensor* dsinks = nullptr;  // backward, with sinks: fp32 [heads_q] output; nullptr: not computed
  int num_splits = 0;  // options.num_splits (>= 0; the backward refuses > 1 here)
  bool q_heads_strided = true;  // q's heads are distinct rows in memory (stride != 0): the GPU may read them as rows
  // A variable-length batch (the CUDA varlen paths): batch is the sequence count, seqlen_q/k the longest
  // sequence's, and varlen_total_q the packed query rows (what the backward's compact workspace is sized by).
  bool varlen = false;
  int64_t varlen_total_q = 0;

  int64_t group() const { return heads_q / heads_kv; }  // query heads per kv head
};

}  // namespace fa4::detail
