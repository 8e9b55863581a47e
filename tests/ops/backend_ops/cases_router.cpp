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
#include <algorithm>
#include <numeric>
#include <random>
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
  return cases;
}

}  // namespace moepeak::testing::backend_ops
