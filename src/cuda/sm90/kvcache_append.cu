// The KV-cache append (kvcache_append.hpp): one thread per word (16 bytes where every row is 16-byte aligned,
// else one element) of a new row, copied for K and V.
#include "cuda/sm90/kvcache_append.hpp"

#include <algorithm>

namespace fa4::sm90 {
namespace {

// Element strides of a rank-4 tensor, and its base.
struct Rows {
  char* data;
  int64_t s0, s1, s2;
};

struct AppendParams {
  Rows k_cache, v_cache, k_new, v_new;  // strides in bytes
  const int32_t* cache_seqlens;
  const int32_t* page_table;
  int64_t max_pages, page_size;  // page_size 0: contiguous
  int64_t seqlen_new, heads_kv, words_per_row;
  int64_t total_words;  // batch · seqlen_new · heads_kv · words_per_row
};

template <class Word>
__global__ void kvcache_append_kernel(const AppendParams p) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total_words; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = i % p.words_per_row;
    int64_t r = i / p.words_per_row;
    const int64_t h = r % p.heads_kv;
    r /= p.heads_kv;
    const int64_t t = r % p.seqlen_new, b = r / p.seqlen_new;
    const int64_t key = int64_t(p.cache_seqlens[b]) + t;
    int64_t outer = b, row = key;
    if (p.page_size > 0) outer = p.page_table[b * p.max_pages + key / p.page_size], row = key % p.page_size;
    const int64_t src = b * p.k_new.s0 + t * p.k_new.s1 + h * p.k_new.s2 + w * int64_t(sizeof(Word));
    const int64_t src_v = b * p.v_new.s0 + t * p.v_new.s1 + h * p.v_new.s2 + w * int64_t(sizeof(Word));
    const int64_t dst = outer * p.k_cache.s0 + row * p.k_cache.s1 + h * p.k_cache.s2 + w * int64_t(sizeof(Word));
    const int64_t dst_v = outer * p.v_cache.s0 + row * p.v_cache.s1 + h * p.v_cache.s2 + w * int64_t(sizeof(Word));
    *reinterpret_cast<Word*>(p.k_cache.data + dst) = *reinterpret_cast<const Word*>(p.k_new.data + src);
    *reinterpret_cast<Word*>(p.v_cache.data + dst_v) = *reinterpret_cast<const Word*>(p.v_new.data + src_v);
  }
}

Rows rows_of(const Tensor& t) {
  const int64_t es = int64_t(element_size(t.dtype));
  return {static_cast<char*>(t.data), t.stride[0] * es, t.stride[1] * es, t.stride[2] * es};
}

bool aligned16(const Tensor& t) {
  const int64_t es = int64_t(element_size(t.dtype));
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.shape[3] * es) % 16 == 0 &&
         (t.stride[0] * es) % 16 == 0 && (t.stride[1] * es) % 16 == 0 && (t.stride[2] * es) % 16 == 0;
}

}  // namespace

cudaError_t launch_kvcache_append(const Tensor& k_cache, const Tensor& v_cache, const Tensor& k_new, const Tensor& v_new,
                                  const int32_t* cache_seqlens, const int32_t* page_table, int64_t max_pages,
                                  int64_t page_size, cudaStream_t stream) {
  AppendParams p{rows_of(k_cache), rows_of(v_cache), rows_of(k_new), rows_of(v_new), cache_seqlens, page_table,
                 max_pages, page_table != nullptr ? page_size : 0, k_new.shape[1], k_new.shape[2], 0, 0};
  const bool wide = aligned16(k_cache) && aligned16(v_cache) && aligned16(k_new) && aligned16(v_new);
  const int64_t row_bytes = k_new.shape[3] * int64_t(element_size(k_new.dtype));
  p.words_per_row = row_bytes / (wide ? 16 : 2);
  p.total_words = k_new.shape[0] * p.seqlen_new * p.heads_kv * p.words_per_row;
  if (p.total_words == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const unsigned blocks = unsigned(std::min<int64_t>((p.total_words + kThreads - 1) / kThreads, 4096));
  if (wide)
    kvcache_append_kernel<uint4><<<blocks, kThreads, 0, stream>>>(p);
  else
    kvcache_append_kernel<uint16_t><<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fa4::sm90
