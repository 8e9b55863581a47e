// MoE ops on the CPU backend: the router (softmax, top-k, renormalisation), the experts' SwiGLU,
// and the row gather / scatter-add / weighted combine of the standard dispatch schedule. Same
// checks as test_dense_ops.cpp: float64 forward against a plain reference, input gradients
// against central finite differences, float vs double, accumulation, and errors. Bf16Storage at
// the end: with bf16 storage each op is its f32 path plus one rounding per output, except where
// ops/permute.h and ops/router.h say otherwise (runs of additions, selection on rounded probs).
// It also holds the bf16 tests of the embedding (its f32/f64 tests: test_vocab_ops.cpp) and fill.
// Run: ./build-ops/tests/ops/test_moe_ops
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/dtype.h"
#include "ops/embedding.h"
#include "ops/fill.h"
#include "ops/permute.h"
#include "ops/router.h"
#include "ops/swiglu.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::all_finite;
using testing::dot;
using testing::grad_err;
using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::kGradTol;
using testing::max_rel_err;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_float;

using testing::bf16_bits;
using testing::expect_bf16_is_f32_rounded_once;
using testing::expect_stream_error;
using testing::make_input;
using testing::rounded_to_bf16;

// ---------------------------------------------------------------------------------------------
// Router: logits (N, E), top-k

constexpr int64_t kTokens = 5, kExperts = 6;
constexpr int kTopK = 2;
constexpr auto kSoftmaxFirst = ops::RouterScore::softmax_then_topk;  // gpt-oss's: test_gpt_oss_ops

struct RouterForward {
  std::vector<double> probs, index, weight;
};

// f32 | bf16 | f64; `renormalize` false: Qwen3-MoE without norm_topk_prob.
RouterForward run_router_forward(OpEnv& env, DType dtype, const std::vector<double>& logits,
                                 int64_t tokens, int64_t experts, int k, bool renormalize = true) {
  auto lt = make_input(env, {tokens, experts}, dtype, logits);
  auto probs = env.output({tokens, experts}, dtype);
  auto index = env.output({tokens, k}, DType::i32);
  auto weight = env.output({tokens, k}, dtype);
  ops::router_forward_cpu(lt, k, kSoftmaxFirst, renormalize, probs, index, weight, env.stream());
  return {env.read(probs), env.read(index), env.read(weight)};
}

// dlogits from dtopk_weight, through a fresh forward in the same dtype.
std::vector<double> run_router_backward(OpEnv& env, DType dtype, const std::vector<double>& logits,
                                        const std::vector<double>& dweight,
                                        bool renormalize = true) {
  auto lt = make_input(env, {kTokens, kExperts}, dtype, logits);
  auto probs = env.output({kTokens, kExperts}, dtype);
  auto index = env.output({kTokens, kTopK}, DType::i32);
  auto weight = env.output({kTokens, kTopK}, dtype);
  ops::router_forward_cpu(lt, kTopK, kSoftmaxFirst, renormalize, probs, index, weight,
                          env.stream());
  auto dw = make_input(env, {kTokens, kTopK}, dtype, dweight);
  auto dlogits = env.output({kTokens, kExperts}, dtype);
  ops::router_backward_cpu(probs, index, weight, dw, renormalize, dlogits, env.stream());
  return env.read(dlogits);
}

// Plain reference: softmax in double, experts sorted by (probability desc, index asc).
RouterForward router_reference(const std::vector<double>& logits, int64_t tokens, int64_t experts,
                               int k) {
  RouterForward ref;
  for (int64_t n = 0; n < tokens; ++n) {
    const double* l = logits.data() + n * experts;
    double row_max = *std::max_element(l, l + experts), sum = 0;
    std::vector<double> p(experts);
    for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(l[e] - row_max));
    for (auto& v : p) v /= sum;
    std::vector<int64_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += p[order[j]];
    ref.probs.insert(ref.probs.end(), p.begin(), p.end());
    for (int j = 0; j < k; ++j) {
      ref.index.push_back(static_cast<double>(order[j]));
      ref.weight.push_back(p[order[j]] / chosen);
    }
  }
  return ref;
}

// The smallest gap between neighbours among each row's k+1 most probable experts: selection and
// order cannot change under a finite-difference step much smaller than this.
double smallest_topk_gap(const std::vector<double>& probs) {
  double gap = 1.0;
  for (int64_t n = 0; n < kTokens; ++n) {
    std::vector<double> p(probs.begin() + n * kExperts, probs.begin() + (n + 1) * kExperts);
    std::sort(p.rbegin(), p.rend());
    for (int j = 0; j < kTopK; ++j) gap = std::min(gap, p[j] - p[j + 1]);
  }
  return gap;
}

TEST(Router, ForwardMatchesReference) {
  OpEnv env;
  auto logits = random_vector(kTokens * kExperts, 60, 2.0);
  for (int k : {1, kTopK, static_cast<int>(kExperts)}) {
    RouterForward got = run_router_forward(env, DType::f64, logits, kTokens, kExperts, k);
    RouterForward ref = router_reference(logits, kTokens, kExperts, k);
    EXPECT_LT(max_rel_err(got.probs, ref.probs), kForwardTol) << "k=" << k;
    EXPECT_EQ(got.index, ref.index) << "k=" << k;
    EXPECT_LT(max_rel_err(got.weight, ref.weight), kForwardTol) << "k=" << k;
    for (int64_t n = 0; n < kTokens; ++n) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += got.weight[n * k + j];
      EXPECT_NEAR(s, 1.0, 1e-14);
    }
  }
}

TEST(Router, TiesGoToTheLowerExpertIndex) {
  OpEnv env;
  // Row 0: three experts tie for first place; row 1: all equal; row 2: a tie for second place.
  std::vector<double> logits = {1.0,  3.0,  3.0, 0.5,  3.0, -1.0,  //
                                0.7,  0.7,  0.7, 0.7,  0.7, 0.7,   //
                                -2.0, 0.25, 4.0, 0.25, 0.1, 0.25};
  for (DType dtype : {DType::f64, DType::f32}) {
    RouterForward got = run_router_forward(env, dtype, logits, 3, kExperts, 3);
    EXPECT_EQ(got.index, (std::vector<double>{1, 2, 4, 0, 1, 2, 2, 1, 3}));
    EXPECT_LT(max_scaled_err(got.weight, router_reference(logits, 3, kExperts, 3).weight),
              dtype == DType::f64 ? kForwardTol : kFloatVsDoubleTol);
    EXPECT_EQ(got.weight[0], got.weight[1]);
    EXPECT_EQ(got.weight[3], got.weight[5]);
  }
}

TEST(Router, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto logits = random_vector(kTokens * kExperts, 61, 1.5);
  auto probe = random_vector(kTokens * kTopK, 62);
  RouterForward fwd = run_router_forward(env, DType::f64, logits, kTokens, kExperts, kTopK);
  // No near-ties: the finite-difference steps (up to 2 * kGradStep = 2e-3 on one logit) move a
  // probability by at most 5e-4, well below the smallest gap, so selection and order hold.
  ASSERT_GT(smallest_topk_gap(fwd.probs), 1e-2);
  auto dlogits = run_router_backward(env, DType::f64, logits, probe);
  auto loss = [&] {
    return dot(run_router_forward(env, DType::f64, logits, kTokens, kExperts, kTopK).weight, probe);
  };
  EXPECT_LT(grad_err(logits, dlogits, loss), kGradTol);
  // Experts that were not chosen get exactly zero gradient.
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t e = 0; e < kExperts; ++e) {
      bool chosen = false;
      for (int j = 0; j < kTopK; ++j) chosen |= fwd.index[n * kTopK + j] == e;
      if (!chosen) {
        EXPECT_EQ(dlogits[n * kExperts + e], 0.0) << n << "," << e;
      }
    }
  }
}

TEST(Router, FloatMatchesDouble) {
  OpEnv env;
  auto logits = rounded_to_float(random_vector(kTokens * kExperts, 63, 1.5));
  auto dweight = rounded_to_float(random_vector(kTokens * kTopK, 64));
  RouterForward f = run_router_forward(env, DType::f32, logits, kTokens, kExperts, kTopK);
  RouterForward d = run_router_forward(env, DType::f64, logits, kTokens, kExperts, kTopK);
  ASSERT_GT(smallest_topk_gap(d.probs), 1e-3);  // far from ties: both pick the same experts
  EXPECT_EQ(f.index, d.index);
  EXPECT_LT(max_scaled_err(f.probs, d.probs), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(f.weight, d.weight), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(run_router_backward(env, DType::f32, logits, dweight),
                           run_router_backward(env, DType::f64, logits, dweight)),
            kFloatVsDoubleTol);
}

TEST(Router, RejectsBadArguments) {
  OpEnv env;
  auto logits = env.input({kTokens, kExperts}, DType::f64, random_vector(kTokens * kExperts, 65));
  auto probs = env.output({kTokens, kExperts}, DType::f64);
  auto index = env.output({kTokens, kTopK}, DType::i32);
  auto index_i64 = env.output({kTokens, kTopK}, DType::i64);
  auto weight = env.output({kTokens, kTopK}, DType::f64);
  auto weight_bad = env.output({kTokens, kTopK + 1}, DType::f64);
  Stream& s = env.stream();
  auto forward = [&](int k, const Tensor& idx, const Tensor& w) {
    ops::router_forward_cpu(logits, k, kSoftmaxFirst, true, probs, idx, w, s);
  };
  EXPECT_THROW(forward(0, index, weight), Error);
  EXPECT_THROW(forward(kExperts + 1, index, weight), Error);
  EXPECT_THROW(forward(kTopK, index_i64, weight), Error);
  EXPECT_THROW(forward(kTopK, index, weight_bad), Error);
  EXPECT_THROW(ops::router_backward_cpu(probs, index, weight_bad, weight, true, probs, s), Error);
  EXPECT_THROW(ops::router_backward_cpu(probs, index, weight, weight, true, weight, s), Error);
  s.synchronize();

  // Indices are data: an expert outside [0, E) or chosen twice fails on the stream.
  auto bad_stream = env.backend().create_stream("router errors");
  std::vector<int64_t> ids(kTokens * kTopK, 0);
  for (int64_t n = 0; n < kTokens; ++n) ids[n * kTopK + 1] = 1;
  ids[3 * kTopK + 1] = kExperts;
  auto bad_index = env.indices({kTokens, kTopK}, DType::i32, ids);
  auto w = env.input({kTokens, kTopK}, DType::f64, random_vector(kTokens * kTopK, 66));
  auto dlogits = env.output({kTokens, kExperts}, DType::f64);
  ops::router_backward_cpu(probs, bad_index, w, w, true, dlogits, *bad_stream);
  expect_stream_error(*bad_stream, {"router_backward_cpu", "topk_index[3, 1] = 6"});
  auto dup_stream = env.backend().create_stream("router duplicates");
  ids[3 * kTopK + 1] = 0;
  auto dup_index = env.indices({kTokens, kTopK}, DType::i32, ids);
  ops::router_backward_cpu(probs, dup_index, w, w, true, dlogits, *dup_stream);
  expect_stream_error(*dup_stream, {"expert 0 chosen twice in row 3"});
  auto full_stream = env.backend().create_stream("router duplicates, not renormalised");
  ops::router_backward_cpu(probs, dup_index, w, w, false, dlogits, *full_stream);
  expect_stream_error(*full_stream, {"router_backward_cpu", "expert 0 chosen twice in row 3"});
}

// Without renormalisation (Qwen3-MoE, norm_topk_prob false): topk_weight is the chosen probs,
// bit for bit, and dlogits[e] = p_e * (g_e - s) reaches every expert (ops/router.h).
TEST(Router, UnnormalisedWeightsAreTheChosenProbs) {
  OpEnv env;
  const auto logits = rounded_to_bf16(random_vector(kTokens * kExperts, 67, 1.5));
  const RouterForward ref = router_reference(logits, kTokens, kExperts, kTopK);
  ASSERT_GT(smallest_topk_gap(ref.probs), 1e-2);  // bf16 probs (2^-9 relative) keep the order
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    RouterForward got = run_router_forward(env, dtype, logits, kTokens, kExperts, kTopK, false);
    EXPECT_EQ(got.index, ref.index) << dtype_name(dtype);
    // probs are the renormalising run's; the weights are copies of them.
    EXPECT_EQ(got.probs, run_router_forward(env, dtype, logits, kTokens, kExperts, kTopK).probs);
    for (int64_t i = 0; i < kTokens * kTopK; ++i) {
      EXPECT_EQ(got.weight[i], got.probs[i / kTopK * kExperts + int64_t(got.index[i])]) << i;
    }
  }
}

TEST(Router, UnnormalisedBackwardMatchesFiniteDifferences) {
  OpEnv env;
  // bf16 values, so that every storage starts from the same logits and loss coefficients c.
  auto logits = rounded_to_bf16(random_vector(kTokens * kExperts, 68, 1.5));
  const auto c = rounded_to_bf16(random_vector(kTokens * kTopK, 69));
  auto forward = [&] {
    return run_router_forward(env, DType::f64, logits, kTokens, kExperts, kTopK, false);
  };
  const RouterForward fwd = forward();
  ASSERT_GT(smallest_topk_gap(fwd.probs), 1e-2);  // as in BackwardMatchesFiniteDifferences
  const auto dlogits = run_router_backward(env, DType::f64, logits, c, false);
  EXPECT_LT(grad_err(logits, dlogits, [&] { return dot(forward().weight, c); }), kGradTol);
  // grad_err covers every logit: an unchosen expert gets -p_e * s, not the renormalised 0.
  // f32 (measured 7e-8 here): kFloatVsDoubleTol. bf16: probs (so the weights) and the output are
  // each rounded once, 2^-9 = 2e-3 relative: 3.4e-3 of the output's scale here and at most 5.1e-3
  // over 52 other seeds far from ties; kBf16VsDoubleTol = 1e-2 leaves a factor 2.
  constexpr double kBf16VsDoubleTol = 1e-2;
  EXPECT_LT(max_scaled_err(run_router_backward(env, DType::f32, logits, c, false), dlogits),
            kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(run_router_backward(env, DType::bf16, logits, c, false), dlogits),
            kBf16VsDoubleTol);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: a, b (M, F)

constexpr int64_t kM = 4, kF = 9;

std::vector<double> run_swiglu_forward(OpEnv& env, DType dtype, int64_t m,
                                       const std::vector<double>& a, const std::vector<double>& b) {
  auto at = env.input({m, kF}, dtype, a);
  auto bt = env.input({m, kF}, dtype, b);
  auto h = env.output({m, kF}, dtype);
  ops::swiglu_forward_cpu(at, bt, h, env.stream());
  return env.read(h);
}

struct SwigluGrads {
  std::vector<double> da, db;
};

SwigluGrads run_swiglu_backward(OpEnv& env, DType dtype, const std::vector<double>& a,
                                const std::vector<double>& b, const std::vector<double>& dh) {
  auto at = env.input({kM, kF}, dtype, a);
  auto bt = env.input({kM, kF}, dtype, b);
  auto dht = env.input({kM, kF}, dtype, dh);
  auto da = env.output({kM, kF}, dtype);
  auto db = env.output({kM, kF}, dtype);
  ops::swiglu_backward_cpu(at, bt, dht, da, db, env.stream());
  return {env.read(da), env.read(db)};
}

TEST(Swiglu, ForwardMatchesReference) {
  OpEnv env;
  auto a = random_vector(kM * kF, 70, 3.0);  // reaches well into both tails of the sigmoid
  auto b = random_vector(kM * kF, 71);
  std::vector<double> ref(a.size());
  for (size_t i = 0; i < a.size(); ++i) ref[i] = a[i] / (1 + std::exp(-a[i])) * b[i];
  EXPECT_LT(max_rel_err(run_swiglu_forward(env, DType::f64, kM, a, b), ref), kForwardTol);
  EXPECT_TRUE(run_swiglu_forward(env, DType::f64, 0, {}, {}).empty());  // an idle expert
}

TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto a = random_vector(kM * kF, 72, 3.0);
  auto b = random_vector(kM * kF, 73);
  auto probe = random_vector(kM * kF, 74);
  SwigluGrads g = run_swiglu_backward(env, DType::f64, a, b, probe);
  auto loss = [&] { return dot(run_swiglu_forward(env, DType::f64, kM, a, b), probe); };
  EXPECT_LT(grad_err(a, g.da, loss), kGradTol);
  EXPECT_LT(grad_err(b, g.db, loss), kGradTol);
}

TEST(Swiglu, FloatMatchesDouble) {
  OpEnv env;
  auto a = rounded_to_float(random_vector(kM * kF, 75, 3.0));
  auto b = rounded_to_float(random_vector(kM * kF, 76));
  auto dh = rounded_to_float(random_vector(kM * kF, 77));
  EXPECT_LT(max_scaled_err(run_swiglu_forward(env, DType::f32, kM, a, b),
                           run_swiglu_forward(env, DType::f64, kM, a, b)),
            kFloatVsDoubleTol);
  SwigluGrads gf = run_swiglu_backward(env, DType::f32, a, b, dh);
  SwigluGrads gd = run_swiglu_backward(env, DType::f64, a, b, dh);
  EXPECT_LT(max_scaled_err(gf.da, gd.da), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(gf.db, gd.db), kFloatVsDoubleTol);
}

TEST(Swiglu, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto a = env.input({kM, kF}, DType::f64, random_vector(kM * kF, 78));
  auto b_bad = env.input({kM, kF + 1}, DType::f64, random_vector(kM * (kF + 1), 79));
  auto b32 = env.input({kM, kF}, DType::f32, random_vector(kM * kF, 80));
  auto h = env.output({kM, kF}, DType::f64);
  EXPECT_THROW(ops::swiglu_forward_cpu(a, b_bad, h, env.stream()), Error);
  EXPECT_THROW(ops::swiglu_forward_cpu(a, b32, h, env.stream()), Error);
  EXPECT_THROW(ops::swiglu_backward_cpu(a, a, a, h, b_bad, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// Row gather / scatter-add / combine: token side (N, H), routed side (M, H), index (M) i32

constexpr int64_t kRowsN = 4, kRoutedM = 7, kHidden = 5;
// Routed rows grouped by expert; tokens 0 and 2 are sent to two experts.
const std::vector<int64_t> kIndex = {0, 2, 3, 1, 2, 0, 3};

std::vector<double> run_gather(OpEnv& env, DType dtype, const std::vector<double>& src) {
  auto st = env.input({kRowsN, kHidden}, dtype, src);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto dst = env.output({kRoutedM, kHidden}, dtype);
  ops::gather_rows_cpu(st, index, dst, env.stream());
  return env.read(dst);
}

std::vector<double> run_scatter_add(OpEnv& env, DType dtype, const std::vector<double>& src,
                                    const std::vector<double>& dst_init) {
  auto st = env.input({kRoutedM, kHidden}, dtype, src);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto dst = env.input({kRowsN, kHidden}, dtype, dst_init);
  ops::scatter_add_rows_cpu(st, index, dst, env.stream());
  return env.read(dst);
}

std::vector<double> run_combine(OpEnv& env, DType dtype, const std::vector<double>& y,
                                const std::vector<double>& weight,
                                const std::vector<double>& out_init) {
  auto yt = env.input({kRoutedM, kHidden}, dtype, y);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto wt = env.input({kRoutedM}, dtype, weight);
  auto out = env.input({kRowsN, kHidden}, dtype, out_init);
  ops::combine_rows_cpu(yt, index, wt, out, env.stream());
  return env.read(out);
}

struct CombineGrads {
  std::vector<double> dy, dweight;
};

CombineGrads run_combine_backward(OpEnv& env, DType dtype, const std::vector<double>& dout,
                                  const std::vector<double>& y, const std::vector<double>& weight) {
  auto doutt = env.input({kRowsN, kHidden}, dtype, dout);
  auto yt = env.input({kRoutedM, kHidden}, dtype, y);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto wt = env.input({kRoutedM}, dtype, weight);
  auto dy = env.output({kRoutedM, kHidden}, dtype);
  auto dweight = env.output({kRoutedM}, dtype);
  ops::combine_rows_backward_cpu(doutt, yt, index, wt, dy, dweight, env.stream());
  return {env.read(dy), env.read(dweight)};
}

TEST(Permute, GatherAndScatterAddMatchReference) {
  OpEnv env;
  auto src = random_vector(kRowsN * kHidden, 90);
  auto gathered = run_gather(env, DType::f64, src);
  for (int64_t i = 0; i < kRoutedM; ++i) {
    for (int64_t h = 0; h < kHidden; ++h) {
      EXPECT_EQ(gathered[i * kHidden + h], src[kIndex[i] * kHidden + h]);
    }
  }
  // Scatter-add accumulates in increasing i: the same additions in the same order, bit for bit.
  auto routed = random_vector(kRoutedM * kHidden, 91);
  auto init = random_vector(kRowsN * kHidden, 92);
  auto ref = init;
  for (int64_t i = 0; i < kRoutedM; ++i) {
    for (int64_t h = 0; h < kHidden; ++h) ref[kIndex[i] * kHidden + h] += routed[i * kHidden + h];
  }
  EXPECT_EQ(run_scatter_add(env, DType::f64, routed, init), ref);
}

TEST(Permute, ScatterAddIsTheGradientOfGather) {
  OpEnv env;
  auto src = random_vector(kRowsN * kHidden, 93);
  auto probe = random_vector(kRoutedM * kHidden, 94);
  auto dsrc = run_scatter_add(env, DType::f64, probe, std::vector<double>(kRowsN * kHidden, 0.0));
  auto loss = [&] { return dot(run_gather(env, DType::f64, src), probe); };
  EXPECT_LT(grad_err(src, dsrc, loss), kGradTol);
}

TEST(Permute, CombineMatchesReferenceAndAccumulates) {
  OpEnv env;
  auto y = random_vector(kRoutedM * kHidden, 95);
  auto weight = random_vector(kRoutedM, 96);
  auto init = random_vector(kRowsN * kHidden, 97);
  auto ref = init;
  for (int64_t i = 0; i < kRoutedM; ++i) {
    for (int64_t h = 0; h < kHidden; ++h) {
      ref[kIndex[i] * kHidden + h] += weight[i] * y[i * kHidden + h];
    }
  }
  EXPECT_EQ(run_combine(env, DType::f64, y, weight, init), ref);
}

TEST(Permute, CombineBackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto y = random_vector(kRoutedM * kHidden, 98);
  auto weight = random_vector(kRoutedM, 99);
  auto init = random_vector(kRowsN * kHidden, 100);
  auto probe = random_vector(kRowsN * kHidden, 101);
  CombineGrads g = run_combine_backward(env, DType::f64, probe, y, weight);
  auto loss = [&] { return dot(run_combine(env, DType::f64, y, weight, init), probe); };
  EXPECT_LT(grad_err(y, g.dy, loss), kGradTol);
  EXPECT_LT(grad_err(weight, g.dweight, loss), kGradTol);

  // dy may overwrite y in place.
  auto doutt = env.input({kRowsN, kHidden}, DType::f64, probe);
  auto yt = env.input({kRoutedM, kHidden}, DType::f64, y);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto wt = env.input({kRoutedM}, DType::f64, weight);
  auto dweight = env.output({kRoutedM}, DType::f64);
  ops::combine_rows_backward_cpu(doutt, yt, index, wt, yt, dweight, env.stream());
  EXPECT_EQ(env.read(yt), g.dy);
  EXPECT_EQ(env.read(dweight), g.dweight);
}

TEST(Permute, FloatMatchesDouble) {
  OpEnv env;
  auto tokens = rounded_to_float(random_vector(kRowsN * kHidden, 102));
  auto routed = rounded_to_float(random_vector(kRoutedM * kHidden, 103));
  auto weight = rounded_to_float(random_vector(kRoutedM, 104));
  auto init = rounded_to_float(random_vector(kRowsN * kHidden, 105));
  EXPECT_EQ(run_gather(env, DType::f32, tokens), run_gather(env, DType::f64, tokens));
  EXPECT_LT(max_scaled_err(run_scatter_add(env, DType::f32, routed, init),
                           run_scatter_add(env, DType::f64, routed, init)),
            kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(run_combine(env, DType::f32, routed, weight, init),
                           run_combine(env, DType::f64, routed, weight, init)),
            kFloatVsDoubleTol);
  CombineGrads gf = run_combine_backward(env, DType::f32, tokens, routed, weight);
  CombineGrads gd = run_combine_backward(env, DType::f64, tokens, routed, weight);
  EXPECT_LT(max_scaled_err(gf.dy, gd.dy), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(gf.dweight, gd.dweight), kFloatVsDoubleTol);
}

TEST(Permute, NoRoutedRows) {
  OpEnv env;
  auto tokens = env.input({kRowsN, kHidden}, DType::f64, random_vector(kRowsN * kHidden, 106));
  auto before = env.read(tokens);
  auto empty_index = env.indices({0}, DType::i32, {});
  auto empty_rows = env.output({0, kHidden}, DType::f64);
  auto empty_weight = env.output({0}, DType::f64);
  ops::gather_rows_cpu(tokens, empty_index, empty_rows, env.stream());
  ops::scatter_add_rows_cpu(empty_rows, empty_index, tokens, env.stream());
  ops::combine_rows_cpu(empty_rows, empty_index, empty_weight, tokens, env.stream());
  ops::combine_rows_backward_cpu(tokens, empty_rows, empty_index, empty_weight, empty_rows,
                                 empty_weight, env.stream());
  EXPECT_EQ(env.read(tokens), before);
}

TEST(Permute, RejectsBadArguments) {
  OpEnv env;
  auto tokens = env.input({kRowsN, kHidden}, DType::f64, random_vector(kRowsN * kHidden, 107));
  auto routed = env.output({kRoutedM, kHidden}, DType::f64);
  auto routed_wide = env.output({kRoutedM, kHidden + 1}, DType::f64);
  auto index = env.indices({kRoutedM}, DType::i32, kIndex);
  auto index_i64 = env.indices({kRoutedM}, DType::i64, kIndex);
  auto weight_short = env.output({kRoutedM - 1}, DType::f64);
  Stream& s = env.stream();
  EXPECT_THROW(ops::gather_rows_cpu(tokens, index, routed_wide, s), Error);
  EXPECT_THROW(ops::gather_rows_cpu(tokens, index_i64, routed, s), Error);
  EXPECT_THROW(ops::scatter_add_rows_cpu(routed_wide, index, tokens, s), Error);
  EXPECT_THROW(ops::combine_rows_cpu(routed, index, weight_short, tokens, s), Error);
  EXPECT_THROW(
      ops::combine_rows_backward_cpu(tokens, routed, index, weight_short, routed, weight_short, s),
      Error);
  s.synchronize();

  // An index outside [0, N) fails on the stream, naming the position; nothing is added.
  std::vector<int64_t> bad = kIndex;
  bad[5] = kRowsN;
  auto bad_index = env.indices({kRoutedM}, DType::i32, bad);
  auto before = env.read(tokens);
  auto scatter_stream = env.backend().create_stream("scatter errors");
  auto routed_src =
      env.input({kRoutedM, kHidden}, DType::f64, random_vector(kRoutedM * kHidden, 108));
  ops::scatter_add_rows_cpu(routed_src, bad_index, tokens, *scatter_stream);
  expect_stream_error(*scatter_stream, {"scatter_add_rows_cpu", "index 4 at position 5"});
  EXPECT_EQ(env.read(tokens), before);
  auto gather_stream = env.backend().create_stream("gather errors");
  bad[2] = -1;
  auto negative_index = env.indices({kRoutedM}, DType::i32, bad);
  ops::gather_rows_cpu(tokens, negative_index, routed, *gather_stream);
  expect_stream_error(*gather_stream, {"gather_rows_cpu", "index -1 at position 2"});
}

// ---------------------------------------------------------------------------------------------
// bf16 storage (ops/cpu/cpu_storage.h): fp32 arithmetic and one rounding to bf16 per output, so
// where the op's semantics allow, a bf16 run is the f32 run on the same (bf16) values with every
// output rounded once to bf16, bit for bit. (The helpers: dense_ops_testing.h.)

TEST(Bf16Storage, SwigluIsTheF32ResultRoundedOnce) {
  OpEnv env;
  const auto a = rounded_to_bf16(random_vector(kM * kF, 170, 4.0));
  const auto b = rounded_to_bf16(random_vector(kM * kF, 171));
  const auto dh = rounded_to_bf16(random_vector(kM * kF, 172));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto at = make_input(env, {kM, kF}, dt, a), bt = make_input(env, {kM, kF}, dt, b);
    r.push_back(env.output({kM, kF}, dt));
    ops::swiglu_forward_cpu(at, bt, r.back(), env.stream());
    r.push_back(env.output({kM, kF}, dt));
    r.push_back(env.output({kM, kF}, dt));
    auto dht = make_input(env, {kM, kF}, dt, dh);  // inputs live until the stream has run
    ops::swiglu_backward_cpu(at, bt, dht, r[1], r[2], env.stream());
    env.stream().synchronize();
    return r;
  });
}

TEST(Bf16Storage, PermuteIsTheF32ResultRoundedOnceWhereNoRowRepeats) {
  OpEnv env;
  const auto tokens = rounded_to_bf16(random_vector(kRowsN * kHidden, 180));
  const auto routed = rounded_to_bf16(random_vector(kRoutedM * kHidden, 181));
  const auto weight = rounded_to_bf16(random_vector(kRoutedM, 182));
  // kIndex sends tokens 0 and 2 twice (not consecutively): the gather and the backward round
  // once per output; the scatters are compared on the first kRowsN positions, a permutation.
  const std::vector<int64_t> perm = {2, 0, 3, 1};
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto tt = make_input(env, {kRowsN, kHidden}, dt, tokens);
    auto yt = make_input(env, {kRoutedM, kHidden}, dt, routed);
    auto wt = make_input(env, {kRoutedM}, dt, weight);
    auto index = env.indices({kRoutedM}, DType::i32, kIndex);
    r.push_back(env.output({kRoutedM, kHidden}, dt));
    ops::gather_rows_cpu(tt, index, r.back(), env.stream());
    r.push_back(env.output({kRoutedM, kHidden}, dt));
    r.push_back(env.output({kRoutedM}, dt));
    ops::combine_rows_backward_cpu(tt, yt, index, wt, r[1], r[2], env.stream());
    auto pi = env.indices({kRowsN}, DType::i32, perm);
    auto head = yt.view().rows(0, kRowsN);
    r.push_back(make_input(env, {kRowsN, kHidden}, dt, tokens));
    ops::scatter_add_rows_cpu(head, pi, r.back(), env.stream());
    r.push_back(make_input(env, {kRowsN, kHidden}, dt, tokens));
    ops::combine_rows_cpu(head, pi, wt.view().rows(0, kRowsN), r.back(), env.stream());
    env.stream().synchronize();
    return r;
  });
}

TEST(Bf16Storage, ScatterSumsEachRunOfOneRowInFp32AndRoundsOnce) {
  // ops/permute.h: consecutive positions on one row within a chunk of 256 are summed in fp32 and
  // rounded once; every other addition rounds to bf16. 300 positions on row 0 (two chunks: 256
  // and 44), then rows 1 and 2 alternating (a rounding each), then row 2 three times (one).
  OpEnv env;
  constexpr int64_t kN = 3, kH = 4, kChunk = 256;
  std::vector<int64_t> index(300, 0);
  for (int i = 0; i < 20; ++i) index.push_back(1 + i % 2);
  for (int i = 0; i < 3; ++i) index.push_back(2);
  const auto m = static_cast<int64_t>(index.size());
  const auto y = rounded_to_bf16(random_vector(m * kH, 190));
  const auto w = rounded_to_bf16(random_vector(m, 191));
  const auto init = rounded_to_bf16(random_vector(kN * kH, 192));
  for (bool weighted : {false, true}) {
    std::vector<float> dst(init.begin(), init.end());  // bf16 values, held in fp32
    for (int64_t i = 0; i < m;) {
      int64_t end = i + 1;
      while (end < m && end % kChunk != 0 && index[end] == index[i]) ++end;
      for (int64_t h = 0; h < kH; ++h) {
        float acc = dst[index[i] * kH + h];
        for (int64_t j = i; j < end; ++j) {
          acc += (weighted ? static_cast<float>(w[j]) : 1.0f) * static_cast<float>(y[j * kH + h]);
        }
        dst[index[i] * kH + h] = static_cast<float>(bf16(acc));
      }
      i = end;
    }
    std::vector<uint16_t> want(dst.size());
    for (size_t e = 0; e < dst.size(); ++e) want[e] = bf16(dst[e]).bits;
    auto yt = make_input(env, {m, kH}, DType::bf16, y);
    auto it = env.indices({m}, DType::i32, index);
    auto wt = make_input(env, {m}, DType::bf16, w);
    auto out = make_input(env, {kN, kH}, DType::bf16, init);
    if (weighted) {
      ops::combine_rows_cpu(yt, it, wt, out, env.stream());
    } else {
      ops::scatter_add_rows_cpu(yt, it, out, env.stream());
    }
    EXPECT_EQ(bf16_bits(env, out), want) << (weighted ? "combine_rows" : "scatter_add_rows");
  }
}

TEST(Bf16Storage, RouterRoundsProbsOnceAndSelectsOnTheRoundedProbs) {
  OpEnv env;
  constexpr int64_t kN = 4, kE = 4;
  constexpr int kK = 2;
  // Row 0: p0 < p1 in fp32 (logits 0 and 2^-10) but both round to one bf16 value, so bf16 picks
  // expert 0 first (ties to the lower index) where f32 picks expert 1.
  auto logits = random_vector(kN * kE, 200, 1.5);
  std::copy_n(std::vector<double>{0.0, 1.0 / 1024, -3.0, -3.0}.begin(), kE, logits.begin());
  logits = rounded_to_bf16(logits);
  const auto weight = rounded_to_bf16(random_vector(kN * kK, 201, 0.3));
  const auto dweight = rounded_to_bf16(random_vector(kN * kK, 202));
  const auto dprobs = rounded_to_bf16(random_vector(kE, 203));
  const auto dl0 = rounded_to_bf16(random_vector(kN * kE, 204));
  const auto probs_in = rounded_to_bf16(random_vector(kN * kE, 205, 0.3));  // the aux's input
  const std::vector<int64_t> chosen = {3, 1, 0, 2, 2, 3, 1, 0};
  // probs, the backward and the aux backward: the f32 results rounded once.
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    // Inputs live until the stream has run.
    auto lt = make_input(env, {kN, kE}, dt, logits), ci = env.indices({kN, kK}, DType::i32, chosen);
    auto wt = make_input(env, {kN, kK}, dt, weight), dwt = make_input(env, {kN, kK}, dt, dweight);
    auto dpt = make_input(env, {kE}, dt, dprobs), pt = make_input(env, {kN, kE}, dt, probs_in);
    r.push_back(env.output({kN, kE}, dt));
    auto index = env.output({kN, kK}, DType::i32), w = env.output({kN, kK}, dt);
    ops::router_forward_cpu(lt, kK, kSoftmaxFirst, true, r[0], index, w, env.stream());
    r.push_back(env.output({kN, kE}, dt));
    ops::router_backward_cpu(r[0], ci, wt, dwt, true, r[1], env.stream());
    r.push_back(make_input(env, {kN, kE}, dt, dl0));
    ops::router_aux_backward_cpu(pt, dpt, r[2], env.stream());
    env.stream().synchronize();
    return r;
  });
  // topk_index and topk_weight: the repeated arg-max over the bf16 probs and bf16(fp32(p / the
  // chosen sum in double)) of them.
  auto probs = env.output({kN, kE}, DType::bf16), w = env.output({kN, kK}, DType::bf16);
  auto index = env.output({kN, kK}, DType::i32);
  auto lt = make_input(env, {kN, kE}, DType::bf16, logits);
  ops::router_forward_cpu(lt, kK, kSoftmaxFirst, true, probs, index, w, env.stream());
  env.stream().synchronize();
  std::vector<double> p(kN * kE);
  for (int64_t e = 0; e < kN * kE; ++e) p[e] = static_cast<float>(probs.data_as<bf16>()[e]);
  ASSERT_EQ(p[0], p[1]) << "row 0 ties in bf16";
  ASSERT_EQ(run_router_forward(env, DType::f32, logits, kN, kE, kK).index[0], 1.0)
      << "row 0 does not tie in f32";
  std::vector<double> want_index;
  std::vector<uint16_t> want_weight;
  for (int64_t n = 0; n < kN; ++n) {
    std::vector<int64_t> order(kE);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return p[n * kE + a] > p[n * kE + b]; });
    double sum = 0;
    for (int j = 0; j < kK; ++j) sum += p[n * kE + order[j]];
    for (int j = 0; j < kK; ++j) {
      want_index.push_back(static_cast<double>(order[j]));
      want_weight.push_back(bf16(static_cast<float>(p[n * kE + order[j]] / sum)).bits);
    }
  }
  EXPECT_EQ(env.read(index), want_index);
  EXPECT_EQ(want_index[0], 0.0);
  EXPECT_EQ(bf16_bits(env, w), want_weight);
}

TEST(Bf16Storage, UnnormalisedRouterIsTheF32ResultRoundedOnce) {
  OpEnv env;
  constexpr int64_t kN = 4, kE = 5, kK = 2;
  // Logits far from ties, so bf16 selects what f32 does; then topk_weight (the chosen probs) is
  // the f32 one rounded once, as probs is. The backward runs from the same (bf16) inputs.
  const auto logits = rounded_to_bf16({0.9,  -1.2, 2.1, 0.1, -0.4, 1.5, 0.2,  -2.0, 0.8, -0.6,
                                       -1.0, 0.6,  1.7, 2.6, 0.0,  0.3, -0.9, 1.1,  2.2, -1.6});
  const auto probs_in = rounded_to_bf16(random_vector(kN * kE, 210, 0.3));
  const auto dweight = rounded_to_bf16(random_vector(kN * kK, 211));
  const std::vector<int64_t> chosen = {2, 4, 0, 3, 1, 2, 4, 0};
  std::vector<double> weight;  // the chosen probs_in, as the forward would write them
  for (int64_t i = 0; i < kN * kK; ++i) weight.push_back(probs_in[i / kK * kE + chosen[i]]);
  std::vector<std::vector<double>> index, dlogits;  // per storage: f32, bf16
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto lt = make_input(env, {kN, kE}, dt, logits), pt = make_input(env, {kN, kE}, dt, probs_in);
    auto ci = env.indices({kN, kK}, DType::i32, chosen), i = env.output({kN, kK}, DType::i32);
    auto wt = make_input(env, {kN, kK}, dt, weight), dwt = make_input(env, {kN, kK}, dt, dweight);
    r.push_back(env.output({kN, kE}, dt));
    r.push_back(env.output({kN, kK}, dt));
    ops::router_forward_cpu(lt, kK, kSoftmaxFirst, false, r[0], i, r[1], env.stream());
    r.push_back(env.output({kN, kE}, dt));
    ops::router_backward_cpu(pt, ci, wt, dwt, false, r[2], env.stream());
    index.push_back(env.read(i));
    dlogits.push_back(env.read(r[2]));
    return r;
  });
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[0], index[1]);
  // And the f32 dlogits are p_e * (g_e - s) in double, rounded once.
  for (int64_t i = 0; i < kN * kE; ++i) {
    const int64_t n = i / kE, e = i % kE;
    double s = 0, g = 0;
    for (int64_t j = n * kK; j < (n + 1) * kK; ++j) {
      s += dweight[j] * weight[j];
      if (chosen[j] == e) g = dweight[j];
    }
    EXPECT_EQ(dlogits[0][i], static_cast<float>(probs_in[i] * (g - s))) << i;
  }
}

TEST(Bf16Storage, EmbeddingCopiesRowsAndRoundsEachAdditionOrTakesAnF32Dweight) {
  OpEnv env;
  constexpr int64_t kV = 6, kH = 9, kN = 5;
  const auto table = rounded_to_bf16(random_vector(kV * kH, 160));
  const auto dout = rounded_to_bf16(random_vector(kN * kH, 161));
  const auto dw0 = rounded_to_bf16(random_vector(kV * kH, 162));
  // Distinct ids: the forward copies, and each dweight row takes at most one addition, so the
  // backward is the f32 one rounded once.
  const std::vector<int64_t> distinct = {4, 0, 5, 2, 1};
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto ids = env.indices({kN}, DType::i64, distinct);
    r.push_back(env.output({kN, kH}, dt));
    auto tt = make_input(env, {kV, kH}, dt, table), dt_out = make_input(env, {kN, kH}, dt, dout);
    ops::embedding_forward_cpu(ids, tt, r.back(), env.stream());
    r.push_back(make_input(env, {kV, kH}, dt, dw0));
    ops::embedding_backward_cpu(ids, dt_out, r.back(), env.stream());
    env.stream().synchronize();
    return r;
  });
  // Repeated ids: with bf16 dweight every += rounds (ops/embedding.h); with an f32 dweight (the
  // fp32 main gradient) the sums are the f32 path's exactly.
  const std::vector<int64_t> repeated = {3, 1, 3, 3, 1};
  auto ids = env.indices({kN}, DType::i64, repeated);
  auto dout_b = make_input(env, {kN, kH}, DType::bf16, dout);
  auto dw_b = make_input(env, {kV, kH}, DType::bf16, dw0);
  ops::embedding_backward_cpu(ids, dout_b, dw_b, env.stream());
  std::vector<uint16_t> want(dw0.size());
  for (size_t i = 0; i < dw0.size(); ++i) want[i] = bf16(static_cast<float>(dw0[i])).bits;
  for (int64_t n = 0; n < kN; ++n) {
    for (int64_t h = 0; h < kH; ++h) {
      uint16_t& acc = want[repeated[n] * kH + h];
      acc = bf16(bf16::to_float(acc) + static_cast<float>(dout[n * kH + h])).bits;
    }
  }
  EXPECT_EQ(bf16_bits(env, dw_b), want);
  auto dout_f = env.input({kN, kH}, DType::f32, dout);
  auto dw_f32_path = env.input({kV, kH}, DType::f32, dw0);
  auto dw_main = env.input({kV, kH}, DType::f32, dw0);
  ops::embedding_backward_cpu(ids, dout_f, dw_f32_path, env.stream());
  ops::embedding_backward_cpu(ids, dout_b, dw_main, env.stream());
  EXPECT_EQ(env.read(dw_main), env.read(dw_f32_path));
  // The other mix (bf16 dweight for f32 dout) is rejected at the call.
  EXPECT_THROW(ops::embedding_backward_cpu(ids, dout_f, dw_b, env.stream()), Error);
  env.stream().synchronize();
}

TEST(Bf16Storage, FillWritesTheRoundedValue) {
  OpEnv env;
  auto t = make_input(env, {5}, DType::bf16, std::vector<double>(5, 2.0));
  ops::fill(t, 1.0 / 3.0, env.stream());
  EXPECT_EQ(bf16_bits(env, t), std::vector<uint16_t>(5, bf16(static_cast<float>(1.0 / 3.0)).bits));
  ops::fill(t, 0.0, env.stream());
  EXPECT_EQ(bf16_bits(env, t), std::vector<uint16_t>(5, 0));
}

}  // namespace
}  // namespace moepeak
