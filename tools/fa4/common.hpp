// Pieces the subcommands share: problem options, dtype names, FLOP counts, timing, a progress bar.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fa4/fa4.hpp"
#include "testing/tensors.hpp"

namespace fa4::cli {

// Whole-number option checks whose errors say what is allowed and name what was given (CLI11's
// NonNegativeNumber / PositiveNumber print a 300-digit upper bound instead).
extern const CLI::Validator kAtLeastZero;  // an integer >= 0
extern const CLI::Validator kAtLeastOne;   // an integer >= 1

struct ProblemArgs {
  int64_t batch = 1, seqlen = 1024, seqlen_q = -1, seqlen_k = -1, heads = 8, heads_kv = -1, head_dim = 64;
  std::string dtype = "bf16";
  std::string layout = "bshd";
  bool causal = false;
  std::vector<int64_t> window;  // left, right
  float softcap = 0.0f, emulated_fraction = 0.0f, tau = 8.0f;
  std::optional<float> scale;
  int64_t num_splits = 0;  // split-KV key ranges of the forward (0: the backend's choice)
  uint64_t seed = 1;

  void add_to(CLI::App* cmd);
  int64_t sq() const { return seqlen_q >= 0 ? seqlen_q : seqlen; }
  int64_t sk() const { return seqlen_k >= 0 ? seqlen_k : seqlen; }
  int64_t hkv() const { return heads_kv > 0 ? heads_kv : heads; }
  Options options() const;
  std::string shape_string() const;
};

// The backward's options: the forward's without num_splits (a forward-only option: the gradient is the unsplit
// one, and the backward refuses n > 1).
Options backward_options(Options o);

DType parse_dtype(const std::string& name);
testing::Layout parse_layout(const std::string& name);

// 4 * d * (visible query-key pairs) per (batch, head): exact for any mask (causal ~ half); backward 2.5x.
double attention_flops(int64_t batch, int64_t heads, int64_t sq, int64_t sk, int64_t d, const Options& o, Pass pass);

double now_seconds();
double median(std::vector<double> v);
// Median wall-clock seconds of `fn` over `iters` runs, after one warm-up run (host backends).
double median_seconds(const std::function<void()>& fn, int iters);

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  Progress(std::string label, int total);
  void step(const std::string& what);
  ~Progress();

 private:
  std::string label_;
  int total_, done_ = 0;
  bool tty_;
  double start_;
};

}  // namespace fa4::cli
