// The fast CPU backend: blocked online softmax (q-blocks x kv-blocks, fp32 accumulation, vectorised inner
// loops), threads over (batch, head, q-block), heaviest causal blocks first. Same numerics policy as the GPU
// (exp2 emulation fraction, conditional rescale with tau). fp64 inputs are computed exactly (in fp64) by
// the reference code, so autograd can be checked numerically.
#pragma once

#include "api/problem.hpp"
#include "fa4/fa4.hpp"

namespace fa4::cpu {

void forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse);

void backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv);

}  // namespace fa4::cpu
