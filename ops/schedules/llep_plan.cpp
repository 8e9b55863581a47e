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

int64_t llep_helped_limit(int64_t num_experts, int64_t world, const LlepParams& params) {
  MOEPEAK_CHECK(world >= 1 && num_experts >= world && num_experts % world == 0,
                "llep_helped_limit: E = ", num_experts, " experts on W = ", world, " ranks");
  const int64_t local = num_experts / world, foreign = num_experts - local;
  const int64_t least = std::min(foreign, local + 1);
  const int64_t asked = params.max_helped_experts;
  MOEPEAK_CHECK(asked == 0 || asked >= least, "schedules.llep_max_helped_experts = ", asked,
                ": with E = ", num_experts, " experts on W = ", world,
                " ranks a routing may need pieces of ", least,
                " foreign experts on one rank to fit the receive capacity (E/W + 1); use 0 for "
                "that least value or a larger one");
  return asked == 0 ? least : std::min(asked, foreign);
}

int64_t LlepPlan::max_rank_load() const {
  return rank_load.empty() ? 0 : *std::max_element(rank_load.begin(), rank_load.end());
}

namespace {

// Appends rows [begin, begin + rows) of expert e on rank g to its pieces (merging with the last
// piece when contiguous on the same rank).
void add_piece(std::vector<LlepPiece>& pieces, int64_t g, int64_t begin, int64_t rows) {
  if (!pieces.empty() && pieces.back().rank == g && pieces.back().end == begin) {
    pieces.back().end += rows;
  } else {
    pieces.push_back({g, begin, begin + rows});
  }
}

// The capacity fill (see the header): every rank keeps its smallest experts while they fit
// under the capacity, the rest are poured into the ranks' free room in rank order.
void plan_fill(LlepPlan& p) {
  const int64_t W = p.world, El = p.experts_per_rank(), R = p.capacity;
  for (auto& pieces : p.pieces) pieces.clear();
  p.rank_load.assign(static_cast<size_t>(W), 0);
  std::vector<int64_t> poured;  // spilled experts, owner order
  for (int64_t o = 0; o < W; ++o) {
    std::vector<int64_t> mine(static_cast<size_t>(El));
    std::iota(mine.begin(), mine.end(), o * El);
    std::stable_sort(mine.begin(), mine.end(),
                     [&](int64_t a, int64_t b) { return p.expert_load[a] < p.expert_load[b]; });
    size_t kept = 0;
    while (kept < mine.size() && p.rank_load[o] + p.expert_load[mine[kept]] <= R) {
      const int64_t e = mine[kept++];
      if (p.expert_load[e] > 0) add_piece(p.pieces[e], o, 0, p.expert_load[e]);
      p.rank_load[o] += p.expert_load[e];
    }
    poured.insert(poured.end(), mine.begin() + static_cast<std::ptrdiff_t>(kept), mine.end());
  }
  std::sort(poured.begin(), poured.end());
  int64_t g = 0;
  for (int64_t e : poured) {
    for (int64_t at = 0; at < p.expert_load[e];) {
      while (g < W && p.rank_load[g] == R) ++g;
      MOEPEAK_CHECK(g < W, "llep plan: no room left for expert ", e, " (W x capacity < T)");
      const int64_t rows = std::min(p.expert_load[e] - at, R - p.rank_load[g]);
      add_piece(p.pieces[e], g, at, rows);
      p.rank_load[g] += rows;
      at += rows;
    }
  }
  p.forced_rows = 0;
  for (int64_t load : p.rank_load) p.forced_rows += std::max<int64_t>(0, load - p.soft_cap);
  p.filled = true;
}

// The LPT spill path: pieces of every expert, rank loads, forced rows. False when the
// helped-expert limit leaves a remainder no rank may take (the caller then fills).
bool plan_spill(LlepPlan& p, const LlepParams& params, std::span<const uint8_t> already) {
  const int64_t W = p.world, E = p.num_experts, El = p.experts_per_rank();
  // helps[g * E + e]: g holds pieces of foreign expert e in this plan; fresh[g]: how many of
  // them are new (not in `already`).
  std::vector<uint8_t> helps(static_cast<size_t>(W * E), 0);
  std::vector<int64_t> fresh(static_cast<size_t>(W), 0);
  auto may_help = [&](int64_t g, int64_t e) {
    const size_t at = static_cast<size_t>(g * E + e);
    return helps[at] || (!already.empty() && already[at]) || fresh[g] < p.helped_limit;
  };
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
      add_piece(pieces, g, begin, rows);
      const size_t at = static_cast<size_t>(g * E + e);
      if (g != o && !helps[at]) {
        helps[at] = 1;
        if (already.empty() || !already[at]) ++fresh[g];
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
        if (r <= 0 || !may_help(g, e)) continue;
        const int64_t piece = std::min(rem, r);
        if (piece < min_piece && piece < rem) continue;  // too small to be worth a GEMM
        chosen = g;
        rows = piece;
        break;
      }
      if (chosen < 0) {
        // Every helper with room offers less than min_tokens_per_gemm (or is at its helped
        // limit): the least-loaded one that may help takes the remainder past its soft cap, up
        // to its hard cap.
        for (int64_t g : helpers) {
          if (hard_room(g) > 0 && may_help(g, e)) {
            chosen = g;
            rows = std::min(rem, hard_room(g));
            break;
          }
        }
        if (chosen < 0) {  // one rank, or every helper full or at its limit: the owner
          if (hard_room(o) <= 0) return false;
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
  return true;
}

}  // namespace

LlepPlan plan_llep(std::span<const int64_t> counts, int64_t world, const LlepParams& params,
                   int64_t capacity, std::span<const uint8_t> already_helped) {
  MOEPEAK_CHECK(world > 0 && !counts.empty() && counts.size() % static_cast<size_t>(world) == 0,
                "llep plan: ", counts.size(), " counts for W = ", world, " ranks (W x E expected)");
  const int64_t W = world, E = static_cast<int64_t>(counts.size()) / world;
  MOEPEAK_CHECK(E % W == 0, "llep plan: E = ", E, " experts is not a multiple of W = ", W);
  MOEPEAK_CHECK(params.alpha > 0, "llep plan: alpha = ", params.alpha, " (> 0 expected)");
  MOEPEAK_CHECK(params.min_tokens_per_gemm >= 0,
                "llep plan: min_tokens_per_gemm = ", params.min_tokens_per_gemm,
                " (>= 0 expected)");
  MOEPEAK_CHECK(capacity >= 1, "llep plan: capacity ", capacity, " (>= 1 expected)");
  MOEPEAK_CHECK(already_helped.empty() || already_helped.size() == counts.size(),
                "llep plan: ", already_helped.size(), " helped flags for W x E = ", counts.size());
  LlepPlan p;
  p.helped_limit = llep_helped_limit(E, W, params);
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
    if (!plan_spill(p, params, already_helped)) {
      MOEPEAK_CHECK(capacity != kNoCapacity, "llep plan: no rank may take expert rows");
      plan_fill(p);
    }
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

void llep_mark_helped(const LlepPlan& plan, std::vector<uint8_t>& helped) {
  const int64_t E = plan.num_experts;
  MOEPEAK_CHECK(helped.size() == static_cast<size_t>(plan.world * E),
                "llep_mark_helped: ", helped.size(), " flags for W x E = ", plan.world * E);
  for (int64_t e = 0; e < E; ++e) {
    for (const LlepPiece& piece : plan.pieces[e]) {
      if (piece.rank != plan.owner(e) && piece.end > piece.begin) {
        helped[static_cast<size_t>(piece.rank * E + e)] = 1;
      }
    }
  }
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
