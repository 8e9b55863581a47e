// The closed-form per-rank memory plan (`moepeak plan`; paper eq. 6,
// docs/design.md#memory-accounting): one term per live set, each from the very function the
// schedule sizes its buffers with (or the model's own, core/model/decoder_memory.h), the device
// capacity, the pinned host terms against the host budget, and a verdict naming the terms that
// overflow.
//
//   PlanInputs in = plan_inputs(cfg, world);       // W, B, T, dtype, capacity, host budget
//   Plan p = make_plan(cfg, in);                   // p.fits, p.overflow()
//   int64_t T = max_seq_len(cfg, in);              // the search: a loop over make_plan
//
// The sets peak at different moments of a step (the optimizer's staging after backward, the logits
// at the head, ...), so the plan's device total is its largest PHASE (core/runtime/step_phase.h:
// the embedding, a layer's attention or experts in either pass, the head, the optimizer), each
// phase the sum of the sets live in it: a set's whole term where it may hold bytes, the model's
// attention and workspace (core/model/decoder_memory.h) and the boundaries (their checkpoint
// schedule's) their own bytes in that phase. The sum of all terms, the bound of a plan without
// phases, is kept beside it. Terms are for the largest rank. docs/plan.md#phases. Test: ctest -R
// test_plan (tests/plan/: every measured per-set peak <= its term, and within 10% except the
// documented router-dependent bounds; every phase's measured peak <= its total).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config/config.h"
#include "core/model/parallel_layout.h"
#include "core/runtime/dtype.h"
#include "core/runtime/live_set.h"
#include "core/runtime/outside_arena.h"
#include "core/runtime/step_phase.h"

namespace moepeak {

struct PlanInputs {
  ParallelDegrees degrees;         // W ranks and the layout's degrees (Ep, Sp, data_shard)
  int64_t batch = 0, seq_len = 0;  // the global micro-batch B x T (what every bound is for)
  int64_t grad_accum = 1;          // m micro-batches per step: no term depends on it
  DType dtype = DType::f32;        // compute dtype (weights, activations)
  uint64_t capacity = 0;           // device bytes per rank
  uint64_t host_budget = 0;        // pinned host bytes per rank
  int world() const { return degrees.world; }
};

// W: `world` when > 0, else parallelism.world_size, else 1; the degrees: the [parallelism] keys
// on W (0 = W; Error unless each divides W). Capacity: runtime.device_memory, or
// for "auto" the CPU arena's default (the CPU backend's "device"); "auto" with backend "cuda" is
// an Error asking for a size. Host budget: runtime.pinned_memory, or for "auto" what the CPU
// backend takes then (half the default device memory). dtype: training.dtype ("auto": float32
// unless the backend is cuda).
PlanInputs plan_inputs(const Config& cfg, int world = 0);

struct PlanTerm {
  LiveSet set;
  uint64_t bytes = 0;
  std::string function;  // what gave the bytes: "dispatch_standard_bytes(N=..., ...)"
  std::string schedule;  // the schedule of the set as the config spells it
};

// One phase of the step: the bytes each live set may hold in it (kAllLiveSets order).
struct PlanPhase {
  StepPhase phase = StepPhase::embedding;
  std::array<uint64_t, kNumLiveSets> bytes{};
  uint64_t total = 0;
  uint64_t operator[](LiveSet s) const { return bytes[static_cast<size_t>(s)]; }
};

struct HostTerm {
  std::string name;  // "sco_boundaries", "optimizer_state", "optimizer_grad_copy", ...
  uint64_t bytes = 0;
  std::string function;
};

struct Plan {
  PlanInputs inputs;
  int64_t tokens_per_rank = 0;                     // N = B*T/W
  std::array<PlanTerm, kNumLiveSets> terms{};      // kAllLiveSets order
  std::array<PlanPhase, kNumStepPhases> phases{};  // kAllStepPhases order
  std::vector<HostTerm> host;
  // runtime.backend = "cuda" only: the device memory beside the arena (the CUDA context, cuBLAS,
  // NCCL's buffers for `communicators`), from the same function that sizes an "auto" arena
  // (core/runtime/outside_arena.h). Not part of `total`, which the arena's capacity holds; the
  // GPU needs capacity + outside_total.
  std::vector<OutsideArenaTerm> outside;
  uint64_t outside_total = 0;
  int communicators = 0;             // of more than one rank, per rank (model_group_communicators)
  int64_t sco_offloaded_layers = 0;  // |S| under checkpoint = "sco"
  // total: the largest phase's (peak_phase) and the allocator's allowance for it (fragmentation,
  // DeviceArena::fragmentation_allowance); sum_of_terms: every term at once.
  uint64_t total = 0, fragmentation = 0, sum_of_terms = 0, host_total = 0;
  uint64_t setup = 0;  // of the peak phase, what the setup allocates: shards, resident optimizer
  StepPhase peak_phase = StepPhase::embedding;
  bool device_fits = false, host_fits = false;
  bool fits() const { return device_fits && host_fits; }
  const PlanTerm& term(LiveSet s) const { return terms[static_cast<size_t>(s)]; }
  const PlanPhase& phase(StepPhase p) const { return phases[static_cast<size_t>(p)]; }
  // "DOES NOT FIT: device total 3.2 GiB (head) > capacity 2 GiB by 1.2 GiB; overflowing: logits
  //  2.1 GiB (105% of capacity), ..." or "FITS: ..." — one line naming what overflows and by how
  //  much.
  std::string verdict() const;
  // The terms that overflow: every set that alone exceeds the capacity, else the largest sets of
  // each phase over the capacity whose removal would make it fit (largest first, each set once);
  // host terms likewise.
  std::vector<std::string> overflow() const;
};

// Throws moepeak::Error (naming the key) for a config the model cannot lay out on W ranks or
// whose shapes are not positive.
Plan make_plan(const Config& cfg, const PlanInputs& inputs);

// The same config with every schedule standard (dispatch, vocab, checkpoint, optimizer placement).
Config with_standard_schedules(const Config& cfg);

// The largest seq_len (a multiple of Sp, at most `limit`) / batch size (a multiple of W/Sp)
// whose plan fits, or 0 if none does. Each candidate is a make_plan call.
int64_t max_seq_len(const Config& cfg, const PlanInputs& inputs, int64_t limit = int64_t{1} << 24);
int64_t max_batch(const Config& cfg, const PlanInputs& inputs, int64_t limit = int64_t{1} << 20);

}  // namespace moepeak
