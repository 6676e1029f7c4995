// Variable-length batches on the sm_90a forward (fa4::forward_varlen on cuda tensors, one launch for every
// sequence): each sequence's out and lse against the fp64 reference of that sequence alone, with the tolerance
// rule, for every compiled forward (dtype, head dim), over ragged lengths with 0 and 1 and sequences longer
// than a tile, GQA, every mask, softcap, sinks and seqused_k (the keys past it NaN). Outputs start NaN-poisoned; rows that belong to no
// sequence must stay so (not written). The metadata are device arrays, as an engine passes them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/fa4.hpp"
#include "gpu_test_util.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::Tensor;

// Rows row0 .. row0 + rows - 1 of a packed rank-3 tensor as a rank-4 batch-1 tensor (host memory).
Tensor rows_of(const Tensor& t, int64_t row0, int64_t rows) {
  Tensor r = t;
  r.rank = 4;
  r.data = static_cast<char*>(t.data) + row0 * t.stride[0] * int64_t(fa4::element_size(t.dtype));
  r.shape = {1, rows, t.shape[1], t.shape[2]};
  r.stride = {std::max<int64_t>(rows, 1) * t.stride[0], t.stride[0], t.stride[1], t.stride[2]};
  return r;
}

// A packed [total, heads, dim] descriptor of a [1, total, heads, dim] host or device tensor.
Tensor packed(Tensor t) {
  t.rank = 3;
  t.shape = {t.shape[1], t.shape[2], t.shape[3], 0};
  t.stride = {t.stride[1], t.stride[2], t.stride[3], 0};
  return t;
}

struct VarlenCase {
  DType dtype = DType::bf16;
  int64_t head_dim = 128, heads_q = 6, heads_kv = 2;
  std::vector<int32_t> len_q, len_k;  // per sequence
  std::vector<int32_t> used_k;        // empty: no seqused_k
  int64_t spare_q = 0;                // packed rows after the last sequence (belong to none)
  Options options;
  bool sinks = false;
  uint64_t seed = 1;
  std::string name() const {
    std::string s = std::string(fa4::to_string(dtype)) + " d" + std::to_string(head_dim) + " h" +
                    std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " lens";
    for (size_t b = 0; b < len_q.size(); ++b) s += " " + std::to_string(len_q[b]) + "x" + std::to_string(len_k[b]);
    if (options.causal) s += " causal";
    if (options.window_left >= 0 || options.window_right >= 0)
      s += " window(" + std::to_string(options.window_left) + "," + std::to_string(options.window_right) + ")";
    if (options.softcap > 0) s += " softcap";
    if (sinks) s += " sinks";
    if (!used_k.empty()) s += " seqused_k";
    return s;
  }
};

void check_varlen(const VarlenCase& c) {
  SCOPED_TRACE(c.name());
  const int64_t batch = int64_t(c.len_q.size());
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < batch; ++b) cu_q.push_back(cu_q.back() + c.len_q[size_t(b)]);
  for (int64_t b = 0; b < batch; ++b) cu_k.push_back(cu_k.back() + c.len_k[size_t(b)]);
  const int64_t total_q = cu_q.back() + c.spare_q, total_k = cu_k.back();
  auto q = HostTensor::make(c.dtype, {1, total_q, c.heads_q, c.head_dim});
  auto k = HostTensor::make(c.dtype, {1, total_k, c.heads_kv, c.head_dim});
  auto v = HostTensor::make(c.dtype, {1, total_k, c.heads_kv, c.head_dim});
  auto out = HostTensor::make(c.dtype, {1, total_q, c.heads_q, c.head_dim});
  auto lse = HostTensor::make_lse({1, c.heads_q, total_q});
  q.fill_normal(c.seed * 7 + 1, c.options.softcap > 0 ? c.options.softcap / 4 : 1.0);
  k.fill_normal(c.seed * 7 + 2);
  v.fill_normal(c.seed * 7 + 3);
  // Keys past seqused_k are not the sequence's: NaN there (0xFFFF in both 16-bit formats) must not reach its
  // output (a zero probability times a NaN value is still a NaN).
  for (size_t b = 0; b < c.used_k.size(); ++b)
    for (auto* t : {&k, &v})
      std::fill_n(static_cast<uint16_t*>(t->desc().data) + (cu_k[b] + c.used_k[b]) * c.heads_kv * c.head_dim,
                  (c.len_k[b] - c.used_k[b]) * c.heads_kv * c.head_dim, uint16_t(0xFFFF));
  out.poison(), lse.poison();
  std::vector<float> sink_values;
  for (int64_t h = 0; h < c.heads_q; ++h) sink_values.push_back(c.sinks ? float(h % 3) - 1.5f : 0.0f);
  float* d_sinks = nullptr;
  cudaMalloc(&d_sinks, sink_values.size() * sizeof(float));
  cudaMemcpy(d_sinks, sink_values.data(), sink_values.size() * sizeof(float), cudaMemcpyHostToDevice);
  Tensor sinks_host;
  sinks_host.data = sink_values.data(), sinks_host.dtype = DType::f32, sinks_host.rank = 1;
  sinks_host.shape = {c.heads_q, 0, 0, 0}, sinks_host.stride = {1, 0, 0, 0};
  Tensor sinks_dev = sinks_host;
  sinks_dev.data = d_sinks, sinks_dev.device = fa4::Device::cuda;

  DeviceCopy d_q(q, size_t(q.numel())), d_k(k, size_t(k.numel())), d_v(v, size_t(v.numel())),
      d_out(out, size_t(out.numel())), d_lse(lse, size_t(lse.numel()));
  const DeviceInts d_cu_q(cu_q), d_cu_k(cu_k), d_used(c.used_k);
  fa4::Varlen vl;
  vl.cu_seqlens_q = d_cu_q.ptr, vl.cu_seqlens_k = d_cu_k.ptr;
  vl.seqused_k = c.used_k.empty() ? nullptr : d_used.ptr;
  vl.batch = batch;
  for (int64_t b = 0; b < batch; ++b) {
    vl.max_seqlen_q = std::max<int64_t>(vl.max_seqlen_q, c.len_q[size_t(b)]);
    vl.max_seqlen_k = std::max<int64_t>(vl.max_seqlen_k, c.used_k.empty() ? c.len_k[size_t(b)] : c.used_k[size_t(b)]);
  }
  Tensor d_lse2 = d_lse.desc();  // [heads, total_q]
  d_lse2.rank = 2, d_lse2.shape = {c.heads_q, total_q, 0, 0}, d_lse2.stride = {total_q, 1, 0, 0};
  Options o = c.options;
  if (c.sinks) o.sinks = &sinks_dev;
  try {
    fa4::forward_varlen(packed(d_q.desc()), packed(d_k.desc()), packed(d_v.desc()), packed(d_out.desc()), &d_lse2, vl, o);
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << "threw: " << e.what();
  }
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(d_sinks);
  d_out.copy_back(out);
  d_lse.copy_back(lse);

  // Each sequence against the fp64 reference of that sequence alone (and the same-precision naive one).
  const Tensor pq = packed(q.desc()), pk = packed(k.desc()), pv = packed(v.desc()), pout = packed(out.desc());
  Options host_o = c.options;
  if (c.sinks) host_o.sinks = &sinks_host;
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0;
  const std::vector<double> lv = lse.values();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = c.len_q[size_t(b)], sk = c.used_k.empty() ? c.len_k[size_t(b)] : c.used_k[size_t(b)];
    if (sq == 0) continue;
    const Tensor qb = rows_of(pq, cu_q[size_t(b)], sq), kb = rows_of(pk, cu_k[size_t(b)], sk),
                 vb = rows_of(pv, cu_k[size_t(b)], sk), ob = rows_of(pout, cu_q[size_t(b)], sq);
    const fa4::detail::Problem p = fa4::detail::validate_inputs("test", qb, kb, vb, host_o);
    auto ref = HostTensor::make(DType::f64, {1, sq, c.heads_q, c.head_dim});
    auto naive = HostTensor::make(DType::f64, {1, sq, c.heads_q, c.head_dim});
    auto lse_ref = HostTensor::make_lse({1, c.heads_q, sq}), lse_naive = HostTensor::make_lse({1, c.heads_q, sq});
    fa4::cpu::reference_forward(p, qb, kb, vb, ref.desc(), &lse_ref.desc(), fa4::cpu::Precision::exact);
    fa4::cpu::reference_forward(p, qb, kb, vb, naive.desc(), &lse_naive.desc(), fa4::cpu::Precision::storage);
    auto got = HostTensor::make(c.dtype, {1, sq, c.heads_q, c.head_dim});  // the sequence's rows, dense
    for (int64_t i = 0; i < sq; ++i)
      std::memcpy(static_cast<char*>(got.desc().data) + i * c.heads_q * c.head_dim * int64_t(fa4::element_size(c.dtype)),
                  static_cast<char*>(ob.data) + i * ob.stride[1] * int64_t(fa4::element_size(c.dtype)),
                  size_t(c.heads_q * c.head_dim) * fa4::element_size(c.dtype));
    const fa4::testing::Comparison co =
        fa4::testing::compare(got.values(), ref.values(), naive.values(), c.dtype, rtol, 0.0);
    std::vector<double> got_lse;
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < sq; ++i) got_lse.push_back(lv[size_t(h * total_q + cu_q[size_t(b)] + i)]);
    const fa4::testing::Comparison cl =
        fa4::testing::compare(got_lse, lse_ref.values(), lse_naive.values(), DType::f32, rtol, 0.0);
    EXPECT_TRUE(co.pass) << "sequence " << b << " out " << co.summary();
    EXPECT_TRUE(cl.pass) << "sequence " << b << " lse " << cl.summary();
  }
  // Rows of no sequence: not written.
  const std::vector<double> ov = out.values();
  size_t written = 0;
  for (int64_t r = cu_q.back(); r < total_q; ++r)
    for (int64_t e = 0; e < c.heads_q * c.head_dim; ++e) written += !std::isnan(ov[size_t(r * c.heads_q * c.head_dim + e)]);
  EXPECT_EQ(written, 0u) << "rows past the last sequence were written";
  std::printf("  %-90s %s\n", c.name().c_str(), ::testing::Test::HasFailure() ? "FAIL" : "ok");
  std::fflush(stdout);
}

TEST(GpuVarlenSm90, EveryInstanceEveryMask) {
  REQUIRE_SM90();
  uint64_t seed = 300;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    VarlenCase c;
    c.dtype = dtype, c.head_dim = head_dim;
    // Ragged: empty, one row, a tile and a tail, longer queries than keys (causal rows with no key), 0 keys.
    c.len_q = {77, 0, 1, 300, 129, 40, 5};
    c.len_k = {45, 3, 1, 513, 129, 0, 200};
    c.spare_q = 9;
    for (int variant = 0; variant < 5; ++variant) {
      VarlenCase v = c;
      v.seed = ++seed;
      if (variant == 1) v.options.causal = true;
      if (variant == 2) v.options.window_left = 37, v.options.window_right = 11;
      if (variant == 3) v.options.softcap = 30.0f, v.options.causal = true;
      if (variant == 4) v.sinks = true, v.options.causal = true;
      check_varlen(v);
    }
  }
}

TEST(GpuVarlenSm90, SequsedKAndManySequences) {
  REQUIRE_SM90();
  VarlenCase c;
  c.dtype = DType::bf16, c.head_dim = 128, c.heads_q = 8, c.heads_kv = 8;
  c.len_q = {10, 3, 0, 64, 1}, c.len_k = {200, 50, 9, 64, 300}, c.used_k = {150, 0, 4, 64, 1};
  check_varlen(c);
  VarlenCase many;  // more sequences than SMs hold tiles at once: the persistent walk over all of them
  many.dtype = DType::f16, many.head_dim = 64, many.heads_q = 4, many.heads_kv = 1;
  for (int b = 0; b < 150; ++b) many.len_q.push_back((b * 37) % 97), many.len_k.push_back((b * 53) % 131 + 1);
  many.options.causal = true;
  check_varlen(many);
}

TEST(GpuVarlenSm90, RefusalsNameTheArgument) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 16, 2, 64});
  q.fill_normal(1);
  DeviceCopy d(q, size_t(q.numel()));
  const DeviceInts cu(std::vector<int32_t>{0, 16});
  fa4::Varlen vl;
  vl.cu_seqlens_q = vl.cu_seqlens_k = cu.ptr, vl.batch = 1, vl.max_seqlen_q = 17, vl.max_seqlen_k = 16;
  auto expect = [&](const Options& o, const std::string& what) {
    try {
      fa4::forward_varlen(packed(d.desc()), packed(d.desc()), packed(d.desc()), packed(d.desc()), nullptr, vl, o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const fa4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect({}, "varlen.max_seqlen_q");  // 17 > total_q
  vl.max_seqlen_q = 16;
  Options split;
  split.num_splits = 2;
  expect(split, "options.num_splits");
  expect({}, "'out': expected memory disjoint from 'q'");  // out is q here
  EXPECT_TRUE(fa4::supports_varlen(fa4::Pass::forward, packed(d.desc()), packed(d.desc()), packed(d.desc()), vl).ok);
  const fa4::Support bwd = fa4::supports_varlen(fa4::Pass::backward, packed(d.desc()), packed(d.desc()), packed(d.desc()), vl);
  EXPECT_FALSE(bwd.ok);
  EXPECT_NE(bwd.reason.find("backward of a variable-length batch"), std::string::npos) << bwd.reason;
}

}  // namespace

namespace {

TEST(GpuVarlenSm90, ValidationNamesEachBadDeviceEntry) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 40, 2, 64});
  q.fill_normal(3);
  DeviceCopy d(q, size_t(q.numel())), d_out(q, size_t(q.numel()));
  auto expect = [&](std::vector<int32_t> cu_q, std::vector<int32_t> used, int64_t max_q, const std::string& arg) {
    const DeviceInts d_cu_q(cu_q), d_cu_k(std::vector<int32_t>{0, 10, 30}), d_used(used);
    fa4::Varlen vl;
    vl.cu_seqlens_q = d_cu_q.ptr, vl.cu_seqlens_k = d_cu_k.ptr, vl.seqused_k = used.empty() ? nullptr : d_used.ptr;
    vl.batch = 2, vl.max_seqlen_q = max_q, vl.max_seqlen_k = 20;
    Options o;
    o.validate_device_metadata = true;
    try {
      fa4::forward_varlen(packed(d.desc()), packed(d.desc()), packed(d.desc()), packed(d_out.desc()), nullptr, vl, o);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const fa4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  };
  expect({0, 25, 20}, {}, 25, "varlen.cu_seqlens_q[2]");  // decreasing
  expect({0, 10, 30}, {5, 21}, 20, "varlen.seqused_k[1]");  // more than its 20 keys
  expect({0, 10, 30}, {}, 12, "varlen.max_seqlen_q");      // shorter than the longest (20)
}

}  // namespace
