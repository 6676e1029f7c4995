// KV-cache attention on the sm_90a forward (fa4::forward_kvcache on cuda tensors): a contiguous or a paged cache
// read in place, ragged cache_seqlens (0 and 1 included), new keys appended in the same call, decode (one query,
// the GQA group packed into one tile) and chunked prefill, split-KV forced and chosen, every compiled (dtype,
// head dim). Cache rows no sequence uses and unused pages hold NaN: they must not reach any output. Each
// sequence's out and lse against the fp64 reference of that sequence's keys alone (tolerance rule); outputs
// start NaN-poisoned; the caches after the append must equal the CPU backend's append bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "cuda/sm90/decode.hpp"
#include "fa4/fa4.hpp"
#include "gpu_test_util.hpp"
#include "testing/tensors.hpp"
#include "testing/tolerance.hpp"

namespace {

using fa4::DType;
using fa4::Options;
using fa4::Tensor;

struct CacheCase {
  DType dtype = DType::bf16;
  int64_t head_dim = 128, heads_q = 8, heads_kv = 2, seqlen_q = 1;
  std::vector<int32_t> cached;  // keys already in each sequence's cache
  int64_t seqlen_new = 0;       // appended in the call
  int64_t page_size = 0;        // 0: contiguous
  int64_t capacity = 0;         // keys a sequence's cache holds (a multiple of page_size when paged)
  Options options;
  uint64_t seed = 1;
  int64_t k_new_pad_rows = 0;  // k_new a view of [batch, seqlen_new + this, ...]: strides unlike v_new's
  int64_t v_new_pad_rows = 0;  // the same for v_new (both padded alike: one set of strides, not packed)
  size_t expect_kernels = 0;   // > 0: the call's launches, counted in a captured copy of it
  bool caller_workspace = false;  // workspace_size_kvcache's bytes, NaN-poisoned; else none (stream-ordered)
  std::string name() const {
    std::string s = std::string(fa4::to_string(dtype)) + " d" + std::to_string(head_dim) + " h" +
                    std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " sq" + std::to_string(seqlen_q) +
                    (page_size ? " page" + std::to_string(page_size) : std::string(" contiguous")) + " cap" +
                    std::to_string(capacity) + " new" + std::to_string(seqlen_new) +
                    (k_new_pad_rows ? " k_new+" + std::to_string(k_new_pad_rows) + "rows" : std::string()) +
                    (v_new_pad_rows ? " v_new+" + std::to_string(v_new_pad_rows) + "rows" : std::string()) + " cached";
    for (int32_t c : cached) s += " " + std::to_string(c);
    if (options.causal) s += " causal";
    if (options.num_splits != 0) s += " splits" + std::to_string(options.num_splits);
    return s;
  }
};

// A dense host tensor's elements as raw 16-bit storage (bf16 / fp16).
uint16_t* elems(const HostTensor& t) { return static_cast<uint16_t*>(t.desc().data); }

HostTensor clone(const HostTensor& t) {
  const Tensor& d = t.desc();
  HostTensor c = HostTensor::make(d.dtype, d.shape);
  c.storage() = t.storage();
  c.desc().data = c.storage().data();
  return c;
}

// Returns the GPU call's out, as stored (empty if it threw).
std::vector<uint16_t> check_kvcache(const CacheCase& c) {
  SCOPED_TRACE(c.name());
  const int64_t batch = int64_t(c.cached.size()), d = c.head_dim, hk = c.heads_kv;
  const bool paged = c.page_size > 0;
  const int64_t max_pages = paged ? c.capacity / c.page_size : 0;
  // Pages: every sequence's max_pages, shuffled, plus spare pages nobody owns.
  const int64_t num_pages = paged ? batch * max_pages + 3 : 0;
  std::vector<int32_t> table(size_t(batch * max_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(uint32_t(c.seed)));
  const std::array<int64_t, 4> cache_shape =
      paged ? std::array<int64_t, 4>{num_pages, c.page_size, hk, d} : std::array<int64_t, 4>{batch, c.capacity, hk, d};
  auto q = HostTensor::make(c.dtype, {batch, c.seqlen_q, c.heads_q, d});
  auto kc = HostTensor::make(c.dtype, cache_shape), vc = HostTensor::make(c.dtype, cache_shape);
  auto kn = HostTensor::make(c.dtype, {batch, std::max<int64_t>(c.seqlen_new, 1) + c.k_new_pad_rows, hk, d});
  auto vn = HostTensor::make(c.dtype, {batch, std::max<int64_t>(c.seqlen_new, 1) + c.v_new_pad_rows, hk, d});
  q.fill_normal(c.seed * 5 + 1), kc.fill_normal(c.seed * 5 + 2), vc.fill_normal(c.seed * 5 + 3);
  kn.fill_normal(c.seed * 5 + 4), vn.fill_normal(c.seed * 5 + 5);
  // Key j of sequence b: its row in the cache image.
  auto slot_row = [&](int64_t b, int64_t j) {
    return paged ? int64_t(table[size_t(b * max_pages + j / c.page_size)]) * c.page_size + j % c.page_size
                 : b * c.capacity + j;
  };
  // Every row no sequence has cached is NaN (0xFFFF in both 16-bit formats): unused pages and slots, and the slots
  // the append will fill.
  const int64_t cache_rows = cache_shape[0] * cache_shape[1];
  std::vector<bool> used(size_t(cache_rows), false);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < c.cached[size_t(b)]; ++j) used[size_t(slot_row(b, j))] = true;
  for (int64_t r = 0; r < cache_rows; ++r)
    if (!used[size_t(r)])
      for (auto* t : {&kc, &vc}) std::fill_n(elems(*t) + r * hk * d, hk * d, uint16_t(0xFFFF));

  // The CPU backend on host copies: the append, and the caches it leaves.
  HostTensor kc_host = clone(kc), vc_host = clone(vc);
  std::vector<int32_t> lens(c.cached);
  fa4::KvCache kv_host;
  kv_host.cache_seqlens = lens.data();
  kv_host.page_table = paged ? table.data() : nullptr, kv_host.max_pages = max_pages;
  Tensor kn_desc = kn.desc(), vn_desc = vn.desc();
  kn_desc.shape[1] = vn_desc.shape[1] = c.seqlen_new;
  if (c.seqlen_new > 0) kv_host.k_new = &kn_desc, kv_host.v_new = &vn_desc;
  {
    auto out_cpu = HostTensor::make(c.dtype, {batch, c.seqlen_q, c.heads_q, d});
    Options o = c.options;
    o.num_splits = 0;
    fa4::forward_kvcache(q.desc(), kc_host.desc(), vc_host.desc(), out_cpu.desc(), nullptr, kv_host, o);
  }

  // The GPU call.
  auto out = HostTensor::make(c.dtype, {batch, c.seqlen_q, c.heads_q, d});
  auto lse = HostTensor::make_lse({batch, c.heads_q, c.seqlen_q});
  out.poison(), lse.poison();
  DeviceCopy d_q(q, size_t(q.numel())), d_kc(kc, size_t(kc.numel())), d_vc(vc, size_t(vc.numel())),
      d_kn(kn, size_t(kn.numel())), d_vn(vn, size_t(vn.numel())), d_out(out, size_t(out.numel())),
      d_lse(lse, size_t(lse.numel()));
  const DeviceInts d_lens(c.cached), d_table(table);
  fa4::KvCache kv;
  kv.cache_seqlens = d_lens.ptr;
  kv.page_table = paged ? d_table.ptr : nullptr, kv.max_pages = max_pages;
  Tensor d_kn_desc = d_kn.desc(), d_vn_desc = d_vn.desc();
  d_kn_desc.shape[1] = d_vn_desc.shape[1] = c.seqlen_new;
  if (c.seqlen_new > 0) kv.k_new = &d_kn_desc, kv.v_new = &d_vn_desc;
  fa4::Workspace workspace;
  void* ws = nullptr;
  if (c.caller_workspace) {  // workspace_size_kvcache's bytes: the forward's, of q against the cache as [batch,
                             // capacity, heads_kv, head_dim] (the recipe it replaced, checked equal here)
    const size_t bytes = fa4::workspace_size_kvcache(d_q.desc(), d_kc.desc(), d_vc.desc(), kv, c.options);
    Tensor keys = Tensor::contiguous(d_kc.desc().data, c.dtype, fa4::Device::cuda, {batch, c.capacity, hk, d});
    keys.device_index = d_kc.desc().device_index;
    EXPECT_EQ(bytes, fa4::workspace_size(fa4::Pass::forward, d_q.desc(), keys, keys, c.options));
    EXPECT_EQ(cudaMalloc(&ws, std::max<size_t>(bytes, 1)), cudaSuccess);
    EXPECT_EQ(cudaMemset(ws, 0xFF, std::max<size_t>(bytes, 1)), cudaSuccess);
    workspace = {ws, bytes};
  }
  const std::unique_ptr<void, cudaError_t (*)(void*)> ws_owner(ws, cudaFree);
  try {
    fa4::forward_kvcache(d_q.desc(), d_kc.desc(), d_vc.desc(), d_out.desc(), &d_lse.desc(), kv, c.options, workspace);
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return {};
  }
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    ADD_FAILURE() << "cudaDeviceSynchronize -> " << cudaGetErrorName(e) << ": " << cudaGetErrorString(e);
    return {};
  }
  d_out.copy_back(out), d_lse.copy_back(lse);
  if (c.expect_kernels > 0) {  // the same call again, captured (it would append the same keys at the same slots)
    size_t kernels = 0;
    captured_kernels(
        [&](fa4::Stream stream) {
          try {
            fa4::forward_kvcache(d_q.desc(), d_kc.desc(), d_vc.desc(), d_out.desc(), &d_lse.desc(), kv, c.options,
                                 workspace, stream);
          } catch (const fa4::Error& e) {
            ADD_FAILURE() << "threw under capture: " << e.what();
          }
        },
        &kernels);
    EXPECT_EQ(kernels, c.expect_kernels) << "kernels launched by the call";
  }
  HostTensor kc_gpu = clone(kc), vc_gpu = clone(vc);
  d_kc.copy_back(kc_gpu), d_vc.copy_back(vc_gpu);
  EXPECT_EQ(std::memcmp(elems(kc_gpu), elems(kc_host), size_t(kc.numel()) * 2), 0) << "k_cache after the append";
  EXPECT_EQ(std::memcmp(elems(vc_gpu), elems(vc_host), size_t(vc.numel()) * 2), 0) << "v_cache after the append";

  // Each sequence against the fp64 reference over its keys, gathered from the appended host cache.
  const std::vector<double> lv = lse.values();
  const int64_t row_elems = hk * d;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t sk = c.cached[size_t(b)] + c.seqlen_new;
    auto kb = HostTensor::make(c.dtype, {1, sk, hk, d}), vb = HostTensor::make(c.dtype, {1, sk, hk, d});
    for (int64_t j = 0; j < sk; ++j) {
      std::memcpy(elems(kb) + j * row_elems, elems(kc_host) + slot_row(b, j) * row_elems, size_t(row_elems) * 2);
      std::memcpy(elems(vb) + j * row_elems, elems(vc_host) + slot_row(b, j) * row_elems, size_t(row_elems) * 2);
    }
    auto qb = HostTensor::make(c.dtype, {1, c.seqlen_q, c.heads_q, d});
    std::memcpy(elems(qb), elems(q) + b * c.seqlen_q * c.heads_q * d, size_t(c.seqlen_q * c.heads_q * d) * 2);
    Options o = c.options;
    o.num_splits = 0;
    const fa4::detail::Problem p = fa4::detail::validate_inputs("test", qb.desc(), kb.desc(), vb.desc(), o);
    auto ref = HostTensor::make(DType::f64, {1, c.seqlen_q, c.heads_q, d});
    auto naive = HostTensor::make(DType::f64, {1, c.seqlen_q, c.heads_q, d});
    auto lse_ref = HostTensor::make_lse({1, c.heads_q, c.seqlen_q}), lse_naive = HostTensor::make_lse({1, c.heads_q, c.seqlen_q});
    fa4::cpu::reference_forward(p, qb.desc(), kb.desc(), vb.desc(), ref.desc(), &lse_ref.desc(), fa4::cpu::Precision::exact);
    fa4::cpu::reference_forward(p, qb.desc(), kb.desc(), vb.desc(), naive.desc(), &lse_naive.desc(), fa4::cpu::Precision::storage);
    auto got = HostTensor::make(c.dtype, {1, c.seqlen_q, c.heads_q, d});
    std::memcpy(elems(got), elems(out) + b * c.seqlen_q * c.heads_q * d, size_t(c.seqlen_q * c.heads_q * d) * 2);
    std::vector<double> got_lse(lv.begin() + b * c.heads_q * c.seqlen_q, lv.begin() + (b + 1) * c.heads_q * c.seqlen_q);
    const auto co = fa4::testing::compare(got.values(), ref.values(), naive.values(), c.dtype, 2.0, 0.0);
    const auto cl = fa4::testing::compare(got_lse, lse_ref.values(), lse_naive.values(), DType::f32, 2.0, 0.0);
    EXPECT_TRUE(co.pass) << "sequence " << b << " (" << sk << " keys) out " << co.summary();
    EXPECT_TRUE(cl.pass) << "sequence " << b << " (" << sk << " keys) lse " << cl.summary();
  }
  std::printf("  %-100s %s\n", c.name().c_str(), ::testing::Test::HasFailure() ? "FAIL" : "ok");
  std::fflush(stdout);
  return std::vector<uint16_t>(elems(out), elems(out) + out.numel());
}

TEST(GpuKvCacheSm90, DecodeEveryInstanceContiguousAndPaged) {
  REQUIRE_SM90();
  uint64_t seed = 900;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    for (int64_t page : {0, 16, 48, 64, 256}) {
      CacheCase c;
      c.dtype = dtype, c.head_dim = head_dim, c.page_size = page, c.seed = ++seed;
      c.capacity = page ? page * (page >= 256 ? 3 : 40) : 700;
      c.cached = {0, 1, 17, 129, int32_t(c.capacity - 2), 300};
      c.seqlen_new = 1;
      c.options.causal = true;
      check_kvcache(c);
    }
  }
}

TEST(GpuKvCacheSm90, SplitsAppendsAndPrefillChunks) {
  REQUIRE_SM90();
  uint64_t seed = 950;
  for (int64_t page : {0, 64}) {
    for (int splits : {0, 1, 3, 8}) {  // 0: the fill rule (here: splits, batch·groups < SMs)
      CacheCase c;
      c.page_size = page, c.capacity = page ? 64 * 70 : 4000, c.seed = ++seed;
      c.cached = {3000, 0, 1234, 63};
      c.seqlen_new = 5, c.seqlen_q = 1;
      c.options.num_splits = splits;
      check_kvcache(c);
    }
    CacheCase chunk;  // chunked prefill: 37 new queries and keys, causal bottom-right over each sequence's cache
    chunk.page_size = page, chunk.capacity = page ? 64 * 20 : 1200, chunk.seed = ++seed;
    chunk.heads_q = 4, chunk.heads_kv = 4, chunk.seqlen_q = 37, chunk.seqlen_new = 37;
    chunk.cached = {0, 500, 1000};
    chunk.options.causal = true;
    check_kvcache(chunk);
    CacheCase window = chunk;
    window.options.causal = false, window.options.window_left = 100, window.options.window_right = 0;
    window.seqlen_new = 0, window.cached = {1, 300, 1199};
    check_kvcache(window);
  }
}

// The decode kernel (FA4_FWD_DECODE_KERNEL=2: every call it takes, perf-log F27) over contiguous and paged caches: every page size of
// the decode test, forced splits (ranges left empty by short sequences included), groups of 1, 4 and 16; with an
// append (1 to a full cache less one key) and without (a sequence of no key: O = 0, LSE = -inf; a full cache);
// and its bits differ from the forward kernel's on every call (the switch reaches another kernel).
TEST(GpuKvCacheSm90, DecodeKernelContiguousAndPaged) {
  REQUIRE_SM90();
  uint64_t seed = 1200;
  int cases = 0, differing = 0;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    if (head_dim > 128) continue;
    for (int64_t page : {0, 16, 48, 64, 256})
      for (int splits : {0, 1, 5}) {
        CacheCase c;
        c.dtype = dtype, c.head_dim = head_dim, c.page_size = page, c.seed = ++seed;
        c.heads_q = splits == 5 ? 16 : 8, c.heads_kv = splits == 1 ? 8 : (splits == 5 ? 1 : 2);
        c.capacity = page ? page * (page >= 256 ? 3 : 40) : 700;
        c.seqlen_new = splits == 1 ? 0 : 1;
        c.cached = {0, 1, 17, 129, int32_t(c.capacity - c.seqlen_new - (splits == 1 ? 0 : 1)), 300};
        c.options.causal = splits != 5, c.options.num_splits = splits;
        std::vector<uint16_t> base;
        {
          const EnvOverride off("FA4_FWD_DECODE_KERNEL", "0");
          base = check_kvcache(c);
        }
        const EnvOverride on("FA4_FWD_DECODE_KERNEL", "2");  // every call it takes, long ranges too
        ++cases, differing += check_kvcache(c) != base;
      }
  }
  EXPECT_EQ(differing, cases) << "calls whose out is the forward kernel's bit for bit: is FA4_FWD_DECODE_KERNEL "
                                 "reaching the decode kernel?";
}

// The decode kernel's own append (perf-log F33; FA4_FWD_DECODE_APPEND): new keys read from k_new / v_new and written
// into their slots by the CTA whose range holds them, in one launch (with one range; the combine after several).
// Appends of 1 key, of keys across two chunks and across ranges, at page boundaries, into a contiguous cache and
// pages of 16 and 64 rows; k_new and v_new packed, or padded alike (one set of strides), or a k_new whose strides
// are not v_new's, which takes the append kernel (one launch more). Its out is the append kernel's bit for bit: the
// appending decode instance reads the same rows, only from elsewhere, and computes them with the same source as the
// instance that runs after the append kernel. In a build whose decode kernel does not append (kDecodeAppends:
// the A/B define off, or the per-warp rings), every call takes the append kernel and FA4_FWD_DECODE_APPEND=1 is
// refused by name.
TEST(GpuKvCacheSm90, DecodeKernelAppendsItsNewKeys) {
  REQUIRE_SM90();
  const EnvOverride decode("FA4_FWD_DECODE_KERNEL", "2");
  if (!fa4::sm90::kDecodeAppends) {
    auto q = HostTensor::make(DType::bf16, {1, 1, 2, 64}), kc = HostTensor::make(DType::bf16, {1, 64, 1, 64});
    auto kn = HostTensor::make(DType::bf16, {1, 1, 1, 64});
    q.fill_normal(1), kc.fill_normal(2), kn.fill_normal(3);
    DeviceCopy d_q(q, size_t(q.numel())), d_kc(kc, size_t(kc.numel())), d_vc(kc, size_t(kc.numel())),
        d_kn(kn, size_t(kn.numel())), d_out(q, size_t(q.numel()));
    const DeviceInts d_lens(std::vector<int32_t>{5});
    fa4::KvCache kv;
    kv.cache_seqlens = d_lens.ptr, kv.k_new = &d_kn.desc(), kv.v_new = &d_kn.desc();
    const EnvOverride on("FA4_FWD_DECODE_APPEND", "1");
    try {
      fa4::forward_kvcache(d_q.desc(), d_kc.desc(), d_vc.desc(), d_out.desc(), nullptr, kv);
      ADD_FAILURE() << "FA4_FWD_DECODE_APPEND=1 accepted by a build whose decode kernel does not append";
    } catch (const fa4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("FA4_FWD_DECODE_APPEND"), std::string::npos) << e.what();
    }
  }
  uint64_t seed = 1500;
  for (const auto& [dtype, head_dim] : compiled_instances(/*backward=*/false)) {
    if (head_dim > 128) continue;
    for (int64_t page : {0, 16, 64})
      for (const auto& [seqlen_new, splits] : {std::pair{1, 1}, {5, 3}, {70, 1}, {130, 4}})
        for (const auto& [k_pad, v_pad] : {std::pair{0, 0}, {3, 3}, {2, 0}}) {
          CacheCase c;
          c.dtype = dtype, c.head_dim = head_dim, c.page_size = page, c.seed = ++seed;
          c.heads_q = 8, c.heads_kv = 2, c.capacity = page ? page * 40 : 640;
          c.seqlen_new = seqlen_new, c.k_new_pad_rows = k_pad, c.v_new_pad_rows = v_pad;
          // New keys from the first slot, across a page's or a chunk's end (63, 127), and ending the cache.
          c.cached = {0, 63, 127, int32_t(c.capacity - seqlen_new)};
          c.options.causal = true, c.options.num_splits = splits;
          c.caller_workspace = k_pad > 0;
          const bool fused = fa4::sm90::kDecodeAppends && k_pad == v_pad;  // not in the per-warp rings' build
          c.expect_kernels = (fused ? 1 : 2) + (splits > 1 ? 1 : 0);
          const std::vector<uint16_t> out = check_kvcache(c);
          const EnvOverride off("FA4_FWD_DECODE_APPEND", "0");
          c.expect_kernels = 2 + (splits > 1 ? 1 : 0);
          EXPECT_TRUE(check_kvcache(c) == out) << c.name() << ": out unlike the append kernel's";
        }
  }
}

// Prefill over a paged cache on every tile row of the head dims whose K/V tiles span several 64-column chunks
// (d = 128, 192, 256: one query, a short chunk, more than a 128-row tile), with pages of 32, 64, 96 and 128 rows
// (boxes of a whole tile or of part of one) and sequences ending inside a box, inside a tile and on a page's end.
TEST(GpuKvCacheSm90, PagedPrefillEveryRowAndPageSize) {
  REQUIRE_SM90();
  uint64_t seed = 990;
  for (int64_t head_dim : {128, 192, 256}) {
    for (int64_t seqlen_q : {1, 37, 150}) {
      for (int64_t page : {32, 64, 96, 128}) {
        CacheCase c;
        c.head_dim = head_dim, c.heads_q = 4, c.heads_kv = 2, c.seqlen_q = seqlen_q, c.seqlen_new = seqlen_q;
        c.page_size = page, c.capacity = page * (1024 / page), c.seed = ++seed;
        c.cached = {0, 64 - int32_t(seqlen_q % 64), 700, int32_t(c.capacity - seqlen_q)};
        c.options.causal = seqlen_q > 1;
        check_kvcache(c);
      }
    }
  }
}

}  // namespace

namespace {

// Small enough for compute-sanitizer (scripts/device-check): paged with an append and two splits, and a
// contiguous chunk of three causal queries.
TEST(GpuKvCacheSm90, Small) {
  REQUIRE_SM90();
  CacheCase paged;
  paged.heads_q = 4, paged.heads_kv = 2, paged.page_size = 16, paged.capacity = 160, paged.seed = 7;
  paged.cached = {0, 5, 40}, paged.seqlen_new = 3, paged.options.num_splits = 2;
  check_kvcache(paged);
  CacheCase chunk;
  chunk.heads_q = 2, chunk.heads_kv = 1, chunk.seqlen_q = 3, chunk.capacity = 200, chunk.seed = 8;
  chunk.cached = {1, 150}, chunk.seqlen_new = 3, chunk.options.causal = true;
  check_kvcache(chunk);
}

}  // namespace

namespace {

// Options::validate_device_metadata (and FA4_VALIDATE=1): each bad device entry is caught before anything is
// launched or written, by name; without it the same metadata are trusted (not tested: that reads out of bounds).
TEST(GpuKvCacheSm90, ValidationNamesEachBadDeviceEntry) {
  REQUIRE_SM90();
  const int64_t batch = 2, page = 16, max_pages = 4, num_pages = 8, hk = 1, d = 64;
  auto q = HostTensor::make(DType::bf16, {batch, 1, 2, d});
  auto kc = HostTensor::make(DType::bf16, {num_pages, page, hk, d});
  auto out = HostTensor::make(DType::bf16, {batch, 1, 2, d});
  q.fill_normal(1), kc.fill_normal(2), out.poison();
  DeviceCopy d_q(q, size_t(q.numel())), d_kc(kc, size_t(kc.numel())), d_vc(kc, size_t(kc.numel())),
      d_out(out, size_t(out.numel()));
  auto expect = [&](std::vector<int32_t> lens, std::vector<int32_t> table, const std::string& arg, bool by_env) {
    const DeviceInts d_lens(lens), d_table(table);
    fa4::KvCache kv;
    kv.cache_seqlens = d_lens.ptr, kv.page_table = d_table.ptr, kv.max_pages = max_pages;
    Options o;
    o.validate_device_metadata = !by_env;
    if (by_env) setenv("FA4_VALIDATE", "1", 1);
    try {
      fa4::forward_kvcache(d_q.desc(), d_kc.desc(), d_vc.desc(), d_out.desc(), nullptr, kv, o);
      ADD_FAILURE() << "no error for " << arg;
    } catch (const fa4::Error& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
    if (by_env) unsetenv("FA4_VALIDATE");
  };
  expect({70, 3}, {0, 1, 2, 3, 4, 5, 6, 7}, "kvcache.cache_seqlens[0]", false);  // > 4 pages of 16
  expect({20, 40}, {0, 1, 2, 3, 4, 5, 9, 7}, "kvcache.page_table[1][2]", false);  // page 9 of 8
  expect({20, 40}, {0, -1, 2, 3, 4, 5, 6, 7}, "kvcache.page_table[0][1]", true);  // by the environment
  // The output was never written.
  d_out.copy_back(out);
  for (double x : out.values()) ASSERT_TRUE(std::isnan(x)) << "a refused call wrote its output";
}

// A cache the kernels cannot read by TMA is refused under the cache's own names, contiguous or paged (the shared
// layout check named them 'k' and 'v' before), and nothing is written.
TEST(GpuKvCacheSm90, LayoutRefusalsNameTheCache) {
  REQUIRE_SM90();
  const int64_t batch = 2, page = 16, num_pages = 8, d = 64;
  auto q = HostTensor::make(DType::bf16, {batch, 1, 2, d});
  // Twice the pages the views below use: their odd strides reach past 8 pages, and the allocations must hold them
  // whole (else the call's aliasing check, which runs first, finds them overlapping out).
  auto kc = HostTensor::make(DType::bf16, {2 * num_pages, page, 1, d});
  auto out = HostTensor::make(DType::bf16, {batch, 1, 2, d});
  q.fill_normal(1), kc.fill_normal(2), out.poison();
  DeviceCopy d_q(q, size_t(q.numel())), d_kc(kc, size_t(kc.numel())), d_vc(kc, size_t(kc.numel())),
      d_out(out, size_t(out.numel()));
  const std::vector<int32_t> lens = {20, 40}, table = {0, 1, 2, 3, 4, 5, 6, 7};
  const DeviceInts d_lens(lens), d_table(table);
  // Rows 65 elements apart: not a multiple of 16 bytes. Contiguous: [batch, 48 keys]; paged: pages of 16 rows.
  auto odd_rows = [&](fa4::Tensor t, int64_t rows) {
    t.shape[0] = num_pages * page / rows, t.shape[1] = rows;
    t.stride[1] = d + 1, t.stride[0] = rows * (d + 1);
    return t;
  };
  // Each cache in turn is bad: by its row stride, or by a base 8 bytes past 16-byte alignment (the paged call
  // checks its capacity view of k_cache first: that refusal must name k_cache too).
  for (const bool paged : {false, true})
    for (const bool bad_k : {true, false})
      for (const bool bad_base : {false, true}) {
        fa4::KvCache kv;
        kv.cache_seqlens = d_lens.ptr;
        if (paged) kv.page_table = d_table.ptr, kv.max_pages = 4;
        const int64_t rows = paged ? page : 48;
        fa4::Tensor k = odd_rows(d_kc.desc(), rows), v = odd_rows(d_vc.desc(), rows);
        if (!paged) k.shape[0] = v.shape[0] = batch;
        for (fa4::Tensor* t : {&k, &v})
          if (bad_base || t != (bad_k ? &k : &v)) t->stride[1] = d, t->stride[0] = rows * d;  // the good layout
        if (bad_base) {
          fa4::Tensor& bad = bad_k ? k : v;
          bad.data = static_cast<char*>(bad.data) + 8;
        }
        const std::string name = bad_k ? "k_cache" : "v_cache";
        const std::string arg = bad_base ? "argument '" + name + "': expected a 16-byte aligned"
                                         : "argument '" + name + ".stride[1]'";
        try {
          fa4::forward_kvcache(d_q.desc(), k, v, d_out.desc(), nullptr, kv, Options{});
          ADD_FAILURE() << "no error for " << arg << (paged ? " (paged)" : " (contiguous)");
        } catch (const fa4::Error& e) {
          EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
        }
      }
  d_out.copy_back(out);
  for (double x : out.values()) ASSERT_TRUE(std::isnan(x)) << "a refused call wrote its output";
}

}  // namespace
