// A KV-cache call on random inputs, shared by `fa4 run --kvcache` (run_kvcache.cpp) and `fa4 trace --kvcache`
// (cmd_trace.cpp). Sequence b has L_b keys cached and `append` appended in the call; the cache holds max(L) +
// append keys per sequence, contiguous or in pages of `page` rows handed out in a shuffled order, and every slot
// no sequence has filled is NaN (it must not reach any output).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fa4/common.hpp"
#include "fa4/fa4.hpp"
#include "fa4/gpu.hpp"
#include "testing/tensors.hpp"

namespace fa4::cli {

// --kvcache, --page-size and --append (fa4 run, fa4 trace): the last two need the first, which excludes the
// options it replaces (--batch, --seqlen, --seqlen-k, --layout). Returns --kvcache.
CLI::Option* add_kvcache_options(CLI::App* cmd, std::vector<int64_t>& kvcache, int64_t& page_size, int64_t& append);

// The host side: tensors, page table and lengths. Not movable: the KvCache views point into it.
struct KvCacheInputs {
  // cmd names the command in errors; page_size 0: a contiguous cache; append < 0: the query length.
  KvCacheInputs(const char* cmd, const ProblemArgs& pa, const std::vector<int64_t>& cached, int64_t page_size,
                int64_t append);
  KvCacheInputs(const KvCacheInputs&) = delete;
  KvCacheInputs& operator=(const KvCacheInputs&) = delete;

  KvCache host_kv() const;                      // the call's metadata, on the host
  int64_t slot(int64_t b, int64_t j) const;     // cache row of key j of sequence b
  double flops(const Options& opts) const;      // the sequences' own work (attention_flops of each)
  std::string problem_line(const Options& opts) const;  // "kvcache b=... +N appended, s_q=... pages of ..."

  DType dtype;
  std::vector<int64_t> cached;
  int64_t batch, sq, h, hk, d, append, page, max_pages, capacity, num_pages;
  std::vector<int32_t> table, lens;
  testing::HostTensor q, out, kc, vc, kn, vn;
};

// The same inputs in device memory, the metadata uploaded as an engine's are; out starts NaN.
struct KvCacheDevice {
  explicit KvCacheDevice(const KvCacheInputs& in);
  KvCacheDevice(const KvCacheDevice&) = delete;
  KvCacheDevice& operator=(const KvCacheDevice&) = delete;

  KvCache kv() const;  // the call's metadata, on the device
  Support supports(const Options& opts) const { return supports_kvcache(q->desc(), kc->desc(), vc->desc(), kv(), opts); }
  void call(const Options& opts, Workspace workspace = {}) const {
    forward_kvcache(q->desc(), kc->desc(), vc->desc(), out->desc(), nullptr, kv(), opts, workspace);
  }
  // Bytes of workspace the call needs (workspace_size_kvcache).
  size_t workspace_bytes(const Options& opts) const;

  const KvCacheInputs& in;
  std::unique_ptr<gpu::Mirror> q, kc, vc, kn, vn, out;
  std::unique_ptr<gpu::Buffer> lens, table;
};

}  // namespace fa4::cli
