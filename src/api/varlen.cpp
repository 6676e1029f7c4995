// Variable-length batches (fa4.hpp, Varlen): the packed tensors and their metadata are validated here, with
// messages naming the packed argument. CPU tensors: each sequence runs as a dense batch-1 problem on rank-4
// views of its rows, through the dense entry points (their validation and backends). CUDA tensors (forward):
// the metadata live on the device and are trusted, as FlashAttention does; everything the host can see is
// checked (shapes, dtypes, devices, max_seqlen against the totals, the options on the longest sequence's
// rows), then one launch of the sm_90a varlen kernel runs every sequence.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "api/select.hpp"
#include "api/validate.hpp"
#include "fa4/fa4.hpp"

#if defined(FA4_WITH_SM90)
#include "cuda/sm90/launch.hpp"
#endif

namespace fa4 {
namespace {

using detail::fail;

std::string shape3(const Tensor& t) { return "rank " + std::to_string(t.rank) + " " + detail::shape_string(t); }

struct Sequence {
  int64_t q0, q_len, k0, k_len;
};

// Every packed tensor has a unit head_dim stride (the kernels and the CPU views read a row's head_dim elements
// contiguously).
void check_unit_head_dim(const char* call, const char* arg, const Tensor& t) {
  if (t.shape[2] > 1 && t.stride[2] != 1)
    fail(Status::invalid_argument, call, std::string(arg) + ".stride[2]", "1 (the head_dim elements contiguous)",
         std::to_string(t.stride[2]));
}

void check_packed(const char* call, const char* arg, const Tensor& t, int64_t rows, int64_t heads, int64_t dim,
                  const Tensor& q) {
  if (t.rank != 3 || t.shape[0] != rows || t.shape[1] != heads || t.shape[2] != dim)
    fail(Status::invalid_argument, call, arg,
         "rank 3 [" + std::to_string(rows) + ", " + std::to_string(heads) + ", " + std::to_string(dim) +
             "] ([total rows, heads, head_dim])",
         shape3(t));
  if (t.device != q.device || t.device_index != q.device_index || t.dtype != q.dtype)
    fail(Status::invalid_argument, call, arg, std::string("the dtype and device of q (") + to_string(q.dtype) + " on " +
                                                  to_string(q.device) + ")",
         std::string(to_string(t.dtype)) + " on " + to_string(t.device));
  check_unit_head_dim(call, arg, t);
}

// What every varlen call checks first: q, k, v packed and alike, a batch size, both offset arrays given (host
// arrays for CPU tensors, device arrays for CUDA ones).
void check_packed_inputs(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& vl) {
  if (q.rank != 3) fail(Status::invalid_argument, call, "q", "rank 3 [total_q, heads, head_dim]", shape3(q));
  check_unit_head_dim(call, "q", q);
  if (k.rank != 3) fail(Status::invalid_argument, call, "k", "rank 3 [total_k, heads_kv, head_dim]", shape3(k));
  check_packed(call, "v", v, k.shape[0], k.shape[1], q.shape[2], q);
  check_packed(call, "k", k, k.shape[0], k.shape[1], q.shape[2], q);
  if (vl.batch < 0) fail(Status::invalid_argument, call, "varlen.batch", "a batch size >= 0", std::to_string(vl.batch));
  if (vl.cu_seqlens_q == nullptr || vl.cu_seqlens_k == nullptr)
    fail(Status::invalid_argument, call, vl.cu_seqlens_q == nullptr ? "varlen.cu_seqlens_q" : "varlen.cu_seqlens_k",
         std::string("a pointer to batch + 1 int32 offsets (in ") + (q.device == Device::cuda ? "device" : "host") +
             " memory, where the tensors are)",
         "null");
}

// The sequences, from metadata (host arrays) checked entry by entry.
std::vector<Sequence> checked_sequences(const char* call, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Varlen& vl) {
  check_packed_inputs(call, q, k, v, vl);
  auto check_offsets = [&](const int32_t* cu, const char* name, int64_t total) {
    const std::string arg = std::string("varlen.") + name;
    if (cu[0] != 0) fail(Status::invalid_argument, call, arg + "[0]", "0", std::to_string(cu[0]));
    for (int64_t b = 0; b < vl.batch; ++b)
      if (cu[b + 1] < cu[b])
        fail(Status::invalid_argument, call, arg + "[" + std::to_string(b + 1) + "]",
             "offsets that do not decrease (>= " + std::to_string(cu[b]) + ")", std::to_string(cu[b + 1]));
    if (cu[vl.batch] > total)
      fail(Status::invalid_argument, call, arg + "[" + std::to_string(vl.batch) + "]",
           "at most the packed rows (" + std::to_string(total) + ")", std::to_string(cu[vl.batch]));
  };
  check_offsets(vl.cu_seqlens_q, "cu_seqlens_q", q.shape[0]);
  check_offsets(vl.cu_seqlens_k, "cu_seqlens_k", k.shape[0]);
  std::vector<Sequence> seqs(static_cast<size_t>(vl.batch));
  int64_t longest_q = 0, longest_k = 0;
  for (int64_t b = 0; b < vl.batch; ++b) {
    Sequence& s = seqs[static_cast<size_t>(b)];
    s.q0 = vl.cu_seqlens_q[b], s.q_len = vl.cu_seqlens_q[b + 1] - s.q0;
    s.k0 = vl.cu_seqlens_k[b], s.k_len = vl.cu_seqlens_k[b + 1] - s.k0;
    if (vl.seqused_k != nullptr) {
      if (vl.seqused_k[b] < 0 || vl.seqused_k[b] > s.k_len)
        fail(Status::invalid_argument, call, "varlen.seqused_k[" + std::to_string(b) + "]",
             "0 .. " + std::to_string(s.k_len) + " (the keys of sequence " + std::to_string(b) + ")",
             std::to_string(vl.seqused_k[b]));
      s.k_len = vl.seqused_k[b];
    }
    longest_q = std::max(longest_q, s.q_len), longest_k = std::max(longest_k, s.k_len);
  }
  if (vl.max_seqlen_q < longest_q || vl.max_seqlen_q > q.shape[0])
    fail(Status::invalid_argument, call, "varlen.max_seqlen_q",
         std::to_string(longest_q) + " .. " + std::to_string(q.shape[0]) + " (the longest query sequence .. total_q)",
         std::to_string(vl.max_seqlen_q));
  if (vl.max_seqlen_k < longest_k || vl.max_seqlen_k > k.shape[0])
    fail(Status::invalid_argument, call, "varlen.max_seqlen_k",
         std::to_string(longest_k) + " .. " + std::to_string(k.shape[0]) + " (the longest key sequence .. total_k)",
         std::to_string(vl.max_seqlen_k));
  return seqs;
}

// The sequences of a call on CPU tensors (CUDA calls take the device paths below).
std::vector<Sequence> sequences(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& vl) {
  if (q.device != Device::cpu)
    throw Error(Status::internal, std::string(call) + ": cuda tensors reached the CPU path of a variable-length batch");
  return checked_sequences(call, q, k, v, vl);
}

// Rows row0 .. row0 + rows - 1 of a packed [total, heads, dim] tensor as a rank-4 batch-1 tensor.
Tensor rows_view(const Tensor& t, int64_t row0, int64_t rows) {
  Tensor r = t;
  r.rank = 4;
  r.data = static_cast<char*>(t.data) + row0 * t.stride[0] * int64_t(element_size(t.dtype));
  r.shape = {1, rows, t.shape[1], t.shape[2]};
  r.stride = {std::max<int64_t>(rows, 1) * t.stride[0], t.stride[0], t.stride[1], t.stride[2]};
  return r;
}

// Columns row0 .. of a [heads, total_q] lse as the dense [1, heads, rows] lse.
Tensor lse_view(const Tensor& lse, int64_t row0, int64_t rows) {
  Tensor r = lse;
  r.rank = 3;
  r.data = static_cast<float*>(lse.data) + row0 * lse.stride[1];
  r.shape = {1, lse.shape[0], rows, 1};
  r.stride = {lse.shape[0] * lse.stride[0], lse.stride[0], lse.stride[1], 1};
  return r;
}

void check_lse(const char* call, const Tensor& lse, const Tensor& q) {
  if (lse.rank != 2 || lse.shape[0] != q.shape[1] || lse.shape[1] != q.shape[0] || lse.dtype != DType::f32 ||
      lse.device != q.device)
    fail(Status::invalid_argument, call, "lse",
         "an f32 rank 2 [" + std::to_string(q.shape[1]) + ", " + std::to_string(q.shape[0]) +
             "] ([heads, total_q]) on q's device",
         std::string(to_string(lse.dtype)) + " " + shape3(lse) + " on " + to_string(lse.device));
}

// A backward's out, dout and gradients packed like q and k, and its lse [heads, total_q].
void check_backward_tensors(const char* call, const Tensor& q, const Tensor& k, const Tensor& out, const Tensor& dout,
                            const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  check_packed(call, "out", out, q.shape[0], q.shape[1], q.shape[2], q);
  check_packed(call, "dout", dout, q.shape[0], q.shape[1], q.shape[2], q);
  check_packed(call, "dq", dq, q.shape[0], q.shape[1], q.shape[2], q);
  check_packed(call, "dk", dk, k.shape[0], k.shape[1], k.shape[2], q);
  check_packed(call, "dv", dv, k.shape[0], k.shape[1], k.shape[2], q);
  check_lse(call, lse, q);
}

// Rows of a packed tensor that belong to no sequence (past the last offset, or keys past seqused_k) are outputs
// too: zero them (all-zero bits are 0 in every dtype), so no element of an output is left unwritten.
void zero_rows(const Tensor& t, int64_t row0, int64_t rows) {
  const int64_t es = int64_t(element_size(t.dtype));
  for (int64_t r = row0; r < row0 + rows; ++r)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      std::memset(static_cast<char*>(t.data) + (r * t.stride[0] + h * t.stride[1]) * es, 0, size_t(t.shape[2] * es));
}

// The [begin, end) row ranges of a packed dimension that no sequence covers.
std::vector<std::pair<int64_t, int64_t>> uncovered(const std::vector<Sequence>& seqs, bool keys, int64_t total) {
  std::vector<std::pair<int64_t, int64_t>> gaps;
  int64_t next = 0;
  for (const Sequence& s : seqs) {
    const int64_t begin = keys ? s.k0 : s.q0, len = keys ? s.k_len : s.q_len;
    if (begin > next) gaps.emplace_back(next, begin);
    next = std::max(next, begin + len);
  }
  if (total > next) gaps.emplace_back(next, total);
  return gaps;
}

// Every sequence's problem is checked before any is run, so a refused call writes nothing.
void require_all(Pass pass, const std::vector<Sequence>& seqs, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Options& options) {
  for (const Sequence& s : seqs) {
    const Support one =
        supports(pass, rows_view(q, s.q0, s.q_len), rows_view(k, s.k0, s.k_len), rows_view(v, s.k0, s.k_len), options);
    if (!one.ok) throw Error(one.code, one.reason);
  }
}

// The CUDA forward: host-visible checks, the problem of the longest sequence's rows (dtype, head dim, options,
// layout, backend), then the kernel. Rows that belong to no sequence are not written (FlashAttention's rule;
// the CPU path zeroes them, having read the metadata).
struct DeviceProblem {
  detail::Problem p;
  Tensor q, k, v;  // every packed row as one batch: [1, total, heads, d]
};

DeviceProblem check_device_inputs(const char* call, Pass pass, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Varlen& vl, const Options& options) {
  check_packed_inputs(call, q, k, v, vl);
  if (vl.max_seqlen_q < 0 || vl.max_seqlen_q > q.shape[0])
    fail(Status::invalid_argument, call, "varlen.max_seqlen_q",
         "0 .. " + std::to_string(q.shape[0]) + " (at most total_q)", std::to_string(vl.max_seqlen_q));
  if (vl.max_seqlen_k < 0 || vl.max_seqlen_k > k.shape[0])
    fail(Status::invalid_argument, call, "varlen.max_seqlen_k",
         "0 .. " + std::to_string(k.shape[0]) + " (at most total_k)", std::to_string(vl.max_seqlen_k));
  if (pass == Pass::backward) {
    detail::check_backward_splits(call, options);
  } else if (options.num_splits > 1) {
    fail(Status::unsupported, call, "options.num_splits",
         "0 or 1 for a variable-length batch on CUDA (its kernel does not split keys)", std::to_string(options.num_splits));
  }
  detail::check_sink_options(call, options, q.shape[1], q, pass == Pass::forward);
  // The longest sequence's rows (starting at row 0: every offset is below total - max_seqlen + 1 only if the
  // metadata are right, so the views are for validation, not for reading).
  const Tensor qv = rows_view(q, 0, vl.max_seqlen_q), kv = rows_view(k, 0, vl.max_seqlen_k),
               vv = rows_view(v, 0, vl.max_seqlen_k);
  detail::Problem p = detail::validate_inputs(call, qv, kv, vv, options);
  if (detail::require_backend(call, p) != detail::Backend::cuda)
    throw Error(Status::internal, std::string(call) + ": cuda tensors selected a host backend");
  detail::require_pass(call, p, pass);
#if defined(FA4_WITH_SM90)
  if (pass == Pass::backward) sm90::check_backward_overrides(call, p, /*varlen=*/true);
#endif
  p.batch = vl.batch;  // the kernels' batch is the sequence count
  p.varlen = true;
  p.varlen_total_q = q.shape[0];  // the backward's workspace is sized by the packed rows (and the count)
  DeviceProblem d{p, rows_view(q, 0, q.shape[0]), rows_view(k, 0, k.shape[0]), rows_view(v, 0, k.shape[0])};
  detail::require_layout(call, p, d.q, d.k, d.v);
  return d;
}

#if defined(FA4_WITH_SM90)
// Options::validate_device_metadata (or FA4_VALIDATE=1): every entry checked on a host copy, as the CPU path does.
void check_device_metadata(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& vl,
                           const Options& options, Stream stream) {
  if (!detail::validate_device_metadata(options)) return;
  const std::vector<int32_t> cu_q =
      sm90::read_device_ints(call, "varlen.cu_seqlens_q", vl.cu_seqlens_q, vl.batch + 1, q.device_index, stream);
  const std::vector<int32_t> cu_k =
      sm90::read_device_ints(call, "varlen.cu_seqlens_k", vl.cu_seqlens_k, vl.batch + 1, q.device_index, stream);
  const std::vector<int32_t> used =
      vl.seqused_k ? sm90::read_device_ints(call, "varlen.seqused_k", vl.seqused_k, vl.batch, q.device_index, stream)
                   : std::vector<int32_t>{};
  Varlen host = vl;
  host.cu_seqlens_q = cu_q.data(), host.cu_seqlens_k = cu_k.data();
  host.seqused_k = vl.seqused_k ? used.data() : nullptr;
  checked_sequences(call, q, k, v, host);
}
#endif

void forward_varlen_device(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                           const Varlen& vl, const Options& options, Stream stream) {
  const char* call = "fa4::forward_varlen";
  const DeviceProblem d = check_device_inputs(call, Pass::forward, q, k, v, vl, options);
  check_packed(call, "out", out, q.shape[0], q.shape[1], q.shape[2], q);
  if (lse) check_lse(call, *lse, q);
  // The outputs may not overlap the inputs or themselves (the CPU path checks each sequence's views likewise).
  detail::check_outputs_apart(call, q, k, v, out, lse);
#if defined(FA4_WITH_SM90)
  check_device_metadata(call, q, k, v, vl, options, stream);
  sm90::forward_varlen(d.p, d.q, d.k, d.v, out, lse, vl, stream);
#else
  (void)d, (void)stream;
  throw Error(Status::internal, std::string(call) + ": a CUDA backend without sm_90a kernels was selected");
#endif
}

// The CUDA backward: the forward's host-visible checks (on the backward's pass), the packed gradients, dout and
// lse, the outputs apart from the inputs and each other, the workspace against the sequence count's layout.
void backward_varlen_device(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                            const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Varlen& vl,
                            const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::backward_varlen";
  const DeviceProblem d = check_device_inputs(call, Pass::backward, q, k, v, vl, options);
  check_backward_tensors(call, q, k, out, dout, lse, dq, dk, dv);
  detail::check_gradients_apart(call, q, k, v, out, dout, lse, dq, dk, dv, options);
  const Tensor dout_rows = rows_view(dout, 0, q.shape[0]);
  detail::require_backward_layout(call, d.p, dout_rows);
  detail::check_workspace(call, d.p, Pass::backward, workspace, stream, "workspace_size_varlen");
#if defined(FA4_WITH_SM90)
  check_device_metadata(call, q, k, v, vl, options, stream);
  sm90::backward_varlen(d.p, d.q, d.k, d.v, rows_view(out, 0, q.shape[0]), dout_rows, lse,
                        rows_view(dq, 0, q.shape[0]), rows_view(dk, 0, k.shape[0]), rows_view(dv, 0, k.shape[0]), vl,
                        workspace, stream);
#else
  (void)d, (void)stream;
  throw Error(Status::internal, std::string(call) + ": a CUDA backend without sm_90a kernels was selected");
#endif
}

}  // namespace

void forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                    const Varlen& varlen, const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::forward_varlen";
  if (q.device == Device::cuda) return forward_varlen_device(q, k, v, out, lse, varlen, options, stream);
  const std::vector<Sequence> seqs = sequences(call, q, k, v, varlen);
  check_packed(call, "out", out, q.shape[0], q.shape[1], q.shape[2], q);
  if (lse) check_lse(call, *lse, q);
  detail::check_sink_options(call, options, q.shape[1], q, true);
  require_all(Pass::forward, seqs, q, k, v, options);
  for (const auto& [begin, end] : uncovered(seqs, false, q.shape[0])) {
    zero_rows(out, begin, end - begin);
    if (lse)
      for (int64_t h = 0; h < lse->shape[0]; ++h)
        for (int64_t r = begin; r < end; ++r)
          static_cast<float*>(lse->data)[h * lse->stride[0] + r * lse->stride[1]] = -INFINITY;
  }
  for (const Sequence& s : seqs) {
    const Tensor seq_lse = lse ? lse_view(*lse, s.q0, s.q_len) : Tensor{};
    forward(rows_view(q, s.q0, s.q_len), rows_view(k, s.k0, s.k_len), rows_view(v, s.k0, s.k_len),
            rows_view(out, s.q0, s.q_len), lse ? &seq_lse : nullptr, options, workspace, stream);
  }
}

void backward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Varlen& varlen,
                     const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::backward_varlen";
  if (q.device == Device::cuda)
    return backward_varlen_device(q, k, v, out, dout, lse, dq, dk, dv, varlen, options, workspace, stream);
  const std::vector<Sequence> seqs = sequences(call, q, k, v, varlen);
  check_backward_tensors(call, q, k, out, dout, lse, dq, dk, dv);
  detail::check_sink_options(call, options, q.shape[1], q, false);
  require_all(Pass::backward, seqs, q, k, v, options);
  for (const auto& [begin, end] : uncovered(seqs, false, q.shape[0])) zero_rows(dq, begin, end - begin);
  for (const auto& [begin, end] : uncovered(seqs, true, k.shape[0])) zero_rows(dk, begin, end - begin), zero_rows(dv, begin, end - begin);
  // The sinks' gradient sums over every sequence: each call writes its own into a scratch vector.
  const int64_t heads = q.shape[1];
  std::vector<float> seq_dsinks(options.dsinks ? size_t(heads) : 0), dsinks(seq_dsinks.size(), 0.0f);
  Options seq_options = options;
  Tensor seq_dsinks_t;
  if (options.dsinks) {
    seq_dsinks_t.data = seq_dsinks.data(), seq_dsinks_t.dtype = DType::f32, seq_dsinks_t.device = Device::cpu;
    seq_dsinks_t.rank = 1, seq_dsinks_t.shape = {heads, 0, 0, 0}, seq_dsinks_t.stride = {1, 0, 0, 0};
    seq_options.dsinks = &seq_dsinks_t;
  }
  for (const Sequence& s : seqs) {
    backward(rows_view(q, s.q0, s.q_len), rows_view(k, s.k0, s.k_len), rows_view(v, s.k0, s.k_len),
             rows_view(out, s.q0, s.q_len), rows_view(dout, s.q0, s.q_len), lse_view(lse, s.q0, s.q_len),
             rows_view(dq, s.q0, s.q_len), rows_view(dk, s.k0, s.k_len), rows_view(dv, s.k0, s.k_len), seq_options,
             workspace, stream);
    for (size_t h = 0; h < dsinks.size(); ++h) dsinks[h] += seq_dsinks[h];
  }
  for (size_t h = 0; h < dsinks.size(); ++h)
    static_cast<float*>(options.dsinks->data)[int64_t(h) * options.dsinks->stride[0]] = dsinks[h];
}

std::size_t workspace_size_varlen(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& varlen,
                                  const Options& options) {
  const char* call = "fa4::workspace_size_varlen";
  if (pass != Pass::forward && pass != Pass::backward)
    throw Error(Status::invalid_argument, std::string(call) + ": argument 'pass': expected forward or backward, got code " +
                                              std::to_string(static_cast<int>(pass)));
  if (q.device != Device::cuda) {
    check_packed_inputs(call, q, k, v, varlen);
    return 0;
  }
  if (pass == Pass::forward) return 0;  // the varlen forward does not split keys
  return detail::workspace_bytes(check_device_inputs(call, pass, q, k, v, varlen, options).p, pass);
}

Support supports_varlen(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& varlen,
                        const Options& options) {
  try {
    if (q.device == Device::cuda) {
      check_device_inputs("fa4::supports_varlen", pass, q, k, v, varlen, options);
      return {true, Status::ok, ""};
    }
    const std::vector<Sequence> seqs = sequences("fa4::supports_varlen", q, k, v, varlen);
    require_all(pass, seqs, q, k, v, options);
    if (seqs.empty()) return supports(pass, rows_view(q, 0, 0), rows_view(k, 0, 0), rows_view(v, 0, 0), options);
    return {true, Status::ok, ""};
  } catch (const Error& e) {
    return {false, e.code(), e.what()};
  }
}

}  // namespace fa4
