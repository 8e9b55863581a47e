// gpt-oss's dense and expert ops on the CPU backend: the bias ops (ops/bias.h, ops/grouped_bias.h)
// and the clamped SwiGLU (ops/swiglu.h, SwigluParams). Same checks as test_dense_ops.cpp: float64
// forward against a plain reference, input gradients against central finite differences, float
// vs double, bf16 storage as the f32 path rounded once (bit for bit), outputs poisoned with NaN
// before each run, and argument errors. The router's topk_then_softmax and RMSNorm's
// NormWeightOrder: test_gpt_oss_router_norm.cpp.
// Run: ./build/tests/ops/test_gpt_oss_ops
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/dtype.h"
#include "ops/bias.h"
#include "ops/grouped_bias.h"
#include "ops/linear.h"
#include "ops/swiglu.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

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

// Expects `f` to throw a moepeak::Error whose message has every part.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const auto& part : parts) EXPECT_NE(m.find(part), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------------------------------------
// Bias: bias (N), y / dy (M, N)

constexpr int64_t kM = 7, kN = 9;

TEST(Bias, BroadcastWritesTheBiasIntoEveryRowExactly) {
  OpEnv env;
  const auto bias = rounded_to_bf16(random_vector(kN, 1, 3.0));  // exact in every dtype
  struct Pair {
    DType bias, y;
  };
  for (Pair d : {Pair{DType::f64, DType::f64}, Pair{DType::f32, DType::f32},
                 Pair{DType::bf16, DType::bf16}, Pair{DType::bf16, DType::f32}}) {
    const std::string what =
        std::string(dtype_name(d.bias)) + " -> " + std::string(dtype_name(d.y));
    auto bt = make_input(env, {kN}, d.bias, bias);
    auto y = env.output({kM, kN}, d.y);
    ops::bias_broadcast_cpu(bt, y, env.stream());
    const auto got = env.read(y);
    for (int64_t i = 0; i < kM * kN; ++i) ASSERT_EQ(got[i], bias[i % kN]) << what << " " << i;
    auto empty = env.output({0, kN}, d.y);  // M == 0: nothing to write
    ops::bias_broadcast_cpu(bt, empty, env.stream());
    env.stream().synchronize();
  }
}

// dbias[n] += sum_m dy[m, n]: the column sum in double over increasing m, rounded once to dbias's
// compute type and added in it (ops/bias.h), so the reference below is exact, not a tolerance.
TEST(Bias, BackwardAddsTheColumnSumOnce) {
  OpEnv env;
  const auto dy = random_vector(kM * kN, 2);
  const auto init = random_vector(kN, 3);
  std::vector<double> ref(init);  // the float64 reference
  for (int64_t m = 0; m < kM; ++m) {
    for (int64_t n = 0; n < kN; ++n) ref[n] += dy[m * kN + n];
  }
  for (DType dt : {DType::f64, DType::f32}) {
    const auto dyv = dt == DType::f32 ? rounded_to_float(dy) : dy;
    const auto initv = dt == DType::f32 ? rounded_to_float(init) : init;
    std::vector<double> sum(kN, 0.0), want(kN);
    for (int64_t m = 0; m < kM; ++m) {
      for (int64_t n = 0; n < kN; ++n) sum[n] += dyv[m * kN + n];
    }
    for (int64_t n = 0; n < kN; ++n) {
      want[n] = dt == DType::f32 ? double(float(initv[n]) + float(sum[n])) : initv[n] + sum[n];
    }
    auto dyt = env.input({kM, kN}, dt, dyv);
    auto db = env.input({kN}, dt, initv);
    ops::bias_backward_cpu(dyt, db, env.stream());
    EXPECT_EQ(env.read(db), want) << dtype_name(dt);
    EXPECT_LT(max_rel_err(env.read(db), ref), dt == DType::f64 ? kForwardTol : kFloatVsDoubleTol);
    // M == 0 leaves dbias unchanged.
    auto none = env.input({0, kN}, dt, {});
    ops::bias_backward_cpu(none, db, env.stream());
    EXPECT_EQ(env.read(db), want) << "M == 0";
  }
}

// y = x W^T + b as bias_broadcast then an accumulating linear_forward: against float64 (f64,
// f32), its gradient in b against finite differences, and bf16 rounded once (one rounding of the
// whole sum, like torch's addmm, not round(round(x W^T) + b)).
TEST(Bias, LinearWithBiasMatchesReferenceAndRoundsOnce) {
  OpEnv env;
  constexpr int64_t K = 11;
  auto x = random_vector(kM * K, 4), w = random_vector(kN * K, 5), b = random_vector(kN, 6, 2.0);
  auto run = [&](DType dt) {
    auto xt = make_input(env, {kM, K}, dt, x), wt = make_input(env, {kN, K}, dt, w);
    auto bt = make_input(env, {kN}, dt, b);
    auto y = env.output({kM, kN}, dt);
    ops::bias_broadcast_cpu(bt, y, env.stream());
    ops::linear_forward_cpu(xt, wt, y, /*accumulate=*/true, env.stream());
    return env.read(y);
  };
  auto reference = [&] {
    std::vector<double> y(kM * kN);
    for (int64_t m = 0; m < kM; ++m) {
      for (int64_t n = 0; n < kN; ++n) {
        double s = b[n];
        for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[n * K + k];
        y[m * kN + n] = s;
      }
    }
    return y;
  };
  EXPECT_LT(max_rel_err(run(DType::f64), reference()), kForwardTol);
  auto probe = random_vector(kM * kN, 7);
  auto dyt = env.input({kM, kN}, DType::f64, probe);
  auto db = env.input({kN}, DType::f64, std::vector<double>(kN, 0.0));
  ops::bias_backward_cpu(dyt, db, env.stream());
  const auto dbias = env.read(db);
  EXPECT_LT(grad_err(b, dbias, [&] { return dot(run(DType::f64), probe); }), kGradTol);
  x = rounded_to_float(x), w = rounded_to_float(w), b = rounded_to_float(b);
  EXPECT_LT(max_scaled_err(run(DType::f32), reference()), kFloatVsDoubleTol);

  // bf16: 1 + (2^-8 + 2^-16) rounds once to 1 + 2^-7; rounding x W^T first (2^-8, a tie to even)
  // and then the sum (1 + 2^-8, a tie to even) would give 1.
  const double e8 = std::ldexp(1.0, -8), e16 = std::ldexp(1.0, -16);
  auto xt = make_input(env, {1, 2}, DType::bf16, {1.0, 1.0});
  auto wt = make_input(env, {1, 2}, DType::bf16, {e8, e16});
  auto bt = make_input(env, {1}, DType::bf16, {1.0});
  auto y = env.output({1, 1}, DType::bf16);
  ops::bias_broadcast_cpu(bt, y, env.stream());
  ops::linear_forward_cpu(xt, wt, y, true, env.stream());
  EXPECT_EQ(env.read(y)[0], 1.0 + 2 * e8);
  // And on random bf16 values: within half a bf16 ulp of the float64 sum, plus the fp32
  // accumulation's error bound (K + 1) 2^-24 sum |terms| (two roundings would reach a whole ulp).
  x = rounded_to_bf16(x), w = rounded_to_bf16(w), b = rounded_to_bf16(b);
  const auto got = run(DType::bf16), want = reference();
  for (int64_t i = 0; i < kM * kN; ++i) {
    const int64_t m = i / kN, n = i % kN;
    double abs_terms = std::abs(b[n]);
    for (int64_t k = 0; k < K; ++k) abs_terms += std::abs(x[m * K + k] * w[n * K + k]);
    const double ulp = std::ldexp(1.0, std::ilogb(want[i]) - 7);
    EXPECT_LE(std::abs(got[i] - want[i]), 0.5 * ulp + (K + 1) * std::ldexp(abs_terms, -24)) << i;
  }
}

TEST(Bias, Bf16IsTheF32ResultRoundedOnceAndTakesAnF32Dbias) {
  OpEnv env;
  constexpr int64_t kRowsBig = 300;  // a column sum long enough for its rounding to matter
  const auto dy = rounded_to_bf16(random_vector(kRowsBig * kN, 8));
  const auto init = rounded_to_bf16(random_vector(kN, 9, 4.0));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto dyt = make_input(env, {kRowsBig, kN}, dt, dy);
    r.push_back(make_input(env, {kN}, dt, init));
    ops::bias_backward_cpu(dyt, r.back(), env.stream());
    r.push_back(env.output({kRowsBig, kN}, dt));
    ops::bias_broadcast_cpu(r[0], r.back(), env.stream());  // the updated dbias as a bias
    env.stream().synchronize();
    return r;
  });
  // An f32 dbias (the fp32 main gradient) beside bf16 dy accumulates exactly as the f32 path.
  std::vector<std::vector<double>> dbs;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto dyt = make_input(env, {kRowsBig, kN}, dt, dy);
    auto db = env.input({kN}, DType::f32, init);
    ops::bias_backward_cpu(dyt, db, env.stream());
    ops::bias_backward_cpu(dyt, db, env.stream());  // twice: +=
    dbs.push_back(env.read(db));
  }
  EXPECT_EQ(dbs[1], dbs[0]);
}

TEST(Bias, RejectsBadArgumentsAtTheCall) {
  OpEnv env;
  Stream& s = env.stream();
  auto b32 = env.input({kN}, DType::f32, random_vector(kN, 10));
  auto b64 = env.input({kN}, DType::f64, random_vector(kN, 11));
  auto bb = make_input(env, {kN}, DType::bf16, random_vector(kN, 12));
  auto b2d = env.input({1, kN}, DType::f32, random_vector(kN, 13));
  auto bi = env.indices({kN}, DType::i32, std::vector<int64_t>(kN, 1));
  auto y32 = env.output({kM, kN}, DType::f32), y64 = env.output({kM, kN}, DType::f64);
  auto yb = env.output({kM, kN}, DType::bf16), y_short = env.output({kM, kN - 1}, DType::f32);
  const std::string bc = "bias_broadcast_cpu", bw = "bias_backward_cpu";
  expect_error([&] { ops::bias_broadcast_cpu(b32, y_short, s); }, {bc, "y"});
  expect_error([&] { ops::bias_broadcast_cpu(b2d, y32, s); }, {bc, "bias must be"});
  expect_error([&] { ops::bias_broadcast_cpu(bi, y32, s); }, {bc, "bias must be"});
  expect_error([&] { ops::bias_broadcast_cpu(b32, y64, s); }, {bc, "y"});
  expect_error([&] { ops::bias_broadcast_cpu(b64, y32, s); }, {bc, "y"});
  expect_error([&] { ops::bias_broadcast_cpu(b32, yb, s); }, {bc, "y"});  // f32 only beside bf16
  expect_error([&] { ops::bias_backward_cpu(y32, b64, s); }, {bw, "dbias"});
  expect_error([&] { ops::bias_backward_cpu(y32, bb, s); }, {bw, "dbias"});
  expect_error([&] { ops::bias_backward_cpu(y_short, b32, s); }, {bw, "dbias"});
  expect_error([&] { ops::bias_backward_cpu(b32, b32, s); }, {bw, "dy must be"});
  s.synchronize();
}

// ---------------------------------------------------------------------------------------------
// Grouped bias: G biases, rows grouped by host offsets

TEST(GroupedBias, IsThePerGroupLoopAndSkipsEmptyAndUndefinedGroups) {
  OpEnv env;
  const std::vector<int64_t> offsets = {0, 3, 3, 8, 10};  // group 1 is empty
  constexpr int64_t kRows = 10;
  constexpr size_t G = 4;
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    const std::string what(dtype_name(dt));
    const DType acc = dt == DType::bf16 ? DType::f32 : dt;  // bf16: the fp32 main gradient
    std::vector<OwnedTensor> owned;
    std::vector<Tensor> biases, dbiases;
    std::vector<std::vector<double>> bias_values, init;
    for (size_t g = 0; g < G; ++g) {
      bias_values.push_back(rounded_to_bf16(random_vector(kN, 20 + g, 2.0)));
      owned.push_back(make_input(env, {kN}, dt, bias_values[g]));
      biases.push_back(owned.back());
      init.push_back(rounded_to_bf16(random_vector(kN, 30 + g)));
      owned.push_back(make_input(env, {kN}, g == 2 ? dt : acc, init[g]));  // bf16 dbias in g 2
      dbiases.push_back(owned.back());
    }
    auto y = env.output({kRows, kN}, dt);
    ops::grouped_bias_broadcast_cpu(biases, offsets, y, env.stream());
    const auto got = env.read(y);
    for (size_t g = 0; g < G; ++g) {
      for (int64_t i = offsets[g] * kN; i < offsets[g + 1] * kN; ++i) {
        ASSERT_EQ(got[i], bias_values[g][i % kN]) << what << " group " << g << " element " << i;
      }
    }

    const auto dy = rounded_to_bf16(random_vector(kRows * kN, 40));
    auto dyt = make_input(env, {kRows, kN}, dt, dy);
    std::vector<Tensor> skip3 = dbiases;
    skip3[3] = Tensor();  // group 3's gradient is not wanted
    ops::grouped_bias_backward_cpu(dyt, offsets, skip3, env.stream());
    // Group by group: bias_backward on the group's rows, bitwise.
    for (size_t g = 0; g < G; ++g) {
      auto want = make_input(env, {kN}, dbiases[g].dtype(), init[g]);
      if (g != 1 && g != 3) {
        ops::bias_backward_cpu(dyt.view().rows(offsets[g], offsets[g + 1]), want, env.stream());
      }
      EXPECT_EQ(env.read(dbiases[g]), env.read(want)) << what << " group " << g;
    }
  }
}

TEST(GroupedBias, RejectsBadArgumentsNamingTheGroup) {
  OpEnv env;
  Stream& s = env.stream();
  auto b0 = env.input({kN}, DType::f32, random_vector(kN, 50));
  auto b1 = env.input({kN}, DType::f32, random_vector(kN, 51));
  auto b64 = env.input({kN}, DType::f64, random_vector(kN, 52));
  auto b_short = env.input({kN - 1}, DType::f32, random_vector(kN - 1, 53));
  auto y = env.output({kM, kN}, DType::f32);
  const std::vector<Tensor> two = {b0, b1};
  const std::string op = "grouped_bias_broadcast_cpu", bw = "grouped_bias_backward_cpu";
  using Offsets = std::vector<int64_t>;
  expect_error([&] { ops::grouped_bias_broadcast_cpu({}, Offsets{0}, y, s); }, {op, "at least"});
  expect_error([&] { ops::grouped_bias_broadcast_cpu(two, Offsets{0, kM}, y, s); }, {op, "3 row"});
  expect_error(
      [&] {
        ops::grouped_bias_broadcast_cpu(two, Offsets{1, 2, kM}, y, s);
      },
      {op, "offsets[0]"});
  expect_error(
      [&] {
        ops::grouped_bias_broadcast_cpu(two, Offsets{0, 5, 4}, y, s);
      },
      {op, "group 1", "must not decrease"});
  expect_error(
      [&] {
        ops::grouped_bias_broadcast_cpu(two, Offsets{0, 2, kM - 1}, y, s);
      },
      {op, "rows of y"});
  expect_error(
      [&] {
        ops::grouped_bias_broadcast_cpu(std::vector<Tensor>{b0, b64}, Offsets{0, 2, kM}, y, s);
      },
      {op, "group 1"});
  expect_error(
      [&] {
        ops::grouped_bias_broadcast_cpu(std::vector<Tensor>{b0, b_short}, Offsets{0, 2, kM}, y, s);
      },
      {op, "group 1"});
  expect_error(
      [&] {
        ops::grouped_bias_backward_cpu(y, Offsets{0, 2, kM}, std::vector<Tensor>{b0, b_short}, s);
      },
      {bw, "group 1", "dbias"});
  expect_error([&] { ops::grouped_bias_backward_cpu(y, Offsets{0, kM}, two, s); }, {bw, "3 row"});
  s.synchronize();
}

// ---------------------------------------------------------------------------------------------
// Clamped SwiGLU (gpt-oss): a, b (M, F), limit 7, alpha 1.702, up_offset 1

constexpr int64_t kRowsA = 4, kF = 10;
const ops::SwigluParams kGptOss = ops::SwigluParams::gpt_oss();

// a and b of scale 6, which cross +-7 often, with exact bound values planted: a = 7, b = 7 and
// b = -7 (the inclusive gradient), a = -7 (no bound for a below) and a = b = 20 (clamped).
std::vector<double> clamp_inputs(uint64_t seed, bool gate) {
  auto v = random_vector(kRowsA * kF, seed, 6.0);
  const std::vector<double> planted = gate ? std::vector<double>{7.0, -7.0, 20.0, 0.5}
                                           : std::vector<double>{7.0, -7.0, 20.0, -20.0};
  std::copy(planted.begin(), planted.end(), v.begin());
  return v;
}

struct ClampRef {
  std::vector<double> h, da, db;
};

// The float64 reference of ops/swiglu.h's clamped formulas, masks on the inclusive ranges.
ClampRef clamp_reference(const std::vector<double>& a, const std::vector<double>& b,
                         const std::vector<double>& dh, const ops::SwigluParams& p) {
  ClampRef r;
  for (size_t i = 0; i < a.size(); ++i) {
    const double g = std::min(a[i], p.limit), u = std::clamp(b[i], -p.limit, p.limit);
    const double s = 1 / (1 + std::exp(-p.alpha * g));
    r.h.push_back((u + p.up_offset) * g * s);
    r.da.push_back(a[i] <= p.limit ? dh[i] * (u + p.up_offset) * (s + p.alpha * g * s * (1 - s))
                                   : 0.0);
    r.db.push_back(std::abs(b[i]) <= p.limit ? dh[i] * g * s : 0.0);
  }
  return r;
}

struct SwigluRun {
  std::vector<double> h, da, db;
};

SwigluRun run_clamped(OpEnv& env, DType dt, const std::vector<double>& a,
                      const std::vector<double>& b, const std::vector<double>& dh,
                      const ops::SwigluParams& p) {
  const int64_t m = static_cast<int64_t>(a.size()) / kF;
  auto at = make_input(env, {m, kF}, dt, a), bt = make_input(env, {m, kF}, dt, b);
  auto dht = make_input(env, {m, kF}, dt, dh);
  auto h = env.output({m, kF}, dt), da = env.output({m, kF}, dt), db = env.output({m, kF}, dt);
  ops::swiglu_forward_cpu(at, bt, p, h, env.stream());
  ops::swiglu_backward_cpu(at, bt, dht, p, da, db, env.stream());
  return {env.read(h), env.read(da), env.read(db)};
}

TEST(SwigluClamped, MatchesTheFloat64ReferenceWithInclusiveGradientBounds) {
  OpEnv env;
  const auto a = clamp_inputs(60, true), b = clamp_inputs(61, false);
  const auto dh = random_vector(kRowsA * kF, 62);
  const ClampRef ref = clamp_reference(a, b, dh, kGptOss);
  const SwigluRun got = run_clamped(env, DType::f64, a, b, dh, kGptOss);
  EXPECT_LT(max_rel_err(got.h, ref.h), kForwardTol);
  EXPECT_LT(max_rel_err(got.da, ref.da), kForwardTol);
  EXPECT_LT(max_rel_err(got.db, ref.db), kForwardTol);
  // The planted bounds: a = 7 and b = +-7 pass their gradient, a = b = 20 get exactly 0 and give
  // a = 7's (b = 7's) forward values.
  EXPECT_NE(got.da[0], 0.0);
  EXPECT_NE(got.db[0], 0.0);
  EXPECT_NE(got.db[1], 0.0);
  EXPECT_EQ(got.da[2], 0.0);
  EXPECT_EQ(got.db[2], 0.0);
  EXPECT_EQ(got.db[3], 0.0);
  size_t beyond = 0;  // the random values cross the bounds too
  for (size_t i = 4; i < a.size(); ++i) beyond += (a[i] > 7) + (std::abs(b[i]) > 7);
  EXPECT_GE(beyond, 4u);
  auto at = env.input({1, 2}, DType::f64, {7.0, 20.0});
  auto bt = env.input({1, 2}, DType::f64, {7.0, 20.0});
  auto h = env.output({1, 2}, DType::f64);
  ops::swiglu_forward_cpu(at, bt, kGptOss, h, env.stream());
  EXPECT_EQ(env.read(h)[0], env.read(h)[1]);
  // Just past a bound the gradient is 0.
  const double past = std::nextafter(7.0, 8.0);
  const SwigluRun edge =
      run_clamped(env, DType::f64, std::vector<double>(kF, past), std::vector<double>(kF, -past),
                  std::vector<double>(kF, 1.0), kGptOss);
  EXPECT_EQ(edge.da, std::vector<double>(kF, 0.0));
  EXPECT_EQ(edge.db, std::vector<double>(kF, 0.0));
  // f32 against f64 on the same (float) values.
  const auto af = rounded_to_float(a), bf = rounded_to_float(b), dhf = rounded_to_float(dh);
  const SwigluRun f = run_clamped(env, DType::f32, af, bf, dhf, kGptOss);
  const SwigluRun d = run_clamped(env, DType::f64, af, bf, dhf, kGptOss);
  EXPECT_LT(max_scaled_err(f.h, d.h), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(f.da, d.da), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(f.db, d.db), kFloatVsDoubleTol);
}

// Away from the kinks (|a - 7|, |b -+ 7| > 0.05, far beyond the finite-difference steps of up to
// 2e-3), the gradients are those of h, for gpt-oss's parameters and for other ones.
TEST(SwigluClamped, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  for (const ops::SwigluParams& p : {kGptOss, ops::SwigluParams{0.7, 2.5, -0.3}}) {
    auto a = random_vector(kRowsA * kF, 63, 3.0), b = random_vector(kRowsA * kF, 64, 3.0);
    for (auto* v : {&a, &b}) {
      for (double& x : *v) {
        if (std::abs(std::abs(x) - p.limit) < 0.05) x += 0.1;
      }
    }
    const auto probe = random_vector(kRowsA * kF, 65);
    const SwigluRun g = run_clamped(env, DType::f64, a, b, probe, p);
    auto loss = [&] { return dot(run_clamped(env, DType::f64, a, b, probe, p).h, probe); };
    EXPECT_LT(grad_err(a, g.da, loss), kGradTol) << "limit " << p.limit;
    EXPECT_LT(grad_err(b, g.db, loss), kGradTol) << "limit " << p.limit;
  }
}

TEST(SwigluClamped, DefaultParamsRunThePlainOpsBitwise) {
  OpEnv env;
  EXPECT_TRUE(ops::SwigluParams{}.is_plain());
  EXPECT_FALSE(kGptOss.is_plain());
  EXPECT_EQ(kGptOss.limit, 7.0);
  EXPECT_EQ(kGptOss.alpha, 1.702);
  EXPECT_EQ(kGptOss.up_offset, 1.0);
  const auto a = random_vector(kRowsA * kF, 66, 4.0), b = random_vector(kRowsA * kF, 67);
  const auto dh = random_vector(kRowsA * kF, 68);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    auto at = make_input(env, {kRowsA, kF}, dt, a), bt = make_input(env, {kRowsA, kF}, dt, b);
    auto dht = make_input(env, {kRowsA, kF}, dt, dh);
    auto h0 = env.output({kRowsA, kF}, dt), h1 = env.output({kRowsA, kF}, dt);
    auto da0 = env.output({kRowsA, kF}, dt), da1 = env.output({kRowsA, kF}, dt);
    auto db0 = env.output({kRowsA, kF}, dt), db1 = env.output({kRowsA, kF}, dt);
    ops::swiglu_forward_cpu(at, bt, h0, env.stream());
    ops::swiglu_forward_cpu(at, bt, ops::SwigluParams{}, h1, env.stream());
    ops::swiglu_backward_cpu(at, bt, dht, da0, db0, env.stream());
    ops::swiglu_backward_cpu(at, bt, dht, ops::SwigluParams{}, da1, db1, env.stream());
    EXPECT_EQ(env.read(h1), env.read(h0)) << dtype_name(dt);
    EXPECT_EQ(env.read(da1), env.read(da0)) << dtype_name(dt);
    EXPECT_EQ(env.read(db1), env.read(db0)) << dtype_name(dt);
    EXPECT_TRUE(testing::all_finite(env.read(da0)));
  }
}

TEST(SwigluClamped, Bf16IsTheF32ResultRoundedOnceAndOutputsMayAliasInputs) {
  OpEnv env;
  const auto a = rounded_to_bf16(clamp_inputs(70, true)),
             b = rounded_to_bf16(clamp_inputs(71, false));
  const auto dh = rounded_to_bf16(random_vector(kRowsA * kF, 72));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto at = make_input(env, {kRowsA, kF}, dt, a), bt = make_input(env, {kRowsA, kF}, dt, b);
    auto dht = make_input(env, {kRowsA, kF}, dt, dh);
    r.push_back(env.output({kRowsA, kF}, dt));
    ops::swiglu_forward_cpu(at, bt, kGptOss, r.back(), env.stream());
    r.push_back(env.output({kRowsA, kF}, dt));
    r.push_back(env.output({kRowsA, kF}, dt));
    ops::swiglu_backward_cpu(at, bt, dht, kGptOss, r[1], r[2], env.stream());
    // In place: da over a, db over b, bitwise the separate outputs.
    r.push_back(make_input(env, {kRowsA, kF}, dt, a));
    r.push_back(make_input(env, {kRowsA, kF}, dt, b));
    ops::swiglu_backward_cpu(r[3], r[4], dht, kGptOss, r[3], r[4], env.stream());
    env.stream().synchronize();
    EXPECT_EQ(env.read(r[3]), env.read(r[1])) << dtype_name(dt);
    EXPECT_EQ(env.read(r[4]), env.read(r[2])) << dtype_name(dt);
    return r;
  });
}

TEST(SwigluClamped, RejectsBadParamsAndShapesAtTheCall) {
  OpEnv env;
  auto a = env.input({kRowsA, kF}, DType::f64, random_vector(kRowsA * kF, 73));
  auto b_bad = env.input({kRowsA, kF + 1}, DType::f64, random_vector(kRowsA * (kF + 1), 74));
  auto h = env.output({kRowsA, kF}, DType::f64);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const ops::SwigluParams& p :
       {ops::SwigluParams{1.702, 0.0, 1.0}, ops::SwigluParams{1.702, -7.0, 1.0},
        ops::SwigluParams{1.702, nan, 1.0}, ops::SwigluParams{nan, 7.0, 1.0},
        ops::SwigluParams{inf, 7.0, 1.0}, ops::SwigluParams{1.702, 7.0, inf}}) {
    expect_error([&] { ops::swiglu_forward_cpu(a, a, p, h, env.stream()); },
                 {"swiglu_forward_cpu", "SwigluParams"});
    expect_error([&] { ops::swiglu_backward_cpu(a, a, a, p, h, h, env.stream()); },
                 {"swiglu_backward_cpu", "SwigluParams"});
  }
  EXPECT_THROW(ops::swiglu_forward_cpu(a, b_bad, kGptOss, h, env.stream()), Error);
  EXPECT_THROW(ops::swiglu_backward_cpu(a, a, a, kGptOss, h, b_bad, env.stream()), Error);
  env.stream().synchronize();
}

}  // namespace
}  // namespace moepeak
