#include <cuda_runtime.h>

#include <string>

#include "cuda/numerics_probe.hpp"
#include "fa4/fa4.hpp"
#include "numerics/convert.hpp"
#include "numerics/exp2.hpp"

namespace fa4::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(Status::cuda_error, std::string("fa4: ") + what + ": " + cudaGetErrorString(e));
}

__global__ void exp2_kernel(const float* in, float* out, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = num::exp2_emulated(in[i]);
}

__global__ void convert_kernel(const float* in, uint16_t* bf16, uint16_t* f16, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    bf16[i] = num::float_to_bf16_bits(in[i]);
    f16[i] = num::float_to_f16_bits(in[i]);
  }
}

template <class T>
T* device_alloc(std::size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * sizeof(T) + 1), "cudaMalloc");
  return static_cast<T*>(p);
}

}  // namespace

void exp2_emulated_on_device(const float* in, float* out, std::size_t n) {
  float* din = device_alloc<float>(n);
  float* dout = device_alloc<float>(n);
  check(cudaMemcpy(din, in, n * sizeof(float), cudaMemcpyHostToDevice), "copy to device");
  exp2_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(din, dout, n);
  check(cudaGetLastError(), "exp2 probe launch");
  check(cudaMemcpy(out, dout, n * sizeof(float), cudaMemcpyDeviceToHost), "copy to host");
  cudaFree(din);
  cudaFree(dout);
}

void convert_on_device(const float* in, uint16_t* bf16, uint16_t* f16, std::size_t n) {
  float* din = device_alloc<float>(n);
  uint16_t* db = device_alloc<uint16_t>(n);
  uint16_t* dh = device_alloc<uint16_t>(n);
  check(cudaMemcpy(din, in, n * sizeof(float), cudaMemcpyHostToDevice), "copy to device");
  convert_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(din, db, dh, n);
  check(cudaGetLastError(), "convert probe launch");
  check(cudaMemcpy(bf16, db, n * sizeof(uint16_t), cudaMemcpyDeviceToHost), "copy to host");
  check(cudaMemcpy(f16, dh, n * sizeof(uint16_t), cudaMemcpyDeviceToHost), "copy to host");
  cudaFree(din);
  cudaFree(db);
  cudaFree(dh);
}

}  // namespace fa4::cuda
