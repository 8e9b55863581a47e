#include "core/runtime/pinned_pool.h"

#include <numa.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/runtime/numa.h"
#include "core/units.h"

namespace moepeak {

PinnedPool::PinnedPool(uint64_t budget, int numa_node, HostRegistrar* registrar)
    : budget_(budget), node_(numa_node), registrar_(registrar) {
  if (numa_available() < 0) {
    node_ = -1;  // no NUMA support in this kernel: plain page-aligned memory
  } else if (node_ < 0) {
    node_ = current_numa_node();
  } else if (node_ > numa_max_node()) {
    MOEPEAK_THROW("pinned pool: NUMA node ", numa_node, " does not exist (this host has nodes 0..",
                  numa_max_node(), ")");
  }
}

PinnedPool::~PinnedPool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.empty()) {
    std::fprintf(stderr, "moepeak: pinned pool destroyed with %zu live blocks (%s)\n", live_.size(),
                 stats_.current().describe().c_str());
  }
  trim_locked(~0ull);
}

void* PinnedPool::map_block(uint64_t bytes) {
  void* p = nullptr;
  if (node_ >= 0) {
    p = numa_alloc_onnode(bytes, node_);
  } else {
    p = std::aligned_alloc(kBlockGranularity, bytes);
  }
  if (p == nullptr) {
    MOEPEAK_THROW("pinned pool: the OS refused ", format_bytes(bytes), " on NUMA node ", node_);
  }
  // Lock the pages so they stay resident; without CAP_IPC_LOCK or a high enough
  // RLIMIT_MEMLOCK this fails and the memory is still usable, only not guaranteed resident.
  (void)mlock(p, bytes);
  if (registrar_ != nullptr) {
    try {
      registrar_->register_host(p, bytes);
    } catch (...) {
      munlock(p, bytes);
      node_ >= 0 ? numa_free(p, bytes) : std::free(p);
      throw;
    }
  }
  return p;
}

void PinnedPool::unmap_block(void* ptr, uint64_t bytes) noexcept {
  if (registrar_ != nullptr) registrar_->unregister_host(ptr);
  munlock(ptr, bytes);
  if (node_ >= 0) {
    numa_free(ptr, bytes);
  } else {
    std::free(ptr);
  }
}

void PinnedPool::trim_locked(uint64_t need) noexcept {
  // Free cached blocks, largest first, until `need` more bytes fit in the budget.
  while (!cache_.empty() && stats_.current_total() + cached_ + need > budget_) {
    auto it = std::prev(cache_.end());
    unmap_block(it->second, it->first);
    cached_ -= it->first;
    cache_.erase(it);
  }
}

Buffer PinnedPool::alloc(size_t bytes, LiveSet set, std::string_view what) {
  uint64_t need = footprint(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* block = nullptr;
  auto hit = cache_.find(need);  // reuse only an exact size: blocks are never split
  if (hit != cache_.end()) {
    block = hit->second;
    cached_ -= need;
    cache_.erase(hit);
  } else {
    if (stats_.current_total() + need > budget_) {
      MOEPEAK_THROW("out of pinned host memory: requested ", format_bytes(bytes), " for ",
                    live_set_name(set), " (", what, "); budget ", format_bytes(budget_),
                    ", in use ", format_bytes(stats_.current_total()),
                    "; live sets now: ", stats_.current().describe());
    }
    trim_locked(need);
    block = map_block(need);
  }
  live_[block] = need;
  stats_.on_alloc(set, need);
  return Buffer(this, block, bytes, set);
}

void PinnedPool::release(void* ptr, size_t /*bytes*/, LiveSet set) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::fprintf(stderr, "moepeak: pinned pool: release of unknown block %p\n", ptr);
    std::abort();
  }
  uint64_t size = it->second;
  live_.erase(it);
  stats_.on_free(set, size);
  cache_.emplace(size, ptr);
  cached_ += size;
}

uint64_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

MemoryStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void PinnedPool::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.reset_peaks();
}

void PinnedPool::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!cache_.empty()) {
    auto it = cache_.begin();
    unmap_block(it->second, it->first);
    cached_ -= it->first;
    cache_.erase(it);
  }
}

}  // namespace moepeak
