// `fa4 info`: version, build options, backends, GPUs, compiled kernels.
#include <fmt/format.h>
#include <omp.h>

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
  fmt::print("          cuda: none compiled yet (src/cuda/instances.def is empty)\n");
}

}  // namespace

void add_info_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("info", "version, build options, backends, GPUs and compiled kernels");
  cmd->callback([] { info(); });
}

}  // namespace fa4::cli
