#include "core/runtime/arena.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/units.h"

namespace moepeak {

DeviceArena::DeviceArena(void* base, uint64_t capacity, std::string name)
    : base_(static_cast<char*>(base)),
      capacity_(capacity / kAlignment * kAlignment),
      name_(std::move(name)) {
  MOEPEAK_CHECK(base != nullptr || capacity == 0, "arena '", name_, "' has no memory");
  if (capacity_ > 0) free_[0] = capacity_;
}

DeviceArena::~DeviceArena() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!allocated_.empty()) {
    // A leak at teardown is a bug in the caller; say so without throwing from a destructor.
    std::fprintf(stderr, "moepeak: arena '%s' destroyed with %zu live blocks (%s)\n", name_.c_str(),
                 allocated_.size(), stats_.current().describe().c_str());
  }
}

Buffer DeviceArena::alloc(size_t bytes, LiveSet set, std::string_view what) {
  uint64_t need = footprint(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  // Best fit: the smallest free block that holds the request, lowest address on ties.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= need && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) {
    uint64_t used = stats_.current_total();
    MOEPEAK_THROW("out of device memory in ", name_, ": requested ", format_bytes(bytes), " for ",
                  live_set_name(set), " (", what, "); capacity ", format_bytes(capacity_),
                  ", in use ", format_bytes(used), ", free ", format_bytes(capacity_ - used),
                  " (largest free block ", format_bytes(largest_free_block_locked()),
                  "); live sets now: ", stats_.current().describe());
  }
  uint64_t offset = best->first;
  uint64_t size = best->second;
  free_.erase(best);
  if (size > need) free_[offset + need] = size - need;
  allocated_[offset] = need;
  high_water_ = std::max(high_water_, offset + need);
  stats_.on_alloc(set, need);
  return Buffer(this, base_ + offset, bytes, set);
}

void DeviceArena::release(void* ptr, size_t /*bytes*/, LiveSet set) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t offset = static_cast<uint64_t>(static_cast<char*>(ptr) - base_);
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) {
    std::fprintf(stderr, "moepeak: arena '%s': release of unknown block at offset %llu\n",
                 name_.c_str(), static_cast<unsigned long long>(offset));
    std::abort();
  }
  uint64_t size = it->second;
  allocated_.erase(it);
  stats_.on_free(set, size);
  // Insert and coalesce with both neighbours.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

uint64_t DeviceArena::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.current_total();
}

uint64_t DeviceArena::largest_free_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  return largest_free_block_locked();
}

uint64_t DeviceArena::largest_free_block_locked() const {
  uint64_t best = 0;
  for (const auto& [off, size] : free_) best = std::max(best, size);
  return best;
}

MemoryStats DeviceArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint64_t DeviceArena::high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

void DeviceArena::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reset_peaks();
  // The live block that ends highest (allocated_ is address-ordered).
  high_water_ = allocated_.empty() ? 0 : allocated_.rbegin()->first + allocated_.rbegin()->second;
}

void DeviceArena::set_phase(StepPhase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.set_phase(phase);
}

}  // namespace moepeak
