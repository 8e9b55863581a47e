// gpt-oss's router and the RMSNorm weight order on the CPU backend: router_forward with
// RouterScore::topk_then_softmax (ops/router.h) and rmsnorm_forward's NormWeightOrder
// (ops/rmsnorm.h). Float64 forward against a plain reference, the backward against central finite
// differences, float vs double, bf16 storage bit for bit where the op rounds once, outputs
// poisoned with NaN before each run, and argument errors. The bias ops and the clamped SwiGLU:
// test_gpt_oss_ops.cpp.
// Run: ./build/tests/ops/test_gpt_oss_router_norm
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
#include "ops/rmsnorm.h"
#include "ops/router.h"
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

constexpr auto kTopkFirst = ops::RouterScore::topk_then_softmax;
constexpr auto kSoftmaxFirst = ops::RouterScore::softmax_then_topk;

// ---------------------------------------------------------------------------------------------
// Router, topk_then_softmax: logits (N, E)

constexpr int64_t kTokens = 5, kExperts = 8;
constexpr int kTopK = 3;

struct RouterForward {
  std::vector<double> probs, index, weight;
};

RouterForward run_router(OpEnv& env, DType dtype, const std::vector<double>& logits, int64_t tokens,
                         int64_t experts, int k, ops::RouterScore score = kTopkFirst) {
  auto lt = make_input(env, {tokens, experts}, dtype, logits);
  auto probs = env.output({tokens, experts}, dtype);
  auto index = env.output({tokens, k}, DType::i32);
  auto weight = env.output({tokens, k}, dtype);
  ops::router_forward_cpu(lt, k, score, true, probs, index, weight, env.stream());
  return {env.read(probs), env.read(index), env.read(weight)};
}

// Plain reference: softmax over all E in double; experts sorted by (logit desc, index asc); the
// weights a softmax in double over the k chosen logits.
RouterForward topk_reference(const std::vector<double>& logits, int64_t tokens, int64_t experts,
                             int k) {
  RouterForward ref;
  for (int64_t n = 0; n < tokens; ++n) {
    const double* l = logits.data() + n * experts;
    const double row_max = *std::max_element(l, l + experts);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(l[e] - row_max);
    for (int64_t e = 0; e < experts; ++e) ref.probs.push_back(std::exp(l[e] - row_max) / sum);
    std::vector<int64_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += std::exp(l[order[j]] - l[order[0]]);
    for (int j = 0; j < k; ++j) {
      ref.index.push_back(static_cast<double>(order[j]));
      ref.weight.push_back(std::exp(l[order[j]] - l[order[0]]) / chosen);
    }
  }
  return ref;
}

// The smallest gap between neighbours among each row's k+1 largest logits.
double smallest_topk_logit_gap(const std::vector<double>& logits, int64_t experts, int k) {
  double gap = std::numeric_limits<double>::infinity();
  for (size_t row = 0; row < logits.size(); row += experts) {
    std::vector<double> l(logits.begin() + row, logits.begin() + row + experts);
    std::sort(l.rbegin(), l.rend());
    for (int j = 0; j < k && j + 1 < experts; ++j) gap = std::min(gap, l[j] - l[j + 1]);
  }
  return gap;
}

TEST(RouterTopkThenSoftmax, ForwardMatchesReferenceAndProbsAreTheFullSoftmax) {
  OpEnv env;
  const auto logits = random_vector(kTokens * kExperts, 80, 2.0);
  for (int k : {1, kTopK, static_cast<int>(kExperts)}) {
    const RouterForward got = run_router(env, DType::f64, logits, kTokens, kExperts, k);
    const RouterForward ref = topk_reference(logits, kTokens, kExperts, k);
    EXPECT_LT(max_rel_err(got.probs, ref.probs), kForwardTol) << "k=" << k;
    EXPECT_EQ(got.index, ref.index) << "k=" << k;
    EXPECT_LT(max_rel_err(got.weight, ref.weight), kForwardTol) << "k=" << k;
    for (int64_t n = 0; n < kTokens; ++n) {
      double s = 0;
      for (int j = 0; j < k; ++j) s += got.weight[n * k + j];
      EXPECT_NEAR(s, 1.0, 1e-14);
      if (k == 1) {
        EXPECT_EQ(got.weight[n], 1.0);
      }
    }
  }
  // probs: bit for bit softmax_then_topk's (the load-balancing loss reads them), every storage.
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    EXPECT_EQ(run_router(env, dt, logits, kTokens, kExperts, kTopK).probs,
              run_router(env, dt, logits, kTokens, kExperts, kTopK, kSoftmaxFirst).probs)
        << dtype_name(dt);
  }
  // f32 against f64 on float values.
  const auto lf = rounded_to_float(logits);
  ASSERT_GT(smallest_topk_logit_gap(lf, kExperts, kTopK), 1e-3);
  const RouterForward f = run_router(env, DType::f32, lf, kTokens, kExperts, kTopK);
  const RouterForward d = run_router(env, DType::f64, lf, kTokens, kExperts, kTopK);
  EXPECT_EQ(f.index, d.index);
  EXPECT_LT(max_scaled_err(f.probs, d.probs), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(f.weight, d.weight), kFloatVsDoubleTol);
}

// Equal logits go to the lower index; NaN ranks after every number (so a row with one NaN
// still picks its k largest numbers and gets finite weights; an all-NaN row picks 0..k-1).
TEST(RouterTopkThenSoftmax, TiesGoToTheLowerIndexAndNaNRanksLast) {
  OpEnv env;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> logits = {1.0, 3.0, 3.0, 0.5, 3.0, -1.0, 2.0, 0.0,   //
                                      0.7, 0.7, 0.7, 0.7, 0.7, 0.7,  0.7, 0.7,   //
                                      nan, 1.0, 3.0, 2.0, nan, 0.0,  2.0, -1.0,  //
                                      nan, nan, nan, nan, nan, nan,  nan, nan};
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    const RouterForward got = run_router(env, dt, logits, 4, kExperts, kTopK);
    EXPECT_EQ(got.index, (std::vector<double>{1, 2, 4, 0, 1, 2, 2, 3, 6, 0, 1, 2}))
        << dtype_name(dt);
    EXPECT_EQ(got.weight[0], got.weight[1]);  // equal logits, equal weights
    EXPECT_EQ(got.weight[3], got.weight[5]);
    EXPECT_EQ(got.weight[7], got.weight[8]);
    EXPECT_TRUE(
        testing::all_finite(std::vector<double>(got.weight.begin(), got.weight.begin() + 9)));
  }
}

// Selection reads the logits: two experts whose probs round to one bf16 value (logits 0 and
// 2^-10) tie under softmax_then_topk (the lower index wins) but not under topk_then_softmax.
TEST(RouterTopkThenSoftmax, SelectsOnTheLogitsNotTheRoundedProbs) {
  OpEnv env;
  const std::vector<double> logits = {0.0, 1.0 / 1024, -3.0, -3.0};
  const RouterForward topk = run_router(env, DType::bf16, logits, 1, 4, 1);
  const RouterForward soft = run_router(env, DType::bf16, logits, 1, 4, 1, kSoftmaxFirst);
  ASSERT_EQ(soft.probs[0], soft.probs[1]) << "the probs tie in bf16";
  EXPECT_EQ(soft.index[0], 0.0);
  EXPECT_EQ(topk.index[0], 1.0);
}

// The backward of topk_then_softmax is router_backward's renormalized one (ops/router.h): its
// weights are a softmax over the chosen logits, whose gradient needs only the weights.
TEST(RouterTopkThenSoftmax, BackwardIsTheRenormalizedBackward) {
  OpEnv env;
  auto logits = random_vector(kTokens * kExperts, 81, 1.5);
  // The finite-difference steps move one logit by at most 2e-3: far below the gaps, so the
  // selection and its order hold.
  ASSERT_GT(smallest_topk_logit_gap(logits, kExperts, kTopK), 1e-2);
  const auto probe = random_vector(kTokens * kTopK, 82);
  auto lt = env.input({kTokens, kExperts}, DType::f64, logits);
  auto probs = env.output({kTokens, kExperts}, DType::f64);
  auto index = env.output({kTokens, kTopK}, DType::i32);
  auto weight = env.output({kTokens, kTopK}, DType::f64);
  ops::router_forward_cpu(lt, kTopK, kTopkFirst, true, probs, index, weight, env.stream());
  auto dw = env.input({kTokens, kTopK}, DType::f64, probe);
  auto dlogits = env.output({kTokens, kExperts}, DType::f64);
  ops::router_backward_cpu(probs, index, weight, dw, /*renormalized=*/true, dlogits, env.stream());
  const auto analytic = env.read(dlogits);
  auto loss = [&] {
    return dot(run_router(env, DType::f64, logits, kTokens, kExperts, kTopK).weight, probe);
  };
  EXPECT_LT(grad_err(logits, analytic, loss), kGradTol);
  // The not-renormalized backward (through the full softmax) is not this gradient.
  auto dfull = env.output({kTokens, kExperts}, DType::f64);
  ops::router_backward_cpu(probs, index, weight, dw, false, dfull, env.stream());
  EXPECT_GT(grad_err(logits, env.read(dfull), loss), 1e-2);
}

TEST(RouterTopkThenSoftmax, Bf16IsTheF32ResultRoundedOnceAndProbsMayBeTheLogits) {
  OpEnv env;
  const auto logits = rounded_to_bf16(random_vector(kTokens * kExperts, 83, 1.5));
  ASSERT_GT(smallest_topk_logit_gap(logits, kExperts, kTopK), 0.0);  // bf16 values: no ties
  std::vector<std::vector<double>> index;
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto lt = make_input(env, {kTokens, kExperts}, dt, logits);
    auto i = env.output({kTokens, kTopK}, DType::i32);
    r.push_back(env.output({kTokens, kExperts}, dt));
    r.push_back(env.output({kTokens, kTopK}, dt));
    ops::router_forward_cpu(lt, kTopK, kTopkFirst, true, r[0], i, r[1], env.stream());
    index.push_back(env.read(i));
    // In place: probs over the logits, bitwise the separate run.
    r.push_back(make_input(env, {kTokens, kExperts}, dt, logits));
    auto i2 = env.output({kTokens, kTopK}, DType::i32);
    r.push_back(env.output({kTokens, kTopK}, dt));
    ops::router_forward_cpu(r[2], kTopK, kTopkFirst, true, r[2], i2, r[3], env.stream());
    EXPECT_EQ(env.read(i2), index.back());
    EXPECT_EQ(env.read(r[2]), env.read(r[0])) << dtype_name(dt);
    EXPECT_EQ(env.read(r[3]), env.read(r[1])) << dtype_name(dt);
    return r;
  });
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[1], index[0]);
}

TEST(RouterTopkThenSoftmax, NeedsRenormalize) {
  OpEnv env;
  auto logits = env.input({kTokens, kExperts}, DType::f64, random_vector(kTokens * kExperts, 84));
  auto probs = env.output({kTokens, kExperts}, DType::f64);
  auto index = env.output({kTokens, kTopK}, DType::i32);
  auto weight = env.output({kTokens, kTopK}, DType::f64);
  try {
    ops::router_forward(logits, kTopK, kTopkFirst, false, probs, index, weight, env.stream());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("router_forward_cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("topk_then_softmax needs renormalize"), std::string::npos) << m;
  }
  EXPECT_THROW(
      ops::router_forward_cpu(logits, 0, kTopkFirst, true, probs, index, weight, env.stream()),
      Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// RMSNorm's NormWeightOrder: x (N, H), w (H)

constexpr int64_t kRows = 6, kHidden = 40;
constexpr double kEps = 1e-5;

struct NormRun {
  OwnedTensor y, rstd;
};

NormRun run_norm(OpEnv& env, DType dt, const std::vector<double>& x, const std::vector<double>& w,
                 ops::NormWeightOrder order) {
  auto xt = make_input(env, {kRows, kHidden}, dt, x), wt = make_input(env, {kHidden}, dt, w);
  NormRun r{env.output({kRows, kHidden}, dt), env.output({kRows}, dt)};
  ops::rmsnorm_forward_cpu(xt, wt, kEps, r.y, r.rstd, env.stream(), order);
  env.stream().synchronize();
  return r;
}

constexpr auto kAfterCast = ops::NormWeightOrder::weight_after_cast;
constexpr auto kInCompute = ops::NormWeightOrder::weight_in_compute_type;

// For f32 and f64 storage the two orders are the same arithmetic (ops/rmsnorm.h): bitwise.
TEST(RmsnormWeightOrder, F32AndF64OrdersAreBitwiseEqual) {
  OpEnv env;
  const auto x = random_vector(kRows * kHidden, 90, 2.0);
  const auto w = random_vector(kHidden, 91, 0.5);
  for (DType dt : {DType::f32, DType::f64}) {
    NormRun a = run_norm(env, dt, x, w, kInCompute), b = run_norm(env, dt, x, w, kAfterCast);
    EXPECT_EQ(env.read(b.y), env.read(a.y)) << dtype_name(dt);
    EXPECT_EQ(env.read(b.rstd), env.read(a.rstd)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_finite(env.read(b.y)));
  }
  // And the default argument is weight_in_compute_type.
  auto xt = env.input({kRows, kHidden}, DType::f32, x), wt = env.input({kHidden}, DType::f32, w);
  auto y = env.output({kRows, kHidden}, DType::f32), rstd = env.output({kRows}, DType::f32);
  ops::rmsnorm_forward(xt, wt, kEps, y, rstd, env.stream());
  EXPECT_EQ(env.read(y), env.read(run_norm(env, DType::f32, x, w, kInCompute).y));
}

// bf16: weight_after_cast is bf16(float(bf16(x * r)) * w), weight_in_compute_type
// bf16((x * r) * w), with r the fp32 rstd: both bitwise against the plain loops here, and they
// differ somewhere (the order is not ignored).
TEST(RmsnormWeightOrder, Bf16AfterCastRoundsXhatFirst) {
  OpEnv env;
  const auto x = rounded_to_bf16(random_vector(kRows * kHidden, 92, 2.0));
  const auto w = rounded_to_bf16(random_vector(kHidden, 93, 0.7));
  std::vector<uint16_t> want_after, want_in;
  std::vector<double> ref;  // float64: x * rstd * w without roundings
  for (int64_t n = 0; n < kRows; ++n) {
    double sum_sq = 0;
    for (int64_t h = 0; h < kHidden; ++h) sum_sq += x[n * kHidden + h] * x[n * kHidden + h];
    const double r64 = 1.0 / std::sqrt(sum_sq / kHidden + kEps);
    const float r = static_cast<float>(r64);
    for (int64_t h = 0; h < kHidden; ++h) {
      const float xv = static_cast<float>(x[n * kHidden + h]), wv = static_cast<float>(w[h]);
      want_in.push_back(bf16((xv * r) * wv).bits);
      want_after.push_back(bf16(static_cast<float>(bf16(xv * r)) * wv).bits);
      ref.push_back(x[n * kHidden + h] * r64 * w[h]);
    }
  }
  NormRun after = run_norm(env, DType::bf16, x, w, kAfterCast);
  NormRun in = run_norm(env, DType::bf16, x, w, kInCompute);
  EXPECT_EQ(bf16_bits(env, after.y), want_after);
  EXPECT_EQ(bf16_bits(env, in.y), want_in);
  EXPECT_NE(want_after, want_in);
  EXPECT_EQ(bf16_bits(env, after.rstd), bf16_bits(env, in.rstd));
  // Two roundings of at most 2^-8 relative each (bf16's unit roundoff; rstd's fp32 rounding adds
  // 2^-24): within 2^-7 of the float64 value, element by element (measured 6.5e-3 here).
  EXPECT_LT(max_rel_err(env.read(after.y), ref), std::ldexp(1.0, -7) * (1 + 1e-3));
}

}  // namespace
}  // namespace moepeak
