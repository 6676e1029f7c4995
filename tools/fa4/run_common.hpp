// What `fa4 run`'s modes share (cmd_run.cpp: dense and varlen; run_kvcache.cpp: KV cache): the arguments, the
// spot-check tolerance, and the printed timing and check lines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa4/common.hpp"
#include "testing/tensors.hpp"

namespace fa4::cli {

struct RunArgs {
  ProblemArgs problem;
  std::string pass = "auto";  // auto: forward, and backward where the backend has one
  std::string backend = "auto";
  int iters = 3;
  int check_rows = 8;
  std::vector<int64_t> varlen;   // per-sequence lengths of a variable-length batch (queries = keys); empty: dense
  int host_cost_calls = 0;       // > 0: also time the host side of that many unsynchronized calls (GPU backend)
  std::vector<int64_t> kvcache;  // per-sequence keys already cached, for a KV-cache call; empty: none
  int64_t page_size = 0;         // with kvcache: rows per page (0: a contiguous cache)
  int64_t append = -1;           // with kvcache: keys appended per sequence in the call (-1: the query length)
};

// Relative tolerance of the spot checks. O: per sampled row, max|ours - ref| <= tol * max(1, max|ref|).
// Gradients: max|ours - ref| <= tol * max|ref| over every checked element of that gradient (their entries
// are far below 1, so the floor of 1 would let a wrong gradient pass). Two units in the last place of the
// output dtype, plus the fp32 accumulation error of a long row (loose enough never to flag a correct kernel,
// tight enough that any indexing or masking bug fails it).
double row_tolerance(DType dtype);

// One sampled row (b, i, h) of O against its fp64 reference row: max|ours - ref| over max(1, max|ref|).
double row_error(const testing::HostTensor& out, int64_t b, int64_t i, int64_t h, const std::vector<double>& ref,
                 bool& finite);

void print_timing(const char* pass, double seconds, double flops, int iters);

// The check line; a failure sets the exit status.
void print_check(bool ok, const std::string& what, double tol, bool finite);

// The packed [total, heads, d] (rank 3) view of a [1, total, heads, d] tensor (host, or its device mirror), and
// the [heads, total] varlen lse of a [1, heads, total] lse tensor (`fa4 run --varlen`, `fa4 bench --varlen`).
Tensor packed_view(const Tensor& t);
Tensor packed_view(const testing::HostTensor& t);
Tensor varlen_lse_view(const Tensor& t);

// `fa4 run --kvcache L1,L2,...` (run_kvcache.cpp).
void run_kvcache(const RunArgs& a);

}  // namespace fa4::cli
