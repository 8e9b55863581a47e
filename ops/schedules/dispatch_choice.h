// The choice point of the `dispatch` live set (docs/design.md#the-schedules): schedules.dispatch
// and the world size mapped to the dispatcher the model runs (make_dispatch) and to the bytes the
// planner shows for it (dispatch_bytes, plus what the dispatcher adds to `weights`, `grads` and
// `workspace`), both from one rule (dispatch_kind):
//
//   schedules.dispatch  W = 1                          W > 1
//   standard            StandardDispatch               ExpertParallelDispatch (R = W*N*k worst)
//   llep                LlepDispatch                   LlepDispatch (+ spilled-expert copies)
//   pipelined_llep      PipelinedLlepDispatch          PipelinedLlepDispatch (+ spilled copies)
//
// Contract: every dispatcher takes x (N, H), index (N, k) i32 global expert ids, weight (N, k),
// this rank's experts, and writes out (N, H) += the weighted expert outputs (dispatch.h). Its
// `dispatch` buffers are sized by the very function dispatch_bytes names, at N = the largest
// rank's tokens; DecoderModel (core/model/decoder.cpp) makes the object and the planner
// (core/plan/plan.cpp) prints the bytes, so the two cannot pick different schedules.
//
// NOTES: adding a dispatch schedule = one new file (the dispatcher and its bytes function) + one
// DispatchKind and one case in each switch of dispatch_choice.cpp; nothing in core/ changes.
// Test: ctest -R test_schedule_choice
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/comm/comm.h"
#include "core/config/config.h"
#include "core/runtime/backend.h"
#include "ops/schedules/dispatch.h"
#include "ops/schedules/schedule_bytes.h"
#include "ops/swiglu.h"

namespace moepeak::schedules {

struct PipelinedLlepLane;

// The dispatcher a config runs: schedules.dispatch resolved for W ranks (standard on one rank is
// StandardDispatch, on several ExpertParallelDispatch). The one place that rule is written.
enum class DispatchKind { standard, expert_parallel, llep, pipelined_llep };
DispatchKind dispatch_kind(DispatchSchedule schedule, int world);

// The shapes the bytes depend on, for the largest rank.
struct DispatchShape {
  int64_t tokens = 0;  // N, this rank's tokens
  int64_t top_k = 0, hidden = 0, ffn = 0;
  int64_t experts = 0;  // E, global
  int world = 1;        // W
  // Layers whose dispatchers keep their buffers from forward to backward at once
  // (resident_layers of checkpoint_choice.h: L under checkpoint = "none", else 1).
  int64_t layers_resident = 1;
  DType dtype = DType::f32;
  // The experts have biases b1, b3 (F), b2 (H) (gpt-oss): LLEP's spill copies carry them and
  // their gradients (2 F + H more elements per copy); the `dispatch` bytes do not change.
  bool expert_biases = false;
};

// The dispatcher of dispatch_kind(schedules.dispatch, comm.world_size()) over `experts` experts
// (E % W == 0) whose SwiGLU is `activation` (the plain one by default; gpt-oss's clamped form:
// ops::SwigluParams::gpt_oss). PipelinedLLEP's overlapping traffic runs on `lane`, one for all of
// a model's layers: made here (collectively) on first need, then shared. Whether the experts have
// biases is the ExpertWeights' business (dispatch.h), not the dispatcher's.
std::unique_ptr<ExpertDispatch> make_dispatch(const SchedulesConfig& schedules, Backend& backend,
                                              Stream& stream, Comm& comm, DType dtype,
                                              int64_t experts,
                                              std::shared_ptr<PipelinedLlepLane>& lane,
                                              const ops::SwigluParams& activation = {});

// The `dispatch` term: bytes, the formula ("dispatch_standard_bytes(N=.., ..., layers=1)"), and the
// schedule name ("standard"). Standard on W > 1 is at its worst case R = W*N*k; the all-at-once
// dispatchers (expert parallel, LLEP) are layers_resident times their one-layer bound.
ScheduleBytes dispatch_bytes(const SchedulesConfig& schedules, const DispatchShape& shape);

// LLEP's spilled-expert copies (W > 1, llep and pipelined_llep; docs/memory.md): what the
// dispatcher adds to the `weights` and `grads` terms, each with the formula text to append
// (" + " + weights_function) and the schedule to append ("+" + schedule). nullopt for a
// dispatcher that keeps no copies.
struct DispatchSpillBytes {
  uint64_t weights = 0, grads = 0;
  std::string weights_function, grads_function;
  std::string schedule;
};
std::optional<DispatchSpillBytes> dispatch_spill_bytes(const SchedulesConfig& schedules,
                                                       const DispatchShape& shape);

// The dispatcher's small count exchange in `workspace` during its forward's planning (part of the
// model's workspace_bytes, core/model/decoder_memory.h): ExpertParallelDispatch "dispatch counts"
// (3, E) i64; LlepDispatch "llep counts" ((W+1)(E+1)) i64; PipelinedLlepDispatch "pipelined llep
// tokens and counts" ((W+1)(1 + K_max E)) i64 (the second exchange, of K <= K_max chunks' counts,
// is never larger); StandardDispatch none. Arena footprints.
uint64_t dispatch_workspace_bytes(const SchedulesConfig& schedules, const DispatchShape& shape);

}  // namespace moepeak::schedules
