// KV-cache attention (fa4.hpp, KvCache). CPU tensors: the cache layout and its metadata are validated here,
// entry by entry, with messages naming the argument and the index; then the new keys are appended in place, and
// each sequence runs as a dense batch-1 problem through the dense entry point (its validation, options and
// backends): a view of a contiguous cache, or the sequence's pages gathered into one host buffer.
// CUDA tensors: the metadata (cache_seqlens, page_table) live on the device and are trusted, as FlashAttention
// does; everything the host can see is checked (shapes, dtypes, devices, layouts, that the append fits the
// capacity, the options against q and a [batch, capacity] view of the keys), then the sm_90a path appends and
// attends, reading the pages in place (a copy kernel appends first, unless the decode kernel does: perf-log F33).
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "api/select.hpp"
#include "api/validate.hpp"
#include "fa4/fa4.hpp"

#if defined(FA4_WITH_SM90)
#include "cuda/sm90/launch.hpp"
#endif

namespace fa4 {
namespace {

using detail::fail;
using detail::invalid;

std::string str(int64_t x) { return std::to_string(x); }
std::string dims(int64_t a, int64_t b, int64_t c, int64_t d) {
  std::string s = "[";  // appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "[" + std::string
  for (int64_t x : {a, b, c}) s += str(x) + ", ";
  return s + str(d) + "]";
}

// Validated metadata: where each sequence's keys are and how many it attends to.
struct Cache {
  bool paged = false;
  int64_t batch = 0, heads_kv = 0, head_dim = 0;
  int64_t page_size = 0;  // paged: rows per page; contiguous: seqlen_cache
  int64_t capacity = 0;   // keys a sequence can hold
  int64_t seqlen_new = 0;
  std::vector<int64_t> cached, total;  // per sequence: keys before the append, keys attended to
  const int32_t* page_table = nullptr;
  int64_t max_pages = 0;

  // (page or batch index, row) of key j of sequence b.
  std::pair<int64_t, int64_t> slot(int64_t b, int64_t j) const {
    if (!paged) return {b, j};
    return {page_table[b * max_pages + j / page_size], j % page_size};
  }
};

void check_kind(const char* call, const char* arg, const Tensor& t, const Tensor& q) {
  if (t.rank != 4) invalid(call, arg, "rank 4", "rank " + str(t.rank));
  if (t.dtype != q.dtype || t.device != q.device || t.device_index != q.device_index)
    invalid(call, arg, std::string("the dtype and device of q (") + to_string(q.dtype) + " on " + to_string(q.device) + ")",
            std::string(to_string(t.dtype)) + " on " + to_string(t.device));
  for (int i = 0; i < 4; ++i)
    if (t.shape[i] < 0) invalid(call, arg, "non-negative sizes", detail::shape_string(t));
  if (t.shape[3] > 1 && t.stride[3] != 1)
    invalid(call, std::string(arg) + ".stride[3]", "1 (head_dim must be contiguous)", str(t.stride[3]));
  if (t.numel() > 0 && t.data == nullptr) invalid(call, arg, "a data pointer (it has " + str(t.numel()) + " elements)", "null");
}

// read_metadata: cache_seqlens and page_table are host memory (CPU tensors, or a CUDA call's validation copy);
// else they are device memory, trusted and not read here.
Cache describe(const char* call, const Tensor& q, const Tensor& kc, const Tensor& vc, const KvCache& kv,
               bool read_metadata) {
  const bool on_host = read_metadata;
  if (q.rank != 4) invalid(call, "q", "rank 4 [batch, seqlen_q, heads, head_dim]", "rank " + str(q.rank));
  check_kind(call, "k_cache", kc, q);
  check_kind(call, "v_cache", vc, q);
  Cache c;
  c.batch = q.shape[0], c.heads_kv = kc.shape[2], c.head_dim = q.shape[3];
  c.paged = kv.page_table != nullptr;
  const std::string layout = c.paged ? "[num_pages, page_size, heads_kv, head_dim]" : "[batch, seqlen_cache, heads_kv, head_dim]";
  if (kc.shape[3] != c.head_dim)
    invalid(call, "k_cache", "shape[3] (head_dim) = " + str(c.head_dim) + " (as 'q'), " + layout, detail::shape_string(kc));
  for (int i = 0; i < 4; ++i)
    if (vc.shape[i] != kc.shape[i]) invalid(call, "v_cache", "shape " + detail::shape_string(kc) + " (as 'k_cache')", detail::shape_string(vc));
  if (c.heads_kv == 0 || q.shape[2] % c.heads_kv != 0)
    invalid(call, "k_cache", "a number of kv heads (shape[2]) dividing the " + str(q.shape[2]) + " query heads",
            str(c.heads_kv) + " kv heads");
  if (c.paged) {
    c.page_size = kc.shape[1], c.page_table = kv.page_table, c.max_pages = kv.max_pages;
    if (c.page_size <= 0 || c.page_size % 16 != 0)
      invalid(call, "k_cache", "a page size (shape[1]) that is a positive multiple of 16, " + layout, str(c.page_size));
    if (kv.max_pages < 0) invalid(call, "kvcache.max_pages", ">= 0 (page_table's columns)", str(kv.max_pages));
    c.capacity = kv.max_pages * c.page_size;
  } else {
    if (kv.max_pages != 0)
      invalid(call, "kvcache.max_pages", "0 without a page_table (a contiguous cache)", str(kv.max_pages));
    if (kc.shape[0] != c.batch)
      invalid(call, "k_cache", "shape[0] (batch) = " + str(c.batch) + " (as 'q'), " + layout, detail::shape_string(kc));
    c.capacity = kc.shape[1];
  }
  // The new keys: both or neither, shaped as one [batch, seqlen_new] block of the cache's rows.
  if ((kv.k_new == nullptr) != (kv.v_new == nullptr))
    invalid(call, kv.k_new ? "kvcache.v_new" : "kvcache.k_new", "a tensor (k_new and v_new come together)", "null");
  if (kv.k_new) {
    check_kind(call, "kvcache.k_new", *kv.k_new, q);
    check_kind(call, "kvcache.v_new", *kv.v_new, q);
    c.seqlen_new = kv.k_new->shape[1];
    const std::string want = dims(c.batch, c.seqlen_new, c.heads_kv, c.head_dim);
    for (auto [name, t] : {std::pair{"kvcache.k_new", kv.k_new}, {"kvcache.v_new", kv.v_new}})
      if (t->shape[0] != c.batch || t->shape[1] != c.seqlen_new || t->shape[2] != c.heads_kv || t->shape[3] != c.head_dim)
        invalid(call, name, "shape " + want + " ([batch, seqlen_new, heads_kv, head_dim])", detail::shape_string(*t));
  }
  if (kv.cache_seqlens == nullptr && c.seqlen_new > 0)
    invalid(call, "kvcache.k_new", "null when cache_seqlens is null (every cache is then full: nothing fits)",
            "a tensor of " + str(c.seqlen_new) + " keys per sequence");
  if (c.seqlen_new > c.capacity)
    invalid(call, "kvcache.k_new",
            "at most " + str(c.capacity) + " keys per sequence (the capacity of a sequence's cache)",
            str(c.seqlen_new) + " keys");
  if (!on_host) return c;
  // Per sequence: how many keys are cached, that the append fits, and the pages the keys need.
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t cached = kv.cache_seqlens ? kv.cache_seqlens[b] : c.capacity;
    const std::string arg = "kvcache.cache_seqlens[" + str(b) + "]";
    if (cached < 0 || cached > c.capacity)
      invalid(call, arg, "0 .. " + str(c.capacity) + " (the keys a sequence's cache holds)", str(cached));
    if (cached + c.seqlen_new > c.capacity)
      invalid(call, arg,
              "at most " + str(c.capacity - c.seqlen_new) + " (the " + str(c.seqlen_new) + " appended keys must fit the " +
                  str(c.capacity) + " of the cache)",
              str(cached));
    c.cached.push_back(cached), c.total.push_back(cached + c.seqlen_new);
    if (!c.paged) continue;
    const int64_t pages = (c.total.back() + c.page_size - 1) / c.page_size;
    for (int64_t i = 0; i < pages; ++i) {
      const int32_t page = kv.page_table[b * kv.max_pages + i];
      if (page < 0 || page >= kc.shape[0])
        invalid(call, "kvcache.page_table[" + str(b) + "][" + str(i) + "]",
                "a page index in 0 .. " + str(kc.shape[0] - 1) + " (k_cache.shape[0] pages; sequence " + str(b) +
                    " needs " + str(pages) + " pages for its " + str(c.total.back()) + " keys)",
                str(page));
    }
  }
  // Pages may be shared for reading (a common prefix), but a slot one sequence appends to may be neither
  // appended to by another (the result would depend on the order of the writes) nor read by another as a
  // cached key (the append would overwrite it under that sequence).
  if (c.paged && c.seqlen_new > 0) {
    std::map<std::pair<int64_t, int64_t>, int64_t> writer;  // slot -> the sequence appending to it
    auto refuse = [&](int64_t b, int64_t j, const std::string& what) {
      invalid(call, "kvcache.page_table[" + str(b) + "][" + str(j / c.page_size) + "]",
              "pages whose appended rows belong to one sequence (row " + str(j % c.page_size) + " of page " +
                  str(c.slot(b, j).first) + " " + what + ")",
              str(c.slot(b, j).first));
    };
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = c.cached[size_t(b)]; j < c.total[size_t(b)]; ++j)
        if (!writer.emplace(c.slot(b, j), b).second) refuse(b, j, "is appended to by two sequences");
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.cached[size_t(b)]; ++j) {
        const auto w = writer.find(c.slot(b, j));
        if (w != writer.end())
          refuse(b, j, "is a cached key of sequence " + str(b) + " that sequence " + str(w->second) + " appends to");
      }
  }
  return c;
}

// One batch entry of a [batch, ...] tensor (rank 4, or the rank-3 lse) as a batch-1 tensor.
Tensor batch_entry(const Tensor& t, int64_t b) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + b * t.stride[0] * int64_t(element_size(t.dtype));
  r.shape[0] = 1;
  return r;
}

// The first n keys of a contiguous cache's sequence b as a [1, n, heads_kv, head_dim] view.
Tensor cache_view(const Tensor& cache, int64_t b, int64_t n) {
  Tensor r = batch_entry(cache, b);
  r.shape[1] = n;
  return r;
}

// Address of row (slot.first, slot.second, head h) of a cache, or of [b, j, h] of any [b, s, h, d] tensor.
char* row_at(const Tensor& t, std::pair<int64_t, int64_t> slot, int64_t h) {
  return static_cast<char*>(t.data) +
         (slot.first * t.stride[0] + slot.second * t.stride[1] + h * t.stride[2]) * int64_t(element_size(t.dtype));
}

// Sequence b's keys, gathered from its pages into one contiguous [1, n, heads_kv, head_dim] buffer.
Tensor gather(const Cache& c, const Tensor& cache, int64_t b, std::vector<std::byte>& buffer) {
  const int64_t n = c.total[size_t(b)], row_bytes = c.head_dim * int64_t(element_size(cache.dtype));
  buffer.resize(size_t(std::max<int64_t>(n * c.heads_kv * row_bytes, 1)));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < c.heads_kv; ++h)
      std::memcpy(buffer.data() + (j * c.heads_kv + h) * row_bytes, row_at(cache, c.slot(b, j), h), size_t(row_bytes));
  return Tensor::contiguous(buffer.data(), cache.dtype, cache.device, {1, n, c.heads_kv, c.head_dim});
}

// Every output and written tensor against every other argument, and the outputs' and lse's shapes.
void check_outputs(const char* call, const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& out,
                   const Tensor* lse, const KvCache& kv) {
  check_kind(call, "out", out, q);
  for (int i = 0; i < 4; ++i)
    if (out.shape[i] != q.shape[i]) invalid(call, "out", "shape " + detail::shape_string(q) + " (as 'q')", detail::shape_string(out));
  if (lse && (lse->rank != 3 || lse->dtype != DType::f32 || lse->device != q.device ||
              lse->device_index != q.device_index || lse->shape[0] != q.shape[0] || lse->shape[1] != q.shape[2] ||
              lse->shape[2] != q.shape[1]))
    invalid(call, "lse",
            "an f32 rank 3 [" + str(q.shape[0]) + ", " + str(q.shape[2]) + ", " + str(q.shape[1]) +
                "] ([batch, heads, seqlen_q]) on q's device",
            std::string(to_string(lse->dtype)) + " rank " + str(lse->rank) + " " + detail::shape_string(*lse) + " on " +
                to_string(lse->device) + " " + str(lse->device_index));
  if (lse && lse->numel() > 0 && lse->data == nullptr)
    invalid(call, "lse", "a data pointer (it has " + str(lse->numel()) + " elements)", "null");
  std::vector<std::pair<const char*, const Tensor*>> inputs = {{"q", &q}, {"k_cache", &kc}, {"v_cache", &vc}};
  if (kv.k_new) inputs.insert(inputs.end(), {{"kvcache.k_new", kv.k_new}, {"kvcache.v_new", kv.v_new}});
  for (const auto& [name, t] : inputs) {
    detail::check_disjoint(call, "out", out, name, *t);
    if (lse) detail::check_disjoint(call, "lse", *lse, name, *t);
  }
  detail::check_no_self_overlap(call, "out", out);
  if (lse) detail::check_no_self_overlap(call, "lse", *lse), detail::check_disjoint(call, "lse", *lse, "out", out);
  if (kv.k_new) {  // the append writes the caches: they must not meet what it reads, nor each other, nor themselves
    detail::check_disjoint(call, "v_cache", vc, "k_cache", kc);
    detail::check_no_self_overlap(call, "k_cache", kc), detail::check_no_self_overlap(call, "v_cache", vc);
    for (const auto& [cache_name, cache] : {std::pair{"k_cache", &kc}, {"v_cache", &vc}})
      for (const auto& [name, t] : {std::pair{"q", &q}, {"kvcache.k_new", kv.k_new}, {"kvcache.v_new", kv.v_new}})
        detail::check_disjoint(call, cache_name, *cache, name, *t);
  }
}

// Every sequence's dense problem is checked before anything is written, so a refused call changes nothing.
// The key descriptors only carry shapes here (supports reads no data).
void require_all(const Cache& c, const Tensor& q, const Tensor& kc, const Options& options) {
  if (c.batch == 0) {  // no sequence: the options are still checked, against an empty problem
    const Tensor keys = Tensor::contiguous(kc.data, kc.dtype, kc.device, {0, 0, c.heads_kv, c.head_dim});
    const Support none = supports(Pass::forward, q, keys, keys, options);
    if (!none.ok) throw Error(none.code, none.reason);
  }
  for (int64_t b = 0; b < c.batch; ++b) {
    const Tensor keys = Tensor::contiguous(kc.data, kc.dtype, kc.device, {1, c.total[size_t(b)], c.heads_kv, c.head_dim});
    const Support one = supports(Pass::forward, batch_entry(q, b), keys, keys, options);
    if (!one.ok) throw Error(one.code, one.reason);
  }
}

// The cache's keys as one contiguous [batch, capacity, heads_kv, head_dim] tensor on its device: the shape checks
// and the workspace size see a paged cache through it (no entry of it is read).
Tensor capacity_view(const Cache& c, const Tensor& kc) {
  Tensor keys = Tensor::contiguous(kc.data, kc.dtype, kc.device, {c.batch, c.capacity, c.heads_kv, c.head_dim});
  keys.device_index = kc.device_index;
  return keys;
}

// CUDA tensors: the problem the kernels run, validated on q against the keys as [batch, capacity, heads_kv,
// head_dim] (the contiguous cache itself; for a paged one capacity_view, and the pages' own layout).
detail::Problem device_problem(const char* call, const Cache& c, const Tensor& q, const Tensor& kc, const Tensor& vc,
                               const Options& options) {
  if (!c.paged) return detail::validate_inputs(call, q, kc, vc, options, "k_cache", "v_cache");
  // The kernels address a page by its index along shape[0]: pages must be distinct in memory, and exist.
  if (kc.shape[0] > 1 && (kc.stride[0] == 0 || vc.stride[0] == 0))
    invalid(call, kc.stride[0] == 0 ? "k_cache.stride[0]" : "v_cache.stride[0]",
            "a non-zero page stride (each page its own rows)", "0");
  if (kc.shape[0] == 0 && c.max_pages > 0)
    invalid(call, "k_cache", "at least one page (kvcache.max_pages is " + str(c.max_pages) + ")",
            detail::shape_string(kc));
  const Tensor keys = capacity_view(c, kc);
  // The view is k_cache's memory: its refusals (a misaligned base) name k_cache.
  const detail::Problem p = detail::validate_inputs(call, q, keys, keys, options, "k_cache", "k_cache");
  detail::require_layout(call, p, q, kc, vc, "k_cache", "v_cache");  // the pages as [num_pages, page_size, heads_kv, head_dim]
  return p;
}

void forward_kvcache_device(const char* call, const Cache& c, const Tensor& q, const Tensor& kc, const Tensor& vc,
                            const Tensor& out, const Tensor* lse, const KvCache& kv, const Options& options,
                            Workspace workspace, Stream stream) {
  const detail::Problem p = device_problem(call, c, q, kc, vc, options);
#if defined(FA4_WITH_SM90)
  if (detail::validate_device_metadata(options)) {  // every entry checked on a host copy, as the CPU path does
    std::vector<int32_t> lens, pages;
    KvCache host = kv;
    if (kv.cache_seqlens) {
      lens = sm90::read_device_ints(call, "kvcache.cache_seqlens", kv.cache_seqlens, c.batch, q.device_index, stream);
      host.cache_seqlens = lens.data();
    }
    if (kv.page_table) {
      pages = sm90::read_device_ints(call, "kvcache.page_table", kv.page_table, c.batch * c.max_pages, q.device_index, stream);
      host.page_table = pages.data();
    }
    describe(call, q, kc, vc, host, /*read_metadata=*/true);
  }
  detail::check_workspace(call, p, Pass::forward, workspace, stream, "workspace_size_kvcache");
  sm90::KvCacheArgs args;
  args.cache_seqlens = kv.cache_seqlens;
  args.page_table = kv.page_table;
  args.max_pages = c.max_pages;
  args.page_size = c.page_size;
  args.k_new = kv.k_new, args.v_new = kv.v_new;
  args.seqlen_new = c.seqlen_new;
  sm90::forward_kvcache(p, q, kc, vc, out, lse, args, workspace, stream);
#else
  (void)p, (void)out, (void)lse, (void)kv, (void)workspace, (void)stream;
  throw Error(Status::internal, std::string(call) + ": a CUDA backend without sm_90a kernels was selected");
#endif
}

}  // namespace

void forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out, const Tensor* lse,
                     const KvCache& kv, const Options& options, Workspace workspace, Stream stream) {
  const char* call = "fa4::forward_kvcache";
  const Cache c = describe(call, q, k_cache, v_cache, kv, q.device == Device::cpu);
  if (q.device == Device::cuda) {
    check_outputs(call, q, k_cache, v_cache, out, lse, kv);
    detail::check_sink_options(call, options, q.shape[2], q, true);
    return forward_kvcache_device(call, c, q, k_cache, v_cache, out, lse, kv, options, workspace, stream);
  }
  check_outputs(call, q, k_cache, v_cache, out, lse, kv);
  detail::check_sink_options(call, options, q.shape[2], q, true);
  require_all(c, q, k_cache, options);
  // The append: rows of k_new / v_new into the cache slots after each sequence's cached keys.
  const int64_t row_bytes = c.head_dim * int64_t(element_size(q.dtype));
  for (int64_t b = 0; kv.k_new && b < c.batch; ++b)
    for (int64_t t = 0; t < c.seqlen_new; ++t)
      for (int64_t h = 0; h < c.heads_kv; ++h) {
        const auto slot = c.slot(b, c.cached[size_t(b)] + t);
        std::memcpy(row_at(k_cache, slot, h), row_at(*kv.k_new, {b, t}, h), size_t(row_bytes));
        std::memcpy(row_at(v_cache, slot, h), row_at(*kv.v_new, {b, t}, h), size_t(row_bytes));
      }
  std::vector<std::byte> k_rows, v_rows;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = c.total[size_t(b)];
    const Tensor k = c.paged ? gather(c, k_cache, b, k_rows) : cache_view(k_cache, b, n);
    const Tensor v = c.paged ? gather(c, v_cache, b, v_rows) : cache_view(v_cache, b, n);
    const Tensor lse_b = lse ? batch_entry(*lse, b) : Tensor{};
    forward(batch_entry(q, b), k, v, batch_entry(out, b), lse ? &lse_b : nullptr, options, workspace, stream);
  }
}

std::size_t workspace_size_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const KvCache& kv,
                                   const Options& options) {
  const char* call = "fa4::workspace_size_kvcache";
  const Cache c = describe(call, q, k_cache, v_cache, kv, /*read_metadata=*/false);  // sizes only: no entry read
  detail::check_sink_options(call, options, q.shape[2], q, true);
  if (q.device == Device::cuda)
    return detail::workspace_bytes(device_problem(call, c, q, k_cache, v_cache, options), Pass::forward);
  // CPU: the options checked as each sequence's call checks them (no check there depends on a sequence's key
  // count), against capacity_view; the CPU backend keeps its scratch itself.
  const Tensor keys = capacity_view(c, k_cache);
  return detail::workspace_bytes(detail::validate_inputs(call, q, keys, keys, options), Pass::forward);
}

Support supports_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const KvCache& kv,
                         const Options& options) {
  try {
    const char* call = "fa4::supports_kvcache";
    const Cache c = describe(call, q, k_cache, v_cache, kv, q.device == Device::cpu);
    detail::check_sink_options(call, options, q.shape[2], q, true);
    if (q.device == Device::cuda)
      device_problem(call, c, q, k_cache, v_cache, options);
    else
      require_all(c, q, k_cache, options);
    return {true, Status::ok, ""};
  } catch (const Error& e) {
    return {false, e.code(), e.what()};
  }
}

}  // namespace fa4
