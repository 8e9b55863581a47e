// CUDA element-wise helpers (see ops/elementwise.h): add and scale are grid-stride kernels,
// sum_squares a block per part (deterministic, no atomics), copy a cudaMemcpyAsync,
// scale_rows and row_dot a block per row (row_dot reduces in double).
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_elementwise.cpp).
#include <cstdint>

#include "ops/cuda/cuda_common.cuh"
#include "ops/elementwise.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::row_blocks;
using cuda::row_threads;
using cuda::store_from;

// out may be a or b: each element is read before the same thread writes it.
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) { store_from(out, i, load_as<C>(a, i) + load_as<C>(b, i)); }
}

template <typename T>
__global__ void scale_kernel(T* x, compute_t<T> factor, int64_t n) {
  using C = compute_t<T>;
  MOEPEAK_GRID_STRIDE(i, n) { store_from(x, i, load_as<C>(x, i) * factor); }
}

// sum_squares: block p of P sums part p = [p c, min(n, (p + 1) c)) with kSumThreads threads, so
// the order of the additions depends only on the tensor's length, address alignment and P, never
// on scheduling, and out[p] is updated by one thread with no atomics. Elements are read 16 bytes
// at a time (kSumUnroll such loads in flight per thread, 64 KiB per block: an SM's bandwidth is
// bounded by the bytes in flight) from the part's first 16-byte-aligned element; the unaligned
// head and the tail one at a time.
constexpr int kSumThreads = 512;
constexpr int kSumUnroll = 8;

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

template <typename T>
__device__ __forceinline__ double sum_sq(const Vec16<T>& u) {
  double s = 0;
#pragma unroll
  for (int e = 0; e < Vec16<T>::kCount; ++e) {
    double d = load_as<double>(u.v, e);
    s += d * d;
  }
  return s;
}

template <typename T>
__global__ void __launch_bounds__(kSumThreads)
    sum_squares_kernel(const T* whole, int64_t total, int64_t part, double* out) {
  __shared__ double scratch[32];
  constexpr int kCount = Vec16<T>::kCount;
  const int64_t stride = blockDim.x;
  // This block's part: x = whole + lo, n elements, head of them before the first 16-byte
  // boundary (whole is at least element-aligned).
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * part;
  const int64_t n = lo >= total ? 0 : total - lo < part ? total - lo : part;
  const T* x = whole + lo;
  const auto misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x) % 16);
  const int64_t to_boundary = misalign == 0 ? 0 : (16 - misalign) / static_cast<int64_t>(sizeof(T));
  const int64_t head = to_boundary < n ? to_boundary : n;
  double sum = 0;
  // x[0, head): before the first 16-byte boundary.
  for (int64_t i = threadIdx.x; i < head; i += stride) {
    double d = load_as<double>(x, i);
    sum += d * d;
  }
  // x[head, head + vecs * kCount): 16-byte vectors.
  const int64_t vecs = (n - head) / kCount;
  const Vec16<T>* xv = reinterpret_cast<const Vec16<T>*>(x + head);
  int64_t v = threadIdx.x;
  for (; v + (kSumUnroll - 1) * stride < vecs; v += kSumUnroll * stride) {
    Vec16<T> u[kSumUnroll];  // all loads issued before the first addition
#pragma unroll
    for (int k = 0; k < kSumUnroll; ++k) u[k] = xv[v + k * stride];
#pragma unroll
    for (int k = 0; k < kSumUnroll; ++k) sum += sum_sq(u[k]);
  }
  for (; v < vecs; v += stride) sum += sum_sq(xv[v]);
  // The tail after the last whole vector.
  for (int64_t i = head + vecs * kCount + threadIdx.x; i < n; i += stride) {
    double d = load_as<double>(x, i);
    sum += d * d;
  }
  sum = cuda::block_sum(sum, scratch);
  if (threadIdx.x == 0 && n > 0) out[blockIdx.x] += sum;
}

// A block per row (grid-stride over rows), threads over the columns.
template <typename T>
__global__ void scale_rows_kernel(T* x, const T* w, int64_t rows, int64_t cols) {
  using C = compute_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const C factor = load_as<C>(w, r);
    T* xr = x + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      store_from(xr, c, load_as<C>(xr, c) * factor);
    }
  }
}

// A block per row: the dot in double (block reduction), rounded to the compute type, then
// written or added to out[r] and rounded once to out's storage type (TO: T, or float beside bf16).
template <typename T, typename TO>
__global__ void row_dot_kernel(const T* a, const T* b, TO* out, int64_t rows, int64_t cols,
                               bool accumulate) {
  using C = compute_t<T>;
  __shared__ double scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* ar = a + r * cols;
    const T* br = b + r * cols;
    double dot = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      dot += load_as<double>(ar, c) * load_as<double>(br, c);
    }
    dot = cuda::block_sum(dot, scratch);
    if (threadIdx.x == 0) {
      const C d = static_cast<C>(dot);
      store_from(out, r, accumulate ? load_as<C>(out, r) + d : d);
    }
  }
}

}  // namespace

void add_cuda(const Tensor& a, const Tensor& b, const Tensor& out, Stream& stream) {
  const char* op = "add_cuda";
  check_add_args(op, a, b, out);
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = a.numel();
    if (n == 0) return;
    add_kernel<T><<<cuda::grid_for(n), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
        static_cast<T*>(out.data()), n);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void scale_cuda(const Tensor& x, double alpha, Stream& stream) {
  const char* op = "scale_cuda";
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = x.numel();
    if (n == 0) return;
    scale_kernel<T><<<cuda::grid_for(n), cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<T*>(x.data()), static_cast<compute_t<T>>(alpha), n);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void sum_squares_cuda(const Tensor& x, const Tensor& out, Stream& stream) {
  const char* op = "sum_squares_cuda";
  check_sum_squares_args(op, out);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const int64_t n = x.numel(), parts = out.size(0);
    if (n == 0) return;  // out[p] += 0
    MOEPEAK_CHECK(parts <= (int64_t{1} << 31) - 1, op, ": ", parts,
                  " parts is past the grid limit");
    sum_squares_kernel<T><<<static_cast<unsigned>(parts), kSumThreads, 0, cuda::native(stream)>>>(
        static_cast<const T*>(x.data()), n, (n + parts - 1) / parts,
        static_cast<double*>(out.data()));
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void copy_cuda(const Tensor& src, const Tensor& dst, Stream& stream) {
  check_copy_args("copy_cuda", src, dst);
  if (src.nbytes() == 0 || src.data() == dst.data()) return;
  // cudaMemcpyDefault: the pointers say where the bytes are (device memory, or pinned host memory
  // under unified addressing).
  MOEPEAK_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDefault,
                                     cuda::native(stream)));
}

void scale_rows_cuda(const Tensor& x, const Tensor& weight, Stream& stream) {
  const char* op = "scale_rows_cuda";
  check_scale_rows_args(op, x, weight);
  const int64_t rows = x.size(0), cols = x.size(1);
  cuda::dispatch_storage(x.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (rows == 0 || cols == 0) return;
    scale_rows_kernel<T><<<row_blocks(rows), row_threads(cols), 0, cuda::native(stream)>>>(
        static_cast<T*>(x.data()), static_cast<const T*>(weight.data()), rows, cols);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void row_dot_cuda(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate,
                  Stream& stream) {
  const char* op = "row_dot_cuda";
  check_row_dot_args(op, a, b, out);
  const int64_t rows = a.size(0), cols = a.size(1);
  cuda::dispatch_storage(a.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (rows == 0) return;  // cols == 0 still writes out = 0 (or leaves it, with accumulate)
    // out in a's dtype, or an f32 accumulator beside bf16 (checked above).
    cuda::with_accumulator<T>(out.dtype(), [&](auto out_zero) {
      using O = decltype(out_zero);
      row_dot_kernel<T, O><<<row_blocks(rows), row_threads(cols), 0, cuda::native(stream)>>>(
          static_cast<const T*>(a.data()), static_cast<const T*>(b.data()),
          static_cast<O*>(out.data()), rows, cols, accumulate);
    });
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
