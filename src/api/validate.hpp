// The one validation layer. Every check throws fa4::Error naming the argument, what was expected and what
// was given; what passes is a Problem the backends can trust.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "api/problem.hpp"
#include "fa4/fa4.hpp"

namespace fa4::detail {

// The error every check throws: "<call>: argument '<arg>': expected <expected>, got <got>".
[[noreturn]] void fail(Status code, const char* call, const std::string& arg, const std::string& expected,
                       const std::string& got);
// fail with Status::invalid_argument.
[[noreturn]] void invalid(const char* call, const std::string& arg, const std::string& expected, const std::string& got);
// "[d0, d1, ...]" over the tensor's rank.
std::string shape_string(const Tensor& t);

// An output must not write any element twice (its strides step past each other).
void check_no_self_overlap(const char* call, const char* arg, const Tensor& t);
// An output's memory range (lowest to highest element it spans) must not meet an input's.
void check_disjoint(const char* call, const char* out_name, const Tensor& out, const char* in_name, const Tensor& in);

// options.sinks and options.dsinks against heads_q query heads on q's device (validate_inputs runs it); a
// forward pass (forward = true) refuses dsinks, which only the backward writes.
void check_sink_options(const char* call, const Options& options, int64_t heads_q, const Tensor& q, bool forward);

// The backward refuses options.num_splits > 1 (split-KV is forward only).
void check_backward_splits(const char* call, const Options& options);

// The inputs and options alone (what `supports` and `workspace_size` see). k_name, v_name: the arguments k and v
// are to the caller (a KV-cache call's contiguous cache is "k_cache" and "v_cache"), for its messages.
Problem validate_inputs(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Options& options,
                        const char* k_name = "k", const char* v_name = "v");

Problem validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                         const Options& options, Workspace workspace, Stream stream);

Problem validate_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                          const Options& options, Workspace workspace, Stream stream);

// A forward's out (and lse) may not overlap themselves, q, k, v (or each other).
void check_outputs_apart(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor* lse);

// A backward's dq, dk, dv (and options.dsinks) may not overlap themselves, each other or any input.
void check_gradients_apart(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                           const Options& options);

// The caller's workspace: none ({nullptr, 0}: the backend allocates stream-ordered), or at least
// workspace_bytes(p, pass) at a non-null pointer; a CPU call takes no stream.
// size_query: the function a caller sizes this call's workspace with (named in the refusal).
void check_workspace(const char* call, const Problem& p, Pass pass, Workspace ws, Stream stream,
                     const char* size_query = "workspace_size");

// Whether a varlen / KV-cache call on CUDA tensors checks its device metadata first: options.validate_device_metadata,
// or FA4_VALIDATE=1 in the environment (read at each such call).
bool validate_device_metadata(const Options& options);

}  // namespace fa4::detail
