// The oracle: naive attention, one row at a time, no blocking, no online softmax.
//
// Precision::exact accumulates in fp64 on the (already low-precision) inputs: the reference of DESIGN.md §4.
// Precision::storage is the "same-precision naive" baseline of FlashAttention's tolerance rule: fp32
// arithmetic, with the results of each matrix product (S, P, O; dP, dS, dQ, dK, dV) rounded to the input
// dtype as a framework's bf16/fp16 matmuls would round them.
// Outputs may be of any dtype (f64 buffers keep the reference unrounded). Attention sinks (p.sinks) join each
// row's denominator; the backward also writes p.dsinks when given (fp32).
#pragma once

#include "api/problem.hpp"
#include "fa4/fa4.hpp"

namespace fa4::cpu {

enum class Precision { exact, storage };

void reference_forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& out, const Tensor* lse, Precision precision = Precision::exact);

// Recomputes the softmax itself (it does not read the forward's LSE). D = rowsum(dO ∘ O) comes from given_out
// when one is passed (the gradient of a backward handed that stored output: what a kernel under test is given,
// so the forward's rounding of O stays out of the backward's comparison), else from the recomputed O.
void reference_backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        Precision precision = Precision::exact, const Tensor* given_out = nullptr);

// One output row (b, h, i) of the exact forward, for spot checks of large runs (`fa4 run`). out_row has
// head_dim entries; returns the row's LSE.
double reference_forward_row(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             int64_t b, int64_t h, int64_t i, double* out_row);

// One row (b, h, i) of the exact dQ, for spot checks of large backward runs.
void reference_backward_dq_row(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& dout, int64_t b, int64_t h, int64_t i, double* dq_row);

}  // namespace fa4::cpu
