// `fa4 info`: version, build options, backends, GPUs, compiled kernels.
#include <fmt/format.h>
#include <omp.h>

#include <string>

#include "api/device_info.hpp"
#include "fa4/commands.hpp"
#include "fa4/fa4.hpp"

namespace fa4::cli {
namespace {

void info() {
  fmt::print("fa4 {}\n", version());
  fmt::print("build     {} {} (C++20), CUDA backend: {}{}\n",
#if defined(__clang__)
             "clang", __clang_version__,
#else
             "g++", __VERSION__,
#endif
             detail::built_with_cuda() ? "on" : "off",
             detail::built_with_cuda() ? fmt::format(" (archs {})", detail::cuda_archs()) : "");
  fmt::print("cpu       backend available: blocked online softmax, fp32 accumulation, {} OpenMP threads\n",
             omp_get_max_threads());
  const auto gpus = detail::cuda_devices();
  if (gpus.empty()) fmt::print("gpu       none {}\n", detail::built_with_cuda() ? "found by the CUDA runtime" : "(built without CUDA)");
  for (const auto& g : gpus)
    fmt::print("gpu {}     {} (sm_{}{}, {} SMs, {:.0f} GiB)\n", g.index, g.name, g.cc_major, g.cc_minor, g.sms, g.memory_gib);
  fmt::print("kernels   cpu: forward, backward; f32 f16 bf16 (fp32 accumulation), f64 (exact); head_dim 1..256;\n"
             "          causal, window, softcap, GQA/MQA, exp2 emulation k/16, rescale threshold\n");
  // The rows of src/cuda/instances.def; a row's kernel exists when its arch is among the built ones.
  const std::string archs = detail::built_with_cuda() ? detail::cuda_archs() : "";
  auto built = [&](std::string arch) { return archs.find(arch.substr(2) + "a") != std::string::npos; };
  std::string rows;
#define FA4_KERNEL(arch, pass, dtype, head_dim)                                                      \
  rows += fmt::format("          cuda: {} {} {} head_dim {}{}\n", #arch, #pass, #dtype, head_dim,   \
                      built(#arch) ? "" : " (not built: FA4_CUDA_ARCHS lacks it)");
#include "cuda/instances.def"
  fmt::print("{}", rows.empty() ? std::string("          cuda: none\n") : rows);
  if (!rows.empty())
    fmt::print("          cuda kernels: causal, window, softcap, GQA/MQA, exp2 emulation k/16, rescale threshold "
               "at run time\n");
}

}  // namespace

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "version, build options, backends, GPUs and compiled kernels");
  cmd->callback([] { info(); });
}

}  // namespace fa4::cli
