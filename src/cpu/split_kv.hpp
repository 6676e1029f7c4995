// Split-KV on the CPU backend (Options::num_splits > 1): the key axis, in whole kv blocks, is cut into ranges;
// each range runs through the backend's usual forward as a problem of its own, into fp32 partials, and
// numerics/split_merge.hpp merges them (f64 inputs, computed exactly, refuse num_splits > 1 in validation). The GPU's decode kernels split the same way; here it
// exists so that the merge, and every option under it, is tested without a GPU.
#pragma once

#include <cstdint>

#include "api/problem.hpp"
#include "fa4/fa4.hpp"

namespace fa4::cpu {

// How many key ranges p runs as: min(num_splits, kv blocks), at least 1.
int64_t split_ranges(const detail::Problem& p);

// The forward of p as split_ranges(p) ranges merged (p.num_splits > 1).
void forward_split(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor* lse);

}  // namespace fa4::cpu
