// CPU attention with a sliding window and attention sinks (ops/attention.h, AttentionVariant):
// forward (out, lse) and backward (dq, dk, dv, dsinks) against a materialised float64 reference
// (scores with the window's mask and the sink's column, softmax, the sink's column dropped;
// tests/ops/attention_testing.h), the gradients also against central differences, f32 against the
// reference, bf16 storage as the f32 result rounded once (bitwise), a window >= T and negligible
// sinks as plain causal attention (bitwise), dominant sinks, keys outside a window never touching
// a row, the key blocks a windowed call visits (O(T * W)), and the argument checks. Cases with a
// value head dim dv other than the query/key one dqk (smaller and larger) run with windows and
// sinks too.
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv) lse: (B, nh, T)            sinks, dsinks: (nh)
//
// Small blocks (detail::attention_*_cpu_blocked, 8 x 8, 16 x 16, 6 x 5) make short sequences
// cross many query and key blocks, so windows start inside key blocks, end on their edges and
// span several; the default blocks run at T = 300 and 600.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/tensor.h"
#include "ops/attention.h"
#include "ops/fill.h"
#include "tests/ops/attention_testing.h"
#include "tests/ops/gradcheck.h"

namespace moepeak {
namespace {

using testing::AttentionTensors;
using testing::AttentionTest;
using testing::bitwise_equal;
using testing::Dims;
using testing::gradient_err;
using testing::Inputs;
using testing::kOddBlocks;
using testing::kSmallBlocks;
using testing::max_rel_err;
using testing::norm_rel_err;
using testing::random_inputs;
using testing::random_sinks;
using testing::random_vector;
using testing::Reference;  // the float64 reference (tests/ops/attention_testing.h)
using testing::reference;
using testing::rounded_to_bf16;
using testing::scores_computed_by;

struct Case {
  Dims dims;
  ops::AttentionBlocks blocks;
  int64_t window;
  bool sinks;
};

std::string describe(const Case& c) {
  const std::string dims = c.dims.dv() == c.dims.dqk() ? " d=" + std::to_string(c.dims.dqk())
                                                       : " dqk=" + std::to_string(c.dims.dqk()) +
                                                             " dv=" + std::to_string(c.dims.dv());
  return "B=" + std::to_string(c.dims.batch) + " T=" + std::to_string(c.dims.seq) +
         " nh=" + std::to_string(c.dims.heads) + " nkv=" + std::to_string(c.dims.kv_heads) + dims +
         " blocks " + std::to_string(c.blocks.query_rows) + "x" + std::to_string(c.blocks.keys) +
         " W=" + std::to_string(c.window) + (c.sinks ? " sinks" : "");
}

// Windows 1, 2, not a multiple of the blocks, spanning several key blocks, T - 1; sinks alone and
// with windows; GQA groups 1, 2, 4 (and 2 with 3 kv heads); B = 1 and 2; small, odd and default
// blocks; dv < dqk (DeepSeek-V3's MLA is 192 / 128) and dv > dqk, with and without windows and
// sinks.
const Case kCases[] = {
    {{1, 20, 4, 4, 8}, {8, 8}, 1, false},
    {{2, 24, 4, 2, 8}, {8, 8}, 1, true},
    {{2, 33, 4, 2, 8}, {8, 8}, 2, true},
    {{2, 40, 4, 1, 8}, {16, 16}, 5, false},
    {{2, 50, 8, 2, 16}, {16, 16}, 19, true},
    {{1, 37, 4, 4, 24}, kOddBlocks, 7, true},
    {{2, 30, 4, 2, 8}, {8, 8}, 29, true},
    {{2, 45, 4, 2, 8}, kSmallBlocks, 0, true},
    {{1, 70, 6, 3, 16}, kSmallBlocks, 20, true},
    {{1, 300, 4, 1, 16}, ops::kAttentionBlocks, 100, true},
    {{2, 600, 8, 2, 8}, ops::kAttentionBlocks, 300, true},
    {{2, 33, 4, 2, 12, 8}, {8, 8}, 2, true},                     // dv < dqk
    {{1, 37, 4, 4, 24, 16}, kOddBlocks, 7, true},                // dv < dqk, odd blocks
    {{2, 45, 4, 2, 8, 20}, kSmallBlocks, 0, true},               // dv > dqk, sinks alone
    {{1, 70, 6, 3, 16, 24}, kSmallBlocks, 20, false},            // dv > dqk, window alone
    {{1, 300, 4, 1, 24, 16}, ops::kAttentionBlocks, 100, true},  // dv < dqk, default blocks
};

class AttentionVariantTest : public AttentionTest {};

std::vector<double> plus(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// The values as a dsinks of q's dtype holds them: f64, or f32 for f32 and bf16 q.
std::vector<double> rounded_start(std::vector<double> v, DType dtype) {
  if (ops::attention_lse_dtype(dtype) == DType::f32)
    for (double& x : v) x = static_cast<float>(x);
  return v;
}

TEST_F(AttentionVariantTest, DoubleMatchesTheReference) {
  // float64 flash vs the materialised softmax: the same sums in other orders, so they agree to a
  // few ulp times log T: 1e-12 (out and lse relative, values under 1e-3 at 1e-3; gradients
  // relative to each tensor's largest element; dsinks, summed over B * T rows, relative).
  uint64_t seed = 500;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Inputs in = random_inputs(c.dims, seed);
    const std::vector<double> sinks =
        c.sinks ? random_sinks(c.dims.heads, seed + 7) : std::vector<double>();
    const std::vector<double> start = random_vector(static_cast<size_t>(c.dims.heads), seed + 8);
    seed += 10;
    const Reference ref = reference(c.dims, in, c.window, sinks);
    const Run got = run(c.dims, DType::f64, in, c.blocks, c.window, sinks, start);
    EXPECT_LT(max_rel_err(got.out, ref.out, 1e-3), 1e-12) << "out";
    EXPECT_LT(max_rel_err(got.lse, ref.lse, 1e-3), 1e-12) << "lse";
    EXPECT_LT(gradient_err(got.dq, ref.dq), 1e-12) << "dq";
    EXPECT_LT(gradient_err(got.dk, ref.dk), 1e-12) << "dk";
    EXPECT_LT(gradient_err(got.dv, ref.dv), 1e-12) << "dv";
    if (c.sinks) {
      EXPECT_LT(max_rel_err(got.dsinks, plus(start, ref.dsinks), 1e-3), 1e-12) << "dsinks";
    }
  }
}

TEST_F(AttentionVariantTest, FloatMatchesTheReference) {
  // float32 vs the float64 reference, relative to each tensor's largest element: rounding of every
  // product and sum (eps 6e-8) and the ~2 ulp polynomial exp, grown by reductions of up to 300
  // keys, as in test_attention's FloatMatchesDouble: 1e-5. dsinks is summed in double from the
  // f32 out and lse, so it carries their error: 1e-5 relative too.
  uint64_t seed = 600;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Inputs in = random_inputs(c.dims, seed);
    const std::vector<double> sinks =
        c.sinks ? random_sinks(c.dims.heads, seed + 7) : std::vector<double>();
    const std::vector<double> start = random_vector(static_cast<size_t>(c.dims.heads), seed + 8);
    seed += 10;
    const Reference ref = reference(c.dims, in, c.window, sinks);
    const Run got = run(c.dims, DType::f32, in, c.blocks, c.window, sinks, start);
    EXPECT_LT(norm_rel_err(got.out, ref.out), 1e-5) << "out";
    EXPECT_LT(norm_rel_err(got.lse, ref.lse), 1e-5) << "lse";
    EXPECT_LT(gradient_err(got.dq, ref.dq), 1e-5) << "dq";
    EXPECT_LT(gradient_err(got.dk, ref.dk), 1e-5) << "dk";
    EXPECT_LT(gradient_err(got.dv, ref.dv), 1e-5) << "dv";
    // The f32 dsinks stores start + sum rounded once, so compare to that at float's resolution.
    if (c.sinks) {
      EXPECT_LT(max_rel_err(got.dsinks, plus(start, ref.dsinks), 1e-2), 1e-5) << "dsinks";
    }
  }
}

TEST_F(AttentionVariantTest, GradientsMatchCentralDifferences) {
  // The reference's gradient formulas checked independently: dq, dk, dv and dsinks of the f64
  // kernel against central differences of L = sum(out * dout) through the f64 forward, window 3
  // and sinks, small blocks crossing the window's edge, dv = dqk and dv != dqk; bound 1e-6 as in
  // test_attention's AttentionGradTest.
  for (const Dims& dims : {Dims{2, 11, 4, 2, 4}, Dims{2, 11, 4, 2, 6, 3}}) {
    SCOPED_TRACE(::testing::Message() << "dqk=" << dims.dqk() << " dv=" << dims.dv());
    const ops::AttentionBlocks blocks{8, 4};
    const int64_t window = 3;
    // Step 3e-5: at 1e-5 the rounding of L (~1e-16 of it, over 2h) reaches 8e-7 of the smallest
    // dq here; at 3e-5 the worst is 2.7e-7 (dk 4e-8, dsinks 7e-11) and the truncation error,
    // ~h^2 f'''/6, stays below it (1e-4: 1.6e-7, 3e-4: 3.7e-7).
    const auto e = central_difference_errors(
        dims, random_inputs(dims, 700), random_sinks(dims.heads, 707), blocks, window, {}, 3e-5);
    EXPECT_LT(e.dq, 1e-6) << "dq";
    EXPECT_LT(e.dk, 1e-6) << "dk";
    EXPECT_LT(e.dv, 1e-6) << "dv";
    EXPECT_LT(e.dsinks, 1e-6) << "dsinks";
  }
}

TEST_F(AttentionVariantTest, WindowOfAtLeastTIsCausalBitwise) {
  // W >= T hides no key: bitwise the plain causal result (W = 0), in every dtype and block size.
  const Dims dims{2, 70, 8, 2, 16};
  const Inputs in = random_inputs(dims, 800);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks, kOddBlocks}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dtype) << " blocks " << blocks.query_rows << "x" << blocks.keys);
      const Run causal = run(dims, dtype, in, blocks, 0, {}, {});
      for (int64_t window : {dims.seq, dims.seq + 5, std::numeric_limits<int64_t>::max()}) {
        const Run got = run(dims, dtype, in, blocks, window, {}, {});
        EXPECT_TRUE(bitwise_equal(got.out, causal.out)) << "out W=" << window;
        EXPECT_TRUE(bitwise_equal(got.lse, causal.lse)) << "lse W=" << window;
        EXPECT_TRUE(bitwise_equal(got.dq, causal.dq)) << "dq W=" << window;
        EXPECT_TRUE(bitwise_equal(got.dk, causal.dk)) << "dk W=" << window;
        EXPECT_TRUE(bitwise_equal(got.dv, causal.dv)) << "dv W=" << window;
      }
    }
}

TEST_F(AttentionVariantTest, NegligibleSinksChangeNothing) {
  // A sink far below every score: exp(s - m) underflows to 0, so -1e4 gives bitwise the result
  // without sinks and leaves dsinks as it was; -40 weighs at most exp(-40 - lse) (~1e-16 of a row
  // here, lse > -3): within 1e-12 of it. Every dtype, with and without a window.
  const Dims dims{2, 40, 4, 2, 8};
  const Inputs in = random_inputs(dims, 900);
  const std::vector<double> start = random_vector(static_cast<size_t>(dims.heads), 901);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (int64_t window : {0, 6}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " W=" << window);
      const Run plain = run(dims, dtype, in, kSmallBlocks, window, {}, {});
      const Run off =
          run(dims, dtype, in, kSmallBlocks, window, std::vector<double>(dims.heads, -1e4), start);
      EXPECT_TRUE(bitwise_equal(off.out, plain.out)) << "out";
      EXPECT_TRUE(bitwise_equal(off.lse, plain.lse)) << "lse";
      EXPECT_TRUE(bitwise_equal(off.dq, plain.dq)) << "dq";
      EXPECT_TRUE(bitwise_equal(off.dk, plain.dk)) << "dk";
      EXPECT_TRUE(bitwise_equal(off.dv, plain.dv)) << "dv";
      EXPECT_TRUE(bitwise_equal(off.dsinks, rounded_start(start, dtype))) << "dsinks";
      if (dtype != DType::f64) continue;
      const Run faint =
          run(dims, dtype, in, kSmallBlocks, window, std::vector<double>(dims.heads, -40), start);
      EXPECT_LT(max_rel_err(faint.out, plain.out, 1e-3), 1e-12) << "out";
      EXPECT_LT(max_rel_err(faint.lse, plain.lse, 1e-3), 1e-12) << "lse";
      EXPECT_LT(norm_rel_err(faint.dq, plain.dq), 1e-12) << "dq";
      EXPECT_LT(norm_rel_err(faint.dk, plain.dk), 1e-12) << "dk";
      EXPECT_LT(norm_rel_err(faint.dv, plain.dv), 1e-12) << "dv";
      EXPECT_LT(max_rel_err(faint.dsinks, start, 1e-3), 1e-12) << "dsinks";
    }
}

TEST_F(AttentionVariantTest, DominantSinks) {
  // Heads with sinks 1e4 (every score's weight exp(x - 1e4) is 0: out and the gradients exactly 0,
  // lse = 1e4, dsinks unchanged as D = dout . 0), -1e4 (no effect), 12 (most of each row's weight,
  // not all) and a plain one, in one call; against the reference (f64, 1e-12 as above; f32, 1e-5).
  const Dims dims{2, 36, 4, 2, 8};
  const Inputs in = random_inputs(dims, 1000);
  const std::vector<double> sinks{1e4, -1e4, 12.0, 0.45};
  const std::vector<double> start = random_vector(static_cast<size_t>(dims.heads), 1001);
  for (int64_t window : {0, 5}) {
    const Reference ref = reference(dims, in, window, sinks);
    for (DType dtype : {DType::f64, DType::f32}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " W=" << window);
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
      const Run got = run(dims, dtype, in, kSmallBlocks, window, sinks, start);
      EXPECT_LT(norm_rel_err(got.out, ref.out), tol) << "out";
      EXPECT_LT(max_rel_err(got.lse, ref.lse, 1e-3), tol) << "lse";
      EXPECT_LT(norm_rel_err(got.dq, ref.dq), tol) << "dq";
      EXPECT_LT(norm_rel_err(got.dk, ref.dk), tol) << "dk";
      EXPECT_LT(norm_rel_err(got.dv, ref.dv), tol) << "dv";
      EXPECT_LT(max_rel_err(got.dsinks, plus(start, ref.dsinks), 1e-2), tol) << "dsinks";
      EXPECT_EQ(got.dsinks[0], rounded_start(start, dtype)[0]) << "dsinks of the dominant head";
      // Head 0 (query heads 0 and 1 share kv head 0; 1 has no effect): exact zeros and lse = 1e4.
      for (int64_t b = 0; b < dims.batch; ++b)
        for (int64_t pos = 0; pos < dims.seq; ++pos) {
          const size_t row =
              static_cast<size_t>(((b * dims.seq + pos) * dims.heads) * dims.head_dim);
          for (int64_t i = 0; i < dims.head_dim; ++i) {
            EXPECT_EQ(got.out[row + i], 0.0);
            EXPECT_EQ(got.dq[row + i], 0.0);
          }
          EXPECT_EQ(got.lse[static_cast<size_t>(b * dims.heads * dims.seq + pos)], 1e4);
        }
    }
  }
}

TEST_F(AttentionVariantTest, Bf16IsTheFloatResultRoundedOnce) {
  // As test_attention's Bf16IsTheFloatResultRoundedOnce, with windows and sinks: on inputs bf16
  // holds exactly (sinks too), lse and dsinks (f32 for both) are the f32 run's bitwise and out,
  // dq, dk, dv the f32 run's rounded to bf16 once. The bf16 backward's second pass sums dK and dV
  // by key blocks of plan.keys from 0 while a windowed query block's key blocks start at its
  // window, so these cases also cover a query block reaching one key block through two of its
  // own. The f32 backward reads the bf16 run's out (widened), as the bf16 backward does.
  uint64_t seed = 1100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    Inputs in = random_inputs(c.dims, seed);
    for (std::vector<double>* x : {&in.q, &in.k, &in.v, &in.dout}) *x = rounded_to_bf16(*x);
    const std::vector<double> sinks =
        c.sinks ? rounded_to_bf16(random_sinks(c.dims.heads, seed + 7)) : std::vector<double>();
    const std::vector<double> start = random_vector(static_cast<size_t>(c.dims.heads), seed + 8);
    seed += 10;
    expect_bf16_is_f32_rounded_once(c.dims, in, c.blocks, c.window, sinks, start);
  }
}

TEST_F(AttentionVariantTest, KeysOutsideTheWindowDoNotTouchARow) {
  // Perturbing k and v at position s changes out, lse and dq of exactly the rows that see it,
  // s <= t < s + W, and leaves every other row bitwise unchanged: masked probabilities are exact
  // zeros and skipped key blocks are never read.
  const Dims dims{2, 70, 4, 2, 8};
  const int64_t s = 37, window = 9;
  for (DType dtype : {DType::f64, DType::f32, DType::bf16})
    for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks, kOddBlocks}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(dtype) << " blocks " << blocks.query_rows << "x" << blocks.keys);
      Inputs in = random_inputs(dims, 1200);
      const std::vector<double> sinks = random_sinks(dims.heads, 1207);
      const std::vector<double> start(dims.heads, 0.0);
      const Run before = run(dims, dtype, in, blocks, window, sinks, start);
      const int64_t k_row = dims.kv_heads * dims.dqk(), v_row = dims.kv_heads * dims.dv();
      for (int64_t b = 0; b < dims.batch; ++b) {
        for (int64_t i = 0; i < k_row; ++i) in.k[(b * dims.seq + s) * k_row + i] += 3.0;
        for (int64_t i = 0; i < v_row; ++i) in.v[(b * dims.seq + s) * v_row + i] -= 5.0;
      }
      const Run after = run(dims, dtype, in, blocks, window, sinks, start);
      const int64_t q_row = dims.heads * dims.dqk(), o_row = dims.heads * dims.dv();
      for (int64_t b = 0; b < dims.batch; ++b)
        for (int64_t pos = 0; pos < dims.seq; ++pos) {
          const bool sees = s <= pos && pos < s + window;
          const auto first_q = static_cast<size_t>((b * dims.seq + pos) * q_row);
          const auto first_o = static_cast<size_t>((b * dims.seq + pos) * o_row);
          const bool same_out =
              std::equal(before.out.begin() + first_o, before.out.begin() + first_o + o_row,
                         after.out.begin() + first_o);
          const bool same_dq =
              std::equal(before.dq.begin() + first_q, before.dq.begin() + first_q + q_row,
                         after.dq.begin() + first_q);
          EXPECT_EQ(same_out, !sees) << "out b=" << b << " t=" << pos;
          EXPECT_EQ(same_dq, !sees) << "dq b=" << b << " t=" << pos;
          for (int64_t h = 0; h < dims.heads; ++h) {
            const auto i = static_cast<size_t>((b * dims.heads + h) * dims.seq + pos);
            EXPECT_EQ(before.lse[i] == after.lse[i], !sees)
                << "lse b=" << b << " h=" << h << " t=" << pos;
          }
        }
    }
}

TEST_F(AttentionVariantTest, WindowedCallsVisitOnlyTheWindowsKeys) {
  // A query block of positions [t0, t0 + P) visits the key blocks (of `keys`, from 0) from the one
  // holding max(0, t0 - W + 1) to the one holding t0 + P - 1, cut there, and no others:
  // rows x (last + 1 - first block's start) score entries per query block, at most
  // B nh T (P + W + keys - 2) in all, O(T W) rather than causal's ~ B nh T^2 / 2. The forward
  // computes each once, the f64 backward once more, the bf16 backward twice (its two passes).
  struct CountCase {
    Dims dims;
    ops::AttentionBlocks blocks;
    int64_t window;
  };
  const CountCase cases[] = {
      {{2, 200, 4, 1, 8}, {16, 16}, 9},                 // P = 4, key blocks cut at the window
      {{1, 2000, 2, 2, 4}, {64, 64}, 16},               // P = 64: T / W large
      {{1, 600, 8, 2, 8}, ops::kAttentionBlocks, 128},  // P = 64, one or two key blocks
  };
  for (const CountCase& c : cases) {
    const Dims& dims = c.dims;
    SCOPED_TRACE(::testing::Message() << "T=" << dims.seq << " W=" << c.window);
    const int64_t group = dims.heads / dims.kv_heads;
    const int64_t positions = std::max<int64_t>(1, c.blocks.query_rows / group);
    const int64_t keys = c.blocks.keys;
    int64_t expected = 0;
    for (int64_t t0 = 0; t0 < dims.seq; t0 += positions) {
      const int64_t last = std::min(t0 + positions, dims.seq) - 1;
      const int64_t first_block = std::max<int64_t>(0, t0 - c.window + 1) / keys * keys;
      expected += (last - t0 + 1) * group * (last + 1 - first_block);
    }
    expected *= dims.batch * dims.kv_heads;
    const int64_t bound = dims.batch * dims.heads * dims.seq * (positions + c.window + keys - 2);
    EXPECT_LE(expected, bound);
    const Inputs in = random_inputs(dims, 1300);
    const ops::AttentionVariant variant{c.window, Tensor()};
    for (DType dtype : {DType::f64, DType::bf16}) {
      AttentionTensors t = allocate(dims, dtype);
      upload_inputs(t, in);
      EXPECT_EQ(scores_computed_by([&] { forward(t, dims, c.blocks, variant); }), expected)
          << dtype_name(dtype) << " forward";
      EXPECT_EQ(scores_computed_by([&] { backward(t, dims, c.blocks, variant); }),
                (dtype == DType::bf16 ? 2 : 1) * expected)
          << dtype_name(dtype) << " backward";
    }
    // Causal at the same shape, for scale: every key up to each block's last position.
    AttentionTensors t = allocate(dims, DType::f64);
    upload_inputs(t, in);
    const int64_t causal = scores_computed_by([&] { forward(t, dims, c.blocks); });
    EXPECT_GT(causal, expected);
    std::printf("  T=%lld W=%lld: %lld score entries windowed, %lld causal (%.3f)\n",
                static_cast<long long>(dims.seq), static_cast<long long>(c.window),
                static_cast<long long>(expected), static_cast<long long>(causal),
                static_cast<double>(expected) / static_cast<double>(causal));
  }
}

TEST_F(AttentionVariantTest, EntryPointsAndOptionalDsinks) {
  // ops::attention_forward / attention_backward (the backend dispatch) with a variant are the
  // default-block kernels bitwise; leaving dsinks undefined skips the sink's gradient and changes
  // nothing else.
  const Dims dims{2, 300, 4, 2, 8};
  const Inputs in = random_inputs(dims, 1400);
  const std::vector<double> sinks = random_sinks(dims.heads, 1407);
  const std::vector<double> start = random_vector(static_cast<size_t>(dims.heads), 1408);
  const Run want = run(dims, DType::f64, in, ops::kAttentionBlocks, 50, sinks, start);

  AttentionTensors t = allocate(dims, DType::f64);
  upload_inputs(t, in);
  OwnedTensor sinks_t = head_vector(sinks, DType::f64, "sinks");
  OwnedTensor dsinks_t = head_vector(start, DType::f64, "dsinks");
  const ops::AttentionVariant variant{50, sinks_t};
  ops::fill(t.out, testing::kNaN, stream());
  ops::fill(t.lse, testing::kNaN, stream());
  ops::fill(t.dq, testing::kNaN, stream());
  ops::attention_forward(t.q, t.k, t.v, dims.scale(), variant, t.out, t.lse, stream());
  ops::attention_backward(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(), variant, t.dq, t.dk,
                          t.dv, dsinks_t, stream());
  EXPECT_TRUE(bitwise_equal(download(t.out), want.out)) << "out";
  EXPECT_TRUE(bitwise_equal(download(t.lse), want.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(download(t.dq), want.dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(download(t.dk), want.dk)) << "dk";
  EXPECT_TRUE(bitwise_equal(download(t.dv), want.dv)) << "dv";
  EXPECT_TRUE(bitwise_equal(download(dsinks_t), want.dsinks)) << "dsinks";

  backward(t, dims, ops::kAttentionBlocks, variant);  // dsinks undefined
  EXPECT_TRUE(bitwise_equal(download(t.dq), want.dq)) << "dq without dsinks";
  EXPECT_TRUE(bitwise_equal(download(t.dk), want.dk)) << "dk without dsinks";
  EXPECT_TRUE(bitwise_equal(download(t.dv), want.dv)) << "dv without dsinks";
  EXPECT_TRUE(bitwise_equal(download(dsinks_t), want.dsinks)) << "dsinks untouched";
}

TEST_F(AttentionVariantTest, BadVariantArgumentsThrowAtTheCall) {
  const Dims dims{2, 5, 4, 2, 8};
  AttentionTensors t = allocate(dims, DType::f64);
  AttentionTensors t16 = allocate(dims, DType::bf16);
  const double scale = dims.scale();
  auto sinks_of = [&](Shape shape, DType dtype) { return make(shape, "sinks", dtype); };
  OwnedTensor sinks = sinks_of(Shape{4}, DType::f64), sinks5 = sinks_of(Shape{5}, DType::f64),
              sinks_2d = sinks_of(Shape{1, 4}, DType::f64),
              sinks32 = sinks_of(Shape{4}, DType::f32), sinks16 = sinks_of(Shape{4}, DType::bf16),
              dsinks16 = sinks_of(Shape{4}, DType::bf16), dsinks32 = sinks_of(Shape{4}, DType::f32);
  auto expect_error = [](const auto& call, const char* op, const char* fragment) {
    try {
      call();
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(op), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
    }
  };
  auto forward_with = [&](const AttentionTensors& x, const ops::AttentionVariant& variant) {
    return [&, variant] {
      ops::attention_forward_cpu(x.q, x.k, x.v, scale, variant, x.out, x.lse, stream());
    };
  };
  auto backward_with = [&](const AttentionTensors& x, const ops::AttentionVariant& variant,
                           const Tensor& dsinks) {
    return [&, variant, dsinks] {
      ops::attention_backward_cpu(x.q, x.k, x.v, x.out, x.lse, x.dout, scale, variant, x.dq, x.dk,
                                  x.dv, dsinks, stream());
    };
  };
  const char* fwd = "attention_forward";
  const char* bwd = "attention_backward";
  expect_error(forward_with(t, {-1, Tensor()}), fwd, "window must be >= 0");
  expect_error(backward_with(t, {-3, Tensor()}, Tensor()), bwd, "window must be >= 0");
  expect_error(forward_with(t, {0, sinks5}), fwd, "sinks must be (nh) = f64(4)");
  expect_error(forward_with(t, {0, sinks_2d}), fwd, "sinks must be (nh)");
  expect_error(forward_with(t, {0, sinks32}), fwd, "sinks must be (nh) = f64(4), got f32(4)");
  expect_error(forward_with(t16, {0, sinks32}), fwd, "sinks must be (nh) = bf16(4)");
  expect_error(backward_with(t, {4, sinks5}, Tensor()), bwd, "sinks must be (nh)");
  expect_error(backward_with(t, {0, Tensor()}, sinks), bwd, "dsinks");
  expect_error(backward_with(t, {0, Tensor()}, sinks), bwd, "sinks is undefined");
  expect_error(backward_with(t, {0, sinks}, sinks5), bwd, "dsinks must be (nh) = f64(4)");
  expect_error(backward_with(t, {0, sinks}, dsinks32), bwd, "dsinks must be (nh) = f64(4)");
  // bf16 q: sinks in bf16, dsinks in f32 (the fp32 main gradient), not bf16.
  expect_error(backward_with(t16, {0, sinks16}, dsinks16), bwd, "dsinks must be (nh) = f32(4)");
  stream().synchronize();  // nothing was enqueued, nothing failed on the stream
  // And the right ones pass.
  forward_with(t16, {2, sinks16})();
  backward_with(t16, {2, sinks16}, dsinks32)();
  stream().synchronize();
}

}  // namespace
}  // namespace moepeak
