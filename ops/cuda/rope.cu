// CUDA RoPE, forward and backward, in place (see ops/rope.h): one thread per (token, frequency
// i < d/2) computes inv_freq, the angle and its cos and sin in double, as the CPU does, and
// rotates that pair of elements in every head of the token.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_rope.cpp).
#include "ops/cuda/cuda_common.cuh"
#include "ops/rope.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

// x: (tokens, heads, head_dim); rotates by +angle, or by -angle with `transpose` (the backward).
// cos and sin are rounded to the compute type (fp32 for f32 and bf16 storage, f64 for f64), the
// rotation is done in it and rounded once to the storage type.
template <typename T>
__global__ void rope_kernel(T* x, const int64_t* positions, int64_t tokens, int64_t heads,
                            int64_t head_dim, double theta, bool transpose) {
  using C = compute_t<T>;
  const int64_t half = head_dim / 2;
  MOEPEAK_GRID_STRIDE(p, tokens * half) {
    const int64_t n = p / half, i = p - n * half;
    const double inv_freq =
        pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double angle = static_cast<double>(positions[n]) * inv_freq;
    double sin_d, cos_d;
    sincos(angle, &sin_d, &cos_d);
    const C c = static_cast<C>(cos_d);
    const C s = static_cast<C>(transpose ? -sin_d : sin_d);
    T* v = x + n * heads * head_dim + i;  // element i of the token's first head
    for (int64_t head = 0; head < heads; ++head, v += head_dim) {
      const C lo = load_as<C>(v, 0), hi = load_as<C>(v, half);
      store_from(v, 0, lo * c - hi * s);
      store_from(v, half, hi * c + lo * s);
    }
  }
}

void rope_cuda(const char* op, const Tensor& x, const Tensor& positions, double theta,
               bool transpose, Stream& stream) {
  check_rope_args(op, x, positions, theta);
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t pairs = tokens * (head_dim / 2);
    if (pairs == 0 || heads == 0) return;
    rope_kernel<T><<<cuda::grid_for(pairs), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<T*>(x.data()), static_cast<const int64_t*>(positions.data()), tokens, heads,
        head_dim, theta, transpose);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void rope_forward_cuda(const Tensor& x, const Tensor& positions, double theta, Stream& stream) {
  rope_cuda("rope_forward_cuda", x, positions, theta, /*transpose=*/false, stream);
}

void rope_backward_cuda(const Tensor& dx, const Tensor& positions, double theta, Stream& stream) {
  rope_cuda("rope_backward_cuda", dx, positions, theta, /*transpose=*/true, stream);
}

}  // namespace moepeak::ops
