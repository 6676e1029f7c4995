// GPU tests of the primitive layer the sm_90a kernels stand on (DESIGN.md §6 steps 1-3), each against a CPU
// computation:
//   GpuTma       a TMA load of a 128B-swizzled bf16 tile, decoded on the host through the swizzle formula;
//                out-of-bounds box elements must arrive as zeros; the TMA store writes back only in-bounds ones.
//   GpuWgmma     m64nNk16 SS with both operands K-major (S = Q·Kᵀ) over a full K loop, accumulator fragments
//                decoded per reference/fa3.md §3.5; RS with A from registers and B = V MN-major (O = P·V); and
//                the chained S → P (registers) → O step of the forward kernel.
//   GpuPipeline  a producer warp (TMA or plain stores) and two consumer warpgroups moving a long random buffer
//                through 2-, 3- and 5-stage mbarrier rings; every element checked.
// A kernel stuck on an mbarrier traps after FA4_MBARRIER_TIMEOUT_NS (src/cuda/ptx/mbarrier.cuh) instead of
// hanging; the test then fails with "unspecified launch failure" and says so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/pipeline/pipeline.cuh"
#include "cuda/ptx/elect.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/swizzle.hpp"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/tensormap.hpp"
#include "numerics/convert.hpp"

namespace {

using fa4::ptx::WgmmaInput;

// ---- host helpers -------------------------------------------------------------------------------------------

std::string launch_diagnosis(cudaError_t e) {
  std::string s = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorLaunchFailure || e == cudaErrorIllegalInstruction)
    s += " -- a trap: an mbarrier wait exceeded FA4_MBARRIER_TIMEOUT_NS (a lost arrival or a wrong expect_tx byte "
         "count; only after that timeout), or an instruction the hardware rejected (e.g. TMA coordinates or "
         "alignment, wgmma on a non-sm_90a device; at once)";
  return s;
}

// Progress line, flushed at once: a step that kills the process (a signal) still leaves the last step in the log.
#define STEP(...)                                                 \
  do {                                                            \
    std::printf("    [step] " __VA_ARGS__);                       \
    std::printf("\n");                                            \
    std::fflush(stdout);                                          \
  } while (0)

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << " -> " << launch_diagnosis(e_); \
  } while (0)

// Launch error, then execution error, with the time the failing kernel ran: a watchdog trap comes only after
// FA4_MBARRIER_TIMEOUT_NS (4 s); a failure within milliseconds is the hardware rejecting an instruction (e.g. a
// TMA with unsupported coordinates or alignment), not a lost arrival.
#define KERNEL_OK(what)                                                                                      \
  do {                                                                                                       \
    const cudaError_t l_ = cudaGetLastError();                                                               \
    ASSERT_EQ(l_, cudaSuccess) << (what) << " launch: " << launch_diagnosis(l_);                             \
    const auto t0_ = std::chrono::steady_clock::now();                                                       \
    const cudaError_t s_ = cudaDeviceSynchronize();                                                          \
    const double ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count(); \
    ASSERT_EQ(s_, cudaSuccess) << (what) << " execution (failed after " << ms_ << " ms): " << launch_diagnosis(s_); \
  } while (0)

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, n * sizeof(T) + 16) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  size_t bytes() const { return count * sizeof(T); }
};

int device_cc() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor;
}

#define REQUIRE_TMA()                                                                       \
  do {                                                                                      \
    if (device_cc() < 90) GTEST_SKIP() << "TMA and mbarrier tx-counts need sm_90 or newer"; \
  } while (0)
#define REQUIRE_WGMMA()                                                                                      \
  do {                                                                                                       \
    if (device_cc() != 90) GTEST_SKIP() << "wgmma exists only on sm_90a (this is sm_" << device_cc() << ")"; \
  } while (0)

uint16_t to_bits(WgmmaInput in, float f) {
  return in == WgmmaInput::bf16 ? fa4::num::float_to_bf16_bits(f) : fa4::num::float_to_f16_bits(f);
}
float from_bits(WgmmaInput in, uint16_t h) {
  return in == WgmmaInput::bf16 ? fa4::num::bf16_bits_to_float(h) : fa4::num::f16_bits_to_float(h);
}
const char* name(WgmmaInput in) { return in == WgmmaInput::bf16 ? "bf16" : "f16"; }

std::vector<uint16_t> random_matrix(WgmmaInput in, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> m(n);
  for (auto& x : m) x = to_bits(in, u(rng));
  return m;
}

// Appends the shared-memory image of a [rows][cols] 16-bit matrix (row stride ld) as the kernels store it:
// [cols/64 chunks][rows][128 bytes], 128B-swizzled (reference/fa3.md §3.2). Chunk j starts j·rows·128 bytes in.
void append_sw128_image(std::vector<uint8_t>& image, const uint16_t* m, int rows, int cols, int ld) {
  const size_t base = image.size();
  image.resize(base + size_t(rows) * cols * 2);
  for (int c0 = 0; c0 < cols; c0 += 64)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 64; ++c) {
        const size_t off = base + size_t(c0 / 64) * rows * 128 + fa4::ptx::sw128_offset(r, c, 2);
        std::memcpy(&image[off], &m[size_t(r) * ld + c0 + c], 2);
      }
}

// fp32 accumulation of exact 16-bit products differs from the fp64 reference only by summation order and the
// tensor core's internal rounding: allow 1e-4 of sum|a·b| (a layout or descriptor error is O(1) of it).
constexpr double kRelTol = 1e-4;

// Compares a 64×N fp32 result returned as raw per-thread fragments (frag[t·N/2 + i]) with a reference, decoding
// the fragment with the layout under test. Prints the first mismatches with their coordinates.
void expect_fragment_matches(const std::vector<float>& frag, int n, const std::vector<double>& ref,
                             const std::vector<double>& magnitude, double rel_tol, const std::string& what) {
  int bad = 0;
  double worst = 0, worst_rel = 0;
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < n / 2; ++i) {
      const int r = fa4::ptx::accumulator_row(t, i), c = fa4::ptx::accumulator_col(t, i);
      const double got = frag[size_t(t) * (n / 2) + i], want = ref[size_t(r) * n + c];
      const double tol = rel_tol * magnitude[size_t(r) * n + c] + 1e-6;
      const double err = std::fabs(got - want);
      if (!(err <= tol)) {  // NaN-safe: a surviving NaN poison fails too
        if (++bad <= 8)
          ADD_FAILURE() << what << ": C[" << r << "][" << c << "] (thread " << t << ", reg " << i << ") = " << got
                        << ", expected " << want << " (tol " << tol << ")";
      } else {
        worst = std::max(worst, err);
        worst_rel = std::max(worst_rel, err / (magnitude[size_t(r) * n + c] + 1e-30));
      }
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << 64 * n << " elements wrong";
  if (bad == 0) std::printf("  %s: max |err| %.3g, max |err| / sum|a·b| %.3g\n", what.c_str(), worst, worst_rel);
}

// ---- device helpers ----------------------------------------------------------------------------------------

// The base of dynamic shared memory rounded up to the 1024-byte swizzle repeat (launch with 1024 spare bytes).
__device__ __forceinline__ uint8_t* dynamic_smem_1024() {
  extern __shared__ uint8_t dynamic_smem[];
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  return dynamic_smem + ((1024u - (addr & 1023u)) & 1023u);
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies a prepared shared-memory image in, then makes it visible to the async proxy (wgmma operand reads).
__device__ void load_image(uint8_t* smem, const uint8_t* image, uint32_t bytes) {
  for (uint32_t i = threadIdx.x * 16; i < bytes; i += blockDim.x * 16)
    *reinterpret_cast<uint4*>(smem + i) = *reinterpret_cast<const uint4*>(image + i);
  fa4::ptx::fence_proxy_async_shared_cta();
  __syncthreads();
}

template <int N>
__device__ void poison(fa4::ptx::WgmmaAccumulator<N>& acc) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc.reg[i] = __int_as_float(0x7FC00000);  // NaN: scale-d = 0 must ignore it
}

template <int N>
__device__ void store_fragment(const fa4::ptx::WgmmaAccumulator<N>& acc, float* out) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) out[threadIdx.x * (N / 2) + i] = acc.reg[i];
}

// ---- (a) TMA ----------------------------------------------------------------------------------------------

struct TmaCoords {
  int32_t c[5];
};

// Poisons the tile buffer, loads one box with TMA, dumps the raw (swizzled) shared-memory image, and stores the
// box back through `store_map` (same geometry, another tensor).
template <int Rank>
__global__ void __launch_bounds__(128)
    tma_roundtrip_kernel(const __grid_constant__ CUtensorMap load_map, const __grid_constant__ CUtensorMap store_map,
                         TmaCoords at, uint32_t box_bytes, uint8_t* image_out) {
  __shared__ alignas(8) uint64_t bar;
  uint8_t* tile = dynamic_smem_1024();
  for (uint32_t i = threadIdx.x; i < box_bytes; i += blockDim.x) tile[i] = 0xA5;
  fa4::ptx::fence_proxy_async_shared_cta();  // order the generic poison before the async-proxy TMA write
  if (threadIdx.x == 0) {
    fa4::ptx::prefetch_tensormap(&load_map);
    fa4::ptx::mbarrier_init(&bar, 1);
    fa4::ptx::fence_barrier_init();
  }
  __syncthreads();
  int32_t coords[Rank];
#pragma unroll
  for (int d = 0; d < Rank; ++d) coords[d] = at.c[d];
  if (threadIdx.x == 0) {
    fa4::ptx::mbarrier_arrive_expect_tx(&bar, box_bytes);  // the full box, out-of-bounds fill included
    fa4::ptx::tma_load(tile, &load_map, coords, &bar);
  }
  fa4::ptx::mbarrier_wait_parity(&bar, 0);
  for (uint32_t i = threadIdx.x; i < box_bytes; i += blockDim.x) image_out[i] = tile[i];
  if (threadIdx.x == 0) {
    fa4::ptx::tma_store(&store_map, coords, tile);
    fa4::ptx::tma_store_commit();
    fa4::ptx::tma_store_wait<0>();
  }
}

struct TmaCase {
  const char* name;
  int rank;
  std::vector<uint64_t> dims;  // innermost first
  std::vector<uint32_t> box;
  std::vector<int32_t> at;
  std::vector<uint64_t> strides = {};  // elements per dimension; empty = contiguous in the order of dims
};

void run_tma_case(const TmaCase& tc) {
  SCOPED_TRACE(tc.name);
  // Boxes start inside the tensor and may run past its END (the seqlen tails of the kernels); a negative start
  // is outside fa4's TMA contract (src/cuda/ptx/tma.cuh).
  for (int d = 0; d < tc.rank; ++d) ASSERT_GE(tc.at[d], 0) << "dimension " << d << ": negative box start";
  uint64_t elems = 1;
  for (auto d : tc.dims) elems *= d;
  const auto host = random_matrix(WgmmaInput::bf16, elems, 7);
  DeviceBuffer<uint16_t> src(elems), dst(elems);
  ASSERT_NE(src.ptr, nullptr);
  ASSERT_NE(dst.ptr, nullptr);
  CUDA_OK(cudaMemcpy(src.ptr, host.data(), src.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dst.ptr, 0xFF, dst.bytes()));  // 0xFFFF: a NaN the store must leave alone out of bounds

  fa4::cuda::TmaTensorSpec spec;
  spec.dtype = fa4::DType::bf16;
  spec.rank = tc.rank;
  std::vector<uint64_t> strides(tc.rank);
  uint64_t contiguous = 1;
  uint32_t box_elems = 1;
  for (int d = 0; d < tc.rank; ++d) {
    strides[d] = tc.strides.empty() ? contiguous : tc.strides[d];
    contiguous *= tc.dims[d];
    spec.dims[d] = tc.dims[d];
    spec.strides_bytes[d] = strides[d] * 2;
    spec.box[d] = tc.box[d];
    box_elems *= tc.box[d];
  }
  CUtensorMap load_map, store_map;  // named variables: 64-byte aligned (tensormap.hpp)
  STEP("%s: encode the load and store tensor maps", tc.name);
  spec.data = src.ptr;
  fa4::cuda::make_tma_tensor_map(spec, &load_map);
  spec.data = dst.ptr;
  fa4::cuda::make_tma_tensor_map(spec, &store_map);

  const uint32_t box_bytes = box_elems * 2;
  DeviceBuffer<uint8_t> image(box_bytes);
  TmaCoords at{};
  for (int d = 0; d < tc.rank; ++d) at.c[d] = tc.at[d];
  const size_t smem = box_bytes + 1024;
  auto kernel = tc.rank == 2 ? tma_roundtrip_kernel<2> : tma_roundtrip_kernel<4>;
  ASSERT_TRUE(tc.rank == 2 || tc.rank == 4);
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  STEP("%s: launch (box at %d, %d, ...)", tc.name, at.c[0], at.c[1]);
  kernel<<<1, 128, smem>>>(load_map, store_map, at, box_bytes, image.ptr);
  KERNEL_OK(tc.name);

  std::vector<uint8_t> img(box_bytes);
  std::vector<uint16_t> out(elems);
  CUDA_OK(cudaMemcpy(img.data(), image.ptr, box_bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(out.data(), dst.ptr, dst.bytes(), cudaMemcpyDeviceToHost));

  // Box element (c, r, z...) with c innermost: in shared memory the box is [rows = product of outer box dims][64],
  // 128B-swizzled. A box row is 128 bytes only if box[0] = 64 (asserted by the cases).
  ASSERT_EQ(tc.box[0] * 2, 128u);
  int bad = 0, oob = 0, inb = 0;
  const uint32_t rows = box_elems / tc.box[0];
  for (uint32_t row = 0; row < rows; ++row)
    for (uint32_t c = 0; c < tc.box[0]; ++c) {
      int64_t g[5] = {0, 0, 0, 0, 0};
      g[0] = int64_t(tc.at[0]) + c;
      uint32_t rem = row;
      bool inside = g[0] >= 0 && g[0] < int64_t(tc.dims[0]);
      for (int d = 1; d < tc.rank; ++d) {
        g[d] = int64_t(tc.at[d]) + rem % tc.box[d];
        rem /= tc.box[d];
        inside = inside && g[d] >= 0 && g[d] < int64_t(tc.dims[d]);
      }
      uint64_t linear = 0;
      for (int d = 0; d < tc.rank; ++d) linear += uint64_t(inside ? g[d] : 0) * strides[d];
      uint16_t got;
      std::memcpy(&got, &img[fa4::ptx::sw128_offset(row, c, 2)], 2);
      const uint16_t want = inside ? host[linear] : 0;
      (inside ? inb : oob)++;
      if (got != want && ++bad <= 8)
        ADD_FAILURE() << "box row " << row << " col " << c << (inside ? " (in bounds)" : " (out of bounds)")
                      << ": smem bits 0x" << std::hex << got << ", expected 0x" << want << std::dec;
      if (inside && out[linear] != host[linear] && ++bad <= 8)
        ADD_FAILURE() << "TMA store: element " << linear << " = 0x" << std::hex << out[linear] << ", expected 0x"
                      << host[linear] << std::dec;
    }
  EXPECT_EQ(bad, 0);
  // The store must not have written outside the box or outside the tensor: count untouched elements.
  size_t written = 0;
  for (uint64_t i = 0; i < elems; ++i) written += out[i] != 0xFFFF;
  EXPECT_EQ(written, size_t(inb)) << "the TMA store wrote outside the in-bounds part of the box";
  std::printf("  %s: %d in-bounds elements, %d zero-filled out of bounds\n", tc.name, inb, oob);
}

TEST(GpuTma, Load2dTileThroughSw128AndZeroFillPastTheEnd) {
  REQUIRE_TMA();
  // [200 rows][104 cols] bf16 (row stride 208 B = 13·16); 64×64 boxes. Every element of the swizzled shared-memory
  // image is decoded on the host (sw128_offset) and compared: in-bounds ones with the source, out-of-bounds ones
  // with 0 (the buffer is poisoned with 0xA5 first), so a wrong swizzle decode or a missing zero fill fails.
  run_tma_case({"2d interior box at (col 0, row 64)", 2, {104, 200}, {64, 64}, {0, 64}});
  run_tma_case({"2d box over both ends at (col 64, row 192)", 2, {104, 200}, {64, 64}, {64, 192}});
  // The kernels' case: a Q/K/V tile of head dim 64 whose rows run past seqlen 77 (odd, so the tail is not a
  // multiple of the 8-row swizzle repeat): rows 77..127 of the box must arrive as zeros.
  run_tma_case({"2d seqlen tail at (col 0, row 64) of [77][64]: rows 77.. zero", 2, {64, 77}, {64, 64}, {0, 64}});
  // Not tested: a box starting before the tensor (negative coordinates). fa4's kernels never issue one, and on
  // the H200 (driver 580) a 2D SW128 load/store at (-8, -5) raised cudaErrorIllegalInstruction in thread 0
  // within milliseconds (not the mbarrier watchdog), so fa4 does not rely on it (src/cuda/ptx/tma.cuh).
}

TEST(GpuTma, Load4dQLayoutTileAndSeqlenTail) {
  REQUIRE_TMA();
  // A [batch 2][seqlen 77][heads 3][dim 128] tensor seen as FA3 sees Q (reference/fa3.md §3.7): dims
  // {128, 77, 3, 2} with the non-monotonic element strides {1, 3·128, 128, 77·3·128}, box {64, 64, 1, 1}.
  const std::vector<uint64_t> bshd = {1, 3 * 128, 128, 77 * 3 * 128};
  run_tma_case({"4d interior (d 64, s 0, h 1, b 0)", 4, {128, 77, 3, 2}, {64, 64, 1, 1}, {64, 0, 1, 0}, bshd});
  run_tma_case({"4d seqlen tail (d 0, s 64, h 2, b 1): rows 77.. zero",
                4,
                {128, 77, 3, 2},
                {64, 64, 1, 1},
                {0, 64, 2, 1},
                bshd});
}

TEST(GpuTma, BadArgumentsNameTheField) {
  // No kernel runs here, but the final, valid encode calls the driver: skip where there is no TMA.
  REQUIRE_TMA();
  STEP("allocate the tensor");
  DeviceBuffer<uint16_t> buf(1 << 16);
  ASSERT_NE(buf.ptr, nullptr);
  fa4::cuda::TmaTensorSpec spec;
  spec.data = buf.ptr;
  spec.rank = 2;
  spec.dims = {128, 256};
  spec.strides_bytes = {2, 256};
  spec.box = {128, 64};  // 256 bytes: wider than the 128-byte swizzle span
  CUtensorMap map;       // a named variable: 64-byte aligned (tensormap.hpp)
  ASSERT_EQ(reinterpret_cast<uintptr_t>(&map) % 64, 0u) << "the compiler did not align a CUtensorMap variable";
  auto expect_error = [&](const char* needle, CUtensorMap* out) {
    SCOPED_TRACE(needle);
    STEP("bad spec: expect an error naming \"%s\"", needle);
    try {
      fa4::cuda::make_tma_tensor_map(spec, out);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::Status::cuda_error);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("box[0]", &map);
  spec.box = {64, 300};
  expect_error("box[1]", &map);
  spec.box = {64, 64};
  spec.strides_bytes = {2, 200};
  expect_error("strides_bytes[1]", &map);
  spec.strides_bytes = {2, 256};
  spec.dtype = fa4::DType::f32;
  expect_error("dtype", &map);
  spec.dtype = fa4::DType::bf16;
  // The spec is valid now; only the output is wrong. The misaligned pointer is checked, never written through.
  alignas(64) unsigned char raw[sizeof(CUtensorMap) + 64];
  expect_error("64-byte aligned", reinterpret_cast<CUtensorMap*>(raw + 16));
  expect_error("null", nullptr);
  STEP("valid spec: encode through the driver");
  try {
    fa4::cuda::make_tma_tensor_map(spec, &map);
  } catch (const fa4::Error& e) {
    ADD_FAILURE() << "the valid spec did not encode: " << e.what();
  }
  STEP("done");
}

// ---- (b) wgmma ----------------------------------------------------------------------------------------------

// S = Q·Kᵀ: A = Q [64][KDim], B = K [N][KDim], both K-major 128B-swizzled images, one k-step of 16 per wgmma.
// KDim is a template parameter so the k loop unrolls as in the real kernels (a rolled loop makes ptxas insert
// extra warpgroup.arrive around the accumulator, C7519).
template <WgmmaInput In, int N, int KDim>
__global__ void __launch_bounds__(128) wgmma_ss_kernel(const uint8_t* image, uint32_t image_bytes, float* frag_out) {
  using namespace fa4::ptx;
  static_assert(KDim % 64 == 0, "whole swizzle chunks");
  uint8_t* smem = dynamic_smem_1024();
  load_image(smem, image, image_bytes);
  const uint32_t q = smem_addr(smem), k = q + 64u * KDim * 2u;
  WgmmaAccumulator<N> acc;
  poison(acc);
  wgmma_fence_operand(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KDim / 16; ++kk) {
    // k-step kk: chunk kk/4 of 64 columns (rows·128 bytes each), 32 bytes per k-step inside the chunk.
    const WgmmaDesc a = sw128_k_major_desc(q + (kk / 4) * 64u * 128u + (kk % 4) * 32u);
    const WgmmaDesc b = sw128_k_major_desc(k + (kk / 4) * uint32_t(N) * 128u + (kk % 4) * 32u);
    wgmma_ss<In, Major::k, Major::k>(acc, a, b, /*accumulate=*/kk > 0);
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(acc);
  store_fragment(acc, frag_out);
}

// O = P·V: A = P [64][k_rows] from registers (fragment layout of wgmma_fragment.hpp, read straight from global),
// B = V [k_rows][N] MN-major: image [N/64 chunks][k_rows][128 B].
template <WgmmaInput In, int N>
__global__ void __launch_bounds__(128)
    wgmma_rs_kernel(const uint16_t* p, int k_rows, const uint8_t* image, uint32_t image_bytes, float* frag_out) {
  using namespace fa4::ptx;
  uint8_t* smem = dynamic_smem_1024();
  load_image(smem, image, image_bytes);
  const uint32_t v = smem_addr(smem);
  const int t = threadIdx.x;
  WgmmaAccumulator<N> acc;
  poison(acc);
  wgmma_fence_operand(acc);
#pragma unroll 1
  for (int kb = 0; kb < k_rows / 16; ++kb) {
    WgmmaFragmentA a;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = fragment_a_row(t, j), c = 16 * kb + fragment_a_col(t, j, 0);
      a.reg[j] = uint32_t(p[r * k_rows + c]) | (uint32_t(p[r * k_rows + c + 1]) << 16);
    }
    wgmma_fence_operand(a);
    wgmma_fence();  // A registers were written by ordinary loads
    wgmma_rs<In, Major::mn>(acc, a, sw128_mn_major_desc(v + kb * 2048u, uint32_t(k_rows) * 128u), kb > 0);
    wgmma_commit_group();
    wgmma_wait_group<0>();  // `a` is overwritten next iteration
    wgmma_fence_operand(a);
  }
  wgmma_fence_operand(acc);
  store_fragment(acc, frag_out);
}

// The forward kernel's step: S = Q·Kᵀ (SS), P = bf16(S) re-indexed in registers, O = P·V (RS).
// Images: Q [64][D], K [KBlockN][D], V [KBlockN][D] (the same smem image format as K, reference/fa3.md §3.3).
template <int KBlockN, int D>
__global__ void __launch_bounds__(128)
    wgmma_chain_kernel(const uint8_t* image, uint32_t image_bytes, float* s_out, float* o_out) {
  using namespace fa4::ptx;
  static_assert(KBlockN % 16 == 0 && D % 64 == 0, "whole k-steps and swizzle chunks");
  uint8_t* smem = dynamic_smem_1024();
  load_image(smem, image, image_bytes);
  const uint32_t q = smem_addr(smem), k = q + 64u * D * 2u, v = k + uint32_t(KBlockN) * D * 2u;

  WgmmaAccumulator<KBlockN> s;
  poison(s);
  wgmma_fence_operand(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_ss<WgmmaInput::bf16, Major::k, Major::k>(
        s, sw128_k_major_desc(q + (kk / 4) * 64u * 128u + (kk % 4) * 32u),
        sw128_k_major_desc(k + (kk / 4) * uint32_t(KBlockN) * 128u + (kk % 4) * 32u), kk > 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(s);

  WgmmaFragmentA p[KBlockN / 16];
#pragma unroll
  for (int kb = 0; kb < KBlockN / 16; ++kb) p[kb] = fragment_a_from_accumulator<WgmmaInput::bf16>(s, kb);

  WgmmaAccumulator<D> o;
  poison(o);
  wgmma_fence_operand(o);
#pragma unroll
  for (int kb = 0; kb < KBlockN / 16; ++kb) wgmma_fence_operand(p[kb]);
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < KBlockN / 16; ++kb)
    wgmma_rs<WgmmaInput::bf16, Major::mn>(o, p[kb], sw128_mn_major_desc(v + kb * 2048u, uint32_t(KBlockN) * 128u),
                                          kb > 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  wgmma_fence_operand(o);
  store_fragment(s, s_out);
  store_fragment(o, o_out);
}

template <class Kernel>
bool set_smem(Kernel kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) == cudaSuccess;
}

template <WgmmaInput In, int N, int KDim>
void run_wgmma_ss() {
  constexpr int k_dim = KDim;
  const std::string what =
      std::string("SS m64n") + std::to_string(N) + "k16 " + name(In) + ", K = " + std::to_string(k_dim);
  SCOPED_TRACE(what);
  const auto q = random_matrix(In, size_t(64) * k_dim, 100 + N);
  const auto kt = random_matrix(In, size_t(N) * k_dim, 200 + N);
  std::vector<uint8_t> image;
  append_sw128_image(image, q.data(), 64, k_dim, k_dim);
  append_sw128_image(image, kt.data(), N, k_dim, k_dim);

  std::vector<double> ref(64 * N), mag(64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0, abs = 0;
      for (int kk = 0; kk < k_dim; ++kk) {
        const double prod = double(from_bits(In, q[m * k_dim + kk])) * from_bits(In, kt[n * k_dim + kk]);
        acc += prod;
        abs += std::fabs(prod);
      }
      ref[m * N + n] = acc;
      mag[m * N + n] = abs;
    }

  DeviceBuffer<uint8_t> dimage(image.size());
  DeviceBuffer<float> dfrag(128 * N / 2);
  ASSERT_TRUE(dimage.ptr && dfrag.ptr);
  CUDA_OK(cudaMemcpy(dimage.ptr, image.data(), image.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dfrag.ptr, 0xFF, dfrag.bytes()));
  const size_t smem = image.size() + 1024;
  ASSERT_TRUE(set_smem(wgmma_ss_kernel<In, N, KDim>, smem));
  wgmma_ss_kernel<In, N, KDim><<<1, 128, smem>>>(dimage.ptr, uint32_t(image.size()), dfrag.ptr);
  KERNEL_OK(what);
  std::vector<float> frag(128 * N / 2);
  CUDA_OK(cudaMemcpy(frag.data(), dfrag.ptr, dfrag.bytes(), cudaMemcpyDeviceToHost));
  expect_fragment_matches(frag, N, ref, mag, kRelTol, what);
}

template <WgmmaInput In, int N>
void run_wgmma_rs(int k_rows) {
  const std::string what =
      std::string("RS m64n") + std::to_string(N) + "k16 " + name(In) + ", K = " + std::to_string(k_rows);
  SCOPED_TRACE(what);
  const auto p = random_matrix(In, size_t(64) * k_rows, 300 + N);
  const auto v = random_matrix(In, size_t(k_rows) * N, 400 + N);
  std::vector<uint8_t> image;
  append_sw128_image(image, v.data(), k_rows, N, N);

  std::vector<double> ref(64 * N), mag(64 * N);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0, abs = 0;
      for (int kk = 0; kk < k_rows; ++kk) {
        const double prod = double(from_bits(In, p[m * k_rows + kk])) * from_bits(In, v[kk * N + n]);
        acc += prod;
        abs += std::fabs(prod);
      }
      ref[m * N + n] = acc;
      mag[m * N + n] = abs;
    }

  DeviceBuffer<uint16_t> dp(p.size());
  DeviceBuffer<uint8_t> dimage(image.size());
  DeviceBuffer<float> dfrag(128 * N / 2);
  ASSERT_TRUE(dp.ptr && dimage.ptr && dfrag.ptr);
  CUDA_OK(cudaMemcpy(dp.ptr, p.data(), dp.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dimage.ptr, image.data(), image.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dfrag.ptr, 0xFF, dfrag.bytes()));
  const size_t smem = image.size() + 1024;
  ASSERT_TRUE(set_smem(wgmma_rs_kernel<In, N>, smem));
  wgmma_rs_kernel<In, N><<<1, 128, smem>>>(dp.ptr, k_rows, dimage.ptr, uint32_t(image.size()), dfrag.ptr);
  KERNEL_OK(what);
  std::vector<float> frag(128 * N / 2);
  CUDA_OK(cudaMemcpy(frag.data(), dfrag.ptr, dfrag.bytes(), cudaMemcpyDeviceToHost));
  expect_fragment_matches(frag, N, ref, mag, kRelTol, what);
}

template <int KBlockN, int D>
void run_wgmma_chain() {
  const std::string what =
      "S = Q·Kᵀ (m64n" + std::to_string(KBlockN) + ") -> P regs -> O = P·V (m64n" + std::to_string(D) + ")";
  SCOPED_TRACE(what);
  constexpr auto In = WgmmaInput::bf16;
  const auto q = random_matrix(In, size_t(64) * D, 500 + KBlockN);
  const auto k = random_matrix(In, size_t(KBlockN) * D, 600 + KBlockN);
  const auto v = random_matrix(In, size_t(KBlockN) * D, 700 + KBlockN);
  std::vector<uint8_t> image;
  append_sw128_image(image, q.data(), 64, D, D);
  append_sw128_image(image, k.data(), KBlockN, D, D);
  append_sw128_image(image, v.data(), KBlockN, D, D);

  DeviceBuffer<uint8_t> dimage(image.size());
  DeviceBuffer<float> ds(128 * KBlockN / 2), dout(128 * D / 2);
  ASSERT_TRUE(dimage.ptr && ds.ptr && dout.ptr);
  CUDA_OK(cudaMemcpy(dimage.ptr, image.data(), image.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(ds.ptr, 0xFF, ds.bytes()));
  CUDA_OK(cudaMemset(dout.ptr, 0xFF, dout.bytes()));
  const size_t smem = image.size() + 1024;
  ASSERT_TRUE(set_smem(wgmma_chain_kernel<KBlockN, D>, smem));
  wgmma_chain_kernel<KBlockN, D><<<1, 128, smem>>>(dimage.ptr, uint32_t(image.size()), ds.ptr, dout.ptr);
  KERNEL_OK(what);
  std::vector<float> sfrag(128 * KBlockN / 2), ofrag(128 * D / 2);
  CUDA_OK(cudaMemcpy(sfrag.data(), ds.ptr, ds.bytes(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ofrag.data(), dout.ptr, dout.bytes(), cudaMemcpyDeviceToHost));

  // S against fp64; then P = bf16(S as the GPU computed it, round to nearest even), so O checks the register
  // re-indexing and the RS product independently of S's rounding.
  std::vector<double> sref(64 * KBlockN), smag(64 * KBlockN);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < KBlockN; ++n) {
      double acc = 0, abs = 0;
      for (int d = 0; d < D; ++d) {
        const double prod = double(from_bits(In, q[m * D + d])) * from_bits(In, k[n * D + d]);
        acc += prod;
        abs += std::fabs(prod);
      }
      sref[m * KBlockN + n] = acc;
      smag[m * KBlockN + n] = abs;
    }
  expect_fragment_matches(sfrag, KBlockN, sref, smag, kRelTol, what + ", S");

  std::vector<float> pm(64 * KBlockN);
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < KBlockN / 2; ++i)
      pm[fa4::ptx::accumulator_row(t, i) * KBlockN + fa4::ptx::accumulator_col(t, i)] =
          fa4::num::round_to_bf16(sfrag[t * (KBlockN / 2) + i]);
  std::vector<double> oref(64 * D), omag(64 * D);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < D; ++n) {
      double acc = 0, abs = 0;
      for (int j = 0; j < KBlockN; ++j) {
        const double prod = double(pm[m * KBlockN + j]) * from_bits(In, v[j * D + n]);
        acc += prod;
        abs += std::fabs(prod);
      }
      oref[m * D + n] = acc;
      omag[m * D + n] = abs;
    }
  expect_fragment_matches(ofrag, D, oref, omag, kRelTol, what + ", O");
}

TEST(GpuWgmma, SsBothKMajorQKtShapesBf16) {
  REQUIRE_WGMMA();
  run_wgmma_ss<WgmmaInput::bf16, 64, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 80, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 96, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 112, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 128, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 144, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 176, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 192, 128>();
  run_wgmma_ss<WgmmaInput::bf16, 256, 128>();
}

TEST(GpuWgmma, SsHeadDims64And256AndFp16) {
  REQUIRE_WGMMA();
  run_wgmma_ss<WgmmaInput::bf16, 128, 64>();
  run_wgmma_ss<WgmmaInput::bf16, 128, 256>();
  run_wgmma_ss<WgmmaInput::f16, 176, 128>();
}

TEST(GpuWgmma, RsRegisterAWithVMnMajor) {
  REQUIRE_WGMMA();
  run_wgmma_rs<WgmmaInput::bf16, 64>(176);
  run_wgmma_rs<WgmmaInput::bf16, 128>(176);
  run_wgmma_rs<WgmmaInput::bf16, 128>(64);
  run_wgmma_rs<WgmmaInput::bf16, 192>(128);
  run_wgmma_rs<WgmmaInput::bf16, 256>(80);
  run_wgmma_rs<WgmmaInput::f16, 128>(176);
}

TEST(GpuWgmma, ChainSThenPInRegistersThenO) {
  REQUIRE_WGMMA();
  run_wgmma_chain<176, 128>();
  run_wgmma_chain<128, 64>();
  run_wgmma_chain<80, 256>();
}

// ---- (c) the mbarrier ring ----------------------------------------------------------------------------------

namespace ring {

constexpr int kTileRows = 64, kTileCols = 64;  // one 128B-swizzled bf16 box per stage
constexpr uint32_t kTileBytes = kTileRows * kTileCols * 2;
constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);         // warpgroup 0 = producer (warp 0 works)
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;  // FA3's split for 2 consumer warpgroups
static_assert(128 * (kProducerRegisters + kConsumerWarpgroups * kConsumerRegisters) <= 65536,
              "setmaxnreg budgets must fit the register file");
static_assert(kTileBytes % fa4::ptx::kSw128AtomBytes == 0, "stages stay 1024-byte aligned");

enum class Producer : int { tma = 0, plain_stores = 1 };

// A deterministic sprinkle of delays on both sides, so stages are found both full and empty and every wrap
// happens under contention.
__device__ __forceinline__ void maybe_stall(uint32_t tile, uint32_t salt) {
  const uint32_t h = (tile * 2654435761u) ^ (salt * 40503u);
  if ((h >> 7) % 5 == 0) __nanosleep((h >> 12) % 4000);
}

// Mode is a template parameter so each producer path is compiled alone and fits the producer's register budget.
template <int Stages, Producer Mode>
__global__ void __launch_bounds__(kThreads, 1)
    ring_kernel(const __grid_constant__ CUtensorMap map, const uint16_t* in, uint16_t* out, int tiles_per_cta) {
  using namespace fa4::ptx;
  using fa4::cuda::Pipeline;
  __shared__ fa4::cuda::PipelineBarriers<Stages> barriers;
  uint8_t* stages = dynamic_smem_1024();
  const int warpgroup = threadIdx.x / 128;
  const int first_tile = blockIdx.x * tiles_per_cta;

  if (threadIdx.x == 0) {
    // TMA: one arrival (with the byte count) per fill. Plain stores: each of the 32 producer lanes arrives after
    // its own stores. Every consumer thread releases after its own reads.
    Pipeline<Stages>::init(barriers, Mode == Producer::tma ? 1 : 32, 128 * kConsumerWarpgroups);
  }
  __syncthreads();
  Pipeline<Stages> pipe(barriers);

  if (warpgroup == 0) {
    setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x >= 32) return;  // one producer warp, as in the forward kernel
    auto st = fa4::cuda::producer_start_state<Stages>();
    for (int t = 0; t < tiles_per_cta; ++t, ++st) {
      uint8_t* stage = stages + st.index * kTileBytes;
      maybe_stall(first_tile + t, 1);
      if constexpr (Mode == Producer::tma) {
        if (elect_one_sync()) {
          pipe.producer_acquire(st);
          pipe.producer_expect_tx(st, kTileBytes);
          const int32_t coords[2] = {0, (first_tile + t) * kTileRows};
          tma_load(stage, &map, coords, pipe.full_barrier(st));
        }
        __syncwarp();
      } else {
        pipe.producer_acquire(st);
        const uint16_t* src = in + size_t(first_tile + t) * kTileRows * kTileCols;
#pragma unroll 2  // a fully unrolled copy holds 16 uint4 in flight: more than the producer's registers
        for (int chunk = threadIdx.x; chunk < kTileRows * 8; chunk += 32) {  // 16-byte chunks, 8 per row
          const int r = chunk / 8, c = (chunk % 8) * 8;
          *reinterpret_cast<uint4*>(stage + sw128_offset(r, c, 2)) =
              *reinterpret_cast<const uint4*>(src + r * kTileCols + c);
        }
        pipe.producer_commit(st);
      }
    }
    return;
  }

  setmaxnreg_inc<kConsumerRegisters>();
  const int ct = threadIdx.x - 128 * warpgroup;  // thread within the consumer warpgroup
  auto st = fa4::cuda::consumer_start_state<Stages>();
  for (int t = 0; t < tiles_per_cta; ++t, ++st) {
    pipe.consumer_wait(st);
    const uint8_t* stage = stages + st.index * kTileBytes;
    uint16_t* dst = out + size_t(first_tile + t) * kTileRows * kTileCols;
    // Warpgroup w copies rows 32w .. 32w+31: 256 chunks of 16 bytes, 2 per thread.
    for (int chunk = ct; chunk < 32 * 8; chunk += 128) {
      const int r = 32 * (warpgroup - 1) + chunk / 8, c = (chunk % 8) * 8;
      *reinterpret_cast<uint4*>(dst + r * kTileCols + c) =
          *reinterpret_cast<const uint4*>(stage + sw128_offset(r, c, 2));
    }
    maybe_stall(first_tile + t, 2 + warpgroup + ct / 32);
    pipe.consumer_release(st);
  }
}

template <int Stages, Producer Mode>
void run() {
  constexpr Producer mode = Mode;
  const std::string what =
      std::to_string(Stages) + "-stage ring, " + (mode == Producer::tma ? "TMA producer" : "plain-store producer");
  SCOPED_TRACE(what);
  constexpr int kCtas = 8, kTilesPerCta = 211;  // 211 is prime: no stage count divides it
  const size_t rows = size_t(kCtas) * kTilesPerCta * kTileRows, elems = rows * kTileCols;
  const auto host = random_matrix(WgmmaInput::bf16, elems, 1000 + Stages);
  DeviceBuffer<uint16_t> in(elems), out(elems);
  ASSERT_TRUE(in.ptr && out.ptr);
  CUDA_OK(cudaMemcpy(in.ptr, host.data(), in.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(out.ptr, 0xFF, out.bytes()));

  fa4::cuda::TmaTensorSpec spec;
  spec.data = in.ptr;
  spec.rank = 2;
  spec.dims = {uint64_t(kTileCols), rows};
  spec.strides_bytes = {2, kTileCols * 2};
  spec.box = {uint32_t(kTileCols), uint32_t(kTileRows)};
  CUtensorMap map;  // a named variable: 64-byte aligned (tensormap.hpp)
  fa4::cuda::make_tma_tensor_map(spec, &map);

  const size_t smem = size_t(Stages) * kTileBytes + 1024;
  ASSERT_TRUE(set_smem(ring_kernel<Stages, Mode>, smem));
  ring_kernel<Stages, Mode><<<kCtas, kThreads, smem>>>(map, in.ptr, out.ptr, kTilesPerCta);
  KERNEL_OK(what);

  std::vector<uint16_t> got(elems);
  CUDA_OK(cudaMemcpy(got.data(), out.ptr, out.bytes(), cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < elems; ++i)
    if (got[i] != host[i] && ++bad <= 8) {
      const size_t row = i / kTileCols, tile = row / kTileRows;
      ADD_FAILURE() << "CTA " << tile / kTilesPerCta << ", tile " << tile % kTilesPerCta << " (stage "
                    << (tile % kTilesPerCta) % Stages << "), row " << row % kTileRows << ", col " << i % kTileCols
                    << ": 0x" << std::hex << got[i] << ", expected 0x" << host[i] << std::dec;
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << elems << " elements wrong";
  if (bad == 0) std::printf("  %s: %zu elements through %d tiles per CTA\n", what.c_str(), elems, kTilesPerCta);
}

}  // namespace ring

TEST(GpuPipeline, TmaProducerTwoConsumerWarpgroups) {
  REQUIRE_TMA();
  ring::run<2, ring::Producer::tma>();
  ring::run<3, ring::Producer::tma>();
  ring::run<5, ring::Producer::tma>();
}

TEST(GpuPipeline, PlainStoreProducerTwoConsumerWarpgroups) {
  REQUIRE_TMA();
  ring::run<2, ring::Producer::plain_stores>();
  ring::run<3, ring::Producer::plain_stores>();
  ring::run<5, ring::Producer::plain_stores>();
}

}  // namespace
