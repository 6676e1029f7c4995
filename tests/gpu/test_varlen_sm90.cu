// Variable-length batches on the sm_90a forward (fa4::forward_varlen on cuda tensors, one launch for every
// sequence): each sequence's out and lse against the fp64 reference of that sequence alone, with the tolerance
// rule, for every compiled forward (dtype, head dim), over ragged lengths with 0 and 1 and sequences longer
// than a tile, GQA, every mask, softcap, sinks and seqused_k (the keys past it NaN). Outputs start NaN-poisoned; rows that belong to no
// sequence must stay so (not written). The metadata are device arrays, as an engine passes them. The backward
// (fa4::backward_varlen) likewise, below.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  int64_t spare_k = 0;                // the same for k and v (backward cases)
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

// A case's offsets on the host and the device, the fa4::Varlen of the device ones, and the [heads, total_q]
// view of a [1, heads, total_q] lse.
std::vector<int32_t> offsets(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (const int32_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}
struct CaseMetadata {
  explicit CaseMetadata(const VarlenCase& c)
      : cu_q(offsets(c.len_q)), cu_k(offsets(c.len_k)), d_cu_q(cu_q), d_cu_k(cu_k), d_used(c.used_k) {
    vl.cu_seqlens_q = d_cu_q.ptr, vl.cu_seqlens_k = d_cu_k.ptr;
    vl.seqused_k = c.used_k.empty() ? nullptr : d_used.ptr;
    vl.batch = int64_t(c.len_q.size());
    for (size_t b = 0; b < c.len_q.size(); ++b) {
      vl.max_seqlen_q = std::max<int64_t>(vl.max_seqlen_q, c.len_q[b]);
      vl.max_seqlen_k = std::max<int64_t>(vl.max_seqlen_k, c.used_k.empty() ? c.len_k[b] : c.used_k[b]);
    }
  }
  std::vector<int32_t> cu_q, cu_k;
  DeviceInts d_cu_q, d_cu_k, d_used;
  fa4::Varlen vl;
};
Tensor heads_by_rows(Tensor lse, int64_t heads, int64_t total_q) {
  lse.rank = 2, lse.shape = {heads, total_q, 0, 0}, lse.stride = {total_q, 1, 0, 0};
  return lse;
}

// The current test's failures so far, and one case's line in the log (flushed: a time limit that kills the
// process keeps what was printed).
int failures() { return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count(); }
void print_case(const char* pass, const std::string& name, bool failed) {
  std::printf("  %s%-*s %s\n", pass, 90 - int(std::strlen(pass)), name.c_str(), failed ? "FAIL" : "ok");
  std::fflush(stdout);
}

void check_varlen(const VarlenCase& c) {
  SCOPED_TRACE(c.name());
  const int failures_before = failures();
  const int64_t batch = int64_t(c.len_q.size());
  const CaseMetadata meta(c);
  const std::vector<int32_t>&cu_q = meta.cu_q, &cu_k = meta.cu_k;
  const fa4::Varlen& vl = meta.vl;
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
  const Tensor d_lse2 = heads_by_rows(d_lse.desc(), c.heads_q, total_q);
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
  print_case("", c.name(), failures() > failures_before);
}

// What every instance runs on its ragged lengths: no mask, causal, a window, softcap, sinks, and (deterministic)
// the deterministic mode; each case with the next seed.
std::vector<VarlenCase> mask_variants(const VarlenCase& base, bool deterministic, uint64_t& seed) {
  std::vector<VarlenCase> cases;
  for (int variant = 0; variant < (deterministic ? 6 : 5); ++variant) {
    VarlenCase v = base;
    v.seed = ++seed;
    if (variant == 1) v.options.causal = true;
    if (variant == 2) v.options.window_left = 37, v.options.window_right = 11;
    if (variant == 3) v.options.softcap = 30.0f, v.options.causal = true;
    if (variant == 4) v.sinks = true, v.options.causal = true;
    if (variant == 5) v.options.deterministic = true, v.options.causal = true;
    cases.push_back(v);
  }
  return cases;
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
    for (const VarlenCase& v : mask_variants(c, /*deterministic=*/false, seed)) check_varlen(v);
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
  EXPECT_TRUE(fa4::supports_varlen(fa4::Pass::backward, packed(d.desc()), packed(d.desc()), packed(d.desc()), vl).ok);
  const fa4::Support bwd_split =
      fa4::supports_varlen(fa4::Pass::backward, packed(d.desc()), packed(d.desc()), packed(d.desc()), vl, split);
  EXPECT_FALSE(bwd_split.ok);
  EXPECT_NE(bwd_split.reason.find("options.num_splits"), std::string::npos) << bwd_split.reason;
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

// The backward (fa4::backward_varlen on cuda tensors): each sequence's dq, dk, dv against the fp64 reference of
// that sequence alone, with the tolerance rule; the gradients NaN-poisoned first; q, dout, k and v NaN in every
// row no sequence owns and in the keys past seqused_k (a NaN there must reach no gradient: the tiles' rows past
// a sequence load as zeros); those rows' gradients zero, as on the CPU backend. With sinks, dsinks summed over
// the sequences against the reference's sum. Deterministic: a second run gives the same bits.
namespace {

struct VarlenGrads {
  HostTensor dq, dk, dv;
  std::vector<float> dsinks;
};

void check_varlen_backward(const VarlenCase& c) {
  SCOPED_TRACE("backward " + c.name());
  const int failures_before = failures();
  const int64_t batch = int64_t(c.len_q.size());
  const CaseMetadata meta(c);
  const std::vector<int32_t>&cu_q = meta.cu_q, &cu_k = meta.cu_k;
  const fa4::Varlen& vl = meta.vl;
  const int64_t total_q = cu_q.back() + c.spare_q, total_k = cu_k.back() + c.spare_k;
  const int64_t hq = c.heads_q, hk = c.heads_kv, d = c.head_dim;
  auto q = HostTensor::make(c.dtype, {1, total_q, hq, d}), dout = HostTensor::make(c.dtype, {1, total_q, hq, d});
  auto k = HostTensor::make(c.dtype, {1, total_k, hk, d}), v = HostTensor::make(c.dtype, {1, total_k, hk, d});
  q.fill_normal(c.seed * 11 + 1, c.options.softcap > 0 ? c.options.softcap / 4 : 1.0);
  k.fill_normal(c.seed * 11 + 2);
  v.fill_normal(c.seed * 11 + 3);
  dout.fill_normal(c.seed * 11 + 4);
  auto nan_rows = [](HostTensor& t, int64_t row0, int64_t rows, int64_t row_elems) {
    if (rows > 0) std::fill_n(static_cast<uint16_t*>(t.desc().data) + row0 * row_elems, rows * row_elems, uint16_t(0xFFFF));
  };
  nan_rows(q, cu_q.back(), c.spare_q, hq * d), nan_rows(dout, cu_q.back(), c.spare_q, hq * d);
  for (auto* t : {&k, &v}) {
    nan_rows(*t, cu_k.back(), c.spare_k, hk * d);
    for (size_t b = 0; b < c.used_k.size(); ++b) nan_rows(*t, cu_k[b] + c.used_k[b], c.len_k[b] - c.used_k[b], hk * d);
  }
  std::vector<float> sink_values;
  for (int64_t h = 0; h < hq; ++h) sink_values.push_back(float(h % 3) - 1.5f);
  float *d_sinks = nullptr, *d_dsinks = nullptr;
  CUDA_OK(cudaMalloc(&d_sinks, size_t(hq) * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_dsinks, size_t(hq) * sizeof(float)));
  CUDA_OK(cudaMemcpy(d_sinks, sink_values.data(), size_t(hq) * sizeof(float), cudaMemcpyHostToDevice));
  auto vector_tensor = [hq](void* data, fa4::Device device) {
    Tensor t;
    t.data = data, t.dtype = DType::f32, t.device = device, t.rank = 1;
    t.shape = {hq, 0, 0, 0}, t.stride = {1, 0, 0, 0};
    return t;
  };
  const Tensor sinks_dev = vector_tensor(d_sinks, fa4::Device::cuda), dsinks_dev = vector_tensor(d_dsinks, fa4::Device::cuda);

  auto out = HostTensor::make(c.dtype, {1, total_q, hq, d});
  auto lse = HostTensor::make_lse({1, hq, total_q});
  out.poison(), lse.poison();
  DeviceCopy d_q(q, size_t(q.numel())), d_k(k, size_t(k.numel())), d_v(v, size_t(v.numel())),
      d_dout(dout, size_t(dout.numel())), d_out(out, size_t(out.numel())), d_lse(lse, size_t(lse.numel()));
  auto poisoned = [](HostTensor t) { t.poison(); return t; };
  VarlenGrads got{poisoned(HostTensor::make(c.dtype, {1, total_q, hq, d})),
                  poisoned(HostTensor::make(c.dtype, {1, total_k, hk, d})),
                  poisoned(HostTensor::make(c.dtype, {1, total_k, hk, d})), {}};
  DeviceCopy d_dq(got.dq, size_t(got.dq.numel())), d_dk(got.dk, size_t(got.dk.numel())),
      d_dv(got.dv, size_t(got.dv.numel()));
  const Tensor d_lse2 = heads_by_rows(d_lse.desc(), c.heads_q, total_q);
  Options o = c.options;
  if (c.sinks) o.sinks = &sinks_dev;
  Options ob = o;
  if (c.sinks) ob.dsinks = &dsinks_dev;
  // A caller's workspace of the size the library asks for, NaN-filled (the preprocess must write what it reads),
  // followed by a guard of 64 KiB that must stay as it was (a write past the layout's end is caught).
  const size_t ws_bytes = fa4::workspace_size_varlen(fa4::Pass::backward, packed(d_q.desc()), packed(d_k.desc()),
                                                     packed(d_v.desc()), vl, ob);
  constexpr size_t kGuardBytes = 64 << 10;
  void* ws_ptr = nullptr;
  CUDA_OK(cudaMalloc(&ws_ptr, ws_bytes + kGuardBytes));
  auto guard_intact = [&] {
    std::vector<uint8_t> guard(kGuardBytes);
    EXPECT_EQ(cudaMemcpy(guard.data(), static_cast<uint8_t*>(ws_ptr) + ws_bytes, kGuardBytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return std::all_of(guard.begin(), guard.end(), [](uint8_t b) { return b == 0xff; });
  };
  auto run = [&](VarlenGrads& g) {
    for (const DeviceCopy* t : {&d_dq, &d_dk, &d_dv})
      EXPECT_EQ(cudaMemset(t->desc().data, 0xff, size_t(t->desc().shape[1] * t->desc().shape[2] * d) * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(d_dsinks, 0xff, size_t(hq) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ws_ptr, 0xff, ws_bytes + kGuardBytes), cudaSuccess);
    try {
      fa4::backward_varlen(packed(d_q.desc()), packed(d_k.desc()), packed(d_v.desc()), packed(d_out.desc()),
                           packed(d_dout.desc()), d_lse2, packed(d_dq.desc()), packed(d_dk.desc()),
                           packed(d_dv.desc()), vl, ob, {ws_ptr, ws_bytes});
    } catch (const fa4::Error& e) {
      ADD_FAILURE() << "backward threw: " << e.what();
    }
    const cudaError_t e = cudaDeviceSynchronize();
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorName(e) << " " << cudaGetErrorString(e);
    EXPECT_TRUE(guard_intact()) << "the backward wrote past the " << ws_bytes << " workspace bytes it asked for";
    d_dq.copy_back(g.dq), d_dk.copy_back(g.dk), d_dv.copy_back(g.dv);
    g.dsinks.assign(size_t(hq), 0.0f);
    EXPECT_EQ(cudaMemcpy(g.dsinks.data(), d_dsinks, size_t(hq) * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  };
  try {
    fa4::forward_varlen(packed(d_q.desc()), packed(d_k.desc()), packed(d_v.desc()), packed(d_out.desc()), &d_lse2, vl, o);
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << "forward threw: " << e.what();
  }
  d_out.copy_back(out), d_lse.copy_back(lse);  // as the backward is given them
  run(got);
  if (c.options.deterministic) {
    VarlenGrads again{HostTensor::make(c.dtype, {1, total_q, hq, d}), HostTensor::make(c.dtype, {1, total_k, hk, d}),
                      HostTensor::make(c.dtype, {1, total_k, hk, d}), {}};
    run(again);
    EXPECT_TRUE(again.dq.storage() == got.dq.storage() && again.dk.storage() == got.dk.storage() &&
                again.dv.storage() == got.dv.storage() && (!c.sinks || again.dsinks == got.dsinks))
        << "a second deterministic run gave other bits";
  }
  cudaFree(ws_ptr);
  cudaFree(d_sinks), cudaFree(d_dsinks);

  // Each sequence against the fp64 reference of that sequence alone (and the same-precision naive one).
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0, atol = c.options.softcap > 0 ? 3e-4 : 0.0;
  const Tensor pq = packed(q.desc()), pk = packed(k.desc()), pv = packed(v.desc()), pdo = packed(dout.desc());
  const Tensor gq = packed(got.dq.desc()), gk = packed(got.dk.desc()), gv = packed(got.dv.desc());
  const Tensor sinks_host = vector_tensor(sink_values.data(), fa4::Device::cpu);
  const Tensor pout = packed(out.desc());
  std::vector<double> dsinks_ref(size_t(hq), 0.0);
  auto dense_rows = [&](const Tensor& rows, int64_t n, int64_t heads) {  // a sequence's rows of a packed result
    auto t = HostTensor::make(c.dtype, {1, n, heads, d});
    const size_t row_bytes = size_t(heads * d) * fa4::element_size(c.dtype);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(t.desc().data) + size_t(i) * row_bytes,
                  static_cast<const char*>(rows.data) + i * rows.stride[1] * int64_t(fa4::element_size(c.dtype)), row_bytes);
    return t.values();
  };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sq = c.len_q[size_t(b)], sk = c.used_k.empty() ? c.len_k[size_t(b)] : c.used_k[size_t(b)];
    const int64_t q0 = cu_q[size_t(b)], k0 = cu_k[size_t(b)];
    Options host_o = c.options;
    if (c.sinks) host_o.sinks = &sinks_host;
    const Tensor qb = rows_of(pq, q0, sq), kb = rows_of(pk, k0, sk), vb = rows_of(pv, k0, sk), dob = rows_of(pdo, q0, sq);
    const Tensor ob = rows_of(pout, q0, sq);
    const fa4::detail::Problem p = fa4::detail::validate_inputs("test", qb, kb, vb, host_o);
    auto ref_q = HostTensor::make(DType::f64, {1, sq, hq, d}), naive_q = HostTensor::make(DType::f64, {1, sq, hq, d});
    auto ref_k = HostTensor::make(DType::f64, {1, sk, hk, d}), naive_k = HostTensor::make(DType::f64, {1, sk, hk, d});
    auto ref_v = HostTensor::make(DType::f64, {1, sk, hk, d}), naive_v = HostTensor::make(DType::f64, {1, sk, hk, d});
    // With sinks, as in test_sinks_sm90.cu: dq, dk, dv given the kernel's stored out (a row with one key has
    // dP - D cancel, and out's rounding would be most of the difference); dsinks_ref from the exact out.
    const Tensor* given_out = c.sinks ? &ob : nullptr;
    fa4::cpu::reference_backward(p, qb, kb, vb, dob, ref_q.desc(), ref_k.desc(), ref_v.desc(), fa4::cpu::Precision::exact,
                                 given_out);
    fa4::cpu::reference_backward(p, qb, kb, vb, dob, naive_q.desc(), naive_k.desc(), naive_v.desc(),
                                 fa4::cpu::Precision::storage, given_out);
    if (c.sinks) {
      std::vector<float> seq_dsinks(size_t(hq), 0.0f);
      const Tensor seq_dsinks_t = vector_tensor(seq_dsinks.data(), fa4::Device::cpu);
      fa4::detail::Problem p_ref = p;
      p_ref.dsinks = &seq_dsinks_t;
      auto scratch_q = HostTensor::make(DType::f64, {1, sq, hq, d});
      auto scratch_k = HostTensor::make(DType::f64, {1, sk, hk, d}), scratch_v = HostTensor::make(DType::f64, {1, sk, hk, d});
      fa4::cpu::reference_backward(p_ref, qb, kb, vb, dob, scratch_q.desc(), scratch_k.desc(), scratch_v.desc(),
                                   fa4::cpu::Precision::exact);
      for (int64_t h = 0; h < hq; ++h) dsinks_ref[size_t(h)] += seq_dsinks[size_t(h)];
    }
    const fa4::testing::Comparison cq = fa4::testing::compare(dense_rows(rows_of(gq, q0, sq), sq, hq), ref_q.values(),
                                                              naive_q.values(), c.dtype, rtol, atol);
    const fa4::testing::Comparison ck = fa4::testing::compare(dense_rows(rows_of(gk, k0, sk), sk, hk), ref_k.values(),
                                                              naive_k.values(), c.dtype, rtol, atol);
    const fa4::testing::Comparison cv = fa4::testing::compare(dense_rows(rows_of(gv, k0, sk), sk, hk), ref_v.values(),
                                                              naive_v.values(), c.dtype, rtol, atol);
    EXPECT_TRUE(cq.pass) << "sequence " << b << " dq " << cq.summary();
    EXPECT_TRUE(ck.pass) << "sequence " << b << " dk " << ck.summary();
    EXPECT_TRUE(cv.pass) << "sequence " << b << " dv " << cv.summary();
  }
  if (c.sinks) {
    // dsinks (test_sinks_sm90.cu's rule): against "own" = -Σ rows exp(sink - lse)·Σ dO·O from the kernel's own out
    // and lse (own_bound: the fp32 sum of D and lse·log2e's rounding), and against the fp64 reference (ref_bound
    // adds out's rounding to the dtype), over every sequence's rows.
    const std::vector<double> ov = out.values(), gv = dout.values(), lv = lse.values();
    for (int64_t h = 0; h < hq; ++h) {
      const double sink = sink_values[size_t(h)];
      double own = 0, own_bound = 0, ref_bound = 0;
      for (int64_t r = 0; r < cu_q.back(); ++r) {
        const double row_lse = lv[size_t(h * total_q + r)];
        if (row_lse == -INFINITY) continue;
        const double p_sink = std::exp(sink - row_lse);
        double dsum = 0, dsum_abs = 0;
        for (int64_t col = 0; col < d; ++col) {
          const size_t e = size_t((r * hq + h) * d + col);
          dsum += gv[e] * ov[e], dsum_abs += std::fabs(gv[e] * ov[e]);
        }
        own -= p_sink * dsum;
        own_bound += p_sink * dsum_abs * 4e-5 * (1.0 + std::fabs(row_lse));
        ref_bound += p_sink * dsum_abs * 2.0 * roundoff(c.dtype);
      }
      const double g = got.dsinks[size_t(h)];
      EXPECT_TRUE(std::isfinite(g)) << "dsinks[" << h << "] = " << g;
      EXPECT_LE(std::fabs(g - own), own_bound + 1e-30) << "dsinks[" << h << "] " << g << " vs own " << own;
      EXPECT_LE(std::fabs(g - dsinks_ref[size_t(h)]), own_bound + ref_bound + 1e-30)
          << "dsinks[" << h << "] " << g << " vs reference " << dsinks_ref[size_t(h)];
    }
  }
  // Rows no sequence owns, and keys past seqused_k: zero gradients (not NaN, not left unwritten).
  auto nonzero_rows = [](const std::vector<double>& vals, int64_t row0, int64_t rows, int64_t row_elems) {
    size_t bad = 0;
    for (int64_t i = row0 * row_elems; i < (row0 + rows) * row_elems; ++i) bad += vals[size_t(i)] != 0.0;
    return bad;
  };
  const std::vector<double> vq = got.dq.values(), vk = got.dk.values(), vv = got.dv.values();
  size_t bad = nonzero_rows(vq, cu_q.back(), c.spare_q, hq * d);
  for (const auto* vals : {&vk, &vv}) {
    bad += nonzero_rows(*vals, cu_k.back(), c.spare_k, hk * d);
    for (size_t b = 0; b < c.used_k.size(); ++b)
      bad += nonzero_rows(*vals, cu_k[b] + c.used_k[b], c.len_k[b] - c.used_k[b], hk * d);
  }
  EXPECT_EQ(bad, 0u) << "gradient elements of rows no sequence owns are not zero";
  print_case("backward ", c.name(), failures() > failures_before);
}

TEST(GpuVarlenSm90, BackwardEveryInstanceEveryMask) {
  REQUIRE_SM90();
  uint64_t seed = 700;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/true)) {
    VarlenCase c;
    c.dtype = dtype, c.head_dim = head_dim;
    // Ragged: a tile and a tail, empty, one row, longer queries than keys (causal rows with no key), no keys,
    // no queries, several key blocks; rows after the last sequence in both packed tensors.
    c.len_q = {77, 0, 1, 300, 129, 40, 0, 5};
    c.len_k = {45, 3, 1, 513, 129, 0, 70, 200};
    c.spare_q = 9, c.spare_k = 21;
    for (const VarlenCase& v : mask_variants(c, /*deterministic=*/true, seed)) check_varlen_backward(v);
  }
}

// A batch for either backward workspace layout: ragged lengths (with 0 and 1, spare rows past the sequences) take
// the compact one (a region per head), equal lengths of whole tiles the per-sequence one (the smaller there).
VarlenCase layout_case(int head_dim, bool ragged) {
  VarlenCase c;
  c.dtype = DType::bf16, c.head_dim = head_dim;
  if (ragged) {
    c.len_q = {77, 0, 1, 300, 129, 40};
    c.len_k = {45, 3, 1, 700, 129, 600};
    c.spare_q = 9, c.spare_k = 21;
  } else {
    c.len_q = {256, 256, 256, 256};
    c.len_k = {640, 256, 512, 600};
  }
  return c;
}

// Deterministic mode in 1 to 4 turn chains (FA4_BWD_DET_CHAINS): a sequence's key blocks split into chains
// (block n % chains of its own blocks) whose slabs land in the workspace's copies; right, and a second run gives
// the same bits (check_varlen_backward). Both workspace layouts: ragged lengths take the compact one (a region per
// head), equal lengths of whole tiles the per-sequence one (the smaller there). Two chains also with each chain's
// first adder storing its slab (FA4_BWD_DET_STORE_FIRST=1: no copy zeroed; tiles a chain never visits skipped).
TEST(GpuVarlenSm90, BackwardDeterministicChains) {
  REQUIRE_SM90();
  uint64_t seed = 900;
  for (const char* chains : {"1", "2", "3", "4", "2 store-first"})
    for (int d : {64, 128, 256})
      for (bool ragged : {true, false}) {
        const bool store_first = std::string(chains) == "2 store-first";
        const EnvOverride chain_count("FA4_BWD_DET_CHAINS", store_first ? "2" : chains);
        const EnvOverride first_stores("FA4_BWD_DET_STORE_FIRST", store_first ? "1" : "0");
        VarlenCase c = layout_case(d, ragged);
        c.options.deterministic = true;
        c.options.causal = d != 128;
        c.seed = seed++;
        SCOPED_TRACE(std::string("FA4_BWD_DET_CHAINS=") + chains + (ragged ? " ragged" : " equal lengths"));
        check_varlen_backward(c);
      }
}

// FA4_BWD_DET_REGISTER_ADDS=1 (deterministic key-split warpgroups add their dQ slabs from registers in their turns,
// helper warps passing them) on variable-length batches: both layouts, d = 64 and 128, chains 1 and 4, causal and
// not, store-first on and off.
TEST(GpuVarlenSm90, BackwardDeterministicRegisterAdds) {
  REQUIRE_SM90();
  const EnvOverride on("FA4_BWD_DET_REGISTER_ADDS", "1");
  uint64_t seed = 980;
  for (const char* chains : {"1", "4"})
    for (int d : {64, 128})
      for (bool ragged : {true, false}) {
        const EnvOverride chain_count("FA4_BWD_DET_CHAINS", chains);
        const EnvOverride first_stores("FA4_BWD_DET_STORE_FIRST", ragged ? "1" : "0");
        VarlenCase c = layout_case(d, ragged);
        c.options.deterministic = true;
        c.options.causal = (seed % 2) == 0;
        c.seed = seed++;
        SCOPED_TRACE(std::string("FA4_BWD_DET_CHAINS=") + chains + (ragged ? " ragged" : " equal lengths"));
        check_varlen_backward(c);
      }
}

// FA4_BWD_DQ_REGISTER_ADDS forced each way (the key-split warpgroups add their dQ slabs from registers, or stage
// them for the writer) on variable-length batches: both workspace layouts (ragged: the compact one), d = 64 and
// 128, causal and not.
TEST(GpuVarlenSm90, BackwardDqRegisterAddsAndStaging) {
  REQUIRE_SM90();
  uint64_t seed = 950;
  for (const char* adds : {"1", "0"}) {
    const EnvOverride on("FA4_BWD_DQ_REGISTER_ADDS", adds);
    for (int d : {64, 128})
      for (bool ragged : {true, false})
        for (bool causal : {false, true}) {
          VarlenCase c = layout_case(d, ragged);
          c.options.causal = causal;
          c.seed = seed++;
          SCOPED_TRACE(std::string("FA4_BWD_DQ_REGISTER_ADDS=") + adds + (ragged ? " ragged" : " equal lengths") +
                       (causal ? " causal" : ""));
          check_varlen_backward(c);
        }
  }
}

TEST(GpuVarlenSm90, BackwardSequsedKGqaAndManySequences) {
  REQUIRE_SM90();
  VarlenCase c;  // keys past seqused_k NaN, a sequence with none used; MQA
  c.dtype = DType::bf16, c.head_dim = 128, c.heads_q = 8, c.heads_kv = 1;
  c.len_q = {10, 3, 0, 64, 1, 200}, c.len_k = {200, 50, 9, 64, 300, 257}, c.used_k = {150, 0, 4, 64, 1, 256};
  c.spare_q = 3;
  check_varlen_backward(c);
  c.options.deterministic = true, c.options.window_left = 20, c.seed = 2;
  check_varlen_backward(c);
  VarlenCase many;  // more CTAs than the GPU holds at once, short sequences of every tail size
  many.dtype = DType::f16, many.head_dim = 64, many.heads_q = 4, many.heads_kv = 2;
  for (int b = 0; b < 150; ++b) many.len_q.push_back((b * 37) % 97), many.len_k.push_back((b * 53) % 131 + 1);
  many.options.causal = true;
  check_varlen_backward(many);
  many.options.deterministic = true, many.seed = 3;
  check_varlen_backward(many);
}

TEST(GpuVarlenSm90, BackwardRefusesTheCtaPairByName) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 16, 2, 64});
  q.fill_normal(1);
  DeviceCopy d_q(q, size_t(q.numel())), d_k(q, size_t(q.numel())), d_v(q, size_t(q.numel())),
      d_out(q, size_t(q.numel())), d_do(q, size_t(q.numel())), d_dq(q, size_t(q.numel())),
      d_dk(q, size_t(q.numel())), d_dv(q, size_t(q.numel()));
  auto lse = HostTensor::make_lse({1, 2, 16});
  DeviceCopy d_lse(lse, size_t(lse.numel()));
  const Tensor lse2 = heads_by_rows(d_lse.desc(), 2, 16);
  const DeviceInts cu(std::vector<int32_t>{0, 16});
  fa4::Varlen vl;
  vl.cu_seqlens_q = vl.cu_seqlens_k = cu.ptr, vl.batch = 1, vl.max_seqlen_q = vl.max_seqlen_k = 16;
  setenv("FA4_BWD_CLUSTER", "1", 1);
  const fa4::Support s = fa4::supports_varlen(fa4::Pass::backward, packed(d_q.desc()), packed(d_k.desc()),
                                              packed(d_v.desc()), vl);  // says what the call does
  EXPECT_FALSE(s.ok);
  EXPECT_NE(s.reason.find("FA4_BWD_CLUSTER"), std::string::npos) << s.reason;
  try {
    fa4::backward_varlen(packed(d_q.desc()), packed(d_k.desc()), packed(d_v.desc()), packed(d_out.desc()),
                         packed(d_do.desc()), lse2, packed(d_dq.desc()), packed(d_dk.desc()), packed(d_dv.desc()), vl);
    ADD_FAILURE() << "the CTA pair ran a variable-length batch";
  } catch (const fa4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FA4_BWD_CLUSTER"), std::string::npos) << e.what();
  }
  unsetenv("FA4_BWD_CLUSTER");
}

}  // namespace

namespace {

// Small enough for compute-sanitizer (scripts/device-check's sanitizer filter): every tail kind, both modes.
TEST(GpuVarlenSm90, BackwardSmall) {
  REQUIRE_SM90();
  VarlenCase c;
  c.dtype = DType::bf16, c.head_dim = 128, c.heads_q = 2, c.heads_kv = 1;
  c.len_q = {77, 0, 1, 130}, c.len_k = {45, 3, 1, 150}, c.used_k = {45, 3, 0, 131};
  c.spare_q = 5, c.spare_k = 7;
  c.options.causal = true;
  check_varlen_backward(c);
  c.options.deterministic = true, c.head_dim = 256, c.seed = 5;
  check_varlen_backward(c);
}

}  // namespace
