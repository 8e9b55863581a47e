// CPU SwiGLU, forward and backward, plain and clamped (gpt-oss): element-wise loops over (M, F)
// (see ops/swiglu.h), in the compute type of the storage (fp32 for f32 and bf16,
// ops/cpu/cpu_storage.h), each output stored (rounded) once. The clamped ops with the default
// parameters call the plain ones.
//
// fp32 compute on a CPU with AVX2 and FMA runs 8 elements at a time with ops/cpu/simd_exp.h's
// exponential (within 1.5 ulp; the sigmoid's e^-v is held at e^88 below v = -88, where the SiLU
// and its gradient are below 1e-36 in magnitude either way); a loop's last partial vector runs in
// padded lanes, so each element's result is the same however the loop is split. Elsewhere (f64,
// or no AVX2) the loops are scalar, with std::exp.
#include "ops/swiglu.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"
#include "ops/cpu/parallel_ranges.h"
#include "ops/cpu/simd_exp.h"
#include "ops/cpu/simd_lanes.h"

namespace moepeak::ops {
namespace {

// Elements per parallel range: below two of these an op runs on its stream's thread alone.
constexpr int64_t kElementsPerTask = 16384;

template <typename T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}

// Storage whose compute type is fp32 (f32, bf16): its loops run in AVX2 lanes where the CPU can.
template <typename T>
constexpr bool kFp32Compute = std::is_same_v<compute_t<T>, float>;

#if defined(__x86_64__)

MOEPEAK_AVX2_FMA inline __m256 sigmoid_avx2(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 minus_v = _mm256_xor_ps(v, _mm256_set1_ps(-0.0f));
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_avx2(minus_v)));
}

// h = silu(a) * b over [begin, end).
template <typename T>
MOEPEAK_AVX2_FMA void swiglu_forward_avx2(const T* ap, const T* bp, T* hp, int64_t begin,
                                          int64_t end) {
  for (int64_t i = begin; i < end; i += 8) {
    const int64_t n = end - i;
    const __m256 av = load8(ap + i, n, 0.0f), bv = load8(bp + i, n, 0.0f);
    store8(hp + i, n, _mm256_mul_ps(_mm256_mul_ps(av, sigmoid_avx2(av)), bv));
  }
}

// da = dh * b * silu'(a), db = dh * silu(a) over [begin, end); each vector is read in full before
// it is written, so da or db may alias an input.
template <typename T>
MOEPEAK_AVX2_FMA void swiglu_backward_avx2(const T* ap, const T* bp, const T* dhp, T* dap, T* dbp,
                                           int64_t begin, int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = begin; i < end; i += 8) {
    const int64_t n = end - i;
    const __m256 av = load8(ap + i, n, 0.0f), bv = load8(bp + i, n, 0.0f),
                 g = load8(dhp + i, n, 0.0f);
    const __m256 s = sigmoid_avx2(av);
    const __m256 silu = _mm256_mul_ps(av, s);
    const __m256 dsilu =
        _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(av, _mm256_sub_ps(one, s))));
    store8(dap + i, n, _mm256_mul_ps(_mm256_mul_ps(g, bv), dsilu));
    store8(dbp + i, n, _mm256_mul_ps(g, silu));
  }
}

#endif  // __x86_64__

// a: (M, F) float; every other tensor: a's shape and dtype.
void check_same_as_a(const char* op, const Tensor& a,
                     std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  MOEPEAK_CHECK(a.ndim() == 2, op, ": a must be (M, F), got ", a.str());
  for (const auto& [t, name] : others)
    t->expect(a.shape(), a.dtype(), std::string(op) + ": " + name);
}

}  // namespace

void check_swiglu_params(const char* op, const SwigluParams& params) {
  MOEPEAK_CHECK(params.limit > 0, op, ": SwigluParams.limit must be > 0 (or +infinity), got ",
                params.limit);
  MOEPEAK_CHECK(std::isfinite(params.alpha) && std::isfinite(params.up_offset), op,
                ": SwigluParams.alpha and up_offset must be finite, got ", params.alpha, " and ",
                params.up_offset);
}

void check_swiglu_forward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& h) {
  check_same_as_a(op, a, {{&b, "b"}, {&h, "h"}});
}

void check_swiglu_backward_args(const char* op, const Tensor& a, const Tensor& b, const Tensor& dh,
                                const Tensor& da, const Tensor& db) {
  check_same_as_a(op, a, {{&b, "b"}, {&dh, "dh"}, {&da, "da"}, {&db, "db"}});
}

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cpu";
  check_swiglu_forward_args(op, a, b, h);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();  // (M, F)
    const T* bp = b.data_as<T>();  // (M, F)
    T* hp = h.data_as<T>();        // (M, F)
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
#if defined(__x86_64__)
        if constexpr (kFp32Compute<T>) {
          if (cpu_has_avx2_fma()) return swiglu_forward_avx2(ap, bp, hp, begin, end);
        }
#endif
        for (int64_t i = begin; i < end; ++i) {
          const compute_t<T> av = load(ap[i]);
          store(hp + i, av * sigmoid(av) * load(bp[i]));
        }
      });
    });
  });
}

void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                         const Tensor& db, Stream& stream) {
  const char* op = "swiglu_backward_cpu";
  check_swiglu_backward_args(op, a, b, dh, da, db);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* ap = a.data_as<T>();    // (M, F)
    const T* bp = b.data_as<T>();    // (M, F)
    const T* dhp = dh.data_as<T>();  // (M, F)
    T* dap = da.data_as<T>();        // (M, F)
    T* dbp = db.data_as<T>();        // (M, F)
    int64_t n = a.numel();
    as_cpu_stream(stream).enqueue([=] {
      using C = compute_t<T>;
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
#if defined(__x86_64__)
        if constexpr (kFp32Compute<T>) {
          if (cpu_has_avx2_fma()) return swiglu_backward_avx2(ap, bp, dhp, dap, dbp, begin, end);
        }
#endif
        for (int64_t i = begin; i < end; ++i) {
          const C av = load(ap[i]), bv = load(bp[i]);
          C s = sigmoid(av);
          C silu = av * s;
          C dsilu = s * (C(1) + av * (C(1) - s));
          C g = load(dhp[i]);
          // Element i is read in full before it is written, so da or db may alias an input.
          store(dap + i, g * bv * dsilu);
          store(dbp + i, g * silu);
        }
      });
    });
  });
}

// ---- the clamped SwiGLU (gpt-oss) --------------------------------------------------------------

namespace {

// The parameters in the compute type C.
template <typename C>
struct ClampedSwiglu {
  C alpha, limit, up_offset;
  explicit ClampedSwiglu(const SwigluParams& p)
      : alpha(static_cast<C>(p.alpha)),
        limit(static_cast<C>(p.limit)),
        up_offset(static_cast<C>(p.up_offset)) {}
  // min(a, limit) and clamp(b, -limit, limit), NaN passing through as in torch.clamp.
  C gate(C a) const { return a > limit ? limit : a; }
  C up(C b) const { return b < -limit ? -limit : b > limit ? limit : b; }
};

#if defined(__x86_64__)

// The same clamps in lanes: a lane whose comparison fails (NaN included) keeps its value.
MOEPEAK_AVX2_FMA inline __m256 gate_avx2(const ClampedSwiglu<float>& p, __m256 a) {
  const __m256 limit = _mm256_set1_ps(p.limit);
  return _mm256_blendv_ps(a, limit, _mm256_cmp_ps(a, limit, _CMP_GT_OQ));
}

MOEPEAK_AVX2_FMA inline __m256 up_avx2(const ClampedSwiglu<float>& p, __m256 b) {
  const __m256 limit = _mm256_set1_ps(p.limit), minus_limit = _mm256_set1_ps(-p.limit);
  b = _mm256_blendv_ps(b, limit, _mm256_cmp_ps(b, limit, _CMP_GT_OQ));
  return _mm256_blendv_ps(b, minus_limit, _mm256_cmp_ps(b, minus_limit, _CMP_LT_OQ));
}

// h = (up(b) + up_offset) * gate(a) * sigmoid(alpha * gate(a)) over [begin, end).
template <typename T>
MOEPEAK_AVX2_FMA void clamped_forward_avx2(const ClampedSwiglu<float>& p, const T* ap, const T* bp,
                                           T* hp, int64_t begin, int64_t end) {
  const __m256 alpha = _mm256_set1_ps(p.alpha), up_offset = _mm256_set1_ps(p.up_offset);
  for (int64_t i = begin; i < end; i += 8) {
    const int64_t n = end - i;
    const __m256 g = gate_avx2(p, load8(ap + i, n, 0.0f)), u = up_avx2(p, load8(bp + i, n, 0.0f));
    const __m256 glu = _mm256_mul_ps(g, sigmoid_avx2(_mm256_mul_ps(alpha, g)));
    store8(hp + i, n, _mm256_mul_ps(_mm256_add_ps(u, up_offset), glu));
  }
}

// The clamped backward over [begin, end) (the scalar loop's formulas); a lane outside a clamp's
// inclusive range (or NaN) gets 0. Each vector is read in full before it is written.
template <typename T>
MOEPEAK_AVX2_FMA void clamped_backward_avx2(const ClampedSwiglu<float>& p, const T* ap, const T* bp,
                                            const T* dhp, T* dap, T* dbp, int64_t begin,
                                            int64_t end) {
  const __m256 one = _mm256_set1_ps(1.0f), alpha = _mm256_set1_ps(p.alpha),
               up_offset = _mm256_set1_ps(p.up_offset), limit = _mm256_set1_ps(p.limit),
               minus_limit = _mm256_set1_ps(-p.limit);
  for (int64_t i = begin; i < end; i += 8) {
    const int64_t n = end - i;
    const __m256 av = load8(ap + i, n, 0.0f), bv = load8(bp + i, n, 0.0f),
                 dhv = load8(dhp + i, n, 0.0f);
    const __m256 g = gate_avx2(p, av), u = up_avx2(p, bv);
    const __m256 ag = _mm256_mul_ps(alpha, g);
    const __m256 s = sigmoid_avx2(ag);
    const __m256 a_passes = _mm256_cmp_ps(av, limit, _CMP_LE_OQ);
    const __m256 b_passes = _mm256_and_ps(_mm256_cmp_ps(bv, minus_limit, _CMP_GE_OQ),
                                          _mm256_cmp_ps(bv, limit, _CMP_LE_OQ));
    const __m256 dglu =
        _mm256_mul_ps(s, _mm256_add_ps(one, _mm256_mul_ps(ag, _mm256_sub_ps(one, s))));
    const __m256 da = _mm256_mul_ps(_mm256_mul_ps(dhv, _mm256_add_ps(u, up_offset)), dglu);
    store8(dap + i, n, _mm256_and_ps(a_passes, da));
    store8(dbp + i, n, _mm256_and_ps(b_passes, _mm256_mul_ps(dhv, _mm256_mul_ps(g, s))));
  }
}

#endif  // __x86_64__

}  // namespace

void swiglu_forward_cpu(const Tensor& a, const Tensor& b, const SwigluParams& params,
                        const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cpu";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_forward_cpu(a, b, h, stream);
    return;
  }
  check_swiglu_forward_args(op, a, b, h);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* ap = a.data_as<T>();  // (M, F)
    const T* bp = b.data_as<T>();  // (M, F)
    T* hp = h.data_as<T>();        // (M, F)
    const int64_t n = a.numel();
    const ClampedSwiglu<C> p(params);
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
#if defined(__x86_64__)
        if constexpr (kFp32Compute<T>) {
          if (cpu_has_avx2_fma()) return clamped_forward_avx2(p, ap, bp, hp, begin, end);
        }
#endif
        for (int64_t i = begin; i < end; ++i) {
          const C g = p.gate(load(ap[i])), u = p.up(load(bp[i]));
          const C glu = g * sigmoid(p.alpha * g);
          store(hp + i, (u + p.up_offset) * glu);
        }
      });
    });
  });
}

void swiglu_backward_cpu(const Tensor& a, const Tensor& b, const Tensor& dh,
                         const SwigluParams& params, const Tensor& da, const Tensor& db,
                         Stream& stream) {
  const char* op = "swiglu_backward_cpu";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_backward_cpu(a, b, dh, da, db, stream);
    return;
  }
  check_swiglu_backward_args(op, a, b, dh, da, db);
  dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* ap = a.data_as<T>();    // (M, F)
    const T* bp = b.data_as<T>();    // (M, F)
    const T* dhp = dh.data_as<T>();  // (M, F)
    T* dap = da.data_as<T>();        // (M, F)
    T* dbp = db.data_as<T>();        // (M, F)
    const int64_t n = a.numel();
    const ClampedSwiglu<C> p(params);
    as_cpu_stream(stream).enqueue([=] {
      parallel_ranges(n, kElementsPerTask, [=](int64_t begin, int64_t end) {
#if defined(__x86_64__)
        if constexpr (kFp32Compute<T>) {
          if (cpu_has_avx2_fma())
            return clamped_backward_avx2(p, ap, bp, dhp, dap, dbp, begin, end);
        }
#endif
        for (int64_t i = begin; i < end; ++i) {
          const C av = load(ap[i]), bv = load(bp[i]), dhv = load(dhp[i]);
          const C g = p.gate(av), u = p.up(bv);
          const C ag = p.alpha * g;
          const C s = sigmoid(ag);
          // d(g * s)/dg = s + alpha * g * s * (1 - s); the clamps pass the gradient on their
          // inclusive ranges (a NaN input fails both tests and gets 0).
          const bool a_passes = av <= p.limit, b_passes = bv >= -p.limit && bv <= p.limit;
          const C dglu = s * (C(1) + ag * (C(1) - s));
          // Element i is read in full before it is written, so da or db may alias an input.
          store(dap + i, a_passes ? dhv * (u + p.up_offset) * dglu : C(0));
          store(dbp + i, b_passes ? dhv * (g * s) : C(0));
        }
      });
    });
  });
}

}  // namespace moepeak::ops
