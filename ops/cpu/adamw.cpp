// CPU AdamW: a plain loop the compiler vectorises; scalars computed once per call. The argument
// checks (check_adamw_args) are shared with the CUDA kernel (ops/cuda/adamw.cu).
#include <cmath>

#include "core/runtime/cpu_stream.h"
#include "ops/adamw.h"

namespace moepeak::ops {
namespace {

template <typename T>
void adamw_loop(T* p, const T* g_in, T* m, T* v, int64_t n, const AdamWHyper& h, bool decay) {
  const T beta1 = static_cast<T>(h.beta1), beta2 = static_cast<T>(h.beta2);
  const T one_minus_beta1 = static_cast<T>(1.0 - h.beta1),
          one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
  const T grad_scale = static_cast<T>(h.grad_scale);
  const T decay_factor = static_cast<T>(decay ? 1.0 - h.lr * h.weight_decay : 1.0);
  const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const T step_size = static_cast<T>(h.lr / bias1);
  const T bias2_sqrt = static_cast<T>(std::sqrt(bias2));
  const T eps = static_cast<T>(h.eps);
  for (int64_t i = 0; i < n; ++i) {
    T g = g_in[i] * grad_scale;
    m[i] = beta1 * m[i] + one_minus_beta1 * g;
    v[i] = beta2 * v[i] + one_minus_beta2 * g * g;
    p[i] *= decay_factor;
    T denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

}  // namespace

void check_adamw_args(const char* op, const Tensor& param, const Tensor& grad, const Tensor& m,
                      const Tensor& v, const AdamWHyper& hyper) {
  const int64_t n = param.numel();
  for (const Tensor* t : {&grad, &m, &v}) {
    MOEPEAK_CHECK(t->numel() == n && t->dtype() == param.dtype(), op, ": param ", param.str(),
                  " with ", t->str(), " (grad, m and v take param's size and dtype)");
  }
  MOEPEAK_CHECK(hyper.step >= 1, op, ": step ", hyper.step, " (steps count from 1)");
}

void adamw_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
               const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_cpu";
  check_adamw_args(op, param, grad, m, v, hyper);
  const int64_t n = param.numel();
  dispatch_float(param.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    T* p = param.data_as<T>();
    const T* g = grad.data_as<T>();
    T* mm = m.data_as<T>();
    T* vv = v.data_as<T>();
    AdamWHyper h = hyper;
    as_cpu_stream(stream).enqueue([=] { adamw_loop<T>(p, g, mm, vv, n, h, decay); });
  });
}

}  // namespace moepeak::ops
