// bf16 storage with fp32 arithmetic in the CPU GEMMs (ops/cpu/gemm_tiles.h, and through it
// ops/linear.h, ops/matmul.h): random bf16 inputs, float64 references computed from those exact
// inputs (cblas_dgemm), outputs poisoned with NaN before the call.
//
// Tolerances, per element, with K the inner size, S = sum_k |a_ik b_kj| + |c_old| and
// e = (K + 4) 2^-24 S: an fp32 sum of K products in any order (plus the fp32 partial sums of the
// inner panels and the old value) is within about K 2^-24 S of the exact sum (u = 2^-24 per
// addition, first order; +4 covers the panel sums, the old value and the second-order term).
//   bf16 C: the output must be the round-to-nearest-even bf16 of some fp32 value within e of the
//           exact result, i.e. between bf16(exact - e) and bf16(exact + e): one rounding (2^-8
//           relative at most: bf16 keeps 8 significant bits) after the fp32 sum, never two.
//   f32 C:  |got - exact| <= e (accumulated in fp32, no bf16 rounding anywhere).
// Also checked bitwise: the AVX2 rounding against bf16(float) (core/runtime/dtype.h) on ties,
// overflow, NaN and subnormals; one rounding with accumulate (old bf16 read, added in fp32,
// rounded once); empty shapes; run-to-run and thread-to-thread reproducibility; the _cols
// variants against the plain op on the same block; padding beyond the leading dimension untouched.
// Run: ctest --test-dir build -R test_gemm_bf16 (or build/tests/ops/test_gemm_bf16)
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "ops/cpu/gemm_tiles.h"
#include "ops/linear.h"
#include "ops/matmul.h"
#include "tests/ops/dense_ops_testing.h"

namespace moepeak {
namespace {

using ops::GemmTilePlan;
using testing::OpEnv;
using Order = GemmTilePlan::Order;

constexpr uint16_t kNanBits = 0x7fc0;  // a quiet bf16 NaN: the poison of bf16 outputs

// n normal values times `scale`, rounded to bf16 (so bf16, f32 and f64 hold them exactly).
std::vector<float> bf16_values(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(bf16(static_cast<float>(d(rng))));
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16(v[i]);
  return out;
}

bool same_bits(bf16 a, bf16 b) { return a.bits == b.bits; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// One GEMM problem in the layout gemm_bf16 takes, with its float64 reference.
struct Problem {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;  // C (m, n) = op(A) (m, k) op(B) (k, n)
  int64_t lda = 0, ldb = 0, ldc = 0;
  std::vector<float> a, b, c0;  // bf16 values; c0 is C before an accumulating call

  std::string name() const {
    return std::string(ta ? "T" : "N") + (tb ? "T" : "N") + " m=" + std::to_string(m) +
           " n=" + std::to_string(n) + " k=" + std::to_string(k);
  }
};

Problem make_problem(bool ta, bool tb, int64_t m, int64_t n, int64_t k, uint64_t seed,
                     int64_t pad = 0) {
  Problem p{ta, tb, m, n, k, 0, 0, 0, {}, {}, {}};
  p.lda = (ta ? m : k) + pad;
  p.ldb = (tb ? k : n) + pad;
  p.ldc = n + pad;
  p.a = bf16_values(static_cast<size_t>((ta ? k : m) * p.lda), seed);
  p.b = bf16_values(static_cast<size_t>((tb ? n : k) * p.ldb), seed + 1);
  p.c0 = bf16_values(static_cast<size_t>(m * p.ldc), seed + 2, 4.0);
  return p;
}

// exact (m, n) = op(A) op(B) (+ c0) and bound (m, n) = e of the file's comment, in float64.
struct Reference {
  std::vector<double> exact, bound;
};

Reference reference(const Problem& p, bool accumulate) {
  const int64_t m = p.m, n = p.n, k = p.k;
  std::vector<double> a(p.a.begin(), p.a.end()), b(p.b.begin(), p.b.end());
  std::vector<double> abs_a(a.size()), abs_b(b.size());
  for (size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(a[i]);
  for (size_t i = 0; i < b.size(); ++i) abs_b[i] = std::abs(b[i]);
  Reference r;
  r.exact.assign(static_cast<size_t>(m * n), 0.0);
  r.bound.assign(static_cast<size_t>(m * n), 0.0);
  if (m > 0 && n > 0 && k > 0) {
    const auto ta = p.ta ? CblasTrans : CblasNoTrans, tb = p.tb ? CblasTrans : CblasNoTrans;
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), 1.0, a.data(), static_cast<blasint>(p.lda), b.data(),
                static_cast<blasint>(p.ldb), 0.0, r.exact.data(), static_cast<blasint>(n));
    cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), 1.0, abs_a.data(), static_cast<blasint>(p.lda),
                abs_b.data(), static_cast<blasint>(p.ldb), 0.0, r.bound.data(),
                static_cast<blasint>(n));
  }
  const double u = std::ldexp(1.0, -24) * static_cast<double>(k + 4);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t o = static_cast<size_t>(i * n + j);
      const double old = accumulate ? p.c0[static_cast<size_t>(i * p.ldc + j)] : 0.0;
      r.exact[o] += old;
      r.bound[o] = u * (r.bound[o] + std::abs(old));
    }
  }
  return r;
}

// Runs gemm_bf16 on a C of storage TC (bf16 or f32) poisoned with NaN (or holding c0 with
// accumulate) and returns C with its padding.
template <typename TC>
std::vector<TC> run(const Problem& p, bool accumulate, const GemmTilePlan* plan = nullptr) {
  const std::vector<bf16> a = to_bf16(p.a), b = to_bf16(p.b);
  std::vector<TC> c(static_cast<size_t>(p.m * p.ldc));
  for (size_t i = 0; i < c.size(); ++i) {
    if constexpr (std::is_same_v<TC, bf16>) {
      c[i] = accumulate ? bf16(p.c0[i]) : bf16();
      if (!accumulate) c[i].bits = kNanBits;
    } else {
      c[i] = accumulate ? p.c0[i] : std::numeric_limits<float>::quiet_NaN();
    }
  }
  ops::gemm_bf16(p.ta, p.tb, p.m, p.n, p.k, a.data(), p.lda, b.data(), p.ldb, accumulate, c.data(),
                 p.ldc, plan);
  return c;
}

double value(bf16 v) { return static_cast<float>(v); }
double value(float v) { return v; }

// The file's tolerance for each element; the padding columns keep their starting values.
template <typename TC>
void expect_matches(const Problem& p, bool accumulate, const std::vector<TC>& c,
                    const std::string& what) {
  const Reference r = reference(p, accumulate);
  int failures = 0;
  for (int64_t i = 0; i < p.m && failures < 5; ++i) {
    for (int64_t j = 0; j < p.ldc && failures < 5; ++j) {
      const TC got = c[static_cast<size_t>(i * p.ldc + j)];
      if (j >= p.n) {  // padding beyond the row's n columns
        const float start = accumulate ? p.c0[static_cast<size_t>(i * p.ldc + j)] : NAN;
        if (accumulate ? value(got) != start : !std::isnan(value(got))) {
          ADD_FAILURE() << what << ": padding (" << i << ", " << j << ") was written";
          ++failures;
        }
        continue;
      }
      const size_t o = static_cast<size_t>(i * p.n + j);
      const double exact = r.exact[o], e = r.bound[o];
      bool ok;
      if constexpr (std::is_same_v<TC, bf16>) {
        const double lo = static_cast<float>(bf16(static_cast<float>(exact - e)));
        const double hi = static_cast<float>(bf16(static_cast<float>(exact + e)));
        ok = value(got) >= lo && value(got) <= hi;
      } else {
        ok = std::abs(value(got) - exact) <= e;
      }
      if (!ok) {
        ADD_FAILURE() << what << ": C(" << i << ", " << j << ") = " << value(got) << ", exact "
                      << exact << ", fp32 bound " << e;
        ++failures;
      }
    }
  }
}

// ---- gemm_bf16 itself ---------------------------------------------------------------------------

// C (1, n) = [1 1] . [hi; lo] = fl32(hi + lo), so every fp32 value of interest reaches the final
// rounding exactly: bitwise bf16(float) of core/runtime/dtype.h, with and without an old value.
TEST(GemmBf16, RoundsLikeBf16OfFloatBitwise) {
  std::vector<float> hi, lo;
  auto add = [&](float h, float l) {
    hi.push_back(h);
    lo.push_back(l);
  };
  const float e8 = std::ldexp(1.0f, -8), e16 = std::ldexp(1.0f, -16);
  add(1.0f, e8);                                            // a tie, to even (down)
  add(1.0f + 2 * e8, e8);                                   // a tie, to even (up)
  add(1.0f, e8 + 64 * e16);                                 // just above a tie
  add(-1.0f, -e8 - 64 * e16);                               // negative
  add(std::ldexp(1.9921875f, 127), std::ldexp(1.0f, 119));  // the largest bf16 + a tie: inf
  add(std::ldexp(1.9921875f, 127), std::ldexp(1.0f, 118));  // below the tie: stays finite
  add(INFINITY, -INFINITY);                                 // NaN
  add(-INFINITY, 1.0f);
  add(std::ldexp(1.0f, -130), std::ldexp(1.0f, -133));   // subnormal, exact
  add(std::ldexp(1.0f, -126), -std::ldexp(1.0f, -133));  // just below the smallest normal
  add(0.0f, -0.0f);
  add(-0.0f, -0.0f);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> d;
  while (hi.size() < 45)
    add(static_cast<float>(bf16(d(rng))), static_cast<float>(bf16(d(rng) * e8)));
  const int64_t n = static_cast<int64_t>(hi.size());
  std::vector<bf16> a{bf16(1.0f), bf16(1.0f)}, b(2 * static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    b[static_cast<size_t>(j)] = bf16(hi[static_cast<size_t>(j)]);
    b[static_cast<size_t>(n + j)] = bf16(lo[static_cast<size_t>(j)]);
    ASSERT_EQ(static_cast<float>(b[static_cast<size_t>(j)]), hi[static_cast<size_t>(j)]) << j;
    ASSERT_EQ(static_cast<float>(b[static_cast<size_t>(n + j)]), lo[static_cast<size_t>(j)]) << j;
  }
  const std::vector<bf16> old = to_bf16(bf16_values(static_cast<size_t>(n), 9));
  for (bool accumulate : {false, true}) {
    std::vector<bf16> c = accumulate ? old : std::vector<bf16>(static_cast<size_t>(n));
    ops::gemm_bf16(false, false, 1, n, 2, a.data(), 2, b.data(), n, accumulate, c.data(), n);
    for (int64_t j = 0; j < n; ++j) {
      const size_t s = static_cast<size_t>(j);
      float sum = (0.0f + hi[s]) + lo[s];  // sgemm sums from +0 (so -0 + -0 is +0)
      if (accumulate) sum += static_cast<float>(old[s]);
      EXPECT_TRUE(same_bits(c[s], bf16(sum)))
          << "column " << j << (accumulate ? " accumulate" : "") << ": got bits " << c[s].bits
          << ", bf16(" << sum << ") bits " << bf16(sum).bits;
    }
  }
  // Products that land among fp32's subnormals (exact there: 14 significant bits) and round to
  // bf16 subnormals: C (1, n) = [a] . [b_j], a = 1.0078125 2^-70, b_j about 2^-60 .. 2^-66.
  const float a1 = std::ldexp(1.0078125f, -70);
  std::vector<bf16> b1(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const float mant = 1.0f + static_cast<float>(j % 128) / 128.0f;
    b1[static_cast<size_t>(j)] = bf16(std::ldexp(mant, -60 - static_cast<int>(j % 7)));
  }
  const bf16 a1b = bf16(a1);
  ASSERT_EQ(static_cast<float>(a1b), a1);
  std::vector<bf16> c1(static_cast<size_t>(n));
  ops::gemm_bf16(false, false, 1, n, 1, &a1b, 1, b1.data(), n, false, c1.data(), n);
  for (int64_t j = 0; j < n; ++j) {
    const size_t s = static_cast<size_t>(j);
    const float product = a1 * static_cast<float>(b1[s]);
    ASSERT_LT(std::abs(product), std::numeric_limits<float>::min()) << j;
    EXPECT_TRUE(same_bits(c1[s], bf16(product))) << "subnormal column " << j;
  }
}

// An accumulated bf16 C is read, added in fp32 and rounded once: 1 + (2^-8 + 2^-16) rounds up to
// 1 + 2^-7, where rounding the product first (2^-8, a tie to even) and then the sum (1 + 2^-8, a
// tie to even) would give 1. An f32 C keeps every bit: 1 + 2^-8 + 2^-16.
TEST(GemmBf16, AccumulateRoundsOnceAndF32CKeepsEveryBit) {
  const float e8 = std::ldexp(1.0f, -8), e16 = std::ldexp(1.0f, -16);
  std::vector<bf16> a{bf16(1.0f), bf16(1.0f)}, b{bf16(e8), bf16(e16)};
  std::vector<bf16> c{bf16(1.0f)};
  ops::gemm_bf16(false, false, 1, 1, 2, a.data(), 2, b.data(), 1, true, c.data(), 1);
  EXPECT_EQ(static_cast<float>(c[0]), 1.0f + 2 * e8);
  std::vector<float> cf{1.0f};
  ops::gemm_bf16(false, false, 1, 1, 2, a.data(), 2, b.data(), 1, true, cf.data(), 1);
  EXPECT_EQ(cf[0], 1.0f + e8 + e16);
}

TEST(GemmBf16, MatchesFloat64WithinOneRoundingEveryTransposeAndPadding) {
  uint64_t seed = 100;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int64_t pad : {0, 3}) {
        const Problem p = make_problem(ta, tb, 37, 50, 96, seed += 10, pad);
        for (bool acc : {false, true}) {
          const std::string what = p.name() + " pad=" + std::to_string(pad) + (acc ? " acc" : "");
          expect_matches(p, acc, run<bf16>(p, acc), what + " bf16 C");
          expect_matches(p, acc, run<float>(p, acc), what + " f32 C");
        }
      }
    }
  }
}

// Small tiles forced through every loop order, none dividing its extent, so every tile edge and
// the accumulation over inner panels (c_tile for a bf16 C, every order for an f32 C) run.
TEST(GemmBf16, EveryLoopOrderWithRaggedTiles) {
  const Problem p = make_problem(true, false, 45, 38, 71, 7, 2);
  for (Order order : {Order::b_panel, Order::a_panel, Order::c_tile}) {
    for (bool acc : {false, true}) {
      const std::string what =
          "order " + std::to_string(static_cast<int>(order)) + (acc ? " acc" : "");
      const GemmTilePlan f32_plan{order, 16, 9, 20};  // 3 x 5 x 4 tiles, every edge ragged
      expect_matches(p, acc, run<float>(p, acc, &f32_plan), what + " f32 C");
      const GemmTilePlan bf16_plan{order, 16, 9, order == Order::c_tile ? 20 : p.k};
      expect_matches(p, acc, run<bf16>(p, acc, &bf16_plan), what + " bf16 C");
    }
  }
  // A bf16 C is rounded once per call, so only c_tile may cut `inner` into panels.
  const GemmTilePlan bad{Order::b_panel, 16, 9, 20};
  EXPECT_THROW(run<bf16>(p, false, &bad), Error);
}

// Shapes the default planner cuts into several tiles with ragged last tiles (the forced plans
// above cover every dimension at once on small shapes; the default plan's tiles are large, so a
// shape split in all three is too big for a test): each loop order once, with the splits named.
TEST(GemmBf16, DefaultPlanAcrossSeveralRaggedTiles) {
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
    bool bf16_c;
    Order order;
    bool split_m, split_n, split_k;
  };
  const std::vector<Case> cases{
      // bf16 C, inner in panels: the fp32 C tile accumulates over them, then one rounding.
      {false, false, 1251, 520, 2151, true, Order::c_tile, true, false, true},
      // f32 C (a dw, dy^T x): an A tile widened once and reused over the column tiles.
      {true, false, 1631, 1511, 1000, false, Order::a_panel, true, true, false},
      // forward's x w^T: a B panel widened once and reused over the row tiles.
      {false, true, 1501, 1101, 900, true, Order::b_panel, true, true, false},
      // f32 C accumulated in place over inner panels.
      {true, false, 1631, 700, 2302, false, Order::b_panel, true, false, true},
  };
  uint64_t seed = 500;
  for (const Case& c : cases) {
    const GemmTilePlan plan = ops::gemm_tile_plan(c.m, c.n, c.k, c.bf16_c);
    const Problem p = make_problem(c.ta, c.tb, c.m, c.n, c.k, seed += 10);
    const std::string what = p.name() + " plan " + std::to_string(static_cast<int>(plan.order)) +
                             ": " + std::to_string(plan.mc) + " x " + std::to_string(plan.nc) +
                             " x " + std::to_string(plan.kc);
    EXPECT_EQ(plan.order, c.order) << what;
    EXPECT_LE(plan.scratch_floats(c.bf16_c), ops::kGemmTileScratchFloats) << what;
    EXPECT_EQ(plan.mc < c.m, c.split_m) << what;
    EXPECT_EQ(plan.nc < c.n, c.split_n) << what;
    EXPECT_EQ(plan.kc < c.k, c.split_k) << what;
    if (c.split_m) {
      EXPECT_NE(c.m % plan.mc, 0) << what;
    }
    if (c.split_n) {
      EXPECT_NE(c.n % plan.nc, 0) << what;
    }
    if (c.split_k) {
      EXPECT_NE(c.k % plan.kc, 0) << what;
    }
    for (bool acc : {false, true}) {
      if (c.bf16_c) {
        expect_matches(p, acc, run<bf16>(p, acc), what);
      } else {
        expect_matches(p, acc, run<float>(p, acc), what);
      }
    }
  }
}

TEST(GemmBf16, EmptyShapes) {
  std::vector<bf16> a(64, bf16(1.0f)), b(64, bf16(1.0f));
  for (bool acc : {false, true}) {
    // rows == 0 or cols == 0: C untouched (a NaN stays).
    for (auto [m, n] : {std::pair<int64_t, int64_t>{0, 4}, {4, 0}}) {
      std::vector<bf16> c(16);
      for (auto& v : c) v.bits = kNanBits;
      std::vector<float> cf(16, NAN);
      ops::gemm_bf16(false, false, m, n, 4, a.data(), 4, b.data(), 4, acc, c.data(), 4);
      ops::gemm_bf16(false, false, m, n, 4, a.data(), 4, b.data(), 4, acc, cf.data(), 4);
      for (size_t i = 0; i < 16; ++i) {
        EXPECT_EQ(c[i].bits, kNanBits);
        EXPECT_TRUE(std::isnan(cf[i]));
      }
    }
    // inner == 0: zeros over the NaN, or C unchanged with accumulate; padding untouched.
    std::vector<bf16> c(3 * 5);
    std::vector<float> cf(3 * 5);
    for (size_t i = 0; i < c.size(); ++i) {
      c[i] = acc ? bf16(static_cast<float>(i)) : bf16();
      if (!acc) c[i].bits = kNanBits;
      cf[i] = acc ? static_cast<float>(i) : NAN;
    }
    ops::gemm_bf16(false, true, 3, 4, 0, a.data(), 1, b.data(), 1, acc, c.data(), 5);
    ops::gemm_bf16(false, true, 3, 4, 0, a.data(), 1, b.data(), 1, acc, cf.data(), 5);
    for (size_t i = 0; i < c.size(); ++i) {
      const bool pad = i % 5 == 4;
      if (acc) {
        EXPECT_EQ(static_cast<float>(c[i]), static_cast<float>(i)) << i;
        EXPECT_EQ(cf[i], static_cast<float>(i)) << i;
      } else if (pad) {
        EXPECT_EQ(c[i].bits, kNanBits) << i;
        EXPECT_TRUE(std::isnan(cf[i])) << i;
      } else {
        EXPECT_TRUE(same_bits(c[i], bf16(0.0f))) << i;
        EXPECT_TRUE(same_bits(cf[i], 0.0f)) << i;
      }
    }
  }
}

// Two runs, and a run on another thread (its own scratch), give the same bits.
TEST(GemmBf16, ReproducibleRunToRunAndAcrossThreads) {
  const Problem p = make_problem(false, true, 700, 600, 1300, 42);
  const auto first = run<bf16>(p, true), second = run<bf16>(p, true);
  const auto first_f = run<float>(p, true), second_f = run<float>(p, true);
  std::vector<bf16> other;
  std::vector<float> other_f;
  std::thread t([&] {
    other = run<bf16>(p, true);
    other_f = run<float>(p, true);
  });
  t.join();
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_TRUE(same_bits(first[i], second[i]) && same_bits(first[i], other[i])) << i;
    ASSERT_TRUE(same_bits(first_f[i], second_f[i]) && same_bits(first_f[i], other_f[i])) << i;
  }
}

// ---- the ops on bf16 tensors
// ----------------------------------------------------------------------

// A CPU tensor holding `values` (bf16 values) in bf16 or f32, or poisoned with NaN when empty.
OwnedTensor tensor(OpEnv& env, Shape shape, DType dtype, const std::vector<float>& values = {}) {
  auto t = OwnedTensor::device(env.backend(), shape, dtype, LiveSet::workspace, "test tensor");
  for (int64_t i = 0; i < t.numel(); ++i) {
    const size_t s = static_cast<size_t>(i);
    const float v = values.empty() ? NAN : values[s];
    if (dtype == DType::bf16) {
      t.data_as<bf16>()[s] = bf16(v);
    } else {
      t.data_as<float>()[s] = v;
    }
  }
  return t;
}

std::vector<float> read(OpEnv& env, const Tensor& t) {
  env.stream().synchronize();
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] =
        t.dtype() == DType::bf16 ? static_cast<float>(t.data_as<bf16>()[i]) : t.data_as<float>()[i];
  }
  return out;
}

// The values as a C of gemm_bf16 (ldc = n) for expect_matches.
template <typename TC>
std::vector<TC> as(const std::vector<float>& v) {
  std::vector<TC> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = TC(v[i]);
  return out;
}

// linear forward and backward on bf16 x, w, dy: y and dx in bf16, dw in bf16 or f32, each
// against its GEMM's float64 reference (the three GEMMs of ops/cpu/linear.cpp).
TEST(GemmBf16, LinearForwardAndBackward) {
  OpEnv env;
  const int64_t M = 70, K = 130, N = 90;
  const std::vector<float> x = bf16_values(M * K, 1), w = bf16_values(N * K, 2),
                           dy = bf16_values(M * N, 3), y0 = bf16_values(M * N, 4),
                           dx0 = bf16_values(M * K, 5), dw0 = bf16_values(N * K, 6);
  auto xt = tensor(env, {M, K}, DType::bf16, x), wt = tensor(env, {N, K}, DType::bf16, w),
       dyt = tensor(env, {M, N}, DType::bf16, dy);
  for (bool acc : {false, true}) {
    const std::string what = acc ? " accumulate" : "";
    auto y = acc ? tensor(env, {M, N}, DType::bf16, y0) : tensor(env, {M, N}, DType::bf16);
    ops::linear_forward(xt, wt, y, acc, env.stream());
    Problem fp{false, true, M, N, K, K, K, N, x, w, y0};
    expect_matches(fp, acc, as<bf16>(read(env, y)), "y" + what);

    for (DType dw_dtype : {DType::bf16, DType::f32}) {
      const std::string dws = " dw " + std::string(dtype_name(dw_dtype));
      auto dx = acc ? tensor(env, {M, K}, DType::bf16, dx0) : tensor(env, {M, K}, DType::bf16);
      auto dw = tensor(env, {N, K}, dw_dtype, dw0);
      ops::linear_backward(xt, wt, dyt, dx, acc, dw, env.stream());
      Problem dxp{false, false, M, K, N, N, K, K, dy, w, dx0};
      expect_matches(dxp, acc, as<bf16>(read(env, dx)), "dx" + what + dws);
      Problem dwp{true, false, N, K, M, N, K, K, dy, x, dw0};
      if (dw_dtype == DType::f32) {
        expect_matches(dwp, true, as<float>(read(env, dw)), "dw" + what + dws);
      } else {
        expect_matches(dwp, true, as<bf16>(read(env, dw)), "dw" + what + dws);
      }
    }
  }
}

// The _cols variants on w[:, k0 : k0 + K] of an (N, K_w) w: bitwise the plain op on a copy of
// the block (gemm_bf16 widens tiles into dense scratch, so the leading dimension never changes
// a result), and dw's columns outside the block untouched.
TEST(GemmBf16, ColsVariantsAreThePlainOpOnTheBlockBitwise) {
  OpEnv env;
  const int64_t M = 40, K = 75, N = 33, k0 = 7, Kw = 91;
  const std::vector<float> x = bf16_values(M * K, 11), wfull = bf16_values(N * Kw, 12),
                           dy = bf16_values(M * N, 13), dw0 = bf16_values(N * Kw, 14);
  std::vector<float> wblock(static_cast<size_t>(N * K)), dw0block(wblock.size());
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t c = 0; c < K; ++c) {
      wblock[static_cast<size_t>(r * K + c)] = wfull[static_cast<size_t>(r * Kw + k0 + c)];
      dw0block[static_cast<size_t>(r * K + c)] = dw0[static_cast<size_t>(r * Kw + k0 + c)];
    }
  }
  auto xt = tensor(env, {M, K}, DType::bf16, x), dyt = tensor(env, {M, N}, DType::bf16, dy);
  auto wf = tensor(env, {N, Kw}, DType::bf16, wfull), wb = tensor(env, {N, K}, DType::bf16, wblock);
  for (bool acc : {false, true}) {
    const std::vector<float> y0 = bf16_values(M * N, 20), dx0 = bf16_values(M * K, 21);
    auto y_cols = acc ? tensor(env, {M, N}, DType::bf16, y0) : tensor(env, {M, N}, DType::bf16);
    auto y_plain = acc ? tensor(env, {M, N}, DType::bf16, y0) : tensor(env, {M, N}, DType::bf16);
    ops::linear_forward_cols(xt, wf, k0, y_cols, acc, env.stream());
    ops::linear_forward(xt, wb, y_plain, acc, env.stream());
    const auto yc = read(env, y_cols), yp = read(env, y_plain);
    for (size_t i = 0; i < yc.size(); ++i) ASSERT_TRUE(same_bits(yc[i], yp[i])) << "y " << i;

    for (DType dw_dtype : {DType::bf16, DType::f32}) {
      auto dx_cols = acc ? tensor(env, {M, K}, DType::bf16, dx0) : tensor(env, {M, K}, DType::bf16);
      auto dx_plain =
          acc ? tensor(env, {M, K}, DType::bf16, dx0) : tensor(env, {M, K}, DType::bf16);
      auto dw_cols = tensor(env, {N, Kw}, dw_dtype, dw0);
      auto dw_plain = tensor(env, {N, K}, dw_dtype, dw0block);
      ops::linear_backward_cols(xt, wf, k0, dyt, dx_cols, acc, dw_cols, env.stream());
      ops::linear_backward(xt, wb, dyt, dx_plain, acc, dw_plain, env.stream());
      const auto dxc = read(env, dx_cols), dxp = read(env, dx_plain);
      for (size_t i = 0; i < dxc.size(); ++i) ASSERT_TRUE(same_bits(dxc[i], dxp[i])) << "dx " << i;
      const auto dwc = read(env, dw_cols), dwp = read(env, dw_plain);
      for (int64_t r = 0; r < N; ++r) {
        for (int64_t c = 0; c < Kw; ++c) {
          const float got = dwc[static_cast<size_t>(r * Kw + c)];
          const bool inside = c >= k0 && c < k0 + K;
          const float want = inside ? dwp[static_cast<size_t>(r * K + c - k0)]
                                    : dw0[static_cast<size_t>(r * Kw + c)];
          ASSERT_TRUE(same_bits(got, want)) << "dw (" << r << ", " << c << ")";
        }
      }
    }
  }
}

TEST(GemmBf16, Matmul) {
  OpEnv env;
  const int64_t M = 45, K = 140, N = 66;
  const std::vector<float> a = bf16_values(M * K, 31), b = bf16_values(K * N, 32),
                           c0 = bf16_values(M * N, 33);
  auto at = tensor(env, {M, K}, DType::bf16, a), bt = tensor(env, {K, N}, DType::bf16, b);
  for (bool acc : {false, true}) {
    auto c = acc ? tensor(env, {M, N}, DType::bf16, c0) : tensor(env, {M, N}, DType::bf16);
    ops::matmul(at, bt, c, acc, env.stream());
    Problem p{false, false, M, N, K, K, N, N, a, b, c0};
    expect_matches(p, acc, as<bf16>(read(env, c)), acc ? "c accumulate" : "c");
  }
}

// Which dtypes the bf16 entry points take: an f32 y, dx or dw only for a bf16 x (fp32
// accumulators: the main gradient, tile sums); w and dy x's dtype.
TEST(GemmBf16, LinearDtypeChecks) {
  OpEnv env;
  auto x = tensor(env, {4, 3}, DType::bf16, std::vector<float>(12, 1.0f));
  auto w = tensor(env, {5, 3}, DType::bf16, std::vector<float>(15, 1.0f));
  auto dy = tensor(env, {4, 5}, DType::bf16, std::vector<float>(20, 1.0f));
  auto dx = tensor(env, {4, 3}, DType::bf16);
  auto dx_f32 = tensor(env, {4, 3}, DType::f32);
  auto y_f32 = tensor(env, {4, 5}, DType::f32);
  auto dw_f64 = OwnedTensor::device(env.backend(), {5, 3}, DType::f64, LiveSet::workspace, "dw");
  auto xf = tensor(env, {4, 3}, DType::f32, std::vector<float>(12, 1.0f));
  auto wf = tensor(env, {5, 3}, DType::f32, std::vector<float>(15, 1.0f));
  auto dyf = tensor(env, {4, 5}, DType::f32, std::vector<float>(20, 1.0f));
  auto dw_bf16 = tensor(env, {5, 3}, DType::bf16, std::vector<float>(15, 0.0f));
  Stream& s = env.stream();
  EXPECT_THROW(ops::linear_backward(x, w, dy, dx, false, dw_f64, s), Error);
  EXPECT_THROW(ops::linear_forward(xf, wf, tensor(env, {4, 5}, DType::bf16), false, s), Error);
  EXPECT_THROW(ops::linear_backward(xf, wf, dyf, Tensor(), false, dw_bf16, s), Error);
  // Both backends' checks take an f32 dw beside bf16 x (the fp32 main gradient).
  auto dw_f32 = tensor(env, {5, 3}, DType::f32, std::vector<float>(15, 0.0f));
  EXPECT_NO_THROW(ops::check_linear_backward_args("cuda", x, w, 0, false, dy, dx, dw_f32));
  EXPECT_NO_THROW(ops::linear_backward(x, w, dy, dx, false, dw_f32, s));
  const auto got = read(env, dw_f32);
  for (float v : got) EXPECT_EQ(v, 4.0f);  // 4 rows of 1 * 1
  // An f32 y and dx beside bf16 x are fp32 accumulators over calls (PipelinedLLEP's F blocks).
  ops::linear_forward(x, w, y_f32, false, s);
  ops::linear_backward(x, w, dy, dx_f32, false, Tensor(), s);
  for (float v : read(env, y_f32)) EXPECT_EQ(v, 3.0f);   // 3 columns of 1 * 1
  for (float v : read(env, dx_f32)) EXPECT_EQ(v, 5.0f);  // 5 outputs of 1 * 1
  // matmul likewise takes an f32 c beside bf16 a and b (Ring-DTP's fp32 dX accumulator), and
  // accumulates into it in fp32: 3 + 3 * 2^-10 per call stays exact, where a bf16 c would round
  // every add back to 3 (half its ulp there is 2^-7).
  auto c_f32 = tensor(env, {4, 5}, DType::f32, std::vector<float>(20, 0.0f));
  auto b = tensor(env, {3, 5}, DType::bf16, std::vector<float>(15, 1.0f));
  auto c_f64 = OwnedTensor::device(env.backend(), {4, 5}, DType::f64, LiveSet::workspace, "c");
  EXPECT_THROW(ops::matmul(x, b, c_f64, false, s), Error);
  EXPECT_THROW(ops::matmul(xf, wf, c_f32, false, s), Error);
  auto small = tensor(env, {4, 3}, DType::bf16, std::vector<float>(12, 1.0f / 1024));
  ops::matmul(x, b, c_f32, false, s);
  for (int i = 0; i < 4; ++i) ops::matmul(small, b, c_f32, true, s);
  for (float v : read(env, c_f32)) EXPECT_EQ(v, 3.0f + 4.0f * 3.0f / 1024);
}

}  // namespace
}  // namespace moepeak
