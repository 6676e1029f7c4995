/* fa4 — C ABI for FFI (ctypes, Rust, C inference engines).
 *
 * Same calls as the C++ API (fa4.hpp). No exception crosses this boundary: every call returns an
 * fa4_status; on failure fa4_last_error() gives a message (thread-local, valid until the next fa4 call on
 * the same thread) that names the argument, what was expected and what was given.
 *
 * Tensors are [batch, seqlen, heads, head_dim] with element strides (unit stride on head_dim); the LSE is
 * [batch, heads, seqlen_q], fp32, natural log. Host-only header: no CUDA header needed. */
#ifndef FA4_FA4_H
#define FA4_FA4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FA4_ABI_VERSION 1

typedef enum fa4_status {
  FA4_OK = 0,
  FA4_ERROR_INVALID_ARGUMENT = 1, /* the call is malformed (shapes, strides, pointers, option values) */
  FA4_ERROR_UNSUPPORTED = 2,      /* well-formed, but no backend of this build can run it */
  FA4_ERROR_CUDA = 3,             /* the CUDA runtime reported an error */
  FA4_ERROR_INTERNAL = 4          /* a bug in fa4: please report it with the message */
} fa4_status;

typedef enum fa4_dtype { FA4_F32 = 0, FA4_F16 = 1, FA4_BF16 = 2, FA4_F64 = 3 } fa4_dtype;
typedef enum fa4_device { FA4_CPU = 0, FA4_CUDA = 1 } fa4_device;
typedef enum fa4_pass { FA4_FORWARD = 0, FA4_BACKWARD = 1 } fa4_pass;

/* rank 4 for q/k/v/out/dout/dq/dk/dv ([b, s, h, d]); rank 3 for the LSE ([b, h, s_q]); rank 1 for sinks. */
typedef struct fa4_tensor {
  void* data;
  int32_t dtype;  /* fa4_dtype */
  int32_t device; /* fa4_device */
  int32_t device_index;
  int32_t rank;
  int64_t shape[4];
  int64_t stride[4]; /* in elements */
} fa4_tensor;

typedef struct fa4_options {
  uint32_t struct_size;      /* sizeof(fa4_options): set by fa4_options_init; lets fields be appended */
  int32_t has_softmax_scale; /* 0: 1/sqrt(head_dim) */
  float softmax_scale;
  int32_t causal;            /* bottom-right aligned: row i sees keys j <= i + seqlen_k - seqlen_q */
  int64_t window_left;       /* -1: unbounded */
  int64_t window_right;      /* -1: unbounded */
  float softcap;             /* 0: off; else s <- softcap * tanh(s * scale / softcap) */
  float exp2_emulated_fraction; /* 0: hardware exp2 only; k/16 (k = 1..16): that share on the FMA pipe */
  float rescale_threshold;   /* tau, log2 units, in [0, 15]: keep a stale row max until it grows by more */
  int32_t deterministic;     /* bitwise identical results over repeated runs (backward) */
  /* Appended (a struct_size that ends before them reads as NULL): */
  const struct fa4_tensor* sinks;  /* attention sinks: fp32 [heads_q] logits joining each row's softmax
                                      denominator (fa4::Options::sinks); NULL: none */
  const struct fa4_tensor* dsinks; /* backward only, with sinks: their gradient, fp32 [heads_q]; NULL: not computed */
  int32_t num_splits;              /* split-KV (forward): 0 = the backend's choice (CPU: 1), n >= 1 = n key ranges
                                      merged with the LSE rule; reads as 0 from a struct_size ending before it */
  int32_t reserved0;                /* 0; keeps the next field past the tail padding of the struct before it
                                       (a struct_size of 72 from an older client never reads it) */
  int32_t validate_device_metadata; /* varlen / KV-cache on CUDA: copy the device metadata to the host and check
                                       every entry first (synchronizes; fa4::Options::validate_device_metadata);
                                       reads as 0 from a struct_size ending before it */
} fa4_options;

/* FlashAttention's defaults: scale 1/sqrt(d), no mask, hardware exp2, tau = 8, non-deterministic. */
void fa4_options_init(fa4_options* options);

/* A contiguous [d0, d1, d2, d3] (or rank-3) tensor descriptor. */
fa4_tensor fa4_tensor_contiguous(void* data, fa4_dtype dtype, fa4_device device, int32_t rank, const int64_t* shape);

const char* fa4_version(void);
const char* fa4_last_error(void);
const char* fa4_status_string(fa4_status status);

/* out = softmax(q k^T) v; lse may be NULL. Asynchronous on `stream` for CUDA tensors; stream must be NULL
 * for CPU tensors. */
fa4_status fa4_forward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                       const fa4_tensor* lse, const fa4_options* options, void* workspace, size_t workspace_bytes,
                       void* stream);

/* dq, dk, dv from q, k, v, out, dout and the forward's lse. */
fa4_status fa4_backward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                        const fa4_tensor* dout, const fa4_tensor* lse, const fa4_tensor* dq, const fa4_tensor* dk,
                        const fa4_tensor* dv, const fa4_options* options, void* workspace, size_t workspace_bytes,
                        void* stream);

/* Bytes of workspace the pass needs for these shapes (device memory for CUDA tensors). */
fa4_status fa4_workspace_size(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                              const fa4_options* options, size_t* bytes);

/* FA4_OK when the pass can run on these inputs; otherwise the status the call would return, with the reason
 * written to `reason` (NUL-terminated, truncated to reason_bytes) and to fa4_last_error(). Never launches. */
fa4_status fa4_supports(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                        const fa4_options* options, char* reason, size_t reason_bytes);

/* Variable-length batches (fa4.hpp's Varlen): q, out, dout, dq are [total_q, h, d] and k, v, dk, dv
 * [total_k, h_kv, d] (rank 3), lse is [h, total_q] (rank 2, fp32); sequence b owns rows cu_seqlens_q[b] ..
 * cu_seqlens_q[b + 1] - 1 of q and cu_seqlens_k[b] .. of k/v (the first seqused_k[b] when seqused_k is not
 * NULL). The offsets live where the tensors do: host arrays for CPU tensors, device arrays for CUDA tensors
 * (both passes run on the sm_90a kernels). fa4_workspace_size_varlen gives the CUDA backward's workspace. */
typedef struct fa4_varlen {
  const int32_t* cu_seqlens_q; /* [batch + 1] */
  const int32_t* cu_seqlens_k; /* [batch + 1] */
  const int32_t* seqused_k;    /* [batch] or NULL */
  int64_t batch;
  int64_t max_seqlen_q;        /* the longest query sequence .. total_q */
  int64_t max_seqlen_k;        /* the longest key sequence .. total_k */
} fa4_varlen;

fa4_status fa4_forward_varlen(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                              const fa4_tensor* lse, const fa4_varlen* varlen, const fa4_options* options,
                              void* workspace, size_t workspace_bytes, void* stream);

fa4_status fa4_backward_varlen(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                               const fa4_tensor* dout, const fa4_tensor* lse, const fa4_tensor* dq,
                               const fa4_tensor* dk, const fa4_tensor* dv, const fa4_varlen* varlen,
                               const fa4_options* options, void* workspace, size_t workspace_bytes, void* stream);

/* Bytes of workspace fa4_forward_varlen / fa4_backward_varlen need (fa4.hpp's workspace_size_varlen). */
fa4_status fa4_workspace_size_varlen(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                                     const fa4_varlen* varlen, const fa4_options* options, size_t* bytes);

/* KV-cache attention (fa4.hpp's KvCache; FlashAttention's flash_attn_with_kvcache), forward only. q, out:
 * [batch, seqlen_q, h, d]; k_cache, v_cache: [batch, seqlen_cache, h_kv, d] (contiguous cache, page_table NULL)
 * or [num_pages, page_size, h_kv, d] (paged, page_size a multiple of 16); lse NULL or [batch, h, seqlen_q].
 * k_new, v_new ([batch, seqlen_new, h_kv, d]) are appended into the cache in place at cache_seqlens[b] first.
 * The int32 metadata live where the tensors do: host arrays for CPU tensors (checked entry by entry), device
 * arrays for CUDA tensors (trusted, as FlashAttention does; asynchronous on `stream`). The workspace:
 * fa4_workspace_size_kvcache's bytes, or none (stream-ordered memory). */
typedef struct fa4_kvcache {
  const int32_t* cache_seqlens;   /* [batch]: keys cached per sequence; NULL: every cache full */
  const int32_t* page_table;      /* [batch, max_pages] row-major; NULL: a contiguous cache */
  int64_t max_pages;              /* page_table's columns (0 without one) */
  const struct fa4_tensor* k_new; /* NULL, or with v_new: the keys and values to append */
  const struct fa4_tensor* v_new;
} fa4_kvcache;

fa4_status fa4_forward_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                               const fa4_tensor* out, const fa4_tensor* lse, const fa4_kvcache* kvcache,
                               const fa4_options* options, void* workspace, size_t workspace_bytes, void* stream);

/* As fa4_supports, for fa4_forward_kvcache's arguments (never writes the cache). */
fa4_status fa4_supports_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                                const fa4_kvcache* kvcache, const fa4_options* options, char* reason,
                                size_t reason_bytes);

/* Bytes of workspace fa4_forward_kvcache needs for these arguments (fa4.hpp's workspace_size_kvcache): a function
 * of the shapes, the options and the GPU, not of the metadata's contents. */
fa4_status fa4_workspace_size_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                                      const fa4_kvcache* kvcache, const fa4_options* options, size_t* bytes);

#ifdef __cplusplus
}
#endif

#endif /* FA4_FA4_H */
