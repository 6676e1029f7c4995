// Intel AMX (bf16 tile matrix multiply) for the CPU backend's bf16 products. Compiled in its own
// translation unit with the AMX target flags and used only when the CPU has AMX-BF16 and the OS grants
// the tile state (checked once at run time); otherwise the fp32 vector kernels run. FA4_CPU_AMX=0 in the
// environment disables it (to compare the two paths).
#pragma once

#include <cstdint>

namespace fa4::cpu::amx {

inline constexpr int kTileRows = 16;     // rows of every tile
inline constexpr int kTileBf16 = 32;     // bf16 per tile row (64 bytes)
inline constexpr int kPanel = 32;        // 2x2 tiles of 16: the register block of gemm64
inline constexpr int kRows = 64;         // rows of every A and C operand

bool available();
void set_enabled(bool on);  // for tests: force the fp32 path (false) or allow AMX again (true)

// Loads / releases the tile configuration on the calling thread (all tiles 16 rows x 64 bytes).
void configure_thread();
void release_thread();

// c[64][n] (row stride ldc floats) = or += a[64][k] (row stride lda bf16) x b, where b is in pair layout
// [k/2][n][2] (element (x, j) at ((x/2) * n + j) * 2 + x % 2). n and k are multiples of 32.
void gemm64(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t n, int64_t k, float* c, int64_t ldc,
            bool accumulate);

// dst[i] = bf16(src[i]) rounded to nearest even, count % 32 == 0.
void to_bf16(const float* src, uint16_t* dst, int64_t count);

}  // namespace fa4::cpu::amx
