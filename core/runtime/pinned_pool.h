// PinnedPool: page-locked host memory on one NUMA node, with its own budget and live-set
// accounting, separate from the device arena (docs/design.md#backends, #memory-accounting).
//
// SCO boundaries and OffloadStreamAdamW state live here. Memory comes from libnuma
// (numa_alloc_onnode on the configured node, or the node the calling thread runs on), is locked
// with mlock and, on the CUDA backend, registered with cudaHostRegister through the HostRegistrar
// so copies from it run at pinned speed.
//
// Pinning is slow (seconds per GiB on large hosts), so freed blocks are cached and reused: the
// budget bounds what the pool holds (live + cached), and cached blocks are given back to the OS
// before a request would go past the budget.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

#include "core/runtime/buffer.h"
#include "core/runtime/memory_stats.h"

namespace moepeak {

// Makes host memory visible to a device (cudaHostRegister) and back. The CPU backend has none.
class HostRegistrar {
 public:
  virtual ~HostRegistrar() = default;
  virtual void register_host(void* ptr, size_t bytes) = 0;
  virtual void unregister_host(void* ptr) noexcept = 0;
};

class PinnedPool final : public BufferOwner {
 public:
  static constexpr size_t kBlockGranularity = 2 * 1024 * 1024;  // blocks are multiples of 2 MiB

  // numa_node < 0: the node of the calling thread. registrar may be null.
  PinnedPool(uint64_t budget, int numa_node, HostRegistrar* registrar);
  ~PinnedPool() override;

  // Throws moepeak::Error (out of pinned host memory) when the budget cannot hold the request.
  Buffer alloc(size_t bytes, LiveSet set, std::string_view what);

  // Bytes a request of `bytes` holds in the pool.
  static uint64_t footprint(uint64_t bytes) {
    uint64_t b = bytes == 0 ? 1 : bytes;
    return (b + kBlockGranularity - 1) / kBlockGranularity * kBlockGranularity;
  }

  uint64_t budget() const { return budget_; }
  int numa_node() const { return node_; }
  uint64_t cached_bytes() const;
  MemoryStats stats() const;
  void reset_peaks();
  // Gives every cached block back to the OS.
  void trim();

  void release(void* ptr, size_t bytes, LiveSet set) noexcept override;

 private:
  void* map_block(uint64_t bytes);
  void unmap_block(void* ptr, uint64_t bytes) noexcept;
  void trim_locked(uint64_t need) noexcept;

  uint64_t budget_;
  int node_;
  HostRegistrar* registrar_;
  mutable std::mutex mu_;
  std::multimap<uint64_t, void*> cache_;  // footprint -> free block
  uint64_t cached_ = 0;
  std::map<void*, uint64_t> live_;  // block -> footprint
  MemoryStats stats_;
};

}  // namespace moepeak
