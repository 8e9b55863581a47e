// CPU router: per token, a max-subtracted softmax over E experts, top-k by repeated arg-max
// (strict '>' so the lower index wins ties), and renormalisation when asked; or (gpt-oss's
// topk_then_softmax) the top k of the logits and a softmax over those k; or (DeepSeek-V3's
// sigmoid_group_limited) sigmoid scores, the best groups by their two best biased scores, the
// top k of those groups' experts. The backward is the gradient of the softmax over the selected
// logits (renormalised) or of the full softmax (not), or of the sigmoid weights, see
// ops/router.h. f32 | bf16 | f64 storage
// (ops/cpu/cpu_storage.h): the exponentials in the compute type (fp32 for bf16), kept in a row
// of scratch until the sum is known, so every output element is rounded to bf16 once.
#include "ops/router.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/runtime/cpu_stream.h"
#include "ops/cpu/cpu_storage.h"

namespace moepeak::ops {

namespace {

// The score and its GroupLimitedRouting, for the forward and the backward alike: the scaling of
// sigmoid_group_limited, and the defaults for the other scores.
void check_router_score(const char* op, RouterScore score, bool renormalize,
                        const GroupLimitedRouting& routing) {
  MOEPEAK_CHECK(score == RouterScore::softmax_then_topk ||
                    score == RouterScore::topk_then_softmax ||
                    score == RouterScore::sigmoid_group_limited,
                op, ": unknown RouterScore ", static_cast<int>(score));
  MOEPEAK_CHECK(score != RouterScore::topk_then_softmax || renormalize, op,
                ": topk_then_softmax needs renormalize = true (its weights are a softmax over the "
                "chosen logits)");
  if (score == RouterScore::sigmoid_group_limited) {
    MOEPEAK_CHECK(std::isfinite(routing.scaling) && routing.scaling > 0, op,
                  ": sigmoid_group_limited's scaling must be finite and > 0, got ",
                  routing.scaling);
  } else {
    MOEPEAK_CHECK(routing.groups == 1 && routing.topk_groups == 1 &&
                      !routing.correction_bias.defined() && routing.scaling == 1.0,
                  op,
                  ": groups, topk_groups, correction_bias and scaling belong to "
                  "sigmoid_group_limited (the other scores take GroupLimitedRouting's defaults)");
  }
}

}  // namespace

void check_router_forward_args(const char* op, const Tensor& logits, int k, RouterScore score,
                               bool renormalize, const Tensor& probs, const Tensor& topk_index,
                               const Tensor& topk_weight, const GroupLimitedRouting& routing) {
  check_router_score(op, score, renormalize, routing);
  MOEPEAK_CHECK(logits.ndim() == 2, op, ": logits must be (N, E), got ", logits.str());
  int64_t tokens = logits.size(0), experts = logits.size(1);
  MOEPEAK_CHECK(k >= 1 && k <= experts, op, ": k must be in [1, E = ", experts, "], got ", k);
  probs.expect(logits.shape(), logits.dtype(), std::string(op) + ": probs");
  topk_index.expect(Shape{tokens, k}, DType::i32, std::string(op) + ": topk_index");
  topk_weight.expect(Shape{tokens, k}, logits.dtype(), std::string(op) + ": topk_weight");
  if (score != RouterScore::sigmoid_group_limited) return;
  const int64_t groups = routing.groups, topk_groups = routing.topk_groups;
  MOEPEAK_CHECK(groups >= 1 && experts % groups == 0 && experts / groups >= 2, op,
                ": groups must divide E = ", experts,
                " into groups of at least 2 experts (a group's score adds its best two), got ",
                groups);
  MOEPEAK_CHECK(topk_groups >= 1 && topk_groups <= groups, op, ": topk_groups must be in [1, ",
                "groups = ", groups, "], got ", topk_groups);
  MOEPEAK_CHECK(k <= topk_groups * (experts / groups), op, ": k = ", k, " exceeds the ",
                topk_groups * (experts / groups), " experts of the ", topk_groups, " kept groups");
  MOEPEAK_CHECK(routing.correction_bias.defined(), op,
                ": sigmoid_group_limited needs a correction_bias (E)");
  routing.correction_bias.expect(Shape{experts},
                                 logits.dtype() == DType::f64 ? DType::f64 : DType::f32,
                                 std::string(op) + ": correction_bias (f32; f64 for f64 logits)");
}

void check_router_backward_args(const char* op, const Tensor& probs, const Tensor& topk_index,
                                const Tensor& topk_weight, const Tensor& dtopk_weight,
                                const Tensor& dlogits, bool renormalized, RouterScore score,
                                const GroupLimitedRouting& routing) {
  // The backward reads only the scaling of routing: the rest may be the forward's or defaults.
  GroupLimitedRouting scaling_only;
  scaling_only.scaling = routing.scaling;
  check_router_score(op, score, renormalized,
                     score == RouterScore::sigmoid_group_limited ? scaling_only : routing);
  MOEPEAK_CHECK(probs.ndim() == 2, op, ": probs must be (N, E), got ", probs.str());
  MOEPEAK_CHECK(topk_index.ndim() == 2 && topk_index.size(0) == probs.size(0) &&
                    topk_index.size(1) >= 1 && topk_index.size(1) <= probs.size(1) &&
                    topk_index.dtype() == DType::i32,
                op, ": topk_index must be i32 (", probs.size(0),
                ", k) with 1 <= k <= ", probs.size(1), ", got ", topk_index.str());
  topk_weight.expect(topk_index.shape(), probs.dtype(), std::string(op) + ": topk_weight");
  dtopk_weight.expect(topk_index.shape(), probs.dtype(), std::string(op) + ": dtopk_weight");
  dlogits.expect(probs.shape(), probs.dtype(), std::string(op) + ": dlogits");
}

void check_router_aux_backward_args(const char* op, const Tensor& probs, const Tensor& dprobs,
                                    const Tensor& dlogits) {
  MOEPEAK_CHECK(probs.ndim() == 2, op, ": probs must be (N, E), got ", probs.str());
  dprobs.expect(Shape{probs.size(1)}, probs.dtype(), std::string(op) + ": dprobs");
  dlogits.expect(probs.shape(), probs.dtype(), std::string(op) + ": dlogits");
}

void check_router_sequence_aux_backward_args(const char* op, const Tensor& probs,
                                             const Tensor& dprobs, const Tensor& dlogits) {
  MOEPEAK_CHECK(probs.ndim() == 2, op, ": probs must be (N, E), got ", probs.str());
  MOEPEAK_CHECK(
      dprobs.ndim() == 2 && dprobs.size(1) == probs.size(1) && dprobs.dtype() == probs.dtype(), op,
      ": dprobs must be (G, E) of probs' dtype for probs ", probs.str(), ", got ", dprobs.str());
  MOEPEAK_CHECK(probs.size(0) == 0 || (dprobs.size(0) > 0 && probs.size(0) % dprobs.size(0) == 0),
                op, ": ", dprobs.size(0), " segments do not divide ", probs.size(0), " rows");
  dlogits.expect(probs.shape(), probs.dtype(), std::string(op) + ": dlogits");
}

namespace {

// topk_then_softmax's row (ops/router.h), with the row's softmax over all E already in `ex` (the
// exponentials in C) and `sum` (their sum in double): the top k of the logits l by repeated
// arg-max (NaN after every number, equal logits to the lower index), the softmax over those k,
// then probs. Every read of l comes before the first write of p, so p may be l.
template <typename T>
void topk_then_softmax_row(const T* l, const compute_t<T>* ex, double sum, int64_t experts, int k,
                           char* chosen, T* p, int32_t* idx, T* w) {
  using C = compute_t<T>;
  std::fill(chosen, chosen + experts, 0);
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e) {
      if (chosen[e]) continue;
      const C v = load(l[e]);
      if (best < 0) {
        best = e;
        continue;
      }
      const C b = load(l[best]);
      if (std::isnan(b) ? !std::isnan(v) : v > b) best = e;
    }
    chosen[best] = 1;
    idx[j] = static_cast<int32_t>(best);
  }
  // exp(l_j - l_max) with l_max the first pick's logit, summed in slot order in double; the
  // weights wait in fp32 (compute type) until the sum is known, so each is rounded once.
  const C top = load(l[idx[0]]);
  double chosen_sum = 0;
  for (int j = 0; j < k; ++j) chosen_sum += std::exp(load(l[idx[j]]) - top);
  for (int j = 0; j < k; ++j) {
    const C e = std::exp(load(l[idx[j]]) - top);
    store(w + j, static_cast<C>(e / chosen_sum));
  }
  // Rounded to the compute type, then (bf16) to the storage type, as CUDA's store does.
  for (int64_t e = 0; e < experts; ++e) store(p + e, static_cast<C>(ex[e] / sum));
}

// sigmoid_group_limited's order (ops/router.h): (a_v, a_i) before (b_v, b_i) when a_v is larger,
// or equal with the lower index; NaN after every number. A strict total order on distinct
// indices, the CUDA kernels' ranks_before.
template <typename C>
bool ranks_before(C a_v, int64_t a_i, C b_v, int64_t b_i) {
  const bool a_nan = std::isnan(a_v), b_nan = std::isnan(b_v);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a_v != b_v) return a_v > b_v;
  return a_i < b_i;
}

// The first of v[0, n) in that order among the candidates (candidate[i] != 0), or -1.
template <typename C>
int64_t first_in_order(const C* v, int64_t n, const char* candidate) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (candidate[i] && (best < 0 || ranks_before(v[i], i, v[best], best))) best = i;
  }
  return best;
}

// Scratch of one row of sigmoid_group_limited, (E) and (groups).
template <typename C>
struct GroupLimitedScratch {
  std::vector<C> choice, group_score;
  std::vector<char> candidate, group_candidate;
};

// One row of sigmoid_group_limited (ops/router.h): the scores into p (each l[e] read before p[e]
// is written, so p may be l), then the choice read back from p plus the bias, the group scores,
// the kept groups, the top k and their weights.
template <typename T>
void sigmoid_group_limited_row(const T* l, const compute_t<T>* bias, int64_t experts,
                               int64_t groups, int64_t topk_groups, int k, bool renormalize,
                               double scaling, GroupLimitedScratch<compute_t<T>>& s, T* p,
                               int32_t* idx, T* w) {
  using C = compute_t<T>;
  const int64_t group_size = experts / groups;
  for (int64_t e = 0; e < experts; ++e) {
    store(p + e, static_cast<C>(C(1) / (C(1) + std::exp(-load(l[e])))));
  }
  for (int64_t e = 0; e < experts; ++e) s.choice[e] = load(p[e]) + bias[e];
  // Each group's two best choices in the order (ties and NaN as for the experts), added once.
  for (int64_t g = 0; g < groups; ++g) {
    const C* c = s.choice.data() + g * group_size;
    int64_t first = 0, second = -1;
    for (int64_t i = 1; i < group_size; ++i) {
      if (ranks_before(c[i], i, c[first], first)) {
        second = first;
        first = i;
      } else if (second < 0 || ranks_before(c[i], i, c[second], second)) {
        second = i;
      }
    }
    s.group_score[g] = c[first] + c[second];
  }
  // The kept groups: repeated arg-max over the group scores; their experts become candidates.
  std::fill(s.group_candidate.begin(), s.group_candidate.end(), 1);
  std::fill(s.candidate.begin(), s.candidate.end(), 0);
  for (int64_t j = 0; j < topk_groups; ++j) {
    const int64_t g = first_in_order(s.group_score.data(), groups, s.group_candidate.data());
    s.group_candidate[g] = 0;
    std::fill_n(s.candidate.begin() + g * group_size, group_size, 1);
  }
  // The top k of the candidates; the weights from the stored (unbiased) scores, in double.
  double chosen_sum = 0;
  for (int j = 0; j < k; ++j) {
    const int64_t e = first_in_order(s.choice.data(), experts, s.candidate.data());
    s.candidate[e] = 0;
    idx[j] = static_cast<int32_t>(e);
    chosen_sum += load(p[e]);
  }
  const double denominator = chosen_sum + 1e-20;
  for (int j = 0; j < k; ++j) {
    const double score = load(p[idx[j]]);
    store(w + j, static_cast<C>(renormalize ? scaling * (score / denominator) : scaling * score));
  }
}

}  // namespace

void router_forward_cpu(const Tensor& logits, int k, RouterScore score, bool renormalize,
                        const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                        Stream& stream, const GroupLimitedRouting& routing) {
  const char* op = "router_forward_cpu";
  check_router_forward_args(op, logits, k, score, renormalize, probs, topk_index, topk_weight,
                            routing);
  int64_t tokens = logits.size(0), experts = logits.size(1);
  const bool topk_first = score == RouterScore::topk_then_softmax;
  if (score == RouterScore::sigmoid_group_limited) {
    MOEPEAK_CHECK(!runs_on_cuda(routing.correction_bias), op,
                  ": correction_bias must be on the CPU backend, got ",
                  routing.correction_bias.str());
    const int64_t groups = routing.groups, topk_groups = routing.topk_groups;
    const double scaling = routing.scaling;
    dispatch_storage(logits.dtype(), op, [&](auto zero) {
      using T = decltype(zero);
      using C = compute_t<T>;
      const T* lp = logits.data_as<T>();                     // (N, E)
      const C* bias = routing.correction_bias.data_as<C>();  // (E)
      T* pp = probs.data_as<T>();                            // (N, E)
      int32_t* ip = topk_index.data_as<int32_t>();           // (N, k)
      T* wp = topk_weight.data_as<T>();                      // (N, k)
      as_cpu_stream(stream).enqueue([=] {
        thread_local GroupLimitedScratch<C> scratch;
        scratch.choice.resize(static_cast<size_t>(experts));
        scratch.candidate.resize(static_cast<size_t>(experts));
        scratch.group_score.resize(static_cast<size_t>(groups));
        scratch.group_candidate.resize(static_cast<size_t>(groups));
        for (int64_t n = 0; n < tokens; ++n) {
          sigmoid_group_limited_row(lp + n * experts, bias, experts, groups, topk_groups, k,
                                    renormalize, scaling, scratch, pp + n * experts, ip + n * k,
                                    wp + n * k);
        }
      });
    });
    return;
  }
  dispatch_storage(logits.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* lp = logits.data_as<T>();            // (N, E)
    T* pp = probs.data_as<T>();                   // (N, E)
    int32_t* ip = topk_index.data_as<int32_t>();  // (N, k)
    T* wp = topk_weight.data_as<T>();             // (N, k)
    as_cpu_stream(stream).enqueue([=] {
      using C = compute_t<T>;
      // (E): scratch of the expert count. ex holds the row's exponentials (for f32 the values
      // the f32 path used to park in probs), rounded once when divided by the sum.
      thread_local std::vector<char> chosen;
      thread_local std::vector<C> ex;
      chosen.resize(static_cast<size_t>(experts));
      ex.resize(static_cast<size_t>(experts));
      for (int64_t n = 0; n < tokens; ++n) {
        const T* l = lp + n * experts;
        T* p = pp + n * experts;
        C row_max = load(l[0]);
        for (int64_t e = 1; e < experts; ++e) row_max = std::max(row_max, load(l[e]));
        double sum = 0;
        for (int64_t e = 0; e < experts; ++e) {
          ex[e] = std::exp(load(l[e]) - row_max);
          sum += ex[e];
        }
        int32_t* idx = ip + n * k;
        T* w = wp + n * k;
        if (topk_first) {
          topk_then_softmax_row(l, ex.data(), sum, experts, k, chosen.data(), p, idx, w);
          continue;
        }
        // Rounded to the compute type, then (bf16) to the storage type, as CUDA's store does.
        for (int64_t e = 0; e < experts; ++e) store(p + e, static_cast<C>(ex[e] / sum));

        // The selection and renormalisation read the stored (rounded) probs.
        std::fill(chosen.begin(), chosen.end(), 0);
        double chosen_sum = 0;
        for (int j = 0; j < k; ++j) {
          int64_t best = -1;
          for (int64_t e = 0; e < experts; ++e) {
            if (!chosen[e] && (best < 0 || load(p[e]) > load(p[best]))) best = e;
          }
          chosen[best] = 1;
          idx[j] = static_cast<int32_t>(best);
          chosen_sum += load(p[best]);
        }
        if (renormalize) {
          for (int j = 0; j < k; ++j) store(w + j, static_cast<C>(load(p[idx[j]]) / chosen_sum));
        } else {
          for (int j = 0; j < k; ++j) w[j] = p[idx[j]];  // the stored prob, bit for bit
        }
      }
    });
  });
}

void router_backward_cpu(const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                         const Tensor& dtopk_weight, bool renormalized, const Tensor& dlogits,
                         Stream& stream, RouterScore score, const GroupLimitedRouting& routing) {
  const char* op = "router_backward_cpu";
  check_router_backward_args(op, probs, topk_index, topk_weight, dtopk_weight, dlogits,
                             renormalized, score, routing);
  int64_t tokens = probs.size(0), experts = probs.size(1), k = topk_index.size(1);
  const bool sigmoid = score == RouterScore::sigmoid_group_limited;
  const double scaling = routing.scaling;
  dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    using C = compute_t<T>;
    const T* pp = probs.data_as<T>();                   // (N, E)
    const int32_t* ip = topk_index.data_as<int32_t>();  // (N, k)
    const T* wp = topk_weight.data_as<T>();             // (N, k)
    const T* dwp = dtopk_weight.data_as<T>();           // (N, k)
    T* dlp = dlogits.data_as<T>();                      // (N, E)
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) {
        const int32_t* idx = ip + n * k;
        for (int64_t j = 0; j < k; ++j) {
          if (idx[j] < 0 || idx[j] >= experts) {
            MOEPEAK_THROW(op, ": topk_index[", n, ", ", j, "] = ", idx[j], " is outside [0, ",
                          experts, ")");
          }
          for (int64_t i = 0; i < j; ++i) {
            if (idx[i] == idx[j]) {
              MOEPEAK_THROW(op, ": expert ", idx[j], " chosen twice in row ", n, " (slots ", i,
                            " and ", j, ")");
            }
          }
        }
        const T* w = wp + n * k;
        const T* dw = dwp + n * k;
        T* dl = dlp + n * experts;
        if (sigmoid) {
          // ds_j from S and T (ops/router.h), times s_j (1 - s_j); every read of p (the slots'
          // scores) comes before the first write of dl, so dlogits may be probs itself.
          const T* p = pp + n * experts;
          double chosen_sum = 0, weighted_sum = 0;  // S = sum_j s_j, T = sum_j dw_j s_j
          for (int64_t j = 0; j < k; ++j) {
            const double s = load(p[idx[j]]);
            chosen_sum += s;
            weighted_sum += static_cast<double>(load(dw[j])) * s;
          }
          const double denominator = chosen_sum + 1e-20;
          thread_local std::vector<double> dlogit;  // (k): each slot's dlogits element
          dlogit.resize(static_cast<size_t>(k));
          for (int64_t j = 0; j < k; ++j) {
            const double s = load(p[idx[j]]), dwj = load(dw[j]);
            const double ds = renormalized
                                  ? scaling * (dwj - weighted_sum / denominator) / denominator
                                  : scaling * dwj;
            dlogit[j] = ds * s * (1 - s);
          }
          for (int64_t e = 0; e < experts; ++e) store(dl + e, C(0));
          for (int64_t j = 0; j < k; ++j) store(dl + idx[j], static_cast<C>(dlogit[j]));
          continue;
        }
        double weighted_dw = 0;  // sum_j dw_j w_j
        for (int64_t j = 0; j < k; ++j) {
          weighted_dw += static_cast<double>(load(dw[j])) * load(w[j]);
        }
        if (renormalized) {
          for (int64_t e = 0; e < experts; ++e) store(dl + e, C(0));
          for (int64_t j = 0; j < k; ++j) {
            const double g = static_cast<double>(load(w[j])) * (load(dw[j]) - weighted_dw);
            store(dl + idx[j], static_cast<C>(g));
          }
        } else {
          // dlogits[e] = p_e * (g_e - s), each element read before it is written (so dlogits
          // may be probs itself, as on CUDA) and rounded once.
          thread_local std::vector<double> g;  // (E): g_e, 0 for an unchosen expert
          g.assign(static_cast<size_t>(experts), 0.0);
          for (int64_t j = 0; j < k; ++j) g[idx[j]] = load(dw[j]);
          const T* p = pp + n * experts;
          for (int64_t e = 0; e < experts; ++e) {
            store(dl + e, static_cast<C>(static_cast<double>(load(p[e])) * (g[e] - weighted_dw)));
          }
        }
      }
    });
  });
}

}  // namespace moepeak::ops

namespace moepeak::ops {

void router_aux_backward_cpu(const Tensor& probs, const Tensor& dprobs, const Tensor& dlogits,
                             Stream& stream) {
  const char* op = "router_aux_backward_cpu";
  check_router_aux_backward_args(op, probs, dprobs, dlogits);
  const int64_t tokens = probs.size(0), experts = probs.size(1);
  dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* p = probs.data_as<T>();    // (N, E)
    const T* dp = dprobs.data_as<T>();  // (E)
    T* dl = dlogits.data_as<T>();       // (N, E)
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) {
        const T* pn = p + n * experts;
        double mean = 0;  // sum_j p_j dp_j, in double
        for (int64_t e = 0; e < experts; ++e) {
          mean += static_cast<double>(load(pn[e])) * load(dp[e]);
        }
        for (int64_t e = 0; e < experts; ++e) {
          // Rounded to the compute type, added in it, and stored (rounded to bf16) once.
          const auto add =
              static_cast<compute_t<T>>(static_cast<double>(load(pn[e])) * (load(dp[e]) - mean));
          T* d = dl + n * experts + e;
          store(d, load(*d) + add);
        }
      }
    });
  });
}

void router_sequence_aux_backward_cpu(const Tensor& probs, const Tensor& dprobs,
                                      const Tensor& dlogits, Stream& stream) {
  const char* op = "router_sequence_aux_backward_cpu";
  check_router_sequence_aux_backward_args(op, probs, dprobs, dlogits);
  const int64_t tokens = probs.size(0), experts = probs.size(1);
  if (tokens == 0) return;
  const int64_t rows_per_segment = tokens / dprobs.size(0);
  dispatch_storage(probs.dtype(), op, [&](auto zero) {
    using T = decltype(zero);
    const T* p = probs.data_as<T>();    // (N, E)
    const T* dp = dprobs.data_as<T>();  // (G, E)
    T* dl = dlogits.data_as<T>();       // (N, E)
    as_cpu_stream(stream).enqueue([=] {
      for (int64_t n = 0; n < tokens; ++n) {
        const T* sn = p + n * experts;
        const T* gn = dp + (n / rows_per_segment) * experts;
        double sum = 0, weighted = 0;  // S = sum_j s_j, sum_j g_j s_j
        for (int64_t e = 0; e < experts; ++e) {
          const double s = load(sn[e]);
          sum += s;
          weighted += static_cast<double>(load(gn[e])) * s;
        }
        const double mean = weighted / sum;  // sum_j g_j s'_j
        for (int64_t e = 0; e < experts; ++e) {
          const double s = load(sn[e]);
          const auto add = static_cast<compute_t<T>>(s * (1.0 - s) * (load(gn[e]) - mean) / sum);
          T* d = dl + n * experts + e;
          store(d, load(*d) + add);
        }
      }
    });
  });
}

}  // namespace moepeak::ops
