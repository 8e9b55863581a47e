// The CPU attention's AVX2 row kernels (declared in ops/cpu/attention_common.h): the row max, the
// exponentials with their sum (a Cephes-style exp, degree-6 polynomial after range reduction,
// ~2 ulp; arguments below -87.3 give exactly 0), dS = P * (dP - D), and bf16 -> fp32 widening.
// Each is called only where cpu_has_avx2_fma() is true.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/attention_common.h"

namespace moepeak::ops::attention_cpu {

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

namespace {

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp_avx2(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3365447f);  // exp(lowest) = 2^-126
  const __m256 highest = _mm256_set1_ps(88.0f);
  __m256 underflow = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lowest), highest);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
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
  __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(exponent)));
}

// Loads min(n, 8) elements, the rest of the lanes set to `pad`.
__attribute__((target("avx2,fma"))) __m256 load_tail(const float* x, int64_t n, float pad) {
  alignas(32) float lanes[8];
  for (int i = 0; i < 8; ++i) lanes[i] = i < n ? x[i] : pad;
  return _mm256_load_ps(lanes);
}

__attribute__((target("avx2,fma"))) void store_tail(float* x, int64_t n, __m256 value) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, value);
  for (int64_t i = 0; i < n; ++i) x[i] = lanes[i];
}

// Horizontal reductions in a fixed lane order.
__attribute__((target("avx2,fma"))) float lanes_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
         ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

__attribute__((target("avx2,fma"))) float lanes_max(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return *std::max_element(lanes, lanes + 8);
}

}  // namespace

__attribute__((target("avx2,fma"))) float row_max_avx2(const float* x, int64_t n) {
  __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) best = _mm256_max_ps(best, _mm256_loadu_ps(x + i));
  if (i < n) best = _mm256_max_ps(best, load_tail(x + i, n - i, -INFINITY));
  return lanes_max(best);
}

__attribute__((target("avx2,fma"))) float exp_shift_sum_avx2(float* x, int64_t n, float shift) {
  const __m256 shift_v = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift_v));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    __m256 e = exp_avx2(_mm256_sub_ps(load_tail(x + i, n - i, -INFINITY), shift_v));
    store_tail(x + i, n - i, e);
    sum = _mm256_add_ps(sum, e);  // padded lanes are exp(-inf) = 0
  }
  return lanes_sum(sum);
}

__attribute__((target("avx2,fma"))) void dscores_avx2(float* p_to_ds, const float* dp, int64_t n,
                                                      float d_row) {
  const __m256 d_v = _mm256_set1_ps(d_row);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(p_to_ds + i);
    _mm256_storeu_ps(p_to_ds + i, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + i), d_v)));
  }
  _mm256_zeroupper();  // as in widen_bf16_avx2
  dscores_generic(p_to_ds + i, dp + i, n - i, d_row);
}

// bf16 -> fp32 8 at a time (a bf16 is the top half of its fp32): exact, as widen() is.
__attribute__((target("avx2"))) void widen_bf16_avx2(const bf16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    __m256i full = _mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(full));
  }
  // NOTES: clear the upper halves of the ymm registers before the scalar (SSE-encoded) tail: GCC
  // emits no vzeroupper before a tail call, and SSE code after dirty upper state runs several
  // times slower (every later expf, mulss, ... of the thread; a bf16 step measured 9x slower).
  _mm256_zeroupper();
  widen(src + i, dst + i, n - i);
}

}  // namespace moepeak::ops::attention_cpu

#endif  // __x86_64__
