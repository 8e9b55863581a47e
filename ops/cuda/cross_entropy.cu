// CUDA cross-entropy on materialised (N, V) logits (see ops/cross_entropy.h): one block per row.
// The row max is a block max in double, the sum of exp(y - max) a block sum in double of fp32
// exponentials (f64 for f64 storage), then the loss (forward) or the softmax minus the one-hot
// label, evaluated in double and rounded once (backward, in place allowed).
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_cross_entropy.cpp).
#include <algorithm>
#include <cmath>

#include "ops/cross_entropy.h"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

// max + log(sum exp(y - max)) of one row; every thread of the block gets it. The block's last
// read of the row happens before the barrier inside the final block_sum, so once this returns the
// row may be overwritten.
template <typename T>
__device__ double row_log_sum_exp(const T* row, int64_t vocab, double* scratch) {
  using C = compute_t<T>;
  double row_max = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    row_max = fmax(row_max, load_as<double>(row, v));
  }
  row_max = cuda::block_max(row_max, scratch);
  double sum = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    sum += static_cast<double>(exp(static_cast<C>(load_as<double>(row, v) - row_max)));
  }
  sum = cuda::block_sum(sum, scratch);
  return row_max + log(sum);
}

__device__ __forceinline__ bool is_bad_label(int64_t label, int64_t vocab) {
  return label != kIgnoreLabel && (label < 0 || label >= vocab);
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    cross_entropy_forward_kernel(const T* logits, const int64_t* labels, T* losses, int64_t tokens,
                                 int64_t vocab) {
  __shared__ double scratch[32];
  for (int64_t n = blockIdx.x; n < tokens; n += gridDim.x) {
    const int64_t label = labels[n];  // the same for the whole block
    if (label == kIgnoreLabel || is_bad_label(label, vocab)) {
      if (threadIdx.x == 0) store_from(losses, n, label == kIgnoreLabel ? 0.0 : NAN);
      continue;
    }
    const T* row = logits + n * vocab;
    const double lse = row_log_sum_exp(row, vocab, scratch);
    if (threadIdx.x == 0) store_from(losses, n, lse - load_as<double>(row, label));
  }
}

template <typename T>
__global__ void __launch_bounds__(cuda::kMaxRowThreads)
    cross_entropy_backward_kernel(const T* logits, const int64_t* labels, double scale, T* dlogits,
                                  int64_t tokens, int64_t vocab) {
  using C = compute_t<T>;
  __shared__ double scratch[32];
  for (int64_t n = blockIdx.x; n < tokens; n += gridDim.x) {
    const int64_t label = labels[n];  // the same for the whole block
    T* drow = dlogits + n * vocab;
    if (label == kIgnoreLabel || is_bad_label(label, vocab)) {
      const double fill = label == kIgnoreLabel ? 0.0 : NAN;
      for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) store_from(drow, v, fill);
      continue;
    }
    const T* row = logits + n * vocab;  // may be drow itself
    const double lse = row_log_sum_exp(row, vocab, scratch);
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
      const double softmax = exp(static_cast<C>(load_as<double>(row, v) - lse));
      const double onehot = v == label ? 1.0 : 0.0;
      store_from(drow, v, scale * (softmax - onehot));
    }
  }
}

}  // namespace

void cross_entropy_forward_cuda(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                                Stream& stream) {
  const char* op = "cross_entropy_forward_cuda";
  check_cross_entropy_forward_args(op, logits, labels, losses);
  const int64_t tokens = logits.size(0), vocab = logits.size(1);
  if (tokens == 0) return;
  cuda::dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    cross_entropy_forward_kernel<T>
        <<<cuda::grid_for(tokens, 1), cuda::long_row_threads(vocab), 0, cuda::native(stream)>>>(
            static_cast<const T*>(logits.data()), static_cast<const int64_t*>(labels.data()),
            static_cast<T*>(losses.data()), tokens, vocab);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void cross_entropy_backward_cuda(const Tensor& logits, const Tensor& labels, double scale,
                                 const Tensor& dlogits, Stream& stream) {
  const char* op = "cross_entropy_backward_cuda";
  check_cross_entropy_backward_args(op, logits, labels, dlogits);
  const int64_t tokens = logits.size(0), vocab = logits.size(1);
  if (tokens == 0) return;
  cuda::dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    cross_entropy_backward_kernel<T>
        <<<cuda::grid_for(tokens, 1), cuda::long_row_threads(vocab), 0, cuda::native(stream)>>>(
            static_cast<const T*>(logits.data()), static_cast<const int64_t*>(labels.data()), scale,
            static_cast<T*>(dlogits.data()), tokens, vocab);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
