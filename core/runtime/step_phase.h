// The phases of a training step, for memory accounting (docs/plan.md#phases): the live sets do
// not all peak at once, so the arena keeps the peak of each phase and the plan's total is the
// largest phase, each phase the sum of the sets live in it.
//
//   embedding           the batch's upload, the embedding and its backward
//   forward_attention   each layer's attention block in the forward pass
//   forward_experts     each layer's router and expert dispatch in the forward pass
//   head                the final norm, the vocabulary projection and the loss (both passes)
//   backward_experts    a layer's experts in the backward pass (with their recompute)
//   backward_attention  a layer's attention in the backward pass (with its recompute)
//   optimizer           the gradient norm, the optimizer step and the step's metrics
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace moepeak {

enum class StepPhase : int {
  embedding = 0,
  forward_attention,
  forward_experts,
  head,
  backward_experts,
  backward_attention,
  optimizer
};

constexpr size_t kNumStepPhases = 7;

constexpr std::array<StepPhase, kNumStepPhases> kAllStepPhases = {
    StepPhase::embedding, StepPhase::forward_attention, StepPhase::forward_experts,
    StepPhase::head,      StepPhase::backward_experts,  StepPhase::backward_attention,
    StepPhase::optimizer};

// The phase of a layer's attention or experts in the forward pass, or in the backward (its
// recompute included).
constexpr StepPhase attention_phase(bool backward) {
  return backward ? StepPhase::backward_attention : StepPhase::forward_attention;
}
constexpr StepPhase experts_phase(bool backward) {
  return backward ? StepPhase::backward_experts : StepPhase::forward_experts;
}

constexpr std::string_view step_phase_name(StepPhase phase) {
  constexpr std::array<std::string_view, kNumStepPhases> names = {
      "embedding",        "forward_attention",  "forward_experts", "head",
      "backward_experts", "backward_attention", "optimizer"};
  return names[static_cast<size_t>(phase)];
}

// One value per phase (bytes of a live set, a phase's total), in kAllStepPhases order.
struct PhaseBytes {
  std::array<uint64_t, kNumStepPhases> bytes{};
  uint64_t& operator[](StepPhase p) { return bytes[static_cast<size_t>(p)]; }
  uint64_t operator[](StepPhase p) const { return bytes[static_cast<size_t>(p)]; }
  uint64_t max() const {
    uint64_t m = 0;
    for (uint64_t b : bytes) m = b > m ? b : m;
    return m;
  }
};

}  // namespace moepeak
