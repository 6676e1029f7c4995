// Host helpers the sm_90a forward and backward launchers share (launch.cu defines them): tensor maps of
// [batch, seqlen, heads, head_dim] tensors, cached device attributes, the current-device guard.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "fa4/fa4.hpp"

namespace fa4::sm90 {

inline constexpr int kBatch = 0, kSeq = 1, kHeads = 2;  // Tensor dims: [batch, seqlen, heads, head_dim]

// An on/off A/B switch from the environment: unset or empty gives `fallback`, "0" off, "1" on; any other value
// is an error naming the variable, not a silent default.
bool env_switch(const char* call, const char* name, bool fallback);

// Throws Error(cuda_error) "<call>: <what>: <name> (<description>)" unless e is cudaSuccess.
inline void throw_if_cuda_error(const char* call, cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(Status::cuda_error, std::string(call) + ": " + what + ": " + cudaGetErrorName(e) + " (" +
                                        cudaGetErrorString(e) + ")");
}

// Device memory from the stream-ordered allocator, given back in stream order on every path (an error after
// the allocation included); CUDA-graph capture records both as graph nodes.
class StreamOrderedBuffer {
 public:
  StreamOrderedBuffer(const char* call, size_t bytes, cudaStream_t stream, const std::string& what)
      : stream_(stream), what_(what) {
    throw_if_cuda_error(call, cudaMallocAsync(&ptr_, bytes, stream), ("cudaMallocAsync of " + what_).c_str());
  }
  ~StreamOrderedBuffer() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  StreamOrderedBuffer(const StreamOrderedBuffer&) = delete;
  StreamOrderedBuffer& operator=(const StreamOrderedBuffer&) = delete;
  void* get() const { return ptr_; }
  // Frees now (after the launches that use it, in stream order), reporting an error.
  void free(const char* call) {
    const cudaError_t e = cudaFreeAsync(ptr_, stream_);
    ptr_ = nullptr;
    throw_if_cuda_error(call, e, ("cudaFreeAsync of " + what_).c_str());
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
  std::string what_;
};

// TMA coordinate steps of a mapped tensor's heads and batch dims: 1, or 0 where the dim is collapsed (stride 0
// or size 1, mapped with extent 1).
struct CoordSteps {
  int32_t head = 1, batch = 1;
};

// Encodes t's rank-4 map {head_dim, seqlen, heads, batch} with boxes {64, box_rows, 1, 1} and the 128-byte
// swizzle into *map (64-byte aligned) and returns the coordinate steps.
CoordSteps map_tensor(const Tensor& t, int64_t head_dim, uint32_t box_rows, CUtensorMap* map);

// Attribute `attr` of CUDA device `index`, queried once per (device, attribute) and cached; nullopt if the query
// fails (no such device).
std::optional<int> device_attribute(int index, cudaDeviceAttr attr);

// Makes `index` the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  DeviceGuard(const char* call, int index) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (const cudaError_t e = cudaSetDevice(index); e != cudaSuccess)
      throw Error(Status::cuda_error, std::string(call) + ": cudaSetDevice(" + std::to_string(index) + "): " + cudaGetErrorString(e));
    switched_ = previous_ >= 0 && previous_ != index;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace fa4::sm90
