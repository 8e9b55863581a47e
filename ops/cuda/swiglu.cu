// CUDA SwiGLU, forward and backward: one grid-stride element-wise kernel each, fp32 math on f32
// or bf16 storage (f64 math on f64), the same formulas as ops/cpu/swiglu.cpp (see ops/swiglu.h).
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

}  // namespace moepeak::ops
