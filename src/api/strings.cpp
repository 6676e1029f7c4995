// Names, sizes and descriptor helpers of the public types.
#include "fa4/fa4.hpp"

namespace fa4 {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
  }
  return "unknown-dtype";
}

const char* to_string(Device device) {
  switch (device) {
    case Device::cpu: return "cpu";
    case Device::cuda: return "cuda";
  }
  return "unknown-device";
}

const char* to_string(Pass pass) { return pass == Pass::forward ? "forward" : pass == Pass::backward ? "backward" : "unknown-pass"; }

const char* to_string(Status status) {
  switch (status) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::unsupported: return "unsupported";
    case Status::cuda_error: return "CUDA error";
    case Status::internal: return "internal error";
  }
  return "unknown status";
}

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
  }
  return 1;
}

Tensor Tensor::contiguous(void* data, DType dtype, Device device, std::array<int64_t, 4> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = 4;
  t.shape = shape;
  t.stride = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
  return t;
}

Tensor Tensor::contiguous3(void* data, DType dtype, Device device, std::array<int64_t, 3> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = 3;
  t.shape = {shape[0], shape[1], shape[2], 1};
  t.stride = {shape[1] * shape[2], shape[2], 1, 1};
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank && i < 4; ++i) n *= shape[i];
  return n;
}

const char* version() { return FA4_VERSION_STRING; }

}  // namespace fa4
