// `fa4 check`: a self-test matrix on every available backend against the fp64 reference with
// FlashAttention's tolerance rule; a PASS/FAIL table and a non-zero exit on any failure.
#include <fmt/format.h>

#include "api/device_info.hpp"
#include "fa4/commands.hpp"
#include "fa4/common.hpp"
#include "fa4/gpu.hpp"
#include "testing/tolerance.hpp"

namespace fa4::cli {
namespace {

std::vector<testing::CaseSpec> check_matrix(bool quick) {
  std::vector<testing::CaseSpec> cases;
  struct Shape { int64_t sq, sk; };
  const std::vector<Shape> shapes = quick ? std::vector<Shape>{{1, 1}, {113, 203}, {239, 1}}
                                          : std::vector<Shape>{{1, 1}, {17, 17}, {113, 203}, {239, 1}, {799, 3}, {257, 512}};
  const std::vector<std::pair<int64_t, int64_t>> heads = {{4, 4}, {4, 2}, {4, 1}};  // MHA, GQA, MQA
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& s : shapes) {
      for (int mask = 0; mask < 3; ++mask) {  // none, causal, window
        testing::CaseSpec c;
        c.dtype = dt;
        c.batch = 2;
        c.seqlen_q = s.sq, c.seqlen_k = s.sk;
        c.heads_q = heads[seed % 3].first, c.heads_kv = heads[seed % 3].second;
        c.head_dim = seed % 2 ? 64 : 128;
        c.options.causal = mask == 1;
        if (mask == 2) c.options.window_left = 32, c.options.window_right = 7;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  // The features one at a time.
  testing::CaseSpec base;
  base.dtype = DType::bf16, base.batch = 2, base.seqlen_q = 200, base.seqlen_k = 300, base.heads_q = 4, base.heads_kv = 2, base.head_dim = 96;
  auto with = [&](auto&& f) { testing::CaseSpec c = base; c.seed = seed++; f(c); cases.push_back(c); };
  with([](auto& c) { c.options.softcap = 15.0f; });
  with([](auto& c) { c.options.exp2_emulated_fraction = 0.25f; });
  with([](auto& c) { c.options.rescale_threshold = 0.0f; });
  with([](auto& c) { c.layout = testing::Layout::bhsd; c.options.causal = true; });
  with([](auto& c) { c.broadcast_kv = true; });
  with([](auto& c) { c.head_dim = 256; c.dtype = DType::f16; });
  with([](auto& c) { c.seqlen_k = 0; });
  // Decode (one query, a GQA group, d = 128): on a GPU the decode kernel's call (short key ranges).
  with([](auto& c) { c.seqlen_q = 1, c.seqlen_k = 1000, c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128; });
  with([](auto& c) { c.dtype = DType::f64; c.head_dim = 32; });
  return cases;
}

void check(bool quick) {
  const auto cases = check_matrix(quick);
  fmt::print("fa4 check: {} cases per backend, fp64 reference, FlashAttention's tolerance rule\n", cases.size());
  std::vector<testing::Executor*> backends{nullptr};  // nullptr: the CPU backend
  gpu::Executor cuda;
  const std::string no_gpu = gpu::unavailable_reason();
  if (no_gpu.empty())
    backends.push_back(&cuda);
  else
    fmt::print("backend cuda: SKIPPED ({})\n", no_gpu);
  fmt::print("\n{:<8} {:<58} {:<6} {}\n", "backend", "case", "result", "worst margin (max_err / bound)");
  int failed = 0, passed = 0, skipped = 0;
  Progress progress("check", static_cast<int>(cases.size() * backends.size()));
  for (testing::Executor* backend : backends) {
    const char* name = backend ? backend->name() : "cpu";
    for (const auto& c : cases) {
      progress.step(c.name());
      testing::CaseResult r;
      try {
        r = testing::run_case(c, backend);
      } catch (const Error& e) {
        if (e.code() != Status::unsupported) throw;
        fmt::print("{:<8} {:<58} {:<6} {}\n", name, c.name(), "SKIP", e.what());  // not counted as a pass
        ++skipped;
        continue;
      }
      double margin = 0;
      for (const auto* cmp : {&r.out, &r.lse, &r.dq, &r.dk, &r.dv})
        if (cmp->bound > 0) margin = std::max(margin, cmp->max_error / cmp->bound);
      // The GPU executor checks the forward alone where fa4::supports refuses the backward there; it says why.
      const std::string no_bwd = backend == &cuda ? cuda.backward_skipped() : "";
      const bool bwd = c.backward && (!backend || backend->has_backward()) && no_bwd.empty();
      fmt::print("{:<8} {:<58} {:<6} {:.3f}{}{}\n", name, c.name() + (bwd ? " fwd+bwd" : " fwd"), r.pass ? "PASS" : "FAIL",
                 margin, r.pass ? "" : "  " + r.failure, no_bwd.empty() ? "" : "  (backward: " + no_bwd + ")");
      (r.pass ? passed : failed) += 1;
    }
  }
  fmt::print("\n{} passed, {} failed, {} skipped (unsupported on that backend)\n", passed, failed, skipped);
  if (failed) set_exit_code(1);
}

}  // namespace

void add_check_command(CLI::App& app) {
  auto quick = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("check", "self-test every available backend against the fp64 reference");
  cmd->add_flag("--quick", *quick, "a smaller matrix");
  cmd->callback([quick] { check(*quick); });
}

}  // namespace fa4::cli
