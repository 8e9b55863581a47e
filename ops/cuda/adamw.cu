// CUDA AdamW: adamw_cuda (ops/adamw.h; param, grad, m, v of one dtype, f32 or f64) and
// adamw_fused_cuda (ops/adamw_fused.h; the device stage of OffloadStreamAdamW: fp32 master, m, v
// in a staging slot, working weights in f32 or bf16, the gradient in their dtype or f32). One
// grid-stride element-wise kernel each, sharing one element update; the per-call scalars are
// ops/cpu/adamw_simd.h's AdamWScalars<T>, computed on the host in double and rounded to T exactly
// as the CPU does, and passed to the kernel by value.
//
// NOTES: bitwise equality with the CPU. The CPU f32 path (ops/cpu/adamw.cpp, adamw_simd.h) is a
// fixed sequence of correctly rounded IEEE 754 operations (mul, add, sub, div, sqrt) with no
// fused multiply-add. nvcc contracts a * b + c into an FMA by default (-fmad=true), which rounds
// once instead of twice and changes the last bit, so every operation here is an explicit
// round-to-nearest intrinsic (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn; __dmul_rn
// etc. for f64), which the compiler never merges into an FMA, and whose division and square root
// are correctly rounded whatever -prec-div / -prec-sqrt say. The operations and their operand
// order are adamw_simd.h's line for line, so with f32 state param/master, m and v are bitwise the
// CPU f32 result for the same inputs (f64 likewise bitwise the CPU f64 result). This holds with
// denormals kept, as the CPU keeps them: the build does not pass --use_fast_math or -ftz=true.
// A bf16 gradient is widened to fp32 exactly, so the fused update with bf16 working weights is
// the f32 update of that widened gradient; an f32 gradient with bf16 working weights (the fp32
// main gradient) is read as it is, so the update is the f32 update of that gradient. The bf16
// working weights are the new master rounded to nearest even (__float2bfloat16_rn).
//
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_adamw.cpp).
#include "ops/adamw.h"
#include "ops/adamw_fused.h"
#include "ops/cpu/adamw_simd.h"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::load_as;
using cuda::store_from;

// The correctly rounded operations of one precision (never contracted into an FMA).
template <typename T>
struct Rn;
template <>
struct Rn<float> {
  static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
  static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
  static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
  static __device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
};
template <>
struct Rn<double> {
  static __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
  static __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
  static __device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
  static __device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
  static __device__ __forceinline__ double sqrt(double a) { return __dsqrt_rn(a); }
};

// One element's update: adamw_simd.h's span_scalar, one line there, one line here.
template <typename T>
__device__ __forceinline__ void adamw_element(T& p, T grad, T& m, T& v, const AdamWScalars<T>& s) {
  using R = Rn<T>;
  const T g = R::mul(grad, s.grad_scale);
  m = R::add(R::mul(s.beta1, m), R::mul(s.one_minus_beta1, g));
  v = R::add(R::mul(s.beta2, v), R::mul(R::mul(s.one_minus_beta2, g), g));
  p = R::mul(p, s.decay_factor);
  const T denom = R::add(R::div(R::sqrt(v), s.bias2_sqrt), s.eps);
  p = R::sub(p, R::mul(s.step_size, R::div(m, denom)));
}

template <typename T>
__global__ void adamw_kernel(T* param, const T* grad, T* m, T* v, int64_t n, AdamWScalars<T> s) {
  MOEPEAK_GRID_STRIDE(i, n) {
    T p = param[i], mi = m[i], vi = v[i];
    adamw_element(p, grad[i], mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}

// W: the working dtype (float or __nv_bfloat16); G: the gradient's (W, or float with bf16 W, the
// fp32 main gradient, read as it is); the state is fp32.
template <typename W, typename G>
__global__ void adamw_fused_kernel(float* master, const G* grad, float* m, float* v, W* working,
                                   int64_t n, AdamWScalars<float> s) {
  MOEPEAK_GRID_STRIDE(i, n) {
    float p = master[i], mi = m[i], vi = v[i];
    adamw_element(p, load_as<float>(grad, i), mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    store_from(working, i, p);  // f32: the master itself; bf16: rounded to nearest even
  }
}

}  // namespace

void adamw_cuda(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_cuda";
  check_adamw_args(op, param, grad, m, v, hyper);
  const int64_t n = param.numel();
  auto launch = [&](auto zero) {
    using T = decltype(zero);
    if (n == 0) return;
    adamw_kernel<T><<<cuda::grid_for(n), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<T*>(param.data()), static_cast<const T*>(grad.data()),
        static_cast<T*>(m.data()), static_cast<T*>(v.data()), n,
        AdamWScalars<T>::make(hyper, decay));
    MOEPEAK_CUDA_LAUNCH_CHECK();
  };
  switch (param.dtype()) {
    case DType::f32:
      launch(float{});
      return;
    case DType::f64:
      launch(double{});
      return;
    default:
      break;
  }
  MOEPEAK_THROW("op ", op, " supports param, grad, m and v in f32 (or f64), got ",
                dtype_name(param.dtype()));
}

void adamw_fused_cuda(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                      const Tensor& working, const AdamWHyper& hyper, bool decay, Stream& stream) {
  const char* op = "adamw_fused_cuda";
  check_adamw_fused_args(op, master, grad, m, v, working, hyper);
  MOEPEAK_CHECK(master.dtype() == DType::f32 &&
                    (working.dtype() == DType::f32 || working.dtype() == DType::bf16),
                "op ", op,
                " runs an f32 master, m and v with f32 or bf16 working weights (and a gradient "
                "of their dtype, or f32); got master ",
                dtype_name(master.dtype()), " and working weights ", dtype_name(working.dtype()));
  const int64_t n = master.numel();
  if (n == 0) return;
  const AdamWScalars<float> s = AdamWScalars<float>::make(hyper, decay);
  auto launch = [&](auto working_zero, auto grad_zero) {
    using W = decltype(working_zero);
    using G = decltype(grad_zero);
    adamw_fused_kernel<W, G><<<cuda::grid_for(n), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<float*>(master.data()), static_cast<const G*>(grad.data()),
        static_cast<float*>(m.data()), static_cast<float*>(v.data()),
        static_cast<W*>(working.data()), n, s);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  };
  // The gradient in the working dtype, or f32 with bf16 working weights (checked above).
  if (working.dtype() == DType::bf16 && grad.dtype() == DType::f32) {
    launch(__nv_bfloat16{}, float{});
  } else if (working.dtype() == DType::bf16) {
    launch(__nv_bfloat16{}, __nv_bfloat16{});
  } else {
    launch(float{}, float{});
  }
}

}  // namespace moepeak::ops
