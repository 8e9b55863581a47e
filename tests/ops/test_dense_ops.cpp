// Dense decoder ops on the CPU backend: RMSNorm, RoPE, linear, and the element-wise helpers.
// For each: float64 forward against a plain double reference in this file, every input gradient
// against central finite differences (L = sum(y * probe)), the float instantiation against the
// double one, accumulate flags, and argument errors. Outputs are poisoned with NaN before each run.
// The MoE ops are in test_moe_ops.cpp, the vocabulary ops in test_vocab_ops.cpp. Bf16Storage at
// the end: with bf16 storage each op is its f32 path plus one rounding per output.
// Run: ./build-ops/tests/ops/test_dense_ops
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/dtype.h"
#include "ops/copy_2d.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using testing::all_finite;
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

// ---------------------------------------------------------------------------------------------
// RMSNorm: x (N, H), w (H)

constexpr int64_t kRows = 5, kHidden = 12;
constexpr double kEps = 1e-5;

struct RmsnormForward {
  std::vector<double> y, rstd;
};

RmsnormForward run_rmsnorm_forward(OpEnv& env, DType dtype, const std::vector<double>& x,
                                   const std::vector<double>& w) {
  auto xt = env.input({kRows, kHidden}, dtype, x);
  auto wt = env.input({kHidden}, dtype, w);
  auto y = env.output({kRows, kHidden}, dtype);
  auto rstd = env.output({kRows}, dtype);
  ops::rmsnorm_forward_cpu(xt, wt, kEps, y, rstd, env.stream());
  return {env.read(y), env.read(rstd)};
}

struct RmsnormGrads {
  std::vector<double> dx, dw;
};

// dw starts at dw_init (the op accumulates into it).
RmsnormGrads run_rmsnorm_backward(OpEnv& env, DType dtype, const std::vector<double>& x,
                                  const std::vector<double>& w, const std::vector<double>& dy,
                                  const std::vector<double>& dw_init) {
  auto xt = env.input({kRows, kHidden}, dtype, x);
  auto wt = env.input({kHidden}, dtype, w);
  auto y = env.output({kRows, kHidden}, dtype);
  auto rstd = env.output({kRows}, dtype);
  ops::rmsnorm_forward_cpu(xt, wt, kEps, y, rstd, env.stream());
  auto dyt = env.input({kRows, kHidden}, dtype, dy);
  auto dx = env.output({kRows, kHidden}, dtype);
  auto dw = env.input({kHidden}, dtype, dw_init);
  ops::rmsnorm_backward_cpu(xt, wt, rstd, dyt, dx, dw, env.stream());
  return {env.read(dx), env.read(dw)};
}

TEST(Rmsnorm, ForwardMatchesDoubleReference) {
  OpEnv env;
  auto x = random_vector(kRows * kHidden, 1);
  auto w = random_vector(kHidden, 2);
  RmsnormForward got = run_rmsnorm_forward(env, DType::f64, x, w);
  std::vector<double> y_ref(x.size()), rstd_ref(kRows);
  for (int64_t n = 0; n < kRows; ++n) {
    double sum_sq = 0;
    for (int64_t h = 0; h < kHidden; ++h) sum_sq += x[n * kHidden + h] * x[n * kHidden + h];
    rstd_ref[n] = 1.0 / std::sqrt(sum_sq / kHidden + kEps);
    for (int64_t h = 0; h < kHidden; ++h) {
      y_ref[n * kHidden + h] = x[n * kHidden + h] * rstd_ref[n] * w[h];
    }
  }
  EXPECT_LT(max_rel_err(got.y, y_ref), kForwardTol);
  EXPECT_LT(max_rel_err(got.rstd, rstd_ref), kForwardTol);
}

TEST(Rmsnorm, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto x = random_vector(kRows * kHidden, 3);
  auto w = random_vector(kHidden, 4);
  auto probe = random_vector(kRows * kHidden, 5);
  RmsnormGrads g =
      run_rmsnorm_backward(env, DType::f64, x, w, probe, std::vector<double>(kHidden, 0.0));
  auto loss = [&] { return dot(run_rmsnorm_forward(env, DType::f64, x, w).y, probe); };
  EXPECT_LT(grad_err(x, g.dx, loss), kGradTol);
  EXPECT_LT(grad_err(w, g.dw, loss), kGradTol);
}

TEST(Rmsnorm, DwAccumulatesAndDxIsWritten) {
  OpEnv env;
  auto x = random_vector(kRows * kHidden, 6);
  auto w = random_vector(kHidden, 7);
  auto dy = random_vector(kRows * kHidden, 8);
  auto dw_init = random_vector(kHidden, 9);
  RmsnormGrads from_zero =
      run_rmsnorm_backward(env, DType::f64, x, w, dy, std::vector<double>(kHidden, 0.0));
  RmsnormGrads from_init = run_rmsnorm_backward(env, DType::f64, x, w, dy, dw_init);
  for (int64_t h = 0; h < kHidden; ++h) {
    EXPECT_EQ(from_init.dw[h], dw_init[h] + from_zero.dw[h]) << "h=" << h;  // one rounding: T(+=)
  }
  EXPECT_EQ(from_init.dx, from_zero.dx);
}

TEST(Rmsnorm, FloatMatchesDouble) {
  OpEnv env;
  auto x = rounded_to_float(random_vector(kRows * kHidden, 10));
  auto w = rounded_to_float(random_vector(kHidden, 11));
  auto dy = rounded_to_float(random_vector(kRows * kHidden, 12));
  std::vector<double> zeros(kHidden, 0.0);
  RmsnormForward f = run_rmsnorm_forward(env, DType::f32, x, w);
  RmsnormForward d = run_rmsnorm_forward(env, DType::f64, x, w);
  EXPECT_LT(max_scaled_err(f.y, d.y), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(f.rstd, d.rstd), kFloatVsDoubleTol);
  RmsnormGrads gf = run_rmsnorm_backward(env, DType::f32, x, w, dy, zeros);
  RmsnormGrads gd = run_rmsnorm_backward(env, DType::f64, x, w, dy, zeros);
  EXPECT_LT(max_scaled_err(gf.dx, gd.dx), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(gf.dw, gd.dw), kFloatVsDoubleTol);
}

TEST(Rmsnorm, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto x = env.input({kRows, kHidden}, DType::f64, random_vector(kRows * kHidden, 13));
  auto w = env.input({kHidden}, DType::f64, random_vector(kHidden, 14));
  auto w_short = env.input({kHidden - 1}, DType::f64, random_vector(kHidden - 1, 15));
  auto w_f32 = env.input({kHidden}, DType::f32, random_vector(kHidden, 16));
  auto y = env.output({kRows, kHidden}, DType::f64);
  auto rstd = env.output({kRows}, DType::f64);
  auto rstd_bad = env.output({kRows + 1}, DType::f64);
  EXPECT_THROW(ops::rmsnorm_forward_cpu(x, w_short, kEps, y, rstd, env.stream()), Error);
  EXPECT_THROW(ops::rmsnorm_forward_cpu(x, w_f32, kEps, y, rstd, env.stream()), Error);
  EXPECT_THROW(ops::rmsnorm_forward_cpu(x, w, kEps, y, rstd_bad, env.stream()), Error);
  try {
    ops::rmsnorm_forward_cpu(x, w, kEps, rstd, rstd, env.stream());
    ADD_FAILURE() << "no error for a wrong y";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rmsnorm_forward_cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("(5, 12)"), std::string::npos) << m;
  }
  auto dx = env.output({kRows, kHidden}, DType::f64);
  auto dw = env.output({kHidden}, DType::f64);
  EXPECT_THROW(ops::rmsnorm_backward_cpu(x, w, rstd, x, dx, w_short, env.stream()), Error);
  EXPECT_THROW(ops::rmsnorm_backward_cpu(x, w, rstd_bad, x, dx, dw, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// RoPE: x (N, n_heads, d), positions (N) i64

constexpr int64_t kTokens = 6, kHeads = 3, kHeadDim = 8;
constexpr double kTheta = 10000.0;
// Plain RoPE over the whole head (the scaling types: test_rope_scaling.cpp).
const ops::RopeParams kRope = ops::RopeParams::standard(kTheta, kHeadDim);
// Global positions, not 0..N-1: a chunk in the middle of a long sequence, and a large one where
// double angles matter.
const std::vector<int64_t> kPositions = {0, 1, 7, 4096, 4097, 131071};

std::vector<double> run_rope(OpEnv& env, DType dtype, const std::vector<double>& x, bool backward) {
  auto xt = env.input({kTokens, kHeads, kHeadDim}, dtype, x);
  auto pos = env.indices({kTokens}, DType::i64, kPositions);
  if (backward) {
    ops::rope_backward_cpu(xt, pos, kRope, env.stream());
  } else {
    ops::rope_forward_cpu(xt, pos, kRope, env.stream());
  }
  return env.read(xt);
}

TEST(Rope, ForwardMatchesRotateHalfReference) {
  OpEnv env;
  auto x = random_vector(kTokens * kHeads * kHeadDim, 20);
  auto got = run_rope(env, DType::f64, x, false);
  std::vector<double> ref(x.size());
  int64_t half = kHeadDim / 2;
  for (int64_t n = 0; n < kTokens; ++n) {
    for (int64_t head = 0; head < kHeads; ++head) {
      const double* v = x.data() + (n * kHeads + head) * kHeadDim;
      double* r = ref.data() + (n * kHeads + head) * kHeadDim;
      for (int64_t i = 0; i < half; ++i) {
        double angle = static_cast<double>(kPositions[n]) * std::pow(kTheta, -2.0 * i / kHeadDim);
        // rotate_half(v) = (-v[half:], v[:half]); out = v * cos + rotate_half(v) * sin.
        r[i] = v[i] * std::cos(angle) - v[i + half] * std::sin(angle);
        r[i + half] = v[i + half] * std::cos(angle) + v[i] * std::sin(angle);
      }
    }
  }
  EXPECT_LT(max_scaled_err(got, ref), kForwardTol);
  // Position 0 is the identity.
  for (int64_t j = 0; j < kHeads * kHeadDim; ++j) EXPECT_EQ(got[j], x[j]);
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  OpEnv env;
  auto x = random_vector(kTokens * kHeads * kHeadDim, 21);
  auto probe = random_vector(x.size(), 22);
  auto dx = run_rope(env, DType::f64, probe, true);
  auto loss = [&] { return dot(run_rope(env, DType::f64, x, false), probe); };
  EXPECT_LT(grad_err(x, dx, loss), kGradTol);
  // The rotation is orthogonal: its transpose undoes it.
  auto back = run_rope(env, DType::f64, run_rope(env, DType::f64, x, false), true);
  EXPECT_LT(max_scaled_err(back, x), 1e-12);
}

TEST(Rope, FloatMatchesDouble) {
  OpEnv env;
  auto x = rounded_to_float(random_vector(kTokens * kHeads * kHeadDim, 23));
  for (bool backward : {false, true}) {
    EXPECT_LT(max_scaled_err(run_rope(env, DType::f32, x, backward),
                             run_rope(env, DType::f64, x, backward)),
              kFloatVsDoubleTol)
        << (backward ? "backward" : "forward");
  }
}

TEST(Rope, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto odd = env.input({2, 1, 3}, DType::f64, random_vector(6, 24));
  auto x = env.input({2, 1, 4}, DType::f64, random_vector(8, 25));
  auto pos2 = env.indices({2}, DType::i64, {0, 1});
  auto pos3 = env.indices({3}, DType::i64, {0, 1, 2});
  auto pos_i32 = env.indices({2}, DType::i32, {0, 1});
  const auto rope3 = ops::RopeParams::standard(kTheta, 3),
             rope4 = ops::RopeParams::standard(kTheta, 4);
  EXPECT_THROW(ops::rope_forward_cpu(odd, pos2, rope3, env.stream()), Error);
  EXPECT_THROW(ops::rope_forward_cpu(x, pos3, rope4, env.stream()), Error);
  EXPECT_THROW(ops::rope_backward_cpu(x, pos_i32, rope4, env.stream()), Error);
  EXPECT_THROW(ops::rope_forward_cpu(x.view().reshape({2, 4}), pos2, rope4, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// Linear: x (M, K), w (N, K), y (M, N)

constexpr int64_t kM = 5, kK = 7, kN = 4;

std::vector<double> run_linear_forward(OpEnv& env, DType dtype, int64_t m,
                                       const std::vector<double>& x, const std::vector<double>& w,
                                       const std::vector<double>* y_init = nullptr) {
  auto xt = env.input({m, kK}, dtype, x);
  auto wt = env.input({kN, kK}, dtype, w);
  auto y = y_init ? env.input({m, kN}, dtype, *y_init) : env.output({m, kN}, dtype);
  ops::linear_forward_cpu(xt, wt, y, y_init != nullptr, env.stream());
  return env.read(y);
}

struct LinearGrads {
  std::vector<double> dx, dw;
};

// dx starts at dx_init when accumulating (else poisoned); dw starts at dw_init.
LinearGrads run_linear_backward(OpEnv& env, DType dtype, int64_t m, const std::vector<double>& x,
                                const std::vector<double>& w, const std::vector<double>& dy,
                                const std::vector<double>* dx_init,
                                const std::vector<double>& dw_init) {
  auto xt = env.input({m, kK}, dtype, x);
  auto wt = env.input({kN, kK}, dtype, w);
  auto dyt = env.input({m, kN}, dtype, dy);
  auto dx = dx_init ? env.input({m, kK}, dtype, *dx_init) : env.output({m, kK}, dtype);
  auto dw = env.input({kN, kK}, dtype, dw_init);
  ops::linear_backward_cpu(xt, wt, dyt, dx, dx_init != nullptr, dw, env.stream());
  return {env.read(dx), env.read(dw)};
}

std::vector<double> matmul_xwt(const std::vector<double>& x, const std::vector<double>& w,
                               int64_t m) {
  std::vector<double> y(m * kN, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t k = 0; k < kK; ++k) y[i * kN + j] += x[i * kK + k] * w[j * kK + k];
    }
  }
  return y;
}

TEST(Linear, ForwardMatchesReferenceAndAccumulates) {
  OpEnv env;
  auto x = random_vector(kM * kK, 30);
  auto w = random_vector(kN * kK, 31);
  auto ref = matmul_xwt(x, w, kM);
  EXPECT_LT(max_scaled_err(run_linear_forward(env, DType::f64, kM, x, w), ref), kForwardTol);
  auto y_init = random_vector(kM * kN, 32);
  auto acc = run_linear_forward(env, DType::f64, kM, x, w, &y_init);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += y_init[i];
  EXPECT_LT(max_scaled_err(acc, ref), kForwardTol);
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  OpEnv env;
  auto x = random_vector(kM * kK, 33);
  auto w = random_vector(kN * kK, 34);
  auto probe = random_vector(kM * kN, 35);
  LinearGrads g = run_linear_backward(env, DType::f64, kM, x, w, probe, nullptr,
                                      std::vector<double>(kN * kK, 0.0));
  auto loss = [&] { return dot(run_linear_forward(env, DType::f64, kM, x, w), probe); };
  EXPECT_LT(grad_err(x, g.dx, loss), kGradTol);
  EXPECT_LT(grad_err(w, g.dw, loss), kGradTol);
}

TEST(Linear, BackwardAccumulatesDxOnRequestAndDwAlways) {
  OpEnv env;
  auto x = random_vector(kM * kK, 36);
  auto w = random_vector(kN * kK, 37);
  auto dy = random_vector(kM * kN, 38);
  auto dx_init = random_vector(kM * kK, 39);
  auto dw_init = random_vector(kN * kK, 40);
  std::vector<double> zeros_w(kN * kK, 0.0);
  LinearGrads plain = run_linear_backward(env, DType::f64, kM, x, w, dy, nullptr, zeros_w);
  LinearGrads acc = run_linear_backward(env, DType::f64, kM, x, w, dy, &dx_init, dw_init);
  std::vector<double> dx_ref = plain.dx, dw_ref = plain.dw;
  for (size_t i = 0; i < dx_ref.size(); ++i) dx_ref[i] += dx_init[i];
  for (size_t i = 0; i < dw_ref.size(); ++i) dw_ref[i] += dw_init[i];
  EXPECT_LT(max_scaled_err(acc.dx, dx_ref), kForwardTol);
  EXPECT_LT(max_scaled_err(acc.dw, dw_ref), kForwardTol);

  // An undefined dx skips the input gradient; dw still accumulates.
  auto xt = env.input({kM, kK}, DType::f64, x);
  auto wt = env.input({kN, kK}, DType::f64, w);
  auto dyt = env.input({kM, kN}, DType::f64, dy);
  auto dw = env.input({kN, kK}, DType::f64, dw_init);
  ops::linear_backward_cpu(xt, wt, dyt, Tensor(), false, dw, env.stream());
  EXPECT_LT(max_scaled_err(env.read(dw), dw_ref), kForwardTol);
}

TEST(Linear, ExpertWithNoTokens) {
  OpEnv env;
  auto w = random_vector(kN * kK, 41);
  auto dw_init = random_vector(kN * kK, 42);
  EXPECT_TRUE(run_linear_forward(env, DType::f64, 0, {}, w).empty());
  LinearGrads g = run_linear_backward(env, DType::f64, 0, {}, w, {}, nullptr, dw_init);
  EXPECT_TRUE(g.dx.empty());
  EXPECT_EQ(g.dw, dw_init);  // dw += 0 rows: unchanged, bit for bit
  // An empty inner dimension (K = 0): y = x w^T is all zeros, written over the NaN poison.
  auto x0 = env.input({kM, 0}, DType::f64, {});
  auto w0 = env.input({kN, 0}, DType::f64, {});
  auto y = env.output({kM, kN}, DType::f64);
  ops::linear_forward_cpu(x0, w0, y, false, env.stream());
  EXPECT_EQ(env.read(y), std::vector<double>(kM * kN, 0.0));
}

TEST(Linear, FloatMatchesDouble) {
  OpEnv env;
  auto x = rounded_to_float(random_vector(kM * kK, 43));
  auto w = rounded_to_float(random_vector(kN * kK, 44));
  auto dy = rounded_to_float(random_vector(kM * kN, 45));
  std::vector<double> zeros(kN * kK, 0.0);
  EXPECT_LT(max_scaled_err(run_linear_forward(env, DType::f32, kM, x, w),
                           run_linear_forward(env, DType::f64, kM, x, w)),
            kFloatVsDoubleTol);
  LinearGrads gf = run_linear_backward(env, DType::f32, kM, x, w, dy, nullptr, zeros);
  LinearGrads gd = run_linear_backward(env, DType::f64, kM, x, w, dy, nullptr, zeros);
  EXPECT_LT(max_scaled_err(gf.dx, gd.dx), kFloatVsDoubleTol);
  EXPECT_LT(max_scaled_err(gf.dw, gd.dw), kFloatVsDoubleTol);
}

TEST(Linear, LargerGemmsOverwriteThePoisonAndRepeatBitForBit) {
  // Large enough for OpenBLAS's blocked, threaded kernels; beta = 0 must overwrite the NaN poison.
  OpEnv env;
  constexpr int64_t m = 96, k = 160, n = 72;
  auto x = env.input({m, k}, DType::f32, random_vector(m * k, 50));
  auto w = env.input({n, k}, DType::f32, random_vector(n * k, 51));
  auto dy = env.input({m, n}, DType::f32, random_vector(m * n, 52));
  std::vector<double> first_y, first_dx, first_dw;
  for (int run = 0; run < 2; ++run) {
    auto y = env.output({m, n}, DType::f32);
    auto dx = env.output({m, k}, DType::f32);
    auto dw = env.input({n, k}, DType::f32, std::vector<double>(n * k, 0.0));
    ops::linear_forward_cpu(x, w, y, false, env.stream());
    ops::linear_backward_cpu(x, w, dy, dx, false, dw, env.stream());
    auto yv = env.read(y), dxv = env.read(dx), dwv = env.read(dw);
    EXPECT_TRUE(all_finite(yv) && all_finite(dxv) && all_finite(dwv));
    if (run == 0) {
      first_y = yv, first_dx = dxv, first_dw = dwv;
    } else {
      EXPECT_EQ(yv, first_y);
      EXPECT_EQ(dxv, first_dx);
      EXPECT_EQ(dwv, first_dw);
    }
  }
}

TEST(Linear, RejectsBadShapesAtTheCall) {
  OpEnv env;
  auto x = env.input({kM, kK}, DType::f64, random_vector(kM * kK, 46));
  auto w = env.input({kN, kK}, DType::f64, random_vector(kN * kK, 47));
  auto w_bad_k = env.input({kN, kK + 1}, DType::f64, random_vector(kN * (kK + 1), 48));
  auto w_f32 = env.input({kN, kK}, DType::f32, random_vector(kN * kK, 49));
  auto y = env.output({kM, kN}, DType::f64);
  auto y_bad = env.output({kM, kN + 1}, DType::f64);
  EXPECT_THROW(ops::linear_forward_cpu(x, w_bad_k, y, false, env.stream()), Error);
  EXPECT_THROW(ops::linear_forward_cpu(x, w_f32, y, false, env.stream()), Error);
  EXPECT_THROW(ops::linear_forward_cpu(x, w, y_bad, false, env.stream()), Error);
  auto dw = env.output({kN, kK}, DType::f64);
  auto dx_bad = env.output({kM, kK + 1}, DType::f64);
  EXPECT_THROW(ops::linear_backward_cpu(x, w, y_bad, Tensor(), false, dw, env.stream()), Error);
  EXPECT_THROW(ops::linear_backward_cpu(x, w, y, dx_bad, false, dw, env.stream()), Error);
  EXPECT_THROW(ops::linear_backward_cpu(x, w, y, Tensor(), false, y, env.stream()), Error);
  env.stream().synchronize();
}

TEST(Linear, ColumnBlockIsTheLinearOfThatBlockAndTouchesOnlyItsColumnsOfDw) {
  // w (N, K_w = 11), block [3, 3 + kK): the ops must equal the plain ops on a contiguous copy of
  // the block, write or add dx as asked, and add to dw's block columns only (the others keep
  // their seeded values bit for bit); an undefined dw skips the weight gradient.
  OpEnv env;
  constexpr int64_t kWide = 11, k0 = 3;
  auto w_wide = random_vector(kN * kWide, 60);
  std::vector<double> w_block(kN * kK);
  for (int64_t j = 0; j < kN; ++j) {
    for (int64_t k = 0; k < kK; ++k) w_block[j * kK + k] = w_wide[j * kWide + k0 + k];
  }
  auto x = random_vector(kM * kK, 61), dy = random_vector(kM * kN, 62);
  auto dw_seed = random_vector(kN * kWide, 63);
  std::vector<double> dw_block_seed(kN * kK);
  for (int64_t j = 0; j < kN; ++j) {
    for (int64_t k = 0; k < kK; ++k) dw_block_seed[j * kK + k] = dw_seed[j * kWide + k0 + k];
  }
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? kForwardTol : kFloatVsDoubleTol;
    auto xt = env.input({kM, kK}, dtype, x);
    auto wt = env.input({kN, kWide}, dtype, w_wide);
    auto dyt = env.input({kM, kN}, dtype, dy);
    auto y = env.output({kM, kN}, dtype);
    ops::linear_forward_cols_cpu(xt, wt, k0, y, false, env.stream());
    EXPECT_LT(max_scaled_err(env.read(y), matmul_xwt(x, w_block, kM)), tol);
    auto y_init = random_vector(kM * kN, 64);
    auto y_acc = env.input({kM, kN}, dtype, y_init);
    ops::linear_forward_cols_cpu(xt, wt, k0, y_acc, true, env.stream());
    EXPECT_LT(
        max_scaled_err(env.read(y_acc), run_linear_forward(env, dtype, kM, x, w_block, &y_init)),
        tol);

    auto dx = env.output({kM, kK}, dtype);
    auto dw = env.input({kN, kWide}, dtype, dw_seed);
    ops::linear_backward_cols_cpu(xt, wt, k0, dyt, dx, false, dw, env.stream());
    LinearGrads ref = run_linear_backward(env, dtype, kM, x, w_block, dy, nullptr, dw_block_seed);
    EXPECT_LT(max_scaled_err(env.read(dx), ref.dx), tol);
    const auto got_dw = env.read(dw), seeded = env.read(env.input({kN, kWide}, dtype, dw_seed));
    for (int64_t j = 0; j < kN; ++j) {
      for (int64_t k = 0; k < kWide; ++k) {
        const double v = got_dw[j * kWide + k];
        if (k >= k0 && k < k0 + kK) {
          EXPECT_NEAR(v, ref.dw[j * kK + k - k0], tol * (1 + std::abs(v))) << j << "," << k;
        } else {
          EXPECT_EQ(v, seeded[j * kWide + k]) << "column " << k << " outside the block changed";
        }
      }
    }
    // dx only (dw undefined), accumulated onto a seeded dx; dw only (dx undefined).
    auto dx_init = random_vector(kM * kK, 65);
    auto dx_acc = env.input({kM, kK}, dtype, dx_init);
    ops::linear_backward_cols_cpu(xt, wt, k0, dyt, dx_acc, true, Tensor(), env.stream());
    LinearGrads ref_acc =
        run_linear_backward(env, dtype, kM, x, w_block, dy, &dx_init, dw_block_seed);
    EXPECT_LT(max_scaled_err(env.read(dx_acc), ref_acc.dx), tol);
    auto dw_only = env.input({kN, kWide}, dtype, dw_seed);
    ops::linear_backward_cols_cpu(xt, wt, k0, dyt, Tensor(), false, dw_only, env.stream());
    EXPECT_EQ(env.read(dw_only), got_dw);
  }
  // Blocks outside w, a negative start, and the plain op on a wider w are rejected.
  auto xb = env.input({kM, kK}, DType::f64, random_vector(kM * kK, 66));
  auto wb = env.input({kN, kK + 2}, DType::f64, random_vector(kN * (kK + 2), 67));
  auto yb = env.output({kM, kN}, DType::f64);
  auto dxb = env.output({kM, kK}, DType::f64);
  EXPECT_NO_THROW(ops::linear_forward_cols_cpu(xb, wb, 2, yb, false, env.stream()));
  EXPECT_THROW(ops::linear_forward_cols_cpu(xb, wb, 3, yb, false, env.stream()), Error);
  EXPECT_THROW(ops::linear_forward_cols_cpu(xb, wb, -1, yb, false, env.stream()), Error);
  EXPECT_THROW(ops::linear_backward_cols_cpu(xb, wb, 3, yb, dxb, false, Tensor(), env.stream()),
               Error);
  EXPECT_THROW(ops::linear_forward_cpu(xb, wb, yb, false, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// Element-wise helpers

TEST(Elementwise, AddWritesAndMayAliasEitherInput) {
  OpEnv env;
  auto a = random_vector(24, 50), b = random_vector(24, 51);
  std::vector<double> ref(24);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = a[i] + b[i];
  for (DType dtype : {DType::f64, DType::f32}) {
    auto at = env.input({4, 6}, dtype, a);
    auto bt = env.input({4, 6}, dtype, b);
    auto out = env.output({4, 6}, dtype);
    ops::add_cpu(at, bt, out, env.stream());
    double tol = dtype == DType::f64 ? 0.0 : kFloatVsDoubleTol;
    EXPECT_LE(max_scaled_err(env.read(out), ref), tol);
    ops::add_cpu(at, bt, at, env.stream());  // a += b
    EXPECT_EQ(env.read(at), env.read(out));
    auto bt2 = env.input({4, 6}, dtype, b);
    auto at2 = env.input({4, 6}, dtype, a);
    ops::add_cpu(at2, bt2, bt2, env.stream());  // b = a + b
    EXPECT_EQ(env.read(bt2), env.read(out));
  }
}

TEST(Elementwise, ScaleSumSquaresAndCopy) {
  OpEnv env;
  auto x = random_vector(30, 52);
  auto xt = env.input({5, 6}, DType::f64, x);
  ops::scale_cpu(xt, -0.375, env.stream());
  auto scaled = env.read(xt);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(scaled[i], x[i] * -0.375);

  // sum_squares accumulates into out, in double, over f64 and f32 tensors alike.
  auto out = env.input({1}, DType::f64, {2.5});
  auto x32 = env.input({30}, DType::f32, x);
  ops::sum_squares_cpu(xt, out, env.stream());
  ops::sum_squares_cpu(x32, out, env.stream());
  double ref = 2.5, s64 = 0, s32 = 0;
  for (double v : scaled) s64 += v * v;
  for (double v : x) s32 += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
  ref = (ref + s64) + s32;
  EXPECT_EQ(env.read(out)[0], ref);  // the same additions in the same order

  // With P partials: part p is [p c, min(n, (p + 1) c)), c = ceil(n / P), each summed in index
  // order and added to out[p]; parts past the end stay as they were. 30 elements over 4 parts
  // of 8 (the last one 6); over 7 parts of 5 (the last one empty).
  for (int64_t parts : {4, 7}) {
    auto partial = env.input({parts}, DType::f64, std::vector<double>(parts, 0.5));
    ops::sum_squares_cpu(xt, partial, env.stream());
    const std::vector<double> got = env.read(partial);
    const int64_t c = (30 + parts - 1) / parts;
    for (int64_t p = 0; p < parts; ++p) {
      double want = 0;
      for (int64_t i = p * c; i < std::min<int64_t>(30, (p + 1) * c); ++i)
        want += scaled[i] * scaled[i];
      EXPECT_EQ(got[p], 0.5 + want) << "part " << p << " of " << parts;
    }
  }

  auto dst = env.output({5, 6}, DType::f64);
  ops::copy_cpu(xt, dst, env.stream());
  EXPECT_EQ(env.read(dst), scaled);
  auto ids = env.indices({3}, DType::i64, {4, -1, 1LL << 40});
  auto ids_copy = env.output({3}, DType::i64);
  ops::copy_cpu(ids, ids_copy, env.stream());
  EXPECT_EQ(env.read(ids_copy), env.read(ids));
}

TEST(Elementwise, ScaleRowsAndRowDotMatchDoubleReferences) {
  // x (M, C) rows scaled by w (M); out (M) (+)= per-row dot of a and b, accumulated in double.
  OpEnv env;
  constexpr int64_t kRows = 6, kCols = 37;
  auto a = random_vector(kRows * kCols, 70), b = random_vector(kRows * kCols, 71);
  auto w = random_vector(kRows, 72), seed = random_vector(kRows, 73);
  std::vector<double> scaled(a), dots(kRows, 0.0);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t c = 0; c < kCols; ++c) {
      scaled[i * kCols + c] *= w[i];
      dots[i] += a[i * kCols + c] * b[i * kCols + c];
    }
  }
  for (DType dtype : {DType::f64, DType::f32}) {
    const double tol = dtype == DType::f64 ? kForwardTol : kFloatVsDoubleTol;
    auto xt = env.input({kRows, kCols}, dtype, a), wt = env.input({kRows}, dtype, w);
    ops::scale_rows_cpu(xt, wt, env.stream());
    EXPECT_LT(max_scaled_err(env.read(xt), scaled), tol);
    auto at = env.input({kRows, kCols}, dtype, a), bt = env.input({kRows, kCols}, dtype, b);
    auto out = env.output({kRows}, dtype);  // poisoned: written
    ops::row_dot_cpu(at, bt, out, false, env.stream());
    EXPECT_LT(max_scaled_err(env.read(out), dots), tol);
    auto acc = env.input({kRows}, dtype, seed);
    ops::row_dot_cpu(at, bt, acc, true, env.stream());
    std::vector<double> ref(seed);
    for (int64_t i = 0; i < kRows; ++i) ref[i] += dots[i];
    EXPECT_LT(max_scaled_err(env.read(acc), ref), tol);
  }
  // No rows is fine; shapes and dtypes that do not match are rejected.
  auto empty = env.output({0, kCols}, DType::f64), no_rows = env.output({0}, DType::f64);
  ops::scale_rows_cpu(empty, no_rows, env.stream());
  ops::row_dot_cpu(empty, empty, no_rows, false, env.stream());
  auto x = env.input({kRows, kCols}, DType::f64, a);
  auto long_w = env.output({kRows + 1}, DType::f64), w32 = env.output({kRows}, DType::f32);
  auto narrow = env.output({kRows, kCols - 1}, DType::f64), out = env.output({kRows}, DType::f64);
  auto out_cols = env.output({kCols}, DType::f64);
  EXPECT_THROW(ops::scale_rows_cpu(x, long_w, env.stream()), Error);
  EXPECT_THROW(ops::scale_rows_cpu(x, w32, env.stream()), Error);
  EXPECT_THROW(ops::row_dot_cpu(x, narrow, out, false, env.stream()), Error);
  EXPECT_THROW(ops::row_dot_cpu(x, x, out_cols, false, env.stream()), Error);
  env.stream().synchronize();
}

TEST(Elementwise, RejectsBadArgumentsAtTheCall) {
  OpEnv env;
  auto a = env.input({4, 6}, DType::f64, random_vector(24, 53));
  auto a_t = env.input({6, 4}, DType::f64, random_vector(24, 54));
  auto a32 = env.input({4, 6}, DType::f32, random_vector(24, 55));
  auto ids = env.indices({4}, DType::i32, {1, 2, 3, 4});
  auto out32 = env.output({1}, DType::f32);
  auto out2 = env.output({2, 1}, DType::f64);
  auto out0 = env.output({0}, DType::f64);
  EXPECT_THROW(ops::add_cpu(a, a_t, a, env.stream()), Error);
  EXPECT_THROW(ops::add_cpu(a, a32, a, env.stream()), Error);
  EXPECT_THROW(ops::scale_cpu(ids, 2.0, env.stream()), Error);
  EXPECT_THROW(ops::sum_squares_cpu(a, out32, env.stream()), Error);
  EXPECT_THROW(ops::sum_squares_cpu(a, out2, env.stream()), Error);  // partials are (P)
  EXPECT_THROW(ops::sum_squares_cpu(a, out0, env.stream()), Error);  // P >= 1
  EXPECT_THROW(ops::copy_cpu(a, a_t, env.stream()), Error);
  EXPECT_THROW(ops::copy_cpu(a, a32, env.stream()), Error);
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// copy_2d: blocks outside either tensor, pitches below the width and mixed dtypes are errors at
// the call that name the side and the numbers (the values are in test_backend_ops_cpu).

TEST(Copy2d, RejectsBlocksOutsideTheTensorsAtTheCall) {
  OpEnv env;
  auto src = env.input({40}, DType::f64, random_vector(40, 21));
  auto dst = env.output({30}, DType::f64);
  auto dst_f32 = env.output({30}, DType::f32);
  EXPECT_THROW(ops::copy_2d_cpu(src, {0, 10}, dst_f32, {0, 10}, 3, 10, env.stream()), Error);
  EXPECT_THROW(ops::copy_2d_cpu(src, {0, 4}, dst, {0, 10}, 3, 5, env.stream()), Error);
  EXPECT_THROW(ops::copy_2d_cpu(src, {-1, 10}, dst, {0, 10}, 3, 5, env.stream()), Error);
  try {
    ops::copy_2d_cpu(src, {5, 10}, dst, {1, 10}, 3, 10, env.stream());
    ADD_FAILURE() << "no error for a dst block past the end";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("copy_2d_cpu: dst block of 3 x 10 elements at offset 1, pitch 10 ends at "
                     "element 31 but dst holds 30"),
              std::string::npos)
        << m;
  }
  ops::copy_2d_cpu(src, {0, 10}, dst, {0, 10}, 0, 10, env.stream());  // empty: allowed
  ops::copy_2d_cpu(src, {5, 10}, dst, {0, 10}, 3, 10, env.stream());  // exactly fits
  env.stream().synchronize();
}

// ---------------------------------------------------------------------------------------------
// bf16 storage (ops/cpu/cpu_storage.h): fp32 arithmetic and one rounding to bf16 per output, so
// a bf16 run is the f32 run on the same (bf16) values with every output rounded once to bf16.
// Each test below makes its float tensors in f32 and in bf16 from bf16-rounded values and
// expects that, bit for bit (the helpers: dense_ops_testing.h).

TEST(Bf16Storage, ElementwiseIsTheF32ResultRoundedOnce) {
  OpEnv env;
  constexpr int64_t kM = 7, kC = 45;
  const auto a = rounded_to_bf16(random_vector(kM * kC, 130));
  const auto b = rounded_to_bf16(random_vector(kM * kC, 131));
  const auto w = rounded_to_bf16(random_vector(kM, 132));
  const auto seed = rounded_to_bf16(random_vector(kM, 133));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto at = make_input(env, {kM, kC}, dt, a), bt = make_input(env, {kM, kC}, dt, b);
    r.push_back(env.output({kM, kC}, dt));
    ops::add_cpu(at, bt, r.back(), env.stream());
    r.push_back(make_input(env, {kM, kC}, dt, a));
    ops::add_cpu(r.back(), bt, r.back(), env.stream());  // out = a
    r.push_back(make_input(env, {kM, kC}, dt, a));
    ops::scale_cpu(r.back(), 0.1, env.stream());  // alpha rounded to fp32 for both
    auto wt = make_input(env, {kM}, dt, w);       // inputs live until the stream has run
    r.push_back(make_input(env, {kM, kC}, dt, a));
    ops::scale_rows_cpu(r.back(), wt, env.stream());
    r.push_back(env.output({kM}, dt));
    ops::row_dot_cpu(at, bt, r.back(), false, env.stream());
    r.push_back(make_input(env, {kM}, dt, seed));
    ops::row_dot_cpu(at, bt, r.back(), true, env.stream());
    r.push_back(env.output({kM, kC}, dt));
    ops::copy_cpu(at, r.back(), env.stream());
    env.stream().synchronize();  // the inputs above are freed on return
    return r;
  });
  // sum_squares writes f64 and squares in double: bf16 x gives exactly the f32 x sums.
  std::vector<std::vector<double>> sums;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto x = make_input(env, {kM * kC}, dt, a);
    auto out = env.input({3}, DType::f64, {0.5, -1.0, 2.0});
    ops::sum_squares_cpu(x, out, env.stream());
    sums.push_back(env.read(out));
  }
  EXPECT_EQ(sums[1], sums[0]);
}

TEST(Bf16Storage, RmsnormIsTheF32ResultRoundedOnceAndTakesAnF32Dw) {
  OpEnv env;
  constexpr int64_t kN = 9, kH = 70;
  const auto x = rounded_to_bf16(random_vector(kN * kH, 140));
  const auto w = rounded_to_bf16(random_vector(kH, 141, 0.3));
  const auto rstd = rounded_to_bf16(random_vector(kN, 142, 0.2));  // any values: an input
  const auto dy = rounded_to_bf16(random_vector(kN * kH, 143));
  const auto dw0 = rounded_to_bf16(random_vector(kH, 144));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto xt = make_input(env, {kN, kH}, dt, x), wt = make_input(env, {kH}, dt, w);
    r.push_back(env.output({kN, kH}, dt));  // y: from the fp32 rstd, rounded once
    r.push_back(env.output({kN}, dt));      // rstd
    ops::rmsnorm_forward_cpu(xt, wt, kEps, r[0], r[1], env.stream());
    auto rt = make_input(env, {kN}, dt, rstd), dyt = make_input(env, {kN, kH}, dt, dy);
    r.push_back(env.output({kN, kH}, dt));  // dx
    r.push_back(make_input(env, {kH}, dt, dw0));
    ops::rmsnorm_backward_cpu(xt, wt, rt, dyt, r[2], r[3], env.stream());
    env.stream().synchronize();
    return r;
  });
  // An f32 dw (the fp32 main gradient) with bf16 storage accumulates exactly as the f32 path.
  std::vector<std::vector<double>> dws;
  for (DType dt : {DType::f32, DType::bf16}) {
    auto xt = make_input(env, {kN, kH}, dt, x), wt = make_input(env, {kH}, dt, w);
    auto rt = make_input(env, {kN}, dt, rstd), dyt = make_input(env, {kN, kH}, dt, dy);
    auto dx = env.output({kN, kH}, dt);
    auto dw = env.input({kH}, DType::f32, dw0);
    ops::rmsnorm_backward_cpu(xt, wt, rt, dyt, dx, dw, env.stream());
    ops::rmsnorm_backward_cpu(xt, wt, rt, dyt, dx, dw, env.stream());  // twice: +=
    dws.push_back(env.read(dw));
  }
  EXPECT_EQ(dws[1], dws[0]);
  // f32 dw only for bf16 x; bf16 dw for f32 x is rejected.
  auto x32 = env.input({kN, kH}, DType::f32, x), w32 = env.input({kH}, DType::f32, w);
  auto r32 = env.input({kN}, DType::f32, rstd), dx32 = env.output({kN, kH}, DType::f32);
  auto dw64 = env.output({kH}, DType::f64), dwb = make_input(env, {kH}, DType::bf16, dw0);
  EXPECT_THROW(ops::rmsnorm_backward_cpu(x32, w32, r32, x32, dx32, dwb, env.stream()), Error);
  auto xb = make_input(env, {kN, kH}, DType::bf16, x), wb = make_input(env, {kH}, DType::bf16, w);
  auto rb = make_input(env, {kN}, DType::bf16, rstd), dxb = env.output({kN, kH}, DType::bf16);
  EXPECT_THROW(ops::rmsnorm_backward_cpu(xb, wb, rb, xb, dxb, dw64, env.stream()), Error);
  env.stream().synchronize();
}

TEST(Bf16Storage, RopeIsTheF32ResultRoundedOnce) {
  OpEnv env;
  const auto x = rounded_to_bf16(random_vector(kTokens * kHeads * kHeadDim, 150));
  expect_bf16_is_f32_rounded_once(env, [&](DType dt) {
    std::vector<OwnedTensor> r;
    auto pos = env.indices({kTokens}, DType::i64, kPositions);
    for (bool backward : {false, true}) {
      r.push_back(make_input(env, {kTokens, kHeads, kHeadDim}, dt, x));
      if (backward) {
        ops::rope_backward_cpu(r.back(), pos, kRope, env.stream());
      } else {
        ops::rope_forward_cpu(r.back(), pos, kRope, env.stream());
      }
    }
    env.stream().synchronize();
    return r;
  });
}

}  // namespace
}  // namespace moepeak
