// Runs the shared numerics on the GPU, so tests can check that device results are bitwise those of the host
// (the exp2 emulation and the conversions are one source compiled twice).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fa4::cuda {

// out[i] = exp2_emulated(in[i]) computed on device 0; host buffers. Throws fa4::Error on CUDA errors.
void exp2_emulated_on_device(const float* in, float* out, std::size_t n);
// bits[i] = float_to_bf16_bits(in[i]) and float_to_f16_bits(in[i]) on the device.
void convert_on_device(const float* in, uint16_t* bf16, uint16_t* f16, std::size_t n);

}  // namespace fa4::cuda
