// Per-tile-step accounting: what each resource must do for one M x N x d step, and in how many cycles.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/model.hpp"

namespace fa4::model {

namespace {

// Issue-slot thread-instructions per score element of the softmax-side work. Hopper (FA3 style) holds a row
// in 4 threads and has only scalar FP32; Blackwell (FA4 style) gives each thread a row and packs FFMA/FADD/FMUL
// two-wide (f32x2). Counts follow the instruction sequences in fa3.md §2.7 and fa4.md §2.6, §3.1.
struct ElementOps {
  double row_max;          // FMNMX
  double scale_subtract;   // FFMA s*scale_log2 - m*scale_log2 (fwd) or - LSE (bwd)
  double exp_issue;        // the MUFU.EX2 instruction's issue slot
  double exp_emulated;     // Cody-Waite + degree-3 Horner + exponent insert: 1 FMNMX, 3 FADD, 3 FFMA, 2 INT
  double row_sum;          // FADD
  double convert;          // F2FP packs two results into bf16x2/f16x2
  double fp32_op;          // any other FP32 add/mul per element (packed on Blackwell)
};
constexpr ElementOps kScalarOps{1, 1, 1, 9, 1, 0.5, 1};
// Packed: the 3 FADD + 3 FFMA of the emulation become 3 instructions; FMNMX and the integer ops stay scalar.
constexpr ElementOps kPackedOps{1, 0.5, 1, 6, 0.5, 0.5, 0.5};

const ElementOps& element_ops(const Hardware& hw) { return hw.packed_fp32 ? kPackedOps : kScalarOps; }

void check(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

TileConfig default_tile(Gpu gpu, Pass pass, int d, bool causal, DType dtype) {
  check(d > 0 && d <= 256, "head dim must be in 1..256");
  const Hardware& hw = hardware(gpu);
  TileConfig t;
  t.pass = pass;
  t.dtype = dtype;
  t.d = d;
  if (!hw.two_cta_mma) {
    // FA3 tile tables (fa3.md §2.1 forward, §4.2 backward). FA3 never emulates exp2 and always rescales.
    if (pass == Pass::fwd) {
      if (dtype == DType::fp8) {
        t.m = d <= 96 ? 192 : 128;
        t.n = d <= 64 ? 160 : d <= 96 ? 128 : d <= 128 ? 224 : d <= 192 ? 160 : 128;
      } else if (d <= 64) {
        t.m = 192, t.n = causal ? 128 : 192, t.p_in_smem = !causal;  // non-causal uses the SS P.V
      } else if (d <= 96) {
        t.m = 192, t.n = 144, t.p_in_smem = true;
      } else if (d <= 128) {
        t.m = 128, t.n = causal ? 128 : 176;
      } else if (d <= 192) {
        t.m = 128, t.n = 112;
      } else {
        t.m = 128, t.n = 80;
      }
    } else {
      if (d <= 64) t.m = 128, t.n = 128;
      else if (d <= 96) t.m = 64, t.n = 128;
      else if (d <= 128) t.m = causal ? 64 : 80, t.n = 128;
      else if (d <= 192) t.m = 64, t.n = 96, t.p_in_smem = true;  // everything SS above hdim 128
      else t.m = 64, t.n = 80, t.p_in_smem = true;
      t.mask_every_step = causal && d > 64;  // SeparateMaskingIterations = hdim <= 64 (fa3.md §4.5)
    }
    return t;
  }
  // FA4 on sm_100/sm_103 (fa4.md §2.1, §3.2, §4, §5.2): 128 x 128 steps; the forward keeps two Q tiles in
  // flight; the backward uses 2-CTA from hdim 128. Emulation 16/4/1 = 12.5% (hd256 kernel 28.1%), none on
  // sm_103; conditional rescale skips ~90% of the rescales (Tri Dao, fa4.md §4).
  t.m = 128;
  t.n = 128;
  if (pass == Pass::fwd) {
    t.q_tiles_per_cta = d <= 128 ? 2 : 1;
    t.ctas = d > 192 ? 2 : 1;
    t.emulated_fraction = hw.sm_arch == 103 ? 0.0 : d > 192 ? 0.28125 : 0.125;
    t.rescale_frequency = dtype == DType::fp8 ? 1.0 : 0.1;
  } else {
    t.ctas = d >= 128 ? 2 : 1;
  }
  return t;
}

Schedule default_schedule(Gpu gpu, Pass pass) {
  return pass == Pass::bwd && !hardware(gpu).two_cta_mma ? Schedule::serial : Schedule::pingpong;
}

TileCost tile_cost(const Hardware& hw, const TileConfig& t) {
  check(t.m > 0 && t.n > 0 && t.d > 0, "tile sizes must be positive");
  check(t.ctas == 1 || t.ctas == 2, "ctas must be 1 or 2");
  check(t.ctas == 1 || hw.two_cta_mma, "2-CTA MMA needs Blackwell (cta_group::2)");
  check(t.cluster == 1 || (t.cluster == 2 && t.pass == Pass::bwd && t.ctas == 1 && !hw.two_cta_mma),
        "a cluster pair models the Hopper backward (Blackwell pairs through cta_group::2: ctas)");
  check(t.q_tiles_per_cta >= 1, "q_tiles_per_cta must be >= 1");
  check(t.emulated_fraction >= 0 && t.emulated_fraction <= 1, "emulated_fraction must be in [0, 1]");
  check(t.rescale_frequency >= 0 && t.rescale_frequency <= 1, "rescale_frequency must be in [0, 1]");
  check(t.pass == Pass::fwd || (t.emulated_fraction == 0 && t.rescale_frequency == 1),
        "emulated_fraction and rescale_frequency apply to the forward pass only");

  const double M = t.m, N = t.n, d = t.d, ctas = t.ctas;
  const double elem = bytes_per_element(t.dtype);
  const bool tmem = hw.tmem_kib.value > 0;
  // One MMA instruction covers 64 rows per warpgroup on Hopper (wgmma m64) and 128 rows per CTA on
  // Blackwell (tcgen05, M = 128, or 256 over a CTA pair). Each instruction reads its whole B operand from
  // SMEM; with 2-CTA each CTA holds and reads half of B.
  const double mma_rows = tmem ? 128 : 64;
  auto gemm_smem_bytes = [&](double m, double k, double n, bool a_in_smem) {
    return (a_in_smem ? m * k * elem : 0) + std::ceil(m / mma_rows) * k * n * elem / ctas;
  };
  const ElementOps& op = element_ops(hw);
  const double score_elements = M * N;
  const double fp32 = 4;

  TileCost c;
  c.exps = score_elements;
  if (t.pass == Pass::fwd) {
    c.flops = 4 * M * N * d;
    // S = Q K^T (A = Q from SMEM), O += P V (A = P from registers/TMEM, or from SMEM on the SS path).
    c.smem_operand_bytes = gemm_smem_bytes(M, d, N, true) + gemm_smem_bytes(M, N, d, t.p_in_smem);
    c.smem_staging_bytes = t.p_in_smem ? score_elements * elem : 0;
    const double f = t.emulated_fraction;
    c.mufu_cycles = score_elements * (1 - f) / hw.mufu_exp2_per_clk.value;
    c.alu_instructions =
        score_elements * (op.row_max + op.scale_subtract + (1 - f) * op.exp_issue + f * op.exp_emulated +
                          op.row_sum + op.convert) +
        t.rescale_frequency * M * d * op.fp32_op;  // O *= scale, one multiply per O element
    if (tmem)  // S written by MMA and read by softmax, P written and read by MMA, O accumulated, O rescaled
      c.tmem_bytes = score_elements * (2 * fp32 + 2 * elem) + M * d * fp32 * 2 * (1 + t.rescale_frequency);
    c.load_bytes = 2 * N * d * elem / ctas;  // K and V
  } else {
    c.flops = 10 * M * N * d;  // five GEMMs = 2.5 x forward
    // KV-stationary, S and dP computed transposed (fa4.md §5.2, fa3.md §4.3): per CTA N key rows, M query rows.
    // dQ = dS K. Blackwell: one MMA over the CTA's rows (2-CTA: M/2 rows, 2N deep). Hopper, M a multiple of 64:
    // per 64-row chunk of dQ the consumer warpgroups split the head dim (fa4's sm_90a rows: d = 128 in two 64-column
    // units, d = 192/256 in two column groups; d = 64 is one unit, the rows split instead), each issuing its wgmmas
    // with its own columns as N, so dS (A) is read once per warpgroup that has columns, min(d/64, 2) times, and K
    // (B) once. Other M (FlashAttention-3's 80-row tiles): transposed, dQ^T = K^T dS^T in 64-column units of d,
    // each reading its N x 64 of K and all of dS^T.
    constexpr double kDqColumnGroups = 2;  // the consumer warpgroups that split the head dim
    const double dq_operand_bytes =
        tmem                    ? gemm_smem_bytes(M / ctas, ctas * N, d, true)
        : std::fmod(M, 64) == 0 ? (M / 64) * (std::min(std::ceil(d / 64), kDqColumnGroups) * 64 * N + N * d) * elem
                                : std::ceil(d / 64) * (N * 64 + N * M) * elem;
    c.smem_operand_bytes = gemm_smem_bytes(N, d, M, true)            // S^T = K Q^T
                           + gemm_smem_bytes(N, d, M, true)          // dP^T = V dO^T
                           + gemm_smem_bytes(N, M, d, t.p_in_smem)   // dV += P^T dO
                           + gemm_smem_bytes(N, M, d, t.p_in_smem)   // dK += dS^T Q
                           + dq_operand_bytes;
    c.smem_staging_bytes = score_elements * elem * (t.p_in_smem ? 2 : 1);  // dS (and P) written for later MMAs
    // 2-CTA: half of dS goes to the peer. Counted on this SM's port: the outgoing half read, sent, and the
    // incoming half written (3 half tiles). The split is our reading; the total is the paper's 384 cycles.
    c.smem_exchange_bytes = ctas == 2 ? 3 * score_elements * elem / 2 : 0;
    c.smem_dq_bytes = 2 * (M / ctas) * d * fp32;  // dQ partial written to SMEM, read by the bulk reduce-add
    if (t.dq_from_registers) {
      if (tmem || t.cluster == 2)
        throw std::invalid_argument("tile_cost: dq_from_registers models the one-CTA Hopper backward");
      c.smem_dq_bytes = 0;  // the same L2 bytes, as reds from the accumulator registers
    }
    if (t.cluster == 2) {
      // Each CTA of the pair sums half of the two partials: the peer's half arrives by DSMEM (written here, read
      // once), its own half of the sum is staged and read by the reduce-add; its other half leaves from
      // registers. Same bytes on this SM's port, half of them now exchange.
      c.smem_exchange_bytes = M * d * fp32;
      c.smem_dq_bytes = M * d * fp32;
    }
    c.mufu_cycles = score_elements / hw.mufu_exp2_per_clk.value;  // the backward never emulates (fa4.md §3.3)
    // Causal mask, when applied on every step: per element a compare against the row limit and a select
    // (ISETP + FSEL, fa3.md §4.5 / hopper/mask.h); masking only the diagonal steps is not counted.
    constexpr double kMaskOps = 2;
    c.alu_instructions = score_elements * (op.exp_issue + op.scale_subtract + 2 * op.fp32_op + 2 * op.convert +
                                           (t.mask_every_step ? kMaskOps : 0));
    if (tmem)  // S, dP (fp32) written and read; P, dS written and read; dV, dK accumulated; dQ out
      c.tmem_bytes = score_elements * (2 * 2 * fp32 + 2 * 2 * elem) + 2 * N * d * fp32 * 2 + (M / ctas) * d * fp32 * 2;
    // Q, dO, LSE, D; dQ reduce-add. A cluster pair loads each shared tile once (multicast) and reduces once.
    c.load_bytes = (2 * M * d * elem / ctas + 2 * M * fp32 + (M / ctas) * d * fp32) / t.cluster;
    c.prologue_bytes = 2 * N * d * elem + 2 * M * d * elem / ctas + 2 * M * fp32;  // K, V; first Q, dO, LSE, D
    c.epilogue_bytes = 2 * N * d * elem + (M / ctas) * d * fp32;                   // dK, dV; last dQ partial
    c.epilogue_smem_bytes = 2 * N * d * elem;
    c.epilogue_alu_instructions = N * d * op.fp32_op + 2 * N * d * op.convert;  // dK scale; dK, dV packs
  }
  const double mma_rate = t.dtype == DType::fp8 ? hw.mma_fp8_flop_per_clk.value : hw.mma_flop_per_clk.value;
  c.mma_cycles = c.flops / mma_rate;
  c.alu_cycles = c.alu_instructions / hw.issue_per_clk.value;
  c.smem_cycles = (c.smem_operand_bytes + c.smem_staging_bytes + c.smem_exchange_bytes + c.smem_dq_bytes) /
                  hw.smem_bytes_per_clk.value;

  const std::pair<Resource, double> by_resource[] = {
      {Resource::mma, c.mma_cycles}, {Resource::mufu, c.mufu_cycles},
      {Resource::alu, c.alu_cycles}, {Resource::smem, c.smem_cycles}};
  const auto slowest = std::max_element(std::begin(by_resource), std::end(by_resource),
                                        [](const auto& a, const auto& b) { return a.second < b.second; });
  c.bound = slowest->first;
  c.bound_cycles = slowest->second;
  c.serial_cycles = std::max(c.mma_cycles, c.smem_cycles) + std::max(c.mufu_cycles, c.alu_cycles);
  return c;
}

double softmax_stream_rate(const Hardware& hw, double emulated_fraction) {
  // The H200.md stream: per element one FFMA, one exp2, one FADD, half a bf16x2 pack (no row max).
  const ElementOps& op = element_ops(hw);
  const double f = emulated_fraction;
  const double issue_per_element =
      op.scale_subtract + (1 - f) * op.exp_issue + f * op.exp_emulated + op.row_sum + op.convert;
  const double issue_limited = hw.issue_per_clk.value * kEfficiency.alu_issue / issue_per_element;
  const double mufu_limited = f < 1 ? hw.mufu_exp2_per_clk.value / (1 - f) : issue_limited;
  return std::min(issue_limited, mufu_limited);
}

}  // namespace fa4::model
