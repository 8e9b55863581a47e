// CPU attention with packed documents (ops/attention.h, AttentionVariant::doc_start): forward (out,
// lse) and backward (dq, dk, dv, dsinks) against a float64 brute force written here (every
// (query, key) score materialised, -inf where the causal mask, the window or the document hides
// the key, the sink as one more column, a softmax over each row, and the gradients from the
// explicit matrices), the kernels' gradients against central differences, f32 against the brute
// force, bf16 storage as the f32 result rounded once (bitwise), doc_start all zeros as doc_start
// undefined (bitwise), keys of other documents never touching a row, masked (query block, key
// block) pairs never visited (NaN in the rows of other documents, and the kernels' score count),
// and the argument and contract checks.
//
//   q, dq: (B, T, nh, dqk)    k, dk: (B, T, nkv, dqk)    v, dv: (B, T, nkv, dv)
//   out, dout: (B, T, nh, dv) lse: (B, nh, T)            sinks, dsinks: (nh)
//   doc_start: (B, T) i32     query t of sequence b sees keys s with
//                             max(doc_start[b][t], t - W + 1 with a window W) <= s <= t
//
// Small blocks (detail::attention_*_cpu_blocked) make short sequences cross many query and key
// blocks, so documents start inside key blocks, on their edges and span several; the default
// blocks run at T = 300 and 600.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/runtime/backend.h"
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
using testing::kNaN;
using testing::kOddBlocks;
using testing::kSmallBlocks;
using testing::max_rel_err;
using testing::norm_rel_err;
using testing::random_inputs;
using testing::random_sinks;
using testing::random_vector;
using testing::rounded_to_bf16;
using testing::scores_computed_by;

// Each sequence's document lengths, in order; each list sums to T.
using Documents = std::vector<std::vector<int64_t>>;

// doc_start (B, T) of the documents: position t of a document starting at f holds f.
std::vector<int32_t> starts_of(const Documents& docs, int64_t seq) {
  std::vector<int32_t> starts;
  for (const std::vector<int64_t>& lengths : docs) {
    int64_t first = 0;
    for (int64_t length : lengths) {
      starts.insert(starts.end(), static_cast<size_t>(length), static_cast<int32_t>(first));
      first += length;
    }
    EXPECT_EQ(first, seq) << "the document lengths must sum to T";
  }
  return starts;
}

// ---- The float64 brute force --------------------------------------------------------------------

struct BruteForce {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
  std::vector<double> dsinks_terms;  // (nh): sum_{b,t} |P[t][T] D[t]|, the scale of dsinks' sum
};

// Whether query t sees key s, from the definitions: causal, inside the window (W = 0: no window),
// inside the document that starts at doc_first.
bool sees(int64_t t, int64_t s, int64_t window, int64_t doc_first) {
  return s <= t && s >= doc_first && (window == 0 || s > t - window);
}

// Per (b, h): the T x (T + 1) matrix S of scaled scores (-inf where the key is hidden; column T
// is the sink, -inf without sinks), P = exp(S - lse) with lse each row's log-sum-exp, out = P V
// (the sink's column has no value), and the backward from the explicit matrices: dP = dout V^T,
// D = rowsum(dout * out), dS = P * (dP - D), dq = scale dS K, dk = scale dS^T Q, dv = P^T dout,
// dsinks[h] = sum_t P[t][T] (0 - D[t]).
BruteForce brute_force(const Dims& dims, const Inputs& in, int64_t window,
                       const std::vector<double>& sinks, const std::vector<int32_t>& doc_start) {
  const int64_t B = dims.batch, T = dims.seq, nh = dims.heads, nkv = dims.kv_heads,
                dqk = dims.dqk(), dv = dims.dv(), group = nh / nkv, cols = T + 1;
  const double scale = dims.scale(), inf = std::numeric_limits<double>::infinity();
  BruteForce r{std::vector<double>(in.dout.size()),
               std::vector<double>(B * nh * T),
               std::vector<double>(in.q.size()),
               std::vector<double>(in.k.size()),
               std::vector<double>(in.v.size()),
               std::vector<double>(nh),
               std::vector<double>(nh)};
  std::vector<double> S(T * cols), P(T * cols), D(T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      auto q_at = [&](int64_t t) { return ((b * T + t) * nh + h) * dqk; };
      auto o_at = [&](int64_t t) { return ((b * T + t) * nh + h) * dv; };
      auto k_at = [&](int64_t s) { return ((b * T + s) * nkv + g) * dqk; };
      auto v_at = [&](int64_t s) { return ((b * T + s) * nkv + g) * dv; };
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t s = 0; s < T; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < dqk; ++i) dot += in.q[q_at(t) + i] * in.k[k_at(s) + i];
          S[t * cols + s] = sees(t, s, window, doc_start[b * T + t]) ? scale * dot : -inf;
        }
        S[t * cols + T] = sinks.empty() ? -inf : sinks[h];
        const double m = *std::max_element(S.begin() + t * cols, S.begin() + (t + 1) * cols);
        double sum = 0;
        for (int64_t s = 0; s < cols; ++s) sum += std::exp(S[t * cols + s] - m);
        const double lse = m + std::log(sum);
        r.lse[(b * nh + h) * T + t] = lse;
        for (int64_t s = 0; s < cols; ++s) P[t * cols + s] = std::exp(S[t * cols + s] - lse);
        D[t] = 0;
        for (int64_t i = 0; i < dv; ++i) {
          double acc = 0;
          for (int64_t s = 0; s < T; ++s) acc += P[t * cols + s] * in.v[v_at(s) + i];
          r.out[o_at(t) + i] = acc;
          D[t] += in.dout[o_at(t) + i] * acc;
        }
        r.dsinks[h] += P[t * cols + T] * (0 - D[t]);
        r.dsinks_terms[h] += std::abs(P[t * cols + T] * D[t]);
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s < T; ++s) {
          double dp = 0;
          for (int64_t i = 0; i < dv; ++i) dp += in.dout[o_at(t) + i] * in.v[v_at(s) + i];
          const double p = P[t * cols + s], ds = p * (dp - D[t]);
          for (int64_t i = 0; i < dqk; ++i) {
            r.dq[q_at(t) + i] += scale * ds * in.k[k_at(s) + i];
            r.dk[k_at(s) + i] += scale * ds * in.q[q_at(t) + i];
          }
          for (int64_t i = 0; i < dv; ++i) r.dv[v_at(s) + i] += p * in.dout[o_at(t) + i];
        }
    }
  return r;
}

// ---- Cases --------------------------------------------------------------------------------------

struct Case {
  Dims dims;
  ops::AttentionBlocks blocks;
  int64_t window;
  bool sinks;
  Documents docs;
  const char* what;
};

std::string describe(const Case& c) {
  std::string text = std::string(c.what) + ": B=" + std::to_string(c.dims.batch) +
                     " T=" + std::to_string(c.dims.seq) + " nh=" + std::to_string(c.dims.heads) +
                     " nkv=" + std::to_string(c.dims.kv_heads) +
                     " dqk=" + std::to_string(c.dims.dqk()) + " dv=" + std::to_string(c.dims.dv()) +
                     " blocks " + std::to_string(c.blocks.query_rows) + "x" +
                     std::to_string(c.blocks.keys) + " W=" + std::to_string(c.window) +
                     (c.sinks ? " sinks" : "") + " documents";
  for (const auto& lengths : c.docs) {
    text += " [";
    for (int64_t length : lengths) text += " " + std::to_string(length);
    text += " ]";
  }
  return text;
}

const Case kCases[] = {
    {{1, 40, 4, 2, 8}, {8, 8}, 0, false, {{7, 13, 3, 17}}, "uneven documents"},
    {{2, 50, 4, 2, 8}, {16, 16}, 0, true, {{37, 13}, {5, 20, 25}}, "longer than a block, B = 2"},
    {{1, 24, 4, 4, 8}, {8, 8}, 0, false, {{1, 1, 1, 5, 1, 1, 14}}, "one-token documents"},
    {{2, 33, 4, 2, 8}, {8, 8}, 0, true, {{32, 1}, {1, 31, 1}}, "boundaries at 1 and T - 1"},
    {{1, 20, 2, 1, 8}, {8, 8}, 0, false, {std::vector<int64_t>(20, 1)}, "every token alone"},
    {{1, 20, 2, 1, 8}, {8, 8}, 0, true, {std::vector<int64_t>(20, 1)}, "alone with its sink"},
    {{2, 45, 4, 2, 8}, kSmallBlocks, 6, true, {{10, 20, 15}, {3, 30, 12}}, "window 6 and sinks"},
    {{1, 37, 4, 1, 24}, kOddBlocks, 7, true, {{12, 1, 24}}, "G = 4, odd blocks, window"},
    {{1, 70, 6, 2, 16}, kSmallBlocks, 20, true, {{33, 17, 20}}, "G = 3, window 20"},
    {{2, 33, 4, 2, 12, 8}, {8, 8}, 0, true, {{9, 24}, {20, 13}}, "dv < dqk"},
    {{1, 45, 4, 2, 8, 20}, kSmallBlocks, 5, false, {{4, 4, 30, 7}}, "dv > dqk, window"},
    {{1, 300, 4, 1, 16}, ops::kAttentionBlocks, 0, true, {{40, 150, 97, 13}}, "default blocks"},
    {{2, 600, 8, 2, 8},
     ops::kAttentionBlocks,
     100,
     true,
     {{300, 300}, {257, 1, 342}},
     "default blocks, window 100"},
    {{1, 300, 4, 1, 24, 16}, ops::kAttentionBlocks, 0, false, {{256, 44}}, "default, dv < dqk"},
};

class AttentionDocumentsTest : public AttentionTest {
 protected:
  // The case's inputs, sinks and dsinks' start from `seed`.
  struct Drawn {
    Inputs in;
    std::vector<double> sinks, start;
    std::vector<int32_t> starts;
  };
  static Drawn draw(const Case& c, uint64_t seed) {
    return Drawn{random_inputs(c.dims, seed),
                 c.sinks ? random_sinks(c.dims.heads, seed + 7) : std::vector<double>(),
                 random_vector(static_cast<size_t>(c.dims.heads), seed + 8),
                 starts_of(c.docs, c.dims.seq)};
  }
};

// dsinks = start + the brute force's sum, head by head, relative to |start| + the sum of its
// terms' magnitudes: the B T terms exp(s_h - lse) D have random signs and cancel (the sum is
// often 10x below its terms), while each term's error is relative to the term, so the sum's
// error is measured against the terms, as tests/ops/backend_ops/cases_attention.cpp does.
double dsinks_err(const std::vector<double>& got, const std::vector<double>& start,
                  const BruteForce& want) {
  double worst = 0;
  for (size_t h = 0; h < got.size(); ++h) {
    if (std::isnan(got[h])) return std::numeric_limits<double>::infinity();
    const double scale = std::abs(start[h]) + want.dsinks_terms[h];
    worst = std::max(worst, std::abs(got[h] - (start[h] + want.dsinks[h])) / scale);
  }
  return worst;
}

TEST_F(AttentionDocumentsTest, DoubleMatchesTheBruteForce) {
  // float64 flash vs the brute force: the same sums in other orders (and the brute force's exp of
  // -inf columns, exact zeros), so they agree to a few ulp times log T: 1e-12 (out and lse
  // relative, values under 1e-3 at 1e-3; gradients relative to each tensor's largest element;
  // dsinks, summed over B * T rows, relative to its terms: dsinks_err).
  uint64_t seed = 2000;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Drawn d = draw(c, seed);
    seed += 10;
    const BruteForce want = brute_force(c.dims, d.in, c.window, d.sinks, d.starts);
    const Run got = run(c.dims, DType::f64, d.in, c.blocks, c.window, d.sinks, d.start, d.starts);
    EXPECT_LT(max_rel_err(got.out, want.out, 1e-3), 1e-12) << "out";
    EXPECT_LT(max_rel_err(got.lse, want.lse, 1e-3), 1e-12) << "lse";
    EXPECT_LT(gradient_err(got.dq, want.dq), 1e-12) << "dq";
    EXPECT_LT(gradient_err(got.dk, want.dk), 1e-12) << "dk";
    EXPECT_LT(gradient_err(got.dv, want.dv), 1e-12) << "dv";
    if (c.sinks) {
      EXPECT_LT(dsinks_err(got.dsinks, d.start, want), 1e-12) << "dsinks";
    }
  }
}

TEST_F(AttentionDocumentsTest, FloatMatchesTheBruteForce) {
  // float32 vs the float64 brute force, relative to each tensor's largest element: the rounding
  // of every product and sum (eps 6e-8) and the ~2 ulp polynomial exp, grown by reductions of up
  // to 342 keys, as in test_attention_variants: 1e-5. dsinks is summed in double from the f32 out
  // and lse and stored start + sum rounded once to f32: 1e-5 of its terms (dsinks_err).
  uint64_t seed = 2200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Drawn d = draw(c, seed);
    seed += 10;
    const BruteForce want = brute_force(c.dims, d.in, c.window, d.sinks, d.starts);
    const Run got = run(c.dims, DType::f32, d.in, c.blocks, c.window, d.sinks, d.start, d.starts);
    EXPECT_LT(norm_rel_err(got.out, want.out), 1e-5) << "out";
    EXPECT_LT(norm_rel_err(got.lse, want.lse), 1e-5) << "lse";
    EXPECT_LT(gradient_err(got.dq, want.dq), 1e-5) << "dq";
    EXPECT_LT(gradient_err(got.dk, want.dk), 1e-5) << "dk";
    EXPECT_LT(gradient_err(got.dv, want.dv), 1e-5) << "dv";
    if (c.sinks) {
      EXPECT_LT(dsinks_err(got.dsinks, d.start, want), 1e-5) << "dsinks";
    }
  }
}

TEST_F(AttentionDocumentsTest, Bf16IsTheFloatResultRoundedOnce) {
  // As test_attention_variants' Bf16IsTheFloatResultRoundedOnce, with documents: on inputs bf16
  // holds exactly (sinks too), lse and dsinks (f32 for both) are the f32 run's bitwise and out,
  // dq, dk, dv the f32 run's rounded to bf16 once. The bf16 backward's second pass (dk/dv by key
  // blocks) must visit the same (query block, key block) pairs as the one-pass loop, whose key
  // blocks start at each query block's document. The f32 backward reads the bf16 run's out
  // (widened), as the bf16 backward does.
  uint64_t seed = 2400;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    Drawn d = draw(c, seed);
    seed += 10;
    for (std::vector<double>* x : {&d.in.q, &d.in.k, &d.in.v, &d.in.dout}) *x = rounded_to_bf16(*x);
    d.sinks = rounded_to_bf16(d.sinks);
    expect_bf16_is_f32_rounded_once(c.dims, d.in, c.blocks, c.window,
                                    c.sinks ? d.sinks : std::vector<double>(), d.start, d.starts);
  }
}

TEST_F(AttentionDocumentsTest, GradientsMatchCentralDifferences) {
  // The brute force's gradient formulas checked independently: dq, dk, dv and dsinks of the f64
  // kernel against central differences of L = sum(out * dout) through the f64 forward, with
  // documents [3, 1, 5, 2] and [6, 5] (one-token documents, boundaries inside and on the edges of
  // 4-key blocks), a window of 3 and sinks, dv = dqk and dv != dqk; bound 1e-6 as in
  // test_attention_variants' GradientsMatchCentralDifferences.
  for (const Dims& dims : {Dims{2, 11, 4, 2, 4}, Dims{2, 11, 4, 2, 6, 3}}) {
    SCOPED_TRACE(::testing::Message() << "dqk=" << dims.dqk() << " dv=" << dims.dv());
    const ops::AttentionBlocks blocks{8, 4};
    // Step 1e-4: the rounding of L over 2h dominates below it (measured worst dq 1.0e-6 at 1e-5
    // and 1.1e-6 at 3e-5, 2.7e-7 at 1e-4, 3.5e-7 at 3e-4 where truncation takes over; dk and
    // dsinks <= 1.5e-8 at 1e-4).
    const auto e =
        central_difference_errors(dims, random_inputs(dims, 2600), random_sinks(dims.heads, 2607),
                                  blocks, 3, starts_of({{3, 1, 5, 2}, {6, 5}}, dims.seq), 1e-4);
    EXPECT_LT(e.dq, 1e-6) << "dq";
    EXPECT_LT(e.dk, 1e-6) << "dk";
    EXPECT_LT(e.dv, 1e-6) << "dv";
    EXPECT_LT(e.dsinks, 1e-6) << "dsinks";
  }
}

TEST_F(AttentionDocumentsTest, AllZeroDocStartIsUndefinedBitwise) {
  // One document per sequence given as doc_start = 0 everywhere hides no key: bitwise the result
  // without doc_start, in every dtype and block size, with and without a window and sinks.
  const Dims dims{2, 70, 8, 2, 16};
  const Inputs in = random_inputs(dims, 2700);
  const std::vector<double> sinks = random_sinks(dims.heads, 2707);
  const std::vector<double> start = random_vector(static_cast<size_t>(dims.heads), 2708);
  const std::vector<int32_t> zeros(static_cast<size_t>(dims.batch * dims.seq), 0);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks, kOddBlocks})
      for (int64_t window : {0, 9})
        for (bool with_sinks : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " blocks " << blocks.query_rows << "x" << blocks.keys
                       << " W=" << window << (with_sinks ? " sinks" : ""));
          const std::vector<double> s = with_sinks ? sinks : std::vector<double>();
          const Run plain = run(dims, dtype, in, blocks, window, s, start, {});
          const Run zero = run(dims, dtype, in, blocks, window, s, start, zeros);
          EXPECT_TRUE(bitwise_equal(zero.out, plain.out)) << "out";
          EXPECT_TRUE(bitwise_equal(zero.lse, plain.lse)) << "lse";
          EXPECT_TRUE(bitwise_equal(zero.dq, plain.dq)) << "dq";
          EXPECT_TRUE(bitwise_equal(zero.dk, plain.dk)) << "dk";
          EXPECT_TRUE(bitwise_equal(zero.dv, plain.dv)) << "dv";
          EXPECT_TRUE(bitwise_equal(zero.dsinks, plain.dsinks)) << "dsinks";
        }
}

TEST_F(AttentionDocumentsTest, KeysOfOtherDocumentsDoNotTouchARow) {
  // Perturbing k and v at position s changes out, lse and dq of exactly the rows that see it (s
  // <= t in s's document, and t < s + W with a window) and leaves every other row bitwise
  // unchanged: keys before a row's document are exact zeros of P, and skipped key blocks are
  // never read. s = 37 is the first key of its document in sequence 0 and inside one in 1.
  const Dims dims{2, 70, 4, 2, 8};
  const int64_t s = 37;
  const Documents docs{{20, 17, 10, 23}, {30, 15, 25}};
  const std::vector<int32_t> starts = starts_of(docs, dims.seq);
  for (int64_t window : {0, 9})
    for (DType dtype : {DType::f64, DType::f32, DType::bf16})
      for (ops::AttentionBlocks blocks : {ops::kAttentionBlocks, kSmallBlocks, kOddBlocks}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " blocks " << blocks.query_rows
                                          << "x" << blocks.keys << " W=" << window);
        Inputs in = random_inputs(dims, 2800);
        const std::vector<double> sinks = random_sinks(dims.heads, 2807);
        const std::vector<double> start(dims.heads, 0.0);
        const Run before = run(dims, dtype, in, blocks, window, sinks, start, starts);
        const int64_t k_row = dims.kv_heads * dims.dqk(), v_row = dims.kv_heads * dims.dv();
        for (int64_t b = 0; b < dims.batch; ++b) {
          for (int64_t i = 0; i < k_row; ++i) in.k[(b * dims.seq + s) * k_row + i] += 3.0;
          for (int64_t i = 0; i < v_row; ++i) in.v[(b * dims.seq + s) * v_row + i] -= 5.0;
        }
        const Run after = run(dims, dtype, in, blocks, window, sinks, start, starts);
        const int64_t q_row = dims.heads * dims.dqk(), o_row = dims.heads * dims.dv();
        for (int64_t b = 0; b < dims.batch; ++b)
          for (int64_t t = 0; t < dims.seq; ++t) {
            const bool seen = sees(t, s, window, starts[static_cast<size_t>(b * dims.seq + t)]);
            const auto first_q = static_cast<size_t>((b * dims.seq + t) * q_row);
            const auto first_o = static_cast<size_t>((b * dims.seq + t) * o_row);
            const bool same_out =
                std::equal(before.out.begin() + first_o, before.out.begin() + first_o + o_row,
                           after.out.begin() + first_o);
            const bool same_dq =
                std::equal(before.dq.begin() + first_q, before.dq.begin() + first_q + q_row,
                           after.dq.begin() + first_q);
            EXPECT_EQ(same_out, !seen) << "out b=" << b << " t=" << t;
            EXPECT_EQ(same_dq, !seen) << "dq b=" << b << " t=" << t;
            for (int64_t h = 0; h < dims.heads; ++h) {
              const auto i = static_cast<size_t>((b * dims.heads + h) * dims.seq + t);
              EXPECT_EQ(before.lse[i] == after.lse[i], !seen)
                  << "lse b=" << b << " h=" << h << " t=" << t;
            }
          }
      }
}

TEST_F(AttentionDocumentsTest, MaskedBlocksAreNeverRead) {
  // Three runs of documents whose edges fall on block edges (query blocks of P positions and key
  // blocks of `keys`, both dividing 16 resp. 256): NaN in k and v of the first run and in q and
  // dout of the last. A row of the middle run sees neither, and a kernel that visited a wholly
  // masked (query block, key block) pair would carry the NaN into it (P V, dS K, dS^T Q and
  // P^T dout multiply the masked zeros by it): out, lse, dq, dk and dv of the middle run's
  // positions are bitwise those of a run without NaN.
  struct Layout {
    Dims dims;
    ops::AttentionBlocks blocks;
    int64_t first_end, middle_end;  // the middle run: positions [first_end, middle_end)
    Documents docs;
  };
  const Layout layouts[] = {
      {{2, 64, 4, 2, 8}, {8, 16}, 16, 48, {{16, 5, 27, 16}, {3, 13, 32, 9, 7}}},
      {{1, 768, 4, 2, 8}, ops::kAttentionBlocks, 256, 512, {{100, 156, 1, 200, 55, 256}}},
  };
  for (const Layout& l : layouts)
    for (int64_t window : {0, 20})
      for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " T=" << l.dims.seq << " W=" << window);
        const Dims& dims = l.dims;
        const std::vector<int32_t> starts = starts_of(l.docs, dims.seq);
        const Inputs clean = random_inputs(dims, 2900);
        Inputs poisoned = clean;
        auto poison = [&](std::vector<double>& x, int64_t width, int64_t from, int64_t to) {
          for (int64_t b = 0; b < dims.batch; ++b)
            std::fill(x.begin() + (b * dims.seq + from) * width,
                      x.begin() + (b * dims.seq + to) * width, kNaN);
        };
        poison(poisoned.k, dims.kv_heads * dims.dqk(), 0, l.first_end);
        poison(poisoned.v, dims.kv_heads * dims.dv(), 0, l.first_end);
        poison(poisoned.q, dims.heads * dims.dqk(), l.middle_end, dims.seq);
        poison(poisoned.dout, dims.heads * dims.dv(), l.middle_end, dims.seq);
        const Run want = run(dims, dtype, clean, l.blocks, window, {}, {}, starts);
        const Run got = run(dims, dtype, poisoned, l.blocks, window, {}, {}, starts);
        // Positions [first_end, middle_end) of a (B, T, heads, d) tensor, and of lse (B, nh, T).
        auto middle = [&](const std::vector<double>& x, int64_t width) {
          std::vector<double> rows;
          for (int64_t b = 0; b < dims.batch; ++b)
            rows.insert(rows.end(), x.begin() + (b * dims.seq + l.first_end) * width,
                        x.begin() + (b * dims.seq + l.middle_end) * width);
          return rows;
        };
        auto middle_lse = [&](const std::vector<double>& x) {
          std::vector<double> rows;
          for (int64_t bh = 0; bh < dims.batch * dims.heads; ++bh)
            rows.insert(rows.end(), x.begin() + bh * dims.seq + l.first_end,
                        x.begin() + bh * dims.seq + l.middle_end);
          return rows;
        };
        const int64_t q_w = dims.heads * dims.dqk(), o_w = dims.heads * dims.dv();
        const int64_t k_w = dims.kv_heads * dims.dqk(), v_w = dims.kv_heads * dims.dv();
        EXPECT_TRUE(bitwise_equal(middle(got.out, o_w), middle(want.out, o_w))) << "out";
        EXPECT_TRUE(bitwise_equal(middle_lse(got.lse), middle_lse(want.lse))) << "lse";
        EXPECT_TRUE(bitwise_equal(middle(got.dq, q_w), middle(want.dq, q_w))) << "dq";
        EXPECT_TRUE(bitwise_equal(middle(got.dk, k_w), middle(want.dk, k_w))) << "dk";
        EXPECT_TRUE(bitwise_equal(middle(got.dv, v_w), middle(want.dv, v_w))) << "dv";
        // The poison did reach the runs that read it (the test can fail).
        EXPECT_TRUE(std::isnan(got.out.front())) << "out of the first run";
        EXPECT_TRUE(std::isnan(got.dk.back())) << "dk of the last run";
      }
}

TEST_F(AttentionDocumentsTest, CallsVisitOnlyTheirDocumentsKeys) {
  // A query block of positions [t0, t0 + P) of sequence b visits the key blocks (of `keys`, from
  // 0) from the one holding its first row's first key, max(doc_start[b][t0], t0 - W + 1), to the
  // one holding t0 + P - 1, cut there, and no others: rows x (last + 1 - first block's start)
  // score entries per query block. The forward computes each once, the f64 backward once more,
  // the bf16 backward twice (its two passes). With documents of mean length L that is about
  // B nh (sum_i L_i^2 / 2 + T (P + keys)), against causal's B nh T^2 / 2.
  struct CountCase {
    Dims dims;
    ops::AttentionBlocks blocks;
    int64_t window;
    Documents docs;
  };
  const CountCase cases[] = {
      {{2, 200, 4, 1, 8}, {16, 16}, 0, {{50, 50, 50, 50}, {13, 70, 1, 116}}},
      {{1, 2048, 2, 2, 4}, {64, 64}, 0, {{300, 500, 248, 1000}}},
      {{1, 2048, 2, 2, 4}, {64, 64}, 100, {{300, 500, 248, 1000}}},
      {{1, 4096, 8, 2, 8}, ops::kAttentionBlocks, 0, {std::vector<int64_t>(16, 256)}},
  };
  for (const CountCase& c : cases) {
    const Dims& dims = c.dims;
    SCOPED_TRACE(::testing::Message() << "T=" << dims.seq << " W=" << c.window);
    const std::vector<int32_t> starts = starts_of(c.docs, dims.seq);
    const int64_t group = dims.heads / dims.kv_heads;
    const int64_t positions = std::max<int64_t>(1, c.blocks.query_rows / group);
    const int64_t keys = c.blocks.keys;
    int64_t expected = 0;
    for (int64_t b = 0; b < dims.batch; ++b)
      for (int64_t t0 = 0; t0 < dims.seq; t0 += positions) {
        const int64_t last = std::min(t0 + positions, dims.seq) - 1;
        int64_t first = starts[static_cast<size_t>(b * dims.seq + t0)];
        if (c.window > 0) first = std::max(first, t0 - c.window + 1);
        expected += (last - t0 + 1) * group * (last + 1 - first / keys * keys);
      }
    expected *= dims.kv_heads;
    const Inputs in = random_inputs(dims, 3000);
    const OwnedTensor starts_t = doc_tensor(dims, starts);
    const ops::AttentionVariant variant{c.window, Tensor(), starts_t};
    for (DType dtype : {DType::f64, DType::bf16}) {
      AttentionTensors t = allocate(dims, dtype);
      upload_inputs(t, in);
      EXPECT_EQ(scores_computed_by([&] { forward(t, dims, c.blocks, variant); }), expected)
          << dtype_name(dtype) << " forward";
      EXPECT_EQ(scores_computed_by([&] { backward(t, dims, c.blocks, variant); }),
                (dtype == DType::bf16 ? 2 : 1) * expected)
          << dtype_name(dtype) << " backward";
    }
    // Causal at the same shape, for scale.
    AttentionTensors t = allocate(dims, DType::f64);
    upload_inputs(t, in);
    const int64_t causal = scores_computed_by([&] { forward(t, dims, c.blocks); });
    EXPECT_LT(expected, causal);
    std::printf("  T=%lld W=%lld: %lld score entries with documents, %lld causal (%.3f)\n",
                static_cast<long long>(dims.seq), static_cast<long long>(c.window),
                static_cast<long long>(expected), static_cast<long long>(causal),
                static_cast<double>(expected) / static_cast<double>(causal));
  }
}

TEST_F(AttentionDocumentsTest, EntryPointsUseTheDefaultBlocks) {
  // ops::attention_forward / attention_backward (the backend dispatch) with doc_start are the
  // default-block kernels bitwise.
  const Dims dims{2, 300, 4, 2, 8};
  const Inputs in = random_inputs(dims, 3100);
  const std::vector<double> sinks = random_sinks(dims.heads, 3107);
  const std::vector<double> start = random_vector(static_cast<size_t>(dims.heads), 3108);
  const std::vector<int32_t> starts = starts_of({{100, 1, 199}, {260, 40}}, dims.seq);
  const Run want = run(dims, DType::f64, in, ops::kAttentionBlocks, 50, sinks, start, starts);

  AttentionTensors t = allocate(dims, DType::f64);
  upload_inputs(t, in);
  OwnedTensor sinks_t = head_vector(sinks, DType::f64, "sinks");
  OwnedTensor dsinks_t = head_vector(start, DType::f64, "dsinks");
  const OwnedTensor starts_t = doc_tensor(dims, starts);
  const ops::AttentionVariant variant{50, sinks_t, starts_t};
  for (const OwnedTensor* x : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv}) ops::fill(*x, kNaN, stream());
  ops::attention_forward(t.q, t.k, t.v, dims.scale(), variant, t.out, t.lse, stream());
  ops::attention_backward(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(), variant, t.dq, t.dk,
                          t.dv, dsinks_t, stream());
  EXPECT_TRUE(bitwise_equal(download(t.out), want.out)) << "out";
  EXPECT_TRUE(bitwise_equal(download(t.lse), want.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(download(t.dq), want.dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(download(t.dk), want.dk)) << "dk";
  EXPECT_TRUE(bitwise_equal(download(t.dv), want.dv)) << "dv";
  EXPECT_TRUE(bitwise_equal(download(dsinks_t), want.dsinks)) << "dsinks";
}

template <typename F>
void expect_error(const F& call, const char* op, const char* fragment) {
  try {
    call();
    ADD_FAILURE() << "no error for " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(op), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(fragment), std::string::npos) << e.message();
  }
}

TEST_F(AttentionDocumentsTest, BadDocStartThrowsAtTheCall) {
  // dtype, shape and backend are checked at the call (check_attention_*_args), before anything is
  // enqueued.
  const Dims dims{2, 5, 4, 2, 8};
  AttentionTensors t = allocate(dims, DType::f64);
  const double scale = dims.scale();
  OwnedTensor i64 = make(Shape{2, 5}, "doc_start", DType::i64),
              f32 = make(Shape{2, 5}, "doc_start", DType::f32),
              longer = make(Shape{2, 6}, "doc_start", DType::i32),
              flat = make(Shape{10}, "doc_start", DType::i32),
              three = make(Shape{2, 5, 1}, "doc_start", DType::i32),
              good = make(Shape{2, 5}, "doc_start", DType::i32);
  std::fill_n(good.data_as<int32_t>(), 10, 0);
  auto forward_with = [&](const Tensor& doc_start) {
    return [&, doc_start] {
      ops::attention_forward_cpu(t.q, t.k, t.v, scale, {0, Tensor(), doc_start}, t.out, t.lse,
                                 stream());
    };
  };
  auto backward_with = [&](const Tensor& doc_start) {
    return [&, doc_start] {
      ops::attention_backward_cpu(t.q, t.k, t.v, t.out, t.lse, t.dout, scale,
                                  {0, Tensor(), doc_start}, t.dq, t.dk, t.dv, Tensor(), stream());
    };
  };
  const char* fwd = "attention_forward";
  const char* bwd = "attention_backward";
  expect_error(forward_with(i64), fwd, "doc_start must be (B, T) = i32(2, 5), got i64(2, 5)");
  expect_error(forward_with(f32), fwd, "doc_start must be (B, T) = i32(2, 5)");
  expect_error(forward_with(longer), fwd, "doc_start must be (B, T) = i32(2, 5)");
  expect_error(forward_with(flat), fwd, "doc_start must be (B, T)");
  expect_error(backward_with(three), bwd, "doc_start must be (B, T)");
  expect_error(backward_with(i64), bwd, "doc_start must be (B, T) = i32(2, 5)");
  stream().synchronize();  // nothing was enqueued, nothing failed on the stream
  forward_with(good)();
  backward_with(good)();
  stream().synchronize();
}

TEST_F(AttentionDocumentsTest, DocStartOnAnotherBackendThrows) {
  // doc_start must be on out's backend: CUDA device memory for a CUDA call, CPU memory for a CPU
  // call. Needs a CUDA backend (the emulated build has one).
  if (!Backend::cuda_available()) GTEST_SKIP() << "no CUDA backend";
  BackendOptions options;
  options.kind = BackendKind::cuda;
  std::unique_ptr<Backend> gpu = Backend::create(options);
  const Dims dims{1, 4, 2, 1, 8};
  AttentionTensors t = allocate(dims, DType::f32);
  OwnedTensor on_gpu =
      OwnedTensor::device(*gpu, Shape{1, 4}, DType::i32, LiveSet::workspace, "doc_start");
  expect_error(
      [&] {
        ops::attention_forward(t.q, t.k, t.v, dims.scale(), {0, Tensor(), on_gpu}, t.out, t.lse,
                               stream());
      },
      "attention_forward", "doc_start i32(1, 4)");
  expect_error(
      [&] {
        ops::attention_backward(t.q, t.k, t.v, t.out, t.lse, t.dout, dims.scale(),
                                {0, Tensor(), on_gpu}, t.dq, t.dk, t.dv, Tensor(), stream());
      },
      "attention_backward", "must be on out's backend (CPU memory)");
}

TEST_F(AttentionDocumentsTest, BrokenContractThrowsOnTheStream) {
  // The CPU kernels test doc_start's values before they read them: a negative start, one after
  // its position and one below its predecessor throw moepeak::Error when the stream synchronises
  // (its error is sticky: a backend per call).
  const Dims dims{1, 6, 2, 1, 8};
  struct Broken {
    std::vector<int32_t> starts;
    const char* fragment;
  };
  const Broken broken[] = {
      {{0, 0, -1, -1, 4, 4}, "doc_start[0][2] = -1 breaks its contract"},
      {{0, 0, 0, 4, 4, 4}, "doc_start[0][3] = 4 breaks its contract"},
      {{0, 0, 2, 1, 4, 4}, "doc_start[0][3] = 1 breaks its contract"},
      {{1, 1, 1, 1, 1, 1}, "doc_start[0][0] = 1"},
  };
  for (const Broken& x : broken)
    for (bool backward_pass : {false, true}) {
      SCOPED_TRACE(::testing::Message() << x.fragment << (backward_pass ? " backward" : ""));
      std::unique_ptr<Backend> own = Backend::create(BackendOptions{});
      Stream& s = own->default_stream();
      auto make_own = [&](Shape shape, DType dtype) {
        return OwnedTensor::device(*own, shape, dtype, LiveSet::workspace, "t");
      };
      OwnedTensor q = make_own(dims.q_shape(), DType::f32),
                  k = make_own(dims.k_shape(), DType::f32),
                  v = make_own(dims.v_shape(), DType::f32),
                  out = make_own(dims.out_shape(), DType::f32),
                  lse = make_own(dims.lse_shape(), DType::f32),
                  starts = make_own(Shape{1, 6}, DType::i32);
      for (const OwnedTensor* x_t : {&q, &k, &v, &out, &lse}) ops::fill(*x_t, 0.5, s);
      std::copy(x.starts.begin(), x.starts.end(), starts.data_as<int32_t>());
      const ops::AttentionVariant variant{0, Tensor(), starts};
      if (backward_pass) {
        OwnedTensor dq = make_own(dims.q_shape(), DType::f32),
                    dk = make_own(dims.k_shape(), DType::f32),
                    dv = make_own(dims.v_shape(), DType::f32);
        ops::attention_backward(q, k, v, out, lse, out, dims.scale(), variant, dq, dk, dv, Tensor(),
                                s);
        expect_error([&] { s.synchronize(); }, "attention_backward", x.fragment);
      } else {
        ops::attention_forward(q, k, v, dims.scale(), variant, out, lse, s);
        expect_error([&] { s.synchronize(); }, "attention_forward", x.fragment);
      }
    }
}

}  // namespace
}  // namespace moepeak
