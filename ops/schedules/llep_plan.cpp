// The LLEP planner (see llep_plan.h): gate, LPT order, soft and hard caps, min_tokens_per_gemm.
// Test: ctest -R test_llep_plan
#include "ops/schedules/llep_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace moepeak::schedules {

int64_t llep_receive_capacity(int64_t rows_per_source, int64_t world, const LlepParams& params) {
  MOEPEAK_CHECK(rows_per_source >= 0 && world >= 1, "llep_receive_capacity: ", rows_per_source,
                " rows per source on ", world, " ranks");
  const double M = static_cast<double>(rows_per_source);
  const int64_t soft = static_cast<int64_t>(std::ceil(params.alpha * M));
  const int64_t gate = static_cast<int64_t>(std::floor(params.lambda * M));
  return std::min(world * rows_per_source, std::max({rows_per_source, soft, gate}));
}

int64_t LlepPlan::max_rank_load() const {
  return rank_load.empty() ? 0 : *std::max_element(rank_load.begin(), rank_load.end());
}

namespace {

// The LPT spill path: pieces of every expert, rank loads, forced rows.
void plan_spill(LlepPlan& p, const LlepParams& params) {
  const int64_t W = p.world, E = p.num_experts, El = p.experts_per_rank();
  const int64_t min_piece = std::max<int64_t>(params.min_tokens_per_gemm, 1);
  std::vector<int64_t> pending = p.native_load, assigned(static_cast<size_t>(W), 0);
  auto eff = [&](int64_t g) { return assigned[g] + pending[g]; };
  // Room under the soft cap (effective load) and under the hard cap (what is really assigned).
  auto room = [&](int64_t g) { return std::min(p.soft_cap - eff(g), p.capacity - assigned[g]); };
  auto hard_room = [&](int64_t g) { return p.capacity - assigned[g]; };

  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return p.expert_load[a] > p.expert_load[b]; });
  std::vector<int64_t> helpers;
  for (int64_t e : order) {
    const int64_t L = p.expert_load[e];
    if (L == 0) continue;
    const int64_t o = e / El;
    pending[o] -= L;
    std::vector<LlepPiece>& pieces = p.pieces[e];
    auto give = [&](int64_t g, int64_t begin, int64_t rows) {
      assigned[g] += rows;
      if (!pieces.empty() && pieces.back().rank == g && pieces.back().end == begin) {
        pieces.back().end += rows;
      } else {
        pieces.push_back({g, begin, begin + rows});
      }
    };
    int64_t at = std::clamp<int64_t>(room(o), 0, L);
    if (at > 0) give(o, 0, at);
    while (at < L) {
      const int64_t rem = L - at;
      helpers.clear();
      for (int64_t g = 0; g < W; ++g) {
        if (g != o) helpers.push_back(g);
      }
      std::stable_sort(helpers.begin(), helpers.end(),
                       [&](int64_t a, int64_t b) { return eff(a) < eff(b); });
      int64_t chosen = -1, rows = 0;
      for (int64_t g : helpers) {
        const int64_t r = room(g);
        if (r <= 0) continue;
        const int64_t piece = std::min(rem, r);
        if (piece < min_piece && piece < rem) continue;  // too small to be worth a GEMM
        chosen = g;
        rows = piece;
        break;
      }
      if (chosen < 0) {
        // Every helper with room offers less than min_tokens_per_gemm: the least-loaded one
        // takes the remainder past its soft cap, up to its hard cap.
        for (int64_t g : helpers) {
          if (hard_room(g) > 0) {
            chosen = g;
            rows = std::min(rem, hard_room(g));
            break;
          }
        }
        if (chosen < 0) {  // one rank, or every helper at its hard cap: the owner, up to its own
          MOEPEAK_CHECK(hard_room(o) > 0, "llep plan: no rank has room for ", rem,
                        " rows of expert ", e, " (capacity ", p.capacity, ")");
          chosen = o;
          rows = std::min(rem, hard_room(o));
        }
        p.forced_rows += rows;
      }
      give(chosen, at, rows);
      at += rows;
    }
  }
  p.rank_load = assigned;
}

}  // namespace

LlepPlan plan_llep(std::span<const int64_t> counts, int64_t world, const LlepParams& params,
                   int64_t capacity) {
  MOEPEAK_CHECK(world > 0 && !counts.empty() && counts.size() % static_cast<size_t>(world) == 0,
                "llep plan: ", counts.size(), " counts for W = ", world, " ranks (W x E expected)");
  const int64_t W = world, E = static_cast<int64_t>(counts.size()) / world;
  MOEPEAK_CHECK(E % W == 0, "llep plan: E = ", E, " experts is not a multiple of W = ", W);
  MOEPEAK_CHECK(params.alpha > 0, "llep plan: alpha = ", params.alpha, " (> 0 expected)");
  MOEPEAK_CHECK(params.min_tokens_per_gemm >= 0,
                "llep plan: min_tokens_per_gemm = ", params.min_tokens_per_gemm,
                " (>= 0 expected)");
  MOEPEAK_CHECK(capacity >= 1, "llep plan: capacity ", capacity, " (>= 1 expected)");
  LlepPlan p;
  p.world = W;
  p.num_experts = E;
  p.capacity = capacity;
  p.expert_load.assign(static_cast<size_t>(E), 0);
  p.native_load.assign(static_cast<size_t>(W), 0);
  p.pieces.assign(static_cast<size_t>(E), {});
  const int64_t El = E / W;
  for (int64_t s = 0; s < W; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t c = counts[static_cast<size_t>(s * E + e)];
      MOEPEAK_CHECK(c >= 0, "llep plan: negative count ", c, " (source ", s, ", expert ", e, ")");
      p.expert_load[e] += c;
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    p.native_load[e / El] += p.expert_load[e];
    p.total_rows += p.expert_load[e];
  }
  const int64_t T = p.total_rows;
  MOEPEAK_CHECK(capacity == kNoCapacity || capacity >= (T + W - 1) / W, "llep plan: capacity ",
                capacity, " rows per rank cannot hold T = ", T, " rows on W = ", W, " ranks");
  const int64_t max_native = *std::max_element(p.native_load.begin(), p.native_load.end());
  const double mean = static_cast<double>(T) / static_cast<double>(W);
  p.imbalance = T > 0 ? static_cast<double>(max_native) / mean : 1.0;
  p.soft_cap = T > 0 ? std::max<int64_t>(
                           1, static_cast<int64_t>(std::ceil(params.alpha * static_cast<double>(T) /
                                                             static_cast<double>(W))))
                     : 0;
  p.spill = T > 0 && (p.imbalance > params.lambda || max_native > capacity);
  if (p.spill) {
    plan_spill(p, params);
  } else {
    p.rank_load = p.native_load;
    for (int64_t e = 0; e < E; ++e) {
      if (p.expert_load[e] > 0) p.pieces[e].push_back({e / El, 0, p.expert_load[e]});
    }
  }

  // Per (expert, source): source s's rows of e are [off, off + c) of e's global order.
  for (int64_t e = 0; e < E; ++e) {
    int64_t off = 0;
    for (int64_t s = 0; s < W; ++s) {
      const int64_t c = counts[static_cast<size_t>(s * E + e)];
      for (const LlepPiece& piece : p.pieces[e]) {
        const int64_t b = std::max(piece.begin, off), en = std::min(piece.end, off + c);
        if (b < en) p.assignments.push_back({e, s, piece.rank, b - off, en - off});
      }
      off += c;
    }
  }
  return p;
}

std::vector<LlepTransfer> llep_transfers(const LlepPlan& plan) {
  std::vector<LlepTransfer> out;
  for (int64_t e = 0; e < plan.num_experts; ++e) {
    const int64_t o = plan.owner(e);
    std::vector<int64_t> helpers;
    for (const LlepPiece& piece : plan.pieces[e]) {
      if (piece.rank != o && piece.end > piece.begin) helpers.push_back(piece.rank);
    }
    std::sort(helpers.begin(), helpers.end());
    helpers.erase(std::unique(helpers.begin(), helpers.end()), helpers.end());
    for (int64_t h : helpers) out.push_back({e, o, h});
  }
  return out;
}

}  // namespace moepeak::schedules
