// The CUDA runtime of the CPU emulation: devices, memory, streams, events and kernel launches
// with CUDA's semantics, on the host (see include/cuda_runtime_api.h for the surface).
//
// NOTES: streams are lazy. Work queued on a stream (a kernel, a copy, a cuBLAS or NCCL call)
// runs only when something waits for it: cudaStreamSynchronize, cudaEventSynchronize, a copy
// from or to pageable host memory (CUDA synchronises the stream for those), cudaFree,
// cudaDeviceSynchronize, or a cudaStreamWaitEvent that another stream reaches while it runs.
// A stream that waits for an event runs the recording stream up to that record first. So the
// order work runs in is the latest one CUDA's rules allow, and a missing cudaStreamWaitEvent
// shows: the consumer runs before the producer, on what the buffer held before. Kernels run on
// the fibers of device_threads.h, blocks one after another, threads in the order that
// MOEPEAK_CUDA_EMULATION_ORDER (forward or reverse) names.
//
// The emulated devices: MOEPEAK_CUDA_EMULATION_DEVICES of them (default 8), each with
// MOEPEAK_CUDA_EMULATION_DEVICE_BYTES (default 16 GiB) of memory, accounted per device; device
// memory is mapped lazily (only the pages written are backed) and allocations up to 64 MiB start
// as 0xff bytes (NaN in f32 and bf16). sm_90 limits: 1024 threads per block, 48 KiB of dynamic
// shared memory without cudaFuncAttributeMaxDynamicSharedMemorySize, 227 KiB with it.
//
// Errors: an invalid call returns its error as CUDA does; a launch with a bad configuration sets
// the error cudaGetLastError returns; work that fails while it runs (a broken barrier, an Error
// from a library) prints what failed to stderr and sets the sticky cudaErrorLaunchFailure that
// every later call returns, as a device fault does on a GPU.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/cuda_emulation/device_prelude.h"
#include "tests/cuda_emulation/device_threads.h"
#include "tests/cuda_emulation/stream_order.h"

namespace {

struct QueuedOp {
  uint64_t ticket = 0;
  std::string what;
  std::function<void()> work;          // empty for a wait
  CUstream_st* wait_stream = nullptr;  // a wait: run this stream up to wait_ticket first
  uint64_t wait_ticket = 0;
};

}  // namespace

struct CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  int priority = 0;
  bool alive = true;
  bool running = false;
  std::deque<QueuedOp> queue;
  uint64_t enqueued = 0, done = 0;
};

struct CUevent_st {
  bool timing = true;
  bool alive = true;
  CUstream_st* stream = nullptr;
  uint64_t ticket = 0;
  double at_ms = 0;
  int queries = 0;  // cudaEventQuery calls since the record
};

namespace moepeak::cuda_emulation {
namespace {

constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kPoisonedAllocationBytes = size_t{64} << 20;
constexpr int kMultiprocessors = 8;
constexpr int kDefaultSharedBytes = 48 * 1024;
constexpr int kOptinSharedBytes = 227 * 1024;

struct Allocation {
  size_t bytes = 0;
  int device = 0;
};

struct State {
  std::recursive_mutex mutex;
  int device_count = 8;
  size_t device_bytes = 16 * kGiB;
  Order order = Order::forward;
  std::vector<size_t> allocated;                  // bytes per device
  std::map<uintptr_t, Allocation> device_memory;  // cudaMalloc'd ranges by start
  std::map<uintptr_t, size_t> pinned;             // cudaMallocHost / cudaHostRegister ranges
  std::map<uintptr_t, size_t> host_allocations;   // cudaMallocHost (to free)
  std::vector<CUstream_st*> streams;              // every stream ever created (never freed)
  std::vector<CUevent_st*> events;
  std::vector<std::unique_ptr<CUstream_st>> legacy;  // each device's legacy default stream
  std::map<const void*, int> max_dynamic_shared;     // by kernel
  cudaError_t sticky = cudaSuccess;
  cudaError_t last = cudaSuccess;

  State() {
    if (const char* v = std::getenv("MOEPEAK_CUDA_EMULATION_DEVICES")) device_count = std::atoi(v);
    if (const char* v = std::getenv("MOEPEAK_CUDA_EMULATION_DEVICE_BYTES")) {
      device_bytes = std::strtoull(v, nullptr, 10);
    }
    if (const char* v = std::getenv("MOEPEAK_CUDA_EMULATION_ORDER")) {
      order = std::string(v) == "reverse" ? Order::reverse : Order::forward;
    }
    allocated.assign(static_cast<size_t>(device_count > 0 ? device_count : 0), 0);
    for (int d = 0; d < device_count; ++d) {
      legacy.push_back(std::make_unique<CUstream_st>());
      legacy.back()->device = d;
    }
  }
};

State& state() {
  static State* s = new State();  // never destroyed: streams may be flushed at exit
  return *s;
}

thread_local int t_device = 0;

using Lock = std::lock_guard<std::recursive_mutex>;

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

cudaError_t fail(cudaError_t e) {
  State& s = state();
  if (s.sticky == cudaSuccess) s.last = e;
  return e;
}

// Runs `stream` until its work up to `ticket` has run.
void run_until(CUstream_st* stream, uint64_t ticket) {
  State& s = state();
  while (stream->done < ticket) {
    if (stream->running) {
      std::fprintf(stderr,
                   "moepeak CUDA emulation: streams wait for each other in a cycle (a wait for "
                   "an event recorded after work that waits for it): a GPU would hang\n");
      s.sticky = cudaErrorLaunchFailure;
      stream->queue.clear();
      stream->done = stream->enqueued;
      return;
    }
    QueuedOp op = std::move(stream->queue.front());
    stream->queue.pop_front();
    stream->running = true;
    if (op.wait_stream != nullptr) {
      run_until(op.wait_stream, op.wait_ticket);
    } else if (s.sticky == cudaSuccess) {
      try {
        op.work();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "moepeak CUDA emulation: %s failed: %s\n", op.what.c_str(), e.what());
        s.sticky = cudaErrorLaunchFailure;
      }
    }
    stream->running = false;
    stream->done = op.ticket;
  }
}

void run_all() {
  State& s = state();
  // Streams created last first: the order least likely to hide a missing wait.
  for (auto it = s.streams.rbegin(); it != s.streams.rend(); ++it) run_until(*it, (*it)->enqueued);
  for (auto& legacy : s.legacy) run_until(legacy.get(), legacy->enqueued);
}

CUstream_st* resolve(cudaStream_t stream) {
  State& s = state();
  if (stream == nullptr) return s.legacy.empty() ? nullptr : s.legacy[t_device].get();
  for (CUstream_st* known : s.streams) {
    if (known == stream) return known->alive ? known : nullptr;
  }
  return nullptr;
}

void push_wait(CUstream_st* stream, CUstream_st* on, uint64_t ticket) {
  if (on == stream || on->done >= ticket) return;
  QueuedOp op;
  op.ticket = ++stream->enqueued;
  op.wait_stream = on;
  op.wait_ticket = ticket;
  stream->queue.push_back(std::move(op));
}

uint64_t push(CUstream_st* stream, std::string what, std::function<void()> work) {
  State& s = state();
  // A device's legacy default stream waits for every blocking stream of that device and they
  // for it.
  CUstream_st* legacy = s.legacy[static_cast<size_t>(stream->device)].get();
  if (stream == legacy) {
    for (CUstream_st* other : s.streams) {
      if (other->alive && other->blocking && other->device == stream->device) {
        push_wait(stream, other, other->enqueued);
      }
    }
  } else if (stream->blocking) {
    push_wait(stream, legacy, legacy->enqueued);
  }
  QueuedOp op;
  op.ticket = ++stream->enqueued;
  op.what = std::move(what);
  op.work = std::move(work);
  stream->queue.push_back(std::move(op));
  return stream->enqueued;
}

// The cudaMalloc'd range `p` lies in, or nullptr.
const std::pair<const uintptr_t, Allocation>* device_range(const void* p) {
  State& s = state();
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.device_memory.upper_bound(a);
  if (it == s.device_memory.begin()) return nullptr;
  --it;
  return a < it->first + it->second.bytes ? &*it : nullptr;
}

bool in_ranges(const std::map<uintptr_t, size_t>& ranges, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return false;
  --it;
  return a < it->first + it->second;
}

// A copy's side is fine when it is host memory or [p, p + bytes) lies in one device allocation.
bool fits(const void* p, size_t bytes) {
  const auto* range = device_range(p);
  if (range == nullptr) return true;
  return reinterpret_cast<uintptr_t>(p) + bytes <= range->first + range->second.bytes;
}

// Whether the pointers agree with an explicit direction (cudaMemcpyDefault infers it): a
// device side must lie in a cudaMalloc'd block, a host side must not.
bool directions_hold(void* dst, const void* src, cudaMemcpyKind kind) {
  const bool dst_device = device_range(dst) != nullptr, src_device = device_range(src) != nullptr;
  switch (kind) {
    case cudaMemcpyHostToHost:
      return !dst_device && !src_device;
    case cudaMemcpyHostToDevice:
      return dst_device && !src_device;
    case cudaMemcpyDeviceToHost:
      return !dst_device && src_device;
    case cudaMemcpyDeviceToDevice:
      return dst_device && src_device;
    case cudaMemcpyDefault:
      return true;
  }
  return false;
}

bool pageable_host(const void* p) {
  return device_range(p) == nullptr && !in_ranges(state().pinned, p);
}

// Queues a copy or memset; work touching pageable host memory completes before the call
// returns, after the stream's earlier work (CUDA's rule for pageable transfers).
cudaError_t queue_transfer(cudaStream_t stream, const char* what, bool touches_pageable,
                           std::function<void()> work) {
  State& s = state();
  if (s.sticky != cudaSuccess) return s.sticky;
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  const uint64_t ticket = push(st, what, std::move(work));
  if (touches_pageable) run_until(st, ticket);
  return s.sticky;
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, std::string what, std::function<void()> work) {
  Lock lock(state().mutex);
  State& s = state();
  if (s.sticky != cudaSuccess) return s.sticky;
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  push(st, std::move(what), std::move(work));
  return cudaSuccess;
}

void drain_all_streams() {
  Lock lock(state().mutex);
  run_all();
}

bool is_device_pointer(const void* ptr) {
  Lock lock(state().mutex);
  return device_range(ptr) != nullptr;
}

bool note_kernel(const char* name) {
  struct Log {
    std::mutex mutex;
    std::set<std::string> names;
    ~Log() {
      const char* path = std::getenv("MOEPEAK_CUDA_EMULATION_KERNEL_LOG");
      if (path == nullptr || *path == '\0') return;
      if (std::FILE* f = std::fopen(path, "a")) {
        for (const std::string& n : names) std::fprintf(f, "%s\n", n.c_str());
        std::fclose(f);
      }
    }
  };
  static Log log;
  std::lock_guard<std::mutex> lock(log.mutex);
  log.names.insert(name);
  return true;
}

void launch_kernel(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, std::function<void()> body) {
  Lock lock(state().mutex);
  State& s = state();
  if (s.sticky != cudaSuccess) return;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  int limit = kDefaultSharedBytes;
  auto attr = s.max_dynamic_shared.find(kernel);
  if (attr != s.max_dynamic_shared.end()) limit = attr->second;
  if (shared_bytes > static_cast<size_t>(limit)) {
    fail(cudaErrorInvalidValue);
    return;
  }
  CUstream_st* st = resolve(stream);
  if (st == nullptr) {
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  const Order order = s.order;
  push(st, std::string("kernel ") + name,
       [grid, block, shared_bytes, order, body = std::move(body)] {
         launch(Dim3{grid.x, grid.y, grid.z}, Dim3{block.x, block.y, block.z}, shared_bytes, body,
                order);
       });
}

}  // namespace moepeak::cuda_emulation

using namespace moepeak::cuda_emulation;  // NOLINT: the C API below is global, as CUDA's is

#define MOEPEAK_EMULATION_ENTER() \
  Lock lock(state().mutex);       \
  State& s = state();             \
  if (s.sticky != cudaSuccess) return s.sticky

cudaError_t cudaGetLastError() {
  Lock lock(state().mutex);
  State& s = state();
  if (s.sticky != cudaSuccess) return s.sticky;
  const cudaError_t e = s.last;
  s.last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  Lock lock(state().mutex);
  return state().sticky != cudaSuccess ? state().sticky : state().last;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) { return cudaRuntimeGetVersion(version); }

cudaError_t cudaGetDeviceCount(int* count) {
  MOEPEAK_EMULATION_ENTER();
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = s.device_count;
  return s.device_count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  MOEPEAK_EMULATION_ENTER();
  if (device < 0 || device >= s.device_count) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  MOEPEAK_EMULATION_ENTER();
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  MOEPEAK_EMULATION_ENTER();
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= s.device_count) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "CUDA emulation on the CPU");
  prop->totalGlobalMem = s.device_bytes;
  prop->sharedMemPerBlock = kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = kOptinSharedBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = kMultiprocessors;
  prop->pciBusID = device + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  MOEPEAK_EMULATION_ENTER();
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= s.device_count) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = kMultiprocessors;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = kOptinSharedBytes;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  MOEPEAK_EMULATION_ENTER();
  if (bus_id == nullptr || len <= 0) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= s.device_count) return fail(cudaErrorInvalidDevice);
  std::snprintf(bus_id, static_cast<size_t>(len), "0000:%02X:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can_access, int device, int peer) {
  MOEPEAK_EMULATION_ENTER();
  if (can_access == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= s.device_count || peer < 0 || peer >= s.device_count) {
    return fail(cudaErrorInvalidDevice);
  }
  *can_access = device != peer;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetP2PAttribute(int* value, cudaDeviceP2PAttr attr, int src, int dst) {
  MOEPEAK_EMULATION_ENTER();
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (src < 0 || src >= s.device_count || dst < 0 || dst >= s.device_count) {
    return fail(cudaErrorInvalidDevice);
  }
  *value = attr == cudaDevP2PAttrAccessSupported ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  MOEPEAK_EMULATION_ENTER();
  run_all();
  return s.sticky;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  MOEPEAK_EMULATION_ENTER();
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  *total_bytes = s.device_bytes;
  *free_bytes = s.device_bytes - s.allocated[static_cast<size_t>(t_device)];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  MOEPEAK_EMULATION_ENTER();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  size_t& used = s.allocated[static_cast<size_t>(t_device)];
  if (bytes > s.device_bytes - used) return fail(cudaErrorMemoryAllocation);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  if (bytes <= kPoisonedAllocationBytes) std::memset(p, 0xff, bytes);
  used += bytes;
  s.device_memory[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, t_device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  MOEPEAK_EMULATION_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.device_memory.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.device_memory.end()) return fail(cudaErrorInvalidDevicePointer);
  run_all();  // cudaFree synchronises the device
  s.allocated[static_cast<size_t>(it->second.device)] -= it->second.bytes;
  munmap(ptr, it->second.bytes);
  s.device_memory.erase(it);
  return s.sticky;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  MOEPEAK_EMULATION_ENTER();
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  const size_t rounded = (bytes + 4095) / 4096 * 4096;
  *ptr = rounded == 0 ? nullptr : std::aligned_alloc(4096, rounded);
  if (bytes != 0 && *ptr == nullptr) return fail(cudaErrorMemoryAllocation);
  if (*ptr != nullptr) {
    s.pinned[reinterpret_cast<uintptr_t>(*ptr)] = rounded;
    s.host_allocations[reinterpret_cast<uintptr_t>(*ptr)] = rounded;
  }
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  MOEPEAK_EMULATION_ENTER();
  if (ptr == nullptr) return cudaSuccess;
  auto it = s.host_allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.host_allocations.end()) return fail(cudaErrorInvalidValue);
  run_all();
  s.pinned.erase(it->first);
  s.host_allocations.erase(it);
  std::free(ptr);
  return s.sticky;
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int /*flags*/) {
  MOEPEAK_EMULATION_ENTER();
  if (ptr == nullptr || bytes == 0 || device_range(ptr) != nullptr) {
    return fail(cudaErrorInvalidValue);
  }
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto next = s.pinned.lower_bound(a);
  if ((next != s.pinned.end() && next->first < a + bytes) || in_ranges(s.pinned, ptr)) {
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  }
  s.pinned[a] = bytes;
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  MOEPEAK_EMULATION_ENTER();
  auto it = s.pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.pinned.end() || s.host_allocations.count(it->first) != 0) {
    return fail(cudaErrorHostMemoryNotRegistered);
  }
  run_all();  // work still queued may read the range
  s.pinned.erase(it);
  return s.sticky;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || !fits(dst, bytes) || !fits(src, bytes) ||
      !directions_hold(dst, src, kind)) {
    return fail(cudaErrorInvalidValue);
  }
  return queue_transfer(stream, "cudaMemcpyAsync", pageable_host(dst) || pageable_host(src),
                        [=] { std::memmove(dst, src, bytes); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  MOEPEAK_EMULATION_ENTER();
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e != cudaSuccess) return e;
  CUstream_st* legacy = s.legacy[static_cast<size_t>(t_device)].get();
  run_until(legacy, legacy->enqueued);
  return s.sticky;
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  if (width == 0 || height == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || width > dpitch || width > spitch ||
      !directions_hold(dst, src, kind)) {
    return fail(cudaErrorInvalidValue);
  }
  const size_t dst_span = dpitch * (height - 1) + width, src_span = spitch * (height - 1) + width;
  if (!fits(dst, dst_span) || !fits(src, src_span)) return fail(cudaErrorInvalidValue);
  auto* d = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(src);
  return queue_transfer(stream, "cudaMemcpy2DAsync", pageable_host(dst) || pageable_host(src), [=] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(d + r * dpitch, from + r * spitch, width);
    }
  });
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || !fits(dst, bytes)) return fail(cudaErrorInvalidValue);
  return queue_transfer(stream, "cudaMemsetAsync", pageable_host(dst),
                        [=] { std::memset(dst, value, bytes); });
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  return cudaMemsetAsync(dst, value, bytes, nullptr);
}

cudaError_t cudaMemset2DAsync(void* dst, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  if (width == 0 || height == 0) return cudaSuccess;
  if (dst == nullptr || width > pitch || !fits(dst, pitch * (height - 1) + width)) {
    return fail(cudaErrorInvalidValue);
  }
  auto* d = static_cast<char*>(dst);
  return queue_transfer(stream, "cudaMemset2DAsync", pageable_host(dst), [=] {
    for (size_t r = 0; r < height; ++r) std::memset(d + r * pitch, value, width);
  });
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  MOEPEAK_EMULATION_ENTER();
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  auto* st = new CUstream_st();
  st->device = t_device;
  st->blocking = (flags & cudaStreamNonBlocking) == 0;
  st->priority = priority;
  s.streams.push_back(st);
  *stream = st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithPriority(stream, cudaStreamDefault, 0);
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  MOEPEAK_EMULATION_ENTER();
  CUstream_st* st = resolve(stream);
  if (st == nullptr || priority == nullptr) return fail(cudaErrorInvalidResourceHandle);
  *priority = st->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  CUstream_st* st = resolve(stream);
  if (st == nullptr || stream == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // Work already queued still runs (CUDA completes it); the handle is dead from now on.
  run_until(st, st->enqueued);
  st->alive = false;
  return s.sticky;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  CUstream_st* st = resolve(stream);
  if (st == nullptr) return fail(cudaErrorInvalidResourceHandle);
  run_until(st, st->enqueued);
  return s.sticky;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  MOEPEAK_EMULATION_ENTER();
  CUstream_st* st = resolve(stream);
  if (st == nullptr || event == nullptr || !event->alive) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (event->stream != nullptr) push_wait(st, event->stream, event->ticket);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  MOEPEAK_EMULATION_ENTER();
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st();
  e->timing = (flags & cudaEventDisableTiming) == 0;
  s.events.push_back(e);
  *event = e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  MOEPEAK_EMULATION_ENTER();
  if (event == nullptr || !event->alive) return fail(cudaErrorInvalidResourceHandle);
  event->alive = false;  // kept: queued records may still write its time
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  MOEPEAK_EMULATION_ENTER();
  CUstream_st* st = resolve(stream);
  if (st == nullptr || event == nullptr || !event->alive) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  CUevent_st* e = event;
  auto ticket = std::make_shared<uint64_t>(0);
  *ticket = push(st, "cudaEventRecord", [e, st, ticket] {
    if (e->stream == st && e->ticket == *ticket) e->at_ms = now_ms();  // still its last record
  });
  e->stream = st;
  e->ticket = *ticket;
  e->queries = 0;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  MOEPEAK_EMULATION_ENTER();
  if (event == nullptr || !event->alive) return fail(cudaErrorInvalidResourceHandle);
  if (event->stream != nullptr) run_until(event->stream, event->ticket);
  return s.sticky;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  MOEPEAK_EMULATION_ENTER();
  if (event == nullptr || !event->alive) return fail(cudaErrorInvalidResourceHandle);
  if (event->stream == nullptr || event->stream->done >= event->ticket) return cudaSuccess;
  // Not done at the first query after a record (the GPU is still busy); the second runs it.
  if (event->queries++ == 0) return cudaErrorNotReady;
  run_until(event->stream, event->ticket);
  return s.sticky;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  MOEPEAK_EMULATION_ENTER();
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  if (!start->timing || !end->timing || !start->alive || !end->alive) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (start->stream == nullptr || end->stream == nullptr)
    return fail(cudaErrorInvalidResourceHandle);
  if (start->stream->done < start->ticket || end->stream->done < end->ticket) {
    return fail(cudaErrorNotReady);
  }
  *ms = static_cast<float>(end->at_ms - start->at_ms);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttributeOf(const void* kernel, cudaFuncAttribute attr, int value) {
  MOEPEAK_EMULATION_ENTER();
  if (kernel == nullptr || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      value > kOptinSharedBytes) {
    return fail(cudaErrorInvalidValue);
  }
  s.max_dynamic_shared[kernel] = value;
  return cudaSuccess;
}
