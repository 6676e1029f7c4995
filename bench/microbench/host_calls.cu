// Host cost of the CUDA calls one fa4 launch path may make (issue 12: a C++ call <= 10 us of host time), each
// timed alone over N back-to-back calls on the calling thread, nothing synchronized in between: where the
// microseconds of `fa4 run --host-cost` can come from, and what caching each would save.
//   nvcc -O2 -std=c++20 -arch=sm_90a bench/microbench/host_calls.cu -o /tmp/host_calls && /tmp/host_calls [N]
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

__global__ void empty_kernel(int) {}

#define OK(x)                                                                           \
  do {                                                                                  \
    if (cudaError_t e_ = (x); e_ != cudaSuccess) {                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

template <class F>
double us_per_call(const char* what, int n, F&& f) {
  f();
  OK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  OK(cudaDeviceSynchronize());
  std::printf("%-72s %8.3f us\n", what, us);
  return us;
}

cudaError_t launch(cudaStream_t s, unsigned grid, unsigned threads, unsigned smem, unsigned cluster) {
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(grid), c.blockDim = dim3(threads), c.dynamicSmemBytes = smem, c.stream = s;
  cudaLaunchAttribute a{};
  if (cluster > 1) {
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = cluster, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
    c.attrs = &a, c.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&c, empty_kernel, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2000;
  cudaStream_t s;
  OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int dev = 0, value = 0;
  us_per_call("cudaGetDevice", n, [&] { OK(cudaGetDevice(&dev)); });
  us_per_call("cudaSetDevice (already current)", n, [&] { OK(cudaSetDevice(dev)); });
  us_per_call("cudaDeviceGetAttribute (SM count)", n,
              [&] { OK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, dev)); });
  us_per_call("cudaFuncSetAttribute (max dynamic smem, 200 KB)", n, [&] {
    OK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  });
  us_per_call("cudaLaunchKernelEx, 132 CTAs x 384 threads, 200 KB smem", n, [&] { OK(launch(s, 132, 384, 200 * 1024, 1)); });
  us_per_call("cudaLaunchKernelEx, 132 CTAs x 384 threads, 200 KB smem, cluster 2", n,
              [&] { OK(launch(s, 132, 384, 200 * 1024, 2)); });
  us_per_call("cudaLaunchKernelEx, 32 CTAs x 128 threads, no smem", n, [&] { OK(launch(s, 32, 128, 0, 1)); });
  us_per_call("<<<>>> launch, 32 CTAs x 128 threads", n, [&] { empty_kernel<<<32, 128, 0, s>>>(0); });
  us_per_call("cudaGetLastError", n, [&] { (void)cudaGetLastError(); });
  void* p = nullptr;
  us_per_call("cudaMallocAsync + cudaFreeAsync (64 KiB, stream-ordered)", n, [&] {
    OK(cudaMallocAsync(&p, 64 << 10, s));
    OK(cudaFreeAsync(p, s));
  });
  OK(cudaMalloc(&p, 64 << 10));
  us_per_call("cudaMemsetAsync (4 bytes)", n, [&] { OK(cudaMemsetAsync(p, 0, 4, s)); });
  cudaStreamCaptureStatus capture;
  us_per_call("cudaStreamIsCapturing", n, [&] { OK(cudaStreamIsCapturing(s, &capture)); });

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  OK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  alignas(64) CUtensorMap map;
  const cuuint64_t dims[4] = {128, 4096, 8, 1}, strides[3] = {8 * 128 * 2, 128 * 2, 4096 * 8 * 128 * 2};
  const cuuint32_t box[4] = {64, 128, 1, 1}, estr[4] = {1, 1, 1, 1};
  us_per_call("cuTensorMapEncodeTiled (bf16, rank 4, 128B swizzle)", n, [&] {
    if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      std::exit(2);
  });
  OK(cudaFree(p));
  OK(cudaStreamDestroy(s));
  return 0;
}
