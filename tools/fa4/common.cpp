#include "fa4/common.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <cstdio>

#include "fa4/commands.hpp"
#include "numerics/mask.hpp"

namespace fa4::cli {

namespace {
CLI::Validator at_least(int64_t lowest) {
  return CLI::Validator(
      [lowest](std::string& text) -> std::string {
        int64_t value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size())
          return fmt::format("expected a whole number >= {}, got '{}'", lowest, text);
        if (value < lowest) return fmt::format("must be >= {}, got {}", lowest, text);
        return "";
      },
      fmt::format("INT >= {}", lowest));
}
}  // namespace

const CLI::Validator kAtLeastZero = at_least(0);
const CLI::Validator kAtLeastOne = at_least(1);
namespace {
int g_exit_code = 0;
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

void ProblemArgs::add_to(CLI::App* cmd) {
  cmd->add_option("-b,--batch", batch, "batch size")->check(kAtLeastZero)->capture_default_str();
  cmd->add_option("-s,--seqlen", seqlen, "sequence length (queries and keys)")->check(kAtLeastZero)->capture_default_str();
  cmd->add_option("--seqlen-q", seqlen_q, "query length (overrides --seqlen)")->check(kAtLeastZero);
  cmd->add_option("--seqlen-k", seqlen_k, "key length (overrides --seqlen)")->check(kAtLeastZero);
  cmd->add_option("--heads", heads, "query heads")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--heads-kv", heads_kv, "key/value heads (GQA/MQA; default: --heads)")->check(kAtLeastOne);
  cmd->add_option("-d,--head-dim", head_dim, "head dimension")->check(kAtLeastOne)->capture_default_str();
  cmd->add_option("--dtype", dtype, "f32, f16, bf16 (f64: CPU only)")->check(CLI::IsMember({"f32", "f16", "bf16", "f64"}))->capture_default_str();
  cmd->add_option("--layout", layout, "memory order of q/k/v/out: bshd, or bhsd through strides")->check(CLI::IsMember({"bshd", "bhsd"}))->capture_default_str();
  cmd->add_flag("--causal", causal, "causal mask, bottom-right aligned");
  cmd->add_option("--window", window, "sliding window: LEFT RIGHT (-1 = unbounded)")->expected(2);
  cmd->add_option("--softcap", softcap, "softcap (0 = off)")->capture_default_str();
  cmd->add_option("--scale", scale, "softmax scale (default 1/sqrt(head_dim))");
  cmd->add_option("--emulated-fraction", emulated_fraction, "share of exp2 on the FMA pipe, k/16")->capture_default_str();
  cmd->add_option("--tau", tau, "rescale threshold tau (log2 units)")->capture_default_str();
  cmd->add_option("--num-splits", num_splits, "forward split-KV: key ranges merged by their LSE (0: the backend's choice)")
      ->check(kAtLeastZero)
      ->capture_default_str();
  cmd->add_option("--seed", seed, "random seed")->capture_default_str();
}

Options ProblemArgs::options() const {
  Options o;
  o.softmax_scale = scale;
  o.causal = causal;
  if (window.size() == 2) o.window_left = window[0], o.window_right = window[1];
  o.softcap = softcap;
  o.exp2_emulated_fraction = emulated_fraction;
  o.rescale_threshold = tau;
  o.num_splits = int(std::min<int64_t>(num_splits, std::numeric_limits<int>::max()));
  return o;
}

Options backward_options(Options o) {
  o.num_splits = 0;
  return o;
}

std::string ProblemArgs::shape_string() const {
  std::string s = "b=" + std::to_string(batch) + " sq=" + std::to_string(sq()) + " sk=" + std::to_string(sk()) +
                  " h=" + std::to_string(heads) + "/" + std::to_string(hkv()) + " d=" + std::to_string(head_dim) + " " +
                  dtype + " " + layout;
  if (causal) s += " causal";
  if (window.size() == 2) s += " window(" + std::to_string(window[0]) + "," + std::to_string(window[1]) + ")";
  if (softcap > 0) s += " softcap=" + std::to_string(softcap);
  if (num_splits > 0) s += " splits=" + std::to_string(num_splits);
  return s;
}

DType parse_dtype(const std::string& n) {
  if (n == "f32") return DType::f32;
  if (n == "f16") return DType::f16;
  if (n == "bf16") return DType::bf16;
  if (n == "f64") return DType::f64;
  throw Error(Status::invalid_argument, "--dtype: expected f32, f16, bf16 or f64, got '" + n + "'");
}

testing::Layout parse_layout(const std::string& n) { return n == "bhsd" ? testing::Layout::bhsd : testing::Layout::bshd; }

double attention_flops(int64_t batch, int64_t heads, int64_t sq, int64_t sk, int64_t d, const Options& o, Pass pass) {
  const num::Mask m = num::Mask::make(sq, sk, o.causal, o.window_left, o.window_right);
  double pairs = 0;
  for (int64_t i = 0; i < sq; ++i) pairs += static_cast<double>(std::max<int64_t>(0, m.key_end(i) - m.key_begin(i)));
  const double fwd = 4.0 * static_cast<double>(batch * heads * d) * pairs;
  return pass == Pass::forward ? fwd : 2.5 * fwd;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double median_seconds(const std::function<void()>& fn, int iters) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_seconds();
    fn();
    t.push_back(now_seconds() - t0);
  }
  return median(t);
}

Progress::Progress(std::string label, int total)
    : label_(std::move(label)), total_(total), tty_(isatty(fileno(stderr)) != 0), start_(now_seconds()) {}

void Progress::step(const std::string& what) {
  ++done_;
  if (!tty_) return;
  const int width = 30;
  const int filled = total_ > 0 ? width * done_ / total_ : width;
  const double elapsed = now_seconds() - start_;
  const double eta = done_ > 0 ? elapsed / done_ * (total_ - done_) : 0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %d/%d  eta %4.0fs  %-40.40s", label_.c_str(), filled,
               "##############################", width - filled, "", done_, total_, eta, what.c_str());
  std::fflush(stderr);
}

Progress::~Progress() {
  if (tty_) std::fprintf(stderr, "\r%*s\r", 120, "");
}

}  // namespace fa4::cli
