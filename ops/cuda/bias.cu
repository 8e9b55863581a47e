// CUDA bias ops (see ops/bias.h): a grid-stride broadcast of the bias into every row, and a
// column-sum kernel for dbias that owns each column in one block and adds to dbias[n] once, so
// it needs no atomics and is reproducible (ops/cuda/rmsnorm.cu's dw kernel, without the x_hat
// factor). The grouped forms run these per group: ops/cuda/grouped_bias.cpp.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_bias.cpp).
#include "ops/bias.h"
#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

// y[m, n] = bias[n] over the M * N elements. B is the bias's storage, Y y's (B, or float for
// bf16 B): the value passes through B's compute type, which holds it exactly.
template <typename B, typename Y>
__global__ void bias_broadcast_kernel(const B* bias, Y* y, int64_t cols, int64_t n) {
  MOEPEAK_GRID_STRIDE(i, n) { store_from(y, i, load_as<compute_t<B>>(bias, i % cols)); }
}

// dbias[n] += sum_m dy[m, n]. A block of kCols x kLanes threads owns kCols columns: lane l sums
// rows l, l + kLanes, ... in double (a warp reads kCols consecutive elements of one row), then
// one thread per column adds the lane sums in lane order and adds the total to dbias[n] once.
// The order depends only on the shape: reproducible run to run. DB is dbias's storage: T, or
// float for bf16 T (the fp32 main gradient): the total is rounded to DB's compute type and added
// in it, then stored (no bf16 rounding for an f32 dbias), as the CPU does.
constexpr int kCols = 32;
constexpr int kLanes = 16;

template <typename T, typename DB>
__global__ void __launch_bounds__(kCols* kLanes)
    bias_backward_kernel(const T* dy, DB* dbias, int64_t rows, int64_t cols) {
  using C = compute_t<DB>;
  __shared__ double lane_sum[kLanes][kCols];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  double sum = 0;
  if (col < cols) {
    for (int64_t m = threadIdx.y; m < rows; m += kLanes) sum += load_as<double>(dy, m * cols + col);
  }
  lane_sum[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double total = 0;
    for (int l = 0; l < kLanes; ++l) total += lane_sum[l][threadIdx.x];
    store_from(dbias, col, load_as<C>(dbias, col) + static_cast<C>(total));
  }
}

}  // namespace

void bias_broadcast_cuda(const Tensor& bias, const Tensor& y, Stream& stream) {
  const char* op = "bias_broadcast_cuda";
  check_bias_broadcast_args(op, bias, y);
  const int64_t n = y.numel();
  cuda::dispatch_storage(bias.dtype(), op, [&](auto zero) {
    using B = decltype(zero);
    if (n == 0) return;
    // y in bias's dtype, or f32 for a bf16 bias (checked above).
    cuda::with_accumulator<B>(y.dtype(), [&](auto y_zero) {
      using Y = decltype(y_zero);
      bias_broadcast_kernel<B, Y><<<cuda::grid_for(n), cuda::kThreads, 0, cuda::native(stream)>>>(
          static_cast<const B*>(bias.data()), static_cast<Y*>(y.data()), y.size(1), n);
    });
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void bias_backward_cuda(const Tensor& dy, const Tensor& dbias, Stream& stream) {
  const char* op = "bias_backward_cuda";
  check_bias_backward_args(op, dy, dbias);
  const int64_t rows = dy.size(0), cols = dy.size(1);
  cuda::dispatch_storage(dy.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (rows == 0 || cols == 0) return;  // dbias unchanged (ops/bias.h)
    const unsigned blocks = static_cast<unsigned>((cols + kCols - 1) / kCols);
    // dbias in dy's dtype, or f32 for a bf16 dy (checked above).
    cuda::with_accumulator<T>(dbias.dtype(), [&](auto db_zero) {
      using DB = decltype(db_zero);
      bias_backward_kernel<T, DB><<<blocks, dim3(kCols, kLanes), 0, cuda::native(stream)>>>(
          static_cast<const T*>(dy.data()), static_cast<DB*>(dbias.data()), rows, cols);
    });
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
