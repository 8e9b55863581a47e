// host_link_bench.h: memcpy and host<->GPU copy rates, and the cost of pinning.
// Tests: ctest -R test_topology (rates > 0 only; no timing asserts).
#include "topology/host_link_bench.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/units.h"
#include "topology/gpu_probe.h"

namespace moepeak::topology {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Host memory on one NUMA node (libnuma), optionally locked; or pageable malloc memory.
class HostBuffer {
 public:
  HostBuffer(uint64_t bytes, int node, bool numa_local)
      : bytes_(bytes), numa_(numa_local && numa_available() >= 0) {
    ptr_ = numa_ ? numa_alloc_onnode(bytes, node) : std::malloc(bytes);
    if (!ptr_)
      MOEPEAK_THROW("probe: cannot allocate ", format_bytes(bytes), " of host memory on NUMA node ",
                    node);
    std::memset(ptr_, 1, bytes);  // first touch: the pages exist before anything is timed
  }
  ~HostBuffer() {
    if (locked_) munlock(ptr_, bytes_);
    if (numa_)
      numa_free(ptr_, bytes_);
    else
      std::free(ptr_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  bool lock() { return locked_ = mlock(ptr_, bytes_) == 0; }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  uint64_t bytes_;
  bool numa_;
  bool locked_ = false;
};

// Keeps the calling thread's CPU affinity and puts it back on destruction.
class AffinityGuard {
 public:
  AffinityGuard() { saved_ok_ = sched_getaffinity(0, sizeof(saved_), &saved_) == 0; }
  ~AffinityGuard() {
    if (saved_ok_) sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  static void run_on(int node) {
    if (numa_available() >= 0) numa_run_on_node(node);
  }

 private:
  cpu_set_t saved_{};
  bool saved_ok_ = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double memcpy_rate(void* dst, const void* src, uint64_t bytes, int iters) {
  std::memcpy(dst, src, bytes);  // warm-up
  std::vector<double> rates;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    std::memcpy(dst, src, bytes);
    const double s = since(t0);
    rates.push_back(static_cast<double>(bytes) / std::max(s, 1e-9) / 1e9);
  }
  return median(rates);
}

// Nodes that hold memory, by os_index.
std::vector<int> memory_nodes(const NodeTopology& topo) {
  std::vector<int> out;
  for (const auto& n : topo.numa_nodes) {
    if (n.memory_bytes > 0) out.push_back(n.os_index);
  }
  if (out.empty()) out.push_back(0);
  return out;
}

// The node the copying thread runs on: the first NUMA node with cores.
int current_home(const NodeTopology& topo) {
  for (const auto& nn : topo.numa_nodes) {
    if (nn.pus > 0) return nn.os_index;
  }
  return 0;
}

}  // namespace

HostLinkBench run_host_link_bench(const NodeTopology& topo, const BenchOptions& options) {
  MOEPEAK_CHECK(options.bytes >= 4096, "bench buffers must be at least 4 KiB, got ", options.bytes,
                " bytes");
  MOEPEAK_CHECK(options.iters >= 1, "bench repetitions must be at least 1, got ", options.iters);
  HostLinkBench out;
  out.bytes = options.bytes;
  out.iters = options.iters;
  const uint64_t n = options.bytes;
  const std::vector<int> nodes = memory_nodes(topo);
  const int home = current_home(topo);
  AffinityGuard guard;
  AffinityGuard::run_on(home);

  // memcpy, pinned: buffers on each node copied by a thread on `home`; pageable: malloc'd.
  for (int node : nodes) {
    HostBuffer src(n, node, true), dst(n, home, true);
    const bool locked = src.lock() && dst.lock();
    if (!locked && node == nodes.front()) {
      out.notes.push_back(
          "mlock refused (RLIMIT_MEMLOCK); \"pinned\" memcpy rows use unlocked NUMA-local memory");
    }
    out.rows.push_back({"memcpy", "pinned", -1, node, node == home, n,
                        memcpy_rate(dst.get(), src.get(), n, options.iters)});
  }
  {
    HostBuffer src(n, home, false), dst(n, home, false);
    out.rows.push_back({"memcpy", "pageable", -1, home, true, n,
                        memcpy_rate(dst.get(), src.get(), n, options.iters)});
  }

  // Pinning cost on `home`.
  out.pinning.numa_node = home;
  out.pinning.bytes = n;
  {
    auto t0 = Clock::now();
    HostBuffer buf(n, home, true);
    out.pinning.alloc_touch_s = since(t0);
    t0 = Clock::now();
    out.pinning.mlock_ok = buf.lock();
    out.pinning.mlock_s = out.pinning.mlock_ok ? since(t0) : 0;
  }

  // GPUs: pinned from the local node and one remote node, pageable from the local node.
  if (!topo.gpus.empty()) {
    {
      HostBuffer buf(n, home, true);
      out.pinning.cuda_register_s = cuda_register_seconds(buf.get(), n);
    }
    for (const auto& g : topo.gpus) {
      const int local = g.numa_node >= 0 ? g.numa_node : home;
      std::vector<int> sources{local};
      for (int node : nodes) {
        if (node != local) {
          sources.push_back(node);
          break;
        }
      }
      AffinityGuard::run_on(local);
      for (int node : sources) {
        HostBuffer src(n, node, true), dst(n, node, true);
        GpuCopyRates r = measure_gpu_copies(g.index, src.get(), dst.get(), n, true, options.iters);
        if (!r.error.empty())
          out.notes.push_back("GPU " + std::to_string(g.index) + " pinned: " + r.error);
        out.rows.push_back({"h2d", "pinned", g.index, node, node == local, n, r.h2d});
        out.rows.push_back({"d2h", "pinned", g.index, node, node == local, n, r.d2h});
        out.rows.push_back({"bidir", "pinned", g.index, node, node == local, n, r.bidir});
      }
      HostBuffer src(n, local, false), dst(n, local, false);
      GpuCopyRates r = measure_gpu_copies(g.index, src.get(), dst.get(), n, false, options.iters);
      if (!r.error.empty())
        out.notes.push_back("GPU " + std::to_string(g.index) + " pageable: " + r.error);
      out.rows.push_back({"h2d", "pageable", g.index, local, true, n, r.h2d});
      out.rows.push_back({"d2h", "pageable", g.index, local, true, n, r.d2h});
      out.rows.push_back({"bidir", "pageable", g.index, local, true, n, r.bidir});
    }
  } else {
    out.notes.push_back("no GPU: host<->device rates not measured (" + topo.gpu_status + ")");
  }
  return out;
}

}  // namespace moepeak::topology
