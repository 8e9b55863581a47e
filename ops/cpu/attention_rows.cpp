// The CPU attention's AVX2 row kernels (declared in ops/cpu/attention_common.h): the row max, the
// exponentials with their sum (ops/cpu/simd_exp.h's exp_avx2: within 1.5 ulp, arguments below -87.3
// give exactly 0), dS = P * (dP - D), and bf16 -> fp32 widening.
// Each is called only where cpu_has_avx2_fma() is true.
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/simd_exp.h"

namespace moepeak::ops::attention_cpu {

namespace {

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
