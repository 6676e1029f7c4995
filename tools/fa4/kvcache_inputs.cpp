// The random inputs of a KV-cache call (kvcache_inputs.hpp).
#include "fa4/kvcache_inputs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace fa4::cli {

using testing::HostTensor;

namespace {

int64_t longest_of(const std::vector<int64_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// The page size, checked before any size is derived from it.
int64_t checked_page(const char* cmd, int64_t page) {
  if (page % 16 != 0)
    throw Error(Status::invalid_argument,
                fmt::format("{}: --page-size: expected a multiple of 16 (0: a contiguous cache), got {}", cmd, page));
  return page;
}

}  // namespace

CLI::Option* add_kvcache_options(CLI::App* cmd, std::vector<int64_t>& kvcache, int64_t& page_size, int64_t& append) {
  CLI::Option* cached = cmd->add_option("--kvcache", kvcache,
                                        "a KV-cache call (flash_attn_with_kvcache): the keys already cached per "
                                        "sequence, comma-separated; --seqlen-q queries each (default 1)")
                            ->delimiter(',')
                            ->check(kAtLeastZero);
  CLI::Option* page = cmd->add_option("--page-size", page_size,
                                      "with --kvcache: a paged cache of pages of N rows (a multiple of 16), handed "
                                      "out shuffled; 0: contiguous")
                          ->check(kAtLeastZero)
                          ->capture_default_str();
  CLI::Option* appended = cmd->add_option("--append", append,
                                          "with --kvcache: new keys appended per sequence in the call (default: "
                                          "--seqlen-q)")
                              ->check(kAtLeastZero);
  page->needs(cached), appended->needs(cached);
  // The batch and key lengths come from --kvcache, the layout is the cache's: those options would be ignored.
  for (const char* other : {"--batch", "--seqlen", "--seqlen-k", "--layout"}) cached->excludes(other);
  return cached;
}

KvCacheInputs::KvCacheInputs(const char* cmd, const ProblemArgs& pa, const std::vector<int64_t>& cached_keys,
                             int64_t page_size, int64_t append_keys)
    : dtype(parse_dtype(pa.dtype)),
      cached(cached_keys),
      batch(int64_t(cached_keys.size())),
      sq(pa.seqlen_q >= 0 ? pa.seqlen_q : 1),
      h(pa.heads),
      hk(pa.hkv()),
      d(pa.head_dim),
      append(append_keys >= 0 ? append_keys : sq),
      page(checked_page(cmd, page_size)),
      max_pages(page ? (longest_of(cached_keys) + append + page - 1) / page : 0),
      capacity(page ? max_pages * page : longest_of(cached_keys) + append),
      num_pages(batch * max_pages + (page ? 2 : 0)),  // two spare pages nobody owns
      table(size_t(batch * max_pages)),
      lens(cached_keys.begin(), cached_keys.end()) {
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(pa.seed));
  const std::array<int64_t, 4> cache_shape = page ? std::array<int64_t, 4>{num_pages, page, hk, d}
                                                  : std::array<int64_t, 4>{batch, capacity, hk, d};
  q = HostTensor::make(dtype, {batch, sq, h, d}), out = HostTensor::make(dtype, {batch, sq, h, d});
  kc = HostTensor::make(dtype, cache_shape), vc = HostTensor::make(dtype, cache_shape);
  kn = HostTensor::make(dtype, {batch, append, hk, d}), vn = HostTensor::make(dtype, {batch, append, hk, d});
  q.fill_normal(pa.seed * 7 + 1), kc.fill_normal(pa.seed * 7 + 2), vc.fill_normal(pa.seed * 7 + 3);
  kn.fill_normal(pa.seed * 7 + 4), vn.fill_normal(pa.seed * 7 + 5);
  out.poison();
  // Every row no sequence has cached starts NaN.
  std::vector<bool> filled(size_t(cache_shape[0] * cache_shape[1]), false);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < cached[size_t(b)]; ++j) filled[size_t(slot(b, j))] = true;
  const int64_t row_bytes = hk * d * int64_t(element_size(dtype));
  for (size_t r = 0; r < filled.size(); ++r)
    if (!filled[r])
      for (auto* t : {&kc, &vc}) std::fill_n(t->storage().data() + int64_t(r) * row_bytes, row_bytes, std::byte{0xFF});
}

int64_t KvCacheInputs::slot(int64_t b, int64_t j) const {
  return page ? int64_t(table[size_t(b * max_pages + j / page)]) * page + j % page : b * capacity + j;
}

KvCache KvCacheInputs::host_kv() const {
  KvCache kv;
  kv.cache_seqlens = lens.data(), kv.page_table = page ? table.data() : nullptr, kv.max_pages = max_pages;
  if (append > 0) kv.k_new = &kn.desc(), kv.v_new = &vn.desc();
  return kv;
}

double KvCacheInputs::flops(const Options& opts) const {
  double total = 0;
  for (int64_t n : cached) total += attention_flops(1, h, sq, n + append, d, opts, Pass::forward);
  return total;
}

std::string KvCacheInputs::problem_line(const Options& opts) const {
  std::string shape = fmt::format("kvcache b={} cached [", batch);
  for (size_t i = 0; i < cached.size() && i < 8; ++i) shape += fmt::format("{}{}", i ? ", " : "", cached[i]);
  shape += cached.size() > 8 ? ", ...]" : "]";
  return fmt::format("{} +{} appended, s_q={} h={}/{} d={} {} {}{}", shape, append, sq, h, hk, d, to_string(dtype),
                     page ? fmt::format("pages of {} ({} of {})", page, batch * max_pages, num_pages)
                          : fmt::format("contiguous (capacity {})", capacity),
                     opts.causal ? " causal" : "");
}

KvCacheDevice::KvCacheDevice(const KvCacheInputs& inputs)
    : in(inputs),
      q(std::make_unique<gpu::Mirror>(inputs.q)),
      kc(std::make_unique<gpu::Mirror>(inputs.kc)),
      vc(std::make_unique<gpu::Mirror>(inputs.vc)),
      kn(std::make_unique<gpu::Mirror>(inputs.kn)),
      vn(std::make_unique<gpu::Mirror>(inputs.vn)),
      out(std::make_unique<gpu::Mirror>(inputs.out)),
      lens(std::make_unique<gpu::Buffer>(std::max<size_t>(inputs.lens.size(), 1) * sizeof(int32_t))),
      table(std::make_unique<gpu::Buffer>(std::max<size_t>(inputs.table.size(), 1) * sizeof(int32_t))) {
  lens->upload(inputs.lens.data(), inputs.lens.size() * sizeof(int32_t));
  table->upload(inputs.table.data(), inputs.table.size() * sizeof(int32_t));
}

size_t KvCacheDevice::workspace_bytes(const Options& opts) const {
  return workspace_size_kvcache(q->desc(), kc->desc(), vc->desc(), kv(), opts);
}

KvCache KvCacheDevice::kv() const {
  KvCache kv = in.host_kv();
  kv.cache_seqlens = static_cast<const int32_t*>(lens->data());
  kv.page_table = in.page ? static_cast<const int32_t*>(table->data()) : nullptr;
  if (in.append > 0) kv.k_new = &kn->desc(), kv.v_new = &vn->desc();
  return kv;
}

}  // namespace fa4::cli
