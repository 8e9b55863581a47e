// ops/cpu/simd_exp.h's vector exponential, and the CPU ops that run on it (SwiGLU, cross-entropy):
// its error over its whole range in fp32 ulps against double's exp (at most 1.5), its edges
// (underflow to 0, NaN kept), and that an element's result does not depend on where a loop's
// vectors fall (the partial last vector runs in padded lanes). Skipped on a CPU without AVX2 and
// FMA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cpu/simd_exp.h"
#include "ops/cross_entropy.h"
#include "ops/swiglu.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::OpEnv;
using testing::random_vector;

#if defined(__x86_64__)

// e^x for 8 arguments at once.
MOEPEAK_AVX2_FMA void exp8(const float* x, float* out) {
  _mm256_storeu_ps(out, ops::exp_avx2(_mm256_loadu_ps(x)));
}

// |got - exact| in units of the fp32 spacing at the exact value.
double ulps(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  const double spacing =
      std::nextafter(rounded, std::numeric_limits<float>::infinity()) - double(rounded);
  return std::abs(double(got) - exact) / spacing;
}

TEST(SimdExp, WithinOneAndAHalfUlpOverItsRange) {
  if (!ops::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  // Every fp32 argument in [-87.33, 88] would be 2^31 calls; 2^22 evenly spaced ones plus the
  // neighbourhoods of the range reduction's switch points (x = (n + 1/2) ln 2) cover its cases.
  std::vector<float> x;
  constexpr int kSteps = 1 << 22;
  for (int i = 0; i < kSteps; ++i) x.push_back(-87.33f + (88.0f + 87.33f) * float(i) / kSteps);
  for (int n = -125; n <= 126; ++n) {
    float mid = static_cast<float>((n + 0.5) * std::log(2.0));
    for (int k = -4; k <= 4; ++k) x.push_back(mid + float(k) * 1e-6f * std::abs(mid));
  }
  while (x.size() % 8 != 0) x.push_back(0.0f);
  std::vector<float> e(x.size());
  for (size_t i = 0; i < x.size(); i += 8) exp8(x.data() + i, e.data() + i);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = ulps(e[i], std::exp(double(x[i])));
    if (err > worst) worst = err, worst_x = x[i];
  }
  EXPECT_LE(worst, 1.5) << "at x = " << worst_x;  // 1.26 when written
}

TEST(SimdExp, UnderflowsToZeroAndKeepsNaN) {
  if (!ops::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  const float x[8] = {-87.34f, -100.0f, -inf, std::nanf(""), 0.0f, 1.0f, 88.0f, -87.3f};
  float e[8];
  exp8(x, e);
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_TRUE(std::isnan(e[3]));
  EXPECT_EQ(e[4], 1.0f);
  EXPECT_LE(ulps(e[5], std::exp(1.0)), 1.5);
  EXPECT_LE(ulps(e[6], std::exp(88.0)), 1.5);
  EXPECT_GT(e[7], 0.0f);  // still a normal number
}

// The op's outputs for the elements [offset, n) of `values` in an f32 tensor of n - offset
// elements: element i of the result is values[offset + i]'s.
std::vector<double> swiglu_suffix(OpEnv& env, const std::vector<double>& a,
                                  const std::vector<double>& b, int64_t offset) {
  const int64_t n = static_cast<int64_t>(a.size()) - offset;
  std::vector<double> as(a.begin() + offset, a.end()), bs(b.begin() + offset, b.end());
  auto at = env.input({1, n}, DType::f32, as);
  auto bt = env.input({1, n}, DType::f32, bs);
  auto h = env.output({1, n}, DType::f32);
  ops::swiglu_forward_cpu(at, bt, h, env.stream());
  return env.read(h);
}

TEST(SimdExp, SwigluElementsDoNotDependOnTheirLane) {
  if (!ops::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  // 37 elements: 4 whole vectors and a tail of 5; each suffix moves every element to another
  // lane, and the last ones between whole and padded vectors.
  OpEnv env;
  const auto a = random_vector(37, 301, 4.0), b = random_vector(37, 302);
  const auto whole = swiglu_suffix(env, a, b, 0);
  for (int64_t offset = 1; offset < 9; ++offset) {
    const auto part = swiglu_suffix(env, a, b, offset);
    for (size_t i = 0; i < part.size(); ++i)
      ASSERT_EQ(part[i], whole[i + offset]) << "offset " << offset << ", element " << i;
  }
}

TEST(SimdExp, CrossEntropyKeepsNaNAndIgnoresThePadding) {
  if (!ops::cpu_has_avx2_fma()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  // V = 11: one whole vector and a padded one. Row 0 holds a NaN: its loss and its gradient row
  // are NaN (as on the double path); row 1 is finite and equals its float64 reference, which the
  // padded lanes (e^-inf = 0) must not disturb.
  OpEnv env;
  constexpr int64_t kVocab = 11;
  auto values = random_vector(2 * kVocab, 303, 3.0);
  values[9] = std::numeric_limits<double>::quiet_NaN();
  auto logits = env.input({2, kVocab}, DType::f32, values);
  auto labels = env.indices({2}, DType::i64, {3, 10});
  auto losses = env.output({2}, DType::f32);
  auto dlogits = env.output({2, kVocab}, DType::f32);
  ops::cross_entropy_forward_cpu(logits, labels, losses, env.stream());
  ops::cross_entropy_backward_cpu(logits, labels, 0.5, dlogits, env.stream());
  const auto loss = env.read(losses), grad = env.read(dlogits);
  EXPECT_TRUE(std::isnan(loss[0]));
  for (int64_t v = 0; v < kVocab; ++v) EXPECT_TRUE(std::isnan(grad[v])) << v;
  // Row 1 in float64 from the fp32-rounded logits.
  double row_max = -1e300, sum = 0;
  for (int64_t v = 0; v < kVocab; ++v)
    row_max = std::max(row_max, double(float(values[kVocab + v])));
  for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(double(float(values[kVocab + v])) - row_max);
  const double lse = row_max + std::log(sum);
  // fp32 storage of the loss, exponentials within 2 ulp: 1e-6 relative leaves a margin of ~4.
  EXPECT_NEAR(loss[1], lse - double(float(values[kVocab + 10])), 1e-6 * std::abs(lse));
  for (int64_t v = 0; v < kVocab; ++v) {
    const double p = std::exp(double(float(values[kVocab + v])) - lse);
    const double want = 0.5 * (p - (v == 10 ? 1.0 : 0.0));
    EXPECT_NEAR(grad[kVocab + v], want, 1e-6) << v;  // a few fp32 ulp of values below 0.5
  }
}

#endif  // __x86_64__

}  // namespace
}  // namespace moepeak
