// The least-loaded expert-parallel (LLEP) planner (arXiv 2601.17111; docs/design.md#the-schedules):
// a pure function from the job's routed-row counts to which rank computes which rows. It never
// changes a routing decision — every (token, expert) row is computed by *some* rank with that
// expert's weights; the plan only chooses the rank.
//
//   counts  (W, E) row-major int64: counts[s * E + e] = rows source rank s routes to expert e
//   plan    for every expert, its global rows [0, L_e) (source-major: source 0's rows in its
//           token order, then source 1's, ...) cut into pieces, each computed by one rank; and
//           the same as per-(expert, source) row ranges (`assignments`), which is what the
//           dispatchers send
//
// Algorithm (the reference's LPT with weight spilling, restated):
//   - expert e is owned by rank e / (E/W); a rank's native load is the rows of its experts;
//   - gate: when max/mean native load <= lambda (and no native load exceeds the hard
//     capacity), every expert stays on its owner — the plain expert-parallel layout;
//   - otherwise experts are taken largest first (ties: lower id first). Each rank has a soft cap
//     of ceil(alpha * T / W) rows (T = all routed rows). A rank's *effective* load is what it was
//     assigned so far plus its native experts not yet taken, so a helper is not picked when its
//     own experts will fill it. The owner keeps what fits under the cap; the rest spills to the
//     other ranks in order of effective load (ties: lower rank), each helper taking as much as
//     fits. A spill piece smaller than min_tokens_per_gemm is skipped unless it is the expert's
//     remainder; if every helper with room offers only such pieces the remainder is forced onto
//     the least-loaded helper past its soft cap (`forced_rows` counts them);
//   - `capacity` is a hard cap no rank may exceed (the receive buffers of a receiver-bounded
//     schedule): forced pieces are cut at it, and the gate is overridden when a native load
//     would exceed it. Feasible whenever W * capacity >= T (checked);
//   - the helped-expert limit H (llep_helped_limit): a rank may take pieces of at most H foreign
//     experts it does not already help (`already_helped`, the earlier chunk plans of a pass),
//     so the weight copies a rank receives are fixed at launch. A helper at its limit is passed
//     over; when no helper may take a remainder it stays on its owner, past the soft cap, up to
//     the hard cap. If even the owner is full the plan is redone by the capacity fill (below).
//
// The capacity fill (`filled`), which is feasible whenever W * capacity >= T and puts at most
// E/W + 1 foreign experts on any rank: each rank keeps its smallest experts whole while they
// fit under the capacity R; the rest of its experts are spilled whole, and the spilled experts
// are poured, in owner order, into the ranks' free room R - kept (rank order), each rank filled
// before the next. Why E/W + 1: a spilled expert of rank o is at least as large as x, the
// smallest one o could not keep, and x > R / E/W (o's kept experts, each <= x, plus x exceed R);
// a rank's share of the pour is one contiguous run of <= R rows, whose whole experts are each
// > R / (E/W), so fewer than E/W of them, plus the two cut at the run's ends. Near the least
// any rule can promise: with W - 1 ranks each routed R + R / (W - 1) rows over E/W equal
// experts and one rank routed none, every rank ends exactly full and the empty one holds R rows
// of experts of W R / ((W - 1) E/W) rows each: pieces of at least (W - 1)(E/W) / W experts.
//
// NOTES: the plan is a deterministic function of (counts, W, params, capacity, already_helped):
// every rank
// computes the same plan from the same all-gathered counts, with no communication. Helpers of
// a spilled expert receive a copy of its weights and return their weight gradients to the owner.
//
// Test: ctest -R test_llep_plan (tests/ops/test_llep_plan.cpp: the invariants on balanced,
// Zipf-skewed and adversarial counts).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace moepeak::schedules {

// LLEP's knobs (the [schedules] llep_alpha, llep_lambda, min_tokens_per_gemm).
struct LlepParams {
  double alpha = 1.0;                // soft cap per rank: ceil(alpha * T / W) rows
  double lambda = 1.3;               // spill only when max/mean native load > lambda
  int64_t min_tokens_per_gemm = 32;  // smallest spill piece, unless it is the remainder
  // New foreign experts a rank may help with in one plan (schedules.llep_max_helped_experts);
  // 0 = the least that is always feasible (llep_helped_limit).
  int64_t max_helped_experts = 0;
};

// The helped-expert limit H of plan_llep on W ranks with E experts (E/W per rank):
//   configured 0          -> min(E - E/W, E/W + 1)  (the capacity fill's bound, see above)
//   configured >= that    -> min(configured, E - E/W)
// Throws moepeak::Error (naming schedules.llep_max_helped_experts) for a configured value below
// min(E - E/W, E/W + 1), for which a routing may exist with no plan under a hard capacity, or
// a negative one.
int64_t llep_helped_limit(int64_t num_experts, int64_t world, const LlepParams& params);

inline constexpr int64_t kNoCapacity = std::numeric_limits<int64_t>::max();

// The receive capacity of a receiver-bounded exchange in which every one of W sources sends at
// most M = rows_per_source rows: the most rows any plan of plan_llep may put on one rank, given
// as its hard `capacity`. With T <= W * M routed rows,
//   R = min(W * M, max(M, ceil(alpha * M), floor(lambda * M)))
// covers the soft cap ceil(alpha * T / W) (<= ceil(alpha * M)), the gate's
// max native load <= lambda * T / W (<= floor(lambda * M)), and W * R >= T (R >= M) keeps the
// plan feasible; no rank can ever receive more than W * M. The dispatchers size their receive
// buffers with it and pass it to the planner, so the buffers and the plan cannot disagree.
int64_t llep_receive_capacity(int64_t rows_per_source, int64_t world, const LlepParams& params);

// Rows [begin, end) of an expert's global row order, computed by `rank`.
struct LlepPiece {
  int64_t rank = 0;
  int64_t begin = 0, end = 0;
};

// Rows [begin, end) of the rows `source` routes to `expert` (in the source's token order),
// computed by `rank`.
struct LlepAssignment {
  int64_t expert = 0, source = 0, rank = 0;
  int64_t begin = 0, end = 0;
};

struct LlepPlan {
  int64_t world = 0, num_experts = 0;
  int64_t total_rows = 0;            // T
  double imbalance = 1.0;            // max / mean native load (1 when T == 0)
  bool spill = false;                // the LPT path ran (imbalance > lambda or over capacity)
  int64_t soft_cap = 0;              // ceil(alpha * T / W)
  int64_t capacity = kNoCapacity;    // the hard cap given
  int64_t forced_rows = 0;           // rows forced past the soft cap (see above)
  int64_t helped_limit = 0;          // H, llep_helped_limit
  bool filled = false;               // the capacity fill made the plan (see above)
  std::vector<int64_t> expert_load;  // (E) L_e
  std::vector<int64_t> native_load;  // (W) rows of each rank's own experts
  std::vector<int64_t> rank_load;    // (W) rows each rank computes
  std::vector<std::vector<LlepPiece>> pieces;  // (E) tiling [0, L_e) in row order
  std::vector<LlepAssignment> assignments;     // by (expert, source, begin); non-empty ranges

  int64_t experts_per_rank() const { return num_experts / world; }
  int64_t owner(int64_t expert) const { return expert / experts_per_rank(); }
  int64_t max_rank_load() const;
};

// Plans one exchange. `already_helped` is empty or (W, E) row-major flags: rank g already holds
// a copy of expert e (an earlier plan of the same pass), so helping e again is not new. Throws
// moepeak::Error on E % W != 0, a negative count, counts of the wrong size, alpha <= 0, a
// negative min_tokens_per_gemm, capacity < 1, W * capacity < T, flags of the wrong size, or a
// helped-expert limit llep_helped_limit rejects.
LlepPlan plan_llep(std::span<const int64_t> counts, int64_t world, const LlepParams& params,
                   int64_t capacity = kNoCapacity, std::span<const uint8_t> already_helped = {});

// Marks in `helped` ((W, E) flags, as plan_llep's already_helped) every (helper, expert) of
// `plan` with rows on a rank that does not own the expert.
void llep_mark_helped(const LlepPlan& plan, std::vector<uint8_t>& helped);

// An expert's weights travelling owner -> helper (and its gradient back) for one plan: every
// (expert, helper != owner) pair with rows, sorted by (expert, helper). The same list on every
// rank; each rank takes part in the pairs that name it.
struct LlepTransfer {
  int64_t expert = 0, owner = 0, helper = 0;
};
std::vector<LlepTransfer> llep_transfers(const LlepPlan& plan);

}  // namespace moepeak::schedules
