// CUDA RoPE, forward and backward, in place (see ops/rope.h): one thread per (token, frequency
// i < rotary_dim/2) computes inv_freq with the CPU's rope_inv_freq (ops/rope_params.h), the angle
// and its cos and sin in double, times the attention factor, as the CPU does, and rotates that
// pair of elements (rotate_half or interleaved) in every head of the token; elements past the
// rotary dimension are not touched. The RopeParams travel by value as a kernel argument.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_rope.cpp).
#include "ops/cuda/cuda_common.cuh"
#include "ops/rope.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

// x: (tokens, heads, head_dim); rotates by +angle, or by -angle with `transpose` (the backward).
// f * cos and f * sin are rounded to the compute type (fp32 for f32 and bf16 storage, f64 for
// f64), the rotation is done in it and rounded once to the storage type.
template <typename T>
__global__ void rope_kernel(T* x, const int64_t* positions, int64_t tokens, int64_t heads,
                            int64_t head_dim, RopeParams p, bool transpose) {
  using C = compute_t<T>;
  const int64_t half = p.rotary_dim / 2;
  // Pair i: elements (i, i + half), or (2i, 2i + 1) interleaved.
  const int64_t lo_step = p.interleaved ? 2 : 1, hi_offset = p.interleaved ? 1 : half;
  MOEPEAK_GRID_STRIDE(q, tokens * half) {
    const int64_t n = q / half, i = q - n * half;
    const double inv_freq = rope_inv_freq(p, i);
    const double angle = static_cast<double>(positions[n]) * inv_freq;
    double sin_d, cos_d;
    sincos(angle, &sin_d, &cos_d);
    cos_d *= p.attention_factor;
    sin_d *= p.attention_factor;
    const C c = static_cast<C>(cos_d);
    const C s = static_cast<C>(transpose ? -sin_d : sin_d);
    T* v = x + n * heads * head_dim + i * lo_step;  // pair i's first element in the first head
    for (int64_t head = 0; head < heads; ++head, v += head_dim) {
      const C lo = load_as<C>(v, 0), hi = load_as<C>(v, hi_offset);
      store_from(v, 0, lo * c - hi * s);
      store_from(v, hi_offset, hi * c + lo * s);
    }
  }
}

void rope_cuda(const char* op, const Tensor& x, const Tensor& positions, const RopeParams& p,
               bool transpose, Stream& stream) {
  check_rope_args(op, x, positions, p);
  const int64_t tokens = x.size(0), heads = x.size(1), head_dim = x.size(2);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t pairs = tokens * (p.rotary_dim / 2);
    if (pairs == 0 || heads == 0) return;
    rope_kernel<T><<<cuda::grid_for(pairs), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<T*>(x.data()), static_cast<const int64_t*>(positions.data()), tokens, heads,
        head_dim, p, transpose);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void rope_forward_cuda(const Tensor& x, const Tensor& positions, const RopeParams& p,
                       Stream& stream) {
  rope_cuda("rope_forward_cuda", x, positions, p, /*transpose=*/false, stream);
}

void rope_backward_cuda(const Tensor& dx, const Tensor& positions, const RopeParams& p,
                        Stream& stream) {
  rope_cuda("rope_backward_cuda", dx, positions, p, /*transpose=*/true, stream);
}

}  // namespace moepeak::ops
