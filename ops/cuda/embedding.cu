// CUDA embedding (see ops/embedding.h): the forward copies a weight row per token (a block per
// token); the backward is deterministic without atomics: each block owns a range of weight rows,
// scans the ids in increasing n and adds the dout rows that land in its range in that order, each
// column by one thread, so every dweight element sees the CPU's additions in the CPU's order
// (an f32 dweight of bf16 dout, the fp32 main gradient, adds in fp32 with no bf16 rounding).
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_embedding.cpp).
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_common.cuh"
#include "ops/embedding.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

template <typename C>
__device__ __forceinline__ C quiet_nan();
template <>
__device__ __forceinline__ float quiet_nan<float>() {
  return __int_as_float(0x7fc00000);
}
template <>
__device__ __forceinline__ double quiet_nan<double>() {
  return __longlong_as_double(0x7ff8000000000000ll);
}

// A block per token (grid-stride over tokens): out[n] = weight[ids[n]], or NaN for an id outside
// [0, vocab).
template <typename T>
__global__ void embedding_forward_kernel(const int64_t* ids, const T* weight, T* out,
                                         int64_t tokens, int64_t vocab, int64_t hidden) {
  using C = compute_t<T>;
  for (int64_t n = blockIdx.x; n < tokens; n += gridDim.x) {
    const int64_t id = ids[n];
    T* dst = out + n * hidden;
    if (id < 0 || id >= vocab) {
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
        store_from(dst, h, quiet_nan<C>());
      }
      continue;
    }
    const T* src = weight + id * hidden;
    for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
  }
}

// Block b owns weight rows [b * rows_per_block, (b + 1) * rows_per_block). It reads the ids
// kBackwardThreads at a time, lists the positions whose id is in its range in increasing n
// (ballot + per-warp counts), then adds those dout rows one after another, thread t owning
// columns t, t + kBackwardThreads, ...: each element of dweight is updated by one thread, in
// increasing n. An id outside [0, vocab) is in no block's range and is skipped. The result does
// not depend on rows_per_block. DW is dweight's storage: T, or float for bf16 T (the fp32 main
// gradient: each += in fp32 on the bf16 values, stored with no bf16 rounding).
constexpr int kBackwardThreads = 256;

template <typename T, typename DW>
__global__ void __launch_bounds__(kBackwardThreads)
    embedding_backward_kernel(const int64_t* __restrict__ ids, const T* __restrict__ dout,
                              DW* __restrict__ dweight, int64_t tokens, int64_t vocab,
                              int64_t hidden, int64_t rows_per_block) {
  using C = compute_t<DW>;
  constexpr int kWarps = kBackwardThreads / 32;
  __shared__ int64_t hit_n[kBackwardThreads];    // positions in this chunk, increasing
  __shared__ int64_t hit_row[kBackwardThreads];  // their ids
  __shared__ int warp_hits[kWarps];
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < vocab ? row_begin + rows_per_block : vocab;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t chunk = 0; chunk < tokens; chunk += kBackwardThreads) {
    const int64_t n = chunk + threadIdx.x;
    const int64_t id = n < tokens ? ids[n] : -1;
    const bool hit = id >= row_begin && id < row_end;
    const unsigned mask = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_hits[warp] = __popc(mask);
    __syncthreads();
    int before = 0, count = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? warp_hits[w] : 0;
      count += warp_hits[w];
    }
    if (hit) {
      const int slot = before + __popc(mask & ((1u << lane) - 1u));
      hit_n[slot] = n;
      hit_row[slot] = id;
    }
    __syncthreads();
    for (int k = 0; k < count; ++k) {
      const T* src = dout + hit_n[k] * hidden;
      DW* dst = dweight + hit_row[k] * hidden;
      for (int64_t h = threadIdx.x; h < hidden; h += kBackwardThreads) {
        store_from(dst, h, load_as<C>(dst, h) + load_as<C>(src, h));
      }
    }
    __syncthreads();  // hit_n, hit_row and warp_hits are rewritten by the next chunk
  }
}

}  // namespace

void embedding_forward_cuda(const Tensor& ids, const Tensor& weight, const Tensor& out,
                            Stream& stream) {
  const char* op = "embedding_forward_cuda";
  check_embedding_forward_args(op, ids, weight, out);
  const int64_t tokens = ids.size(0), vocab = weight.size(0), hidden = weight.size(1);
  cuda::dispatch_storage(weight.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (tokens == 0 || hidden == 0) return;
    const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(tokens, 1, cuda::kMaxGridBlocks));
    embedding_forward_kernel<T><<<blocks, cuda::row_threads(hidden), 0, cuda::native(stream)>>>(
        static_cast<const int64_t*>(ids.data()), static_cast<const T*>(weight.data()),
        static_cast<T*>(out.data()), tokens, vocab, hidden);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void embedding_backward_cuda(const Tensor& ids, const Tensor& dout, const Tensor& dweight,
                             Stream& stream) {
  const char* op = "embedding_backward_cuda";
  check_embedding_backward_args(op, ids, dout, dweight);
  const int64_t tokens = ids.size(0), vocab = dweight.size(0), hidden = dweight.size(1);
  cuda::dispatch_storage(dout.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (tokens == 0 || vocab == 0 || hidden == 0) return;
    // About kTargetBlocks blocks: each scans all the ids (tokens * 8 bytes, from L2), so more
    // blocks spread the row additions wider but scan more.
    constexpr int64_t kTargetBlocks = 512;
    const int64_t rows_per_block = (vocab + kTargetBlocks - 1) / kTargetBlocks;
    const auto blocks = static_cast<unsigned>((vocab + rows_per_block - 1) / rows_per_block);
    auto launch = [&](auto dw_zero) {
      using DW = decltype(dw_zero);
      embedding_backward_kernel<T, DW><<<blocks, kBackwardThreads, 0, cuda::native(stream)>>>(
          static_cast<const int64_t*>(ids.data()), static_cast<const T*>(dout.data()),
          static_cast<DW*>(dweight.data()), tokens, vocab, hidden, rows_per_block);
    };
    // dweight in dout's dtype, or f32 for a bf16 dout (checked above).
    cuda::with_accumulator<T>(dweight.dtype(), launch);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
