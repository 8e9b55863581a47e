// CUDA gather / scatter-add / weighted combine of rows by an i32 index (see ops/permute.h).
//
// scatter_add_rows and combine_rows add several routed rows into one token row. They do it
// without atomics, in the CPU's order: the grid tiles the destination (N, H) into row ranges
// (and column ranges when N is small), each block scans the whole index in chunks of blockDim
// positions, compacts the positions that land in its rows (increasing i, by ballot), and applies
// them one after another, thread t always owning the same columns. So each destination element
// is read-modified-written by one thread in increasing i: deterministic, and with the CPU's
// rounding for f32. A run of consecutive hits on one row (within a chunk) is summed in registers
// and stored once, which for bf16 storage means one rounding per run rather than per addition.
// The price is that every block reads the whole index (M i32s, from L2): the grid is sized to ~4
// blocks per SM, so that is 4 * SMs * M * 4 bytes, small beside the M * H elements moved for H in
// the hundreds or more. A single destination row (N = 1) serialises its M additions by
// construction (the order is the contract).
//
// gather_rows is one block per routed row (one thread per element for rows narrower than a
// warp) and combine_rows_backward one block per routed row; the backward's dot product
// is a block reduction in double taken before the row of dy (which may be y) is written.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_permute.cpp).
#include <algorithm>

#include "ops/cuda/cuda_common.cuh"
#include "ops/permute.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

// Round-to-nearest multiply and add that nvcc does not contract into an FMA, so a += w * y
// rounds as the CPU's loop does.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// Threads for a block that walks the H columns of a row: a multiple of 32 up to kThreads.
int threads_for_columns(int64_t hidden) {
  int64_t t = (hidden + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(t, 32, cuda::kThreads));
}

int multiprocessors() {
  int device = 0, sms = 0;
  MOEPEAK_CUDA_CHECK(cudaGetDevice(&device));
  MOEPEAK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::max(sms, 1);
}

template <typename T>
__global__ void gather_rows_kernel(const T* src, const int32_t* index, T* dst, int64_t routed,
                                   int64_t rows, int64_t hidden) {
  for (int64_t i = blockIdx.x; i < routed; i += gridDim.x) {
    const int64_t r = index[i];
    T* to = dst + i * hidden;
    if (r < 0 || r >= rows) {  // skipped: a zero row (ops/permute.h)
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) to[h] = T(0.0f);
      continue;
    }
    const T* from = src + r * hidden;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) to[h] = from[h];
  }
}

// The same for narrow rows (H < 32, e.g. the (M, 1) routing weights): one thread per element.
template <typename T>
__global__ void gather_narrow_rows_kernel(const T* src, const int32_t* index, T* dst,
                                          int64_t routed, int64_t rows, int64_t hidden) {
  MOEPEAK_GRID_STRIDE(e, routed * hidden) {
    const int64_t i = e / hidden, h = e - i * hidden;
    const int64_t r = index[i];
    dst[e] = r >= 0 && r < rows ? src[r * hidden + h] : T(0.0f);
  }
}

// dst[index[i]] += (weight[i] *) src[i] for i in increasing order; see the file comment. Block
// (bx, by) owns destination rows [bx * rows_per_block, +rows_per_block) (grid-strided) and columns
// [by * cols_per_block, +cols_per_block). blockDim.x is kThreads.
template <typename T, bool kWeighted>
__global__ void __launch_bounds__(cuda::kThreads)
    scatter_rows_kernel(const T* src, const int32_t* index, const T* weight, T* dst, int64_t routed,
                        int64_t rows, int64_t hidden, int64_t rows_per_block,
                        int64_t cols_per_block) {
  using C = compute_t<T>;
  __shared__ int hits[cuda::kThreads];          // chunk offsets of the positions this block applies
  __shared__ int32_t hit_rows[cuda::kThreads];  // and their destination rows
  __shared__ int warp_hits[cuda::kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t c0 = blockIdx.y * cols_per_block;
  const int64_t c1 = c0 + cols_per_block < hidden ? c0 + cols_per_block : hidden;
  for (int64_t lo = blockIdx.x * rows_per_block; lo < rows; lo += gridDim.x * rows_per_block) {
    const int64_t hi = lo + rows_per_block < rows ? lo + rows_per_block : rows;
    for (int64_t base = 0; base < routed; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      bool mine = false;
      int32_t r = -1;
      if (i < routed) {
        r = index[i];
        mine = r >= lo && r < hi;  // an index outside [0, N) is in no block's range: skipped
      }
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (lane == 0) warp_hits[warp] = __popc(ballot);
      __syncthreads();
      int before = 0, count = 0;
      for (int w = 0; w < warps; ++w) {
        const int c = warp_hits[w];
        if (w < warp) before += c;
        count += c;
      }
      if (mine) {
        const int slot = before + __popc(ballot & ((1u << lane) - 1u));
        hits[slot] = threadIdx.x;
        hit_rows[slot] = r;
      }
      __syncthreads();
      // A run of consecutive hits on one row is summed in registers and stored once (the same
      // additions in the same order; with bf16 storage one rounding per run, not per add).
      for (int j = 0; j < count;) {
        const int32_t row = hit_rows[j];
        int end = j + 1;
        while (end < count && hit_rows[end] == row) ++end;
        T* to = dst + static_cast<int64_t>(row) * hidden;
        for (int64_t h = c0 + threadIdx.x; h < c1; h += blockDim.x) {
          C acc = load_as<C>(to, h);
          for (int jj = j; jj < end; ++jj) {
            const int64_t s = base + hits[jj];
            const C y = load_as<C>(src + s * hidden, h);
            if constexpr (kWeighted) {
              acc = add_rn(acc, mul_rn(load_as<C>(weight, s), y));
            } else {
              acc = add_rn(acc, y);
            }
          }
          store_from(to, h, acc);
        }
        j = end;
      }
      __syncthreads();  // hits, hit_rows and warp_hits are rewritten for the next chunk
    }
  }
}

template <typename T>
__global__ void combine_rows_backward_kernel(const T* dout, const T* y, const int32_t* index,
                                             const T* weight, T* dy, T* dweight, int64_t routed,
                                             int64_t rows, int64_t hidden) {
  using C = compute_t<T>;
  __shared__ double scratch[32];
  for (int64_t i = blockIdx.x; i < routed; i += gridDim.x) {
    const int64_t r = index[i];  // the same for the whole block
    T* dyr = dy + i * hidden;
    if (r < 0 || r >= rows) {  // skipped: zeros (ops/permute.h)
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) store_from(dyr, h, C(0));
      if (threadIdx.x == 0) store_from(dweight, i, C(0));
      continue;
    }
    const T* g = dout + r * hidden;
    const T* yr = y + i * hidden;
    double dot = 0;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      dot += load_as<double>(g, h) * load_as<double>(yr, h);
    }
    // block_sum synchronises the block after every thread's reads of y[i]: dy may alias y.
    dot = cuda::block_sum(dot, scratch);
    const C w = load_as<C>(weight, i);
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      store_from(dyr, h, mul_rn(w, load_as<C>(g, h)));
    }
    if (threadIdx.x == 0) store_from(dweight, i, dot);
  }
}

template <bool kWeighted>
void launch_scatter(const char* op, const Tensor& src, const Tensor& index, const Tensor* weight,
                    const Tensor& dst, Stream& stream) {
  const int64_t routed = index.size(0), rows = dst.size(0), hidden = dst.size(1);
  if (routed == 0 || rows == 0 || hidden == 0) return;
  const int64_t target = 4 * static_cast<int64_t>(multiprocessors());
  int64_t row_tiles = std::min(rows, target);
  const int64_t rows_per_block = (rows + row_tiles - 1) / row_tiles;
  row_tiles = (rows + rows_per_block - 1) / rows_per_block;
  // Few destination rows: split the columns too (at least kThreads columns a block).
  int64_t col_tiles = std::max<int64_t>(
      1, std::min((hidden + cuda::kThreads - 1) / cuda::kThreads, target / row_tiles));
  const int64_t cols_per_block = (hidden + col_tiles - 1) / col_tiles;
  col_tiles = (hidden + cols_per_block - 1) / cols_per_block;
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
  cuda::dispatch_storage(dst.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    scatter_rows_kernel<T, kWeighted><<<grid, cuda::kThreads, 0, cuda::native(stream)>>>(
        static_cast<const T*>(src.data()), static_cast<const int32_t*>(index.data()),
        weight != nullptr ? static_cast<const T*>(weight->data()) : nullptr,
        static_cast<T*>(dst.data()), routed, rows, hidden, rows_per_block, cols_per_block);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void gather_rows_cuda(const Tensor& src, const Tensor& index, const Tensor& dst, Stream& stream) {
  const char* op = "gather_rows_cuda";
  check_gather_rows_args(op, src, index, dst);
  const int64_t routed = index.size(0), rows = src.size(0), hidden = src.size(1);
  if (routed == 0 || hidden == 0) return;
  cuda::dispatch_storage(src.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* sp = static_cast<const T*>(src.data());
    const int32_t* ip = static_cast<const int32_t*>(index.data());
    T* dp = static_cast<T*>(dst.data());
    if (hidden < 32) {
      gather_narrow_rows_kernel<T>
          <<<cuda::grid_for(routed * hidden), cuda::kThreads, 0, cuda::native(stream)>>>(
              sp, ip, dp, routed, rows, hidden);
    } else {
      gather_rows_kernel<T>
          <<<cuda::grid_for(routed, 1), threads_for_columns(hidden), 0, cuda::native(stream)>>>(
              sp, ip, dp, routed, rows, hidden);
    }
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void scatter_add_rows_cuda(const Tensor& src, const Tensor& index, const Tensor& dst,
                           Stream& stream) {
  const char* op = "scatter_add_rows_cuda";
  check_scatter_add_rows_args(op, src, index, dst);
  launch_scatter<false>(op, src, index, nullptr, dst, stream);
}

void combine_rows_cuda(const Tensor& y, const Tensor& index, const Tensor& weight,
                       const Tensor& out, Stream& stream) {
  const char* op = "combine_rows_cuda";
  check_combine_rows_args(op, y, index, weight, out);
  launch_scatter<true>(op, y, index, &weight, out, stream);
}

void combine_rows_backward_cuda(const Tensor& dout, const Tensor& y, const Tensor& index,
                                const Tensor& weight, const Tensor& dy, const Tensor& dweight,
                                Stream& stream) {
  const char* op = "combine_rows_backward_cuda";
  check_combine_rows_backward_args(op, dout, y, index, weight, dy, dweight);
  const int64_t routed = index.size(0), rows = dout.size(0), hidden = dout.size(1);
  if (routed == 0) return;
  cuda::dispatch_storage(dout.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    combine_rows_backward_kernel<T>
        <<<cuda::grid_for(routed, 1), threads_for_columns(hidden), 0, cuda::native(stream)>>>(
            static_cast<const T*>(dout.data()), static_cast<const T*>(y.data()),
            static_cast<const int32_t*>(index.data()), static_cast<const T*>(weight.data()),
            static_cast<T*>(dy.data()), static_cast<T*>(dweight.data()), routed, rows, hidden);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
