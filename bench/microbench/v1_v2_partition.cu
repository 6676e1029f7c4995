// What FlashAttention-2's work partition bought over FlashAttention-1's, measured (issue 13's guide, page 5).
// Three teaching kernels share one tile step (S = Q·Kᵀ and O += P·V on WMMA bf16 tensor cores, the online
// softmax between them; 64 queries × 64 keys × d = 64, four warps of 16 query rows) and differ only in the two
// things v2 changed:
//   v1        K/V blocks in the outer loop, query blocks inside: every step reads Q, O, m, l from global memory
//             and writes O, m, l back (O as fp32, as FlashAttention-1's o_tmp); one CTA per (batch, head).
//   v2-order  query blocks outside, K/V inside: O, m, l stay on chip and are written once; still one CTA per
//             (batch, head) — the loop order alone.
//   v2        the same loop order, one CTA per (batch, head, query block): v2's parallelism over the sequence.
// They are not fa4's kernels (no TMA, no wgmma, no warp specialisation, synchronous loads): the point is the
// difference between them. Every output is checked against an fp64 reference on sampled rows.
//   nvcc -O3 -std=c++20 -arch=sm_90a bench/microbench/v1_v2_partition.cu -o /tmp/v1v2
//   /tmp/v1v2 [--batch B] [--heads H] [--seqlen S] [--iters N] [--only v1|v2-order|v2] [--json file]
// Under ncu (`--metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum`) with --iters 1 each kernel
// runs once after one warm-up launch, so its DRAM and L2 bytes can be read per variant.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

#define OK(x)                                                                                   \
  do {                                                                                          \
    if (cudaError_t e_ = (x); e_ != cudaSuccess) {                                              \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kD = 64;        // head dim
constexpr int kBlockM = 64;   // query rows per block
constexpr int kBlockN = 64;   // keys per block
constexpr int kWarps = 4;     // 16 query rows each
constexpr int kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = kBlockM / kWarps;
static_assert(kRowsPerWarp == 16, "one WMMA row tile per warp");
static_assert(kD % 16 == 0 && kBlockN % 16 == 0, "WMMA 16x16x16 tiles");

enum class Variant { v1, v2_order, v2 };
const char* name_of(Variant v) { return v == Variant::v1 ? "v1" : v == Variant::v2_order ? "v2-order" : "v2"; }

struct Shape {
  int batch, heads, seqlen;
  __host__ __device__ int blocks() const { return seqlen / kBlockM; }  // q, k, v, out: [batch, seqlen, heads, d]
  size_t elems() const { return size_t(batch) * seqlen * heads * kD; }
};

struct Smem {
  bf16 q[kBlockM][kD];
  bf16 k[kBlockN][kD];
  bf16 v[kBlockN][kD];
  float s[kWarps][kRowsPerWarp][kBlockN];  // scores, then the P·V product of the step
  bf16 p[kWarps][kRowsPerWarp][kBlockN];
  float o[kBlockM][kD];                      // the running (unnormalised) output of the query block
  float m[kBlockM], l[kBlockM], alpha[kBlockM];
};

// rows x kD bf16 from [.., seqlen, heads, d] at (batch, head, row0) into shared memory, 16 bytes per thread.
__device__ void load_tile(bf16 (*dst)[kD], const bf16* src, const Shape& sh, int b, int h, int row0, int rows) {
  constexpr int kChunks = kD / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const size_t at = ((size_t(b) * sh.seqlen + row0 + r) * sh.heads + h) * kD + c;
    *reinterpret_cast<int4*>(&dst[r][c]) = *reinterpret_cast<const int4*>(src + at);
  }
}

// One tile step of one query block against one K/V block: the online softmax update of (o, m, l).
__device__ void tile_step(Smem& sm, float scale_log2) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = warp * kRowsPerWarp;
  // S = Q·Kᵀ for this warp's 16 rows.
  for (int n = 0; n < kBlockN / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    for (int kk = 0; kk < kD / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bt;  // Kᵀ read from K's rows
      wmma::load_matrix_sync(a, &sm.q[r0][kk * 16], kD);
      wmma::load_matrix_sync(bt, &sm.k[n * 16][kk * 16], kD);
      wmma::mma_sync(acc, a, bt, acc);
    }
    wmma::store_matrix_sync(&sm.s[warp][0][n * 16], acc, kBlockN, wmma::mem_row_major);
  }
  __syncwarp();
  // The online softmax: two lanes per row, 32 columns each.
  {
    const int row = lane / 2, half = lane % 2, r = r0 + row;
    float* srow = &sm.s[warp][row][half * (kBlockN / 2)];
    float mx = -INFINITY;
    for (int c = 0; c < kBlockN / 2; ++c) mx = fmaxf(mx, srow[c] * scale_log2);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
    float sum = 0.f;
    for (int c = 0; c < kBlockN / 2; ++c) {
      const float p = exp2f(srow[c] * scale_log2 - m_new);
      sum += p;
      sm.p[warp][row][half * (kBlockN / 2) + c] = __float2bfloat16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp();
    if (half == 0) {
      const float alpha = exp2f(m_old - m_new);  // 0 on the first step (m_old = -inf)
      sm.alpha[r] = alpha;
      sm.l[r] = sm.l[r] * alpha + sum;
      sm.m[r] = m_new;
    }
  }
  __syncwarp();
  // P·V into the score buffer, then o = o·alpha + P·V.
  for (int n = 0; n < kD / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.f);
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
      wmma::load_matrix_sync(a, &sm.p[warp][0][kk * 16], kBlockN);
      wmma::load_matrix_sync(b, &sm.v[kk * 16][n * 16], kD);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(&sm.s[warp][0][n * 16], acc, kBlockN, wmma::mem_row_major);
  }
  __syncwarp();
  for (int i = lane; i < kRowsPerWarp * kD; i += 32) {
    const int row = i / kD, c = i % kD;
    sm.o[r0 + row][c] = sm.o[r0 + row][c] * sm.alpha[r0 + row] + sm.s[warp][row][c];
  }
}

__device__ void reset_state(Smem& sm) {
  for (int i = threadIdx.x; i < kBlockM * kD; i += kThreads) sm.o[i / kD][i % kD] = 0.f;
  for (int i = threadIdx.x; i < kBlockM; i += kThreads) { sm.m[i] = -INFINITY; sm.l[i] = 0.f; }
}

__device__ void write_output(const Smem& sm, bf16* out, const Shape& sh, int b, int h, int row0) {
  for (int i = threadIdx.x; i < kBlockM * kD; i += kThreads) {
    const int r = i / kD, c = i % kD;
    out[((size_t(b) * sh.seqlen + row0 + r) * sh.heads + h) * kD + c] = __float2bfloat16(sm.o[r][c] / sm.l[r]);
  }
}

// v2 and v2-order: query blocks outside, K/V inside; O, m, l on chip for a query block's whole life.
// grid.x = batch*heads*(queries per CTA == 1 block ? blocks : 1).
__global__ void __launch_bounds__(kThreads) q_outer(const bf16* q, const bf16* k, const bf16* v, bf16* out, Shape sh,
                                                    float scale_log2, int q_blocks_per_cta) {
  extern __shared__ __align__(128) unsigned char raw[];
  Smem& sm = *reinterpret_cast<Smem*>(raw);
  const int ctas_per_head = sh.blocks() / q_blocks_per_cta;
  const int bh = blockIdx.x / ctas_per_head, b = bh / sh.heads, h = bh % sh.heads;
  const int first = (blockIdx.x % ctas_per_head) * q_blocks_per_cta;
  for (int i = first; i < first + q_blocks_per_cta; ++i) {
    load_tile(sm.q, q, sh, b, h, i * kBlockM, kBlockM);
    reset_state(sm);
    for (int j = 0; j < sh.blocks(); ++j) {
      __syncthreads();  // the previous step's K/V reads are done
      load_tile(sm.k, k, sh, b, h, j * kBlockN, kBlockN);
      load_tile(sm.v, v, sh, b, h, j * kBlockN, kBlockN);
      __syncthreads();
      tile_step(sm, scale_log2);
    }
    __syncthreads();
    write_output(sm, out, sh, b, h, i * kBlockM);
    __syncthreads();
  }
}

// v1: K/V outside, query blocks inside; (O, m, l) of every query block live in global memory between steps
// (O as fp32 [batch, seqlen, heads, d], m and l as fp32 [batch, heads, seqlen]). One CTA per (batch, head).
__global__ void __launch_bounds__(kThreads) kv_outer(const bf16* q, const bf16* k, const bf16* v, bf16* out,
                                                     float* o_acc, float* m_acc, float* l_acc, Shape sh,
                                                     float scale_log2) {
  extern __shared__ __align__(128) unsigned char raw[];
  Smem& sm = *reinterpret_cast<Smem*>(raw);
  const int b = blockIdx.x / sh.heads, h = blockIdx.x % sh.heads, n = sh.blocks();
  const size_t ml0 = (size_t(b) * sh.heads + h) * sh.seqlen;
  for (int j = 0; j < n; ++j) {
    __syncthreads();
    load_tile(sm.k, k, sh, b, h, j * kBlockN, kBlockN);
    load_tile(sm.v, v, sh, b, h, j * kBlockN, kBlockN);
    for (int i = 0; i < n; ++i) {
      load_tile(sm.q, q, sh, b, h, i * kBlockM, kBlockM);
      if (j == 0) {
        reset_state(sm);
      } else {  // read the query block's state back from global memory
        for (int e = threadIdx.x; e < kBlockM * kD / 4; e += kThreads) {
          const int r = e / (kD / 4), c = (e % (kD / 4)) * 4;
          *reinterpret_cast<float4*>(&sm.o[r][c]) = *reinterpret_cast<const float4*>(
              o_acc + ((size_t(b) * sh.seqlen + i * kBlockM + r) * sh.heads + h) * kD + c);
        }
        for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
          sm.m[r] = m_acc[ml0 + i * kBlockM + r];
          sm.l[r] = l_acc[ml0 + i * kBlockM + r];
        }
      }
      __syncthreads();
      tile_step(sm, scale_log2);
      __syncthreads();
      if (j == n - 1) {
        write_output(sm, out, sh, b, h, i * kBlockM);
      } else {  // write it back for the next K/V block
        for (int e = threadIdx.x; e < kBlockM * kD / 4; e += kThreads) {
          const int r = e / (kD / 4), c = (e % (kD / 4)) * 4;
          *reinterpret_cast<float4*>(o_acc + ((size_t(b) * sh.seqlen + i * kBlockM + r) * sh.heads + h) * kD + c) =
              *reinterpret_cast<const float4*>(&sm.o[r][c]);
        }
        for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
          m_acc[ml0 + i * kBlockM + r] = sm.m[r];
          l_acc[ml0 + i * kBlockM + r] = sm.l[r];
        }
      }
      __syncthreads();
    }
  }
}

struct Args {
  int batch = 1, heads = 16, seqlen = 4096, iters = 10;
  std::string only, json;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", argv[i]); std::exit(2); }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--batch")) a.batch = std::atoi(next());
    else if (!std::strcmp(argv[i], "--heads")) a.heads = std::atoi(next());
    else if (!std::strcmp(argv[i], "--seqlen")) a.seqlen = std::atoi(next());
    else if (!std::strcmp(argv[i], "--iters")) a.iters = std::atoi(next());
    else if (!std::strcmp(argv[i], "--only")) a.only = next();
    else if (!std::strcmp(argv[i], "--json")) a.json = next();
    else { std::fprintf(stderr, "unknown argument '%s' (see the file's header)\n", argv[i]); std::exit(2); }
  }
  if (a.batch < 1 || a.heads < 1 || a.iters < 1 || a.seqlen < kBlockM || a.seqlen % kBlockM) {
    std::fprintf(stderr, "need batch, heads, iters >= 1 and seqlen a positive multiple of %d (got %d, %d, %d, %d)\n",
                 kBlockM, a.batch, a.heads, a.iters, a.seqlen);
    std::exit(2);
  }
  if (!a.only.empty() && a.only != "v1" && a.only != "v2-order" && a.only != "v2") {
    std::fprintf(stderr, "--only: expected v1, v2-order or v2, got '%s'\n", a.only.c_str());
    std::exit(2);
  }
  return a;
}

float bf16_to_float(bf16 x) { return __bfloat162float(x); }

// fp64 reference of one output row, the largest error over a sample of rows against it.
double max_error(const std::vector<bf16>& hq, const std::vector<bf16>& hk, const std::vector<bf16>& hv,
                 const std::vector<bf16>& ho, const Shape& sh, double scale) {
  double worst = 0;
  std::mt19937 rng(7);
  for (int t = 0; t < 24; ++t) {
    const int b = rng() % sh.batch, h = rng() % sh.heads, r = rng() % sh.seqlen;
    auto at = [&](int row, int c) { return ((size_t(b) * sh.seqlen + row) * sh.heads + h) * kD + c; };
    std::vector<double> s(sh.seqlen);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < sh.seqlen; ++j) {
      double dot = 0;
      for (int c = 0; c < kD; ++c) dot += double(bf16_to_float(hq[at(r, c)])) * bf16_to_float(hk[at(j, c)]);
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int c = 0; c < kD; ++c) {
      double o = 0;
      for (int j = 0; j < sh.seqlen; ++j) o += s[j] * bf16_to_float(hv[at(j, c)]);
      worst = std::max(worst, std::abs(o / sum - double(bf16_to_float(ho[at(r, c)]))));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const Shape sh{a.batch, a.heads, a.seqlen};
  const size_t n = sh.elems();
  std::vector<bf16> hq(n), hk(n), hv(n), ho(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (auto* t : {&hq, &hk, &hv})
    for (auto& x : *t) x = __float2bfloat16(dist(rng));
  bf16 *q, *k, *v, *out;
  float *o_acc, *m_acc, *l_acc;
  OK(cudaMalloc(&q, n * sizeof(bf16)));
  OK(cudaMalloc(&k, n * sizeof(bf16)));
  OK(cudaMalloc(&v, n * sizeof(bf16)));
  OK(cudaMalloc(&out, n * sizeof(bf16)));
  OK(cudaMalloc(&o_acc, n * sizeof(float)));
  OK(cudaMalloc(&m_acc, size_t(sh.batch) * sh.heads * sh.seqlen * sizeof(float)));
  OK(cudaMalloc(&l_acc, size_t(sh.batch) * sh.heads * sh.seqlen * sizeof(float)));
  OK(cudaMemcpy(q, hq.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  OK(cudaMemcpy(k, hk.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  OK(cudaMemcpy(v, hv.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
  const int smem = sizeof(Smem);
  OK(cudaFuncSetAttribute(q_outer, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  OK(cudaFuncSetAttribute(kv_outer, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const double scale = 1.0 / std::sqrt(double(kD));
  const float scale_log2 = float(scale * M_LOG2E);
  const int bh = sh.batch * sh.heads;
  int sms = 0;
  OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double flops = 4.0 * bh * double(sh.seqlen) * sh.seqlen * kD;
  // Global-memory bytes each variant's loads and stores ask for (served by L2 or DRAM; ncu tells which):
  // v1 reads K and V once, and per step the query block and its (O, m, l) state, written back after it;
  // v2 and v2-order read Q once and K, V once per query block. Both write the output once.
  const double v1_state = double(bh) * sh.blocks() * sh.blocks() *
                          (kBlockM * kD * sizeof(bf16) + 2.0 * (kBlockM * kD + 2 * kBlockM) * sizeof(float));
  const double kv_per_q_block = double(bh) * sh.blocks() * 2.0 * sh.seqlen * kD * sizeof(bf16);

  std::printf("v1 vs v2 work partition: bf16, batch %d x heads %d, seqlen %d, d %d, tile %dx%d, %d SMs, smem %d B\n",
              sh.batch, sh.heads, sh.seqlen, kD, kBlockM, kBlockN, sms, smem);
  std::printf("%-9s %8s %10s %9s %9s %14s\n", "variant", "CTAs", "ms", "TFLOP/s", "max err", "GB asked");
  std::string json = "[";
  for (Variant var : {Variant::v1, Variant::v2_order, Variant::v2}) {
    if (!a.only.empty() && a.only != name_of(var)) continue;
    OK(cudaMemset(out, 0xff, n * sizeof(bf16)));  // NaN: a row the kernel misses cannot pass the check
    const int ctas = var == Variant::v2 ? bh * sh.blocks() : bh;
    auto launch = [&] {
      if (var == Variant::v1)
        kv_outer<<<ctas, kThreads, smem>>>(q, k, v, out, o_acc, m_acc, l_acc, sh, scale_log2);
      else
        q_outer<<<ctas, kThreads, smem>>>(q, k, v, out, sh, scale_log2, var == Variant::v2 ? 1 : sh.blocks());
    };
    launch();
    OK(cudaGetLastError());
    OK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    OK(cudaEventCreate(&e0));
    OK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int it = 0; it < a.iters; ++it) {
      OK(cudaEventRecord(e0));
      launch();
      OK(cudaEventRecord(e1));
      OK(cudaEventSynchronize(e1));
      float t = 0;
      OK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const float med = ms[ms.size() / 2];
    OK(cudaMemcpy(ho.data(), out, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    const double err = max_error(hq, hk, hv, ho, sh, scale);
    const double bytes = var == Variant::v1 ? 3.0 * n * sizeof(bf16) + v1_state
                                            : 2.0 * n * sizeof(bf16) + kv_per_q_block;
    const bool pass = std::isfinite(err) && err < 2e-2;
    std::printf("%-9s %8d %10.3f %9.1f %9.2e %14.2f %s\n", name_of(var), ctas, med, flops / (med * 1e-3) / 1e12,
                err, bytes / 1e9, pass ? "" : "FAILED");
    char row[400];
    std::snprintf(row, sizeof row,
                  "%s{\"variant\":\"%s\",\"batch\":%d,\"heads\":%d,\"seqlen\":%d,\"d\":%d,\"ctas\":%d,\"ms\":%.4f,"
                  "\"tflops\":%.2f,\"max_err\":%.3e,\"bytes_asked\":%.0f,\"sms\":%d}",
                  json.size() > 1 ? "," : "", name_of(var), sh.batch, sh.heads, sh.seqlen, kD, ctas, med,
                  flops / (med * 1e-3) / 1e12, err, bytes, sms);
    json += row;
    if (!pass) return 1;
  }
  json += "]\n";
  if (!a.json.empty()) {
    FILE* f = std::fopen(a.json.c_str(), "w");
    if (!f) { std::perror(a.json.c_str()); return 1; }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}
