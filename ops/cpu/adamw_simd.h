// The AdamW element update over a span of elements, scalar or AVX2, computing exactly the
// sequence of rounded operations below (ops/adamw.h's update, one IEEE operation at a time), so
// every optimizer placement gives bitwise the same weights, m and v (docs/design.md#exactness).
// Used by the CPU's adamw op (resident AdamW, ops/cpu/adamw.cpp), the fused update +
// working-weight refresh of OffloadStreamAdamW (ops/adamw_fused.h) and the multi-threaded host
// AdamW of the serial offload (ops/cpu/cpu_adamw.h).
//
//   param, m, v (n)  T = f32 | f64, updated in place;  grad (n) T;  working (n) T or null
//   per element (each line one IEEE operation per arithmetic sign, rounded to T):
//     g = grad * grad_scale
//     m = beta1 * m + one_minus_beta1 * g
//     v = beta2 * v + (one_minus_beta2 * g) * g
//     param = param * decay_factor                   (decay_factor = 1 - lr*wd, or 1)
//     param = param - step_size * (m / (sqrt(v) / bias2_sqrt + eps))
//     working = param                                (when working is not null)
//   The scalars are computed once per call in double and rounded to T, as the reference does.
//
// NOTES: bitwise equality with the reference holds because the vector path uses only operations
// IEEE 754 rounds exactly like their scalar forms (add, sub, mul, div, sqrt, all correctly
// rounded), in the same order, and never fused multiply-add: the AVX2 functions are compiled
// with target("avx2") only, not "fma", and the project compiles as ISO C++ (-std=c++20, which
// makes GCC's default -ffp-contract=off), so neither path is contracted.
//
// Test: tests/ops/test_adamw_kernels.cpp (each path, and ops::adamw_cpu, against a plain scalar
// loop of this sequence kept in the test, bitwise, on random inputs and hyper-parameters, every
// tail length).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/runtime/dtype.h"
#include "ops/adamw.h"

namespace moepeak::ops {

// The per-call scalars, computed in double and rounded to T.
template <typename T>
struct AdamWScalars {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, grad_scale, decay_factor, step_size, bias2_sqrt,
      eps;

  static AdamWScalars make(const AdamWHyper& h, bool decay) {
    AdamWScalars s;
    s.beta1 = static_cast<T>(h.beta1);
    s.beta2 = static_cast<T>(h.beta2);
    s.one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
    s.one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
    s.grad_scale = static_cast<T>(h.grad_scale);
    s.decay_factor = static_cast<T>(decay ? 1.0 - h.lr * h.weight_decay : 1.0);
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
    s.step_size = static_cast<T>(h.lr / bias1);
    s.bias2_sqrt = static_cast<T>(std::sqrt(bias2));
    s.eps = static_cast<T>(h.eps);
    return s;
  }
};

// Which instructions adamw_span uses. automatic = AVX2 when the CPU has it, else scalar.
enum class AdamWSimd { automatic, scalar, avx2 };

// True when this CPU (and build) can run the AVX2 path.
bool adamw_avx2_available();

// The update of n elements (see the top of the file). Runs on the calling thread. `simd` =
// avx2 on a CPU without AVX2 throws moepeak::Error.
template <typename T>
void adamw_span(T* param, const T* grad, T* m, T* v, T* working, int64_t n,
                const AdamWScalars<T>& s, AdamWSimd simd = AdamWSimd::automatic);

extern template void adamw_span<float>(float*, const float*, float*, float*, float*, int64_t,
                                       const AdamWScalars<float>&, AdamWSimd);
extern template void adamw_span<double>(double*, const double*, double*, double*, double*, int64_t,
                                        const AdamWScalars<double>&, AdamWSimd);

// adamw_span<float> over n elements of an fp32 master, m, v and gradient, and each updated master
// element rounded to nearest even into the bf16 working weights: what adamw_fused writes and the
// serial offload's host AdamW copies up. A chunk at a time, so the rounding reads the master
// while it is in L1.
void adamw_span_bf16_working(float* master, const float* grad, float* m, float* v, bf16* working,
                             int64_t n, const AdamWScalars<float>& s,
                             AdamWSimd simd = AdamWSimd::automatic);

}  // namespace moepeak::ops
