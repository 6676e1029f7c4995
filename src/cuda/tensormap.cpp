#include "cuda/tensormap.hpp"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace fa4::cuda {
namespace {

[[noreturn]] void fail(const std::string& what) { throw Error(Status::cuda_error, "fa4: TMA tensor map: " + what); }

std::string field(const char* name, int i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

// Resolved once per process. The entry point is requested by ABI version (12.0 introduced the function), so a
// newer driver hands back the 12.0-compatible signature declared by the PFN type.
struct DriverEntryPoints {
  PFN_cuTensorMapEncodeTiled_v12000 encode_tiled = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  std::string error;  // non-empty when the lookup failed
};

const DriverEntryPoints& driver() {
  static DriverEntryPoints eps;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    const cudaError_t e =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      eps.error = std::string("cannot resolve cuTensorMapEncodeTiled from the driver (") +
                  (e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found for CUDA ABI 12.0") + ")";
      return;
    }
    eps.encode_tiled = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    void* es = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuGetErrorString", &es, 6000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      eps.error_string = reinterpret_cast<PFN_cuGetErrorString_v6000>(es);
  });
  return eps;
}

uint32_t swizzle_span_bytes(TmaSwizzle s) {
  switch (s) {
    case TmaSwizzle::none:
      return 0;
    case TmaSwizzle::b32:
      return 32;
    case TmaSwizzle::b64:
      return 64;
    case TmaSwizzle::b128:
      return 128;
  }
  return 0;
}

CUtensorMapSwizzle to_driver(TmaSwizzle s) {
  switch (s) {
    case TmaSwizzle::none:
      return CU_TENSOR_MAP_SWIZZLE_NONE;
    case TmaSwizzle::b32:
      return CU_TENSOR_MAP_SWIZZLE_32B;
    case TmaSwizzle::b64:
      return CU_TENSOR_MAP_SWIZZLE_64B;
    case TmaSwizzle::b128:
      return CU_TENSOR_MAP_SWIZZLE_128B;
  }
  fail("swizzle: unknown value");
}

// The driver checks the same rules but reports only CUDA_ERROR_INVALID_VALUE; checking first names the field.
void validate(const TmaTensorSpec& s, uint32_t elem_bytes) {
  if (s.data == nullptr) fail("data is null");
  if (reinterpret_cast<uintptr_t>(s.data) % 16 != 0) fail("data must be 16-byte aligned");
  if (s.rank < 1 || s.rank > kTmaMaxRank)
    fail("rank must be in [1, " + std::to_string(kTmaMaxRank) + "], got " + std::to_string(s.rank));
  const uint32_t span = swizzle_span_bytes(s.swizzle);
  for (int i = 0; i < s.rank; ++i) {
    if (s.dims[i] < 1 || s.dims[i] > (uint64_t{1} << 32))
      fail(field("dims", i) + " must be in [1, 2^32], got " + std::to_string(s.dims[i]));
    if (s.box[i] < 1 || s.box[i] > kTmaMaxBoxDim)
      fail(field("box", i) + " must be in [1, 256], got " + std::to_string(s.box[i]));
    if (i == 0) {
      if (s.strides_bytes[0] != elem_bytes)
        fail("strides_bytes[0] must be the element size " + std::to_string(elem_bytes) +
             " (TMA needs a unit-stride innermost dimension), got " + std::to_string(s.strides_bytes[0]));
    } else {
      if (s.strides_bytes[i] % 16 != 0 || s.strides_bytes[i] >= (uint64_t{1} << 40))
        fail(field("strides_bytes", i) + " must be a multiple of 16 below 2^40, got " +
             std::to_string(s.strides_bytes[i]));
    }
  }
  const uint64_t inner_bytes = uint64_t{s.box[0]} * elem_bytes;
  if (inner_bytes % 16 != 0)
    fail("box[0] * element size must be a multiple of 16 bytes, got " + std::to_string(inner_bytes));
  if (span != 0 && inner_bytes > span)
    fail("box[0] * element size = " + std::to_string(inner_bytes) + " bytes exceeds the " + std::to_string(span) +
         "-byte swizzle span");
}

static_assert(sizeof(TmaTensorSpec) == 120, "same_spec compares every field of TmaTensorSpec: add a new one there");
bool same_spec(const TmaTensorSpec& a, const TmaTensorSpec& b) {
  return a.data == b.data && a.dtype == b.dtype && a.rank == b.rank && a.dims == b.dims &&
         a.strides_bytes == b.strides_bytes && a.box == b.box && a.swizzle == b.swizzle;
}

// The per-thread cache of encoded maps: round-robin replacement; thread-local, so no lock on the call path.
struct EncodedMap {
  TmaTensorSpec spec;
  CUtensorMap map;
  bool valid = false;
};
// A training step's calls fit: the varlen backward encodes 14 maps (q, dO, K, V, each also in 16-row and 1-row
// boxes), its forward 5; with 16 entries a step that alternated the two missed every time (round-robin over a
// longer cycle hits nothing). 32 entries of 384 bytes (CUtensorMap is 128-byte aligned), 12 KiB per thread, a linear
// scan of compares.
constexpr int kCachedMaps = 32;
struct MapCache {
  EncodedMap entries[kCachedMaps];
  int next = 0;
};
thread_local MapCache map_cache;

void encode(const TmaTensorSpec& spec, CUtensorMap* out);

}  // namespace

void make_tma_tensor_map(const TmaTensorSpec& spec, CUtensorMap* out) {
  if (out == nullptr) fail("out (the CUtensorMap to encode into) is null");
  if (reinterpret_cast<uintptr_t>(out) % 64 != 0)
    fail("out (the CUtensorMap to encode into) must be 64-byte aligned, got address " +
         std::to_string(reinterpret_cast<uintptr_t>(out)) + " (" +
         std::to_string(reinterpret_cast<uintptr_t>(out) % 64) + " mod 64)");
  MapCache& cache = map_cache;
  for (const EncodedMap& e : cache.entries)
    if (e.valid && same_spec(e.spec, spec)) {
      *out = e.map;
      return;
    }
  encode(spec, out);  // throws on a bad spec: nothing is cached then
  EncodedMap& slot = cache.entries[cache.next];
  cache.next = (cache.next + 1) % kCachedMaps;
  slot.spec = spec;
  slot.map = *out;
  slot.valid = true;
}

namespace {

void encode(const TmaTensorSpec& spec, CUtensorMap* out) {
  CUtensorMapDataType type;
  uint32_t elem_bytes = 2;
  switch (spec.dtype) {
    case DType::bf16:
      type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
      break;
    case DType::f16:
      type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
      break;
    default:
      fail(std::string("dtype must be bf16 or f16, got ") + to_string(spec.dtype));
  }
  validate(spec, elem_bytes);

  const DriverEntryPoints& eps = driver();
  if (eps.encode_tiled == nullptr) fail(eps.error);

  std::array<cuuint64_t, kTmaMaxRank> dims{};
  std::array<cuuint64_t, kTmaMaxRank> strides{};  // the driver takes strides of dimensions 1..rank-1 only
  std::array<cuuint32_t, kTmaMaxRank> box{};
  std::array<cuuint32_t, kTmaMaxRank> element_strides{};
  for (int i = 0; i < spec.rank; ++i) {
    dims[i] = spec.dims[i];
    if (i > 0) strides[i - 1] = spec.strides_bytes[i];
    box[i] = spec.box[i];
    element_strides[i] = 1;
  }

  // The driver writes all of *out (alignment checked above); nothing here stores to it itself.
  const CUresult r =
      eps.encode_tiled(out, type, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.data), dims.data(),
                       strides.data(), box.data(), element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
                       to_driver(spec.swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    const char* msg = nullptr;
    if (eps.error_string == nullptr || eps.error_string(r, &msg) != CUDA_SUCCESS) msg = nullptr;
    fail("cuTensorMapEncodeTiled failed with error " + std::to_string(static_cast<int>(r)) +
         (msg != nullptr ? std::string(" (") + msg + ")" : std::string()));
  }
}

}  // namespace

}  // namespace fa4::cuda
