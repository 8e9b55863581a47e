// LlepRoute: one rank's send and arrival layout for an LLEP plan (see llep_route.h).
// Test: through tests/parallel/test_llep.cpp
#include "ops/schedules/llep_route.h"

#include "core/error.h"

namespace moepeak::schedules {

int64_t LlepRoute::received() const {
  int64_t r = 0;
  for (int64_t v : recv_rows) r += v;
  return r;
}

LlepRoute make_llep_route(const LlepPlan& plan, int64_t rank, std::span<const int64_t> tokens,
                          std::span<const int32_t> host_index, int64_t top_k) {
  const int64_t W = plan.world, E = plan.num_experts;
  LlepRoute route;
  // This rank's rows per expert, token order: their slots n * k + j.
  std::vector<std::vector<int32_t>> rows_of(static_cast<size_t>(E));
  for (int64_t n : tokens) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = host_index[static_cast<size_t>(n * top_k + j)];
      rows_of[static_cast<size_t>(e)].push_back(static_cast<int32_t>(n * top_k + j));
    }
  }
  // Rows per (destination, expert) from this rank, and per (source, expert) to it.
  std::vector<int64_t> to(static_cast<size_t>(W * E), 0), from(static_cast<size_t>(W * E), 0);
  std::vector<int64_t> mine(static_cast<size_t>(E), 0);
  for (const LlepAssignment& a : plan.assignments) {
    const int64_t rows = a.end - a.begin;
    if (a.source == rank) {
      to[a.rank * E + a.expert] += rows;
      mine[a.expert] += rows;
    }
    if (a.rank == rank) from[a.source * E + a.expert] += rows;
  }
  for (int64_t e = 0; e < E; ++e) {
    MOEPEAK_CHECK(mine[e] == static_cast<int64_t>(rows_of[e].size()), "llep route: rank ", rank,
                  " has ", rows_of[e].size(), " rows for expert ", e, ", the plan ", mine[e]);
  }
  // Send order: destination, expert, token.
  route.send_rows.assign(static_cast<size_t>(W), 0);
  std::vector<int64_t> cursor(static_cast<size_t>(W * E), 0);
  int64_t at = 0;
  for (int64_t d = 0; d < W; ++d) {
    for (int64_t e = 0; e < E; ++e) {
      cursor[d * E + e] = at;
      at += to[d * E + e];
      route.send_rows[d] += to[d * E + e];
    }
  }
  route.send_token.resize(static_cast<size_t>(at));
  route.send_slot.resize(static_cast<size_t>(at));
  // Assignments are sorted by (expert, source, begin): each expert's pieces in row order.
  for (const LlepAssignment& a : plan.assignments) {
    if (a.source != rank) continue;
    int64_t& pos = cursor[a.rank * E + a.expert];
    const int64_t begin = pos;
    for (int64_t i = a.begin; i < a.end; ++i, ++pos) {
      const int32_t slot = rows_of[a.expert][static_cast<size_t>(i)];
      route.send_slot[pos] = slot;
      route.send_token[pos] = static_cast<int32_t>(slot / top_k);
    }
    if (!route.combine_ranges.empty() && route.combine_ranges.back().end == begin) {
      route.combine_ranges.back().end = pos;
    } else if (pos > begin) {
      route.combine_ranges.push_back({begin, pos});
    }
  }
  // Arrival order: source, expert.
  route.recv_rows.assign(static_cast<size_t>(W), 0);
  at = 0;
  for (int64_t s = 0; s < W; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = from[s * E + e];
      if (rows == 0) continue;
      route.blocks.push_back({at, rows, e, s});
      route.recv_rows[s] += rows;
      at += rows;
    }
  }
  return route;
}

}  // namespace moepeak::schedules
