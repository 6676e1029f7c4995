// One test per bad-input class: each must be refused with fa4::Error whose message names the argument,
// what was expected and what was given; nothing may be written to the outputs.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>

#include "testing/tensors.hpp"

using namespace fa4;
using fa4::testing::HostTensor;

namespace {

struct Fixture {
  HostTensor q = HostTensor::make(DType::bf16, {2, 33, 4, 64});
  HostTensor k = HostTensor::make(DType::bf16, {2, 40, 2, 64});
  HostTensor v = HostTensor::make(DType::bf16, {2, 40, 2, 64});
  HostTensor out = HostTensor::make(DType::bf16, {2, 33, 4, 64});
  HostTensor lse = HostTensor::make_lse({2, 4, 33});
  HostTensor dout = HostTensor::make(DType::bf16, {2, 33, 4, 64});
  HostTensor dq = HostTensor::make(DType::bf16, {2, 33, 4, 64});
  HostTensor dk = HostTensor::make(DType::bf16, {2, 40, 2, 64});
  HostTensor dv = HostTensor::make(DType::bf16, {2, 40, 2, 64});
  Fixture() {
    q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
    out.poison(), lse.poison();
  }
  void fwd(const Options& o = {}) { forward(q.desc(), k.desc(), v.desc(), out.desc(), &lse.desc(), o); }
  void bwd(const Options& o = {}) {
    backward(q.desc(), k.desc(), v.desc(), out.desc(), dout.desc(), lse.desc(), dq.desc(), dk.desc(), dv.desc(), o);
  }
};

// Runs f, expects an fa4::Error of `code` whose message contains every fragment.
template <class F>
void expect_error(F&& f, Status code, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const char* frag : fragments) EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << "'" << frag << "' not in: " << e.what();
  }
}

bool all_nan(const HostTensor& t) {
  for (double x : t.values())
    if (!std::isnan(x)) return false;
  return true;
}

}  // namespace

TEST(Validation, WrongRank) {
  Fixture f;
  f.q.desc().rank = 3;
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'q'", "rank 4", "rank 3"});
  EXPECT_TRUE(all_nan(f.out));
}

TEST(Validation, MismatchedShapes) {
  Fixture f;
  f.k.desc().shape[0] = 3;
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'k'", "batch", "[3, 40, 2, 64]"});
  Fixture g;
  g.v.desc().shape[1] = 39;
  expect_error([&] { g.fwd(); }, Status::invalid_argument, {"'v'", "seqlen_k", "40"});
  Fixture h;
  h.out.desc().shape[1] = 32;
  expect_error([&] { h.fwd(); }, Status::invalid_argument, {"'out'", "[2, 33, 4, 64]"});
  Fixture l;
  l.lse.desc().shape[2] = 40;
  expect_error([&] { l.fwd(); }, Status::invalid_argument, {"'lse'", "[2, 4, 33]"});
  Fixture d;
  d.dk.desc().shape[2] = 4;
  expect_error([&] { d.bwd(); }, Status::invalid_argument, {"'dk'", "as 'k'"});
}

TEST(Validation, HeadsNotDivisible) {
  Fixture f;
  f.q = HostTensor::make(DType::bf16, {2, 33, 5, 64});
  f.out = HostTensor::make(DType::bf16, {2, 33, 5, 64});
  expect_error([&] { forward(f.q.desc(), f.k.desc(), f.v.desc(), f.out.desc(), nullptr); }, Status::invalid_argument,
               {"'k'", "dividing the 5 query heads", "2 kv heads"});
}

TEST(Validation, NonUnitHeadDimStride) {
  Fixture f;
  f.k.desc().stride[3] = 2;
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'k.stride[3]'", "contiguous", "2"});
}

TEST(Validation, UnsupportedDtypeAndHeadDim) {
  Fixture f;
  f.q.desc().dtype = static_cast<DType>(9);
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'q'", "dtype", "9"});
  Fixture g;
  g.v.desc().dtype = DType::f16;
  expect_error([&] { g.fwd(); }, Status::invalid_argument, {"'v'", "bf16", "f16"});
  HostTensor q = HostTensor::make(DType::f32, {1, 4, 1, 300}), o = HostTensor::make(DType::f32, {1, 4, 1, 300});
  expect_error([&] { forward(q.desc(), q.desc(), q.desc(), o.desc(), nullptr); }, Status::unsupported, {"head_dim", "[1, 256]", "300"});
  Fixture e;
  e.lse = HostTensor::make(DType::bf16, {2, 4, 33, 1});
  e.lse.desc().rank = 3;
  expect_error([&] { e.fwd(); }, Status::invalid_argument, {"'lse'", "f32", "bf16"});
}

TEST(Validation, NullPointers) {
  Fixture f;
  f.v.desc().data = nullptr;
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'v'", "data pointer", "null"});
  Fixture g;
  g.dq.desc().data = nullptr;
  expect_error([&] { g.bwd(); }, Status::invalid_argument, {"'dq'", "null"});
  // An empty tensor needs no pointer.
  HostTensor q = HostTensor::make(DType::f32, {0, 4, 1, 8});
  Tensor t = q.desc();
  t.data = nullptr;
  EXPECT_NO_THROW(forward(t, t, t, t, nullptr));
}

TEST(Validation, OutputAliasingAnInput) {
  Fixture f;
  expect_error([&] { forward(f.q.desc(), f.k.desc(), f.v.desc(), f.q.desc(), nullptr); }, Status::invalid_argument,
               {"'out'", "disjoint from 'q'", "aliasing"});
  Fixture g;
  expect_error([&] {
    backward(g.q.desc(), g.k.desc(), g.v.desc(), g.out.desc(), g.dout.desc(), g.lse.desc(), g.dout.desc(), g.dk.desc(), g.dv.desc());
  }, Status::invalid_argument, {"'dq'", "'dout'"});
  Fixture h;
  Tensor self_overlap = h.out.desc();
  self_overlap.stride[1] = 0;  // every position of a row writes the same memory
  expect_error([&] { forward(h.q.desc(), h.k.desc(), h.v.desc(), self_overlap, nullptr); }, Status::invalid_argument,
               {"'out'", "no two elements share memory"});
}

TEST(Validation, InvalidWindowAndOptions) {
  Fixture f;
  Options o;
  o.window_left = -2;
  expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.window_left'", "-1", "-2"});
  o = {};
  o.causal = true, o.window_right = 3;
  expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.window_right'", "causal", "3"});
  o = {};
  o.softcap = -1;
  expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.softcap'"});
  o = {};
  o.rescale_threshold = 20;
  expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.rescale_threshold'", "[0, 15]", "20"});
  o = {};
  o.exp2_emulated_fraction = 0.3f;
  expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.exp2_emulated_fraction'", "k/16"});
  HostTensor q = HostTensor::make(DType::f32, {1, 4, 1, 8}), out = HostTensor::make(DType::f32, {1, 4, 1, 8});
  o = {};
  o.exp2_emulated_fraction = 0.25f;
  expect_error([&] { forward(q.desc(), q.desc(), q.desc(), out.desc(), nullptr, o); }, Status::unsupported,
               {"'options.exp2_emulated_fraction'", "f32"});
}

TEST(Validation, NonFiniteScale) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Fixture f;
    Options o;
    o.softmax_scale = bad;
    expect_error([&] { f.fwd(o); }, Status::invalid_argument, {"'options.softmax_scale'", "finite"});
    EXPECT_TRUE(all_nan(f.out));
  }
}

TEST(Validation, CudaTensorsAndStreamsAreRefusedClearly) {
  // f32 has no GPU kernel in any build (and without CUDA there is no GPU backend at all); the refusal comes
  // from selection, before any pointer is touched.
  HostTensor q = HostTensor::make(DType::f32, {1, 8, 2, 64}), o = HostTensor::make(DType::f32, {1, 8, 2, 64});
  Tensor qc = q.desc(), oc = o.desc();
  qc.device = oc.device = Device::cuda;
  expect_error([&] { forward(qc, qc, qc, oc, nullptr); }, Status::unsupported, {"'q'", "cuda"});
  Fixture g;
  int dummy;
  expect_error([&] { forward(g.q.desc(), g.k.desc(), g.v.desc(), g.out.desc(), nullptr, {}, {}, reinterpret_cast<Stream>(&dummy)); },
               Status::invalid_argument, {"'stream'", "null for cpu"});
  Fixture h;
  expect_error([&] { forward(h.q.desc(), h.k.desc(), h.v.desc(), h.out.desc(), nullptr, {}, {nullptr, 64}); },
               Status::invalid_argument, {"'workspace'", "null"});
}

TEST(Validation, SupportsReportsWithoutThrowing) {
  Fixture f;
  EXPECT_TRUE(supports(Pass::forward, f.q.desc(), f.k.desc(), f.v.desc()).ok);
  EXPECT_EQ(workspace_size(Pass::backward, f.q.desc(), f.k.desc(), f.v.desc()), 0u);
  f.k.desc().shape[3] = 32;
  const Support s = supports(Pass::forward, f.q.desc(), f.k.desc(), f.v.desc());
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.code, Status::invalid_argument);
  EXPECT_NE(s.reason.find("'k'"), std::string::npos) << s.reason;
}

// Offsets past 2^32 elements: q and out live in sparse mappings with their second batch 2^32 + 4096
// elements after the first. Results must equal those of compact copies bit for bit.
TEST(Validation, ElementOffsetsBeyond32BitsAreHandled) {
  const int64_t s = 48, h = 2, d = 64, batch_stride = (int64_t{1} << 32) + 4096;
  const size_t bytes = static_cast<size_t>(batch_stride + s * h * d) * sizeof(uint16_t);
  auto far = [&](void* map) {  // [2, s, h, d] with a batch stride beyond 2^32 elements
    Tensor t = Tensor::contiguous(map, DType::bf16, Device::cpu, {2, s, h, d});
    t.stride[0] = batch_stride;
    return t;
  };
  void* qmap = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* omap = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(qmap, MAP_FAILED);
  ASSERT_NE(omap, MAP_FAILED);
  HostTensor q = HostTensor::make(DType::bf16, {2, s, h, d}), k = HostTensor::make(DType::bf16, {2, s, h, d}),
             v = HostTensor::make(DType::bf16, {2, s, h, d}), out = HostTensor::make(DType::bf16, {2, s, h, d});
  q.fill_normal(5), k.fill_normal(6), v.fill_normal(7);
  const Tensor qfar = far(qmap), ofar = far(omap);
  const size_t batch_bytes = static_cast<size_t>(s * h * d) * sizeof(uint16_t);
  for (int64_t b = 0; b < 2; ++b)
    std::memcpy(static_cast<uint16_t*>(qmap) + b * batch_stride, static_cast<const char*>(q.desc().data) + b * batch_bytes, batch_bytes);
  forward(q.desc(), k.desc(), v.desc(), out.desc(), nullptr);
  forward(qfar, k.desc(), v.desc(), ofar, nullptr);
  for (int64_t b = 0; b < 2; ++b)
    EXPECT_EQ(std::memcmp(static_cast<uint16_t*>(omap) + b * batch_stride, static_cast<const char*>(out.desc().data) + b * batch_bytes, batch_bytes), 0)
        << "batch " << b;
  munmap(qmap, bytes);
  munmap(omap, bytes);
}

TEST(Validation, OffsetsThatOverflow64BitsAreRefused) {
  Fixture f;
  f.k.desc().stride[0] = int64_t{1} << 62;
  expect_error([&] { f.fwd(); }, Status::invalid_argument, {"'k'", "2^62"});
}

TEST(Determinism, BackwardIsBitwiseRepeatable) {
  Fixture a, b;
  Options o;
  o.deterministic = true;
  o.causal = true;
  a.fwd(o);
  a.bwd(o);
  b.fwd(o);
  b.bwd(o);
  EXPECT_EQ(a.dq.values(), b.dq.values());
  EXPECT_EQ(a.dk.values(), b.dk.values());
  EXPECT_EQ(a.dv.values(), b.dv.values());
}
