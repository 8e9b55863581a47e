#include "core/runtime/memory_stats.h"

#include <algorithm>

#include "core/error.h"
#include "core/units.h"

namespace moepeak {

uint64_t MemorySnapshot::total() const {
  uint64_t t = 0;
  for (uint64_t b : bytes) t += b;
  return t;
}

std::string MemorySnapshot::describe() const {
  std::string out;
  for (LiveSet s : kAllLiveSets) {
    if ((*this)[s] == 0) continue;
    if (!out.empty()) out += ", ";
    out += std::string(live_set_name(s)) + " " + format_bytes((*this)[s]);
  }
  return out.empty() ? "nothing" : out;
}

void MemoryStats::on_alloc(LiveSet set, uint64_t bytes) {
  size_t i = static_cast<size_t>(set);
  current_.bytes[i] += bytes;
  current_total_ += bytes;
  if (current_.bytes[i] > peak_.bytes[i]) peak_.bytes[i] = current_.bytes[i];
  uint64_t& phase_set = phase_set_peak_[static_cast<size_t>(phase_)].bytes[i];
  if (current_.bytes[i] > phase_set) phase_set = current_.bytes[i];
  if (current_total_ > peak_total_) {
    peak_total_ = current_total_;
    at_peak_ = current_;
  }
  note_phase_peak();
}

void MemoryStats::note_phase_peak() {
  if (current_total_ > phase_peak_[phase_]) {
    phase_peak_[phase_] = current_total_;
    phase_at_peak_[static_cast<size_t>(phase_)] = current_;
  }
}

void MemoryStats::set_phase(StepPhase phase) {
  phase_ = phase;
  note_phase_peak();
  note_phase_set_peaks();
}

void MemoryStats::note_phase_set_peaks() {
  MemorySnapshot& peaks = phase_set_peak_[static_cast<size_t>(phase_)];
  for (size_t i = 0; i < kNumLiveSets; ++i)
    peaks.bytes[i] = std::max(peaks.bytes[i], current_.bytes[i]);
}

void MemoryStats::on_free(LiveSet set, uint64_t bytes) {
  size_t i = static_cast<size_t>(set);
  // NOTES: a free larger than what the set holds means a buffer was freed twice or tagged with
  // another set than it was allocated with; the accounting would silently lie afterwards.
  MOEPEAK_CHECK(current_.bytes[i] >= bytes, "freeing ", bytes, " bytes from live set ",
                live_set_name(set), " which holds only ", current_.bytes[i]);
  current_.bytes[i] -= bytes;
  current_total_ -= bytes;
}

void MemoryStats::reset_peaks() {
  peak_ = current_;
  peak_total_ = current_total_;
  at_peak_ = current_;
  phase_peak_ = PhaseBytes{};
  phase_at_peak_ = {};
  phase_set_peak_ = {};
  note_phase_peak();
  note_phase_set_peaks();
}

}  // namespace moepeak
