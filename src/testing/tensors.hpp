// Host tensors for tests, `fa4 check` and `fa4 run`: owned buffers in any dtype and layout, random fill
// (rounded to the dtype, never zeros), NaN poisoning, and the reads the comparisons need.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "fa4/fa4.hpp"

namespace fa4::testing {

// Storage order of the [b, s, h, d] dims: bshd (canonical) or bhsd (through strides, no copy).
enum class Layout { bshd, bhsd };

class HostTensor {
 public:
  HostTensor() = default;
  // Move-only: the descriptor points into the owned buffer (a moved vector keeps its storage).
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  static HostTensor make(DType dtype, std::array<int64_t, 4> shape, Layout layout = Layout::bshd);
  static HostTensor make_lse(std::array<int64_t, 3> shape);  // [b, h, s_q] fp32

  const Tensor& desc() const { return desc_; }
  Tensor& desc() { return desc_; }
  int64_t numel() const { return desc_.numel(); }

  void fill_normal(uint64_t seed, double stddev = 1.0);
  void poison();  // every element NaN: an unwritten output cannot pass

  // Element at a logical index (rank 4: [b, s, h, d]; rank 3: [b, h, s]), as double.
  double at(const std::array<int64_t, 4>& idx) const;
  void set(const std::array<int64_t, 4>& idx, double value);
  // All elements in logical row-major order.
  std::vector<double> values() const;
  // The owned bytes; desc().data points at their start (a device mirror copies them as they are).
  std::vector<std::byte>& storage() { return bytes_; }
  const std::vector<std::byte>& storage() const { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
  Tensor desc_;
};

}  // namespace fa4::testing
