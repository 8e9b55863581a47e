// The bracketing search of `moepeak bench reach`: the largest value (a seq_len, or a global
// batch) at which a probe — a real training run of a few steps — succeeds, seeded from the plan's
// prediction. Pure: the probe is a callback, so the search is tested against an oracle
// (tests/measure/test_reach_search.cpp) and the bench gives it real runs (cli/bench_reach.cpp).
//
//   ReachSearch s = search_reach({.planned = 1792, .step = 64, .max = 1 << 20},
//                                [&](int64_t v) { return probe(v).trained; });
//   s.limit;        // the largest value that trained (0: not even the lowest)
//   s.first_failed; // limit + step when the search bracketed it, which did not train
//
// The rule: every value is a multiple of `step` in [lowest, max] (lowest: the smallest value a
// run can be made at, `step` unless given). Probe the plan's value (rounded down to a step, at
// least the lowest); going up from a success, and down from a failure, by a factor of 1.25 (at
// least one step) until the other outcome, or the bound (`max`, or the lowest) is reached; then
// halve the bracket down to one step. Memory grows with the value, so what trains at v is taken to
// train below v: the result is two probes seen, `limit` trained and `first_failed` = limit + step
// did not (unless `max` trained, or the lowest did not).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace moepeak::measure {

struct ReachSearchInputs {
  int64_t planned = 0;  // the plan's limit (0: none fits by the plan)
  int64_t step = 1;     // granularity: every probed value is a multiple of it
  int64_t max = 0;      // no probe above it (> 0)
  int64_t lowest = 0;   // no probe below it: a multiple of step (0: step)
};

struct ReachProbe {
  int64_t value = 0;
  bool trained = false;
};

struct ReachSearch {
  int64_t limit = 0;               // the largest value that trained (0: none did)
  int64_t first_failed = 0;        // the smallest value seen to fail (0: none failed up to `max`)
  std::vector<ReachProbe> probes;  // in the order run
};

// Throws moepeak::Error for a step < 1, max < step, or a lowest that is not a multiple of step in
// [step, max].
ReachSearch search_reach(const ReachSearchInputs& in,
                         const std::function<bool(int64_t value)>& trains);

}  // namespace moepeak::measure
