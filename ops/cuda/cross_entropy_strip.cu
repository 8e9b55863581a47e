// CUDA cross-entropy over vocabulary strips (see ops/cross_entropy_strip.h): the (N, 3) f64
// state [m, z, t] in double throughout. The strip forward and backward run one block per token
// (the forward reduces the strip's max and sum of exponentials over the block); init and merge
// are one thread per token with the CPU's exact recurrence.
// Test: ctest -L cuda -R test_backend_ops (cases in
// tests/ops/backend_ops/cases_cross_entropy_strip.cpp).
#include <algorithm>
#include <cmath>

#include "ops/cross_entropy.h"
#include "ops/cross_entropy_strip.h"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

__global__ void state_init_kernel(double* state, int64_t tokens) {
  MOEPEAK_GRID_STRIDE(n, tokens) {
    state[3 * n] = -INFINITY;
    state[3 * n + 1] = 0;
    state[3 * n + 2] = 0;
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    strip_forward_kernel(const T* strip, const int64_t* labels, int64_t column_begin, double* state,
                         int64_t tokens, int64_t columns) {
  using C = compute_t<T>;
  __shared__ double scratch[32];
  for (int64_t n = blockIdx.x; n < tokens; n += gridDim.x) {
    const int64_t label = labels[n];  // the same for the whole block
    if (label == kIgnoreLabel) continue;
    const T* row = strip + n * columns;
    double strip_max = -INFINITY;
    for (int64_t v = threadIdx.x; v < columns; v += blockDim.x) {
      strip_max = fmax(strip_max, load_as<double>(row, v));
    }
    strip_max = cuda::block_max(strip_max, scratch);
    double* st = state + 3 * n;
    const double old_m = st[0];  // every thread reads it before the barriers of block_sum
    const double m = fmax(old_m, strip_max);
    double sum = 0;
    for (int64_t v = threadIdx.x; v < columns; v += blockDim.x) {
      sum += static_cast<double>(exp(static_cast<C>(load_as<double>(row, v) - m)));
    }
    sum = cuda::block_sum(sum, scratch);
    if (threadIdx.x == 0) {
      // NOTES: old_m - m is -inf before the first strip (exp gives 0, z is 0): no NaN.
      st[1] = st[1] * exp(old_m - m) + sum;
      st[0] = m;
      const int64_t c = label - column_begin;
      if (c >= 0 && c < columns) st[2] = load_as<double>(row, c);
    }
  }
}

__global__ void state_merge_kernel(const double* partial, double* state, int64_t tokens) {
  MOEPEAK_GRID_STRIDE(n, tokens) {
    const double* pt = partial + 3 * n;
    double* st = state + 3 * n;
    const double pm = pt[0], sm = st[0];
    if (pm == -INFINITY) continue;  // nothing folded into the partial state
    if (sm == -INFINITY) {
      st[0] = pm;
      st[1] = pt[1];
      st[2] = pt[2];
      continue;
    }
    const double m = fmax(sm, pm);
    st[1] = st[1] * exp(sm - m) + pt[1] * exp(pm - m);
    st[0] = m;
    st[2] += pt[2];
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    strip_backward_kernel(const T* strip, const int64_t* labels, int64_t column_begin,
                          const double* state, double scale, T* dstrip, int64_t tokens,
                          int64_t columns) {
  using C = compute_t<T>;
  for (int64_t n = blockIdx.x; n < tokens; n += gridDim.x) {
    const int64_t label = labels[n];
    T* drow = dstrip + n * columns;
    if (label == kIgnoreLabel) {
      for (int64_t v = threadIdx.x; v < columns; v += blockDim.x) store_from(drow, v, C(0));
      continue;
    }
    const T* row = strip + n * columns;  // may be drow itself: each element is read, then written
    const double lse = state[3 * n] + log(state[3 * n + 1]);
    const int64_t target = label - column_begin;  // a column of this strip or outside [0, C)
    for (int64_t v = threadIdx.x; v < columns; v += blockDim.x) {
      const double softmax = exp(static_cast<C>(load_as<double>(row, v) - lse));
      const double onehot = v == target ? 1.0 : 0.0;
      store_from(drow, v, scale * (softmax - onehot));
    }
  }
}

}  // namespace

void cross_entropy_state_init_cuda(const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_state_init_cuda";
  check_cross_entropy_state_init_args(op, state);
  const int64_t tokens = state.size(0);
  if (tokens == 0) return;
  state_init_kernel<<<cuda::grid_for(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
      static_cast<double*>(state.data()), tokens);
  MOEPEAK_CUDA_LAUNCH_CHECK();
}

void cross_entropy_strip_forward_cuda(const Tensor& strip, const Tensor& labels,
                                      int64_t column_begin, const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_strip_forward_cuda";
  check_cross_entropy_strip_forward_args(op, strip, labels, column_begin, state);
  const int64_t tokens = strip.size(0), columns = strip.size(1);
  if (tokens == 0) return;
  cuda::dispatch_storage(strip.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    strip_forward_kernel<T>
        <<<cuda::grid_for(tokens, 1), cuda::long_row_threads(columns), 0, cuda::native(stream)>>>(
            static_cast<const T*>(strip.data()), static_cast<const int64_t*>(labels.data()),
            column_begin, static_cast<double*>(state.data()), tokens, columns);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void cross_entropy_state_merge_cuda(const Tensor& partial, const Tensor& state, Stream& stream) {
  const char* op = "cross_entropy_state_merge_cuda";
  check_cross_entropy_state_merge_args(op, partial, state);
  const int64_t tokens = state.size(0);
  if (tokens == 0) return;
  state_merge_kernel<<<cuda::grid_for(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
      static_cast<const double*>(partial.data()), static_cast<double*>(state.data()), tokens);
  MOEPEAK_CUDA_LAUNCH_CHECK();
}

void cross_entropy_strip_backward_cuda(const Tensor& strip, const Tensor& labels,
                                       int64_t column_begin, const Tensor& state, double scale,
                                       const Tensor& dstrip, Stream& stream) {
  const char* op = "cross_entropy_strip_backward_cuda";
  check_cross_entropy_strip_backward_args(op, strip, labels, column_begin, state, dstrip);
  const int64_t tokens = strip.size(0), columns = strip.size(1);
  if (tokens == 0) return;
  cuda::dispatch_storage(strip.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    strip_backward_kernel<T>
        <<<cuda::grid_for(tokens, 1), cuda::long_row_threads(columns), 0, cuda::native(stream)>>>(
            static_cast<const T*>(strip.data()), static_cast<const int64_t*>(labels.data()),
            column_begin, static_cast<const double*>(state.data()), scale,
            static_cast<T*>(dstrip.data()), tokens, columns);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
