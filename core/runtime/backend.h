// Backend: the small interface every op and schedule runs on (docs/design.md#backends), implemented
// by the CPU backend (always built; what CI runs) and the CUDA backend (built when nvcc is found).
//
//   Backend::create(options)   -> device arena with a capacity, pinned host pool with a budget
//   backend.alloc(bytes, set)  -> device Buffer tagged with its live set
//   backend.pinned().alloc()   -> pinned host Buffer (NUMA-local)
//   create_stream / create_event, copy_async, memset_async, synchronize, memory_info
//
// Device pointers are only dereferenced by work running on a stream of the same backend; on the
// CPU they are plain host pointers, so tests can read them after synchronising.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/runtime/arena.h"
#include "core/runtime/buffer.h"
#include "core/runtime/pinned_pool.h"
#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace moepeak {

enum class BackendKind { cpu, cuda };

std::string_view backend_kind_name(BackendKind kind);

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };

struct BackendOptions {
  BackendKind kind = BackendKind::cpu;
  // Arena capacity. 0 means the default: on CUDA the card's free memory less `outside_arena`;
  // on the CPU 2 GiB.
  uint64_t device_memory = 0;
  // CUDA: what the default arena leaves free for the context, cuBLAS and NCCL — the Trainer
  // gives the plan's terms (core/runtime/outside_arena.h); 0 = kCudaReserveBytes, for callers
  // that do not know their communicators (the benches).
  uint64_t outside_arena = 0;
  uint64_t pinned_budget = 1ull << 30;  // pinned host pool budget
  int device_index = 0;                 // CUDA device (the rank's local GPU)
  int numa_node = -1;                   // pinned pool node; -1 = the node this thread runs on
  int cpu_threads = 0;                  // CPU backend: OpenBLAS threads; 0 = OpenBLAS's default
};

// The CUDA ordinal a rank opens, given the one it wants (its local rank, or the probe's GPU for
// it) and how many devices it sees: the wanted one when visible; 0 when the launcher shows each
// rank a single GPU (srun --gpus-per-task=1, or a per-rank CUDA_VISIBLE_DEVICES), whatever its
// number on the node; otherwise an Error naming both and `cuda_visible_devices` (the variable's
// value, or null when unset).
int visible_cuda_device(int wanted, int visible, const char* cuda_visible_devices);

struct MemoryInfo {
  uint64_t capacity = 0;        // arena capacity
  uint64_t used = 0;            // bytes held by live buffers
  uint64_t largest_free = 0;    // largest block a request can still get
  uint64_t physical_total = 0;  // the device's (or host's) total memory
  uint64_t physical_free = 0;   // free as the driver (or OS) reports it
  // CUDA only (0 on the CPU): device bytes in use when the backend opened the device, before it
  // took the arena (the CUDA context, and anything other processes hold). With physical_total -
  // physical_free - capacity it gives what lives outside the arena
  // (docs/plan.md#outside-the-arena).
  uint64_t used_before_arena = 0;
};

class Backend;

// Copies a tensor's bytes to a new host vector and waits for the stream (small results,
// checkpoints, tests). The second form converts the elements to double (any dtype; integers
// exactly up to 2^53).
std::vector<char> copy_to_host(const Tensor& t, Backend& backend, Stream& stream);
std::vector<double> copy_to_host_as_double(const Tensor& t, Backend& backend, Stream& stream);
// The other way: writes `values` (one per element) into a tensor of any dtype, rounded to it
// (bf16 to nearest even, integers truncated), and waits for the stream.
void copy_from_host_as(const std::vector<double>& values, const Tensor& t, Backend& backend,
                       Stream& stream);

class Backend {
 public:
  // Bytes left outside a default arena on a GPU for the CUDA context, cuBLASLt workspaces and
  // NCCL when the caller does not say (BackendOptions::outside_arena).
  static constexpr uint64_t kCudaReserveBytes = 2ull << 30;
  static constexpr uint64_t kCpuDefaultDeviceMemory = 2ull << 30;

  // Throws moepeak::Error when the kind is not compiled in or no device is usable.
  static std::unique_ptr<Backend> create(const BackendOptions& options);
  // True when this build has the CUDA backend and a CUDA device can be opened.
  static bool cuda_available();

  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // One line for logs: "cpu (2 cores, OpenBLAS 0.3.21)" / "cuda:0 NVIDIA H200 (sm_90, 139.8 GiB)".
  virtual std::string describe() const = 0;

  Buffer alloc(size_t bytes, LiveSet set, std::string_view what) {
    return arena().alloc(bytes, set, what);
  }
  virtual DeviceArena& arena() = 0;
  virtual PinnedPool& pinned() = 0;

  // The stream work goes to when a caller has no other; created with the backend.
  virtual Stream& default_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream(
      std::string name, StreamPriority priority = StreamPriority::normal) = 0;
  virtual std::unique_ptr<Event> create_event(EventTiming timing = EventTiming::off) = 0;

  virtual void copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                          Stream& stream) = 0;
  virtual void memset_async(void* dst, int value, size_t bytes, Stream& stream) = 0;
  // Blocks until all work on all streams of this backend has finished.
  virtual void synchronize() = 0;
  virtual MemoryInfo memory_info() = 0;
};

}  // namespace moepeak
