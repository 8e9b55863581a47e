// `moepeak tune`'s selection rules (docs/tune.md): pure functions from measured points to the
// chosen one, no measurement and no plan inside (the caller measures each point and asks the plan
// whether the point's config fits, and passes both in), so they are tested on synthetic curves.
//
//   std::vector<DispatchPoint> pts = ...;           // one per (c, K_max), median times measured
//   const Choice c = select_chunk(pts, 0.03);       // index of the chosen point + why, in words
//
// The rules (thresholds are arguments; `moepeak tune` passes the documented defaults):
//   chunk     the smallest effective chunk c_eff (then the smallest dispatch peak) among the points
//             the plan accepts whose median time is within `tolerance` (3%) of the fastest point
//             the plan accepts;
//   staging   the smallest staging bytes (s * beta, as adamw_offload_stream_bytes counts them)
//             among the points the plan accepts whose median time is within `tolerance` (5%) of
//             the fastest point the plan accepts (ties: fewer slots, then the smaller bucket);
//   payload   the Ring-DTP payload with the smaller median time among its points with no strips
//             kept that the plan accepts (ties: the one ring_dtp_resolve_payload would pick,
//             passed as `preferred`);
//   kept      the fewest strips kept from forward to backward among that payload's points the
//             plan accepts whose median time is within `tolerance` (3%) of the fastest of them;
//   sco       the most offloaded layers |S| among the points the plan accepts whose overhead over
//             the standard schedule's median time is within `tolerance` (3%) (ties: the smaller
//             host budget).
// Only measured points are considered — nothing is interpolated or extrapolated. When no point
// qualifies each rule throws moepeak::Error naming the constraint that excluded them and the
// numbers ("no chunk_tokens in {64, 128} fits the plan: the smallest dispatch peak 1.2 MiB
// (c = 64, K_max = 16): does not fit: ...").
//
// Test: ctest -R test_tune_select (tests/tune/test_tune_select.cpp: flat, knee, noisy and
// nothing-fits curves for each rule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moepeak::tune {

// What every measured point carries: the median of the repetitions and their min and max, and
// the plan's verdict for a config with this point's values (`plan_note`: the verdict line when it
// does not fit).
struct Timing {
  double median_s = 0, min_s = 0, max_s = 0;
  int repeats = 0;
};

struct DispatchPoint {
  int64_t chunk_tokens = 0;  // c as configured (schedules.chunk_tokens)
  int64_t max_chunks = 0;    // K_max (schedules.max_chunks)
  int64_t chunks = 0;        // K = min(ceil(N / c), K_max)
  int64_t chunk_eff = 0;     // c_eff = ceil(N / K)
  Timing time;               // PipelinedLLEP forward + backward of one MoE layer
  uint64_t peak_bytes = 0;   // measured `dispatch` peak
  uint64_t bound_bytes = 0;  // pipelined_llep_dispatch_bytes (equal to the peak)
  bool plan_fits = false;
  std::string plan_note;
};

struct OptimizerPoint {
  int64_t bucket_params = 0;      // beta as configured
  int64_t staging_slots = 0;      // s as configured
  int64_t bucket = 0, slots = 0;  // offload_stream_shape's effective values
  Timing time;                    // one OffloadStreamAdamW step
  uint64_t staging_bytes = 0;     // measured `optimizer` peak
  uint64_t bound_bytes = 0;       // adamw_offload_stream_bytes (equal to the peak)
  bool plan_fits = false;
  std::string plan_note;
};

struct VocabPoint {
  std::string payload;       // "activations" or "weights"
  int64_t kept_strips = 0;   // schedules.vocab_kept_strips (at most the strips a rank forms)
  Timing time;               // Ring-DTP forward + backward
  uint64_t peak_bytes = 0;   // measured `logits` peak
  uint64_t bound_bytes = 0;  // ring_dtp_bytes
  bool plan_fits = false;
  std::string plan_note;
};

struct ScoPoint {
  std::string label;  // "none", "half", "all"
  int64_t offloaded_layers = 0;
  uint64_t host_budget = 0;  // schedules.sco_host_budget, bytes
  Timing time;               // forward + backward of a step
  double overhead = 0;       // median / standard's median - 1
  uint64_t peak_bytes = 0;   // measured `boundaries` peak
  uint64_t bound_bytes = 0;  // sco_boundaries_bytes
  bool plan_fits = false;
  std::string plan_note;
};

struct Choice {
  size_t index = 0;    // into the points passed
  std::string reason;  // the rule and the numbers, one line (tuned.toml's comment)
};

Choice select_chunk(const std::vector<DispatchPoint>& points, double tolerance = 0.03);
Choice select_staging(const std::vector<OptimizerPoint>& points, double tolerance = 0.05);
Choice select_payload(const std::vector<VocabPoint>& points, const std::string& preferred = "");
// Among the points of `payload` (select_payload's choice); returns the index into `points`.
Choice select_kept_strips(const std::vector<VocabPoint>& points, const std::string& payload,
                          double tolerance = 0.03);
Choice select_sco(const std::vector<ScoPoint>& points, double tolerance = 0.03);

// The summary of one point's repetitions (median as bench_common's median: the mean of the two
// middle values for an even count). Error on an empty list.
Timing summarize(const std::vector<double>& times_s);

}  // namespace moepeak::tune
