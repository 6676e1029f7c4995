// The sm_90a forward as the API sees it (host only, no CUDA headers): what is compiled, what a device and a
// tensor layout must be for it, and the launch. Defined in launch.cu, part of the build only when
// FA4_CUDA_ARCHS contains 90a (FA4_WITH_SM90).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "api/problem.hpp"
#include "fa4/fa4.hpp"

namespace fa4::sm90 {

// Whether src/cuda/instances.def has an sm90 forward row for (dtype, head_dim).
bool has_forward_kernel(DType dtype, int64_t head_dim);

// Whether src/cuda/instances.def has an sm90 backward row for (dtype, head_dim).
bool has_backward_kernel(DType dtype, int64_t head_dim);

// Whether CUDA device `index` is compute capability 9.0 (the sm_90a kernels run nowhere else). Cached.
bool device_is_sm90(int index);

// Throws Error(unsupported) naming `name` (e.g. "k.stride[1]") when tensor t cannot be read by TMA: base
// address 16-byte aligned, non-negative strides, seqlen/heads/batch strides multiples of 8 elements (16
// bytes) below 2^40 bytes, a seqlen stride of 0 only when seqlen is 1. Stride-0 heads/batch (broadcast) are
// fine. Also refuses sizes beyond the kernel's 32-bit indices.
void check_tma_layout(const char* call, const char* name, const Tensor& t);
// Whether t passes check_tma_layout (an output that can be stored by TMA; else the per-thread stores).
bool tma_addressable(const Tensor& t);

// For tests: while one lives, every forward call on this thread runs kFwdTiles row `row` (config.hpp), whatever
// row the query length would choose, so each compiled kernel meets every shape. A call whose head dim is not
// the row's fails with invalid_argument. Guards nest; the previous choice returns when one dies.
class ScopedFwdRow {
 public:
  explicit ScopedFwdRow(int row);
  ~ScopedFwdRow();
  ScopedFwdRow(const ScopedFwdRow&) = delete;
  ScopedFwdRow& operator=(const ScopedFwdRow&) = delete;

 private:
  int previous_;
};

// Bytes of workspace the forward needs: split-KV's fp32 partials (O and LSE per split and query row) when the
// call splits its keys (Options::num_splits, or the fill rule with 0), else 0.
size_t forward_workspace_bytes(const detail::Problem& p);

// Launches the forward on `stream` (asynchronous, nothing synchronous): the kernel, and with split-KV the combine
// kernel after it. Uses `workspace` when given (>= forward_workspace_bytes), else allocates what it needs
// stream-ordered. The problem has been validated and selected for sm90.
void forward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor* lse, Workspace workspace, Stream stream);

// The variable-length forward (fa4::forward_varlen on CUDA tensors): q, k, v as one batch of their packed rows
// ([1, total, heads, d], as the API checked their layout), out [total_q, h, d], lse [h, total_q] or null, the
// metadata device int32 arrays (trusted, as FlashAttention does). `p` was
// validated on the longest sequence's rows ([1, max_seqlen, ...] views): dtype, head dim, options, mask sides.
// One launch of the head dim's varlen kernel; rows that belong to no sequence are not written.
void forward_varlen(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor* lse, const Varlen& varlen, Stream stream);

// A KV-cache call on CUDA tensors (fa4::forward_kvcache): the device metadata (trusted, as FlashAttention does)
// and what is appended. cache_seqlens null: every sequence holds the cache's capacity. Paged: page_table set,
// page_size the caches' shape[1].
struct KvCacheArgs {
  const int32_t* cache_seqlens = nullptr;  // device [batch]
  const int32_t* page_table = nullptr;     // device [batch, max_pages]
  int64_t max_pages = 0, page_size = 0;
  const Tensor* k_new = nullptr;  // [batch, seqlen_new, heads_kv, head_dim], with v_new; written into the caches first
  const Tensor* v_new = nullptr;
  int64_t seqlen_new = 0;
};

// The KV-cache forward: the append when k_new is given (a copy kernel first, unless the decode kernel runs the
// call and appends itself: perf-log F33), then the forward's plan (row, GQA packing, split-KV) run by the
// instances with per-sequence geometry. `p` was validated on q against a [batch, capacity, heads_kv, head_dim]
// view of the keys (capacity = what a sequence's cache can hold).
// Asynchronous on `stream`; workspace as forward's (forward_workspace_bytes(p)).
void forward_kvcache(const detail::Problem& p, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& out, const Tensor* lse, const KvCacheArgs& cache, Workspace workspace,
                     Stream stream);

// Options::validate_device_metadata: n int32 of device memory (metadata the caller passed) copied to the host in
// the stream's order (after whatever the stream was doing, which may have written them); synchronizes the
// stream, so it refuses a stream under CUDA-graph capture, naming `arg`.
std::vector<int32_t> read_device_ints(const char* call, const char* arg, const int32_t* data, int64_t n,
                                      int device_index, Stream stream);

// The backward's A/B environment overrides (every FA4_BWD_* variable, listed beside Overrides in bwd/launch.cu)
// for this call: throws, naming the variable, on a value it cannot take (not a known value; the CTA pair with a
// variable-length batch), so supports() answers what the call would do.
void check_backward_overrides(const char* call, const detail::Problem& p, bool varlen);

// The paths the backward's main kernel takes for a call, as its tile row, the problem and the FA4_BWD_* overrides
// decide them (the launch sets its kernel flags from this, so a test can check that a switch reaches the kernel);
// a bad override throws as the call would.
struct BackwardPaths {
  bool cluster_pair = false;       // FA4_BWD_CLUSTER
  bool dq_register_adds = false;   // default mode: dQ slabs added from registers (key-split rows)
  bool det_register_adds = false;  // deterministic key-split rows: from registers in turn (helper warps)
  bool det_turn_helpers = false;   // deterministic column-split rows: helper warps pass the turns
  bool det_slab_release = false;   // deterministic key-split writers pass each slab's turn on its own
  bool det_store_first = false;    // deterministic: each chain's first slab stored
  bool det_two_buffers = false;    // deterministic key-split rows: a staging buffer per dQ writer
  int det_chains = 1;              // turn chains (1 outside deterministic mode and on the rotated walk)
  bool det_rotated_walk = false;   // deterministic, unmasked, where it fits (FA4_BWD_DET_ROTATED=0: off)
};
// sms: the device's SM count (the rotated walk needs a (batch, kv head)'s key blocks resident at once); < 0: not
// checked (host-only tests).
BackwardPaths backward_paths(const detail::Problem& p, bool varlen, int64_t sms = -1);

// Bytes of workspace the backward needs (bwd/config.hpp's layout: fp32 dQ accumulator (one copy per deterministic
// turn chain), LSE·log2e, D; a variable-length problem (p.varlen) in the compact layout of its packed rows).
size_t backward_workspace_bytes(const detail::Problem& p);

// Launches the backward on `stream`: preprocess (D, LSE·log2e, zeroed dQ accumulator), the K/V-stationary main
// kernel, postprocess (dQ). Asynchronous; uses `workspace` when given (>= backward_workspace_bytes), else
// allocates it stream-ordered (cudaMallocAsync / cudaFreeAsync). Validated and selected for sm90.
void backward(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
              Workspace workspace, Stream stream);

// The variable-length backward (fa4::backward_varlen on CUDA tensors): p is the problem of varlen.batch
// sequences of the longest lengths (max_seqlen_q/k), q, dout, dq, k, v, dk, dv the packed rows as one batch
// ([1, total, heads, d]), out likewise, lse the packed [heads, total_q], the metadata device arrays (trusted).
// Rows no sequence covers (and keys past seqused_k) get zero gradients. Workspace: backward_workspace_bytes(p).
void backward_varlen(const detail::Problem& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                     const Varlen& varlen, Workspace workspace, Stream stream);

}  // namespace fa4::sm90
