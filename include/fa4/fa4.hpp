// fa4 — C++ API. Host-only header (no CUDA header needed).
//
// Layout: q, k, v, out, dout, dq, dk, dv are [batch, seqlen, heads, head_dim] with element strides; head_dim
// must have unit stride, every other stride is free (so [b, h, s, d] storage works through strides, and a
// stride of 0 broadcasts an input). lse is [batch, heads, seqlen_q], fp32, natural log.
// Inputs may share memory with each other (packed QKV); each output must not overlap itself, and the memory
// range it spans (lowest to highest element) must be disjoint from every other argument's range.
// Errors are thrown as fa4::Error (code() says which class); every message names the argument, what was
// expected and what was given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

// The CUDA runtime's stream struct, declared at global scope as cuda_runtime.h declares it, so that fa4::Stream
// is the same type (and mangles the same) whether or not a translation unit includes the CUDA headers.
struct CUstream_st;

namespace fa4 {

enum class DType : int32_t { f32 = 0, f16 = 1, bf16 = 2, f64 = 3 };
enum class Device : int32_t { cpu = 0, cuda = 1 };
enum class Pass : int32_t { forward = 0, backward = 1 };
enum class Status : int32_t { ok = 0, invalid_argument = 1, unsupported = 2, cuda_error = 3, internal = 4 };

const char* to_string(DType dtype);
const char* to_string(Device device);
const char* to_string(Pass pass);
const char* to_string(Status status);
std::size_t element_size(DType dtype);

// The stream type of the CUDA runtime, declared without including it (cudaStream_t is CUstream_st*).
using Stream = ::CUstream_st*;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int device_index = 0;
  int rank = 4;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> stride{};  // elements

  // Row-major (contiguous) strides for the given shape.
  static Tensor contiguous(void* data, DType dtype, Device device, std::array<int64_t, 4> shape);
  static Tensor contiguous3(void* data, DType dtype, Device device, std::array<int64_t, 3> shape);
  int64_t numel() const;
};

struct Options {
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  bool causal = false;                 // bottom-right aligned
  int64_t window_left = -1;            // -1: unbounded
  int64_t window_right = -1;           // -1: unbounded
  float softcap = 0.0f;                // 0: off
  float exp2_emulated_fraction = 0.0f; // 0 = hardware exp2; k/16 of the elements on the FMA pipe
  float rescale_threshold = 8.0f;      // tau (log2 units), in [0, 15]
  bool deterministic = false;
  // Attention sinks (gpt-oss; FlashAttention-4's learnable_sink): per query head one logit, in the units of the
  // scaled scores (neither scaled nor capped), that joins every row's softmax denominator as a key whose value
  // is zero: lse = log(exp(sink_h) + sum_j exp(s_ij)). fp32 [heads_q] on q's device; nullptr: none. A row that
  // sees no key then has out = 0 and lse = sink_h. CPU and CUDA (forward and backward).
  const Tensor* sinks = nullptr;
  // Backward only, with sinks: their gradient, fp32 [heads_q], overwritten with
  // dsink_h = -sum over batch and rows of exp(sink_h - lse) * rowsum(dout * out). nullptr: not computed.
  const Tensor* dsinks = nullptr;
  // Split-KV (decode): the keys of each (batch, head, query tile) are split into this many ranges, computed
  // separately and merged with the LSE rule. 0: chosen from the shape and the device (the CPU backend: 1);
  // n >= 1: n ranges (fewer when there are fewer keys). Forward only; the result is the same up to rounding.
  int num_splits = 0;
  // Variable-length and KV-cache calls on CUDA tensors trust their device metadata (cu_seqlens, seqused_k,
  // cache_seqlens, page_table), as FlashAttention does: a wrong entry there is read as given. With this set (or
  // with the environment variable FA4_VALIDATE=1), the call first copies them to the host and checks every entry
  // as the CPU backend does, throwing an Error that names the first bad one (e.g. 'kvcache.page_table[1][2]')
  // before anything is launched. The copy synchronizes the stream, so such a call cannot be captured into a
  // CUDA graph; a debugging aid, off by default. CPU tensors are always checked.
  bool validate_device_metadata = false;
};

class Error : public std::runtime_error {
 public:
  Error(Status code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Status code() const noexcept { return code_; }

 private:
  Status code_;
};

struct Support {
  bool ok = false;
  Status code = Status::ok;
  std::string reason;  // empty when ok
};

struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// out = softmax(scale * q k^T [masked, capped]) v, and lse when given.
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
             const Options& options = {}, Workspace workspace = {}, Stream stream = nullptr);

// dq, dk, dv. lse is the forward's.
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Options& options = {},
              Workspace workspace = {}, Stream stream = nullptr);

std::size_t workspace_size(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Options& options = {});

// Whether the pass can run on inputs shaped like these, and if not why. Never launches, never throws for
// bad input (the reason says what is wrong).
Support supports(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Options& options = {});

// Variable-length batches, FlashAttention's varlen layout: the sequences packed without padding. q, out (and
// dout, dq) are [total_q, heads, head_dim], k, v (and dk, dv) [total_k, heads_kv, head_dim]: rank 3, element
// strides, head_dim unit stride. Sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 of q and rows
// cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1 of k and v, of which it attends to the first seqused_k[b] when
// seqused_k is given. lse is [heads, total_q], fp32. Every mask and option applies per sequence (causal is
// bottom-right within each sequence); rows no sequence covers get 0 in dq, dk, dv (and keys past seqused_k in
// dk, dv); on CPU tensors also 0 in out and -inf in lse (the CUDA forward leaves those rows unwritten, as
// FlashAttention does). The metadata live where the tensors do: host arrays for CPU tensors, checked entry by
// entry; device arrays for CUDA tensors, trusted unless Options::validate_device_metadata (or FA4_VALIDATE=1)
// asks for a check. The backward's workspace on CUDA: workspace_size_varlen.
struct Varlen {
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1]: 0, then non-decreasing, last <= total_q
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1]: 0, then non-decreasing, last <= total_k
  const int32_t* seqused_k = nullptr;     // optional [batch]: 0 <= seqused_k[b] <= that sequence's keys
  int64_t batch = 0;
  int64_t max_seqlen_q = 0;  // at least the longest query sequence, at most total_q
  int64_t max_seqlen_k = 0;  // at least the longest key sequence (as used), at most total_k
};

void forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor* lse,
                    const Varlen& varlen, const Options& options = {}, Workspace workspace = {},
                    Stream stream = nullptr);

void backward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                     const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Varlen& varlen,
                     const Options& options = {}, Workspace workspace = {}, Stream stream = nullptr);

Support supports_varlen(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& varlen,
                        const Options& options = {});

// Bytes of workspace a variable-length call needs (0 on CPU tensors and for the forward; the CUDA backward's
// dQ accumulator, LSE·log2e and D for varlen.batch sequences of max_seqlen_q rows each, padded to the tile:
// about batch · heads · max_seqlen_q · (head_dim + 2) · 4 bytes). Reads no metadata.
std::size_t workspace_size_varlen(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Varlen& varlen,
                                  const Options& options = {});

// KV-cache attention (FlashAttention's flash_attn_with_kvcache), forward only: decode and chunked prefill
// against a cache that is read in place, either contiguous or paged.
//   q, out: [batch, seqlen_q, heads, head_dim]; lse (optional): [batch, heads, seqlen_q], fp32.
//   Contiguous cache (page_table == nullptr): k_cache, v_cache [batch, seqlen_cache, heads_kv, head_dim].
//   Paged cache: k_cache, v_cache [num_pages, page_size, heads_kv, head_dim], page_size a multiple of 16;
//   page_table[b * max_pages + i] is the page holding keys i * page_size .. (i + 1) * page_size - 1 of
//   sequence b. Pages may be in any order, and sequences may share pages they only read.
// Sequence b attends to its first cache_seqlens[b] cached keys, plus seqlen_new more when k_new, v_new
// ([batch, seqlen_new, heads_kv, head_dim]) are given: those are first written into the cache (in place) at
// positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1, then attended to with the rest. Every
// option of the dense forward applies per sequence over its keys (causal is bottom-right: a decode query sees
// every key); num_splits splits each sequence's keys. On CPU tensors the metadata are host int32 arrays, checked
// entry by entry before anything is written; on CUDA tensors (sm_90a) they are device arrays, trusted as
// FlashAttention does (Options::validate_device_metadata checks every entry on a host copy first), the cache is
// read in place, and the call is asynchronous on `stream`; its workspace is workspace_size_kvcache's bytes (none
// given: stream-ordered memory).
struct KvCache {
  const int32_t* cache_seqlens = nullptr;  // [batch]: keys already cached per sequence; nullptr: every cache full
  const int32_t* page_table = nullptr;     // [batch, max_pages], row-major; nullptr: a contiguous cache
  int64_t max_pages = 0;                   // page_table's columns (0 without a page_table)
  const Tensor* k_new = nullptr;           // optional, with v_new: [batch, seqlen_new, heads_kv, head_dim]
  const Tensor* v_new = nullptr;
};

void forward_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                     const Tensor* lse, const KvCache& cache, const Options& options = {}, Workspace workspace = {},
                     Stream stream = nullptr);

Support supports_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const KvCache& cache,
                         const Options& options = {});

// Bytes of workspace forward_kvcache needs for these arguments (0 on CPU tensors, and on CUDA where no split-KV
// range is planned). A function of the shapes, max_pages, the options and the GPU, never of the metadata's
// contents (which stay unread): size it once per shape and reuse it.
std::size_t workspace_size_kvcache(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const KvCache& cache, const Options& options = {});

const char* version();

}  // namespace fa4
