// CUDA router (see ops/router.h): one warp per token. The forward takes the row max, sums the
// exponentials in double, writes probs rounded to the storage dtype, then selects the top k by
// repeated arg-max over the rounded probs with ties to the lower expert index (ops/cpu/router.cpp's
// rule), and renormalises in double when asked. topk_then_softmax (gpt-oss) has its own
// forward kernel: the same arg-max over the logits, a softmax over the k chosen, then probs. The
// backwards are warp-per-row too, row sums in double.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_router.cpp).
#include <cmath>

#include "ops/cuda/cuda_common.cuh"
#include "ops/router.h"

namespace moepeak::ops {
namespace {

using cuda::compute_t;
using cuda::load_as;
using cuda::store_from;

constexpr int kWarpsPerBlock = cuda::kThreads / 32;

// Blocks for one warp per row.
unsigned grid_for_rows(int64_t rows) { return cuda::grid_for(rows, kWarpsPerBlock); }

// The selection order: (a_v, a_i) comes before (b_v, b_i) when a is more probable, or equally
// probable with a lower index. NaN comes after every number (so an all-NaN row picks 0, 1, ...
// as the CPU's strict '>' does). Indices are distinct, so this is a strict total order.
template <typename C>
__device__ __forceinline__ bool ranks_before(C a_v, int a_i, C b_v, int b_i) {
  const bool a_nan = isnan(a_v), b_nan = isnan(b_v);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a_v != b_v) return a_v > b_v;
  return a_i < b_i;
}

// The next pick of a warp's repeated arg-max over v[0, E): the first expert in selection order
// after (prev_v, prev_i) (prev_i < 0: the first overall), into best_v and best_i on every lane.
// Each lane scans experts lane, lane + 32, ..., then the warp reduces.
template <typename T, typename C>
__device__ __forceinline__ void warp_next_pick(const T* v, int experts, int lane, C prev_v,
                                               int prev_i, C& best_v, int& best_i) {
  for (int e = lane; e < experts; e += 32) {
    C x = load_as<C>(v, e);
    if (prev_i >= 0 && !ranks_before(prev_v, prev_i, x, e)) continue;  // already chosen
    if (best_i < 0 || ranks_before(x, e, best_v, best_i)) {
      best_v = x;
      best_i = e;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    C other_v = __shfl_xor_sync(0xffffffffu, best_v, offset);
    int other_i = __shfl_xor_sync(0xffffffffu, best_i, offset);
    if (other_i >= 0 && (best_i < 0 || ranks_before(other_v, other_i, best_v, best_i))) {
      best_v = other_v;
      best_i = other_i;
    }
  }
}

template <typename T>
__global__ void router_forward_kernel(const T* logits, T* probs, int32_t* topk_index,
                                      T* topk_weight, int64_t tokens, int experts, int k,
                                      bool renormalize) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const T* l = logits + n * experts;
    T* p = probs + n * experts;
    C row_max = -INFINITY;
    for (int e = lane; e < experts; e += 32) row_max = fmax(row_max, load_as<C>(l, e));
    row_max = cuda::warp_max(row_max);
    double sum = 0;
    for (int e = lane; e < experts; e += 32) {
      sum += static_cast<double>(exp(load_as<C>(l, e) - row_max));
    }
    sum = cuda::warp_sum(sum);
    // Each lane writes and later reads back only its own experts e = lane + 32 i, so probs may
    // be logits itself and no lane reads another lane's stores.
    for (int e = lane; e < experts; e += 32) {
      C ex = exp(load_as<C>(l, e) - row_max);
      store_from(p, e, static_cast<double>(ex) / sum);
    }

    // Top k: the j-th pick is the first in selection order after the (j-1)-th.
    int32_t* idx = topk_index + n * k;
    T* w = topk_weight + n * k;
    C prev_v = 0;
    int prev_i = -1;
    double chosen_sum = 0;
    for (int j = 0; j < k; ++j) {
      C best_v = 0;
      int best_i = -1;
      warp_next_pick(p, experts, lane, prev_v, prev_i, best_v, best_i);  // the stored probs
      // Every lane holds the same pick (k <= E, so there always is one). Slot j belongs to lane
      // j % 32, which parks the chosen prob in w[j] (exact: it is a stored value) until the sum
      // of all k is known; without renormalisation that is the weight.
      if (lane == (j & 31)) {
        idx[j] = best_i;
        store_from(w, j, best_v);
      }
      chosen_sum += static_cast<double>(best_v);
      prev_v = best_v;
      prev_i = best_i;
    }
    if (renormalize) {
      for (int j = lane; j < k; j += 32) {
        store_from(w, j, load_as<double>(w, j) / chosen_sum);
      }
    }
  }
}

// topk_then_softmax (gpt-oss): the row's softmax sum as above, the top k of the LOGITS by the
// same arg-max, the weights exp(l_j - l_top) / (their sum in double, added in slot order on every
// lane), and then probs. Every lane has read all the logits it needs (the picks and its slots'
// chosen logits) before the __syncwarp, and writes only its own experts' probs after it, so
// probs may be logits itself.
template <typename T>
__global__ void router_topk_then_softmax_kernel(const T* logits, T* probs, int32_t* topk_index,
                                                T* topk_weight, int64_t tokens, int experts,
                                                int k) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const T* l = logits + n * experts;
    T* p = probs + n * experts;
    C row_max = -INFINITY;
    for (int e = lane; e < experts; e += 32) row_max = fmax(row_max, load_as<C>(l, e));
    row_max = cuda::warp_max(row_max);
    double sum = 0;
    for (int e = lane; e < experts; e += 32) {
      sum += static_cast<double>(exp(load_as<C>(l, e) - row_max));
    }
    sum = cuda::warp_sum(sum);

    int32_t* idx = topk_index + n * k;
    T* w = topk_weight + n * k;
    C prev_v = 0, top = 0;
    int prev_i = -1;
    double chosen_sum = 0;
    for (int j = 0; j < k; ++j) {
      C best_v = 0;
      int best_i = -1;
      warp_next_pick(l, experts, lane, prev_v, prev_i, best_v, best_i);  // the stored logits
      if (lane == (j & 31)) idx[j] = best_i;  // slot j belongs to lane j % 32
      if (j == 0) top = best_v;
      chosen_sum += static_cast<double>(exp(best_v - top));
      prev_v = best_v;
      prev_i = best_i;
    }
    // Each lane's slots j = lane + 32 i, whose idx[j] it wrote itself.
    for (int j = lane; j < k; j += 32) {
      const C e = exp(load_as<C>(l, idx[j]) - top);
      store_from(w, j, static_cast<double>(e) / chosen_sum);
    }
    __syncwarp();
    for (int e = lane; e < experts; e += 32) {
      C ex = exp(load_as<C>(l, e) - row_max);
      store_from(p, e, static_cast<double>(ex) / sum);
    }
  }
}

template <typename T>
__global__ void router_backward_kernel(const int32_t* topk_index, const T* topk_weight,
                                       const T* dtopk_weight, T* dlogits, int64_t tokens,
                                       int experts, int k) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const int32_t* idx = topk_index + n * k;
    const T* w = topk_weight + n * k;
    const T* dw = dtopk_weight + n * k;
    double weighted_dw = 0;  // sum_j dw_j w_j
    for (int j = lane; j < k; j += 32) {
      weighted_dw += load_as<double>(dw, j) * load_as<double>(w, j);
    }
    weighted_dw = cuda::warp_sum(weighted_dw);
    // Each expert looks for the first slot naming it, so an invalid or repeated slot writes
    // nothing and no two lanes write one element.
    T* dl = dlogits + n * experts;
    for (int e = lane; e < experts; e += 32) {
      double g = 0;
      for (int j = 0; j < k; ++j) {
        if (idx[j] == e) {
          g = load_as<double>(w, j) * (load_as<double>(dw, j) - weighted_dw);
          break;
        }
      }
      store_from(dl, e, g);
    }
  }
}

// Not renormalised: dlogits[e] = p_e * (g_e - s) for every expert, g_e from the first slot
// naming e (0 if none), s over all k slots. Each lane reads p[e] before writing dl[e] of its own
// experts only, so dlogits may be probs itself.
template <typename T>
__global__ void router_backward_full_kernel(const T* probs, const int32_t* topk_index,
                                            const T* topk_weight, const T* dtopk_weight, T* dlogits,
                                            int64_t tokens, int experts, int k) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const int32_t* idx = topk_index + n * k;
    const T* w = topk_weight + n * k;
    const T* dw = dtopk_weight + n * k;
    double weighted_dw = 0;  // s = sum_j dw_j w_j
    for (int j = lane; j < k; j += 32) {
      weighted_dw += load_as<double>(dw, j) * load_as<double>(w, j);
    }
    weighted_dw = cuda::warp_sum(weighted_dw);
    const T* p = probs + n * experts;
    T* dl = dlogits + n * experts;
    for (int e = lane; e < experts; e += 32) {
      double g = 0;
      for (int j = 0; j < k; ++j) {
        if (idx[j] == e) {
          g = load_as<double>(dw, j);
          break;
        }
      }
      store_from(dl, e, load_as<double>(p, e) * (g - weighted_dw));
    }
  }
}

template <typename T>
__global__ void router_aux_backward_kernel(const T* probs, const T* dprobs, T* dlogits,
                                           int64_t tokens, int experts) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const T* pn = probs + n * experts;
    double mean = 0;  // sum_j p_j dp_j
    for (int e = lane; e < experts; e += 32) {
      mean += load_as<double>(pn, e) * load_as<double>(dprobs, e);
    }
    mean = cuda::warp_sum(mean);
    T* dl = dlogits + n * experts;
    for (int e = lane; e < experts; e += 32) {
      C add = static_cast<C>(load_as<double>(pn, e) * (load_as<double>(dprobs, e) - mean));
      store_from(dl, e, load_as<C>(dl, e) + add);
    }
  }
}

}  // namespace

void router_forward_cuda(const Tensor& logits, int k, RouterScore score, bool renormalize,
                         const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         Stream& stream) {
  const char* op = "router_forward_cuda";
  check_router_forward_args(op, logits, k, score, renormalize, probs, topk_index, topk_weight);
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " does not fit an i32 expert index");
  if (tokens == 0) return;
  cuda::dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (score == RouterScore::topk_then_softmax) {
      router_topk_then_softmax_kernel<T>
          <<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
              static_cast<const T*>(logits.data()), static_cast<T*>(probs.data()),
              static_cast<int32_t*>(topk_index.data()), static_cast<T*>(topk_weight.data()), tokens,
              static_cast<int>(experts), k);
    } else {
      router_forward_kernel<T><<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
          static_cast<const T*>(logits.data()), static_cast<T*>(probs.data()),
          static_cast<int32_t*>(topk_index.data()), static_cast<T*>(topk_weight.data()), tokens,
          static_cast<int>(experts), k, renormalize);
    }
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void router_backward_cuda(const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                          const Tensor& dtopk_weight, bool renormalized, const Tensor& dlogits,
                          Stream& stream) {
  const char* op = "router_backward_cuda";
  check_router_backward_args(op, probs, topk_index, topk_weight, dtopk_weight, dlogits);
  const int64_t tokens = probs.size(0), experts = probs.size(1), k = topk_index.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " does not fit an i32 expert index");
  if (tokens == 0) return;
  cuda::dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (renormalized) {
      router_backward_kernel<T><<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
          static_cast<const int32_t*>(topk_index.data()), static_cast<const T*>(topk_weight.data()),
          static_cast<const T*>(dtopk_weight.data()), static_cast<T*>(dlogits.data()), tokens,
          static_cast<int>(experts), static_cast<int>(k));
    } else {
      router_backward_full_kernel<T>
          <<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
              static_cast<const T*>(probs.data()), static_cast<const int32_t*>(topk_index.data()),
              static_cast<const T*>(topk_weight.data()), static_cast<const T*>(dtopk_weight.data()),
              static_cast<T*>(dlogits.data()), tokens, static_cast<int>(experts),
              static_cast<int>(k));
    }
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

void router_aux_backward_cuda(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                              Stream& stream) {
  const char* op = "router_aux_backward_cuda";
  check_router_aux_backward_args(op, probs, dprobs, dlogits);
  const int64_t tokens = probs.size(0), experts = probs.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " is too large");
  if (tokens == 0 || experts == 0) return;
  cuda::dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    router_aux_backward_kernel<T>
        <<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(probs.data()), static_cast<const T*>(dprobs.data()),
            static_cast<T*>(dlogits.data()), tokens, static_cast<int>(experts));
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
