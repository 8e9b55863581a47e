#include "core/runtime/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/runtime/cuda_check.h"
#include "core/units.h"

namespace moepeak {
namespace {

class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, int device, StreamPriority priority = StreamPriority::normal)
      : name_(std::move(name)), device_(device) {
    MOEPEAK_CUDA_CHECK(cudaSetDevice(device_));
    int least = 0, greatest = 0;  // CUDA's greatest priority is the numerically lowest
    MOEPEAK_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MOEPEAK_CUDA_CHECK(cudaStreamCreateWithPriority(
        &stream_, cudaStreamNonBlocking, priority == StreamPriority::high ? greatest : least));
  }
  ~CudaStream() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  const std::string& name() const override { return name_; }
  void wait(const Event& event) override;
  void synchronize() override { MOEPEAK_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* native_handle() const override { return stream_; }
  cudaStream_t get() const { return stream_; }

 private:
  std::string name_;
  int device_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(EventTiming timing) : timing_(timing) {
    MOEPEAK_CUDA_CHECK(cudaEventCreateWithFlags(
        &event_, timing == EventTiming::on ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  void record(Stream& stream) override {
    MOEPEAK_CUDA_CHECK(cudaEventRecord(event_, static_cast<cudaStream_t>(stream.native_handle())));
    recorded_ = true;
  }
  void synchronize() override { MOEPEAK_CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool query() override {
    cudaError_t s = cudaEventQuery(event_);
    if (s == cudaErrorNotReady) return false;
    MOEPEAK_CUDA_CHECK(s);
    return true;
  }
  double elapsed_ms(const Event& start) const override {
    const auto& s = dynamic_cast<const CudaEvent&>(start);
    MOEPEAK_CHECK(timing_ == EventTiming::on && s.timing_ == EventTiming::on,
                  "elapsed_ms on an event created without timing (create_event(EventTiming::on))");
    MOEPEAK_CHECK(recorded_ && s.recorded_, "elapsed_ms on an event that was never recorded");
    float ms = 0;
    MOEPEAK_CUDA_CHECK(cudaEventElapsedTime(&ms, s.event_, event_));
    return ms;
  }
  cudaEvent_t get() const { return event_; }

 private:
  EventTiming timing_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

void CudaStream::wait(const Event& event) {
  MOEPEAK_CUDA_CHECK(cudaStreamWaitEvent(stream_, dynamic_cast<const CudaEvent&>(event).get(), 0));
}

class CudaHostRegistrar final : public HostRegistrar {
 public:
  void register_host(void* ptr, size_t bytes) override {
    MOEPEAK_CUDA_CHECK(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  }
  void unregister_host(void* ptr) noexcept override { cudaHostUnregister(ptr); }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options)
      : device_(visible_cuda_device(options.device_index, cuda_device_count(),
                                    std::getenv("CUDA_VISIBLE_DEVICES"))) {
    MOEPEAK_CUDA_CHECK(cudaSetDevice(device_));
    MOEPEAK_CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
    size_t free_bytes = 0, total_bytes = 0;
    MOEPEAK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    used_before_arena_ = total_bytes - free_bytes;
    uint64_t capacity = options.device_memory;
    if (capacity == 0) {
      const uint64_t reserve = options.outside_arena ? options.outside_arena : kCudaReserveBytes;
      MOEPEAK_CHECK(free_bytes > reserve, "GPU ", device_, " has only ", format_bytes(free_bytes),
                    " free, less than the ", format_bytes(reserve),
                    " kept outside the arena for the CUDA context, cuBLAS and NCCL");
      // NOTES: free_bytes already excludes the context (it exists by now); the reserve keeps
      // it anyway, so that the arena plus every term of the plan fits the card.
      capacity = free_bytes - reserve;
    }
    MOEPEAK_CHECK(capacity <= free_bytes, "runtime.device_memory = ", format_bytes(capacity),
                  " but GPU ", device_, " (", props_.name, ") has only ", format_bytes(free_bytes),
                  " free");
    // NOTES: one region for the whole run: sub-allocation never calls cudaMalloc/cudaFree in the
    // step (no implicit device synchronisation), and the arena's peaks are the real footprint.
    MOEPEAK_CUDA_CHECK(cudaMalloc(&region_, capacity));
    arena_ = std::make_unique<DeviceArena>(region_, capacity,
                                           "cuda:" + std::to_string(device_) + " device memory");
    pinned_ = std::make_unique<PinnedPool>(options.pinned_budget, options.numa_node, &registrar_);
    default_stream_ = std::make_unique<CudaStream>("default", device_);
  }

  ~CudaBackend() override {
    cudaDeviceSynchronize();
    default_stream_.reset();
    pinned_.reset();
    arena_.reset();
    if (region_ != nullptr) cudaFree(region_);
  }

  BackendKind kind() const override { return BackendKind::cuda; }
  std::string describe() const override {
    return "cuda:" + std::to_string(device_) + " " + props_.name + " (sm_" +
           std::to_string(props_.major) + std::to_string(props_.minor) + ", " +
           format_bytes(props_.totalGlobalMem) + ", arena " + format_bytes(arena_->capacity()) +
           ", pinned budget " + format_bytes(pinned_->budget()) + " on NUMA node " +
           std::to_string(pinned_->numa_node()) + ")";
  }
  DeviceArena& arena() override { return *arena_; }
  PinnedPool& pinned() override { return *pinned_; }
  Stream& default_stream() override { return *default_stream_; }
  std::unique_ptr<Stream> create_stream(std::string name,
                                        StreamPriority priority = StreamPriority::normal) override {
    return std::make_unique<CudaStream>(std::move(name), device_, priority);
  }
  std::unique_ptr<Event> create_event(EventTiming timing = EventTiming::off) override {
    MOEPEAK_CUDA_CHECK(cudaSetDevice(device_));
    return std::make_unique<CudaEvent>(timing);
  }
  void copy_async(void* dst, const void* src, size_t bytes, CopyKind /*kind*/,
                  Stream& stream) override {
    // NOTES: the kind is the caller's intent; CUDA gets cudaMemcpyDefault and infers the
    // direction from the pointers (unified addressing, every 64-bit CUDA platform), so a pinned
    // host tensor passed where a device one was expected still copies correctly.
    MOEPEAK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                       static_cast<cudaStream_t>(stream.native_handle())));
  }
  void memset_async(void* dst, int value, size_t bytes, Stream& stream) override {
    MOEPEAK_CUDA_CHECK(
        cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream.native_handle())));
  }
  void synchronize() override {
    MOEPEAK_CUDA_CHECK(cudaSetDevice(device_));
    MOEPEAK_CUDA_CHECK(cudaDeviceSynchronize());
  }
  MemoryInfo memory_info() override {
    MemoryInfo info;
    info.capacity = arena_->capacity();
    info.used = arena_->used();
    info.largest_free = arena_->largest_free_block();
    size_t free_bytes = 0, total_bytes = 0;
    MOEPEAK_CUDA_CHECK(cudaSetDevice(device_));
    MOEPEAK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    info.physical_total = total_bytes;
    info.physical_free = free_bytes;
    info.used_before_arena = used_before_arena_;
    return info;
  }

 private:
  int device_;
  cudaDeviceProp props_{};
  void* region_ = nullptr;
  uint64_t used_before_arena_ = 0;  // total - free when the device was opened (context, others)
  CudaHostRegistrar registrar_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<PinnedPool> pinned_;
  std::unique_ptr<CudaStream> default_stream_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

}  // namespace moepeak
