// FlashAttention's tolerance rule (DESIGN.md §4, reference/ecosystem.md §4.1), and one self-checking
// attention case (random inputs, NaN-poisoned outputs, fp64 reference) shared by the tests and `fa4 check`.
//
//   max|ours - ref| <= rtol * max|naive_same_precision - ref| + atol,   rtol = 2 (3 with softcap)
//   atol = 2 * max|round(round(ref + 0.3) - 0.3) - ref| in the output dtype (about one ulp of the values),
//   plus 3e-4 on gradients with softcap, and on f32 gradients and on the (fp32) LSE 4 ulp of max|ref| (see
//   run_case).
#pragma once

#include <string>
#include <vector>

#include "fa4/fa4.hpp"
#include "testing/tensors.hpp"

namespace fa4::testing {

struct Comparison {
  double max_error = 0;     // max |ours - ref|
  double baseline = 0;      // max |naive same-precision - ref|
  double atol = 0;
  double bound = 0;         // rtol * baseline + atol
  int64_t mismatched_nonfinite = 0;  // NaN/inf in ours where ref is finite, or vice versa
  bool pass = false;
  std::string summary() const;
};

Comparison compare(const std::vector<double>& ours, const std::vector<double>& ref, const std::vector<double>& naive,
                   DType dtype, double rtol, double extra_atol);

struct CaseSpec {
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  DType dtype = DType::f32;
  Options options;
  Layout layout = Layout::bshd;
  bool backward = true;
  bool broadcast_kv = false;  // K/V heads given as stride-0 views of one head
  uint64_t seed = 1;
  std::string name() const;
};

// A case's random inputs, fresh per seed: q (scaled by softcap / 4 with softcap, so the scores reach the cap,
// as FlashAttention's tests do), k, v and dout; with broadcast_kv, k and v are stride-0 views over heads of one
// stored head (kv_storage_elems elements each).
struct CaseInputs {
  HostTensor q, k, v, dout;
  int64_t kv_storage_elems = 0;
};
CaseInputs make_case_inputs(const CaseSpec& spec);

struct CaseResult {
  Comparison out, lse, dq, dk, dv;
  bool pass = false;
  std::string failure;  // the first failing tensor and its numbers
};

// Where a case's passes run: by default the public API on the host tensors (the CPU backend). The CLI's
// GPU executor mirrors them to device memory, runs there and copies the outputs back.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  virtual bool has_backward() const = 0;
  virtual void forward(HostTensor& q, HostTensor& k, HostTensor& v, HostTensor& out, HostTensor& lse,
                       const Options& options) = 0;
  // Called only where has_backward(), after forward() on the same tensors (out and lse are its outputs);
  // dq, dk, dv arrive NaN-poisoned. Returns false, computing nothing, where the executor's backend does not run
  // this problem's backward (fa4::supports refuses it): the case then checks the forward only.
  virtual bool backward(const HostTensor& q, const HostTensor& k, const HostTensor& v, const HostTensor& out,
                        const HostTensor& dout, const HostTensor& lse, HostTensor& dq, HostTensor& dk, HostTensor& dv,
                        const Options& options) = 0;
};

// Runs the case (forward, and backward where the executor has one) through the public API and checks every
// output against the fp64 reference with the rule above. executor == nullptr: the CPU backend.
CaseResult run_case(const CaseSpec& spec, Executor* executor = nullptr);

}  // namespace fa4::testing
