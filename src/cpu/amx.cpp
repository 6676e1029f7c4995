// Built with -mamx-tile -mamx-bf16 -mavx512f -mavx512bf16 (CMakeLists.txt); only called after available().
#include "cpu/amx.hpp"

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cpuid.h>
#include <cstdlib>
#include <cstring>

namespace fa4::cpu::amx {
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask the kernel for an extended state component
constexpr int kXfeatureXtiledata = 18;     // the AMX tile data state

bool detect() {
  const char* env = std::getenv("FA4_CPU_AMX");
  if (env && std::strcmp(env, "0") == 0) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);  // CPUID.(7,0):EDX AMX-TILE, AMX-BF16
  if (!tile || !bf16 || !__builtin_cpu_supports("avx512f")) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

std::atomic<int> g_state{-1};  // -1 unknown, 0 off, 1 on
bool g_hardware = false;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

bool available() {
  int s = g_state.load();
  if (s < 0) {
    g_hardware = detect();
    s = g_hardware ? 1 : 0;
    g_state.store(s);
  }
  return s == 1;
}

void set_enabled(bool on) {
  available();
  g_state.store(on && g_hardware ? 1 : 0);
}

// A static object: GCC 12 treats the stores into a local config as dead before ldtilecfg and drops them.
constexpr TileConfig make_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kTileRows;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
const TileConfig kTileConfig = make_config();

void configure_thread() { _tile_loadconfig(&kTileConfig); }

void release_thread() { _tile_release(); }

// Tiles: 0-3 accumulators C[2][2], 4-5 A (two row panels), 6-7 B (two column panels).
void gemm64(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t n, int64_t k, float* c, int64_t ldc,
            bool accumulate) {
  const int64_t a_stride = lda * 2, b_stride = n * 4, c_stride = ldc * 4;  // bytes
  for (int64_t m0 = 0; m0 < kRows; m0 += kPanel) {
    for (int64_t n0 = 0; n0 < n; n0 += kPanel) {
      float* c00 = c + m0 * ldc + n0;
      float* c10 = c00 + kTileRows * ldc;
      if (accumulate) {
        _tile_loadd(0, c00, c_stride);
        _tile_loadd(1, c00 + kTileRows, c_stride);
        _tile_loadd(2, c10, c_stride);
        _tile_loadd(3, c10 + kTileRows, c_stride);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k0 = 0; k0 < k; k0 += kTileBf16) {
        _tile_loadd(4, a + m0 * lda + k0, a_stride);
        _tile_loadd(5, a + (m0 + kTileRows) * lda + k0, a_stride);
        const uint16_t* bk = b + (k0 / 2) * n * 2 + n0 * 2;
        _tile_loadd(6, bk, b_stride);
        _tile_loadd(7, bk + kTileRows * 2, b_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c00, c_stride);
      _tile_stored(1, c00 + kTileRows, c_stride);
      _tile_stored(2, c10, c_stride);
      _tile_stored(3, c10 + kTileRows, c_stride);
    }
  }
}

void to_bf16(const float* src, uint16_t* dst, int64_t count) {
  for (int64_t i = 0; i < count; i += 32) {
    const __m512bh packed = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(packed));
  }
}

}  // namespace fa4::cpu::amx
