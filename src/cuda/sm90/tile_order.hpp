// The linear order in which the persistent sm_90a forward walks its work tiles (scheduler.cuh), host and device,
// so the CPU tests check that it is a permutation and longest-first where it should be:
//   static (non-causal): query blocks fastest, then heads, then batch — the CTAs running at once share the K/V
//                        of few heads in L2;
//   LPT (causal):        sections of `lpt_section` (batch, head) pairs whose K/V fit in L2 together, one after the
//                        other; inside a section query blocks slowest and last first (the longest rows first),
//                        then the pairs. Longest-first over the whole problem would stream every head's K/V
//                        through L2 at once.
// Split-KV (num_splits > 1, never with LPT): each tile is split into num_splits key ranges, the split index
// fastest, so a tile's ranges run at the same time and share its Q in L2.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::sm90 {

struct WorkTile {
  int32_t m_block;  // query rows [block_m·m_block, block_m·(m_block + 1))
  int32_t head;     // query head
  int32_t batch;
  int32_t split = 0;  // key range of num_splits (split-KV); 0 without
};

struct TileOrder {
  int32_t num_m_blocks = 0;
  int32_t heads_q = 0;
  int32_t batch = 0;
  bool lpt = false;         // the causal order
  int32_t lpt_section = 1;  // (batch, head) pairs per section, >= 1
  int32_t num_splits = 1;   // key ranges per tile (> 1 only in the static order)

  FA4_HD int32_t num_tiles() const { return num_m_blocks * heads_q * batch * num_splits; }

  // Tile `linear` (0 <= linear < num_tiles()).
  FA4_HD WorkTile tile(int32_t linear) const {
    WorkTile t;
    uint32_t n = uint32_t(linear);
    if (num_splits > 1) {
      t.split = int32_t(n % uint32_t(num_splits));
      n /= uint32_t(num_splits);
    }
    if (lpt) {
      const uint32_t pairs = uint32_t(heads_q) * uint32_t(batch), blocks = uint32_t(num_m_blocks);
      const uint32_t first_pair = n / (uint32_t(lpt_section) * blocks) * uint32_t(lpt_section);
      const uint32_t width = pairs - first_pair < uint32_t(lpt_section) ? pairs - first_pair : uint32_t(lpt_section);
      const uint32_t rest = n - first_pair * blocks;
      t.m_block = num_m_blocks - 1 - int32_t(rest / width);
      const uint32_t pair = first_pair + rest % width;
      t.head = int32_t(pair % uint32_t(heads_q));
      t.batch = int32_t(pair / uint32_t(heads_q));
    } else {
      t.m_block = int32_t(n % uint32_t(num_m_blocks));
      const uint32_t rest = n / uint32_t(num_m_blocks);
      t.head = int32_t(rest % uint32_t(heads_q));
      t.batch = int32_t(rest / uint32_t(heads_q));
    }
    return t;
  }
};

}  // namespace fa4::sm90
