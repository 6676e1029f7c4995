#include "testing/tensors.hpp"

#include <cmath>
#include <limits>
#include <random>

#include "numerics/convert.hpp"

namespace fa4::testing {
namespace {

double read(const void* base, DType dtype, int64_t off) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f64: return static_cast<const double*>(base)[off];
    case DType::bf16: return num::bf16_bits_to_float(static_cast<const uint16_t*>(base)[off]);
    case DType::f16: return num::f16_bits_to_float(static_cast<const uint16_t*>(base)[off]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

void write(void* base, DType dtype, int64_t off, double x) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[off] = static_cast<float>(x); break;
    case DType::f64: static_cast<double*>(base)[off] = x; break;
    case DType::bf16: static_cast<uint16_t*>(base)[off] = num::float_to_bf16_bits(static_cast<float>(x)); break;
    case DType::f16: static_cast<uint16_t*>(base)[off] = num::float_to_f16_bits(static_cast<float>(x)); break;
  }
}

int64_t offset(const Tensor& t, const std::array<int64_t, 4>& idx) {
  int64_t off = 0;
  for (int i = 0; i < t.rank; ++i) off += idx[i] * t.stride[i];
  return off;
}

template <class F>
void for_each_index(const Tensor& t, F&& f) {
  std::array<int64_t, 4> ext{1, 1, 1, 1};
  for (int i = 0; i < t.rank; ++i) ext[i] = t.shape[i];
  for (int64_t a = 0; a < ext[0]; ++a)
    for (int64_t b = 0; b < ext[1]; ++b)
      for (int64_t c = 0; c < ext[2]; ++c)
        for (int64_t d = 0; d < ext[3]; ++d) f(std::array<int64_t, 4>{a, b, c, d});
}

}  // namespace

HostTensor HostTensor::make(DType dtype, std::array<int64_t, 4> shape, Layout layout) {
  HostTensor h;
  int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  h.bytes_.resize(static_cast<size_t>(std::max<int64_t>(n, 1)) * element_size(dtype));
  h.desc_ = Tensor::contiguous(h.bytes_.data(), dtype, Device::cpu, shape);
  if (layout == Layout::bhsd) {  // memory order b, h, s, d
    h.desc_.stride = {shape[2] * shape[1] * shape[3], shape[3], shape[1] * shape[3], 1};
  }
  return h;
}

HostTensor HostTensor::make_lse(std::array<int64_t, 3> shape) {
  HostTensor h;
  const int64_t n = shape[0] * shape[1] * shape[2];
  h.bytes_.resize(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  h.desc_ = Tensor::contiguous3(h.bytes_.data(), DType::f32, Device::cpu, shape);
  return h;
}

void HostTensor::fill_normal(uint64_t seed, double stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  for_each_index(desc_, [&](const auto& idx) { write(desc_.data, desc_.dtype, offset(desc_, idx), dist(rng)); });
}

void HostTensor::poison() {
  for_each_index(desc_, [&](const auto& idx) {
    write(desc_.data, desc_.dtype, offset(desc_, idx), std::numeric_limits<double>::quiet_NaN());
  });
}

double HostTensor::at(const std::array<int64_t, 4>& idx) const { return read(desc_.data, desc_.dtype, offset(desc_, idx)); }
void HostTensor::set(const std::array<int64_t, 4>& idx, double value) { write(desc_.data, desc_.dtype, offset(desc_, idx), value); }

std::vector<double> HostTensor::values() const {
  std::vector<double> v;
  v.reserve(static_cast<size_t>(numel()));
  for_each_index(desc_, [&](const auto& idx) { v.push_back(at(idx)); });
  return v;
}

}  // namespace fa4::testing
