// Peer throughputs measured on our H200, transcribed from ../shared/H200.md (bf16, 16k tokens,
// heads = 2048 / d, TFLOP/s). FA3 hdim 256 comes from that file's second table (FA3 was not built for hdim
// 256 in the first). The model is validated against these; it is never fitted per row.
#include <array>

#include "model/model.hpp"

namespace fa4::model {

namespace {

constexpr Measurement kRows[] = {
    // impl, d, causal, seqlen, fwd, bwd
    {"FA3", 64, false, 512, 325, 257},    {"FA3", 64, false, 1024, 375, 356},   {"FA3", 64, false, 2048, 466, 430},
    {"FA3", 64, false, 4096, 486, 478},   {"FA3", 64, false, 8192, 518, 507},   {"FA3", 64, false, 16384, 522, 511},
    {"FA3", 64, true, 512, 223, 146},     {"FA3", 64, true, 1024, 297, 239},    {"FA3", 64, true, 2048, 397, 347},
    {"FA3", 64, true, 4096, 449, 428},    {"FA3", 64, true, 8192, 499, 480},    {"FA3", 64, true, 16384, 514, 521},
    {"FA3", 128, false, 512, 379, 274},   {"FA3", 128, false, 1024, 594, 392},  {"FA3", 128, false, 2048, 640, 474},
    {"FA3", 128, false, 4096, 655, 536},  {"FA3", 128, false, 8192, 680, 558},  {"FA3", 128, false, 16384, 682, 587},
    {"FA3", 128, true, 512, 321, 162},    {"FA3", 128, true, 1024, 468, 275},   {"FA3", 128, true, 2048, 563, 387},
    {"FA3", 128, true, 4096, 609, 478},   {"FA3", 128, true, 8192, 642, 543},   {"FA3", 128, true, 16384, 642, 584},
    {"FA3", 256, false, 1024, 672, 383},  {"FA3", 256, false, 4096, 697, 439},  {"FA3", 256, false, 16384, 725, 452},
    {"FA3", 256, true, 1024, 459, 292},   {"FA3", 256, true, 4096, 633, 412},   {"FA3", 256, true, 16384, 679, 455},
    {"cuDNN", 64, false, 512, 385, 230},  {"cuDNN", 64, false, 1024, 421, 320}, {"cuDNN", 64, false, 2048, 433, 378},
    {"cuDNN", 64, false, 4096, 445, 413}, {"cuDNN", 64, false, 8192, 452, 432}, {"cuDNN", 64, false, 16384, 453, 446},
    {"cuDNN", 64, true, 512, 256, 132},   {"cuDNN", 64, true, 1024, 336, 207},  {"cuDNN", 64, true, 2048, 383, 287},
    {"cuDNN", 64, true, 4096, 416, 352},  {"cuDNN", 64, true, 8192, 428, 392},  {"cuDNN", 64, true, 16384, 438, 418},
    {"cuDNN", 128, false, 512, 502, 266}, {"cuDNN", 128, false, 1024, 567, 364}, {"cuDNN", 128, false, 2048, 592, 447},
    {"cuDNN", 128, false, 4096, 606, 489}, {"cuDNN", 128, false, 8192, 612, 521}, {"cuDNN", 128, false, 16384, 617, 538},
    {"cuDNN", 128, true, 512, 335, 157},  {"cuDNN", 128, true, 1024, 432, 250}, {"cuDNN", 128, true, 2048, 492, 342},
    {"cuDNN", 128, true, 4096, 536, 415}, {"cuDNN", 128, true, 8192, 558, 469}, {"cuDNN", 128, true, 16384, 573, 512},
    {"cuDNN", 256, false, 512, 514, 197}, {"cuDNN", 256, false, 1024, 591, 265}, {"cuDNN", 256, false, 2048, 628, 325},
    {"cuDNN", 256, false, 4096, 649, 360}, {"cuDNN", 256, false, 8192, 659, 349}, {"cuDNN", 256, false, 16384, 667, 354},
    {"cuDNN", 256, true, 512, 340, 137},  {"cuDNN", 256, true, 1024, 451, 210}, {"cuDNN", 256, true, 2048, 518, 273},
    {"cuDNN", 256, true, 4096, 552, 324}, {"cuDNN", 256, true, 8192, 583, 366}, {"cuDNN", 256, true, 16384, 600, 370},
};

}  // namespace

std::span<const Measurement> h200_measurements() { return kRows; }

std::vector<ValidationRow> validate_h200() {
  std::vector<ValidationRow> rows;
  for (const Measurement& m : kRows) {
    ValidationRow row{m};
    const Problem problem{16384 / m.seqlen, 2048 / m.d, m.seqlen, m.seqlen, m.causal, m.causal};
    for (Pass pass : {Pass::fwd, Pass::bwd}) {
      const double measured = pass == Pass::fwd ? m.fwd_tflops : m.bwd_tflops;
      const TileConfig tile = default_tile(Gpu::h200, pass, m.d, m.causal);
      const double predicted =
          predict(hardware(Gpu::h200), tile, problem, default_schedule(Gpu::h200, pass)).tflops;
      (pass == Pass::fwd ? row.fwd_predicted : row.bwd_predicted) = predicted;
      (pass == Pass::fwd ? row.fwd_error : row.bwd_error) = measured > 0 ? predicted / measured - 1 : 0;
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace fa4::model
