// The AdamW span kernel: a scalar loop and an AVX2 loop (8 f32 or 4 f64 lanes) with the scalar
// loop for the tail, picked at run time (see adamw_simd.h for the arithmetic and why the two
// paths agree bit for bit). Test: ctest -R test_adamw_kernels
#include "ops/cpu/adamw_simd.h"

#include <immintrin.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {
namespace {

template <typename T>
void span_scalar(T* p, const T* gin, T* m, T* v, T* w, int64_t begin, int64_t n,
                 const AdamWScalars<T>& s) {
  for (int64_t i = begin; i < n; ++i) {
    T g = gin[i] * s.grad_scale;
    m[i] = s.beta1 * m[i] + s.one_minus_beta1 * g;
    v[i] = s.beta2 * v[i] + s.one_minus_beta2 * g * g;
    p[i] *= s.decay_factor;
    T denom = std::sqrt(v[i]) / s.bias2_sqrt + s.eps;
    p[i] -= s.step_size * (m[i] / denom);
    if (w != nullptr) w[i] = p[i];
  }
}

#if defined(__x86_64__) || defined(__i386__)
#define MOEPEAK_HAVE_AVX2_PATH 1
#define MOEPEAK_AVX2 __attribute__((target("avx2")))

// NOTES: target("avx2") without "fma": the compiler may not contract a mul and an add into an
// FMA here, which would round once instead of twice and break bitwise equality.
struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr int kLanes = 8;
  MOEPEAK_AVX2 static V set1(T x) { return _mm256_set1_ps(x); }
  MOEPEAK_AVX2 static V load(const T* p) { return _mm256_loadu_ps(p); }
  MOEPEAK_AVX2 static void store(T* p, V x) { _mm256_storeu_ps(p, x); }
  MOEPEAK_AVX2 static V add(V a, V b) { return _mm256_add_ps(a, b); }
  MOEPEAK_AVX2 static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  MOEPEAK_AVX2 static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  MOEPEAK_AVX2 static V div(V a, V b) { return _mm256_div_ps(a, b); }
  MOEPEAK_AVX2 static V sqrt(V a) { return _mm256_sqrt_ps(a); }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr int kLanes = 4;
  MOEPEAK_AVX2 static V set1(T x) { return _mm256_set1_pd(x); }
  MOEPEAK_AVX2 static V load(const T* p) { return _mm256_loadu_pd(p); }
  MOEPEAK_AVX2 static void store(T* p, V x) { _mm256_storeu_pd(p, x); }
  MOEPEAK_AVX2 static V add(V a, V b) { return _mm256_add_pd(a, b); }
  MOEPEAK_AVX2 static V sub(V a, V b) { return _mm256_sub_pd(a, b); }
  MOEPEAK_AVX2 static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  MOEPEAK_AVX2 static V div(V a, V b) { return _mm256_div_pd(a, b); }
  MOEPEAK_AVX2 static V sqrt(V a) { return _mm256_sqrt_pd(a); }
};

template <typename X>
MOEPEAK_AVX2 void span_avx2(typename X::T* p, const typename X::T* gin, typename X::T* m,
                            typename X::T* v, typename X::T* w, int64_t n,
                            const AdamWScalars<typename X::T>& s) {
  using V = typename X::V;
  const V beta1 = X::set1(s.beta1), beta2 = X::set1(s.beta2);
  const V omb1 = X::set1(s.one_minus_beta1), omb2 = X::set1(s.one_minus_beta2);
  const V grad_scale = X::set1(s.grad_scale), decay = X::set1(s.decay_factor);
  const V step_size = X::set1(s.step_size), bias2_sqrt = X::set1(s.bias2_sqrt);
  const V eps = X::set1(s.eps);
  const int64_t vec_end = n / X::kLanes * X::kLanes;
  for (int64_t i = 0; i < vec_end; i += X::kLanes) {
    // The same operations, in the same order, as span_scalar (one line there, one line here).
    V g = X::mul(X::load(gin + i), grad_scale);
    V mi = X::add(X::mul(beta1, X::load(m + i)), X::mul(omb1, g));
    V vi = X::add(X::mul(beta2, X::load(v + i)), X::mul(X::mul(omb2, g), g));
    V pi = X::mul(X::load(p + i), decay);
    V denom = X::add(X::div(X::sqrt(vi), bias2_sqrt), eps);
    pi = X::sub(pi, X::mul(step_size, X::div(mi, denom)));
    X::store(m + i, mi);
    X::store(v + i, vi);
    X::store(p + i, pi);
    if (w != nullptr) X::store(w + i, pi);
  }
  _mm256_zeroupper();  // before the SSE tail: see ops/cpu/gemm_tiles.cpp, widen_avx2
  span_scalar(p, gin, m, v, w, vec_end, n, s);
}

template <typename T>
struct Avx2Of;
template <>
struct Avx2Of<float> {
  using type = F32x8;
};
template <>
struct Avx2Of<double> {
  using type = F64x4;
};
#endif

}  // namespace

bool adamw_avx2_available() {
#ifdef MOEPEAK_HAVE_AVX2_PATH
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

template <typename T>
void adamw_span(T* param, const T* grad, T* m, T* v, T* working, int64_t n,
                const AdamWScalars<T>& s, AdamWSimd simd) {
  if (simd == AdamWSimd::automatic)
    simd = adamw_avx2_available() ? AdamWSimd::avx2 : AdamWSimd::scalar;
  if (simd == AdamWSimd::avx2) {
    MOEPEAK_CHECK(adamw_avx2_available(),
                  "adamw: the AVX2 path was asked for but this CPU has no AVX2");
#ifdef MOEPEAK_HAVE_AVX2_PATH
    span_avx2<typename Avx2Of<T>::type>(param, grad, m, v, working, n, s);
    return;
#endif
  }
  span_scalar(param, grad, m, v, working, 0, n, s);
}

template void adamw_span<float>(float*, const float*, float*, float*, float*, int64_t,
                                const AdamWScalars<float>&, AdamWSimd);
template void adamw_span<double>(double*, const double*, double*, double*, double*, int64_t,
                                 const AdamWScalars<double>&, AdamWSimd);

void adamw_span_bf16_working(float* master, const float* grad, float* m, float* v, bf16* working,
                             int64_t n, const AdamWScalars<float>& s, AdamWSimd simd) {
  constexpr int64_t kChunk = 2048;  // 8 KiB of fp32 master: in L1 when it is rounded
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    adamw_span<float>(master + i, grad + i, m + i, v + i, nullptr, len, s, simd);
    narrow(master + i, working + i, len);
  }
}

}  // namespace moepeak::ops
