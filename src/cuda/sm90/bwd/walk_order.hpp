// Deterministic mode's rotated walk (FA4_BWD_DET_ROTATED, perf-log B29): where nothing is masked, every key block
// of a (batch, kv head) visits all P = group · m_tiles positions of its walk (query head, then query tile). Key
// block j starts at position ⌊j·P/n⌋ of the n blocks and wraps, so at every step the n blocks are on n different
// positions, and the slabs of a position are added in arrival order: a block's turn on a position is the number
// of blocks that reach it at an earlier step. Each block then waits only for the block that reached the
// position one step before it (no chain fill), provided every block of the (batch, kv head) runs at once: the
// kernel runs it on a persistent cooperative grid (bwd/kernel.cu). Host and device code (the CPU tests check the
// turns against the arrival steps).
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::sm90 {

// 32-bit arithmetic (the turn is computed per tile in the producer warps' 24 registers, where a 64-bit division
// spills): the host takes the walk only where n · P < 2^31 (kMaxProduct).
struct RotatedWalk {
  static constexpr int64_t kMaxProduct = int64_t{1} << 31;
  uint32_t n_blocks = 1;   // n: the key blocks of the (batch, kv head)
  uint32_t positions = 1;  // P = group · m_tiles, at least n (distinct starts)

  // The first position of key block j: ⌊j·P/n⌋, strictly increasing in j when P >= n.
  FA4_HD int32_t start(int32_t j) const { return int32_t(uint32_t(j) * positions / n_blocks); }
  // The blocks whose walks start at or before position t: #{j : ⌊j·P/n⌋ <= t} = ⌈(t + 1)·n / P⌉.
  FA4_HD int32_t starts_up_to(int32_t t) const {
    return int32_t((uint32_t(t + 1) * n_blocks + positions - 1) / positions);
  }
  // Key block j's turn on position t. Block j reaches t at step (t − start(j)) mod P: first the a blocks that
  // start at or before t, from the latest start (block a − 1) down to block 0, then those that start after t
  // (wrapping), from block n − 1 down to block a. So the turn is (a − 1 − j) mod n.
  FA4_HD int32_t turn(int32_t j, int32_t t) const {
    const int32_t r = starts_up_to(t) - 1 - j;
    return r < 0 ? r + int32_t(n_blocks) : r;
  }
};

}  // namespace fa4::sm90
