// Current and peak bytes per live set, the total peak, and the breakdown of live sets at the
// moment the total peaked (docs/design.md#memory-accounting). Shared by the device arena and the
// pinned host pool.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/runtime/live_set.h"

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
  // Starts a new peak window (e.g. one training step): peaks become the current values.
  void reset_peaks();

  const MemorySnapshot& current() const { return current_; }
  uint64_t current_total() const { return current_total_; }
  // Highest value each live set reached on its own since the last reset.
  const MemorySnapshot& peak_per_set() const { return peak_; }
  uint64_t peak_total() const { return peak_total_; }
  // The live sets as they were at the moment the total peaked.
  const MemorySnapshot& at_peak() const { return at_peak_; }

 private:
  MemorySnapshot current_, peak_, at_peak_;
  uint64_t current_total_ = 0;
  uint64_t peak_total_ = 0;
};

}  // namespace moepeak
