// Variable-length batches (fa4::forward_varlen / backward_varlen) on the CPU backend: ragged sequences (0, 1
// and longer, queries and keys of different lengths, seqused_k with NaN in the unused rows) packed without padding; every sequence's
// outputs and gradients, read back from the packed tensors, checked against the fp64 reference with the
// tolerance rule (testing::run_case on the same inputs). And each bad piece of metadata refused by name.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::Tensor;
using fa4::testing::CaseSpec;
using fa4::testing::HostTensor;

// A packed [total, heads, dim] tensor stored as a [1, total, heads, dim] HostTensor, seen as rank 3.
struct Packed {
  HostTensor host;
  Tensor desc;
  Packed(DType dtype, int64_t total, int64_t heads, int64_t dim)
      : host(HostTensor::make(dtype, {1, total, heads, dim})) {
    desc = host.desc();
    desc.rank = 3;
    desc.shape = {total, heads, dim, 1};
    desc.stride = {heads * dim, dim, 1, 1};
  }
};

struct Ragged {
  std::vector<int32_t> cu_q{0}, cu_k{0}, used_k;
  std::vector<CaseSpec> specs;  // one batch-1 case per sequence (its inputs are the packed rows)
  fa4::Varlen varlen() const {
    fa4::Varlen v;
    v.cu_seqlens_q = cu_q.data(), v.cu_seqlens_k = cu_k.data();
    v.seqused_k = used_k.empty() ? nullptr : used_k.data();
    v.batch = int64_t(specs.size());
    for (const CaseSpec& s : specs)
      v.max_seqlen_q = std::max(v.max_seqlen_q, s.seqlen_q), v.max_seqlen_k = std::max(v.max_seqlen_k, s.seqlen_k);
    return v;
  }
};

// Replays one sequence's rows of the packed results as the executor run_case checks.
class Replay : public fa4::testing::Executor {
 public:
  Replay(const Ragged& r, size_t b, const Packed& out, const HostTensor& lse, const Packed& dq, const Packed& dk,
         const Packed& dv)
      : r_(r), b_(b), out_(out), lse_(lse), dq_(dq), dk_(dk), dv_(dv) {}
  const char* name() const override { return "varlen replay"; }
  bool has_backward() const override { return true; }
  void forward(HostTensor&, HostTensor&, HostTensor&, HostTensor& out, HostTensor& lse, const Options&) override {
    copy_rows(out_.host, r_.cu_q[b_], out);
    const int64_t heads = out.desc().shape[2];
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < out.desc().shape[1]; ++i) lse.set({0, h, i, 0}, lse_.at({0, h, r_.cu_q[b_] + i, 0}));
  }
  bool backward(const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&,
                const HostTensor&, HostTensor& dq, HostTensor& dk, HostTensor& dv, const Options&) override {
    copy_rows(dq_.host, r_.cu_q[b_], dq);
    copy_rows(dk_.host, r_.cu_k[b_], dk);
    copy_rows(dv_.host, r_.cu_k[b_], dv);
    return true;
  }

 private:
  static void copy_rows(const HostTensor& packed, int64_t row0, HostTensor& to) {
    const auto& s = to.desc().shape;
    for (int64_t i = 0; i < s[1]; ++i)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t c = 0; c < s[3]; ++c) to.set({0, i, h, c}, packed.at({0, row0 + i, h, c}));
  }
  const Ragged& r_;
  size_t b_;
  const Packed &out_;
  const HostTensor& lse_;
  const Packed &dq_, &dk_, &dv_;
};

// unused_keys > 0: each sequence's keys are followed by that many NaN rows it owns but does not use
// (seqused_k), which poison the result if any is read.
void run_ragged(const std::vector<std::pair<int64_t, int64_t>>& lengths, const Options& options, DType dtype,
                int64_t heads, int64_t heads_kv, int64_t dim, int32_t unused_keys = 0) {
  Ragged r;
  uint64_t seed = 11;
  for (const auto& [lq, lk] : lengths) {
    CaseSpec s;
    s.seqlen_q = lq, s.seqlen_k = lk, s.heads_q = heads, s.heads_kv = heads_kv, s.head_dim = dim, s.dtype = dtype;
    s.options = options, s.seed = seed++;
    r.specs.push_back(s);
    r.cu_q.push_back(r.cu_q.back() + int32_t(lq)), r.cu_k.push_back(r.cu_k.back() + int32_t(lk) + unused_keys);
    if (unused_keys > 0) r.used_k.push_back(int32_t(lk));
  }
  const int64_t tq = r.cu_q.back(), tk = r.cu_k.back();
  Packed q(dtype, tq, heads, dim), k(dtype, tk, heads_kv, dim), v(dtype, tk, heads_kv, dim), dout(dtype, tq, heads, dim);
  Packed out(dtype, tq, heads, dim), dq(dtype, tq, heads, dim), dk(dtype, tk, heads_kv, dim), dv(dtype, tk, heads_kv, dim);
  k.host.poison(), v.host.poison();  // the unused rows stay NaN
  for (size_t b = 0; b < r.specs.size(); ++b) {  // the packed inputs are each case's own random inputs
    const fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(r.specs[b]);
    auto pack = [&](const HostTensor& from, Packed& to, int64_t row0) {
      const auto& s = from.desc().shape;
      for (int64_t i = 0; i < s[1]; ++i)
        for (int64_t h = 0; h < s[2]; ++h)
          for (int64_t c = 0; c < s[3]; ++c) to.host.set({0, row0 + i, h, c}, from.at({0, i, h, c}));
    };
    pack(in.q, q, r.cu_q[b]), pack(in.dout, dout, r.cu_q[b]), pack(in.k, k, r.cu_k[b]), pack(in.v, v, r.cu_k[b]);
  }
  HostTensor lse_host = HostTensor::make_lse({1, heads, tq});
  Tensor lse = lse_host.desc();
  lse.rank = 2, lse.shape = {heads, tq, 1, 1}, lse.stride = {tq, 1, 1, 1};
  for (auto* t : {&out.host, &dq.host, &dk.host, &dv.host, &lse_host}) t->poison();
  const fa4::Varlen vl = r.varlen();
  ASSERT_TRUE(fa4::supports_varlen(fa4::Pass::backward, q.desc, k.desc, v.desc, vl, options).ok);
  fa4::forward_varlen(q.desc, k.desc, v.desc, out.desc, &lse, vl, options);
  fa4::backward_varlen(q.desc, k.desc, v.desc, out.desc, dout.desc, lse, dq.desc, dk.desc, dv.desc, vl, options);
  // Key rows no sequence uses (seqused_k) get zero gradients, not the poison.
  for (size_t b = 0; b < r.specs.size(); ++b)
    for (int64_t row = r.cu_k[b] + r.specs[b].seqlen_k; row < r.cu_k[b + 1]; ++row)
      for (int64_t h = 0; h < heads_kv; ++h)
        for (int64_t c = 0; c < dim; ++c)
          ASSERT_TRUE(dk.host.at({0, row, h, c}) == 0 && dv.host.at({0, row, h, c}) == 0) << "row " << row;
  for (size_t b = 0; b < r.specs.size(); ++b) {
    Replay replay(r, b, out, lse_host, dq, dk, dv);
    const fa4::testing::CaseResult res = fa4::testing::run_case(r.specs[b], &replay);
    EXPECT_TRUE(res.pass) << "sequence " << b << " (" << r.specs[b].name() << "): " << res.failure;
  }
}

}  // namespace

TEST(Varlen, RaggedSequencesMatchTheReference) {
  const std::vector<std::pair<int64_t, int64_t>> lengths = {{37, 37}, {1, 5}, {0, 9}, {64, 100}, {5, 0}, {130, 130}, {1, 1}};
  run_ragged(lengths, {}, DType::bf16, 4, 2, 32);
  Options causal;
  causal.causal = true;
  run_ragged(lengths, causal, DType::bf16, 4, 1, 64);
  Options window;
  window.window_left = 17, window.window_right = 3, window.softcap = 20.0f;
  run_ragged(lengths, window, DType::f16, 2, 2, 32);
  run_ragged(lengths, causal, DType::bf16, 2, 1, 32, /*unused_keys=*/3);
}

TEST(Varlen, BadMetadataIsRefusedByName) {
  Packed q(DType::f32, 10, 2, 32), k(DType::f32, 12, 2, 32), v(DType::f32, 12, 2, 32), out(DType::f32, 10, 2, 32);
  std::vector<int32_t> cu_q{0, 4, 10}, cu_k{0, 6, 12};
  fa4::Varlen vl;
  vl.cu_seqlens_q = cu_q.data(), vl.cu_seqlens_k = cu_k.data(), vl.batch = 2, vl.max_seqlen_q = 6, vl.max_seqlen_k = 6;
  auto refusal = [&](const fa4::Varlen& bad) {
    try {
      fa4::forward_varlen(q.desc, k.desc, v.desc, out.desc, nullptr, bad);
    } catch (const fa4::Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(refusal(vl), "(accepted)");
  std::vector<int32_t> decreasing{0, 7, 5}, past_end{0, 4, 11}, not_zero{1, 4, 10}, used{7, 2};
  fa4::Varlen bad = vl;
  bad.cu_seqlens_q = decreasing.data();
  EXPECT_NE(refusal(bad).find("'varlen.cu_seqlens_q[2]': expected offsets that do not decrease (>= 7), got 5"),
            std::string::npos) << refusal(bad);
  bad = vl, bad.cu_seqlens_q = past_end.data();
  EXPECT_NE(refusal(bad).find("'varlen.cu_seqlens_q[2]': expected at most the packed rows (10), got 11"),
            std::string::npos) << refusal(bad);
  bad = vl, bad.cu_seqlens_q = not_zero.data();
  EXPECT_NE(refusal(bad).find("'varlen.cu_seqlens_q[0]'"), std::string::npos) << refusal(bad);
  bad = vl, bad.seqused_k = used.data();
  EXPECT_NE(refusal(bad).find("'varlen.seqused_k[0]': expected 0 .. 6"), std::string::npos) << refusal(bad);
  bad = vl, bad.max_seqlen_q = 5;
  EXPECT_NE(refusal(bad).find("'varlen.max_seqlen_q': expected 6 .. 10"), std::string::npos) << refusal(bad);
  bad = vl, bad.cu_seqlens_k = nullptr;
  EXPECT_NE(refusal(bad).find("'varlen.cu_seqlens_k'"), std::string::npos) << refusal(bad);
  // Packed shapes and devices.
  Packed wrong(DType::f32, 9, 2, 32);
  EXPECT_THROW(fa4::forward_varlen(q.desc, k.desc, v.desc, wrong.desc, nullptr, vl), fa4::Error);
  // A head_dim that is not contiguous (every other element of a wider row) is refused by name, in either pass.
  Packed wide(q.desc.dtype, q.desc.shape[0], q.desc.shape[1], 2 * q.desc.shape[2]);
  Tensor strided = wide.desc;
  strided.shape[2] = q.desc.shape[2], strided.stride[2] = 2;
  try {
    fa4::forward_varlen(q.desc, k.desc, v.desc, strided, nullptr, vl);
    ADD_FAILURE() << "a strided head_dim in out was accepted";
  } catch (const fa4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'out.stride[2]': expected 1"), std::string::npos) << e.what();
  }
  EXPECT_NE(fa4::supports_varlen(fa4::Pass::backward, strided, k.desc, v.desc, vl).reason.find("'q.stride[2]'"),
            std::string::npos);
  Tensor on_gpu = q.desc;
  on_gpu.device = fa4::Device::cuda;
  const fa4::Support s = fa4::supports_varlen(fa4::Pass::forward, on_gpu, k.desc, v.desc, vl);
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.code, fa4::Status::invalid_argument);  // k and v are not where q is
  EXPECT_NE(s.reason.find("the dtype and device of q"), std::string::npos) << s.reason;
  // The backward of a varlen batch runs on CUDA tensors too: where it is refused, the machine or the build is
  // the reason (no Hopper GPU, no CUDA backend), never the pass.
  Tensor k_gpu = k.desc, v_gpu = v.desc;
  k_gpu.device = v_gpu.device = fa4::Device::cuda;
  const fa4::Support b = fa4::supports_varlen(fa4::Pass::backward, on_gpu, k_gpu, v_gpu, vl);
  const fa4::Support f = fa4::supports_varlen(fa4::Pass::forward, on_gpu, k_gpu, v_gpu, vl);
  EXPECT_EQ(b.ok, f.ok) << b.reason << " / " << f.reason;
  if (!b.ok) {
    EXPECT_EQ(b.code, fa4::Status::unsupported);
    EXPECT_NE(b.reason.find("cuda"), std::string::npos) << b.reason;
    EXPECT_EQ(b.reason.find("backward"), std::string::npos) << b.reason;
  }
}
