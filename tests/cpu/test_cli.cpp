// The `fa4` command line: exit codes and messages of each subcommand (runs the built binary).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr
};

Result fa4(const std::string& args) {
  const std::string cmd = std::string(FA4_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool has(const Result& r, const char* text) { return r.output.find(text) != std::string::npos; }

}  // namespace

TEST(Cli, RunPrintsACheckedResult) {
  const Result r = fa4("run -s 200 --heads 2 -d 64 --iters 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "backend   cpu") || has(r, "backend   cuda")) << r.output;  // the GPU where it can run
  EXPECT_TRUE(has(r, "TFLOP/s")) << r.output;
  EXPECT_TRUE(has(r, "check     PASS")) << r.output;
}

TEST(Cli, RunWithGqaCausalStridedLayout) {
  const Result r = fa4("run --seqlen-q 77 --seqlen-k 130 --heads 4 --heads-kv 2 --causal --layout bhsd --dtype f16 --iters 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "PASS")) << r.output;
}

// A variable-length batch (empty and one-token sequences included), forward and backward, checked per sequence;
// the dense batch/length/layout options cannot be combined with it (they would be ignored).
TEST(Cli, RunVarlenChecksEverySequenceKind) {
  const Result r = fa4("run --varlen 17,0,40,1 --heads 4 --heads-kv 2 -d 32 --causal --pass both --iters 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "problem   varlen b=4 total=58 lens [17, 0, 40, 1] h=4/2 d=32 bf16 causal")) << r.output;
  EXPECT_TRUE(has(r, "backward")) << r.output;
  EXPECT_TRUE(has(r, "check     PASS")) << r.output;
  const Result both = fa4("run --varlen 17,5 -s 100");
  EXPECT_NE(both.code, 0);
  EXPECT_TRUE(has(both, "--seqlen excludes --varlen")) << both.output;
  const Result negative = fa4("run --varlen 17,-5");
  EXPECT_NE(negative.code, 0);
  EXPECT_TRUE(has(negative, "--varlen: must be >= 0, got -5")) << negative.output;
}

// A KV-cache call: a shuffled paged cache with NaN in every unfilled slot, new keys appended; checked rows.
TEST(Cli, RunKvCacheChecksPagedAndContiguous) {
  const Result paged = fa4("run --kvcache 0,1,40 --page-size 16 --heads 4 --heads-kv 2 -d 32 --causal --iters 1");
  EXPECT_EQ(paged.code, 0) << paged.output;
  EXPECT_TRUE(has(paged, "problem   kvcache b=3 cached [0, 1, 40] +1 appended, s_q=1 h=4/2 d=32 bf16 pages of 16")) << paged.output;
  EXPECT_TRUE(has(paged, "check     PASS")) << paged.output;
  const Result chunk = fa4("run --kvcache 5,30 --seqlen-q 6 --append 2 --heads 2 -d 32 --iters 1");
  EXPECT_EQ(chunk.code, 0) << chunk.output;
  EXPECT_TRUE(has(chunk, "+2 appended, s_q=6 h=2/2 d=32 bf16 contiguous (capacity 32)")) << chunk.output;
  EXPECT_TRUE(has(chunk, "check     PASS")) << chunk.output;
  const Result odd = fa4("run --kvcache 5 --page-size 20");
  EXPECT_NE(odd.code, 0);
  EXPECT_TRUE(has(odd, "--page-size: expected a multiple of 16 (0: a contiguous cache), got 20")) << odd.output;
  const Result alone = fa4("run --page-size 16");
  EXPECT_NE(alone.code, 0);
  EXPECT_TRUE(has(alone, "--page-size requires --kvcache")) << alone.output;
  const Result bwd = fa4("run --kvcache 5 --pass bwd");
  EXPECT_NE(bwd.code, 0);
  EXPECT_TRUE(has(bwd, "a KV-cache call has no backward")) << bwd.output;
}

// --host-cost times the GPU backend's launch path; on the CPU backend it says why there is nothing to time.
TEST(Cli, RunHostCostSaysWhatItMeasures) {
  const Result r = fa4("run -s 64 --heads 2 --iters 1 --host-cost 20");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "host      forward") || has(r, "host      not measured: on the CPU backend")) << r.output;
  // The KV-cache call too (it was accepted and ignored there).
  const Result kv = fa4("run --kvcache 3,40 --page-size 16 --heads 4 --heads-kv 2 -d 64 --iters 1 --host-cost 10");
  EXPECT_EQ(kv.code, 0) << kv.output;
  EXPECT_TRUE(has(kv, "host      forward_kvcache") || has(kv, "host      not measured: on the CPU backend")) << kv.output;
}

TEST(Cli, BadOptionValueExitsNonZeroNamingIt) {
  const Result r = fa4("run --dtype f32 --emulated-fraction 0.25 -s 16 --iters 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "options.exp2_emulated_fraction")) << r.output;
  const Result w = fa4("run --window -5 0 -s 16");
  EXPECT_EQ(w.code, 2) << w.output;
  EXPECT_TRUE(has(w, "options.window_left")) << w.output;
  const Result parse = fa4("run --dtype f8");
  EXPECT_NE(parse.code, 0);
  EXPECT_TRUE(has(parse, "--dtype")) << parse.output;
  const Result none = fa4("");
  EXPECT_NE(none.code, 0);
}

TEST(Cli, CudaBackendIsRefusedClearly) {  // f32 has no GPU kernel in any build
  const Result r = fa4("run --backend cuda --dtype f32 -s 16");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "cuda")) << r.output;
}

TEST(Cli, CheckQuickPasses) {
  const Result r = fa4("check --quick");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "passed")) << r.output;
  EXPECT_FALSE(has(r, "FAIL")) << r.output;
}

TEST(Cli, BenchWritesJson) {
  const std::string path = ::testing::TempDir() + "fa4_bench_test.json";
  const Result r = fa4("bench --seqlen 64 --head-dim 32 --heads 2 --dtype bf16 --iters 1 --commit abc --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  EXPECT_EQ(doc["commit"], "abc");
  ASSERT_EQ(doc["rows"].size(), 2u);  // fwd and bwd
  EXPECT_GT(doc["rows"][0]["tflops"].get<double>(), 0.0);
  EXPECT_EQ(doc["rows"][1]["pass"], "bwd");
}

// Decode shapes: one query against each --seqlen of keys, GQA, forced splits: a "decode" row with the K/V
// bytes streamed per second (issue 12's schema), and the backward of the same shape unsplit.
TEST(Cli, BenchWritesDecodeRows) {
  const std::string path = ::testing::TempDir() + "fa4_bench_decode.json";
  const Result r = fa4("bench --seqlen 256 --seqlen-q 1 --head-dim 32 --heads 4 --heads-kv 2 --num-splits 2 --dtype bf16 "
                       "--iters 1 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(doc["rows"].size(), 2u);
  const auto& d = doc["rows"][0];
  EXPECT_EQ(d["pass"], "decode");
  EXPECT_EQ(d["seqlen_k"], 256);
  EXPECT_EQ(d["heads_kv"], 2);
  EXPECT_EQ(d["num_splits"], 2);
  EXPECT_EQ(d["page_size"], 0);
  EXPECT_GT(d["gbps"].get<double>(), 0.0);
  EXPECT_NEAR(d["us"].get<double>(), 1e3 * d["ms"].get<double>(), 1e-6);
  EXPECT_EQ(doc["rows"][1]["pass"], "bwd");
  EXPECT_TRUE(has(fa4("bench --seqlen-q 0"), "--seqlen-q: must be >= 1, got 0"));
}

// The forward's softmax policy swept (issue 11's ablation): one row per (exp2 share, tau), each recording its
// policy; a share that is not k/16 is the library's error, naming the option.
TEST(Cli, BenchSweepsTheSoftmaxPolicy) {
  const std::string path = ::testing::TempDir() + "fa4_bench_policy.json";
  const Result r = fa4("bench --pass fwd --seqlen 64 --head-dim 32 --heads 2 --dtype bf16 --iters 1 "
                       "--emulated-fraction 0 0.25 --tau 0 8 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(doc["rows"].size(), 4u);
  EXPECT_EQ(doc["rows"][1]["exp2_emulated_fraction"], 0.0);
  EXPECT_EQ(doc["rows"][1]["rescale_threshold"], 8.0);
  EXPECT_EQ(doc["rows"][2]["exp2_emulated_fraction"], 0.25);
  EXPECT_EQ(doc["rows"][2]["rescale_threshold"], 0.0);
  EXPECT_TRUE(has(r, "emu=0.25 tau=8")) << r.output;
  const Result bad = fa4("bench --pass fwd --seqlen 64 --head-dim 32 --dtype bf16 --iters 1 --emulated-fraction 0.3");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(has(bad, "exp2_emulated_fraction")) << bad.output;
  EXPECT_TRUE(has(fa4("bench --varlen 10,20 --tau 0"), "--varlen excludes --tau"));
}

// One variable-length batch (lengths 0 and 1 among them, GQA, causal): "fwd-varlen" / "bwd-varlen" rows with the
// lengths and the tokens; the dense sweep's shape options are refused beside it, not ignored.
TEST(Cli, BenchWritesVarlenRows) {
  const std::string path = ::testing::TempDir() + "fa4_bench_varlen.json";
  const Result r = fa4("bench --varlen 70,0,1,33 --head-dim 32 --heads 4 --heads-kv 2 --mask causal --dtype bf16 "
                       "--iters 1 --json " + path);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto doc = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(doc["rows"].size(), 2u);
  const auto& f = doc["rows"][0];
  EXPECT_EQ(f["pass"], "fwd-varlen");
  EXPECT_EQ(f["lens"], "70,0,1,33");
  EXPECT_EQ(f["tokens"], 104);
  EXPECT_EQ(f["n_seqs"], 4);
  EXPECT_EQ(f["min_len"], 0);
  EXPECT_EQ(f["max_len"], 70);
  EXPECT_EQ(f["mean_len"], 26);
  EXPECT_EQ(f["batch"], 4);
  EXPECT_EQ(f["heads_kv"], 2);
  EXPECT_TRUE(f["causal"].get<bool>());
  EXPECT_GT(f["tflops"].get<double>(), 0.0);
  EXPECT_EQ(doc["rows"][1]["pass"], "bwd-varlen");
  EXPECT_TRUE(has(fa4("bench --varlen 10,20 --seqlen 64"), "--seqlen excludes --varlen"));
}

TEST(Cli, InfoAndExplain) {
  const Result i = fa4("info");
  EXPECT_EQ(i.code, 0);
  EXPECT_TRUE(has(i, "fa4 0.")) << i.output;
  const Result e = fa4("explain");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_TRUE(has(e, "RESCALE")) << e.output;
  EXPECT_TRUE(has(e, "keep the stale m")) << e.output;
  EXPECT_TRUE(has(e, "equal up to fp32 rounding")) << e.output;
}

// `fa4 trace` records only on a GPU with a trace build; anywhere else it says which of the two is missing and
// exits non-zero, never writing an empty trace.
TEST(Cli, TraceSaysWhatItNeeds) {
  const std::string dir = ::testing::TempDir() + "fa4-trace-cli";
  const Result r = fa4("trace -s 128 --heads 2 -d 64 --out " + dir);
  if (r.code == 0) GTEST_SKIP() << "a GPU trace build recorded a trace here: " << r.output;
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r, "needs a GPU") || has(r, "no CUDA backend") || has(r, "-DFA4_TRACE=ON")) << r.output;
  EXPECT_FALSE(std::ifstream(dir + "/trace.json").good()) << "a failed trace wrote output";
  // A KV-cache call (paged) likewise; its options as fa4 run's, refused where they would be ignored.
  const Result kv = fa4("trace --kvcache 64,10 --page-size 16 --heads 4 --heads-kv 2 -d 64 --out " + dir);
  if (kv.code == 0) GTEST_SKIP() << "a GPU trace build recorded a trace here: " << kv.output;
  EXPECT_EQ(kv.code, 2) << kv.output;
  EXPECT_TRUE(has(kv, "needs a GPU") || has(kv, "no CUDA backend") || has(kv, "-DFA4_TRACE=ON")) << kv.output;
  const Result alone = fa4("trace --page-size 16");
  EXPECT_NE(alone.code, 0);
  EXPECT_TRUE(has(alone, "--page-size requires --kvcache")) << alone.output;
  const Result both = fa4("trace --kvcache 5 --seqlen-k 9");
  EXPECT_NE(both.code, 0);
  EXPECT_TRUE(has(both, "excludes")) << both.output;
}

// A decode shape with forced split-KV ranges: the forward splits (the problem line says so), the backward runs
// unsplit (num_splits is forward-only), and both pass the check; a negative count is refused by name.
TEST(Cli, RunTakesNumSplits) {
  Result r = fa4("run --seqlen-q 1 --seqlen-k 300 --heads 4 --heads-kv 2 -d 32 --num-splits 3 --iters 1 --backend cpu");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r, "splits=3")) << r.output;
  EXPECT_TRUE(has(r, "check     PASS")) << r.output;
  EXPECT_TRUE(has(r, "backward")) << r.output;
  r = fa4("run --num-splits -1");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r, "--num-splits: must be >= 0, got -1")) << r.output;
}

// Bad command lines name what was given and what is allowed.
TEST(Cli, BadArgumentsSayWhatIsAllowed) {
  Result r = fa4("run --seqlen -5");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r, "--seqlen: must be >= 0, got -5")) << r.output;
  EXPECT_FALSE(has(r, "179769313486231570")) << "the 300-digit bound is back: " << r.output;
  r = fa4("run --heads 0");
  EXPECT_TRUE(has(r, "--heads: must be >= 1, got 0")) << r.output;
  r = fa4("run --seqlen 12abc");
  EXPECT_TRUE(has(r, "expected a whole number >= 0, got '12abc'")) << r.output;
  r = fa4("frobnicate");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r, "unknown command 'frobnicate'")) << r.output;
  EXPECT_TRUE(has(r, "run, check, bench")) << r.output;
}
