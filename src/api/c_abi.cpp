// The C ABI: converts descriptors, calls the C++ API, and turns every exception into a status plus a
// thread-local message. Nothing throws across this boundary.
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "fa4/fa4.h"
#include "fa4/fa4.hpp"

namespace {

thread_local std::string g_last_error;

// A descriptor of rank min_rank .. max_rank (the tensors: 2 to 4; the sinks: 1).
fa4::Tensor to_cpp(const fa4_tensor* t, const char* arg, int min_rank = 2, int max_rank = 4) {
  if (t == nullptr) throw fa4::Error(fa4::Status::invalid_argument, std::string("fa4: argument '") + arg + "': expected a tensor descriptor, got NULL");
  fa4::Tensor r;
  r.data = t->data;
  r.dtype = static_cast<fa4::DType>(t->dtype);
  r.device = static_cast<fa4::Device>(t->device);
  r.device_index = t->device_index;
  r.rank = t->rank;
  if (t->rank < min_rank || t->rank > max_rank) {
    const std::string ranks = min_rank == max_rank ? std::to_string(min_rank)
                                                   : std::to_string(min_rank) + " to " + std::to_string(max_rank);
    throw fa4::Error(fa4::Status::invalid_argument, std::string("fa4: argument '") + arg + "': expected rank " + ranks +
                                                        ", got rank " + std::to_string(t->rank));
  }
  for (int i = 0; i < 4; ++i) {
    r.shape[i] = i < t->rank ? t->shape[i] : 1;
    r.stride[i] = i < t->rank ? t->stride[i] : 1;
  }
  return r;
}

// The C options as fa4::Options, with the sinks' descriptors converted and kept alive: construct it in the
// call's argument list (a temporary lives until the call returns). A struct_size from before the appended
// fields (sinks, dsinks, num_splits, validate_device_metadata) reads them as NULL / 0.
class CppOptions {
 public:
  explicit CppOptions(const fa4_options* o) {
    if (o == nullptr) return;
    constexpr size_t kFirstVersion = offsetof(fa4_options, deterministic) + sizeof(int32_t);
    if (o->struct_size < kFirstVersion)
      throw fa4::Error(fa4::Status::invalid_argument,
                       "fa4: argument 'options': expected struct_size >= " + std::to_string(kFirstVersion) +
                           " (call fa4_options_init), got " + std::to_string(o->struct_size));
    if (o->has_softmax_scale) r_.softmax_scale = o->softmax_scale;
    r_.causal = o->causal != 0;
    r_.window_left = o->window_left;
    r_.window_right = o->window_right;
    r_.softcap = o->softcap;
    r_.exp2_emulated_fraction = o->exp2_emulated_fraction;
    r_.rescale_threshold = o->rescale_threshold;
    r_.deterministic = o->deterministic != 0;
    const auto has = [o](size_t end) { return o->struct_size >= end; };
    if (has(offsetof(fa4_options, sinks) + sizeof(o->sinks)) && o->sinks) {
      sinks_ = to_cpp(o->sinks, "options.sinks", 1, 1);
      r_.sinks = &sinks_;
    }
    if (has(offsetof(fa4_options, dsinks) + sizeof(o->dsinks)) && o->dsinks) {
      dsinks_ = to_cpp(o->dsinks, "options.dsinks", 1, 1);
      r_.dsinks = &dsinks_;
    }
    if (has(offsetof(fa4_options, num_splits) + sizeof(o->num_splits))) r_.num_splits = o->num_splits;
    // 72 was sizeof(fa4_options) before this field (num_splits then tail padding): an older client's struct_size
    // of 72 must not reach it, whatever its padding bytes hold.
    static_assert(offsetof(fa4_options, validate_device_metadata) >= 72, "validate_device_metadata in old padding");
    if (has(offsetof(fa4_options, validate_device_metadata) + sizeof(o->validate_device_metadata)))
      r_.validate_device_metadata = o->validate_device_metadata != 0;
  }
  CppOptions(const CppOptions&) = delete;
  CppOptions& operator=(const CppOptions&) = delete;
  const fa4::Options& get() const { return r_; }

 private:
  fa4::Options r_;
  fa4::Tensor sinks_, dsinks_;
};

template <class F>
fa4_status guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return FA4_OK;
  } catch (const fa4::Error& e) {
    g_last_error = e.what();
    return static_cast<fa4_status>(e.code());
  } catch (const std::bad_alloc&) {
    g_last_error = "fa4: out of host memory";
    return FA4_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = std::string("fa4: internal error: ") + e.what();
    return FA4_ERROR_INTERNAL;
  } catch (...) {
    g_last_error = "fa4: internal error: unknown exception";
    return FA4_ERROR_INTERNAL;
  }
}

fa4::Pass to_pass(fa4_pass pass) {
  if (pass != FA4_FORWARD && pass != FA4_BACKWARD)
    throw fa4::Error(fa4::Status::invalid_argument, "fa4: argument 'pass': expected FA4_FORWARD or FA4_BACKWARD, got " + std::to_string(static_cast<int>(pass)));
  return static_cast<fa4::Pass>(pass);
}

}  // namespace

extern "C" {

void fa4_options_init(fa4_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  const fa4::Options d;
  o->struct_size = sizeof(fa4_options);
  o->window_left = d.window_left;
  o->window_right = d.window_right;
  o->softcap = d.softcap;
  o->exp2_emulated_fraction = d.exp2_emulated_fraction;
  o->rescale_threshold = d.rescale_threshold;
}

fa4_tensor fa4_tensor_contiguous(void* data, fa4_dtype dtype, fa4_device device, int32_t rank, const int64_t* shape) {
  fa4_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = rank;
  if (shape == nullptr || rank < 1 || rank > 4) {
    t.rank = -1;  // refused by every call, with a message naming the argument
    return t;
  }
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

const char* fa4_version(void) { return fa4::version(); }
const char* fa4_last_error(void) { return g_last_error.c_str(); }
const char* fa4_status_string(fa4_status status) { return fa4::to_string(static_cast<fa4::Status>(status)); }

fa4_status fa4_forward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                       const fa4_tensor* lse, const fa4_options* options, void* workspace, size_t workspace_bytes,
                       void* stream) {
  return guarded([&] {
    const fa4::Tensor lse_t = lse ? to_cpp(lse, "lse") : fa4::Tensor{};
    fa4::forward(to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), to_cpp(out, "out"), lse ? &lse_t : nullptr,
                 CppOptions(options).get(), {workspace, workspace_bytes}, static_cast<fa4::Stream>(stream));
  });
}

fa4_status fa4_backward(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                        const fa4_tensor* dout, const fa4_tensor* lse, const fa4_tensor* dq, const fa4_tensor* dk,
                        const fa4_tensor* dv, const fa4_options* options, void* workspace, size_t workspace_bytes,
                        void* stream) {
  return guarded([&] {
    fa4::backward(to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), to_cpp(out, "out"), to_cpp(dout, "dout"),
                  to_cpp(lse, "lse"), to_cpp(dq, "dq"), to_cpp(dk, "dk"), to_cpp(dv, "dv"), CppOptions(options).get(),
                  {workspace, workspace_bytes}, static_cast<fa4::Stream>(stream));
  });
}

namespace {
fa4::Varlen to_cpp(const fa4_varlen* v) {
  if (v == nullptr)
    throw fa4::Error(fa4::Status::invalid_argument, "fa4: argument 'varlen': expected a fa4_varlen, got NULL");
  fa4::Varlen r;
  r.cu_seqlens_q = v->cu_seqlens_q, r.cu_seqlens_k = v->cu_seqlens_k, r.seqused_k = v->seqused_k;
  r.batch = v->batch, r.max_seqlen_q = v->max_seqlen_q, r.max_seqlen_k = v->max_seqlen_k;
  return r;
}
}  // namespace

fa4_status fa4_forward_varlen(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                              const fa4_tensor* lse, const fa4_varlen* varlen, const fa4_options* options,
                              void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const fa4::Tensor lse_t = lse ? to_cpp(lse, "lse") : fa4::Tensor{};
    fa4::forward_varlen(to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), to_cpp(out, "out"), lse ? &lse_t : nullptr,
                        to_cpp(varlen), CppOptions(options).get(), {workspace, workspace_bytes},
                        static_cast<fa4::Stream>(stream));
  });
}

fa4_status fa4_backward_varlen(const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v, const fa4_tensor* out,
                               const fa4_tensor* dout, const fa4_tensor* lse, const fa4_tensor* dq,
                               const fa4_tensor* dk, const fa4_tensor* dv, const fa4_varlen* varlen,
                               const fa4_options* options, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    fa4::backward_varlen(to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), to_cpp(out, "out"), to_cpp(dout, "dout"),
                         to_cpp(lse, "lse"), to_cpp(dq, "dq"), to_cpp(dk, "dk"), to_cpp(dv, "dv"), to_cpp(varlen),
                         CppOptions(options).get(), {workspace, workspace_bytes}, static_cast<fa4::Stream>(stream));
  });
}

namespace {
// The C KvCache as fa4::KvCache, keeping the converted k_new / v_new alive (construct it in the call's argument
// list, as CppOptions).
class CppKvCache {
 public:
  explicit CppKvCache(const fa4_kvcache* c) {
    if (c == nullptr)
      throw fa4::Error(fa4::Status::invalid_argument, "fa4: argument 'kvcache': expected a fa4_kvcache, got NULL");
    r_.cache_seqlens = c->cache_seqlens, r_.page_table = c->page_table, r_.max_pages = c->max_pages;
    if (c->k_new) k_new_ = to_cpp(c->k_new, "kvcache.k_new", 4, 4), r_.k_new = &k_new_;
    if (c->v_new) v_new_ = to_cpp(c->v_new, "kvcache.v_new", 4, 4), r_.v_new = &v_new_;
  }
  CppKvCache(const CppKvCache&) = delete;
  CppKvCache& operator=(const CppKvCache&) = delete;
  const fa4::KvCache& get() const { return r_; }

 private:
  fa4::KvCache r_;
  fa4::Tensor k_new_, v_new_;
};
}  // namespace

fa4_status fa4_forward_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                               const fa4_tensor* out, const fa4_tensor* lse, const fa4_kvcache* kvcache,
                               const fa4_options* options, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    const fa4::Tensor lse_t = lse ? to_cpp(lse, "lse") : fa4::Tensor{};
    fa4::forward_kvcache(to_cpp(q, "q"), to_cpp(k_cache, "k_cache"), to_cpp(v_cache, "v_cache"), to_cpp(out, "out"),
                         lse ? &lse_t : nullptr, CppKvCache(kvcache).get(), CppOptions(options).get(),
                         {workspace, workspace_bytes}, static_cast<fa4::Stream>(stream));
  });
}

fa4_status fa4_supports_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                                const fa4_kvcache* kvcache, const fa4_options* options, char* reason,
                                size_t reason_bytes) {
  fa4::Support s;
  const fa4_status status = guarded([&] {
    s = fa4::supports_kvcache(to_cpp(q, "q"), to_cpp(k_cache, "k_cache"), to_cpp(v_cache, "v_cache"),
                              CppKvCache(kvcache).get(), CppOptions(options).get());
    if (!s.ok) throw fa4::Error(s.code, s.reason);
  });
  if (reason != nullptr && reason_bytes > 0) {
    std::strncpy(reason, g_last_error.c_str(), reason_bytes - 1);
    reason[reason_bytes - 1] = '\0';
  }
  return status;
}

fa4_status fa4_workspace_size_kvcache(const fa4_tensor* q, const fa4_tensor* k_cache, const fa4_tensor* v_cache,
                                      const fa4_kvcache* kvcache, const fa4_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr)
      throw fa4::Error(fa4::Status::invalid_argument,
                       "fa4_workspace_size_kvcache: argument 'bytes': expected a pointer, got NULL");
    *bytes = fa4::workspace_size_kvcache(to_cpp(q, "q"), to_cpp(k_cache, "k_cache"), to_cpp(v_cache, "v_cache"),
                                         CppKvCache(kvcache).get(), CppOptions(options).get());
  });
}

fa4_status fa4_workspace_size(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                              const fa4_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr) throw fa4::Error(fa4::Status::invalid_argument, "fa4_workspace_size: argument 'bytes': expected a pointer, got NULL");
    *bytes = fa4::workspace_size(to_pass(pass), to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), CppOptions(options).get());
  });
}

fa4_status fa4_workspace_size_varlen(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                                     const fa4_varlen* varlen, const fa4_options* options, size_t* bytes) {
  return guarded([&] {
    if (bytes == nullptr)
      throw fa4::Error(fa4::Status::invalid_argument,
                       "fa4_workspace_size_varlen: argument 'bytes': expected a pointer, got NULL");
    *bytes = fa4::workspace_size_varlen(to_pass(pass), to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), to_cpp(varlen),
                                        CppOptions(options).get());
  });
}

fa4_status fa4_supports(fa4_pass pass, const fa4_tensor* q, const fa4_tensor* k, const fa4_tensor* v,
                        const fa4_options* options, char* reason, size_t reason_bytes) {
  fa4::Support s;
  const fa4_status status = guarded([&] {
    s = fa4::supports(to_pass(pass), to_cpp(q, "q"), to_cpp(k, "k"), to_cpp(v, "v"), CppOptions(options).get());
    if (!s.ok) throw fa4::Error(s.code, s.reason);
  });
  if (reason != nullptr && reason_bytes > 0) {
    std::strncpy(reason, g_last_error.c_str(), reason_bytes - 1);
    reason[reason_bytes - 1] = '\0';
  }
  return status;
}

}  // extern "C"
