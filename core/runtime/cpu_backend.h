// The CPU backend: "device memory" is an arena over reserved address space with the configured
// capacity, pinned host memory a NUMA-local pool with its own budget, streams worker threads
// (cpu_stream.h). Ops run fp32 (and f64 for tests) loops and OpenBLAS GEMMs on those streams.
#pragma once

#include <memory>
#include <mutex>
#include <set>

#include "core/runtime/backend.h"
#include "core/runtime/cpu_stream.h"

namespace moepeak {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  BackendKind kind() const override { return BackendKind::cpu; }
  std::string describe() const override;
  DeviceArena& arena() override { return *arena_; }
  PinnedPool& pinned() override { return *pinned_; }
  Stream& default_stream() override { return *default_stream_; }
  std::unique_ptr<Stream> create_stream(std::string name,
                                        StreamPriority priority = StreamPriority::normal) override;
  std::unique_ptr<Event> create_event(EventTiming timing = EventTiming::off) override;
  void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& stream) override;
  void memset_async(void* dst, int value, size_t bytes, Stream& stream) override;
  void synchronize() override;
  MemoryInfo memory_info() override;

 private:
  std::unique_ptr<CpuStream> make_stream(std::string name);

  void* region_ = nullptr;
  uint64_t region_bytes_ = 0;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<PinnedPool> pinned_;
  std::mutex streams_mu_;
  std::set<CpuStream*> streams_;  // every live stream, for synchronize()
  std::unique_ptr<CpuStream> default_stream_;
};

}  // namespace moepeak
