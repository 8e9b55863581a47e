// DeviceArena: "device memory" with a capacity, sub-allocated and accounted per live set.
//
// One region (cudaMalloc'd on CUDA, reserved address space on the CPU) is carved into blocks by a
// best-fit free list with coalescing. Going past the capacity is an out-of-memory error, exactly as
// on a GPU, so a schedule that would OOM on a GPU also OOMs on the CPU backend at the same
// configuration scaled down (docs/design.md#backends). The error names the failed request and the
// live sets at that moment.
//
// Accounting counts the bytes a block occupies (the request rounded up to kAlignment), so the
// measured peak is what the region really had to hold.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/runtime/buffer.h"
#include "core/runtime/memory_stats.h"

namespace moepeak {

class DeviceArena final : public BufferOwner {
 public:
  static constexpr size_t kAlignment = 256;  // cudaMalloc's alignment; vector loads rely on it

  // Manages [base, base + capacity). The arena does not own the region.
  DeviceArena(void* base, uint64_t capacity, std::string name);
  ~DeviceArena() override;

  // Throws moepeak::Error (out of device memory) if no free block can hold `bytes`.
  // `what` names the tensor in the error message ("layer 3 q_proj grad").
  Buffer alloc(size_t bytes, LiveSet set, std::string_view what);

  // Bytes a request of `bytes` occupies in the arena (for planners that want to be exact).
  static uint64_t footprint(uint64_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  // The allocator's fragmentation a plan allows for `transient` bytes (those not allocated at
  // setup): 1/8 of them, in whole blocks. NOTES: best fit leaves holes smaller than the next
  // requests among blocks of different lifetimes (a layer's attention gradients above the
  // experts' tiles, ...): the plan tests measured up to 6.7% of the transient bytes, and
  // configs/reach.toml at its bounded limit more than 1/16 (docs/plan.md#phases).
  static uint64_t fragmentation_allowance(uint64_t transient) {
    return footprint((transient + 7) / 8);
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;
  uint64_t largest_free_block() const;
  const std::string& name() const { return name_; }

  // Copies of the statistics (the arena may be used from several threads).
  MemoryStats stats() const;
  // The highest end offset any block reached since the last reset_peaks (at least that of the
  // blocks live then): the region the run really needed. Beyond stats().peak_total() it is the
  // allocator's fragmentation, which the plan's sum of per-set peaks must also cover
  // (docs/plan.md#outside-the-arena).
  uint64_t high_water() const;
  void reset_peaks();
  // The phase of the step that runs from now on (MemoryStats::set_phase): the model and the
  // trainer tell it, so a step's peak is known per phase (docs/plan.md#phases).
  void set_phase(StepPhase phase);

  void release(void* ptr, size_t bytes, LiveSet set) noexcept override;

 private:
  uint64_t largest_free_block_locked() const;

  char* base_;
  uint64_t capacity_;
  std::string name_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;       // offset -> size, address-ordered, coalesced
  std::map<uint64_t, uint64_t> allocated_;  // offset -> footprint
  MemoryStats stats_;
  uint64_t high_water_ = 0;
};

}  // namespace moepeak
