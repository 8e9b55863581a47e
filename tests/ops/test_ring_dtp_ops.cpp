// The ops Ring-DTP is built from, on the CPU backend: matmul (ops/matmul.h) and the strip-wise
// online cross-entropy (ops/cross_entropy_strip.h). Checked against plain float64 loops and
// against the materialised cross-entropy (ops/cross_entropy.h) on the same logits:
//   - matmul written and accumulated, empty inner dimension, float vs double;
//   - folding the vocabulary strip by strip — in any strip order and width, or in two halves
//     whose states are merged — gives the materialised losses (f64 within 1e-14 relative: only
//     the order of the exponential sum differs);
//   - the strips' gradients from the final state equal the materialised dlogits (in place too);
//   - ignored tokens (-100) keep an untouched state and get zero gradient rows;
//   - bad shapes throw at the call.
// Outputs are poisoned with NaN first, so an element an op forgets to write fails.
//
//     ctest -R test_ring_dtp_ops --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
#include "ops/cross_entropy.h"
#include "ops/cross_entropy_strip.h"
#include "ops/matmul.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::kFloatVsDoubleTol;
using testing::kForwardTol;
using testing::max_scaled_err;
using testing::OpEnv;
using testing::random_vector;
using testing::rounded_to_float;

// ---------------------------------------------------------------------------------------------
// matmul: a (M, K) . b (K, N)

std::vector<double> reference_matmul(const std::vector<double>& a, const std::vector<double>& b,
                                     int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) c[i * n + j] += a[i * k + l] * b[l * n + j];
    }
  }
  return c;
}

TEST(Matmul, WritesAndAccumulatesLikeThePlainLoop) {
  OpEnv env;
  const int64_t m = 7, k = 5, n = 9;
  auto a = random_vector(m * k, 201), b = random_vector(k * n, 202), c0 = random_vector(m * n, 203);
  auto want = reference_matmul(a, b, m, k, n);
  auto at = env.input({m, k}, DType::f64, a), bt = env.input({k, n}, DType::f64, b);
  auto written = env.output({m, n}, DType::f64);  // NaN: = must overwrite every element
  ops::matmul_cpu(at, bt, written, false, env.stream());
  EXPECT_LT(max_scaled_err(env.read(written), want), kForwardTol);

  auto accumulated = env.input({m, n}, DType::f64, c0);
  ops::matmul_cpu(at, bt, accumulated, true, env.stream());
  for (size_t i = 0; i < want.size(); ++i) want[i] += c0[i];
  EXPECT_LT(max_scaled_err(env.read(accumulated), want), kForwardTol);
}

TEST(Matmul, EmptyInnerDimensionWritesZerosAndFloatMatchesDouble) {
  OpEnv env;
  auto empty_a = env.output({3, 0}, DType::f32), empty_b = env.output({0, 4}, DType::f32);
  auto c = env.output({3, 4}, DType::f32);
  ops::matmul_cpu(empty_a, empty_b, c, false, env.stream());
  for (double v : env.read(c)) EXPECT_EQ(v, 0.0);

  const int64_t m = 6, k = 33, n = 4;
  auto a = rounded_to_float(random_vector(m * k, 211)),
       b = rounded_to_float(random_vector(k * n, 212));
  std::vector<double> results[2];
  int i = 0;
  for (DType dtype : {DType::f64, DType::f32}) {
    auto out = env.output({m, n}, dtype);
    ops::matmul_cpu(env.input({m, k}, dtype, a), env.input({k, n}, dtype, b), out, false,
                    env.stream());
    results[i++] = env.read(out);
  }
  EXPECT_LT(max_scaled_err(results[1], results[0]), kFloatVsDoubleTol);
}

TEST(Matmul, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto a = env.output({3, 4}, DType::f64), b = env.output({5, 2}, DType::f64);
  auto c = env.output({3, 2}, DType::f64), b32 = env.output({4, 2}, DType::f32);
  EXPECT_THROW(ops::matmul_cpu(a, b, c, false, env.stream()), Error);    // inner 4 vs 5
  EXPECT_THROW(ops::matmul_cpu(a, b32, c, false, env.stream()), Error);  // dtype
  auto b_ok = env.output({4, 2}, DType::f64), c_bad = env.output({3, 3}, DType::f64);
  EXPECT_THROW(ops::matmul_cpu(a, b_ok, c_bad, false, env.stream()), Error);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy over strips: logits (N, V) cut into column strips.

constexpr int64_t kTokens = 9, kVocab = 23;

// Labels in [0, V) with every third token ignored; logits of a few units, so softmax is not flat.
std::vector<int64_t> make_labels(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> pick(0, kVocab - 1);
  std::vector<int64_t> labels(kTokens);
  for (int64_t n = 0; n < kTokens; ++n) labels[n] = n % 3 == 1 ? ops::kIgnoreLabel : pick(rng);
  labels[0] = 0;           // the first column
  labels[2] = kVocab - 1;  // the last one
  return labels;
}
std::vector<double> make_logits(uint64_t seed) {
  auto v = random_vector(kTokens * kVocab, seed);
  for (auto& x : v) x *= 4;
  return v;
}

// Columns [a, b) of the (N, V) logits as an (N, b - a) row-major block.
std::vector<double> columns(const std::vector<double>& logits, int64_t a, int64_t b) {
  std::vector<double> out;
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t v = a; v < b; ++v) out.push_back(logits[n * kVocab + v]);
  }
  return out;
}

// Strips [a, b) of width `width` over [0, V), in the given order.
std::vector<std::pair<int64_t, int64_t>> strips(int64_t width, bool reversed) {
  std::vector<std::pair<int64_t, int64_t>> s;
  for (int64_t a = 0; a < kVocab; a += width) s.push_back({a, std::min(a + width, kVocab)});
  if (reversed) std::reverse(s.begin(), s.end());
  return s;
}

// Folds the strips into a fresh state; returns the state tensor (N, 3) f64.
OwnedTensor fold(OpEnv& env, DType dtype, const std::vector<double>& logits, const Tensor& labels,
                 const std::vector<std::pair<int64_t, int64_t>>& order) {
  auto state = env.output({kTokens, 3}, DType::f64);
  ops::cross_entropy_state_init_cpu(state, env.stream());
  for (auto [a, b] : order) {
    auto strip = env.input({kTokens, b - a}, dtype, columns(logits, a, b));
    ops::cross_entropy_strip_forward_cpu(strip, labels, a, state, env.stream());
    env.stream().synchronize();  // the strip tensor dies at the end of this iteration
  }
  return state;
}

// Per-token losses lse - t from a state (0 for ignored tokens).
std::vector<double> losses_of(OpEnv& env, const Tensor& state, const std::vector<int64_t>& labels) {
  auto s = env.read(state);
  std::vector<double> losses(kTokens, 0.0);
  for (int64_t n = 0; n < kTokens; ++n) {
    if (labels[n] != ops::kIgnoreLabel)
      losses[n] = s[3 * n] + std::log(s[3 * n + 1]) - s[3 * n + 2];
  }
  return losses;
}

std::vector<double> materialized_losses(OpEnv& env, DType dtype, const std::vector<double>& logits,
                                        const Tensor& labels) {
  auto out = env.output({kTokens}, dtype);
  ops::cross_entropy_forward_cpu(env.input({kTokens, kVocab}, dtype, logits), labels, out,
                                 env.stream());
  return env.read(out);
}

TEST(CrossEntropyStrip, FoldingStripsInAnyOrderGivesTheMaterialisedLosses) {
  OpEnv env;
  auto logits = make_logits(301);
  auto label_values = make_labels(302);
  auto labels = env.indices({kTokens}, DType::i64, label_values);
  auto want = materialized_losses(env, DType::f64, logits, labels);
  for (int64_t width : {int64_t{1}, int64_t{4}, int64_t{7}, kVocab}) {
    for (bool reversed : {false, true}) {
      auto state = fold(env, DType::f64, logits, labels, strips(width, reversed));
      EXPECT_LT(max_scaled_err(losses_of(env, state, label_values), want), 1e-14)
          << "strips of " << width << (reversed ? ", last strip first" : "");
    }
  }
}

TEST(CrossEntropyStrip, MergedHalvesEqualOneFold) {
  OpEnv env;
  auto logits = make_logits(311);
  auto label_values = make_labels(312);
  auto labels = env.indices({kTokens}, DType::i64, label_values);
  auto want = materialized_losses(env, DType::f64, logits, labels);
  // Columns [0, 11) into one state, [11, V) into another, merged either way round.
  for (bool into_first : {true, false}) {
    auto low = fold(env, DType::f64, logits, labels, {{0, 5}, {5, 11}});
    auto high = fold(env, DType::f64, logits, labels, {{11, 17}, {17, kVocab}});
    const Tensor& into = into_first ? low.view() : high.view();
    ops::cross_entropy_state_merge_cpu(into_first ? high : low, into, env.stream());
    EXPECT_LT(max_scaled_err(losses_of(env, into, label_values), want), 1e-14);
  }
  // A state that has seen nothing is the identity, on either side.
  auto full = fold(env, DType::f64, logits, labels, strips(kVocab, false));
  auto empty = fold(env, DType::f64, logits, labels, {});
  auto before = env.read(full);
  ops::cross_entropy_state_merge_cpu(empty, full, env.stream());
  EXPECT_EQ(env.read(full), before);
  ops::cross_entropy_state_merge_cpu(full, empty, env.stream());
  EXPECT_EQ(env.read(empty), before);
}

TEST(CrossEntropyStrip, StripGradientsEqualTheMaterialisedGradient) {
  OpEnv env;
  auto logits = make_logits(321);
  auto label_values = make_labels(322);
  auto labels = env.indices({kTokens}, DType::i64, label_values);
  const double scale = 1.0 / 6;
  for (DType dtype : {DType::f64, DType::f32}) {
    auto want_t = env.output({kTokens, kVocab}, dtype);
    ops::cross_entropy_backward_cpu(env.input({kTokens, kVocab}, dtype, logits), labels, scale,
                                    want_t, env.stream());
    auto want = env.read(want_t);
    auto state = fold(env, dtype, logits, labels, strips(5, true));
    std::vector<double> got(want.size(), std::numeric_limits<double>::quiet_NaN());
    for (auto [a, b] : strips(5, false)) {
      auto strip = env.input({kTokens, b - a}, dtype, columns(logits, a, b));
      bool in_place = a % 2 == 0;
      auto out = env.output({kTokens, b - a}, dtype);
      const Tensor& dstrip = in_place ? strip.view() : out.view();
      ops::cross_entropy_strip_backward_cpu(strip, labels, a, state, scale, dstrip, env.stream());
      auto g = env.read(dstrip);
      for (int64_t n = 0; n < kTokens; ++n) {
        for (int64_t v = a; v < b; ++v) got[n * kVocab + v] = g[n * (b - a) + v - a];
      }
    }
    // f64: lse differs from the materialised one only by the order of the exponential sum.
    // f32: both evaluate in double from the same f32 logits and round once.
    EXPECT_LT(max_scaled_err(got, want), dtype == DType::f64 ? 1e-14 : 1e-6) << dtype_name(dtype);
    for (int64_t n = 0; n < kTokens; ++n) {
      if (label_values[n] != ops::kIgnoreLabel) continue;
      for (int64_t v = 0; v < kVocab; ++v)
        EXPECT_EQ(got[n * kVocab + v], 0.0) << "ignored row " << n;
    }
  }
}

TEST(CrossEntropyStrip, IgnoredTokensKeepAFreshState) {
  OpEnv env;
  auto label_values = make_labels(331);
  auto labels = env.indices({kTokens}, DType::i64, label_values);
  auto state = fold(env, DType::f32, make_logits(332), labels, strips(6, false));
  auto s = env.read(state);
  for (int64_t n = 0; n < kTokens; ++n) {
    if (label_values[n] == ops::kIgnoreLabel) {
      EXPECT_EQ(s[3 * n], -std::numeric_limits<double>::infinity());
      EXPECT_EQ(s[3 * n + 1], 0.0);
      EXPECT_EQ(s[3 * n + 2], 0.0);
    } else {
      EXPECT_TRUE(std::isfinite(s[3 * n]) && s[3 * n + 1] >= 1.0) << "token " << n;
    }
  }
}

TEST(CrossEntropyStrip, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto strip = env.output({4, 3}, DType::f64), state = env.output({4, 3}, DType::f64);
  auto labels = env.indices({4}, DType::i64, {0, 1, 2, 3});
  auto labels32 = env.indices({4}, DType::i32, {0, 1, 2, 3});
  auto state32 = env.output({4, 3}, DType::f32), short_state = env.output({3, 3}, DType::f64);
  EXPECT_THROW(ops::cross_entropy_strip_forward_cpu(strip, labels32, 0, state, env.stream()),
               Error);
  EXPECT_THROW(ops::cross_entropy_strip_forward_cpu(strip, labels, 0, state32, env.stream()),
               Error);
  EXPECT_THROW(ops::cross_entropy_strip_forward_cpu(strip, labels, -1, state, env.stream()), Error);
  EXPECT_THROW(ops::cross_entropy_state_merge_cpu(short_state, state, env.stream()), Error);
  auto dstrip = env.output({4, 2}, DType::f64);
  EXPECT_THROW(
      ops::cross_entropy_strip_backward_cpu(strip, labels, 0, state, 1.0, dstrip, env.stream()),
      Error);
  auto empty = env.output({4, 0}, DType::f64);
  EXPECT_THROW(ops::cross_entropy_strip_forward_cpu(empty, labels, 0, state, env.stream()), Error);
  env.stream().synchronize();
}

}  // namespace
}  // namespace moepeak
