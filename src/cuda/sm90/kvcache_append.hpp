// The KV-cache append on CUDA tensors (fa4::forward_kvcache with k_new / v_new): the new keys and values are
// copied into the caches at each sequence's cache_seqlens[b] (through the page table when paged), before the
// attention kernel reads them (same stream).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// k_cache, v_cache: [batch, capacity, h_kv, d] or paged [num_pages, page_size, h_kv, d] (page_table set);
// k_new, v_new: [batch, seqlen_new, h_kv, d]; cache_seqlens: device [batch] (null: 0 — but the API refuses
// k_new without it). Row t of sequence b goes to key cache_seqlens[b] + t. Metadata trusted.
cudaError_t launch_kvcache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                                  const int32_t* cache_seqlens, const int32_t* page_table, int64_t max_pages,
                                  int64_t page_size, cudaStream_t stream);

}  // namespace fa4::sm90
