// The row layout of one LLEP exchange on one rank (host metadata): which of this rank's routed
// rows go to which compute rank in which order, and what arrives here from whom. Shared by
// LlepDispatch (one exchange for the whole batch) and PipelinedLlepDispatch (one per chunk).
//
//   tokens      this exchange's local token positions, ascending (all N, or one chunk's)
//   host_index  (N, k) i32 top-k expert ids of every local token
//   plan        the exchange's LlepPlan (llep_plan.h) over the all-gathered counts
//
// Send order (source side): destination rank, then expert, then token — each (destination,
// expert) block holds the assigned rows in token order. The returned rows come back in the same
// order, so the source combines them in place; `combine_ranges` lists the send order's rows
// expert by expert (adjacent ranges merged), and combining (or scatter-adding) range by range
// adds each token's k contributions in increasing expert id — the order of the standard
// dispatchers, whose send order is expert-major (a token has at most one row per expert).
//
// Arrival order (compute side): source rank, then expert, then the source's send order, in
// `blocks` of one (source, expert) each. Every row of a block runs the same expert.
//
// Test: through tests/parallel/test_llep.cpp (every layout is exercised against the standard
// dispatcher's results).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/schedules/llep_plan.h"

namespace moepeak::schedules {

struct LlepRoute {
  struct Range {
    int64_t begin = 0, end = 0;
  };
  struct Block {
    int64_t begin = 0, rows = 0, expert = 0, source = 0;
  };
  // Source side, send order.
  std::vector<int32_t> send_token;    // (m) local token position of each sent row
  std::vector<int32_t> send_slot;     // (m) its (token, choice) slot n * k + j
  std::vector<int64_t> send_rows;     // (W) rows to each rank (this rank included)
  std::vector<Range> combine_ranges;  // send-order rows, expert by expert
  // Compute side, arrival order.
  std::vector<int64_t> recv_rows;  // (W) rows from each rank
  std::vector<Block> blocks;       // non-empty (source, expert) blocks in arrival order

  int64_t sent() const { return static_cast<int64_t>(send_token.size()); }
  int64_t received() const;
};

// Builds this rank's layout. Throws moepeak::Error when this rank's rows per expert disagree with
// the plan's counts for it (the plan was made from other counts).
LlepRoute make_llep_route(const LlepPlan& plan, int64_t rank, std::span<const int64_t> tokens,
                          std::span<const int32_t> host_index, int64_t top_k);

}  // namespace moepeak::schedules
