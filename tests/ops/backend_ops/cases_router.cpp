// test_backend_ops cases: router forward, backward and aux backward (ops/router.h).
//
// topk_index is compared exactly, so the forward's logits have no near-ties: each row is a
// shuffled arange with step 1/8 (E <= 96, |logit| <= 6) or 1/16 (E <= 256, |logit| <= 8). Those
// values are exact in bf16, and any two probs differ by a factor >= e^(1/16) = 1.06, far beyond
// fp32 or bf16 rounding, so every precision orders them alike. Exact ties are tested separately:
// rows where every logit appears twice give bitwise-equal probs in every run, and the lower
// expert index must win. Shapes cover k = 1, k = E, k > 32 (slots of several lanes), E = 1,
// E = 256 and N = 0.
//
// The backward's topk_index is a random k-subset per row. On CUDA a slot outside [0, E) or
// repeating an earlier slot's expert is skipped (the CPU throws); the "skip rule" case feeds such
// slots to the GPU and computes the documented result on the host for the reference.
// Every forward and backward case of the shape list, and the skip rule, runs both with
// renormalisation (Mixtral; the names without a suffix) and without (Qwen3-MoE without
// norm_topk_prob; " renormalize=false"). Without it the backward reads probs, which are then
// drawn in [0, 1) like a softmax's. gpt-oss's topk_then_softmax ("router_topk_then_softmax")
// runs the forward over the same shapes and tie rows (the same distinct logits: its selection
// reads them directly), in place (probs over the logits), and once followed by the renormalized
// backward on its outputs (its backward, ops/router.h).
//
// DeepSeek-V3's sigmoid_group_limited ("router_sigmoid_group_limited"): the bias (Kind::state:
// f32 under test, f64 in the reference) is a fixed permutation of multiples of 1/64 around 0 (of
// 1 where k is every kept expert, so that all of them are far apart), and each row's logits are
// logit(o / 64) for random o in [4, 60], rounded to bf16, drawn again until the row's selection
// is far from ties: neighbours among the kept groups' k+1 best choices at least 0.005 apart and
// the last kept group score 0.01 above the first dropped one. bf16 storage moves a score (so a
// choice) by at most 2^-9 = 0.00195 (plus fp32's 1e-7), a group score by twice that, so every
// precision selects alike. Shapes cover DeepSeek-V3 (E = 256,
// groups 8/4, k = 8, scaling 2.5), Kimi-K2 (E = 384, 1/1), groups of 2 with more groups than
// lanes, k > 32, k = E, N = 0. Exact ties: logits 0 (s = 1/2 in every precision) and dyadic
// biases with equal values and equal group scores. NaN: one NaN logit in some rows (probs, NaN
// there, is an `in` the op overwrites, so not compared). The backward (from random scores and
// k-subsets), its skip rule, in place, and after the forward.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cpu/cpu_storage.h"
#include "ops/op_common.h"
#include "ops/router.h"
#include "tests/ops/backend_ops/harness.h"

namespace moepeak::testing::backend_ops {

namespace {

// Rows of `experts` logits, each a shuffled arange (perm - E/2) * step. With `pairs`, each
// value appears twice in the row (exact ties).
Generator distinct_logits(int64_t experts, bool pairs = false) {
  const double step = experts <= 96 ? 1.0 / 8 : 1.0 / 16;
  return [experts, step, pairs](std::mt19937_64& rng, int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    std::vector<int64_t> perm(static_cast<size_t>(experts));
    for (int64_t row = 0; row * experts < n; ++row) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t e = 0; e < experts; ++e) {
        int64_t rank = pairs ? perm[e] / 2 : perm[e];
        v[row * experts + e] = static_cast<double>(rank - experts / 2) * step;
      }
    }
    return v;
  };
}

// Per row, k distinct experts of E in random order. With `invalid`, about one slot in four is
// replaced by -1, E, a large id, or the expert of an earlier slot.
Generator topk_subsets(int64_t experts, int64_t k, bool invalid = false) {
  return [experts, k, invalid](std::mt19937_64& rng, int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    std::vector<int64_t> perm(static_cast<size_t>(experts));
    std::uniform_int_distribution<int> pick(0, 15);
    for (int64_t row = 0; row * k < n; ++row) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        double e = static_cast<double>(perm[j]);
        int p = pick(rng);
        if (invalid && p == 0) e = -1;
        if (invalid && p == 1) e = static_cast<double>(experts);
        if (invalid && p == 2) e = 1e6;
        if (invalid && p == 3 && j > 0) e = v[row * k + j - 1];
        v[row * k + j] = e;
      }
    }
    return v;
  };
}

// The CUDA backward's rule for bad slots (ops/router.h), on host memory of the CPU backend (in
// f64 for the reference; in the storage dtype, bf16 with fp32 rounding included, when the CPU is
// under test: ops/cpu/cpu_storage.h).
void router_backward_skip_rule(const Tensor& probs, const Tensor& topk_index,
                               const Tensor& topk_weight, const Tensor& dtopk_weight,
                               bool renormalized, const Tensor& dlogits) {
  ops::dispatch_storage(dlogits.dtype(), "router_backward skip rule", [&](auto zero) {
    using T = decltype(zero);
    using C = ops::compute_t<T>;
    using ops::load;
    const int64_t tokens = dlogits.size(0), experts = dlogits.size(1), k = topk_index.size(1);
    const T* p = probs.data_as<T>();
    const int32_t* idx = topk_index.data_as<int32_t>();
    const T* w = topk_weight.data_as<T>();
    const T* dw = dtopk_weight.data_as<T>();
    T* dl = dlogits.data_as<T>();
    for (int64_t n = 0; n < tokens; ++n) {
      double weighted_dw = 0;
      for (int64_t j = 0; j < k; ++j) {
        weighted_dw += double(load(dw[n * k + j])) * load(w[n * k + j]);
      }
      if (!renormalized) {
        // p_e * (g_e - s), g_e from the first valid slot naming e, else 0.
        std::vector<double> g(static_cast<size_t>(experts), 0.0);
        for (int64_t j = k - 1; j >= 0; --j) {  // backwards, so the first slot naming e wins
          int64_t e = idx[n * k + j];
          if (e >= 0 && e < experts) g[e] = load(dw[n * k + j]);
        }
        for (int64_t e = 0; e < experts; ++e) {
          const double v = double(load(p[n * experts + e])) * (g[e] - weighted_dw);
          ops::store(dl + n * experts + e, static_cast<C>(v));
        }
        continue;
      }
      for (int64_t e = 0; e < experts; ++e) ops::store(dl + n * experts + e, C(0));
      for (int64_t j = k - 1; j >= 0; --j) {  // backwards, so the first slot naming e wins
        int64_t e = idx[n * k + j];
        if (e < 0 || e >= experts) continue;
        const double g = double(load(w[n * k + j])) * (load(dw[n * k + j]) - weighted_dw);
        ops::store(dl + n * experts + e, static_cast<C>(g));
      }
    }
  });
}

// sigmoid_group_limited's backward with CUDA's rule for bad slots (ops/router.h): S and T over
// the valid slots (in [0, E), not repeating an earlier slot's expert), each valid slot's
// dlogits element, 0 elsewhere; on host memory as router_backward_skip_rule.
void sigmoid_backward_skip_rule(const Tensor& probs, const Tensor& topk_index,
                                const Tensor& dtopk_weight, bool renormalized, double scaling,
                                const Tensor& dlogits) {
  ops::dispatch_storage(dlogits.dtype(), "sigmoid backward skip rule", [&](auto zero) {
    using T = decltype(zero);
    using C = ops::compute_t<T>;
    using ops::load;
    const int64_t tokens = dlogits.size(0), experts = dlogits.size(1), k = topk_index.size(1);
    const T* p = probs.data_as<T>();
    const int32_t* idx = topk_index.data_as<int32_t>();
    const T* dw = dtopk_weight.data_as<T>();
    T* dl = dlogits.data_as<T>();
    for (int64_t n = 0; n < tokens; ++n) {
      const int32_t* row = idx + n * k;
      auto valid = [&](int64_t j) {
        if (row[j] < 0 || row[j] >= experts) return false;
        return std::find(row, row + j, row[j]) == row + j;
      };
      double sum = 0, weighted = 0;
      for (int64_t j = 0; j < k; ++j) {
        if (!valid(j)) continue;
        const double s = load(p[n * experts + row[j]]);
        sum += s;
        weighted += double(load(dw[n * k + j])) * s;
      }
      const double denominator = sum + 1e-20;
      for (int64_t e = 0; e < experts; ++e) ops::store(dl + n * experts + e, C(0));
      for (int64_t j = 0; j < k; ++j) {
        if (!valid(j)) continue;
        const double s = load(p[n * experts + row[j]]), dwj = load(dw[n * k + j]);
        const double ds =
            renormalized ? scaling * (dwj - weighted / denominator) / denominator : scaling * dwj;
        ops::store(dl + n * experts + row[j], static_cast<C>(ds * s * (1 - s)));
      }
    }
  });
}

// sigmoid_group_limited's order on host doubles: larger first, equal to the lower index, NaN
// last (ops/router.h).
bool ranks_before(double a, int64_t a_i, double b, int64_t b_i) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(b);
  if (!std::isnan(a) && a != b) return a > b;
  return a_i < b_i;
}

// How far one row's selection is from ties, in float64 from the choices c (E): the gap between
// the last kept and the first dropped group score, and the smallest gap between neighbours among
// the kept groups' k+1 best choices (pairs with a NaN are ordered by the rule, not by value, and
// count as far apart).
struct SelectionGaps {
  double groups = std::numeric_limits<double>::infinity();
  double experts = std::numeric_limits<double>::infinity();
};

double gap(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::infinity() : a - b;
}

SelectionGaps selection_gaps(const std::vector<double>& c, int64_t groups, int64_t topk_groups,
                             int64_t k) {
  const int64_t experts = static_cast<int64_t>(c.size()), size = experts / groups;
  auto by_choice = [&](int64_t a, int64_t b) { return ranks_before(c[a], a, c[b], b); };
  std::vector<double> score(groups);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> members(size);
    std::iota(members.begin(), members.end(), g * size);
    std::sort(members.begin(), members.end(), by_choice);
    score[g] = c[members[0]] + c[members[1]];
  }
  std::vector<int64_t> order(groups);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return ranks_before(score[a], a, score[b], b); });
  SelectionGaps gaps;
  if (topk_groups < groups)
    gaps.groups = gap(score[order[topk_groups - 1]], score[order[topk_groups]]);
  std::vector<int64_t> kept;
  for (int64_t j = 0; j < topk_groups; ++j) {
    for (int64_t i = 0; i < size; ++i) kept.push_back(order[j] * size + i);
  }
  std::sort(kept.begin(), kept.end(), by_choice);
  for (int64_t j = 0; j < k && j + 1 < static_cast<int64_t>(kept.size()); ++j) {
    gaps.experts = std::min(gaps.experts, gap(c[kept[j]], c[kept[j + 1]]));
  }
  return gaps;
}

// The correction bias of E experts: (perm(e) - E/2) * step for a fixed permutation, exact in f32.
// step 1/64 by default; step 1 where k is every kept expert (all of them must be far apart: the
// scores, within 56/64 of each other, then never reach the next bias).
std::vector<double> correction_bias(int64_t experts, double step = 1.0 / 64) {
  std::vector<double> bias(static_cast<size_t>(experts));
  std::vector<int64_t> perm(static_cast<size_t>(experts));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(static_cast<uint64_t>(experts));
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t e = 0; e < experts; ++e) bias[e] = static_cast<double>(perm[e] - experts / 2) * step;
  return bias;
}

// Rows of logit(o / 64) rounded to bf16, o uniform in [4, 60], each row drawn until its
// selection (with `bias`) is far from ties (see the top of the file). With `nan_rows`, every
// other row has one NaN logit at a random expert (k must then stay below the kept experts).
Generator group_limited_logits(std::vector<double> bias, int64_t groups, int64_t topk_groups,
                               int64_t k, bool nan_rows = false) {
  return [bias, groups, topk_groups, k, nan_rows](std::mt19937_64& rng, int64_t n) {
    const int64_t experts = static_cast<int64_t>(bias.size());
    std::vector<double> v(static_cast<size_t>(n));
    std::uniform_int_distribution<int> grid(4, 60);
    std::uniform_int_distribution<int64_t> expert(0, experts - 1);
    std::vector<double> c(static_cast<size_t>(experts));
    for (int64_t row = 0; row * experts < n; ++row) {
      double* l = v.data() + row * experts;
      for (int attempt = 0;; ++attempt) {
        if (attempt == 100000)
          throw std::runtime_error("group_limited_logits: no row far from ties");
        for (int64_t e = 0; e < experts; ++e) {
          const double q = grid(rng) / 64.0;
          l[e] = static_cast<float>(bf16(static_cast<float>(std::log(q / (1 - q)))));
        }
        if (nan_rows && row % 2 == 0) l[expert(rng)] = std::numeric_limits<double>::quiet_NaN();
        for (int64_t e = 0; e < experts; ++e) c[e] = 1 / (1 + std::exp(-l[e])) + bias[e];
        const SelectionGaps gaps = selection_gaps(c, groups, topk_groups, k);
        if (gaps.groups > 0.01 && gaps.experts > 0.005) break;
      }
    }
    return v;
  };
}

constexpr auto kSigmoid = ops::RouterScore::sigmoid_group_limited;

// DeepSeek-V3's router: forward shapes (renormalised or not), exact ties, NaN rows, in place;
// the backward, its skip rule, in place, and after the forward.
void add_sigmoid_group_limited_cases(std::vector<OpCase>& cases) {
  struct Shape {
    int64_t n, e, k, groups, topk_groups;
    double scaling;
  };
  auto describe = [](const Shape& s) {
    char scaling[32];
    std::snprintf(scaling, sizeof scaling, "%g", s.scaling);
    return " N=" + std::to_string(s.n) + " E=" + std::to_string(s.e) + " k=" + std::to_string(s.k) +
           " groups=" + std::to_string(s.groups) + "/" + std::to_string(s.topk_groups) +
           " scaling=" + std::string(scaling);
  };
  const std::vector<Shape> shapes{
      {37, 64, 8, 8, 4, 2.5},   {5, 256, 8, 8, 4, 2.5}, {3, 384, 8, 1, 1, 2.827},
      {17, 32, 4, 8, 4, 1.0},   {9, 80, 40, 4, 2, 1.0}, {6, 64, 6, 32, 3, 1.5},
      {4, 384, 8, 192, 4, 2.5}, {33, 16, 1, 1, 1, 1.0}, {4, 64, 64, 1, 1, 1.0},
      {3, 2, 2, 1, 1, 1.0},     {0, 64, 8, 8, 4, 2.5}};
  for (const Shape& sh : shapes) {
    const int ki = static_cast<int>(sh.k);
    const ops::GroupLimitedRouting routing{sh.groups, sh.topk_groups, Tensor(), sh.scaling};
    const bool every_kept = sh.k == sh.topk_groups * (sh.e / sh.groups);
    const auto bias = correction_bias(sh.e, every_kept ? 1.0 : 1.0 / 64);
    for (bool renorm : {true, false}) {
      cases.push_back(OpCase{
          "router_sigmoid_group_limited" + describe(sh) + (renorm ? "" : " renormalize=false"),
          {in("logits", {sh.n, sh.e}, Kind::floating,
              group_limited_logits(bias, sh.groups, sh.topk_groups, sh.k)),
           in("correction_bias", {sh.e}, Kind::state, values(bias)), out("probs", {sh.n, sh.e}),
           out("topk_index", {sh.n, sh.k}, Kind::i32), out("topk_weight", {sh.n, sh.k})},
          [ki, renorm, routing](const std::vector<Tensor>& t, Stream& s) {
            ops::GroupLimitedRouting r = routing;
            r.correction_bias = t[1];
            ops::router_forward(t[0], ki, kSigmoid, renorm, t[2], t[3], t[4], s, r);
          }});
    }
  }

  // Exact ties: s = 1/2 for every expert, and biases in eighths with repeats, so equal choices
  // and equal group scores in every precision; the lower expert and group index go first.
  for (const Shape& sh : std::vector<Shape>{{3, 16, 5, 4, 2, 2.5}, {2, 64, 8, 8, 4, 1.0}}) {
    const int ki = static_cast<int>(sh.k);
    std::vector<double> bias(static_cast<size_t>(sh.e));
    for (int64_t e = 0; e < sh.e; ++e) bias[e] = static_cast<double>((e * 5) % 4) / 8;
    const ops::GroupLimitedRouting routing{sh.groups, sh.topk_groups, Tensor(), sh.scaling};
    cases.push_back(OpCase{
        "router_sigmoid_group_limited ties" + describe(sh),
        {in("logits", {sh.n, sh.e}, Kind::floating, values(std::vector<double>(sh.n * sh.e, 0.0))),
         in("correction_bias", {sh.e}, Kind::state, values(bias)), out("probs", {sh.n, sh.e}),
         out("topk_index", {sh.n, sh.k}, Kind::i32), out("topk_weight", {sh.n, sh.k})},
        [ki, routing](const std::vector<Tensor>& t, Stream& s) {
          ops::GroupLimitedRouting r = routing;
          r.correction_bias = t[1];
          ops::router_forward(t[0], ki, kSigmoid, true, t[2], t[3], t[4], s, r);
        }});
  }

  // One NaN logit in every other row: NaN ranks last (the group of 2 holding it scores NaN).
  // probs holds the NaN, so it is an `in` here (filled, overwritten, not compared).
  for (const Shape& sh : std::vector<Shape>{{12, 64, 8, 8, 4, 2.5}, {12, 32, 3, 16, 3, 1.0}}) {
    const int ki = static_cast<int>(sh.k);
    const auto bias = correction_bias(sh.e);
    const ops::GroupLimitedRouting routing{sh.groups, sh.topk_groups, Tensor(), sh.scaling};
    cases.push_back(
        OpCase{"router_sigmoid_group_limited nan" + describe(sh),
               {in("logits", {sh.n, sh.e}, Kind::floating,
                   group_limited_logits(bias, sh.groups, sh.topk_groups, sh.k, /*nan_rows=*/true)),
                in("correction_bias", {sh.e}, Kind::state, values(bias)), in("probs", {sh.n, sh.e}),
                out("topk_index", {sh.n, sh.k}, Kind::i32), out("topk_weight", {sh.n, sh.k})},
               [ki, routing](const std::vector<Tensor>& t, Stream& s) {
                 ops::GroupLimitedRouting r = routing;
                 r.correction_bias = t[1];
                 ops::router_forward(t[0], ki, kSigmoid, true, t[2], t[3], t[4], s, r);
               }});
  }

  // In place: probs over the logits.
  {
    const Shape sh{21, 64, 8, 8, 4, 2.5};
    const auto bias = correction_bias(sh.e);
    cases.push_back(
        OpCase{"router_sigmoid_group_limited in place" + describe(sh),
               {inout("logits_probs", {sh.n, sh.e}, Kind::floating,
                      group_limited_logits(bias, sh.groups, sh.topk_groups, sh.k)),
                in("correction_bias", {sh.e}, Kind::state, values(bias)),
                out("topk_index", {sh.n, sh.k}, Kind::i32), out("topk_weight", {sh.n, sh.k})},
               [sh](const std::vector<Tensor>& t, Stream& s) {
                 ops::router_forward(t[0], static_cast<int>(sh.k), kSigmoid, true, t[0], t[2], t[3],
                                     s, {sh.groups, sh.topk_groups, t[1], sh.scaling});
               }});
  }

  // The backward from random scores in (0, 1) and k-subsets (topk_weight is not read).
  for (const Shape& sh : std::vector<Shape>{{37, 64, 8, 8, 4, 2.5},
                                            {5, 256, 8, 8, 4, 2.5},
                                            {3, 384, 8, 1, 1, 2.827},
                                            {9, 80, 40, 4, 2, 1.0},
                                            {0, 64, 8, 8, 4, 2.5}}) {
    const ops::GroupLimitedRouting routing{sh.groups, sh.topk_groups, Tensor(), sh.scaling};
    for (bool renorm : {true, false}) {
      cases.push_back(OpCase{"router_sigmoid_group_limited_backward" + describe(sh) +
                                 (renorm ? "" : " renormalize=false"),
                             {in("probs", {sh.n, sh.e}, Kind::floating, uniform(0.02, 0.98)),
                              in("topk_index", {sh.n, sh.k}, Kind::i32, topk_subsets(sh.e, sh.k)),
                              in("topk_weight", {sh.n, sh.k}), in("dtopk_weight", {sh.n, sh.k}),
                              out("dlogits", {sh.n, sh.e})},
                             [renorm, routing](const std::vector<Tensor>& t, Stream& s) {
                               ops::router_backward(t[0], t[1], t[2], t[3], renorm, t[4], s,
                                                    kSigmoid, routing);
                             }});
    }
  }
  // In place: dlogits over probs.
  cases.push_back(OpCase{"router_sigmoid_group_limited_backward in place N=19 E=64 k=8",
                         {inout("probs_dlogits", {19, 64}, Kind::floating, uniform(0.02, 0.98)),
                          in("topk_index", {19, 8}, Kind::i32, topk_subsets(64, 8)),
                          in("topk_weight", {19, 8}), in("dtopk_weight", {19, 8})},
                         [](const std::vector<Tensor>& t, Stream& s) {
                           ops::router_backward(t[0], t[1], t[2], t[3], true, t[0], s, kSigmoid,
                                                {1, 1, Tensor(), 2.5});
                         }});
  // Bad slots: CUDA skips them; the reference applies the same rule on the host.
  for (const Shape& sh : std::vector<Shape>{{40, 8, 4, 1, 1, 2.5}, {6, 64, 40, 1, 1, 1.0}}) {
    for (bool renorm : {true, false}) {
      cases.push_back(OpCase{
          "router_sigmoid_group_limited_backward skip rule" + describe(sh) +
              (renorm ? "" : " renormalize=false"),
          {in("probs", {sh.n, sh.e}, Kind::floating, uniform(0.02, 0.98)),
           in("topk_index", {sh.n, sh.k}, Kind::i32, topk_subsets(sh.e, sh.k, /*invalid=*/true)),
           in("topk_weight", {sh.n, sh.k}), in("dtopk_weight", {sh.n, sh.k}),
           out("dlogits", {sh.n, sh.e})},
          [renorm, sh](const std::vector<Tensor>& t, Stream& s) {
            if (ops::runs_on_cuda(t[4])) {
              ops::router_backward(t[0], t[1], t[2], t[3], renorm, t[4], s, kSigmoid,
                                   {1, 1, Tensor(), sh.scaling});
            } else {
              sigmoid_backward_skip_rule(t[0], t[1], t[3], renorm, sh.scaling, t[4]);
            }
          }});
    }
  }
  // The forward, then the backward on its outputs.
  {
    const Shape sh{37, 64, 8, 8, 4, 2.5};
    const auto bias = correction_bias(sh.e);
    cases.push_back(OpCase{
        "router_sigmoid_group_limited_then_backward" + describe(sh),
        {in("logits", {sh.n, sh.e}, Kind::floating,
            group_limited_logits(bias, sh.groups, sh.topk_groups, sh.k)),
         in("correction_bias", {sh.e}, Kind::state, values(bias)), out("probs", {sh.n, sh.e}),
         out("topk_index", {sh.n, sh.k}, Kind::i32), out("topk_weight", {sh.n, sh.k}),
         in("dtopk_weight", {sh.n, sh.k}), out("dlogits", {sh.n, sh.e})},
        [sh](const std::vector<Tensor>& t, Stream& s) {
          const ops::GroupLimitedRouting r{sh.groups, sh.topk_groups, t[1], sh.scaling};
          ops::router_forward(t[0], static_cast<int>(sh.k), kSigmoid, true, t[2], t[3], t[4], s, r);
          ops::router_backward(t[2], t[3], t[4], t[5], true, t[6], s, kSigmoid, r);
        }});
  }
}

}  // namespace

MOEPEAK_BACKEND_OPS_CASES(router) {
  std::vector<OpCase> cases;
  struct RouterShape {
    int64_t n, e, k;
  };
  const std::vector<RouterShape> shapes{{37, 8, 2},  {64, 16, 4}, {5, 256, 8},
                                        {3, 8, 8},   {1, 1, 1},   {0, 8, 2},
                                        {33, 64, 1}, {9, 80, 40}, {4, 200, 200}};
  for (auto [n, e, k] : shapes) {
    std::string shape =
        " N=" + std::to_string(n) + " E=" + std::to_string(e) + " k=" + std::to_string(k);
    const int ki = static_cast<int>(k);
    for (bool renorm : {true, false}) {
      const std::string suffix = renorm ? "" : " renormalize=false";
      cases.push_back(
          OpCase{"router_forward" + shape + suffix,
                 {in("logits", {n, e}, Kind::floating, distinct_logits(e)), out("probs", {n, e}),
                  out("topk_index", {n, k}, Kind::i32), out("topk_weight", {n, k})},
                 [ki, renorm](const std::vector<Tensor>& t, Stream& s) {
                   ops::router_forward(t[0], ki, ops::RouterScore::softmax_then_topk, renorm, t[1],
                                       t[2], t[3], s);
                 }});
      cases.push_back(OpCase{
          "router_backward" + shape + suffix,
          {renorm ? in("probs", {n, e}) : in("probs", {n, e}, Kind::floating, uniform(0.0, 1.0)),
           in("topk_index", {n, k}, Kind::i32, topk_subsets(e, k)),
           in("topk_weight", {n, k}, Kind::floating, uniform(0.05, 1.0)),
           in("dtopk_weight", {n, k}), out("dlogits", {n, e})},
          [renorm](const std::vector<Tensor>& t, Stream& s) {
            ops::router_backward(t[0], t[1], t[2], t[3], renorm, t[4], s);
          }});
    }
    cases.push_back(OpCase{"router_aux_backward" + shape,
                           {in("probs", {n, e}, Kind::floating, uniform(0.0, 1.0)),
                            in("dprobs", {e}), inout("dlogits", {n, e})},
                           [](const std::vector<Tensor>& t, Stream& s) {
                             ops::router_aux_backward(t[0], t[1], t[2], s);
                           }});
    // One segment (a sequence on this rank), and every row its own.
    for (int64_t g : std::vector<int64_t>{1, std::max<int64_t>(n, 1)}) {
      cases.push_back(OpCase{"router_sequence_aux_backward" + shape + " G=" + std::to_string(g),
                             {in("scores", {n, e}, Kind::floating, uniform(0.02, 0.98)),
                              in("dprobs", {g, e}), inout("dlogits", {n, e})},
                             [](const std::vector<Tensor>& t, Stream& s) {
                               ops::router_sequence_aux_backward(t[0], t[1], t[2], s);
                             }});
      if (n <= 1) break;
    }
  }

  // Exact ties (every logit twice in its row): the lower expert index goes first.
  for (auto [n, e, k] : std::vector<RouterShape>{{16, 8, 8}, {7, 64, 9}}) {
    const int ki = static_cast<int>(k);
    cases.push_back(OpCase{
        "router_forward ties N=" + std::to_string(n) + " E=" + std::to_string(e) +
            " k=" + std::to_string(k),
        {in("logits", {n, e}, Kind::floating, distinct_logits(e, /*pairs=*/true)),
         out("probs", {n, e}), out("topk_index", {n, k}, Kind::i32), out("topk_weight", {n, k})},
        [ki](const std::vector<Tensor>& t, Stream& s) {
          ops::router_forward(t[0], ki, ops::RouterScore::softmax_then_topk, true, t[1], t[2], t[3],
                              s);
        }});
  }
  // One row of equal logits: probs 1/E exactly, experts 0..k-1 in order.
  cases.push_back(OpCase{
      "router_forward equal row E=6 k=4",
      {in("logits", {1, 6}, Kind::floating, values({0.5, 0.5, 0.5, 0.5, 0.5, 0.5})),
       out("probs", {1, 6}), out("topk_index", {1, 4}, Kind::i32), out("topk_weight", {1, 4})},
      [](const std::vector<Tensor>& t, Stream& s) {
        ops::router_forward(t[0], 4, ops::RouterScore::softmax_then_topk, true, t[1], t[2], t[3],
                            s);
      }});

  // gpt-oss: top-k of the logits, then a softmax over those k.
  for (auto [n, e, k] : shapes) {
    const int ki = static_cast<int>(k);
    cases.push_back(
        OpCase{"router_topk_then_softmax N=" + std::to_string(n) + " E=" + std::to_string(e) +
                   " k=" + std::to_string(k),
               {in("logits", {n, e}, Kind::floating, distinct_logits(e)), out("probs", {n, e}),
                out("topk_index", {n, k}, Kind::i32), out("topk_weight", {n, k})},
               [ki](const std::vector<Tensor>& t, Stream& s) {
                 ops::router_forward(t[0], ki, ops::RouterScore::topk_then_softmax, true, t[1],
                                     t[2], t[3], s);
               }});
  }
  for (auto [n, e, k] : std::vector<RouterShape>{{16, 8, 8}, {7, 64, 9}}) {
    const int ki = static_cast<int>(k);
    const std::string shape =
        " N=" + std::to_string(n) + " E=" + std::to_string(e) + " k=" + std::to_string(k);
    cases.push_back(OpCase{
        "router_topk_then_softmax ties" + shape,
        {in("logits", {n, e}, Kind::floating, distinct_logits(e, /*pairs=*/true)),
         out("probs", {n, e}), out("topk_index", {n, k}, Kind::i32), out("topk_weight", {n, k})},
        [ki](const std::vector<Tensor>& t, Stream& s) {
          ops::router_forward(t[0], ki, ops::RouterScore::topk_then_softmax, true, t[1], t[2], t[3],
                              s);
        }});
    cases.push_back(OpCase{"router_topk_then_softmax in place" + shape,
                           {inout("logits_probs", {n, e}, Kind::floating, distinct_logits(e)),
                            out("topk_index", {n, k}, Kind::i32), out("topk_weight", {n, k})},
                           [ki](const std::vector<Tensor>& t, Stream& s) {
                             ops::router_forward(t[0], ki, ops::RouterScore::topk_then_softmax,
                                                 true, t[0], t[1], t[2], s);
                           }});
  }
  cases.push_back(
      OpCase{"router_topk_then_softmax_then_backward N=37 E=32 k=4",
             {in("logits", {37, 32}, Kind::floating, distinct_logits(32)), out("probs", {37, 32}),
              out("topk_index", {37, 4}, Kind::i32), out("topk_weight", {37, 4}),
              in("dtopk_weight", {37, 4}), out("dlogits", {37, 32})},
             [](const std::vector<Tensor>& t, Stream& s) {
               ops::router_forward(t[0], 4, ops::RouterScore::topk_then_softmax, true, t[1], t[2],
                                   t[3], s);
               ops::router_backward(t[1], t[2], t[3], t[4], /*renormalized=*/true, t[5], s);
             }});

  // Bad slots: CUDA skips them (ops/router.h); the CPU reference applies the same rule on the
  // host, since router_backward_cpu throws on them.
  for (auto [n, e, k] : std::vector<RouterShape>{{40, 8, 4}, {6, 64, 40}}) {
    for (bool renorm : {true, false}) {
      cases.push_back(OpCase{
          "router_backward skip rule N=" + std::to_string(n) + " E=" + std::to_string(e) +
              " k=" + std::to_string(k) + (renorm ? "" : " renormalize=false"),
          {renorm ? in("probs", {n, e}) : in("probs", {n, e}, Kind::floating, uniform(0.0, 1.0)),
           in("topk_index", {n, k}, Kind::i32, topk_subsets(e, k, /*invalid=*/true)),
           in("topk_weight", {n, k}, Kind::floating, uniform(0.05, 1.0)),
           in("dtopk_weight", {n, k}), out("dlogits", {n, e})},
          [renorm](const std::vector<Tensor>& t, Stream& s) {
            if (ops::runs_on_cuda(t[4])) {
              ops::router_backward(t[0], t[1], t[2], t[3], renorm, t[4], s);
            } else {
              router_backward_skip_rule(t[0], t[1], t[2], t[3], renorm, t[4]);
            }
          }});
    }
  }

  add_sigmoid_group_limited_cases(cases);
  return cases;
}

}  // namespace moepeak::testing::backend_ops
