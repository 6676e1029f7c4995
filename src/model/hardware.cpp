// Hardware parameter sets and the model's global efficiency parameters, each with its source.
// "fa4.md", "fa3.md", "H200.md" are ../shared/reference/fa4.md, ../shared/reference/fa3.md, ../shared/H200.md.
#include <array>
#include <stdexcept>

#include "model/model.hpp"

namespace fa4::model {

namespace {

// Per-SM rates common to Hopper and Blackwell: four SM sub-partitions, each issuing one warp instruction
// (32 lanes) per clock; FFMA runs at that rate on 128 FP32 lanes.
constexpr Sourced kIssue{128, "4 schedulers x 32 lanes per clock (NVIDIA Hopper/Blackwell architecture whitepapers)"};
constexpr Sourced kSmem{128, "128 B/clk/SM (FA4 paper/blog, fa4.md §1.4)"};

const std::array<Hardware, 4> kHardware{{
    {"H100 SXM", 90,
     {132, "datasheet"},
     {1.98, "datasheet max boost; the same GH100 die holds 1980 MHz under load on our H200 (H200.md)"},
     {4096, "989 TFLOP/s dense at 1830 MHz / 132 SMs (datasheet); fa4.md §1.4"},
     {8192, "fa4.md §1.4 (cudnn-frontend PR #650)"},
     {16, "FA4 paper (fa4.md §1.4); 15.9 measured on the same die (H200.md)"},
     kIssue,
     kSmem,
     {3.35, "datasheet"},
     {0, "no tensor memory on sm_90"},
     false, false},
    {"H200", 90,
     {132, "H200.md (measured device)"},
     {1.98, "H200.md: SM clock 1980 MHz under load"},
     {4096, "same GH100 tensor cores as H100 (fa4.md §1.4)"},
     {8192, "fa4.md §1.4"},
     {15.9, "H200.md: MUFU ex2.approx.f32 measured 15.9 results/clk/SM"},
     kIssue,
     kSmem,
     {4.8, "datasheet (H200.md measures 4.24 TB/s device-to-device copy)"},
     {0, "no tensor memory on sm_90"},
     false, false},
    {"B200", 100,
     {148, "fa4.md §1.4 (2.25 PF over 148 SMs)"},
     {1.856, "derived: 2.25 PF dense BF16 (datasheet) / (148 SMs x 8192 FLOP/clk)"},
     {8192, "FA4 paper (fa4.md §1.4)"},
     {16384, "fa4.md §1.4 (cudnn-frontend PR #650)"},
     {16, "FA4 paper (fa4.md §1.4)"},
     kIssue,
     kSmem,
     {8.0, "datasheet (HGX B200)"},
     {256, "FA4 blog: 128 lanes x 512 columns x 32 bit (fa4.md §1.4)"},
     true, true},
    {"B300", 103,
     {148, "[est] assumed equal to B200; the full Blackwell Ultra die has 160 SMs (NVIDIA blog)"},
     {1.856, "[est] assumed equal to B200: same 2.25 PF dense BF16 (datasheet)"},
     {8192, "fa4.md §1.4"},
     {16384, "[est] as B200"},
     {32, "FA4 paper/blog: MUFU.EX2 doubled on sm_103 (fa4.md §1.1, §1.4)"},
     kIssue,
     {128, "[est] assumed equal to B200 (fa4.md §1.4 gives none)"},
     {8.0, "datasheet (HGX B300)"},
     {256, "NVIDIA Blackwell Ultra blog: 256 KB TMEM per SM"},
     true, true},
}};

constexpr std::array<Gpu, 4> kAllGpus{Gpu::h100, Gpu::h200, Gpu::b200, Gpu::b300};

}  // namespace

// Global efficiency parameters; the same for every GPU, head dim, sequence length and mask:
// - sustained: 759 TFLOP/s measured for an 8192^3 BF16 torch matmul on our H200 (H200.md) over the peak at the
//   measured clock (132 x 4096 x 1.98 GHz = 1070.5 TFLOP/s) = 0.709. Applied to every resource alike, as a
//   lower effective clock would be (a fully loaded SM is power-limited); assumed the same on every GPU.
//   Derating only the tensor cores instead made SMEM look relatively faster and erased the 2-CTA backward gain
//   that FA4 measures on B200 (fa4.md §1.2), so the model treats it as a clock-like factor.
// - alu_issue: FFMA chains reach 107 of 128 lanes per clock on our H200 (H200.md, fa4.md §1.6) = 0.84.
// - overlap_exponent_regs: on Hopper the MMA side and the softmax side of a tile step do not overlap
//   perfectly (register-resident accumulators, named-barrier ping-pong). Their times are combined as the
//   p-norm (a^p + b^p)^(1/p): p = 1 is the serial sum, p -> infinity the overlapped bound. p = 2 was chosen
//   once against FA3's forward throughput on our H200 (all head dims, seqlen >= 4k); it is the only number
//   fitted to attention throughputs (the two I/O parameters below are fitted to a microbenchmark). Blackwell (TMEM accumulators, a dedicated MMA warp) is modelled as fully overlapped.
// - hbm_achieved: 4.24 TB/s device-to-device copy measured on our H200 (H200.md) over the 4.8 TB/s datasheet
//   = 0.883. Used for every HBM stream (the backward's pre/postprocess kernels, the compulsory-traffic check).
// - exposed_io_share, exposed_io_latency: a backward CTA loads K, V and its first Q/dO tile before its first
//   step and stores dK, dV and its last dQ partial after its last step; nothing of its own overlaps that I/O
//   (the kernels are not persistent). Measured on our H200 with a one-CTA-per-SM, non-persistent kernel
//   (384 threads, 200 KB SMEM, 16 waves) that loads B bytes into SMEM, computes, and stores B bytes
//   (docs/model.md, appendix): the extra time per CTA over a compute-only run is
//   0.27 us + bytes / 60.8 GB/s (least squares over B = 32..160 KB each way, two compute lengths), i.e. 530
//   cycles and 30.7 B/clk per SM at 1980 MHz, 1.89x the SM's fair share of 4.24 TB/s (16.2 B/clk). Expressed
//   as that share so that it scales with each GPU's HBM bandwidth per SM; the ratio is assumed GPU-independent.
const Efficiency kEfficiency{759.0 / (132 * 4096 * 1.98e-3), 107.0 / 128.0, 2.0,
                             4.24 / 4.8, 30.7 / (4.24e12 / 132 / 1.98e9), 530};

const Hardware& hardware(Gpu gpu) { return kHardware.at(static_cast<size_t>(gpu)); }

std::span<const Gpu> all_gpus() { return kAllGpus; }

std::string_view name(Gpu gpu) {
  switch (gpu) {
    case Gpu::h100: return "h100";
    case Gpu::h200: return "h200";
    case Gpu::b200: return "b200";
    case Gpu::b300: return "b300";
  }
  throw std::invalid_argument("unknown Gpu");
}

std::string_view name(Pass pass) { return pass == Pass::fwd ? "fwd" : "bwd"; }

std::string_view name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp8: return "fp8";
  }
  throw std::invalid_argument("unknown DType");
}

std::string_view name(Schedule schedule) { return schedule == Schedule::pingpong ? "pingpong" : "serial"; }

std::string_view name(Resource resource) {
  switch (resource) {
    case Resource::mma: return "mma";
    case Resource::mufu: return "mufu";
    case Resource::alu: return "alu";
    case Resource::smem: return "smem";
  }
  throw std::invalid_argument("unknown Resource");
}

int bytes_per_element(DType dtype) { return dtype == DType::fp8 ? 1 : 2; }

}  // namespace fa4::model
