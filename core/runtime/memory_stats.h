// Current and peak bytes per live set, the total peak, and the breakdown of live sets at the
// moment the total peaked (docs/design.md#memory-accounting); the same peaks for each phase of a
// step (core/runtime/step_phase.h), which the code running tells with set_phase. Shared by the
// device arena and the pinned host pool.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/runtime/live_set.h"
#include "core/runtime/step_phase.h"

namespace moepeak {

struct MemorySnapshot {
  std::array<uint64_t, kNumLiveSets> bytes{};
  uint64_t total() const;
  uint64_t operator[](LiveSet s) const { return bytes[static_cast<size_t>(s)]; }
  // "weights 1.00 GiB, grads 512.00 MiB, ..." listing only non-zero sets ("nothing" if empty).
  std::string describe() const;
};

class MemoryStats {
 public:
  void on_alloc(LiveSet set, uint64_t bytes);
  void on_free(LiveSet set, uint64_t bytes);
  // Starts a new peak window (e.g. one training step): peaks become the current values (the
  // phases' peaks 0 but the current phase's).
  void reset_peaks();
  // What runs from now on; the bytes live are counted in its peak (set_phase included).
  void set_phase(StepPhase phase);
  StepPhase phase() const { return phase_; }

  const MemorySnapshot& current() const { return current_; }
  uint64_t current_total() const { return current_total_; }
  // Highest value each live set reached on its own since the last reset.
  const MemorySnapshot& peak_per_set() const { return peak_; }
  uint64_t peak_total() const { return peak_total_; }
  // The live sets as they were at the moment the total peaked.
  const MemorySnapshot& at_peak() const { return at_peak_; }
  // The highest total while `phase` ran (0 if it did not) and the sets at that moment.
  uint64_t phase_peak(StepPhase phase) const { return phase_peak_[phase]; }
  const PhaseBytes& phase_peaks() const { return phase_peak_; }
  const MemorySnapshot& phase_at_peak(StepPhase phase) const {
    return phase_at_peak_[static_cast<size_t>(phase)];
  }
  // Highest value each live set reached on its own while `phase` ran (what was live when the
  // phase began included): the per-phase functions of the planner (attention_phase_bytes, ...)
  // are held to these.
  const MemorySnapshot& phase_peak_per_set(StepPhase phase) const {
    return phase_set_peak_[static_cast<size_t>(phase)];
  }

 private:
  void note_phase_peak();
  void note_phase_set_peaks();  // the current values count in the current phase's set peaks

  MemorySnapshot current_, peak_, at_peak_;
  uint64_t current_total_ = 0;
  uint64_t peak_total_ = 0;
  StepPhase phase_ = StepPhase::embedding;
  PhaseBytes phase_peak_;
  std::array<MemorySnapshot, kNumStepPhases> phase_at_peak_{};
  std::array<MemorySnapshot, kNumStepPhases> phase_set_peak_{};
};

}  // namespace moepeak
