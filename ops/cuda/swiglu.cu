// CUDA SwiGLU, forward and backward, plain and clamped (gpt-oss): one grid-stride element-wise
// kernel each, fp32 math on f32 or bf16 storage (f64 math on f64), the same formulas as
// ops/cpu/swiglu.cpp (see ops/swiglu.h). The clamped ops with the default parameters run the
// plain kernels.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_swiglu.cpp).
#include "ops/cuda/cuda_common.cuh"
#include "ops/swiglu.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

template <typename C>
__device__ __forceinline__ C sigmoid(C v) {
  return C(1) / (C(1) + exp(-v));
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* a, const T* b, T* h, int64_t n) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) {
    C av = load_as<C>(a, i);
    store_from(h, i, av * sigmoid(av) * load_as<C>(b, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* a, const T* b, const T* dh, T* da, T* db,
                                       int64_t n) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) {
    C av = load_as<C>(a, i), bv = load_as<C>(b, i), g = load_as<C>(dh, i);
    C s = sigmoid(av);
    C dsilu = s * (C(1) + av * (C(1) - s));
    // Every input element is read before either output is written (da or db may alias one).
    store_from(da, i, g * bv * dsilu);
    store_from(db, i, g * av * s);
  }
}

// The clamped form (ops/swiglu.h): parameters in the compute type C.
template <typename C>
struct ClampedSwiglu {
  C alpha, limit, up_offset;
  // min(a, limit) and clamp(b, -limit, limit), NaN passing through as in torch.clamp.
  __device__ __forceinline__ C gate(C a) const { return a > limit ? limit : a; }
  __device__ __forceinline__ C up(C b) const { return b < -limit ? -limit : b > limit ? limit : b; }
};

template <typename C>
ClampedSwiglu<C> clamped_params(const SwigluParams& p) {
  return ClampedSwiglu<C>{static_cast<C>(p.alpha), static_cast<C>(p.limit),
                          static_cast<C>(p.up_offset)};
}

template <typename T>
__global__ void swiglu_clamped_forward_kernel(const T* a, const T* b, T* h, int64_t n,
                                              ClampedSwiglu<compute_t<T>> p) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) {
    const C g = p.gate(load_as<C>(a, i)), u = p.up(load_as<C>(b, i));
    const C glu = g * sigmoid(p.alpha * g);
    store_from(h, i, (u + p.up_offset) * glu);
  }
}

template <typename T>
__global__ void swiglu_clamped_backward_kernel(const T* a, const T* b, const T* dh, T* da, T* db,
                                               int64_t n, ClampedSwiglu<compute_t<T>> p) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) {
    const C av = load_as<C>(a, i), bv = load_as<C>(b, i), dhv = load_as<C>(dh, i);
    const C g = p.gate(av), u = p.up(bv);
    const C ag = p.alpha * g;
    const C s = sigmoid(ag);
    // The clamps pass the gradient on their inclusive ranges (a NaN input gets 0).
    const bool a_passes = av <= p.limit, b_passes = bv >= -p.limit && bv <= p.limit;
    const C dglu = s * (C(1) + ag * (C(1) - s));
    // Every input element is read before either output is written (da or db may alias one).
    store_from(da, i, a_passes ? dhv * (u + p.up_offset) * dglu : C(0));
    store_from(db, i, b_passes ? dhv * (g * s) : C(0));
  }
}

}  // namespace

void swiglu_forward_cuda(const Tensor& a, const Tensor& b, const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cuda";
  check_swiglu_forward_args(op, a, b, h);
  if (a.numel() == 0) return;
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    swiglu_forward_kernel<T>
        <<<cuda::grid_for(a.numel()), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
            static_cast<T*>(h.data()), a.numel());
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dh, const Tensor& da,
                          const Tensor& db, Stream& stream) {
  const char* op = "swiglu_backward_cuda";
  check_swiglu_backward_args(op, a, b, dh, da, db);
  if (a.numel() == 0) return;
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    swiglu_backward_kernel<T>
        <<<cuda::grid_for(a.numel()), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
            static_cast<const T*>(dh.data()), static_cast<T*>(da.data()),
            static_cast<T*>(db.data()), a.numel());
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_forward_cuda(const Tensor& a, const Tensor& b, const SwigluParams& params,
                         const Tensor& h, Stream& stream) {
  const char* op = "swiglu_forward_cuda";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_forward_cuda(a, b, h, stream);
    return;
  }
  check_swiglu_forward_args(op, a, b, h);
  if (a.numel() == 0) return;
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    swiglu_clamped_forward_kernel<T>
        <<<cuda::grid_for(a.numel()), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
            static_cast<T*>(h.data()), a.numel(), clamped_params<compute_t<T>>(params));
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void swiglu_backward_cuda(const Tensor& a, const Tensor& b, const Tensor& dh,
                          const SwigluParams& params, const Tensor& da, const Tensor& db,
                          Stream& stream) {
  const char* op = "swiglu_backward_cuda";
  check_swiglu_params(op, params);
  if (params.is_plain()) {
    swiglu_backward_cuda(a, b, dh, da, db, stream);
    return;
  }
  check_swiglu_backward_args(op, a, b, dh, da, db);
  if (a.numel() == 0) return;
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    swiglu_clamped_backward_kernel<T>
        <<<cuda::grid_for(a.numel()), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
            static_cast<const T*>(dh.data()), static_cast<T*>(da.data()),
            static_cast<T*>(db.data()), a.numel(), clamped_params<compute_t<T>>(params));
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
