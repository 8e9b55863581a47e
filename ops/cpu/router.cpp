// CPU router: per token, a max-subtracted softmax over E experts, top-k by repeated arg-max
// (strict '>' so the lower index wins ties), and renormalisation when asked; or (gpt-oss's
// topk_then_softmax) the top k of the logits and a softmax over those k. The backward is the
// gradient of the softmax over the selected logits (renormalised) or of the full softmax (not),
// see ops/router.h. f32 | bf16 | f64 storage
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

void check_router_forward_args(const char* op, const Tensor& logits, int k, RouterScore score,
                               bool renormalize, const Tensor& probs, const Tensor& topk_index,
                               const Tensor& topk_weight) {
  MOEPEAK_CHECK(score == RouterScore::softmax_then_topk || score == RouterScore::topk_then_softmax,
                op, ": unknown RouterScore ", static_cast<int>(score));
  MOEPEAK_CHECK(score != RouterScore::topk_then_softmax || renormalize, op,
                ": topk_then_softmax needs renormalize = true (its weights are a softmax over the "
                "chosen logits)");
  MOEPEAK_CHECK(logits.ndim() == 2, op, ": logits must be (N, E), got ", logits.str());
  int64_t tokens = logits.size(0), experts = logits.size(1);
  MOEPEAK_CHECK(k >= 1 && k <= experts, op, ": k must be in [1, E = ", experts, "], got ", k);
  probs.expect(logits.shape(), logits.dtype(), std::string(op) + ": probs");
  topk_index.expect(Shape{tokens, k}, DType::i32, std::string(op) + ": topk_index");
  topk_weight.expect(Shape{tokens, k}, logits.dtype(), std::string(op) + ": topk_weight");
}

void check_router_backward_args(const char* op, const Tensor& probs, const Tensor& topk_index,
                                const Tensor& topk_weight, const Tensor& dtopk_weight,
                                const Tensor& dlogits) {
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

}  // namespace

void router_forward_cpu(const Tensor& logits, int k, RouterScore score, bool renormalize,
                        const Tensor& probs, const Tensor& topk_index, const Tensor& topk_weight,
                        Stream& stream) {
  const char* op = "router_forward_cpu";
  check_router_forward_args(op, logits, k, score, renormalize, probs, topk_index, topk_weight);
  int64_t tokens = logits.size(0), experts = logits.size(1);
  const bool topk_first = score == RouterScore::topk_then_softmax;
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
                         Stream& stream) {
  const char* op = "router_backward_cpu";
  check_router_backward_args(op, probs, topk_index, topk_weight, dtopk_weight, dlogits);
  int64_t tokens = probs.size(0), experts = probs.size(1), k = topk_index.size(1);
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
        double weighted_dw = 0;  // sum_j dw_j w_j
        for (int64_t j = 0; j < k; ++j) {
          weighted_dw += static_cast<double>(load(dw[j])) * load(w[j]);
        }
        T* dl = dlp + n * experts;
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

}  // namespace moepeak::ops
