// param_init: the counter-based generator behind ParamStore::initialize, shared with the ZeRO-3
// store (core/model/zero_params.h) so that a rank holding a slice of a tensor produces exactly the
// values the single-rank store gives those elements.
//
// Parameter `index` (its position in ParamLayout::params()) has its own splitmix64 stream keyed by
// (seed, index). Element j of a matrix is initializer_range * Box-Muller(two draws), the draws
// being numbers 2j+1 and 2j+2 of that stream; norms are 1. splitmix64's state is a plain counter
// (state += golden gamma per draw), so element j is computed directly from the stream's start:
// generating elements [begin, end) costs end - begin, not end, and the values are bit-identical
// to walking the stream from 0 (unsigned arithmetic wraps the same way).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/runtime/dtype.h"

namespace moepeak::param_init {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += kGamma);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Box-Muller on splitmix64: portable, so a seed gives the same weights on every platform.
inline double next_normal(uint64_t& state) {
  double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// The state parameter `index`'s stream starts from.
inline uint64_t stream_start(uint64_t seed, uint64_t index) {
  return seed * 0x100000001b3ull + 0x51ed270b27a7c2e1ull * (index + 1);
}

// Element j (flattened, row-major) of parameter `index`, in float64.
inline double element(uint64_t seed, uint64_t index, bool is_norm, double initializer_range,
                      int64_t j) {
  if (is_norm) return 1.0;
  uint64_t state = stream_start(seed, index) + 2 * static_cast<uint64_t>(j) * kGamma;
  return initializer_range * next_normal(state);
}

// Writes v converted to `dtype` (f32, f64 or bf16) at dst.
inline void store(DType dtype, double v, void* dst) {
  switch (dtype) {
    case DType::f32: {
      float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      break;
    }
    case DType::f64:
      std::memcpy(dst, &v, 8);
      break;
    case DType::bf16: {
      bf16 b(static_cast<float>(v));
      std::memcpy(dst, &b, 2);
      break;
    }
    default:
      MOEPEAK_THROW("parameters must be f32, f64 or bf16, not ", dtype_name(dtype));
  }
}

}  // namespace moepeak::param_init
