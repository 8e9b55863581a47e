// DeepSeek-V3's router on the CPU backend: router_forward / router_backward with
// RouterScore::sigmoid_group_limited and GroupLimitedRouting (ops/router.h), and the
// auxiliary-loss-free bias update (ops/router_balance.h). Float64 forward against a reference
// written from the formulas (random logits and biases, group limits 8/4 with E = 32, 64 and 256,
// 1/1 with E = 384, renormalised or not, scaling 2.5), hand-made ties and NaN rows, the backward
// against float64 finite differences, f32 against f64, bf16 against the same arithmetic in fp32
// bit for bit, every output poisoned with NaN before the run (OpEnv::output), and argument
// errors. CUDA against the CPU: tests/ops/backend_ops/cases_router.cpp.
// Run: ./build/tests/ops/test_router_group_limited
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/dtype.h"
#include "ops/router.h"
#include "ops/router_balance.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::bf16_bits;
using testing::dot;
using testing::expect_bf16_is_f32_rounded_once;
using testing::grad_err;
using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::kGradTol;
using testing::make_input;
using testing::max_rel_err;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_bf16;
using testing::rounded_to_float;

constexpr auto kSigmoid = ops::RouterScore::sigmoid_group_limited;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// One router configuration: E experts in `groups` groups, `topk_groups` kept, top k.
struct Routing {
  int64_t experts, groups, topk_groups;
  int k;
  bool renormalize;
  double scaling;
};

std::string describe(const Routing& r) {
  return "E=" + std::to_string(r.experts) + " groups=" + std::to_string(r.groups) + "/" +
         std::to_string(r.topk_groups) + " k=" + std::to_string(r.k) +
         (r.renormalize ? " norm" : " no norm") + " scaling=" + std::to_string(r.scaling);
}

struct RouterForward {
  std::vector<double> probs, index, weight;
};

DType bias_dtype(DType logits) { return logits == DType::f64 ? DType::f64 : DType::f32; }

// The forward in `dtype` (f32 | bf16 | f64); the bias in f32 (f64 for f64 logits).
RouterForward run_forward(OpEnv& env, DType dtype, const std::vector<double>& logits,
                          const std::vector<double>& bias, const Routing& r) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / r.experts;
  auto lt = make_input(env, {tokens, r.experts}, dtype, logits);
  auto bt = env.input({r.experts}, bias_dtype(dtype), bias);
  auto probs = env.output({tokens, r.experts}, dtype);
  auto index = env.output({tokens, r.k}, DType::i32);
  auto weight = env.output({tokens, r.k}, dtype);
  ops::router_forward_cpu(lt, r.k, kSigmoid, r.renormalize, probs, index, weight, env.stream(),
                          {r.groups, r.topk_groups, bt, r.scaling});
  return {env.read(probs), env.read(index), env.read(weight)};
}

// dlogits from dtopk_weight through a fresh forward in the same dtype; with `in_place` the
// backward writes over probs.
std::vector<double> run_backward(OpEnv& env, DType dtype, const std::vector<double>& logits,
                                 const std::vector<double>& bias, const Routing& r,
                                 const std::vector<double>& dweight, bool in_place = false) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / r.experts;
  auto lt = make_input(env, {tokens, r.experts}, dtype, logits);
  auto bt = env.input({r.experts}, bias_dtype(dtype), bias);
  auto probs = env.output({tokens, r.experts}, dtype);
  auto index = env.output({tokens, r.k}, DType::i32);
  auto weight = env.output({tokens, r.k}, dtype);
  const ops::GroupLimitedRouting routing{r.groups, r.topk_groups, bt, r.scaling};
  ops::router_forward_cpu(lt, r.k, kSigmoid, r.renormalize, probs, index, weight, env.stream(),
                          routing);
  auto dw = make_input(env, {tokens, r.k}, dtype, dweight);
  auto dlogits = env.output({tokens, r.experts}, dtype);
  const Tensor& out = in_place ? probs.view() : dlogits.view();
  ops::router_backward_cpu(probs, index, weight, dw, r.renormalize, out, env.stream(), kSigmoid,
                           routing);
  return env.read(out);
}

// The float64 reference, from the formulas of ops/router.h (no NaN in its inputs).
struct Reference {
  RouterForward fwd;
  // The smallest gap at a decision the selection makes: between the last kept and the first
  // dropped group score, and between neighbours among the kept groups' k+1 best choices. A
  // change of the choices smaller than it cannot change topk_index.
  double margin = std::numeric_limits<double>::infinity();
  int limited_rows = 0;  // rows whose top k differs from the plain top k of s + bias
};

Reference reference(const std::vector<double>& logits, const std::vector<double>& bias,
                    const Routing& r) {
  Reference ref;
  const int64_t experts = r.experts, size = experts / r.groups;
  const int64_t tokens = static_cast<int64_t>(logits.size()) / experts;
  for (int64_t n = 0; n < tokens; ++n) {
    std::vector<double> s(experts), c(experts);
    for (int64_t e = 0; e < experts; ++e) {
      s[e] = 1.0 / (1.0 + std::exp(-logits[n * experts + e]));
      c[e] = s[e] + bias[e];
    }
    std::vector<double> group_score(r.groups);
    for (int64_t g = 0; g < r.groups; ++g) {
      std::vector<double> v(c.begin() + g * size, c.begin() + (g + 1) * size);
      std::sort(v.rbegin(), v.rend());
      group_score[g] = v[0] + v[1];
    }
    std::vector<int64_t> group_order(r.groups);
    std::iota(group_order.begin(), group_order.end(), 0);
    std::stable_sort(group_order.begin(), group_order.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    if (r.topk_groups < r.groups) {
      ref.margin = std::min(ref.margin, group_score[group_order[r.topk_groups - 1]] -
                                            group_score[group_order[r.topk_groups]]);
    }
    std::vector<int64_t> kept;
    for (int64_t j = 0; j < r.topk_groups; ++j) {
      for (int64_t i = 0; i < size; ++i) kept.push_back(group_order[j] * size + i);
    }
    std::sort(kept.begin(), kept.end());
    auto by_choice = [&](int64_t a, int64_t b) { return c[a] > c[b]; };
    std::stable_sort(kept.begin(), kept.end(), by_choice);
    for (int j = 0; j < r.k && j + 1 < static_cast<int>(kept.size()); ++j) {
      ref.margin = std::min(ref.margin, c[kept[j]] - c[kept[j + 1]]);
    }
    std::vector<int64_t> plain(experts);
    std::iota(plain.begin(), plain.end(), 0);
    std::stable_sort(plain.begin(), plain.end(), by_choice);
    if (!std::equal(kept.begin(), kept.begin() + r.k, plain.begin())) ++ref.limited_rows;
    double sum = 0;
    for (int j = 0; j < r.k; ++j) sum += s[kept[j]];
    ref.fwd.probs.insert(ref.fwd.probs.end(), s.begin(), s.end());
    for (int j = 0; j < r.k; ++j) {
      ref.fwd.index.push_back(static_cast<double>(kept[j]));
      const double w = r.renormalize ? s[kept[j]] / (sum + 1e-20) : s[kept[j]];
      ref.fwd.weight.push_back(w * r.scaling);
    }
  }
  return ref;
}

// Logits (N, E) and a bias (E) with the selection at least `min_margin` from any tie: the
// first of seeds seed, seed + 2, ... whose draw qualifies. Logits ~ N(0, 2), bias ~ N(0, 0.3).
struct Draw {
  std::vector<double> logits, bias;
  uint64_t seed = 0;
  bool found = false;
};

Draw far_from_ties(const Routing& r, int64_t tokens, uint64_t seed, double min_margin,
                   bool bf16_values = false) {
  Draw d;
  for (int attempt = 0; attempt < 200; ++attempt, seed += 2) {
    d.logits = random_vector(static_cast<size_t>(tokens * r.experts), seed, 2.0);
    d.bias = rounded_to_float(random_vector(static_cast<size_t>(r.experts), seed + 1, 0.3));
    if (bf16_values) d.logits = rounded_to_bf16(d.logits);
    if (reference(d.logits, d.bias, r).margin > min_margin) {
      d.seed = seed;
      d.found = true;
      return d;
    }
  }
  return d;
}

constexpr int64_t kTokens = 16;

TEST(RouterGroupLimited, ForwardMatchesTheFloat64Reference) {
  OpEnv env;
  const std::vector<Routing> routings = {
      {64, 8, 4, 8, true, 2.5},  {64, 8, 4, 8, false, 2.5},   {32, 8, 4, 4, true, 1.0},
      {32, 8, 4, 6, false, 1.0}, {16, 8, 3, 6, true, 1.0},    {48, 4, 2, 5, true, 1.5},
      {32, 4, 4, 5, true, 2.5},  {64, 1, 1, 6, true, 2.5},    {64, 1, 1, 6, false, 1.0},
      {256, 8, 4, 8, true, 2.5}, {384, 1, 1, 8, true, 2.827}, {8, 4, 1, 2, false, 1.0},
      {12, 6, 2, 4, true, 1.0}};
  uint64_t seed = 300;
  for (const Routing& r : routings) {
    SCOPED_TRACE(describe(r));
    const auto logits = random_vector(static_cast<size_t>(kTokens * r.experts), seed++, 2.0);
    const auto bias = random_vector(static_cast<size_t>(r.experts), seed++, 0.3);
    const Reference ref = reference(logits, bias, r);
    const RouterForward got = run_forward(env, DType::f64, logits, bias, r);
    // The same float64 arithmetic in the same order, so the same choice even near ties.
    EXPECT_EQ(got.index, ref.fwd.index);
    EXPECT_LT(max_rel_err(got.probs, ref.fwd.probs), kForwardTol);
    EXPECT_LT(max_rel_err(got.weight, ref.fwd.weight), kForwardTol);
    if (r.renormalize) {
      for (int64_t n = 0; n < kTokens; ++n) {
        double sum = 0;
        for (int j = 0; j < r.k; ++j) sum += got.weight[n * r.k + j];
        EXPECT_NEAR(sum, r.scaling, 1e-14);
      }
    }
    // The draws exercise the limit: some rows choose otherwise than the plain top k (and none
    // when every group is kept).
    if (r.topk_groups < r.groups) {
      EXPECT_GT(ref.limited_rows, 0);
    } else {
      EXPECT_EQ(ref.limited_rows, 0);
    }
  }
}

// One group (Kimi-K2, and DeepSeek-V3 with n_group = topk_group = 1): the plain top k of s + b.
TEST(RouterGroupLimited, OneGroupIsThePlainTopKOfTheBiasedScores) {
  OpEnv env;
  const Routing r{40, 1, 1, 7, false, 1.0};
  const auto logits = random_vector(static_cast<size_t>(kTokens * r.experts), 320, 2.0);
  const auto bias = random_vector(static_cast<size_t>(r.experts), 321, 0.3);
  for (DType dtype : {DType::f64, DType::f32}) {
    const RouterForward got = run_forward(env, dtype, logits, bias, r);
    for (int64_t n = 0; n < kTokens; ++n) {
      std::vector<int64_t> order(r.experts);
      std::iota(order.begin(), order.end(), 0);
      // The op's choice: the stored score plus the bias in the compute type.
      auto choice = [&](int64_t e) {
        const double p = got.probs[n * r.experts + e];
        return dtype == DType::f32
                   ? static_cast<double>(static_cast<float>(p) + static_cast<float>(bias[e]))
                   : p + bias[e];
      };
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return choice(a) > choice(b); });
      for (int j = 0; j < r.k; ++j) {
        EXPECT_EQ(got.index[n * r.k + j], static_cast<double>(order[j]))
            << dtype_name(dtype) << " row " << n;
        // Without renormalisation and with scaling 1: the stored score, bit for bit.
        EXPECT_EQ(got.weight[n * r.k + j], got.probs[n * r.experts + order[j]]);
      }
    }
  }
}

// Exact values in every dtype: logits 0 give s = 1/2, and the biases are dyadic, so
// choice = 1/2 + b and the group scores are exact. E = 8 in groups of 2:
//   choice       0.75 0.5 | 0.625 0.625 | 0.75 0.5 | 0.25 0.875
//   group score      1.25 |        1.25 |     1.25 |     1.125
// Three groups tie: with topk_groups = 2 the lower two (0 and 1) are kept. The top 3 of their
// experts are 0, 2, 3 (2 and 3 tie: the lower first). Expert 7, the largest choice, and expert 4,
// tying expert 0, are in dropped groups. With one group the same inputs give 7, 0, 4.
TEST(RouterGroupLimited, TiesGoToTheLowerGroupAndExpertAndTheGroupLimitDropsTheBest) {
  OpEnv env;
  const std::vector<double> bias = {0.25, 0.0, 0.125, 0.125, 0.25, 0.0, -0.25, 0.375};
  const std::vector<double> logits(8, 0.0);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const RouterForward grouped = run_forward(env, dtype, logits, bias, {8, 4, 2, 3, true, 2.5});
    EXPECT_EQ(grouped.probs, std::vector<double>(8, 0.5));
    EXPECT_EQ(grouped.index, (std::vector<double>{0, 2, 3}));
    // 2.5 * (0.5 / (1.5 + 1e-20)) in double, rounded once (via fp32 for bf16).
    const double w = 2.5 * (0.5 / (1.5 + 1e-20));
    const double stored = dtype == DType::f64   ? w
                          : dtype == DType::f32 ? static_cast<float>(w)
                                                : rounded_to_bf16({w})[0];
    EXPECT_EQ(grouped.weight, std::vector<double>(3, stored));
    const RouterForward plain = run_forward(env, dtype, logits, bias, {8, 1, 1, 3, false, 2.5});
    EXPECT_EQ(plain.index, (std::vector<double>{7, 0, 4}));
    EXPECT_EQ(plain.weight, std::vector<double>(3, 1.25));  // 2.5 * 0.5, exact
    // And keeping one group of the three tied ones: group 0.
    const RouterForward one = run_forward(env, dtype, logits, bias, {8, 4, 1, 2, false, 1.0});
    EXPECT_EQ(one.index, (std::vector<double>{0, 1}));
  }
}

// NaN ranks after every number (ops/router.h). E = 8, bias 0.01 (e + 1):
//   row 0: expert 0 NaN. Groups of 2: group 0 = {NaN, s(3)} has one number, so its score is NaN
//     and ranks last: kept are group 2 (s(.2) + .05 + s(.1) + .06 = 1.185) and group 1 (0.961);
//     the top 3 are 3 (0.662), 4 (0.600), 5 (0.585), all finite. Groups of 4: group 0's two best
//     numbers (1.635) beat group 1 (1.185); the top 2 are 1 and 3, NaN skipped.
//   row 1: all NaN: groups 0..topk_groups-1 and their first experts in index order.
TEST(RouterGroupLimited, NaNRanksLast) {
  OpEnv env;
  std::vector<double> bias(8);
  for (int e = 0; e < 8; ++e) bias[e] = 0.01 * (e + 1);
  std::vector<double> logits = {kNaN, 3.0, -1.0, 0.5, 0.2, 0.1, -2.0, -3.0};
  logits.resize(16, kNaN);
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const RouterForward pairs = run_forward(env, dtype, logits, bias, {8, 4, 2, 3, true, 1.0});
    EXPECT_EQ(pairs.index, (std::vector<double>{3, 4, 5, 0, 1, 2}));
    EXPECT_TRUE(testing::all_finite({pairs.weight.begin(), pairs.weight.begin() + 3}));
    for (int j = 3; j < 6; ++j) EXPECT_TRUE(std::isnan(pairs.weight[j]));
    const RouterForward fours = run_forward(env, dtype, logits, bias, {8, 2, 1, 2, true, 1.0});
    EXPECT_EQ(fours.index, (std::vector<double>{1, 3, 0, 1}));
    EXPECT_TRUE(testing::all_finite({fours.weight.begin(), fours.weight.begin() + 2}));
  }
}

// The backward against five-point finite differences of dot(topk_weight, c) in float64, with the
// selection far from ties: the steps move one logit by at most 2e-3, so one choice by at most
// 5e-4 (sigmoid' <= 1/4), below the margin of 1e-3.
TEST(RouterGroupLimited, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  constexpr int64_t kRows = 4;
  uint64_t seed = 400;
  for (const Routing& r : std::vector<Routing>{{32, 8, 4, 6, true, 2.5},
                                               {32, 8, 4, 6, false, 2.5},
                                               {16, 1, 1, 3, true, 1.0},
                                               {12, 6, 2, 4, true, 1.7}}) {
    SCOPED_TRACE(describe(r));
    Draw d = far_from_ties(r, kRows, seed, 1e-3);
    seed += 100;
    ASSERT_TRUE(d.found);
    const auto probe = random_vector(static_cast<size_t>(kRows * r.k), d.seed + 7);
    const auto dlogits = run_backward(env, DType::f64, d.logits, d.bias, r, probe);
    auto loss = [&] {
      return dot(run_forward(env, DType::f64, d.logits, d.bias, r).weight, probe);
    };
    EXPECT_LT(grad_err(d.logits, dlogits, loss), kGradTol);
    // Only the chosen experts get a gradient; the others exactly 0.
    const RouterForward fwd = run_forward(env, DType::f64, d.logits, d.bias, r);
    int zeros = 0;
    for (int64_t n = 0; n < kRows; ++n) {
      for (int64_t e = 0; e < r.experts; ++e) {
        bool chosen = false;
        for (int j = 0; j < r.k; ++j) chosen |= fwd.index[n * r.k + j] == e;
        if (!chosen) {
          EXPECT_EQ(dlogits[n * r.experts + e], 0.0) << n << "," << e;
          ++zeros;
        } else {
          EXPECT_NE(dlogits[n * r.experts + e], 0.0) << n << "," << e;
        }
      }
    }
    EXPECT_EQ(zeros, kRows * (r.experts - r.k));
    // In place (dlogits over probs): the same values.
    EXPECT_EQ(run_backward(env, DType::f64, d.logits, d.bias, r, probe, /*in_place=*/true),
              dlogits);
  }
}

// The weights and the backward's arithmetic in fp32 and double as the op does it (ops/router.h),
// for f32 and bf16 storage, from the scores the op stored: the order, the fp32 choice and group
// scores, the weights in double rounded once. Fills index and the unrounded weights.
void select_in_fp32(const std::vector<double>& probs, const std::vector<double>& bias,
                    const Routing& r, std::vector<double>& index, std::vector<double>& weight) {
  const int64_t experts = r.experts, size = experts / r.groups;
  const int64_t tokens = static_cast<int64_t>(probs.size()) / experts;
  index.clear();
  weight.clear();
  for (int64_t n = 0; n < tokens; ++n) {
    const double* p = probs.data() + n * experts;
    std::vector<float> c(experts), group_score(r.groups);
    for (int64_t e = 0; e < experts; ++e)
      c[e] = static_cast<float>(p[e]) + static_cast<float>(bias[e]);
    for (int64_t g = 0; g < r.groups; ++g) {
      std::vector<float> v(c.begin() + g * size, c.begin() + (g + 1) * size);
      std::sort(v.rbegin(), v.rend());
      group_score[g] = v[0] + v[1];
    }
    std::vector<int64_t> groups(r.groups), kept;
    std::iota(groups.begin(), groups.end(), 0);
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
    for (int64_t j = 0; j < r.topk_groups; ++j) {
      for (int64_t i = 0; i < size; ++i) kept.push_back(groups[j] * size + i);
    }
    std::sort(kept.begin(), kept.end());
    std::stable_sort(kept.begin(), kept.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
    double sum = 0;
    for (int j = 0; j < r.k; ++j) sum += p[kept[j]];
    for (int j = 0; j < r.k; ++j) {
      index.push_back(static_cast<double>(kept[j]));
      const double s = p[kept[j]];
      weight.push_back(r.renormalize ? r.scaling * (s / (sum + 1e-20)) : r.scaling * s);
    }
  }
}

TEST(RouterGroupLimited, FloatMatchesDoubleAndBf16SelectsOnTheRoundedScores) {
  OpEnv env;
  for (const Routing& r : std::vector<Routing>{
           {64, 8, 4, 8, true, 2.5}, {32, 8, 4, 6, false, 2.5}, {64, 1, 1, 6, true, 1.0}}) {
    SCOPED_TRACE(describe(r));
    // bf16 logits, so every storage starts from the same values; far from ties in f64, so f32
    // chooses alike (its scores are within 1e-7 of the f64 ones).
    Draw d = far_from_ties(r, kTokens, 500, 1e-4, /*bf16_values=*/true);
    ASSERT_TRUE(d.found);
    const auto dweight = rounded_to_bf16(random_vector(static_cast<size_t>(kTokens * r.k), 501));
    const RouterForward f64 = run_forward(env, DType::f64, d.logits, d.bias, r);
    const RouterForward f32 = run_forward(env, DType::f32, d.logits, d.bias, r);
    EXPECT_EQ(f32.index, f64.index);
    EXPECT_LT(max_scaled_err(f32.probs, f64.probs), kFloatVsDoubleTol);
    EXPECT_LT(max_scaled_err(f32.weight, f64.weight), kFloatVsDoubleTol);
    EXPECT_LT(max_scaled_err(run_backward(env, DType::f32, d.logits, d.bias, r, dweight),
                             run_backward(env, DType::f64, d.logits, d.bias, r, dweight)),
              kFloatVsDoubleTol);

    // f32 and bf16: the choice from the stored scores, bit for bit; bf16's scores are the f32
    // ones rounded once (the sigmoid is fp32 for both), its weights computed from the rounded
    // scores.
    const RouterForward b16 = run_forward(env, DType::bf16, d.logits, d.bias, r);
    EXPECT_EQ(b16.probs, rounded_to_bf16(f32.probs));
    std::vector<double> index, weight;
    select_in_fp32(f32.probs, d.bias, r, index, weight);
    EXPECT_EQ(f32.index, index);
    EXPECT_EQ(f32.weight, rounded_to_float(weight));
    select_in_fp32(b16.probs, d.bias, r, index, weight);
    EXPECT_EQ(b16.index, index);
    EXPECT_EQ(b16.weight, rounded_to_bf16(weight));
  }
}

// The backward from given scores: bf16 is the f32 result rounded once (both compute in double
// from the same values), and the f32 result is the formula of ops/router.h in double, rounded.
TEST(RouterGroupLimited, BackwardRoundsOnceFromTheStoredScores) {
  OpEnv env;
  constexpr int64_t kN = 5, kE = 8, kK = 3;
  std::vector<double> probs = random_vector(kN * kE, 600, 0.25);
  for (auto& p : probs) p = 0.5 + p;  // scores around 1/2
  probs = rounded_to_bf16(probs);
  const auto dweight = rounded_to_bf16(random_vector(kN * kK, 601));
  const std::vector<int64_t> chosen = {3, 1, 7, 0, 2, 5, 6, 4, 1, 2, 3, 4, 7, 6, 5};
  const double scaling = 2.5;
  for (bool renorm : {true, false}) {
    SCOPED_TRACE(renorm ? "renormalized" : "not renormalized");
    std::vector<std::vector<double>> f32_result;
    expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
      std::vector<OwnedTensor> r;
      auto pt = make_input(env, {kN, kE}, dt, probs), dwt = make_input(env, {kN, kK}, dt, dweight);
      auto ci = env.indices({kN, kK}, DType::i32, chosen);
      auto wt = env.output({kN, kK}, dt);  // not read: NaN
      r.push_back(env.output({kN, kE}, dt));
      ops::router_backward_cpu(pt, ci, wt, dwt, renorm, r[0], env.stream(), kSigmoid,
                               {1, 1, Tensor(), scaling});
      f32_result.push_back(env.read(r[0]));
      return r;
    });
    std::vector<double> want(kN * kE, 0.0);
    for (int64_t n = 0; n < kN; ++n) {
      double sum = 0, weighted = 0;
      for (int64_t j = 0; j < kK; ++j) {
        sum += probs[n * kE + chosen[n * kK + j]];
        weighted += dweight[n * kK + j] * probs[n * kE + chosen[n * kK + j]];
      }
      const double denominator = sum + 1e-20;
      for (int64_t j = 0; j < kK; ++j) {
        const double s = probs[n * kE + chosen[n * kK + j]], dw = dweight[n * kK + j];
        const double ds =
            renorm ? scaling * (dw - weighted / denominator) / denominator : scaling * dw;
        want[n * kE + chosen[n * kK + j]] = static_cast<float>(ds * s * (1 - s));
      }
    }
    ASSERT_FALSE(f32_result.empty());
    EXPECT_EQ(f32_result[0], want);
  }
}

TEST(RouterGroupLimited, RejectsBadArguments) {
  OpEnv env;
  constexpr int64_t kN = 3, kE = 32;
  auto logits = env.input({kN, kE}, DType::f32, random_vector(kN * kE, 700));
  auto logits64 = env.input({kN, kE}, DType::f64, random_vector(kN * kE, 700));
  auto bias = env.input({kE}, DType::f32, random_vector(kE, 701, 0.1));
  auto bias64 = env.input({kE}, DType::f64, random_vector(kE, 701, 0.1));
  auto bias_short = env.input({kE - 1}, DType::f32, random_vector(kE - 1, 702));
  auto probs = env.output({kN, kE}, DType::f32), probs64 = env.output({kN, kE}, DType::f64);
  Stream& s = env.stream();
  auto forward = [&](int k, const ops::GroupLimitedRouting& routing,
                     ops::RouterScore score = kSigmoid) {
    auto index = env.output({kN, k}, DType::i32);
    auto weight = env.output({kN, k}, DType::f32);
    ops::router_forward_cpu(logits, k, score, true, probs, index, weight, s, routing);
    s.synchronize();
  };
  auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NO_THROW(forward(8, {8, 4, bias, 2.5}));
  EXPECT_NO_THROW(forward(16, {8, 4, bias, 2.5}));      // k = the kept groups' 16 experts
  EXPECT_THROW(forward(8, {3, 1, bias, 1.0}), Error);   // 3 does not divide 32
  EXPECT_THROW(forward(8, {32, 8, bias, 1.0}), Error);  // groups of 1
  EXPECT_THROW(forward(8, {0, 1, bias, 1.0}), Error);
  EXPECT_THROW(forward(8, {8, 0, bias, 1.0}), Error);
  EXPECT_THROW(forward(8, {8, 9, bias, 1.0}), Error);
  const std::string too_many = message([&] { forward(17, {8, 4, bias, 1.0}); });
  EXPECT_NE(too_many.find("exceeds the 16 experts of the 4 kept groups"), std::string::npos)
      << too_many;
  const std::string no_bias = message([&] { forward(8, {8, 4, Tensor(), 1.0}); });
  EXPECT_NE(no_bias.find("needs a correction_bias"), std::string::npos) << no_bias;
  EXPECT_THROW(forward(8, {8, 4, bias_short, 1.0}), Error);
  EXPECT_THROW(forward(8, {8, 4, bias64, 1.0}), Error);  // f32 logits take an f32 bias
  for (double scaling : {0.0, -1.0, kNaN, std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(forward(8, {8, 4, bias, scaling}), Error) << scaling;
  }
  // f64 logits take an f64 bias.
  {
    auto index = env.output({kN, 8}, DType::i32), weight = env.output({kN, 8}, DType::f64);
    EXPECT_THROW(ops::router_forward_cpu(logits64, 8, kSigmoid, true, probs64, index, weight, s,
                                         {8, 4, bias, 1.0}),
                 Error);
    EXPECT_NO_THROW(ops::router_forward_cpu(logits64, 8, kSigmoid, true, probs64, index, weight, s,
                                            {8, 4, bias64, 1.0}));
    s.synchronize();
  }
  // The other scores take the defaults only.
  for (auto score : {ops::RouterScore::softmax_then_topk, ops::RouterScore::topk_then_softmax}) {
    EXPECT_NO_THROW(forward(8, {}, score));
    EXPECT_THROW(forward(8, {2, 1, Tensor(), 1.0}, score), Error);
    EXPECT_THROW(forward(8, {1, 1, bias, 1.0}, score), Error);
    const std::string scaled = message([&] { forward(8, {1, 1, Tensor(), 2.5}, score); });
    EXPECT_NE(scaled.find("belong to sigmoid_group_limited"), std::string::npos) << scaled;
  }

  // The backward reads only the scaling; the rules of the scores hold there too.
  auto index = env.output({kN, 4}, DType::i32);
  auto weight = env.output({kN, 4}, DType::f32);
  ops::router_forward_cpu(logits, 4, kSigmoid, true, probs, index, weight, s, {8, 4, bias, 2.5});
  auto dlogits = env.output({kN, kE}, DType::f32);
  auto backward = [&](bool renorm, ops::RouterScore score, const ops::GroupLimitedRouting& r) {
    ops::router_backward_cpu(probs, index, weight, weight, renorm, dlogits, s, score, r);
    s.synchronize();
  };
  EXPECT_NO_THROW(backward(true, kSigmoid, {8, 4, bias, 2.5}));
  EXPECT_NO_THROW(backward(false, kSigmoid, {1, 1, Tensor(), 2.5}));
  EXPECT_THROW(backward(true, kSigmoid, {8, 4, bias, 0.0}), Error);
  EXPECT_THROW(backward(true, ops::RouterScore::softmax_then_topk, {8, 4, bias, 2.5}), Error);
  EXPECT_THROW(backward(false, ops::RouterScore::topk_then_softmax, {}), Error);
  EXPECT_THROW(backward(true, static_cast<ops::RouterScore>(7), {}), Error);
}

// ---------------------------------------------------------------------------------------------
// The auxiliary-loss-free balancing update (ops/router_balance.h), by hand numbers.

TEST(RouterBalance, MovesEachBiasOneStepTowardTheMeanLoad) {
  // Sum 24 over 4 experts: mean 6. Expert 0 is over (-gamma), 1 under (+gamma), 2 and 3 at the
  // mean (unchanged).
  const std::vector<int64_t> load = {10, 2, 6, 6};
  std::vector<double> bias = {0.5, -0.25, 0.0, 1.0};
  ops::update_correction_bias(load, 0.001, bias);
  EXPECT_EQ(bias, (std::vector<double>{0.5 - 0.001, -0.25 + 0.001, 0.0, 1.0}));
  // f32: double(bias) + step rounded once.
  std::vector<float> bias32 = {0.5f, -0.25f, 0.0f, 1.0f};
  ops::update_correction_bias(load, 0.001, bias32);
  EXPECT_EQ(bias32, (std::vector<float>{static_cast<float>(0.5 - 0.001),
                                        static_cast<float>(-0.25 + 0.001), 0.0f, 1.0f}));
  // A mean between integers (1.5): every expert moves.
  std::vector<double> two = {0.0, 0.0};
  ops::update_correction_bias(std::vector<int64_t>{1, 2}, 0.25, two);
  EXPECT_EQ(two, (std::vector<double>{0.25, -0.25}));
  // Twice: the steps add up; gamma 0 changes nothing.
  ops::update_correction_bias(std::vector<int64_t>{1, 2}, 0.25, two);
  EXPECT_EQ(two, (std::vector<double>{0.5, -0.5}));
  ops::update_correction_bias(std::vector<int64_t>{1, 2}, 0.0, two);
  EXPECT_EQ(two, (std::vector<double>{0.5, -0.5}));
  // No experts: nothing to do.
  std::vector<double> none;
  EXPECT_NO_THROW(ops::update_correction_bias(std::vector<int64_t>{}, 0.1, none));
}

// Loads beyond 2^53: the mean 2^53 + 1 is an integer that double cannot hold (the double mean
// of the sum 3 * 2^53 + 3 comes out 2^53 + 2, and the load 2^53 + 1 as double is 2^53), so only
// an exact comparison leaves expert 0, at the mean, unchanged.
TEST(RouterBalance, DecidesTheSignExactly) {
  const int64_t big = int64_t{1} << 53;
  std::vector<double> bias = {0.0, 0.0, 0.0};
  ops::update_correction_bias(std::vector<int64_t>{big + 1, big, big + 2}, 0.5, bias);
  EXPECT_EQ(bias, (std::vector<double>{0.0, 0.5, -0.5}));
}

TEST(RouterBalance, RejectsBadArguments) {
  std::vector<double> bias = {0.0, 0.0};
  const std::vector<int64_t> load = {1, 2};
  EXPECT_THROW(ops::update_correction_bias(std::vector<int64_t>{1, 2, 3}, 0.1, bias), Error);
  EXPECT_THROW(ops::update_correction_bias(std::vector<int64_t>{1, -2}, 0.1, bias), Error);
  EXPECT_THROW(ops::update_correction_bias(load, -0.1, bias), Error);
  EXPECT_THROW(ops::update_correction_bias(load, kNaN, bias), Error);
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(ops::update_correction_bias(std::vector<int64_t>{max, 1}, 0.1, bias), Error);
  // The sum fits, E * sum does not.
  EXPECT_THROW(ops::update_correction_bias(std::vector<int64_t>{max / 2 + 1, 0}, 0.1, bias), Error);
  EXPECT_EQ(bias, (std::vector<double>{0.0, 0.0}));  // untouched by the failed calls
}

}  // namespace
}  // namespace moepeak
