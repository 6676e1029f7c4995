// The rotated query-tile walk of the sm_90a backward (host and device, so the CPU tests check its turn order).
// Without a mask every key block visits every query tile. Walking them all from tile 0 makes the blocks meet
// on the same tile at the same time: in deterministic mode each waits for the one before it to add its dQ slab
// (a staircase as long as the blocks of a head, paid once per wave), and in either mode their reduce-adds land
// on the same addresses together. Rotated, key block j of n starts its walk at tile o_j = ⌊j·m_tiles / n⌋ and
// wraps, so at any step the blocks are on n different tiles, and a tile's visitors arrive m_tiles / n steps
// apart. Deterministic mode adds a tile's slabs in arrival order: a block's turn is the number of blocks that
// reach the tile at an earlier step. Taken only where n <= m_tiles (distinct starts) and every block of a head
// can be resident at once (the turn order then asks a CTA to wait for CTAs launched after it: host's check).
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace fa4::sm90 {

struct RotatedWalk {
  int32_t n_blocks = 1;  // key blocks per (batch, kv head), <= m_tiles
  int32_t m_tiles = 1;   // query tiles, every one visited by every key block

  // The first tile of key block j's walk.
  FA4_HD int32_t start(int32_t n_block) const { return int32_t(int64_t(n_block) * m_tiles / n_blocks); }

  // The step at which key block j reaches tile m.
  FA4_HD int32_t step(int32_t n_block, int32_t m_block) const {
    const int32_t s = m_block - start(n_block);
    return s < 0 ? s + m_tiles : s;
  }

  // Key blocks whose walk starts before tile x (0 <= x <= m_tiles): start(j) < x  <=>  j < x·n / m_tiles.
  FA4_HD int32_t starts_before(int32_t x) const {
    return int32_t((int64_t(x) * n_blocks + m_tiles - 1) / m_tiles);
  }

  // Deterministic mode's turn of key block j on tile m: the blocks reaching m at an earlier step are those whose
  // start lies in the s tiles up to m (cyclically), s = step(j, m).
  FA4_HD int32_t turn(int32_t n_block, int32_t m_block) const {
    const int32_t first = m_block - step(n_block, m_block) + 1;  // the window of starts is [first, m_block]
    if (first >= 0) return starts_before(m_block + 1) - starts_before(first);
    return starts_before(m_block + 1) + n_blocks - starts_before(first + m_tiles);
  }
};

}  // namespace fa4::sm90
