// Feeds-and-speeds model of the attention forward and backward pipelines (issue 5).
//
// The model counts, per tile step (M query rows x N key rows x head dim d), the work each SM resource must do,
// converts it to cycles with per-SM rates, and composes the resources into a time per step according to the
// role schedule. A list-scheduling simulation over the SMs then turns per-tile times into a whole-problem
// time (wave quantization, causal imbalance, longest-first order). Everything is host-only arithmetic.
//
// Units: cycles are SM clock cycles of one SM (one CTA; with 2-CTA MMA, per CTA of the pair). Bytes are per
// CTA. FLOPs follow FlashAttention's convention: forward 4*M*N*d per step, backward 2.5x that.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fa4::model {

enum class Gpu { h100, h200, b200, b300 };
enum class Pass { fwd, bwd };
enum class DType { bf16, fp16, fp8 };
// pingpong: the softmax of one tile runs while the MMAs of another run (FA3's two-warpgroup ping-pong and
// intra-warpgroup overlap on Hopper; FA4's two softmax warpgroups and MMA warp on Blackwell).
// serial: a warpgroup's MMAs and its softmax alternate with no overlap.
enum class Schedule { pingpong, serial };
enum class Resource { mma, mufu, alu, smem };

std::string_view name(Gpu);
std::string_view name(Pass);
std::string_view name(DType);
std::string_view name(Schedule);
std::string_view name(Resource);
int bytes_per_element(DType);

// A hardware parameter with where it comes from (datasheet, paper, or our H200 measurement).
struct Sourced {
  double value;
  std::string_view source;
};

struct Hardware {
  std::string_view name;  // "H100 SXM"
  int sm_arch;            // 90, 100, 103
  Sourced sm_count;
  Sourced clock_ghz;              // sustained SM clock used to turn cycles into seconds
  Sourced mma_flop_per_clk;       // dense FP16/BF16 tensor-core FLOP per clock per SM
  Sourced mma_fp8_flop_per_clk;   // dense FP8
  Sourced mufu_exp2_per_clk;      // MUFU.EX2 results per clock per SM
  Sourced issue_per_clk;          // thread-instructions issued per clock per SM (4 schedulers x 32 lanes)
  Sourced smem_bytes_per_clk;     // shared-memory bandwidth per SM
  Sourced hbm_tb_per_s;
  Sourced tmem_kib;               // tensor memory per SM (0: none)
  bool packed_fp32;               // f32x2 FFMA/FADD/FMUL (sm_100+): two elementwise ops per instruction
  bool two_cta_mma;               // tcgen05 cta_group::2
};

const Hardware& hardware(Gpu);
std::span<const Gpu> all_gpus();

// The model's only tuning knobs. Global (the same for every configuration), each documented where defined.
struct Efficiency {
  double sustained;              // sustained fraction of peak rates on a fully loaded SM (all resources)
  double alu_issue;              // further fraction of the peak instruction-issue rate reached by ALU streams
  double overlap_exponent_regs;  // p of the p-norm that composes MMA and softmax time on Hopper ping-pong
  double hbm_achieved;           // achieved fraction of the datasheet HBM bandwidth (streaming copy)
  double exposed_io_share;       // a lone CTA's exposed load/store rate, in multiples of its fair HBM share
  double exposed_io_latency;     // fixed cycles per work tile for its exposed prologue + epilogue I/O
};
extern const Efficiency kEfficiency;

// One tile step and the kernel options that change its cost.
struct TileConfig {
  Pass pass = Pass::fwd;
  DType dtype = DType::bf16;
  int m = 128;                     // query rows per step (per CTA pair's CTA for 2-CTA forward)
  int n = 128;                     // key rows per step (the CTA's own key rows in the backward)
  int d = 128;                     // head dim (= value head dim)
  int ctas = 1;                    // 2: Blackwell cta_group::2 MMA, B operands split over the pair
  int cluster = 1;                 // Hopper backward, 2: a cluster of two CTAs on neighbouring key blocks that
                                   // share Q, dO, LSE, D by TMA multicast and sum their dQ partials through
                                   // distributed SMEM before one reduce-add per pair (DESIGN.md §1)
  bool p_in_smem = false;          // P (fwd) or P and dS as A operands (bwd) staged through SMEM, not regs/TMEM
  int q_tiles_per_cta = 1;         // forward: Q tiles one CTA keeps in flight (FA4: 2 ping-pong tiles)
  double emulated_fraction = 0.0;  // forward exp2 done on the FMA pipe (Cody-Waite + degree-3 polynomial)
  double rescale_frequency = 1.0;  // forward: fraction of steps that rescale O (FA4 conditional rescale ~0.1)
  bool mask_every_step = false;    // backward: causal mask applied to every step, not only the diagonal ones
                                   // (FA3 separates the masking iterations only for hdim <= 64, fa3.md §4.5)
  bool dq_from_registers = false;  // Hopper backward, one CTA: dQ partials added from registers (red.global.add)
                                   // instead of staged in SMEM for a bulk reduce-add (fa4's d = 128 row, B20)
};

// The tile configuration the reference kernels use (FA3 tables on Hopper, FA4 on Blackwell) with the
// exp2-emulation and rescale policy each uses by default.
TileConfig default_tile(Gpu, Pass, int d, bool causal, DType = DType::bf16);
// The role schedule the reference kernels use: FA3's backward has no inter-warpgroup ping-pong (serial);
// its forward and both FA4 passes overlap softmax with MMAs (pingpong).
Schedule default_schedule(Gpu, Pass);

// Per-step work and cycles by resource. Cycles here are ideal (peak rates, no efficiency factors).
struct TileCost {
  double flops = 0;
  double exps = 0;  // score elements needing exp2 (MUFU + emulated)
  double mma_cycles = 0, mufu_cycles = 0, alu_cycles = 0, smem_cycles = 0;
  double alu_instructions = 0;  // thread-instructions on the issue slots (softmax, conversion, rescale, emulation)
  // shared-memory bytes by purpose
  double smem_operand_bytes = 0;   // MMA operand reads
  double smem_staging_bytes = 0;   // P (fwd, SS path) or dS (and P) writes
  double smem_exchange_bytes = 0;  // 2-CTA dS exchange through distributed shared memory
  double smem_dq_bytes = 0;        // dQ fp32 partial written and read back for the global reduce-add
  double tmem_bytes = 0;           // tensor-memory reads + writes (Blackwell only)
  double load_bytes = 0;           // global -> SMEM per step (K,V fwd; Q,dO,LSE,D and dQ reduce-add bwd)
  // Backward work tiles are not persistent (one CTA per K/V block, fa3.md §4.8, fa4.md §7): what a CTA must
  // load before its first step (K, V and the first Q, dO, LSE, D) and store after its last (dK, dV and the
  // last dQ partial) is exposed, not overlapped with its steps. Zero in the forward (persistent kernels).
  double prologue_bytes = 0;
  double epilogue_bytes = 0;
  // The epilogue's own work before its store: dK *= softmax scale, dK and dV packed to 16 bit and written to
  // SMEM for the TMA store (fa3.md §4.6, fa4.md §5.1).
  double epilogue_smem_bytes = 0;
  double epilogue_alu_instructions = 0;
  Resource bound = Resource::mma;  // slowest resource
  double bound_cycles = 0;         // overlapped bound: max over resources
  double serial_cycles = 0;        // serial sum: tensor-core side + softmax side
};

TileCost tile_cost(const Hardware&, const TileConfig&);

// Cycles per step after efficiencies, composed according to the schedule.
struct StepTime {
  double tensor_side = 0;   // max(MMA, SMEM) / sustained
  double softmax_side = 0;  // max(MUFU, ALU / alu_issue) / sustained
  double step = 0;          // composed
  double fill = 0;          // exposed once per work tile: the overlap a pipeline fill/drain loses
};

// Cycles a backward work tile spends outside its steps: the exposed prologue and epilogue I/O
// (TileCost::prologue_bytes, epilogue_bytes) at a fixed latency plus the bytes at exposed_io_share x the SM's
// fair share of the achieved HBM bandwidth, and the epilogue's conversion and SMEM staging at the per-SM rates
// (sustained, alu_issue). Zero for the forward.
double work_tile_io_cycles(const Hardware&, const TileCost&);
StepTime step_time(const Hardware&, const TileCost&, Schedule);

struct Problem {
  int batch = 1;
  int heads = 16;
  int seqlen_q = 4096;
  int seqlen_k = 4096;
  bool causal = false;  // bottom-right aligned
  bool lpt = false;     // longest-processing-time-first tile order
};

struct Prediction {
  TileCost tile;
  StepTime time;
  long work_tiles = 0;            // CTA (pair) work tiles
  int units = 0;                  // concurrent work tiles (SMs / CTAs per pair)
  double makespan_cycles = 0;     // list-scheduled finish time
  double wave_efficiency = 0;     // busy fraction of units (wave quantization + imbalance)
  double flops = 0;               // FlashAttention convention
  double compute_seconds = 0;
  double io_cycles = 0;           // per work tile: exposed prologue/epilogue I/O (backward)
  double hbm_bytes = 0;           // compulsory HBM traffic of the main kernel
  double hbm_seconds = 0;
  // Backward only: the separate preprocess (D = rowsum(dO o O), LSE*log2e, zero the fp32 dQ accumulator) and
  // postprocess (dQ accumulator -> bf16) kernels, pure HBM streams that run before and after the main kernel.
  double aux_bytes = 0;
  double aux_seconds = 0;
  double tflops = 0;              // flops / (max(compute, hbm) + aux) time
  double tile_bound_tflops = 0;   // upper limit from the overlapped per-tile bound alone, ideal rates
};

Prediction predict(const Hardware&, const TileConfig&, const Problem&, Schedule);

// Makespan of greedy list scheduling of `work` (in order) on `units` identical machines.
double list_schedule_makespan(std::vector<double> work, int units, bool longest_first);

// Throughput (elements / clock / SM) of a softmax-like stream (FFMA, exp2, FADD, bf16 pack) with a fraction of
// the exps emulated: the model's version of the H200 microbenchmark in ../shared/H200.md.
double softmax_stream_rate(const Hardware&, double emulated_fraction);

// Measured peer throughputs on our H200 (../shared/H200.md), for validation.
struct Measurement {
  std::string_view impl;  // "FA3" or "cuDNN"
  int d;
  bool causal;
  int seqlen;
  double fwd_tflops;  // 0: not measured
  double bwd_tflops;
};
std::span<const Measurement> h200_measurements();

// The model's prediction for each measured row: H200, FA3's tile configuration and schedule (used for cuDNN
// too, whose configuration is not public), the benchmark shape (batch = 16384 / seqlen, heads = 2048 / d),
// longest-first order when causal (FA3's causal schedulers). error = predicted / measured - 1.
struct ValidationRow {
  Measurement measured;
  double fwd_predicted = 0, bwd_predicted = 0;
  double fwd_error = 0, bwd_error = 0;
};
std::vector<ValidationRow> validate_h200();

}  // namespace fa4::model
