#include "core/runtime/cpu_backend.h"

#include <cblas.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/runtime/blas_kernels.h"
#include "core/runtime/numa.h"
#include "core/units.h"

namespace moepeak {

CpuBackend::CpuBackend(const BackendOptions& options) {
  region_bytes_ = options.device_memory != 0 ? options.device_memory : kCpuDefaultDeviceMemory;
  // NOTES: the region is reserved address space, not committed memory: pages cost RAM only once
  // touched, so a "80GiB device" on a 24 GiB machine works as long as the live sets stay small —
  // the capacity is an accounting limit, exactly like a GPU's.
  region_ = mmap(nullptr, region_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region_ == MAP_FAILED) {
    region_ = nullptr;
    MOEPEAK_THROW("cpu backend: cannot reserve ", format_bytes(region_bytes_),
                  " of address space for runtime.device_memory: ", std::strerror(errno));
  }
  arena_ = std::make_unique<DeviceArena>(region_, region_bytes_, "cpu device memory");
  select_blas_kernels();  // before the first GEMM: OpenBLAS may have guessed this CPU wrong
  if (options.cpu_threads > 0) openblas_set_num_threads(options.cpu_threads);
  pinned_ = std::make_unique<PinnedPool>(options.pinned_budget, options.numa_node, nullptr);
  default_stream_ = make_stream("default");
}

CpuBackend::~CpuBackend() {
  default_stream_.reset();
  pinned_.reset();
  arena_.reset();
  if (region_ != nullptr) munmap(region_, region_bytes_);
}

std::string CpuBackend::describe() const {
  const BlasKernels& blas = select_blas_kernels();
  const std::string kernels = blas.active == blas.detected
                                  ? blas.active
                                  : blas.active + " (detected " + blas.detected + ")";
  return "cpu (" + std::to_string(std::thread::hardware_concurrency()) + " cores, OpenBLAS " +
         kernels + " kernels, " + std::to_string(openblas_get_num_threads()) + " threads, " +
         std::to_string(numa_node_count()) + " NUMA node(s), device memory " +
         format_bytes(arena_->capacity()) + ", pinned budget " + format_bytes(pinned_->budget()) +
         " on node " + std::to_string(pinned_->numa_node()) + ")";
}

std::unique_ptr<CpuStream> CpuBackend::make_stream(std::string name) {
  auto stream = std::make_unique<CpuStream>(std::move(name), [this](CpuStream* s) {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_.erase(s);
  });
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(stream.get());
  return stream;
}

std::unique_ptr<Stream> CpuBackend::create_stream(std::string name,
                                                  StreamPriority /*priority: one thread each*/) {
  return make_stream(std::move(name));
}

std::unique_ptr<Event> CpuBackend::create_event(EventTiming timing) {
  return std::make_unique<CpuEvent>(timing);
}

void CpuBackend::copy_async(void* dst, const void* src, size_t bytes, CopyKind /*kind*/,
                            Stream& stream) {
  // NOTES: an empty copy may come with null pointers (the data() of an empty vector, a rank that
  // receives no rows); memcpy with a null pointer is undefined even for 0 bytes (UBSan).
  if (bytes == 0) return;
  as_cpu_stream(stream).enqueue([=] { std::memcpy(dst, src, bytes); });
}

void CpuBackend::memset_async(void* dst, int value, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  as_cpu_stream(stream).enqueue([=] { std::memset(dst, value, bytes); });
}

void CpuBackend::synchronize() {
  std::vector<CpuStream*> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams.assign(streams_.begin(), streams_.end());
  }
  for (CpuStream* s : streams) s->synchronize();
}

MemoryInfo CpuBackend::memory_info() {
  MemoryInfo info;
  info.capacity = arena_->capacity();
  info.used = arena_->used();
  info.largest_free = arena_->largest_free_block();
  auto host = host_memory();
  info.physical_total = host.total_bytes;
  info.physical_free = host.free_bytes;
  return info;
}

}  // namespace moepeak
