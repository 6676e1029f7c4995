// The sm_90a forward kernel through the public API (fa4::forward on cuda tensors), against the fp64 reference
// with FlashAttention's tolerance rule (src/testing/tolerance.hpp), over DESIGN.md §4's sweep, for every
// compiled row of src/cuda/instances.def. Inputs are random per case; device outputs start NaN-poisoned, so an
// unwritten element fails. Also: layouts through strides (bhsd, stride-0 broadcast K/V), the exp2 emulation
// and rescale-threshold policies, determinism (two runs bitwise equal), and clear refusals of what the kernel
// cannot take (TMA-unaligned strides).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "cuda/sm90/config.hpp"
#if defined(FA4_WITH_SM90)
#include "cuda/sm90/launch.hpp"
#endif
#include "fa4/fa4.hpp"
#include "numerics/convert.hpp"
#include "numerics/exp2.hpp"
#include "numerics/online_softmax.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"
#include "gpu_test_util.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::testing::HostTensor;
using fa4::testing::Layout;


struct GpuResult {
  fa4::testing::Comparison out, lse;
  std::vector<double> out_values, lse_values;
};

// Random inputs (fresh per seed), NaN-poisoned outputs, fa4::forward on the device on a non-default stream,
// then the fp64 reference (exact) and the same-precision naive baseline (storage) on the host.
GpuResult run_on_gpu(const GpuCase& c, bool with_reference = true) {
  GpuResult r;
  const std::array<int64_t, 4> qshape{c.batch, c.seqlen_q, c.heads_q, c.head_dim};
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(c.spec());
  HostTensor &q = in.q, &k = in.k, &v = in.v;
  const size_t k_elems = size_t(in.kv_storage_elems);
  auto out = HostTensor::make(c.dtype, qshape, c.layout);
  auto lse = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  out.poison();
  lse.poison();

  DeviceCopy dq(q, size_t(q.numel())), dk(k, k_elems), dv(v, k_elems), dout(out, size_t(out.numel())),
      dlse(lse, size_t(lse.numel()));
  EXPECT_TRUE(dq.ok() && dk.ok() && dv.ok() && dout.ok() && dlse.ok());
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  try {
    fa4::forward(dq.desc(), dk.desc(), dv.desc(), dout.desc(), &dlse.desc(), c.options, {},
                 reinterpret_cast<fa4::Stream>(stream));
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << c.spec().name() << ": fa4::forward threw: " << e.what();
  }
  const cudaError_t e = cudaStreamSynchronize(stream);
  EXPECT_EQ(e, cudaSuccess) << c.spec().name() << ": " << cudaGetErrorName(e) << " " << cudaGetErrorString(e);
  cudaStreamDestroy(stream);
  dout.copy_back(out);
  dlse.copy_back(lse);
  r.out_values = out.values();
  r.lse_values = lse.values();
  if (!with_reference) return r;

  const fa4::detail::Problem p = fa4::detail::validate_inputs("test", q.desc(), k.desc(), v.desc(), c.options);
  auto out_ref = HostTensor::make(DType::f64, qshape), out_naive = HostTensor::make(DType::f64, qshape);
  auto lse_ref = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  auto lse_naive = HostTensor::make_lse({c.batch, c.heads_q, c.seqlen_q});
  fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_ref.desc(), &lse_ref.desc(),
                              fa4::cpu::Precision::exact);
  fa4::cpu::reference_forward(p, q.desc(), k.desc(), v.desc(), out_naive.desc(), &lse_naive.desc(),
                              fa4::cpu::Precision::storage);
  const double rtol = c.options.softcap > 0 ? 3.0 : 2.0;
  r.out = fa4::testing::compare(r.out_values, out_ref.values(), out_naive.values(), c.dtype, rtol, 0.0);
  r.lse = fa4::testing::compare(r.lse_values, lse_ref.values(), lse_naive.values(), DType::f32, rtol, 0.0);
  return r;
}

// Checks one case and prints its numbers (the record of what passed on the device).
void check_case(const GpuCase& c) {
  const std::string name = c.spec().name();
  SCOPED_TRACE(name);
  const GpuResult r = run_on_gpu(c);
  EXPECT_TRUE(r.out.pass) << name << ": out " << r.out.summary();
  EXPECT_TRUE(r.lse.pass) << name << ": lse " << r.lse.summary();
  std::printf("  %-62s out %.3g / %.3g   lse %.3g / %.3g%s\n", name.c_str(), r.out.max_error, r.out.bound,
              r.lse.max_error, r.lse.bound, r.out.pass && r.lse.pass ? "" : "   FAIL");
}

// One compiled kernel: a (dtype, head dim) of instances.def on one of the head dim's tile-table rows.
struct Instance {
  DType dtype;
  int head_dim;
  int tile_row;  // index into fa4::sm90::kFwdTiles
  std::string name() const {
    const fa4::sm90::FwdTile& t = fa4::sm90::kFwdTiles[tile_row];
    return std::string(fa4::to_string(dtype)) + " d=" + std::to_string(head_dim) + " (" + std::to_string(t.block_m) +
           "x" + std::to_string(t.block_n) + " tiles)";
  }
};

std::vector<Instance> compiled_instances() {
  std::vector<Instance> rows;
  auto add = [&](DType dtype, int head_dim) {
    for (int r = 0; r < fa4::sm90::kFwdRows; ++r)
      if (fa4::sm90::kFwdTiles[r].head_dim == head_dim) rows.push_back({dtype, head_dim, r});
  };
#define FA4_IF_sm90(...) __VA_ARGS__
#define FA4_IF_sm100(...)
#define FA4_IF_fwd(...) __VA_ARGS__
#define FA4_IF_bwd(...)
#define FA4_KERNEL(arch, pass, dtype, head_dim) FA4_IF_##arch(FA4_IF_##pass(add(DType::dtype, head_dim);))
#include "cuda/instances.def"
  return rows;
}

// While it lives, this thread's forward calls run the instance's tile-table row, whatever the query length
// would choose (a head dim with several rows picks one by seqlen_q): each kernel meets every shape.
#if defined(FA4_WITH_SM90)
using ForcedRow = fa4::sm90::ScopedFwdRow;
#else
struct ForcedRow {  // no sm90 kernels compiled: nothing to force (and the sm90 tests have nothing to run)
  explicit ForcedRow(int) {}
};
#endif


// DESIGN.md §4's odd and unequal lengths, plus more queries than keys (bottom-right causal masks whole rows)
// and no keys at all (O = 0, LSE = -inf).
const Shape kSweep[] = {{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {1023, 1024}, {203, 113}, {64, 0}};

// Every compiled row over the sweep × {no mask, causal, window}; head configurations MHA / GQA / MQA and
// softcap rotate over the cases so that each meets every shape class.
TEST(GpuAttentionSm90, ForwardSweepEveryInstance) {
  REQUIRE_SM90();
  const std::vector<Instance> rows = compiled_instances();
  ASSERT_FALSE(rows.empty());
  uint64_t seed = 1;
  for (const Instance& row : rows) {
    std::printf("%s\n", row.name().c_str());
    const ForcedRow forced(row.tile_row);
    for_each_sweep_case<GpuCase>(row.dtype, row.head_dim, kSweep, seed, [](const GpuCase& c, int) { check_case(c); });
  }
}

// Long enough for the row each head dim chooses by itself past 1024 queries (d = 64: 192-row tiles).
TEST(GpuAttentionSm90, LongSequenceCausal) {
  REQUIRE_SM90();
  for (int d : {64, 128}) {
    GpuCase c;
    c.dtype = DType::bf16;
    c.head_dim = d;
    c.seqlen_q = c.seqlen_k = 4224;
    c.heads_q = c.heads_kv = 1;
    c.options.causal = true;
    c.seed = 4224 + uint64_t(d);
    check_case(c);
  }
}

// Strides instead of copies: [b, h, s, d] storage, and K/V heads broadcast with stride 0 (TMA maps the
// broadcast dim with extent 1).
TEST(GpuAttentionSm90, LayoutsThroughStrides) {
  REQUIRE_SM90();
  for (int d : {64, 128}) {
    GpuCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 130, c.seqlen_k = 257, c.heads_q = 4, c.heads_kv = 2;
    c.layout = Layout::bhsd;
    c.seed = 900 + d;
    check_case(c);
    c.layout = Layout::bshd;
    c.broadcast_kv = true;
    c.options.causal = true;
    c.dtype = DType::f16;
    c.seed = 901 + d;
    check_case(c);
  }
}

// The numerics policy knobs: a fraction of exp2 on the FMA pipe (emulation), and the rescale threshold tau
// (0 = always rescale, 15 = the largest allowed), on inputs whose row max keeps growing (large |q|).
TEST(GpuAttentionSm90, Exp2EmulationAndRescaleThreshold) {
  REQUIRE_SM90();
  for (float fraction : {0.25f, 1.0f})
    for (float tau : {0.0f, 8.0f, 15.0f}) {
      GpuCase c;
      c.head_dim = 128;
      c.batch = 1, c.seqlen_q = 300, c.seqlen_k = 700, c.heads_q = 2, c.heads_kv = 1;
      c.options.exp2_emulated_fraction = fraction;
      c.options.rescale_threshold = tau;
      c.options.causal = tau == 8.0f;
      c.seed = uint64_t(100 * fraction + tau);
      check_case(c);
    }
}

// The FA4 softmax on the FMA pipe is bitwise the host's emulation. Inputs that make every step but exp2 exact:
// K = V = identity (keys = head_dim), scale 1, and query row i = -200 everywhere except 0 at key a_i and -δ_i at
// key b_i. Then S is exact, the row max is 0, exp2 is 1 at a_i, e = exp2(-δ_i·log2 e) at b_i and exactly 0
// elsewhere (x < -126), so l = 1 + e with one rounding in any order, and O row i is zero except
// O[a_i] = rn(1 / l) and O[b_i] = rn(rn16(e) / l) — all determined by e. With the policy emulating b_i's
// column group the device result must equal the host emulation bit for bit; where MUFU computes e, some rows
// must differ (the test is sensitive to which exp2 ran).
TEST(GpuAttentionSm90, Exp2EmulatedElementsAreBitwiseTheHostEmulation) {
  REQUIRE_SM90();
  for (const Instance& row : compiled_instances()) {
    if (row.head_dim > fa4::sm90::kFwdTiles[row.tile_row].block_n) continue;  // keys = head_dim fit one K/V tile
    const ForcedRow forced(row.tile_row);
    const int64_t d = row.head_dim, keys = d, rows = 1000, heads = 2;
    for (int per16 : {4, 16}) {
      SCOPED_TRACE(row.name() + " per16=" + std::to_string(per16));
      auto q = HostTensor::make(row.dtype, {1, rows, heads, d});
      auto k = HostTensor::make(row.dtype, {1, keys, 1, d});
      auto v = HostTensor::make(row.dtype, {1, keys, 1, d});
      for (int64_t j = 0; j < keys; ++j)
        for (int64_t c = 0; c < d; ++c) {
          k.set({0, j, 0, c}, j == c ? 1.0 : 0.0);
          v.set({0, j, 0, c}, j == c ? 1.0 : 0.0);
        }
      std::vector<int64_t> a(rows * heads), b(rows * heads);
      uint64_t state = 12345 + uint64_t(per16) * 7 + uint64_t(d);
      auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = h * rows + i;
          b[r] = r % keys;                                           // every column group in turn
          a[r] = (b[r] + 1 + int64_t(next() % uint64_t(keys - 1))) % keys;  // any other key
          const double delta = 0.01 + double(next() % 100000) / 100000.0 * 20.0;
          for (int64_t c = 0; c < d; ++c) q.set({0, i, h, c}, c == a[r] ? 0.0 : (c == b[r] ? -delta : -200.0));
        }
      auto out = HostTensor::make(row.dtype, {1, rows, heads, d});
      out.poison();
      DeviceCopy dq(q, size_t(q.numel())), dk(k, size_t(k.numel())), dv(v, size_t(v.numel())),
          dout(out, size_t(out.numel()));
      fa4::Tensor k_heads = dk.desc(), v_heads = dv.desc();  // one stored kv head, broadcast to both query heads
      k_heads.shape[2] = v_heads.shape[2] = heads;
      k_heads.stride[2] = v_heads.stride[2] = 0;
      Options o;
      o.softmax_scale = 1.0f;
      o.exp2_emulated_fraction = float(per16) / 16.0f;
      fa4::forward(dq.desc(), k_heads, v_heads, dout.desc(), nullptr, o);
      CUDA_OK(cudaDeviceSynchronize());
      dout.copy_back(out);

      const float scale_log2 = fa4::num::ScoreTransform::make(1.0f, 0.0f).scale_log2;
      const auto rn16 = [&](float x) {
        return row.dtype == DType::bf16 ? fa4::num::round_to_bf16(x) : fa4::num::round_to_f16(x);
      };
      int emulated_rows = 0, emulated_equal = 0, mufu_rows = 0, mufu_equal = 0;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = h * rows + i;
          const float x = float(q.at({0, i, h, b[r]})) * scale_log2;
          const float e = fa4::num::exp2_emulated(x);
          const float inv_l = 1.0f / (1.0f + e);
          bool equal = true;
          for (int64_t c = 0; c < d; ++c) {
            const float want = c == a[r] ? rn16(inv_l) : (c == b[r] ? rn16(rn16(e) * inv_l) : 0.0f);
            equal = equal && out.at({0, i, h, c}) == double(want);
          }
          if (fa4::num::exp2_is_emulated(b[r], per16)) {
            ++emulated_rows;
            emulated_equal += equal;
            if (!equal && emulated_rows - emulated_equal <= 3)
              ADD_FAILURE() << "row " << i << " head " << h << " (key " << b[r] << ", e = " << e
                            << "): device O differs from the host emulation";
          } else {
            ++mufu_rows;
            mufu_equal += equal;
          }
        }
      std::printf("  %s per16=%d: emulated rows bitwise equal %d/%d; MUFU rows equal to the emulation %d/%d\n",
                  row.name().c_str(), per16, emulated_equal, emulated_rows,
                  mufu_equal, mufu_rows);
      EXPECT_GT(emulated_rows, 0);
      EXPECT_EQ(emulated_equal, emulated_rows);
      if (mufu_rows > 0) EXPECT_LT(mufu_equal, mufu_rows) << "MUFU and the emulation never differ: the test is blind";
    }
  }
}

// Determinism: the kernel has a fixed reduction order, so two runs give the same bits.
TEST(GpuAttentionSm90, TwoRunsAreBitwiseEqual) {
  REQUIRE_SM90();
  GpuCase c;
  c.head_dim = 128;
  c.batch = 2, c.seqlen_q = 517, c.seqlen_k = 1031, c.heads_q = 4, c.heads_kv = 2;
  c.options.window_left = 200;
  c.options.exp2_emulated_fraction = 0.25f;
  c.seed = 77;
  const GpuResult a = run_on_gpu(c, false), b = run_on_gpu(c, false);
  ASSERT_EQ(a.out_values.size(), b.out_values.size());
  EXPECT_EQ(std::memcmp(a.out_values.data(), b.out_values.data(), a.out_values.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(a.lse_values.data(), b.lse_values.data(), a.lse_values.size() * sizeof(double)), 0);
}

// The epilogue's two store paths agree: an output whose seqlen stride is not a multiple of 16 bytes cannot be
// stored by TMA and takes the per-thread stores; both must give the same bits (same math, different store).
TEST(GpuAttentionSm90, PaddedOutputTakesTheDirectStoresWithTheSameBits) {
  REQUIRE_SM90();
  for (int d : {64, 128}) {
    GpuCase c;
    c.head_dim = d;
    c.batch = 2, c.seqlen_q = 190, c.seqlen_k = 333, c.heads_q = 4, c.heads_kv = 2;
    c.options.causal = true;
    c.seed = 4000 + d;
    const GpuResult dense = run_on_gpu(c, false);

    auto q = HostTensor::make(c.dtype, {c.batch, c.seqlen_q, c.heads_q, d});
    auto k = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, d});
    auto v = HostTensor::make(c.dtype, {c.batch, c.seqlen_k, c.heads_kv, d});
    q.fill_normal(c.seed * 7 + 1);  // run_on_gpu's inputs for this seed
    k.fill_normal(c.seed * 7 + 2);
    v.fill_normal(c.seed * 7 + 3);
    const int64_t row_stride = c.heads_q * d + 2;  // 4-byte aligned pairs, not 16-byte aligned rows
    const size_t padded_elems = size_t(c.batch * c.seqlen_q * row_stride);
    std::vector<uint16_t> host(padded_elems, 0x7FC1u);  // a NaN in bf16 and in fp16
    void* dout = nullptr;
    CUDA_OK(cudaMalloc(&dout, padded_elems * 2));
    CUDA_OK(cudaMemcpy(dout, host.data(), padded_elems * 2, cudaMemcpyHostToDevice));
    fa4::Tensor out = q.desc();
    out.data = dout;
    out.device = fa4::Device::cuda;
    out.device_index = 0;
    out.stride = {c.seqlen_q * row_stride, row_stride, d, 1};
    DeviceCopy dq(q, size_t(q.numel())), dk(k, size_t(k.numel())), dv(v, size_t(v.numel()));
    fa4::forward(dq.desc(), dk.desc(), dv.desc(), out, nullptr, c.options);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(host.data(), dout, padded_elems * 2, cudaMemcpyDeviceToHost));
    cudaFree(dout);
    size_t differ = 0, i = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t s = 0; s < c.seqlen_q; ++s)
        for (int64_t h = 0; h < c.heads_q; ++h)
          for (int64_t e = 0; e < d; ++e, ++i) {
            const float got = fa4::num::bf16_bits_to_float(host[size_t(b * c.seqlen_q * row_stride + s * row_stride + h * d + e)]);
            differ += !(got == float(dense.out_values[i]));
          }
    EXPECT_EQ(differ, 0u) << "d=" << d << ": the padded output differs from the TMA-stored one";
    // The two pad elements of every row stay untouched.
    size_t pads_written = 0;
    for (int64_t r = 0; r < c.batch * c.seqlen_q; ++r)
      for (int64_t pad = 0; pad < 2; ++pad) pads_written += host[size_t(r * row_stride + c.heads_q * d + pad)] != 0x7FC1u;
    EXPECT_EQ(pads_written, 0u);
  }
}

// The persistent grid walks many tiles per CTA (static stride, or the causal LPT counter), skipping tiles whose
// rows see no key, and stages O for consecutive tiles through the same buffers. Every tile's math is the same
// whatever CTA runs it, so the whole problem in one call (320 tiles of 128 rows, or 224 of 192, on 132 SMs) must
// give the bits of the same problem cut into per-(batch, kv head) calls of 40 (or 28) tiles (one per CTA). At d = 256 the causal LPT
// order has two L2 sections of (batch, head) pairs (28 + 4 on a 50 MB L2); rows 0..299 see no key.
void expect_persistent_walk_matches_one_tile_per_cta(int only_head_dim, int64_t batch, int64_t heads_q,
                                                     int64_t heads_kv, int64_t sq, int64_t sk) {
  const int64_t group = heads_q / heads_kv;
  for (const Instance& row : compiled_instances()) {
    if (row.dtype != DType::bf16 || (only_head_dim > 0 && row.head_dim != only_head_dim)) continue;
    const ForcedRow forced(row.tile_row);
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::window}) {
      const int64_t d = row.head_dim;
      SCOPED_TRACE(row.name() + " mask " + std::to_string(int(m)));
      auto q = HostTensor::make(row.dtype, {batch, sq, heads_q, d});
      auto k = HostTensor::make(row.dtype, {batch, sk, heads_kv, d});
      auto v = HostTensor::make(row.dtype, {batch, sk, heads_kv, d});
      q.fill_normal(31 + d), k.fill_normal(32 + d), v.fill_normal(33 + d);
      auto out = HostTensor::make(row.dtype, {batch, sq, heads_q, d});
      auto lse = HostTensor::make_lse({batch, heads_q, sq});
      out.poison(), lse.poison();
      DeviceCopy dq(q, size_t(q.numel())), dk(k, size_t(k.numel())), dv(v, size_t(v.numel())),
          whole(out, size_t(out.numel())), parts(out, size_t(out.numel())), whole_lse(lse, size_t(lse.numel())),
          parts_lse(lse, size_t(lse.numel()));
      // One split: the per-head slices are small enough for the fill rule to split their keys, which would sum
      // in another order; the walk, not split-KV, is what this test compares.
      Options o = options_for(m);
      o.num_splits = 1;
      fa4::forward(dq.desc(), dk.desc(), dv.desc(), whole.desc(), &whole_lse.desc(), o);
      auto slice = [](fa4::Tensor t, int64_t b, int64_t h, int64_t heads, int hdim) {
        const size_t es = fa4::element_size(t.dtype);
        t.data = static_cast<char*>(t.data) + size_t(b * t.stride[0] + h * t.stride[hdim]) * es;
        t.shape[0] = 1;
        t.shape[hdim] = heads;
        return t;
      };
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t kvh = 0; kvh < heads_kv; ++kvh) {
          const fa4::Tensor lse_part = slice(parts_lse.desc(), b, kvh * group, group, 1);
          fa4::forward(slice(dq.desc(), b, kvh * group, group, 2), slice(dk.desc(), b, kvh, 1, 2),
                       slice(dv.desc(), b, kvh, 1, 2), slice(parts.desc(), b, kvh * group, group, 2), &lse_part, o);
        }
      CUDA_OK(cudaDeviceSynchronize());
      auto out_parts = HostTensor::make(row.dtype, {batch, sq, heads_q, d});
      auto lse_parts = HostTensor::make_lse({batch, heads_q, sq});
      whole.copy_back(out);
      whole_lse.copy_back(lse);
      parts.copy_back(out_parts);
      parts_lse.copy_back(lse_parts);
      const std::vector<double> a = out.values(), b = out_parts.values(), la = lse.values(), lb = lse_parts.values();
      size_t nan = 0;
      for (double x : a) nan += x != x;
      EXPECT_EQ(nan, 0u) << "unwritten (poisoned) output elements";
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << "O differs";
      EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(double)), 0) << "LSE differs";
    }
  }
}

TEST(GpuAttentionSm90, PersistentWalkMatchesOneTilePerCta) {
  REQUIRE_SM90();
  expect_persistent_walk_matches_one_tile_per_cta(0, 2, 16, 4, 1200, 900);
}

// The same on a problem small enough for compute-sanitizer, d = 64 only: more tiles than the H100/H200's 132 SMs
// whether block_m is 128 (208 tiles) or 192 (144 tiles); rows 0..299 see no key under the causal mask.
TEST(GpuAttentionSm90, PersistentWalkSmall) {
  REQUIRE_SM90();
  expect_persistent_walk_matches_one_tile_per_cta(64, 1, 8, 4, 3300, 3000);
}

// A forward A/B switch set to a value other than 0 or 1: refused with Status::invalid_argument naming it.
void expect_forward_refuses_env(const char* name, const char* value) {
  auto q = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  q.fill_normal(1);
  DeviceCopy dq(q, size_t(q.numel())), dout(q, size_t(q.numel()));
  const EnvOverride bad(name, value);
  try {
    fa4::forward(dq.desc(), dq.desc(), dq.desc(), dout.desc(), nullptr);
    ADD_FAILURE() << name << "=" << value << " was accepted";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::Status::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

// FA4_FWD_PROLOGUE_TURN=0: a work tile's first S issued outside the consumers' turns at the tensor core. The
// turns stay balanced whatever the walk (one, two or three consumers; tiles of one K/V tile and of many; empty
// ranges): the persistent walk under the switch gives the bits of one tile per CTA, every row and mask, and a
// value other than 0 or 1 is refused by name.
TEST(GpuAttentionSm90, PrologueOutsideTurnsMatchesOneTilePerCta) {
  REQUIRE_SM90();
  const EnvOverride outside("FA4_FWD_PROLOGUE_TURN", "0");
  expect_persistent_walk_matches_one_tile_per_cta(0, 2, 16, 4, 1200, 900);
  // 256 work tiles of one K/V tile each at every row (64 keys: at most every block_n), more than the SMs: each
  // CTA walks several one-turn tiles in a row.
  expect_persistent_walk_matches_one_tile_per_cta(0, 2, 128, 32, 100, 64);
  expect_forward_refuses_env("FA4_FWD_PROLOGUE_TURN", "yes");
}

// What the kernel cannot read is refused with Status::unsupported naming the argument, before any launch.
TEST(GpuAttentionSm90, UnsupportedLayoutsAndPassesAreRefusedClearly) {
  REQUIRE_SM90();
  auto q = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  q.fill_normal(1);
  DeviceCopy dq(q, size_t(q.numel())), dout(q, size_t(q.numel()));
  auto expect_unsupported = [](const std::function<void()>& f, const std::vector<std::string>& needles) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::Status::unsupported) << e.what();
      for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
      std::printf("  refused: %s\n", e.what());
    }
  };
  // A seqlen stride of 132 elements (264 bytes) is not a multiple of 16 bytes: TMA cannot step it.
  fa4::Tensor k = dq.desc();
  k.shape = {1, 32, 2, 64};
  k.stride = {32 * 132, 132, 64, 1};
  expect_unsupported([&] { fa4::forward(dq.desc(), k, k, dout.desc(), nullptr); }, {"'k.stride[1]'", "16 bytes"});
  // A base address off 16-byte alignment (q = the first 32 rows, moved by one element).
  fa4::Tensor q_moved = dq.desc(), out32 = dout.desc();
  q_moved.data = static_cast<char*>(q_moved.data) + 2;
  q_moved.shape = out32.shape = {1, 32, 2, 64};
  expect_unsupported([&] { fa4::forward(q_moved, dq.desc(), dq.desc(), out32, nullptr); }, {"'q'", "16-byte"});
  // A head dim without a compiled kernel.
  fa4::Tensor q48 = dq.desc();
  q48.shape = {1, 16, 2, 48};
  expect_unsupported([&] { fa4::forward(q48, q48, q48, q48, nullptr); }, {"'q'", "head_dim 48"});
  EXPECT_TRUE(fa4::supports(fa4::Pass::forward, dq.desc(), dq.desc(), dq.desc()).ok);
}

#if defined(FA4_WITH_SM90)
// The test hook cannot run a kernel on a head dim it was not built for: a d = 64 call forced onto a d = 128
// row fails before any launch, and the output keeps its poison.
TEST(GpuAttentionSm90, ForcedRowOfAnotherHeadDimIsRefused) {
  REQUIRE_SM90();
  const int row128 = fa4::sm90::fwd_row(128, 1);
  ASSERT_GE(row128, 0);
  auto q = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  q.fill_normal(2);
  auto out = HostTensor::make(DType::bf16, {1, 64, 2, 64});
  out.poison();
  DeviceCopy dq(q, size_t(q.numel())), dout(out, size_t(out.numel()));
  const ForcedRow forced(row128);
  try {
    fa4::forward(dq.desc(), dq.desc(), dq.desc(), dout.desc(), nullptr);
    ADD_FAILURE() << "no error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::Status::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a row of head dim 64"), std::string::npos) << e.what();
  }
  CUDA_OK(cudaDeviceSynchronize());
  dout.copy_back(out);
  size_t nan = 0;
  for (double x : out.values()) nan += x != x;
  EXPECT_EQ(nan, size_t(out.numel())) << "the refused call wrote output";
}
#endif

}  // namespace
