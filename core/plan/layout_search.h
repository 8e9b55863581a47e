// The layout search (`moepeak plan --search-layout`): every valid (Ep, Sp, data_shard) for W
// ranks, each with the micro-batch and gradient accumulation that reach the config's global
// batch, its plan, and the bytes each rank moves per step; the best named by a goal.
//
//   LayoutSearch s = search_layouts(cfg, in, LayoutGoal::max_context);
//   s.rows[s.best]   // the layout to run; s.rows: one per candidate, in enumeration order
//
// Traffic per rank and step (docs/parallelism.md#bytes-per-step; b = dtype bytes, a ring
// collective over G ranks moves (G-1)/G of its buffer per rank, m micro-batches, N = B*T/W):
//   zero_dense     m * 3 (Ds-1)/Ds P_dense b        gather in forward and backward, reduce-scatter
//   dense_replicas m * 2 (R-1)/R P_dense/Ds b       all-reduce of the shards, R = W/Ds
//   zero_experts   m * 3 (Re-1)/Re P_exp b          the rank's E/Ep experts, Re = W/Ep,
//                                                  P_exp = L_moe E 3 F H
//   ulysses        m * p L * N (nh+nkv) (d+dv) b (Sp-1)/Sp    q, k, v, out (and their gradients)
//   dispatch       m * p L_moe * 2 N k H b (Ep-1)/Ep    tokens out to their experts and back
//   vocab          m * 3 (W-1) min(N, V/W) H b      Ring-DTP's ring (materialized: in zero_dense)
// with p = 2 passes (forward, backward), 3 when checkpointing recomputes each layer, L_moe the
// layers with experts (DecoderSpec::moe_layers), d and dv the q/k and value heads' widths
// (DecoderSpec: dv = d but for latent attention, where nkv = nh), P_dense every other
// parameter (the shared experts and dense MLPs included). These are the volumes of the
// schedules' collectives, not timings; the search ranks layouts by them.
// Test: ctest -R test_plan_layout_search
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/layout_defect.h"
#include "core/model/parallel_layout.h"
#include "core/plan/plan.h"

namespace moepeak {

enum class LayoutGoal {
  fits,         // the configured shape fits; fewest bytes per step
  max_context,  // the longest seq_len that fits (then fewest bytes)
  max_batch,    // the largest micro-batch that fits (then fewest bytes)
};

// Bytes one rank sends per optimizer step, by collective (the formulas above).
struct StepTraffic {
  double zero_dense = 0, dense_replicas = 0, zero_experts = 0, ulysses = 0, dispatch = 0, vocab = 0;
  double total() const {
    return zero_dense + dense_replicas + zero_experts + ulysses + dispatch + vocab;
  }
};

StepTraffic step_traffic(const Config& cfg, const ParallelDegrees& degrees, int64_t batch,
                         int64_t seq_len, int64_t grad_accum, DType dtype);

struct LayoutRow {
  ParallelDegrees degrees;
  int64_t batch = 0, grad_accum = 1;  // micro-batch B and m, B * m = the global batch
  bool valid = false;                 // the model can be laid out so (else `defect` and `why`)
  LayoutDefect defect = LayoutDefect::none;  // the rule it breaks (other: make_plan threw)
  std::string why;                           // the message naming the numbers
  Plan plan;                                 // at (B, seq_len) when valid
  std::string binding;                       // the largest live set of the plan
  int64_t max_context = 0;  // LayoutGoal::max_context: the longest seq_len that fits
  int64_t max_batch = 0;    // LayoutGoal::max_batch: the largest micro-batch that fits
  StepTraffic traffic;      // per rank and step, at (B, m, seq_len)
  double step_s = 0;        // the predicted step (order_layouts_by_step_time); 0: not timed
};

struct LayoutSearch {
  int64_t global_batch = 0;  // training.batch_size * training.grad_accum_steps
  LayoutGoal goal = LayoutGoal::fits;
  std::vector<LayoutRow> rows;
  int best = -1;  // index into rows; -1 when no layout fits
};

// Every (Ep, Sp, Ds) with each dividing W and E % Ep == 0 (rows with `valid` false name why the
// model cannot be laid out so, e.g. heads not divisible by Sp: the kind of the rule in `defect`,
// LayoutDefect::batch when no micro-batch splits over W/Sp, the message in `why`, from
// layout_defect, or from make_plan's error with LayoutDefect::other). For each valid one, the
// largest micro-batch B dividing the global batch, a multiple of W/Sp, whose plan fits (else the
// smallest), m = global / B. The best: the goal's largest value among the layouts that fit, ties
// (and LayoutGoal::fits) broken by the fewest bytes per step, then the larger Ds and Ep.
LayoutSearch search_layouts(const Config& cfg, const PlanInputs& inputs, LayoutGoal goal);

}  // namespace moepeak
