// recomputes_layers / resident_layers / make_boundaries / boundaries_bytes: the `boundaries` live
// set's one choice point (see checkpoint_choice.h). Test: ctest -R test_schedule_choice
#include "ops/schedules/checkpoint_choice.h"

#include <string>

#include "core/error.h"
#include "ops/schedules/checkpoint_sco.h"

namespace moepeak::schedules {

bool recomputes_layers(CheckpointSchedule checkpoint) {
  switch (checkpoint) {
    case CheckpointSchedule::none:
      return false;
    case CheckpointSchedule::standard:
    case CheckpointSchedule::sco:
      return true;
  }
  MOEPEAK_THROW("schedules.checkpoint: unknown schedule ", static_cast<int>(checkpoint));
}

int64_t resident_layers(CheckpointSchedule checkpoint, int64_t layers) {
  return recomputes_layers(checkpoint) ? 1 : layers;
}

std::unique_ptr<CheckpointBoundaries> make_boundaries(const SchedulesConfig& s, Backend& backend,
                                                      Stream& stream) {
  switch (s.checkpoint) {
    case CheckpointSchedule::none:
    case CheckpointSchedule::standard:
      return std::make_unique<StandardBoundaries>();
    case CheckpointSchedule::sco:
      return std::make_unique<ScoBoundaries>(backend, stream, s.sco_host_budget_bytes());
  }
  MOEPEAK_THROW("schedules.checkpoint: unknown schedule ", static_cast<int>(s.checkpoint));
}

BoundariesBytes boundaries_bytes(const SchedulesConfig& s, const BoundariesShape& b) {
  const int64_t L = b.layers, N = b.tokens, H = b.hidden;
  const std::string name(enum_name(s.checkpoint));
  BoundariesBytes out;
  switch (s.checkpoint) {
    case CheckpointSchedule::none:
    case CheckpointSchedule::standard: {
      out.device = {
          boundaries_standard_bytes(L, N, H, b.dtype),
          "boundaries_standard_bytes(" + formula_args({{"L", L}, {"N", N}, {"H", H}}) + ")", name};
      // The L layer inputs, and a layer's output beside its experts and at the head; in the
      // backward too when the recompute has an output (a PipelinedLLEP recompute only plans).
      const uint64_t inputs = boundaries_standard_bytes(L - 1, N, H, b.dtype);
      const bool recompute_output = s.checkpoint == CheckpointSchedule::standard &&
                                    s.dispatch != DispatchSchedule::pipelined_llep;
      out.phases[StepPhase::embedding] = boundaries_standard_bytes(0, N, H, b.dtype);
      out.phases[StepPhase::forward_attention] = inputs;
      out.phases[StepPhase::forward_experts] = out.device.bytes;
      out.phases[StepPhase::head] = out.device.bytes;
      out.phases[StepPhase::backward_experts] = recompute_output ? out.device.bytes : inputs;
      out.phases[StepPhase::backward_attention] = inputs;
      return out;
    }
    case CheckpointSchedule::sco: {
      // "auto": the pool's budget less what is live in it when the step starts.
      const uint64_t budget = s.sco_host_budget_bytes().value_or(
          b.host_budget > b.host_live ? b.host_budget - b.host_live : 0);
      const int64_t S = sco_offloaded_layers(L, N, H, b.dtype, budget);
      out.offloaded_layers = S;
      out.device = {
          sco_boundaries_bytes(L, S, N, H, b.dtype),
          "sco_boundaries_bytes(" + formula_args({{"L", L}, {"S", S}, {"N", N}, {"H", H}}) + ")",
          name};
      for (StepPhase ph : kAllStepPhases) {
        if (ph != StepPhase::optimizer) out.phases[ph] = out.device.bytes;
      }
      out.host.push_back({"sco_boundaries", sco_host_bytes(S, N, H, b.dtype),
                          "sco_host_bytes(" + formula_args({{"S", S}, {"N", N}, {"H", H}}) + ")"});
      return out;
    }
  }
  MOEPEAK_THROW("schedules.checkpoint: unknown schedule ", static_cast<int>(s.checkpoint));
}

}  // namespace moepeak::schedules
