// The choice point of the `boundaries` live set (docs/design.md#the-schedules):
// schedules.checkpoint mapped to where the model keeps each layer's input from forward to
// backward (make_boundaries), to what the schedule means for the other sets (recomputes_layers,
// resident_layers) and to the device and pinned host bytes the planner shows (boundaries_bytes):
//
//   schedules.checkpoint  object              recompute  layers resident  bytes
//   none                  StandardBoundaries  no         L                boundaries_standard_bytes
//   standard              StandardBoundaries  yes        1                boundaries_standard_bytes
//   sco                   ScoBoundaries       yes        1                sco_boundaries_bytes
//                                                                         + host sco_host_bytes
//
// Contract: the boundaries keep L (N, H) layer inputs in the compute dtype as
// CheckpointBoundaries says (checkpoint_standard.h); every device byte is in `boundaries` (and
// SCO's pinned block in the pool's `boundaries`), sized by the functions boundaries_bytes names,
// the ones the planner (core/plan/plan.cpp) prints; DecoderModel (core/model/decoder.cpp) makes
// the object.
//
// NOTES: adding a checkpoint schedule = one new file (a CheckpointBoundaries and its bytes
// functions) + one case in each switch of checkpoint_choice.cpp; nothing in core/ changes.
// Test: ctest -R test_schedule_choice
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "core/runtime/step_phase.h"
#include "ops/schedules/checkpoint_standard.h"
#include "ops/schedules/schedule_bytes.h"

namespace moepeak::schedules {

// Whether backward recomputes each layer from its kept input (every schedule but "none").
bool recomputes_layers(CheckpointSchedule checkpoint);

// Layers whose activations (and dispatch buffers) are live at once from forward to backward:
// all `layers` under "none", else 1.
int64_t resident_layers(CheckpointSchedule checkpoint, int64_t layers);

// The boundaries of schedules.checkpoint; `stream` is the one the model's layers run on (SCO's
// copies get a stream of their own, its host budget is schedules.sco_host_budget).
std::unique_ptr<CheckpointBoundaries> make_boundaries(const SchedulesConfig& schedules,
                                                      Backend& backend, Stream& stream);

// The shapes the bytes depend on.
struct BoundariesShape {
  int64_t layers = 0;  // L
  int64_t tokens = 0;  // N, this rank's tokens
  int64_t hidden = 0;
  DType dtype = DType::f32;
  // The pinned pool's budget and what is live in it when a step starts (the optimizer's host
  // state): SCO's "auto" host budget is their difference, as sco_host_budget resolves it in a run.
  uint64_t host_budget = 0, host_live = 0;
};

// The device `boundaries` term (bytes, formula, schedule name), the host terms (SCO's pinned
// block, "sco_boundaries"), and |S|, the layers SCO offloads (0 for the others).
struct BoundariesBytes {
  ScheduleBytes device;
  // The device bytes in each phase of a step (their max is device.bytes): standard and none hold
  // the embedding's output around the embedding, the L layer inputs while a layer's attention runs
  // and the L + 1st (a layer's output) beside its experts (in the backward only a standard
  // recompute that has one: not PipelinedLLEP's) and at the head; SCO its whole term in every phase
  // but the optimizer's; nothing there (the pass has ended).
  PhaseBytes phases;
  std::vector<HostBytes> host;
  int64_t offloaded_layers = 0;
};
BoundariesBytes boundaries_bytes(const SchedulesConfig& schedules, const BoundariesShape& shape);

}  // namespace moepeak::schedules
