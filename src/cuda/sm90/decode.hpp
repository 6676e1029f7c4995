// Host view of the decode kernel (decode.cu): one query per sequence against a dense K/V or a KV cache, each CTA one
// (key range, kv head, sequence) with the kv head's `group` query heads as the rows of one 16-row tile, on
// mma.sync: FlashDecoding's shape. The default for the calls it takes whose key ranges are short (perf-log F27:
// there the forward kernel's decode row spends its 64-row wgmma tile on 4-8 real rows and its warp specialisation
// on one or two key tiles per CTA; FA4_FWD_DECODE_KERNEL, launch.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fa4/fa4.hpp"
#include "numerics/online_softmax.hpp"

namespace fa4::sm90 {

inline constexpr int kDecodeMaxRows = 16;  // group (query heads per kv head) at most this: one m16 tile
inline constexpr int kDecodeChunkKeys = 64;  // keys per step of a CTA (16 per key warp): a key range's unit
// K/V chunks in flight per CTA, and so CTAs per SM (shared memory at d = 128, 34 KiB a stage; decode.cu asserts it
// and holds its registers to fit):
// two stages, three CTAs. FA4_AB_DECODE_STAGES=3 (two CTAs, four chunks in flight per SM where two stages keep
// three) is an A/B define for a build's CUDA flags (perf-log F28), read by the kernel and the split rule alike.
#ifndef FA4_AB_DECODE_STAGES
#define FA4_AB_DECODE_STAGES 2
#endif
#ifndef FA4_AB_DECODE_WARP_RINGS  // 1: each warp copies and waits for its own rows (decode.cu; perf-log F28b)
#define FA4_AB_DECODE_WARP_RINGS 0
#endif
#ifndef FA4_AB_DECODE_COLUMN_HALVES  // 1: at d = 128 eight warps, two per 16 keys, each P·V on half of the columns
#define FA4_AB_DECODE_COLUMN_HALVES 0   // (decode.cu; perf-log F34)
#endif
inline constexpr int kDecodeStages = FA4_AB_DECODE_STAGES;
inline constexpr int kDecodeCtasPerSm = kDecodeStages == 2 ? 3 : kDecodeStages == 3 ? 2 : 1;
// CTAs per SM the split rule plans for a head dim: kDecodeCtasPerSm, or with F34's eight warps at d = 128 two
// (their registers: 2 × 256 threads × 128 ≤ 64K; decode.cu's __launch_bounds__ holds them).
constexpr int decode_planned_ctas_per_sm(int64_t head_dim) {
  return FA4_AB_DECODE_COLUMN_HALVES && head_dim == 128 ? 2 : kDecodeCtasPerSm;
}
static_assert(!FA4_AB_DECODE_COLUMN_HALVES || (kDecodeStages == 2 && !FA4_AB_DECODE_WARP_RINGS),
              "F34 is measured against main's two stages, without F28b's per-warp rings (a warp copies what two read)");
inline constexpr int64_t kDecodeMaxRangeKeys = 1024;  // the default's longest range (launch.cu; FA4_FWD_DECODE_KERNEL)
// Whether the kernel can append a KV-cache call's new keys itself (DecodeParams::k_new; perf-log F33: the C++
// KV-cache call 12.8 → 9.5-10.1 µs of host time): the default since the thirteenth session (FA4_AB_DECODE_APPEND=0
// in a build's CUDA flags restores the append kernel). Not with the per-warp rings (F28b): the copy of a chunk's new
// rows into the cache reads rows other warps loaded.
#ifndef FA4_AB_DECODE_APPEND
#define FA4_AB_DECODE_APPEND 1
#endif
inline constexpr bool kDecodeAppends = FA4_AB_DECODE_APPEND && !FA4_AB_DECODE_WARP_RINGS;

struct DecodeParams {
  // q, out [batch, 1, heads_q, head_dim]: element strides of batch and head (head_dim contiguous, pairs aligned).
  const void* q = nullptr;
  int64_t q_stride_b = 0, q_stride_h = 0;
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_h = 0;
  float* lse = nullptr;  // [batch, heads_q, 1] natural log, or null
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  // k, v [batch (or pages), rows, heads_kv, head_dim]: one set of element strides for both (rows 16-byte aligned).
  // Key j of sequence b is row j of batch b, or with page_table row j % page_size of page page_table[b ·
  // page_table_stride + j / page_size].
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_stride_b = 0, kv_stride_s = 0, kv_stride_h = 0;
  const int32_t* page_table = nullptr;
  int32_t page_table_stride = 0, page_size = 0;
  // Keys of sequence b: seqused_k[b] + seqlen_k_added (a KV-cache call), or seqlen_k (seqused_k null).
  const int32_t* seqused_k = nullptr;
  int32_t seqlen_k = 0, seqlen_k_added = 0;
  int32_t batch = 0, heads_kv = 0, group = 1, num_splits = 1;
  num::ScoreTransform score;
  float rescale_threshold = 8;
  // num_splits > 1: O / l and LSE of each range into [num_splits][batch][heads_q] rows (the combine kernel's
  // layout, split_combine.hpp) instead of out and lse.
  float* o_partial = nullptr;
  float* lse_partial = nullptr;
  // A KV-cache call's append (last: the fields above keep their offsets), done by this kernel (perf-log F33; null:
  // nothing to append, or the append kernel ran first): keys seqused_k[b] .. seqused_k[b] + seqlen_k_added - 1 of
  // sequence b are read from k_new / v_new [batch, seqlen_k_added, heads_kv, head_dim] (one set of element strides,
  // rows 16-byte aligned), and the CTA whose range holds such a key writes it into its slot of k and v (which are
  // then the caches the call appends to).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t new_stride_b = 0, new_stride_s = 0, new_stride_h = 0;
};

// Whether the decode kernel is compiled for (dtype, head_dim).
bool has_decode_kernel(DType dtype, int64_t head_dim);

// CTAs of the (dtype, head_dim) instances an SM of the current device holds, the fewer of the appending one's and the
// other's (the occupancy API; 0: no such instance, -1: the query failed): decode_planned_ctas_per_sm, what the split
// rule assumes.
int decode_ctas_per_sm(DType dtype, int head_dim);

// Grid: num_splits × heads_kv × batch CTAs, launched as a programmatic dependent of the stream's previous kernel.
cudaError_t launch_decode(DType dtype, int head_dim, const DecodeParams& p, cudaStream_t stream);

}  // namespace fa4::sm90
