// dsinks of CUDA attention with sinks (see ops/cuda/attention_sinks.h): a block per query head sums
// -exp(s_h - lse) D over the B T rows in double, in a fixed order, and adds the total once.
//
//   out, dout: (B, T, nh, dv)   lse: (B, nh, T) compute dtype   sinks: (nh) q's dtype
//   dsinks: (nh) f32 for bf16 storage, else the storage's dtype; accumulated (+=)
//
// Test: ctest -L cuda -R test_backend_ops (the attention cases with sinks).
#include "ops/cuda/attention_sinks.h"

#include "ops/cuda/cuda_common.cuh"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::warp_sum;

// dsinks. Grid (nh): block h owns dsinks[h]. The B T rows (b, t) are taken kSinkRows at a time,
// warp w the steps w, w + kSinkWarps, ... in order; a row's D = dout . out is spread over the
// lanes (columns lane + 32 i; the step's rows interleaved, so a lane has 2 kSinkRows loads in
// flight) and summed by a shuffle tree, and every lane sums exp(s_h - lse) D of its warp's rows in
// row order. Then the warps' sums are added in warp order (block_sum, lane 0's) and thread 0 adds
// the negated total once. All in double, in a fixed order: bitwise reproducible, no atomics.
// A = dsinks' dtype (f32 for bf16 storage); d = dv, the width of out and dout.
constexpr int kSinkThreads = 1024;
constexpr int kSinkWarps = kSinkThreads / 32;
constexpr int kSinkRows = 4;
template <typename T, typename A>
__global__ void __launch_bounds__(kSinkThreads)
    attention_dsinks_kernel(const T* out, const T* dout, const compute_t<T>* lse, const T* sinks,
                            A* dsinks, int64_t batch, int64_t seq, int heads, int d) {
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = blockIdx.x;
  const int64_t rows = batch * seq;
  const double sink = load_as<double>(sinks, h);
  double sum = 0;
  for (int64_t bt0 = int64_t(warp) * kSinkRows; bt0 < rows;
       bt0 += int64_t(kSinkWarps) * kSinkRows) {
    int64_t base[kSinkRows];  // (b, t, h) of a (B, T, nh, d) tensor, row bt = b T + t
    double partial[kSinkRows];
#pragma unroll
    for (int j = 0; j < kSinkRows; ++j) {
      base[j] = ((bt0 + j) * heads + h) * d;
      partial[j] = 0;
    }
    for (int c = lane; c < d; c += 32) {
#pragma unroll
      for (int j = 0; j < kSinkRows; ++j)
        if (bt0 + j < rows)
          partial[j] += load_as<double>(dout, base[j] + c) * load_as<double>(out, base[j] + c);
    }
#pragma unroll
    for (int j = 0; j < kSinkRows; ++j) {
      const double delta = warp_sum(partial[j]);  // uniform: every lane takes part
      if (bt0 + j < rows) {
        const int64_t b = (bt0 + j) / seq, t = bt0 + j - b * seq;
        sum += exp(sink - static_cast<double>(lse[(b * heads + h) * seq + t])) * delta;
      }
    }
  }
  const double total = cuda::block_sum(lane == 0 ? sum : 0.0, scratch);
  if (threadIdx.x == 0) dsinks[h] = static_cast<A>(static_cast<double>(dsinks[h]) - total);
}

}  // namespace

// dsinks += -sum_{b,t} exp(sinks - lse) D (attention_dsinks_kernel), one block per query head.
void attention_dsinks_cuda(const Tensor& q, const Tensor& out, const Tensor& lse,
                           const Tensor& dout, const Tensor& sinks, const Tensor& dsinks,
                           Stream& stream, const char* op) {
  const unsigned grid = static_cast<unsigned>(q.size(2));  // nh * dv < 2^29 (the op's checks)
  cuda::dispatch_storage(q.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    cuda::with_accumulator<T>(dsinks.dtype(), [&](auto acc_zero) {
      using A = decltype(acc_zero);
      auto kernel = attention_dsinks_kernel<T, A>;
      kernel<<<grid, kSinkThreads, 0, cuda::native(stream)>>>(
          static_cast<const T*>(out.data()), static_cast<const T*>(dout.data()),
          static_cast<const compute_t<T>*>(lse.data()), static_cast<const T*>(sinks.data()),
          static_cast<A*>(dsinks.data()), q.size(0), q.size(1), static_cast<int>(q.size(2)),
          static_cast<int>(out.size(3)));
      MOEPEAK_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace moepeak::ops
