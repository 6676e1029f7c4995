// `fa4 explain`: the online-softmax update worked step by step. One block of query rows walks across two
// K/V tiles; after each tile it prints the tile's row max, the rescale decision against tau, the running
// m (log2 units), l and O; at the end it divides by l and shows the result equals the full softmax.
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "fa4/commands.hpp"
#include "numerics/exp2.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::cli {
namespace {

struct ExplainArgs {
  int rows = 2, tile = 4, dim = 4;
  float tau = 8.0f, boost = 6.0f;
  uint64_t seed = 3;
};

void explain(const ExplainArgs& a) {
  const int n = 2 * a.tile;
  std::mt19937_64 rng(a.seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto fill = [&](int r, int c) { std::vector<float> m(r * c); for (auto& x : m) x = dist(rng); return m; };
  auto q = fill(a.rows, a.dim), k = fill(n, a.dim), v = fill(n, a.dim);
  for (int j = a.tile; j < n; ++j)  // the second tile's keys are larger, so the row max jumps there
    for (int c = 0; c < a.dim; ++c) k[j * a.dim + c] *= a.boost;
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.dim));
  const auto st = num::ScoreTransform::make(scale, 0.0f);

  fmt::print("Online softmax, one block of {} query rows across 2 K/V tiles of {} keys (d = {}, scale = 1/sqrt(d),\n"
             "tau = {} in log2 units). Scores are kept as x = s * log2(e); P = exp2(x - m) against the row's\n"
             "reference max m, which moves only when a tile's max exceeds it by more than tau.\n",
             a.rows, a.tile, a.dim, a.tau);
  std::vector<float> m(a.rows, -INFINITY), l(a.rows, 0.0f), o(a.rows * a.dim, 0.0f);
  for (int t = 0; t < 2; ++t) {
    fmt::print("\n-- tile {} (keys {}..{}) --\n", t, t * a.tile, t * a.tile + a.tile - 1);
    for (int r = 0; r < a.rows; ++r) {
      std::vector<float> x(a.tile);
      float bm = -INFINITY;
      for (int j = 0; j < a.tile; ++j) {
        float dot = 0;
        for (int c = 0; c < a.dim; ++c) dot += q[r * a.dim + c] * k[(t * a.tile + j) * a.dim + c];
        x[j] = st(dot);
        bm = std::max(bm, x[j]);
      }
      const num::RowMaxUpdate u = num::update_row_max(m[r], bm, a.tau);
      std::string decision;
      if (m[r] == -INFINITY)
        decision = fmt::format("first tile: m = tile max {:.3f}", bm);
      else if (u.rescaled)
        decision = fmt::format("max grew by {:.3f} > tau: RESCALE O and l by 2^{:.3f} = {:.4g}, m -> {:.3f}", bm - m[r],
                               u.log2_scale, num::exp2_accurate(u.log2_scale), u.m);
      else
        decision = fmt::format("max grew by {:.3f} <= tau: keep the stale m = {:.3f} (no rescale; P up to 2^{:.3f})",
                               std::max(0.0f, bm - m[r]), m[r], std::max(0.0f, bm - m[r]));
      if (u.rescaled) {
        const float f = num::exp2_accurate(u.log2_scale);
        l[r] *= f;
        for (int c = 0; c < a.dim; ++c) o[r * a.dim + c] *= f;
      }
      m[r] = u.m;
      std::string ps;
      for (int j = 0; j < a.tile; ++j) {
        const float p = num::exp2_accurate(x[j] - num::safe_max(m[r]));
        ps += fmt::format("{:.4g} ", p);
        l[r] += p;
        for (int c = 0; c < a.dim; ++c) o[r * a.dim + c] += p * v[(t * a.tile + j) * a.dim + c];
      }
      std::string os;
      for (int c = 0; c < a.dim; ++c) os += fmt::format("{:+.4f} ", o[r * a.dim + c]);
      fmt::print("row {}: x max {:.3f}; {}\n       P = [ {}]\n       m = {:.3f}  l = {:.5g}  O (unnormalised) = [ {}]\n",
                 r, bm, decision, ps, m[r], l[r], os);
    }
  }
  fmt::print("\n-- finish: O / l, LSE = (m + log2 l) * ln 2; against the full softmax (fp64) --\n");
  double worst = 0;
  for (int r = 0; r < a.rows; ++r) {
    const num::RowFinal fin = num::finalize_row(m[r], l[r]);
    std::vector<double> s(n);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; ++j) {
      double dot = 0;
      for (int c = 0; c < a.dim; ++c) dot += static_cast<double>(q[r * a.dim + c]) * k[j * a.dim + c];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    for (int j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    std::string ours, full;
    for (int c = 0; c < a.dim; ++c) {
      double ref = 0;
      for (int j = 0; j < n; ++j) ref += s[j] / sum * v[j * a.dim + c];
      const double mine = o[r * a.dim + c] * fin.inv_l;
      worst = std::max(worst, std::fabs(mine - ref));
      ours += fmt::format("{:+.6f} ", mine);
      full += fmt::format("{:+.6f} ", ref);
    }
    fmt::print("row {}: online  O = [ {}]  LSE = {:.6f}\n       full    O = [ {}]  LSE = {:.6f}\n", r, ours, fin.lse, full,
               mx + std::log(sum));
  }
  fmt::print("\nmax |online - full| = {:.2e}: {}\n", worst,
             worst < 1e-5 ? "equal up to fp32 rounding (the stale max cancels in O / l)" : "MISMATCH");
  if (worst >= 1e-5) set_exit_code(1);
}

}  // namespace

void add_explain_command(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand("explain", "walk the online-softmax update across two K/V tiles, step by step");
  cmd->add_option("--rows", a->rows, "query rows")->check(CLI::Range(1, 8))->capture_default_str();
  cmd->add_option("--tile", a->tile, "keys per tile")->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--dim", a->dim, "head dim")->check(CLI::Range(1, 16))->capture_default_str();
  cmd->add_option("--tau", a->tau, "rescale threshold (log2 units)")->check(CLI::Range(0.0, 15.0))->capture_default_str();
  cmd->add_option("--boost", a->boost, "factor on the second tile's keys (makes the max jump)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "random seed")->capture_default_str();
  cmd->callback([a] { explain(*a); });
}

}  // namespace fa4::cli
