#include "core/runtime/numa.h"

#include <numa.h>
#include <sched.h>
#include <sys/sysinfo.h>

#include "core/error.h"

namespace moepeak {

int numa_node_count() { return numa_available() < 0 ? 1 : numa_max_node() + 1; }

int current_numa_node() {
  if (numa_available() < 0) return 0;
  int cpu = sched_getcpu();
  int node = cpu >= 0 ? numa_node_of_cpu(cpu) : 0;
  return node >= 0 ? node : 0;
}

NumaNodeMemory numa_node_memory(int node) {
  if (numa_available() < 0) return host_memory();
  MOEPEAK_CHECK(node >= 0 && node <= numa_max_node(), "NUMA node ", node,
                " does not exist (nodes 0..", numa_max_node(), ")");
  long long free_bytes = 0;
  long long total = numa_node_size64(node, &free_bytes);
  NumaNodeMemory m;
  m.total_bytes = total > 0 ? static_cast<uint64_t>(total) : 0;
  m.free_bytes = free_bytes > 0 ? static_cast<uint64_t>(free_bytes) : 0;
  return m;
}

NumaNodeMemory host_memory() {
  struct sysinfo info {};
  MOEPEAK_CHECK(sysinfo(&info) == 0, "sysinfo() failed");
  NumaNodeMemory m;
  m.total_bytes = static_cast<uint64_t>(info.totalram) * info.mem_unit;
  m.free_bytes = static_cast<uint64_t>(info.freeram + info.bufferram) * info.mem_unit;
  return m;
}

}  // namespace moepeak
