// Which element of a 64×N tile each thread of a warpgroup holds in a wgmma register fragment
// (reference/fa3.md §3.5, §3.6). Host and device: kernels index rows/columns with it (masking, row max), tests
// decode device fragments with it.
//
// Thread t of the warpgroup: warp w = t / 32, lane l = t % 32, base row r = 16·w + l / 4, column pair c = l % 4.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::ptx {

inline constexpr int kWarpgroupThreads = 128;

// fp32 accumulator of m64nNk16, register i in [0, N/2): 8-column block i/4; inside it the pairs
// (r, 2c), (r, 2c+1), (r+8, 2c), (r+8, 2c+1).
FA4_HD constexpr int accumulator_row(int thread, int reg) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * ((reg / 2) % 2);
}
FA4_HD constexpr int accumulator_col(int thread, int reg) { return 8 * (reg / 4) + 2 * (thread % 4) + (reg % 2); }

// 16-bit A operand of an RS wgmma (64×16 per k-step): 4 b32 registers of 2 elements, low half = even column.
// Register j holds row r + 8·(j%2), columns 8·(j/2) + 2c and + 1 — the accumulator layout of a 64×16 slice, so
// register j of k-block kk packs accumulator registers 8·kk + 2·j (low) and 8·kk + 2·j + 1 (high).
FA4_HD constexpr int fragment_a_row(int thread, int reg) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * (reg % 2);
}
FA4_HD constexpr int fragment_a_col(int thread, int reg, int half) { return 8 * (reg / 2) + 2 * (thread % 4) + half; }
FA4_HD constexpr int fragment_a_source_reg(int k_block, int reg, int half) { return 8 * k_block + 2 * reg + half; }

static_assert(accumulator_row(127, 3) == 63 && accumulator_col(127, 3) == 7, "last thread, first block: (63, 7)");
static_assert(fragment_a_row(37, 1) == accumulator_row(37, fragment_a_source_reg(0, 1, 0)) &&
                  fragment_a_col(37, 2, 1) == accumulator_col(37, fragment_a_source_reg(0, 2, 1)),
              "the A fragment of a 64x16 slice is the accumulator layout of that slice");

}  // namespace fa4::ptx
