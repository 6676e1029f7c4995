// The C ABI: statuses, thread-local messages, defaults, and the same results as the C++ API.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "fa4/fa4.h"
#include "testing/tensors.hpp"

using fa4::testing::HostTensor;

namespace {
fa4_tensor to_c(const fa4::Tensor& t) {
  fa4_tensor c{};
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.device = static_cast<int32_t>(t.device);
  c.rank = t.rank;
  for (int i = 0; i < 4; ++i) c.shape[i] = t.shape[i], c.stride[i] = t.stride[i];
  return c;
}
}  // namespace

TEST(CAbi, OptionsInitGivesFlashAttentionDefaults) {
  fa4_options o;
  std::memset(&o, 0x7f, sizeof o);
  fa4_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(fa4_options));
  EXPECT_EQ(o.has_softmax_scale, 0);
  EXPECT_EQ(o.causal, 0);
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.softcap, 0.0f);
  EXPECT_EQ(o.rescale_threshold, 8.0f);
  EXPECT_EQ(o.exp2_emulated_fraction, 0.0f);
}

TEST(CAbi, ForwardAndBackwardMatchTheCppApi) {
  auto q = HostTensor::make(fa4::DType::bf16, {2, 37, 4, 64}), k = HostTensor::make(fa4::DType::bf16, {2, 50, 2, 64}),
       v = HostTensor::make(fa4::DType::bf16, {2, 50, 2, 64}), dout = HostTensor::make(fa4::DType::bf16, {2, 37, 4, 64});
  q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), dout.fill_normal(4);
  auto out_c = HostTensor::make(fa4::DType::bf16, {2, 37, 4, 64}), out_cpp = HostTensor::make(fa4::DType::bf16, {2, 37, 4, 64});
  auto lse_c = HostTensor::make_lse({2, 4, 37}), lse_cpp = HostTensor::make_lse({2, 4, 37});
  out_c.poison(), lse_c.poison();
  fa4::Options opts;
  opts.causal = true;
  fa4::forward(q.desc(), k.desc(), v.desc(), out_cpp.desc(), &lse_cpp.desc(), opts);

  fa4_options o;
  fa4_options_init(&o);
  o.causal = 1;
  const fa4_tensor cq = to_c(q.desc()), ck = to_c(k.desc()), cv = to_c(v.desc()), co = to_c(out_c.desc()), cl = to_c(lse_c.desc());
  ASSERT_EQ(fa4_forward(&cq, &ck, &cv, &co, &cl, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  EXPECT_EQ(out_c.values(), out_cpp.values());
  EXPECT_EQ(lse_c.values(), lse_cpp.values());

  auto dq = HostTensor::make(fa4::DType::bf16, {2, 37, 4, 64}), dk = HostTensor::make(fa4::DType::bf16, {2, 50, 2, 64}),
       dv = HostTensor::make(fa4::DType::bf16, {2, 50, 2, 64});
  const fa4_tensor cdo = to_c(dout.desc()), cdq = to_c(dq.desc()), cdk = to_c(dk.desc()), cdv = to_c(dv.desc());
  ASSERT_EQ(fa4_backward(&cq, &ck, &cv, &co, &cdo, &cl, &cdq, &cdk, &cdv, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  for (double x : dk.values()) ASSERT_TRUE(std::isfinite(x));
  size_t ws = 123;
  EXPECT_EQ(fa4_workspace_size(FA4_BACKWARD, &cq, &ck, &cv, &o, &ws), FA4_OK);
  EXPECT_EQ(ws, 0u);
}

TEST(CAbi, ErrorsReturnStatusAndNameTheArgument) {
  auto q = HostTensor::make(fa4::DType::f32, {1, 8, 2, 16});
  auto out = HostTensor::make(fa4::DType::f32, {1, 8, 2, 16});
  fa4_tensor cq = to_c(q.desc()), co = to_c(out.desc());
  fa4_tensor bad = cq;
  bad.shape[3] = 8;
  EXPECT_EQ(fa4_forward(&cq, &bad, &cq, &co, nullptr, nullptr, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'k'"), std::string::npos) << fa4_last_error();
  EXPECT_EQ(fa4_forward(&cq, nullptr, &cq, &co, nullptr, nullptr, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'k'"), std::string::npos);
  fa4_options o;
  fa4_options_init(&o);
  o.struct_size = 8;
  EXPECT_EQ(fa4_forward(&cq, &cq, &cq, &co, nullptr, &o, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("struct_size"), std::string::npos);
  // Success clears the message.
  EXPECT_EQ(fa4_forward(&cq, &cq, &cq, &co, nullptr, nullptr, nullptr, 0, nullptr), FA4_OK);
  EXPECT_STREQ(fa4_last_error(), "");
  EXPECT_STREQ(fa4_status_string(FA4_ERROR_UNSUPPORTED), "unsupported");
  const int64_t shape[2] = {1, 2};
  fa4_tensor wrong = fa4_tensor_contiguous(q.desc().data, FA4_F32, FA4_CPU, 0, shape);
  EXPECT_EQ(fa4_forward(&wrong, &cq, &cq, &co, nullptr, nullptr, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
}

TEST(CAbi, SupportsWritesTheReason) {
  auto q = HostTensor::make(fa4::DType::f32, {1, 8, 2, 16});
  fa4_tensor cq = to_c(q.desc());
  char reason[256];
  EXPECT_EQ(fa4_supports(FA4_FORWARD, &cq, &cq, &cq, nullptr, reason, sizeof reason), FA4_OK);
  EXPECT_STREQ(reason, "");
  cq.device = FA4_CUDA;
  EXPECT_EQ(fa4_supports(FA4_FORWARD, &cq, &cq, &cq, nullptr, reason, sizeof reason), FA4_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(reason).find("cuda"), std::string::npos) << reason;
  char tiny[8];
  fa4_supports(FA4_FORWARD, &cq, &cq, &cq, nullptr, tiny, sizeof tiny);
  EXPECT_EQ(std::strlen(tiny), 7u);  // truncated, NUL-terminated
  EXPECT_EQ(fa4_supports(static_cast<fa4_pass>(7), &cq, &cq, &cq, nullptr, nullptr, 0), FA4_ERROR_INVALID_ARGUMENT);
}

TEST(CAbi, LastErrorIsThreadLocal) {
  auto q = HostTensor::make(fa4::DType::f32, {1, 8, 2, 16});
  fa4_tensor cq = to_c(q.desc());
  fa4_tensor bad = cq;
  bad.rank = 2;
  EXPECT_NE(fa4_forward(&bad, &cq, &cq, &cq, nullptr, nullptr, nullptr, 0, nullptr), FA4_OK);
  std::string other;
  std::thread([&] { other = fa4_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(fa4_last_error()), "");
}

// Variable-length batches through the C ABI: the same bytes as the C++ call, and a NULL fa4_varlen named.
TEST(CAbi, VarlenMatchesTheCppApi) {
  auto make3 = [](fa4::Tensor t, int64_t total, int64_t h, int64_t d) {
    t.rank = 3, t.shape = {total, h, d, 1}, t.stride = {h * d, d, 1, 1};
    return t;
  };
  auto q = HostTensor::make(fa4::DType::bf16, {1, 12, 2, 32}), k = HostTensor::make(fa4::DType::bf16, {1, 20, 1, 32}),
       v = HostTensor::make(fa4::DType::bf16, {1, 20, 1, 32}), out_c = HostTensor::make(fa4::DType::bf16, {1, 12, 2, 32}),
       out_cpp = HostTensor::make(fa4::DType::bf16, {1, 12, 2, 32});
  q.fill_normal(1), k.fill_normal(2), v.fill_normal(3), out_c.poison(), out_cpp.poison();
  const fa4::Tensor tq = make3(q.desc(), 12, 2, 32), tk = make3(k.desc(), 20, 1, 32), tv = make3(v.desc(), 20, 1, 32),
                    to_c_out = make3(out_c.desc(), 12, 2, 32), to_cpp_out = make3(out_cpp.desc(), 12, 2, 32);
  const int32_t cu_q[] = {0, 5, 12}, cu_k[] = {0, 9, 20};
  fa4_varlen cv{cu_q, cu_k, nullptr, 2, 7, 11};
  fa4::Varlen vl;
  vl.cu_seqlens_q = cu_q, vl.cu_seqlens_k = cu_k, vl.batch = 2, vl.max_seqlen_q = 7, vl.max_seqlen_k = 11;
  fa4_options o;
  fa4_options_init(&o);
  o.causal = 1;
  fa4::Options oc;
  oc.causal = true;
  const fa4_tensor cq = to_c(tq), ck = to_c(tk), cvv = to_c(tv), cout = to_c(to_c_out);
  ASSERT_EQ(fa4_forward_varlen(&cq, &ck, &cvv, &cout, nullptr, &cv, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  fa4::forward_varlen(tq, tk, tv, to_cpp_out, nullptr, vl, oc);
  EXPECT_EQ(out_c.storage(), out_cpp.storage());
  EXPECT_EQ(fa4_forward_varlen(&cq, &ck, &cvv, &cout, nullptr, nullptr, &o, nullptr, 0, nullptr),
            FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'varlen'"), std::string::npos) << fa4_last_error();
  // The workspace query: none for CPU tensors (the CPU backend keeps its scratch), the C++ answer, NULLs named.
  size_t bytes = 123;
  ASSERT_EQ(fa4_workspace_size_varlen(FA4_BACKWARD, &cq, &ck, &cvv, &cv, &o, &bytes), FA4_OK) << fa4_last_error();
  EXPECT_EQ(bytes, fa4::workspace_size_varlen(fa4::Pass::backward, tq, tk, tv, vl, oc));
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(fa4_workspace_size_varlen(FA4_BACKWARD, &cq, &ck, &cvv, &cv, &o, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'bytes'"), std::string::npos) << fa4_last_error();
  EXPECT_EQ(fa4_workspace_size_varlen(FA4_BACKWARD, &cq, &ck, &cvv, nullptr, &o, &bytes), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("'varlen'"), std::string::npos) << fa4_last_error();
}

// Attention sinks through the C ABI: the same outputs and dsinks as the C++ API; a struct_size from before the
// appended fields still works (reading them as NULL), one shorter than the first version is refused.
TEST(CAbi, SinksMatchTheCppApiAndOldStructsStillWork) {
  auto q = HostTensor::make(fa4::DType::bf16, {1, 29, 2, 32}), k = HostTensor::make(fa4::DType::bf16, {1, 33, 1, 32}),
       v = HostTensor::make(fa4::DType::bf16, {1, 33, 1, 32}), dout = HostTensor::make(fa4::DType::bf16, {1, 29, 2, 32});
  q.fill_normal(11), k.fill_normal(12), v.fill_normal(13), dout.fill_normal(14);
  float sinks[2] = {1.0f, -2.0f}, dsinks_cpp[2] = {NAN, NAN}, dsinks_c[2] = {NAN, NAN};
  const int64_t heads = 2;
  fa4::Tensor s_cpp, ds_cpp;
  s_cpp.data = sinks, s_cpp.rank = 1, s_cpp.shape = {2, 0, 0, 0}, s_cpp.stride = {1, 0, 0, 0};
  ds_cpp = s_cpp;
  ds_cpp.data = dsinks_cpp;
  auto out_cpp = HostTensor::make(fa4::DType::bf16, {1, 29, 2, 32}), out_c = HostTensor::make(fa4::DType::bf16, {1, 29, 2, 32});
  auto lse_cpp = HostTensor::make_lse({1, 2, 29}), lse_c = HostTensor::make_lse({1, 2, 29});
  auto dq = HostTensor::make(fa4::DType::bf16, {1, 29, 2, 32}), dk = HostTensor::make(fa4::DType::bf16, {1, 33, 1, 32}),
       dv = HostTensor::make(fa4::DType::bf16, {1, 33, 1, 32});
  fa4::Options opts;
  opts.sinks = &s_cpp;
  fa4::forward(q.desc(), k.desc(), v.desc(), out_cpp.desc(), &lse_cpp.desc(), opts);
  opts.dsinks = &ds_cpp;
  fa4::backward(q.desc(), k.desc(), v.desc(), out_cpp.desc(), dout.desc(), lse_cpp.desc(), dq.desc(), dk.desc(),
                dv.desc(), opts);

  const fa4_tensor cs = fa4_tensor_contiguous(sinks, FA4_F32, FA4_CPU, 1, &heads),
                   cds = fa4_tensor_contiguous(dsinks_c, FA4_F32, FA4_CPU, 1, &heads);
  fa4_options o;
  fa4_options_init(&o);
  o.sinks = &cs;
  const fa4_tensor cq = to_c(q.desc()), ck = to_c(k.desc()), cv = to_c(v.desc()), co = to_c(out_c.desc()),
                   cl = to_c(lse_c.desc()), cdo = to_c(dout.desc()), cdq = to_c(dq.desc()), cdk = to_c(dk.desc()),
                   cdv = to_c(dv.desc());
  ASSERT_EQ(fa4_forward(&cq, &ck, &cv, &co, &cl, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  EXPECT_EQ(out_c.values(), out_cpp.values());
  EXPECT_EQ(lse_c.values(), lse_cpp.values());
  o.dsinks = &cds;
  ASSERT_EQ(fa4_backward(&cq, &ck, &cv, &co, &cdo, &cl, &cdq, &cdk, &cdv, &o, nullptr, 0, nullptr), FA4_OK)
      << fa4_last_error();
  EXPECT_EQ(dsinks_c[0], dsinks_cpp[0]);
  EXPECT_EQ(dsinks_c[1], dsinks_cpp[1]);
  EXPECT_TRUE(std::isfinite(dsinks_c[0]) && dsinks_c[0] != 0.0f);

  // A caller built before the sinks existed: its struct ends at `deterministic`; the fields past it are not read.
  o.struct_size = uint32_t(offsetof(fa4_options, deterministic) + sizeof(int32_t));
  o.dsinks = &cds;  // garbage past the old struct's end would be here; it must be ignored
  ASSERT_EQ(fa4_forward(&cq, &ck, &cv, &co, &cl, &o, nullptr, 0, nullptr), FA4_OK) << fa4_last_error();
  fa4::Options plain;
  fa4::forward(q.desc(), k.desc(), v.desc(), out_cpp.desc(), &lse_cpp.desc(), plain);
  EXPECT_EQ(out_c.values(), out_cpp.values()) << "an old struct_size must mean no sinks";
  o.struct_size = uint32_t(offsetof(fa4_options, deterministic));
  EXPECT_EQ(fa4_forward(&cq, &ck, &cv, &co, &cl, &o, nullptr, 0, nullptr), FA4_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa4_last_error()).find("struct_size"), std::string::npos);
}
