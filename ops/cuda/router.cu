// CUDA router (see ops/router.h): one warp per token. The forward takes the row max, sums the
// exponentials in double, writes probs rounded to the storage dtype, then selects the top k by
// repeated arg-max over the rounded probs with ties to the lower expert index (ops/cpu/router.cpp's
// rule), and renormalises in double when asked. topk_then_softmax (gpt-oss) has its own
// forward kernel: the same arg-max over the logits, a softmax over the k chosen, then probs.
// sigmoid_group_limited (DeepSeek-V3) has its own too: the sigmoid scores, the group scores
// into shared memory, the same arg-max over the groups and then over the kept groups' experts.
// All three select with warp_top_k. The backwards are warp-per-row too, row sums in double.
// Test: ctest -L cuda -R test_backend_ops (cases in tests/ops/backend_ops/cases_router.cpp).
#include <cmath>
#include <string>

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

// The next pick of a warp's repeated arg-max over the candidates e in [0, count): the first in
// selection order after (prev_v, prev_i) (prev_i < 0: the first overall), into best_v and best_i
// on every lane (best_i < 0 when no candidate is left). value(e, x) sets x to e's value and
// returns whether e is a candidate at all. Each lane scans e = lane, lane + 32, ..., then the
// warp reduces.
template <typename C, typename Value>
__device__ __forceinline__ void warp_next_pick(int count, int lane, const Value& value, C prev_v,
                                               int prev_i, C& best_v, int& best_i) {
  for (int e = lane; e < count; e += 32) {
    C x = 0;
    if (!value(e, x)) continue;
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

// A warp's top k of the candidates in [0, count) (warp_next_pick's value): the j-th pick is the
// first in selection order after the (j-1)-th; on_pick(j, v, i) runs on every lane with pick j's
// value and index, in order j = 0, ..., k - 1. The caller makes sure k candidates exist.
template <typename C, typename Value, typename OnPick>
__device__ __forceinline__ void warp_top_k(int count, int k, int lane, const Value& value,
                                           const OnPick& on_pick) {
  C prev_v = 0;
  int prev_i = -1;
  for (int j = 0; j < k; ++j) {
    C best_v = 0;
    int best_i = -1;
    warp_next_pick(count, lane, value, prev_v, prev_i, best_v, best_i);
    on_pick(j, best_v, best_i);
    prev_v = best_v;
    prev_i = best_i;
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

    // Top k of the stored probs.
    int32_t* idx = topk_index + n * k;
    T* w = topk_weight + n * k;
    double chosen_sum = 0;
    warp_top_k<C>(
        experts, k, lane,
        [&](int e, C& x) {
          x = load_as<C>(p, e);
          return true;
        },
        [&](int j, C best_v, int best_i) {
          // Every lane holds the same pick (k <= E, so there always is one). Slot j belongs to
          // lane j % 32, which parks the chosen prob in w[j] (exact: it is a stored value) until
          // the sum of all k is known; without renormalisation that is the weight.
          if (lane == (j & 31)) {
            idx[j] = best_i;
            store_from(w, j, best_v);
          }
          chosen_sum += static_cast<double>(best_v);
        });
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
    C top = 0;
    double chosen_sum = 0;
    warp_top_k<C>(
        experts, k, lane,
        [&](int e, C& x) {
          x = load_as<C>(l, e);  // the stored logits
          return true;
        },
        [&](int j, C best_v, int best_i) {
          if (lane == (j & 31)) idx[j] = best_i;  // slot j belongs to lane j % 32
          if (j == 0) top = best_v;
          chosen_sum += static_cast<double>(exp(best_v - top));
        });
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

// sigmoid_group_limited's group scores: kWarpsPerBlock slices of `groups` compute-type values.
extern __shared__ __align__(16) unsigned char router_group_smem[];

// sigmoid_group_limited (DeepSeek-V3, ops/router.h), with the CPU's arithmetic in each step:
//   1. each lane stores its experts' scores s = 1 / (1 + exp(-l)) (reading l[e] before writing
//      p[e], so probs may be logits itself);
//   2. after a __syncwarp, lane g % 32 adds group g's two best choices (p[e] + bias[e], the
//      stored scores read back) into the warp's slice of shared memory;
//   3. after another __syncwarp, warp_top_k over the group scores; its last pick is the
//      threshold: group g is kept when it is that pick or ranks before it;
//   4. warp_top_k over the kept groups' experts by their choice, the scores' sum in double in
//      slot order on every lane; then each lane writes the weights of its slots j = lane + 32 i.
// The next token's scores are written only after the next step 1's __syncwarp, which every lane
// reaches after its reads of this token's scores.
template <typename T>
__global__ void router_sigmoid_group_limited_kernel(const T* logits, const compute_t<T>* bias,
                                                    T* probs, int32_t* topk_index, T* topk_weight,
                                                    int64_t tokens, int experts, int k, int groups,
                                                    int topk_groups, bool renormalize,
                                                    double scaling) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  C* group_score = reinterpret_cast<C*>(router_group_smem) + (threadIdx.x >> 5) * groups;
  const int group_size = experts / groups;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const T* l = logits + n * experts;
    T* p = probs + n * experts;
    for (int e = lane; e < experts; e += 32) {
      const C x = load_as<C>(l, e);
      store_from(p, e, C(1) / (C(1) + exp(-x)));
    }
    __syncwarp();
    auto choice = [&](int e) { return load_as<C>(p, e) + bias[e]; };
    for (int g = lane; g < groups; g += 32) {
      const int base = g * group_size;
      C first_v = choice(base), second_v = 0;
      int first = 0, second = -1;
      for (int i = 1; i < group_size; ++i) {
        const C v = choice(base + i);
        if (ranks_before(v, i, first_v, first)) {
          second_v = first_v;
          second = first;
          first_v = v;
          first = i;
        } else if (second < 0 || ranks_before(v, i, second_v, second)) {
          second_v = v;
          second = i;
        }
      }
      group_score[g] = first_v + second_v;
    }
    __syncwarp();
    C last_v = 0;  // the last kept group's score and index
    int last_g = -1;
    warp_top_k<C>(
        groups, topk_groups, lane,
        [&](int g, C& x) {
          x = group_score[g];
          return true;
        },
        [&](int, C v, int g) {
          last_v = v;
          last_g = g;
        });
    int32_t* idx = topk_index + n * k;
    T* w = topk_weight + n * k;
    double chosen_sum = 0;
    warp_top_k<C>(
        experts, k, lane,
        [&](int e, C& x) {
          const int g = e / group_size;
          if (g != last_g && !ranks_before(group_score[g], g, last_v, last_g)) return false;
          x = choice(e);
          return true;
        },
        [&](int j, C, int e) {
          if (lane == (j & 31)) idx[j] = e;  // slot j belongs to lane j % 32
          chosen_sum += load_as<double>(p, e);
        });
    const double denominator = chosen_sum + 1e-20;
    for (int j = lane; j < k; j += 32) {
      const double s = load_as<double>(p, idx[j]);
      store_from(w, j, renormalize ? scaling * (s / denominator) : scaling * s);
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

// Whether slot j of a row names an expert in [0, E) that no earlier slot names (CUDA's rule for
// bad slots, ops/router.h).
__device__ __forceinline__ bool valid_slot(const int32_t* idx, int j, int experts) {
  if (idx[j] < 0 || idx[j] >= experts) return false;
  for (int i = 0; i < j; ++i) {
    if (idx[i] == idx[j]) return false;
  }
  return true;
}

// sigmoid_group_limited's backward (ops/router.h): S and T over the valid slots in slot order on
// every lane (the CPU's sums, bit for bit), then, after a __syncwarp (every read of another
// lane's probs done, so dlogits may be probs itself), each lane writes its own experts: ds_j *
// s (1 - s) from the first slot naming e, 0 for the experts no slot names.
template <typename T>
__global__ void router_backward_sigmoid_kernel(const T* probs, const int32_t* topk_index,
                                               const T* dtopk_weight, T* dlogits, int64_t tokens,
                                               int experts, int k, bool renormalized,
                                               double scaling) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const int32_t* idx = topk_index + n * k;
    const T* dw = dtopk_weight + n * k;
    const T* p = probs + n * experts;
    T* dl = dlogits + n * experts;
    double chosen_sum = 0, weighted_sum = 0;  // S = sum_j s_j, T = sum_j dw_j s_j
    for (int j = 0; j < k; ++j) {
      if (!valid_slot(idx, j, experts)) continue;
      const double s = load_as<double>(p, idx[j]);
      chosen_sum += s;
      weighted_sum += load_as<double>(dw, j) * s;
    }
    const double denominator = chosen_sum + 1e-20;
    __syncwarp();
    for (int e = lane; e < experts; e += 32) {
      double g = 0;
      for (int j = 0; j < k; ++j) {
        if (idx[j] == e) {  // the first slot naming e: a valid one
          const double s = load_as<double>(p, e), dwj = load_as<double>(dw, j);
          const double ds = renormalized
                                ? scaling * (dwj - weighted_sum / denominator) / denominator
                                : scaling * dwj;
          g = ds * s * (1 - s);
          break;
        }
      }
      store_from(dl, e, g);
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

template <typename T>
__global__ void router_sequence_aux_backward_kernel(const T* scores, const T* dprobs, T* dlogits,
                                                    int64_t tokens, int experts,
                                                    int64_t rows_per_segment) {
  using C = compute_t<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t n = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
       n < tokens; n += warps) {
    const T* sn = scores + n * experts;
    const T* gn = dprobs + (n / rows_per_segment) * experts;
    double sum = 0, weighted = 0;  // S = sum_j s_j, sum_j g_j s_j
    for (int e = lane; e < experts; e += 32) {
      const double s = load_as<double>(sn, e);
      sum += s;
      weighted += load_as<double>(gn, e) * s;
    }
    sum = cuda::warp_sum(sum);
    weighted = cuda::warp_sum(weighted);
    const double mean = weighted / sum;  // sum_j g_j s'_j
    T* dl = dlogits + n * experts;
    for (int e = lane; e < experts; e += 32) {
      const double s = load_as<double>(sn, e);
      C add = static_cast<C>(s * (1.0 - s) * (load_as<double>(gn, e) - mean) / sum);
      store_from(dl, e, load_as<C>(dl, e) + add);
    }
  }
}

}  // namespace

void router_forward_cuda(const Tensor& logits, int k, RouterScore score, bool renormalize,
                         const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         Stream& stream, const GroupLimitedRouting& routing) {
  const char* op = "router_forward_cuda";
  check_router_forward_args(op, logits, k, score, renormalize, probs, topk_index, topk_weight,
                            routing);
  const int64_t tokens = logits.size(0), experts = logits.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " does not fit an i32 expert index");
  const bool sigmoid = score == RouterScore::sigmoid_group_limited;
  MOEPEAK_CHECK(!sigmoid || runs_on_cuda(routing.correction_bias), op,
                ": correction_bias must be CUDA device memory, got ",
                routing.correction_bias.str());
  if (tokens == 0) return;
  cuda::dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (sigmoid) {
      using C = compute_t<T>;
      const size_t smem = sizeof(C) * kWarpsPerBlock * static_cast<size_t>(routing.groups);
      auto kernel = router_sigmoid_group_limited_kernel<T>;
      cuda::allow_dynamic_smem(kernel, smem, op, "groups = " + std::to_string(routing.groups));
      router_sigmoid_group_limited_kernel<T>
          <<<grid_for_rows(tokens), cuda::kThreads, smem, cuda::native(stream)>>>(
              static_cast<const T*>(logits.data()),
              static_cast<const C*>(routing.correction_bias.data()), static_cast<T*>(probs.data()),
              static_cast<int32_t*>(topk_index.data()), static_cast<T*>(topk_weight.data()), tokens,
              static_cast<int>(experts), k, static_cast<int>(routing.groups),
              static_cast<int>(routing.topk_groups), renormalize, routing.scaling);
    } else if (score == RouterScore::topk_then_softmax) {
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
                          Stream& stream, RouterScore score, const GroupLimitedRouting& routing) {
  const char* op = "router_backward_cuda";
  check_router_backward_args(op, probs, topk_index, topk_weight, dtopk_weight, dlogits,
                             renormalized, score, routing);
  const int64_t tokens = probs.size(0), experts = probs.size(1), k = topk_index.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " does not fit an i32 expert index");
  if (tokens == 0) return;
  cuda::dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    if (score == RouterScore::sigmoid_group_limited) {
      router_backward_sigmoid_kernel<T>
          <<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
              static_cast<const T*>(probs.data()), static_cast<const int32_t*>(topk_index.data()),
              static_cast<const T*>(dtopk_weight.data()), static_cast<T*>(dlogits.data()), tokens,
              static_cast<int>(experts), static_cast<int>(k), renormalized, routing.scaling);
    } else if (renormalized) {
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

void router_sequence_aux_backward_cuda(const Tensor& probs, const Tensor& dprobs,
                                       const Tensor& dlogits, Stream& stream) {
  const char* op = "router_sequence_aux_backward_cuda";
  check_router_sequence_aux_backward_args(op, probs, dprobs, dlogits);
  const int64_t tokens = probs.size(0), experts = probs.size(1);
  MOEPEAK_CHECK(experts <= INT32_MAX, op, ": E = ", experts, " is too large");
  if (tokens == 0 || experts == 0) return;
  const int64_t rows_per_segment = tokens / dprobs.size(0);
  cuda::dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    router_sequence_aux_backward_kernel<T>
        <<<grid_for_rows(tokens), cuda::kThreads, 0, cuda::native(stream)>>>(
            static_cast<const T*>(probs.data()), static_cast<const T*>(dprobs.data()),
            static_cast<T*>(dlogits.data()), tokens, static_cast<int>(experts), rows_per_segment);
    MOEPEAK_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace moepeak::ops
