// The decode kernel (decode.hpp; perf-log F27). One CTA of four key warps (eight warps at d = 128 with F34's
// column halves) per (key range, kv head, sequence). The kv head's query heads are the rows of one 16-row tile (rows
// past the group are zeros, never stored); its key range streams through shared memory in chunks of 64 keys (16 per
// key warp) by cp.async, kStages chunks in flight, rows past the sequence's keys zero-filled (an unwritten cache
// slot may hold NaN, and 0 · NaN is NaN in P·V). Each warp keeps its own online softmax over its 16 keys of every
// chunk (S = Q·Kᵀ and O += P·V on mma.sync m16n8k16, P from the S registers, V through ldmatrix.trans), with the
// forward's numerics (num::ScoreTransform, the conditional rescale, finalize_row); at the end the four key warps'
// (m, l, O) merge through shared memory and the CTA writes its rows: O and LSE, or with splits the range's O / l
// and LSE for the combine kernel. A KV-cache call's new keys (DecodeParams::k_new) are read from k_new / v_new, and
// written into their cache slots by the CTA whose range holds them (perf-log F33).
#include "cuda/sm90/decode.hpp"

#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cuda/ptx/mma_sync.cuh"
#include "cuda/sm90/quad.cuh"
#include "cuda/sm90/tiles.cuh"
#include "numerics/convert.hpp"

namespace fa4::sm90 {
namespace {

constexpr int kKeysPerWarp = 16;  // one k-step of P·V
constexpr int kChunkKeys = kDecodeChunkKeys;
constexpr int kKeyWarps = kChunkKeys / kKeysPerWarp;  // warps that own a chunk's keys, 16 each
static_assert(kChunkKeys == kKeysPerWarp * kKeyWarps, "a chunk is every key warp's k-step");
// kDecodeStages (decode.hpp): two chunks in flight per CTA, 68 KiB of shared memory at d = 128, so three CTAs fit
// an SM, their registers too (ptxas: 166 at d = 128, 96 at d = 64, with F33's append 168 and 125; 3 × 4 warps ×
// 168 × 32 ≤ 64K; the GPU test DecodeKernelHoldsItsCtasPerSm asks the occupancy API, as a __launch_bounds__
// minimum would change the code). Four stages (136 KiB) left one warp per scheduler, and the kernel is issue-bound
// (4.4 cycles per instruction; perf-log F27).

template <int HeadDim>
struct DecodeLayout {
  // F34 (FA4_AB_DECODE_COLUMN_HALVES, decode.hpp): at d = 128 two warps per 16 keys, both computing S and P, each
  // P·V into half of O's columns: twice the warps for the dependent chains to hide each other, a shorter P·V and
  // rescale per warp. Else one warp per 16 keys, all of O.
  static constexpr int kColumnHalves = FA4_AB_DECODE_COLUMN_HALVES && HeadDim == 128 ? 2 : 1;
  static constexpr int kWarps = kKeyWarps * kColumnHalves;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kColumns = HeadDim / kColumnHalves;  // of O (and V) per warp
  // A K or V row padded by 16 bytes: consecutive rows start 4 banks apart, so the 8 rows an ldmatrix (or the 8 key
  // rows of a B fragment's 32-bit loads) touches fall in distinct banks.
  static constexpr int kRowBytes = HeadDim * 2 + 16;
  static constexpr int kTileBytes = kChunkKeys * kRowBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K, then V
  static constexpr int kSmemBytes = kDecodeStages * kStageBytes;
  static constexpr int kSegments = HeadDim * 2 / 16;  // 16-byte copies per row
  static constexpr int kCopiesPerThread = kChunkKeys * kSegments / kThreads;
  // The merge: every key warp's O [16][kMergeStride] (a row's column halves from its two warps), then m and l [16]
  // each, fp32, over the (drained) stages. Rows 8 banks apart: the merge's readers (4 rows × 8 column phases per
  // warp) hit 32 distinct banks; with F34's 16 phases, 2 rows a warp, two ways on 8 banks (once per CTA).
  static constexpr int kMergeStride = HeadDim + 8;
  static constexpr int kMergeBytes = kKeyWarps * kDecodeMaxRows * (kMergeStride + 2) * 4;
  static constexpr int kMergePhases = kThreads / kDecodeMaxRows;  // threads per row; a thread every kMergePhases-th column
  static_assert(HeadDim % 16 == 0, "whole k-steps of 16");
  static_assert(kChunkKeys * kSegments % kThreads == 0, "every thread issues the same number of copies");
  static_assert(kColumns % 16 == 0, "whole ldmatrix column pairs per warp");
  static_assert(kMergeBytes <= kSmemBytes, "the merge scratch fits in the stages");
  static_assert(decode_planned_ctas_per_sm(HeadDim) * (kSmemBytes + 1024) <= 228 * 1024,
                "the planned CTAs per SM (each with the driver's 1 KiB)");
  static_assert(HeadDim % kMergePhases == 0, "the merge gives each thread every kMergePhases-th column");
};

// Appends: the instance for the calls whose new keys it appends (DecodeParams::k_new, F33); the other instance has
// none of that code, as the append's copy branch and registers (166 -> 168 at d = 128) cost the calls without an
// append 1-1.6% at b = 1 on the H100 (perf-log, thirteenth session's outcomes).
// F34's eight warps: ptxas gives them 128 registers, two CTAs' worth (a minimum-blocks bound of 2 made it spill;
// DecodeKernelHoldsItsCtasPerSm catches growth past them).
template <ptx::WgmmaInput In, int HeadDim, bool Appends>
__global__ void __launch_bounds__(DecodeLayout<HeadDim>::kThreads) decode_kernel(const __grid_constant__ DecodeParams p) {
  using L = DecodeLayout<HeadDim>;
  constexpr bool kAppends = kDecodeAppends && Appends;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // The warp's keys (16 of each chunk) and its columns of O and V (F34; written so that one half compiles to what
  // it did before F34).
  const int key_warp = L::kColumnHalves == 1 ? warp : warp % kKeyWarps;
  const int col0 = L::kColumnHalves == 1 ? 0 : warp / kKeyWarps * L::kColumns;
  const int g = lane / 4, c = 2 * (lane % 4);  // fragment row and column pair (mma_sync.cuh)
  const int split = int(blockIdx.x % uint32_t(p.num_splits));
  const int kv_head = int(blockIdx.x / uint32_t(p.num_splits) % uint32_t(p.heads_kv));
  const int b = int(blockIdx.x / uint32_t(p.num_splits * p.heads_kv));
  // As the forward (kernel_fwd.cu): the next kernel (the combine) may become resident; nothing global is touched
  // before the previous one (whatever wrote q, the cache or k_new; the append kernel where it runs) is done.
  if (threadIdx.x == 0) cudaTriggerProgrammaticLaunchCompletion();
  cudaGridDependencySynchronize();

  const int32_t n_keys = p.seqused_k != nullptr ? p.seqused_k[b] + p.seqlen_k_added : p.seqlen_k;
  const int32_t chunks = (n_keys + kChunkKeys - 1) / kChunkKeys;
  const int32_t c_begin = int32_t(int64_t(chunks) * split / p.num_splits);
  const int32_t c_end = int32_t(int64_t(chunks) * (split + 1) / p.num_splits);

  // This thread's copies of a chunk: rows r0 + i · kRowStep (i < kCopiesPerThread), 16-byte segment `seg` of each
  // (a half-warp per 256-byte row at d = 128: coalesced). Their rows' addresses are stepped, not divided: a chunk
  // costs one division by the page size per thread (one per copy made the paged kernel issue 45% more
  // instructions than the contiguous one, and this kernel is issue-bound: perf-log F27). A page holds at least 16
  // rows (the API's rule), so a step of ≤ 16 rows crosses at most one page boundary.
#if FA4_AB_DECODE_WARP_RINGS
  // F28b (A/B define, perf-log): each warp copies the 16 rows it reads (rows 16·warp + lane / kSegments + i ·
  // kRowStep), so a chunk's stage needs no CTA barrier: the warp's own wait and __syncwarp order it, and the warps
  // run their rings apart (one's softmax beside another's wait).
  constexpr int kRowStep = 32 / L::kSegments;
  static_assert(kRowStep <= 16 && kRowStep * L::kCopiesPerThread == kKeysPerWarp, "one page step per copy at most");
  const int r0 = warp * kKeysPerWarp + lane / L::kSegments, seg = lane % L::kSegments;
#else
  constexpr int kRowStep = L::kThreads / L::kSegments;
  static_assert(kRowStep <= 16 && kRowStep * L::kCopiesPerThread == kChunkKeys, "one page step per copy at most");
  const int r0 = int(threadIdx.x) / L::kSegments, seg = int(threadIdx.x) % L::kSegments;
#endif
  // K and V share their strides (decode_kernel_applies): one offset per copy serves both.
  const int64_t head_offset = int64_t(kv_head) * p.kv_stride_h + seg * 8, batch_offset = int64_t(b) * p.kv_stride_b;
  const int32_t* const pages_of_b = p.page_table != nullptr ? p.page_table + int64_t(b) * p.page_table_stride : nullptr;
  const int32_t page_size = p.page_table != nullptr ? p.page_size : 1;
  // Rows past the keys copy nothing (zero fill) from a valid address: the last key's.
  const int32_t last = max(n_keys - 1, 0), last_page = last / page_size, last_row = last % page_size;
  // The pages of a chunk's copies, read one issue ahead of the copies (a read at the issue put an L2 round trip
  // on every chunk's critical path); first_row: where the thread's first row sits in its page.
  struct ChunkPages {
    int32_t page[L::kCopiesPerThread];
    int32_t first_row;
  };
  auto read_pages = [&](int32_t chunk, ChunkPages& cp) {
    if (p.page_table == nullptr || chunk >= c_end) return;
    const int32_t j = chunk * kChunkKeys + r0;
    int32_t page = j / page_size, row = j - page * page_size;
    cp.first_row = row;
#pragma unroll
    for (int i = 0; i < L::kCopiesPerThread; ++i) {
      cp.page[i] = pages_of_b[j + i * kRowStep < n_keys ? page : last_page];
      row += kRowStep;
      if (row >= page_size) row -= page_size, ++page;
    }
  };
  // A KV-cache call's new keys, when this kernel appends them (DecodeParams::k_new): the first one's index, else
  // past every key. Their cache slots are not read: their chunk copies them from k_new / v_new.
  const int32_t new_begin = kAppends && p.k_new != nullptr ? n_keys - p.seqlen_k_added : INT32_MAX;
  // Chunk `chunk` of K and V into stage `stage` (one commit group, empty past the range).
  auto issue = [&](int32_t chunk, int stage, const ChunkPages& cp) {
    if (chunk < c_end) {
      uint8_t* const k_tile = smem + stage * L::kStageBytes + r0 * L::kRowBytes + seg * 16;
      uint8_t* const v_tile = k_tile + L::kTileBytes;
      const int32_t j = chunk * kChunkKeys + r0;
      // has_new: a chunk that may hold new keys takes their rows from k_new / v_new (a branch per chunk, so the
      // other chunks' copies cost what they did).
      auto copies = [&](auto has_new) {
        int32_t row = cp.first_row;  // with pages
#pragma unroll
        for (int i = 0; i < L::kCopiesPerThread; ++i) {
          const bool inside = j + i * kRowStep < n_keys;
          const int64_t offset =
              head_offset + (p.page_table != nullptr
                                 ? int64_t(cp.page[i]) * p.kv_stride_b + int64_t(inside ? row : last_row) * p.kv_stride_s
                                 : batch_offset + int64_t(inside ? j + i * kRowStep : last) * p.kv_stride_s);
          if constexpr (decltype(has_new)::value) {
            const int32_t key = j + i * kRowStep;
            const uint16_t* k_src = static_cast<const uint16_t*>(p.k) + offset;
            const uint16_t* v_src = static_cast<const uint16_t*>(p.v) + offset;
            if (inside && key >= new_begin) {
              const int64_t fresh = int64_t(b) * p.new_stride_b + int64_t(key - new_begin) * p.new_stride_s +
                                    int64_t(kv_head) * p.new_stride_h + seg * 8;
              k_src = static_cast<const uint16_t*>(p.k_new) + fresh, v_src = static_cast<const uint16_t*>(p.v_new) + fresh;
            }
            __pipeline_memcpy_async(k_tile + i * kRowStep * L::kRowBytes, k_src, 16, inside ? 0 : 16);
            __pipeline_memcpy_async(v_tile + i * kRowStep * L::kRowBytes, v_src, 16, inside ? 0 : 16);
          } else {
            __pipeline_memcpy_async(k_tile + i * kRowStep * L::kRowBytes, static_cast<const uint16_t*>(p.k) + offset,
                                    16, inside ? 0 : 16);
            __pipeline_memcpy_async(v_tile + i * kRowStep * L::kRowBytes, static_cast<const uint16_t*>(p.v) + offset,
                                    16, inside ? 0 : 16);
          }
          row += kRowStep;
          if (row >= page_size) row -= page_size;
        }
      };
      if (kAppends && chunk * kChunkKeys + kChunkKeys > new_begin)
        copies(std::integral_constant<bool, kAppends>{});
      else
        copies(std::false_type{});
    }
    __pipeline_commit();
  };
  // The append (F33): chunk `chunk`'s new keys, landed in stage `stage`, into their cache slots. Each (key, kv head)
  // is written by the one CTA whose range holds the key, and no CTA of the call reads that slot (the CTA itself
  // read the key from k_new; another sequence may not read a slot this call appends to: kvcache.cpp's contract).
  // The next kernel in the stream sees the writes (its grid-dependency wait is for this grid's completion).
  // Element offset of key `key`'s row of this kv head (for a KV cache, its slot): the append's address of one row
  // (the copies step theirs through the pages instead).
  auto row_offset = [&](int32_t key) {
    return (p.page_table != nullptr
                ? int64_t(pages_of_b[key / page_size]) * p.kv_stride_b + int64_t(key % page_size) * p.kv_stride_s
                : batch_offset + int64_t(key) * p.kv_stride_s) +
           int64_t(kv_head) * p.kv_stride_h;
  };
  auto append_rows = [&](int32_t chunk, int stage) {
    const int32_t first = max(new_begin - chunk * kChunkKeys, 0), end = min(n_keys - chunk * kChunkKeys, kChunkKeys);
    for (int at = int(threadIdx.x) + first * L::kSegments; at < end * L::kSegments; at += L::kThreads) {
      const int r = at / L::kSegments, segment = at % L::kSegments;
      const int32_t key = chunk * kChunkKeys + r;
      const int64_t slot = row_offset(key) + segment * 8;
      const uint8_t* const k_row = smem + stage * L::kStageBytes + r * L::kRowBytes + segment * 16;
      // k and v are the caches here (DecodeParams::k_new): the call's own tensors, written in place.
      *reinterpret_cast<uint4*>(const_cast<uint16_t*>(static_cast<const uint16_t*>(p.k)) + slot) =
          *reinterpret_cast<const uint4*>(k_row);
      *reinterpret_cast<uint4*>(const_cast<uint16_t*>(static_cast<const uint16_t*>(p.v)) + slot) =
          *reinterpret_cast<const uint4*>(k_row + L::kTileBytes);
    }
  };
  {
    ChunkPages first[kDecodeStages - 1] = {};  // the prologue's pages: one round trip for all of them
#pragma unroll
    for (int s = 0; s < kDecodeStages - 1; ++s) read_pages(c_begin + s, first[s]);
#pragma unroll
    for (int s = 0; s < kDecodeStages - 1; ++s) issue(c_begin + s, s, first[s]);
  }
  ChunkPages pages = {};  // of chunk c_begin + kDecodeStages - 1, the loop's first issue
  read_pages(c_begin + kDecodeStages - 1, pages);

  // Q's rows as A fragments, loaded once: row r is query head kv_head · group + r (zeros past the group).
  uint32_t qf[HeadDim / 16][4];
  const uint16_t* const q = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b;
#pragma unroll
  for (int ks = 0; ks < HeadDim / 16; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i & 1), col = ks * 16 + c + 8 * (i >> 1);
      qf[ks][i] = row < p.group
                      ? *reinterpret_cast<const uint32_t*>(q + (int64_t(kv_head) * p.group + row) * p.q_stride_h + col)
                      : 0u;
    }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g and g + 8; l summed over the quad at the end
  float o[L::kColumns / 8][4];  // columns col0 + 8·j + c, + 1
#pragma unroll
  for (int j = 0; j < L::kColumns / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int32_t chunk = c_begin; chunk < c_end; ++chunk) {
    const int i = chunk - c_begin;
    issue(chunk + kDecodeStages - 1, (i + kDecodeStages - 1) % kDecodeStages, pages);  // the stage the last chunk read
    read_pages(chunk + kDecodeStages, pages);  // used by the next turn's issue, after this chunk's work
    __pipeline_wait_prior(kDecodeStages - 1);  // this thread's copies of `chunk` have landed
#if FA4_AB_DECODE_WARP_RINGS
    __syncwarp();  // and its warp's, which are all it reads
#else
    __syncthreads();  // and everyone's
#endif
    if constexpr (kAppends)
      if (chunk * kChunkKeys + kChunkKeys > new_begin) append_rows(chunk, i % kDecodeStages);  // CTA-uniform
    const uint8_t* const k_rows = smem + (i % kDecodeStages) * L::kStageBytes + key_warp * kKeysPerWarp * L::kRowBytes;
    const uint8_t* const v_rows = k_rows + L::kTileBytes;

    float s[2][4] = {};  // keys 8·nt + c, c + 1 of the warp's 16; rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
    for (int ks = 0; ks < HeadDim / 16; ++ks)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint8_t* const at = k_rows + (nt * 8 + g) * L::kRowBytes + (ks * 16 + c) * 2;
        const uint32_t kf[2] = {*reinterpret_cast<const uint32_t*>(at), *reinterpret_cast<const uint32_t*>(at + 16)};
        ptx::mma_m16n8k16<In>(s[nt], qf[ks], kf);
      }

    const int32_t key0 = chunk * kChunkKeys + key_warp * kKeysPerWarp;
    float block_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = key0 + nt * 8 + c + (e & 1) < n_keys ? p.score(s[nt][e]) : -INFINITY;
        block_max[e >> 1] = fmaxf(block_max[e >> 1], s[nt][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const num::RowMaxUpdate u = num::update_row_max(m[h], quad_max(block_max[h]), p.rescale_threshold);
      if (u.rescaled) {
        const float scale = exp2f(u.log2_scale);
        l[h] *= scale;
#pragma unroll
        for (int j = 0; j < L::kColumns / 8; ++j) o[j][2 * h] *= scale, o[j][2 * h + 1] *= scale;
      }
      m[h] = u.m;
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - num::safe_max(m[e >> 1]));
        l[e >> 1] += s[nt][e];
      }
    // P as the A fragment of the warp's 16 keys: S's C layout of key tiles 0 and 1 is A's column halves.
    const uint32_t pf[4] = {ptx::pack_rn<In>(s[0][0], s[0][1]), ptx::pack_rn<In>(s[0][2], s[0][3]),
                            ptx::pack_rn<In>(s[1][0], s[1][1]), ptx::pack_rn<In>(s[1][2], s[1][3])};
    // V's B fragments by ldmatrix.trans: matrices (keys 0-7 | 8-15) × (columns dn .. dn + 7 | dn + 8 .. dn + 15).
    const int mat = lane / 8;
    const uint32_t v_lane = static_cast<uint32_t>(__cvta_generic_to_shared(
        v_rows + ((mat & 1) * 8 + lane % 8) * L::kRowBytes + (mat >> 1) * 16 + col0 * 2));
#pragma unroll
    for (int dn = 0; dn < L::kColumns; dn += 16) {
      uint32_t vf[4];
      ptx::ldmatrix_x4_trans(vf, v_lane + dn * 2);
      const uint32_t lo[2] = {vf[0], vf[1]}, hi[2] = {vf[2], vf[3]};
      ptx::mma_m16n8k16<In>(o[dn / 8], pf, lo);
      ptx::mma_m16n8k16<In>(o[dn / 8 + 1], pf, hi);
    }
#if FA4_AB_DECODE_WARP_RINGS
    __syncwarp();  // the warp is done with its rows of this stage before it refills them
#else
    __syncthreads();  // every warp is done with this stage before it is refilled
#endif
  }
  __pipeline_wait_prior(0);  // no copy is in flight into the stages the merge reuses (only empty groups remain)
  __syncthreads();

  // The merge: each warp's (m, l, O) rows into shared memory, then each thread one row's share of the columns.
  float* const merge_o = reinterpret_cast<float*>(smem);                          // [key warp][row][kMergeStride]
  float* const merge_m = merge_o + kKeyWarps * kDecodeMaxRows * L::kMergeStride;  // [key warp][row]
  float* const merge_l = merge_m + kKeyWarps * kDecodeMaxRows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = quad_sum(l[h]);
    if (lane % 4 == 0 && col0 == 0)  // a key warp's two halves hold the same m and l
      merge_m[key_warp * kDecodeMaxRows + g + 8 * h] = m[h], merge_l[key_warp * kDecodeMaxRows + g + 8 * h] = l[h];
  }
#pragma unroll
  for (int j = 0; j < L::kColumns / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      merge_o[(key_warp * kDecodeMaxRows + g + 8 * (e >> 1)) * L::kMergeStride + col0 + j * 8 + c + (e & 1)] = o[j][e];
  __syncthreads();

  const int row = int(threadIdx.x) / L::kMergePhases, phase = int(threadIdx.x) % L::kMergePhases;
  if (row >= p.group) return;
  float row_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) row_max = fmaxf(row_max, merge_m[w * kDecodeMaxRows + row]);
  float weight[kKeyWarps], row_sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) {
    const float mw = merge_m[w * kDecodeMaxRows + row];
    weight[w] = mw == -INFINITY ? 0.0f : exp2f(mw - row_max);  // a warp that saw no key adds nothing
    row_sum += merge_l[w * kDecodeMaxRows + row] * weight[w];
  }
  const num::RowFinal fin = num::finalize_row(row_max, row_sum);  // no key at all: O = 0, LSE = -inf
  const int64_t head = int64_t(kv_head) * p.group + row, heads_q = int64_t(p.heads_kv) * p.group;
  const int64_t partial_row = (int64_t(split) * p.batch + b) * heads_q + head;
  if (p.o_partial != nullptr && phase == 0) p.lse_partial[partial_row] = fin.lse;
  if (p.o_partial == nullptr && p.lse != nullptr && phase == 0) p.lse[b * p.lse_stride_b + head * p.lse_stride_h] = fin.lse;
  uint16_t* const out = static_cast<uint16_t*>(p.out) + b * p.out_stride_b + head * p.out_stride_h;
#pragma unroll
  for (int col = phase; col < HeadDim; col += L::kMergePhases) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kKeyWarps; ++w) acc += merge_o[(w * kDecodeMaxRows + row) * L::kMergeStride + col] * weight[w];
    if (p.o_partial != nullptr)
      p.o_partial[partial_row * HeadDim + col] = acc * fin.inv_l;
    else
      out[col] = In == ptx::WgmmaInput::bf16 ? num::float_to_bf16_bits(acc * fin.inv_l)
                                             : num::float_to_f16_bits(acc * fin.inv_l);
  }
}

// The compiled instance of (dtype, head_dim, appends) (has_decode_kernel holds; appends only where the build's kernel
// can, kDecodeAppends), its dynamic shared memory and threads.
struct DecodeInstance {
  void (*kernel)(DecodeParams);
  uint32_t smem;
  uint32_t threads;
};
template <int HeadDim, bool Appends>
DecodeInstance decode_instance(DType dtype) {
  using ptx::WgmmaInput;
  return {dtype == DType::bf16 ? decode_kernel<WgmmaInput::bf16, HeadDim, Appends>
                               : decode_kernel<WgmmaInput::f16, HeadDim, Appends>,
          uint32_t(DecodeLayout<HeadDim>::kSmemBytes), uint32_t(DecodeLayout<HeadDim>::kThreads)};
}
DecodeInstance decode_instance(DType dtype, int64_t head_dim, bool appends) {
  if (head_dim == 64) return appends ? decode_instance<64, kDecodeAppends>(dtype) : decode_instance<64, false>(dtype);
  return appends ? decode_instance<128, kDecodeAppends>(dtype) : decode_instance<128, false>(dtype);
}

}  // namespace

bool has_decode_kernel(DType dtype, int64_t head_dim) {
  return (dtype == DType::bf16 || dtype == DType::f16) && (head_dim == 64 || head_dim == 128);
}

int decode_ctas_per_sm(DType dtype, int head_dim) {
  if (!has_decode_kernel(dtype, head_dim)) return 0;
  int fewest = INT32_MAX;
  for (bool appends : {false, true}) {  // the instance with fewer
    const DecodeInstance d = decode_instance(dtype, head_dim, appends);
    int ctas = 0;
    if (opt_in_dynamic_smem(reinterpret_cast<const void*>(d.kernel), d.smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, d.kernel, int(d.threads), size_t(d.smem)) != cudaSuccess)
      return -1;
    fewest = std::min(fewest, ctas);
  }
  return fewest;
}

cudaError_t launch_decode(DType dtype, int head_dim, const DecodeParams& p, cudaStream_t stream) {
  if (!has_decode_kernel(dtype, head_dim)) return cudaErrorInvalidValue;
  const DecodeInstance d = decode_instance(dtype, head_dim, p.k_new != nullptr);
  const uint32_t grid = uint32_t(p.num_splits) * uint32_t(p.heads_kv) * uint32_t(p.batch);
  return launch_with_dynamic_smem(d.kernel, grid, d.threads, d.smem, stream, p, 1, /*programmatic=*/true);
}

}  // namespace fa4::sm90
