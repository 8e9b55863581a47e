// DeepSeek-V3's sequence-wise balance loss's path to the router logits on the CPU backend:
// router_sequence_aux_backward (ops/router.h). The loss it differentiates, for sigmoid scores
// s = sigmoid(logits) and per-segment weights g (G, E):
//   L = sum_n sum_e g[n / R, e] * s[n, e] / sum_j s[n, j],   R = N / G
// Float64 against the closed form written here and against float64 finite differences of L,
// one segment, several and one per row, the += onto a random incoming gradient; f32 against f64;
// bf16 against the f32 run rounded once, bit for bit; argument errors. CUDA against the CPU:
// tests/ops/backend_ops/cases_router.cpp.
// Run: ./build/tests/ops/test_router_sequence_aux
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/router.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

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

std::vector<double> sigmoid_of(const std::vector<double>& logits) {
  std::vector<double> s(logits.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 / (1.0 + std::exp(-logits[i]));
  return s;
}

// L above, in double.
double loss_of(const std::vector<double>& logits, const std::vector<double>& g, int64_t experts,
               int64_t segments) {
  const std::vector<double> s = sigmoid_of(logits);
  const int64_t tokens = static_cast<int64_t>(s.size()) / experts, rows = tokens / segments;
  double loss = 0;
  for (int64_t n = 0; n < tokens; ++n) {
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += s[n * experts + e];
    for (int64_t e = 0; e < experts; ++e)
      loss += g[(n / rows) * experts + e] * s[n * experts + e] / sum;
  }
  return loss;
}

// dL/dlogits in closed form: s_e (1 - s_e) (g_e - sum_j g_j s_j / S) / S, plus `incoming`.
std::vector<double> closed_form(const std::vector<double>& scores, const std::vector<double>& g,
                                const std::vector<double>& incoming, int64_t experts,
                                int64_t segments) {
  const int64_t tokens = static_cast<int64_t>(scores.size()) / experts, rows = tokens / segments;
  std::vector<double> d = incoming;
  for (int64_t n = 0; n < tokens; ++n) {
    const double* s = scores.data() + n * experts;
    const double* gn = g.data() + (n / rows) * experts;
    double sum = 0, weighted = 0;
    for (int64_t e = 0; e < experts; ++e) {
      sum += s[e];
      weighted += gn[e] * s[e];
    }
    for (int64_t e = 0; e < experts; ++e)
      d[n * experts + e] += s[e] * (1 - s[e]) * (gn[e] - weighted / sum) / sum;
  }
  return d;
}

// The op in `dtype` from scores, g and the incoming gradient; dlogits read back as doubles.
std::vector<double> run_op(OpEnv& env, DType dtype, const std::vector<double>& scores,
                           const std::vector<double>& g, const std::vector<double>& incoming,
                           int64_t experts, int64_t segments) {
  const int64_t tokens = static_cast<int64_t>(scores.size()) / experts;
  auto s = make_input(env, {tokens, experts}, dtype, scores);
  auto gt = make_input(env, {segments, experts}, dtype, g);
  auto d = make_input(env, {tokens, experts}, dtype, incoming);
  ops::router_sequence_aux_backward_cpu(s, gt, d, env.stream());
  return env.read(d);
}

struct Shape3 {
  int64_t tokens, experts, segments;
};

std::string describe(const Shape3& c) {
  return "N=" + std::to_string(c.tokens) + " E=" + std::to_string(c.experts) +
         " G=" + std::to_string(c.segments);
}

const std::vector<Shape3> kShapes = {{12, 8, 1}, {12, 8, 3}, {6, 16, 6}, {10, 64, 2}, {4, 1, 2}};

TEST(RouterSequenceAux, MatchesTheClosedFormAndFiniteDifferences) {
  OpEnv env;
  uint64_t seed = 900;
  for (const Shape3& c : kShapes) {
    SCOPED_TRACE(describe(c));
    auto logits = random_vector(static_cast<size_t>(c.tokens * c.experts), seed++, 2.0);
    const auto g = random_vector(static_cast<size_t>(c.segments * c.experts), seed++);
    const auto incoming = random_vector(logits.size(), seed++, 0.1);
    const auto scores = sigmoid_of(logits);
    const auto got = run_op(env, DType::f64, scores, g, incoming, c.experts, c.segments);
    const auto want = closed_form(scores, g, incoming, c.experts, c.segments);
    EXPECT_LT(max_rel_err(got, want), kForwardTol);
    // What the op added is dL/dlogits.
    std::vector<double> added(got.size());
    for (size_t i = 0; i < got.size(); ++i) added[i] = got[i] - incoming[i];
    auto loss = [&] { return loss_of(logits, g, c.experts, c.segments); };
    EXPECT_LT(grad_err(logits, added, loss), kGradTol);
  }
}

TEST(RouterSequenceAux, FloatMatchesDoubleAndBf16IsTheF32ResultRoundedOnce) {
  OpEnv env;
  uint64_t seed = 950;
  for (const Shape3& c : kShapes) {
    SCOPED_TRACE(describe(c));
    const auto logits = random_vector(static_cast<size_t>(c.tokens * c.experts), seed++, 2.0);
    const auto scores = rounded_to_float(sigmoid_of(logits));
    const auto g =
        rounded_to_float(random_vector(static_cast<size_t>(c.segments * c.experts), seed++));
    const auto incoming = rounded_to_float(random_vector(scores.size(), seed++, 0.1));
    EXPECT_LT(max_scaled_err(run_op(env, DType::f32, scores, g, incoming, c.experts, c.segments),
                             run_op(env, DType::f64, scores, g, incoming, c.experts, c.segments)),
              kFloatVsDoubleTol);
    const auto s16 = rounded_to_bf16(scores), g16 = rounded_to_bf16(g);
    const auto d16 = rounded_to_bf16(incoming);
    expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
      std::vector<OwnedTensor> r;
      auto s = make_input(env, {c.tokens, c.experts}, dt, s16);
      auto gt = make_input(env, {c.segments, c.experts}, dt, g16);
      r.push_back(make_input(env, {c.tokens, c.experts}, dt, d16));
      ops::router_sequence_aux_backward_cpu(s, gt, r[0], env.stream());
      env.stream().synchronize();
      return r;
    });
  }
}

TEST(RouterSequenceAux, NoRowsIsANoOp) {
  OpEnv env;
  auto s = env.input({0, 8}, DType::f32, {});
  auto g = env.input({0, 8}, DType::f32, {});
  auto d = env.output({0, 8}, DType::f32);
  ops::router_sequence_aux_backward_cpu(s, g, d, env.stream());
  env.stream().synchronize();
}

TEST(RouterSequenceAux, RejectsBadArguments) {
  OpEnv env;
  constexpr int64_t kN = 6, kE = 8;
  auto scores = env.input({kN, kE}, DType::f32, random_vector(kN * kE, 990, 0.4));
  auto dlogits = env.output({kN, kE}, DType::f32);
  auto message = [&](const Tensor& s, const Tensor& g, const Tensor& d) -> std::string {
    try {
      ops::router_sequence_aux_backward_cpu(s, g, d, env.stream());
      env.stream().synchronize();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  auto g4 = env.input({4, kE}, DType::f32, random_vector(4 * kE, 991));
  EXPECT_NE(message(scores, g4, dlogits).find("4 segments do not divide 6 rows"), std::string::npos)
      << message(scores, g4, dlogits);
  auto g_wide = env.input({2, kE + 1}, DType::f32, random_vector(2 * (kE + 1), 992));
  EXPECT_NE(message(scores, g_wide, dlogits).find("dprobs must be (G, E)"), std::string::npos);
  auto g64 = env.input({2, kE}, DType::f64, random_vector(2 * kE, 993));
  EXPECT_NE(message(scores, g64, dlogits).find("dprobs must be (G, E)"), std::string::npos);
  auto g0 = env.input({0, kE}, DType::f32, {});
  EXPECT_NE(message(scores, g0, dlogits).find("0 segments do not divide 6 rows"),
            std::string::npos);
  auto g2 = env.input({2, kE}, DType::f32, random_vector(2 * kE, 994));
  auto short_d = env.output({kN - 1, kE}, DType::f32);
  EXPECT_NE(message(scores, g2, short_d).find("dlogits"), std::string::npos);
  auto flat = env.input({kN * kE}, DType::f32, random_vector(kN * kE, 995, 0.4));
  EXPECT_NE(message(flat, g2, dlogits).find("probs must be (N, E)"), std::string::npos);
}

}  // namespace
}  // namespace moepeak
