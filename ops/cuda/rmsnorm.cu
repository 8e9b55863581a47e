// CUDA RMSNorm, forward and backward (see ops/rmsnorm.h): a block per row for y (in either
// NormWeightOrder), rstd and dx with double block reductions (the CPU's double statistics), and a
// column-sum kernel for dw that owns each column in one block and adds to dw[h] once, so dw needs
// no atomics and is reproducible; an f32 dw of bf16 x (the fp32 main gradient) is added to in
// fp32 with no bf16 rounding.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_rmsnorm.cpp).
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/rmsnorm.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::row_blocks;
using cuda::row_threads;
using cuda::store_from;

// The value v takes when stored in T and read back: a bf16 rounding; identity otherwise.
template <typename T, typename C>
__device__ __forceinline__ C round_to_storage(C v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else {
    return v;
  }
}

// One block per row (grid-stride over rows): sum of squares in double, rstd = 1 / sqrt(mean +
// eps) in double, rounded to the compute type (fp32 for f32 and bf16), y = (x * rstd) * w, or
// with after_cast (NormWeightOrder::weight_after_cast) y = round_to_storage(x * rstd) * w.
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* w, double eps, T* y, T* rstd,
                                       int64_t rows, int64_t hidden, bool after_cast) {
  using C = compute_t<T>;
  __shared__ double scratch[32];
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    const T* xr = x + n * hidden;
    double sum_sq = 0;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      double v = load_as<double>(xr, h);
      sum_sq += v * v;
    }
    sum_sq = cuda::block_sum(sum_sq, scratch);
    double mean_sq = hidden > 0 ? sum_sq / static_cast<double>(hidden) : 0.0;
    C r = static_cast<C>(1.0 / sqrt(mean_sq + eps));
    if (threadIdx.x == 0) store_from(rstd, n, r);
    T* yr = y + n * hidden;
    if (after_cast) {
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
        store_from(yr, h, round_to_storage<T>(load_as<C>(xr, h) * r) * load_as<C>(w, h));
      }
    } else {
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
        store_from(yr, h, (load_as<C>(xr, h) * r) * load_as<C>(w, h));
      }
    }
  }
}

// One block per row: dx = rstd * (g - xhat * mean_h(g * xhat)), g = dy * w, xhat = x * rstd, all
// in double, rounded once. Each thread reads its own elements of x and dy before writing dx, so
// dx may be x or dy.
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* x, const T* w, const T* rstd, const T* dy,
                                           T* dx, int64_t rows, int64_t hidden) {
  __shared__ double scratch[32];
  for (int64_t n = blockIdx.x; n < rows; n += gridDim.x) {
    const T* xr = x + n * hidden;
    const T* dyr = dy + n * hidden;
    const double r = load_as<double>(rstd, n);
    double g_dot_xhat = 0;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      double xhat = load_as<double>(xr, h) * r;
      g_dot_xhat += load_as<double>(dyr, h) * load_as<double>(w, h) * xhat;
    }
    g_dot_xhat = cuda::block_sum(g_dot_xhat, scratch);
    const double mean_g_xhat = g_dot_xhat / static_cast<double>(hidden);  // hidden > 0 here
    T* dxr = dx + n * hidden;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      double xhat = load_as<double>(xr, h) * r;
      double g = load_as<double>(dyr, h) * load_as<double>(w, h);
      store_from(dxr, h, r * (g - xhat * mean_g_xhat));
    }
  }
}

// dw[h] += sum_n dy[n, h] * x[n, h] * rstd[n]. A block of kDwCols x kDwLanes threads owns
// kDwCols columns: lane l sums rows l, l + kDwLanes, ... in double (a warp reads kDwCols
// consecutive elements of one row), then one thread per column adds the lane sums in lane order
// and adds the total to dw[h] once. The order depends only on the shape: reproducible run to run.
// DW is dw's storage: T, or float for bf16 T (the fp32 main gradient): the total is rounded to
// dw's compute type (fp32) and added in it, then stored with no bf16 rounding, as the CPU does.
constexpr int kDwCols = 32;
constexpr int kDwLanes = 16;

template <typename T, typename DW>
__global__ void __launch_bounds__(kDwCols* kDwLanes)
    rmsnorm_backward_dw_kernel(const T* x, const T* rstd, const T* dy, DW* dw, int64_t rows,
                               int64_t hidden) {
  using C = compute_t<DW>;
  __shared__ double lane_sum[kDwLanes][kDwCols];
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kDwCols + threadIdx.x;
  double sum = 0;
  if (h < hidden) {
    for (int64_t n = threadIdx.y; n < rows; n += kDwLanes) {
      double xhat = load_as<double>(x, n * hidden + h) * load_as<double>(rstd, n);
      sum += load_as<double>(dy, n * hidden + h) * xhat;
    }
  }
  lane_sum[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && h < hidden) {
    double total = 0;
    for (int l = 0; l < kDwLanes; ++l) total += lane_sum[l][threadIdx.x];
    store_from(dw, h, load_as<C>(dw, h) + static_cast<C>(total));
  }
}

}  // namespace

void rmsnorm_forward_cuda(const Tensor& x, const Tensor& w, double eps, const Tensor& y,
                          const Tensor& rstd, Stream& stream, NormWeightOrder order) {
  const char* op = "rmsnorm_forward_cuda";
  check_rmsnorm_forward_args(op, x, w, eps, y, rstd);
  const int64_t rows = x.size(0), hidden = x.size(1);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (rows == 0) return;  // hidden == 0 still writes rstd = 1 / sqrt(eps), as the CPU does
    rmsnorm_forward_kernel<T><<<row_blocks(rows), row_threads(hidden), 0, cuda::native(stream)>>>(
        static_cast<const T*>(x.data()), static_cast<const T*>(w.data()), eps,
        static_cast<T*>(y.data()), static_cast<T*>(rstd.data()), rows, hidden,
        order == NormWeightOrder::weight_after_cast);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void rmsnorm_backward_cuda(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           const Tensor& dx, const Tensor& dw, Stream& stream) {
  const char* op = "rmsnorm_backward_cuda";
  check_rmsnorm_backward_args(op, x, w, rstd, dy, dx, dw);
  const int64_t rows = x.size(0), hidden = x.size(1);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (rows == 0 || hidden == 0) return;  // dx is empty and dw += 0
    cudaStream_t s = cuda::native(stream);
    // dw first: it reads x and dy, which dx may overwrite (dx may be x or dy).
    const unsigned dw_blocks = static_cast<unsigned>((hidden + kDwCols - 1) / kDwCols);
    auto launch_dw = [&](auto dw_zero) {
      using DW = decltype(dw_zero);
      rmsnorm_backward_dw_kernel<T, DW><<<dw_blocks, dim3(kDwCols, kDwLanes), 0, s>>>(
          static_cast<const T*>(x.data()), static_cast<const T*>(rstd.data()),
          static_cast<const T*>(dy.data()), static_cast<DW*>(dw.data()), rows, hidden);
    };
    // dw in x's dtype, or f32 for a bf16 x (checked above).
    cuda::with_accumulator<T>(dw.dtype(), launch_dw);
    MOEPEAK_CUDA_LAUNCH_CHECK();
    rmsnorm_backward_dx_kernel<T><<<row_blocks(rows), row_threads(hidden), 0, s>>>(
        static_cast<const T*>(x.data()), static_cast<const T*>(w.data()),
        static_cast<const T*>(rstd.data()), static_cast<const T*>(dy.data()),
        static_cast<T*>(dx.data()), rows, hidden);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
