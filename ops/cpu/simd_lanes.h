// Eight elements of a CPU storage type (ops/cpu/cpu_storage.h: f32, bf16) in fp32 AVX2 lanes and
// back, for the vector loops of the SwiGLU (ops/cpu/swiglu.cpp) and the cross-entropy
// (ops/cpu/cross_entropy.cpp):
//
//   load8(p, n, pad)   the first min(n, 8) elements widened to fp32 (exact), the other lanes `pad`
//   store8(p, n, v)    the first min(n, 8) lanes stored (a bf16 rounded once), memory past n
//   untouched
//
// f32 with n >= 8 is one unaligned load or store. Compiled for AVX2 + FMA only
// (ops/cpu/simd_exp.h): call them where cpu_has_avx2_fma() is true.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/simd_exp.h"

namespace moepeak::ops {

template <typename T>
MOEPEAK_AVX2_FMA inline __m256 load8(const T* p, int64_t n, float pad) {
  if constexpr (std::is_same_v<T, float>) {
    return n >= 8 ? _mm256_loadu_ps(p) : load_tail(p, n, pad);
  } else {
    alignas(32) float lanes[8];
    for (int64_t l = 0; l < 8; ++l) lanes[l] = l < n ? load(p[l]) : pad;
    return _mm256_load_ps(lanes);
  }
}

template <typename T>
MOEPEAK_AVX2_FMA inline void store8(T* p, int64_t n, __m256 v) {
  if constexpr (std::is_same_v<T, float>) {
    if (n >= 8) {
      _mm256_storeu_ps(p, v);
    } else {
      store_tail(p, n, v);
    }
  } else {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (int64_t l = 0; l < n && l < 8; ++l) store(p + l, lanes[l]);
  }
}

}  // namespace moepeak::ops

#endif  // __x86_64__
