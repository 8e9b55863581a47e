// The LLEP planner (ops/schedules/llep_plan.h) as a pure function, on count matrices drawn
// balanced, Zipf-skewed and adversarial (every source routes its rows to the same experts), over
// W in {1, 2, 4, 8}, several alpha, lambda, min_tokens_per_gemm and hard capacities. Invariants:
//   - every routed row is assigned exactly once: each (expert, source) range [0, count) is tiled
//     by its assignments, each expert's pieces tile [0, L_e), rank loads add up;
//   - the hard capacity is never exceeded;
//   - gate: no spill (every row on its owner) iff max/mean native load <= lambda and no native
//     load exceeds the capacity;
//   - soft cap: with nothing forced, no rank computes more than ceil(alpha T / W); with alpha >= 1,
//     min_tokens_per_gemm <= 1 and no helped-expert limit nothing is ever forced; forced overflow
//     (no capacity, no limit) stays under (W - 1) * (min_tokens_per_gemm - 1) rows past the cap;
//   - the helped-expert limit H: no rank holds pieces of more than H foreign experts it did not
//     already help, with the limit at its least (E/W + 1) and unbounded (E - E/W); when the LPT
//     cannot place a remainder under it, the capacity fill does (hand-checked, and counted);
//   - min_tokens_per_gemm: without a binding capacity every helper piece below it is the last
//     piece of its expert (the remainder);
//   - the receive capacity formula covers every plan of a receiver-bounded exchange;
//   - hand-checked plans (one hot expert spread over the ranks), determinism, and errors;
//   - PipelinedLLEP's launch shape (ops/schedules/dispatch_pipelined_llep.h, "Bound"): the slots S
//     and tile rows T against the rule, recomputed here from the buffer list — S = 2 exactly when
//     the two-slot rows with T_min-row tiles fit 2 W M_c H b, T the largest that fits — so that
//     the dispatch bytes stay under pipelined_llep_bound_bytes (2 W M_c H b + metadata) whenever
//     shape.bounded, which holds whenever one slot with a one-row tile fits (in particular for
//     every grid point with max(alpha, lambda) <= W - 1 here), and otherwise exceed it by exactly
//     backward's rows past 2 W M_c H b; S = 1 at W = 2, 3 and S = 2 at W = 4, 8 at the defaults.
//
//     ctest -R test_llep_plan --output-on-failure
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/measure/harness.h"
#include "core/runtime/arena.h"
#include "ops/schedules/dispatch_pipelined_llep.h"
#include "ops/schedules/llep_plan.h"

namespace moepeak {
namespace {

using schedules::kNoCapacity;
using schedules::llep_receive_capacity;
using schedules::llep_transfers;
using schedules::LlepParams;
using schedules::LlepPlan;
using schedules::plan_llep;

enum class Skew { balanced, zipf, adversarial };

// (W, E) counts: every source routes `rows` rows (`rows / k` tokens, top-k distinct experts),
// drawn by the benches' seeded routing (core/measure/harness.h; Zipf s = 1.2).
std::vector<int64_t> draw_counts(std::mt19937_64& rng, int64_t W, int64_t E, int64_t tokens,
                                 int64_t k, Skew skew) {
  const char* kind = skew == Skew::zipf          ? "zipf"
                     : skew == Skew::adversarial ? "adversarial"
                                                 : "balanced";
  std::vector<int64_t> counts(static_cast<size_t>(W * E), 0);
  for (int64_t s = 0; s < W; ++s) {
    const measure::SeededRouting r = measure::seeded_routing(kind, tokens, E, k, 1.2, 1, rng);
    for (int32_t e : r.index) ++counts[s * E + e];
  }
  return counts;
}

std::string describe(const LlepPlan& p, const LlepParams& q) {
  std::string s =
      "W=" + std::to_string(p.world) + " E=" + std::to_string(p.num_experts) +
      " T=" + std::to_string(p.total_rows) + " alpha=" + std::to_string(q.alpha) +
      " lambda=" + std::to_string(q.lambda) + " min=" + std::to_string(q.min_tokens_per_gemm) +
      " cap=" + (p.capacity == kNoCapacity ? std::string("none") : std::to_string(p.capacity)) +
      " imbalance=" + std::to_string(p.imbalance) + " loads";
  for (int64_t l : p.rank_load) s += " " + std::to_string(l);
  return s;
}

// Every invariant that holds for any plan; returns whether forced pieces could be below
// min_tokens_per_gemm for reasons of capacity (then that rule is not checked).
void check_plan(const LlepPlan& p, const std::vector<int64_t>& counts, const LlepParams& q) {
  const int64_t W = p.world, E = p.num_experts, El = E / W;
  const std::string what = describe(p, q);
  // Each (expert, source) range tiled once, in order.
  std::vector<int64_t> load(static_cast<size_t>(W), 0);
  size_t a = 0;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < W; ++s) {
      int64_t at = 0;
      while (a < p.assignments.size() && p.assignments[a].expert == e &&
             p.assignments[a].source == s) {
        const auto& x = p.assignments[a++];
        ASSERT_EQ(x.begin, at) << what << ": expert " << e << " source " << s;
        ASSERT_GT(x.end, x.begin) << what;
        ASSERT_TRUE(x.rank >= 0 && x.rank < W) << what;
        load[x.rank] += x.end - x.begin;
        at = x.end;
      }
      ASSERT_EQ(at, counts[s * E + e]) << what << ": expert " << e << " source " << s;
    }
  }
  ASSERT_EQ(a, p.assignments.size()) << what << ": assignments out of order";
  EXPECT_EQ(load, p.rank_load) << what;
  int64_t T = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t at = 0;
    for (const auto& piece : p.pieces[e]) {
      EXPECT_EQ(piece.begin, at) << what << ": pieces of expert " << e;
      at = piece.end;
    }
    EXPECT_EQ(at, p.expert_load[e]) << what;
    T += p.expert_load[e];
  }
  EXPECT_EQ(T, p.total_rows);
  // Hard capacity, always.
  EXPECT_LE(p.max_rank_load(), p.capacity) << what;
  // The gate.
  const int64_t max_native = *std::max_element(p.native_load.begin(), p.native_load.end());
  const bool should_spill = T > 0 && (p.imbalance > q.lambda || max_native > p.capacity);
  EXPECT_EQ(p.spill, should_spill) << what;
  if (!p.spill) {
    for (const auto& x : p.assignments) EXPECT_EQ(x.rank, x.expert / El) << what;
    EXPECT_TRUE(llep_transfers(p).empty()) << what;
  }
  // Soft cap: only forced rows go past it.
  if (p.forced_rows == 0 && p.spill) {
    EXPECT_LE(p.max_rank_load(), p.soft_cap) << what;
  }
  // The helped-expert limit (nothing already helped here): foreign experts per rank.
  EXPECT_EQ(p.helped_limit, schedules::llep_helped_limit(E, W, q));
  std::vector<int64_t> helped(static_cast<size_t>(W), 0);
  for (const auto& t : llep_transfers(p)) ++helped[t.helper];
  for (int64_t g = 0; g < W; ++g) EXPECT_LE(helped[g], p.helped_limit) << what << ": rank " << g;
  if (!p.spill) {
    EXPECT_FALSE(p.filled) << what;
  }
  if (p.filled) {
    EXPECT_NE(p.capacity, kNoCapacity) << what;
  }
  const bool unlimited = p.helped_limit == E - El;
  if (p.spill && unlimited && q.alpha >= 1.0 && q.min_tokens_per_gemm <= 1) {
    EXPECT_EQ(p.forced_rows, 0) << what;
  }
  if (p.spill && unlimited && q.alpha >= 1.0 && p.capacity == kNoCapacity) {
    EXPECT_LE(p.max_rank_load(),
              p.soft_cap + (W - 1) * std::max<int64_t>(0, q.min_tokens_per_gemm - 1))
        << what;
  }
  // min_tokens_per_gemm: a small helper piece is its expert's remainder (without a capacity).
  if (p.capacity == kNoCapacity) {
    for (int64_t e = 0; e < E; ++e) {
      for (const auto& piece : p.pieces[e]) {
        if (piece.rank == e / El) continue;
        if (piece.end - piece.begin < q.min_tokens_per_gemm) {
          EXPECT_EQ(piece.end, p.expert_load[e])
              << what << ": a spill of " << piece.end - piece.begin << " rows of expert " << e
              << " that is not the remainder";
        }
      }
    }
  }
  // Transfers: exactly the (expert, helper != owner) pairs with rows.
  for (const auto& t : llep_transfers(p)) {
    EXPECT_EQ(t.owner, t.expert / El);
    EXPECT_NE(t.helper, t.owner);
    EXPECT_TRUE(std::any_of(p.pieces[t.expert].begin(), p.pieces[t.expert].end(),
                            [&](const auto& x) { return x.rank == t.helper; }));
  }
}

TEST(LlepPlan, InvariantsOverRandomCounts) {
  std::mt19937_64 rng(20261129);
  int64_t cases = 0, spilled = 0, forced = 0, filled = 0;
  for (int64_t W : {1, 2, 4, 8}) {
    for (int64_t E : {8, 16, 32}) {
      if (E % W != 0) continue;
      for (Skew skew : {Skew::balanced, Skew::zipf, Skew::adversarial}) {
        for (int64_t tokens : {0, 1, 7, 50, 200}) {
          const int64_t k = std::min<int64_t>(4, E);
          const std::vector<int64_t> counts = draw_counts(rng, W, E, tokens, k, skew);
          for (double alpha : {1.0, 1.1, 0.8}) {
            for (double lambda : {1.0, 1.3, 2.0}) {
              for (int64_t min_tokens : {0, 1, 8, 64}) {
                // The helped-expert limit at its least (0) and unbounded (E, clamped).
                for (int64_t helped : {int64_t{0}, E}) {
                  LlepParams q{alpha, lambda, min_tokens, helped};
                  // No hard cap, and the receiver-bounded one (every source sent tokens * k rows).
                  for (bool bounded : {false, true}) {
                    const int64_t cap =
                        bounded ? std::max<int64_t>(1, llep_receive_capacity(tokens * k, W, q))
                                : kNoCapacity;
                    LlepPlan p = plan_llep(counts, W, q, cap);
                    check_plan(p, counts, q);
                    if (HasFatalFailure()) return;
                    ++cases;
                    spilled += p.spill;
                    forced += p.forced_rows > 0;
                    filled += p.filled;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::printf("%lld plans checked, %lld spilled, %lld with forced rows, %lld filled\n",
              static_cast<long long>(cases), static_cast<long long>(spilled),
              static_cast<long long>(forced), static_cast<long long>(filled));
  EXPECT_GT(spilled, cases / 10);
  EXPECT_GT(forced, 0);
  EXPECT_GT(filled, 0);
}

TEST(LlepPlan, ReceiveCapacityHoldsEveryPlanOfABoundedExchange) {
  // The capacity formula is what sizes PipelinedLLEP's receive slots: with each source sending
  // at most M rows, the plan stays under it without the planner having to force anything past
  // the soft cap except for min_tokens_per_gemm.
  std::mt19937_64 rng(7);
  for (int64_t W : {2, 4, 8}) {
    const int64_t E = 4 * W, k = 4, tokens = 40, M = tokens * k;
    for (Skew skew : {Skew::balanced, Skew::zipf, Skew::adversarial}) {
      const std::vector<int64_t> counts = draw_counts(rng, W, E, tokens, k, skew);
      for (double lambda : {1.0, 1.3, 3.0}) {
        LlepParams q{1.0, lambda, 1, E};  // no helped-expert limit: balance alone
        const int64_t cap = llep_receive_capacity(M, W, q);
        EXPECT_EQ(cap, std::min(W * M, std::max(M, static_cast<int64_t>(std::floor(lambda * M)))));
        LlepPlan p = plan_llep(counts, W, q, cap);
        check_plan(p, counts, q);
        EXPECT_EQ(p.forced_rows, 0);
        // The gate alone decides: the capacity never overrides it here.
        const int64_t max_native = *std::max_element(p.native_load.begin(), p.native_load.end());
        EXPECT_EQ(p.spill, p.imbalance > lambda) << "max native " << max_native << " cap " << cap;
      }
    }
  }
  EXPECT_EQ(llep_receive_capacity(0, 4, {}), 0);
  EXPECT_EQ(llep_receive_capacity(100, 4, {1.0, 1.3, 32}), 130);
  EXPECT_EQ(llep_receive_capacity(100, 4, {2.0, 1.3, 32}), 200);
  EXPECT_EQ(llep_receive_capacity(100, 1, {2.0, 1.3, 32}), 100);  // never past W * M
}

TEST(LlepPlan, OneHotExpertIsSpreadOverTheLeastLoadedRanks) {
  // W = 4, E = 8 (2 per rank); every source sends 30 rows to expert 0 and 10 to expert 5.
  const int64_t W = 4, E = 8;
  std::vector<int64_t> counts(W * E, 0);
  for (int64_t s = 0; s < W; ++s) {
    counts[s * E + 0] = 30;
    counts[s * E + 5] = 10;
  }
  // T = 160, mean 40, native loads: rank 0 120, rank 2 40 -> imbalance 3 > 1.3.
  LlepPlan p = plan_llep(counts, W, {1.0, 1.3, 4});
  check_plan(p, counts, {1.0, 1.3, 4});
  EXPECT_TRUE(p.spill);
  EXPECT_DOUBLE_EQ(p.imbalance, 3.0);
  EXPECT_EQ(p.soft_cap, 40);
  // Expert 0 (120 rows, taken first): its owner keeps 40; rank 2's effective load is its pending
  // expert 5 (40), so ranks 1 and 3 (0) take 40 each first, rank 2 gets nothing of it; expert 5
  // stays home.
  ASSERT_EQ(p.pieces[0].size(), 3u);
  EXPECT_EQ(p.pieces[0][0].rank, 0);
  EXPECT_EQ(p.pieces[0][0].end, 40);
  EXPECT_EQ(p.pieces[0][1].rank, 1);
  EXPECT_EQ(p.pieces[0][1].end, 80);
  EXPECT_EQ(p.pieces[0][2].rank, 3);
  EXPECT_EQ(p.pieces[0][2].end, 120);
  ASSERT_EQ(p.pieces[5].size(), 1u);
  EXPECT_EQ(p.pieces[5][0].rank, 2);
  EXPECT_EQ(p.rank_load, (std::vector<int64_t>{40, 40, 40, 40}));
  // Source-major row order: the owner keeps sources 0 and 1 (30 + 10 of source 1's rows).
  EXPECT_EQ(p.assignments[0].source, 0);
  EXPECT_EQ(p.assignments[0].rank, 0);
  EXPECT_EQ(p.assignments[1].source, 1);
  EXPECT_EQ(p.assignments[1].end, 10);
  EXPECT_EQ(p.assignments[2].rank, 1);
  const auto t = llep_transfers(p);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].expert, 0);
  EXPECT_EQ(t[0].helper, 1);
  EXPECT_EQ(t[1].helper, 3);
  // The same input gives the same plan.
  LlepPlan again = plan_llep(counts, W, {1.0, 1.3, 4});
  EXPECT_EQ(again.rank_load, p.rank_load);
  ASSERT_EQ(again.assignments.size(), p.assignments.size());
  for (size_t i = 0; i < p.assignments.size(); ++i) {
    EXPECT_EQ(again.assignments[i].rank, p.assignments[i].rank);
    EXPECT_EQ(again.assignments[i].end, p.assignments[i].end);
  }
}

TEST(LlepPlan, LambdaGate) {
  // W = 2, E = 2: native loads 13 and 10 (imbalance 26/23 = 1.13) and 16 and 10 (1.23).
  const LlepParams q{1.0, 1.2, 1};
  std::vector<int64_t> mild = {13, 10, 0, 0};
  std::vector<int64_t> hot = {16, 10, 0, 0};
  LlepPlan a = plan_llep(mild, 2, q), b = plan_llep(hot, 2, q);
  EXPECT_FALSE(a.spill);
  EXPECT_EQ(a.rank_load, (std::vector<int64_t>{13, 10}));
  EXPECT_TRUE(b.spill);
  EXPECT_EQ(b.rank_load, (std::vector<int64_t>{13, 13}));
  // The hard capacity overrides the gate: 13 rows do not fit a capacity of 12.
  LlepPlan c = plan_llep(mild, 2, q, 12);
  EXPECT_TRUE(c.spill);
  EXPECT_LE(c.max_rank_load(), 12);
}

TEST(LlepPlan, SmallSpillsWaitForTheRemainder) {
  // W = 4, E = 4: expert 0 has 100 rows, the others 20 each; cap = ceil(160 / 4) = 40.
  // Expert 0 keeps 40 on its owner; the helpers' effective loads are 20 each (their own expert
  // pending), room 20 each: with min_tokens_per_gemm = 25 none qualifies and the remainder of 60
  // is forced onto rank 1, past its soft cap.
  std::vector<int64_t> counts = {100, 20, 20, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  LlepPlan p = plan_llep(counts, 4, {1.0, 1.3, 25});
  check_plan(p, counts, {1.0, 1.3, 25});
  ASSERT_EQ(p.pieces[0].size(), 2u);
  EXPECT_EQ(p.pieces[0][1].rank, 1);
  EXPECT_EQ(p.pieces[0][1].end - p.pieces[0][1].begin, 60);
  EXPECT_EQ(p.forced_rows, 60);
  // With min_tokens_per_gemm = 20 the helpers take 20 each.
  LlepPlan q = plan_llep(counts, 4, {1.0, 1.3, 20});
  EXPECT_EQ(q.pieces[0].size(), 4u);
  EXPECT_EQ(q.forced_rows, 0);
  EXPECT_EQ(q.rank_load, (std::vector<int64_t>{40, 40, 40, 40}));
  // A hard capacity of 50 cuts the forced remainder: 50 on rank 1, 10 more on rank 2.
  LlepPlan r = plan_llep(counts, 4, {1.0, 1.3, 25}, 50);
  check_plan(r, counts, {1.0, 1.3, 25});
  EXPECT_LE(r.max_rank_load(), 50);
}

// Rows (buffers with H or F columns) of PipelinedLlepDispatch's backward, which is never below
// its forward, for S slots and T-row tiles: the header's list, in footprints.
// Backward's rows (the larger part) with S slots, T-row tiles and F blocks of Fb columns:
// staging [+ returned dx], S slots of x and dout, x, dout and dx tiles, a, b, g, dg blocks.
uint64_t pipelined_rows(uint64_t S, uint64_t T, uint64_t Fb, uint64_t Mc, uint64_t Rc, uint64_t H,
                        uint64_t b) {
  auto fp = [](uint64_t v) { return DeviceArena::footprint(v); };
  return (S == 2 ? 2 : 1) * fp(Mc * H * b) + 2 * S * fp(Rc * H * b) + 3 * fp(T * H * b) +
         4 * fp(T * Fb * b);
}

TEST(PipelinedLlepShape, SlotsAndTilesKeepTheDispatchUnderTheBound) {
  using schedules::PipelinedLlepParams;
  int64_t cases = 0, two_slots = 0, unbounded = 0, unbounded_near_w = 0;
  for (int64_t W : {2, 3, 4, 8, 16}) {
    for (int64_t k : {1, 2, 8}) {
      for (int64_t c : {4, 64, 205, 1024}) {
        for (int64_t H : {64, 256, 1024}) {
          for (int64_t F : {H / 2, 2 * H, 7 * H / 2}) {
            for (double alpha : {1.0, 1.5}) {
              for (double lambda : {1.0, 1.3, 2.0, W - 1.0, W - 0.5}) {
                if (std::max(alpha, lambda) > W - 0.5) continue;
                for (DType dtype : {DType::f32, DType::f64}) {
                  PipelinedLlepParams q;
                  q.chunk_tokens = c;
                  q.alpha = alpha;
                  q.lambda = lambda;
                  const int64_t N = 3 * c + 1;  // K = 4 chunks of c_eff = ceil(N / 4) <= c
                  const auto s = schedules::pipelined_llep_shape(N, k, H, F, dtype, W, q);
                  const std::string what =
                      "W=" + std::to_string(W) + " k=" + std::to_string(k) +
                      " c=" + std::to_string(c) + " H=" + std::to_string(H) +
                      " F=" + std::to_string(F) + " alpha=" + std::to_string(alpha) +
                      " lambda=" + std::to_string(lambda) + " " + std::string(dtype_name(dtype)) +
                      ": S=" + std::to_string(s.slots) + " T=" + std::to_string(s.tile_rows) +
                      " F_b=" + std::to_string(s.ffn_block);
                  ++cases;
                  const uint64_t Mc = s.rows_per_source, Rc = s.receive_rows, ce = s.chunk_tokens;
                  const uint64_t b = dtype_size(dtype), T = s.tile_rows, Fb = s.ffn_block;
                  const uint64_t budget = 2ull * W * Mc * H * b;
                  const uint64_t t_min = std::min<uint64_t>(ce, q.min_tokens_per_gemm);
                  const uint64_t f_min = std::min<uint64_t>(F, 64);
                  ASSERT_TRUE(s.slots == 1 || s.slots == 2) << what;
                  ASSERT_GE(s.tile_rows, 1) << what;
                  ASSERT_LE(s.tile_rows, s.chunk_tokens) << what;
                  // F in ffn_blocks equal blocks of ffn_block columns (the last one may be
                  // narrower), none empty.
                  ASSERT_GE(s.ffn_blocks, 1) << what;
                  EXPECT_EQ(s.ffn_block, (F + s.ffn_blocks - 1) / s.ffn_blocks) << what;
                  EXPECT_GT(F, (s.ffn_blocks - 1) * s.ffn_block) << what;
                  auto fits = [&](uint64_t S, uint64_t t, uint64_t f) {
                    return pipelined_rows(S, t, f, Mc, Rc, H, b) <= budget;
                  };
                  // The widest block beside T-row tiles (at least `lo` columns, which fit).
                  auto widest = [&](uint64_t S, uint64_t t, uint64_t lo) {
                    uint64_t f = lo;
                    while (f < static_cast<uint64_t>(F) && fits(S, t, f + 1)) ++f;
                    return f;
                  };
                  // 1/T + 1/F_b with F cut into equal blocks of at most f columns.
                  auto cost = [&](uint64_t t, uint64_t f) {
                    const uint64_t blocks = (F + f - 1) / f;
                    return 1.0 / t + 1.0 / ((F + blocks - 1) / blocks);
                  };
                  EXPECT_EQ(s.slots == 2, fits(2, t_min, f_min)) << what;
                  EXPECT_EQ(s.bounded, s.slots == 2 || fits(1, 1, 1)) << what;
                  if (s.bounded) {
                    EXPECT_TRUE(fits(s.slots, T, Fb)) << what;
                    if (s.slots == 2) {
                      EXPECT_GE(T, t_min) << what;
                    }
                    // Fb is the widest block at T, cut into equal blocks; and no pair at the
                    // ends of T's range (the largest T, and T_min or 1) costs less.
                    const uint64_t f_lo = fits(s.slots, 1, f_min) ? f_min : 1;
                    const uint64_t f_at_t = widest(s.slots, T, f_lo);
                    EXPECT_EQ(static_cast<uint64_t>(s.ffn_blocks), (F + f_at_t - 1) / f_at_t)
                        << what << ": F_b not the widest block at T";
                    uint64_t t_hi = 1;
                    while (t_hi < ce && fits(s.slots, t_hi + 1, f_lo)) ++t_hi;
                    const uint64_t t_lo = s.slots == 2 ? t_min : 1;
                    for (uint64_t t : {t_hi, t_lo}) {
                      EXPECT_LE(cost(T, f_at_t), cost(t, widest(s.slots, t, f_lo)) + 1e-12)
                          << what << ": T = " << t << " costs less";
                    }
                  } else {
                    // Over the bound: the cheapest pair whose rows stay within one U of the
                    // least overshoot (T_min-row tiles, F_min-column blocks).
                    EXPECT_EQ(s.slots, 1) << what;
                    const uint64_t allowed =
                        pipelined_rows(1, t_min, f_min, Mc, Rc, H, b) + Mc * H * b;
                    auto ok = [&](uint64_t t, uint64_t f) {
                      return pipelined_rows(1, t, f, Mc, Rc, H, b) <= allowed;
                    };
                    auto widest_ok = [&](uint64_t t) {
                      uint64_t f = f_min;
                      while (f < static_cast<uint64_t>(F) && ok(t, f + 1)) ++f;
                      return f;
                    };
                    EXPECT_TRUE(ok(T, Fb)) << what;
                    EXPECT_GE(T, t_min) << what;
                    const uint64_t f_at_t = widest_ok(T);
                    EXPECT_EQ(static_cast<uint64_t>(s.ffn_blocks), (F + f_at_t - 1) / f_at_t)
                        << what << ": F_b not the widest block at T";
                    uint64_t t_hi = t_min;
                    while (t_hi < ce && ok(t_hi + 1, f_min)) ++t_hi;
                    for (uint64_t t : {t_hi, t_min}) {
                      EXPECT_LE(cost(T, f_at_t), cost(t, widest_ok(t)) + 1e-12)
                          << what << ": T = " << t << " costs less";
                    }
                  }
                  // One slot with a one-row tile fits when 2 W U - U - 2 R_c H b (what is left
                  // beside the staging and the slot) covers the tile and the footprint rounding.
                  auto fp = [](uint64_t v) { return DeviceArena::footprint(v); };
                  const double left = (2.0 * W - 1) * Mc * H * b - 2.0 * Rc * H * b;
                  if (left >= 3 * 255 + 3 * fp(H * b) + 4 * fp(b)) {
                    EXPECT_TRUE(s.bounded) << what;
                  }
                  if (std::max(alpha, lambda) <= W - 1.0 && Mc >= 64) {
                    EXPECT_TRUE(s.bounded) << what;
                  }
                  // The bound and the dispatch bytes differ by backward's rows past 2 W M_c H b:
                  // both carry backward's metadata, and the peak is backward's.
                  const uint64_t bytes =
                      schedules::pipelined_llep_dispatch_bytes(N, k, H, F, dtype, W, q);
                  const uint64_t bound =
                      schedules::pipelined_llep_bound_bytes(N, k, H, F, dtype, W, q);
                  EXPECT_EQ(bytes,
                            schedules::pipelined_llep_backward_bytes(N, k, H, F, dtype, W, q));
                  EXPECT_LE(schedules::pipelined_llep_forward_bytes(N, k, H, F, dtype, W, q),
                            bytes);
                  const int64_t rows_over =
                      static_cast<int64_t>(pipelined_rows(s.slots, T, Fb, Mc, Rc, H, b)) -
                      static_cast<int64_t>(budget);
                  EXPECT_EQ(static_cast<int64_t>(bytes) - static_cast<int64_t>(bound), rows_over)
                      << what;
                  if (s.bounded) {
                    EXPECT_LE(bytes, bound) << what;
                  }
                  two_slots += s.slots == 2;
                  unbounded += !s.bounded;
                  unbounded_near_w += !s.bounded && std::max(alpha, lambda) > W - 1.0;
                }
              }
            }
          }
        }
      }
    }
  }
  std::printf(
      "%lld shapes: %lld with two slots, %lld over the bound: %lld with max(alpha, lambda) "
      "> W - 1, the rest with M_c < 64 rows\n",
      static_cast<long long>(cases), static_cast<long long>(two_slots),
      static_cast<long long>(unbounded), static_cast<long long>(unbounded_near_w));
  EXPECT_GT(two_slots, 0);
}

TEST(PipelinedLlepShape, DefaultsGiveOneSlotOnTwoAndThreeRanksAndTwoFromFour) {
  // The bench's shape (docs/perf.md): N = 2048 per rank, top-8, H = 256, F = 512, c = 205, f32;
  // and a Mixtral-like layer: top-2, H = 4096, F = 14336, c = 4096 (the default), N = 16384.
  schedules::PipelinedLlepParams bench;
  bench.chunk_tokens = 205;
  const schedules::PipelinedLlepParams mixtral;
  for (int64_t W : {1, 2, 3, 4, 8}) {
    const auto a = schedules::pipelined_llep_shape(2048, 8, 256, 512, DType::f32, W, bench);
    const auto m = schedules::pipelined_llep_shape(16384, 2, 4096, 14336, DType::f32, W, mixtral);
    std::printf("W=%lld: bench S=%lld T=%lld F_b=%lld%s; mixtral S=%lld T=%lld F_b=%lld%s\n",
                static_cast<long long>(W), static_cast<long long>(a.slots),
                static_cast<long long>(a.tile_rows), static_cast<long long>(a.ffn_block),
                a.bounded ? "" : " (over)", static_cast<long long>(m.slots),
                static_cast<long long>(m.tile_rows), static_cast<long long>(m.ffn_block),
                m.bounded ? "" : " (over)");
    for (const auto& s : {a, m}) {
      EXPECT_EQ(s.slots, W >= 4 ? 2 : 1) << "W=" << W;
      EXPECT_EQ(s.bounded, W > 1) << "W=" << W;  // one rank: R_c = M_c, backward needs 3 U > 2 U
    }
  }
  // One rank over the bound (R_c = M_c): the small preset's layer (N = 4096, top-2, H = 512,
  // F = 1024, one chunk) takes tiles far past T_min x F_min = 32 x 64, which cost a GPU a launch
  // per block (2.7 s a step on an H200, docs/perf.md), yet stays within one U of that overshoot.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const schedules::PipelinedLlepParams defaults;
    const auto s = schedules::pipelined_llep_shape(4096, 2, 512, 1024, dtype, 1, defaults);
    std::printf("small preset W=1 %s: S=%lld T=%lld F_b=%lld (%lld blocks)\n",
                std::string(dtype_name(dtype)).c_str(), static_cast<long long>(s.slots),
                static_cast<long long>(s.tile_rows), static_cast<long long>(s.ffn_block),
                static_cast<long long>(s.ffn_blocks));
    EXPECT_FALSE(s.bounded);
    EXPECT_GE(s.tile_rows * s.ffn_block, 16 * 32 * 64) << dtype_name(dtype);
  }
  // The bench at W = 4: c_eff = 205, M_c = 1640, R_c = 2132; 7.2 U of the 8 U are the
  // staging, landing and two slots of x and dout, the tiles get the rest, 0.8 U = 1312 rows of
  // H = 256: T (3 H + 4 F_b) <= 1312 H, best at T = 180 rows with F = 512 in 2 blocks of 256
  // (1/180 + 1/256; 205 rows leave F_b = 217 -> 3 blocks of 171, 1/205 + 1/171 is more).
  const auto a = schedules::pipelined_llep_shape(2048, 8, 256, 512, DType::f32, 4, bench);
  EXPECT_EQ(a.chunk_tokens, 205);
  EXPECT_EQ(a.receive_rows, 2132);
  EXPECT_EQ(a.tile_rows, 180);
  EXPECT_EQ(a.ffn_blocks, 2);
  EXPECT_EQ(a.ffn_block, 256);
  // The chunking-only overload leaves S, T and the F blocks unset.
  const auto c = schedules::pipelined_llep_shape(2048, 8, 4, bench);
  EXPECT_EQ(c.slots, 0);
  EXPECT_EQ(c.tile_rows, 0);
  EXPECT_EQ(c.ffn_blocks, 0);
  EXPECT_EQ(c.receive_rows, a.receive_rows);
}

TEST(LlepPlan, HelpedLimitIsTheLeastAlwaysFeasibleUnlessRaised) {
  using schedules::llep_helped_limit;
  EXPECT_EQ(llep_helped_limit(8, 8, {}), 2);   // E/W = 1: 1 + 1
  EXPECT_EQ(llep_helped_limit(8, 4, {}), 3);   // E/W = 2
  EXPECT_EQ(llep_helped_limit(8, 2, {}), 4);   // E/W + 1 = 5 > E - E/W = 4 foreign experts
  EXPECT_EQ(llep_helped_limit(64, 8, {}), 9);  // E/W = 8
  EXPECT_EQ(llep_helped_limit(8, 1, {}), 0);   // one rank: nothing is foreign
  LlepParams q;
  q.max_helped_experts = 5;
  EXPECT_EQ(llep_helped_limit(8, 4, q), 5);
  q.max_helped_experts = 100;
  EXPECT_EQ(llep_helped_limit(8, 4, q), 6);  // clamped to E - E/W
  q.max_helped_experts = 2;                  // below E/W + 1 = 3
  try {
    llep_helped_limit(8, 4, q);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("schedules.llep_max_helped_experts = 2"), std::string::npos)
        << e.message();
  }
  q.max_helped_experts = -1;
  EXPECT_THROW(llep_helped_limit(8, 4, q), Error);
}

TEST(LlepPlan, CapacityFillPlacesWhatTheLimitedLptCannot) {
  // W = 8, E = 8 (one expert each, H = 2), 6 rows per source, capacity 6 = T / W: every rank
  // must end exactly full. Expert loads 15 11 7 4 4 1 3 3. The LPT, with each helper allowed
  // two foreign experts, leaves a remainder no rank may take; the fill keeps experts 3..7 home
  // and pours 0, 1, 2 into the free rooms 6 6 6 2 2 5 3 3 in rank order.
  const int64_t W = 8, E = 8;
  const std::vector<int64_t> counts = {
      2, 1, 0, 1, 1, 0, 1, 0,  //
      3, 1, 1, 0, 0, 0, 0, 1,  //
      2, 3, 1, 0, 0, 0, 0, 0,  //
      3, 0, 1, 0, 0, 0, 1, 1,  //
      2, 1, 2, 0, 1, 0, 0, 0,  //
      0, 2, 1, 1, 1, 0, 1, 0,  //
      1, 2, 0, 1, 1, 0, 0, 1,  //
      2, 1, 1, 1, 0, 1, 0, 0,  //
  };
  const LlepParams q{1.0, 1.0, 1, 0};
  const LlepPlan p = plan_llep(counts, W, q, 6);
  check_plan(p, counts, q);
  ASSERT_TRUE(p.filled);
  EXPECT_EQ(p.rank_load, std::vector<int64_t>(8, 6));
  auto pieces = [&](int64_t e) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& x : p.pieces[e]) out.push_back({x.rank, x.begin, x.end});
    return out;
  };
  EXPECT_EQ(pieces(0), (std::vector<std::vector<int64_t>>{{0, 0, 6}, {1, 6, 12}, {2, 12, 15}}));
  EXPECT_EQ(pieces(1),
            (std::vector<std::vector<int64_t>>{{2, 0, 3}, {3, 3, 5}, {4, 5, 7}, {5, 7, 11}}));
  EXPECT_EQ(pieces(2), (std::vector<std::vector<int64_t>>{{5, 0, 1}, {6, 1, 4}, {7, 4, 7}}));
  for (int64_t e = 3; e < E; ++e) {
    EXPECT_EQ(pieces(e), (std::vector<std::vector<int64_t>>{{e, 0, p.expert_load[e]}}));
  }
  // With the limit lifted the LPT places it alone, with more copies on some rank.
  const LlepPlan free_plan = plan_llep(counts, W, {1.0, 1.0, 1, E}, 6);
  check_plan(free_plan, counts, {1.0, 1.0, 1, E});
  EXPECT_FALSE(free_plan.filled);
}

TEST(LlepPlan, ExpertsAlreadyHelpedDoNotCountAgainstTheLimit) {
  // W = 4, E = 4 (H = 2). Every source routes 10 rows to each of experts 0, 1, 2: T = 120, soft
  // cap 30, and each owner keeps 30 and spills 10. Unlimited, rank 3 takes all three spills;
  // with H = 2 it takes two and the third goes past the soft cap onto a rank that may help.
  const int64_t W = 4, E = 4;
  std::vector<int64_t> counts(W * E, 0);
  for (int64_t s = 0; s < W; ++s) {
    for (int64_t e = 0; e < 3; ++e) counts[s * E + e] = 10;
  }
  const LlepParams q{1.0, 1.3, 1, 0};
  const LlepPlan unlimited = plan_llep(counts, W, {1.0, 1.3, 1, E});
  EXPECT_EQ(unlimited.rank_load, (std::vector<int64_t>{30, 30, 30, 30}));
  const LlepPlan first = plan_llep(counts, W, q);
  check_plan(first, counts, q);
  EXPECT_EQ(first.helped_limit, 2);
  EXPECT_GT(first.forced_rows, 0);
  EXPECT_EQ(first.rank_load[3], 20);
  std::vector<uint8_t> helped(static_cast<size_t>(W * E), 0);
  schedules::llep_mark_helped(first, helped);
  for (const auto& t : llep_transfers(first)) EXPECT_EQ(helped[t.helper * E + t.expert], 1);
  // A later chunk that may reuse every copy: the limit no longer binds, the plan is the
  // unlimited one.
  std::vector<uint8_t> all(static_cast<size_t>(W * E), 0);
  for (int64_t g = 0; g < W; ++g) {
    for (int64_t e = 0; e < E; ++e) all[g * E + e] = e != g;
  }
  const LlepPlan with_all = plan_llep(counts, W, q, kNoCapacity, all);
  EXPECT_EQ(with_all.rank_load, unlimited.rank_load);
  ASSERT_EQ(with_all.assignments.size(), unlimited.assignments.size());
  for (size_t i = 0; i < with_all.assignments.size(); ++i) {
    EXPECT_EQ(with_all.assignments[i].rank, unlimited.assignments[i].rank);
    EXPECT_EQ(with_all.assignments[i].end, unlimited.assignments[i].end);
  }
  // New experts per rank stay within H for random already-helped sets.
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> some(static_cast<size_t>(W * E), 0);
    for (auto& f : some) f = rng() % 3 == 0;
    const std::vector<int64_t> c = draw_counts(rng, W, E, 30, 2, Skew::zipf);
    const int64_t cap = llep_receive_capacity(60, W, q);
    const LlepPlan p = plan_llep(c, W, q, cap, some);
    std::vector<int64_t> fresh(W, 0);
    for (const auto& t : llep_transfers(p)) fresh[t.helper] += !some[t.helper * E + t.expert];
    for (int64_t g = 0; g < W; ++g) EXPECT_LE(fresh[g], p.helped_limit) << "trial " << trial;
    EXPECT_LE(p.max_rank_load(), cap);
  }
  EXPECT_THROW(plan_llep(counts, W, q, kNoCapacity, std::vector<uint8_t>(3, 0)), Error);
}

TEST(LlepPlan, Errors) {
  std::vector<int64_t> counts = {1, 2, 3, 4, 5, 6};
  EXPECT_THROW(plan_llep(counts, 4, {}), Error);  // 6 counts for 4 ranks
  EXPECT_THROW(plan_llep(counts, 2, {}), Error);  // E = 3 not a multiple of W = 2
  std::vector<int64_t> neg = {1, -1, 0, 0};
  EXPECT_THROW(plan_llep(neg, 2, {}), Error);
  std::vector<int64_t> ok = {10, 10, 10, 10};
  EXPECT_THROW(plan_llep(ok, 2, {0.0, 1.3, 1}), Error);  // alpha
  EXPECT_THROW(plan_llep(ok, 2, {}, 19), Error);         // 2 * 19 < 40 rows
  EXPECT_NO_THROW(plan_llep(ok, 2, {}, 20));
  try {
    plan_llep(counts, 2, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("E = 3"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace moepeak
