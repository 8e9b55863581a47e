// The CPU kernels' vector exponential (AVX2 + FMA, 8 fp32 lanes) and the lane helpers around it,
// shared by the attention's row kernels (ops/cpu/attention_rows.cpp), the SwiGLU
// (ops/cpu/swiglu.cpp) and the cross-entropy (ops/cpu/cross_entropy.cpp).
//
//   exp_avx2(x)         e^x per lane: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2, a degree-6
//                       polynomial in r, times 2^n), within 1.5 ulp of the exact value on
//                       [-87.3, 88] (tests/ops/test_simd_exp.cpp); below -87.3365 (e^x < 2^-126,
//                       and -inf) exactly 0; above 88 e^88; NaN stays NaN
//   load_tail(p, n, pad) / store_tail(p, n, v)   the first min(n, 8) lanes from / to memory, the
//                       other lanes `pad` on load and untouched memory on store
//
// Each function is compiled for AVX2 + FMA only (target attributes): call them from functions
// compiled the same way, and only where cpu_has_avx2_fma() is true. Every lane runs the same
// instructions, so an element's result does not depend on its lane or on how a loop was split.
// NOTES: the project compiles as ISO C++ (no -ffp-contract=fast), so GCC fuses no multiply and
// add of its own here: the FMAs are the ones written.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moepeak::ops {

// True when this CPU runs AVX2 and FMA (checked once).
inline bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if defined(__x86_64__)

#define MOEPEAK_AVX2_FMA __attribute__((target("avx2,fma")))

MOEPEAK_AVX2_FMA __attribute__((always_inline)) inline __m256 exp_avx2(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3365447f);  // exp(lowest) = 2^-126
  const __m256 highest = _mm256_set1_ps(88.0f);
  const __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);  // false for NaN
  // max_ps / min_ps return their second operand when either is NaN: x last keeps a NaN.
  x = _mm256_min_ps(highest, _mm256_max_ps(lowest, x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, with ln2 split in two so that n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n from its exponent bits (n in [-126, 127]; a NaN lane's bits do not matter: p is NaN).
  const __m256i two_to_n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n)));
}

MOEPEAK_AVX2_FMA inline __m256 load_tail(const float* x, int64_t n, float pad) {
  alignas(32) float lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = i < n ? x[i] : pad;
  return _mm256_load_ps(lanes);
}

MOEPEAK_AVX2_FMA inline void store_tail(float* x, int64_t n, __m256 value) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, value);
  for (int64_t i = 0; i < n && i < 8; ++i) x[i] = lanes[i];
}

#endif  // __x86_64__

}  // namespace moepeak::ops
