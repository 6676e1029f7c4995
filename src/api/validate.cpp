#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/select.hpp"

namespace fa4::detail {

std::string shape_string(const Tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank && i < 4; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

void fail(Status code, const char* call, const std::string& arg, const std::string& expected, const std::string& got) {
  throw Error(code, std::string(call) + ": argument '" + arg + "': expected " + expected + ", got " + got);
}

void invalid(const char* call, const std::string& arg, const std::string& expected, const std::string& got) {
  fail(Status::invalid_argument, call, arg, expected, got);
}

namespace {

const char* const kDimNames4[4] = {"batch", "seqlen", "heads", "head_dim"};
const char* const kDimNames3[3] = {"batch", "heads", "seqlen_q"};

const char* dim_name(const Tensor& t, int i) { return t.rank == 3 ? kDimNames3[i] : kDimNames4[i]; }

bool valid_dtype(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::f64; }
bool valid_device(Device d) { return d == Device::cpu || d == Device::cuda; }

// Byte range [lo, hi) a tensor touches; empty (lo == hi) when it has no elements.
std::pair<int64_t, int64_t> byte_extent(const Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.rank; ++i) {
    const int64_t span = t.stride[i] * (t.shape[i] - 1);
    (span < 0 ? lo : hi) += span;
  }
  const auto base = static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(t.data));
  const auto es = static_cast<int64_t>(element_size(t.dtype));
  return {base + lo * es, base + (hi + 1) * es};
}

// Structure every tensor argument must have: rank, known dtype and device, sizes, unit head_dim stride,
// a pointer when there are elements, and offsets that fit 64-bit arithmetic.
void check_tensor(const char* call, const char* arg, const Tensor& t, int rank) {
  if (t.rank != rank) invalid(call, arg, "rank " + std::to_string(rank), "rank " + std::to_string(t.rank));
  if (!valid_dtype(t.dtype)) invalid(call, arg, "dtype f32, f16, bf16 or f64", "dtype code " + std::to_string(static_cast<int>(t.dtype)));
  if (!valid_device(t.device)) invalid(call, arg, "device cpu or cuda", "device code " + std::to_string(static_cast<int>(t.device)));
  for (int i = 0; i < rank; ++i)
    if (t.shape[i] < 0)
      invalid(call, arg, std::string("a non-negative size on dim ") + std::to_string(i) + " (" + dim_name(t, i) + ")",
              shape_string(t));
  if (rank == 4 && t.shape[3] > 1 && t.stride[3] != 1)
    invalid(call, std::string(arg) + ".stride[3]", "1 (head_dim must be contiguous)", std::to_string(t.stride[3]));
  if (t.numel() > 0 && t.data == nullptr) invalid(call, arg, "a data pointer (it has " + std::to_string(t.numel()) + " elements)", "null");
  // |offset| of the farthest element, in bytes, must fit comfortably in int64 (all address math is 64-bit).
  long double reach = 0;
  for (int i = 0; i < rank; ++i) reach += std::fabs(static_cast<long double>(t.stride[i])) * std::max<int64_t>(t.shape[i] - 1, 0);
  if (reach * element_size(t.dtype) > static_cast<long double>(int64_t{1} << 62))
    invalid(call, arg, "element offsets below 2^62 bytes", "a tensor reaching " + std::to_string(static_cast<double>(reach)) + " elements");
}

void check_same_shape(const char* call, const char* arg, const Tensor& t, const char* ref_name, const Tensor& ref) {
  for (int i = 0; i < ref.rank; ++i)
    if (t.shape[i] != ref.shape[i])
      invalid(call, arg, std::string("shape ") + shape_string(ref) + " (as '" + ref_name + "')", shape_string(t));
}

void check_same_kind(const char* call, const char* arg, const Tensor& t, const Tensor& q, DType dtype) {
  if (t.dtype != dtype) invalid(call, arg, std::string("dtype ") + to_string(dtype), to_string(t.dtype));
  if (t.device != q.device || t.device_index != q.device_index)
    invalid(call, arg, std::string("device ") + to_string(q.device) + ":" + std::to_string(q.device_index) + " (as 'q')",
            std::string(to_string(t.device)) + ":" + std::to_string(t.device_index));
}

void check_lse(const char* call, const Tensor& lse, const Problem& p, const Tensor& q) {
  check_tensor(call, "lse", lse, 3);
  check_same_kind(call, "lse", lse, q, DType::f32);
  if (lse.shape[0] != p.batch || lse.shape[1] != p.heads_q || lse.shape[2] != p.seqlen_q)
    invalid(call, "lse", "shape [" + std::to_string(p.batch) + ", " + std::to_string(p.heads_q) + ", " + std::to_string(p.seqlen_q) + "] ([batch, heads, seqlen_q])",
            shape_string(lse));
}


}  // namespace

void check_workspace(const char* call, const Problem& p, Pass pass, Workspace ws, Stream stream, const char* size_query) {
  const std::size_t need = workspace_bytes(p, pass);
  // No workspace at all ({nullptr, 0}) is allowed: the backend then takes what it needs from the stream-ordered
  // allocator (README). A workspace that is given must be large enough.
  const bool none_given = ws.data == nullptr && ws.bytes == 0;
  if (!none_given && ws.bytes < need)
    invalid(call, "workspace", std::to_string(need) + " bytes (see " + size_query + "), or none", std::to_string(ws.bytes) + " bytes");
  if (ws.bytes > 0 && ws.data == nullptr) invalid(call, "workspace", "a data pointer for " + std::to_string(ws.bytes) + " bytes", "null");
  if (p.device == Device::cpu && stream != nullptr) invalid(call, "stream", "null for cpu tensors", "a CUDA stream");
}

// An output must not write any element twice: sorted by |stride|, each dim must step past all the smaller.
void check_no_self_overlap(const char* call, const char* arg, const Tensor& t) {
  if (t.numel() == 0) return;
  std::vector<std::pair<int64_t, int64_t>> dims;  // |stride|, size
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) dims.push_back({t.stride[i] < 0 ? -t.stride[i] : t.stride[i], t.shape[i]});
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (auto [stride, size] : dims) {
    if (stride <= reach)
      invalid(call, arg, "strides under which no two elements share memory (it is an output)",
              "stride " + std::to_string(stride) + " inside the span of the smaller dims");
    reach += stride * (size - 1);
  }
}

void check_disjoint(const char* call, const char* out_name, const Tensor& out, const char* in_name, const Tensor& in) {
  const auto a = byte_extent(out), b = byte_extent(in);
  if (a.first == a.second || b.first == b.second) return;
  if (a.first < b.second && b.first < a.second)
    invalid(call, out_name, std::string("memory disjoint from '") + in_name + "'", "an overlapping range (aliasing)");
}

void check_sink_options(const char* call, const Options& o, int64_t heads_q, const Tensor& q, bool forward) {
  for (auto [name, t] : {std::pair{"options.sinks", o.sinks}, {"options.dsinks", o.dsinks}}) {
    if (t == nullptr) continue;
    check_tensor(call, name, *t, 1);
    check_same_kind(call, name, *t, q, DType::f32);
    if (t->shape[0] != heads_q) invalid(call, name, "shape [" + std::to_string(heads_q) + "] ([heads_q])", shape_string(*t));
  }
  if (o.dsinks && !o.sinks) invalid(call, "options.dsinks", "null unless options.sinks is given", "a tensor");
  if (o.dsinks && forward) invalid(call, "options.dsinks", "null (only the backward writes the sinks' gradient)", "a tensor");
}

void check_backward_splits(const char* call, const Options& o) {
  if (o.num_splits > 1)
    invalid(call, "options.num_splits", "0 or 1 for the backward (split-KV is a forward-only option)",
            std::to_string(o.num_splits));
}

Problem validate_inputs(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Options& o,
                        const char* k_name, const char* v_name) {
  check_tensor(call, "q", q, 4);
  check_tensor(call, k_name, k, 4);
  check_tensor(call, v_name, v, 4);
  check_same_kind(call, k_name, k, q, q.dtype);
  check_same_kind(call, v_name, v, q, q.dtype);

  Problem p;
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.heads_q = q.shape[2];
  p.q_heads_strided = q.stride[2] != 0 || q.shape[2] == 1;
  p.head_dim = q.shape[3];
  p.seqlen_k = k.shape[1];
  p.heads_kv = k.shape[2];
  p.dtype = q.dtype;
  p.device = q.device;
  p.device_index = q.device_index;
  if (k.shape[0] != p.batch) invalid(call, k_name, "shape[0] (batch) = " + std::to_string(p.batch) + " (as 'q')", shape_string(k));
  if (v.shape[0] != p.batch) invalid(call, v_name, "shape[0] (batch) = " + std::to_string(p.batch) + " (as 'q')", shape_string(v));
  if (v.shape[1] != p.seqlen_k) invalid(call, v_name, "shape[1] (seqlen_k) = " + std::to_string(p.seqlen_k) + " (as '" + k_name + "')", shape_string(v));
  if (v.shape[2] != p.heads_kv) invalid(call, v_name, "shape[2] (heads_kv) = " + std::to_string(p.heads_kv) + " (as '" + k_name + "')", shape_string(v));
  if (k.shape[3] != p.head_dim) invalid(call, k_name, "shape[3] (head_dim) = " + std::to_string(p.head_dim) + " (as 'q')", shape_string(k));
  if (v.shape[3] != p.head_dim)
    invalid(call, v_name, "shape[3] (head_dim) = " + std::to_string(p.head_dim) + " (as 'q'; a different value head dim is not supported)", shape_string(v));
  if (p.heads_kv == 0 && p.heads_q > 0) invalid(call, k_name, "at least one kv head (shape[2] > 0)", shape_string(k));
  if (p.heads_kv > 0 && p.heads_q % p.heads_kv != 0)
    invalid(call, k_name, "a number of kv heads dividing the " + std::to_string(p.heads_q) + " query heads (GQA/MQA)",
            std::to_string(p.heads_kv) + " kv heads");
  if (p.head_dim < 1 || p.head_dim > 256)
    fail(Status::unsupported, call, "q", "head_dim (shape[3]) in [1, 256]", std::to_string(p.head_dim));

  // Options.
  if (o.softmax_scale && !std::isfinite(*o.softmax_scale))
    invalid(call, "options.softmax_scale", "a finite number", std::to_string(*o.softmax_scale));
  p.scale = o.softmax_scale ? *o.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  if (!std::isfinite(o.softcap) || o.softcap < 0)
    invalid(call, "options.softcap", "a finite number >= 0 (0 = off)", std::to_string(o.softcap));
  p.softcap = o.softcap;
  if (o.window_left < -1) invalid(call, "options.window_left", ">= 0, or -1 for unbounded", std::to_string(o.window_left));
  if (o.window_right < -1) invalid(call, "options.window_right", ">= 0, or -1 for unbounded", std::to_string(o.window_right));
  if (o.causal && o.window_right > 0)
    invalid(call, "options.window_right", "-1 or 0 with causal=true (causal already limits the right side to 0)",
            std::to_string(o.window_right));
  p.mask = num::Mask::make(p.seqlen_q, p.seqlen_k, o.causal, o.window_left, o.window_right);
  if (!std::isfinite(o.rescale_threshold) || o.rescale_threshold < 0 || o.rescale_threshold > 15)
    invalid(call, "options.rescale_threshold", "tau in [0, 15] (log2 units; P <= 2^tau must fit fp16)", std::to_string(o.rescale_threshold));
  p.rescale_threshold = o.rescale_threshold;
  const float f16ths = o.exp2_emulated_fraction * 16.0f;
  if (!std::isfinite(f16ths) || f16ths < 0 || f16ths > 16 || f16ths != std::floor(f16ths))
    invalid(call, "options.exp2_emulated_fraction", "k/16 for k in 0..16", std::to_string(o.exp2_emulated_fraction));
  p.exp2_emulated_per16 = static_cast<int>(f16ths);
  if (p.exp2_emulated_per16 > 0 && (p.dtype == DType::f32 || p.dtype == DType::f64))
    fail(Status::unsupported, call, "options.exp2_emulated_fraction",
         "0 for f32/f64 inputs (the emulation's 8.8e-5 relative error is a bf16/fp16 policy)",
         std::to_string(o.exp2_emulated_fraction) + " with " + to_string(p.dtype));
  p.deterministic = o.deterministic;
  if (o.num_splits < 0)
    invalid(call, "options.num_splits", ">= 0 (0: chosen by the backend; n: n key ranges)", std::to_string(o.num_splits));
  if (o.num_splits > 1 && p.dtype == DType::f64)
    fail(Status::unsupported, call, "options.num_splits",
         "0 or 1 for f64 inputs (they are computed exactly, in fp64; split-KV merges fp32 partials)",
         std::to_string(o.num_splits));
  p.num_splits = o.num_splits;
  check_sink_options(call, o, p.heads_q, q, false);
  p.sinks = o.sinks;
  p.dsinks = o.dsinks;

  require_backend(call, p);  // the device and dtype must have a backend in this build
  require_layout(call, p, q, k, v, k_name, v_name);  // and its kernels must be able to read these strides
  return p;
}

void check_outputs_apart(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor* lse) {
  check_no_self_overlap(call, "out", out);
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) check_disjoint(call, "out", out, name, *t);
  if (lse) {
    check_no_self_overlap(call, "lse", *lse);
    for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}}) check_disjoint(call, "lse", *lse, name, *t);
  }
}

Problem validate_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                         const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::forward";
  Problem p = validate_inputs(call, q, k, v, options);
  check_sink_options(call, options, p.heads_q, q, true);
  check_tensor(call, "out", out, 4);
  check_same_kind(call, "out", out, q, q.dtype);
  check_same_shape(call, "out", out, "q", q);
  if (lse) check_lse(call, *lse, p, q);
  check_outputs_apart(call, q, k, v, out, lse);
  check_workspace(call, p, Pass::forward, workspace, stream);
  return p;
}

void check_gradients_apart(const char* call, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                           const Options& options) {
  const std::pair<const char*, const Tensor*> outputs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& o : outputs) check_no_self_overlap(call, o.first, *o.second);
  const std::pair<const char*, const Tensor*> all[] = {{"q", &q},   {"k", &k},   {"v", &v},  {"out", &out}, {"dout", &dout},
                                                       {"lse", &lse}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  for (const auto& o : outputs)
    for (const auto& a : all)
      if (std::string(a.first) != o.first) check_disjoint(call, o.first, *o.second, a.first, *a.second);
  if (options.dsinks) {
    check_no_self_overlap(call, "options.dsinks", *options.dsinks);
    check_disjoint(call, "options.dsinks", *options.dsinks, "options.sinks", *options.sinks);
    for (const auto& a : all) check_disjoint(call, "options.dsinks", *options.dsinks, a.first, *a.second);
  }
}

Problem validate_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                          const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                          const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::backward";
  Problem p = validate_inputs(call, q, k, v, options);
  require_pass(call, p, Pass::backward);
  check_backward_splits(call, options);
  check_tensor(call, "out", out, 4);
  check_same_kind(call, "out", out, q, q.dtype);
  check_same_shape(call, "out", out, "q", q);
  check_tensor(call, "dout", dout, 4);
  check_same_kind(call, "dout", dout, q, q.dtype);
  check_same_shape(call, "dout", dout, "q", q);
  check_lse(call, lse, p, q);
  const std::pair<const char*, const Tensor*> outputs[] = {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}};
  const std::pair<const char*, const Tensor*> shapes[] = {{"q", &q}, {"k", &k}, {"v", &v}};
  for (int i = 0; i < 3; ++i) {
    check_tensor(call, outputs[i].first, *outputs[i].second, 4);
    check_same_kind(call, outputs[i].first, *outputs[i].second, q, q.dtype);
    check_same_shape(call, outputs[i].first, *outputs[i].second, shapes[i].first, *shapes[i].second);
  }
  check_gradients_apart(call, q, k, v, out, dout, lse, dq, dk, dv, options);
  require_backward_layout(call, p, dout);
  check_workspace(call, p, Pass::backward, workspace, stream);
  return p;
}

bool validate_device_metadata(const Options& options) {
  if (options.validate_device_metadata) return true;
  const char* env = std::getenv("FA4_VALIDATE");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace fa4::detail
