// The live sets every device (and pinned host) allocation is tagged with. Peak memory is a maximum
// over live sets resident at the same time (docs/design.md#memory-accounting); the arena tracks
// each one so a run can print its peak beside the planner's bound for that set.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace moepeak {

enum class LiveSet : int {
  weights = 0,  // working weights (bf16 on CUDA), incl. ZeRO-3 gathered layers
  grads,        // weight gradients of this rank's shard (and gathered grads before reduce-scatter)
  optimizer,    // resident AdamW state, or OffloadStreamAdamW staging slots
  attention,    // q/k/v/o activations and the attention working set
  dispatch,     // expert dispatch / combine buffers
  logits,       // vocabulary projection: materialised logits or Ring-DTP strips
  boundaries,   // checkpoint boundaries (layer inputs kept for recompute)
  workspace,    // everything transient: GEMM workspace, temporaries, other activations
};

constexpr size_t kNumLiveSets = 8;

constexpr std::array<LiveSet, kNumLiveSets> kAllLiveSets = {
    LiveSet::weights,  LiveSet::grads,  LiveSet::optimizer,  LiveSet::attention,
    LiveSet::dispatch, LiveSet::logits, LiveSet::boundaries, LiveSet::workspace};

constexpr std::string_view live_set_name(LiveSet set) {
  constexpr std::array<std::string_view, kNumLiveSets> names = {
      "weights",  "grads",  "optimizer",  "attention",
      "dispatch", "logits", "boundaries", "workspace"};
  return names[static_cast<size_t>(set)];
}

inline std::optional<LiveSet> live_set_from_name(std::string_view name) {
  for (LiveSet s : kAllLiveSets) {
    if (live_set_name(s) == name) return s;
  }
  return std::nullopt;
}

}  // namespace moepeak
