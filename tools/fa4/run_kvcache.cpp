// `fa4 run --kvcache L1,L2,... [--page-size P] [--append N] [--seqlen-q Q]`: one KV-cache call
// (fa4::forward_kvcache, FlashAttention's flash_attn_with_kvcache) on random inputs. Sequence b has L_b keys
// cached and N appended in the call (default: its Q queries); the cache holds max(L) + N keys per sequence,
// contiguous or in pages of P rows handed out in a shuffled order, and every slot no sequence has filled is NaN
// (it must not reach any output). Runs on the GPU when it can (the metadata uploaded as an engine's are), else on
// the CPU; timed (each timed call appends the same keys at the same slots again); sampled rows of O checked
// against the fp64 reference over each sequence's keys.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "api/device_info.hpp"
#include "api/validate.hpp"
#include "cpu/reference.hpp"
#include "fa4/fa4.hpp"
#include "fa4/gpu.hpp"
#include "fa4/run_common.hpp"

namespace fa4::cli {

using testing::HostTensor;

void run_kvcache(const RunArgs& a) {
  const ProblemArgs& pa = a.problem;
  const char* cmd = "fa4 run";
  if (a.pass == "bwd" || a.pass == "both")
    throw Error(Status::unsupported, std::string(cmd) + ": --pass: expected fwd or auto with --kvcache (a KV-cache "
                                                        "call has no backward), got " + a.pass);
  const DType dtype = parse_dtype(pa.dtype);
  const Options opts = pa.options();
  const std::vector<int64_t>& cached = a.kvcache;
  const int64_t batch = int64_t(cached.size()), h = pa.heads, hk = pa.hkv(), d = pa.head_dim;
  const int64_t sq = pa.seqlen_q >= 0 ? pa.seqlen_q : 1, append = a.append >= 0 ? a.append : sq;
  const int64_t page = a.page_size;
  if (page % 16 != 0)
    throw Error(Status::invalid_argument,
                fmt::format("{}: --page-size: expected a multiple of 16 (0: a contiguous cache), got {}", cmd, page));
  const int64_t longest = cached.empty() ? 0 : *std::max_element(cached.begin(), cached.end());
  const int64_t max_pages = page ? (longest + append + page - 1) / page : 0;
  const int64_t capacity = page ? max_pages * page : longest + append;
  const int64_t num_pages = batch * max_pages + (page ? 2 : 0);  // two spare pages nobody owns
  std::vector<int32_t> table(size_t(batch * max_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(pa.seed));
  const std::array<int64_t, 4> cache_shape = page ? std::array<int64_t, 4>{num_pages, page, hk, d}
                                                  : std::array<int64_t, 4>{batch, capacity, hk, d};
  auto q = HostTensor::make(dtype, {batch, sq, h, d}), out = HostTensor::make(dtype, {batch, sq, h, d});
  auto kc = HostTensor::make(dtype, cache_shape), vc = HostTensor::make(dtype, cache_shape);
  auto kn = HostTensor::make(dtype, {batch, append, hk, d}), vn = HostTensor::make(dtype, {batch, append, hk, d});
  q.fill_normal(pa.seed * 7 + 1), kc.fill_normal(pa.seed * 7 + 2), vc.fill_normal(pa.seed * 7 + 3);
  kn.fill_normal(pa.seed * 7 + 4), vn.fill_normal(pa.seed * 7 + 5);
  out.poison();
  // Cache row of key j of sequence b; every row no sequence has cached starts NaN.
  auto slot = [&](int64_t b, int64_t j) {
    return page ? int64_t(table[size_t(b * max_pages + j / page)]) * page + j % page : b * capacity + j;
  };
  std::vector<bool> filled(size_t(cache_shape[0] * cache_shape[1]), false);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < cached[size_t(b)]; ++j) filled[size_t(slot(b, j))] = true;
  const int64_t row_bytes = hk * d * int64_t(element_size(dtype));
  for (size_t r = 0; r < filled.size(); ++r)
    if (!filled[r])
      for (auto* t : {&kc, &vc}) std::fill_n(t->storage().data() + int64_t(r) * row_bytes, row_bytes, std::byte{0xFF});
  std::vector<int32_t> lens(cached.begin(), cached.end());
  KvCache kv;
  kv.cache_seqlens = lens.data(), kv.page_table = page ? table.data() : nullptr, kv.max_pages = max_pages;
  if (append > 0) kv.k_new = &kn.desc(), kv.v_new = &vn.desc();

  std::string why = a.backend == "cpu" ? "requested" : gpu::unavailable_reason();
  std::unique_ptr<gpu::Mirror> gq, gkc, gvc, gkn, gvn, gout;
  std::unique_ptr<gpu::Buffer> glens, gtable;
  KvCache gkv = kv;
  bool cuda = false;
  if (a.backend != "cpu" && why.empty()) {
    gq = std::make_unique<gpu::Mirror>(q), gkc = std::make_unique<gpu::Mirror>(kc), gvc = std::make_unique<gpu::Mirror>(vc);
    gkn = std::make_unique<gpu::Mirror>(kn), gvn = std::make_unique<gpu::Mirror>(vn);
    glens = std::make_unique<gpu::Buffer>(std::max<size_t>(lens.size(), 1) * sizeof(int32_t));
    glens->upload(lens.data(), lens.size() * sizeof(int32_t));
    gtable = std::make_unique<gpu::Buffer>(std::max<size_t>(table.size(), 1) * sizeof(int32_t));
    gtable->upload(table.data(), table.size() * sizeof(int32_t));
    gkv.cache_seqlens = static_cast<const int32_t*>(glens->data());
    gkv.page_table = page ? static_cast<const int32_t*>(gtable->data()) : nullptr;
    if (append > 0) gkv.k_new = &gkn->desc(), gkv.v_new = &gvn->desc();
    const Support s = supports_kvcache(gq->desc(), gkc->desc(), gvc->desc(), gkv, opts);
    if (s.ok)
      cuda = true, why = detail::cuda_devices()[0].name;
    else
      why = s.reason;
  }
  if (a.backend == "cuda" && !cuda) throw Error(Status::unsupported, std::string(cmd) + ": --backend cuda: " + why);
  if (!cuda) {
    const Support s = supports_kvcache(q.desc(), kc.desc(), vc.desc(), kv, opts);
    if (!s.ok) throw Error(s.code, s.reason);
  }
  fmt::print("backend   {} ({})\n", cuda ? "cuda" : "cpu", why.empty() ? "no GPU" : why);
  std::string shape = fmt::format("kvcache b={} cached [", batch);
  for (size_t i = 0; i < cached.size() && i < 8; ++i) shape += fmt::format("{}{}", i ? ", " : "", cached[i]);
  shape += cached.size() > 8 ? ", ...]" : "]";
  fmt::print("problem   {} +{} appended, s_q={} h={}/{} d={} {} {}{}\n", shape, append, sq, h, hk, d, to_string(dtype),
             page ? fmt::format("pages of {} ({} of {})", page, batch * max_pages, num_pages)
                  : fmt::format("contiguous (capacity {})", capacity),
             opts.causal ? " causal" : "");

  double flops = 0;
  for (int64_t n : cached) flops += attention_flops(1, h, sq, n + append, d, opts, Pass::forward);
  double sec = 0;
  if (cuda) {
    gout = std::make_unique<gpu::Mirror>(out);
    sec = gpu::median_ms([&] {
      forward_kvcache(gq->desc(), gkc->desc(), gvc->desc(), gout->desc(), nullptr, gkv, opts);
    }, a.iters) * 1e-3;
    gout->copy_to(out), gkc->copy_to(kc), gvc->copy_to(vc);
    // Host time per call (issue 12): the append, the forward and (split) the combine launched, no workspace given
    // (split partials in stream-ordered memory). Repeating the call appends the same keys at the same slots.
    if (a.host_cost_calls > 0)
      fmt::print("host      forward_kvcache {:8.2f} us per call ({} calls, not synchronized in between)\n",
                 gpu::host_us_per_call([&] {
                   forward_kvcache(gq->desc(), gkc->desc(), gvc->desc(), gout->desc(), nullptr, gkv, opts);
                 }, a.host_cost_calls),
                 a.host_cost_calls);
  } else {
    if (a.host_cost_calls > 0) fmt::print("host      not measured: on the CPU backend the call is the computation\n");
    sec = median_seconds([&] { forward_kvcache(q.desc(), kc.desc(), vc.desc(), out.desc(), nullptr, kv, opts); },
                         a.iters);
  }
  print_timing("forward", sec, flops, a.iters);

  if (a.check_rows <= 0 || batch == 0 || h == 0 || sq == 0) {
    fmt::print("check     skipped\n");
    return;
  }
  // Sampled rows against the fp64 reference over the sequence's keys, gathered from the cache after the append.
  std::mt19937_64 rng(pa.seed);
  const double tol = row_tolerance(dtype);
  double worst = 0;
  bool finite = true;
  std::vector<double> ref(size_t(d), 0.0);
  for (int r = 0; r < a.check_rows; ++r) {
    const int64_t b = r == 0 ? batch - 1 : int64_t(rng() % uint64_t(batch)), n = cached[size_t(b)] + append;
    const int64_t hh = int64_t(rng() % uint64_t(h)), i = r == 0 ? sq - 1 : int64_t(rng() % uint64_t(sq));
    auto kb = HostTensor::make(dtype, {1, std::max<int64_t>(n, 1), hk, d});
    auto vb = HostTensor::make(dtype, {1, std::max<int64_t>(n, 1), hk, d});
    for (int64_t j = 0; j < n; ++j) {
      std::copy_n(kc.storage().data() + slot(b, j) * row_bytes, row_bytes, kb.storage().data() + j * row_bytes);
      std::copy_n(vc.storage().data() + slot(b, j) * row_bytes, row_bytes, vb.storage().data() + j * row_bytes);
    }
    Tensor qs = q.desc(), ks = kb.desc(), vs = vb.desc();
    qs.data = q.storage().data() + b * sq * h * d * int64_t(element_size(dtype)), qs.shape[0] = 1;
    ks.shape[1] = vs.shape[1] = n;
    Options ref_opts = opts;
    ref_opts.num_splits = 0;
    const detail::Problem prob = detail::validate_inputs("fa4 run (reference)", qs, ks, vs, ref_opts);
    cpu::reference_forward_row(prob, qs, ks, vs, 0, hh, i, ref.data());
    worst = std::max(worst, row_error(out, b, i, hh, ref, finite));
  }
  print_check(finite && worst <= tol, fmt::format("O {:.2e} ({} sampled rows)", worst, a.check_rows), tol, finite);
}

}  // namespace fa4::cli
