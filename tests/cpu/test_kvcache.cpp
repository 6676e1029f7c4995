// Split-KV (Options::num_splits) and KV-cache attention (fa4::forward_kvcache) on the CPU backend.
// Split-KV: the LSE merge rule by hand, then 1..8 ranges (more ranges than key blocks too) against the fp64
// reference with the tolerance rule, under causal, window, softcap and sinks. KV cache: each sequence's keys
// are one testing case's random keys, laid into pages in shuffled order (unused slots NaN, so a stray read
// fails), the last seqlen_new of them given as k_new to be appended; the output and LSE read back for that
// sequence are checked against the reference of the dense [1, n, heads_kv, d] problem (testing::run_case on
// the same inputs), and the cache afterwards holds the appended keys. Then every bad argument refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "fa4/fa4.h"
#include "numerics/split_merge.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::Tensor;
using fa4::testing::CaseSpec;
using fa4::testing::HostTensor;

Options with_splits(Options o, int n) {
  o.num_splits = n;
  return o;
}

// ---- split-KV ---------------------------------------------------------------------------------------------

TEST(SplitKv, MergeRuleByHand) {
  fa4::num::LseMerge<double> m;
  m.add(std::log(2.0)), m.add(-INFINITY), m.add(std::log(6.0));
  m.finish();
  EXPECT_NEAR(m.lse, std::log(8.0), 1e-15);
  EXPECT_NEAR(m.weight(std::log(2.0)), 0.25, 1e-15);
  EXPECT_NEAR(m.weight(std::log(6.0)), 0.75, 1e-15);
  EXPECT_EQ(m.weight(-INFINITY), 0.0);
  fa4::num::LseMerge<double> big;  // no overflow around large logits, in either order
  big.add(1000.0), big.add(1001.0), big.add(999.0);
  big.finish();
  EXPECT_NEAR(big.lse, 1001.0 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-12);
  fa4::num::LseMerge<double> empty;  // every range empty: lse -inf, every weight 0 (O = 0)
  empty.add(-INFINITY), empty.add(-INFINITY);
  empty.finish();
  EXPECT_EQ(empty.lse, -INFINITY);
  EXPECT_EQ(empty.weight(-INFINITY), 0.0);
}

// Joining per-lane states (the GPU combine's warp reduction) gives the sequential merge's lse, in any grouping,
// with empty states and ranges among them.
TEST(SplitKv, MergeStatesJoinLikeSequentialAdds) {
  const double lses[] = {3.0, -INFINITY, 1000.0, -2.5, 999.5, -INFINITY, 0.25};
  fa4::num::LseMerge<double> all;
  for (double l : lses) all.add(l);
  all.finish();
  for (int cut = 0; cut <= 7; ++cut) {
    fa4::num::LseMerge<double> a, b;
    for (int i = 0; i < 7; ++i) (i < cut ? a : b).add(lses[i]);
    a.add_state(b.max, b.sum);
    a.finish();
    EXPECT_NEAR(a.lse, all.lse, 1e-12) << "cut " << cut;
  }
  fa4::num::LseMerge<double> empty, other;
  empty.add_state(other.max, other.sum);  // two empty states stay empty
  empty.finish();
  EXPECT_EQ(empty.lse, -INFINITY);
}

void expect_case(CaseSpec s) {
  s.backward = false;  // split-KV is forward only
  const fa4::testing::CaseResult r = fa4::testing::run_case(s);
  EXPECT_TRUE(r.pass) << s.name() << " num_splits=" << s.options.num_splits << ": " << r.failure;
}

TEST(SplitKv, EverySplitCountMatchesTheReference) {
  Options causal, window, softcap;
  causal.causal = true;
  window.window_left = 70, window.window_right = 9;
  softcap.softcap = 15.0f, softcap.causal = true;
  for (int n = 1; n <= 8; ++n)
    for (const Options& o : {Options{}, causal, window, softcap})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 300}, {17, 203}, {113, 100}, {3, 513}}) {
        CaseSpec s;
        s.seqlen_q = sq, s.seqlen_k = sk, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 64, s.dtype = DType::bf16;
        s.options = with_splits(o, n), s.seed = uint64_t(n * 100 + sk);
        expect_case(s);
      }
}

TEST(SplitKv, SplitsMatchOneRangeAndHandleEmptyRanges) {
  // 8 ranges over 2 key blocks (fewer ranges run), f16 and f32, a sink, and rows that see no key at all
  // (causal with seqlen_q > seqlen_k: O = 0, lse = -inf, or the sink's).
  for (DType dtype : {DType::f16, DType::f32}) {
    CaseSpec s;
    s.seqlen_q = 150, s.seqlen_k = 100, s.heads_q = 2, s.heads_kv = 1, s.head_dim = 32, s.dtype = dtype;
    s.options.causal = true, s.options.num_splits = 8;
    expect_case(s);
    s.options.window_left = 10, s.seqlen_k = 700, s.options.num_splits = 5;  // most ranges empty for each row
    expect_case(s);
  }
  std::vector<float> sinks{0.5f, -1.0f};
  Tensor sink_t = Tensor::contiguous(sinks.data(), DType::f32, fa4::Device::cpu, {2, 1, 1, 1});
  sink_t.rank = 1, sink_t.shape = {2, 0, 0, 0}, sink_t.stride = {1, 0, 0, 0};
  CaseSpec s;
  s.seqlen_q = 70, s.seqlen_k = 400, s.heads_q = 2, s.heads_kv = 2, s.head_dim = 64, s.dtype = DType::bf16;
  s.options.sinks = &sink_t, s.options.causal = true, s.options.num_splits = 3;
  expect_case(s);

  // num_splits = 0 and n give the same result up to rounding: within the tolerance rule's bound of each other.
  s.options = {};
  s.seqlen_k = 1000, s.dtype = DType::f32;
  const fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(s);
  auto run = [&](int n) {
    HostTensor out = HostTensor::make(s.dtype, {1, s.seqlen_q, s.heads_q, s.head_dim});
    HostTensor lse = HostTensor::make_lse({1, s.heads_q, s.seqlen_q});
    fa4::forward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), &lse.desc(), with_splits({}, n));
    std::vector<double> all = out.values(), l = lse.values();
    all.insert(all.end(), l.begin(), l.end());
    return all;
  };
  const std::vector<double> one = run(0);
  for (int n : {2, 4, 8, 16, 100}) {
    const std::vector<double> split = run(n);
    double worst = 0;
    for (size_t i = 0; i < one.size(); ++i) worst = std::max(worst, std::fabs(split[i] - one[i]));
    EXPECT_LT(worst, 1e-5) << "num_splits " << n;
  }
}

std::string refusal(const std::function<void()>& call) {
  try {
    call();
  } catch (const fa4::Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(SplitKv, NegativeAndBackwardSplitsAreRefusedByName) {
  CaseSpec s;
  s.seqlen_q = 8, s.seqlen_k = 8, s.head_dim = 32;
  fa4::testing::CaseInputs in = fa4::testing::make_case_inputs(s);
  HostTensor out = HostTensor::make(s.dtype, {1, 8, 1, 32}), lse = HostTensor::make_lse({1, 1, 8});
  HostTensor dq = HostTensor::make(s.dtype, {1, 8, 1, 32}), dk = HostTensor::make(s.dtype, {1, 8, 1, 32}),
             dv = HostTensor::make(s.dtype, {1, 8, 1, 32});
  const std::string neg =
      refusal([&] { fa4::forward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), nullptr, with_splits({}, -1)); });
  EXPECT_NE(neg.find("'options.num_splits': expected >= 0"), std::string::npos) << neg;
  const std::string bwd = refusal([&] {
    fa4::backward(in.q.desc(), in.k.desc(), in.v.desc(), out.desc(), in.dout.desc(), lse.desc(), dq.desc(), dk.desc(),
                  dv.desc(), with_splits({}, 2));
  });
  EXPECT_NE(bwd.find("'options.num_splits': expected 0 or 1 for the backward"), std::string::npos) << bwd;
  const fa4::Support sup = fa4::supports(fa4::Pass::backward, in.q.desc(), in.k.desc(), in.v.desc(), with_splits({}, 4));
  EXPECT_FALSE(sup.ok);
  EXPECT_NE(sup.reason.find("options.num_splits"), std::string::npos) << sup.reason;
  EXPECT_TRUE(fa4::supports(fa4::Pass::backward, in.q.desc(), in.k.desc(), in.v.desc(), with_splits({}, 1)).ok);
  EXPECT_TRUE(fa4::supports(fa4::Pass::forward, in.q.desc(), in.k.desc(), in.v.desc(), with_splits({}, 4)).ok);
  s.dtype = DType::f64;  // computed exactly: fp32 partials would not be
  fa4::testing::CaseInputs in64 = fa4::testing::make_case_inputs(s);
  const fa4::Support f64 = fa4::supports(fa4::Pass::forward, in64.q.desc(), in64.k.desc(), in64.v.desc(), with_splits({}, 2));
  EXPECT_EQ(f64.code, fa4::Status::unsupported);
  EXPECT_NE(f64.reason.find("'options.num_splits': expected 0 or 1 for f64 inputs"), std::string::npos) << f64.reason;
}

// ---- KV cache ---------------------------------------------------------------------------------------------

// A batch of sequences in a (paged or contiguous) cache, built from one testing case per sequence.
struct CacheBatch {
  int64_t page_size = 0;  // 0: a contiguous cache of capacity `contiguous_len`
  int64_t contiguous_len = 0, seqlen_q = 1, seqlen_new = 0, heads = 4, heads_kv = 2, dim = 64;
  DType dtype = DType::bf16;
  Options options;
  std::vector<int32_t> cached;  // per sequence

  std::vector<CaseSpec> specs;
  std::vector<fa4::testing::CaseInputs> inputs;
  HostTensor q, k_cache, v_cache, k_new, v_new, out, lse;
  std::vector<int32_t> page_table;
  int64_t max_pages = 0;

  int64_t batch() const { return int64_t(cached.size()); }
  // (page or batch index, row) of key j of sequence b.
  std::pair<int64_t, int64_t> slot(int64_t b, int64_t j) const {
    if (page_size == 0) return {b, j};
    return {page_table[size_t(b * max_pages + j / page_size)], j % page_size};
  }

  void build(uint64_t seed) {
    const int64_t B = batch();
    for (int64_t b = 0; b < B; ++b) {
      CaseSpec s;
      s.seqlen_q = seqlen_q, s.seqlen_k = cached[size_t(b)] + seqlen_new, s.heads_q = heads, s.heads_kv = heads_kv;
      s.head_dim = dim, s.dtype = dtype, s.options = options, s.seed = seed + uint64_t(b), s.backward = false;
      specs.push_back(s);
      inputs.push_back(fa4::testing::make_case_inputs(s));
    }
    // Pages: each sequence gets ceil(total / page_size) + 1 (one spare column), handed out in shuffled order
    // from a pool with spare pages that nobody uses.
    int64_t num_pages = 0;
    if (page_size > 0) {
      for (int64_t b = 0; b < B; ++b)
        max_pages = std::max(max_pages, (specs[size_t(b)].seqlen_k + page_size - 1) / page_size + 1);
      num_pages = B * max_pages + 3;
      std::vector<int32_t> pool(static_cast<size_t>(num_pages));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), std::mt19937(unsigned(seed)));
      page_table.assign(pool.begin(), pool.begin() + B * max_pages);
    }
    const std::array<int64_t, 4> cshape = page_size > 0 ? std::array<int64_t, 4>{num_pages, page_size, heads_kv, dim}
                                                        : std::array<int64_t, 4>{B, contiguous_len, heads_kv, dim};
    k_cache = HostTensor::make(dtype, cshape), v_cache = HostTensor::make(dtype, cshape);
    k_cache.poison(), v_cache.poison();
    q = HostTensor::make(dtype, {B, seqlen_q, heads, dim});
    k_new = HostTensor::make(dtype, {B, seqlen_new, heads_kv, dim}), v_new = HostTensor::make(dtype, {B, seqlen_new, heads_kv, dim});
    out = HostTensor::make(dtype, {B, seqlen_q, heads, dim}), lse = HostTensor::make_lse({B, heads, seqlen_q});
    out.poison(), lse.poison();
    for (int64_t b = 0; b < B; ++b) {
      const fa4::testing::CaseInputs& in = inputs[size_t(b)];
      for (int64_t i = 0; i < seqlen_q; ++i)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t c = 0; c < dim; ++c) q.set({b, i, h, c}, in.q.at({0, i, h, c}));
      for (int64_t j = 0; j < specs[size_t(b)].seqlen_k; ++j)
        for (int64_t h = 0; h < heads_kv; ++h)
          for (int64_t c = 0; c < dim; ++c) {
            const int64_t t = j - cached[size_t(b)];
            if (t < 0) {
              const auto [p, r] = slot(b, j);
              k_cache.set({p, r, h, c}, in.k.at({0, j, h, c})), v_cache.set({p, r, h, c}, in.v.at({0, j, h, c}));
            } else {
              k_new.set({b, t, h, c}, in.k.at({0, j, h, c})), v_new.set({b, t, h, c}, in.v.at({0, j, h, c}));
            }
          }
    }
  }

  fa4::KvCache metadata() const {
    fa4::KvCache kv;
    kv.cache_seqlens = cached.data();
    kv.page_table = page_size > 0 ? page_table.data() : nullptr;
    kv.max_pages = max_pages;
    if (seqlen_new > 0) kv.k_new = &k_new.desc(), kv.v_new = &v_new.desc();
    return kv;
  }
  void run() {
    fa4::forward_kvcache(q.desc(), k_cache.desc(), v_cache.desc(), out.desc(), &lse.desc(), metadata(), options);
  }
};

// Hands run_case one sequence's rows of the batched results.
class Replay : public fa4::testing::Executor {
 public:
  Replay(const CacheBatch& c, int64_t b) : c_(c), b_(b) {}
  const char* name() const override { return "kvcache replay"; }
  bool has_backward() const override { return false; }
  void forward(HostTensor&, HostTensor&, HostTensor&, HostTensor& out, HostTensor& lse, const Options&) override {
    for (int64_t i = 0; i < c_.seqlen_q; ++i)
      for (int64_t h = 0; h < c_.heads; ++h) {
        lse.set({0, h, i, 0}, c_.lse.at({b_, h, i, 0}));
        for (int64_t d = 0; d < c_.dim; ++d) out.set({0, i, h, d}, c_.out.at({b_, i, h, d}));
      }
  }
  bool backward(const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&, const HostTensor&,
                const HostTensor&, HostTensor&, HostTensor&, HostTensor&, const Options&) override {
    return false;
  }

 private:
  const CacheBatch& c_;
  int64_t b_;
};

void check_batch(CacheBatch& c, uint64_t seed) {
  c.build(seed);
  c.run();
  for (int64_t b = 0; b < c.batch(); ++b) {
    Replay replay(c, b);
    const fa4::testing::CaseResult r = fa4::testing::run_case(c.specs[size_t(b)], &replay);
    EXPECT_TRUE(r.pass) << "page_size " << c.page_size << ", sequence " << b << " (cached " << c.cached[size_t(b)]
                        << " + new " << c.seqlen_new << ", " << c.specs[size_t(b)].name()
                        << ", num_splits " << c.options.num_splits << "): " << r.failure;
    // The cache now holds every key of the sequence, the appended ones included, bit for bit.
    for (int64_t j = 0; j < c.specs[size_t(b)].seqlen_k; ++j) {
      const auto [p, row] = c.slot(b, j);
      for (int64_t h = 0; h < c.heads_kv; ++h)
        for (int64_t d = 0; d < c.dim; ++d)
          ASSERT_TRUE(c.k_cache.at({p, row, h, d}) == c.inputs[size_t(b)].k.at({0, j, h, d}) &&
                      c.v_cache.at({p, row, h, d}) == c.inputs[size_t(b)].v.at({0, j, h, d}))
              << "sequence " << b << " key " << j;
    }
  }
}

TEST(KvCache, PagedDecodeMatchesTheReference) {
  for (int64_t page : {16, 64, 256}) {
    CacheBatch c;
    c.page_size = page;
    c.cached = {0, 1, int32_t(page), int32_t(page - 2), 37, int32_t(2 * page + 5)};  // empty, one key, a full page
    c.seqlen_new = 0;
    check_batch(c, 100 + uint64_t(page));
    CacheBatch a;  // decode with an append of one key, and of 5 keys crossing a page boundary at page - 2
    a.page_size = page, a.cached = c.cached, a.seqlen_new = 1;
    check_batch(a, 200 + uint64_t(page));
    a.seqlen_new = 5, a.inputs.clear(), a.specs.clear(), a.page_table.clear(), a.max_pages = 0;
    check_batch(a, 300 + uint64_t(page));
  }
}

TEST(KvCache, OptionsApplyPerSequence) {
  Options causal, window, softcap;
  causal.causal = true;
  window.window_left = 40, window.window_right = 0, window.softcap = 10.0f;
  softcap.softcap = 20.0f;
  int seed = 0;
  for (const Options& o : {causal, window, softcap})
    for (int splits : {0, 1, 3, 8})
      for (auto [heads, heads_kv] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}, {2, 2}}) {
        CacheBatch c;  // chunked prefill: 7 queries per sequence, 7 keys appended
        c.page_size = 16, c.seqlen_q = 7, c.seqlen_new = 7, c.heads = heads, c.heads_kv = heads_kv, c.dim = 32;
        c.dtype = seed % 2 ? DType::f16 : DType::bf16;
        c.options = with_splits(o, splits);
        c.cached = {0, 9, 16, 130};
        check_batch(c, uint64_t(1000 + seed++));
      }
}

TEST(KvCache, ContiguousCacheMatchesTheReference) {
  CacheBatch c;
  c.contiguous_len = 150, c.seqlen_q = 3, c.seqlen_new = 3, c.heads = 6, c.heads_kv = 3, c.dim = 64;
  c.dtype = DType::f32;
  c.options.causal = true, c.options.num_splits = 2;
  c.cached = {0, 1, 147, 100};
  check_batch(c, 77);
  CacheBatch full;  // no cache_seqlens: every cache full, nothing appended
  full.contiguous_len = 80, full.cached = {80, 80}, full.dtype = DType::bf16;
  full.build(78);
  fa4::KvCache kv = full.metadata();
  kv.cache_seqlens = nullptr;
  fa4::forward_kvcache(full.q.desc(), full.k_cache.desc(), full.v_cache.desc(), full.out.desc(), &full.lse.desc(), kv);
  for (int64_t b = 0; b < 2; ++b) {
    Replay replay(full, b);
    EXPECT_TRUE(fa4::testing::run_case(full.specs[size_t(b)], &replay).pass);
  }
}

TEST(KvCache, BadArgumentsAreRefusedByNameAndWriteNothing) {
  CacheBatch c;
  c.page_size = 16, c.seqlen_new = 2, c.heads = 2, c.heads_kv = 1, c.dim = 32, c.dtype = DType::f32;
  c.cached = {3, 20};
  c.build(5);
  std::vector<std::byte> before = c.k_cache.storage();
  const fa4::KvCache good = c.metadata();
  auto why = [&](const fa4::KvCache& kv, const Options& o = {}) {
    return refusal([&] {
      fa4::forward_kvcache(c.q.desc(), c.k_cache.desc(), c.v_cache.desc(), c.out.desc(), &c.lse.desc(), kv, o);
    });
  };
  auto expect = [&](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << "wanted '" << want << "' in: " << got;
  };
  fa4::KvCache kv = good;
  std::vector<int32_t> table = c.page_table;
  table[1] = 999;  // sequence 0's second column: never read (its 5 keys need one page), so not checked
  table[size_t(c.max_pages + 1)] = -1;  // sequence 1's second page: its 22 keys need it
  kv.page_table = table.data();
  expect(why(kv), "'kvcache.page_table[1][1]': expected a page index in 0 .. ");
  std::vector<int32_t> shared = c.page_table;
  shared[size_t(c.max_pages)] = shared[0];  // both sequences append into page 0's rows 3, 4
  kv = good, kv.page_table = shared.data();
  std::vector<int32_t> same_rows{3, 3};
  kv.cache_seqlens = same_rows.data();
  expect(why(kv), "'kvcache.page_table[1][0]': expected pages whose appended rows belong to one sequence (row 3 of "
                  "page " + std::to_string(shared[0]) + " is appended to by two sequences)");
  std::vector<int32_t> reads_it{3, 10};  // sequence 1 reads page 0's rows 3, 4 as cached keys: sequence 0 appends there
  kv.cache_seqlens = reads_it.data();
  expect(why(kv), "'kvcache.page_table[1][0]': expected pages whose appended rows belong to one sequence (row 3 of "
                  "page " + std::to_string(shared[0]) + " is a cached key of sequence 1 that sequence 0 appends to)");
  std::vector<int32_t> prefix{16, 16};  // a full shared page read by both, each appending into its own next page
  kv.cache_seqlens = prefix.data();
  EXPECT_EQ(why(kv), "(accepted)");
  EXPECT_NE(c.k_cache.storage(), before) << "an accepted call appends";
  before = c.k_cache.storage();  // the refusals below must leave the cache as it is now
  kv = good, kv.cache_seqlens = nullptr;
  expect(why(kv), "'kvcache.k_new': expected null when cache_seqlens is null");
  std::vector<int32_t> too_many{3, int32_t(c.max_pages * 16 + 1)}, overflow{3, int32_t(c.max_pages * 16 - 1)},
      negative{-1, 0};
  kv = good, kv.cache_seqlens = too_many.data();
  expect(why(kv), "'kvcache.cache_seqlens[1]': expected 0 .. " + std::to_string(c.max_pages * 16));
  kv.cache_seqlens = overflow.data();
  expect(why(kv), "'kvcache.cache_seqlens[1]': expected at most " + std::to_string(c.max_pages * 16 - 2) +
                      " (the 2 appended keys must fit");
  kv.cache_seqlens = negative.data();
  expect(why(kv), "'kvcache.cache_seqlens[0]'");
  kv = good, kv.v_new = nullptr;
  expect(why(kv), "'kvcache.v_new': expected a tensor (k_new and v_new come together)");
  kv = good, kv.max_pages = -1;
  expect(why(kv), "'kvcache.max_pages'");
  HostTensor short_new = HostTensor::make(c.dtype, {2, 2, 1, 16});
  kv = good, kv.k_new = &short_new.desc();
  expect(why(kv), "'kvcache.k_new': expected shape [2, 2, 1, 32]");
  kv = good, kv.page_table = nullptr, kv.max_pages = 0;  // a contiguous cache must have q's batch
  expect(why(kv), "'k_cache': expected shape[0] (batch) = 2");
  kv.max_pages = 3;
  expect(why(kv), "'kvcache.max_pages': expected 0 without a page_table");
  expect(why(good, with_splits({}, -2)), "'options.num_splits'");
  Options bad_window;
  bad_window.causal = true, bad_window.window_right = 4;
  expect(why(good, bad_window), "'options.window_right'");
  // A cache that is appended to may not share memory with itself (its slots would be two keys at once).
  Tensor k_folded = c.k_cache.desc();
  k_folded.stride[0] = 0;
  expect(refusal([&] {
           fa4::forward_kvcache(c.q.desc(), k_folded, c.v_cache.desc(), c.out.desc(), nullptr, good);
         }),
         "argument 'k_cache': expected strides under which no two elements share memory");
  EXPECT_EQ(c.k_cache.storage(), before) << "a refused call must not append";

  // Page sizes: a multiple of 16.
  HostTensor odd_pages = HostTensor::make(c.dtype, {8, 24, 1, 32});
  expect(refusal([&] {
           fa4::forward_kvcache(c.q.desc(), odd_pages.desc(), odd_pages.desc(), c.out.desc(), nullptr, good);
         }),
         "'k_cache': expected a page size (shape[1]) that is a positive multiple of 16");
  HostTensor wrong_v = HostTensor::make(c.dtype, {c.k_cache.desc().shape[0], 16, 1, 16});
  expect(refusal([&] { fa4::forward_kvcache(c.q.desc(), c.k_cache.desc(), wrong_v.desc(), c.out.desc(), nullptr, good); }),
         "'v_cache': expected shape");
  HostTensor bad_lse = HostTensor::make_lse({2, 2, 2});
  expect(refusal([&] {
           fa4::forward_kvcache(c.q.desc(), c.k_cache.desc(), c.v_cache.desc(), c.out.desc(), &bad_lse.desc(), good);
         }),
         "'lse': expected an f32 rank 3 [2, 2, 1]");
  // Outputs may not alias the cache.
  Tensor out_in_cache = c.out.desc();
  out_in_cache.data = c.k_cache.desc().data;
  expect(refusal([&] {
           fa4::forward_kvcache(c.q.desc(), c.k_cache.desc(), c.v_cache.desc(), out_in_cache, nullptr, good);
         }),
         "'out': expected memory disjoint from 'k_cache'");
  // CUDA tensors of a dtype no CUDA kernel takes (f32): refused as unsupported, and supports_kvcache says why
  // (the GPU path itself: tests/gpu/test_kvcache_sm90.cu). A cache on another device than q: invalid.
  Tensor q_gpu = c.q.desc(), k_gpu = c.k_cache.desc(), v_gpu = c.v_cache.desc();
  q_gpu.device = k_gpu.device = v_gpu.device = fa4::Device::cuda;
  fa4::KvCache no_append = good;
  no_append.k_new = no_append.v_new = nullptr;
  const fa4::Support s = fa4::supports_kvcache(q_gpu, k_gpu, v_gpu, no_append);
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.code, fa4::Status::unsupported);
  expect(s.reason, "cuda tensors");
  const fa4::Support mixed = fa4::supports_kvcache(q_gpu, c.k_cache.desc(), c.v_cache.desc(), no_append);
  EXPECT_EQ(mixed.code, fa4::Status::invalid_argument);
  expect(mixed.reason, "argument 'k_cache': expected the dtype and device of q");
  EXPECT_TRUE(fa4::supports_kvcache(c.q.desc(), c.k_cache.desc(), c.v_cache.desc(), good).ok);
  EXPECT_EQ(c.k_cache.storage(), before) << "supports_kvcache must not append";
  // The CUDA path's own layout checks come before any backend is selected (so they hold on any build): an lse
  // without data, a broadcast page dimension.
  Tensor out_gpu = c.out.desc(), lse_gpu = c.lse.desc();
  out_gpu.device = lse_gpu.device = fa4::Device::cuda;
  lse_gpu.data = nullptr;
  expect(refusal([&] { fa4::forward_kvcache(q_gpu, k_gpu, v_gpu, out_gpu, &lse_gpu, no_append); }),
         "argument 'lse': expected a data pointer");
  Tensor k_broadcast = k_gpu;
  k_broadcast.stride[0] = 0;
  expect(refusal([&] { fa4::forward_kvcache(q_gpu, k_broadcast, v_gpu, out_gpu, nullptr, no_append); }),
         "argument 'k_cache.stride[0]': expected a non-zero page stride");
}

}  // namespace

// ---- the C ABI --------------------------------------------------------------------------------------------

namespace {

fa4_tensor to_c(const Tensor& t) {
  fa4_tensor r{};
  r.data = t.data, r.dtype = int32_t(t.dtype), r.device = int32_t(t.device), r.device_index = t.device_index;
  r.rank = t.rank;
  for (int i = 0; i < 4; ++i) r.shape[i] = t.shape[i], r.stride[i] = t.stride[i];
  return r;
}

TEST(KvCache, CAbiMatchesTheCppApi) {
  CacheBatch a, b;  // the same batch twice: one through each API (each appends into its own cache)
  for (CacheBatch* c : {&a, &b}) {
    c->page_size = 16, c->seqlen_q = 2, c->seqlen_new = 2, c->heads = 2, c->heads_kv = 1, c->dim = 32;
    c->dtype = DType::f32, c->cached = {5, 31};
    c->options.causal = true, c->options.num_splits = 2;
    c->build(41);
  }
  a.run();
  fa4_options o;
  fa4_options_init(&o);
  EXPECT_EQ(o.num_splits, 0);
  o.causal = 1, o.num_splits = 2;
  const fa4_tensor q = to_c(b.q.desc()), kc = to_c(b.k_cache.desc()), vc = to_c(b.v_cache.desc()),
                   out = to_c(b.out.desc()), lse = to_c(b.lse.desc()), kn = to_c(b.k_new.desc()),
                   vn = to_c(b.v_new.desc());
  fa4_kvcache kv{b.cached.data(), b.page_table.data(), b.max_pages, &kn, &vn};
  char reason[256];
  ASSERT_EQ(fa4_supports_kvcache(&q, &kc, &vc, &kv, &o, reason, sizeof reason), FA4_OK) << reason;
  // The workspace query: none on CPU tensors, through either API; a NULL result pointer or kvcache is refused.
  size_t bytes = 123;
  ASSERT_EQ(fa4_workspace_size_kvcache(&q, &kc, &vc, &kv, &o, &bytes), FA4_OK) << fa4_last_error();
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(fa4::workspace_size_kvcache(b.q.desc(), b.k_cache.desc(), b.v_cache.desc(), b.metadata(), b.options), 0u);
  EXPECT_EQ(fa4_workspace_size_kvcache(&q, &kc, &vc, &kv, &o, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'bytes'"), std::string::npos) << fa4_last_error();
  EXPECT_EQ(fa4_workspace_size_kvcache(&q, &kc, &vc, nullptr, &o, &bytes), FA4_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(fa4_forward_kvcache(&q, &kc, &vc, &out, &lse, &kv, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  EXPECT_EQ(b.out.values(), a.out.values());
  EXPECT_EQ(b.lse.values(), a.lse.values());
  EXPECT_EQ(b.k_cache.values().size(), a.k_cache.values().size());
  EXPECT_EQ(b.k_cache.storage(), a.k_cache.storage());
  // Errors name the argument; a struct_size from before num_splits reads it as 0 (a -1 there is not seen).
  EXPECT_EQ(fa4_forward_kvcache(&q, &kc, &vc, &out, &lse, nullptr, &o, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'kvcache'"), std::string::npos) << fa4_last_error();
  o.num_splits = -1;
  EXPECT_EQ(fa4_supports_kvcache(&q, &kc, &vc, &kv, &o, reason, sizeof reason), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(reason).find("'options.num_splits'"), std::string::npos) << reason;
  EXPECT_EQ(fa4_workspace_size_kvcache(&q, &kc, &vc, &kv, &o, &bytes), FA4_ERROR_INVALID_ARGUMENT);  // as the call
  EXPECT_NE(std::string(fa4_last_error()).find("'options.num_splits'"), std::string::npos) << fa4_last_error();
  o.struct_size = uint32_t(offsetof(fa4_options, num_splits));
  EXPECT_EQ(fa4_supports_kvcache(&q, &kc, &vc, &kv, &o, reason, sizeof reason), FA4_OK) << reason;
}

}  // namespace
